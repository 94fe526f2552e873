// Every kernel launch of the extension, and the programmatic dependent launch (PDL) that chains
// them on Hopper.
//
// Why: a verify round is ~650 launches, most of them short (a norm, a rotation, an attention
// block of 12 us); between two kernels the GPU drains the first grid before the next one starts
// (~1-3 us each, 0.6 ms of the Qwen3-8B-shaped round on the H200, 34th session). With PDL a kernel
// starts while the one before it finishes: it runs its prologue (barrier set-up, descriptor
// prefetch, and in the Hopper GEMM the first stages of its weight, which no kernel writes) and
// then waits at chain_wait() until the previous grid has completed and its memory is visible.
//
// The rule that makes chaining safe: every kernel of this extension calls chain_wait() before it
// reads or writes memory another kernel may touch (tests/test_kernel_launches.py checks that each
// __global__ function calls it, and that no launch bypasses launch_kernel); chain_release(), which
// lets the next kernel's CTAs start arriving, comes at the start (join_chain). A kernel that is
// not ours (torch's, cuBLAS's) is launched without the attribute and so waits as usual.
//
// DSPINE_PDL: unset or 1 (the default since the 37th session: the Qwen3-8B-shaped round with our
// GEMM chained took its verify graph from 6.96 to 6.57 ms at batch 1 on the H100, the kernel file's
// and the engine's GPU tests passing chained) chains the launches on sm_90+ (older GPUs launch as
// usual); 0 launches them unchained. Read at every launch (a CUDA graph keeps what it captured).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace dspine {
namespace gpu {

// Waits until the kernel before this one in the stream has completed and its writes are visible
// (returns at once when the launch was not chained).
__device__ __forceinline__ void chain_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next chained kernel launch once every CTA of this grid has called this or exited.
__device__ __forceinline__ void chain_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The start of every kernel but the Hopper GEMM's producer (which loads its first weight stages
// before it): let the next kernel launch, then wait for the previous one. Releasing first lets
// the kernel after this one start its prologue while this one still waits, e.g. the output
// projection's GEMM loading its first ring of weights (~27 MB over the SMs, most of Qwen3-8B's
// 33.5 MB o weight) while the attention runs on 32 SMs and the memory bus idles. It is safe
// because waits chain: the next kernel's chain_wait() returns only once this grid has completed,
// and this grid completes only after its own chain_wait() saw the previous one complete.
__device__ __forceinline__ void join_chain() {
  chain_release();
  chain_wait();
}

// DSPINE_PDL as a switch: unset / "" / "1" on, "0" off; anything else off, with one warning.
inline bool chain_requested() {
  const char* env = std::getenv("DSPINE_PDL");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "1") == 0) return true;
  if (std::strcmp(env, "0") == 0) return false;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fprintf(stderr, "dspine_engine: DSPINE_PDL=%s is neither 0 nor 1; launches are not chained\n", env);
  return false;
}

// Whether the current device runs griddepcontrol (compute capability 9.0 or later). Asked at every
// chained launch, so the answer is kept per device (0 unknown, 1 no, 2 yes): what is left a launch
// is cudaGetDevice, a thread-local read.
inline bool device_chains() {
  static std::atomic<int> known[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const bool cacheable = dev >= 0 && dev < 64;
  if (cacheable && known[dev].load(std::memory_order_relaxed) != 0) return known[dev].load(std::memory_order_relaxed) == 2;
  int major = 0;
  const bool chains =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  if (cacheable) known[dev].store(chains ? 2 : 1, std::memory_order_relaxed);
  return chains;
}

inline bool chain_launches() { return chain_requested() && device_chains(); }

// Where and how a kernel runs: grid, block, dynamic shared memory, stream, and whether all its
// CTAs must be resident at once (a grid whose CTAs wait for one another).
struct Launch {
  Launch(dim3 grid_, dim3 block_, size_t smem_, cudaStream_t stream_, bool cooperative_ = false)
      : grid(grid_), block(block_), smem(smem_), stream(stream_), cooperative(cooperative_) {}
  dim3 grid;
  dim3 block;
  size_t smem;
  cudaStream_t stream;
  bool cooperative;
};

// Launches `kernel`, chained to the kernel before it when chain_launches(). A chained launch
// drops the cooperative attribute (whether the two combine is not documented) and keeps its
// guarantee another way: such a grid fits the GPU in one wave, and the next kernel starts only
// once all of its CTAs have started (chain_release), so none of them waits behind a dependent.
// Errors surface through cudaGetLastError, as a <<<>>> launch's do.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), const Launch& how, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = how.grid;
  config.blockDim = how.block;
  config.dynamicSmemBytes = how.smem;
  config.stream = how.stream;
  cudaLaunchAttribute attr{};
  if (chain_launches()) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
  } else if (how.cooperative) {
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
  }
  if (attr.id != cudaLaunchAttributeIgnore) {
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);  // errors: see above
}

}  // namespace gpu
}  // namespace dspine
