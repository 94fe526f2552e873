// Paged sliding-window attention with GQA on the CPU: one kernel for prefill (causal varlen),
// decode (1 query), verify (B causal queries) and draft (B bidirectional queries).
//
// Work item = (sequence, kv head, tile of up to kQTile queries). All query heads of the GQA group
// share one pass over the keys, so each K/V row is read once per tile. Keys are visited in
// chunks of kKChunk with an online softmax (running max and sum per query row).
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "common.h"

namespace dspine {
namespace cpu {

struct PagedAttentionArgs {
  int64_t batch, q_heads, kv_heads, head_dim, page_size, max_pages;
  int64_t q_tok_stride;  // elements between query rows (heads then head_dim are contiguous)
  bool causal;
  int64_t window;  // <= 0: none; else query p sees key k only if p - k < window
  float scale;
};

// One work item's buffers: queries, running output, max and sum per row, one chunk's scores,
// and the chunk's keys and values as fp32.
struct AttentionScratch {
  std::vector<float> qf, acc, m, l, s, kf, vf;
  std::vector<int64_t> pos;
  void size(int64_t rows, int64_t d, int64_t chunk) {
    qf.resize(rows * d);
    acc.assign(rows * d, 0.f);
    m.assign(rows, -std::numeric_limits<float>::infinity());
    l.assign(rows, 0.f);
    s.resize(rows * chunk);
    kf.resize(chunk * d);
    vf.resize(chunk * d);
    pos.resize(rows);
  }
};

template <typename T>
void paged_attention(const T* q, const T* k_cache, const T* v_cache, T* out,
                     const int32_t* block_tables, const int32_t* kv_lens, const int32_t* cu_q,
                     const PagedAttentionArgs& a) {
  constexpr int64_t kQTile = 16;
  constexpr int64_t kKChunk = 32;
  const int64_t group = a.q_heads / a.kv_heads;
  const int64_t d = a.head_dim;
  const int64_t slot_stride = a.kv_heads * d;

  // Enumerate work items up front so OpenMP can balance them.
  struct Item { int64_t b, kvh, i0, i1; };
  std::vector<Item> items;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t n = cu_q[b + 1] - cu_q[b];
    for (int64_t kvh = 0; kvh < a.kv_heads; ++kvh)
      for (int64_t i0 = 0; i0 < n; i0 += kQTile) items.push_back({b, kvh, i0, std::min(n, i0 + kQTile)});
  }

  // Decode over a short context is a few microseconds of work: run it on the calling thread,
  // because an OpenMP region there costs more than it saves, and its spinning helpers steal the
  // core from the quantised GEMVs around it on a shared machine (chunk_pool.h).
  int64_t visits = 0;
  for (int64_t b = 0; b < a.batch; ++b) visits += (cu_q[b + 1] - cu_q[b]) * int64_t{kv_lens[b]};
  const bool tiny = visits * a.q_heads * d < (int64_t{1} << 21);
  const auto body = [&](int64_t w) {
    const Item it = items[w];
    const int64_t n = cu_q[it.b + 1] - cu_q[it.b];
    const int64_t kv_len = kv_lens[it.b];
    const int64_t first_pos = kv_len - n;
    const int32_t* table = block_tables + it.b * a.max_pages;
    const int64_t rows = (it.i1 - it.i0) * group;  // row r = (query i0 + r / group, head r % group)

    // Per-thread scratch, grown once (a decode step runs thousands of these items), used through
    // plain pointers: each access to a thread_local in a shared library is a call.
    thread_local AttentionScratch tls;
    AttentionScratch& sc = tls;
    sc.size(rows, d, kKChunk);
    float *const qf = sc.qf.data(), *const acc = sc.acc.data(), *const m = sc.m.data(),
                 *const l = sc.l.data(), *const s = sc.s.data(),
                 *const kf = sc.kf.data(), *const vf = sc.vf.data();
    int64_t* const pos = sc.pos.data();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = it.i0 + r / group, h = it.kvh * group + r % group;
      pos[r] = first_pos + i;
      const T* src = q + (cu_q[it.b] + i) * a.q_tok_stride + h * d;
      for (int64_t x = 0; x < d; ++x) qf[r * d + x] = to_f(src[x]) * a.scale;
    }
    // Union of the visible key ranges of the tile's rows.
    const int64_t p_lo = first_pos + it.i0, p_hi = first_pos + it.i1 - 1;
    const int64_t k_lo = a.window > 0 ? std::max<int64_t>(0, p_lo - a.window + 1) : 0;
    const int64_t k_hi = a.causal ? p_hi : kv_len - 1;

    for (int64_t k0 = k_lo; k0 <= k_hi; k0 += kKChunk) {
      const int64_t nk = std::min(kKChunk, k_hi - k0 + 1);
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t kp = k0 + j;
        const int64_t slot = static_cast<int64_t>(table[kp / a.page_size]) * a.page_size + kp % a.page_size;
        const T* ks = k_cache + slot * slot_stride + it.kvh * d;
        const T* vs = v_cache + slot * slot_stride + it.kvh * d;
        for (int64_t x = 0; x < d; ++x) {
          kf[j * d + x] = to_f(ks[x]);
          vf[j * d + x] = to_f(vs[x]);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float* qr = &qf[r * d];
        float* sr = &s[r * kKChunk];
        float cmax = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t kp = k0 + j;
          const bool vis = (!a.causal || kp <= pos[r]) && (a.window <= 0 || pos[r] - kp < a.window);
          float dot = 0.f;
          if (vis) {
            const float* kr = &kf[j * d];
#pragma omp simd reduction(+ : dot)
            for (int64_t x = 0; x < d; ++x) dot += qr[x] * kr[x];
          }
          sr[j] = vis ? dot : -std::numeric_limits<float>::infinity();
          cmax = std::max(cmax, sr[j]);
        }
        if (cmax == -std::numeric_limits<float>::infinity()) continue;  // nothing visible here
        const float m_new = std::max(m[r], cmax);
        const float corr = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first visible chunk
        float* ar = &acc[r * d];
        if (corr != 1.f) {
          for (int64_t x = 0; x < d; ++x) ar[x] *= corr;
        }
        float lsum = l[r] * corr;
        for (int64_t j = 0; j < nk; ++j) {
          if (sr[j] == -std::numeric_limits<float>::infinity()) continue;
          const float p = std::exp(sr[j] - m_new);
          lsum += p;
          const float* vr = &vf[j * d];
#pragma omp simd
          for (int64_t x = 0; x < d; ++x) ar[x] += p * vr[x];
        }
        l[r] = lsum;
        m[r] = m_new;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = it.i0 + r / group, h = it.kvh * group + r % group;
      T* dst = out + ((cu_q[it.b] + i) * a.q_heads + h) * d;
      const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
      for (int64_t x = 0; x < d; ++x) dst[x] = from_f<T>(acc[r * d + x] * inv);
    }
  };
  if (tiny) {
    for (int64_t w = 0; w < static_cast<int64_t>(items.size()); ++w) body(w);
  } else {
    parallel_for(static_cast<int64_t>(items.size()), body);
  }
}

}  // namespace cpu
}  // namespace dspine
