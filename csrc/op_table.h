// Every op of torch.ops.dspine (the quantised CPU ops aside: quant_bindings.cpp), written once:
//   X(name, C++ return type, (C++ parameters), "schema after the name")
// dspine_ops.h declares each op's CPU and CUDA entry point from it and ops.cpp defines the
// schemas and registers both backends from it, so adding an op here is one row (plus its
// kernels, its Python wrapper, reference and fake in dspine_engine/ops.py).
#pragma once

#include <torch/all.h>

#include <tuple>

namespace dspine {

// Multi-tensor results, named so that a table row's return type holds no comma.
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

}  // namespace dspine

#define DSPINE_OPS(X)                                                                            \
  X(rms_norm, at::Tensor, (const at::Tensor& x, const at::Tensor& weight, double eps),          \
    "(Tensor x, Tensor weight, float eps) -> Tensor")                                           \
  X(add_rms_norm, Tensor2,                                                                       \
    (const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps),     \
    "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)")                \
  X(rope, at::Tensor,                                                                            \
    (const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin,                \
     const std::optional<at::Tensor>& norm, double eps),                                         \
    "(Tensor x, Tensor positions, Tensor cos_sin, Tensor? norm=None, float eps=0.) -> Tensor")  \
  X(write_kv, void,                                                                              \
    (const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,                      \
     const at::Tensor& cos_sin, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots, \
     const std::optional<at::Tensor>& k_norm, double eps),                                       \
    "(Tensor k, Tensor v, Tensor positions, Tensor cos_sin, Tensor(a!) k_cache, "               \
    "Tensor(b!) v_cache, Tensor slots, Tensor? k_norm=None, float eps=0.) -> ()")               \
  X(rope_write_kv, at::Tensor,                                                                   \
    (const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,  \
     const at::Tensor& cos_sin, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots, \
     const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, double eps), \
    "(Tensor q, Tensor k, Tensor v, Tensor positions, Tensor cos_sin, Tensor(a!) k_cache, "     \
    "Tensor(b!) v_cache, Tensor slots, Tensor? q_norm=None, Tensor? k_norm=None, "              \
    "float eps=0.) -> Tensor")                                                                  \
  X(paged_attention, at::Tensor,                                                                 \
    (const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,                  \
     const at::Tensor& block_tables, const at::Tensor& kv_lens, const at::Tensor& cu_q,          \
     int64_t max_q_len, bool causal, int64_t window, double scale, int64_t max_kv_len,           \
     bool exact, bool prefill),                                                                  \
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor kv_lens, "          \
    "Tensor cu_q, int max_q_len, bool causal, int window, float scale, int max_kv_len=0, "      \
    "bool exact=False, bool prefill=False) -> Tensor")                                          \
  X(silu_mul, at::Tensor, (const at::Tensor& x), "(Tensor x) -> Tensor")                        \
  X(fused_injection, at::Tensor, (const at::Tensor& h, const at::Tensor& gate_h, const at::Tensor& fproj), \
    "(Tensor h, Tensor gate_h, Tensor fproj) -> Tensor")                                        \
  X(transition_walk, Tensor3,                                                                    \
    (const at::Tensor& logits, const at::Tensor& g, const at::Tensor& pred_table,                \
     const at::Tensor& succ_table, const at::Tensor& anchor, int64_t top_k,                      \
     const at::Tensor& temperature, const at::Tensor& uniforms),                                 \
    "(Tensor logits, Tensor g, Tensor pred_table, Tensor succ_table, Tensor anchor, int top_k, " \
    "Tensor temperature, Tensor uniforms) -> (Tensor, Tensor, Tensor)")                         \
  X(block_verify, Tensor2,                                                                       \
    (const at::Tensor& logits, const at::Tensor& draft_tokens, const at::Tensor& cand_ids,       \
     const at::Tensor& cand_probs, const at::Tensor& temperature, const at::Tensor& top_k,       \
     const at::Tensor& top_p, const at::Tensor& uniforms),                                       \
    "(Tensor logits, Tensor draft_tokens, Tensor cand_ids, Tensor cand_probs, "                 \
    "Tensor temperature, Tensor top_k, Tensor top_p, Tensor uniforms) -> (Tensor, Tensor)")     \
  X(causal_conv1d, at::Tensor,                                                                   \
    (const at::Tensor& x, const at::Tensor& weight, at::Tensor& conv_state,                      \
     const at::Tensor& state_slots, const at::Tensor& cu_q, int64_t max_q_len, bool checkpoint), \
    "(Tensor x, Tensor weight, Tensor(s!) conv_state, Tensor state_slots, Tensor cu_q, "        \
    "int max_q_len, bool checkpoint) -> Tensor")                                                \
  X(conv_state_commit, void,                                                                     \
    (at::Tensor& conv_state, const at::Tensor& state_slots, const at::Tensor& num_accepted,      \
     int64_t kernel_size),                                                                       \
    "(Tensor(s!) conv_state, Tensor state_slots, Tensor num_accepted, int kernel_size) -> ()")  \
  X(gated_delta_recurrent, at::Tensor,                                                           \
    (const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,         \
     const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias, at::Tensor& state, \
     const at::Tensor& state_slots, const at::Tensor& cu_q, int64_t max_q_len,                   \
     at::Tensor& ring_k, at::Tensor& ring_u, at::Tensor& ring_g, at::Tensor& states_out),        \
    "(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, "         \
    "Tensor(s!) state, Tensor state_slots, Tensor cu_q, int max_q_len, Tensor(rk!) ring_k, "    \
    "Tensor(ru!) ring_u, Tensor(rg!) ring_g, Tensor(so!) states_out) -> Tensor")                \
  X(gated_delta_replay, void,                                                                    \
    (at::Tensor& state, const at::Tensor& ring_k, const at::Tensor& ring_u,                      \
     const at::Tensor& ring_g, const at::Tensor& state_slots, const at::Tensor& num_accepted),   \
    "(Tensor(s!) state, Tensor ring_k, Tensor ring_u, Tensor ring_g, Tensor state_slots, "      \
    "Tensor num_accepted) -> ()")                                                               \
  X(gated_delta_chunk, at::Tensor,                                                               \
    (const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,         \
     const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias, at::Tensor& state, \
     const at::Tensor& state_slots, const at::Tensor& cu_q, int64_t max_q_len),                  \
    "(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, "         \
    "Tensor(s!) state, Tensor state_slots, Tensor cu_q, int max_q_len) -> Tensor")
