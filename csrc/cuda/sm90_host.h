// Host side of the Hopper (sm_90a) paths, shared by their translation units (cuda_attention_sm90.cu,
// cuda_dense_sm90.cu): the driver's tensor-map encoder, found through the runtime (no link against
// libcuda, so the library still loads where no driver is installed), the swizzled maps both
// encode with it, and the check that a kernel's sm_90a image is the one the device runs.
// Included before any CUTLASS header: CUTLASS includes <cudaTypedefs.h> inside its own namespace,
// and the header's include guard would then hide the global typedefs used here.
#pragma once

#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <atomic>
#include <initializer_list>
#include <type_traits>

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

// A tiled tensor map of T (bf16 or fp16) over `rank` dims (innermost first; strides of the outer
// ones in bytes), boxes of `box` elements in the 128-byte swizzle the wgmma tiles read, promoted
// to L2 in 256-byte lines, coordinates out of bounds read as zeros. False where the driver lacks
// the encoder or refuses the map (e.g. data not 16-byte aligned).
template <typename T>
bool encode_swizzled_map(CUtensorMap* map, cuuint32_t rank, const void* data, const cuuint64_t* dims,
                         const cuuint64_t* strides, const cuuint32_t* box) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, type, rank, const_cast<void*>(data), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether every kernel of `kernels` runs its sm_90a image on the current device: a Hopper GPU
// (compute capability 9.0) and a build with 90a in its arch list (an sm_80-only build would run the
// kernels' trapping stubs instead). Asked once per device, the answer kept in the caller's `cache`
// (0 unknown, 1 yes, 2 no); the error of a missing image is cleared so no later launch check
// reports it.
inline bool sm90_images_run(std::atomic<int> (&cache)[64], std::initializer_list<const void*> kernels) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::atomic<int>& slot = cache[dev & 63];
  const int known = slot.load(std::memory_order_relaxed);
  if (known != 0) return known == 1;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  bool ok = major == 9 && minor == 0;
  for (const void* kernel : kernels) {
    cudaFuncAttributes a{};
    ok = ok && cudaFuncGetAttributes(&a, kernel) == cudaSuccess && a.binaryVersion == 90;
  }
  cudaGetLastError();
  slot.store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

}  // namespace gpu
}  // namespace dspine
