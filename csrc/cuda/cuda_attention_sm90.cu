// The Hopper (sm_90a) paged attention path (attention_sm90.cuh): its instantiations, its launch
// and the check that its image runs on the current device. One of the two translation units that
// include CuTe (with cuda_dense_sm90.cu; setup.py adds the CUTLASS include path and
// -DDSPINE_WITH_SM90 when it finds the headers); torch-free, so it compiles standalone for the
// sm_80 / sm_90a checks.
#if defined(DSPINE_WITH_SM90)

#include "sm90_host.h"  // first: before CUTLASS (sm90_host.h says why)

#include <atomic>
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "attention_sm90.cuh"
#include "attention_heuristics.h"
#include "attention_sm90.h"

namespace dspine {
namespace gpu {

namespace {
std::atomic<int64_t> g_sm90_launches{0};
std::atomic<int64_t> g_sm90_tma_launches{0};
}

int64_t attention_sm90_launches() { return g_sm90_launches.load(std::memory_order_relaxed); }
int64_t attention_sm90_tma_launches() { return g_sm90_tma_launches.load(std::memory_order_relaxed); }

// The sm_90a images of both head dims must be what this device runs (sm90_host.h).
template <typename T>
bool attention_sm90_runnable() {
  static std::atomic<int> cached[64];
  return sm90_images_run(cached, {reinterpret_cast<const void*>(paged_attention_sm90_kernel<T, 64, false>),
                                  reinterpret_cast<const void*>(paged_attention_sm90_kernel<T, 128, false>)});
}

namespace {

// One cache as the [slots, kv_heads, D] tensor of Sm90LoadMaps, boxes of a tile's 128 slots x 1 x 64.
template <typename T>
bool encode_cache_map(CUtensorMap* map, const void* cache, const PagedAttentionParams& p) {
  static_assert(Sm90Tile<T, 64>::kBlockN == 128 && Sm90Tile<T, 128>::kBlockN == 128, "a box is one key tile");
  const cuuint64_t elem = sizeof(T);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.kv_heads),
                              static_cast<cuuint64_t>(p.num_pages) * p.page_size};
  const cuuint64_t strides[2] = {p.head_dim * elem, static_cast<cuuint64_t>(p.kv_heads) * p.head_dim * elem};
  const cuuint32_t box[3] = {64, 1, Sm90Tile<T, 128>::kBlockN};  // 64 columns of one tile's slots
  return encode_swizzled_map<T>(map, 3, cache, dims, strides, box);
}

// The maps for this call, or on = false (cp.async for every tile) when the pages are too small
// for the kernel's run check, DSPINE_SM90_LOADS=cp.async asks for that (read at every launch, so
// the tests run both in one process), a slot index would not fit the copies' 32-bit coordinates,
// or the driver refuses a map (e.g. a cache not 16-byte aligned).
template <typename T>
Sm90LoadMaps sm90_load_maps(const PagedAttentionParams& p) {
  Sm90LoadMaps maps{};
  const bool fits = static_cast<int64_t>(p.num_pages) * p.page_size <= INT32_MAX;
  maps.on = sm90_tma_loads(p.page_size, std::getenv("DSPINE_SM90_LOADS")) && fits &&
            encode_cache_map<T>(&maps.k, p.k_cache, p) && encode_cache_map<T>(&maps.v, p.v_cache, p);
  return maps;
}

}  // namespace

template <typename T, bool ASYNC_ARRIVE>
void launch_attention_sm90_head_dim(const PagedAttentionParams& p, const Sm90LoadMaps& maps, cudaStream_t stream) {
  if (p.head_dim == 64)
    launch_attention_sm90_tile<T, 64, ASYNC_ARRIVE>(p, maps, stream);
  else
    launch_attention_sm90_tile<T, 128, ASYNC_ARRIVE>(p, maps, stream);
}

template <typename T>
void launch_attention_sm90(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.batch == 0 || p.max_q_len <= 0) return;
  g_sm90_launches.fetch_add(1, std::memory_order_relaxed);
  const Sm90LoadMaps maps = sm90_load_maps<T>(p);
  if (maps.on) g_sm90_tma_launches.fetch_add(1, std::memory_order_relaxed);
  // DSPINE_SM90_ARRIVE (async / wait) read at every launch, so tests run both in one process.
  if (sm90_async_arrivals(p.head_dim, std::getenv("DSPINE_SM90_ARRIVE")))
    launch_attention_sm90_head_dim<T, true>(p, maps, stream);
  else
    launch_attention_sm90_head_dim<T, false>(p, maps, stream);
}

template bool attention_sm90_runnable<__nv_bfloat16>();
template bool attention_sm90_runnable<__half>();
template void launch_attention_sm90<__nv_bfloat16>(const PagedAttentionParams&, cudaStream_t);
template void launch_attention_sm90<__half>(const PagedAttentionParams&, cudaStream_t);

}  // namespace gpu
}  // namespace dspine

#endif  // DSPINE_WITH_SM90
