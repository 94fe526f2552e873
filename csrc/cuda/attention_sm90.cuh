// Paged attention row tiles on Hopper (sm_90a): warpgroup MMA (wgmma) through CuTe, a producer
// warpgroup streaming K/V through an mbarrier ring, two consumer warpgroups. Semantics are those
// of attention.cuh (dspine_engine/ops.py:paged_attention); this kernel runs the subset
// attention_heuristics.h routes to it (bf16/fp16, head dim 64/128, row tiles, no window).
//
// CTA = 3 warpgroups (384 threads) owning one (sequence, kv head, tile of 128 rows), rows being
// (query, head of the GQA group) pairs exactly as in the mma.sync kernel (cta_work is shared):
//   warpgroup 0  producer: Q once, then K and V tiles of 128 keys into two rings of kStages
//                stages (K_{i+1} before V_i, the order the consumers need them). A tile whose
//                keys are all visible and whose 128 cache slots are consecutive (its pages are)
//                goes by TMA, one 128-row box per 64 columns (sm90_tile_slot); any other by
//                cp.async, 16 bytes a copy, one page-table read per thread and tile (its 8 or 16
//                key rows lie on one page; KeyRun in attention.cuh), zero-filling the keys outside
//                the visible range. Each load is announced on its `full` mbarrier by
//                Sm90WaitAnnouncer or Sm90AsyncAnnouncer (below), plus the TMA's bytes.
//   warpgroups 1-2  consumers, 64 rows each (the M of one wgmma): S = Q K^T with both operands
//                in shared memory (SS), online softmax on the S accumulators in registers (the
//                mma.sync kernel's softmax_scores / rescale_rows: wgmma's accumulator layout per
//                warp is the m16n8 layout they were written for), P converted in registers and
//                O += P V with P as the register operand (RS). Two batches in flight: tile i's
//                Q K^T and tile i-1's P V are issued together, the softmax of tile i runs under
//                P V, O is rescaled under the next step's Q K^T (FlashAttention-3's
//                intra-warpgroup overlap). A stage of K is released when its Q K^T retires, one
//                of V after P V.
// Masks are applied only on tiles that some row of the CTA cannot fully see (the causal
// diagonal), as in the mma.sync kernel. No key split: the heuristic sends a call here only when
// its row tiles fill the GPU by themselves.
//
// The two consumers take turns issuing a step's GEMMs (ping-pong, named barriers), so that one's
// softmax runs under the other's GEMMs. Not yet: an output staged through shared memory. See
// docs/KERNELS.md for the measured rate.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: the maps are encoded through the runtime)

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include "attention.cuh"
#include "attention_sm90_cuts.h"
#include "sm90_wgmma.cuh"

namespace dspine {
namespace gpu {

template <typename T, int D>
struct Sm90Tile {
  using Elem = T;
  using E = typename CuteElem<T>::type;
  static constexpr int kD = D;
  static constexpr int kBlockM = 128;  // 2 consumer warpgroups x 64 rows (wgmma M)
  static constexpr int kBlockN = 128;  // keys per stage: the N of QK^T, the K of PV
  // Stages of K and of V (apart: a stage of K frees when Q K^T is done with it, one of V when
  // P V is). Three at head dim 128 fill the SM's shared memory (225 KB).
  static constexpr int kStages = D <= 64 ? 4 : 3;
  static constexpr int kThreads = 3 * 128;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kRunKeys = key_run_length(kBlockN, kChunks, 128);  // per producer thread
  static_assert(kRunKeys > 0, "the producer's 128 threads cover a tile in runs");
  // setmaxnreg budgets: what the producer gives back must cover what the consumers take, inside
  // the CTA's 384 x 168 = 64512 registers: 128 x 72 + 256 x 216 = 64512. At 40 the producer
  // spilled 12-16 bytes (its cp.async address math); 56 compiled with none until its whole key
  // runs got their own copy path (KeyRun::visit), which spills 12 bytes at 56 and none at 64; the
  // TMA path's run check (sm90_tile_slot) spilled 24 bytes at 64 (head dim 128) and none at 72.
  // The consumers compile without spills at 216 (224 before).
  static constexpr int kProducerRegs = 72;
  static constexpr int kConsumerRegs = 216;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * ((65536 / 384) & ~7),
                "the warpgroups' registers fit what the launch gives the CTA");

  // Shared memory: K-major 128-byte-swizzled tiles (what wgmma reads without bank conflicts).
  // V is stored like K (key rows of D contiguous elements, as the cache holds them) and read by
  // PV through a transposed (D x keys) view, i.e. as an MN-major B operand.
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<E>{}, cute::Shape<cute::Int<kBlockM>, cute::Int<D>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<E>{}, cute::Shape<cute::Int<kBlockN>, cute::Int<D>, cute::Int<kStages>>{}));
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutK{}, cute::make_layout(cute::Shape<cute::Int<D>, cute::Int<kBlockN>, cute::Int<kStages>>{},
                                       cute::Stride<cute::Int<kBlockN>, cute::_1, cute::Int<kBlockN * D>>{})));

  // Two warpgroups along M; each runs 64 x N x 16 wgmmas.
  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<E, E, float, cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<D>>>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<E, E, float, cute::Shape<cute::_64, cute::Int<D>, cute::Int<kBlockN>>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

  static constexpr size_t kQBytes = cute::cosize(SmemLayoutQ{}) * sizeof(E);
  static constexpr size_t kKVBytes = cute::cosize(SmemLayoutK{}) * sizeof(E);
  static constexpr size_t kBarrierBytes = (1 + 4 * kStages) * sizeof(uint64_t);
  // +1024: the dynamic shared memory base is re-aligned to 1024 bytes (the 128-byte swizzle's
  // period, which the wgmma descriptors assume).
  static constexpr size_t kSmemBytes = 1024 + kQBytes + 2 * kKVBytes + kBarrierBytes;
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep the 1024-byte alignment");
  static_assert(kSmemBytes <= 227 * 1024, "fits one Hopper SM");

  // First row (inside the CTA's tile) of the calling consumer warp: warps 4..11 own rows 16 each,
  // which is where the tiled MMA puts their accumulator rows (store_rows reads it).
  __device__ static int warp_row0() { return (static_cast<int>(threadIdx.x / kWarpSize) - 4) * 16; }
};

// Tensor maps of the K and V caches for loading whole tiles by TMA (encoded on the host:
// cuda_attention_sm90.cu). A cache is the 3-D tensor [slots, kv_heads, D] (dims D, kv_heads,
// slots, innermost first); a box is 128 slots (a tile's keys) x 1 head x 64 columns in the
// 128-byte swizzle the wgmma tiles use, so it lands on its 64-column half of the stage exactly as
// the cp.async path writes it. on = false: every tile by cp.async.
struct Sm90LoadMaps {
  CUtensorMap k, v;
  bool on;
};

#if DSPINE_SM90_DEVICE_CODE
// Producer: thread tid copies 16-byte chunk tid % kChunks of the kRunKeys consecutive key rows
// starting at (tid / kChunks) * kRunKeys of a tile; their offsets come from one table read
// (KeyRun), made before the stage's `empty` wait and shared by the tile's K and V loads.
template <typename C>
__device__ __forceinline__ KeyRun<C::kRunKeys> sm90_key_run(const PagedAttentionParams& p, const CtaWork& w,
                                                           const int32_t* table, int tile, int tid) {
  return KeyRun<C::kRunKeys>(table, tile * C::kBlockN + tid / C::kChunks * C::kRunKeys, p, w, C::kD);
}

// One K or V tile (`cache`) into its stage, zero-filled outside the CTA's visible keys.
template <typename C, class TS>
__device__ __forceinline__ void sm90_load_tile(TS& dst, const void* cache, const PagedAttentionParams& p,
                                               const CtaWork& w, const int32_t* table,
                                               const KeyRun<C::kRunKeys>& run, int stage, int tid) {
  using T = typename C::Elem;
  const T* src = static_cast<const T*>(cache);
  const int ch = tid % C::kChunks, r0 = tid / C::kChunks * C::kRunKeys;
  run.visit(table, p, w, C::kD, [&](int k, int64_t off, auto whole) {
    copy_key_chunk(&dst(r0 + k, ch * 8, stage), src + ch * 8, off, whole);
  });
}

// The first cache slot of key tile `tile` when TMA can load it whole, else -1 (cp.async): every
// key of the tile visible to the CTA (nothing to zero-fill) and its 128 slots consecutive in the
// cache, i.e. the pages it touches mapped and consecutive (the engine's page pool hands them out
// in ascending runs: kv_cache.py, PagePool). Why only whole runs: 16-row boxes, one per page of
// 16, made the 8K prefill 12% slower than cp.async, where 128-row boxes made it 15% faster (H100,
// 32nd session, `h200_quick.sh prefill-pages`). Each producer warp reads the table entries itself,
// one a lane (the host allows TMA only for power-of-two pages of at least 8 keys: at most 16
// pages a tile), so all four agree without a barrier; read before the producer waits for a
// stage, as KeyRun is.
template <typename C>
__device__ __forceinline__ int sm90_tile_slot(const PagedAttentionParams& p, const CtaWork& w, const int32_t* table,
                                              bool tma, int tile) {
  const int k0 = tile * C::kBlockN, k1 = k0 + C::kBlockN - 1;
  if (!tma || k0 < w.key_lo || k1 > w.key_hi) return -1;  // uniform over the warpgroup
  const int first = k0 >> w.page_shift, idx = min(first + static_cast<int>(threadIdx.x % kWarpSize), k1 >> w.page_shift);
  const int page = idx < p.max_pages ? table[idx] : -1;
  const int page0 = __shfl_sync(0xffffffffu, page, 0);
  const bool in_run = page >= 0 && page < p.num_pages && page == page0 + (idx - first);
  if (!__all_sync(0xffffffffu, in_run)) return -1;
  return page0 * p.page_size + (k0 - first * p.page_size);  // < 2^31: the host checks
}

// A tile by TMA from its first slot (sm90_tile_slot): producer thread 0 adds the tile's bytes to
// the stage's `full` barrier and issues one 128-row box per 64 columns, which count those bytes
// down as they land (the barrier's phase also waits for all 128 producer arrivals).
template <typename C, class TS>
__device__ __forceinline__ void sm90_tma_tile(TS& dst, const CUtensorMap* map, const CtaWork& w, int slot, int stage,
                                              uint64_t* full) {
  if (threadIdx.x != 0) return;
  cutlass::arch::ClusterTransactionBarrier::expect_transaction(
      full, static_cast<uint32_t>(C::kBlockN * C::kD * sizeof(typename C::Elem)));
  constexpr uint64_t kCacheHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
#pragma unroll
  for (int h = 0; h < C::kD / 64; ++h)
    cute::SM90_TMA_LOAD_3D::copy(map, full, kCacheHint, &dst(0, h * 64, stage), h * 64, w.kvh, slot);
}

// How the producer announces a load (one cp.async group per thread) on its `full` barrier:
//   Sm90WaitAnnouncer   each thread waits for its own copies, fences them into the async proxy
//                       that wgmma reads through and arrives: two loads in flight per thread
//                       (the load before is announced once the next one is issued).
//   Sm90AsyncAnnouncer  each thread hands the arrival to the copy unit
//                       (cp.async.mbarrier.arrive.noinc: the barrier counts it once the thread's
//                       earlier copies have landed) and goes on at once, so as many loads are in
//                       flight as the rings have free stages; the ordering into wgmma's reads is
//                       the barrier's (as CUTLASS's cp.async warp-specialised mainloops rely on).
// Both are kept: async is faster at head dim 128, wait at 64 (sm90_async_arrivals in
// attention_heuristics.h, with the measurements).
struct Sm90WaitAnnouncer {
  uint64_t* pending = nullptr;  // `full` barrier of the load issued last, not yet announced

  // Call right after committing a load's group; `full` is that load's barrier.
  __device__ __forceinline__ void issued(uint64_t* full) {
    cp_async_wait<1>();
    announce_pending();
    pending = full;
  }
  __device__ __forceinline__ void finish() {
    cp_async_wait<0>();
    announce_pending();
  }

 private:
  __device__ __forceinline__ void announce_pending() {
    if (pending == nullptr) return;
    // cp.async writes through the generic proxy, wgmma reads through the async proxy: each
    // writing thread fences its own writes before its release-arrive.
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::ClusterBarrier::arrive(pending);
  }
};

struct Sm90AsyncAnnouncer {
  __device__ __forceinline__ void issued(uint64_t* full) { cutlass::arch::cpasync_barrier_arrive_noinc(full); }
  // No copy outlives its thread (the barriers count them either way).
  __device__ __forceinline__ void finish() { cp_async_wait<0>(); }
};
#endif

// grid: (batch * kv_heads, 1, row tiles of 128); block: 384 threads; dynamic smem kSmemBytes.
// ASYNC_ARRIVE: the producer's announcer (Sm90AsyncAnnouncer, else Sm90WaitAnnouncer).
template <typename T, int D, bool ASYNC_ARRIVE>
__global__ void __launch_bounds__(Sm90Tile<T, D>::kThreads, 1)
    paged_attention_sm90_kernel(const PagedAttentionParams p, const __grid_constant__ Sm90LoadMaps maps) {
  join_chain();  // launch.cuh
#if DSPINE_SM90_DEVICE_CODE
  using namespace cute;
  using C = Sm90Tile<T, D>;
  using E = typename C::E;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  E* q_ptr = reinterpret_cast<E*>(base);
  E* k_ptr = reinterpret_cast<E*>(base + C::kQBytes);
  E* v_ptr = reinterpret_cast<E*>(base + C::kQBytes + C::kKVBytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(base + C::kQBytes + 2 * C::kKVBytes);
  uint64_t* q_full = bars;
  // [kStages] each: producer -> consumers (128 arrivals), consumers -> producer (256 arrivals).
  uint64_t* full_k = bars + 1;
  uint64_t* full_v = full_k + C::kStages;
  uint64_t* empty_k = full_v + C::kStages;
  uint64_t* empty_v = empty_k + C::kStages;
  using Bar = cutlass::arch::ClusterBarrier;

  Tensor sQ = make_tensor(make_smem_ptr(q_ptr), typename C::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(k_ptr), typename C::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(v_ptr), typename C::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(v_ptr), typename C::SmemLayoutVt{});

  const CtaWork w = cta_work<C>(p);
  if (w.rows_here <= 0) return;  // uniform over the CTA
  const int n_tiles = w.tile_end - w.tile_begin;

  if (threadIdx.x == 0) {
    Bar::init(q_full, 128);
    for (int s = 0; s < C::kStages; ++s) {
      Bar::init(&full_k[s], 128);
      Bar::init(&full_v[s], 128);
      Bar::init(&empty_k[s], 256);
      Bar::init(&empty_v[s], 256);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // Parity a stage's barrier shows once its u-th use (u = tile / kStages) may start: a fresh
  // `empty` barrier passes parity 1 at once.
  auto use_parity = [](int tile) { return (tile / C::kStages) & 1; };
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---------------------------------------------------------------- producer warpgroup
    // Loads in the order the consumers need them: Q, K_0, then K_{i+1} before V_i (Q K^T of the
    // next tile is issued before P V of this one).
    cutlass::arch::warpgroup_reg_dealloc<C::kProducerRegs>();
    const int tid = threadIdx.x;
    load_q_rows<T, D, C::kBlockM, 128>(p, w, tid, [&](int r, int ch) { return &sQ(r, ch * 8); });
    cp_async_commit();
    if (n_tiles == 0) {
      cp_async_wait<0>();  // no copy outlives the CTA; no consumer waits for Q
      return;
    }
    const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.max_pages;
    std::conditional_t<ASYNC_ARRIVE, Sm90AsyncAnnouncer, Sm90WaitAnnouncer> announce;
    announce.issued(q_full);
    if (maps.on && tid == 0) {
      cute::prefetch_tma_descriptor(&maps.k);
      cute::prefetch_tma_descriptor(&maps.v);
    }
    // Tile i of K or V into its stage: by TMA from its first slot when it has one (whole and on
    // consecutive slots: sm90_tile_slot), else by cp.async (a range's first and last tiles
    // zero-fill the keys outside it).
    auto load = [&](auto& dst, const CUtensorMap* map, const void* cache, const KeyRun<C::kRunKeys>& rows,
                    int tile_slot, int i, uint64_t* full) {
      const int stage = i % C::kStages;
      if (!sm90_loads_tile(i, C::kStages)) return;
      if (tile_slot >= 0)
        sm90_tma_tile<C>(dst, map, w, tile_slot, stage, full);
      else
        sm90_load_tile<C>(dst, cache, p, w, table, rows, stage, tid);
    };
    // Tile i's sources (rows for cp.async, the first slot for TMA), each read before its waits.
    KeyRun<C::kRunKeys> run = sm90_key_run<C>(p, w, table, w.tile_begin, tid);
    int slot = sm90_tile_slot<C>(p, w, table, maps.on, w.tile_begin);
    load(sK, &maps.k, p.k_cache, run, slot, 0, &full_k[0]);
    cp_async_commit();
    announce.issued(&full_k[0]);
    for (int i = 0; i < n_tiles; ++i) {
      KeyRun<C::kRunKeys> next = run;
      int next_slot = slot;
      if (i + 1 < n_tiles) {
        next = sm90_key_run<C>(p, w, table, w.tile_begin + i + 1, tid);
        next_slot = sm90_tile_slot<C>(p, w, table, maps.on, w.tile_begin + i + 1);
        const int stage = (i + 1) % C::kStages;
        Bar::wait(&empty_k[stage], use_parity(i + 1) ^ 1);
        load(sK, &maps.k, p.k_cache, next, next_slot, i + 1, &full_k[stage]);
        cp_async_commit();
        announce.issued(&full_k[stage]);
      }
      const int stage = i % C::kStages;
      Bar::wait(&empty_v[stage], use_parity(i) ^ 1);
      load(sV, &maps.v, p.v_cache, run, slot, i, &full_v[stage]);
      cp_async_commit();
      announce.issued(&full_v[stage]);
      run = next;
      slot = next_slot;
    }
    announce.finish();
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    // Two wgmma batches in flight (FlashAttention-3's intra-warpgroup overlap): tile i's Q K^T
    // and tile i-1's P V are issued back to back, the softmax of tile i runs while P V still
    // accumulates, and O takes tile i's correction under the next step's Q K^T.
    cutlass::arch::warpgroup_reg_alloc<C::kConsumerRegs>();
    const int lane = threadIdx.x % kWarpSize;
    RowState rs(p, w, w.row0 + C::warp_row0() + lane / 4);  // this thread's rows: that one and + 8
    if (n_tiles == 0) {  // no key to see: zero rows (or empty partials)
      float o[D / 8][4] = {};
      store_rows<C>(p, w, o, rs.m_run, rs.l_run);
      return;
    }
    const int ctid = threadIdx.x - 128;
    typename C::TiledMmaS mma_s;
    typename C::TiledMmaO mma_o;
    auto thr_s = mma_s.get_thread_slice(ctid);
    auto thr_o = mma_o.get_thread_slice(ctid);
    Tensor tSrQ = thr_s.partition_fragment_A(sQ);   // descriptors (MMA, 1, D/16)
    Tensor tSrK = thr_s.partition_fragment_B(sK);   // descriptors (MMA, 1, D/16, stages)
    Tensor tOrV = thr_o.partition_fragment_B(sVt);  // descriptors (MMA, 1, BN/16, stages)
    Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<C::kBlockM>, Int<C::kBlockN>>{});
    Tensor tOrO = partition_fragment_C(mma_o, Shape<Int<C::kBlockM>, Int<D>>{});
    Tensor tOrP = make_tensor<E>(partition_shape_A(mma_o, Shape<Int<C::kBlockM>, Int<C::kBlockN>>{}));
    // The flat register order of the S accumulators (per 8 columns: row g cols 2q, 2q+1, row
    // g+8 the same) is the order of the RS A operand over 16-column k blocks, so P is S converted
    // element by element (no shuffles), and the mma.sync kernel's [n/8][4] arrays index both.
    static_assert(decltype(size(tSrS))::value == C::kBlockN / 2, "S: 64 x BN per warpgroup");
    static_assert(decltype(size(tOrO))::value == D / 2, "O: 64 x D per warpgroup");
    static_assert(decltype(size(tOrP))::value == C::kBlockN / 2, "P: S's registers");

    float s[C::kBlockN / 8][4];
    float corr[2];
    // Scores of tile i (in tSrS, retired) -> P in s, running max/sum, corr.
    auto softmax_tile = [&](int i) {
#pragma unroll
      for (int j = 0; j < size(tSrS); ++j) s[j / 4][j % 4] = tSrS(j);
      if constexpr (sm90_cut(kSm90CutSoftmax)) {
        corr[0] = corr[1] = 1.f;
        return;
      }
      const int k0 = (w.tile_begin + i) * C::kBlockN;
      const bool need_mask = !(k0 >= w.full_lo && k0 + C::kBlockN - 1 <= w.full_hi);
      softmax_scores<C::kBlockN>(s, rs.m_run, rs.l_run, corr, k0, need_mask, rs.vis0, rs.vis1, rs.scale_log2);
    };
    auto p_from_s = [&] {
#pragma unroll
      for (int j = 0; j < size(tOrP); ++j) tOrP(j) = static_cast<E>(s[j / 4][j % 4]);
    };
    // P V on V stage `stage` retired: O readable, P writable, the stage back to the producer.
    auto retire_pv = [&](int stage) {
      wgmma_wait<0>(tOrO);
      warpgroup_fence_operand(tOrP);
      Bar::arrive(&empty_v[stage]);
    };
    auto o_of_regs = [&](float (&o)[D / 8][4]) {
#pragma unroll
      for (int j = 0; j < size(tOrO); ++j) o[j / 4][j % 4] = tOrO(j);
    };
    // O (no P V in flight) takes the last softmax's correction.
    auto rescale_o = [&] {
      float o[D / 8][4];
      o_of_regs(o);
      rescale_rows<D>(o, corr);
#pragma unroll
      for (int j = 0; j < size(tOrO); ++j) tOrO(j) = o[j / 4][j % 4];
    };

    Bar::wait(q_full, 0);
    Bar::wait(&full_k[0], 0);
    wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, 0), tSrS);
    wgmma_wait<0>(tSrS);
    Bar::arrive(&empty_k[0]);
    softmax_tile(0);  // corr is 1 or 0 against an O that is still zero: nothing to rescale
    clear(tOrO);
    p_from_s();
    // Ping-pong (FlashAttention-3's warp scheduler barriers): the two consumers take turns to
    // issue a step's two GEMMs, so one's softmax runs while the other's GEMMs hold the tensor
    // cores. Named barrier 1 + c is consumer c's turn (its 128 threads wait, the other's 128
    // arrive); consumer 0 goes first. The last arrive has no wait to match, which the end of
    // the CTA clears.
    const int me = wg - 1;
    if (me == 1) cutlass::arch::NamedBarrier::arrive(256, 1);
    // O takes tile i - 1's correction between the issues of Q K_i^T and P V_{i-1}, while the
    // tensor cores run the first (FlashAttention-3's order), not after P V retires, where it sat
    // between that wait and the next step's issues. The same operations in the same order:
    // ((P_0 V_0) c_1 + P_1 V_1) c_2 + P_2 V_2 ..., so the same bits. Tile 0's correction meets
    // an O that is still zero, so step 1 has none to apply.
    for (int i = 1; i < n_tiles; ++i) {
      const int stage = i % C::kStages, prev = (i - 1) % C::kStages;
      Bar::wait(&full_k[stage], use_parity(i));
      cutlass::arch::NamedBarrier::sync(256, 1 + me);
      wgmma_issue<true, false>(mma_s, tSrQ, tSrK(_, _, _, stage), tSrS);
      if (i > 1) rescale_o();
      Bar::wait(&full_v[prev], use_parity(i - 1));
      wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, prev), tOrO);
      cutlass::arch::NamedBarrier::arrive(256, 2 - me);
      wgmma_wait<1>(tSrS);  // Q K_i^T retired; P V_{i-1} may still run
      Bar::arrive(&empty_k[stage]);
      softmax_tile(i);
      retire_pv(prev);
      p_from_s();
    }
    const int last = (n_tiles - 1) % C::kStages;
    if (n_tiles > 1) rescale_o();
    Bar::wait(&full_v[last], use_parity(n_tiles - 1));
    wgmma_issue<false, true>(mma_o, tOrP, tOrV(_, _, _, last), tOrO);
    retire_pv(last);
    float o[D / 8][4];
    o_of_regs(o);
    store_rows<C>(p, w, o, rs.m_run, rs.l_run);
  }
#else
  __trap();  // no sm_90a image in this pass; attention_sm90_runnable() keeps launches away
#endif
}

template <typename T, int D, bool ASYNC_ARRIVE>
void launch_attention_sm90_tile(const PagedAttentionParams& p, const Sm90LoadMaps& maps, cudaStream_t stream) {
  using C = Sm90Tile<T, D>;
  constexpr auto kernel = paged_attention_sm90_kernel<T, D, ASYNC_ARRIVE>;
  const int64_t row_tiles = ceil_div(static_cast<int64_t>(p.max_q_len) * (p.q_heads / p.kv_heads), C::kBlockM);
  const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), 1u, static_cast<unsigned>(row_tiles));
  allow_max_dynamic_smem<kernel>();
  launch_kernel(kernel, Launch(grid, C::kThreads, C::kSmemBytes, stream), p, maps);
}

}  // namespace gpu
}  // namespace dspine
