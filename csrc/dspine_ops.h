// The ops of dspine_engine, as torch sees them (the table: op_table.h). Each has a CPU entry
// point (csrc/cpu) and, when built with CUDA, a CUDA entry point (csrc/cuda); ops.cpp registers
// both under one schema, so `torch.ops.dspine.<name>` dispatches on the device of its inputs.
// Semantics: dspine_engine/ops.py.
#pragma once

#include <torch/all.h>

#include "op_table.h"

namespace dspine {

// Each op's entry point per backend, from the one table (op_table.h).
#define DSPINE_DECLARE_OP(name, ret, params, schema) ret name params;
namespace cpu {
DSPINE_OPS(DSPINE_DECLARE_OP)
}  // namespace cpu
namespace cuda {
DSPINE_OPS(DSPINE_DECLARE_OP)
}  // namespace cuda
#undef DSPINE_DECLARE_OP

namespace cpu {
// The quantised GEMM's binding (CPU only, quant_bindings.cpp), which the one-op layer loops
// (draft_layers.cpp, target_layers.cpp) call without a dispatch.
at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight, c10::string_view format,
                        int64_t out_features);
}  // namespace cpu

// Argument checks shared by both backends: they turn misuse into a readable Python error.
void check_cache_dtype(const at::Tensor& x, const at::Tensor& cache, const char* op, const char* x_name);
void check_attention_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const at::Tensor& kv_lens,
                          const at::Tensor& cu_q, int64_t max_kv_len);
void check_verify_args(const at::Tensor& logits, const at::Tensor& draft_tokens,
                       const at::Tensor& cand_ids, const at::Tensor& cand_probs,
                       const at::Tensor& temperature, const at::Tensor& top_k,
                       const at::Tensor& top_p, const at::Tensor& uniforms);
// Shared by the norm / RoPE / KV-write bindings of both backends.
void check_norm_rows(const at::Tensor& x, const at::Tensor& w, const char* name);
void check_rope_table(const at::Tensor& positions, const at::Tensor& cos_sin, int64_t n, int64_t d);
void check_token_rows(const at::Tensor& x, const char* name);
// A per-head RMSNorm weight given to rope / write_kv / rope_write_kv: [head_dim] of x's dtype.
void check_head_norm(const std::optional<at::Tensor>& norm, const at::Tensor& x, const char* op);
void check_write_kv_args(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                         const at::Tensor& cos_sin, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, const at::Tensor& slots);
void check_injection_args(const at::Tensor& h, const at::Tensor& gate_h, const at::Tensor& fproj);
void check_silu_mul_args(const at::Tensor& x);
void check_rope_write_kv_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& positions, const at::Tensor& cos_sin,
                              const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slots,
                              const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm);
// bf16_tables: the caller's kernel also reads bf16 transition tables beside fp32 logits (the CPU).
void check_walk_args(const at::Tensor& logits, const at::Tensor& g, const at::Tensor& pred_table,
                     const at::Tensor& succ_table, const at::Tensor& anchor, int64_t top_k,
                     const at::Tensor& temperature, const at::Tensor& uniforms, bool bf16_tables = false);

// Gated DeltaNet ops (gated_delta_checks.cpp).
constexpr int64_t kConvMaxKernelSize = 16;
constexpr int64_t kGdnMaxHeadDim = 256;
void check_varlen_meta(const at::Tensor& state_slots, const at::Tensor& cu_q, const char* op);
void check_conv1d_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& conv_state,
                       const at::Tensor& state_slots, const at::Tensor& cu_q);
void check_conv_commit_args(const at::Tensor& conv_state, const at::Tensor& state_slots,
                            const at::Tensor& num_accepted, int64_t kernel_size);
void check_gated_delta_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_log,
                            const at::Tensor& dt_bias, const at::Tensor& state,
                            const at::Tensor& state_slots, const at::Tensor& cu_q, const char* op);
// Rings [..., slots, R, heads(, dim)] matching `state` [..., slots, v_heads, k_dim, v_dim] with
// `lead_dims` leading dims before the slots.
void check_ring_args(const at::Tensor& ring_k, const at::Tensor& ring_u, const at::Tensor& ring_g,
                     int64_t lead_dims, const at::Tensor& state, int64_t hk, const char* op);
// The optional outputs of gated_delta_recurrent: the replay ring and the stored states.
void check_recurrent_outputs(const at::Tensor& q, const at::Tensor& state, const at::Tensor& ring_k,
                             const at::Tensor& ring_u, const at::Tensor& ring_g,
                             const at::Tensor& states_out, const char* op);
void check_replay_args(const at::Tensor& state, const at::Tensor& ring_k, const at::Tensor& ring_u,
                       const at::Tensor& ring_g, const at::Tensor& state_slots,
                       const at::Tensor& num_accepted);

}  // namespace dspine
