// Paged sliding-window attention with GQA on the CPU: one kernel for prefill (causal varlen),
// decode (1 query), verify (B causal queries) and draft (B bidirectional queries).
//
// Work item = (sequence, kv head, tile of queries). All query heads of the GQA group share one
// pass over the keys, so each K/V chunk is loaded once per item. Keys are visited in chunks at
// absolute positions with an online softmax (running max and sum per query row); one chunk is a
// step (attention_step.h: portable, or SIMD over the AVX-512 or AVX2 kernels of
// attention_avx512.h / attention_avx2.h, chosen at run time by isa.h).
//
// A row's output depends only on the row: not on the query tile, the rows beside it, the thread
// split or the chunk loads (attention_step.h says how). That is what makes a verify block's row
// equal the same row decoded alone (tests: test_block_rows_equal_decoding_them_one_by_one).
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_avx2.h"
#include "attention_avx512.h"
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

namespace attn {

// One work item's buffers: queries, running output, max, sum and rescaling per row, one
// chunk's scores and visible lanes per row, each row's visible key range; the chunk's key and
// value rows (fp32 copies when the cache is not fp32) and its keys transposed (AVX-512 step).
struct Scratch {
  std::vector<float> qf, acc, m, l, corr, s, kf, vf, kt;
  std::vector<uint32_t> mask;
  std::vector<int64_t> lo, hi;
  const float* krow[kKeyChunk];
  const float* vrow[kKeyChunk];
  void size(int64_t rows, int64_t d) {
    qf.resize(rows * d);
    acc.assign(rows * d, 0.f);
    m.assign(rows, kNegInf);
    l.assign(rows, 0.f);
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

// Points the chunk's lanes [j0, j1) at their key and value rows of kv head kvh.
template <typename T>
void load_chunk(const T* k_cache, const T* v_cache, const int32_t* table, int64_t kvh,
                const PagedAttentionArgs& a, KeyChunk& c, Scratch& sc) {
  const int64_t d = a.head_dim, slot_stride = a.kv_heads * d;
  for (int j = c.j0; j < c.j1; ++j) {
    const int64_t kp = c.k0 + j;
    const int64_t slot = static_cast<int64_t>(table[kp / a.page_size]) * a.page_size + kp % a.page_size;
    const T* ks = k_cache + slot * slot_stride + kvh * d;
    const T* vs = v_cache + slot * slot_stride + kvh * d;
    if constexpr (std::is_same<T, float>::value) {
      sc.krow[j] = ks;
      sc.vrow[j] = vs;
    } else {
      float* kf = sc.kf.data() + j * d;
      float* vf = sc.vf.data() + j * d;
      for (int64_t x = 0; x < d; ++x) {
        kf[x] = to_f(ks[x]);
        vf[x] = to_f(vs[x]);
      }
      sc.krow[j] = kf;
      sc.vrow[j] = vf;
    }
  }
  c.k = sc.krow;
  c.v = sc.vrow;
}

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

// Work is counted in query-by-key multiply-adds (rows x keys x head_dim). Below 2^21 of them
// (decode over a short context: a few microseconds) the kernel runs on the calling thread, as it
// did with a bound of its own: an item is too short to pay for waking a helper, which on a shared
// machine steals the core from the GEMVs around it (chunk_pool.h). parallel_for's bound
// (common.h, 2^16) counts elements of simple loops: 32 of these multiply-adds to one.
constexpr int64_t kMultiplyAddsPerWorkUnit = 32;

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

}  // namespace attn

template <typename T>
void paged_attention(const T* q, const T* k_cache, const T* v_cache, T* out,
                     const int32_t* block_tables, const int32_t* kv_lens, const int32_t* cu_q,
                     const PagedAttentionArgs& a) {
  using namespace attn;
  const int64_t group = a.q_heads / a.kv_heads;
  const int64_t d = a.head_dim;
  const StepKind kind = step_kind(d);

  // Enumerate work items up front so the threads can balance them.
  const int64_t tile = query_tile(cu_q, a, max_threads());
  struct Item { int64_t b, kvh, i0, i1; };
  std::vector<Item> items;
  int64_t work = 0;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t n = cu_q[b + 1] - cu_q[b];
    work += n * int64_t{kv_lens[b]} * a.q_heads * d;
    for (int64_t kvh = 0; kvh < a.kv_heads; ++kvh)
      for (int64_t i0 = 0; i0 < n; i0 += tile) items.push_back({b, kvh, i0, std::min(n, i0 + tile)});
  }
  if (items.empty()) return;

  const auto body = [&](int64_t w) {
    const Item it = items[w];
    const int64_t n = cu_q[it.b + 1] - cu_q[it.b];
    const int64_t kv_len = kv_lens[it.b];
    const int64_t first_pos = kv_len - n;
    const int32_t* table = block_tables + it.b * a.max_pages;
    const int64_t rows = (it.i1 - it.i0) * group;  // row r = (query i0 + r / group, head r % group)

    // Per-thread scratch, grown once (a decode step runs thousands of these items), used through
    // plain pointers: each access to a thread_local in a shared library is a call.
    thread_local Scratch tls;
    Scratch& sc = tls;
    sc.size(rows, d);
    int64_t *const lo = sc.lo.data(), *const hi = sc.hi.data();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = it.i0 + r / group, h = it.kvh * group + r % group;
      const int64_t pos = first_pos + i;
      lo[r] = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      hi[r] = a.causal ? pos : kv_len - 1;
      const T* src = q + (cu_q[it.b] + i) * a.q_tok_stride + h * d;
      for (int64_t x = 0; x < d; ++x) sc.qf[r * d + x] = to_f(src[x]) * a.scale;
    }
    const Rows rw{rows, d, sc.qf.data(), sc.acc.data(), sc.m.data(), sc.l.data(), sc.s.data(),
                  sc.corr.data(), sc.mask.data()};
    // Keys some row of the tile sees (rows are in position order).
    const int64_t k_lo = lo[0], k_hi = hi[rows - 1];
    for (int64_t k0 = k_lo / kKeyChunk * kKeyChunk; k0 <= k_hi; k0 += kKeyChunk) {
      KeyChunk c{k0, static_cast<int>(std::max<int64_t>(k_lo - k0, 0)),
                 static_cast<int>(std::min<int64_t>(k_hi - k0 + 1, kKeyChunk)), nullptr, nullptr};
      load_chunk(k_cache, v_cache, table, it.kvh, a, c, sc);
      for (int64_t r = 0; r < rows; ++r) sc.mask[r] = lane_mask(lo[r], hi[r], k0);
      run_step(kind, c, rw, sc.kt.data());
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = it.i0 + r / group, h = it.kvh * group + r % group;
      T* dst = out + ((cu_q[it.b] + i) * a.q_heads + h) * d;
      const float inv = rw.l[r] > 0.f ? 1.f / rw.l[r] : 0.f;
      for (int64_t x = 0; x < d; ++x) dst[x] = from_f<T>(rw.acc[r * d + x] * inv);
    }
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  parallel_for(n_items, work / n_items / kMultiplyAddsPerWorkUnit, body);
}

}  // namespace cpu
}  // namespace dspine
