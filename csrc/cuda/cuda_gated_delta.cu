// Thin torch bindings of the CUDA Gated DeltaNet kernels (conv1d.cuh, gated_delta.cuh): the same
// argument checks as the CPU bindings, outputs from the caching allocator, launches on the
// current stream. Device metadata is never read on the host (graph-capturable): slots outside
// the state, and tokens past a ring, are skipped by the kernels instead of refused.
#include "binding.h"
#include "conv1d.cuh"
#include "gated_delta.cuh"

namespace dspine {
namespace cuda {

static_assert(gpu::kGdnMaxDim >= kGdnMaxHeadDim, "the CUDA kernels must hold the largest head dim");

static void check_grid(int64_t batch, const char* op) {
  TORCH_CHECK(batch < 65536, op, ": batch must be < 65536 on CUDA");
}

at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight, at::Tensor& conv_state,
                         const at::Tensor& slots_in, const at::Tensor& cu_in, int64_t max_q_len, bool checkpoint) {
  check_device("causal_conv1d", x, weight, conv_state, slots_in, cu_in);
  const c10::cuda::CUDAGuard guard(x.device());
  check_conv1d_args(x, weight, conv_state, slots_in, cu_in);
  check_grid(slots_in.numel(), "causal_conv1d");
  TORCH_CHECK(max_q_len >= 0 && max_q_len < 65535LL * gpu::kConvTokenTile, "causal_conv1d: max_q_len out of range");
  auto slots = slots_in.contiguous(), cu = cu_in.contiguous();
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  gpu::Conv1dParams p{x.data_ptr(), weight.data_ptr(), conv_state.data_ptr(), out.data_ptr(),
                      slots.data_ptr<int32_t>(), cu.data_ptr<int32_t>(), x.stride(0), conv_state.size(0),
                      static_cast<int>(slots.numel()), static_cast<int>(x.size(1)), static_cast<int>(weight.size(1)),
                      static_cast<int>(conv_state.size(1)), static_cast<int>(max_q_len), checkpoint};
  dispatch_float(x.scalar_type(), "causal_conv1d", [&](auto tag) {
    gpu::launch_causal_conv1d<decltype(tag)>(p, stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void conv_state_commit(at::Tensor& conv_state, const at::Tensor& slots_in, const at::Tensor& accepted_in,
                       int64_t kernel_size) {
  check_device("conv_state_commit", conv_state, slots_in, accepted_in);
  const c10::cuda::CUDAGuard guard(conv_state.device());
  check_conv_commit_args(conv_state, slots_in, accepted_in, kernel_size);
  auto slots = slots_in.contiguous(), accepted = accepted_in.contiguous();
  const int64_t s = conv_state.size(-3), w = conv_state.size(-2), c = conv_state.size(-1);
  const int64_t lead = s ? conv_state.numel() / (s * w * c) : 0;
  dispatch_float(conv_state.scalar_type(), "conv_state_commit", [&](auto tag) {
    using T = decltype(tag);
    gpu::launch_conv_state_commit<T>(ptr<T>(conv_state), slots.data_ptr<int32_t>(), accepted.data_ptr<int32_t>(),
                                     lead, s, static_cast<int>(w), static_cast<int>(c), static_cast<int>(kernel_size),
                                     static_cast<int>(slots.numel()), stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

static gpu::GdnParams gdn_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                 const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                                 at::Tensor& state, const at::Tensor& slots, const at::Tensor& cu, const at::Tensor& out) {
  gpu::GdnParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.a_log = a_log.data_ptr<float>();
  p.dt_bias = dt_bias.data_ptr<float>();
  p.state = state.data_ptr<float>();
  p.out = out.data_ptr();
  p.slots = slots.data_ptr<int32_t>();
  p.cu_q = cu.data_ptr<int32_t>();
  p.q_stride = q.stride(0);
  p.k_stride = k.stride(0);
  p.v_stride = v.stride(0);
  p.a_stride = a.stride(0);
  p.b_stride = b.stride(0);
  p.num_slots = state.size(0);
  p.batch = static_cast<int>(slots.numel());
  p.hk = static_cast<int>(q.size(1));
  p.hv = static_cast<int>(v.size(1));
  p.dk = static_cast<int>(q.size(2));
  p.dv = static_cast<int>(v.size(2));
  return p;
}

at::Tensor gated_delta_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                                 const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                                 at::Tensor& state, const at::Tensor& slots_in, const at::Tensor& cu_in,
                                 int64_t max_q_len, at::Tensor& ring_k, at::Tensor& ring_u, at::Tensor& ring_g,
                                 at::Tensor& states_out) {
  const char* op = "gated_delta_recurrent";
  check_device(op, q, k, v, a, b, a_log, dt_bias, state, slots_in, cu_in, ring_k, ring_u, ring_g, states_out);
  const c10::cuda::CUDAGuard guard(q.device());
  check_gated_delta_args(q, k, v, a, b, a_log, dt_bias, state, slots_in, cu_in, op);
  check_grid(slots_in.numel(), op);
  check_recurrent_outputs(q, state, ring_k, ring_u, ring_g, states_out, op);
  const bool ring = ring_k.numel() > 0;
  auto slots = slots_in.contiguous(), cu = cu_in.contiguous();
  auto out = at::empty({v.size(0), v.size(1), v.size(2)}, q.options());
  auto p = gdn_params(q, k, v, a, b, a_log, dt_bias, state, slots, cu, out);
  if (ring) {
    p.ring_k = ring_k.data_ptr<float>();
    p.ring_u = ring_u.data_ptr<float>();
    p.ring_g = ring_g.data_ptr<float>();
    p.ring_len = static_cast<int>(ring_k.size(1));
  }
  if (states_out.numel() > 0) p.states_out = states_out.data_ptr<float>();
  dispatch_float(q.scalar_type(), op, [&](auto tag) { gpu::launch_gated_delta_recurrent<decltype(tag)>(p, stream()); });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void gated_delta_replay(at::Tensor& state, const at::Tensor& ring_k, const at::Tensor& ring_u,
                        const at::Tensor& ring_g, const at::Tensor& slots_in, const at::Tensor& accepted_in) {
  check_device("gated_delta_replay", state, ring_k, ring_u, ring_g, slots_in, accepted_in);
  const c10::cuda::CUDAGuard guard(state.device());
  check_replay_args(state, ring_k, ring_u, ring_g, slots_in, accepted_in);
  auto slots = slots_in.contiguous(), accepted = accepted_in.contiguous();
  const int64_t l = state.dim() - 4;
  gpu::GdnReplayParams p{};
  p.state = state.data_ptr<float>();
  p.ring_k = ring_k.data_ptr<float>();
  p.ring_u = ring_u.data_ptr<float>();
  p.ring_g = ring_g.data_ptr<float>();
  p.slots = slots.data_ptr<int32_t>();
  p.num_accepted = accepted.data_ptr<int32_t>();
  p.num_slots = state.size(l);
  p.lead = p.num_slots ? state.numel() / (p.num_slots * state.size(l + 1) * state.size(l + 2) * state.size(l + 3)) : 0;
  p.batch = static_cast<int>(slots.numel());
  p.ring_len = static_cast<int>(ring_k.size(l + 1));
  p.hk = static_cast<int>(ring_k.size(l + 2));
  p.hv = static_cast<int>(state.size(l + 1));
  p.dk = static_cast<int>(state.size(l + 2));
  p.dv = static_cast<int>(state.size(l + 3));
  TORCH_CHECK(p.dk <= gpu::kGdnMaxDim, "gated_delta_replay: k_dim must be <= ", gpu::kGdnMaxDim);
  gpu::launch_gated_delta_replay(p, stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor gated_delta_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
                             const at::Tensor& b, const at::Tensor& a_log, const at::Tensor& dt_bias,
                             at::Tensor& state, const at::Tensor& slots_in, const at::Tensor& cu_in,
                             int64_t max_q_len) {
  const char* op = "gated_delta_chunk";
  check_device(op, q, k, v, a, b, a_log, dt_bias, state, slots_in, cu_in);
  const c10::cuda::CUDAGuard guard(q.device());
  check_gated_delta_args(q, k, v, a, b, a_log, dt_bias, state, slots_in, cu_in, op);
  check_grid(slots_in.numel(), op);
  auto slots = slots_in.contiguous(), cu = cu_in.contiguous();
  auto out = at::empty({v.size(0), v.size(1), v.size(2)}, q.options());
  const auto p = gdn_params(q, k, v, a, b, a_log, dt_bias, state, slots, cu, out);
  bool fits = true;
  dispatch_float(q.scalar_type(), op, [&](auto tag) { fits = gpu::launch_gated_delta_chunk<decltype(tag)>(p, stream()); });
  TORCH_CHECK(fits, op, ": k_dim ", q.size(2), " needs more shared memory than the device has");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace cuda
}  // namespace dspine
