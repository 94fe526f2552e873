// Paged sliding-window attention with GQA (CUDA). Semantics: dspine_engine/ops.py:paged_attention.
//
// Main path (bf16/fp16, head_dim 64/128/256): FlashAttention-2 style on mma.sync m16n8k16.
// - A CTA (4 warps) owns one (sequence, kv head, tile of 64 rows), where row r of a sequence is
//   the pair (query r / group, head r % group): the query heads of one GQA group and the queries
//   of one block share the M dimension, so every K/V tile is read once per kv head for all of them
//   (decode: group rows; verify/draft blocks: 16 * group rows).
// - K/V tiles (64 keys, 32 for head_dim 256) stream through shared memory with cp.async, double
//   buffered. Page lookups happen per key row while loading; keys outside the CTA's visible range
//   are never read (zero-filled), so pages outside the window may be -1 in the block table.
// - S = Q K^T and O += P V run on tensor cores with fp32 accumulators; the softmax is online
//   (running max / sum per row, in the exp2 domain), P is re-packed from the S accumulators
//   straight into A fragments (no shared-memory round trip).
// - Split-KV (flash-decoding): when (sequences x kv heads x row tiles) cannot fill the GPU, grid.y
//   splits each key range; splits write unnormalised fp32 partials + (max, sum) and a second
//   kernel combines them. The split count is chosen on the host from shapes alone (no sync).
// Fallback (fp32, other head dims): one warp per (query, head), CUDA cores, no split.
#pragma once

#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "mma.cuh"

namespace dspine {
namespace gpu {

struct PagedAttentionParams {
  const void* q;
  const void* k_cache;
  const void* v_cache;
  void* out;
  const int32_t* block_tables;
  const int32_t* kv_lens;
  const int32_t* cu_q;
  float* partial_o;   // [splits, num_tokens, q_heads, head_dim] (split-KV only)
  float* partial_ml;  // [splits, num_tokens, q_heads, 2]: running max (log2 domain) and sum
  int64_t q_row_stride;  // elements between query tokens; heads and head_dim are contiguous
  int64_t num_tokens;    // query rows
  int64_t num_pages;
  int batch, q_heads, kv_heads, head_dim, page_size, max_pages, max_q_len;
  int window;  // <= 0: none; else query p sees key k only if p - k < window
  bool causal;
  float scale;
  int num_splits;
};

// Keys [lo, hi] visible to the query at position pos (empty when hi < lo).
struct KeyRange {
  int lo, hi;
};

__device__ __forceinline__ KeyRange visible_keys(int pos, int kv_len, bool causal, int window) {
  KeyRange r;
  r.hi = causal ? min(pos, kv_len - 1) : kv_len - 1;
  r.lo = window > 0 ? max(0, pos - window + 1) : 0;
  return r;
}

// log2(page_size) when it is a power of two (the usual case: a shift instead of a division per
// key row), else -1.
__device__ __forceinline__ int page_shift_of(int page_size) {
  return (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
}

// Element offset of key position kp of kv head kvh in the [pages, page_size, kv_heads, d] cache,
// or -1 when the block table has no valid page there (freed, or past the table / pool). The
// caller zero-fills such a key and never reads memory for it; inside a row's visible range that
// is a caller error (a table narrower than kv_len) the kernel cannot report without a host sync,
// and the zero key still gets softmax weight (issue 12: a wrong result, silent under memcheck).
__device__ __forceinline__ int64_t kv_offset(const int32_t* table, int kp, const PagedAttentionParams& p,
                                             int page_shift, int kvh, int d) {
  const int page_idx = page_shift >= 0 ? kp >> page_shift : kp / p.page_size;
  if (page_idx >= p.max_pages) return -1;
  const int page = table[page_idx];
  if (page < 0 || page >= p.num_pages) return -1;
  const int64_t slot = static_cast<int64_t>(page) * p.page_size + (kp - page_idx * p.page_size);
  return (slot * p.kv_heads + kvh) * d;
}

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel
// ---------------------------------------------------------------------------------------------

template <typename T, int D>
struct MmaTile {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockM = 16 * kWarps;         // rows (query, head) per CTA
  static constexpr int kBlockN = D >= 256 ? 32 : 64;  // keys per pipeline stage
  static constexpr int kPitch = D + 8;                // +16 bytes per smem row: conflict-free ldmatrix
  static constexpr int kChunks = D / 8;               // 16-byte chunks per row
  static constexpr bool kQInRegs = D <= 128;          // head_dim 256 re-reads Q from smem (registers)
  static constexpr size_t kSmemBytes = static_cast<size_t>(kBlockM + 4 * kBlockN) * kPitch * sizeof(T);
};

// Which rows and keys one CTA handles.
struct CtaWork {
  int b, kvh, group, q_begin, n, kv_len, first_pos, row0, rows_here, page_shift;
  int key_lo, key_hi;    // union of the rows' visible keys (what is loaded)
  int full_lo, full_hi;  // keys visible to every row (tiles inside need no mask)
  int tile_begin, tile_end;
};

template <int BLOCK_M, int BLOCK_N>
__device__ __forceinline__ CtaWork cta_work(const PagedAttentionParams& p) {
  CtaWork w;
  w.b = blockIdx.x / p.kv_heads;
  w.kvh = blockIdx.x % p.kv_heads;
  w.group = p.q_heads / p.kv_heads;
  w.q_begin = p.cu_q[w.b];
  w.n = p.cu_q[w.b + 1] - w.q_begin;
  w.kv_len = p.kv_lens[w.b];
  w.first_pos = w.kv_len - w.n;
  w.page_shift = page_shift_of(p.page_size);
  // Heaviest (latest, for causal) row tiles first: better balance of the triangular work.
  w.row0 = (gridDim.z - 1 - blockIdx.z) * BLOCK_M;
  w.rows_here = min(BLOCK_M, w.n * w.group - w.row0);
  w.tile_begin = w.tile_end = 0;
  if (w.rows_here <= 0) return w;
  const KeyRange first = visible_keys(w.first_pos + w.row0 / w.group, w.kv_len, p.causal, p.window);
  const KeyRange last =
      visible_keys(w.first_pos + (w.row0 + w.rows_here - 1) / w.group, w.kv_len, p.causal, p.window);
  w.key_lo = first.lo;
  w.key_hi = last.hi;
  w.full_lo = last.lo;
  w.full_hi = first.hi;
  const int tiles = w.key_hi >= w.key_lo ? w.key_hi / BLOCK_N - w.key_lo / BLOCK_N + 1 : 0;
  const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
  w.tile_begin = w.key_lo / BLOCK_N + static_cast<int>(blockIdx.y) * per_split;
  w.tile_end = min(w.key_lo / BLOCK_N + tiles, w.tile_begin + per_split);
  return w;
}

template <typename T, int D>
__device__ __forceinline__ void load_q_tile(T* sQ, const PagedAttentionParams& p, const CtaWork& w) {
  using C = MmaTile<T, D>;
  const T* q = static_cast<const T*>(p.q);
  for (int c = threadIdx.x; c < C::kBlockM * C::kChunks; c += C::kThreads) {
    const int r = c / C::kChunks, ch = c % C::kChunks;
    const bool valid = r < w.rows_here;
    const T* src = q;
    if (valid) {
      const int row = w.row0 + r;
      const int64_t token = w.q_begin + row / w.group;
      const int head = w.kvh * w.group + row % w.group;
      src = q + token * p.q_row_stride + static_cast<int64_t>(head) * D + ch * 8;
    }
    cp_async_16(sQ + r * C::kPitch + ch * 8, src, valid);
  }
}

template <typename T, int D>
__device__ __forceinline__ void load_kv_tile(T* sK, T* sV, const PagedAttentionParams& p, const CtaWork& w,
                                             int tile) {
  using C = MmaTile<T, D>;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.max_pages;
  for (int c = threadIdx.x; c < C::kBlockN * C::kChunks; c += C::kThreads) {
    const int r = c / C::kChunks, ch = c % C::kChunks;
    const int kp = tile * C::kBlockN + r;
    const int64_t off = (kp >= w.key_lo && kp <= w.key_hi) ? kv_offset(table, kp, p, w.page_shift, w.kvh, D) : -1;
    const bool valid = off >= 0;
    cp_async_16(sK + r * C::kPitch + ch * 8, valid ? kc + off + ch * 8 : kc, valid);
    cp_async_16(sV + r * C::kPitch + ch * 8, valid ? vc + off + ch * 8 : vc, valid);
  }
}

// A fragment of the warp's 16 Q rows for head-dim columns kk*16 .. kk*16+15.
template <typename T, int D>
__device__ __forceinline__ void load_q_frag(uint32_t (&a)[4], const T* sQ, int kk) {
  using C = MmaTile<T, D>;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int row = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
  ldmatrix_x4(a, sQ + row * C::kPitch + kk * 16 + (lane / 16) * 8);
}

// s = Q K^T for the warp's 16 rows and the tile's kBlockN keys.
template <typename T, int D>
__device__ __forceinline__ void warp_scores(float (&s)[MmaTile<T, D>::kBlockN / 8][4],
                                            const uint32_t (&qf)[MmaTile<T, D>::kQInRegs ? D / 16 : 1][4],
                                            const T* sQ, const T* sK) {
  using C = MmaTile<T, D>;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int nt = 0; nt < C::kBlockN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    if constexpr (C::kQInRegs) {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = qf[kk][i];
    } else {
      load_q_frag<T, D>(a, sQ, kk);
    }
#pragma unroll
    for (int nt2 = 0; nt2 < C::kBlockN / 16; ++nt2) {
      uint32_t b[4];  // b0,b1 of key tile 2*nt2, then of key tile 2*nt2+1
      const int key = nt2 * 16 + (lane % 8) + (lane / 16) * 8;
      ldmatrix_x4(b, sK + key * C::kPitch + kk * 16 + ((lane / 8) % 2) * 8);
      mma_16816<T>(s[2 * nt2], a, b[0], b[1]);
      mma_16816<T>(s[2 * nt2 + 1], a, b[2], b[3]);
    }
  }
}

// Online softmax over one tile: scales/masks s into the exp2 domain, rescales o and the running
// (max, sum) of the thread's two rows, and leaves P = exp2(s - max) in s.
template <int BN, int D>
__device__ __forceinline__ void softmax_update(float (&s)[BN / 8][4], float (&o)[D / 8][4], float (&m_run)[2],
                                               float (&l_run)[2], int k0, bool need_mask, KeyRange vis0,
                                               KeyRange vis1, float scale_log2) {
  const int quad = threadIdx.x % 4;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = s[nt][e] * scale_log2;
      if (need_mask) {
        const int kp = k0 + nt * 8 + quad * 2 + (e & 1);
        const KeyRange& vr = e < 2 ? vis0 : vis1;
        if (kp < vr.lo || kp > vr.hi) v = -INFINITY;
      }
      s[nt][e] = v;
      mx[e / 2] = fmaxf(mx[e / 2], v);
    }
  }
  float m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r]);
    m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
    const float corr = exp2f(m_run[r] - m_use[r]);
    m_run[r] = m_new;
    l_run[r] *= corr;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][2 * r] *= corr;
      o[dt][2 * r + 1] *= corr;
    }
  }
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = exp2f(s[nt][e] - m_use[e / 2]);
      l_run[e / 2] += s[nt][e];
    }
  }
}

// o += P V with P taken from the score accumulators.
template <typename T, int D>
__device__ __forceinline__ void warp_pv(float (&o)[D / 8][4], const float (&s)[MmaTile<T, D>::kBlockN / 8][4],
                                        const T* sV) {
  using C = MmaTile<T, D>;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int kk = 0; kk < C::kBlockN / 16; ++kk) {
    const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                           pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
#pragma unroll
    for (int dt2 = 0; dt2 < D / 16; ++dt2) {
      uint32_t b[4];  // b0,b1 of head-dim tile 2*dt2, then of 2*dt2+1
      ldmatrix_x4_trans(b, sV + key * C::kPitch + dt2 * 16 + (lane / 16) * 8);
      mma_16816<T>(o[2 * dt2], a, b[0], b[1]);
      mma_16816<T>(o[2 * dt2 + 1], a, b[2], b[3]);
    }
  }
}

// Writes the thread's two rows: normalised T output, or fp32 partials when the keys are split.
template <typename T, int D>
__device__ __forceinline__ void store_rows(const PagedAttentionParams& p, const CtaWork& w,
                                           const float (&o)[D / 8][4], const float (&m_run)[2],
                                           float (&l_run)[2]) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(kFullMask, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(kFullMask, l_run[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = warp * 16 + lane / 4 + 8 * r;
    if (local >= w.rows_here) continue;
    const int row = w.row0 + local;
    const int64_t token = w.q_begin + row / w.group;
    const int head = w.kvh * w.group + row % w.group;
    const int64_t row_index = token * p.q_heads + head;
    if (p.num_splits == 1) {
      const float inv = l_run[r] > 0.f ? 1.f / l_run[r] : 0.f;
      T* dst = static_cast<T*>(p.out) + row_index * D + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        *reinterpret_cast<uint32_t*>(dst + dt * 8) = pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    } else {
      const int64_t part = static_cast<int64_t>(blockIdx.y) * p.num_tokens * p.q_heads + row_index;
      float* dst = p.partial_o + part * D + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
      if (lane % 4 == 0) *reinterpret_cast<float2*>(p.partial_ml + part * 2) = make_float2(m_run[r], l_run[r]);
    }
  }
}

// grid: (batch * kv_heads, num_splits, row tiles); block: 128 threads; dynamic smem kSmemBytes.
template <typename T, int D>
__global__ void __launch_bounds__(MmaTile<T, D>::kThreads)
paged_attention_mma_kernel(const PagedAttentionParams p) {
  using C = MmaTile<T, D>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + C::kBlockM * C::kPitch;  // [2 stages][kBlockN][kPitch]
  T* sV = sK + 2 * C::kBlockN * C::kPitch;

  const CtaWork w = cta_work<C::kBlockM, C::kBlockN>(p);
  if (w.rows_here <= 0) return;  // uniform over the CTA
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const bool warp_active = warp * 16 < w.rows_here;  // a decode tile may fill only one warp
  const int row = w.row0 + warp * 16 + lane / 4;     // this thread's rows: row and row + 8
  const KeyRange vis0 = visible_keys(w.first_pos + row / w.group, w.kv_len, p.causal, p.window);
  const KeyRange vis1 = visible_keys(w.first_pos + (row + 8) / w.group, w.kv_len, p.causal, p.window);
  const float scale_log2 = p.scale * 1.4426950408889634f;

  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  uint32_t qf[C::kQInRegs ? D / 16 : 1][4];

  load_q_tile<T, D>(sQ, p, w);
  cp_async_commit();
  if (w.tile_begin < w.tile_end) {
    load_kv_tile<T, D>(sK, sV, p, w, w.tile_begin);
    cp_async_commit();
  }
  for (int t = w.tile_begin; t < w.tile_end; ++t) {
    const int stage = (t - w.tile_begin) & 1;
    if (t + 1 < w.tile_end) {  // prefetch the next tile into the other stage
      load_kv_tile<T, D>(sK + (stage ^ 1) * C::kBlockN * C::kPitch, sV + (stage ^ 1) * C::kBlockN * C::kPitch,
                         p, w, t + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (warp_active) {
      if constexpr (C::kQInRegs) {
        if (t == w.tile_begin) {
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) load_q_frag<T, D>(qf[kk], sQ, kk);
        }
      }
      const T* k_stage = sK + stage * C::kBlockN * C::kPitch;
      const T* v_stage = sV + stage * C::kBlockN * C::kPitch;
      float s[C::kBlockN / 8][4];
      warp_scores<T, D>(s, qf, sQ, k_stage);
      const int k0 = t * C::kBlockN;
      const bool need_mask = !(k0 >= w.full_lo && k0 + C::kBlockN - 1 <= w.full_hi);
      softmax_update<C::kBlockN, D>(s, o, m_run, l_run, k0, need_mask, vis0, vis1, scale_log2);
      warp_pv<T, D>(o, s, v_stage);
    }
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();  // the Q copy, when there was no tile at all
  if (warp_active) store_rows<T, D>(p, w, o, m_run, l_run);
}

// out[row] = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s; one warp per (token, head) row.
template <typename T>
__global__ void __launch_bounds__(256) combine_splits_kernel(const PagedAttentionParams p) {
  const int64_t rows = p.num_tokens * p.q_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int d = p.head_dim;
  float m_max = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) m_max = fmaxf(m_max, p.partial_ml[(s * rows + row) * 2]);
  T* dst = static_cast<T*>(p.out) + row * d;
  if (m_max == -INFINITY) {  // the query sees no key
    for (int x = lane; x < d; x += kWarpSize) dst[x] = from_float<T>(0.f);
    return;
  }
  float l_sum = 0.f;
  for (int s = 0; s < p.num_splits; ++s) {
    const float2 ml = *reinterpret_cast<const float2*>(p.partial_ml + (s * rows + row) * 2);
    l_sum += exp2f(ml.x - m_max) * ml.y;
  }
  const float inv = 1.f / l_sum;
  for (int x = lane; x < d; x += kWarpSize) {
    float acc = 0.f;
    for (int s = 0; s < p.num_splits; ++s)
      acc += exp2f(p.partial_ml[(s * rows + row) * 2] - m_max) * p.partial_o[(s * rows + row) * d + x];
    dst[x] = from_float<T>(acc * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA-core fallback: fp32 and head dims without a tensor-core instantiation
// ---------------------------------------------------------------------------------------------

// Sequence owning query row `token`: the last b with cu_q[b] <= token.
__device__ __forceinline__ int sequence_of(const int32_t* cu_q, int batch, int64_t token) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_q[mid] <= token) lo = mid; else hi = mid;
  }
  return lo;
}

constexpr int kSimtMaxHeadDim = 256;

template <typename T>
__global__ void __launch_bounds__(128) paged_attention_simt_kernel(const PagedAttentionParams p) {
  constexpr int kPerLane = kSimtMaxHeadDim / kWarpSize;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (w >= p.num_tokens * p.q_heads) return;
  const int64_t token = w / p.q_heads;
  const int head = static_cast<int>(w % p.q_heads);
  const int b = sequence_of(p.cu_q, p.batch, token);
  const int n = p.cu_q[b + 1] - p.cu_q[b];
  const int kv_len = p.kv_lens[b];
  const int pos = kv_len - n + static_cast<int>(token - p.cu_q[b]);
  const KeyRange vis = visible_keys(pos, kv_len, p.causal, p.window);
  const int d = p.head_dim;
  const int kvh = head / (p.q_heads / p.kv_heads);
  const T* q = static_cast<const T*>(p.q) + token * p.q_row_stride + static_cast<int64_t>(head) * d;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const int32_t* table = p.block_tables + static_cast<int64_t>(b) * p.max_pages;

  float qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int x = lane + e * kWarpSize;
    qv[e] = x < d ? to_float(q[x]) * p.scale : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int page_shift = page_shift_of(p.page_size);
  for (int kp = vis.lo; kp <= vis.hi; ++kp) {
    const int64_t off = kv_offset(table, kp, p, page_shift, kvh, d);
    if (off < 0) continue;  // uniform over the warp
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int x = lane + e * kWarpSize;
      if (x < d) dot += qv[e] * to_float(kc[off + x]);
    }
    dot = warp_sum(dot);
    const float m_new = fmaxf(m, dot);
    const float corr = expf(m - m_new), pr = expf(dot - m_new);
    l = l * corr + pr;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int x = lane + e * kWarpSize;
      if (x < d) acc[e] = acc[e] * corr + pr * to_float(vc[off + x]);
    }
    m = m_new;
  }
  T* dst = static_cast<T*>(p.out) + (token * p.q_heads + head) * d;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int x = lane + e * kWarpSize;
    if (x < d) dst[x] = from_float<T>(acc[e] * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: path choice, split heuristic, launch
// ---------------------------------------------------------------------------------------------

inline bool attention_uses_mma(bool half_precision, int head_dim) {
  return half_precision && (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

// Split count for the tensor-core path, from shapes alone (kv_lens live on the device).
inline int attention_num_splits(const PagedAttentionParams& p, int num_sms) {
  const int block_m = 64;
  const int block_n = p.head_dim >= 256 ? 32 : 64;
  const int ctas_per_sm = p.head_dim <= 64 ? 3 : 2;  // what registers and shared memory allow
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t rows = static_cast<int64_t>(p.max_q_len) * group;
  const int64_t work = static_cast<int64_t>(p.batch) * p.kv_heads * ceil_div(rows, block_m);
  const int64_t target = static_cast<int64_t>(num_sms) * ctas_per_sm;
  if (work <= 0 || work >= target) return 1;
  int64_t max_keys = static_cast<int64_t>(p.max_pages) * p.page_size;
  if (p.window > 0 && p.window + p.max_q_len < max_keys) max_keys = p.window + p.max_q_len;
  const int64_t max_tiles = ceil_div(max_keys, block_n) + 1;
  // Every split writes fp32 partials for its rows and the combine reads them back; reading at
  // least ~8 keys per row keeps that traffic a fraction of the K/V bytes.
  const int64_t rows_per_cta = rows < block_m ? rows : block_m;
  int64_t min_tiles = ceil_div(8 * rows_per_cta, block_n);
  if (min_tiles < 2) min_tiles = 2;
  int64_t splits = ceil_div(target, work);
  if (splits > max_tiles / min_tiles) splits = max_tiles / min_tiles;
  if (splits > 128) splits = 128;
  return splits < 1 ? 1 : static_cast<int>(splits);
}

// Workspace (floats) the split path needs; 0 when num_splits == 1.
inline int64_t attention_workspace_floats(const PagedAttentionParams& p) {
  if (p.num_splits <= 1) return 0;
  return static_cast<int64_t>(p.num_splits) * p.num_tokens * p.q_heads * (p.head_dim + 2);
}

// The workspace's one layout (every caller binds it here): the partial outputs
// [splits][tokens][q_heads][head_dim], then each partial row's (max, sum) pair.
inline void bind_attention_workspace(PagedAttentionParams& p, float* workspace) {
  p.partial_o = workspace;
  p.partial_ml = workspace + static_cast<int64_t>(p.num_splits) * p.num_tokens * p.q_heads * p.head_dim;
}

template <typename T, int D>
void launch_attention_mma(const PagedAttentionParams& p, cudaStream_t stream) {
  using C = MmaTile<T, D>;
  const int64_t row_tiles = ceil_div(static_cast<int64_t>(p.max_q_len) * (p.q_heads / p.kv_heads), C::kBlockM);
  const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(row_tiles));
  allow_max_dynamic_smem<paged_attention_mma_kernel<T, D>>();
  paged_attention_mma_kernel<T, D><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  if (p.num_splits > 1) {
    const int64_t rows = p.num_tokens * p.q_heads;
    combine_splits_kernel<T><<<static_cast<unsigned>(ceil_div(rows, 8)), 256, 0, stream>>>(p);
  }
}

template <typename T>
void launch_attention_simt(const PagedAttentionParams& p, cudaStream_t stream) {
  const int64_t warps = p.num_tokens * p.q_heads;
  paged_attention_simt_kernel<T><<<static_cast<unsigned>(ceil_div(warps, 4)), 128, 0, stream>>>(p);
}

// When num_splits > 1, bind_attention_workspace(p, w) must have given p a workspace w of
// attention_workspace_floats(p) floats.
template <typename T>
void launch_paged_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.batch == 0 || p.max_q_len <= 0) return;
  if constexpr (std::is_same<T, float>::value) {
    launch_attention_simt<T>(p, stream);
  } else {
    switch (p.head_dim) {
      case 64: launch_attention_mma<T, 64>(p, stream); break;
      case 128: launch_attention_mma<T, 128>(p, stream); break;
      case 256: launch_attention_mma<T, 256>(p, stream); break;
      default: launch_attention_simt<T>(p, stream); break;
    }
  }
}

}  // namespace gpu
}  // namespace dspine
