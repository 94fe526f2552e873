// RoPE (rotate-half form) and the paged KV write with RoPE fused on the keys (CUDA).
//
// One thread per (token, head, i < D/2) rotation pair: it reads x[i] and x[i + D/2] and the
// matching cos/sin, so neighbouring threads touch neighbouring addresses (coalesced). Both ops are
// pure bandwidth. A position outside the cos/sin table is an error (a device-side assert): the
// table is never read past, and nothing is written for that token.
#pragma once

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kRopeBlock = 256;

struct RotationPair {
  int64_t token;
  int head, i;
};

__device__ __forceinline__ RotationPair rotation_pair(int64_t idx, int heads, int half) {
  const int64_t per_token = static_cast<int64_t>(heads) * half;
  const int rem = static_cast<int>(idx % per_token);
  return {idx / per_token, rem / half, rem % half};
}

// Writes rope(in)[i] and rope(in)[i + half] to out.
template <typename T>
__device__ __forceinline__ void rotate_pair(const T* in, T* out, int i, int half, int pos,
                                            const float* cos_sin, int max_pos) {
  DSPINE_DEVICE_REQUIRE(pos >= 0 && pos < max_pos, "rope: position outside the cos/sin table");
  if (pos < 0 || pos >= max_pos) return;  // (unreachable past the check; keeps reads in bounds)
  const float c = cos_sin[static_cast<int64_t>(pos) * 2 * half + i];
  const float s = cos_sin[static_cast<int64_t>(pos) * 2 * half + half + i];
  const float x1 = to_float(in[i]), x2 = to_float(in[i + half]);
  out[i] = from_float<T>(x1 * c - x2 * s);
  out[i + half] = from_float<T>(x2 * c + x1 * s);
}

template <typename T>
__global__ void __launch_bounds__(kRopeBlock)
rope_kernel(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out,
            const int32_t* __restrict__ positions, const float* __restrict__ cos_sin, int max_pos,
            int64_t n, int heads, int d) {
  const int half = d / 2;
  const int64_t total = n * heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const RotationPair r = rotation_pair(idx, heads, half);
    const T* in = x + r.token * x_stride + static_cast<int64_t>(r.head) * d;
    T* o = out + (r.token * heads + r.head) * d;
    rotate_pair(in, o, r.i, half, positions[r.token], cos_sin, max_pos);
  }
}

// cos_sin == nullptr: keys are copied without rotation. Slots < 0 (padding) or past the cache
// (`capacity` slots; it cannot be checked on the host without a sync) are skipped.
template <typename T>
__global__ void __launch_bounds__(kRopeBlock)
write_kv_kernel(const T* __restrict__ k, int64_t k_stride, const T* __restrict__ v, int64_t v_stride,
                const int32_t* __restrict__ positions, const float* __restrict__ cos_sin, int max_pos,
                T* __restrict__ k_cache, T* __restrict__ v_cache, const int32_t* __restrict__ slots,
                int64_t capacity, int64_t n, int heads, int d) {
  const int half = d / 2;
  const int64_t total = n * heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const RotationPair r = rotation_pair(idx, heads, half);
    const int64_t slot = slots[r.token];
    if (slot < 0 || slot >= capacity) continue;
    const int64_t dst = (slot * heads + r.head) * d;
    const T* ks = k + r.token * k_stride + static_cast<int64_t>(r.head) * d;
    const T* vs = v + r.token * v_stride + static_cast<int64_t>(r.head) * d;
    if (cos_sin) {
      rotate_pair(ks, k_cache + dst, r.i, half, positions[r.token], cos_sin, max_pos);
    } else {
      k_cache[dst + r.i] = ks[r.i];
      k_cache[dst + r.i + half] = ks[r.i + half];
    }
    v_cache[dst + r.i] = vs[r.i];
    v_cache[dst + r.i + half] = vs[r.i + half];
  }
}

inline unsigned rope_grid(int64_t pairs) { return grid_stride_blocks(pairs, kRopeBlock); }

template <typename T>
void launch_rope(const T* x, int64_t x_stride, T* out, const int32_t* positions, const float* cos_sin,
                 int max_pos, int64_t n, int heads, int d, cudaStream_t stream) {
  const int64_t pairs = n * heads * (d / 2);
  if (pairs == 0) return;
  rope_kernel<T><<<rope_grid(pairs), kRopeBlock, 0, stream>>>(x, x_stride, out, positions, cos_sin,
                                                              max_pos, n, heads, d);
}

template <typename T>
void launch_write_kv(const T* k, int64_t k_stride, const T* v, int64_t v_stride, const int32_t* positions,
                     const float* cos_sin, int max_pos, T* k_cache, T* v_cache, const int32_t* slots,
                     int64_t capacity, int64_t n, int heads, int d, cudaStream_t stream) {
  const int64_t pairs = n * heads * (d / 2);
  if (pairs == 0) return;
  write_kv_kernel<T><<<rope_grid(pairs), kRopeBlock, 0, stream>>>(
      k, k_stride, v, v_stride, positions, cos_sin, max_pos, k_cache, v_cache, slots, capacity, n,
      heads, d);
}

}  // namespace gpu
}  // namespace dspine
