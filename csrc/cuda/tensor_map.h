// Host side of TMA: the driver's tensor-map encoder, found through the runtime (no link against
// libcuda, so the library still loads where no driver is installed). Shared by the Hopper
// translation units (cuda_attention_sm90.cu, cuda_dense_sm90.cu), which include it before any
// CUTLASS header: CUTLASS includes <cudaTypedefs.h> inside its own namespace, and the header's
// include guard would then hide the global typedefs used here.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

namespace dspine {
namespace gpu {

// cuTensorMapEncodeTiled, or null where the driver does not have it. Looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

}  // namespace gpu
}  // namespace dspine
