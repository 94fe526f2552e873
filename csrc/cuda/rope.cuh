// RoPE (rotate-half form), the paged KV write with RoPE fused on the keys, and both in one launch
// (rope_write_kv: a target layer's query rotation and KV write) (CUDA).
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

// The rotations of one op: x [n, heads, d] (rows x_stride apart) rotated into out (contiguous).
template <typename T>
struct RopeArgs {
  const T* x;
  int64_t x_stride;
  T* out;
  int heads;
};

// The KV write of one op. cos_sin == nullptr: keys are copied without rotation. Slots < 0
// (padding) or past the cache (`capacity` slots; it cannot be checked on the host without a
// sync) are skipped.
template <typename T>
struct WriteKvArgs {
  const T* k;
  int64_t k_stride;
  const T* v;
  int64_t v_stride;
  T* k_cache;
  T* v_cache;
  const int32_t* slots;
  int64_t capacity;
  int heads;
};

// Rotation pair idx of a RoPE op.
template <typename T>
__device__ __forceinline__ void rope_pair(const RopeArgs<T>& a, int64_t idx, const int32_t* positions,
                                          const float* cos_sin, int max_pos, int d) {
  const int half = d / 2;
  const RotationPair r = rotation_pair(idx, a.heads, half);
  const T* in = a.x + r.token * a.x_stride + static_cast<int64_t>(r.head) * d;
  T* o = a.out + (r.token * a.heads + r.head) * d;
  rotate_pair(in, o, r.i, half, positions[r.token], cos_sin, max_pos);
}

// Rotation pair idx of a KV write: k's pair rotated (or copied) and v's pair copied into the slot.
template <typename T>
__device__ __forceinline__ void write_kv_pair(const WriteKvArgs<T>& a, int64_t idx, const int32_t* positions,
                                              const float* cos_sin, int max_pos, int d) {
  const int half = d / 2;
  const RotationPair r = rotation_pair(idx, a.heads, half);
  const int64_t slot = a.slots[r.token];
  if (slot < 0 || slot >= a.capacity) return;
  const int64_t dst = (slot * a.heads + r.head) * d;
  const T* ks = a.k + r.token * a.k_stride + static_cast<int64_t>(r.head) * d;
  const T* vs = a.v + r.token * a.v_stride + static_cast<int64_t>(r.head) * d;
  if (cos_sin) {
    rotate_pair(ks, a.k_cache + dst, r.i, half, positions[r.token], cos_sin, max_pos);
  } else {
    a.k_cache[dst + r.i] = ks[r.i];
    a.k_cache[dst + r.i + half] = ks[r.i + half];
  }
  a.v_cache[dst + r.i] = vs[r.i];
  a.v_cache[dst + r.i + half] = vs[r.i + half];
}

// One grid-stride loop over the query rotations (q_pairs of them; 0 for write_kv alone) and then
// the KV write's pairs (kv_pairs; 0 for rope alone): rope, write_kv and rope_write_kv are this one
// kernel, so a target layer rotates its queries and writes its keys in a single launch.
template <typename T>
__global__ void __launch_bounds__(kRopeBlock)
rope_write_kv_kernel(const RopeArgs<T> q, int64_t q_pairs, const WriteKvArgs<T> kv, int64_t kv_pairs,
                     const int32_t* __restrict__ positions, const float* __restrict__ cos_sin, int max_pos,
                     int d) {
  const int64_t total = q_pairs + kv_pairs;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (idx < q_pairs)
      rope_pair(q, idx, positions, cos_sin, max_pos, d);
    else
      write_kv_pair(kv, idx - q_pairs, positions, cos_sin, max_pos, d);
  }
}

// n tokens; q.heads (kv.heads) 0 leaves the rotation (the write) out.
template <typename T>
void launch_rope_write_kv(const RopeArgs<T>& q, const WriteKvArgs<T>& kv, const int32_t* positions,
                          const float* cos_sin, int max_pos, int64_t n, int d, cudaStream_t stream) {
  const int64_t q_pairs = n * q.heads * (d / 2), kv_pairs = n * kv.heads * (d / 2);
  if (q_pairs + kv_pairs == 0) return;
  rope_write_kv_kernel<T><<<grid_stride_blocks(q_pairs + kv_pairs, kRopeBlock), kRopeBlock, 0, stream>>>(
      q, q_pairs, kv, kv_pairs, positions, cos_sin, max_pos, d);
}

template <typename T>
void launch_rope(const T* x, int64_t x_stride, T* out, const int32_t* positions, const float* cos_sin,
                 int max_pos, int64_t n, int heads, int d, cudaStream_t stream) {
  launch_rope_write_kv<T>(RopeArgs<T>{x, x_stride, out, heads}, WriteKvArgs<T>{}, positions, cos_sin, max_pos, n,
                          d, stream);
}

template <typename T>
void launch_write_kv(const T* k, int64_t k_stride, const T* v, int64_t v_stride, const int32_t* positions,
                     const float* cos_sin, int max_pos, T* k_cache, T* v_cache, const int32_t* slots,
                     int64_t capacity, int64_t n, int heads, int d, cudaStream_t stream) {
  launch_rope_write_kv<T>(RopeArgs<T>{}, WriteKvArgs<T>{k, k_stride, v, v_stride, k_cache, v_cache, slots, capacity, heads},
                          positions, cos_sin, max_pos, n, d, stream);
}

}  // namespace gpu
}  // namespace dspine
