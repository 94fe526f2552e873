// Thin torch bindings of the CUDA kernels (all ops but attention, see cuda_attention.cu): argument
// checks (the same as the CPU bindings), output/workspace allocation through the caching
// allocator, launch on the current stream. No host reads of device memory: graph-capturable.
#include <algorithm>
#include <cstdlib>

#include "activation.cuh"
#include "binding.h"
#include "injection.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "transition.cuh"
#include "verify.cuh"

namespace dspine {
namespace cuda {

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  check_device("rms_norm", x_in, weight);
  const c10::cuda::CUDAGuard guard(x_in.device());
  auto x = x_in.contiguous(), w = weight.contiguous();
  check_norm_rows(x, w, "rms_norm");
  auto out = at::empty_like(x);
  const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
  dispatch_float(x.scalar_type(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    gpu::launch_rms_norm<T>(ptr<T>(x), nullptr, ptr<T>(w), ptr<T>(out), nullptr, rows, static_cast<int>(d),
                            static_cast<float>(eps), stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x_in, const at::Tensor& res_in,
                                                const at::Tensor& weight, double eps) {
  check_device("add_rms_norm", x_in, res_in, weight);
  const c10::cuda::CUDAGuard guard(x_in.device());
  auto x = x_in.contiguous(), res = res_in.contiguous(), w = weight.contiguous();
  check_norm_rows(x, w, "add_rms_norm");
  TORCH_CHECK(res.sizes() == x.sizes() && res.scalar_type() == x.scalar_type(), "add_rms_norm: residual must match x");
  auto out = at::empty_like(x), sum = at::empty_like(x);
  const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
  dispatch_float(x.scalar_type(), "add_rms_norm", [&](auto tag) {
    using T = decltype(tag);
    gpu::launch_rms_norm<T>(ptr<T>(x), ptr<T>(res), ptr<T>(w), ptr<T>(out), ptr<T>(sum), rows,
                            static_cast<int>(d), static_cast<float>(eps), stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, sum};
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin,
                const std::optional<at::Tensor>& norm, double eps) {
  check_device("rope", x, positions, cos_sin);
  const c10::cuda::CUDAGuard guard(x.device());
  check_token_rows(x, "rope");
  check_rope_table(positions, cos_sin, x.size(0), x.size(2));
  check_head_norm(norm, x, "rope");
  auto out = at::empty(x.sizes(), x.options());
  auto pos = positions.contiguous();
  dispatch_float(x.scalar_type(), "rope", [&](auto tag) {
    using T = decltype(tag);
    const gpu::RopeArgs<T> xa{ptr<T>(x), x.stride(0), ptr<T>(out), static_cast<int>(x.size(1)),
                              norm ? ptr<T>(*norm) : nullptr};
    gpu::launch_rope_write_kv<T>(xa, gpu::WriteKvArgs<T>{}, pos.data_ptr<int32_t>(), cos_sin.data_ptr<float>(),
                                 static_cast<int>(cos_sin.size(0)), x.size(0), static_cast<int>(x.size(2)), stream(),
                                 static_cast<float>(eps));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

void write_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions, const at::Tensor& cos_sin,
              at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
              const std::optional<at::Tensor>& k_norm, double eps) {
  check_device("write_kv", k, v, positions, cos_sin, k_cache, v_cache, slots);
  const c10::cuda::CUDAGuard guard(k.device());
  check_write_kv_args(k, v, positions, cos_sin, k_cache, v_cache, slots);
  check_head_norm(k_norm, k, "write_kv");
  const bool rotate = cos_sin.numel() > 0;
  auto pos = positions.contiguous(), sl = slots.contiguous();
  // Slots past the cache cannot be rejected without reading them on the host; the kernel skips them.
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);
  dispatch_float(k.scalar_type(), "write_kv", [&](auto tag) {
    using T = decltype(tag);
    const gpu::WriteKvArgs<T> kva{ptr<T>(k),       k.stride(0),     ptr<T>(v),
                                  v.stride(0),     ptr<T>(k_cache), ptr<T>(v_cache),
                                  sl.data_ptr<int32_t>(), capacity, static_cast<int>(k.size(1)),
                                  k_norm ? ptr<T>(*k_norm) : nullptr};
    gpu::launch_rope_write_kv<T>(gpu::RopeArgs<T>{}, kva, rotate ? pos.data_ptr<int32_t>() : nullptr,
                                 rotate ? cos_sin.data_ptr<float>() : nullptr,
                                 rotate ? static_cast<int>(cos_sin.size(0)) : 0, k.size(0),
                                 static_cast<int>(k.size(2)), stream(), static_cast<float>(eps));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor rope_write_kv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                         const at::Tensor& cos_sin, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
                         const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                         double eps) {
  check_device("rope_write_kv", q, k, v, positions, cos_sin, k_cache, v_cache, slots);
  const c10::cuda::CUDAGuard guard(q.device());
  check_rope_write_kv_args(q, k, v, positions, cos_sin, k_cache, v_cache, slots, q_norm, k_norm);
  auto out = at::empty(q.sizes(), q.options());
  auto pos = positions.contiguous(), sl = slots.contiguous();
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);  // slots past it are skipped (write_kv)
  dispatch_float(q.scalar_type(), "rope_write_kv", [&](auto tag) {
    using T = decltype(tag);
    const T* qn = q_norm ? ptr<T>(*q_norm) : nullptr;
    const T* kn = k_norm ? ptr<T>(*k_norm) : nullptr;
    const gpu::RopeArgs<T> qa{ptr<T>(q), q.stride(0), ptr<T>(out), static_cast<int>(q.size(1)), qn};
    const gpu::WriteKvArgs<T> kva{ptr<T>(k),       k.stride(0),           ptr<T>(v), v.stride(0),
                                  ptr<T>(k_cache), ptr<T>(v_cache),       sl.data_ptr<int32_t>(),
                                  capacity,        static_cast<int>(k.size(1)), kn};
    gpu::launch_rope_write_kv<T>(qa, kva, pos.data_ptr<int32_t>(), cos_sin.data_ptr<float>(),
                                 static_cast<int>(cos_sin.size(0)), q.size(0), static_cast<int>(q.size(2)), stream(),
                                 static_cast<float>(eps));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor silu_mul(const at::Tensor& x_in) {
  check_device("silu_mul", x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  check_silu_mul_args(x_in);
  auto x = x_in.contiguous();
  const int64_t inter = x.size(1) / 2;
  auto out = at::empty({x.size(0), inter}, x.options());
  dispatch_float(x.scalar_type(), "silu_mul", [&](auto tag) {
    using T = decltype(tag);
    gpu::launch_silu_mul<T>(ptr<T>(x), ptr<T>(out), x.size(0), inter, stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor fused_injection(const at::Tensor& h_in, const at::Tensor& gate_in, const at::Tensor& fproj_in) {
  check_device("fused_injection", h_in, gate_in, fproj_in);
  const c10::cuda::CUDAGuard guard(h_in.device());
  check_injection_args(h_in, gate_in, fproj_in);
  auto h = h_in.contiguous(), g = gate_in.contiguous(), f = fproj_in.contiguous();
  auto out = at::empty_like(h);
  dispatch_float(h.scalar_type(), "fused_injection", [&](auto tag) {
    using T = decltype(tag);
    gpu::launch_fused_injection<T>(ptr<T>(h), ptr<T>(g), ptr<T>(f), ptr<T>(out), h.size(0),
                                   static_cast<int>(h.size(1)), static_cast<int>(h.size(2)), stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// Rows of V elements can use 16-byte loads when every row starts 16-byte aligned.
static bool rows_vectorisable(const at::Tensor& t, int64_t row_len) {
  return gpu::is_aligned16(t.data_ptr()) && (row_len * static_cast<int64_t>(t.element_size())) % 16 == 0;
}

// DSPINE_WALK_SPLITS=n slices every row of the walk's top-k pass into n (at most 16; a testing
// and tuning aid: the candidates are the same for every n); 0 or unset keeps the heuristic. Read at
// every call (binding.h, env_int).
static int forced_walk_splits() { return std::max(0, env_int("DSPINE_WALK_SPLITS", 0)); }
// DSPINE_VERIFY_RADIX=1: the sampled rows' top-k / top-p thresholds by radix passes only (the
// candidate search's baseline; both give the same thresholds).
static bool verify_radix_only() { return env_int("DSPINE_VERIFY_RADIX", 0) != 0; }

std::tuple<at::Tensor, at::Tensor, at::Tensor> transition_walk(
    const at::Tensor& logits_in, const at::Tensor& g_in, const at::Tensor& pred_in, const at::Tensor& succ_in,
    const at::Tensor& anchor_in, int64_t top_k, const at::Tensor& temp_in, const at::Tensor& u_in) {
  check_device("transition_walk", logits_in, g_in, pred_in, succ_in, anchor_in, temp_in, u_in);
  const c10::cuda::CUDAGuard guard(logits_in.device());
  check_walk_args(logits_in, g_in, pred_in, succ_in, anchor_in, top_k, temp_in, u_in);
  TORCH_CHECK(top_k <= gpu::kWalkMaxK, "transition_walk: top_k must be <= ", gpu::kWalkMaxK, " on CUDA");
  auto logits = logits_in.contiguous(), anchor = anchor_in.contiguous(), temp = temp_in.contiguous(),
       u = u_in.contiguous();
  const bool use_t = g_in.numel() > 0;
  auto g = use_t ? g_in.contiguous() : g_in, pred = use_t ? pred_in.contiguous() : pred_in,
       succ = use_t ? succ_in.contiguous() : succ_in;
  const int64_t b = logits.size(0), j = logits.size(1), v = logits.size(2);
  TORCH_CHECK(v < INT32_MAX && b * j < INT32_MAX, "transition_walk: too large");
  auto opts = logits.options();
  auto tokens = at::empty({b, j}, opts.dtype(at::kLong));
  auto cand_ids = at::empty({b, j, top_k}, opts.dtype(at::kLong));
  auto cand_probs = at::empty({b, j, top_k}, opts.dtype(at::kFloat));
  auto cand_vals = at::empty({b, j, top_k}, opts.dtype(at::kFloat));
  auto pair = at::empty({b, j, top_k, top_k}, opts.dtype(at::kFloat));
  auto arrivals = at::zeros({b}, opts.dtype(at::kInt));
  gpu::WalkParams p{};
  p.logits = logits.data_ptr();
  p.g = use_t ? g.data_ptr() : nullptr;
  p.pred = use_t ? pred.data_ptr() : nullptr;
  p.succ = use_t ? succ.data_ptr() : nullptr;
  p.anchor = anchor.data_ptr<int64_t>();
  p.temperature = temp.data_ptr<float>();
  p.uniforms = u.data_ptr<float>();
  p.tokens = tokens.data_ptr<int64_t>();
  p.cand_ids = cand_ids.data_ptr<int64_t>();
  p.cand_probs = cand_probs.data_ptr<float>();
  p.cand_vals = cand_vals.data_ptr<float>();
  p.pair = pair.data_ptr<float>();
  p.arrivals = arrivals.data_ptr<int>();
  p.batch = static_cast<int>(b);
  p.positions = static_cast<int>(j);
  p.vocab = static_cast<int>(v);
  p.rank = use_t ? static_cast<int>(g.size(2)) : 0;
  p.top_k = static_cast<int>(top_k);
  p.vec_ok = rows_vectorisable(logits, v);
  const int64_t entries = gpu::plan_walk_topk(p, num_sms(), forced_walk_splits());
  at::Tensor split_vals, split_ids;  // kept alive until the launches are queued
  if (entries > 0) {
    split_vals = at::empty({entries}, opts.dtype(at::kFloat));
    split_ids = at::empty({entries}, opts.dtype(at::kInt));
    p.split_vals = split_vals.data_ptr<float>();
    p.split_ids = split_ids.data_ptr<int>();
  }
  dispatch_float(logits.scalar_type(), "transition_walk", [&](auto tag) {
    using T = decltype(tag);
    TORCH_CHECK(gpu::walk_smem_bytes(p, sizeof(T)) <= static_cast<size_t>(gpu::walk_smem_limit<T>()),
                "transition_walk: positions * top_k^2 or top_k * rank is too large for shared memory");
    gpu::launch_transition_walk<T>(p, stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {tokens, cand_ids, cand_probs};
}

std::tuple<at::Tensor, at::Tensor> block_verify(
    const at::Tensor& logits_in, const at::Tensor& draft_in, const at::Tensor& cid_in, const at::Tensor& cp_in,
    const at::Tensor& temp_in, const at::Tensor& tk_in, const at::Tensor& tp_in, const at::Tensor& u_in) {
  check_device("block_verify", logits_in, draft_in, cid_in, cp_in, temp_in, tk_in, tp_in, u_in);
  const c10::cuda::CUDAGuard guard(logits_in.device());
  check_verify_args(logits_in, draft_in, cid_in, cp_in, temp_in, tk_in, tp_in, u_in);
  auto logits = logits_in.contiguous(), draft = draft_in.contiguous(), cid = cid_in.contiguous(),
       cp = cp_in.contiguous(), temp = temp_in.contiguous(), tk = tk_in.contiguous(), tp = tp_in.contiguous(),
       u = u_in.contiguous();
  const int64_t b = logits.size(0), t = logits.size(1), v = logits.size(2);
  TORCH_CHECK(v < INT32_MAX && b * t < INT32_MAX && cid.size(2) < INT32_MAX, "block_verify: too large");
  auto opts = logits.options();
  auto accept = at::empty({b}, opts.dtype(at::kInt));
  auto out = at::empty({b, t}, opts.dtype(at::kLong));
  static_assert(sizeof(gpu::VerifyRow) == 32, "VerifyRow is read back as two 16-byte words");
  gpu::VerifyParams p{};
  p.logits = logits.data_ptr();
  p.draft_tokens = draft.data_ptr<int64_t>();
  p.cand_ids = cid.data_ptr<int64_t>();
  p.cand_probs = cp.data_ptr<float>();
  p.temperature = temp.data_ptr<float>();
  p.top_k = tk.data_ptr<int32_t>();
  p.top_p = tp.data_ptr<float>();
  p.uniforms = u.data_ptr<float>();
  p.accept_len = accept.data_ptr<int32_t>();
  p.out_tokens = out.data_ptr<int64_t>();
  p.batch = static_cast<int>(b);
  p.block = static_cast<int>(t);
  p.vocab = static_cast<int>(v);
  p.cand = static_cast<int>(cid.size(2));
  p.chunk_len = gpu::row_chunk_len(v);
  p.vec_ok = rows_vectorisable(logits, v);
  p.radix_only = verify_radix_only();
  // One workspace (the caching allocator's blocks are 512-byte aligned); its counters zeroed.
  const gpu::VerifyWorkspace w = gpu::plan_verify(p, num_sms());
  auto workspace = at::empty({static_cast<int64_t>(w.bytes)}, opts.dtype(at::kByte));
  gpu::bind_verify_workspace(p, w, static_cast<char*>(workspace.data_ptr()));
  C10_CUDA_CHECK(cudaMemsetAsync(p.arrivals, 0, w.counter_bytes, stream()));
  dispatch_float(logits.scalar_type(), "block_verify", [&](auto tag) {
    using T = decltype(tag);
    gpu::launch_block_verify<T>(p, stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {accept, out};
}

}  // namespace cuda
}  // namespace dspine
