// RoPE (rotate-half form) and the paged KV write with RoPE fused on the keys (CPU).
#pragma once

#include "common.h"

namespace dspine {
namespace cpu {

// Rotates one head vector of length d by the table row cs = [cos(0..d/2), sin(0..d/2)].
template <typename T>
inline void rotate_head(const T* in, T* out, const float* cs, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[i], s = cs[half + i];
    const float x1 = to_f(in[i]), x2 = to_f(in[half + i]);
    out[i] = from_f<T>(x1 * c - x2 * s);
    out[half + i] = from_f<T>(x2 * c + x1 * s);
  }
}

// x: [n, heads, d] with token stride x_stride (elements) and contiguous heads; out contiguous.
template <typename T>
void rope(const T* x, int64_t x_stride, T* out, const int32_t* positions, const float* cos_sin,
          int64_t n, int64_t heads, int64_t d) {
  parallel_for(n, heads * d, [&](int64_t t) {
    const float* cs = cos_sin + static_cast<int64_t>(positions[t]) * d;
    for (int64_t h = 0; h < heads; ++h)
      rotate_head(x + t * x_stride + h * d, out + (t * heads + h) * d, cs, d);
  });
}

// Writes rope(k) (or k as is when cos_sin is null) and v into cache slots; slot < 0 is skipped.
// Caches are [pages, page_size, kv_heads, d] contiguous, so a slot addresses kv_heads * d values.
template <typename T>
void write_kv(const T* k, int64_t k_stride, const T* v, int64_t v_stride,
              const int32_t* positions, const float* cos_sin, T* k_cache, T* v_cache,
              const int32_t* slots, int64_t n, int64_t kv_heads, int64_t d) {
  parallel_for(n, 2 * kv_heads * d, [&](int64_t t) {
    const int64_t slot = slots[t];
    if (slot < 0) return;
    T* kd = k_cache + slot * kv_heads * d;
    T* vd = v_cache + slot * kv_heads * d;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const T* ks = k + t * k_stride + h * d;
      if (cos_sin) {
        rotate_head(ks, kd + h * d, cos_sin + static_cast<int64_t>(positions[t]) * d, d);
      } else {
        for (int64_t i = 0; i < d; ++i) kd[h * d + i] = ks[i];
      }
      const T* vs = v + t * v_stride + h * d;
      for (int64_t i = 0; i < d; ++i) vd[h * d + i] = vs[i];
    }
  });
}

}  // namespace cpu
}  // namespace dspine
