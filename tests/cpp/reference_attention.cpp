// Inputs and the full-matrix reference of paged attention (see reference.h).
#include <algorithm>
#include <cmath>

#include "reference.h"

namespace dspine_test {
namespace {

// First key position any query of the sequence may see.
int64_t first_visible_key(const AttentionCase& c, int64_t b) {
  const int64_t first_pos = c.kv_lens[b] - c.q_lens[b];
  return c.window > 0 ? std::max<int64_t>(0, first_pos - c.window + 1) : 0;
}

}  // namespace

std::string AttentionCase::describe() const {
  std::string seqs;
  for (size_t b = 0; b < q_lens.size(); ++b) seqs += str(b ? "," : "", q_lens[b], "/", kv_lens[b]);
  return str("paged_attention q/kv=[", seqs, "] heads=", q_heads, "/", kv_heads, " head_dim=", head_dim,
             " page_size=", page_size, " causal=", causal, " window=", window, " q_pad=", q_pad);
}

PagedInputs make_attention_inputs(const AttentionCase& c, Rng& rng) {
  PagedInputs in;
  const int64_t batch = static_cast<int64_t>(c.q_lens.size());
  const int64_t slot_size = c.kv_heads * c.head_dim;
  int64_t max_pages = 1, pages_needed = 0;
  for (int64_t len : c.kv_lens) {
    const int64_t pages = (len + c.page_size - 1) / c.page_size;
    max_pages = std::max(max_pages, pages + 1);  // one spare column, left -1
    pages_needed += pages;
  }
  // Page 0 is the NaN page; the rest are handed out in shuffled order.
  const int64_t num_pages = pages_needed + 1 + 2;
  std::vector<int32_t> free_pages;
  for (int64_t p = 1; p < num_pages; ++p) free_pages.push_back(static_cast<int32_t>(p));
  rng.shuffle(free_pages);

  in.k_cache = poisoned(num_pages * c.page_size * slot_size);
  in.v_cache = poisoned(in.k_cache.size());
  in.block_tables.assign(batch * max_pages, -1);
  size_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = c.kv_lens[b], k_lo = first_visible_key(c, b);
    for (int64_t page = 0; page * c.page_size < len; ++page) {
      const int32_t id = free_pages[next++];
      const bool outside_window = (page + 1) * c.page_size <= k_lo;
      in.block_tables[b * max_pages + page] = outside_window ? (rng.coin() ? -1 : 0) : id;
      for (int64_t off = 0; off < c.page_size && page * c.page_size + off < len; ++off)
        for (int64_t x = 0; x < slot_size; ++x) {
          const int64_t i = (static_cast<int64_t>(id) * c.page_size + off) * slot_size + x;
          in.k_cache[i] = rng.normal();
          in.v_cache[i] = rng.normal();
        }
    }
  }

  const int64_t row = c.q_heads * c.head_dim, stride = row + c.q_pad;
  in.cu_q.push_back(0);
  for (int64_t b = 0; b < batch; ++b) {
    in.cu_q.push_back(static_cast<int32_t>(in.cu_q.back() + c.q_lens[b]));
    in.kv_lens.push_back(static_cast<int32_t>(c.kv_lens[b]));
    in.max_q_len = std::max(in.max_q_len, c.q_lens[b]);
  }
  in.q.assign(in.cu_q.back() * stride, kNaN);
  for (int64_t t = 0; t < in.cu_q.back(); ++t)
    for (int64_t x = 0; x < row; ++x) in.q[t * stride + x] = rng.normal();

  in.args.batch = batch;
  in.args.q_heads = c.q_heads;
  in.args.kv_heads = c.kv_heads;
  in.args.head_dim = c.head_dim;
  in.args.q_token_stride = c.q_pad ? stride : 0;
  in.args.num_pages = num_pages;
  in.args.page_size = c.page_size;
  in.args.max_pages = max_pages;
  in.args.causal = c.causal;
  in.args.window = c.window;
  in.args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  return in;
}

std::vector<double> attention_naive(const AttentionCase& c, const PagedInputs& in) {
  const int64_t total_q = in.cu_q.back(), d = c.head_dim, group = c.q_heads / c.kv_heads;
  const int64_t q_stride = c.q_heads * d + c.q_pad, slot_size = c.kv_heads * d;
  std::vector<double> out(total_q * c.q_heads * d, 0.0);
  for (size_t b = 0; b < c.q_lens.size(); ++b) {
    const int64_t n = c.q_lens[b], kv_len = c.kv_lens[b], max_pages = in.args.max_pages;
    std::vector<char> mask(n * kv_len);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < kv_len; ++k) {
        const int64_t pos = kv_len - n + i;
        const bool causal_ok = !c.causal || k <= pos;
        const bool window_ok = c.window <= 0 || pos - k < c.window;
        mask[i * kv_len + k] = causal_ok && window_ok;
      }
    auto key_slot = [&](int64_t k) {
      return static_cast<int64_t>(in.block_tables[b * max_pages + k / c.page_size]) * c.page_size + k % c.page_size;
    };
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < c.q_heads; ++h) {
        const float* qv = &in.q[(in.cu_q[b] + i) * q_stride + h * d];
        const int64_t kvh = h / group;
        std::vector<double> score(kv_len, -INFINITY);
        double max_score = -INFINITY;
        for (int64_t k = 0; k < kv_len; ++k) {
          if (!mask[i * kv_len + k]) continue;
          const float* kv = &in.k_cache[key_slot(k) * slot_size + kvh * d];
          double dot = 0.0;
          for (int64_t x = 0; x < d; ++x) dot += static_cast<double>(qv[x]) * kv[x];
          score[k] = dot * in.args.scale;
          max_score = std::max(max_score, score[k]);
        }
        double denom = 0.0;
        std::vector<double> acc(d, 0.0);
        for (int64_t k = 0; k < kv_len; ++k) {
          if (!mask[i * kv_len + k]) continue;
          const double p = std::exp(score[k] - max_score);
          denom += p;
          const float* vv = &in.v_cache[key_slot(k) * slot_size + kvh * d];
          for (int64_t x = 0; x < d; ++x) acc[x] += p * vv[x];
        }
        double* o = &out[((in.cu_q[b] + i) * c.q_heads + h) * d];
        for (int64_t x = 0; x < d; ++x) o[x] = denom > 0.0 ? acc[x] / denom : 0.0;
      }
  }
  return out;
}

std::vector<AttentionCase> named_attention_cases() {
  std::vector<AttentionCase> cases;
  // decode: one query per sequence, GQA 4
  cases.push_back({{1, 1, 1, 1, 1}, {1, 17, 33, 64, 100}, 8, 2, 64, 16, true, 0});
  // causal prefill (varlen) plus a chunked prefill (queries after existing keys), odd head_dim
  cases.push_back({{1, 7, 40, 20}, {1, 7, 40, 50}, 6, 3, 40, 3, true, 0});
  // sliding window, MQA, queries spanning several query tiles and key chunks
  cases.push_back({{17, 9, 1}, {70, 9, 33}, 4, 1, 24, 4, true, 5});
  // verify: 16 causal queries after the cache, with and without a window
  for (int64_t window : {0, 20}) cases.push_back({{16, 16, 16}, {16, 50, 300}, 16, 4, 128, 16, true, window});
  // draft: 16 bidirectional queries; a window shorter than the block cuts inside it
  for (int64_t window : {0, 8, 40}) cases.push_back({{16, 16}, {16, 90}, 8, 2, 64, 5, false, window});
  // window 1: each query sees only itself (output = its own V row)
  for (bool causal : {true, false}) cases.push_back({{3, 5}, {3, 12}, 3, 3, 5, 1, causal, 1});
  // sequences without queries, padded query rows, page size 1
  cases.push_back({{0, 4, 0, 2}, {9, 4, 3, 30}, 4, 2, 16, 1, true, 0, 7});
  cases.push_back({{0, 4, 0, 2}, {9, 4, 3, 30}, 4, 2, 16, 1, false, 6, 3});
  // head_dim 256, a long bidirectional block over a long cache
  cases.push_back({{33}, {200}, 2, 1, 256, 32, false, 0});
  return cases;
}

// Random shapes: every combination of the knobs eventually meets.
std::vector<AttentionCase> random_attention_cases(int count, uint64_t seed) {
  std::vector<AttentionCase> cases;
  Rng pick(seed);
  const int64_t head_dims[] = {1, 3, 8, 24, 64, 80, 128};
  const int64_t page_sizes[] = {1, 2, 3, 7, 16};
  for (int i = 0; i < count; ++i) {
    AttentionCase c;
    const int64_t kv_heads = pick.integer(1, 3), group = pick.integer(1, 4);
    c.kv_heads = kv_heads;
    c.q_heads = kv_heads * group;
    c.head_dim = head_dims[pick.integer(0, 6)];
    c.page_size = page_sizes[pick.integer(0, 4)];
    c.causal = pick.coin();
    c.window = pick.coin() ? 0 : pick.integer(1, 40);
    c.q_pad = pick.coin(0.3) ? pick.integer(1, 9) : 0;
    const int64_t batch = pick.integer(1, 4);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t kv_len = pick.integer(1, 120);
      c.kv_lens.push_back(kv_len);
      c.q_lens.push_back(pick.integer(0, std::min<int64_t>(kv_len, 40)));
    }
    cases.push_back(c);
  }
  return cases;
}

}  // namespace dspine_test
