// Transition walk and block verify against naive references that follow the documented rules
// step by step (dspine_kernels.h, dspine_engine/ops.py).
//
// Decisions must match exactly, so the inputs keep them unambiguous: logits and transition
// tables are dyadic (float arithmetic on them is exact, ties are exact ties), and where a
// decision compares a uniform with a probability (sampling, acceptance) the reference moves a
// uniform that falls within kMargin of the boundary to the middle of its interval before the
// kernel runs. The distributions themselves are compared with a tolerance.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "test_util.h"

namespace dspine_test {
namespace {

constexpr double kMargin = 1e-4;

// Ids of the k best values, best first, ties to the lower id (a stable sort, then a cut).
std::vector<int64_t> top_k_ids(const float* row, int64_t vocab, int64_t k) {
  std::vector<int64_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  ids.resize(k);
  return ids;
}

int64_t argmax_first(const std::vector<double>& x) {
  return std::max_element(x.begin(), x.end()) - x.begin();  // max_element keeps the first maximum
}

int64_t argmax_first(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

// Inverse-CDF sample of p (any positive total) with uniform u; if u*total lies within kMargin of
// a CDF boundary, u is first moved to the middle of the chosen index's interval.
int64_t sample_unambiguous(const std::vector<double>& p, float& u) {
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  std::vector<double> cdf(p.size());
  std::partial_sum(p.begin(), p.end(), cdf.begin());
  const auto pick_for = [&](double target) {
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] > 0.0 && cdf[i] > target) return static_cast<int64_t>(i);
    return static_cast<int64_t>(p.size()) - 1;
  };
  int64_t pick = pick_for(u * total);
  const double lo = cdf[pick] - p[pick], hi = cdf[pick], target = u * total;
  if (target - lo < kMargin * total || hi - target < kMargin * total) {
    // Too close to a boundary; re-aim at the most probable index, mid-interval.
    pick = argmax_first(p);
    u = static_cast<float>((cdf[pick] - p[pick] / 2) / total);
  }
  return pick;
}

// ---- transition walk ------------------------------------------------------------------------

struct WalkCase {
  int64_t batch, positions, vocab, rank, top_k;
  bool tied_logits;  // coarse dyadic logits: many exact ties between candidates
};

struct WalkOutputs {
  std::vector<int64_t> tokens, cand_ids;
  std::vector<double> cand_probs;
};

WalkOutputs walk_naive(const WalkCase& c, const std::vector<float>& logits, const std::vector<float>& g,
                       const std::vector<float>& pred, const std::vector<float>& succ,
                       const std::vector<int64_t>& anchor, const std::vector<float>& temperature,
                       std::vector<float>& uniforms) {
  const int64_t K = c.top_k;
  WalkOutputs o{std::vector<int64_t>(c.batch * c.positions), std::vector<int64_t>(c.batch * c.positions * K),
                std::vector<double>(c.batch * c.positions * K)};
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t prev = anchor[b];
    for (int64_t j = 0; j < c.positions; ++j) {
      const int64_t row = b * c.positions + j;
      const auto cands = top_k_ids(&logits[row * c.vocab], c.vocab, K);
      std::vector<double> score(K);
      for (int64_t i = 0; i < K; ++i) {
        score[i] = logits[row * c.vocab + cands[i]];
        for (int64_t r = 0; r < c.rank; ++r)
          score[i] += static_cast<double>(pred[prev * c.rank + r]) * g[row * c.rank + r] * succ[cands[i] * c.rank + r];
      }
      std::vector<double> q(K, 0.0);
      int64_t pick;
      if (temperature[b] > 0.f) {
        const double top = *std::max_element(score.begin(), score.end());
        for (int64_t i = 0; i < K; ++i) q[i] = std::exp((score[i] - top) / temperature[b]);
        const double sum = std::accumulate(q.begin(), q.end(), 0.0);
        for (auto& x : q) x /= sum;
        pick = sample_unambiguous(q, uniforms[row]);
      } else {
        pick = argmax_first(score);
        q[pick] = 1.0;
      }
      std::copy(cands.begin(), cands.end(), o.cand_ids.begin() + row * K);
      std::copy(q.begin(), q.end(), o.cand_probs.begin() + row * K);
      prev = o.tokens[row] = cands[pick];
    }
  }
  return o;
}

void walk_case(const WalkCase& c, uint64_t seed) {
  Case scope(str("transition_walk batch=", c.batch, " positions=", c.positions, " vocab=", c.vocab, " rank=", c.rank,
                 " top_k=", c.top_k, " tied=", c.tied_logits, " seed=", seed));
  Rng rng(seed);
  const int64_t rows = c.batch * c.positions;
  std::vector<float> logits(rows * c.vocab), g(rows * c.rank), pred(c.vocab * c.rank), succ(c.vocab * c.rank);
  for (auto& x : logits) x = c.tied_logits ? rng.dyadic(2, 2) : rng.dyadic(8, 64);
  for (auto* table : {&g, &pred, &succ})
    for (auto& x : *table) x = rng.dyadic(2, 4);
  std::vector<int64_t> anchor(c.batch);
  std::vector<float> temperature(c.batch), uniforms(rows);
  const float temperatures[] = {0.f, 0.6f, 1.f, 1.7f};
  for (int64_t b = 0; b < c.batch; ++b) {
    anchor[b] = rng.integer(0, c.vocab - 1);
    temperature[b] = temperatures[b % 4];
  }
  for (auto& u : uniforms) u = rng.uniform();

  const auto want = walk_naive(c, logits, g, pred, succ, anchor, temperature, uniforms);  // may move uniforms
  std::vector<int64_t> tokens(rows, -7), cand_ids(rows * c.top_k, -7);
  auto cand_probs = poisoned(rows * c.top_k);
  const bool use_tables = c.rank > 0;
  if (!check_ok(dspine_cpu_transition_walk_f32(logits.data(), use_tables ? g.data() : nullptr,
                                               use_tables ? pred.data() : nullptr, use_tables ? succ.data() : nullptr,
                                               anchor.data(), temperature.data(), uniforms.data(), tokens.data(),
                                               cand_ids.data(), cand_probs.data(), c.batch, c.positions, c.vocab,
                                               c.rank, c.top_k),
                "transition_walk"))
    return;
  check_equal("cand_ids", cand_ids, want.cand_ids);
  check_equal("tokens", tokens, want.tokens);
  check_close("cand_probs", cand_probs, want.cand_probs, 1e-6, 1e-5);
}

// ---- block verify ---------------------------------------------------------------------------

// softmax(logits / T) with tie-inclusive top-k (keep x >= k-th largest), then tie-inclusive
// top-p (keep p >= the value at which the descending cumulative sum first reaches top_p).
std::vector<double> sampling_probs_naive(const float* row, int64_t vocab, float t, int32_t top_k, float top_p) {
  std::vector<double> x(vocab);
  for (int64_t i = 0; i < vocab; ++i) x[i] = static_cast<double>(row[i] / t);  // fp32 division, as specified
  if (top_k > 0 && top_k < vocab) {
    std::vector<double> sorted(x);
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double kth = sorted[top_k - 1];
    for (auto& v : x)
      if (v < kth) v = -INFINITY;
  }
  const double top = *std::max_element(x.begin(), x.end());
  std::vector<double> p(vocab);
  for (int64_t i = 0; i < vocab; ++i) p[i] = std::exp(x[i] - top);
  double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (auto& v : p) v /= sum;
  if (top_p < 1.f) {
    std::vector<double> sorted(p);
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    double cum = 0.0, tau = sorted.back();
    for (double v : sorted) {
      cum += v;
      if (cum >= top_p) {
        tau = v;
        break;
      }
    }
    for (auto& v : p)
      if (v < tau) v = 0.0;
    sum = std::accumulate(p.begin(), p.end(), 0.0);
    for (auto& v : p) v /= sum;
  }
  return p;
}

// True when top_p cuts the descending cumulative sum of some row within kMargin of a value.
bool top_p_is_ambiguous(const float* row, int64_t vocab, float t, int32_t top_k, float top_p) {
  if (top_p >= 1.f) return false;
  auto p = sampling_probs_naive(row, vocab, t, top_k, 1.f);
  std::sort(p.begin(), p.end(), std::greater<double>());
  double cum = 0.0;
  for (double v : p) {
    cum += v;
    if (std::fabs(cum - top_p) < kMargin) return true;
  }
  return false;
}

struct VerifyCase {
  int64_t batch, block, vocab, cand;
};

struct VerifyInputs {
  std::vector<float> logits, cand_probs, temperature, top_p, uniforms;
  std::vector<int64_t> draft_tokens, cand_ids;
  std::vector<int32_t> top_k, seq_lens;
};

struct VerifyOutputs {
  std::vector<int32_t> accept_len, new_seq_lens;
  std::vector<int64_t> out_tokens;
};

// Sequence b of the reference; may move uniforms off decision boundaries.
void verify_sequence_naive(const VerifyCase& c, VerifyInputs& in, int64_t b, VerifyOutputs& o) {
  const int64_t T = c.block, V = c.vocab, K = c.cand;
  const float t = in.temperature[b];
  float* u = &in.uniforms[b * T];
  int64_t accepted = 0, bonus = -1;
  for (int64_t j = 0; j < T; ++j) {
    const float* row = &in.logits[(b * T + j) * V];
    const bool has_draft = j < T - 1;
    if (t <= 0.f) {
      const int64_t target = argmax_first(row, V);
      if (has_draft && in.draft_tokens[b * (T - 1) + j] == target) {
        o.out_tokens[b * T + j] = target;
        ++accepted;
        continue;
      }
      bonus = target;
      break;
    }
    auto p = sampling_probs_naive(row, V, t, in.top_k[b], in.top_p[b]);
    if (has_draft) {
      const int64_t d = in.draft_tokens[b * (T - 1) + j];
      const int64_t* ids = &in.cand_ids[(b * (T - 1) + j) * K];
      const float* qs = &in.cand_probs[(b * (T - 1) + j) * K];
      double q_d = 0.0;
      for (int64_t i = 0; i < K; ++i) q_d += ids[i] == d ? qs[i] : 0.f;
      if (std::fabs(u[j] * q_d - p[d]) < kMargin) u[j] = std::fmod(u[j] + 0.5f, 1.f);  // off the boundary
      if (u[j] * q_d < p[d]) {
        o.out_tokens[b * T + j] = d;
        ++accepted;
        continue;
      }
      std::vector<double> residual(p);
      for (int64_t i = 0; i < K; ++i) residual[ids[i]] -= qs[i];
      double mass = 0.0;
      for (auto& v : residual) mass += (v = std::max(0.0, v));
      if (mass > 0.0) p = residual;
    }
    bonus = sample_unambiguous(p, u[T - 1]);
    break;
  }
  o.out_tokens[b * T + accepted] = bonus;
  o.accept_len[b] = static_cast<int32_t>(accepted);
  o.new_seq_lens[b] = in.seq_lens[b] + static_cast<int32_t>(accepted) + 1;
}

// Logits where drafts often agree with the target, so accept lengths cover 0 .. block-1.
VerifyInputs make_verify_inputs(const VerifyCase& c, Rng& rng) {
  const int64_t T = c.block, V = c.vocab, K = c.cand;
  VerifyInputs in;
  in.logits.resize(c.batch * T * V);
  for (auto& x : in.logits) x = rng.dyadic(3, 8);
  in.draft_tokens.resize(c.batch * (T - 1));
  in.cand_ids.resize(c.batch * (T - 1) * K);
  in.cand_probs.resize(c.batch * (T - 1) * K);
  const float temperatures[] = {0.f, 1.f, 0.5f, 2.f, 0.8f};
  const int32_t top_ks[] = {0, 1, 3, 0, static_cast<int32_t>(V)};
  const float top_ps[] = {1.f, 1.f, 0.9f, 0.5f, 0.95f};
  for (int64_t b = 0; b < c.batch; ++b) {
    in.temperature.push_back(temperatures[b % 5]);
    in.top_k.push_back(top_ks[(b / 2) % 5]);
    in.top_p.push_back(top_ps[(b / 3) % 5]);
    in.seq_lens.push_back(static_cast<int32_t>(rng.integer(0, 1000)));
    for (int64_t j = 0; j + 1 < T; ++j) {
      float* row = &in.logits[(b * T + j) * V];
      const int64_t row_id = b * (T - 1) + j;
      std::vector<int64_t> ids(V);
      std::iota(ids.begin(), ids.end(), 0);
      rng.shuffle(ids);
      int64_t* cands = &in.cand_ids[row_id * K];
      std::copy(ids.begin(), ids.begin() + K, cands);
      float sum = 0.f;
      for (int64_t i = 0; i < K; ++i) sum += (in.cand_probs[row_id * K + i] = rng.uniform(0.05f, 1.f));
      for (int64_t i = 0; i < K; ++i) in.cand_probs[row_id * K + i] /= sum;
      // Usually the draft is the first candidate and the target strongly agrees with it;
      // sometimes a random token, possibly outside the candidates (q(d) = 0).
      const bool agree = rng.coin(0.8);
      const int64_t d = agree ? cands[0] : rng.integer(0, V - 1);
      in.draft_tokens[row_id] = d;
      if (agree) row[d] = 6.f;
    }
  }
  in.uniforms.resize(c.batch * T);
  for (auto& u : in.uniforms) u = rng.uniform();
  // A top_p that lands on a cumulative sum would make the filter itself ambiguous.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < T; ++j)
      while (in.temperature[b] > 0.f && top_p_is_ambiguous(&in.logits[(b * T + j) * V], V, in.temperature[b],
                                                            in.top_k[b], in.top_p[b]))
        in.top_p[b] -= 0.01f;
  return in;
}

// Returns the reference accept lengths, so the caller can check the inputs cover them all.
std::vector<int32_t> verify_case(const VerifyCase& c, uint64_t seed) {
  Case scope(str("block_verify batch=", c.batch, " block=", c.block, " vocab=", c.vocab, " cand=", c.cand,
                 " seed=", seed));
  Rng rng(seed);
  VerifyInputs in = make_verify_inputs(c, rng);
  VerifyOutputs want{std::vector<int32_t>(c.batch), std::vector<int32_t>(c.batch),
                     std::vector<int64_t>(c.batch * c.block, -1)};
  for (int64_t b = 0; b < c.batch; ++b) verify_sequence_naive(c, in, b, want);

  VerifyOutputs got{std::vector<int32_t>(c.batch, -7), std::vector<int32_t>(c.batch, -7),
                    std::vector<int64_t>(c.batch * c.block, -7)};
  if (!check_ok(dspine_cpu_block_verify_f32(in.logits.data(), in.draft_tokens.data(), in.cand_ids.data(),
                                            in.cand_probs.data(), in.temperature.data(), in.top_k.data(),
                                            in.top_p.data(), in.uniforms.data(), in.seq_lens.data(),
                                            got.accept_len.data(), got.out_tokens.data(), got.new_seq_lens.data(),
                                            c.batch, c.block, c.vocab, c.cand),
                "block_verify"))
    return want.accept_len;
  check_equal("accept_len", got.accept_len, want.accept_len);
  check_equal("out_tokens", got.out_tokens, want.out_tokens);
  check_equal("new_seq_lens", got.new_seq_lens, want.new_seq_lens);
  return want.accept_len;
}

}  // namespace

void test_transition_walk() {
  uint64_t seed = 200;
  for (bool tied : {true, false}) {
    walk_case({4, 15, 50, 8, 8, tied}, ++seed);   // DSpine: transition tables on
    walk_case({4, 15, 50, 0, 8, tied}, ++seed);   // DFlash: scores are the logits alone
    walk_case({3, 1, 7, 3, 7, tied}, ++seed);     // K = vocab
    walk_case({5, 6, 33, 16, 1, tied}, ++seed);   // K = 1: the pick is forced
    walk_case({8, 9, 101, 5, 13, tied}, ++seed);  // odd sizes
  }
}

void test_block_verify() {
  uint64_t seed = 300;
  // Block 16, greedy and sampled rows: the inputs must produce every kind of outcome.
  std::vector<int> seen(16, 0);
  for (int64_t cand : {1, 8})  // point-mass drafts (K = 1), sparse draft distributions
    for (int32_t n : verify_case({10, 16, 64, cand}, ++seed)) ++seen[n];
  check(seen[0] > 0 && seen[15] > 0 && std::count(seen.begin(), seen.end(), 0) < 10,
        "block 16 cases cover rejection at the first draft, full acceptance and lengths between");
  verify_case({7, 1, 20, 4}, ++seed);    // no drafts: only the bonus token
  verify_case({9, 5, 37, 3}, ++seed);
  verify_case({20, 8, 11, 11}, ++seed);  // K = vocab
  for (int i = 0; i < 6; ++i) verify_case({15, 6, 23, 2}, ++seed);
}

}  // namespace dspine_test
