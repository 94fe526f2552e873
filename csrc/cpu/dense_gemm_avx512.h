// The AVX-512 panel kernel of dense_gemm.h: up to 6 rows x one 64-column panel, 4 vectors of 16
// columns a row, every lane one output's chain of fused multiply-adds over k in order (the order
// dense_gemm.h states). Called on CPUs with AVX-512 (isa.h), from code built for any x86-64: the
// functions carry their target.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSPINE_DENSE_SIMD 1

#include <immintrin.h>

#include <type_traits>

#include "dense_panel.h"
#include "isa.h"

#define DSPINE_DENSE_AVX512_FN __attribute__((target("avx512f,avx2,fma,f16c")))

DSPINE_AVX512_QUIET_BEGIN  // isa.h

namespace dspine {
namespace cpu {
namespace dense {

// 24 accumulators, 6 row broadcasts and a weight vector: 31 of the 32 registers.
constexpr int kRowsAvx512 = 6;
static_assert(kRowsAvx512 <= kRowsMax, "dense_gemm.h sizes its buffers by kRowsMax");

// 16 weights widened to fp32 (exact for every type).
template <typename T>
DSPINE_DENSE_AVX512_FN inline __m512 load16(const T* p) {
  if constexpr (std::is_same<T, float>::value) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kIsFp16<T>) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16
  }
}

template <int R, typename T>
DSPINE_DENSE_AVX512_FN void rows_avx512(const PanelArgs<T>& a) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  const T* w = a.panel;
  for (int64_t kk = 0; kk < a.k; ++kk, w += kPanel) {
    if (a.prefetch) prefetch_row(w);
    __m512 xb[R];
    for (int r = 0; r < R; ++r) xb[r] = _mm512_set1_ps(a.x[r * a.ldx + kk]);
    for (int c = 0; c < 4; ++c) {
      const __m512 wv = load16(w + 16 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(xb[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(a.out + r * a.ldo + 16 * c, acc[r][c]);
}

template <typename T>
void panel_avx512(const PanelArgs<T>& a, int rows) {
  switch (rows) {
    case 1: return rows_avx512<1>(a);
    case 2: return rows_avx512<2>(a);
    case 3: return rows_avx512<3>(a);
    case 4: return rows_avx512<4>(a);
    case 5: return rows_avx512<5>(a);
    default: return rows_avx512<6>(a);
  }
}

}  // namespace dense
}  // namespace cpu
}  // namespace dspine

DSPINE_AVX512_QUIET_END

#endif  // x86-64
