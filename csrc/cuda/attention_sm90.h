// Host-side entry points of the Hopper (sm_90a) paged attention path, defined in
// cuda_attention_sm90.cu (the only translation unit that includes CuTe). This header includes no
// CUTLASS, so the sm_80 binding and the plain CUDA library can call through it without CUTLASS
// headers; a build without CUTLASS (DSPINE_WITH_SM90 undefined) gets the stubs below.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention.cuh"

namespace dspine {
namespace gpu {

#if defined(DSPINE_WITH_SM90)
// True when the sm_90a kernel of element type T has an image that runs on the current device
// (a Hopper GPU and a build with 90a in DSPINE_CUDA_ARCHS). Cached per device.
template <typename T>
bool attention_sm90_runnable();

// Launches the warp-specialised wgmma kernel on p's row tiles (no key split: p.num_splits must
// be 1). Only for shapes attention_sm90_supports() accepts, on a device where
// attention_sm90_runnable<T>() holds.
template <typename T>
void launch_attention_sm90(const PagedAttentionParams& p, cudaStream_t stream);

// Launches of the sm_90a kernel since the process started (a debug counter: the GPU tests read
// it through torch.ops.dspine.attention_sm90_launches to check that the dispatch took the path).
int64_t attention_sm90_launches();

// Of those, the launches that could load whole tiles by TMA (Sm90LoadMaps encoded; the tiles on
// consecutive slots then do): the tests check that both load paths were offered.
int64_t attention_sm90_tma_launches();
#else
template <typename T>
inline bool attention_sm90_runnable() { return false; }
template <typename T>
inline void launch_attention_sm90(const PagedAttentionParams&, cudaStream_t) {}
inline int64_t attention_sm90_launches() { return 0; }
inline int64_t attention_sm90_tma_launches() { return 0; }
#endif

}  // namespace gpu
}  // namespace dspine
