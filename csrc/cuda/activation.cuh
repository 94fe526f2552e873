// The gated MLP's activation (CUDA): out[t, c] = silu(x[t, c]) * x[t, I + c] for x [rows, 2I].
// One launch instead of torch's two (silu, then the product) and one pass over x: a target layer
// ran F.silu(gate) * up as two kernels and an intermediate tensor. One thread per VEC consecutive
// columns of one row, 16-byte loads when aligned; fp32 math, one rounding (ops.py: silu_mul_ref).
#pragma once

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kSiluMulBlock = 256;

template <typename T, int VEC>
__global__ void __launch_bounds__(kSiluMulBlock)
silu_mul_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t inter) {
  join_chain();  // launch.cuh
  using P = Pack<T, VEC>;
  const int64_t vecs_per_row = inter / VEC;
  const int64_t total = rows * vecs_per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / vecs_per_row;
    const int64_t col = (idx % vecs_per_row) * VEC;
    const P g = *reinterpret_cast<const P*>(x + row * 2 * inter + col);
    const P u = *reinterpret_cast<const P*>(x + row * 2 * inter + inter + col);
    P o;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float gf = to_float(g.v[e]);
      o.v[e] = from_float<T>(gf / (1.f + __expf(-gf)) * to_float(u.v[e]));
    }
    *reinterpret_cast<P*>(out + row * inter + col) = o;
  }
}

template <typename T, int VEC>
void launch_silu_mul_vec(const T* x, T* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  launch_kernel(silu_mul_kernel<T, VEC>, Launch(grid_stride_blocks(rows * (inter / VEC), kSiluMulBlock), kSiluMulBlock, 0, stream), x, out, rows, inter);
}

// x: [rows, 2 * inter] contiguous; out: [rows, inter] contiguous.
template <typename T>
void launch_silu_mul(const T* x, T* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  if (rows == 0 || inter == 0) return;
  constexpr int kVec = vec16<T>();
  // The up half starts inter elements in: 16-byte aligned only when inter is a multiple of kVec.
  if (inter % kVec == 0 && is_aligned16(x) && is_aligned16(out))
    launch_silu_mul_vec<T, kVec>(x, out, rows, inter, stream);
  else
    launch_silu_mul_vec<T, 1>(x, out, rows, inter, stream);
}

}  // namespace gpu
}  // namespace dspine
