// RMSNorm and the fused residual-add + RMSNorm (CUDA).
//
// A group of `threads_per_row` threads (whole warps) owns one row: it reads the row once to sum
// the squares (writing x + residual on the way when fused), reduces, then reads it again (from
// L1/L2) to scale. Rows shorter than a block share it, so per-head norms (d = 128) stay efficient.
#pragma once

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kNormBlock = 256;

template <typename T, int VEC>
__global__ void __launch_bounds__(kNormBlock)
rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ residual, const T* __restrict__ w,
                T* __restrict__ out, T* __restrict__ residual_out, int64_t rows, int d, float eps,
                int threads_per_row) {
  join_chain();  // launch.cuh
  using P = Pack<T, VEC>;
  __shared__ float warp_sums[kNormBlock / kWarpSize];
  const int rows_per_block = blockDim.x / threads_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / threads_per_row;
  const int t = threadIdx.x % threads_per_row;
  const int vecs = d / VEC;
  const bool live = row < rows;
  const T* src = x + row * d;

  float ss = 0.f;
  if (live) {
    for (int i = t; i < vecs; i += threads_per_row) {
      P a = reinterpret_cast<const P*>(src)[i];
      if (residual) {
        // Round the sum to T first: the next layer sees exactly this stored residual.
        const P r = reinterpret_cast<const P*>(residual + row * d)[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) a.v[e] = from_float<T>(to_float(a.v[e]) + to_float(r.v[e]));
        reinterpret_cast<P*>(residual_out + row * d)[i] = a;
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) ss += to_float(a.v[e]) * to_float(a.v[e]);
    }
  }
  ss = warp_sum(ss);
  const int warps_per_row = threads_per_row / kWarpSize;
  if (warps_per_row > 1) {  // uniform over the block
    const int warp = threadIdx.x / kWarpSize;
    if (threadIdx.x % kWarpSize == 0) warp_sums[warp] = ss;
    __syncthreads();
    ss = 0.f;
    const int first = (warp / warps_per_row) * warps_per_row;
    for (int i = 0; i < warps_per_row; ++i) ss += warp_sums[first + i];
  }
  if (!live) return;

  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  if (residual) src = residual_out + row * d;  // this thread's own writes: visible to it
  for (int i = t; i < vecs; i += threads_per_row) {
    const P a = reinterpret_cast<const P*>(src)[i];
    const P g = reinterpret_cast<const P*>(w)[i];
    P o;
#pragma unroll
    for (int e = 0; e < VEC; ++e) o.v[e] = from_float<T>(to_float(a.v[e]) * inv * to_float(g.v[e]));
    reinterpret_cast<P*>(out + row * d)[i] = o;
  }
}

inline int norm_threads_per_row(int vecs) {
  int t = kWarpSize;
  while (t < kNormBlock && t < vecs) t *= 2;
  return t;
}

template <typename T, int VEC>
void launch_rms_norm_vec(const T* x, const T* residual, const T* w, T* out, T* residual_out,
                         int64_t rows, int d, float eps, cudaStream_t stream) {
  const int tpr = norm_threads_per_row(d / VEC);
  const int rows_per_block = kNormBlock / tpr;
  const int64_t blocks = ceil_div(rows, rows_per_block);
  launch_kernel(rms_norm_kernel<T, VEC>, Launch(static_cast<unsigned>(blocks), kNormBlock, 0, stream), x, residual, w, out, residual_out, rows, d, eps, tpr);
}

// residual / residual_out null: plain RMSNorm. Otherwise residual_out = x + residual is normed.
template <typename T>
void launch_rms_norm(const T* x, const T* residual, const T* w, T* out, T* residual_out,
                     int64_t rows, int d, float eps, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  constexpr int kVec = vec16<T>();
  const bool vec_ok = d % kVec == 0 && is_aligned16(x) && is_aligned16(w) && is_aligned16(out) &&
                      (!residual || (is_aligned16(residual) && is_aligned16(residual_out)));
  if (vec_ok) {
    launch_rms_norm_vec<T, kVec>(x, residual, w, out, residual_out, rows, d, eps, stream);
  } else {
    launch_rms_norm_vec<T, 1>(x, residual, w, out, residual_out, rows, d, eps, stream);
  }
}

}  // namespace gpu
}  // namespace dspine
