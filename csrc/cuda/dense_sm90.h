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

#if defined(DSPINE_WITH_SM90)
// True when the sm_90a kernels of element type T have an image that runs on the current device
// and the driver encodes tensor maps. Cached per device.
template <typename T>
bool dense_sm90_runnable();

// y = x W^T on p (shapes checked by the caller: k % 32 == 0, x rows and W 16-byte aligned, m, n
// > 0), cut as dense_sm90_plan(n, k, num_sms, forced_splits) says. Only where
// dense_sm90_runnable<T>() holds. Returns false (nothing launched) if the driver refuses a
// tensor map or the call needs more than 65535 column tiles or row blocks (the grid's y / z).
template <typename T>
bool launch_dense_sm90(const DenseParams& p, int num_sms, int forced_splits, cudaStream_t stream);

// Launches of the sm_90a kernels since the process started (the GPU tests check the path ran).
int64_t dense_sm90_launches();
#else
template <typename T>
inline bool dense_sm90_runnable() { return false; }
template <typename T>
inline bool launch_dense_sm90(const DenseParams&, int, int, cudaStream_t) { return false; }
inline int64_t dense_sm90_launches() { return 0; }
#endif

}  // namespace gpu
}  // namespace dspine
