// Inputs and step-by-step references of the transition walk and block verify (see reference.h).
//
// Decisions must match exactly, so the inputs keep them unambiguous: logits and transition
// tables are dyadic (float arithmetic on them is exact, ties are exact ties), and where a
// decision compares a uniform with a probability (sampling, acceptance) the reference moves a
// uniform that falls within kMargin of the boundary to the middle of its interval before the
// kernel runs. Distributions themselves are compared with a tolerance by the tests.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "reference.h"

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
}

}  // namespace

// ---- transition walk --------------------------------------------------------------------------

WalkInputs make_walk_inputs(const WalkCase& c, uint64_t seed) {
  Rng rng(seed);
  const int64_t rows = c.batch * c.positions;
  WalkInputs in;
  in.logits.resize(rows * c.vocab);
  in.g.resize(rows * c.rank);
  in.pred.resize(c.vocab * c.rank);
  in.succ.resize(c.vocab * c.rank);
  for (auto& x : in.logits) x = c.tied_logits ? rng.dyadic(2, 2) : rng.dyadic(8, 64);
  for (auto* table : {&in.g, &in.pred, &in.succ})
    for (auto& x : *table) x = rng.dyadic(2, 4);
  const float temperatures[] = {0.f, 0.6f, 1.f, 1.7f};
  for (int64_t b = 0; b < c.batch; ++b) {
    in.anchor.push_back(rng.integer(0, c.vocab - 1));
    in.temperature.push_back(temperatures[b % 4]);
  }
  in.uniforms.resize(rows);
  for (auto& u : in.uniforms) u = rng.uniform();
  return in;
}

WalkOutputs walk_naive(const WalkCase& c, WalkInputs& in) {
  const auto &logits = in.logits, &g = in.g, &pred = in.pred, &succ = in.succ, &temperature = in.temperature;
  auto& uniforms = in.uniforms;
  const int64_t K = c.top_k;
  WalkOutputs o{std::vector<int64_t>(c.batch * c.positions), std::vector<int64_t>(c.batch * c.positions * K),
                std::vector<double>(c.batch * c.positions * K)};
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t prev = in.anchor[b];
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

std::string WalkCase::describe() const {
  return str("transition_walk batch=", batch, " positions=", positions, " vocab=", vocab, " rank=", rank,
             " top_k=", top_k, " tied=", tied_logits);
}

std::vector<WalkCase> walk_cases() {
  std::vector<WalkCase> cases;
  for (bool tied : {true, false}) {
    cases.push_back({4, 15, 50, 8, 8, tied});    // DSpine: transition tables on
    cases.push_back({4, 15, 50, 0, 8, tied});    // DFlash: scores are the logits alone
    cases.push_back({3, 1, 7, 3, 7, tied});      // K = vocab
    cases.push_back({5, 6, 33, 16, 1, tied});    // K = 1: the pick is forced
    cases.push_back({8, 9, 101, 5, 13, tied});   // odd sizes
    cases.push_back({6, 15, 300, 32, 32, tied}); // the largest K the CUDA walk takes
  }
  return cases;
}

// ---- block verify -----------------------------------------------------------------------------

// Logits where drafts often agree with the target, so accept lengths cover 0 .. block-1.
VerifyInputs make_verify_inputs(const VerifyCase& c, uint64_t seed) {
  Rng rng(seed);
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

VerifyOutputs verify_naive(const VerifyCase& c, VerifyInputs& in) {
  VerifyOutputs want{std::vector<int32_t>(c.batch), std::vector<int64_t>(c.batch * c.block, -1)};
  for (int64_t b = 0; b < c.batch; ++b) verify_sequence_naive(c, in, b, want);
  return want;
}

std::string VerifyCase::describe() const {
  return str("block_verify batch=", batch, " block=", block, " vocab=", vocab, " cand=", cand);
}

std::vector<VerifyCase> verify_cases() {
  std::vector<VerifyCase> cases = {
      {10, 16, 64, 1},   // point-mass drafts (K = 1)
      {10, 16, 64, 8},   // sparse draft distributions
      {7, 1, 20, 4},     // no drafts: only the bonus token
      {9, 5, 37, 3},
      {20, 8, 11, 11},   // K = vocab
      {6, 16, 3000, 8},  // a vocabulary wider than one CUDA row chunk per thread
  };
  for (int i = 0; i < 6; ++i) cases.push_back({15, 6, 23, 2});
  return cases;
}

}  // namespace dspine_test
