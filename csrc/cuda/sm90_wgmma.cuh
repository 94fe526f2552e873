// What the Hopper (sm_90a) kernels share: the element types CuTe names, the guard that keeps
// wgmma / setmaxnreg / TMA code out of every pass but sm_90a, and the issue / wait of a wgmma
// batch. Included by attention_sm90.cuh and dense_sm90.cuh (each compiled only in a
// DSPINE_WITH_SM90 translation unit, the ones that see the CUTLASS headers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>

// The wgmma / setmaxnreg code exists only in the sm_90a pass; every other pass (sm_80, the host)
// sees kernels that trap (never launched there: each path's *_runnable() checks the image).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSPINE_SM90_DEVICE_CODE 1
#else
#define DSPINE_SM90_DEVICE_CODE 0
#endif

namespace dspine {
namespace gpu {

template <typename T>
struct CuteElem;
template <>
struct CuteElem<__nv_bfloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CuteElem<__half> {
  using type = cutlass::half_t;
};

#if DSPINE_SM90_DEVICE_CODE
// Issues C = A B over the k blocks of the operands as one wgmma batch (committed, not waited
// for). ZERO_INIT overwrites C; REG_A: A is a register fragment (RS), fenced like the accumulators.
// Until wgmma_wait retires the batch, C must not be read and a register A not written.
template <bool ZERO_INIT, bool REG_A, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_issue(TiledMma& mma, const TA& a, const TB& b, TC& c) {
  using namespace cute;
  constexpr bool kRegA = REG_A;
  if constexpr (kRegA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (ZERO_INIT) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// Waits until at most N of this warpgroup's batches are in flight; `c` (the accumulators of the
// batches that retired) is then safe to read.
template <int N, class TC>
__device__ __forceinline__ void wgmma_wait(TC& c) {
  cute::warpgroup_wait<N>();
  cute::warpgroup_fence_operand(c);
}

#endif  // DSPINE_SM90_DEVICE_CODE

}  // namespace gpu
}  // namespace dspine
