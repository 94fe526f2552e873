// RoPE (rotate-half form) and the paged KV write with RoPE fused on the keys (CPU).
#pragma once

#include <algorithm>
#include <type_traits>

#include "common.h"

namespace dspine {
namespace cpu {

// Rotates one head vector of length d by the table row cs = [cos(0..d/2), sin(0..d/2)]. The
// rotation is computed in fp32 and rounded once into out's type (an fp16 cache's keys: rounded
// after the rotation, to nearest even as torch's .half()).
template <typename T, typename O>
inline void rotate_head(const T* in, O* out, const float* cs, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[i], s = cs[half + i];
    const float x1 = to_f(in[i]), x2 = to_f(in[half + i]);
    out[i] = from_f<O>(x1 * c - x2 * s);
    out[half + i] = from_f<O>(x2 * c + x1 * s);
  }
}

// out[0, d) = in[0, d) in out's type: a copy of the bits when the types are the same (a NaN's
// payload included), else through fp32, rounded once.
template <typename T, typename O>
inline void convert_row(const T* in, O* out, int64_t d) {
  if constexpr (std::is_same<T, O>::value) {
    std::copy(in, in + d, out);
  } else {
    for (int64_t i = 0; i < d; ++i) out[i] = from_f<O>(to_f(in[i]));
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
// C is the cache's element type: T's, or fp16 under fp32 rows (each value rounded once).
template <typename T, typename C>
void write_kv(const T* k, int64_t k_stride, const T* v, int64_t v_stride,
              const int32_t* positions, const float* cos_sin, C* k_cache, C* v_cache,
              const int32_t* slots, int64_t n, int64_t kv_heads, int64_t d) {
  parallel_for(n, 2 * kv_heads * d, [&](int64_t t) {
    const int64_t slot = slots[t];
    if (slot < 0) return;
    C* kd = k_cache + slot * kv_heads * d;
    C* vd = v_cache + slot * kv_heads * d;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const T* ks = k + t * k_stride + h * d;
      if (cos_sin) {
        rotate_head(ks, kd + h * d, cos_sin + static_cast<int64_t>(positions[t]) * d, d);
      } else {
        convert_row(ks, kd + h * d, d);
      }
      convert_row(v + t * v_stride + h * d, vd + h * d, d);
    }
  });
}

}  // namespace cpu
}  // namespace dspine
