// Fused adjacent causal injection (CPU): gate + shift-by-one + multiply + residual add.
#pragma once

#include "common.h"

namespace dspine {
namespace cpu {

// h, gate_h, out: [n, block, hidden]; fproj: [n, block, 2*hidden] = [W_gf f | W_i f].
// out[:, 0] = h[:, 0]; out[:, j] = h[:, j] + sigmoid(gate_h[:, j] + fproj[:, j-1, :H]) * fproj[:, j-1, H:].
template <typename T>
void fused_injection(const T* h, const T* gate_h, const T* fproj, T* out, int64_t n,
                     int64_t block, int64_t hidden) {
  parallel_for(n * block, 4 * hidden, [&](int64_t row) {
    const int64_t j = row % block;
    const T* hr = h + row * hidden;
    T* o = out + row * hidden;
    if (j == 0) {
      for (int64_t x = 0; x < hidden; ++x) o[x] = hr[x];
      return;
    }
    const T* g = gate_h + row * hidden;
    const T* f = fproj + (row - 1) * 2 * hidden;  // the predecessor's projections
    for (int64_t x = 0; x < hidden; ++x)
      o[x] = from_f<T>(to_f(hr[x]) + sigmoidf(to_f(g[x]) + to_f(f[x])) * to_f(f[hidden + x]));
  });
}

}  // namespace cpu
}  // namespace dspine
