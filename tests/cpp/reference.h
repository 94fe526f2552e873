// Test inputs and naive references of the ops with the most logic (paged attention, transition
// walk, block verify), shared by the CPU tests and the CUDA tests.
#pragma once

#include "test_util.h"

namespace dspine_test {

// ---- paged attention ------------------------------------------------------------------------

struct AttentionCase {
  std::vector<int64_t> q_lens, kv_lens;  // per sequence: new query rows and keys
  int64_t q_heads, kv_heads, head_dim, page_size;
  bool causal;
  int64_t window;
  int64_t q_pad = 0;  // extra elements between query rows

  std::string describe() const;
};

struct PagedInputs {
  std::vector<float> q, k_cache, v_cache;
  std::vector<int32_t> block_tables, kv_lens, cu_q;
  dspine_attention_args args{};
  int64_t max_q_len = 0;
};

// A shuffled page layout (wrong page arithmetic shows) where everything the kernel must not use
// is NaN: cache slots past each sequence's length, the padding between query rows, and pages
// wholly outside the window (-1 in the block table, like freed pages, or a page full of NaN).
PagedInputs make_attention_inputs(const AttentionCase& c, Rng& rng);

// Full-matrix attention: the sequence's keys gathered in order, an explicit [queries, keys]
// mask built from the definition, softmax in double.
std::vector<double> attention_naive(const AttentionCase& c, const PagedInputs& in);

// Shapes the engine runs (decode, prefill, verify, draft, windows) and random ones.
std::vector<AttentionCase> named_attention_cases();
std::vector<AttentionCase> random_attention_cases(int count, uint64_t seed);

// ---- transition walk --------------------------------------------------------------------------

struct WalkCase {
  int64_t batch, positions, vocab, rank, top_k;
  bool tied_logits;  // coarse dyadic logits: many exact ties between candidates
  std::string describe() const;
};

struct WalkInputs {
  std::vector<float> logits, g, pred, succ, temperature, uniforms;
  std::vector<int64_t> anchor;
};

struct WalkOutputs {
  std::vector<int64_t> tokens, cand_ids;
  std::vector<double> cand_probs;
};

// Dyadic logits and tables (exact float arithmetic); temperatures cycle through greedy and
// sampled rows.
WalkInputs make_walk_inputs(const WalkCase& c, uint64_t seed);

// The documented walk, step by step. Moves a uniform that falls within rounding distance of a
// CDF boundary to the middle of its interval first, so any correct kernel makes the same picks.
WalkOutputs walk_naive(const WalkCase& c, WalkInputs& in);

std::vector<WalkCase> walk_cases();

// ---- block verify -----------------------------------------------------------------------------

struct VerifyCase {
  int64_t batch, block, vocab, cand;
  std::string describe() const;
};

struct VerifyInputs {
  std::vector<float> logits, cand_probs, temperature, top_p, uniforms;
  std::vector<int64_t> draft_tokens, cand_ids;
  std::vector<int32_t> top_k;
};

struct VerifyOutputs {
  std::vector<int32_t> accept_len;
  std::vector<int64_t> out_tokens;
};

// Drafts that usually agree with a peaked target (accept lengths cover 0 .. block-1), greedy and
// sampled rows with and without top-k / top-p; top_p is kept off the cumulative sums.
VerifyInputs make_verify_inputs(const VerifyCase& c, uint64_t seed);

// The documented verify rule, sequence by sequence; moves uniforms off decision boundaries.
VerifyOutputs verify_naive(const VerifyCase& c, VerifyInputs& in);

std::vector<VerifyCase> verify_cases();

}  // namespace dspine_test
