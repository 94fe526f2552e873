// Shared by the C API translation units (CPU and CUDA): argument checks that throw, and the
// boundary that turns exceptions into status codes + dspine_last_error(). Not installed.
#pragma once

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "dspine_kernels.h"

namespace dspine {
namespace capi {

// The thread's last error message (defined once, in dspine_kernels.cpp).
std::string& last_error();

// Thrown by the checks below; turned into DSPINE_INVALID_ARGUMENT at the API boundary.
struct InvalidArgument {
  std::string message;
};

// Thrown when a CUDA runtime call fails; turned into DSPINE_CUDA_ERROR.
struct CudaFailure {
  std::string message;
};

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// Throws InvalidArgument("<parts...>") unless ok; the message is only built on failure.
template <typename... Parts>
void require(bool ok, const Parts&... parts) {
  if (!ok) throw InvalidArgument{concat(parts...)};
}

inline void require_ptr(const void* p, const char* op, const char* name) {
  require(p != nullptr, op, ": ", name, " is NULL");
}

// Checks several named pointers at once: require_ptrs(op, {{x, "x"}, {w, "weight"}}).
inline void require_ptrs(const char* op, std::initializer_list<std::pair<const void*, const char*>> named) {
  for (const auto& [p, name] : named) require_ptr(p, op, name);
}

inline void require_nonnegative(int64_t value, const char* op, const char* name) {
  require(value >= 0, op, ": ", name, " must be >= 0 (got ", value, ")");
}

// Runs one API call: no exception may cross the C boundary.
template <typename Body>
dspine_status guarded(Body&& body) {
  try {
    body();
    last_error().clear();
    return DSPINE_OK;
  } catch (const InvalidArgument& e) {
    last_error() = e.message;
    return DSPINE_INVALID_ARGUMENT;
  } catch (const CudaFailure& e) {
    last_error() = e.message;
    return DSPINE_CUDA_ERROR;
  } catch (const std::bad_alloc&) {
    last_error() = "out of memory";
  } catch (const std::exception& e) {
    last_error() = e.what();
  } catch (...) {
    last_error() = "unknown error";
  }
  return DSPINE_INTERNAL_ERROR;
}

// ---- shape and pointer checks shared by the CPU and CUDA entry points ------------------------
// Each *_has_work checks the sizes and returns false when there is nothing to compute (then the
// pointers may be NULL); the require_*_ptrs check the pointers of a call that has work.

inline bool norm_has_work(const char* op, int64_t rows, int64_t dim) {
  require_nonnegative(rows, op, "rows");
  require(dim >= 1, op, ": dim must be >= 1");
  return rows > 0;
}

inline bool rope_has_work(const char* op, int64_t x_token_stride, int64_t tokens, int64_t heads, int64_t head_dim) {
  require_nonnegative(tokens, op, "tokens");
  require_nonnegative(heads, op, "heads");
  require(head_dim >= 2 && head_dim % 2 == 0, op, ": head_dim must be even and >= 2 for RoPE (got ", head_dim, ")");
  require(x_token_stride >= heads * head_dim, op, ": x_token_stride must be >= heads * head_dim");
  return tokens > 0 && heads > 0;
}

inline bool write_kv_has_work(const char* op, int64_t k_token_stride, int64_t v_token_stride, int64_t num_slots,
                              int64_t tokens, int64_t kv_heads, int64_t head_dim, bool rotate) {
  require_nonnegative(tokens, op, "tokens");
  require(kv_heads >= 1 && head_dim >= 1, op, ": kv_heads and head_dim must be >= 1");
  require(!rotate || head_dim % 2 == 0, op, ": head_dim must be even for RoPE (got ", head_dim, ")");
  require(k_token_stride >= kv_heads * head_dim && v_token_stride >= kv_heads * head_dim, op,
          ": k/v token strides must be >= kv_heads * head_dim");
  require_nonnegative(num_slots, op, "num_slots");
  return tokens > 0;
}

inline bool attention_has_work(const char* op, const dspine_attention_args* args) {
  require_ptr(args, op, "args");
  const dspine_attention_args& a = *args;
  require_nonnegative(a.batch, op, "batch");
  require(a.q_heads >= 1 && a.kv_heads >= 1 && a.q_heads % a.kv_heads == 0, op, ": q_heads (", a.q_heads,
          ") must be a positive multiple of kv_heads (", a.kv_heads, ")");
  require(a.head_dim >= 1, op, ": head_dim must be >= 1");
  require(a.page_size >= 1, op, ": page_size must be >= 1");
  require_nonnegative(a.num_pages, op, "num_pages");
  require_nonnegative(a.max_pages, op, "max_pages");
  require(a.q_token_stride == 0 || a.q_token_stride >= a.q_heads * a.head_dim, op,
          ": q_token_stride must be 0 or >= q_heads * head_dim");
  return a.batch > 0;
}

inline int64_t attention_q_stride(const dspine_attention_args& a) {
  return a.q_token_stride ? a.q_token_stride : a.q_heads * a.head_dim;
}

inline bool injection_has_work(const char* op, int64_t n, int64_t block, int64_t hidden) {
  require_nonnegative(n, op, "n");
  require_nonnegative(block, op, "block");
  require_nonnegative(hidden, op, "hidden");
  return n > 0 && block > 0 && hidden > 0;
}

inline bool walk_has_work(const char* op, int64_t batch, int64_t positions, int64_t vocab, int64_t rank,
                          int64_t top_k) {
  require_nonnegative(batch, op, "batch");
  require_nonnegative(positions, op, "positions");
  require_nonnegative(rank, op, "rank");
  require(vocab >= 1, op, ": vocab must be >= 1");
  require(top_k >= 1 && top_k <= vocab, op, ": top_k must be in [1, vocab] (got ", top_k, ")");
  return batch > 0 && positions > 0;
}

inline void require_walk_ptrs(const char* op, const void* logits, const void* g, const void* pred_table,
                              const void* succ_table, const void* anchor, const void* temperature,
                              const void* uniforms, const void* tokens, const void* cand_ids, const void* cand_probs,
                              int64_t rank) {
  require_ptrs(op, {{logits, "logits"}, {anchor, "anchor"}, {temperature, "temperature"}, {uniforms, "uniforms"},
                    {tokens, "tokens"}, {cand_ids, "cand_ids"}, {cand_probs, "cand_probs"}});
  if (rank > 0) require_ptrs(op, {{g, "g"}, {pred_table, "pred_table"}, {succ_table, "succ_table"}});
}

inline bool verify_has_work(const char* op, int64_t batch, int64_t block, int64_t vocab, int64_t cand) {
  require_nonnegative(batch, op, "batch");
  require(block >= 1, op, ": block must be >= 1 (the bonus row)");
  require(vocab >= 1, op, ": vocab must be >= 1");
  require_nonnegative(cand, op, "cand");
  return batch > 0;
}

inline void require_verify_ptrs(const char* op, const void* logits, const void* draft_tokens, const void* cand_ids,
                                const void* cand_probs, const void* temperature, const void* top_k,
                                const void* top_p, const void* uniforms, const void* accept_len,
                                const void* out_tokens, int64_t block, int64_t cand) {
  require_ptrs(op, {{logits, "logits"}, {temperature, "temperature"}, {top_k, "top_k"}, {top_p, "top_p"},
                    {uniforms, "uniforms"}, {accept_len, "accept_len"}, {out_tokens, "out_tokens"}});
  if (block > 1) require_ptr(draft_tokens, op, "draft_tokens");
  if (block > 1 && cand > 0) require_ptrs(op, {{cand_ids, "cand_ids"}, {cand_probs, "cand_probs"}});
}

}  // namespace capi
}  // namespace dspine
