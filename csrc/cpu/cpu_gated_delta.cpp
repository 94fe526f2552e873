// Thin torch bindings of the CPU Gated DeltaNet kernels (conv1d.h, gated_delta.h): checks (host
// metadata is validated here, reading it is free on the CPU), dtype dispatch, outputs.
#include <ATen/Dispatch.h>

#include "../dspine_ops.h"
#include "conv1d.h"
#include "gated_delta.h"

namespace dspine {
namespace cpu {

#define DSPINE_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, TYPE, NAME, __VA_ARGS__)

static_assert(kConvMaxKernel >= kConvMaxKernelSize, "the CPU conv window must hold the largest kernel");

// cu_q must run monotonically from 0 to `rows`, no sequence may be longer than max_q_len (the
// CUDA launch relies on it) nor, when max_len >= 0, than max_len; every slot must be < num_slots.
static void check_varlen_host(const at::Tensor& slots, const at::Tensor& cu_q, int64_t rows, int64_t max_q_len,
                              int64_t num_slots, int64_t max_len, const char* op, const char* limit) {
  const int32_t* cq = cu_q.data_ptr<int32_t>();
  const int32_t* sl = slots.data_ptr<int32_t>();
  const int64_t batch = slots.numel();
  TORCH_CHECK(cq[0] == 0 && cq[batch] == rows, op, ": cu_q must run from 0 to the number of token rows");
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(cq[b + 1] >= cq[b], op, ": cu_q must not decrease");
    TORCH_CHECK(cq[b + 1] - cq[b] <= max_q_len, op, ": sequence ", b, " is longer than max_q_len");
    TORCH_CHECK(sl[b] < num_slots, op, ": state slot ", sl[b], " is outside the state (", num_slots, " slots)");
    TORCH_CHECK(max_len < 0 || cq[b + 1] - cq[b] <= max_len, op, ": sequence ", b, " has ", cq[b + 1] - cq[b],
                " tokens, more than ", limit, " (", max_len, ")");
  }
}

static void check_accepted_host(const at::Tensor& slots, const at::Tensor& num_accepted, int64_t num_slots,
                                int64_t max_accept, const char* op) {
  const int32_t* sl = slots.data_ptr<int32_t>();
  const int32_t* m = num_accepted.data_ptr<int32_t>();
  for (int64_t b = 0; b < slots.numel(); ++b) {
    TORCH_CHECK(sl[b] < num_slots, op, ": state slot ", sl[b], " is outside the state (", num_slots, " slots)");
    TORCH_CHECK(m[b] >= 0 && m[b] <= max_accept, op, ": num_accepted[", b, "] = ", m[b], " is outside [0, ",
                max_accept, "]");
  }
}

at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight, at::Tensor& conv_state,
                         const at::Tensor& slots_in, const at::Tensor& cu_in, int64_t max_q_len, bool checkpoint) {
  check_conv1d_args(x, weight, conv_state, slots_in, cu_in);
  auto slots = slots_in.contiguous(), cu = cu_in.contiguous();
  const int64_t k = weight.size(1), width = conv_state.size(1);
  check_varlen_host(slots, cu, x.size(0), max_q_len, conv_state.size(0), checkpoint ? width - (k - 1) : -1, "causal_conv1d",
                    "the rows after the window");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  Conv1dArgs a{slots.numel(), x.size(1), k, width, x.stride(0), checkpoint};
  DSPINE_DISPATCH_FLOATS(x.scalar_type(), "causal_conv1d", [&] {
    cpu::causal_conv1d<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), conv_state.data_ptr<scalar_t>(),
                                 out.data_ptr<scalar_t>(), slots.data_ptr<int32_t>(), cu.data_ptr<int32_t>(), a);
  });
  return out;
}

void conv_state_commit(at::Tensor& conv_state, const at::Tensor& slots_in, const at::Tensor& accepted_in,
                       int64_t kernel_size) {
  check_conv_commit_args(conv_state, slots_in, accepted_in, kernel_size);
  auto slots = slots_in.contiguous(), accepted = accepted_in.contiguous();
  const int64_t s = conv_state.size(-3), w = conv_state.size(-2), c = conv_state.size(-1);
  check_accepted_host(slots, accepted, s, w - (kernel_size - 1), "conv_state_commit");
  const int64_t lead = s ? conv_state.numel() / (s * w * c) : 0;
  DSPINE_DISPATCH_FLOATS(conv_state.scalar_type(), "conv_state_commit", [&] {
    cpu::conv_state_commit<scalar_t>(conv_state.data_ptr<scalar_t>(), lead, s, w, c, slots.data_ptr<int32_t>(),
                                     accepted.data_ptr<int32_t>(), slots.numel(), kernel_size);
  });
}

static GatedDeltaArgs gdn_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                               const at::Tensor& b, int64_t batch, int64_t ring_len) {
  return GatedDeltaArgs{batch,       q.size(1),   v.size(1),   q.size(2),   v.size(2), q.stride(0),
                        k.stride(0), v.stride(0), a.stride(0), b.stride(0), ring_len};
}

template <typename T>
static GdnInputs<T> gdn_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                               const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias) {
  return GdnInputs<T>{q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), a.data_ptr<T>(), b.data_ptr<T>(),
                      a_log.data_ptr<float>(), dt_bias.data_ptr<float>()};
}

at::Tensor gated_delta_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                 const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                                 at::Tensor& state, const at::Tensor& slots_in, const at::Tensor& cu_in,
                                 int64_t max_q_len, at::Tensor& ring_k, at::Tensor& ring_u, at::Tensor& ring_g,
                                 at::Tensor& states_out) {
  const char* op = "gated_delta_recurrent";
  check_gated_delta_args(q, k, v, a, b, a_log, dt_bias, state, slots_in, cu_in, op);
  check_recurrent_outputs(q, state, ring_k, ring_u, ring_g, states_out, op);
  const bool ring = ring_k.numel() > 0;
  const int64_t ring_len = ring ? ring_k.size(1) : 0;
  auto slots = slots_in.contiguous(), cu = cu_in.contiguous();
  check_varlen_host(slots, cu, q.size(0), max_q_len, state.size(0), ring ? ring_len : -1, op, "the ring length");
  auto out = at::empty({v.size(0), v.size(1), v.size(2)}, q.options());
  const auto args = gdn_args(q, k, v, a, b, slots.numel(), ring_len);
  DSPINE_DISPATCH_FLOATS(q.scalar_type(), "gated_delta_recurrent", [&] {
    cpu::gated_delta_recurrent<scalar_t>(
        gdn_inputs<scalar_t>(q, k, v, a, b, a_log, dt_bias), state.data_ptr<float>(), out.data_ptr<scalar_t>(),
        slots.data_ptr<int32_t>(), cu.data_ptr<int32_t>(), ring ? ring_k.data_ptr<float>() : nullptr,
        ring ? ring_u.data_ptr<float>() : nullptr, ring ? ring_g.data_ptr<float>() : nullptr,
        states_out.numel() ? states_out.data_ptr<float>() : nullptr, args);
  });
  return out;
}

void gated_delta_replay(at::Tensor& state, const at::Tensor& ring_k, const at::Tensor& ring_u,
                        const at::Tensor& ring_g, const at::Tensor& slots_in, const at::Tensor& accepted_in) {
  check_replay_args(state, ring_k, ring_u, ring_g, slots_in, accepted_in);
  auto slots = slots_in.contiguous(), accepted = accepted_in.contiguous();
  const int64_t l = state.dim() - 4;
  const int64_t s = state.size(l), hv = state.size(l + 1), dk = state.size(l + 2), dv = state.size(l + 3);
  const int64_t r = ring_k.size(l + 1), hk = ring_k.size(l + 2);
  check_accepted_host(slots, accepted, s, r, "gated_delta_replay");
  const int64_t lead = s ? state.numel() / (s * hv * dk * dv) : 0;
  cpu::gated_delta_replay(state.data_ptr<float>(), ring_k.data_ptr<float>(), ring_u.data_ptr<float>(),
                          ring_g.data_ptr<float>(), slots.data_ptr<int32_t>(), accepted.data_ptr<int32_t>(), lead, s,
                          slots.numel(), r, hk, hv, dk, dv);
}

at::Tensor gated_delta_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                             const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                             at::Tensor& state, const at::Tensor& slots_in, const at::Tensor& cu_in,
                             int64_t max_q_len) {
  const char* op = "gated_delta_chunk";
  check_gated_delta_args(q, k, v, a, b, a_log, dt_bias, state, slots_in, cu_in, op);
  auto slots = slots_in.contiguous(), cu = cu_in.contiguous();
  check_varlen_host(slots, cu, q.size(0), max_q_len, state.size(0), -1, op, "");
  auto out = at::empty({v.size(0), v.size(1), v.size(2)}, q.options());
  const auto args = gdn_args(q, k, v, a, b, slots.numel(), 0);
  DSPINE_DISPATCH_FLOATS(q.scalar_type(), "gated_delta_chunk", [&] {
    cpu::gated_delta_chunk<scalar_t>(gdn_inputs<scalar_t>(q, k, v, a, b, a_log, dt_bias), state.data_ptr<float>(),
                                     out.data_ptr<scalar_t>(), slots.data_ptr<int32_t>(), cu.data_ptr<int32_t>(),
                                     args);
  });
  return out;
}

}  // namespace cpu
}  // namespace dspine
