// Argument checks of the Gated DeltaNet ops (conv1d, gated delta rule), shared by the CPU and
// CUDA bindings. They look at shapes, strides and dtypes only (never at device memory).
#include <torch/extension.h>

#include "dspine_ops.h"

namespace dspine {

static void check_rows(const at::Tensor& x, int64_t dims, const char* op, const char* name) {
  TORCH_CHECK(x.dim() == dims, op, ": ", name, " must have ", dims, " dims");
  TORCH_CHECK(x.stride(-1) == 1, op, ": ", name, " rows must be contiguous in their last dim");
  if (dims == 3) TORCH_CHECK(x.stride(1) == x.size(2), op, ": ", name, " heads must be contiguous");
}

void check_varlen_meta(const at::Tensor& state_slots, const at::Tensor& cu_q, const char* op) {
  TORCH_CHECK(state_slots.dim() == 1 && state_slots.scalar_type() == at::kInt, op,
              ": state_slots must be int32 [batch]");
  TORCH_CHECK(cu_q.dim() == 1 && cu_q.scalar_type() == at::kInt && cu_q.numel() == state_slots.numel() + 1,
              op, ": cu_q must be int32 [batch + 1]");
}

void check_conv1d_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& conv_state,
                       const at::Tensor& state_slots, const at::Tensor& cu_q) {
  const char* op = "causal_conv1d";
  check_rows(x, 2, op, "x");
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == x.size(1) && weight.is_contiguous(), op,
              ": weight must be contiguous [channels, kernel]");
  const int64_t k = weight.size(1);
  TORCH_CHECK(k >= 2 && k <= kConvMaxKernelSize, op, ": kernel size must be in [2, ", kConvMaxKernelSize, "]");
  TORCH_CHECK(conv_state.dim() == 3 && conv_state.size(2) == x.size(1) && conv_state.size(1) >= k - 1 &&
                  conv_state.is_contiguous(),
              op, ": conv_state must be contiguous [slots, width >= kernel - 1, channels]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && conv_state.scalar_type() == x.scalar_type(), op,
              ": x, weight and conv_state must share a dtype");
  check_varlen_meta(state_slots, cu_q, op);
}

void check_conv_commit_args(const at::Tensor& conv_state, const at::Tensor& state_slots,
                            const at::Tensor& num_accepted, int64_t kernel_size) {
  const char* op = "conv_state_commit";
  TORCH_CHECK(conv_state.dim() >= 3 && conv_state.is_contiguous(), op, ": conv_state must be contiguous [..., slots, width, channels]");
  TORCH_CHECK(kernel_size >= 2 && conv_state.size(-2) >= kernel_size - 1, op, ": kernel_size must be >= 2 and fit the window");
  TORCH_CHECK(state_slots.dim() == 1 && state_slots.scalar_type() == at::kInt, op, ": state_slots must be int32 [batch]");
  TORCH_CHECK(num_accepted.sizes() == state_slots.sizes() && num_accepted.scalar_type() == at::kInt, op,
              ": num_accepted must be int32 [batch]");
}

void check_gated_delta_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                            const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                            const at::Tensor& state, const at::Tensor& state_slots, const at::Tensor& cu_q,
                            const char* op) {
  check_rows(q, 3, op, "q");
  check_rows(k, 3, op, "k");
  check_rows(v, 3, op, "v");
  check_rows(a, 2, op, "a");
  check_rows(b, 2, op, "b");
  const int64_t n = q.size(0), hk = q.size(1), dk = q.size(2), hv = v.size(1), dv = v.size(2);
  TORCH_CHECK(k.sizes() == q.sizes(), op, ": q and k must both be [tokens, k_heads, k_dim]");
  TORCH_CHECK(v.size(0) == n && a.size(0) == n && b.size(0) == n, op, ": q, k, v, a, b must have the same tokens");
  TORCH_CHECK(hk > 0 && hv % hk == 0, op, ": value heads must be a multiple of key heads");
  TORCH_CHECK(a.size(1) == hv && b.size(1) == hv, op, ": a and b must be [tokens, v_heads]");
  TORCH_CHECK(dk > 0 && dv > 0 && dk <= kGdnMaxHeadDim && dv <= kGdnMaxHeadDim, op, ": head dims must be in [1, ",
              kGdnMaxHeadDim, "]");
  const auto dt = q.scalar_type();
  TORCH_CHECK(k.scalar_type() == dt && v.scalar_type() == dt && a.scalar_type() == dt && b.scalar_type() == dt, op,
              ": q, k, v, a, b must share a dtype");
  for (const auto* p : {&a_log, &dt_bias})
    TORCH_CHECK(p->dim() == 1 && p->numel() == hv && p->scalar_type() == at::kFloat && p->is_contiguous(), op,
                ": A_log and dt_bias must be contiguous fp32 [v_heads]");
  TORCH_CHECK(state.dim() == 4 && state.size(1) == hv && state.size(2) == dk && state.size(3) == dv &&
                  state.scalar_type() == at::kFloat && state.is_contiguous(),
              op, ": state must be contiguous fp32 [slots, v_heads, k_dim, v_dim]");
  check_varlen_meta(state_slots, cu_q, op);
}

void check_ring_args(const at::Tensor& ring_k, const at::Tensor& ring_u, const at::Tensor& ring_g,
                     int64_t lead_dims, const at::Tensor& state, int64_t hk, const char* op) {
  const int64_t l = lead_dims;
  const auto lead = state.sizes().slice(0, l + 1);  // (..., slots)
  const int64_t hv = state.size(l + 1), dk = state.size(l + 2), dv = state.size(l + 3);
  TORCH_CHECK(ring_k.dim() == l + 4 && ring_u.dim() == l + 4 && ring_g.dim() == l + 3, op,
              ": rings must be [..., slots, R, heads(, dim)]");
  TORCH_CHECK(ring_k.sizes().slice(0, l + 1) == lead && ring_u.sizes().slice(0, l + 1) == lead &&
                  ring_g.sizes().slice(0, l + 1) == lead,
              op, ": rings and state must have the same slots");
  const int64_t r = ring_k.size(l + 1);
  TORCH_CHECK(ring_k.size(l + 2) == hk && ring_k.size(l + 3) == dk, op, ": ring_k must be [..., slots, R, k_heads, k_dim]");
  TORCH_CHECK(ring_u.size(l + 1) == r && ring_u.size(l + 2) == hv && ring_u.size(l + 3) == dv, op,
              ": ring_u must be [..., slots, R, v_heads, v_dim]");
  TORCH_CHECK(ring_g.size(l + 1) == r && ring_g.size(l + 2) == hv, op, ": ring_g must be [..., slots, R, v_heads]");
  for (const auto* t : {&ring_k, &ring_u, &ring_g})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), op, ": rings must be contiguous fp32");
}

void check_recurrent_outputs(const at::Tensor& q, const at::Tensor& state, const at::Tensor& ring_k,
                             const at::Tensor& ring_u, const at::Tensor& ring_g, const at::Tensor& states_out,
                             const char* op) {
  if (ring_k.numel() > 0) check_ring_args(ring_k, ring_u, ring_g, 0, state, q.size(1), op);
  if (states_out.numel() > 0)
    TORCH_CHECK(states_out.dim() == 4 && states_out.size(0) == q.size(0) &&
                    states_out.sizes().slice(1) == state.sizes().slice(1) &&
                    states_out.scalar_type() == at::kFloat && states_out.is_contiguous(),
                op, ": states_out must be contiguous fp32 [tokens, v_heads, k_dim, v_dim]");
}

void check_replay_args(const at::Tensor& state, const at::Tensor& ring_k, const at::Tensor& ring_u,
                       const at::Tensor& ring_g, const at::Tensor& state_slots, const at::Tensor& num_accepted) {
  const char* op = "gated_delta_replay";
  TORCH_CHECK(state.dim() >= 4 && state.scalar_type() == at::kFloat && state.is_contiguous(), op,
              ": state must be contiguous fp32 [..., slots, v_heads, k_dim, v_dim]");
  const int64_t lead = state.dim() - 4;
  TORCH_CHECK(ring_k.dim() == lead + 4, op, ": ring_k must be [..., slots, R, k_heads, k_dim]");
  const int64_t hk = ring_k.size(lead + 2);
  TORCH_CHECK(hk > 0 && state.size(lead + 1) % hk == 0, op, ": value heads must be a multiple of key heads");
  check_ring_args(ring_k, ring_u, ring_g, lead, state, hk, op);
  TORCH_CHECK(state_slots.dim() == 1 && state_slots.scalar_type() == at::kInt, op, ": state_slots must be int32 [batch]");
  TORCH_CHECK(num_accepted.sizes() == state_slots.sizes() && num_accepted.scalar_type() == at::kInt, op,
              ": num_accepted must be int32 [batch]");
}

}  // namespace dspine
