// Transition walk and block verify against the step-by-step references of
// reference_sampling.cpp, which follow the documented rules (dspine_kernels.h, ops.py).
#include <algorithm>

#include "reference.h"

namespace dspine_test {
namespace {

void walk_case(const WalkCase& c, uint64_t seed) {
  Case scope(str(c.describe(), " seed=", seed));
  WalkInputs in = make_walk_inputs(c, seed);
  const WalkOutputs want = walk_naive(c, in);  // may move uniforms off decision boundaries
  const int64_t rows = c.batch * c.positions;
  std::vector<int64_t> tokens(rows, -7), cand_ids(rows * c.top_k, -7);
  auto cand_probs = poisoned(rows * c.top_k);
  const bool use_tables = c.rank > 0;
  if (!check_ok(dspine_cpu_transition_walk_f32(in.logits.data(), use_tables ? in.g.data() : nullptr,
                                               use_tables ? in.pred.data() : nullptr,
                                               use_tables ? in.succ.data() : nullptr, in.anchor.data(),
                                               in.temperature.data(), in.uniforms.data(), tokens.data(),
                                               cand_ids.data(), cand_probs.data(), c.batch, c.positions, c.vocab,
                                               c.rank, c.top_k),
                "transition_walk"))
    return;
  check_equal("cand_ids", cand_ids, want.cand_ids);
  check_equal("tokens", tokens, want.tokens);
  check_close("cand_probs", cand_probs, want.cand_probs, 1e-6, 1e-5);
}

// Returns the reference accept lengths, so the caller can check the inputs cover them all.
std::vector<int32_t> verify_case(const VerifyCase& c, uint64_t seed) {
  Case scope(str(c.describe(), " seed=", seed));
  VerifyInputs in = make_verify_inputs(c, seed);
  const VerifyOutputs want = verify_naive(c, in);  // may move uniforms off decision boundaries
  VerifyOutputs got{std::vector<int32_t>(c.batch, -7), std::vector<int64_t>(c.batch * c.block, -7)};
  if (!check_ok(dspine_cpu_block_verify_f32(in.logits.data(), in.draft_tokens.data(), in.cand_ids.data(),
                                            in.cand_probs.data(), in.temperature.data(), in.top_k.data(),
                                            in.top_p.data(), in.uniforms.data(), got.accept_len.data(),
                                            got.out_tokens.data(), c.batch, c.block, c.vocab, c.cand),
                "block_verify"))
    return want.accept_len;
  check_equal("accept_len", got.accept_len, want.accept_len);
  check_equal("out_tokens", got.out_tokens, want.out_tokens);
  return want.accept_len;
}

}  // namespace

void test_transition_walk() {
  uint64_t seed = 200;
  for (const auto& c : walk_cases()) walk_case(c, ++seed);
}

void test_block_verify() {
  uint64_t seed = 300;
  std::vector<int> seen;  // accept lengths of the block-16 cases
  for (const auto& c : verify_cases()) {
    const auto accepted = verify_case(c, ++seed);
    if (c.block != 16) continue;
    seen.resize(16, 0);
    for (int32_t n : accepted) ++seen[n];
  }
  check(seen.size() == 16 && seen[0] > 0 && seen[15] > 0 && std::count(seen.begin(), seen.end(), 0) < 10,
        "block 16 cases cover rejection at the first draft, full acceptance and lengths between");
}

}  // namespace dspine_test
