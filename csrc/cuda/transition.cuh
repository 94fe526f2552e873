// Transition-cache scoring and the chain walk (CUDA): two launches for the whole batch.
// Semantics: dspine_engine/ops.py:transition_walk.
//
// 1. walk_topk_kernel, one CTA per (sequence, position) row of logits: each thread keeps a sorted
//    register list of the K best of its groups (one pass over V, 16-byte loads, thread t reading
//    the 8-element groups t, t + 256, ... so that a warp's loads are contiguous), then K rounds of
//    a block-wide tournament between the list heads give the candidates C_j in order (higher
//    score first, ties to the lower id). A warp skips every element below its floor, the K-th
//    largest of its 32 lanes' list heads: K elements of the row already rank before it. Why: the
//    insertion is a divergent, unrolled shift, and without the floor each lane inserted ~42 of its
//    ~593 elements at V = 151,936, K = 8 (random logits; ~9 with the floor refreshed after each of
//    the first four groups, the lists' filling, then every four), which kept the H200 walk at
//    ~300 us for a batch of 32 where reading the logits takes ~35.
// 2. walk_pairs_kernel, again one CTA per row: all K x K pair scores
//    s_j(c | a) = U_j(c) + sum_r P[a, r] g_j[r] Q[c, r] for a in C_{j-1} (the anchor for j = 0):
//    the 2K + 1 table rows are staged into shared memory with every load in flight at once, then
//    one warp per (a, c) pair reduces over r. The last CTA of a sequence (atomic arrival counter)
//    walks the chain with one thread: a K-wide lookup per position (greedy first-max, or
//    inverse-CDF over softmax(s / T)).
// The pair scores need C_{j-1} and C_j, which come from different CTAs of launch 1; a second
// launch is the dependency-free way to wait for them while keeping the table gathers parallel.
#pragma once

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
  int batch, positions, vocab, rank, top_k;
  bool vec_ok;
};

constexpr int kWalkMaxK = 32;

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

// This thread's K best of the row (see the file's comment: strided groups, the warp's floor).
// Every loop bound is uniform over the block, so the floor's shuffles see all lanes.
template <typename T, int MAXK>
__device__ void thread_top_list(const T* row, int vocab, bool vec_ok, int k, TopList<MAXK>& list) {
  constexpr int kBatch = 4;
  constexpr int kStride = kRowThreads * kGroup;
  const int mine = static_cast<int>(threadIdx.x) * kGroup;
  float floor_v = -INFINITY;  // an element below it has k elements of the row ranking before it
  const auto take = [&](const float(&v)[kGroup], int i0) {
#pragma unroll
    for (int e = 0; e < kGroup; ++e)
      if (v[e] >= floor_v && i0 + e < vocab) list.push(v[e], i0 + e);  // NaN fails the compare
  };
  int base = 0;
  for (int g = 0; g < kBatch && base < vocab; ++g, base += kStride) {  // the lists fill: a floor a group
    float v[kGroup];
    load_group(row, base + mine, vocab, vec_ok, v);
    take(v, base + mine);
    floor_v = warp_kth_largest(list.v[0], k);
  }
  for (; base < vocab; base += kBatch * kStride) {
    float v[kBatch][kGroup];
#pragma unroll
    for (int g = 0; g < kBatch; ++g) load_group(row, base + g * kStride + mine, vocab, vec_ok, v[g]);
#pragma unroll
    for (int g = 0; g < kBatch; ++g) take(v[g], base + g * kStride + mine);
    floor_v = warp_kth_largest(list.v[0], k);
  }
}

template <typename T, int MAXK>
__global__ void __launch_bounds__(kRowThreads) walk_topk_kernel(const WalkParams p) {
  __shared__ float top_v[MAXK];
  __shared__ int top_id[MAXK];
  __shared__ BestScratch best;
  const int row = blockIdx.x;
  const T* x = static_cast<const T*>(p.logits) + static_cast<int64_t>(row) * p.vocab;
  TopList<MAXK> list;
  list.init();
  thread_top_list<T, MAXK>(x, p.vocab, p.vec_ok, p.top_k, list);
  block_top_k(list, p.top_k, top_v, top_id, best);
  if (threadIdx.x < p.top_k) {
    const int id = top_id[threadIdx.x];  // INT_MAX only in rows of NaN: keep indices in range
    p.cand_ids[static_cast<int64_t>(row) * p.top_k + threadIdx.x] = id < p.vocab ? id : 0;
    p.cand_vals[static_cast<int64_t>(row) * p.top_k + threadIdx.x] = top_v[threadIdx.x];
  }
}

// Shared memory of launch 2: the staged table rows, later reused by the walk.
inline size_t walk_stage_bytes(int top_k, int rank, size_t elem) {
  return (2 * static_cast<size_t>(top_k) + 1) * rank * elem + 2 * top_k * sizeof(int);
}
inline size_t walk_chain_bytes(int positions, int top_k) {
  const size_t jk = static_cast<size_t>(positions) * top_k;
  return (jk * top_k + jk + positions + top_k) * sizeof(float);
}

// Row (b, j): pair[a][c] = U_j(c) + sum_r (P[a_id, r] g_j[r]) Q[c_id, r].
template <typename T>
__device__ void pair_scores_of_row(const WalkParams& p, int b, int j, unsigned char* smem) {
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
  T* rows = reinterpret_cast<T*>(smem + 2 * K * sizeof(int));  // [n_prev] P, [K] Q, [1] g_j
  for (int i = threadIdx.x; i < n_prev + K; i += blockDim.x) {
    const int64_t id = i >= n_prev ? p.cand_ids[row * K + i - n_prev]
                       : j == 0    ? p.anchor[b]
                                   : p.cand_ids[(row - 1) * K + i];
    ids[i] = id >= 0 && id < p.vocab ? static_cast<int>(id) : -1;
  }
  __syncthreads();
  const T* pred = static_cast<const T*>(p.pred);
  const T* succ = static_cast<const T*>(p.succ);
  const T* g = static_cast<const T*>(p.g) + row * r;
  const int n_rows = n_prev + K + 1;
#pragma unroll 4
  for (int i = threadIdx.x; i < n_rows * r; i += blockDim.x) {  // independent loads: all in flight
    const int rr = i / r, x = i % r;
    const int id = rr < n_prev + K ? ids[rr] : 0;
    const T* src = rr < n_prev ? pred + static_cast<int64_t>(id) * r
                   : rr < n_prev + K ? succ + static_cast<int64_t>(id) * r
                                     : g;
    rows[i] = id >= 0 ? src[x] : from_float<T>(0.f);
  }
  __syncthreads();
  const int lane = threadIdx.x % kWarpSize;
  const T* sg = rows + (n_prev + K) * r;
  for (int pair = threadIdx.x / kWarpSize; pair < n_prev * K; pair += blockDim.x / kWarpSize) {
    const int a = pair / K, c = pair % K;
    const T* pa = rows + a * r;
    const T* qc = rows + (n_prev + c) * r;
    float dot = 0.f;
    for (int x = lane; x < r; x += kWarpSize) dot += (to_float(pa[x]) * to_float(sg[x])) * to_float(qc[x]);
    dot = warp_sum(dot);
    if (lane == 0) out[a * K + c] = vals[c] + dot;
  }
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

// One thread: the serial walk from the anchor over the pair scores (all operands in shared
// memory; global memory is only written).
__device__ inline void walk_chain(const WalkParams& p, int b, const int* ids, const float* pair, const float* u,
                                  float t, float* q) {
  const int J = p.positions, K = p.top_k;
  int a = 0;  // row of the pair table: index of the previous token among its candidates
  for (int j = 0; j < J; ++j) {
    const int64_t row = static_cast<int64_t>(b) * J + j;
    const float* s = pair + (j * K + a) * K;
    int pick;
    if (t > 0.f) {
      softmax_scaled(s, K, t, q);
      pick = sample_index(q, K, u[j]);
    } else {
      pick = first_argmax(s, K);
      for (int c = 0; c < K; ++c) q[c] = c == pick ? 1.f : 0.f;
    }
    for (int c = 0; c < K; ++c) p.cand_probs[row * K + c] = q[c];
    p.tokens[row] = ids[j * K + pick];
    a = pick;
  }
}

// Run by the last CTA of sequence b, once every row's pair scores are in global memory.
__device__ inline void walk_sequence(const WalkParams& p, int b, unsigned char* smem) {
  const int J = p.positions, K = p.top_k;
  float* pair = reinterpret_cast<float*>(smem);     // [J][K][K]
  int* ids = reinterpret_cast<int*>(pair + J * K * K);  // [J][K]
  float* u = reinterpret_cast<float*>(ids + J * K);  // [J]
  float* q = u + J;                                  // [K]
  const int64_t base = static_cast<int64_t>(b) * J;
  __syncthreads();  // the staging area is reused
  for (int i = threadIdx.x; i < J * K * K; i += blockDim.x) pair[i] = __ldcg(p.pair + base * K * K + i);
  for (int i = threadIdx.x; i < J * K; i += blockDim.x) ids[i] = static_cast<int>(p.cand_ids[base * K + i]);
  for (int i = threadIdx.x; i < J; i += blockDim.x) u[i] = p.uniforms[base + i];
  __syncthreads();
  if (threadIdx.x == 0) walk_chain(p, b, ids, pair, u, p.temperature[b], q);
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) walk_pairs_kernel(const WalkParams p) {
  extern __shared__ __align__(16) unsigned char walk_smem[];
  const int b = blockIdx.x / p.positions, j = blockIdx.x % p.positions;
  pair_scores_of_row<T>(p, b, j, walk_smem);
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
  walk_topk_kernel<T, MAXK><<<static_cast<unsigned>(p.batch * p.positions), kRowThreads, 0, stream>>>(p);
}

// Dynamic shared memory the pair/walk kernel may use on this device (static part excluded).
template <typename T>
int walk_smem_limit() {
  return allow_max_dynamic_smem<walk_pairs_kernel<T>>();
}

// Requires 1 <= top_k <= kWalkMaxK and walk_smem_bytes() <= walk_smem_limit<T>().
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
  walk_pairs_kernel<T><<<static_cast<unsigned>(p.batch * p.positions), kRowThreads, smem, stream>>>(p);
}

}  // namespace gpu
}  // namespace dspine
