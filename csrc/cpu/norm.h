// RMSNorm and the fused residual-add + RMSNorm (CPU).
#pragma once

#include "common.h"

namespace dspine {
namespace cpu {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows of length d.
// When residual_out is given, x is first replaced by x + residual (written to residual_out).
template <typename T>
void rms_norm(const T* x, const T* residual, const T* w, T* out, T* residual_out, int64_t rows,
              int64_t d, float eps) {
  parallel_for(rows, d, [&](int64_t r) {
    const T* xr = x + r * d;
    float ss = 0.f;
    if (residual) {
      const T* rr = residual + r * d;
      T* so = residual_out + r * d;
      for (int64_t i = 0; i < d; ++i) {
        // Round the sum to T first: the next layer sees exactly this stored residual.
        T s = from_f<T>(to_f(xr[i]) + to_f(rr[i]));
        so[i] = s;
        float f = to_f(s);
        ss += f * f;
      }
      xr = so;
    } else {
      for (int64_t i = 0; i < d; ++i) {
        float f = to_f(xr[i]);
        ss += f * f;
      }
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    T* o = out + r * d;
    for (int64_t i = 0; i < d; ++i) o[i] = from_f<T>(to_f(xr[i]) * inv * to_f(w[i]));
  });
}

}  // namespace cpu
}  // namespace dspine
