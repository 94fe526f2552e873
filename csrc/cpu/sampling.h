// Sampling pieces shared by the transition walk and the block verifier (CPU):
// the filtered target distribution, inverse-CDF sampling and the sorted top-k.
#pragma once

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "common.h"

namespace dspine {
namespace cpu {

// Index of the first maximal value (matches torch.argmax).
template <typename T>
inline int64_t argmax_first(const T* x, int64_t n) {
  int64_t best = 0;
  float bv = to_f(x[0]);
  for (int64_t i = 1; i < n; ++i) {
    const float v = to_f(x[i]);
    if (v > bv || (std::isnan(v) && !std::isnan(bv))) { bv = v; best = i; }
  }
  return best;
}

// p = softmax(logits / t) with tie-inclusive top-k, then tie-inclusive top-p, renormalised.
template <typename T>
void sampling_probs(const T* logits, int64_t v, float t, int64_t top_k, float top_p,
                    std::vector<float>& p) {
  p.resize(v);
  for (int64_t i = 0; i < v; ++i) p[i] = to_f(logits[i]) / t;
  if (top_k > 0 && top_k < v) {
    std::vector<float> tmp(p);
    std::nth_element(tmp.begin(), tmp.begin() + (top_k - 1), tmp.end(), std::greater<float>());
    const float kth = tmp[top_k - 1];
    for (auto& x : p) if (x < kth) x = -std::numeric_limits<float>::infinity();
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : p) mx = std::max(mx, x);
  double sum = 0.0;
  for (auto& x : p) { x = std::exp(x - mx); sum += x; }
  const float inv = static_cast<float>(1.0 / sum);
  for (auto& x : p) x *= inv;
  if (top_p < 1.f) {
    std::vector<float> sorted;
    sorted.reserve(v);
    for (float x : p) if (x > 0.f) sorted.push_back(x);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    double cum = 0.0;
    float tau = sorted.back();
    for (float x : sorted) {
      cum += x;
      if (cum >= top_p) { tau = x; break; }
    }
    double kept = 0.0;
    for (auto& x : p) { if (x < tau) x = 0.f; kept += x; }
    const float kinv = static_cast<float>(1.0 / kept);
    for (auto& x : p) x *= kinv;
  }
}

// First index whose cumulative mass exceeds u * total (inverse CDF), never a zero-mass index.
inline int64_t sample_index(const float* p, int64_t n, float u) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += p[i];
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  int64_t last_pos = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] <= 0.f) continue;
    cum += p[i];
    last_pos = i;
    if (cum > target) return i;
  }
  return last_pos < 0 ? 0 : last_pos;
}

// The k best ids of x, highest score first, ties to the lower id: a total order on non-NaN
// scores, so any exact method gives the same ids. A NaN breaks that order; such a row keeps
// the sort's answer (topk_by_sort).
template <typename T>
void topk_by_sort(const T* x, int64_t v, int64_t k, int64_t* ids, float* vals) {
  std::vector<int64_t> idx(v);
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int64_t a, int64_t b) {
    const float xa = to_f(x[a]), xb = to_f(x[b]);
    return xa > xb || (xa == xb && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  for (int64_t i = 0; i < k; ++i) { ids[i] = idx[i]; vals[i] = to_f(x[idx[i]]); }
}

// One pass keeping the k best so far in ids/vals, in order: most scores lose to the k-th at
// one compare (the sort over an index array cost ~0.1 ms a 49K-token row, most of the draft's
// walk). Scanned in id order, an equal score never displaces an earlier id.
template <typename T>
void topk_sorted(const T* x, int64_t v, int64_t k, int64_t* ids, float* vals) {
  int64_t n = 0;
  for (int64_t i = 0; i < v; ++i) {
    const float xi = to_f(x[i]);
    if (n == k && xi <= vals[k - 1]) continue;
    if (std::isnan(xi)) return topk_by_sort(x, v, k, ids, vals);
    int64_t pos = n < k ? n++ : k - 1;
    for (; pos > 0 && vals[pos - 1] < xi; --pos) {
      vals[pos] = vals[pos - 1];
      ids[pos] = ids[pos - 1];
    }
    vals[pos] = xi;
    ids[pos] = i;
  }
}

}  // namespace cpu
}  // namespace dspine
