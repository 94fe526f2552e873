// Dense GEMM for few rows on Hopper (sm_90a): y[m, n] = sum_k x[m, k] W[n, k], bf16 / fp16 in,
// fp32 accumulators, the weight streamed by TMA at the copy bandwidth. Semantics:
// dspine_engine/ops.py:dense_matmul (the same op as dense_gemm.cuh, which serves other GPUs).
//
// Why: a verify block's projections have 16 rows a sequence; cuBLAS reads their weights at 63-84%
// of the copy bandwidth (H200, 21st session) and the mma.sync kernel of dense_gemm.cuh at 0.71-0.96x
// cuBLAS's speed at 8-16 rows (H100, 27th session): both keep too few bytes in flight.
//
// Operands swapped: the wgmma's M is 64 output columns (W rows, K-major A in shared memory), its N
// 16 rows of x (K-major B), so 1-64 rows cost one m64n16k16 per 64 columns, 16 rows and 16 k.
// CTA = one consumer warpgroup (threads 0-127: the wgmmas) + one producer warp (thread 128 issues
// the TMA loads). A unit is 128 k of one tile of BN columns; a stage of the ring holds a unit's W
// (BN rows) and x (RT x 16 rows, rows past m zero-filled by the TMA unit, as are k past the end).
//
// Stream-K (dense_sm90_plan.h): CTA c of G streams the units [c U / G, (c + 1) U / G) through its
// ring without a break, tile after tile, so every SM reads the same share of the weight in one
// round (a grid of whole tiles and k splits ran 3 rounds of short-lived CTAs on Qwen3-8B's qkv,
// each filling and draining its pipeline: 25.3 us against cuBLAS's 16.2 on the H200). A CTA's
// range cuts at most two tiles: the first piece, if it ends a tile another CTA began, is held in
// registers until the range is done; the last, if it does not end its tile, goes to the
// workspace as fp32 partial sums and a flag is raised. The owner of a cut tile (the CTA with its
// last unit) then waits for its contributors' flags, adds their partials in CTA order and its
// own piece last, writes y and lowers the flags for the next launch. Owners only wait for lower
// CTAs, whose flags are raised at the end of their own ranges, and the launch is cooperative (all
// CTAs resident), so the waits end.
//
// One reduction order per output: an output is summed over each piece's units in k order, 16 k a
// wgmma, the pieces added in CTA order, and nothing of that depends on m, the row tile RT or the
// launch (the plan depends on n, k and the GPU only), so a row is bitwise the same alone, in a
// decode step or in a verify block (tests/test_dense_gpu.py).
#pragma once

#include <cutlass/arch/barrier.h>

#include "common.cuh"
#include "dense_gemm.cuh"  // DenseParams
#include "dense_sm90_plan.h"
#include "sm90_wgmma.cuh"

namespace dspine {
namespace gpu {

// The CTA's tile: BN output columns, RT row tiles of 16.
template <typename T, int BN, int RT>
struct DenseSm90Tile {
  using E = typename CuteElem<T>::type;
  static_assert(BN == 64 || BN == 128, "64 or 128 output columns a tile");
  static_assert(RT == 1 || RT == 2 || RT == 4, "16, 32 or 64 rows a CTA");
  static constexpr int kBlockN = BN;
  static constexpr int kRows = 16 * RT;
  static constexpr int kStageK = kDenseSm90StageK;
  static constexpr int kBoxK = 64;  // one 128-byte swizzle row of k a TMA box
  static constexpr int kStageBytes = (BN + kRows) * kStageK * static_cast<int>(sizeof(E));
  static constexpr int kRingBudget = 208 * 1024;
  static constexpr int kStages = kRingBudget / kStageBytes > 12 ? 12 : kRingBudget / kStageBytes;
  static_assert(kStages >= 3, "a ring of at least three stages");
  static constexpr int kThreads = 128 + 32;  // consumer warpgroup, producer warp
  static constexpr int kProducerThread = 128;

  using SmemLayoutW = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<E>{}, cute::Shape<cute::Int<BN>, cute::Int<kStageK>, cute::Int<kStages>>{}));
  using SmemLayoutX = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<E>{}, cute::Shape<cute::Int<kRows>, cute::Int<kStageK>, cute::Int<kStages>>{}));
  // m64n16k16 whatever RT: more rows are more wgmmas of the same shape (one instruction, one
  // rounding, for every row count).
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<E, E, float, cute::Shape<cute::_64, cute::_16, cute::Int<kStageK>>>()));

  static constexpr size_t kWBytes = cute::cosize(SmemLayoutW{}) * sizeof(E);
  static constexpr size_t kXBytes = cute::cosize(SmemLayoutX{}) * sizeof(E);
  static constexpr size_t kBarrierBytes = 2 * kStages * sizeof(uint64_t);
  // +1024: the base is re-aligned to the 128-byte swizzle's 1024-byte period.
  static constexpr size_t kSmemBytes = 1024 + kWBytes + kXBytes + kBarrierBytes;
  static_assert(kWBytes % 1024 == 0 && kXBytes % 1024 == 0, "rings keep the 1024-byte alignment");
  static_assert(kSmemBytes <= 227 * 1024, "fits one Hopper SM");
};

// The weight ([n, k], boxes of BN rows x 64 k) and x ([m, k] at x_stride, boxes of 16 RT rows x
// 64 k), both in the 128-byte swizzle the wgmma tiles read (encoded on the host per call).
struct DenseSm90Maps {
  CUtensorMap w, x;
};

// What the CTAs of a launch share (cuda_dense_sm90.cu keeps one per device and stream): a
// partial-sum slot and a flag a CTA. A flag is 1 from the moment its CTA's partials are written
// until the owner of their tile has read them, 0 otherwise (so 0 between launches).
struct DenseSm90Workspace {
  float* partials;  // [ctas][kDenseSm90MaxRows * 128]
  int* flags;       // [ctas]
};

#if DSPINE_SM90_DEVICE_CODE
namespace dense_sm90 {

// The 128 consumer threads only (the producer thread may still be issuing loads).
__device__ __forceinline__ void consumers_sync() { cutlass::arch::NamedBarrier::sync(128, 1); }

__device__ __forceinline__ int load_acquire(const int* flag) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(int* flag, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}

// Waits for a contributor's flag; a wait of seconds is a broken launch (a bug), which traps
// instead of hanging the process.
__device__ __forceinline__ void wait_for_flag(const int* flag) {
  for (int64_t spins = 0; load_acquire(flag) != 1; ++spins) {
    if (spins > (int64_t{1} << 26)) __trap();
    __nanosleep(64);
  }
}

// y[row, n0 + col] for the accumulators `acc` (coords: their (column, row) in the tile).
template <typename T, class Acc, class Coords>
__device__ __forceinline__ void store_y(const DenseParams& p, const Acc& acc, const Coords& coords, int n0) {
  T* y = static_cast<T*>(p.y);
#pragma unroll
  for (int j = 0; j < cute::size(acc); ++j) {
    const int col = n0 + cute::get<0>(coords(j)), row = cute::get<1>(coords(j));
    if (row < p.m && col < p.n) y[static_cast<int64_t>(row) * p.n + col] = from_float<T>(acc(j));
  }
}

}  // namespace dense_sm90
#endif

// grid: plan.ctas CTAs (cooperative: all resident); block: kThreads; dynamic shared memory
// kSmemBytes. p.m <= 16 RT rows (a launch per 64 rows), p.n, p.k as DenseParams says.
template <typename T, int BN, int RT>
__global__ void __launch_bounds__(DenseSm90Tile<T, BN, RT>::kThreads, 1)
    dense_sm90_kernel(const DenseParams p, const __grid_constant__ DenseSm90Maps maps, const DenseSm90Plan plan,
                      const DenseSm90Workspace work) {
#if DSPINE_SM90_DEVICE_CODE
  using namespace cute;
  using C = DenseSm90Tile<T, BN, RT>;
  using E = typename C::E;
  using Bar = cutlass::arch::ClusterBarrier;
  using TxBar = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  E* w_ptr = reinterpret_cast<E*>(base);
  E* x_ptr = reinterpret_cast<E*>(base + C::kWBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + C::kWBytes + C::kXBytes);  // TMA -> consumers
  uint64_t* empty = full + C::kStages;                                               // consumers -> TMA
  Tensor sW = make_tensor(make_smem_ptr(w_ptr), typename C::SmemLayoutW{});
  Tensor sX = make_tensor(make_smem_ptr(x_ptr), typename C::SmemLayoutX{});

  const int cta = static_cast<int>(blockIdx.x);
  const int64_t u0 = plan.unit_begin(cta), u1 = plan.unit_begin(cta + 1);
  const int n_units = static_cast<int>(u1 - u0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      Bar::init(&full[s], 1);     // the producer's arrive (with the stage's bytes)
      Bar::init(&empty[s], 128);  // every consumer thread, once the stage's wgmmas retired
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x == C::kProducerThread) {
    // ---------------------------------------------------------------- producer
    prefetch_tma_descriptor(&maps.w);
    prefetch_tma_descriptor(&maps.x);
    constexpr uint64_t kStream = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_FIRST);  // W: read once
    constexpr uint64_t kKeep = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_LAST);     // x: every CTA
    for (int i = 0; i < n_units; ++i) {
      const int stage = i % C::kStages;
      const int64_t u = u0 + i;
      const int n0 = static_cast<int>(u / plan.stages) * BN, k0 = static_cast<int>(u % plan.stages) * C::kStageK;
      Bar::wait(&empty[stage], ((i / C::kStages) & 1) ^ 1);  // a fresh barrier passes parity 1
      TxBar::arrive_and_expect_tx(&full[stage], static_cast<uint32_t>(C::kStageBytes));
#pragma unroll
      for (int b = 0; b < C::kStageK / C::kBoxK; ++b) {
        SM90_TMA_LOAD_2D::copy(&maps.w, &full[stage], kStream, &sW(0, b * C::kBoxK, stage), k0 + b * C::kBoxK, n0);
        SM90_TMA_LOAD_2D::copy(&maps.x, &full[stage], kKeep, &sX(0, b * C::kBoxK, stage), k0 + b * C::kBoxK, 0);
      }
    }
  } else if (threadIdx.x < 128) {
    // ---------------------------------------------------------------- consumer warpgroup
    const int tid = static_cast<int>(threadIdx.x);
    typename C::TiledMma mma;
    auto thr = mma.get_thread_slice(tid);
    Tensor acc = partition_fragment_C(mma, Shape<Int<BN>, Int<C::kRows>>{});  // (MMA, BN / 64, RT)
    Tensor head = make_fragment_like(acc);  // the first piece, when it finishes a tile begun before
    const Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<BN>, Int<C::kRows>>{}));
    Tensor tA = thr.partition_fragment_A(sW);  // descriptors (MMA, BN / 64, 128 / 16, stages)
    Tensor tB = thr.partition_fragment_B(sX);  // descriptors (MMA, RT, 128 / 16, stages)
    int64_t head_tile = -1;
    clear(acc);
    for (int i = 0; i < n_units; ++i) {
      const int stage = i % C::kStages;
      const int64_t u = u0 + i, tile = u / plan.stages;
      Bar::wait(&full[stage], (i / C::kStages) & 1);
      wgmma_issue<false, false>(mma, tA(_, _, _, stage), tB(_, _, _, stage), acc);
      wgmma_wait<1>(acc);  // unit i - 1's wgmmas retired: its stage goes back to the producer
      if (i > 0) Bar::arrive(&empty[(i - 1) % C::kStages]);
      if (u % plan.stages != plan.stages - 1) continue;
      // The tile ends here: y, or, if another CTA began it, the first piece kept for after the range.
      wgmma_wait<0>(acc);
      if (u0 <= tile * plan.stages) {
        dense_sm90::store_y<T>(p, acc, coords, static_cast<int>(tile) * BN);
      } else {
        copy(acc, head);
        head_tile = tile;
      }
      clear(acc);
    }
    wgmma_wait<0>(acc);  // unconditional: a wait on one path only makes ptxas serialize the wgmmas
    if (u1 % plan.stages != 0) {
      // The range ends inside a tile (the last piece): its partials for the tile's owner.
      float* slot = work.partials + static_cast<int64_t>(cta) * (kDenseSm90MaxRows * 128);
#pragma unroll
      for (int j = 0; j < size(acc); ++j) __stcg(slot + j * 128 + tid, acc(j));
      __threadfence();
      dense_sm90::consumers_sync();
      if (tid == 0) dense_sm90::store_release(work.flags + cta, 1);
    }
    if (head_tile >= 0) {
      // The tile's contributors, lowest CTA first; their partials in that order, this CTA's last.
      const int first = plan.first_cta_of_tile(head_tile, cta);
      if (tid == 0)
        for (int c = first; c < cta; ++c) dense_sm90::wait_for_flag(work.flags + c);
      dense_sm90::consumers_sync();
      const float* slot = work.partials + static_cast<int64_t>(first) * (kDenseSm90MaxRows * 128);
#pragma unroll
      for (int j = 0; j < size(acc); ++j) acc(j) = __ldcg(slot + j * 128 + tid);
      for (int c = first + 1; c < cta; ++c) {
        slot = work.partials + static_cast<int64_t>(c) * (kDenseSm90MaxRows * 128);
#pragma unroll
        for (int j = 0; j < size(acc); ++j) acc(j) += __ldcg(slot + j * 128 + tid);
      }
#pragma unroll
      for (int j = 0; j < size(acc); ++j) acc(j) += head(j);
      dense_sm90::store_y<T>(p, acc, coords, static_cast<int>(head_tile) * BN);
      // Read by every consumer thread before the flags drop (the next launch's writers wait for
      // this one to end anyway; the sync keeps a flag's meaning within the launch).
      dense_sm90::consumers_sync();
      if (tid == 0)
        for (int c = first; c < cta; ++c) dense_sm90::store_release(work.flags + c, 0);
    }
  }
#else
  __trap();  // no sm_90a image in this pass; dense_sm90_runnable() keeps launches away
#endif
}

}  // namespace gpu
}  // namespace dspine
