// The contract between dense_gemm.h's driver and its panel kernels (scalar here, AVX2 and
// AVX-512 in dense_gemm_avx2.h / dense_gemm_avx512.h): what one kernel call computes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace dspine {
namespace cpu {
namespace dense {

constexpr int64_t kPanel = 64;  // output columns of one panel: 4 AVX-512 vectors of fp32
constexpr int kRowsMax = 6;     // the most rows a kernel call takes (any instruction set)

// One call of a panel kernel: `rows` rows of x (fp32, row stride ldx) against one panel of k
// rows of kPanel weights, into out[r * ldo + c] (fp32, all kPanel columns).
template <typename T>
struct PanelArgs {
  const float* x;
  int64_t ldx;
  const T* panel;
  int64_t k;
  float* out;
  int64_t ldo;
  bool prefetch;  // stream the panel from memory (its first row group), not from the cache
};

// A panel streams from memory once a call (its first row group); the hardware prefetcher alone
// keeps too few lines in flight for that stream (as for the quantised kernels: quant_gemm.cpp).
// A kernel asks, at each k, for the lines of the weight row this many bytes further along (the
// next panel's near a panel's end: a chunk's panels are adjacent). Prefetches never fault.
constexpr int64_t kPrefetchAhead = 16384;

template <typename T>
inline void prefetch_row(const T* w) {
  const char* p = reinterpret_cast<const char*>(w) + kPrefetchAhead;
  for (int64_t line = 0; line < kPanel * static_cast<int64_t>(sizeof(T)); line += 64)
    __builtin_prefetch(p + line, 0, 3);
}

// The scalar kernel: the same fused multiply-adds one lane at a time (std::fma is exact
// wherever the CPU lacks the instruction).
template <typename T>
void panel_scalar(const PanelArgs<T>& a, int rows) {
  for (int r = 0; r < rows; ++r) {
    float acc[kPanel] = {};
    const float* x = a.x + r * a.ldx;
    for (int64_t kk = 0; kk < a.k; ++kk) {
      const T* w = a.panel + kk * kPanel;
      for (int64_t c = 0; c < kPanel; ++c) acc[c] = std::fma(x[kk], to_f(w[c]), acc[c]);
    }
    std::memcpy(a.out + r * a.ldo, acc, sizeof(acc));
  }
}

}  // namespace dense
}  // namespace cpu
}  // namespace dspine
