// Small device helpers shared by the CUDA kernels. No torch includes: the kernels are header
// templates over raw pointers (bound to torch in cuda_ops.cu / cuda_attention.cu), so the same
// headers can build into a plain C++/CUDA library.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "launch.cuh"  // every kernel joins the launch chain

// A device-side check that stays on in release builds (unlike assert under NDEBUG): a kernel
// that meets an input it must not read through stops with "device-side assert triggered" at
// the next synchronisation instead of reading memory it does not own. For inputs the host
// cannot check without a sync (positions, slots live on the device).
#if defined(__CUDA_ARCH__)
#define DSPINE_DEVICE_REQUIRE(cond, msg)                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      printf("dspine_engine: %s (%s:%d)\n", msg, __FILE__, __LINE__);                     \
      __assert_fail(#cond, __FILE__, static_cast<unsigned>(__LINE__), __func__);          \
    }                                                                                     \
  } while (0)
#else
#define DSPINE_DEVICE_REQUIRE(cond, msg) ((void)0)
#endif

namespace dspine {
namespace gpu {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Blocks of `block` threads for a grid-stride loop over `work` items: one per block's worth, at
// least 1, at most 512K (the loops stride past that; a grid that large is all resident anyway).
inline unsigned grid_stride_blocks(int64_t work, int block) {
  const int64_t blocks = ceil_div(work, block);
  return static_cast<unsigned>(blocks < 65536 * 8 ? (blocks > 0 ? blocks : 1) : 65536 * 8);
}

inline bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Lets `Kernel` use the device's whole opt-in shared memory (beyond the default 48 KiB) minus
// what it declares statically: asking for more makes cudaFuncSetAttribute fail, and the launch
// after it. The attribute is per device; it is set once per device, not per launch. Returns the
// dynamic bytes a launch of `Kernel` may ask for.
template <auto Kernel>
int allow_max_dynamic_smem() {
  static std::atomic<uint64_t> done{0};
  static std::atomic<int> limit{0};
  int dev = 0;
  cudaGetDevice(&dev);
  const uint64_t bit = 1ull << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return limit.load(std::memory_order_relaxed);
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  cudaFuncAttributes attr{};
  cudaFuncGetAttributes(&attr, Kernel);
  const int dynamic = optin - static_cast<int>(attr.sharedSizeBytes);
  cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic);
  limit.store(dynamic, std::memory_order_relaxed);
  done.fetch_or(bit, std::memory_order_release);
  return dynamic;
}

// ---- element conversions (all arithmetic happens in fp32) ------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
struct FromFloat;
template <>
struct FromFloat<float> {
  __device__ __forceinline__ static float cast(float x) { return x; }
};
template <>
struct FromFloat<__half> {
  __device__ __forceinline__ static __half cast(float x) { return __float2half_rn(x); }
};
template <>
struct FromFloat<__nv_bfloat16> {
  __device__ __forceinline__ static __nv_bfloat16 cast(float x) { return __float2bfloat16_rn(x); }
};
template <typename T>
__device__ __forceinline__ T from_float(float x) { return FromFloat<T>::cast(x); }

// VEC consecutive elements moved as one (16-byte when VEC * sizeof(T) == 16) memory access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// Elements per 16-byte access.
template <typename T>
constexpr int vec16() { return static_cast<int>(16 / sizeof(T)); }

// ---- warp / block reductions ------------------------------------------------------------------

template <typename V>
__device__ __forceinline__ V warp_sum(V x) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Inclusive prefix sum over the lanes of a warp (lane 0 first).
template <typename V>
__device__ __forceinline__ V warp_inclusive_scan(V x) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int o = 1; o < kWarpSize; o <<= 1) {
    const V y = __shfl_up_sync(kFullMask, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Sum over the whole block; every thread gets the result. `scratch` holds one V per warp.
// Contains __syncthreads: call from uniform control flow only.
template <typename V>
__device__ V block_sum(V x, V* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  V total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

__device__ inline float block_max(float x, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// Inclusive prefix sum over the block in thread order. `scratch` holds one V per warp.
template <typename V>
__device__ V block_inclusive_scan(V x, V* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  x = warp_inclusive_scan(x);
  __syncthreads();
  if (lane == kWarpSize - 1) scratch[warp] = x;
  __syncthreads();
  for (int w = 0; w < warp; ++w) x += scratch[w];
  return x;
}

// The last block of a group to call this returns true (and sees the others' global writes).
// Every thread must have finished its global writes before calling; uniform control flow only.
__device__ inline bool arrive_last(int* counter, int expected) {
  __shared__ bool last;
  __threadfence();  // publish this thread's writes before the block is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == expected - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

}  // namespace gpu
}  // namespace dspine
