// RoPE (rotate-half form), the paged KV write with RoPE fused on the keys, and both in one launch
// (rope_write_kv: a target layer's query rotation and KV write), each with an optional per-head
// RMSNorm before the rotation (Qwen3's q_norm / k_norm) (CUDA).
//
// A group of lanes (a power of two, at most a warp) owns one head row of one token: lane j holds
// element vectors j and j + half/VEC, the two halves a rotation pairs, so the rotation needs no
// exchange between lanes and every access is a VEC-wide load or store. With a norm the group first
// sums the row's squares (one shuffle reduction inside the group) and scales each element, rounded
// to T as rms_norm stores it, before rotating it: the normed row never goes through memory. All of
// it is bandwidth (or, for a few tokens, latency): one launch instead of the norms' two and the
// copies of their strided q/k views. A position outside the cos/sin table is an error (a
// device-side assert): the table is never read past, and nothing is written for that token.
#pragma once

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kRopeBlock = 256;

// The rotations of one op: x [n, heads, d] (rows x_stride apart) rotated into out (contiguous);
// norm (d weights) or null: each head row RMS-normed first.
template <typename T>
struct RopeArgs {
  const T* x;
  int64_t x_stride;
  T* out;
  int heads;
  const T* norm = nullptr;
};

// The KV write of one op. cos_sin == nullptr: keys are copied without rotation. Slots < 0
// (padding) or past the cache (`capacity` slots; it cannot be checked on the host without a
// sync) are skipped. norm (d weights) or null: each key head row RMS-normed first.
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
  const T* norm = nullptr;
};

// What every row of a launch shares.
struct RopeShape {
  const int32_t* positions;
  const float* cos_sin;  // [max_pos, d]: cos then sin of each pair; null: keys copied unrotated
  int max_pos;
  int d;
  float eps;
  int group;  // lanes a head row (a power of two <= 32)
};

// One head row's source and destination, and its norm (null: none).
template <typename T>
struct HeadRow {
  const T* src;
  T* dst;
  const T* norm;
  int pos;
};

template <typename T, int VEC>
__device__ __forceinline__ float sum_squares(const T* src, int lane, int hv, int group) {
  using P = Pack<T, VEC>;
  float ss = 0.f;
  for (int j = lane; j < 2 * hv; j += group) {
    const P a = reinterpret_cast<const P*>(src)[j];
#pragma unroll
    for (int e = 0; e < VEC; ++e) ss += to_float(a.v[e]) * to_float(a.v[e]);
  }
  return ss;
}

// Element values of one vector as the rotation reads them: normed (rounded to T) or as stored.
template <typename T, int VEC>
__device__ __forceinline__ void load_normed(const T* src, const T* norm, float inv, int j, float (&x)[VEC]) {
  using P = Pack<T, VEC>;
  const P a = reinterpret_cast<const P*>(src)[j];
  if (norm) {
    const P g = reinterpret_cast<const P*>(norm)[j];
#pragma unroll
    for (int e = 0; e < VEC; ++e) x[e] = to_float(from_float<T>(to_float(a.v[e]) * inv * to_float(g.v[e])));
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) x[e] = to_float(a.v[e]);
  }
}

// Rotates (or, cos_sin null, copies) one head row into dst, this lane's vector pairs of it.
template <typename T, int VEC>
__device__ __forceinline__ void rotate_row(const HeadRow<T>& r, const RopeShape& s, float inv, int lane, int hv) {
  using P = Pack<T, VEC>;
  const int half = s.d / 2;
  const float* cs = s.cos_sin ? s.cos_sin + static_cast<int64_t>(r.pos) * s.d : nullptr;
  for (int j = lane; j < hv; j += s.group) {
    float x1[VEC], x2[VEC];
    load_normed<T, VEC>(r.src, r.norm, inv, j, x1);
    load_normed<T, VEC>(r.src, r.norm, inv, j + hv, x2);
    P o1, o2;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (!cs) {  // keys without positions: copied (normed or not) as they are
        o1.v[e] = from_float<T>(x1[e]);
        o2.v[e] = from_float<T>(x2[e]);
        continue;
      }
      const int i = j * VEC + e;
      const float c = cs[i], sn = cs[half + i];
      o1.v[e] = from_float<T>(x1[e] * c - x2[e] * sn);
      o2.v[e] = from_float<T>(x2[e] * c + x1[e] * sn);
    }
    reinterpret_cast<P*>(r.dst)[j] = o1;
    reinterpret_cast<P*>(r.dst)[j + hv] = o2;
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void copy_row(const T* src, T* dst, int lane, int hv, int group) {
  using P = Pack<T, VEC>;
  for (int j = lane; j < 2 * hv; j += group) reinterpret_cast<P*>(dst)[j] = reinterpret_cast<const P*>(src)[j];
}

// Head row `row` of the launch: the query rotations' rows first, then the KV write's. `live`
// false: a key row whose slot is padding or past the cache (nothing to do, but its lanes still
// take part in the group's shuffles).
template <typename T>
__device__ __forceinline__ HeadRow<T> head_row(const RopeArgs<T>& q, const WriteKvArgs<T>& kv, int64_t q_rows,
                                               int64_t row, const RopeShape& s, bool& is_key, bool& live,
                                               const T*& v_src, T*& v_dst) {
  is_key = row >= q_rows;
  live = true;
  if (!is_key) {
    const int64_t token = row / q.heads;
    const int head = static_cast<int>(row % q.heads);
    const int pos = s.cos_sin ? s.positions[token] : 0;
    return {q.x + token * q.x_stride + static_cast<int64_t>(head) * s.d, q.out + row * s.d, q.norm, pos};
  }
  const int64_t kr = row - q_rows, token = kr / kv.heads;
  const int head = static_cast<int>(kr % kv.heads);
  const int64_t slot = kv.slots[token];
  live = slot >= 0 && slot < kv.capacity;
  const int64_t dst = live ? (slot * kv.heads + head) * s.d : 0;  // (never written when not live)
  v_src = kv.v + token * kv.v_stride + static_cast<int64_t>(head) * s.d;
  v_dst = kv.v_cache + dst;
  const int pos = s.cos_sin ? s.positions[token] : 0;
  return {kv.k + token * kv.k_stride + static_cast<int64_t>(head) * s.d, kv.k_cache + dst, kv.norm, pos};
}

// One grid-stride loop over head rows, q_rows of queries (0 for write_kv alone) then kv_rows of
// keys and values (0 for rope alone): rope, write_kv and rope_write_kv are this one kernel. The
// loop is uniform over each warp (every lane runs every step) so the group shuffles are safe.
template <typename T, int VEC>
__global__ void __launch_bounds__(kRopeBlock)
rope_write_kv_kernel(const RopeArgs<T> q, int64_t q_rows, const WriteKvArgs<T> kv, int64_t kv_rows,
                     const RopeShape s) {
  join_chain();  // launch.cuh
  const int hv = s.d / 2 / VEC;  // vectors in a half row
  const int lane = threadIdx.x % s.group;
  const int rows_per_warp = kWarpSize / s.group;
  const int64_t total = q_rows + kv_rows;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const bool any_norm = q.norm || kv.norm;
  for (int64_t base = warp * rows_per_warp; base < total; base += warps * rows_per_warp) {
    const int64_t row = base + (threadIdx.x % kWarpSize) / s.group;
    bool is_key = false, live = row < total;
    const T* v_src = nullptr;
    T* v_dst = nullptr;
    HeadRow<T> r{};
    if (live) r = head_row(q, kv, q_rows, row, s, is_key, live, v_src, v_dst);
    if (live && s.cos_sin) {
      DSPINE_DEVICE_REQUIRE(r.pos >= 0 && r.pos < s.max_pos, "rope: position outside the cos/sin table");
      live = r.pos >= 0 && r.pos < s.max_pos;  // (unreachable past the check; keeps reads in bounds)
    }
    float inv = 1.f;
    if (any_norm) {  // uniform over the launch: every lane reaches the shuffles
      float ss = live && r.norm ? sum_squares<T, VEC>(r.src, lane, hv, s.group) : 0.f;
      for (int o = s.group / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(kFullMask, ss, o);
      inv = rsqrtf(ss / static_cast<float>(s.d) + s.eps);
    }
    if (!live) continue;
    rotate_row<T, VEC>(r, s, inv, lane, hv);
    if (is_key) copy_row<T, VEC>(v_src, v_dst, lane, hv, s.group);
  }
}

// The lanes a head row takes: one per vector pair, rounded up to a power of two, at most a warp.
inline int rope_group(int vector_pairs) {
  int g = 1;
  while (g < kWarpSize && g < vector_pairs) g *= 2;
  return g;
}

template <typename T>
bool rope_vectors_fit(const RopeArgs<T>& q, const WriteKvArgs<T>& kv, int d) {
  constexpr int kVec = vec16<T>();
  auto row_ok = [&](const T* p, int64_t stride) {
    return !p || (is_aligned16(p) && (stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);
  };
  return (d / 2) % kVec == 0 && row_ok(q.x, q.x_stride) && row_ok(q.out, d) && row_ok(q.norm, 0) &&
         row_ok(kv.k, kv.k_stride) && row_ok(kv.v, kv.v_stride) && row_ok(kv.k_cache, d) &&
         row_ok(kv.v_cache, d) && row_ok(kv.norm, 0);
}

template <typename T, int VEC>
void launch_rope_rows(const RopeArgs<T>& q, int64_t q_rows, const WriteKvArgs<T>& kv, int64_t kv_rows,
                      RopeShape s, cudaStream_t stream) {
  s.group = rope_group(s.d / 2 / VEC);
  const int64_t threads = ceil_div(q_rows + kv_rows, kWarpSize / s.group) * kWarpSize;
  launch_kernel(rope_write_kv_kernel<T, VEC>, Launch(grid_stride_blocks(threads, kRopeBlock), kRopeBlock, 0, stream), q, q_rows, kv, kv_rows, s);
}

// n tokens; q.heads (kv.heads) 0 leaves the rotation (the write) out. eps: the norms' epsilon.
template <typename T>
void launch_rope_write_kv(const RopeArgs<T>& q, const WriteKvArgs<T>& kv, const int32_t* positions,
                          const float* cos_sin, int max_pos, int64_t n, int d, cudaStream_t stream,
                          float eps = 0.f) {
  const int64_t q_rows = n * q.heads, kv_rows = n * kv.heads;
  if (q_rows + kv_rows == 0) return;
  const RopeShape s{positions, cos_sin, max_pos, d, eps, 0};
  if (rope_vectors_fit(q, kv, d))
    launch_rope_rows<T, vec16<T>()>(q, q_rows, kv, kv_rows, s, stream);
  else
    launch_rope_rows<T, 1>(q, q_rows, kv, kv_rows, s, stream);
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
