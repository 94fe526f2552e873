// Transition-cache scoring and the chain walk (CUDA): two launches for the whole batch.
// Semantics: dspine_engine/ops.py:transition_walk.
//
// 1. walk_topk_kernel, one CTA per (sequence, position) row of logits (or per slice of a row, when
//    the rows alone would leave most SMs idle: see walk_topk_splits): each thread keeps a sorted
//    register list of the K best of its groups (one pass over V, 16-byte loads, thread t reading
//    the 8-element groups t, t + 256, ... so that a warp's loads are contiguous), then a two-level
//    merge of the lists (block_top_k) gives the candidates C_j in order (higher score first, ties
//    to the lower id). A warp skips every element below its floor, the K-th largest of its 32
//    lanes' list heads: K elements of the row already rank before it. Why: the insertion is a
//    divergent, unrolled shift, and without the floor each lane inserted ~42 of its ~593 elements
//    at V = 151,936, K = 8 (random logits; ~9 with the floor refreshed after each of the first
//    four groups, the lists' filling, then every four; it is now every eight), which kept the
//    H200 walk at ~300 us for a batch of 32 where reading the logits takes ~35.
// 2. walk_pairs_kernel, again one CTA per row: all K x K pair scores
//    s_j(c | a) = U_j(c) + sum_r P[a, r] g_j[r] Q[c, r] for a in C_{j-1} (the anchor for j = 0):
//    the 2K + 1 table rows are staged into shared memory with every load in flight at once, then
//    a warp per (predecessor a, 8 candidates c) reduces their dots over r at once (a warp per
//    pair for j = 0's single predecessor). The last CTA of a sequence (atomic arrival counter)
//    picks every (position, predecessor) row's successor at once, a thread a row (greedy
//    first-max, or inverse-CDF over softmax(s / T)); one thread then follows the chain through
//    those picks, and all write its outputs.
// The pair scores need C_{j-1} and C_j, which come from different CTAs of launch 1; a second
// launch is the dependency-free way to wait for them while keeping the table gathers parallel.
// Sliced rows: launch 1 leaves each slice's K best; launch 2 merges a row's slices first (one warp
// for C_j, which it publishes, one for C_{j-1}, kept in shared memory). The K best of the union are
// the K best of the slices' K bests under the same strict order (value, then lower id), so the
// candidates are the unsliced ones exactly, whatever the slice count.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "sampling.cuh"

namespace dspine {
namespace gpu {

struct WalkParams {
  const void* logits;  // [batch, J, V]
  const void* g;       // [batch, J, rank] (null: no transition tables, scores are U alone)
  const void* pred;    // [V, rank]
  const void* succ;    // [V, rank]
  const int64_t* anchor;
  const float* temperature;
  const float* uniforms;  // [batch, J]
  int64_t* tokens;        // [batch, J]
  int64_t* cand_ids;      // [batch, J, K]
  float* cand_probs;      // [batch, J, K]
  float* cand_vals;       // workspace [batch, J, K]: U at the candidates
  float* pair;            // workspace [batch, J, K, K]: s_j(c | a) at [a][c]
  int* arrivals;          // [batch], zero before the launch
  float* split_vals;      // workspace [batch * J][topk_splits][K] (topk_splits > 1): a slice's K best
  int* split_ids;         // ... and their ids (INT_MAX: none)
  int batch, positions, vocab, rank, top_k;
  int topk_splits, split_len;  // slices a row (<= 1: none) and elements a slice (a multiple of kGroup)
  bool vec_ok;
};

constexpr int kWalkMaxK = 32;

// ---- host: how many slices a row of launch 1 takes --------------------------------------------

constexpr int kWalkBatch = 4;                             // groups a thread loads before it scans them
constexpr int kWalkStride = kRowThreads * kGroup;         // elements between a thread's groups
constexpr int kWalkMinSplit = kWalkBatch * kWalkStride;   // one batch of loads a thread
constexpr int kWalkMaxSplits = 16;                       // a merge reads <= 16 x kWalkMaxK entries

// Slices a row: only while the rows leave SMs short of two CTAs each (a c = 1 round: 15 rows on
// 132 SMs), then about four CTAs an SM, no slice shorter than one batch of loads. More rows keep
// one CTA a row: the merge and each slice's tournament are pure overhead once the GPU is full.
inline int walk_topk_splits(int64_t rows, int64_t vocab, int num_sms) {
  if (rows <= 0 || rows >= 2LL * num_sms) return 1;
  const int64_t want = ceil_div(4LL * num_sms, rows);
  const int64_t most = vocab / kWalkMinSplit;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, kWalkMaxSplits})));
}

// Sets p's slicing (p.vocab set; forced > 0 fixes the count, a testing and tuning aid) and
// returns the workspace entries (floats, and as many ints) it needs.
inline int64_t plan_walk_topk(WalkParams& p, int num_sms, int forced = 0) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.positions;
  int want = forced > 0 ? std::min(forced, kWalkMaxSplits) : walk_topk_splits(rows, p.vocab, num_sms);
  p.split_len = static_cast<int>(round_up(ceil_div(p.vocab, want), kGroup));
  p.topk_splits = static_cast<int>(ceil_div(p.vocab, p.split_len));  // no empty slice
  return p.topk_splits > 1 ? rows * p.topk_splits * p.top_k : 0;
}

// The k-th largest (1 <= k <= 32) of the warp's 32 values, in every lane: a bitonic sort over the
// lanes, descending. Never given NaN (NaN never enters a top list).
__device__ __forceinline__ float warp_kth_largest(float v, int k) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int size = 2; size <= kWarpSize; size <<= 1) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const float o = __shfl_xor_sync(kFullMask, v, stride);
      const bool keep_max = ((lane & size) == 0) == ((lane & stride) == 0);  // descending blocks keep max low
      v = keep_max ? fmaxf(v, o) : fminf(v, o);
    }
  }
  return __shfl_sync(kFullMask, v, k - 1);
}

// ---- the scan: a thread's K best of its strided groups ------------------------------------

// Two-byte logits in pairs (bf16 or fp16), for the packed compares of the scan.
template <typename T>
using Packed2 = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;

// The marks of a 16-byte group of eight 2-byte values at or above floor2 (both halves the floor):
// bit j for element 2j and bit 16 + j for element 2j + 1 (j = 0..3: the group's 32-bit words),
// which is where __hge2_mask leaves a word's two halves once masked with 0x00010001: four packed
// compares, four ANDs folded into shifts and ORs, no repacking. NaN compares false, as in the
// per-element test it replaces.
template <typename T>
__device__ __forceinline__ uint32_t group_mask_at_or_above(const uint4& raw, Packed2<T> floor2) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t mask = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    Packed2<T> pair;
    memcpy(&pair, &words[j], sizeof(pair));
    mask |= (__hge2_mask(pair, floor2) & 0x00010001u) << j;  // 0xffff per true half
  }
  return mask;
}

// Element index of mark bit b of group_mask_at_or_above.
__device__ __forceinline__ int marked_element(int b) { return b < 16 ? 2 * b : 2 * (b - 16) + 1; }

// Element e of a 16-byte group of eight 2-byte values, as a float.
template <typename T>
__device__ __forceinline__ float packed_element(const uint4& raw, int e) {
  const uint32_t w = e < 4 ? (e < 2 ? raw.x : raw.y) : (e < 6 ? raw.z : raw.w);
  const unsigned short bits = static_cast<unsigned short>((e & 1) ? w >> 16 : w & 0xffffu);
  if constexpr (std::is_same<T, __half>::value)
    return __half2float(__ushort_as_half(bits));
  else
    return __bfloat162float(__ushort_as_bfloat16(bits));
}

// The group's elements marked in mask (those at or above the floor) into the list, one loop trip
// each: a warp runs as many trips as its busiest lane has marks (one or two past the lists'
// filling), not eight. Not unrolled: the insertion is an unrolled shift of MAXK slots, and eight
// copies of it a group made the scan outgrow the instruction cache (H100 ncu, 27th session:
// "no instruction" the main loop's first stall).
template <typename T, int MAXK>
__device__ __forceinline__ void take_marked(const uint4& raw, uint32_t mask, int i0, TopList<MAXK>& list) {
#pragma unroll 1
  for (; mask != 0; mask &= mask - 1) {
    const int e = marked_element(__ffs(mask) - 1);
    list.push(packed_element<T>(raw, e), i0 + e);
  }
}

// The scan's whole batches for 2-byte logits (vec_ok rows), from `base` while every group of a
// batch lies inside the row for every thread; returns where the guarded loop goes on. Why its own
// loop: with a guard per load the compiler issued each 16-byte load next to its first use, one
// load in flight per thread (H100 ncu, 26th session: DRAM 34%, the four loads' first uses the top
// stalls). Here nothing guards the loads, the next batch's loads are issued before this batch is
// scanned (their address clamped to the last whole batch, so the final prefetch re-reads it), and
// a group is tested against the floor with four packed compares (the floor is a value of the row,
// or -inf, so it is exact in T).
template <typename T, int MAXK>
__device__ int scan_whole_batches(const T* row, int vocab, int base, int k, float& floor_v, TopList<MAXK>& list) {
  constexpr int kStep = kWalkBatch * kWalkStride;
  const int whole = (vocab - base) / kStep;  // the same in every thread
  if (whole <= 0) return base;
  const int last = base + (whole - 1) * kStep;
  const int mine = static_cast<int>(threadIdx.x) * kGroup;
  const auto load_batch = [&](int at, uint4(&raw)[kWalkBatch]) {
#pragma unroll
    for (int g = 0; g < kWalkBatch; ++g)
      raw[g] = __ldg(reinterpret_cast<const uint4*>(row + at + g * kWalkStride + mine));
  };
  uint4 cur[kWalkBatch];
  load_batch(base, cur);
  bool refresh = false;
#pragma unroll 1
  for (; base <= last; base += kStep) {
    uint4 next[kWalkBatch];
    load_batch(base + kStep <= last ? base + kStep : last, next);
    const T floor_t = from_float<T>(floor_v);
    const Packed2<T> floor2 = {floor_t, floor_t};
#pragma unroll
    for (int g = 0; g < kWalkBatch; ++g) {
      const uint32_t mask = group_mask_at_or_above<T>(cur[g], floor2);
      if (mask != 0) take_marked<T>(cur[g], mask, base + g * kWalkStride + mine, list);
    }
    // Every other batch: the floor's 32-lane sort was a third of the loop's instructions, and
    // past the lists' filling it rises slowly; a staler floor only marks a few more elements.
    if (refresh) floor_v = warp_kth_largest(list.v[0], k);
    refresh = !refresh;
#pragma unroll
    for (int g = 0; g < kWalkBatch; ++g) cur[g] = next[g];
  }
  return base;
}

// This thread's K best of the row (see the file's comment: strided groups, the warp's floor).
// Every loop bound is uniform over the block, so the floor's shuffles see all lanes.
template <typename T, int MAXK>
__device__ void thread_top_list(const T* row, int vocab, bool vec_ok, int k, TopList<MAXK>& list) {
  const int mine = static_cast<int>(threadIdx.x) * kGroup;
  float floor_v = -INFINITY;  // an element below it has k elements of the row ranking before it
  const auto take = [&](const float(&v)[kGroup], int i0) {
#pragma unroll 1  // one copy of the insertion (see take_marked)
    for (int e = 0; e < kGroup; ++e)
      if (v[e] >= floor_v && i0 + e < vocab) list.push(v[e], i0 + e);  // NaN fails the compare
  };
  int base = 0;
  for (int g = 0; g < kWalkBatch && base < vocab; ++g, base += kWalkStride) {  // the lists fill: a floor a group
    float v[kGroup];
    load_group(row, base + mine, vocab, vec_ok, v);
    take(v, base + mine);
    floor_v = warp_kth_largest(list.v[0], k);
  }
  if constexpr (sizeof(T) == 2) {
    if (vec_ok) base = scan_whole_batches<T, MAXK>(row, vocab, base, k, floor_v, list);
  }
  for (; base < vocab; base += kWalkBatch * kWalkStride) {  // what is left: guarded loads
    float v[kWalkBatch][kGroup];
#pragma unroll
    for (int g = 0; g < kWalkBatch; ++g) load_group(row, base + g * kWalkStride + mine, vocab, vec_ok, v[g]);
#pragma unroll
    for (int g = 0; g < kWalkBatch; ++g) take(v[g], base + g * kWalkStride + mine);
    floor_v = warp_kth_largest(list.v[0], k);
  }
}

// A candidate as the walk publishes it: INT_MAX (no element: a row of NaN) becomes id 0.
__device__ __forceinline__ void publish_candidate(const WalkParams& p, int64_t row, int c, float v, int id) {
  p.cand_ids[row * p.top_k + c] = id < p.vocab ? id : 0;
  p.cand_vals[row * p.top_k + c] = v;
}

// Four CTAs an SM at K <= 8 (64 registers a thread): a batch of 32 sequences' 15 rows is 480 CTAs,
// one wave on 132 SMs only at four an SM (80 registers, three an SM, made it two waves).
template <typename T, int MAXK>
__global__ void __launch_bounds__(kRowThreads, MAXK <= 8 ? 4 : 1) walk_topk_kernel(const WalkParams p) {
  join_chain();  // launch.cuh
  __shared__ float top_v[MAXK];
  __shared__ int top_id[MAXK];
  __shared__ TopKScratch<MAXK> best;
  const int splits = p.topk_splits > 1 ? p.topk_splits : 1;
  const int64_t row = blockIdx.x / splits;
  const int slice = blockIdx.x % splits;
  const int begin = slice * p.split_len;  // 0 unsliced (split_len is then >= vocab)
  const int len = splits == 1 ? p.vocab : p.vocab - begin < p.split_len ? p.vocab - begin : p.split_len;
  const T* x = static_cast<const T*>(p.logits) + row * p.vocab + begin;  // begin % kGroup == 0
  TopList<MAXK> list;
  list.init();
  thread_top_list<T, MAXK>(x, len, p.vec_ok, p.top_k, list);  // ids relative to begin
  block_top_k(list, p.top_k, top_v, top_id, best);
  const int c = threadIdx.x;
  if (c >= p.top_k) return;
  const int id = top_id[c] == INT_MAX ? INT_MAX : top_id[c] + begin;
  if (splits == 1) {
    publish_candidate(p, row, c, top_v[c], id);
  } else {
    const int64_t at = (row * splits + slice) * p.top_k + c;
    p.split_vals[at] = top_v[c];
    p.split_ids[at] = id;
  }
}

// One warp: the K best of row `row`'s slices (launch 1's, sliced) in order, into vals / ids.
// Lane l holds entries l, l + 32, ... in `ent_v` / `ent_id` (shared, this warp's own); a bit per
// entry marks the ones taken. Ties between empty entries (-inf, INT_MAX) go to the lower index.
__device__ inline void merge_slices(const WalkParams& p, int64_t row, float* ent_v, int* ent_id, float* vals,
                                    int* ids) {
  const int lane = threadIdx.x % kWarpSize;
  const int n = p.topk_splits * p.top_k;
  const int64_t base = row * n;
  for (int e = lane; e < n; e += kWarpSize) {
    ent_v[e] = p.split_vals[base + e];
    ent_id[e] = p.split_ids[base + e];
  }
  __syncwarp();
  uint32_t taken = 0;  // bit m: entry lane + 32 m (n <= kWalkMaxSplits * kWalkMaxK = 512 <= 32 * 32)
  for (int c = 0; c < p.top_k; ++c) {
    float v = -INFINITY;
    int id = INT_MAX, at = INT_MAX;
    for (int e = lane, m = 0; e < n; e += kWarpSize, ++m) {
      if (taken >> m & 1u) continue;
      if (at == INT_MAX || ranks_before(ent_v[e], ent_id[e], v, id)) {
        v = ent_v[e];
        id = ent_id[e];
        at = e;
      }
    }
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFullMask, v, o);
      const int oi = __shfl_xor_sync(kFullMask, id, o), oa = __shfl_xor_sync(kFullMask, at, o);
      if (ranks_before(ov, oi, v, id) || (!ranks_before(v, id, ov, oi) && oa < at)) {
        v = ov;
        id = oi;
        at = oa;
      }
    }
    if (at != INT_MAX && at % kWarpSize == lane) taken |= 1u << (at / kWarpSize);
    if (lane == 0) {
      vals[c] = v;
      ids[c] = id;
    }
  }
  __syncwarp();
}

// Shared memory of launch 2: the staged table rows, later reused by the walk.
inline size_t walk_stage_bytes(int top_k, int rank, size_t elem) {
  return (2 * static_cast<size_t>(top_k) + 1) * rank * elem + 3 * top_k * sizeof(int);  // ids, U, rows
}
inline size_t walk_chain_bytes(int positions, int top_k) {
  const size_t jk = static_cast<size_t>(positions) * top_k;
  // walk_sequence's layout: pair [J][K][K], ids [J][K], u [J], next [J][K], picks [J] (4 bytes each)
  return (jk * top_k + 2 * jk + 2 * static_cast<size_t>(positions)) * sizeof(float);
}

// out[a * K + c] = U(c) + sum_r (P[a] g)[r] Q[c, r] for n_prev x K pairs of staged rows, a warp
// per (predecessor, B candidates): P[a] g once per element for B independent accumulators whose
// warp sums interleave (a warp per pair spends most of its time in one dependent butterfly).
template <typename T, int B>
__device__ void pair_dots(const T* rows, const T* sg, const float* svals, int n_prev, int K, int r, float* out) {
  const int lane = threadIdx.x % kWarpSize, groups = (K + B - 1) / B;
  for (int unit = threadIdx.x / kWarpSize; unit < n_prev * groups; unit += blockDim.x / kWarpSize) {
    const int a = unit / groups, c0 = (unit % groups) * B;
    const T* pa = rows + a * r;
    const T* q0 = rows + (n_prev + c0) * r;
    float dot[B] = {};
    for (int x = lane; x < r; x += kWarpSize) {
      const float h = to_float(pa[x]) * to_float(sg[x]);
#pragma unroll
      for (int u = 0; u < B; ++u)
        if (c0 + u < K) dot[u] += h * to_float(q0[u * r + x]);
    }
#pragma unroll
    for (int u = 0; u < B; ++u) dot[u] = warp_sum(dot[u]);
#pragma unroll
    for (int u = 0; u < B; ++u)
      if (lane == 0 && c0 + u < K) out[a * K + c0 + u] = svals[c0 + u] + dot[u];
  }
}
constexpr int kPairBatch = 8;

// Row (b, j): pair[a][c] = U_j(c) + sum_r (P[a_id, r] g_j[r]) Q[c_id, r]. prev: C_{j-1}'s ids
// (unused for j = 0).
template <typename T>
__device__ void pair_scores_of_row(const WalkParams& p, int b, int j, unsigned char* smem, const int64_t* prev) {
  const int K = p.top_k, r = p.rank;
  const int64_t row = static_cast<int64_t>(b) * p.positions + j;
  const float* vals = p.cand_vals + row * K;
  float* out = p.pair + row * K * K;
  if (!p.g) {
    for (int i = threadIdx.x; i < K * K; i += blockDim.x) out[i] = vals[i % K];
    return;
  }
  const int n_prev = j == 0 ? 1 : K;
  int* ids = reinterpret_cast<int*>(smem);  // [n_prev] predecessors, then [K] candidates (-1: none)
  float* svals = reinterpret_cast<float*>(ids + 2 * K);  // [K] the candidates' U
  T* rows = reinterpret_cast<T*>(svals + K);              // [n_prev] P, [K] Q, [1] g_j
  for (int i = threadIdx.x; i < n_prev + K; i += blockDim.x) {
    const int64_t id = i >= n_prev ? p.cand_ids[row * K + i - n_prev]
                       : j == 0    ? p.anchor[b]
                                   : prev[i];
    ids[i] = id >= 0 && id < p.vocab ? static_cast<int>(id) : -1;
    if (i < K) svals[i] = vals[i];
  }
  __syncthreads();
  const T* pred = static_cast<const T*>(p.pred);
  const T* succ = static_cast<const T*>(p.succ);
  const T* g = static_cast<const T*>(p.g) + row * r;
  const int total = (n_prev + K + 1) * r;
  // kStage loads a thread in flight at once: all of a chunk's loads, then its stores. One store
  // per load in a plain loop kept them one memory latency apart (17 in a row at K = 8, r = 256):
  // `rows` and `ids` share this shared array, so no load of ids[] (and no global load after it)
  // could move above the previous iteration's store.
  constexpr int kStage = sizeof(T) == 2 ? 16 : 8;  // (fp32 at 16 spilled on sm_80)
  for (int base = threadIdx.x; base < total; base += kStage * blockDim.x) {
    T staged[kStage];
#pragma unroll
    for (int u = 0; u < kStage; ++u) {
      const int i = base + u * blockDim.x;
      staged[u] = from_float<T>(0.f);
      if (i >= total) continue;
      const int rr = i / r, x = i % r;
      const int id = rr < n_prev + K ? ids[rr] : 0;
      const T* src = rr < n_prev ? pred + static_cast<int64_t>(id) * r
                     : rr < n_prev + K ? succ + static_cast<int64_t>(id) * r
                                       : g;
      if (id >= 0) staged[u] = src[x];
    }
#pragma unroll
    for (int u = 0; u < kStage; ++u)
      if (base + u * blockDim.x < total) rows[base + u * blockDim.x] = staged[u];
  }
  __syncthreads();
  // Each dot is summed lane-strided, then by the butterfly, whatever the batch: the same bits.
  const T* sg = rows + (n_prev + K) * r;
  const int warps = blockDim.x / kWarpSize;
  if (n_prev * ((K + kPairBatch - 1) / kPairBatch) >= warps)
    pair_dots<T, kPairBatch>(rows, sg, svals, n_prev, K, r, out);
  else  // j = 0's single predecessor: a batch per warp would leave most warps idle
    pair_dots<T, 1>(rows, sg, svals, n_prev, K, r, out);
}

// q = softmax(s / t) over n scores (fp32, as torch.softmax).
__device__ inline void softmax_scaled(const float* s, int n, float t, float* q) {
  float mx = -INFINITY;
  for (int c = 0; c < n; ++c) mx = fmaxf(mx, __fdiv_rn(s[c], t));
  float sum = 0.f;
  for (int c = 0; c < n; ++c) {
    q[c] = expf(__fdiv_rn(s[c], t) - mx);
    sum += q[c];
  }
  for (int c = 0; c < n; ++c) q[c] = __fdiv_rn(q[c], sum);
}

__device__ inline int first_argmax(const float* s, int n) {
  int best = 0;
  for (int c = 1; c < n; ++c)
    if (argmax_before(s[c], c, s[best], best)) best = c;
  return best;
}

// Every row (j, a) of the pair table at once, one thread a row: the candidate the chain picks at
// position j after predecessor a. Sampled rows are turned into q = softmax(s / T) in place (the
// probabilities the chain reports). Only rows the chain can reach (position 0 has the anchor's).
__device__ inline void pick_every_row(const WalkParams& p, float* pair, const float* u, float t, int* next) {
  const int J = p.positions, K = p.top_k;
  for (int i = threadIdx.x; i < J * K; i += blockDim.x) {
    const int j = i / K, a = i % K;
    if (j == 0 && a > 0) continue;
    float* s = pair + i * K;
    if (t > 0.f) {
      softmax_scaled(s, K, t, s);
      next[i] = sample_index(s, K, u[j]);
    } else {
      next[i] = first_argmax(s, K);
    }
  }
}

// The chain itself is then J dependent lookups (one thread), and its outputs are written by all:
// the serial walk over whole rows (softmax, pick, K stores a position) was ~J x 1,500 cycles.
__device__ inline void walk_chain(const WalkParams& p, int b, const int* ids, const float* pair, const int* next,
                                  float t, int* picks) {
  const int J = p.positions, K = p.top_k;
  if (threadIdx.x == 0) {
    int a = 0;  // row of the pair table: index of the previous token among its candidates
    for (int j = 0; j < J; ++j) picks[j] = a = next[j * K + a];
  }
  __syncthreads();
  const int64_t base = static_cast<int64_t>(b) * J;
  for (int i = threadIdx.x; i < J * K; i += blockDim.x) {
    const int j = i / K, c = i % K, a = j == 0 ? 0 : picks[j - 1];
    p.cand_probs[base * K + i] = t > 0.f ? pair[(j * K + a) * K + c] : c == picks[j] ? 1.f : 0.f;
  }
  for (int j = threadIdx.x; j < J; j += blockDim.x) p.tokens[base + j] = ids[j * K + picks[j]];
}

// Run by the last CTA of sequence b, once every row's pair scores are in global memory.
__device__ inline void walk_sequence(const WalkParams& p, int b, unsigned char* smem) {
  const int J = p.positions, K = p.top_k;
  float* pair = reinterpret_cast<float*>(smem);     // [J][K][K]
  int* ids = reinterpret_cast<int*>(pair + J * K * K);  // [J][K]
  float* u = reinterpret_cast<float*>(ids + J * K);  // [J]
  int* next = reinterpret_cast<int*>(u + J);         // [J][K]
  int* picks = next + J * K;                         // [J]
  const int64_t base = static_cast<int64_t>(b) * J;
  const float t = p.temperature[b];
  __syncthreads();  // the staging area is reused
  for (int i = threadIdx.x; i < J * K * K; i += blockDim.x) pair[i] = __ldcg(p.pair + base * K * K + i);
  // Through L2 like the pair scores: with sliced rows other CTAs of this launch published them.
  for (int i = threadIdx.x; i < J * K; i += blockDim.x)
    ids[i] = static_cast<int>(__ldcg(reinterpret_cast<const long long*>(p.cand_ids) + base * K + i));
  for (int i = threadIdx.x; i < J; i += blockDim.x) u[i] = p.uniforms[base + i];
  __syncthreads();
  pick_every_row(p, pair, u, t, next);
  __syncthreads();
  walk_chain(p, b, ids, pair, next, t, picks);
}

// Sliced rows: warp 0 merges row (b, j)'s slices and publishes C_j (this CTA's pair scores, and the
// walk, read it from global memory); warp 1 merges row (b, j - 1)'s into `prev` (its own CTA
// publishes it, in no particular order with this one).
__device__ inline void merge_rows(const WalkParams& p, int b, int j, int64_t* prev) {
  __shared__ float ent_v[2][kWalkMaxSplits * kWalkMaxK];
  __shared__ int ent_id[2][kWalkMaxSplits * kWalkMaxK];
  __shared__ float top_v[2][kWalkMaxK];
  __shared__ int top_id[2][kWalkMaxK];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(b) * p.positions + j;
  if (warp == 0 || (warp == 1 && j > 0)) {
    merge_slices(p, row - warp, ent_v[warp], ent_id[warp], top_v[warp], top_id[warp]);
    for (int c = lane; c < p.top_k; c += kWarpSize) {
      if (warp == 0) publish_candidate(p, row, c, top_v[0][c], top_id[0][c]);
      else prev[c] = top_id[1][c] < p.vocab ? top_id[1][c] : 0;
    }
  }
  __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) walk_pairs_kernel(const WalkParams p) {
  join_chain();  // launch.cuh
  extern __shared__ __align__(16) unsigned char walk_smem[];
  __shared__ int64_t merged_prev[kWalkMaxK];
  const int b = blockIdx.x / p.positions, j = blockIdx.x % p.positions;
  const int64_t row = static_cast<int64_t>(b) * p.positions + j;
  const int64_t* prev = j > 0 ? p.cand_ids + (row - 1) * p.top_k : nullptr;
  if (p.topk_splits > 1) {
    merge_rows(p, b, j, merged_prev);
    prev = merged_prev;
  }
  pair_scores_of_row<T>(p, b, j, walk_smem, prev);
  if (!arrive_last(&p.arrivals[b], p.positions)) return;
  walk_sequence(p, b, walk_smem);
}

inline size_t walk_smem_bytes(const WalkParams& p, size_t elem) {
  const size_t stage = p.g ? walk_stage_bytes(p.top_k, p.rank, elem) : 0;
  const size_t chain = walk_chain_bytes(p.positions, p.top_k);
  return stage > chain ? stage : chain;
}

template <typename T, int MAXK>
void launch_walk_topk(const WalkParams& p, cudaStream_t stream) {
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.positions * (p.topk_splits > 1 ? p.topk_splits : 1);
  launch_kernel(walk_topk_kernel<T, MAXK>, Launch(static_cast<unsigned>(ctas), kRowThreads, 0, stream), p);
}

// Dynamic shared memory the pair/walk kernel may use on this device (static part excluded).
template <typename T>
int walk_smem_limit() {
  return allow_max_dynamic_smem<walk_pairs_kernel<T>>();
}

// Requires 1 <= top_k <= kWalkMaxK and walk_smem_bytes() <= walk_smem_limit<T>(); sliced rows
// (plan_walk_topk) their split_vals / split_ids workspace.
template <typename T>
void launch_transition_walk(const WalkParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.positions == 0) return;
  if (p.top_k <= 8) {
    launch_walk_topk<T, 8>(p, stream);
  } else if (p.top_k <= 16) {
    launch_walk_topk<T, 16>(p, stream);
  } else {
    launch_walk_topk<T, kWalkMaxK>(p, stream);
  }
  const size_t smem = walk_smem_bytes(p, sizeof(T));
  if (smem > 48 * 1024) walk_smem_limit<T>();
  launch_kernel(walk_pairs_kernel<T>, Launch(static_cast<unsigned>(p.batch * p.positions), kRowThreads, smem, stream), p);
}

}  // namespace gpu
}  // namespace dspine
