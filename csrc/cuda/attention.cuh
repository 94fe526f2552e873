// Paged sliding-window attention with GQA (CUDA). Semantics: dspine_engine/ops.py:paged_attention.
//
// Main path (bf16/fp16, head_dim 64/128/256): FlashAttention-2 style on mma.sync m16n8k16.
// - A CTA (4 warps) owns one (sequence, kv head, tile of rows), where row r of a sequence is the
//   pair (query r / group, head r % group): the query heads of one GQA group and the queries of
//   one block share the M dimension, so every K/V tile is read once per kv head for all of them.
// - Two variants of one kernel. Row tiles (prefill, verify/draft blocks): 64 rows, warp w owns
//   rows 16w..16w+15 against every key. Key split (decode, and anything of <= 16 rows): one
//   16-row tile shared by the 4 warps, warp w owns keys 16w..16w+15 of every 64-key tile, and the
//   warps' (max, sum, O) are merged through shared memory at the end. A decode step has only
//   `group` real rows (4 for Qwen3-8B): as a row tile, one warp did all the CTA's math.
// - K/V tiles stream through a ring of shared-memory stages filled by cp.async (3 stages for the
//   key split at head_dim <= 128: two tiles in flight while one is computed). Page lookups happen
//   per key row while loading; keys outside the CTA's visible range are never read (zero-filled),
//   so pages outside the window may be -1 in the block table.
// - S = Q K^T and O += P V run on tensor cores with fp32 accumulators; the softmax is online
//   (running max / sum per row, in the exp2 domain), P is re-packed from the S accumulators
//   straight into A fragments (no shared-memory round trip).
// - Split-KV (flash-decoding): when (sequences x kv heads x row tiles) cannot fill the GPU, grid.y
//   splits each key range; splits write unnormalised fp32 partials + (max, sum), and the last
//   split of a row tile to finish (an arrival counter) combines them: no second kernel. The split
//   count is planned on the host (attention_splits.cuh), the ranges from the device kv_lens.
// Fallback (fp32, other head dims): one warp per (query, head), CUDA cores, no split.
#pragma once

#include <cmath>
#include <type_traits>

#include "attention_splits.cuh"
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
  int* arrivals;      // [batch * kv_heads * row tiles] split arrival counters, zeroed per launch
  int64_t q_row_stride;  // elements between query tokens; heads and head_dim are contiguous
  int64_t num_tokens;    // query rows
  int64_t num_pages;
  int batch, q_heads, kv_heads, head_dim, page_size, max_pages, max_q_len;
  int window;  // <= 0: none; else query p sees key k only if p - k < window
  bool causal;
  float scale;
  int num_splits;
  // Blocks of <= 16 rows on the row-tile variant too (DSPINE_ATTN_KEY_SPLIT=0): a diagnostic.
  // The key split sums a row's keys in four warp slices merged at the end, the row tiles in one
  // pass, so a decode row (key split) and the same row inside a verify block (row tiles) round
  // differently; with this set both run the row tiles (benchmarks/gpu_row_exactness.py).
  bool row_tiles_only;
  // Blocks of any number of rows on the key-split variant, 16 rows a CTA (the row-exact mode's
  // key-split form, DSPINE_ATTN_EXACT=2; plan_exact_segments): a row is then summed in the same
  // four warp slices whether it is decoded alone or sits in a verify block.
  bool key_split_any_rows;
  // Row-exact mode (DSPINE_ATTN_EXACT=1; plan_exact_segments): > 0, split y reads the absolute key
  // tiles [y * segment_tiles, (y + 1) * segment_tiles), so a row's keys fall into the same
  // splits, summed the same way, in every call (whatever the batch, the block or the graph).
  int segment_tiles;
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

// Tile shape of the two variants, shared by the kernel and the host (row tiles, workspace).
// The key split gives each warp 16 keys of a 64-key stage (16 is the k of the P V mma); row tiles
// at head_dim 256 stream 32 keys a stage so that two stages and Q fit twice on a Hopper SM.
constexpr int mma_block_m(bool key_split) { return key_split ? 16 : 64; }
constexpr int mma_block_n(bool key_split, int head_dim) { return key_split || head_dim < 256 ? 64 : 32; }

// Rows a loading thread copies as one run of consecutive keys, or 0 where the tile's threads
// cannot be laid out so (the loaders then look every row up by itself). A power of two, so that
// a run starting at a multiple of its length never straddles a power-of-two page at least as long.
constexpr int key_run_length(int block_n, int chunks, int threads) {
  return threads % chunks == 0 && (block_n * chunks) % threads == 0 &&
                 ((block_n * chunks / threads) & (block_n * chunks / threads - 1)) == 0
             ? block_n * chunks / threads
             : 0;
}

constexpr int log2_of(int n) { return n <= 1 ? 0 : 1 + log2_of(n / 2); }

template <typename T, int D, bool KEY_SPLIT>
struct MmaTile {
  using Elem = T;
  static constexpr int kD = D;
  static constexpr bool kKeySplit = KEY_SPLIT;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockM = mma_block_m(KEY_SPLIT);      // rows (query, head) per CTA
  static constexpr int kBlockN = mma_block_n(KEY_SPLIT, D);   // keys per pipeline stage
  static constexpr int kWarpN = KEY_SPLIT ? 16 : kBlockN;     // keys one warp multiplies per stage
  // Pipeline depth. The key split only streams, so it keeps two tiles in flight while it computes
  // a third where that still fits twice per Hopper SM (head_dim <= 128: 109 KB a CTA). Row tiles
  // keep two stages: their occupancy is register-bound and prefill is compute-bound.
  static constexpr int kStages = KEY_SPLIT && D <= 128 ? 3 : 2;
  static constexpr int kPitch = D + 8;         // +16 bytes per smem row: conflict-free ldmatrix
  static constexpr int kChunks = D / 8;        // 16-byte chunks per row
  static constexpr int kRunKeys = key_run_length(kBlockN, kChunks, kThreads);  // load_kv_tile
  static constexpr bool kQInRegs = D <= 128;   // head_dim 256 re-reads Q from smem (registers)
  static constexpr int kTileElems = kBlockN * kPitch;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kBlockM + 2 * kStages * kBlockN) * kPitch * sizeof(T);
  // The key split merges its warps' (O, max, sum) fragments through the idle K/V stages.
  static constexpr size_t kMergeBytes = static_cast<size_t>(kWarps - 1) * (D / 2 + 4) * kWarpSize * sizeof(float);
  static_assert(!KEY_SPLIT || kWarps * kWarpN == kBlockN, "the key split covers a stage with its warps");
  static_assert(kMergeBytes <= 2 * kStages * kBlockN * kPitch * sizeof(T), "merge scratch fits in the stages");

  // First row (inside the CTA's tile) and first key (inside a stage) of the calling warp.
  __device__ static int warp_row0() { return KEY_SPLIT ? 0 : static_cast<int>(threadIdx.x / kWarpSize) * 16; }
  __device__ static int warp_key0() { return KEY_SPLIT ? static_cast<int>(threadIdx.x / kWarpSize) * kWarpN : 0; }
};

// Which rows and keys one CTA handles.
struct CtaWork {
  int b, kvh, group, q_begin, n, kv_len, first_pos, row0, rows_here, page_shift;
  int key_lo, key_hi;    // union of the rows' visible keys (what is loaded)
  int full_lo, full_hi;  // keys visible to every row (tiles inside need no mask)
  int tile_begin, tile_end;
};

template <typename C>
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
  w.row0 = (gridDim.z - 1 - blockIdx.z) * C::kBlockM;
  w.rows_here = min(C::kBlockM, w.n * w.group - w.row0);
  w.tile_begin = w.tile_end = 0;
  if (w.rows_here <= 0) return w;
  const KeyRange first = visible_keys(w.first_pos + w.row0 / w.group, w.kv_len, p.causal, p.window);
  const KeyRange last =
      visible_keys(w.first_pos + (w.row0 + w.rows_here - 1) / w.group, w.kv_len, p.causal, p.window);
  w.key_lo = first.lo;
  w.key_hi = last.hi;
  w.full_lo = last.lo;
  w.full_hi = first.hi;
  const int tiles = w.key_hi >= w.key_lo ? w.key_hi / C::kBlockN - w.key_lo / C::kBlockN + 1 : 0;
  // The real context decides how many splits get keys: ceil(tiles / num_splits) each, so a grid
  // planned for a long context (a graph captured at the cache's width) runs few, full splits on
  // a short one; the others stay empty and only report (max -inf, sum 0).
  if (p.segment_tiles > 0) {  // row-exact mode: absolute segments, not shares of this tile's range
    const int segment = static_cast<int>(blockIdx.y) * p.segment_tiles;
    w.tile_begin = max(w.key_lo / C::kBlockN, segment);
    w.tile_end = min(w.key_lo / C::kBlockN + tiles, segment + p.segment_tiles);
    return w;
  }
  const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
  w.tile_begin = w.key_lo / C::kBlockN + static_cast<int>(blockIdx.y) * per_split;
  w.tile_end = min(w.key_lo / C::kBlockN + tiles, w.tile_begin + per_split);
  return w;
}

// One thread's two rows in the m16n8 accumulator layout (`row` and `row + 8` of its warp's 16):
// their visible keys, the log2 scale, and the online softmax's running max and sum. The mma.sync
// row tiles here and the wgmma ones (attention_sm90.cuh, whose O lives in wgmma's accumulators)
// start from it.
struct RowState {
  KeyRange vis0, vis1;
  float scale_log2;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  __device__ __forceinline__ RowState(const PagedAttentionParams& p, const CtaWork& w, int row)
      : vis0(visible_keys(w.first_pos + row / w.group, w.kv_len, p.causal, p.window)),
        vis1(visible_keys(w.first_pos + (row + 8) / w.group, w.kv_len, p.causal, p.window)),
        scale_log2(p.scale * 1.4426950408889634f) {}
};

// RowState with the rows' output accumulators, zeroed (the mma.sync kernels keep O in registers).
template <int D>
struct RowSoftmax : RowState {
  float o[D / 8][4];

  __device__ __forceinline__ RowSoftmax(const PagedAttentionParams& p, const CtaWork& w, int row)
      : RowState(p, w, row) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  }
};

// Issues the copies of a row tile's query rows (a (token, head) pair of the GQA group each) into
// shared memory: THREADS threads, thread tid copying 16-byte chunk tid % (D / 8) of rows
// tid / (D / 8), + THREADS / (D / 8), ...; dst(r, ch) is where chunk ch of row r goes, rows past
// the tile are zero-filled. A thread's (token, head) is stepped from row to row, not divided out
// again per copy: two divisions by the group a copy were ~500 instructions a warp of a verify
// block's prologue (H100 ncu, 27th session).
template <typename T, int D, int ROWS, int THREADS, class Dst>
__device__ __forceinline__ void load_q_rows(const PagedAttentionParams& p, const CtaWork& w, int tid, Dst&& dst) {
  constexpr int kChunks = D / 8;
  static_assert(THREADS % kChunks == 0 && ROWS % (THREADS / kChunks) == 0, "every thread copies whole rows' chunk");
  constexpr int kRowStep = THREADS / kChunks;
  const T* q = static_cast<const T*>(p.q);
  const int ch = tid % kChunks, r0 = tid / kChunks;
  int token = (w.row0 + r0) / w.group, head = (w.row0 + r0) % w.group;
  const int token_step = kRowStep / w.group, head_step = kRowStep % w.group;
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const int r = r0 + i * kRowStep;
    const bool valid = r < w.rows_here;
    const int64_t row_at = (w.q_begin + static_cast<int64_t>(token)) * p.q_row_stride +
                           static_cast<int64_t>(w.kvh * w.group + head) * D + ch * 8;
    cp_async_16(dst(r, ch), valid ? q + row_at : q, valid);
    token += token_step;
    head += head_step;
    if (head >= w.group) {
      head -= w.group;
      ++token;
    }
  }
}

template <typename C>
__device__ __forceinline__ void load_q_tile(typename C::Elem* sQ, const PagedAttentionParams& p, const CtaWork& w) {
  load_q_rows<typename C::Elem, C::kD, C::kBlockM, C::kThreads>(
      p, w, threadIdx.x, [&](int r, int ch) { return sQ + r * C::kPitch + ch * 8; });
}

// The cache offsets of kRun consecutive keys kp0 .. kp0 + kRun - 1 (kp0 a multiple of kRun) of
// one CTA's sequence and kv head. On pages holding a multiple of kRun keys (the engine's 16 hold
// 4, 8 or 16) they share one page, so one table read serves the whole run, for K and V alike:
// a table read is a dependent global load before any copy can start, and reading it per row
// left the loaders waiting on it (ncu: the sm90 producer stalled on L1TEX, its consumers idle).
// Other page sizes read the table per key. Keys outside the CTA's visible range are -1 and not
// looked up (their pages may be freed).
template <int kRun>
struct KeyRun {
  static_assert(kRun > 0 && (kRun & (kRun - 1)) == 0, "a run is a power of two of keys");
  int kp0;
  int64_t base;   // kp0's offset when one read serves the run; -1 if its page is not mapped
  bool one_page;

  __device__ __forceinline__ KeyRun(const int32_t* table, int first_key, const PagedAttentionParams& p,
                                    const CtaWork& w, int d)
      : kp0(first_key), base(-1), one_page(w.page_shift >= log2_of(kRun)) {
    if (one_page && kp0 <= w.key_hi && kp0 + kRun - 1 >= w.key_lo) base = kv_offset(table, kp0, p, w.page_shift, w.kvh, d);
  }

  // Offset of key kp0 + k, -1 where it is zero-filled instead.
  __device__ __forceinline__ int64_t offset(int k, const int32_t* table, const PagedAttentionParams& p,
                                            const CtaWork& w, int d) const {
    const int kp = kp0 + k;
    if (kp < w.key_lo || kp > w.key_hi) return -1;
    if (one_page) return base < 0 ? -1 : base + static_cast<int64_t>(k) * p.kv_heads * d;
    return kv_offset(table, kp, p, w.page_shift, w.kvh, d);
  }

  // emit(k, offset, whole) for k = 0 .. kRun - 1, offset as offset() gives it. whole is
  // std::true_type when every key of the run is visible and on one mapped page: the offsets are
  // then base + k * kv_heads * d and none is -1, so the caller's copies need no test. Why: the
  // per-key tests and 64-bit offsets were ~400 instructions a warp per 64-key tile of the mma.sync
  // kernel (H100 ncu, 27th session, a verify block at 1K keys: a third of its instructions), and
  // every tile but a range's first and last is whole.
  template <class Emit>
  __device__ __forceinline__ void visit(const int32_t* table, const PagedAttentionParams& p, const CtaWork& w,
                                        int d, Emit&& emit) const {
    if (base >= 0 && kp0 >= w.key_lo && kp0 + kRun - 1 <= w.key_hi) {
      const int64_t stride = static_cast<int64_t>(p.kv_heads) * d;
#pragma unroll
      for (int k = 0; k < kRun; ++k) emit(k, base + k * stride, std::true_type{});
    } else {
#pragma unroll
      for (int k = 0; k < kRun; ++k) emit(k, offset(k, table, p, w, d), std::false_type{});
    }
  }
};

// Copies 16 bytes of a cache at element offset `off` (-1: zero-fills instead), `whole` as
// KeyRun::visit passes it (std::true_type: off is known valid, no test).
template <typename T, class Whole>
__device__ __forceinline__ void copy_key_chunk(void* dst, const T* cache, int64_t off, Whole) {
  const bool valid = Whole::value || off >= 0;
  cp_async_16(dst, valid ? cache + off : cache, valid);
}

// Issues the copies of key tile `tile` into one stage: 2 * kBlockN * D / 8 16-byte copies over
// the CTA's threads, all in flight at once.
template <typename C>
__device__ __forceinline__ void load_kv_tile(typename C::Elem* sK, typename C::Elem* sV, const PagedAttentionParams& p,
                                             const CtaWork& w, int tile) {
  using T = typename C::Elem;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.b) * p.max_pages;
  auto copy_row = [&](int r, int ch, int64_t off, auto whole) {
    copy_key_chunk(sK + r * C::kPitch + ch * 8, kc + ch * 8, off, whole);
    copy_key_chunk(sV + r * C::kPitch + ch * 8, vc + ch * 8, off, whole);
  };
  if constexpr (C::kRunKeys > 0) {  // chunk ch of rows r0 .. r0 + kRunKeys - 1: one table read
    const int ch = threadIdx.x % C::kChunks, r0 = threadIdx.x / C::kChunks * C::kRunKeys;
    const KeyRun<C::kRunKeys> run(table, tile * C::kBlockN + r0, p, w, C::kD);
    run.visit(table, p, w, C::kD, [&](int k, int64_t off, auto whole) { copy_row(r0 + k, ch, off, whole); });
  } else {
    for (int c = threadIdx.x; c < C::kBlockN * C::kChunks; c += C::kThreads) {
      const int r = c / C::kChunks, kp = tile * C::kBlockN + r;
      copy_row(r, c % C::kChunks,
               kp >= w.key_lo && kp <= w.key_hi ? kv_offset(table, kp, p, w.page_shift, w.kvh, C::kD) : -1,
               std::false_type{});
    }
  }
}

// A fragment of the warp's 16 Q rows for head-dim columns kk*16 .. kk*16+15.
template <typename C>
__device__ __forceinline__ void load_q_frag(uint32_t (&a)[4], const typename C::Elem* sQ, int kk) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = C::warp_row0() + (lane % 8) + ((lane / 8) % 2) * 8;
  ldmatrix_x4(a, sQ + row * C::kPitch + kk * 16 + (lane / 16) * 8);
}

// s = Q K^T for the warp's 16 rows and its kWarpN keys (sK points at the warp's first key).
template <typename C>
__device__ __forceinline__ void warp_scores(float (&s)[C::kWarpN / 8][4],
                                            const uint32_t (&qf)[C::kQInRegs ? C::kD / 16 : 1][4],
                                            const typename C::Elem* sQ, const typename C::Elem* sK) {
  using T = typename C::Elem;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int nt = 0; nt < C::kWarpN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < C::kD / 16; ++kk) {
    uint32_t a[4];
    if constexpr (C::kQInRegs) {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = qf[kk][i];
    } else {
      load_q_frag<C>(a, sQ, kk);
    }
#pragma unroll
    for (int nt2 = 0; nt2 < C::kWarpN / 16; ++nt2) {
      uint32_t b[4];  // b0,b1 of key tile 2*nt2, then of key tile 2*nt2+1
      const int key = nt2 * 16 + (lane % 8) + (lane / 16) * 8;
      ldmatrix_x4(b, sK + key * C::kPitch + kk * 16 + ((lane / 8) % 2) * 8);
      mma_16816<T>(s[2 * nt2], a, b[0], b[1]);
      mma_16816<T>(s[2 * nt2 + 1], a, b[2], b[3]);
    }
  }
}

// Online softmax over one tile, scores side: scales/masks s into the exp2 domain, updates the
// running (max, sum) of the thread's two rows and leaves P = exp2(s - max) in s; corr[r] is the
// factor row r's output accumulator must take (rescale_rows). Apart from the rescale so that the
// Hopper kernel can run it while the previous tile's P V is still accumulating into O.
template <int BN>
__device__ __forceinline__ void softmax_scores(float (&s)[BN / 8][4], float (&m_run)[2], float (&l_run)[2],
                                               float (&corr)[2], int k0, bool need_mask, KeyRange vis0,
                                               KeyRange vis1, float scale_log2) {
  const int quad = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] *= scale_log2;
  }
  // The mask in a block of its own, taken or skipped once per tile (need_mask is the same in the
  // warp): inside the scaling loop the compiler predicated its tests on every element of every
  // tile (H100 ncu, 27th session: ~100 of a 64-key tile's ~700 instructions a warp).
  if (need_mask) {
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kp = k0 + nt * 8 + quad * 2 + (e & 1);
        const KeyRange& vr = e < 2 ? vis0 : vis1;
        if (kp < vr.lo || kp > vr.hi) s[nt][e] = -INFINITY;
      }
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
  }
  float m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r]);
    m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
    corr[r] = exp2f(m_run[r] - m_use[r]);
    m_run[r] = m_new;
    l_run[r] *= corr[r];
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

// The output side of the online softmax: row r of o (elements 2r, 2r + 1 of each group of 4)
// times corr[r].
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], const float (&corr)[2]) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] *= corr[e / 2];
  }
}

// Both sides at once (the mma.sync kernels, whose O is plain registers).
template <int BN, int D>
__device__ __forceinline__ void softmax_update(float (&s)[BN / 8][4], float (&o)[D / 8][4], float (&m_run)[2],
                                               float (&l_run)[2], int k0, bool need_mask, KeyRange vis0,
                                               KeyRange vis1, float scale_log2) {
  float corr[2];
  softmax_scores<BN>(s, m_run, l_run, corr, k0, need_mask, vis0, vis1, scale_log2);
  rescale_rows<D>(o, corr);
}

// o += P V with P taken from the score accumulators (sV points at the warp's first key).
template <typename C>
__device__ __forceinline__ void warp_pv(float (&o)[C::kD / 8][4], const float (&s)[C::kWarpN / 8][4],
                                        const typename C::Elem* sV) {
  using T = typename C::Elem;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int kk = 0; kk < C::kWarpN / 16; ++kk) {
    const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                           pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
#pragma unroll
    for (int dt2 = 0; dt2 < C::kD / 16; ++dt2) {
      uint32_t b[4];  // b0,b1 of head-dim tile 2*dt2, then of 2*dt2+1
      ldmatrix_x4_trans(b, sV + key * C::kPitch + dt2 * 16 + (lane / 16) * 8);
      mma_16816<T>(o[2 * dt2], a, b[0], b[1]);
      mma_16816<T>(o[2 * dt2 + 1], a, b[2], b[3]);
    }
  }
}

// Key split: warps 1..3 hand their (O, max, sum) fragments to warp 0 through shared memory and
// warp 0 rescales everything to the common max and adds. Every warp holds the same rows in the
// same fragment layout, so a thread reads exactly its own rows' and columns' values (the stride
// of 32 floats between a lane's values keeps the accesses conflict-free). Called by all threads.
template <int D>
__device__ __forceinline__ void merge_warps(float (&o)[D / 8][4], float (&m_run)[2], float (&l_run)[2],
                                            float* scratch) {
  constexpr int kVals = D / 2 + 4;  // o fragments, then m of both rows, then l of both rows
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (warp > 0) {
    float* dst = scratch + (warp - 1) * kVals * kWarpSize + lane;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[(dt * 4 + e) * kWarpSize] = o[dt][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      dst[(D / 2 + r) * kWarpSize] = m_run[r];
      dst[(D / 2 + 2 + r) * kWarpSize] = l_run[r];
    }
  }
  __syncthreads();
  if (warp != 0) return;
  for (int from = 0; from < 3; ++from) {
    const float* src = scratch + from * kVals * kWarpSize + lane;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_other = src[(D / 2 + r) * kWarpSize];
      const float m_new = fmaxf(m_run[r], m_other);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // neither saw a key: both weights 0
      const float mine = exp2f(m_run[r] - m_use), theirs = exp2f(m_other - m_use);
      m_run[r] = m_new;
      l_run[r] = l_run[r] * mine + src[(D / 2 + 2 + r) * kWarpSize] * theirs;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * r] = o[dt][2 * r] * mine + src[(dt * 4 + 2 * r) * kWarpSize] * theirs;
        o[dt][2 * r + 1] = o[dt][2 * r + 1] * mine + src[(dt * 4 + 2 * r + 1) * kWarpSize] * theirs;
      }
    }
  }
}

// Writes the thread's two rows: normalised T output, or fp32 partials when the keys are split
// (O only where the split saw a key: the combine skips rows whose max is -inf).
template <typename C>
__device__ __forceinline__ void store_rows(const PagedAttentionParams& p, const CtaWork& w,
                                           const float (&o)[C::kD / 8][4], const float (&m_run)[2],
                                           float (&l_run)[2]) {
  using T = typename C::Elem;
  constexpr int D = C::kD;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(kFullMask, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(kFullMask, l_run[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = C::warp_row0() + lane / 4 + 8 * r;
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
      if (m_run[r] != -INFINITY) {
        float* dst = p.partial_o + part * D + (lane % 4) * 2;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
      }
      if (lane % 4 == 0) *reinterpret_cast<float2*>(p.partial_ml + part * 2) = make_float2(m_run[r], l_run[r]);
    }
  }
}

// One warp combines one output row: out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s over the
// splits that saw a key of the row (m_s > -inf); zeros where none did. A lane per D/32 consecutive
// columns. The weights come first (a lane per split, shuffled out after), so no load of a split's
// O waits on another load: kUnroll splits' O are in flight at once instead of one split per
// memory latency (a 64-row tile of 32 splits read one split at a time took ~100 us). Partials
// written by other CTAs are read through L2 (__ldcg), never from this SM's L1. Empty splits wrote
// no O (garbage there): their weight is 0 and their loaded values are never used.
template <typename T, int D>
__device__ __forceinline__ void combine_row(const PagedAttentionParams& p, int64_t row_index) {
  constexpr int kPerLane = D / kWarpSize;
  constexpr int kSplitRegs = kMaxCombineSplits / kWarpSize;  // split s: lane s % 32, register s / 32
  constexpr int kUnroll = D >= 256 ? 4 : 8;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = p.num_tokens * p.q_heads;
  const float2* ml = reinterpret_cast<const float2*>(p.partial_ml);
  float weight[kSplitRegs], l_part[kSplitRegs], m_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kSplitRegs; ++j) {
    const int s = j * kWarpSize + lane;
    const float2 v = s < p.num_splits ? __ldcg(ml + s * rows + row_index) : make_float2(-INFINITY, 0.f);
    weight[j] = v.x;
    l_part[j] = v.y;
    m_max = fmaxf(m_max, v.x);
  }
  m_max = warp_max(m_max);
  float l_sum = 0.f;
#pragma unroll
  for (int j = 0; j < kSplitRegs; ++j) {
    weight[j] = weight[j] == -INFINITY ? 0.f : exp2f(weight[j] - m_max);
    l_sum += weight[j] * l_part[j];
  }
  l_sum = warp_sum(l_sum);
  // The splits with a weight lie in [lo, hi]: only those O rows are read. A graph's grid is
  // planned for its largest context, so most splits of a short one are empty, and reading them
  // all cost the combine a memory round trip per kUnroll of them. The same weights are added in
  // the same order: the result is bitwise the full loop's.
  int lo = kMaxCombineSplits, hi = -1;
#pragma unroll
  for (int j = 0; j < kSplitRegs; ++j) {
    const unsigned used = __ballot_sync(kFullMask, weight[j] != 0.f);
    if (used != 0u) {
      lo = min(lo, j * kWarpSize + __ffs(used) - 1);
      hi = j * kWarpSize + kWarpSize - 1 - __clz(used);
    }
  }
  float acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.f;
  const float* o_row = p.partial_o + row_index * D + lane * kPerLane;
#pragma unroll
  for (int j = 0; j < kSplitRegs; ++j) {
    if (j * kWarpSize > hi || j * kWarpSize + kWarpSize <= lo) continue;  // uniform over the warp
    // From lo rounded down to kUnroll (so s0 + u stays a lane of this register) up to hi.
    const int begin = max(lo - j * kWarpSize, 0) / kUnroll * kUnroll;
    const int end = min(hi - j * kWarpSize + 1, kWarpSize);
    for (int s0 = begin; s0 < end; s0 += kUnroll) {
      float vals[kUnroll][kPerLane];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int s = j * kWarpSize + s0 + u;
        const float* src = o_row + static_cast<int64_t>(s) * rows * D;
#pragma unroll
        for (int e = 0; e < kPerLane; e += 2) {
          const float2 v = s0 + u < end ? __ldcg(reinterpret_cast<const float2*>(src + e)) : make_float2(0.f, 0.f);
          vals[u][e] = v.x;
          vals[u][e + 1] = v.y;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float ws = __shfl_sync(kFullMask, weight[j], (s0 + u) % kWarpSize);
        if (ws != 0.f) {  // uniform over the warp
#pragma unroll
          for (int e = 0; e < kPerLane; ++e) acc[e] += ws * vals[u][e];
        }
      }
    }
  }
  const float inv = l_sum > 0.f ? 1.f / l_sum : 0.f;
  Pack<T, kPerLane> out;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) out.v[e] = from_float<T>(acc[e] * inv);
  *reinterpret_cast<Pack<T, kPerLane>*>(static_cast<T*>(p.out) + row_index * D + lane * kPerLane) = out;
}

// Run by the last split of a key-split tile (<= 16 rows) to arrive: its rows, a warp each.
template <typename C>
__device__ __forceinline__ void combine_tile(const PagedAttentionParams& p, const CtaWork& w) {
  const int warp = threadIdx.x / kWarpSize;
  for (int local = warp; local < w.rows_here; local += C::kWarps) {
    const int row = w.row0 + local;
    const int64_t row_index = (w.q_begin + row / w.group) * p.q_heads + w.kvh * w.group + row % w.group;
    combine_row<typename C::Elem, C::kD>(p, row_index);
  }
}

// The row tiles' combine (verify blocks, prefill): its own launch, a warp per output row over the
// whole grid. A row tile holds up to 64 rows, so folding its splits in the last CTA to arrive
// would read up to 1 MB of partials through one SM while the others idle.
template <typename T, int D>
__global__ void __launch_bounds__(256) combine_splits_kernel(const PagedAttentionParams p) {
  join_chain();  // launch.cuh
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= p.num_tokens * p.q_heads) return;
  combine_row<T, D>(p, row);
}

// grid: (batch * kv_heads, num_splits, row tiles); block: 128 threads; dynamic smem kSmemBytes.
template <typename T, int D, bool KEY_SPLIT>
__global__ void __launch_bounds__(MmaTile<T, D, KEY_SPLIT>::kThreads)
paged_attention_mma_kernel(const PagedAttentionParams p) {
  join_chain();  // launch.cuh
  using C = MmaTile<T, D, KEY_SPLIT>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sKV = sQ + C::kBlockM * C::kPitch;  // kStages x (K tile, V tile)

  const CtaWork w = cta_work<C>(p);
  if (w.rows_here <= 0) return;  // uniform over the CTA, and over the row tile's splits
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const bool warp_active = C::warp_row0() < w.rows_here;  // a row tile may fill only one warp
  RowSoftmax<D> rs(p, w, w.row0 + C::warp_row0() + lane / 4);  // this thread's rows: that one and + 8
  uint32_t qf[C::kQInRegs ? D / 16 : 1][4];

  // Commit groups: Q, then one per tile (empty past the range), so that before computing tile i
  // exactly kStages - 2 younger groups may still be in flight.
  load_q_tile<C>(sQ, p, w);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (w.tile_begin + s < w.tile_end)
      load_kv_tile<C>(sKV + 2 * s * C::kTileElems, sKV + (2 * s + 1) * C::kTileElems, p, w, w.tile_begin + s);
    cp_async_commit();
  }
  for (int t = w.tile_begin; t < w.tile_end; ++t) {
    const int i = t - w.tile_begin;
    cp_async_wait<C::kStages - 2>();
    // Tile t has landed for every thread; every warp is done with tile t - 1, whose stage the
    // prefetch below refills.
    __syncthreads();
    const int next = t + C::kStages - 1;
    if (next < w.tile_end) {
      const int ns = (i + C::kStages - 1) % C::kStages;
      load_kv_tile<C>(sKV + 2 * ns * C::kTileElems, sKV + (2 * ns + 1) * C::kTileElems, p, w, next);
    }
    cp_async_commit();
    if (warp_active) {
      if constexpr (C::kQInRegs) {
        if (i == 0) {
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) load_q_frag<C>(qf[kk], sQ, kk);
        }
      }
      const int stage = i % C::kStages;
      const T* k_warp = sKV + 2 * stage * C::kTileElems + C::warp_key0() * C::kPitch;
      const T* v_warp = sKV + (2 * stage + 1) * C::kTileElems + C::warp_key0() * C::kPitch;
      float s[C::kWarpN / 8][4];
      warp_scores<C>(s, qf, sQ, k_warp);
      const int k0 = t * C::kBlockN + C::warp_key0();
      const bool need_mask = !(k0 >= w.full_lo && k0 + C::kWarpN - 1 <= w.full_hi);
      softmax_update<C::kWarpN, D>(s, rs.o, rs.m_run, rs.l_run, k0, need_mask, rs.vis0, rs.vis1, rs.scale_log2);
      warp_pv<C>(rs.o, s, v_warp);
    }
  }
  cp_async_wait<0>();  // the Q copy when there was no tile; the empty trailing groups
  if constexpr (KEY_SPLIT) {
    __syncthreads();  // every warp is done with the stages before they hold the merge
    merge_warps<D>(rs.o, rs.m_run, rs.l_run, reinterpret_cast<float*>(sKV));
    if (warp == 0) store_rows<C>(p, w, rs.o, rs.m_run, rs.l_run);
  } else if (warp_active) {
    store_rows<C>(p, w, rs.o, rs.m_run, rs.l_run);
  }
  if constexpr (KEY_SPLIT) {  // row tiles are combined by their own launch (combine_splits_kernel)
    if (p.num_splits > 1 && arrive_last(p.arrivals + blockIdx.x * gridDim.z + blockIdx.z, p.num_splits))
      combine_tile<C>(p, w);
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
  join_chain();  // launch.cuh
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
// Host side: path choice, split plan, workspace, launch
// ---------------------------------------------------------------------------------------------

inline bool attention_uses_mma(bool half_precision, int head_dim) {
  return half_precision && (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

// The key-split variant runs every call whose row tiles hold at most 16 rows (decode: the GQA
// group; a short block of a small group).
inline bool attention_key_split(const PagedAttentionParams& p) {
  return !p.row_tiles_only &&
         (p.key_split_any_rows || static_cast<int64_t>(p.max_q_len) * (p.q_heads / p.kv_heads) <= mma_block_m(true));
}

inline int64_t attention_row_tiles(const PagedAttentionParams& p) {
  return ceil_div(static_cast<int64_t>(p.max_q_len) * (p.q_heads / p.kv_heads), mma_block_m(attention_key_split(p)));
}

// Calls f(C{}) with C the MmaTile of the tensor-core variant that runs p (attention_uses_mma).
template <typename T, bool KEY_SPLIT, typename F>
void visit_mma_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64: f(MmaTile<T, 64, KEY_SPLIT>{}); break;
    case 128: f(MmaTile<T, 128, KEY_SPLIT>{}); break;
    default: f(MmaTile<T, 256, KEY_SPLIT>{}); break;
  }
}

template <typename T, typename F>
void visit_mma_tile(const PagedAttentionParams& p, F&& f) {
  if (attention_key_split(p))
    visit_mma_head_dim<T, true>(p.head_dim, f);
  else
    visit_mma_head_dim<T, false>(p.head_dim, f);
}

// CTAs of variant C one SM holds (registers and shared memory), as the CUDA runtime computes it.
// A host-side query, asked once per device (the split plan runs at every call).
template <typename C>
int mma_ctas_per_sm() {
  constexpr auto kernel = paged_attention_mma_kernel<typename C::Elem, C::kD, C::kKeySplit>;
  static std::atomic<int> cached[64];  // per device; 0 = not asked yet
  int dev = 0;
  cudaGetDevice(&dev);
  std::atomic<int>& slot = cached[dev & 63];
  int n = slot.load(std::memory_order_relaxed);
  if (n > 0) return n;
  allow_max_dynamic_smem<kernel>();
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, C::kThreads, C::kSmemBytes) != cudaSuccess || n < 1)
    n = 1;
  slot.store(n, std::memory_order_relaxed);
  return n;
}

// Row-exact mode (DSPINE_ATTN_EXACT=1). By default a decode row runs the key-split variant and a
// verify row the row tiles, each with a split count planned from the whole call, so the same row
// is summed in different orders (benchmarks/gpu_row_exactness.py: 0% of verify rows equal the
// decoded row on the H200). Here every call runs the row tiles, and blocks of up to
// kExactSegmentMaxQ tokens (decode, verify) are split at the absolute segment_keys-key
// segments of the context (as many as the call's bound on the context needs; each starts a fresh
// online softmax, and the combine folds them in order, skipping the empty ones exactly), so a
// generated row is computed one way whatever else the call holds: a verify row is bitwise the
// decoded row, and a sequence's rows do not depend on its batch or on a CUDA graph's bound.
// Longer blocks (prefill chunks) run unsplit: their rows are computed only there, the row tiles
// fill the GPU, and segment partials would cost num_tokens x segments x heads x (D + 2) floats
// (GBs for a 4K-token chunk of a large model at 32K). Which of the two a call takes follows its
// longest block, yet no row changes with it: a prompt is prefilled whole from position 0
// (scheduler.py: no chunk of a prompt starts past its first token), so a prompt of <= 16 tokens
// has <= 16 keys, one segment, whose fold is the unsplit result exactly (weight 2^0 = 1, its own
// sum; DECISIONS "What lossless means on a GPU"). Returns false, leaving p to the planner,
// where a block's bound needs more than kMaxCombineSplits segments (contexts past 64K keys at the
// default 256 keys a segment), and off the tensor cores (the CUDA-core kernel walks a row's keys
// in order in one warp: row-exact already). segment_keys (a power of two from 64 to 1024;
// DSPINE_ATTN_EXACT_SEGMENT, a measurement) trades a short context's latency (more CTAs of fewer
// tiles each) against the partials' traffic (a 64-row tile writes and reads back ~33 KB a
// segment beside 128 KB of K/V at 256 keys); every row of a process must use one value.
// key_split (DSPINE_ATTN_EXACT=2, a measurement): the blocks of up to kExactSegmentMaxQ tokens run
// the key-split variant instead, 16 rows a CTA, so a decode keeps the four warps the row tiles
// leave idle (3-4 real rows of an mma's 16) while a verify block of 48-64 rows reads each K/V
// tile once per 16 rows (3-4 CTAs, mostly from L2). Its one gap: a prompt of <= 16 tokens is then
// prefilled on the key split when the call's longest block is that short and on the row tiles
// beside a longer prompt, so its first token may depend on its batch (chat templates make
// prompts longer than 16 tokens).
constexpr int kExactSegmentKeys = 256;
constexpr int kExactSegmentMaxQ = 16;

inline bool valid_exact_segment_keys(int keys) {
  return keys >= 64 && keys <= 1024 && (keys & (keys - 1)) == 0;  // whole tiles of every variant
}

template <typename T>
bool plan_exact_segments(PagedAttentionParams& p, int64_t max_kv_len, bool key_split = false,
                         int segment_keys = kExactSegmentKeys) {
  if constexpr (std::is_same<T, float>::value) {
    return false;
  } else {
    if (!attention_uses_mma(true, p.head_dim)) return false;
    p.segment_tiles = 0;
    if (p.max_q_len > kExactSegmentMaxQ) {  // a prefill chunk: the row tiles, unsplit
      p.row_tiles_only = true;
      p.key_split_any_rows = false;
      p.num_splits = 1;
      return true;
    }
    const int64_t bound = max_kv_len > 0 ? max_kv_len : static_cast<int64_t>(p.max_pages) * p.page_size;
    const int64_t segments = (bound + segment_keys - 1) / segment_keys;
    if (segments > kMaxCombineSplits) return false;
    p.row_tiles_only = !key_split;  // before visit_mma_tile: these two pick the variant
    p.key_split_any_rows = key_split;
    p.num_splits = segments > 1 ? static_cast<int>(segments) : 1;
    visit_mma_tile<T>(p, [&](auto tile) { p.segment_tiles = segment_keys / decltype(tile)::kBlockN; });
    return true;
  }
}

// Sets p.num_splits (1 off the tensor-core path). max_kv_len: a host
// bound on every sequence's kv_len, e.g. the largest context of a graph's bucket; <= 0 when
// unknown, then the block table's width stands in. forced > 0 fixes the count (even ranges, as
// many non-empty splits as the keys allow: a testing and tuning aid).
template <typename T>
void plan_attention_splits(PagedAttentionParams& p, int num_sms, int64_t max_kv_len, int forced = 0) {
  p.num_splits = 1;
  if constexpr (!std::is_same<T, float>::value) {  // fp32 runs on CUDA cores, never split
    if (!attention_uses_mma(true, p.head_dim)) return;
    if (forced > 0) {
      p.num_splits = forced < kMaxSplits ? forced : kMaxSplits;  // the combine holds kMaxSplits weights
      return;
    }
    int64_t max_keys = max_kv_len > 0 ? max_kv_len : static_cast<int64_t>(p.max_pages) * p.page_size;
    if (p.window > 0 && p.window + static_cast<int64_t>(p.max_q_len) < max_keys) max_keys = p.window + p.max_q_len;
    visit_mma_tile<T>(p, [&](auto tile) {
      using C = decltype(tile);
      SplitInputs in;
      in.work = static_cast<int64_t>(p.batch) * p.kv_heads * attention_row_tiles(p);
      in.slots = static_cast<int64_t>(num_sms) * mma_ctas_per_sm<C>();
      in.max_keys = max_keys;
      in.block_n = C::kBlockN;
      p.num_splits = plan_splits(in);
    });
  }
}

// Workspace (floats) the split path needs; 0 when num_splits == 1.
inline int64_t attention_workspace_floats(const PagedAttentionParams& p) {
  if (p.num_splits <= 1) return 0;
  static_assert(sizeof(int) == sizeof(float), "arrival counters share the float workspace");
  const int64_t rows = p.num_tokens * p.q_heads;
  return static_cast<int64_t>(p.num_splits) * rows * (p.head_dim + 2) +
         static_cast<int64_t>(p.batch) * p.kv_heads * attention_row_tiles(p);
}

// The workspace's one layout (every caller binds it here): the partial outputs
// [splits][tokens][q_heads][head_dim], each partial row's (max, sum) pair, then one arrival
// counter per (sequence, kv head, row tile), which the launch zeroes (a memset node in a graph:
// the graphs share one memory pool, so counters left in a workspace would not survive to the next
// replay).
inline void bind_attention_workspace(PagedAttentionParams& p, float* workspace) {
  const int64_t partials = static_cast<int64_t>(p.num_splits) * p.num_tokens * p.q_heads;
  p.partial_o = workspace;
  p.partial_ml = workspace + partials * p.head_dim;
  p.arrivals = reinterpret_cast<int*>(p.partial_ml + partials * 2);
}

template <typename C>
void launch_attention_mma(const PagedAttentionParams& p, cudaStream_t stream) {
  constexpr auto kernel = paged_attention_mma_kernel<typename C::Elem, C::kD, C::kKeySplit>;
  const int64_t row_tiles = attention_row_tiles(p);
  const dim3 grid(static_cast<unsigned>(p.batch * p.kv_heads), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(row_tiles));
  if (C::kKeySplit && p.num_splits > 1)  // errors surface through cudaGetLastError, as a launch's do
    cudaMemsetAsync(p.arrivals, 0, static_cast<size_t>(p.batch) * p.kv_heads * row_tiles * sizeof(int), stream);
  allow_max_dynamic_smem<kernel>();
  launch_kernel(kernel, Launch(grid, C::kThreads, C::kSmemBytes, stream), p);
  if (!C::kKeySplit && p.num_splits > 1) {
    const int64_t rows = p.num_tokens * p.q_heads;
    launch_kernel(combine_splits_kernel<typename C::Elem, C::kD>, Launch(static_cast<unsigned>(ceil_div(rows, 8)), 256, 0, stream), p);
  }
}

template <typename T>
void launch_attention_simt(const PagedAttentionParams& p, cudaStream_t stream) {
  const int64_t warps = p.num_tokens * p.q_heads;
  launch_kernel(paged_attention_simt_kernel<T>, Launch(static_cast<unsigned>(ceil_div(warps, 4)), 128, 0, stream), p);
}

// plan_attention_splits<T> must have set p's split fields, and when num_splits > 1,
// bind_attention_workspace(p, w) must have given p a workspace w of attention_workspace_floats(p)
// floats.
template <typename T>
void launch_paged_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.batch == 0 || p.max_q_len <= 0) return;
  if constexpr (std::is_same<T, float>::value) {
    launch_attention_simt<T>(p, stream);
  } else {
    if (attention_uses_mma(true, p.head_dim))
      visit_mma_tile<T>(p, [&](auto tile) { launch_attention_mma<decltype(tile)>(p, stream); });
    else
      launch_attention_simt<T>(p, stream);
  }
}

}  // namespace gpu
}  // namespace dspine
