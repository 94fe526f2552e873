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
// the TMA loads): BN = 64 or 128 output columns, RT x 16 rows, and one k split of the plan
// (dense_sm90_plan.h). A stage holds 128 k of W (BN rows) and of x (RT x 16 rows, rows past m
// zero-filled by the TMA unit, as are k past the end); the ring has as many stages as fit ~200 KB
// (4-8), all of them in flight. The k splits of a column tile are the CTAs of one cluster: each
// leaves its fp32 partial sums in its shared memory, and CTA r adds the cluster's partials for its
// 1/splits of the columns in rank order (distributed shared memory) and writes them.
//
// One reduction order per output: an output is summed over its split's k stages in order, 16 k a
// wgmma, the splits added in rank order, and nothing of that depends on m, the row tile RT, the
// tile width BN or the grid (the plan depends on n, k and the GPU only), so a row is bitwise the
// same alone, in a decode step or in a verify block (tests/test_dense_gpu.py).
#pragma once

#include <cooperative_groups.h>

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
  static_assert(BN == 64 || BN == 128, "64 or 128 output columns a CTA");
  static_assert(RT == 1 || RT == 2 || RT == 4, "16, 32 or 64 rows a CTA");
  static constexpr int kBlockN = BN;
  static constexpr int kRows = 16 * RT;
  static constexpr int kStageK = kDenseSm90StageK;
  static constexpr int kBoxK = 64;  // one 128-byte swizzle row of k a TMA box
  static constexpr int kStageBytes = (BN + kRows) * kStageK * static_cast<int>(sizeof(E));
  static constexpr int kRingBudget = 200 * 1024;
  static constexpr int kStages = kRingBudget / kStageBytes > 8 ? 8 : kRingBudget / kStageBytes;
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
  // The partial sums [kRows][BN] (fp32) reuse the W ring once the last stage is consumed.
  static_assert(kRows * BN * sizeof(float) <= kWBytes, "the partial sums fit the W ring");
};

// The weight ([n, k], boxes of BN rows x 64 k) and x ([m, k] at x_stride, boxes of 16 RT rows x
// 64 k), both in the 128-byte swizzle the wgmma tiles read (encoded on the host per call).
struct DenseSm90Maps {
  CUtensorMap w, x;
};

// grid: (splits, column tiles, row blocks), clusters of `splits` CTAs along x (CLUSTER: splits >
// 1); block: kThreads; dynamic shared memory kSmemBytes. p.m, p.n, p.k as DenseParams says.
template <typename T, int BN, int RT, bool CLUSTER>
__global__ void __launch_bounds__(DenseSm90Tile<T, BN, RT>::kThreads, 1)
    dense_sm90_kernel(const DenseParams p, const __grid_constant__ DenseSm90Maps maps) {
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

  // This CTA's split of k: stages [s0, s1) of the call's ceil(k / 128).
  const int splits = static_cast<int>(gridDim.x), split = static_cast<int>(blockIdx.x);
  const int all_stages = (p.k + C::kStageK - 1) / C::kStageK;
  const int s0 = static_cast<int>(static_cast<int64_t>(all_stages) * split / splits);
  const int s1 = static_cast<int>(static_cast<int64_t>(all_stages) * (split + 1) / splits);
  const int n_stages = s1 - s0;
  const int n0 = static_cast<int>(blockIdx.y) * BN, row0 = static_cast<int>(blockIdx.z) * C::kRows;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      Bar::init(&full[s], 1);     // the producer's arrive (with the stage's bytes)
      Bar::init(&empty[s], 128);  // every consumer thread, once the stage's wgmmas retired
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  typename C::TiledMma mma;
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor acc = partition_fragment_C(mma, Shape<Int<BN>, Int<C::kRows>>{});  // (MMA, BN / 64, RT)
  if (threadIdx.x == C::kProducerThread) {
    // ---------------------------------------------------------------- producer
    prefetch_tma_descriptor(&maps.w);
    prefetch_tma_descriptor(&maps.x);
    constexpr uint64_t kStream = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_FIRST);  // W: read once
    constexpr uint64_t kKeep = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_LAST);     // x: every CTA
    for (int i = 0; i < n_stages; ++i) {
      const int stage = i % C::kStages;
      Bar::wait(&empty[stage], ((i / C::kStages) & 1) ^ 1);  // a fresh barrier passes parity 1
      TxBar::arrive_and_expect_tx(&full[stage], static_cast<uint32_t>(C::kStageBytes));
      const int k0 = (s0 + i) * C::kStageK;
#pragma unroll
      for (int b = 0; b < C::kStageK / C::kBoxK; ++b) {
        SM90_TMA_LOAD_2D::copy(&maps.w, &full[stage], kStream, &sW(0, b * C::kBoxK, stage), k0 + b * C::kBoxK, n0);
        SM90_TMA_LOAD_2D::copy(&maps.x, &full[stage], kKeep, &sX(0, b * C::kBoxK, stage), k0 + b * C::kBoxK, row0);
      }
    }
  } else if (threadIdx.x < 128) {
    // ---------------------------------------------------------------- consumer warpgroup
    Tensor tA = thr.partition_fragment_A(sW);  // descriptors (MMA, BN / 64, 128 / 16, stages)
    Tensor tB = thr.partition_fragment_B(sX);  // descriptors (MMA, RT, 128 / 16, stages)
    clear(acc);
    for (int i = 0; i < n_stages; ++i) {
      const int stage = i % C::kStages;
      Bar::wait(&full[stage], (i / C::kStages) & 1);
      wgmma_issue<false, false>(mma, tA(_, _, _, stage), tB(_, _, _, stage), acc);
      wgmma_wait<1>(acc);  // stage i - 1's wgmmas retired: its buffers go back to the producer
      if (i > 0) Bar::arrive(&empty[(i - 1) % C::kStages]);
    }
    wgmma_wait<0>(acc);
  }
  // Every wgmma has retired and every load landed (the consumers waited for all of them): the W
  // ring takes the partial sums, [kRows][BN] fp32, row-major.
  __syncthreads();
  float* partial = reinterpret_cast<float*>(w_ptr);
  if (threadIdx.x < 128) {
    Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<BN>, Int<C::kRows>>{}));
#pragma unroll
    for (int j = 0; j < size(acc); ++j) {
      const int col = get<0>(coords(j)), row = get<1>(coords(j));
      partial[row * BN + col] = acc(j);
    }
  }
  // CTA `split` adds the cluster's partials for its share of the columns, in rank order.
  namespace cg = cooperative_groups;
  if constexpr (CLUSTER) cg::this_cluster().sync(); else __syncthreads();
  const int share = BN / splits;  // splits is a power of two <= 8, BN 64 or 128
  const int rows = min(C::kRows, p.m - row0);
  T* y = static_cast<T*>(p.y);
  for (int e = threadIdx.x; e < rows * share; e += C::kThreads) {
    const int row = e / share, col = split * share + e % share;
    if (n0 + col >= p.n) continue;
    float v;
    if constexpr (CLUSTER) {
      cg::cluster_group cluster = cg::this_cluster();
      v = cluster.map_shared_rank(partial, 0)[row * BN + col];
      for (int r = 1; r < splits; ++r) v += cluster.map_shared_rank(partial, r)[row * BN + col];
    } else {
      v = partial[row * BN + col];
    }
    y[static_cast<int64_t>(row0 + row) * p.n + n0 + col] = from_float<T>(v);
  }
  if constexpr (CLUSTER) cg::this_cluster().sync();  // no CTA leaves while others read its partials
#else
  __trap();  // no sm_90a image in this pass; dense_sm90_runnable() keeps launches away
#endif
}

}  // namespace gpu
}  // namespace dspine
