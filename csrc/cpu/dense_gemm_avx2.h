// The AVX2 panel kernel of dense_gemm.h: up to 3 rows x one 64-column panel, taken as two halves
// of 4 vectors of 8 columns (16 registers: 12 accumulators, 3 row broadcasts, a weight vector),
// every lane one output's chain of fused multiply-adds over k in order (the order dense_gemm.h
// states). Called on CPUs with AVX2 and FMA (isa.h), from code built for any x86-64.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSPINE_DENSE_SIMD 1

#include <immintrin.h>

#include <type_traits>

#include "dense_panel.h"

#define DSPINE_DENSE_AVX2_FN __attribute__((target("avx2,fma,f16c")))

namespace dspine {
namespace cpu {
namespace dense {

constexpr int kRowsAvx2 = 3;
static_assert(kRowsAvx2 <= kRowsMax, "dense_gemm.h sizes its buffers by kRowsMax");

// 8 weights widened to fp32 (exact for every type).
template <typename T>
DSPINE_DENSE_AVX2_FN inline __m256 load8(const T* p) {
  if constexpr (std::is_same<T, float>::value) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kIsFp16<T>) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16
  }
}

// Columns [half * 32, half * 32 + 32) of the panel.
template <int R, typename T>
DSPINE_DENSE_AVX2_FN void half_avx2(const PanelArgs<T>& a, int half) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  const T* w = a.panel + 32 * half;
  for (int64_t kk = 0; kk < a.k; ++kk, w += kPanel) {
    if (a.prefetch && half == 0) prefetch_row(w);
    __m256 xb[R];
    for (int r = 0; r < R; ++r) xb[r] = _mm256_set1_ps(a.x[r * a.ldx + kk]);
    for (int c = 0; c < 4; ++c) {
      const __m256 wv = load8(w + 8 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xb[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(a.out + r * a.ldo + 32 * half + 8 * c, acc[r][c]);
}

template <int R, typename T>
void rows_avx2(const PanelArgs<T>& a) {
  half_avx2<R>(a, 0);
  half_avx2<R>(a, 1);
}

template <typename T>
void panel_avx2(const PanelArgs<T>& a, int rows) {
  switch (rows) {
    case 1: return rows_avx2<1>(a);
    case 2: return rows_avx2<2>(a);
    default: return rows_avx2<3>(a);
  }
}

}  // namespace dense
}  // namespace cpu
}  // namespace dspine

#endif  // x86-64
