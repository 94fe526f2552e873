// Paged sliding-window attention against full-matrix attention with an explicit mask
// (reference_attention.cpp): decode, prefill, verify and draft shapes, then random ones.
#include "reference.h"

namespace dspine_test {
namespace {

void run_case(const AttentionCase& c, uint64_t seed) {
  Case scope(str(c.describe(), " seed=", seed));
  Rng rng(seed);
  const PagedInputs in = make_attention_inputs(c, rng);
  auto out = poisoned(in.cu_q.back() * c.q_heads * c.head_dim);
  if (!check_ok(dspine_cpu_paged_attention_f32(in.q.data(), in.k_cache.data(), in.v_cache.data(), out.data(),
                                               in.block_tables.data(), in.kv_lens.data(), in.cu_q.data(), &in.args),
                "paged_attention"))
    return;
  check_close("out", out, attention_naive(c, in), 2e-5, 1e-4);
}

}  // namespace

void test_attention() {
  uint64_t seed = 100;
  for (const auto& c : named_attention_cases()) run_case(c, ++seed);
  for (const auto& c : random_attention_cases(60, 12345)) run_case(c, ++seed);
}

}  // namespace dspine_test
