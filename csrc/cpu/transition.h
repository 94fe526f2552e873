// Transition-cache scoring and the chain walk (CPU). See dspine_engine/ops.py:transition_walk.
#pragma once

#include <vector>

#include "sampling.h"

namespace dspine {
namespace cpu {

struct TransitionArgs {
  int64_t batch, positions, vocab, rank, top_k;  // positions = J = block - 1
  bool use_transition;
};

// logits [b, J, V]; g [b, J, r]; pred/succ [V, r] (of T, or bf16 beside fp32 logits: TT);
// anchor [b]; temperature [b]; uniforms [b, J].
template <typename T, typename TT = T>
void transition_walk(const T* logits, const T* g, const TT* pred, const TT* succ,
                     const int64_t* anchor, const float* temperature, const float* uniforms,
                     int64_t* tokens, int64_t* cand_ids, float* cand_probs,
                     const TransitionArgs& a) {
  const int64_t K = a.top_k, J = a.positions;
  std::vector<float> cand_vals(a.batch * J * K);
  // Candidates of every (sequence, position) in parallel: the expensive, order-free part.
  parallel_for(a.batch * J, [&](int64_t row) {
    topk_sorted(logits + row * a.vocab, a.vocab, K, cand_ids + row * K, &cand_vals[row * K]);
  });
  // The serial part: a walk over K scores per step.
  parallel_for(a.batch, [&](int64_t b) {
    int64_t prev = anchor[b];
    const float t = temperature[b];
    std::vector<float> s(K);
    for (int64_t j = 0; j < J; ++j) {
      const int64_t row = b * J + j;
      const int64_t* ids = cand_ids + row * K;
      for (int64_t c = 0; c < K; ++c) {
        float sc = cand_vals[row * K + c];
        if (a.use_transition) {
          const TT* pa = pred + prev * a.rank;
          const T* gj = g + row * a.rank;
          const TT* qb = succ + ids[c] * a.rank;
          float dot = 0.f;
          for (int64_t r = 0; r < a.rank; ++r) dot += to_f(pa[r]) * to_f(gj[r]) * to_f(qb[r]);
          sc += dot;
        }
        s[c] = sc;
      }
      float* q = cand_probs + row * K;
      int64_t pick;
      if (t > 0.f) {
        float mx = s[0];
        for (float x : s) mx = std::max(mx, x);
        double sum = 0.0;
        for (int64_t c = 0; c < K; ++c) { q[c] = std::exp((s[c] - mx) / t); sum += q[c]; }
        for (int64_t c = 0; c < K; ++c) q[c] = static_cast<float>(q[c] / sum);
        pick = sample_index(q, K, uniforms[row]);
      } else {
        pick = argmax_first(s.data(), K);
        for (int64_t c = 0; c < K; ++c) q[c] = c == pick ? 1.f : 0.f;
      }
      prev = ids[pick];
      tokens[row] = prev;
    }
  });
}

}  // namespace cpu
}  // namespace dspine
