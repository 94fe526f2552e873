// Paged sliding-window attention with GQA on the CPU: one kernel for prefill (causal varlen),
// decode (1 query), verify (B causal queries) and draft (B bidirectional queries).
//
// Tile = (sequence, kv head, tile of queries). All query heads of the GQA group share one pass
// over the keys, so each K/V chunk is loaded once per tile. A row's keys are cut into segments at
// absolute positions, each an online softmax (running max and sum per query row) from a fresh
// start, folded in order (attention_segments.h); a tile is one work item, or, when there are too
// few tiles for the threads (decode at batch 1), one item per segment. Within a segment keys are
// visited in chunks at absolute positions; one chunk is a step (attention_step.h: portable, or
// SIMD over the AVX-512 or AVX2 kernels of attention_avx512.h / attention_avx2.h, chosen at run
// time by isa.h). Queries and outputs have one element type, the cache its own: the same, or fp16
// under fp32 queries (the GGUF path's cache); a chunk's rows are widened to fp32 exactly as it is
// loaded, with F16C under the SIMD steps.
//
// A row's output depends only on the row: not on the query tile, the rows beside it, the thread
// split, whether its segments ran as separate items, or the chunk loads (attention_step.h says
// how). That is what makes a verify block's row equal the same row decoded alone (tests:
// test_block_rows_equal_decoding_them_one_by_one, test_long_rows_*).
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_avx2.h"
#include "attention_avx512.h"
#include "attention_segments.h"
#include "attention_step.h"
#include "common.h"
#include "isa.h"

namespace dspine {
namespace cpu {

struct PagedAttentionArgs {
  int64_t batch, q_heads, kv_heads, head_dim, page_size, max_pages;
  int64_t q_tok_stride;  // elements between query rows (heads then head_dim are contiguous)
  bool causal;
  int64_t window;  // <= 0: none; else query p sees key k only if p - k < window
  float scale;
};

// The first column of sequence b's table row (`table`, max_pages wide) that holds a key some
// query of the sequence sees but names no page of the cache (-1, or >= num_pages), or -1 when
// there is none. Visible keys run from the first query's window start to kv_len - 1; columns
// wholly below the window may be freed (-1). The kernel indexes the cache with these entries
// unchecked, so the bindings run this first (kv_len <= max_pages * page_size is checked before).
inline int64_t first_missing_page(const int32_t* table, int64_t n, int64_t kv_len, int64_t window,
                                  int64_t page_size, int64_t num_pages) {
  if (n <= 0) return -1;
  const int64_t first_pos = kv_len - n;
  const int64_t k_lo = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
  for (int64_t page = k_lo / page_size; page * page_size < kv_len; ++page)
    if (table[page] < 0 || table[page] >= num_pages) return page;
  return -1;
}

namespace attn {

// One work item's buffers: queries, a segment's running output, max, sum and rescaling per row,
// the rows' fold over segments (attention_segments.h; an unsplit tile's), one chunk's scores
// and visible lanes per row, each row's visible key range; the chunk's key and value rows (fp32
// copies when the cache is not fp32) and its keys transposed (AVX-512 step).
struct Scratch {
  std::vector<float> qf, acc, m, l, corr, s, kf, vf, kt, fold;
  std::vector<uint32_t> mask;
  std::vector<int64_t> lo, hi;
  const float* krow[kKeyChunk];
  const float* vrow[kKeyChunk];
  void size(int64_t rows, int64_t d) {
    qf.resize(rows * d);
    acc.resize(rows * d);
    m.resize(rows);
    l.resize(rows);
    corr.resize(rows);
    s.resize(rows * kKeyChunk);
    mask.resize(rows);
    lo.resize(rows);
    hi.resize(rows);
    kf.resize(kKeyChunk * d);
    vf.resize(kKeyChunk * d);
    kt.resize(d * kKeyChunk);
  }
};

// Query rows per work item: 16 share each chunk load; fewer where that leaves too few items for
// the threads (a batch-1 verify block is one item per kv head: 3 for 2 threads). Any tile gives
// every row the same result.
inline int64_t query_tile(const int32_t* cu_q, const PagedAttentionArgs& a, int threads) {
  int64_t tile = 16;
  for (; tile > 4; tile /= 2) {
    int64_t items = 0;
    for (int64_t b = 0; b < a.batch; ++b) items += a.kv_heads * ((cu_q[b + 1] - cu_q[b] + tile - 1) / tile);
    if (items >= 2 * threads) break;
  }
  return tile;
}

// Work is counted in query-by-key multiply-adds (rows x keys x head_dim). Below 2^16 of them
// (decode over ~100 keys of the default model: a microsecond or two) the kernel runs on the
// calling thread: an item that short does not pay for a helper's hand-off. Above it the helpers
// take items: within a step they are spinning between the GEMMs anyway (chunk_pool.h; perf of a
// 2-thread decode step: the helper idle ~45% of it, the attention ~13% of the caller's time).
// The bound was 2^21 until 2026-12-05; 2^16 decoded 1.04x / 1.02x faster (cpu_decode_ab.py,
// 2 threads, two A/Bs of 7 and 9 pairs, docs/BENCHMARKS.md). Any bound gives every row the same
// result.
constexpr int64_t kParallelWork = int64_t{1} << 16;

// A call with too few tiles for the threads (decode at batch 1) runs its long tiles' segments as
// separate items on the threads from 2^18 multiply-adds (SmolLM2-135M's 9 heads x 64 dims: 455
// keys). Measured at batch 1 on 2 threads with the cache warm (benchmarks/cpu_attention.py):
// 1024 keys 47 -> 27 us, 2048 keys 92 -> 52 us, 600 keys 30 -> 15 us; at 300 keys it saved
// 4 us or nothing, not worth a helper's wake on a loaded machine.
constexpr int64_t kSplitWork = int64_t{1} << 18;

enum class StepKind { kPortable, kAvx2, kAvx512 };

// The step this call runs: the widest SIMD kernels the CPU (and DSPINE_CPU_ISA) allows whose
// vectors divide head_dim. One process keeps one choice, so a row never meets two.
inline StepKind step_kind(int64_t d) {
  const Isa isa = active_isa();
#if defined(DSPINE_ATTENTION_AVX512)
  if (isa >= Isa::kAvx512Vnni && d % 16 == 0) return StepKind::kAvx512;
#endif
#if defined(DSPINE_ATTENTION_AVX2)
  if (isa >= Isa::kAvx2 && d % 8 == 0) return StepKind::kAvx2;
#endif
  (void)isa;
  (void)d;
  return StepKind::kPortable;
}

inline void run_step(StepKind kind, const KeyChunk& c, const Rows& rw, float* kt) {
  switch (kind) {
#if defined(DSPINE_ATTENTION_AVX512)
    case StepKind::kAvx512: return simd_step<avx512::Avx512>(c, rw, kt);
#endif
#if defined(DSPINE_ATTENTION_AVX2)
    case StepKind::kAvx2: return simd_step<avx2::Avx2>(c, rw, kt);
#endif
    default: return portable_step(c, rw);
  }
}

// dst[0, d) = a cache row in fp32: an fp16 row widened with F16C under a SIMD step (whose
// vectors divide d), any other element by element. Exact either way, so a row's result does not
// depend on which way its keys were widened.
template <typename C>
void widen_row(const C* src, int64_t d, StepKind kind, float* dst) {
  if constexpr (kIsFp16<C>) {
    const auto* bits = reinterpret_cast<const uint16_t*>(src);
#if defined(DSPINE_ATTENTION_AVX512)
    if (kind == StepKind::kAvx512) return widen_fp16(avx512::Avx512{}, bits, d, dst);
#endif
#if defined(DSPINE_ATTENTION_AVX2)
    if (kind == StepKind::kAvx2) return widen_fp16(avx2::Avx2{}, bits, d, dst);
#endif
    (void)bits;
  }
  (void)kind;
  for (int64_t x = 0; x < d; ++x) dst[x] = to_f(src[x]);
}

// Points the chunk's lanes [j0, j1) at their key and value rows of kv head kvh: the cache's own
// rows when it is fp32, else fp32 copies of them in the scratch.
template <typename C>
void load_chunk(const C* k_cache, const C* v_cache, const int32_t* table, int64_t kvh,
                const PagedAttentionArgs& a, StepKind kind, KeyChunk& c, Scratch& sc) {
  const int64_t d = a.head_dim, slot_stride = a.kv_heads * d;
  for (int j = c.j0; j < c.j1; ++j) {
    const int64_t kp = c.k0 + j;
    const int64_t slot = static_cast<int64_t>(table[kp / a.page_size]) * a.page_size + kp % a.page_size;
    const C* ks = k_cache + slot * slot_stride + kvh * d;
    const C* vs = v_cache + slot * slot_stride + kvh * d;
    if constexpr (std::is_same<C, float>::value) {
      sc.krow[j] = ks;
      sc.vrow[j] = vs;
    } else {
      float* kf = sc.kf.data() + j * d;
      float* vf = sc.vf.data() + j * d;
      widen_row(ks, d, kind, kf);
      widen_row(vs, d, kind, vf);
      sc.krow[j] = kf;
      sc.vrow[j] = vf;
    }
  }
  c.k = sc.krow;
  c.v = sc.vrow;
}

// The keys [lo, hi] the query at position pos sees.
inline void visible_keys(const PagedAttentionArgs& a, int64_t pos, int64_t kv_len, int64_t* lo,
                         int64_t* hi) {
  *lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  *hi = a.causal ? pos : kv_len - 1;
}

// A tile of query rows of one (sequence, kv head) and the segments its keys span. A split
// tile's segments are separate work items whose partials go to slots part + s * slot_floats
// (s counted from seg0), folded afterwards; an unsplit tile is one item that folds as it goes.
struct Tile {
  int64_t b, kvh, i0, i1, seg0, seg1;
  int64_t part;  // < 0: not split
};

// A split tile's slot of one segment: per row its max, sum, then all rows' outputs.
inline int64_t slot_floats(int64_t rows, int64_t d) { return rows * (d + 2); }

inline RowState slot_row(float* slot, int64_t rows, int64_t d, int64_t r) {
  return {slot + r, slot + rows + r, slot + 2 * rows + r * d};
}

// Whether long tiles' segments become items of their own: only where the call runs on several
// threads and has too few tiles to keep them busy. Any choice gives every row the same result.
inline bool split_segments(int64_t tiles, int64_t work, int threads) {
  return threads > 1 && tiles < 2 * threads && work >= kSplitWork;
}

// T: the queries' and outputs' element type; C: the cache's (T's, or fp16 under fp32 queries).
template <typename T, typename C>
class PagedAttention {
 public:
  PagedAttention(const T* q, const C* k_cache, const C* v_cache, T* out, const int32_t* block_tables,
                 const int32_t* kv_lens, const int32_t* cu_q, const PagedAttentionArgs& a)
      : q_(q), k_(k_cache), v_(v_cache), out_(out), tables_(block_tables), kv_lens_(kv_lens),
        cu_q_(cu_q), a_(a), group_(a.q_heads / a.kv_heads), d_(a.head_dim),
        kind_(step_kind(a.head_dim)) {}

  void run() {
    const int threads = max_threads();
    const bool split = plan(threads);
    if (items_.empty()) return;
    const int64_t n_items = static_cast<int64_t>(items_.size());
    const auto item = [&](int64_t w) { run_item(w); };
    if (split || work_ >= kParallelWork)
      parallel_for(n_items, item);
    else
      for (int64_t w = 0; w < n_items; ++w) item(w);
    for (const Tile& t : tiles_)
      if (t.part >= 0) fold_split_tile(t);
  }

 private:
  struct Item { int64_t tile, seg; };  // seg < 0: all of the tile's segments

  // Enumerates tiles and work items up front so the threads can balance them; returns whether
  // some tile was split into its segments.
  bool plan(int threads) {
    const int64_t tile = query_tile(cu_q_, a_, threads);
    for (int64_t b = 0; b < a_.batch; ++b) {
      const int64_t n = cu_q_[b + 1] - cu_q_[b], kv_len = kv_lens_[b];
      work_ += n * kv_len * a_.q_heads * d_;
      for (int64_t kvh = 0; kvh < a_.kv_heads; ++kvh)
        for (int64_t i0 = 0; i0 < n; i0 += tile) {
          const int64_t i1 = std::min(n, i0 + tile);
          int64_t lo, hi, unused;
          visible_keys(a_, kv_len - n + i0, kv_len, &lo, &unused);
          visible_keys(a_, kv_len - n + i1 - 1, kv_len, &unused, &hi);
          tiles_.push_back({b, kvh, i0, i1, first_segment(lo), end_segment(hi), -1});
        }
    }
    const bool split = split_segments(static_cast<int64_t>(tiles_.size()), work_, threads);
    int64_t part = 0;
    for (int64_t t = 0; t < static_cast<int64_t>(tiles_.size()); ++t) {
      Tile& tl = tiles_[t];
      if (!split || tl.seg1 - tl.seg0 < 2) {
        items_.push_back({t, -1});
        continue;
      }
      tl.part = part;
      part += (tl.seg1 - tl.seg0) * slot_floats(rows(tl), d_);
      for (int64_t s = tl.seg0; s < tl.seg1; ++s) items_.push_back({t, s});
    }
    parts_.resize(part);
    return part > 0;
  }

  // Row r of a tile: query i0 + r / group, head kvh * group + r % group.
  int64_t rows(const Tile& t) const { return (t.i1 - t.i0) * group_; }

  float* slot(const Tile& t, int64_t s) {
    return parts_.data() + t.part + (s - t.seg0) * slot_floats(rows(t), d_);
  }

  void run_item(int64_t w) {
    const Item it = items_[w];
    const Tile& t = tiles_[it.tile];
    // Per-thread scratch, grown once (a decode step runs thousands of these items), used through
    // plain pointers: each access to a thread_local in a shared library is a call.
    thread_local Scratch tls;
    Scratch& sc = tls;
    const int64_t n = rows(t);
    sc.size(n, d_);
    load_rows(t, sc);
    if (it.seg >= 0) {
      float* p = slot(t, it.seg);
      segment_pass(t, it.seg, sc, p, p + n, p + 2 * n);
      return;
    }
    sc.fold.assign(n * (d_ + 2), 0.f);
    float* f = sc.fold.data();
    for (int64_t s = t.seg0; s < t.seg1; ++s) {
      segment_pass(t, s, sc, sc.m.data(), sc.l.data(), sc.acc.data());
      for (int64_t r = 0; r < n; ++r) {
        const RowState seg{sc.m.data() + r, sc.l.data() + r, sc.acc.data() + r * d_};
        fold_segment(slot_row(f, n, d_, r), seg, d_);
      }
    }
    write_rows(t, f);
  }

  // Scaled fp32 queries and each row's visible keys.
  void load_rows(const Tile& t, Scratch& sc) const {
    const int64_t n = cu_q_[t.b + 1] - cu_q_[t.b], kv_len = kv_lens_[t.b];
    for (int64_t r = 0; r < rows(t); ++r) {
      const int64_t i = t.i0 + r / group_, h = t.kvh * group_ + r % group_;
      visible_keys(a_, kv_len - n + i, kv_len, &sc.lo[r], &sc.hi[r]);
      const T* src = q_ + (cu_q_[t.b] + i) * a_.q_tok_stride + h * d_;
      for (int64_t x = 0; x < d_; ++x) sc.qf[r * d_ + x] = to_f(src[x]) * a_.scale;
    }
  }

  // The rows' partials over segment s, from a fresh start, into m, l, acc.
  void segment_pass(const Tile& t, int64_t s, Scratch& sc, float* m, float* l, float* acc) const {
    const int64_t n = rows(t);
    std::fill(m, m + n, kNegInf);
    std::fill(l, l + n, 0.f);
    std::fill(acc, acc + n * d_, 0.f);
    const Rows rw{n, d_, sc.qf.data(), acc, m, l, sc.s.data(), sc.corr.data(), sc.mask.data()};
    const int32_t* table = tables_ + t.b * a_.max_pages;
    // Keys of the segment some row of the tile sees (rows are in position order).
    const int64_t k_lo = std::max(sc.lo[0], s * kSegmentKeys);
    const int64_t k_hi = std::min(sc.hi[n - 1], (s + 1) * kSegmentKeys - 1);
    for (int64_t k0 = k_lo / kKeyChunk * kKeyChunk; k0 <= k_hi; k0 += kKeyChunk) {
      KeyChunk c{k0, static_cast<int>(std::max<int64_t>(k_lo - k0, 0)),
                 static_cast<int>(std::min<int64_t>(k_hi - k0 + 1, kKeyChunk)), nullptr, nullptr};
      load_chunk(k_, v_, table, t.kvh, a_, kind_, c, sc);
      for (int64_t r = 0; r < n; ++r) sc.mask[r] = lane_mask(sc.lo[r], sc.hi[r], k0);
      run_step(kind_, c, rw, sc.kt.data());
    }
  }

  // A split tile's slots folded in segment order, as run_item folds an unsplit one.
  void fold_split_tile(const Tile& t) {
    const int64_t n = rows(t);
    std::vector<float> f(n * (d_ + 2), 0.f);
    for (int64_t s = t.seg0; s < t.seg1; ++s)
      for (int64_t r = 0; r < n; ++r)
        fold_segment(slot_row(f.data(), n, d_, r), slot_row(slot(t, s), n, d_, r), d_);
    write_rows(t, f.data());
  }

  // Outputs of the tile's rows from their folded results.
  void write_rows(const Tile& t, float* folded) const {
    for (int64_t r = 0; r < rows(t); ++r) {
      const RowState st = slot_row(folded, rows(t), d_, r);
      const int64_t i = t.i0 + r / group_, h = t.kvh * group_ + r % group_;
      T* dst = out_ + ((cu_q_[t.b] + i) * a_.q_heads + h) * d_;
      const float inv = *st.l > 0.f ? 1.f / *st.l : 0.f;
      for (int64_t x = 0; x < d_; ++x) dst[x] = from_f<T>(st.acc[x] * inv);
    }
  }

  const T* q_;
  const C *k_, *v_;
  T* out_;
  const int32_t *tables_, *kv_lens_, *cu_q_;
  const PagedAttentionArgs& a_;
  const int64_t group_, d_;
  const StepKind kind_;
  std::vector<Tile> tiles_;
  std::vector<Item> items_;
  std::vector<float> parts_;  // split tiles' segment partials
  int64_t work_ = 0;          // multiply-adds of the call
};

}  // namespace attn

// T: the queries' and outputs' element type; C: the cache's (T's, or fp16 under fp32 queries).
template <typename T, typename C>
void paged_attention(const T* q, const C* k_cache, const C* v_cache, T* out,
                     const int32_t* block_tables, const int32_t* kv_lens, const int32_t* cu_q,
                     const PagedAttentionArgs& a) {
  attn::PagedAttention<T, C>(q, k_cache, v_cache, out, block_tables, kv_lens, cu_q, a).run();
}

}  // namespace cpu
}  // namespace dspine
