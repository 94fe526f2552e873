// Host-side entry points of the Hopper dense GEMM (dense_sm90.cuh), defined in
// cuda_dense_sm90.cu (a translation unit that includes CuTe). No CUTLASS here, so the binding
// (cuda_dense.cu) calls through it in any build; without CUTLASS (DSPINE_WITH_SM90 undefined) the
// stubs below keep every call on dense_gemm.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dense_gemm.cuh"  // DenseParams

namespace dspine {
namespace gpu {

// Tuning and test aids (0: the plan's choice): the tile width, 64 or 128 columns
// (DSPINE_DENSE_SM90_BN), and the CTA count, 1 up to the SM count (DSPINE_DENSE_SM90_CTAS; it moves
// where the stream-K ranges cut the tiles); `wide` (DSPINE_DENSE_SM90_WIDE, 1 unless set to 0):
// one wgmma for a warpgroup's 32 or 64 rows instead of one per 16 (dense_sm90.cuh, DenseSm90Tile::kMmaN).
struct DenseSm90Knobs {
  int block_n = 0;
  int ctas = 0;
  bool wide = true;
};

#if defined(DSPINE_WITH_SM90)
// True when the sm_90a kernels of element type T have an image that runs on the current device
// and the driver encodes tensor maps. Cached per device.
template <typename T>
bool dense_sm90_runnable();

// y = x W^T on p (shapes checked by the caller: k % 32 == 0, x rows and W 16-byte aligned, m, n
// > 0), shared among CTAs as dense_sm90_plan(n, k, num_sms, knobs) says, one launch per 128 rows.
// Only where dense_sm90_runnable<T>() holds. Returns false (nothing, or only whole 64-row blocks,
// launched) if the driver refuses a tensor map or the stream's workspace cannot be allocated.
template <typename T>
bool launch_dense_sm90(const DenseParams& p, int num_sms, const DenseSm90Knobs& knobs, cudaStream_t stream);

// Launches of the sm_90a kernels since the process started (the GPU tests check the path ran).
int64_t dense_sm90_launches();
#else
template <typename T>
inline bool dense_sm90_runnable() { return false; }
template <typename T>
inline bool launch_dense_sm90(const DenseParams&, int, const DenseSm90Knobs&, cudaStream_t) { return false; }
inline int64_t dense_sm90_launches() { return 0; }
#endif

}  // namespace gpu
}  // namespace dspine
