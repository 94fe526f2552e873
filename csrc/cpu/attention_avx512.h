// The AVX-512 kernel set of the CPU paged attention's SIMD step (attention_step.h: simd_step).
//
// Scores: a tile of up to 8 query rows against the 32 keys of a chunk, each SIMD lane one key
// (the chunk's keys transposed once per step, reused by every row), so each score is one chain of
// fused multiply-adds over head_dim in order x = 0, 1, ..., d - 1: no horizontal reduction, and
// the same chain whichever tile or lane the row and key fall in. Softmax: per row over 32 lanes,
// with an exp of our own (below). Output: a tile of up to 4 rows, each SIMD lane one dim of
// head_dim, a chain of multiply-adds over the keys in order; a key a row does not see is masked
// out of the multiply-add, never added as zero. Called only for head_dim a multiple of 16 on a CPU
// with AVX-512 (isa.h), from code compiled for any x86-64: the functions carry their target.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSPINE_ATTENTION_AVX512 1

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "attention_step.h"
#include "isa.h"

#define DSPINE_AVX512_FN __attribute__((target("avx512f")))

DSPINE_AVX512_QUIET_BEGIN  // isa.h

namespace dspine {
namespace cpu {
namespace attn {
namespace avx512 {  // the kernels of one instruction set; the tag-overloads found by ADL

// The kernel set simd_step (attention_step.h) runs: a tag its functions are overloaded on.
struct Avx512 {
  static constexpr int kScoreRows = 8;   // 16 accumulators (8 rows x 2 key vectors)
  static constexpr int kOutputRows = 4;  // 16 accumulators (4 rows x 64 dims)
};

// dst[0, d) = the fp16 row src widened to fp32 (exact), 16 elements at a time (d is a multiple
// of 16 wherever these kernels run).
DSPINE_AVX512_FN inline void widen_fp16(Avx512, const uint16_t* src, int64_t d, float* dst) {
  for (int64_t x = 0; x < d; x += 16)
    _mm512_storeu_ps(dst + x, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + x))));
}

// e^x lane by lane (attention_step.h: kExpTaylor).
DSPINE_AVX512_FN inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(kExpFloor), x);  // this order keeps a NaN (max returns operand 2)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[i]));
  return _mm512_scalef_ps(p, n);
}

// dst[c * kKeyChunk + i] = k[i][x0 + c] for i, c < 16: a 16 x 16 transpose in registers
// (pairs of rows interleaved, then pairs of pairs, then 128-bit lanes across registers).
DSPINE_AVX512_FN inline void transpose16(const float* const* k, int64_t x0, float* dst) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_loadu_ps(k[2 * i] + x0), b = _mm512_loadu_ps(k[2 * i + 1] + x0);
    t[2 * i] = _mm512_unpacklo_ps(a, b);  // per 128-bit lane l: a[4l], b[4l], a[4l+1], b[4l+1]
    t[2 * i + 1] = _mm512_unpackhi_ps(a, b);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + c] lane l: element 4l + c of rows 4g .. 4g + 3
    const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 v = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), w = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
    const __m512 x = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 y = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);
    _mm512_storeu_ps(dst + c * kKeyChunk, _mm512_shuffle_f32x4(v, x, 0x88));
    _mm512_storeu_ps(dst + (4 + c) * kKeyChunk, _mm512_shuffle_f32x4(v, x, 0xdd));
    _mm512_storeu_ps(dst + (8 + c) * kKeyChunk, _mm512_shuffle_f32x4(w, y, 0x88));
    _mm512_storeu_ps(dst + (12 + c) * kKeyChunk, _mm512_shuffle_f32x4(w, y, 0xdd));
  }
}

// kt[x * kKeyChunk + j] = key j's element x, for the loaded lanes (the others are never read
// unmasked): each half of the chunk loaded whole is transposed in registers, the rest element by
// element. Moves only: no rounding, whichever way a lane is transposed.
DSPINE_AVX512_FN inline void transpose_keys(Avx512, const KeyChunk& c, int64_t d, float* kt) {
  for (int h = 0; h < kKeyChunk; h += 16) {
    if (c.j0 <= h && c.j1 >= h + 16) {
      for (int64_t x0 = 0; x0 < d; x0 += 16) transpose16(c.k + h, x0, kt + x0 * kKeyChunk + h);
      continue;
    }
    for (int j = std::max(c.j0, h); j < std::min(c.j1, h + 16); ++j) {
      const float* k = c.k[j];
      for (int64_t x = 0; x < d; ++x) kt[x * kKeyChunk + j] = k[x];
    }
  }
}

// s[r * kKeyChunk + j] = q_r . k_j for R rows and all 32 lanes.
template <int R>
DSPINE_AVX512_FN void score_rows(const float* q, int64_t d, const float* kt, float* s) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t x = 0; x < d; ++x) {
    const __m512 k0 = _mm512_loadu_ps(kt + x * kKeyChunk), k1 = _mm512_loadu_ps(kt + x * kKeyChunk + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 qr = _mm512_set1_ps(q[r * d + x]);
      lo[r] = _mm512_fmadd_ps(qr, k0, lo[r]);
      hi[r] = _mm512_fmadd_ps(qr, k1, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(s + r * kKeyChunk, lo[r]);
    _mm512_storeu_ps(s + r * kKeyChunk + 16, hi[r]);
  }
}

DSPINE_AVX512_FN inline void score_tile(Avx512, int rows, const float* q, int64_t d, const float* kt, float* s) {
  switch (rows) {
    case 1: return score_rows<1>(q, d, kt, s);
    case 2: return score_rows<2>(q, d, kt, s);
    case 3: return score_rows<3>(q, d, kt, s);
    case 4: return score_rows<4>(q, d, kt, s);
    case 5: return score_rows<5>(q, d, kt, s);
    case 6: return score_rows<6>(q, d, kt, s);
    case 7: return score_rows<7>(q, d, kt, s);
    default: return score_rows<8>(q, d, kt, s);
  }
}

// Scores of the visible lanes -> probabilities (0 elsewhere); updates the row's max and sum and
// returns the factor its output must be rescaled by.
DSPINE_AVX512_FN inline float softmax_row(Avx512, float* s, uint32_t vis, float* m, float* l) {
  if (vis == 0) return 1.f;
  const __mmask16 lo = static_cast<__mmask16>(vis), hi = static_cast<__mmask16>(vis >> 16);
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  const __m512 s0 = _mm512_mask_loadu_ps(ninf, lo, s), s1 = _mm512_mask_loadu_ps(ninf, hi, s + 16);
  const float cmax = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
  if (cmax == kNegInf) {  // only with infinite inputs: the row takes nothing from this chunk
    _mm512_storeu_ps(s, _mm512_setzero_ps());
    _mm512_storeu_ps(s + 16, _mm512_setzero_ps());
    return 1.f;
  }
  const float m_new = std::max(*m, cmax);
  const float corr = std::exp(*m - m_new);  // exp(-inf) = 0 on the first visible chunk
  const __m512 mv = _mm512_set1_ps(m_new);
  const __m512 p0 = _mm512_maskz_mov_ps(lo, exp_avx512(_mm512_sub_ps(s0, mv)));
  const __m512 p1 = _mm512_maskz_mov_ps(hi, exp_avx512(_mm512_sub_ps(s1, mv)));
  _mm512_storeu_ps(s, p0);
  _mm512_storeu_ps(s + 16, p1);
  *l = *l * corr + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  *m = m_new;
  return corr;
}

// acc_r[x0, x0 + 16 NV) = acc_r * corr_r + sum over lanes j in [j0, j1) that row r sees of
// p_rj * v_j, for R rows. Full: every row sees every lane of [j0, j1), no masking needed.
template <int R, int NV, bool Full>
DSPINE_AVX512_FN void accumulate_rows(float* acc, int64_t d, int64_t x0, const float* corr, const float* p,
                                      const uint32_t* mask, const float* const* v, int j0, int j1) {
  __m512 a[R][NV];
  for (int r = 0; r < R; ++r) {
    const __m512 cr = _mm512_set1_ps(corr[r]);
    for (int u = 0; u < NV; ++u) a[r][u] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * d + x0 + 16 * u), cr);
  }
  for (int j = j0; j < j1; ++j) {
    __m512 vx[NV];
    for (int u = 0; u < NV; ++u) vx[u] = _mm512_loadu_ps(v[j] + x0 + 16 * u);
    for (int r = 0; r < R; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kKeyChunk + j]);
      if (Full) {
        for (int u = 0; u < NV; ++u) a[r][u] = _mm512_fmadd_ps(pr, vx[u], a[r][u]);
      } else {
        const __mmask16 on = (mask[r] >> j & 1u) ? 0xffff : 0;
        for (int u = 0; u < NV; ++u) a[r][u] = _mm512_mask3_fmadd_ps(pr, vx[u], a[r][u], on);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) _mm512_storeu_ps(acc + r * d + x0 + 16 * u, a[r][u]);
}

template <int NV, bool Full>
DSPINE_AVX512_FN inline void accumulate_tile(int rows, float* acc, int64_t d, int64_t x0, const float* corr,
                                             const float* p, const uint32_t* mask, const float* const* v, int j0,
                                             int j1) {
  switch (rows) {
    case 1: return accumulate_rows<1, NV, Full>(acc, d, x0, corr, p, mask, v, j0, j1);
    case 2: return accumulate_rows<2, NV, Full>(acc, d, x0, corr, p, mask, v, j0, j1);
    case 3: return accumulate_rows<3, NV, Full>(acc, d, x0, corr, p, mask, v, j0, j1);
    default: return accumulate_rows<4, NV, Full>(acc, d, x0, corr, p, mask, v, j0, j1);
  }
}

// Output update of a tile of rows over all of head_dim: 64 dims at a time, then 16.
template <bool Full>
DSPINE_AVX512_FN inline void accumulate_dims(int rows, float* acc, int64_t d, const float* corr, const float* p,
                                             const uint32_t* mask, const float* const* v, int j0, int j1) {
  int64_t x0 = 0;
  for (; x0 + 64 <= d; x0 += 64) accumulate_tile<4, Full>(rows, acc, d, x0, corr, p, mask, v, j0, j1);
  for (; x0 < d; x0 += 16) accumulate_tile<1, Full>(rows, acc, d, x0, corr, p, mask, v, j0, j1);
}

DSPINE_AVX512_FN inline void accumulate(Avx512, bool full, int rows, float* acc, int64_t d, const float* corr,
                                        const float* p, const uint32_t* mask, const float* const* v, int j0,
                                        int j1) {
  if (full)
    accumulate_dims<true>(rows, acc, d, corr, p, mask, v, j0, j1);
  else
    accumulate_dims<false>(rows, acc, d, corr, p, mask, v, j0, j1);
}

}  // namespace avx512
}  // namespace attn
}  // namespace cpu
}  // namespace dspine

DSPINE_AVX512_QUIET_END
#undef DSPINE_AVX512_FN
#endif
