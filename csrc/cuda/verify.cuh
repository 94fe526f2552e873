// Block verify with first-mismatch truncation (CUDA), one launch for the whole batch.
// Semantics: dspine_engine/ops.py:block_verify.
//
// grid = batch * T * splits CTAs, `splits` per (sequence, block row) of target logits, all rows
// in parallel:
// - greedy rows (temperature 0): the row's argmax (first maximal id); accept iff the draft equals
//   it. Each of the row's `splits` CTAs reads one slice, coalesced (thread t the groups t, t + 256,
//   ... of 8), and the slice's last CTA to finish (per-row arrival counter) combines the slices'
//   bests. Why split: one CTA a row left a batch-32 verify at 1.03 waves of CTAs on an H200 with
//   each CTA streaming a 300 KB row, and a batch-1 verify at 16 CTAs for 132 SMs.
// - sampled rows, read by the row's first CTA alone (the others return at once: the pass needs
//   thread-owned contiguous chunks for its inverse-CDF prefix sums): the statistics of
//   p_j = softmax(x / T) with tie-inclusive top-k / top-p
//   (thresholds from a few gathered candidates where a bound keeps them few, else by radix passes
//   over the row; no sort), p_j(d_j), the accept test
//   u_j * q_j(d_j) < p_j(d_j), and per-chunk masses of p_j and of the residual max(0, p_j - q_j)
//   (q is sparse: the residual differs from p only at the K candidates).
// The last CTA of a sequence (atomic arrival counter) finds the first rejected row n, then the
// bonus: the argmax of row n, or an inverse-CDF sample of row n (residual at a rejection, p after
// a full accept): a block scan over the chunk masses picks the chunk, a warp scan inside it picks
// the token. Cumulative sums are in fp64; a pick may differ from the sequential reference only
// where u sits within rounding of a boundary.
#pragma once

#include <algorithm>

#include "sampling.cuh"

namespace dspine {
namespace gpu {

// Per-row result handed to the sequence's last CTA (32 bytes, read back with one cache-global load).
struct alignas(16) VerifyRow {
  DistStats st;
  int argmax;
  int flags;
};
constexpr int kRowAccepted = 1;
constexpr int kRowResidualPositive = 2;

struct VerifyParams {
  const void* logits;  // [batch, T, V]
  const int64_t* draft_tokens;  // [batch, T-1]
  const int64_t* cand_ids;      // [batch, T-1, K]
  const float* cand_probs;      // [batch, T-1, K]
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* uniforms;  // [batch, T]
  int32_t* accept_len;     // [batch]
  int64_t* out_tokens;     // [batch, T]
  VerifyRow* rows;         // workspace [batch * T]
  double* chunk_mass;      // workspace [batch * T][2][kRowThreads]: p, then the residual
  int2* parts;             // workspace [batch * T][splits]: a greedy slice's best (value bits, id)
  int* arrivals;           // [batch], zero before the launch
  int* row_arrivals;       // [batch * T], zero before the launch (used when splits > 1)
  int batch, block, vocab, cand, chunk_len;
  int splits, split_len;   // greedy rows: CTAs a row, elements a slice (a multiple of kGroup)
  bool vec_ok;
  bool radix_only;         // sampled rows' thresholds by the radix passes alone (DSPINE_VERIFY_RADIX)
};

// ---- host: the launch's shape and its one workspace ------------------------------------------

constexpr int kVerifyMinSplit = kRowThreads * kGroup * 4;  // one batch of 4 loads a thread
constexpr int kVerifyMaxSplits = 32;                       // the combine reads them in one warp
constexpr int kVerifyCtasPerSm = 4;                        // __launch_bounds__ below

// Greedy slices a row: about four waves of CTAs, no slice shorter than one batch of loads.
inline int verify_splits(int64_t rows, int64_t vocab, int num_sms) {
  const int64_t want = ceil_div(4LL * kVerifyCtasPerSm * num_sms, rows > 0 ? rows : 1);
  const int64_t most = ceil_div(vocab, kVerifyMinSplit);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, kVerifyMaxSplits})));
}

// Byte offsets in the workspace; the counters come last so that one memset zeroes them all.
struct VerifyWorkspace {
  size_t rows, mass, parts, counters, counter_bytes, bytes;
};

inline VerifyWorkspace verify_workspace(int64_t batch, int64_t block, int splits) {
  const size_t n = static_cast<size_t>(batch * block);
  VerifyWorkspace w{};
  w.rows = 0;
  w.mass = w.rows + n * sizeof(VerifyRow);
  w.parts = w.mass + n * 2 * kRowThreads * sizeof(double);
  w.counters = w.parts + n * static_cast<size_t>(splits) * sizeof(int2);
  w.counter_bytes = (static_cast<size_t>(batch) + n) * sizeof(int);
  w.bytes = w.counters + w.counter_bytes;
  return w;
}

// Sets p's greedy split (p.batch, p.block and p.vocab set) and returns the workspace it needs.
inline VerifyWorkspace plan_verify(VerifyParams& p, int num_sms) {
  const int want = verify_splits(static_cast<int64_t>(p.batch) * p.block, p.vocab, num_sms);
  p.split_len = static_cast<int>(round_up(ceil_div(p.vocab, want), kGroup));
  p.splits = static_cast<int>(ceil_div(p.vocab, p.split_len));  // no empty slice
  return verify_workspace(p.batch, p.block, p.splits);
}

// Points p's workspace into `base` (16-byte aligned, w.bytes long). The caller zeroes
// [p.arrivals, + w.counter_bytes) on the launch's stream before the launch.
inline void bind_verify_workspace(VerifyParams& p, const VerifyWorkspace& w, char* base) {
  p.rows = reinterpret_cast<VerifyRow*>(base + w.rows);
  p.chunk_mass = reinterpret_cast<double*>(base + w.mass);
  p.parts = reinterpret_cast<int2*>(base + w.parts);
  p.arrivals = reinterpret_cast<int*>(base + w.counters);
  p.row_arrivals = p.arrivals + p.batch;
}

struct VerifyScratch {
  DistScratch dist;
  BestScratch best;
  double chunk_corr[kRowThreads];
  double total;
  int chunk;
  double base;
  int n;
  int pick;
  int cand_kept;   // distinct candidates with p > 0
  int cand_resid;  // some candidate keeps residual mass
};

// q(x): the draft's probability of token x (sum over duplicate candidates, in order).
__device__ __forceinline__ float draft_prob(const int64_t* ids, const float* qs, int k, int64_t x) {
  float q = 0.f;
  for (int c = 0; c < k; ++c)
    if (ids[c] == x) q += qs[c];
  return q;
}

// Sampled row: distribution stats, accept test and the chunk masses of p and of the residual.
template <typename T>
__device__ void verify_sampled_row(const VerifyParams& p, int b, int j, const T* x, VerifyScratch& sh) {
  const int row = b * p.block + j;
  const DistResult dist = row_distribution(x, p.vocab, p.chunk_len, p.vec_ok, p.temperature[b], p.top_k[b],
                                           p.top_p[b], p.radix_only, sh.dist);
  const bool has_draft = j < p.block - 1;
  const int64_t* ids = p.cand_ids + (static_cast<int64_t>(b) * (p.block - 1) + j) * p.cand;
  const float* qs = p.cand_probs + (static_cast<int64_t>(b) * (p.block - 1) + j) * p.cand;

  // Residual max(0, p - q) = p except at distinct candidates, where min(p, q) is removed.
  if (threadIdx.x == 0) {
    sh.cand_kept = 0;
    sh.cand_resid = 0;
  }
  sh.chunk_corr[threadIdx.x] = 0.0;
  __syncthreads();
  for (int c = threadIdx.x; has_draft && c < p.cand; c += blockDim.x) {
    const int64_t id = ids[c];
    bool repeat = false;
    for (int c2 = 0; c2 < c; ++c2) repeat |= ids[c2] == id;
    if (repeat || id < 0 || id >= p.vocab) continue;
    const float px = prob(dist.st, to_float(x[id]));
    const float resid = fmaxf(0.f, px - draft_prob(ids, qs, p.cand, id));
    if (px > 0.f) atomicAdd(&sh.cand_kept, 1);
    if (resid > 0.f) sh.cand_resid = 1;
    atomicAdd(&sh.chunk_corr[id / p.chunk_len], static_cast<double>(px) - resid);
  }
  __syncthreads();
  double* mass = p.chunk_mass + static_cast<int64_t>(row) * 2 * kRowThreads;
  mass[threadIdx.x] = dist.chunk_mass;
  mass[kRowThreads + threadIdx.x] = dist.chunk_mass - sh.chunk_corr[threadIdx.x];
  if (threadIdx.x == 0) {
    VerifyRow info{dist.st, 0, 0};
    if (has_draft) {
      const int64_t d = p.draft_tokens[static_cast<int64_t>(b) * (p.block - 1) + j];
      const float pd = d >= 0 && d < p.vocab ? prob(dist.st, to_float(x[d])) : 0.f;
      const float qd = draft_prob(ids, qs, p.cand, d);
      const double u = p.uniforms[row];
      if (u * qd < static_cast<double>(pd)) info.flags |= kRowAccepted;
      // The residual is empty only if every token with p > 0 is a candidate with q >= p.
      if (sh.cand_resid || dist.kept > sh.cand_kept) info.flags |= kRowResidualPositive;
    }
    p.rows[row] = info;
  }
}

// This thread's best (torch.argmax order) over [begin, end), groups of kGroup strided by the
// block so that a warp's loads are contiguous. Each thread meets its ids in increasing order, so
// "strictly greater, or the first NaN" keeps the first maximal id; the block merge orders by id.
template <typename T>
__device__ __forceinline__ void slice_best(const T* row, int begin, int end, bool vec_ok, float& bv, int& bi) {
  constexpr int kBatch = 4;
  constexpr int kStride = kRowThreads * kGroup;
  for (int i0 = begin + static_cast<int>(threadIdx.x) * kGroup; i0 < end; i0 += kBatch * kStride) {
    float v[kBatch][kGroup];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) load_group(row, i0 + k * kStride, end, vec_ok, v[k]);  // -inf past end
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
#pragma unroll
      for (int e = 0; e < kGroup; ++e) {
        const float x = v[k][e];
        if (x > bv || (isnan(x) && !isnan(bv))) {
          bv = x;
          bi = i0 + k * kStride + e;
        }
      }
  }
}

// A slice (a whole row when splits == 1) of a greedy row. Returns whether this CTA wrote the
// row's result, i.e. read the last slice to finish; the row's other CTAs return false.
template <typename T>
__device__ bool verify_greedy_row(const VerifyParams& p, int b, int j, int split, const T* x, VerifyScratch& sh) {
  const int row = b * p.block + j;
  const int begin = split * p.split_len, end = min(p.vocab, begin + p.split_len);
  float bv = -INFINITY;
  int bi = INT_MAX;  // a slice of -inf only: ranks after any real id
  slice_best(x, begin, end, p.vec_ok, bv, bi);
  block_best(bv, bi, argmax_before, sh.best);
  if (p.splits > 1) {
    if (threadIdx.x == 0) p.parts[static_cast<int64_t>(row) * p.splits + split] = make_int2(__float_as_int(bv), bi);
    if (!arrive_last(&p.row_arrivals[row], p.splits)) return false;
    if (threadIdx.x < kWarpSize) {  // the slices' bests, written by other CTAs: read through L2
      bv = -INFINITY;
      bi = INT_MAX;
      if (static_cast<int>(threadIdx.x) < p.splits) {
        const int2 part = __ldcg(p.parts + static_cast<int64_t>(row) * p.splits + threadIdx.x);
        bv = __int_as_float(part.x);
        bi = part.y;
      }
      warp_best(bv, bi, argmax_before);
    }
  }
  if (threadIdx.x == 0) {
    const int am = bi < p.vocab ? bi : 0;  // an all -inf row: id 0, as torch.argmax
    VerifyRow info{DistStats{1.f, 0.f, 1.f, -INFINITY, 0.f, 1.f}, am, 0};
    if (j < p.block - 1 && p.draft_tokens[static_cast<int64_t>(b) * (p.block - 1) + j] == am)
      info.flags = kRowAccepted;
    p.rows[row] = info;
  }
  return true;
}

// A row written by another CTA of this launch: read through L2 (two 16-byte loads).
__device__ __forceinline__ VerifyRow load_row(const VerifyRow* r) {
  const int4 a = __ldcg(reinterpret_cast<const int4*>(r));
  const int4 b = __ldcg(reinterpret_cast<const int4*>(r) + 1);
  const DistStats st{__int_as_float(a.x), __int_as_float(a.y), __int_as_float(a.z),
                     __int_as_float(a.w), __int_as_float(b.x), __int_as_float(b.y)};
  return VerifyRow{st, b.z, b.w};
}

// Value of token i in the distribution being sampled: p, or the residual max(0, p - q).
template <typename T>
__device__ __forceinline__ float sample_weight(const T* x, int i, const DistStats& st, const int64_t* ids,
                                               const float* qs, int k, bool residual) {
  const float px = prob(st, to_float(x[i]));
  return residual ? fmaxf(0.f, px - draft_prob(ids, qs, k, i)) : px;
}

// Warp 0: inverse-CDF pick inside `chunk`, starting at cumulative mass `base`; the last token of
// positive weight in the chunk when rounding leaves target out of reach. Returns -1 if none.
template <typename T>
__device__ int pick_in_chunk(const T* x, int vocab, int chunk_len, int chunk, double base, double target,
                             const DistStats& st, const int64_t* ids, const float* qs, int k, bool residual) {
  const int lane = threadIdx.x % kWarpSize;
  const int begin = chunk * chunk_len, end = min(vocab, begin + chunk_len);
  const int per = (chunk_len + kWarpSize - 1) / kWarpSize;
  const int lo = min(end, begin + lane * per), hi = min(end, lo + per);
  double mine = 0.0;
  int last_pos = -1;
  for (int i = lo; i < hi; ++i) {
    const float w = sample_weight(x, i, st, ids, qs, k, residual);
    mine += w;
    if (w > 0.f) last_pos = i;
  }
  const double incl = warp_inclusive_scan(mine);
  const unsigned hits = __ballot_sync(kFullMask, base + incl > target);
  int pick = -1;
  if (hits != 0 && lane == __ffs(hits) - 1) {
    double cum = base + incl - mine;
    for (int i = lo; i < hi && pick < 0; ++i) {
      const float w = sample_weight(x, i, st, ids, qs, k, residual);
      cum += w;
      if (w > 0.f && cum > target) pick = i;
    }
    if (pick < 0) pick = last_pos;  // the element sums fell short of the chunk sum by rounding
  }
  if (hits == 0) pick = last_pos;
  // Broadcast: the hit lane's pick, else the highest lane's last positive token.
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) pick = max(pick, __shfl_xor_sync(kFullMask, pick, o));
  return pick;
}

// Block-wide inverse-CDF sample of row `row` over its precomputed chunk masses; -1 if no mass.
template <typename T>
__device__ int sample_row(const VerifyParams& p, int row, const DistStats& st, const int64_t* ids,
                          const float* qs, bool residual, float u, VerifyScratch& sh) {
  const T* x = static_cast<const T*>(p.logits) + static_cast<int64_t>(row) * p.vocab;
  const double* mass = p.chunk_mass + (static_cast<int64_t>(row) * 2 + (residual ? 1 : 0)) * kRowThreads;
  const double mine = fmax(0.0, __ldcg(mass + threadIdx.x));
  const double incl = block_inclusive_scan(mine, sh.dist.dscratch);
  if (threadIdx.x == kRowThreads - 1) sh.total = incl;
  if (threadIdx.x == 0) sh.chunk = INT_MAX;
  __syncthreads();
  const double target = static_cast<double>(u) * sh.total;
  if (incl > target) atomicMin(&sh.chunk, static_cast<int>(threadIdx.x));
  __syncthreads();
  bool found = sh.chunk != INT_MAX;
  if (!found) {  // rounding put the target past the last chunk: take the last chunk with mass
    __syncthreads();
    if (threadIdx.x == 0) sh.chunk = -1;
    __syncthreads();
    if (mine > 0.0) atomicMax(&sh.chunk, static_cast<int>(threadIdx.x));
    __syncthreads();
    if (sh.chunk < 0) return -1;
  }
  if (static_cast<int>(threadIdx.x) == sh.chunk) sh.base = incl - mine;
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    const int pick = pick_in_chunk(x, p.vocab, p.chunk_len, sh.chunk, sh.base, found ? target : INFINITY, st, ids,
                                   qs, p.cand, residual);
    if (threadIdx.x == 0) sh.pick = pick;
  }
  __syncthreads();
  return sh.pick;
}

// The bonus token of a sampled sequence whose first rejected row is n.
template <typename T>
__device__ int64_t sample_bonus(const VerifyParams& p, int b, int n, VerifyScratch& sh) {
  const int row = b * p.block + n;
  const VerifyRow info = load_row(p.rows + row);
  const bool residual = n < p.block - 1 && (info.flags & kRowResidualPositive);
  const int64_t* ids = p.cand_ids + (static_cast<int64_t>(b) * (p.block - 1) + n) * p.cand;
  const float* qs = p.cand_probs + (static_cast<int64_t>(b) * (p.block - 1) + n) * p.cand;
  const float u = p.uniforms[static_cast<int64_t>(b) * p.block + p.block - 1];
  int pick = sample_row<T>(p, row, info.st, ids, qs, residual, u, sh);
  if (pick < 0 && residual) pick = sample_row<T>(p, row, info.st, ids, qs, false, u, sh);
  return pick < 0 ? 0 : pick;
}

// Run by the last CTA of sequence b: accept length, bonus, outputs.
template <typename T>
__device__ void finish_sequence(const VerifyParams& p, int b, VerifyScratch& sh) {
  if (threadIdx.x == 0) sh.n = p.block - 1;
  __syncthreads();
  for (int j = threadIdx.x; j < p.block - 1; j += blockDim.x)
    if (!(load_row(p.rows + b * p.block + j).flags & kRowAccepted)) atomicMin(&sh.n, j);  // first rejection
  __syncthreads();
  const int n = sh.n;
  int64_t bonus;
  if (p.temperature[b] > 0.f) {
    bonus = sample_bonus<T>(p, b, n, sh);
  } else {
    bonus = load_row(p.rows + b * p.block + n).argmax;
  }
  const int64_t* draft = p.draft_tokens + static_cast<int64_t>(b) * (p.block - 1);
  int64_t* out = p.out_tokens + static_cast<int64_t>(b) * p.block;
  for (int j = threadIdx.x; j < p.block; j += blockDim.x) out[j] = j < n ? draft[j] : (j == n ? bonus : -1);
  if (threadIdx.x == 0) p.accept_len[b] = n;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads, kVerifyCtasPerSm) block_verify_kernel(const VerifyParams p) {  // 64 regs: one wave
  join_chain();  // launch.cuh
  __shared__ VerifyScratch sh;
  const int row = blockIdx.x / p.splits, split = blockIdx.x % p.splits;
  const int b = row / p.block, j = row % p.block;
  const T* x = static_cast<const T*>(p.logits) + static_cast<int64_t>(row) * p.vocab;
  if (p.temperature[b] > 0.f) {
    if (split != 0) return;  // a sampled row is its first CTA's
    verify_sampled_row(p, b, j, x, sh);
  } else if (!verify_greedy_row(p, b, j, split, x, sh)) {
    return;  // another slice of the row finishes it
  }
  if (!arrive_last(&p.arrivals[b], p.block)) return;
  finish_sequence<T>(p, b, sh);
}

// p's workspace bound by bind_verify_workspace, its counters zeroed.
template <typename T>
void launch_block_verify(const VerifyParams& p, cudaStream_t stream) {
  if (p.batch == 0) return;
  const unsigned ctas = static_cast<unsigned>(static_cast<int64_t>(p.batch) * p.block * p.splits);
  launch_kernel(block_verify_kernel<T>, Launch(ctas, kRowThreads, 0, stream), p);
}

}  // namespace gpu
}  // namespace dspine
