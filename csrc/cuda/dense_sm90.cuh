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
// CTA = one or two consumer warpgroups (threads 0-127 / 0-255: the wgmmas, 64 rows each at most)
// + one producer warp (its first thread issues the TMA loads). A unit is 128 k of one tile of BN columns; a stage of the ring holds a unit's W
// (BN rows) and x (16 RT rows a warpgroup, rows past m zero-filled by the TMA unit, as are k past the end).
//
// Stream-K (dense_sm90_plan.h): CTA c of G streams the units [c U / G, (c + 1) U / G) through its
// ring without a break, tile after tile, so every SM reads the same share of the weight in one
// round (a grid of whole tiles and k splits ran 3 rounds of short-lived CTAs on Qwen3-8B's qkv,
// each filling and draining its pipeline: 25.3 us against cuBLAS's 16.2 on the H200). A CTA's
// range cuts at most two tiles: the first piece, if it ends a tile another CTA began, waits in the
// workspace until the range is done; the last, if it does not end its tile, goes to the
// workspace as fp32 partial sums and a flag is raised. The owner of a cut tile (the CTA with its
// last unit) then waits for its contributors' flags, adds their partials in CTA order and its
// own piece last, writes y and lowers the flags for the next launch. Owners only wait for lower
// CTAs, whose flags are raised at the end of their own ranges, and the launch is cooperative (all
// CTAs resident), so the waits end.
//
// One reduction order per output: an output is summed over each piece's units in k order, 16 k a
// wgmma, the pieces added in CTA order, and nothing of that depends on m, the row tiles or the
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

// The CTA's tile: BN output columns, WG consumer warpgroups of RT row tiles of 16 each; WIDE: a
// warpgroup's rows in one m64n(16 RT)k16 wgmma instead of RT m64n16k16 ones.
template <typename T, int BN, int RT, int WG, bool WIDE>
struct DenseSm90Tile {
  using E = typename CuteElem<T>::type;
  static_assert(BN == 64 || BN == 128, "64 or 128 output columns a tile");
  static_assert(RT == 1 || RT == 2 || RT == 4, "16, 32 or 64 rows a warpgroup");
  static_assert(WG == 1 || WG == 2, "one or two consumer warpgroups");
  static constexpr int kGroupRows = 16 * RT;  // a warpgroup's rows: its own x ring
  static constexpr int kRows = kGroupRows * WG;
  static constexpr int kStageK = kDenseSm90StageK;
  static constexpr int kBoxK = 64;  // one 128-byte swizzle row of k a TMA box
  static constexpr int kStageBytes = (BN + kRows) * kStageK * static_cast<int>(sizeof(E));
  static constexpr int kRingBudget = 208 * 1024;
  static constexpr int kStages = kRingBudget / kStageBytes > 12 ? 12 : kRingBudget / kStageBytes;
  static_assert(kStages >= 3, "a ring of at least three stages");
  static constexpr int kConsumers = 128 * WG;
  static constexpr int kThreads = kConsumers + 32;  // consumer warpgroups, producer warp
  static constexpr int kProducerThread = kConsumers;
  static_assert(kRows <= kDenseSm90MaxRows, "a launch's rows");

  using SmemLayoutW = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<E>{}, cute::Shape<cute::Int<BN>, cute::Int<kStageK>, cute::Int<kStages>>{}));
  using SmemLayoutX = decltype(cute::tile_to_shape(  // one warpgroup's
      cute::GMMA::Layout_K_SW128_Atom<E>{}, cute::Shape<cute::Int<kGroupRows>, cute::Int<kStageK>, cute::Int<kStages>>{}));
  // Narrow (DSPINE_DENSE_SM90_WIDE=0): m64n16k16 whatever RT and WG, more rows being more wgmmas
  // of the same shape. Wide (the default since the 37th session): one m64n(16 RT)k16 for a
  // warpgroup's rows, which reads the weight's 64 x 16 operand from shared memory once instead of
  // RT times (at 128 rows the narrow form reads ~320 KB of shared memory a 32 KB stage, as long as
  // the stage takes to arrive). Each output is still one fp32 chain in the same k order, and
  // tests/test_dense_gpu.py holds every row equal to the row alone (one m64n16k16): on the H100
  // the wide form was as fast at 16 rows and 5-15% faster at 64-128 (37th session).
  static constexpr int kMmaN = WIDE ? kGroupRows : 16;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<E, E, float, cute::Shape<cute::_64, cute::Int<kMmaN>, cute::Int<kStageK>>>()));

  static constexpr size_t kWBytes = cute::cosize(SmemLayoutW{}) * sizeof(E);
  static constexpr size_t kXGroupBytes = cute::cosize(SmemLayoutX{}) * sizeof(E);
  static constexpr size_t kXBytes = kXGroupBytes * WG;
  static constexpr size_t kBarrierBytes = 2 * kStages * sizeof(uint64_t);
  // +1024: the base is re-aligned to the 128-byte swizzle's 1024-byte period.
  static constexpr size_t kSmemBytes = 1024 + kWBytes + kXBytes + kBarrierBytes;
  static_assert(kWBytes % 1024 == 0 && kXGroupBytes % 1024 == 0, "rings keep the 1024-byte alignment");
  static_assert(kSmemBytes <= 227 * 1024, "fits one Hopper SM");
};

// The weight ([n, k], boxes of BN rows x 64 k) and x ([m, k] at x_stride, boxes of 16 RT rows x
// 64 k, a warpgroup's rows), both in the 128-byte swizzle the wgmma tiles read (encoded on the host per call).
struct DenseSm90Maps {
  CUtensorMap w, x;
};

// What the CTAs of a launch share (cuda_dense_sm90.cu keeps one per device and stream): two
// partial-sum slots and a flag a CTA. A flag is 1 from the moment its CTA's partials are written
// until the owner of their tile has read them, 0 otherwise (so 0 between launches).
struct DenseSm90Workspace {
  float* partials;  // [ctas][2][kSlotFloats]: a CTA's last piece and first piece, in accumulator order
  int* flags;       // [ctas]
};
constexpr int64_t kSlotFloats = int64_t{kDenseSm90MaxRows} * 128;  // a piece of 128 rows x 128 columns

#if DSPINE_SM90_DEVICE_CODE
namespace dense_sm90 {

// The consumer threads only (the producer thread may still be issuing loads).
template <int CONSUMERS>
__device__ __forceinline__ void consumers_sync() { cutlass::arch::NamedBarrier::sync(CONSUMERS, 1); }

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
    if (spins > (int64_t{1} << 22)) __trap();  // ~4M polls: seconds
    __nanosleep(64);
  }
}

// y[row0 + row, n0 + col] for a warpgroup's accumulators (their (column, row) in its tile from the
// identity tensor, rebuilt here rather than kept in registers across the loop).
template <typename T, int BN, int ROWS, class Thr, class Acc>
__device__ __forceinline__ void store_y(const DenseParams& p, const Thr& thr, const Acc& acc, int n0, int row0) {
  const auto coords = thr.partition_C(cute::make_identity_tensor(cute::Shape<cute::Int<BN>, cute::Int<ROWS>>{}));
  T* y = static_cast<T*>(p.y);
#pragma unroll
  for (int j = 0; j < cute::size(acc); ++j) {
    const int col = n0 + cute::get<0>(coords(j)), row = row0 + cute::get<1>(coords(j));
    if (row < p.m && col < p.n) y[static_cast<int64_t>(row) * p.n + col] = from_float<T>(acc(j));
  }
}

}  // namespace dense_sm90
#endif

// grid: plan.ctas CTAs (cooperative: all resident); block: kThreads; dynamic shared memory
// kSmemBytes. p.m <= 16 RT WG rows (a launch per 128 rows), p.n, p.k as DenseParams says.
template <typename T, int BN, int RT, int WG, bool WIDE>
__global__ void __launch_bounds__(DenseSm90Tile<T, BN, RT, WG, WIDE>::kThreads, 1)
    dense_sm90_kernel(const DenseParams p, const __grid_constant__ DenseSm90Maps maps, const DenseSm90Plan plan,
                      const DenseSm90Workspace work) {
#if DSPINE_SM90_DEVICE_CODE
  using namespace cute;
  using C = DenseSm90Tile<T, BN, RT, WG, WIDE>;
  using E = typename C::E;
  using Bar = cutlass::arch::ClusterBarrier;
  using TxBar = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  E* w_ptr = reinterpret_cast<E*>(base);
  E* x_ptr = reinterpret_cast<E*>(base + C::kWBytes);  // warpgroup g's ring at g x kXGroupBytes
  uint64_t* full = reinterpret_cast<uint64_t*>(base + C::kWBytes + C::kXBytes);  // TMA -> consumers
  uint64_t* empty = full + C::kStages;                                               // consumers -> TMA
  Tensor sW = make_tensor(make_smem_ptr(w_ptr), typename C::SmemLayoutW{});

  const int cta = static_cast<int>(blockIdx.x);
  const int64_t u0 = plan.unit_begin(cta), u1 = plan.unit_begin(cta + 1);
  const int n_units = static_cast<int>(u1 - u0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      Bar::init(&full[s], 1);               // the producer's arrive (with the stage's bytes)
      Bar::init(&empty[s], C::kConsumers);  // every consumer thread, once the stage's wgmmas retired
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
    // A unit's weight boxes, and its x boxes (one a warpgroup), into `stage`.
    const auto load_w = [&](int stage, int64_t u) {
      const int n0 = static_cast<int>(u / plan.stages) * BN, k0 = static_cast<int>(u % plan.stages) * C::kStageK;
#pragma unroll
      for (int b = 0; b < C::kStageK / C::kBoxK; ++b)
        SM90_TMA_LOAD_2D::copy(&maps.w, &full[stage], kStream, &sW(0, b * C::kBoxK, stage), k0 + b * C::kBoxK, n0);
    };
    const auto load_x = [&](int stage, int64_t u) {
      const int k0 = static_cast<int>(u % plan.stages) * C::kStageK;
#pragma unroll
      for (int b = 0; b < C::kStageK / C::kBoxK; ++b)
#pragma unroll
        for (int g = 0; g < WG; ++g) {
          Tensor sX = make_tensor(make_smem_ptr(x_ptr + g * (C::kXGroupBytes / sizeof(E))), typename C::SmemLayoutX{});
          SM90_TMA_LOAD_2D::copy(&maps.x, &full[stage], kKeep, &sX(0, b * C::kBoxK, stage), k0 + b * C::kBoxK,
                                 g * C::kGroupRows);
        }
    };
    // The first ring's weight while the previous kernel finishes (no kernel writes a weight); x,
    // that kernel's output, only after it (a stage's barrier counts both loads' bytes).
    const int early = n_units < C::kStages ? n_units : C::kStages;
    for (int i = 0; i < early; ++i) {
      TxBar::arrive_and_expect_tx(&full[i], static_cast<uint32_t>(C::kStageBytes));
      load_w(i, u0 + i);
    }
    join_chain();
    for (int i = 0; i < n_units; ++i) {
      const int stage = i % C::kStages;
      if (i >= early) {
        Bar::wait(&empty[stage], ((i / C::kStages) & 1) ^ 1);  // freed by the consumers (i >= kStages)
        TxBar::arrive_and_expect_tx(&full[stage], static_cast<uint32_t>(C::kStageBytes));
        load_w(stage, u0 + i);
      }
      load_x(stage, u0 + i);
    }
  } else if (threadIdx.x < C::kConsumers) {
    // ---------------------------------------------------------------- consumer warpgroups
    join_chain();  // launch.cuh: the producer alone starts (on the weight) before the previous kernel ends
    const int tid = static_cast<int>(threadIdx.x), group = tid / 128, row0 = group * C::kGroupRows;
    Tensor sX = make_tensor(make_smem_ptr(x_ptr + group * (C::kXGroupBytes / sizeof(E))), typename C::SmemLayoutX{});
    typename C::TiledMma mma;
    auto thr = mma.get_thread_slice(tid % 128);
    Tensor acc = partition_fragment_C(mma, Shape<Int<BN>, Int<C::kGroupRows>>{});  // (MMA, BN / 64, RT)
    Tensor tA = thr.partition_fragment_A(sW);  // descriptors (MMA, BN / 64, 128 / 16, stages)
    Tensor tB = thr.partition_fragment_B(sX);  // descriptors (MMA, RT or 1 (wide), 128 / 16, stages)
    // Slot 2c holds this CTA's last piece for the owner of its tile; slot 2c + 1 its first piece,
    // when that finishes a tile begun before, until the range is done (not in registers: two
    // warpgroups have 168 registers a thread).
    float* const tail_slot = work.partials + (2 * static_cast<int64_t>(cta)) * kSlotFloats;
    float* const head_slot = tail_slot + kSlotFloats;
    int64_t head_tile = -1;
    clear(acc);
    for (int i = 0; i < n_units; ++i) {
      const int stage = i % C::kStages;
      const int64_t u = u0 + i, tile = u / plan.stages;
      Bar::wait(&full[stage], (i / C::kStages) & 1);
      wgmma_issue<false, false>(mma, tA(_, _, _, stage), tB(_, _, _, stage), acc);
      wgmma_wait<1>(acc);  // unit i - 1's wgmmas retired: its stage goes back to the producer
      if (i > 0) Bar::arrive(&empty[(i - 1) % C::kStages]);
      if (!plan.ends_tile(u)) continue;
      // The tile ends here: y, or, if another CTA began it, the first piece kept for after the range.
      wgmma_wait<0>(acc);
      if (plan.holds_tile_start(cta, tile)) {
        dense_sm90::store_y<T, BN, C::kGroupRows>(p, thr, acc, static_cast<int>(tile) * BN, row0);
      } else {
#pragma unroll
        for (int j = 0; j < size(acc); ++j) __stcg(head_slot + j * C::kConsumers + tid, acc(j));
        head_tile = tile;
      }
      clear(acc);
    }
    wgmma_wait<0>(acc);  // unconditional: a wait on one path only makes ptxas serialize the wgmmas
    if (plan.leaves_partial(cta)) {
      // The range ends inside a tile (the last piece): its partials for the tile's owner.
#pragma unroll
      for (int j = 0; j < size(acc); ++j) __stcg(tail_slot + j * C::kConsumers + tid, acc(j));
      __threadfence();
      dense_sm90::consumers_sync<C::kConsumers>();
      if (tid == 0) dense_sm90::store_release(work.flags + cta, 1);
    }
    if (head_tile >= 0) {
      // The tile's contributors, lowest CTA first; their partials in that order, this CTA's last.
      const int first = plan.first_cta_of_tile(head_tile, cta);
      if (tid == 0)
        for (int c = first; c < cta; ++c) dense_sm90::wait_for_flag(work.flags + c);
      dense_sm90::consumers_sync<C::kConsumers>();
      const float* slot = work.partials + (2 * static_cast<int64_t>(first)) * kSlotFloats;
#pragma unroll
      for (int j = 0; j < size(acc); ++j) acc(j) = __ldcg(slot + j * C::kConsumers + tid);
      for (int c = first + 1; c < cta; ++c) {
        slot = work.partials + (2 * static_cast<int64_t>(c)) * kSlotFloats;
#pragma unroll
        for (int j = 0; j < size(acc); ++j) acc(j) += __ldcg(slot + j * C::kConsumers + tid);
      }
#pragma unroll
      for (int j = 0; j < size(acc); ++j) acc(j) += __ldcg(head_slot + j * C::kConsumers + tid);
      dense_sm90::store_y<T, BN, C::kGroupRows>(p, thr, acc, static_cast<int>(head_tile) * BN, row0);
      // Read by every consumer thread before the flags drop (the next launch's writers wait for
      // this one to end anyway; the sync keeps a flag's meaning within the launch).
      dense_sm90::consumers_sync<C::kConsumers>();
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
