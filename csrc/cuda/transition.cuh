// Transition-cache scoring and the chain walk (CUDA), one launch for the whole batch.
// Semantics: dspine_engine/ops.py:transition_walk.
//
// grid = batch * J CTAs, one per (sequence, position) row of logits:
// 1. Top-K of the row: each thread keeps a sorted register list of its chunk's K best (one pass
//    over V, 16-byte loads), then K rounds of a block-wide tournament between the list heads give
//    the candidates in order (higher score first, ties to the lower id).
// 2. The last CTA of a sequence to finish (atomic arrival counter) does the serial part: all
//    K x K pair scores s_j(c | a) = U_j(c) + sum_r P[a, r] g_j[r] Q[c, r] for a in C_{j-1}
//    (the anchor for j = 0), one warp per (j, a), into shared memory; then one thread walks the
//    chain, a K-wide lookup per position (greedy first-max, or inverse-CDF over softmax(s / T)).
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
  int* arrivals;          // [batch], zero before the launch
  int batch, positions, vocab, rank, top_k, chunk_len;
  bool vec_ok;
};

// Shared memory of the walk: pair scores [J][K][K], candidate scores [J][K], ids [J][K],
// uniforms [J] and the current q [K].
inline size_t walk_smem_bytes(int positions, int top_k) {
  const size_t jk = static_cast<size_t>(positions) * top_k;
  return (jk * top_k + 2 * jk + positions + top_k) * sizeof(float);
}

template <typename T>
__device__ void pair_scores(const WalkParams& p, int b, const int* ids, const float* vals, float* pair) {
  const int J = p.positions, K = p.top_k;
  if (!p.g) {
    for (int i = threadIdx.x; i < J * K * K; i += blockDim.x) pair[i] = vals[(i / (K * K)) * K + i % K];
    return;
  }
  const T* g = static_cast<const T*>(p.g);
  const T* pred = static_cast<const T*>(p.pred);
  const T* succ = static_cast<const T*>(p.succ);
  const int r = p.rank;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int tasks = 1 + (J - 1) * K;  // (j = 0, the anchor), then (j >= 1, a in C_{j-1})
  for (int task = warp; task < tasks; task += blockDim.x / kWarpSize) {
    const int j = task == 0 ? 0 : 1 + (task - 1) / K;
    const int a = task == 0 ? 0 : (task - 1) % K;
    const int64_t prev = j == 0 ? p.anchor[b] : ids[(j - 1) * K + a];
    const bool has_prev = prev >= 0 && prev < p.vocab;
    const T* pa = pred + (has_prev ? prev : 0) * r;
    const T* gj = g + (static_cast<int64_t>(b) * J + j) * r;
    for (int c = 0; c < K; ++c) {
      const T* qc = succ + static_cast<int64_t>(ids[j * K + c]) * r;
      float dot = 0.f;
      for (int x = lane; x < r; x += kWarpSize) dot += (to_float(pa[x]) * to_float(gj[x])) * to_float(qc[x]);
      dot = warp_sum(dot);
      if (lane == 0) pair[(j * K + a) * K + c] = vals[j * K + c] + (has_prev ? dot : 0.f);
    }
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

// One thread: the serial walk from the anchor over the precomputed pair scores (all operands in
// shared memory; global memory is only written).
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

// Run by the last CTA of sequence b, after every position's candidates are in global memory.
template <typename T>
__device__ void walk_sequence(const WalkParams& p, int b) {
  extern __shared__ float walk_smem[];
  const int J = p.positions, K = p.top_k;
  float* pair = walk_smem;                            // [J][K][K]: pair[(j*K + a)*K + c]
  float* vals = pair + J * K * K;                     // [J][K]
  int* ids = reinterpret_cast<int*>(vals + J * K);    // [J][K]
  float* u = reinterpret_cast<float*>(ids + J * K);   // [J]
  float* q = u + J;                                   // [K]
  const int64_t base = static_cast<int64_t>(b) * J * K;
  for (int i = threadIdx.x; i < J * K; i += blockDim.x) {
    ids[i] = static_cast<int>(__ldcg(p.cand_ids + base + i));  // written by other CTAs: skip L1
    vals[i] = __ldcg(p.cand_vals + base + i);
  }
  for (int j = threadIdx.x; j < J; j += blockDim.x) u[j] = p.uniforms[static_cast<int64_t>(b) * J + j];
  __syncthreads();
  pair_scores<T>(p, b, ids, vals, pair);
  __syncthreads();
  if (threadIdx.x == 0) walk_chain(p, b, ids, pair, u, p.temperature[b], q);
}

template <typename T, int MAXK>
__global__ void __launch_bounds__(kRowThreads) transition_walk_kernel(const WalkParams p) {
  __shared__ float top_v[MAXK];
  __shared__ int top_id[MAXK];
  __shared__ BestScratch best;
  const int row = blockIdx.x, b = row / p.positions;
  const T* x = static_cast<const T*>(p.logits) + static_cast<int64_t>(row) * p.vocab;

  TopList<MAXK> list;
  list.init();
  for_each_in_chunk(x, p.vocab, p.chunk_len, p.vec_ok, [&](int i, float v, bool valid) {
    if (valid) list.push(v, i);
  });
  block_top_k(list, p.top_k, top_v, top_id, best);
  if (threadIdx.x < p.top_k) {
    const int id = top_id[threadIdx.x];  // INT_MAX only for rows of NaN: keep indices in range
    p.cand_ids[static_cast<int64_t>(row) * p.top_k + threadIdx.x] = id < p.vocab ? id : 0;
    p.cand_vals[static_cast<int64_t>(row) * p.top_k + threadIdx.x] = top_v[threadIdx.x];
  }
  if (!arrive_last(&p.arrivals[b], p.positions)) return;
  walk_sequence<T>(p, b);
}

constexpr int kWalkMaxK = 32;

template <typename T, int MAXK>
void launch_walk_k(const WalkParams& p, cudaStream_t stream) {
  const size_t smem = walk_smem_bytes(p.positions, p.top_k);
  auto kernel = transition_walk_kernel<T, MAXK>;
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  kernel<<<static_cast<unsigned>(p.batch * p.positions), kRowThreads, smem, stream>>>(p);
}

// Requires 1 <= top_k <= kWalkMaxK and walk_smem_bytes() within the device's shared memory.
template <typename T>
void launch_transition_walk(const WalkParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.positions == 0) return;
  if (p.top_k <= 8) {
    launch_walk_k<T, 8>(p, stream);
  } else if (p.top_k <= 16) {
    launch_walk_k<T, 16>(p, stream);
  } else {
    launch_walk_k<T, kWalkMaxK>(p, stream);
  }
}

}  // namespace gpu
}  // namespace dspine
