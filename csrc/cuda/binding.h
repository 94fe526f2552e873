// Helpers of the thin torch bindings of the CUDA kernels (cuda_ops.cu, cuda_attention.cu):
// dtype dispatch onto the CUDA element types, device checks, the current stream. The bindings
// never read device memory on the host, so every op can be captured in a CUDA graph.
#pragma once

#include <cstdlib>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/all.h>

#include "../dspine_ops.h"

namespace dspine {
namespace cuda {

// Calls f(T{}) with T the CUDA element type of `type` (float, __half, __nv_bfloat16).
template <typename F>
void dispatch_float(at::ScalarType type, const char* op, F&& f) {
  switch (type) {
    case at::kFloat: f(float{}); break;
    case at::kHalf: f(__half{}); break;
    case at::kBFloat16: f(__nv_bfloat16{}); break;
    default: TORCH_CHECK(false, op, ": unsupported dtype ", type);
  }
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

inline cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

// A device attribute of the current device (host-side query, no synchronisation).
inline int device_attribute(cudaDeviceAttr attr) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, c10::cuda::current_device()));
  return value;
}

inline int num_sms() { return device_attribute(cudaDevAttrMultiProcessorCount); }

// The kernels' tuning knobs are environment variables read at every call, so a process (the
// tests, kernel_bench.py) can change them between calls; a captured CUDA graph keeps what it was
// captured with. The variable as an integer, `unset` when it is missing or empty.
inline int env_int(const char* name, int unset) {
  const char* env = std::getenv(name);
  return env && *env ? std::atoi(env) : unset;
}

// All non-empty tensors on the CUDA device of `first` (empty placeholders may live anywhere).
template <typename... Ts>
void check_device(const char* op, const at::Tensor& first, const Ts&... rest) {
  TORCH_CHECK(first.is_cuda(), op, ": expected CUDA tensors");
  const auto same = [&](const at::Tensor& t) {
    TORCH_CHECK(t.numel() == 0 || t.device() == first.device(), op, ": all tensors must be on ", first.device());
  };
  (same(rest), ...);
}

}  // namespace cuda
}  // namespace dspine
