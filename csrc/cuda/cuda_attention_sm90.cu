// The Hopper (sm_90a) paged attention path (attention_sm90.cuh): its instantiations, its launch
// and the check that its image runs on the current device. The only translation unit that
// includes CuTe (setup.py adds the CUTLASS include path and -DDSPINE_WITH_SM90 when it finds the
// headers); torch-free, so it compiles standalone for the sm_80 / sm_90a checks.
#if defined(DSPINE_WITH_SM90)

#include <atomic>
#include <cstdlib>

#include "attention_sm90.cuh"
#include "attention_heuristics.h"
#include "attention_sm90.h"

namespace dspine {
namespace gpu {

namespace {
std::atomic<int64_t> g_sm90_launches{0};
}

int64_t attention_sm90_launches() { return g_sm90_launches.load(std::memory_order_relaxed); }

// The image the runtime picks for this device must be the sm_90a one: an sm_80-only build (or a
// build for another Hopper-less arch list) would run the trapping stub instead. Asked once per
// device; the error of a missing image is cleared so no later launch check reports it.
template <typename T>
bool attention_sm90_runnable() {
  static std::atomic<int> cached[64];  // per device: 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::atomic<int>& slot = cached[dev & 63];
  const int known = slot.load(std::memory_order_relaxed);
  if (known != 0) return known == 1;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  bool ok = major == 9 && minor == 0;
  if (ok) {
    cudaFuncAttributes a64{}, a128{};
    ok = cudaFuncGetAttributes(&a64, paged_attention_sm90_kernel<T, 64, false>) == cudaSuccess &&
         cudaFuncGetAttributes(&a128, paged_attention_sm90_kernel<T, 128, false>) == cudaSuccess &&
         a64.binaryVersion == 90 && a128.binaryVersion == 90;
    cudaGetLastError();
  }
  slot.store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

template <typename T, bool ASYNC_ARRIVE>
void launch_attention_sm90_head_dim(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch_attention_sm90_tile<T, 64, ASYNC_ARRIVE>(p, stream);
  else
    launch_attention_sm90_tile<T, 128, ASYNC_ARRIVE>(p, stream);
}

template <typename T>
void launch_attention_sm90(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.batch == 0 || p.max_q_len <= 0) return;
  g_sm90_launches.fetch_add(1, std::memory_order_relaxed);
  // DSPINE_SM90_ARRIVE (async / wait) read at every launch, so tests run both in one process.
  if (sm90_async_arrivals(p.head_dim, std::getenv("DSPINE_SM90_ARRIVE")))
    launch_attention_sm90_head_dim<T, true>(p, stream);
  else
    launch_attention_sm90_head_dim<T, false>(p, stream);
}

template bool attention_sm90_runnable<__nv_bfloat16>();
template bool attention_sm90_runnable<__half>();
template void launch_attention_sm90<__nv_bfloat16>(const PagedAttentionParams&, cudaStream_t);
template void launch_attention_sm90<__half>(const PagedAttentionParams&, cudaStream_t);

}  // namespace gpu
}  // namespace dspine

#endif  // DSPINE_WITH_SM90
