// The C API of dspine_kernels.h: argument checks, then the fp32 instantiation of the CPU kernel
// templates in csrc/cpu. Every index a kernel dereferences is checked here first, because the
// kernels themselves trust their inputs (the torch bindings check shapes the same way).
#include "dspine_kernels.h"

#include <exception>
#include <initializer_list>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "cpu/attention.h"
#include "cpu/injection.h"
#include "cpu/norm.h"
#include "cpu/rope.h"
#include "cpu/transition.h"
#include "cpu/verify.h"

#ifndef DSPINE_VERSION
#define DSPINE_VERSION "0.0.0"
#endif

namespace {

thread_local std::string last_error;

// Thrown by the checks below and turned into DSPINE_INVALID_ARGUMENT at the API boundary.
struct InvalidArgument {
  std::string message;
};

// Throws InvalidArgument("<parts...>") unless ok; the message is only built on failure.
template <typename... Parts>
void require(bool ok, const Parts&... parts) {
  if (ok) return;
  std::ostringstream os;
  (os << ... << parts);
  throw InvalidArgument{os.str()};
}

void require_ptr(const void* p, const char* op, const char* name) {
  require(p != nullptr, op, ": ", name, " is NULL");
}

// Checks several named pointers at once: require_ptrs(op, {{x, "x"}, {w, "weight"}}).
void require_ptrs(const char* op, std::initializer_list<std::pair<const void*, const char*>> named) {
  for (const auto& [p, name] : named) require_ptr(p, op, name);
}

void require_nonnegative(int64_t value, const char* op, const char* name) {
  require(value >= 0, op, ": ", name, " must be >= 0 (got ", value, ")");
}

// Runs one API call: no exception may cross the C boundary.
template <typename Body>
dspine_status guarded(Body&& body) {
  try {
    body();
    last_error.clear();
    return DSPINE_OK;
  } catch (const InvalidArgument& e) {
    last_error = e.message;
    return DSPINE_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return DSPINE_INTERNAL_ERROR;
}

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

void check_rope_table(const float* cos_sin, const int32_t* positions, int64_t head_dim, const char* op) {
  require_ptr(cos_sin, op, "cos_sin");
  require_ptr(positions, op, "positions");
  require(head_dim % 2 == 0, op, ": head_dim must be even for RoPE (got ", head_dim, ")");
}

// ---- paged attention ------------------------------------------------------------------------

void check_attention_shape(const dspine_attention_args& a) {
  const char* op = "paged_attention";
  require_nonnegative(a.batch, op, "batch");
  require(a.q_heads >= 1 && a.kv_heads >= 1 && a.q_heads % a.kv_heads == 0, op,
          ": q_heads (", a.q_heads, ") must be a positive multiple of kv_heads (", a.kv_heads, ")");
  require(a.head_dim >= 1, op, ": head_dim must be >= 1");
  require(a.page_size >= 1, op, ": page_size must be >= 1");
  require_nonnegative(a.num_pages, op, "num_pages");
  require_nonnegative(a.max_pages, op, "max_pages");
  require(a.q_token_stride == 0 || a.q_token_stride >= a.q_heads * a.head_dim, op,
          ": q_token_stride must be 0 or >= q_heads * head_dim");
}

// Pages holding a key that some query of sequence b sees must exist; others are never read.
void check_sequence_pages(const dspine_attention_args& a, const int32_t* table, int64_t b, int64_t n,
                          int64_t kv_len) {
  if (n == 0) return;
  const int64_t first_pos = kv_len - n;
  const int64_t k_lo = a.window > 0 ? std::max<int64_t>(0, first_pos - a.window + 1) : 0;
  for (int64_t page = k_lo / a.page_size; page * a.page_size < kv_len; ++page) {
    const int32_t id = table[page];
    require(id >= 0 && id < a.num_pages, "paged_attention: block_tables[", b, ", ", page, "] = ", id,
            " is not a page of the cache (", a.num_pages, " pages) but holds visible keys");
  }
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

const char* dspine_last_error(void) { return last_error.c_str(); }

const char* dspine_version(void) { return DSPINE_VERSION; }

dspine_status dspine_cpu_rms_norm_f32(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                                      float eps) {
  return guarded([&] {
    const char* op = "rms_norm";
    require_nonnegative(rows, op, "rows");
    require(dim >= 1, op, ": dim must be >= 1");
    if (rows == 0) return;
    require_ptr(x, op, "x");
    require_ptr(weight, op, "weight");
    require_ptr(out, op, "out");
    dspine::cpu::rms_norm<float>(x, nullptr, weight, out, nullptr, rows, dim, eps);
  });
}

dspine_status dspine_cpu_add_rms_norm_f32(const float* x, const float* residual, const float* weight, float* out,
                                          float* residual_out, int64_t rows, int64_t dim, float eps) {
  return guarded([&] {
    const char* op = "add_rms_norm";
    require_nonnegative(rows, op, "rows");
    require(dim >= 1, op, ": dim must be >= 1");
    if (rows == 0) return;
    require_ptr(x, op, "x");
    require_ptr(residual, op, "residual");
    require_ptr(weight, op, "weight");
    require_ptr(out, op, "out");
    require_ptr(residual_out, op, "residual_out");
    require(out != residual_out, op, ": out and residual_out must be different buffers");
    dspine::cpu::rms_norm<float>(x, residual, weight, out, residual_out, rows, dim, eps);
  });
}

dspine_status dspine_cpu_rope_f32(const float* x, int64_t x_token_stride, float* out, const int32_t* positions,
                                  const float* cos_sin, int64_t cos_sin_rows, int64_t tokens, int64_t heads,
                                  int64_t head_dim) {
  return guarded([&] {
    const char* op = "rope";
    require_nonnegative(tokens, op, "tokens");
    require_nonnegative(heads, op, "heads");
    require(head_dim >= 2, op, ": head_dim must be >= 2");
    require(x_token_stride >= heads * head_dim, op, ": x_token_stride must be >= heads * head_dim");
    if (tokens == 0 || heads == 0) return;
    require_ptr(x, op, "x");
    require_ptr(out, op, "out");
    check_rope_table(cos_sin, positions, head_dim, op);
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
    require_nonnegative(tokens, op, "tokens");
    require(kv_heads >= 1 && head_dim >= 1, op, ": kv_heads and head_dim must be >= 1");
    require(k_token_stride >= kv_heads * head_dim && v_token_stride >= kv_heads * head_dim, op,
            ": k/v token strides must be >= kv_heads * head_dim");
    require_nonnegative(num_slots, op, "num_slots");
    if (tokens == 0) return;
    require_ptr(k, op, "k");
    require_ptr(v, op, "v");
    require_ptr(slots, op, "slots");
    require_ptr(k_cache, op, "k_cache");
    require_ptr(v_cache, op, "v_cache");
    for (int64_t t = 0; t < tokens; ++t)
      require(slots[t] < num_slots, op, ": slots[", t, "] = ", slots[t], " is outside the cache (", num_slots,
              " slots)");
    if (cos_sin) {
      check_rope_table(cos_sin, positions, head_dim, op);
      check_positions(positions, tokens, cos_sin_rows, op, [&](int64_t t) { return slots[t] >= 0; });
    }
    dspine::cpu::write_kv<float>(k, k_token_stride, v, v_token_stride, cos_sin ? positions : nullptr, cos_sin,
                                 k_cache, v_cache, slots, tokens, kv_heads, head_dim);
  });
}

dspine_status dspine_cpu_paged_attention_f32(const float* q, const float* k_cache, const float* v_cache, float* out,
                                             const int32_t* block_tables, const int32_t* kv_lens,
                                             const int32_t* cu_q, const dspine_attention_args* args) {
  return guarded([&] {
    const char* op = "paged_attention";
    require_ptr(args, op, "args");
    const dspine_attention_args& a = *args;
    check_attention_shape(a);
    if (a.batch == 0) return;
    require_ptr(block_tables, op, "block_tables");
    require_ptr(kv_lens, op, "kv_lens");
    require_ptr(cu_q, op, "cu_q");
    check_attention_sequences(a, block_tables, kv_lens, cu_q);
    if (cu_q[a.batch] == 0) return;
    require_ptr(q, op, "q");
    require_ptr(out, op, "out");
    require_ptr(k_cache, op, "k_cache");
    require_ptr(v_cache, op, "v_cache");
    const int64_t stride = a.q_token_stride ? a.q_token_stride : a.q_heads * a.head_dim;
    const dspine::cpu::PagedAttentionArgs kernel_args{a.batch,     a.q_heads,   a.kv_heads, a.head_dim,
                                                      a.page_size, a.max_pages, stride,     a.causal != 0,
                                                      a.window,    a.scale};
    dspine::cpu::paged_attention<float>(q, k_cache, v_cache, out, block_tables, kv_lens, cu_q, kernel_args);
  });
}

dspine_status dspine_cpu_fused_injection_f32(const float* h, const float* gate_h, const float* fproj, float* out,
                                             int64_t n, int64_t block, int64_t hidden) {
  return guarded([&] {
    const char* op = "fused_injection";
    require_nonnegative(n, op, "n");
    require_nonnegative(block, op, "block");
    require_nonnegative(hidden, op, "hidden");
    if (n == 0 || block == 0 || hidden == 0) return;
    require_ptr(h, op, "h");
    require_ptr(gate_h, op, "gate_h");
    require_ptr(fproj, op, "fproj");
    require_ptr(out, op, "out");
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
    require_nonnegative(batch, op, "batch");
    require_nonnegative(positions, op, "positions");
    require_nonnegative(rank, op, "rank");
    require(vocab >= 1, op, ": vocab must be >= 1");
    require(top_k >= 1 && top_k <= vocab, op, ": top_k must be in [1, vocab] (got ", top_k, ")");
    if (batch == 0 || positions == 0) return;
    require_ptrs(op, {{logits, "logits"}, {anchor, "anchor"}, {temperature, "temperature"}, {uniforms, "uniforms"},
                      {tokens, "tokens"}, {cand_ids, "cand_ids"}, {cand_probs, "cand_probs"}});
    const bool use_transition = rank > 0;
    if (use_transition) {
      require_ptr(g, op, "g");
      require_ptr(pred_table, op, "pred_table");
      require_ptr(succ_table, op, "succ_table");
      check_ids(anchor, batch, vocab, op, "anchor", 0);  // the first row of pred_table read
    }
    const dspine::cpu::TransitionArgs a{batch, positions, vocab, rank, top_k, use_transition};
    dspine::cpu::transition_walk<float>(logits, g, pred_table, succ_table, anchor, temperature, uniforms, tokens,
                                        cand_ids, cand_probs, a);
  });
}

dspine_status dspine_cpu_block_verify_f32(const float* logits, const int64_t* draft_tokens, const int64_t* cand_ids,
                                          const float* cand_probs, const float* temperature, const int32_t* top_k,
                                          const float* top_p, const float* uniforms, const int32_t* seq_lens,
                                          int32_t* accept_len, int64_t* out_tokens, int32_t* new_seq_lens,
                                          int64_t batch, int64_t block, int64_t vocab, int64_t cand) {
  return guarded([&] {
    const char* op = "block_verify";
    require_nonnegative(batch, op, "batch");
    require(block >= 1, op, ": block must be >= 1 (the bonus row)");
    require(vocab >= 1, op, ": vocab must be >= 1");
    require_nonnegative(cand, op, "cand");
    if (batch == 0) return;
    require_ptrs(op, {{logits, "logits"}, {temperature, "temperature"}, {top_k, "top_k"}, {top_p, "top_p"},
                      {uniforms, "uniforms"}, {seq_lens, "seq_lens"}, {accept_len, "accept_len"},
                      {out_tokens, "out_tokens"}, {new_seq_lens, "new_seq_lens"}});
    const int64_t drafts = block - 1;
    if (drafts > 0) {
      require_ptr(draft_tokens, op, "draft_tokens");
      if (cand > 0) {
        require_ptr(cand_ids, op, "cand_ids");
        require_ptr(cand_probs, op, "cand_probs");
      }
      check_verify_ids(draft_tokens, cand_ids, temperature, batch, drafts, vocab, cand);
    }
    const dspine::cpu::VerifyArgs a{batch, block, vocab, cand};
    dspine::cpu::block_verify<float>(logits, draft_tokens, cand_ids, cand_probs, temperature, top_k, top_p, uniforms,
                                     seq_lens, accept_len, out_tokens, new_seq_lens, a);
  });
}

}  // extern "C"
