// The C API of dspine_kernels.h: argument checks, then the fp32 instantiation of the CPU kernel
// templates in csrc/cpu. Every index a kernel dereferences is checked here first, because the
// kernels themselves trust their inputs (the torch bindings check shapes the same way).
#include "dspine_kernels.h"

#include <algorithm>
#include <string>

#include "capi_internal.h"
#include "cpu/attention.h"
#include "cpu/injection.h"
#include "cpu/norm.h"
#include "cpu/rope.h"
#include "cpu/transition.h"
#include "cpu/verify.h"

#ifndef DSPINE_VERSION
#define DSPINE_VERSION "0.0.0"
#endif

namespace dspine {
namespace capi {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

}  // namespace capi
}  // namespace dspine

namespace {

using namespace dspine::capi;

// positions[t] (for the tokens `used` selects) must be rows of the RoPE table.
template <typename Used>
void check_positions(const int32_t* positions, int64_t tokens, int64_t cos_sin_rows, const char* op,
                     Used&& used) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (!used(t)) continue;
    require(positions[t] >= 0 && positions[t] < cos_sin_rows, op, ": positions[", t, "] = ", positions[t],
            " is outside the cos_sin table (", cos_sin_rows, " rows)");
  }
}

// ---- paged attention ------------------------------------------------------------------------

// Pages holding a key that some query of sequence b sees must exist; others are never read.
void check_sequence_pages(const dspine_attention_args& a, const int32_t* table, int64_t b, int64_t n,
                          int64_t kv_len) {
  const int64_t page = dspine::cpu::first_missing_page(table, n, kv_len, a.window, a.page_size, a.num_pages);
  require(page < 0, "paged_attention: block_tables[", b, ", ", page, "] = ", page < 0 ? 0 : table[page],
          " is not a page of the cache (", a.num_pages, " pages) but holds visible keys");
}

void check_attention_sequences(const dspine_attention_args& a, const int32_t* block_tables,
                               const int32_t* kv_lens, const int32_t* cu_q) {
  const char* op = "paged_attention";
  require(cu_q[0] == 0, op, ": cu_q[0] must be 0");
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t n = static_cast<int64_t>(cu_q[b + 1]) - cu_q[b];
    const int64_t kv_len = kv_lens[b];
    require(n >= 0, op, ": cu_q must be non-decreasing (sequence ", b, ")");
    require(n <= kv_len, op, ": sequence ", b, " has ", n, " queries but only ", kv_len, " keys");
    require(kv_len <= a.max_pages * a.page_size, op, ": kv_lens[", b, "] = ", kv_len,
            " exceeds its block table (", a.max_pages, " pages of ", a.page_size, ")");
    check_sequence_pages(a, block_tables + b * a.max_pages, b, n, kv_len);
  }
}

// ---- transition walk and verify ---------------------------------------------------------------

void check_ids(const int64_t* ids, int64_t count, int64_t vocab, const char* op, const char* name,
               int64_t offset) {
  for (int64_t i = 0; i < count; ++i)
    require(ids[i] >= 0 && ids[i] < vocab, op, ": ", name, "[", offset + i, "] = ", ids[i],
            " is not a token id (vocab ", vocab, ")");
}

// Sampled rows index p with their draft and candidate ids; greedy rows only compare them.
void check_verify_ids(const int64_t* draft_tokens, const int64_t* cand_ids, const float* temperature,
                      int64_t batch, int64_t drafts, int64_t vocab, int64_t cand) {
  for (int64_t b = 0; b < batch; ++b) {
    if (!(temperature[b] > 0.f)) continue;
    check_ids(draft_tokens + b * drafts, drafts, vocab, "block_verify", "draft_tokens", b * drafts);
    check_ids(cand_ids + b * drafts * cand, drafts * cand, vocab, "block_verify", "cand_ids", b * drafts * cand);
  }
}

}  // namespace

extern "C" {

const char* dspine_last_error(void) { return last_error().c_str(); }

const char* dspine_version(void) { return DSPINE_VERSION; }

dspine_status dspine_set_cpu_threads(int64_t n) {
  return guarded([&] {
    using dspine::cpu::kMaxKernelThreads;
    require(n >= 0 && n <= kMaxKernelThreads, "set_cpu_threads: n must be 0 (follow OpenMP) or 1..",
            kMaxKernelThreads, " (got ", n, ")");
    dspine::cpu::kernel_threads().store(static_cast<int>(n));
  });
}

int64_t dspine_cpu_threads(void) { return dspine::cpu::kernel_threads().load(); }

dspine_status dspine_cpu_rms_norm_f32(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                                      float eps) {
  return guarded([&] {
    const char* op = "rms_norm";
    if (!norm_has_work(op, rows, dim)) return;
    require_ptrs(op, {{x, "x"}, {weight, "weight"}, {out, "out"}});
    dspine::cpu::rms_norm<float>(x, nullptr, weight, out, nullptr, rows, dim, eps);
  });
}

dspine_status dspine_cpu_add_rms_norm_f32(const float* x, const float* residual, const float* weight, float* out,
                                          float* residual_out, int64_t rows, int64_t dim, float eps) {
  return guarded([&] {
    const char* op = "add_rms_norm";
    if (!norm_has_work(op, rows, dim)) return;
    require_ptrs(op, {{x, "x"}, {residual, "residual"}, {weight, "weight"}, {out, "out"},
                      {residual_out, "residual_out"}});
    require(out != residual_out, op, ": out and residual_out must be different buffers");
    dspine::cpu::rms_norm<float>(x, residual, weight, out, residual_out, rows, dim, eps);
  });
}

dspine_status dspine_cpu_rope_f32(const float* x, int64_t x_token_stride, float* out, const int32_t* positions,
                                  const float* cos_sin, int64_t cos_sin_rows, int64_t tokens, int64_t heads,
                                  int64_t head_dim) {
  return guarded([&] {
    const char* op = "rope";
    if (!rope_has_work(op, x_token_stride, tokens, heads, head_dim)) return;
    require_ptrs(op, {{x, "x"}, {out, "out"}, {positions, "positions"}, {cos_sin, "cos_sin"}});
    check_positions(positions, tokens, cos_sin_rows, op, [](int64_t) { return true; });
    dspine::cpu::rope<float>(x, x_token_stride, out, positions, cos_sin, tokens, heads, head_dim);
  });
}

dspine_status dspine_cpu_write_kv_f32(const float* k, int64_t k_token_stride, const float* v,
                                      int64_t v_token_stride, const int32_t* positions, const float* cos_sin,
                                      int64_t cos_sin_rows, float* k_cache, float* v_cache, int64_t num_slots,
                                      const int32_t* slots, int64_t tokens, int64_t kv_heads, int64_t head_dim) {
  return guarded([&] {
    const char* op = "write_kv";
    const bool rotate = cos_sin != nullptr;
    if (!write_kv_has_work(op, k_token_stride, v_token_stride, num_slots, tokens, kv_heads, head_dim, rotate)) return;
    require_ptrs(op, {{k, "k"}, {v, "v"}, {slots, "slots"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}});
    for (int64_t t = 0; t < tokens; ++t)
      require(slots[t] < num_slots, op, ": slots[", t, "] = ", slots[t], " is outside the cache (", num_slots,
              " slots)");
    if (rotate) {
      require_ptr(positions, op, "positions");
      check_positions(positions, tokens, cos_sin_rows, op, [&](int64_t t) { return slots[t] >= 0; });
    }
    dspine::cpu::write_kv<float>(k, k_token_stride, v, v_token_stride, rotate ? positions : nullptr, cos_sin, k_cache,
                                 v_cache, slots, tokens, kv_heads, head_dim);
  });
}

dspine_status dspine_cpu_paged_attention_f32(const float* q, const float* k_cache, const float* v_cache, float* out,
                                             const int32_t* block_tables, const int32_t* kv_lens,
                                             const int32_t* cu_q, const dspine_attention_args* args) {
  return guarded([&] {
    const char* op = "paged_attention";
    if (!attention_has_work(op, args)) return;
    const dspine_attention_args& a = *args;
    require_ptrs(op, {{block_tables, "block_tables"}, {kv_lens, "kv_lens"}, {cu_q, "cu_q"}});
    check_attention_sequences(a, block_tables, kv_lens, cu_q);
    if (cu_q[a.batch] == 0) return;
    require_ptrs(op, {{q, "q"}, {out, "out"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}});
    const dspine::cpu::PagedAttentionArgs kernel_args{
        a.batch, a.q_heads, a.kv_heads, a.head_dim, a.page_size, a.max_pages, attention_q_stride(a),
        a.causal != 0, a.window, a.scale};
    dspine::cpu::paged_attention<float>(q, k_cache, v_cache, out, block_tables, kv_lens, cu_q, kernel_args);
  });
}

dspine_status dspine_cpu_fused_injection_f32(const float* h, const float* gate_h, const float* fproj, float* out,
                                             int64_t n, int64_t block, int64_t hidden) {
  return guarded([&] {
    const char* op = "fused_injection";
    if (!injection_has_work(op, n, block, hidden)) return;
    require_ptrs(op, {{h, "h"}, {gate_h, "gate_h"}, {fproj, "fproj"}, {out, "out"}});
    dspine::cpu::fused_injection<float>(h, gate_h, fproj, out, n, block, hidden);
  });
}

dspine_status dspine_cpu_transition_walk_f32(const float* logits, const float* g, const float* pred_table,
                                             const float* succ_table, const int64_t* anchor,
                                             const float* temperature, const float* uniforms, int64_t* tokens,
                                             int64_t* cand_ids, float* cand_probs, int64_t batch, int64_t positions,
                                             int64_t vocab, int64_t rank, int64_t top_k) {
  return guarded([&] {
    const char* op = "transition_walk";
    if (!walk_has_work(op, batch, positions, vocab, rank, top_k)) return;
    require_walk_ptrs(op, logits, g, pred_table, succ_table, anchor, temperature, uniforms, tokens, cand_ids,
                      cand_probs, rank);
    const bool use_transition = rank > 0;
    if (use_transition) check_ids(anchor, batch, vocab, op, "anchor", 0);  // rows of pred_table
    const dspine::cpu::TransitionArgs a{batch, positions, vocab, rank, top_k, use_transition};
    dspine::cpu::transition_walk<float>(logits, g, pred_table, succ_table, anchor, temperature, uniforms, tokens,
                                        cand_ids, cand_probs, a);
  });
}

dspine_status dspine_cpu_block_verify_f32(const float* logits, const int64_t* draft_tokens, const int64_t* cand_ids,
                                          const float* cand_probs, const float* temperature, const int32_t* top_k,
                                          const float* top_p, const float* uniforms, int32_t* accept_len,
                                          int64_t* out_tokens, int64_t batch, int64_t block, int64_t vocab,
                                          int64_t cand) {
  return guarded([&] {
    const char* op = "block_verify";
    if (!verify_has_work(op, batch, block, vocab, cand)) return;
    require_verify_ptrs(op, logits, draft_tokens, cand_ids, cand_probs, temperature, top_k, top_p, uniforms,
                        accept_len, out_tokens, block, cand);
    if (block > 1) check_verify_ids(draft_tokens, cand_ids, temperature, batch, block - 1, vocab, cand);
    const dspine::cpu::VerifyArgs a{batch, block, vocab, cand};
    dspine::cpu::block_verify<float>(logits, draft_tokens, cand_ids, cand_probs, temperature, top_k, top_p, uniforms,
                                     accept_len, out_tokens, a);
  });
}

}  // extern "C"
