// Row-wise selection and sampling pieces shared by the transition walk and the block verifier.
//
// One CTA (kRowThreads threads) owns one row of V logits. Thread t owns the contiguous chunk
// [t * chunk_len, (t + 1) * chunk_len) (chunk_len a multiple of 8, so 16-byte loads stay aligned);
// contiguous chunks make per-thread partial sums prefix sums in vocabulary order, which is what
// inverse-CDF sampling needs. All loops over a chunk have the same trip count in every thread, so
// warp-synchronous intrinsics may be used inside them.
#pragma once

#include <climits>

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / kWarpSize;
constexpr int kGroup = 8;  // elements per load

inline int row_chunk_len(int64_t vocab) {
  return static_cast<int>(round_up(ceil_div(vocab, kRowThreads), kGroup));
}

// Eight consecutive elements as floats; past the row end they read as -inf.
template <typename T>
__device__ __forceinline__ void load_group(const T* row, int i0, int vocab, bool vec_ok, float (&v)[kGroup]) {
  if (vec_ok && i0 + kGroup <= vocab) {
    if constexpr (sizeof(T) == 2) {
      const Pack<T, 8> a = *reinterpret_cast<const Pack<T, 8>*>(row + i0);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = to_float(a.v[e]);
    } else {
      const Pack<T, 4> a = *reinterpret_cast<const Pack<T, 4>*>(row + i0);
      const Pack<T, 4> b = *reinterpret_cast<const Pack<T, 4>*>(row + i0 + 4);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[e] = to_float(a.v[e]);
        v[e + 4] = to_float(b.v[e]);
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < kGroup; ++e) v[e] = i0 + e < vocab ? to_float(row[i0 + e]) : -INFINITY;
  }
}

// f(index, value, valid) for every element slot of this thread's chunk (uniform trip count).
// Loads are issued kBatch groups at a time so that enough bytes are in flight to cover HBM latency.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_chunk(const T* row, int vocab, int chunk_len, bool vec_ok, F&& f) {
  constexpr int kBatch = 4;
  const int begin = threadIdx.x * chunk_len;
  for (int g = 0; g < chunk_len; g += kBatch * kGroup) {
    float v[kBatch][kGroup];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (g + k * kGroup < chunk_len) load_group(row, begin + g + k * kGroup, vocab, vec_ok, v[k]);
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (g + k * kGroup >= chunk_len) break;  // uniform: chunk_len is the same in every thread
      const int i0 = begin + g + k * kGroup;
#pragma unroll
      for (int e = 0; e < kGroup; ++e) f(i0 + e, v[k][e], i0 + e < vocab);
    }
  }
}

// ---- orderings -----------------------------------------------------------------------------

// Top-k order: higher score first, ties to the lower id; NaN never ranks.
__host__ __device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// torch.argmax order: NaN beats everything, then the higher value, ties to the lower id.
__device__ __forceinline__ bool argmax_before(float va, int ia, float vb, int ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (na) return ia < ib;
  return ranks_before(va, ia, vb, ib);
}

// Butterfly over the warp: every lane ends with the best (value, id) under `before`.
template <typename Before>
__device__ __forceinline__ void warp_best(float& v, int& id, Before before) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, o);
    const int oi = __shfl_xor_sync(kFullMask, id, o);
    if (before(ov, oi, v, id)) {
      v = ov;
      id = oi;
    }
  }
}

struct BestScratch {
  float v[kRowWarps];
  int id[kRowWarps];
  float best_v;
  int best_id;
};

// Best (value, id) of the block under `before`; every thread gets it. Uniform control flow only.
template <typename Before>
__device__ void block_best(float& v, int& id, Before before, BestScratch& sh) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  warp_best(v, id, before);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) {
    sh.v[warp] = v;
    sh.id[warp] = id;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < kRowWarps ? sh.v[lane] : -INFINITY;
    id = lane < kRowWarps ? sh.id[lane] : INT_MAX;
    warp_best(v, id, before);
    if (lane == 0) {
      sh.best_v = v;
      sh.best_id = id;
    }
  }
  __syncthreads();
  v = sh.best_v;
  id = sh.best_id;
}

// ---- per-thread sorted top list + block merge (small k) -------------------------------------

template <int MAXK>
struct TopList {
  float v[MAXK];
  int id[MAXK];

  __host__ __device__ void init() {
#pragma unroll
    for (int s = 0; s < MAXK; ++s) {
      v[s] = -INFINITY;
      id[s] = INT_MAX;  // empty slots rank after every real element, even -inf ones
    }
  }

  // Inserts (x, i) keeping v sorted by ranks_before; unrolled so the list stays in registers.
  __host__ __device__ void push(float x, int i) {
    if (!ranks_before(x, i, v[MAXK - 1], id[MAXK - 1])) return;
#pragma unroll
    for (int s = MAXK - 1; s > 0; --s) {
      if (ranks_before(x, i, v[s - 1], id[s - 1])) {  // (x, i) lands above s - 1: shift it down
        v[s] = v[s - 1];
        id[s] = id[s - 1];
      } else if (ranks_before(x, i, v[s], id[s])) {  // lands exactly at s
        v[s] = x;
        id[s] = i;
      }
    }
    if (ranks_before(x, i, v[0], id[0])) {
      v[0] = x;
      id[0] = i;
    }
  }

  __host__ __device__ void pop() {
#pragma unroll
    for (int s = 0; s < MAXK - 1; ++s) {
      v[s] = v[s + 1];
      id[s] = id[s + 1];
    }
    v[MAXK - 1] = -INFINITY;
    id[MAXK - 1] = INT_MAX;
  }
};

// Shared memory of block_top_k: each warp's k best, in order.
template <int MAXK>
struct TopKScratch {
  float v[kRowWarps][MAXK];
  int id[kRowWarps][MAXK];
};

// The k (<= MAXK) best elements over all threads' lists, in order, into top_v / top_id (shared).
// Two levels: each warp draws its own k best from its lanes' list heads (k rounds of a warp
// tournament, shuffles only; the winner's owner pops it), then warp 0 draws the block's k best
// from the warps' sorted k-lists, lane w holding the head of warp w's. One barrier in all, where
// k block-wide rounds took three each (H100 ncu, 27th session: the walk's top-k kernel spent 29%
// of its stall samples in that tournament, mostly at its barriers). The same k elements in the
// same order: each level takes the best remaining under one strict order (ranks_before).
template <int MAXK>
__device__ void block_top_k(TopList<MAXK>& list, int k, float* top_v, int* top_id, TopKScratch<MAXK>& sh) {
  static_assert(kRowWarps <= kWarpSize, "warp 0 holds a head per warp");
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int c = 0; c < k; ++c) {
    float v = list.v[0];
    int id = list.id[0];
    warp_best(v, id, ranks_before);
    if (list.id[0] == id) list.pop();  // ids are unique, so only the owner pops (or empty slots)
    if (lane == 0) {
      sh.v[warp][c] = v;
      sh.id[warp][c] = id;
    }
  }
  __syncthreads();
  if (warp == 0) {
    int next = 0;  // lane w < kRowWarps: the first of warp w's entries not yet drawn
    for (int c = 0; c < k; ++c) {
      const bool has = lane < kRowWarps && next < k;
      float v = has ? sh.v[lane][next] : -INFINITY;
      int id = has ? sh.id[lane][next] : INT_MAX;
      const int mine = id;
      warp_best(v, id, ranks_before);
      if (has && mine == id) ++next;
      if (lane == 0) {
        top_v[c] = v;
        top_id[c] = id;
      }
    }
  }
  __syncthreads();
}

// ---- radix threshold searches (any k; top-p) --------------------------------------------------

// float -> uint32 with the same order; -0 and +0 share a key (they compare equal).
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u << 1) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Radix passes of 8 bits (4 over a 32-bit key), each warp adding into its own histogram: logits
// share their top bits, so one histogram for the CTA had all 8 warps' atomics queue on the same
// few buckets (the top-k / top-p verify at batch 32 took 2.6-3.3 ms). A warp's histogram is
// padded by one bucket so that bucket b of every warp falls in a different bank.
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kRadixPitch = kRadixBins + 1;

struct RadixScratch {
  unsigned long long hist[kRowWarps * kRadixPitch];  // per warp
  unsigned long long total[kRadixBins];              // the warps' sum, per pass
  int bucket;
  unsigned long long above;
};

// hist[bucket] += w summed over the lanes that share `bucket` (< 0: no add): one shared atomic
// per distinct bucket per warp instead of one per lane (logits cluster in few buckets).
// Weights are split in 32-bit halves for __reduce_add_sync; a warp's total must stay < 2^52.
__device__ __forceinline__ void warp_aggregated_add(unsigned long long* hist, int bucket, unsigned long long w) {
  if (!__any_sync(kFullMask, bucket >= 0)) return;  // later passes: most elements miss the prefix
  const unsigned peers = __match_any_sync(kFullMask, bucket);
  const unsigned hi = __reduce_add_sync(peers, static_cast<unsigned>(w >> 20));
  const unsigned lo = __reduce_add_sync(peers, static_cast<unsigned>(w & 0xfffffu));
  if (bucket >= 0 && static_cast<int>(threadIdx.x % kWarpSize) == __ffs(peers) - 1)
    atomicAdd(&hist[bucket], (static_cast<unsigned long long>(hi) << 20) + lo);
}

// Warp 0: the highest bucket b with above + weight(buckets >= b) >= need (need >= 1), into
// sh.bucket (-1 if none) and sh.above (weight strictly above b), from total[0, Bins).
template <int Bins>
__device__ inline void find_bucket_from_top(const unsigned long long* total, RadixScratch& sh,
                                            unsigned long long need, unsigned long long above) {
  const int lane = threadIdx.x % kWarpSize;
  constexpr int per = Bins / kWarpSize;
  const int top = Bins - 1 - lane * per;  // lane scans buckets top, top - 1, ..., top - per + 1
  unsigned long long mine = 0;
#pragma unroll 1  // (unrolled, its loads spilled the verify kernel's registers at 64)
  for (int i = 0; i < per; ++i) mine += total[top - i];
  const unsigned long long incl = warp_inclusive_scan(mine);
  const unsigned hits = __ballot_sync(kFullMask, above + incl >= need);
  if (hits == 0) {
    if (lane == 0) sh.bucket = -1;
    return;
  }
  if (lane != __ffs(hits) - 1) return;
  unsigned long long cum = above + incl - mine;
#pragma unroll 1
  for (int i = 0; i < per; ++i) {
    const unsigned long long h = total[top - i];
    if (cum + h >= need) {
      sh.bucket = top - i;
      sh.above = cum;
      return;
    }
    cum += h;
  }
}

// The largest key K with weight(elements whose key >= K) >= need, by radix passes over the row.
// value(x) maps a logit to the ranked float, weight(v) gives its integer weight (0: ignored).
// Returns false if the whole row weighs less than need. With weight 1 and need k this is the
// k-th largest value; with fixed-point probabilities and need = top_p it is the top-p threshold
// tau. The key found does not depend on how its bits are split into passes, nor on the order the
// integer weights are added in. Uniform control flow only. Two digit layouts:
// - narrow (top-k's): four passes of kRadixBits, each warp adding into its own histogram with
//   warp aggregation (warp_aggregated_add), the warps' histograms summed after the pass;
// - wide (top-p's): three passes of 11, 11 and 10 bits into one CTA-wide histogram of kWideBins
//   buckets (the per-warp histograms' storage), a plain shared atomic per hit: no match / reduce
//   per element, one pass fewer. A probability's key starts with its exponent, so a flat row
//   (the rows that reach a radix search under top-p: the levels failed) spreads over hundreds of
//   quarter-octave buckets and the atomics rarely collide. A peaked row's logits share their top
//   11 bits, and same-bucket atomics then serialise (top-k + top-p on peaked rows, radix only:
//   2.8 -> 5.6 ms at batch 32, H100), so top-k keeps the narrow passes.
constexpr int kWideBins = 2048;
static_assert(kRowWarps * kRadixPitch >= kWideBins, "the wide histogram reuses the per-warp ones' storage");

template <bool Wide, typename T, typename ValueFn, typename WeightFn>
__device__ bool radix_search(const T* row, int vocab, int chunk_len, bool vec_ok, ValueFn value,
                             WeightFn weight, unsigned long long need, RadixScratch& sh, uint32_t& key_out) {
  constexpr int kPasses = Wide ? 3 : 32 / kRadixBits;
  constexpr int kHistWords = Wide ? kWideBins : kRowWarps * kRadixPitch;
  uint32_t prefix = 0, prefix_mask = 0;
  unsigned long long above = 0;
#pragma unroll 1
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = Wide ? (pass == 0 ? 21 : pass == 1 ? 10 : 0) : 32 - kRadixBits * (pass + 1);
    const uint32_t digit_mask = Wide ? (pass == 2 ? 0x3ffu : 0x7ffu) : kRadixBins - 1;
    __syncthreads();  // the previous pass (or caller) is done with sh
    for (int i = threadIdx.x; i < kHistWords; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    for_each_in_chunk(row, vocab, chunk_len, vec_ok, [&](int, float x, bool valid) {
      const float v = value(x);
      const uint32_t key = order_key(v);
      const unsigned long long w = valid ? weight(v) : 0ull;
      const bool hit = w != 0 && (key & prefix_mask) == prefix;
      const int bucket = static_cast<int>((key >> shift) & digit_mask);
      if (Wide) {
        if (hit) atomicAdd(&sh.hist[bucket], w);
      } else {
        unsigned long long* mine = sh.hist + (threadIdx.x / kWarpSize) * kRadixPitch;  // this warp's
        warp_aggregated_add(mine, hit ? bucket : -1, hit ? w : 0ull);
      }
    });
    __syncthreads();
    if (!Wide) {
      for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) {
        unsigned long long sum = 0;
        for (int w = 0; w < kRowWarps; ++w) sum += sh.hist[w * kRadixPitch + b];
        sh.total[b] = sum;
      }
      __syncthreads();
    }
    if (threadIdx.x < kWarpSize)
      find_bucket_from_top<Wide ? kWideBins : kRadixBins>(Wide ? sh.hist : sh.total, sh, need, above);
    __syncthreads();
    const int bucket = sh.bucket;
    if (bucket < 0) return false;
    above = sh.above;
    prefix |= static_cast<uint32_t>(bucket) << shift;
    prefix_mask |= digit_mask << shift;
  }
  key_out = prefix;
  return true;
}

// ---- threshold search over a few gathered candidates ------------------------------------------
//
// Both filters' thresholds are the largest key K whose weight W(K) (the weight of the elements with
// key >= K) reaches `need`. W only steps at the elements' keys, so K is the largest key_i with
// W(key_i) >= need. Given a bound B with W(B) >= need, K >= B, and W at keys >= B depends only on
// the elements with key >= B: when those are few they are gathered into shared memory and each
// one's W is summed there. That is the radix passes' K exactly, found in two light passes over
// the row (one for B, one to gather) instead of four passes with a warp-aggregated shared
// histogram add per element (2.2-2.9 ms for a batch-32 top-k / top-p verify on an H100). B for
// top-k <= kFastTopK: the k-th largest of the threads' chunk maxima (k distinct elements are at
// least that). B for top-p: the highest of kMassLevels probability levels whose mass reaches
// top_p (no more than 2^l elements have p >= 2^-l, so the gather fits whenever a level does).
// Rows without such a bound (flat distributions) or whose gather overflows keep the radix passes.
constexpr int kCandCap = 512;    // gathered candidates a row
constexpr int kFastTopK = 128;   // largest k whose bound comes from the chunk maxima
constexpr int kMassLevels = 6;   // p >= 2^-2, 2^-4, 2^-6, 2^-7, 2^-8, 2^-9

__device__ __forceinline__ float mass_level(int l) {
  return l < 3 ? __uint_as_float(static_cast<uint32_t>(127 - 2 * (l + 1)) << 23)
               : __uint_as_float(static_cast<uint32_t>(127 - (l + 4)) << 23);
}

struct CandScratch {
  float x[kCandCap];                  // the gathered logits (as the row's loads give them)
  int idx[kCandCap];                  // and their ids
  uint32_t key[kCandCap];             // their ranked values' keys
  unsigned long long w[kCandCap];     // and weights
  float thread_max[kRowThreads];
  unsigned long long level_mass[kMassLevels];
  int n;           // elements that passed the gather's test (may exceed kCandCap: overflow)
  float bound;
  int found;
  uint32_t best;
};

// Every element with value(x) >= bound and nonzero weight, into sh.x (any order); sh.n counts them
// all, also past kCandCap. `bound` as the ranked values compare (NaN never passes).
template <typename T, typename ValueFn, typename WeightFn>
__device__ void gather_candidates(const T* row, int vocab, int chunk_len, bool vec_ok, ValueFn value, WeightFn weight,
                                  float bound, CandScratch& sh) {
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();  // the scratch may still be read by a previous search
  if (threadIdx.x == 0) sh.n = 0;
  __syncthreads();
  for_each_in_chunk(row, vocab, chunk_len, vec_ok, [&](int i, float x, bool valid) {
    const float v = value(x);
    const bool take = valid && v >= bound && weight(v) != 0ull;
    const unsigned takers = __ballot_sync(kFullMask, take);
    if (takers == 0) return;
    int base = 0;
    if (lane == __ffs(takers) - 1) base = atomicAdd(&sh.n, __popc(takers));
    base = __shfl_sync(kFullMask, base, __ffs(takers) - 1);
    const int at = base + __popc(takers & ((1u << lane) - 1u));
    if (take && at < kCandCap) {
      sh.x[at] = x;
      sh.idx[at] = i;
    }
  });
  __syncthreads();
}

// f(x) for this thread's chunk's gathered elements in index order (a thread's gathers land in
// the order it met them): what a pass over the chunk sees of them, when sh holds them all
// (sh.n <= kCandCap), so sums over them come out with the same bits.
template <typename F>
__device__ void for_each_gathered_in_chunk(const CandScratch& sh, int chunk_len, F&& f) {
  const int begin = threadIdx.x * chunk_len;
  for (int j = 0; j < sh.n; ++j) {
    const int i = sh.idx[j];
    if (i >= begin && i - begin < chunk_len) f(sh.x[j]);
  }
}

// K over the gathered candidates (sh.n <= kCandCap): the largest key whose weight from above
// reaches need. Returns false if none does (the whole set weighs less than need).
template <typename ValueFn, typename WeightFn>
__device__ bool search_candidates(ValueFn value, WeightFn weight, unsigned long long need, CandScratch& sh,
                                  uint32_t& key_out) {
  const int n = sh.n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = value(sh.x[i]);
    sh.key[i] = order_key(v);
    sh.w[i] = weight(v);
  }
  if (threadIdx.x == 0) {
    sh.found = 0;
    sh.best = 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (sh.w[i] == 0) continue;  // K is a weighted element's key, as the radix passes find it
    const uint32_t ki = sh.key[i];
    unsigned long long above = 0;
    for (int j = 0; j < n; ++j) above += sh.key[j] >= ki ? sh.w[j] : 0ull;
    if (above >= need) {
      atomicMax(&sh.best, ki);
      sh.found = 1;
    }
  }
  __syncthreads();
  key_out = sh.best;
  return sh.found != 0;
}

// The k-th largest of the threads' chunk maxima of value(x) (-inf where fewer than k threads have
// an element): W(bound) >= k unless it is -inf. k <= kRowThreads.
template <typename T, typename ValueFn>
__device__ float top_k_bound(const T* row, int vocab, int chunk_len, bool vec_ok, ValueFn value, int k,
                             CandScratch& sh) {
  float mine = -INFINITY;
  for_each_in_chunk(row, vocab, chunk_len, vec_ok, [&](int, float x, bool valid) {
    if (valid) mine = fmaxf(mine, value(x));  // fmaxf drops NaN
  });
  __syncthreads();
  sh.thread_max[threadIdx.x] = mine;
  if (threadIdx.x == 0) sh.bound = -INFINITY;
  __syncthreads();
  int greater = 0, at_least = 0;
  for (int t = 0; t < kRowThreads; ++t) {
    const float o = sh.thread_max[t];
    greater += o > mine;
    at_least += o >= mine;
  }
  if (greater < k && at_least >= k) sh.bound = mine;  // every writer writes the same value
  __syncthreads();
  return sh.bound;
}

// The highest level whose probability mass (weight(p) summed over p >= level, p = prob(x))
// reaches need; 0 if none does. One pass: an element at or above the lowest level (at most 2^9 of
// them: their p sum to at most 1) adds its weight to its level's band with one shared atomic, the
// rest (most of any row) only compare.
template <typename T, typename ProbFn, typename WeightFn>
__device__ float top_p_bound(const T* row, int vocab, int chunk_len, bool vec_ok, ProbFn prob, WeightFn weight,
                             unsigned long long need, CandScratch& sh) {
  const float lowest = mass_level(kMassLevels - 1);
  __syncthreads();  // the scratch may still be read by a previous search
  if (threadIdx.x < kMassLevels) sh.level_mass[threadIdx.x] = 0;
  __syncthreads();
  for_each_in_chunk(row, vocab, chunk_len, vec_ok, [&](int, float x, bool valid) {
    const float v = valid ? prob(x) : 0.f;
    if (!(v >= lowest)) return;
    int band = 0;  // the highest level v reaches
    while (v < mass_level(band)) ++band;
    atomicAdd(&sh.level_mass[band], weight(v));
  });
  __syncthreads();
  unsigned long long at_or_above = 0;
  for (int l = 0; l < kMassLevels; ++l) {
    at_or_above += sh.level_mass[l];
    if (at_or_above >= need) return mass_level(l);
  }
  return 0.f;
}

// The threshold from the candidates at or above `bound`; false where they overflow the gather
// (then `found` and `key` are unset and sh.cand holds nothing usable).
template <typename T, typename ValueFn, typename WeightFn>
__device__ bool gathered_threshold(const T* row, int vocab, int chunk_len, bool vec_ok, ValueFn value, WeightFn weight,
                                   float bound, unsigned long long need, CandScratch& sh, bool& found,
                                   uint32_t& key) {
  gather_candidates(row, vocab, chunk_len, vec_ok, value, weight, bound, sh);
  if (sh.n > kCandCap) return false;
  found = search_candidates(value, weight, need, sh, key);
  return true;
}

// ---- the filtered sampling distribution (ops.py:sampling_probs_ref) ---------------------------

// p(x) = softmax(x / t) restricted to x / t >= kth (top-k), then to p >= tau (top-p), renormalised.
// kth = -inf and tau = 0 / inv_z2 = 1 when a filter is off. The hot loops multiply by reciprocals
// (x * (1/t), e * (1/z)) instead of dividing: IEEE divisions per element would make the pass
// compute-bound. Values are within an ulp of torch's; the filters use the same function as the
// sampling, so they stay consistent with each other.
struct DistStats {
  float inv_t, m, inv_z1, kth, tau, inv_z2;
};

__device__ __forceinline__ float prob_before_top_p(const DistStats& st, float x) {
  const float xs = x * st.inv_t;
  if (!(xs >= st.kth)) return 0.f;
  return __expf(xs - st.m) * st.inv_z1;
}

__device__ __forceinline__ float prob(const DistStats& st, float x) {
  const float p1 = prob_before_top_p(st, x);
  return p1 >= st.tau ? p1 * st.inv_z2 : 0.f;
}

constexpr double kMassOne = 281474976710656.0;  // 2^48: fixed-point unit of probability mass

struct DistScratch {
  union {  // never live together: a row takes the radix passes only where its candidates failed
    RadixScratch radix;
    CandScratch cand;
  };
  float fscratch[kRowWarps];
  double dscratch[kRowWarps];
  int iscratch[kRowWarps];
};

struct DistResult {
  DistStats st;
  double chunk_mass;  // sum of p over this thread's chunk
  int kept;           // elements of the whole row that survive the filters (block total)
};

// Statistics of the row's sampling distribution (multi-pass; one pass when no filter is on).
template <typename T>
__device__ DistResult row_distribution(const T* row, int vocab, int chunk_len, bool vec_ok, float t, int top_k,
                                       float top_p, bool radix_only, DistScratch& sh) {
  DistResult r;
  const float inv_t = __frcp_rn(t);
  r.st = DistStats{inv_t, 0.f, 1.f, -INFINITY, 0.f, 1.f};
  bool gathered = false;  // sh.cand holds every element of the row that can have p > 0
  if (top_k > 0 && top_k < vocab) {
    uint32_t key;
    bool found = false;
    const auto scaled = [inv_t](float x) { return x * inv_t; };
    const auto count = [](float v) { return isnan(v) ? 0ull : 1ull; };
    const auto need = static_cast<unsigned long long>(top_k);
    if (!radix_only && top_k <= kFastTopK) {
      const float bound = top_k_bound(row, vocab, chunk_len, vec_ok, scaled, top_k, sh.cand);
      if (bound > -INFINITY || vocab <= kCandCap)
        gathered = gathered_threshold(row, vocab, chunk_len, vec_ok, scaled, count, bound, need, sh.cand, found, key);
    }
    if (!gathered) found = radix_search<false>(row, vocab, chunk_len, vec_ok, scaled, count, need, sh.radix, key);
    if (found) r.st.kth = key_value(key);
  }
  // Online softmax over the chunk: running max and sum of exp relative to it. From the
  // candidates when they hold every kept element: one pass over the row fewer, the same bits.
  const float kth = r.st.kth;
  float m_t = -INFINITY, e_t = 0.f;
  int kept = 0;
  const auto softmax_step = [&](float x, bool valid) {
    const float xs = x * inv_t;
    if (!valid || !(xs >= kth)) return;
    ++kept;
    if (xs > m_t) {
      e_t = e_t * __expf(m_t - xs) + 1.f;
      m_t = xs;
    } else {
      e_t += __expf(xs - m_t);
    }
  };
  if (gathered)
    for_each_gathered_in_chunk(sh.cand, chunk_len, [&](float x) { softmax_step(x, true); });
  else
    for_each_in_chunk(row, vocab, chunk_len, vec_ok, [&](int, float x, bool valid) { softmax_step(x, valid); });
  r.st.m = block_max(m_t, sh.fscratch);
  const double e_scaled = m_t == -INFINITY ? 0.0 : static_cast<double>(e_t) * __expf(m_t - r.st.m);
  const double z1 = block_sum(e_scaled, sh.dscratch);
  r.st.inv_z1 = static_cast<float>(1.0 / z1);
  r.chunk_mass = e_scaled / z1;
  if (top_p < 1.f) {
    uint32_t key;
    const DistStats st = r.st;
    const auto p1 = [st](float x) { return prob_before_top_p(st, x); };
    const auto mass = [](float v) { return __double2ull_rn(static_cast<double>(v) * kMassOne); };
    const auto need = static_cast<unsigned long long>(fmax(1.0, ceil(static_cast<double>(top_p) * kMassOne)));
    bool found = false, done = false;
    if (gathered) {  // every element with p > 0 is a candidate of the top-k search
      found = search_candidates(p1, mass, need, sh.cand, key);
      done = true;
    } else if (!radix_only) {
      const float level = top_p_bound(row, vocab, chunk_len, vec_ok, p1, mass, need, sh.cand);
      if (level > 0.f) done = gathered_threshold(row, vocab, chunk_len, vec_ok, p1, mass, level, need, sh.cand, found, key);
    }
    // done: the candidates hold every element with p >= tau (top-k's: every one with p > 0;
    // the levels': every one at or above a level whose mass reaches top_p, so tau >= it).
    if (!done) found = radix_search<true>(row, vocab, chunk_len, vec_ok, p1, mass, need, sh.radix, key);
    if (found) r.st.tau = key_value(key);
    const float tau = r.st.tau;
    double kept_mass = 0.0;
    kept = 0;
    const auto kept_step = [&](float x, bool valid) {
      const float v = valid ? prob_before_top_p(st, x) : 0.f;
      if (v > 0.f && v >= tau) {
        kept_mass += v;
        ++kept;
      }
    };
    if (done)
      for_each_gathered_in_chunk(sh.cand, chunk_len, [&](float x) { kept_step(x, true); });
    else
      for_each_in_chunk(row, vocab, chunk_len, vec_ok, [&](int, float x, bool valid) { kept_step(x, valid); });
    const double z2 = block_sum(kept_mass, sh.dscratch);
    r.st.inv_z2 = static_cast<float>(1.0 / z2);
    r.chunk_mass = kept_mass / z2;
  }
  r.kept = block_sum(kept, sh.iscratch);
  return r;
}

// Inverse-CDF pick over n weights (ops.py:_sample_index): first index whose cumulative weight
// exceeds u * total, never a zero-weight index. Serial: for the K candidates of one position.
__device__ inline int sample_index(const float* w, int n, float u) {
  double total = 0.0;
  for (int i = 0; i < n; ++i) total += w[i];
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int last_pos = -1;
  for (int i = 0; i < n; ++i) {
    if (w[i] <= 0.f) continue;
    cum += w[i];
    last_pos = i;
    if (cum > target) return i;
  }
  return last_pos < 0 ? 0 : last_pos;
}

}  // namespace gpu
}  // namespace dspine
