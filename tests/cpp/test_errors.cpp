// Misuse is reported, not executed: every rejected call returns DSPINE_INVALID_ARGUMENT, names
// the op and the culprit in dspine_last_error(), and leaves its outputs untouched.
#include "test_util.h"

namespace dspine_test {
namespace {

// The call fails with DSPINE_INVALID_ARGUMENT and the message contains `needle`.
void expect_rejected(dspine_status status, const char* call, const std::string& needle) {
  Case scope(call);
  check_status(status, DSPINE_INVALID_ARGUMENT, call);
  const std::string message = dspine_last_error();
  check(message.find(needle) != std::string::npos, str("message '", message, "' does not mention '", needle, "'"));
}

bool all_nan(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isnan(x)) return false;
  return true;
}

void norm_and_rope_errors() {
  std::vector<float> x(8, 1.f), w(4, 1.f), out = poisoned(8), table(4 * 4, 0.5f);
  expect_rejected(dspine_cpu_rms_norm_f32(x.data(), w.data(), out.data(), -1, 4, 1e-6f), "rms_norm rows < 0", "rows");
  expect_rejected(dspine_cpu_rms_norm_f32(x.data(), nullptr, out.data(), 2, 4, 1e-6f), "rms_norm weight NULL",
                  "weight");
  expect_rejected(dspine_cpu_add_rms_norm_f32(x.data(), x.data(), w.data(), out.data(), nullptr, 2, 4, 1e-6f),
                  "add_rms_norm residual_out NULL", "residual_out");
  expect_rejected(dspine_cpu_add_rms_norm_f32(x.data(), x.data(), w.data(), out.data(), out.data(), 2, 4, 1e-6f),
                  "add_rms_norm out == residual_out", "different buffers");
  std::vector<int32_t> positions = {0, 4};  // the table has rows 0..3
  expect_rejected(dspine_cpu_rope_f32(x.data(), 4, out.data(), positions.data(), table.data(), 4, 2, 1, 4),
                  "rope position past the table", "positions[1] = 4");
  expect_rejected(dspine_cpu_rope_f32(x.data(), 3, out.data(), positions.data(), table.data(), 4, 1, 1, 3),
                  "rope odd head_dim", "even");
  check(all_nan(out), "rejected calls left out untouched");
}

void write_kv_errors() {
  std::vector<float> k(2 * 4, 1.f), table(8 * 4, 0.5f), k_cache = poisoned(3 * 4), v_cache = poisoned(3 * 4);
  std::vector<int32_t> positions = {0, 1}, slots = {2, 3};  // 3 slots: slot 3 does not exist
  expect_rejected(dspine_cpu_write_kv_f32(k.data(), 4, k.data(), 4, positions.data(), table.data(), 8, k_cache.data(),
                                          v_cache.data(), 3, slots.data(), 2, 1, 4),
                  "write_kv slot past the cache", "slots[1] = 3");
  slots = {-1, 1};
  positions = {99, -2};  // the padding token's position is never read; token 1's is
  expect_rejected(dspine_cpu_write_kv_f32(k.data(), 4, k.data(), 4, positions.data(), table.data(), 8, k_cache.data(),
                                          v_cache.data(), 3, slots.data(), 2, 1, 4),
                  "write_kv negative position", "positions[1] = -2");
  check(all_nan(k_cache) && all_nan(v_cache), "rejected calls left the caches untouched");
}

void attention_errors() {
  // One sequence of 5 keys in pages of 2: pages 0..2 of the table; 1 query at position 4.
  std::vector<float> q(4, 1.f), cache(4 * 2 * 4, 1.f), out = poisoned(4);
  std::vector<int32_t> tables = {0, 1, 2}, kv_lens = {5}, cu_q = {0, 1};
  dspine_attention_args a{};
  a.batch = 1, a.q_heads = 1, a.kv_heads = 1, a.head_dim = 4, a.num_pages = 4, a.page_size = 2, a.max_pages = 3;
  a.causal = 1, a.window = 0, a.scale = 0.5f;
  auto call = [&] {
    return dspine_cpu_paged_attention_f32(q.data(), cache.data(), cache.data(), out.data(), tables.data(),
                                          kv_lens.data(), cu_q.data(), &a);
  };
  check_ok(call(), "paged_attention valid call");
  check(std::string(dspine_last_error()).empty(), "a successful call clears the last error");
  out = poisoned(4);

  tables = {0, -1, 2};  // page 1 holds visible keys 2, 3
  expect_rejected(call(), "paged_attention freed page inside the window", "block_tables[0, 1] = -1");
  a.window = 2;  // query 4 now sees keys 3, 4 only: page 1 still needed (key 3)
  expect_rejected(call(), "paged_attention freed page at the window edge", "block_tables[0, 1]");
  a.window = 1;  // key 4 only (page 2): pages 0 and 1 may be freed
  check_ok(call(), "paged_attention freed pages outside the window");
  out = poisoned(4);
  tables = {0, 1, 2};
  a.window = 0;

  kv_lens = {7};  // 3 pages of 2 hold at most 6 keys
  expect_rejected(call(), "paged_attention kv_len past the block table", "exceeds its block table");
  kv_lens = {5};
  cu_q = {0, 6};
  expect_rejected(call(), "paged_attention more queries than keys", "6 queries but only 5 keys");
  cu_q = {0, 1};
  a.q_heads = 3, a.kv_heads = 2;
  expect_rejected(call(), "paged_attention q_heads not a multiple of kv_heads", "multiple of kv_heads");
  check(all_nan(out), "rejected calls left out untouched");
}

void sampling_errors() {
  const int64_t batch = 1, positions = 2, vocab = 5, rank = 2, k = 2;
  std::vector<float> logits(batch * 3 * vocab, 0.f), g(batch * positions * rank, 1.f), table(vocab * rank, 1.f);
  std::vector<float> temperature = {1.f}, uniforms(3, 0.5f), cand_probs = poisoned(positions * k);
  std::vector<int64_t> anchor = {5}, tokens(positions, -7), cand_ids(positions * k, -7);
  expect_rejected(dspine_cpu_transition_walk_f32(logits.data(), g.data(), table.data(), table.data(), anchor.data(),
                                                 temperature.data(), uniforms.data(), tokens.data(), cand_ids.data(),
                                                 cand_probs.data(), batch, positions, vocab, rank, k),
                  "transition_walk anchor outside the vocab", "anchor[0] = 5");
  anchor = {1};
  expect_rejected(dspine_cpu_transition_walk_f32(logits.data(), g.data(), table.data(), table.data(), anchor.data(),
                                                 temperature.data(), uniforms.data(), tokens.data(), cand_ids.data(),
                                                 cand_probs.data(), batch, positions, vocab, rank, vocab + 1),
                  "transition_walk top_k > vocab", "top_k");
  check(all_nan(cand_probs), "rejected walks left cand_probs untouched");

  // Verify, block 3: drafts [batch, 2], candidates [batch, 2, 2].
  std::vector<int64_t> drafts = {0, 9}, ids = {1, 2, 3, 4}, out_tokens(3, -7);
  std::vector<float> probs(4, 0.5f), top_p = {1.f};
  std::vector<int32_t> top_k = {0}, accept = {-7};
  auto verify = [&] {
    return dspine_cpu_block_verify_f32(logits.data(), drafts.data(), ids.data(), probs.data(), temperature.data(),
                                       top_k.data(), top_p.data(), uniforms.data(), accept.data(), out_tokens.data(),
                                       batch, 3, vocab, 2);
  };
  expect_rejected(verify(), "block_verify sampled draft outside the vocab", "draft_tokens[1] = 9");
  check(out_tokens == std::vector<int64_t>(3, -7) && accept[0] == -7, "rejected verify left outputs untouched");
  temperature = {0.f};  // greedy rows only compare ids: any value is fine
  check_ok(verify(), "block_verify greedy with an out-of-vocab draft");
  // Uniform logits: the argmax is id 0, so draft 0 is accepted, 9 is not, and 0 is the bonus.
  check(accept[0] == 1 && out_tokens == std::vector<int64_t>{0, 0, -1},
        str("greedy verify: accept ", accept[0], ", tokens ", out_tokens[0], " ", out_tokens[1], " ", out_tokens[2]));
}

void thread_setting_errors() {
  check(dspine_cpu_threads() == 0, "the kernels follow OpenMP until told otherwise");
  check_ok(dspine_set_cpu_threads(3), "set_cpu_threads 3");
  check(dspine_cpu_threads() == 3, "set_cpu_threads(3) is what dspine_cpu_threads reports");
  expect_rejected(dspine_set_cpu_threads(-1), "set_cpu_threads -1", "got -1");
  expect_rejected(dspine_set_cpu_threads(4097), "set_cpu_threads 4097", "got 4097");
  check(dspine_cpu_threads() == 3, "a refused count leaves the setting as it was");
  check_ok(dspine_set_cpu_threads(0), "set_cpu_threads 0");
  check(dspine_cpu_threads() == 0, "0 follows OpenMP again");
}

}  // namespace

void test_errors() {
  check(std::string(dspine_version()).size() >= 5, "dspine_version() looks like MAJOR.MINOR.PATCH");
  thread_setting_errors();
  norm_and_rope_errors();
  write_kv_errors();
  attention_errors();
  sampling_errors();
}

}  // namespace dspine_test
