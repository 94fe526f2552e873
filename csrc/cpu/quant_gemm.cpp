// Kernels of quant_gemm.h: a scalar, an AVX2 and an AVX-512 VNNI version of every tile kernel,
// chosen at run time (the library is built once and must run on CPUs without AVX-512).
//
// All versions compute each output with the same operations in the same order (see the header),
// so contracting a multiply and an add into an FMA would break the bitwise contract: this file
// is compiled without floating-point contraction.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
// GCC 12 flags its own AVX-512 conversion intrinsics (an undefined placeholder operand).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "quant_gemm.h"

#include "chunk_pool.h"
#include "common.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dspine {
namespace cpu {
namespace quant {

namespace {

constexpr int kRowGroup = 4;  // activation rows that share one pass over a weight tile

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise it
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while (!(mant & 0x400u));
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Activations of one call, quantised per row and block of 32.
struct QuantActs {
  int64_t nb = 0;
  std::vector<int8_t> q;  // [m, k]
  std::vector<float> d;   // [m, nb]: amax / 127 (NaN when the block holds a non-finite value)
  std::vector<float> s;   // [m, nb]: d * sum(q)
};

void quantize_block(const float* x, int8_t* q, float* d, float* s) {
  float amax = 0.f;
  bool finite = true;
  for (int e = 0; e < kBlock; ++e) {
    finite = finite && std::isfinite(x[e]);
    amax = std::max(amax, std::fabs(x[e]));
  }
  const float dx = finite ? amax / 127.0f : NAN;
  const float id = (finite && dx != 0.f) ? 1.0f / dx : 0.f;
  int32_t sum = 0;
  for (int e = 0; e < kBlock; ++e) {
    const int32_t qi = finite ? static_cast<int32_t>(std::nearbyint(x[e] * id)) : 0;  // ties to even
    q[e] = static_cast<int8_t>(qi);
    sum += qi;
  }
  *d = dx;
  *s = dx * static_cast<float>(sum);
}

#define DSPINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// quantize_block with AVX-512, bitwise the same: the max of magnitudes and the integer sum are
// exact in any order, the scale and its inverse are the same scalar operations, and the
// conversion rounds to nearest even as nearbyint does (the default rounding mode). A block
// holding a non-finite value takes the scalar path. Why: the scalar loop cost ~33 ns a block,
// ~0.1 ms of a CPU draft forward and ~0.5 ms of a 4-row verify of the default model.
DSPINE_AVX512 void quantize_block_avx512(const float* x, int8_t* q, float* d, float* s) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  const __mmask16 bad =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(a), exp), exp) |
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(b), exp), exp);
  if (bad) return quantize_block(x, q, d, s);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float dx = amax / 127.0f;
  const __m512 id = _mm512_set1_ps(dx != 0.f ? 1.0f / dx : 0.f);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id));
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *d = dx;
  *s = dx * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
}

QuantActs quantize_acts(const float* x, int64_t m, int64_t k) {
  const auto quantize = active_isa() == Isa::kAvx512Vnni ? &quantize_block_avx512 : &quantize_block;
  QuantActs a;
  a.nb = k / kBlock;
  a.q.resize(static_cast<size_t>(m * k));
  a.d.resize(static_cast<size_t>(m * a.nb));
  a.s.resize(static_cast<size_t>(m * a.nb));
  const int64_t blocks = m * a.nb;
  // Only a prompt's worth of rows is worth splitting (a 16-row block of a 2880-wide input is
  // ~20 us of work on one thread): chunks of kActChunk blocks on the kernels' threads, so that
  // a prompt runs on cpu_threads like every other kernel (not on torch's OpenMP team).
  constexpr int64_t kActChunk = 1024;
  parallel_for((blocks + kActChunk - 1) / kActChunk, kActChunk * kBlock, [&](int64_t c) {
    for (int64_t i = c * kActChunk; i < std::min(blocks, (c + 1) * kActChunk); ++i)
      quantize(x + i * kBlock, a.q.data() + i * kBlock, a.d.data() + i, a.s.data() + i);
  });
  return a;
}

// The weights of a step are larger than the caches and stream from memory once a step. The
// hardware prefetcher alone keeps too few lines in flight ahead of a kernel busy with dot
// products: on one core a 4-row GEMM read its weights at ~9 GB/s and a 1-row one at ~11, where
// a plain read streams ~15 (docs/BENCHMARKS.md, "prefetching the weights"). Each SIMD kernel
// asks, at every tile-block it reads, for the lines kPrefetchAhead bytes further along its
// stream (the next tiles' blocks). Prefetches never fault, so running past the tensor is harmless.
// Distances from 8 to 24 KiB measured alike; 16 KiB is ~3 Q4_1 tiles of a k = 576 matrix.
constexpr int64_t kPrefetchAhead = 16384;

template <int64_t Bytes>
inline void prefetch_ahead(const uint8_t* block) {
  for (int64_t line = 0; line < Bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchAhead + line, _MM_HINT_T0);
}

// Arguments of one tile kernel call: `rows` activation rows against one 16-row weight tile.
struct TileArgs {
  const uint8_t* w;  // the tile: nb tile-blocks
  int64_t nb, k;
  const int8_t* xq;  // first row's quantised activations (row stride k)
  const float* xd;   // first row's block scales (row stride nb)
  const float* xs;
  float* out;        // rows x 16 outputs, row stride ldo
  int64_t ldo;
};

// ---------------------------------------------------------------------------- scalar

int32_t isum_scalar(Format f, const uint8_t* blk, int n, const int8_t* x) {
  int32_t isum = 0;
  if (f == kQ4_1) {
    for (int p = 0; p < 4; ++p)
      for (int t = 0; t < 4; ++t) {
        const uint8_t byte = blk[64 + 64 * p + 4 * n + t];
        isum += (byte & 0x0f) * x[4 * p + t] + (byte >> 4) * x[16 + 4 * p + t];
      }
  } else {
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < 4; ++t)
        isum += static_cast<int8_t>(blk[32 + 64 * j + 4 * n + t]) * x[4 * j + t];
  }
  return isum;
}

void tile_scalar(Format f, int rows, const TileArgs& a) {
  const int64_t bytes = tile_block_bytes(f);
  for (int r = 0; r < rows; ++r)
    for (int n = 0; n < kTileRows; ++n) {
      float acc = 0.f;
      for (int64_t b = 0; b < a.nb; ++b) {
        const uint8_t* blk = a.w + b * bytes;
        const float isum = static_cast<float>(isum_scalar(f, blk, n, a.xq + r * a.k + b * kBlock));
        const float dw = half_to_float(blk + 2 * n);
        float part = (dw * a.xd[r * a.nb + b]) * isum;
        if (f == kQ4_1) part = part + half_to_float(blk + 32 + 2 * n) * a.xs[r * a.nb + b];
        acc = acc + part;
      }
      a.out[r * a.ldo + n] = acc;
    }
}

// ---------------------------------------------------------------------------- AVX2
// One ymm holds 8 outputs: each 32-bit lane gathers 4 consecutive k of one output row, so a
// broadcast of 4 activation bytes feeds all 8 rows at once (maddubs: u8 x s8 pairs -> s16).

#define DSPINE_AVX2 __attribute__((target("avx2,fma,f16c")))

template <int R>
DSPINE_AVX2 void q4_1_avx2(const TileArgs& a) {
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = a.w + b * 320;
    prefetch_ahead<320>(blk);
    const int8_t* xb = a.xq + b * kBlock;
    // 8 maddubs per lane add at most 8 * 2 * 15 * 127 = 30480: s16 cannot overflow.
    __m256i s16[R][2];
    for (int r = 0; r < R; ++r) s16[r][0] = s16[r][1] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 + 64 * p));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 96 + 64 * p));
      const __m256i lo0 = _mm256_and_si256(w0, low), hi0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), low);
      const __m256i lo1 = _mm256_and_si256(w1, low), hi1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), low);
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = xb + r * a.k;
        const __m256i xl = _mm256_set1_epi32(load_i32(xr + 4 * p));
        const __m256i xh = _mm256_set1_epi32(load_i32(xr + 16 + 4 * p));
        s16[r][0] = _mm256_add_epi16(s16[r][0], _mm256_add_epi16(_mm256_maddubs_epi16(lo0, xl),
                                                                 _mm256_maddubs_epi16(hi0, xh)));
        s16[r][1] = _mm256_add_epi16(s16[r][1], _mm256_add_epi16(_mm256_maddubs_epi16(lo1, xl),
                                                                 _mm256_maddubs_epi16(hi1, xh)));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
      const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * h)));
      for (int r = 0; r < R; ++r) {
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[r][h], ones));
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.xd[r * a.nb + b])), isum);
        const __m256 u = _mm256_mul_ps(mw, _mm256_set1_ps(a.xs[r * a.nb + b]));
        acc[r][h] = _mm256_add_ps(acc[r][h], _mm256_add_ps(t, u));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(a.out + r * a.ldo, acc[r][0]);
    _mm256_storeu_ps(a.out + r * a.ldo + 8, acc[r][1]);
  }
}

template <int R>
DSPINE_AVX2 void q8_0_avx2(const TileArgs& a) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = a.w + b * 544;
    prefetch_ahead<544>(blk);
    const int8_t* xb = a.xq + b * kBlock;
    __m256i s32[R][2];
    for (int r = 0; r < R; ++r) s32[r][0] = s32[r][1] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      // s8 x s8 through maddubs: |w| (unsigned) times x carrying w's sign; a pair adds at
      // most 2 * 128 * 127 < 32768, so the s16 step cannot saturate.
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 64 * j));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 + 64 * j));
      const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_set1_epi32(load_i32(xb + r * a.k + 4 * j));
        s32[r][0] = _mm256_add_epi32(s32[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(aw0, _mm256_sign_epi8(x, w0)), ones));
        s32[r][1] = _mm256_add_epi32(s32[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(aw1, _mm256_sign_epi8(x, w1)), ones));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h)));
      for (int r = 0; r < R; ++r) {
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.xd[r * a.nb + b])),
                                       _mm256_cvtepi32_ps(s32[r][h]));
        acc[r][h] = _mm256_add_ps(acc[r][h], t);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(a.out + r * a.ldo, acc[r][0]);
    _mm256_storeu_ps(a.out + r * a.ldo + 8, acc[r][1]);
  }
}

// ---------------------------------------------------------------------------- AVX-512 VNNI
// One zmm holds the 16 outputs of a tile; vpdpbusd does u8 x s8 4-way dot products into s32.
// (DSPINE_AVX512 is defined above, with the activations' quantiser.)


// T adjacent full tiles (16 T outputs) against the same rows; tile t's bytes start a.nb blocks
// after tile t - 1's, its outputs 16 columns later in a.out. Every output gets the same operations
// in the same order whatever T; T = 2 loads each row's activation broadcasts (4 bytes a dot
// product, the block's scale and sum) once for both tiles. Why T = 2: at 4 rows those broadcasts
// were a third of a tile's instructions, and on the CPU a 4-row verify's GEMMs do not hide under
// the weights' streaming (docs/BENCHMARKS.md, "a round op by op").
template <int R, int T = 1>
DSPINE_AVX512 void q4_1_avx512(const TileArgs& a) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk[T];
    for (int t = 0; t < T; ++t) {
      blk[t] = a.w + (t * a.nb + b) * 320;
      prefetch_ahead<320>(blk[t]);
    }
    const int8_t* xb = a.xq + b * kBlock;
    __m512i s32[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) s32[r][t] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      __m512i lo[T], hi[T];
      for (int t = 0; t < T; ++t) {
        const __m512i w = _mm512_loadu_si512(blk[t] + 64 + 64 * p);
        lo[t] = _mm512_and_si512(w, low);
        hi[t] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = xb + r * a.k;
        const __m512i xl = _mm512_set1_epi32(load_i32(xr + 4 * p));
        const __m512i xh = _mm512_set1_epi32(load_i32(xr + 16 + 4 * p));
        for (int t = 0; t < T; ++t) {
          s32[r][t] = _mm512_dpbusd_epi32(s32[r][t], lo[t], xl);
          s32[r][t] = _mm512_dpbusd_epi32(s32[r][t], hi[t], xh);
        }
      }
    }
    __m512 dw[T], mw[T];
    for (int t = 0; t < T; ++t) {
      dw[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[t])));
      mw[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[t] + 32)));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xd = _mm512_set1_ps(a.xd[r * a.nb + b]), xs = _mm512_set1_ps(a.xs[r * a.nb + b]);
      for (int t = 0; t < T; ++t) {
        const __m512 tt = _mm512_mul_ps(_mm512_mul_ps(dw[t], xd), _mm512_cvtepi32_ps(s32[r][t]));
        const __m512 u = _mm512_mul_ps(mw[t], xs);
        acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_add_ps(tt, u));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(a.out + r * a.ldo + 16 * t, acc[r][t]);
}

template <int R>
DSPINE_AVX512 void q4_1_avx512_pair(const TileArgs& a) {  // for the rows table below
  q4_1_avx512<R, 2>(a);
}

template <int R>
DSPINE_AVX512 void q8_0_avx512(const TileArgs& a) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = a.w + b * 544;
    prefetch_ahead<544>(blk);
    const int8_t* xb = a.xq + b * kBlock;
    __m512i s32[R];
    for (int r = 0; r < R; ++r) s32[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      // s8 x s8 as |w| (u8) times x negated where w < 0; |-128| reads as 128 unsigned.
      const __m512i w = _mm512_loadu_si512(blk + 32 + 64 * j);
      const __m512i aw = _mm512_abs_epi8(w);
      const __mmask64 negative = _mm512_movepi8_mask(w);
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_set1_epi32(load_i32(xb + r * a.k + 4 * j));
        s32[r] = _mm512_dpbusd_epi32(s32[r], aw, _mm512_mask_sub_epi8(x, negative, zero, x));
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    for (int r = 0; r < R; ++r) {
      const __m512 t = _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(a.xd[r * a.nb + b])),
                                     _mm512_cvtepi32_ps(s32[r]));
      acc[r] = _mm512_add_ps(acc[r], t);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(a.out + r * a.ldo, acc[r]);
}

// ---------------------------------------------------------------------------- dispatch

using TileKernel = void (*)(const TileArgs&);

#define DSPINE_ROWS_TABLE(fn) {&fn<1>, &fn<2>, &fn<3>, &fn<4>}

// `tiles` adjacent tiles a call: 2 only for Q4_1 on AVX-512 VNNI (run_tiles pairs them).
TileKernel simd_kernel(Isa isa, Format f, int rows, int tiles) {
  static const TileKernel q4_avx2[kRowGroup] = DSPINE_ROWS_TABLE(q4_1_avx2);
  static const TileKernel q8_avx2[kRowGroup] = DSPINE_ROWS_TABLE(q8_0_avx2);
  static const TileKernel q4_avx512[kRowGroup] = DSPINE_ROWS_TABLE(q4_1_avx512);
  static const TileKernel q4_avx512_pair[kRowGroup] = DSPINE_ROWS_TABLE(q4_1_avx512_pair);
  static const TileKernel q8_avx512[kRowGroup] = DSPINE_ROWS_TABLE(q8_0_avx512);
  if (tiles == 2) return q4_avx512_pair[rows - 1];
  if (isa == Isa::kAvx512Vnni) return (f == kQ4_1 ? q4_avx512 : q8_avx512)[rows - 1];
  return (f == kQ4_1 ? q4_avx2 : q8_avx2)[rows - 1];
}

void run_tile(Isa isa, Format f, int rows, int tiles, const TileArgs& a) {
  if (isa == Isa::kScalar)
    tile_scalar(f, rows, a);
  else
    simd_kernel(isa, f, rows, tiles)(a);
}

void run_tiles(Isa isa, Format f, const uint8_t* w, int64_t g0, int64_t g1, const QuantActs& acts,
               int64_t m, int64_t k, int64_t n, float* y) {
  const int64_t tile_bytes = acts.nb * tile_block_bytes(f);
  float partial[kRowGroup * kTileRows];
  const bool pairs = isa == Isa::kAvx512Vnni && f == kQ4_1;
  for (int64_t g = g0, tiles = 1; g < g1; g += tiles) {
    // Two full tiles of this chunk a call where the kernel exists (q4_1_avx512<R, 2>).
    tiles = pairs && g + 1 < g1 && (g + 2) * kTileRows <= n ? 2 : 1;
    const int64_t cols = std::min<int64_t>(tiles * kTileRows, n - g * kTileRows);
    for (int64_t r0 = 0; r0 < m; r0 += kRowGroup) {
      const int rows = static_cast<int>(std::min<int64_t>(kRowGroup, m - r0));
      const bool direct = cols == tiles * kTileRows;  // a padded last tile goes through `partial`
      TileArgs a{w + g * tile_bytes, acts.nb, k, acts.q.data() + r0 * k, acts.d.data() + r0 * acts.nb,
                 acts.s.data() + r0 * acts.nb, direct ? y + r0 * n + g * kTileRows : partial,
                 direct ? n : kTileRows};
      run_tile(isa, f, rows, static_cast<int>(tiles), a);
      if (!direct)
        for (int r = 0; r < rows; ++r)
          std::memcpy(y + (r0 + r) * n + g * kTileRows, partial + r * kTileRows, cols * sizeof(float));
    }
  }
}

struct MatmulJob {
  Isa isa;
  Format f;
  const uint8_t* w;
  const QuantActs* acts;
  int64_t m, k, n, tiles, chunk;
  float* y;
};

void matmul_chunk(void* ctx, int64_t c) {
  const auto& j = *static_cast<const MatmulJob*>(ctx);
  run_tiles(j.isa, j.f, j.w, c * j.chunk, std::min(j.tiles, (c + 1) * j.chunk), *j.acts, j.m, j.k, j.n, j.y);
}

}  // namespace

void quant_matmul(const float* x, int64_t m, int64_t k, const uint8_t* w, Format f, int64_t n,
                  float* y) {
  if (m == 0 || n == 0) return;
  const QuantActs acts = quantize_acts(x, m, k);
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  const int threads = max_threads();  // the kernels' threads (common.h)
  // Threads split the outputs, never k, so an output's reduction order does not depend on them.
  // About 8 chunks a thread, claimed dynamically (chunk_pool.h says why not OpenMP).
  const int64_t chunk = std::max<int64_t>(1, tiles / (8 * threads));
  MatmulJob job{active_isa(), f, w, &acts, m, k, n, tiles, chunk, y};
  ChunkPool::instance().run((tiles + chunk - 1) / chunk, threads, &matmul_chunk, &job);
}

void quant_rows(const int64_t* ids, int64_t count, const uint8_t* w, Format f, int64_t k,
                float* out) {
  const int64_t nb = k / kBlock, bytes = tile_block_bytes(f);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t g = ids[i] / kTileRows;
    const int n = static_cast<int>(ids[i] % kTileRows);
    float* o = out + i * k;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + (g * nb + b) * bytes;
      const float d = half_to_float(blk + 2 * n);
      if (f == kQ4_1) {
        const float mn = half_to_float(blk + 32 + 2 * n);
        for (int e = 0; e < 16; ++e) {
          const uint8_t byte = blk[64 + 64 * (e / 4) + 4 * n + e % 4];
          o[b * kBlock + e] = d * static_cast<float>(byte & 0x0f) + mn;
          o[b * kBlock + 16 + e] = d * static_cast<float>(byte >> 4) + mn;
        }
      } else {
        for (int e = 0; e < kBlock; ++e)
          o[b * kBlock + e] = d * static_cast<float>(static_cast<int8_t>(blk[32 + 64 * (e / 4) + 4 * n + e % 4]));
      }
    }
  }
}

}  // namespace quant
}  // namespace cpu
}  // namespace dspine
