// Fused adjacent causal injection (CUDA): gate + shift-by-one + multiply + residual add.
//
// out[:, 0] = h[:, 0]; out[:, j] = h[:, j] + sigmoid(gate_h[:, j] + fproj[:, j-1, :H]) * fproj[:, j-1, H:]
// One thread per VEC consecutive hidden elements of one row, 16-byte loads when aligned. The
// projections (W_gh norm(h), [W_gf f | W_i f]) are plain GEMMs computed before this op.
#pragma once

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kInjectionBlock = 256;

template <typename T, int VEC>
__global__ void __launch_bounds__(kInjectionBlock)
fused_injection_kernel(const T* __restrict__ h, const T* __restrict__ gate_h, const T* __restrict__ fproj,
                       T* __restrict__ out, int64_t rows, int block, int hidden) {
  join_chain();  // launch.cuh
  using P = Pack<T, VEC>;
  const int vecs_per_row = hidden / VEC;
  const int64_t total = rows * vecs_per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / vecs_per_row;
    const int64_t col = (idx % vecs_per_row) * VEC;
    const P x = *reinterpret_cast<const P*>(h + row * hidden + col);
    P o = x;
    if (row % block != 0) {  // position 0 (the anchor) passes through unchanged
      const P g = *reinterpret_cast<const P*>(gate_h + row * hidden + col);
      const T* pred = fproj + (row - 1) * 2 * hidden;  // the predecessor's projections
      const P gf = *reinterpret_cast<const P*>(pred + col);
      const P inj = *reinterpret_cast<const P*>(pred + hidden + col);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float gate = 1.f / (1.f + __expf(-(to_float(g.v[e]) + to_float(gf.v[e]))));
        o.v[e] = from_float<T>(to_float(x.v[e]) + gate * to_float(inj.v[e]));
      }
    }
    *reinterpret_cast<P*>(out + row * hidden + col) = o;
  }
}

template <typename T, int VEC>
void launch_fused_injection_vec(const T* h, const T* gate_h, const T* fproj, T* out, int64_t rows,
                                int block, int hidden, cudaStream_t stream) {
  launch_kernel(fused_injection_kernel<T, VEC>, Launch(grid_stride_blocks(rows * (hidden / VEC), kInjectionBlock), kInjectionBlock, 0, stream), h, gate_h, fproj, out, rows, block, hidden);
}

// h, gate_h, out: [n, block, hidden] contiguous; fproj: [n, block, 2 * hidden] contiguous.
template <typename T>
void launch_fused_injection(const T* h, const T* gate_h, const T* fproj, T* out, int64_t n, int block,
                            int hidden, cudaStream_t stream) {
  const int64_t rows = n * block;
  if (rows == 0 || hidden == 0) return;
  constexpr int kVec = vec16<T>();
  const bool vec_ok = hidden % kVec == 0 && is_aligned16(h) && is_aligned16(gate_h) &&
                      is_aligned16(fproj) && is_aligned16(out);
  if (vec_ok) {
    launch_fused_injection_vec<T, kVec>(h, gate_h, fproj, out, rows, block, hidden, stream);
  } else {
    launch_fused_injection_vec<T, 1>(h, gate_h, fproj, out, rows, block, hidden, stream);
  }
}

}  // namespace gpu
}  // namespace dspine
