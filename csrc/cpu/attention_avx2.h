// The AVX2 kernel set of the CPU paged attention's SIMD step (attention_step.h: simd_step), for
// CPUs without AVX-512: the same scheme as attention_avx512.h in 8-lane registers (16 of them,
// so smaller tiles: scores of 6 rows x 16 keys, outputs of 3 rows x 32 dims). Each score is one
// FMA chain over head_dim in order, each output one FMA chain over the keys in order; a key a row
// does not see is skipped for that row. Called only for head_dim a multiple of 8 on a CPU with
// AVX2 and FMA (isa.h), from code compiled for any x86-64: the functions carry their target.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSPINE_ATTENTION_AVX2 1

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "attention_step.h"

#define DSPINE_AVX2_FN __attribute__((target("avx2,fma")))

namespace dspine {
namespace cpu {
namespace attn {
namespace avx2 {  // the kernels of one instruction set; the tag-overloads found by ADL

struct Avx2 {
  static constexpr int kScoreRows = 6;   // 12 accumulators (6 rows x 16 keys)
  static constexpr int kOutputRows = 3;  // 12 accumulators (3 rows x 32 dims)
};

// dst[0, d) = the fp16 row src widened to fp32 (exact), 8 elements at a time (d is a multiple
// of 8 wherever these kernels run). F16C: isa.h's AVX2 level requires it.
__attribute__((target("avx2,fma,f16c"))) inline void widen_fp16(Avx2, const uint16_t* src, int64_t d, float* dst) {
  for (int64_t x = 0; x < d; x += 8)
    _mm256_storeu_ps(dst + x, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + x))));
}

// e^x lane by lane (attention_step.h: kExpTaylor); 2^n built in the exponent bits (n >= -126).
DSPINE_AVX2_FN inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(kExpFloor), x);  // this order keeps a NaN (max returns operand 2)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Horizontal max and sum of 8 lanes, always in the same order.
DSPINE_AVX2_FN inline float hmax(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

DSPINE_AVX2_FN inline float hsum(__m256 x) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

// All ones in the lanes 8g .. 8g + 7 of the chunk that vis marks.
DSPINE_AVX2_FN inline __m256 lanes_seen(uint32_t vis, int g) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i v = _mm256_set1_epi32(static_cast<int>(vis >> (8 * g) & 0xffu));
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(v, bits), bits));
}

// dst[c * kKeyChunk + i] = k[i][x0 + c] for i, c < 8: an 8 x 8 transpose in registers.
DSPINE_AVX2_FN inline void transpose8(const float* const* k, int64_t x0, float* dst) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    const __m256 a = _mm256_loadu_ps(k[2 * i] + x0), b = _mm256_loadu_ps(k[2 * i + 1] + x0);
    t[2 * i] = _mm256_unpacklo_ps(a, b);  // per 128-bit lane l: a[4l], b[4l], a[4l+1], b[4l+1]
    t[2 * i + 1] = _mm256_unpackhi_ps(a, b);
  }
  for (int g = 0; g < 2; ++g) {  // u[4g + c] lane l: element 4l + c of rows 4g .. 4g + 3
    u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * kKeyChunk, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
    _mm256_storeu_ps(dst + (4 + c) * kKeyChunk, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
  }
}

// kt[x * kKeyChunk + j] = key j's element x for the loaded lanes: 8 lanes loaded whole are
// transposed in registers, the rest element by element (moves only: no rounding).
DSPINE_AVX2_FN inline void transpose_keys(Avx2, const KeyChunk& c, int64_t d, float* kt) {
  for (int h = 0; h < kKeyChunk; h += 8) {
    if (c.j0 <= h && c.j1 >= h + 8) {
      for (int64_t x0 = 0; x0 < d; x0 += 8) transpose8(c.k + h, x0, kt + x0 * kKeyChunk + h);
      continue;
    }
    for (int j = std::max(c.j0, h); j < std::min(c.j1, h + 8); ++j) {
      const float* k = c.k[j];
      for (int64_t x = 0; x < d; ++x) kt[x * kKeyChunk + j] = k[x];
    }
  }
}

// s[r * kKeyChunk + j] = q_r . k_j for R rows and all 32 lanes, 16 lanes at a time.
template <int R>
DSPINE_AVX2_FN void score_rows(const float* q, int64_t d, const float* kt, float* s) {
  for (int h = 0; h < kKeyChunk; h += 16) {
    __m256 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t x = 0; x < d; ++x) {
      const __m256 k0 = _mm256_loadu_ps(kt + x * kKeyChunk + h), k1 = _mm256_loadu_ps(kt + x * kKeyChunk + h + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 qr = _mm256_broadcast_ss(q + r * d + x);
        lo[r] = _mm256_fmadd_ps(qr, k0, lo[r]);
        hi[r] = _mm256_fmadd_ps(qr, k1, hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(s + r * kKeyChunk + h, lo[r]);
      _mm256_storeu_ps(s + r * kKeyChunk + h + 8, hi[r]);
    }
  }
}

DSPINE_AVX2_FN inline void score_tile(Avx2, int rows, const float* q, int64_t d, const float* kt, float* s) {
  switch (rows) {
    case 1: return score_rows<1>(q, d, kt, s);
    case 2: return score_rows<2>(q, d, kt, s);
    case 3: return score_rows<3>(q, d, kt, s);
    case 4: return score_rows<4>(q, d, kt, s);
    case 5: return score_rows<5>(q, d, kt, s);
    default: return score_rows<6>(q, d, kt, s);
  }
}

// Scores of the visible lanes -> probabilities (0 elsewhere); updates the row's max and sum and
// returns the factor its output must be rescaled by.
DSPINE_AVX2_FN inline float softmax_row(Avx2, float* s, uint32_t vis, float* m, float* l) {
  if (vis == 0) return 1.f;
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  __m256 sv[4], seen[4], mx = ninf;
  for (int g = 0; g < 4; ++g) {
    seen[g] = lanes_seen(vis, g);
    sv[g] = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * g), seen[g]);
    mx = _mm256_max_ps(mx, sv[g]);
  }
  const float cmax = hmax(mx);
  if (cmax == kNegInf) {  // only with infinite inputs: the row takes nothing from this chunk
    for (int g = 0; g < 4; ++g) _mm256_storeu_ps(s + 8 * g, _mm256_setzero_ps());
    return 1.f;
  }
  const float m_new = std::max(*m, cmax);
  const float corr = std::exp(*m - m_new);  // exp(-inf) = 0 on the first visible chunk
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 p[4];
  for (int g = 0; g < 4; ++g) {
    p[g] = _mm256_and_ps(seen[g], exp_avx2(_mm256_sub_ps(sv[g], mv)));
    _mm256_storeu_ps(s + 8 * g, p[g]);
  }
  *l = *l * corr + hsum(_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])));
  *m = m_new;
  return corr;
}

// acc_r[x0, x0 + 8 NV) = acc_r * corr_r + sum over lanes j in [j0, j1) that row r sees of
// p_rj * v_j, for R rows. Full: every row sees every lane of [j0, j1).
template <int R, int NV, bool Full>
DSPINE_AVX2_FN void accumulate_rows(float* acc, int64_t d, int64_t x0, const float* corr, const float* p,
                                    const uint32_t* mask, const float* const* v, int j0, int j1) {
  __m256 a[R][NV];
  for (int r = 0; r < R; ++r) {
    const __m256 cr = _mm256_set1_ps(corr[r]);
    for (int u = 0; u < NV; ++u) a[r][u] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * d + x0 + 8 * u), cr);
  }
  for (int j = j0; j < j1; ++j) {
    __m256 pr[R];
    for (int r = 0; r < R; ++r) pr[r] = _mm256_broadcast_ss(p + r * kKeyChunk + j);
    for (int u = 0; u < NV; ++u) {
      const __m256 vx = _mm256_loadu_ps(v[j] + x0 + 8 * u);
      for (int r = 0; r < R; ++r)
        if (Full || (mask[r] >> j & 1u)) a[r][u] = _mm256_fmadd_ps(pr[r], vx, a[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) _mm256_storeu_ps(acc + r * d + x0 + 8 * u, a[r][u]);
}

template <int NV, bool Full>
DSPINE_AVX2_FN inline void accumulate_tile(int rows, float* acc, int64_t d, int64_t x0, const float* corr,
                                           const float* p, const uint32_t* mask, const float* const* v, int j0,
                                           int j1) {
  switch (rows) {
    case 1: return accumulate_rows<1, NV, Full>(acc, d, x0, corr, p, mask, v, j0, j1);
    case 2: return accumulate_rows<2, NV, Full>(acc, d, x0, corr, p, mask, v, j0, j1);
    default: return accumulate_rows<3, NV, Full>(acc, d, x0, corr, p, mask, v, j0, j1);
  }
}

// Output update of a tile of rows over all of head_dim: 32 dims at a time, then 8.
template <bool Full>
DSPINE_AVX2_FN inline void accumulate_dims(int rows, float* acc, int64_t d, const float* corr, const float* p,
                                           const uint32_t* mask, const float* const* v, int j0, int j1) {
  int64_t x0 = 0;
  for (; x0 + 32 <= d; x0 += 32) accumulate_tile<4, Full>(rows, acc, d, x0, corr, p, mask, v, j0, j1);
  for (; x0 < d; x0 += 8) accumulate_tile<1, Full>(rows, acc, d, x0, corr, p, mask, v, j0, j1);
}

DSPINE_AVX2_FN inline void accumulate(Avx2, bool full, int rows, float* acc, int64_t d, const float* corr,
                                      const float* p, const uint32_t* mask, const float* const* v, int j0, int j1) {
  if (full)
    accumulate_dims<true>(rows, acc, d, corr, p, mask, v, j0, j1);
  else
    accumulate_dims<false>(rows, acc, d, corr, p, mask, v, j0, j1);
}

}  // namespace avx2
}  // namespace attn
}  // namespace cpu
}  // namespace dspine

#undef DSPINE_AVX2_FN
#endif
