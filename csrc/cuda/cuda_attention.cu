// Thin torch binding of the paged attention kernels (attention.cuh). Its own translation unit:
// the tensor-core instantiations dominate the build time, and this lets them compile in parallel.
#include <algorithm>
#include <cstdlib>

#include "attention.cuh"
#include "binding.h"

namespace dspine {
namespace cuda {

// DSPINE_ATTN_SPLITS=n forces the split-KV count of the tensor-core path (a tuning and testing
// aid: every count gives the same result up to fp32 rounding; 0 or unset keeps the heuristic).
// Read at every call, so a process can change it; a captured CUDA graph keeps its count.
static int forced_splits() {
  const char* env = std::getenv("DSPINE_ATTN_SPLITS");
  return env ? std::max(0, std::min(128, std::atoi(env))) : 0;
}

at::Tensor paged_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& kv_lens, const at::Tensor& cu_q,
                           int64_t max_q_len, bool causal, int64_t window, double scale, int64_t max_kv_len) {
  check_device("paged_attention", q_in, k_cache, v_cache, block_tables, kv_lens, cu_q);
  const c10::cuda::CUDAGuard guard(q_in.device());
  check_attention_args(q_in, k_cache, v_cache, block_tables, kv_lens, cu_q, max_kv_len);
  TORCH_CHECK(max_q_len >= 0, "paged_attention: max_q_len must be >= 0");
  TORCH_CHECK(k_cache.size(3) <= gpu::kSimtMaxHeadDim, "paged_attention: head_dim must be <= ",
              gpu::kSimtMaxHeadDim, " on CUDA");
  const bool mma = gpu::attention_uses_mma(q_in.scalar_type() != at::kFloat, static_cast<int>(q_in.size(2)));
  // The tensor-core path copies 16-byte chunks: query rows must start 16-byte aligned.
  const bool rows_aligned = gpu::is_aligned16(q_in.data_ptr()) && (q_in.stride(0) * q_in.element_size()) % 16 == 0;
  auto q = (mma && !rows_aligned) ? q_in.contiguous() : q_in;
  TORCH_CHECK(!mma || (gpu::is_aligned16(k_cache.data_ptr()) && gpu::is_aligned16(v_cache.data_ptr())),
              "paged_attention: caches must be 16-byte aligned");
  auto kl = kv_lens.contiguous(), cq = cu_q.contiguous();
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());

  gpu::PagedAttentionParams p{};
  p.q = q.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.out = out.data_ptr();
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.kv_lens = kl.data_ptr<int32_t>();
  p.cu_q = cq.data_ptr<int32_t>();
  p.q_row_stride = q.stride(0);
  p.num_tokens = q.size(0);
  p.num_pages = k_cache.size(0);
  p.batch = static_cast<int>(kl.numel());
  p.q_heads = static_cast<int>(q.size(1));
  p.kv_heads = static_cast<int>(k_cache.size(2));
  p.head_dim = static_cast<int>(q.size(2));
  p.page_size = static_cast<int>(k_cache.size(1));
  p.max_pages = static_cast<int>(block_tables.size(1));
  p.max_q_len = static_cast<int>(max_q_len);
  p.window = static_cast<int>(window);
  p.causal = causal;
  p.scale = static_cast<float>(scale);
  TORCH_CHECK(max_q_len * (p.q_heads / p.kv_heads) <= 64LL * 65535, "paged_attention: max_q_len is too large");
  at::Tensor workspace;
  dispatch_float(q.scalar_type(), "paged_attention", [&](auto tag) {
    using T = decltype(tag);
    gpu::plan_attention_splits<T>(p, num_sms(), max_kv_len, forced_splits());
    if (p.num_splits > 1) {
      workspace = at::empty({gpu::attention_workspace_floats(p)}, q.options().dtype(at::kFloat));
      gpu::bind_attention_workspace(p, workspace.data_ptr<float>());
    }
    gpu::launch_paged_attention<T>(p, stream());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace cuda
}  // namespace dspine
