// Dense GEMM on the CPU whose every output has one fixed reduction order: y = x @ W^T for fp32,
// bf16 or fp16 x, W and y (the same type), W [n, k] from a checkpoint.
//
// Why our own: greedy speculative decoding is token-identical to autoregressive decoding only if
// a position's row gives the same bits in a one-row decode step and inside a multi-row verify or
// prefill call. A BLAS may compute full blocks of rows and the rows left over with different
// kernels (MKL's sgemm on an AMD EPYC: rows of multiples of 4 differ in the last bits from calls
// of 1-3 rows; docs/DECISIONS.md), and padding every call to its block made a lone sequence's
// decode step a 4-row GEMM.
//
// Order: each output is one chain of fused multiply-adds over k in order, in fp32:
//   acc = 0; for kk = 0 .. k-1: acc = fma(x[i][kk], W[j][kk], acc);  y[i][j] = acc  (rounded
//   to nearest even for bf16 / fp16)
// whatever the number of rows of the call, the row group a row falls in, the thread that runs it
// and the instruction set (dspine_engine/ops.py: dense_matmul_ref). SIMD lanes hold output
// columns, never parts of one sum, and threads split the columns, never k.
//
// Layout: W is repacked once at load into panels of kPanel output columns,
//   packed[p][kk][c] = W[kPanel * p + c][kk]   (0 where kPanel * p + c >= n)
// so that a panel is one contiguous stream of k rows of kPanel values: the weights are read once
// a call for all its rows (a decode step is bound by that read), and a panel stays in the L2
// cache while the row groups of a prefill pass over it. No torch dependency.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"
#include "dense_panel.h"
#include "dense_gemm_avx2.h"
#include "dense_gemm_avx512.h"
#include "isa.h"

namespace dspine {
namespace cpu {
namespace dense {

// The rows one kernel call takes in this instruction set (its accumulators fill the registers).
inline int row_group(Isa isa) {
#if defined(DSPINE_DENSE_SIMD)
  if (isa >= Isa::kAvx512Vnni) return kRowsAvx512;
  if (isa >= Isa::kAvx2) return kRowsAvx2;
#endif
  (void)isa;
  return 4;
}

template <typename T>
void run_panel(Isa isa, const PanelArgs<T>& a, int rows) {
#if defined(DSPINE_DENSE_SIMD)
  if (isa >= Isa::kAvx512Vnni) return panel_avx512(a, rows);
  if (isa >= Isa::kAvx2) return panel_avx2(a, rows);
#endif
  panel_scalar(a, rows);
}

// Panels [p0, p1) for every row of the call.
template <typename T>
void run_panels(Isa isa, const float* x, int64_t m, int64_t k, const T* w, int64_t n, T* y,
                int64_t p0, int64_t p1) {
  const int group = row_group(isa);
  float partial[kRowsMax * kPanel];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t col = p * kPanel, cols = std::min(kPanel, n - col);
    for (int64_t r0 = 0; r0 < m; r0 += group) {
      const int rows = static_cast<int>(std::min<int64_t>(group, m - r0));
      // fp32 outputs of a full panel are written in place; others go through `partial`.
      float* out = partial;
      if constexpr (std::is_same<T, float>::value)
        if (cols == kPanel) out = y + r0 * n + col;
      const bool direct = out != partial;
      run_panel(isa, PanelArgs<T>{x + r0 * k, k, w + p * k * kPanel, k, out, direct ? n : kPanel, r0 == 0},
                rows);
      if (!direct)
        for (int r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) y[(r0 + r) * n + col + c] = from_f<T>(partial[r * kPanel + c]);
    }
  }
}

// y[m, n] = x[m, k] @ W^T with W packed as above (ceil(n / kPanel) panels). x, y row-major.
template <typename T>
void dense_matmul(const T* x, int64_t m, int64_t k, const T* w, int64_t n, T* y) {
  if (m == 0 || n == 0) return;
  // The kernels read fp32 activations: bf16 / fp16 rows are widened once (exactly).
  std::vector<float> widened;
  const float* xf;
  if constexpr (std::is_same<T, float>::value) {
    xf = x;
  } else {
    widened.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m * k; ++i) widened[i] = to_f(x[i]);
    xf = widened.data();
  }
  const Isa isa = active_isa();
  const int64_t panels = (n + kPanel - 1) / kPanel;
  // About 8 chunks a thread, claimed dynamically (common.h parallel_for); a small product stays
  // on the calling thread.
  const int64_t chunk = std::max<int64_t>(1, panels / (8 * max_threads()));
  const int64_t chunks = (panels + chunk - 1) / chunk;
  parallel_for(chunks, chunk * kPanel * k * m, [&](int64_t c) {
    run_panels(isa, xf, m, k, w, n, y, c * chunk, std::min(panels, (c + 1) * chunk));
  });
}

}  // namespace dense
}  // namespace cpu
}  // namespace dspine
