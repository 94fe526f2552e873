// The gated MLP's activation (CPU): out[t, c] = silu(x[t, c]) * x[t, I + c] for x [rows, 2I].
#pragma once

#include "common.h"

namespace dspine {
namespace cpu {

// fp32 math and one rounding to T: silu(g) = g * sigmoid(g).
template <typename T>
void silu_mul(const T* x, T* out, int64_t rows, int64_t inter) {
  parallel_for(rows, 4 * inter, [&](int64_t row) {
    const T* gate = x + row * 2 * inter;
    const T* up = gate + inter;
    T* o = out + row * inter;
    for (int64_t c = 0; c < inter; ++c) {
      const float g = to_f(gate[c]);
      o[c] = from_f<T>(g * sigmoidf(g) * to_f(up[c]));
    }
  });
}

}  // namespace cpu
}  // namespace dspine
