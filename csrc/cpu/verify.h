// Block verify with first-mismatch truncation (CPU). See dspine_engine/ops.py:block_verify.
#pragma once

#include <vector>

#include "sampling.h"

namespace dspine {
namespace cpu {

struct VerifyArgs {
  int64_t batch, block, vocab, cand;  // block = T (drafts + 1), cand = K
};

template <typename T>
void block_verify(const T* logits, const int64_t* draft_tokens, const int64_t* cand_ids,
                  const float* cand_probs, const float* temperature, const int32_t* top_k,
                  const float* top_p, const float* uniforms, int32_t* accept_len,
                  int64_t* out_tokens, const VerifyArgs& a) {
  const int64_t Tn = a.block, V = a.vocab, K = a.cand;
  parallel_for(a.batch, [&](int64_t b) {
    const float t = temperature[b];
    const float* u = uniforms + b * Tn;
    int64_t* out = out_tokens + b * Tn;
    for (int64_t j = 0; j < Tn; ++j) out[j] = -1;
    int64_t n = 0, bonus = 0;
    std::vector<float> p;
    for (int64_t j = 0; j < Tn; ++j) {
      const T* row = logits + (b * Tn + j) * V;
      const bool has_draft = j < Tn - 1;
      if (t <= 0.f) {
        const int64_t target = argmax_first(row, V);
        if (has_draft && draft_tokens[b * (Tn - 1) + j] == target) { out[j] = target; ++n; continue; }
        bonus = target;
        break;
      }
      sampling_probs(row, V, t, top_k[b], top_p[b], p);
      if (has_draft) {
        const int64_t d = draft_tokens[b * (Tn - 1) + j];
        const int64_t* ids = cand_ids + (b * (Tn - 1) + j) * K;
        const float* qs = cand_probs + (b * (Tn - 1) + j) * K;
        float q_d = 0.f;
        for (int64_t c = 0; c < K; ++c) if (ids[c] == d) q_d += qs[c];
        if (u[j] * q_d < p[d]) { out[j] = d; ++n; continue; }
        // Rejected: sample the residual max(0, p - q); p itself if the residual is empty.
        std::vector<float> resid(p);
        for (int64_t c = 0; c < K; ++c) resid[ids[c]] -= qs[c];
        double mass = 0.0;
        for (auto& x : resid) { x = std::max(0.f, x); mass += x; }
        if (mass > 0.0) p.swap(resid);
      }
      bonus = sample_index(p.data(), V, u[Tn - 1]);
      break;
    }
    out[n] = bonus;
    accept_len[b] = static_cast<int32_t>(n);
  });
}

}  // namespace cpu
}  // namespace dspine
