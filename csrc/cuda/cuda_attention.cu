// Thin torch binding of the paged attention kernels (attention.cuh). Its own translation unit:
// the tensor-core instantiations dominate the build time, and this lets them compile in parallel.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "attention.cuh"
#include "attention_heuristics.h"
#include "attention_sm90.h"
#include "binding.h"

namespace dspine {
namespace cuda {

// The attention knobs below are read at every call (binding.h, env_int).

// DSPINE_ATTN_SPLITS=n forces the split-KV count of the tensor-core path (a tuning and testing
// aid: every count gives the same result up to fp32 rounding; 0 or unset keeps the heuristic).
static int forced_splits() { return std::max(0, std::min(128, env_int("DSPINE_ATTN_SPLITS", 0))); }

// DSPINE_ATTN_SM90 unset: the Hopper wgmma kernel takes prefill calls (every one it supports)
// and nothing else; =0 keeps every call off it, =1 sends it every shape it supports, =auto adds
// the batch-dependent heuristic for the other calls (attention_heuristics.h says why that is
// opt-in).
static int forced_sm90() {
  const char* env = std::getenv("DSPINE_ATTN_SM90");
  if (env == nullptr || env[0] == '\0') return gpu::kSm90Default;
  if (std::strcmp(env, "auto") == 0) return gpu::kSm90Auto;
  return env_int("DSPINE_ATTN_SM90", 0) != 0 ? 1 : 0;
}

// DSPINE_ATTN_KEY_SPLIT=0 runs blocks of <= 16 rows (decode) on the row-tile variant too (a
// diagnostic of where a decode row and a verify row differ; attention.cuh, row_tiles_only).
static bool row_tiles_only() { return env_int("DSPINE_ATTN_KEY_SPLIT", 1) == 0; }

// DSPINE_ATTN_EXACT=1: row-exact attention (attention.cuh, plan_exact_segments) for every call of
// the process, as the op's `exact` argument (the engine's default) gives one call: every row
// summed one way, so greedy speculative output equals autoregressive output token for token on
// the GPU too. =2: the same on the key-split variant (a measurement, attention.cuh says what it
// trades). Either overrides DSPINE_ATTN_SPLITS and the sm90 path (which never splits).
static int exact_env() { return env_int("DSPINE_ATTN_EXACT", 0); }

// DSPINE_ATTN_EXACT_SEGMENT=n: keys a row-exact segment holds (a power of two, 64..1024; default
// 256), a measurement of the mode's latency against its partials' traffic (plan_exact_segments).
// Rows stay exact against each other only while every call of the process uses one value.
static int exact_segment_keys() {
  const int keys = env_int("DSPINE_ATTN_EXACT_SEGMENT", gpu::kExactSegmentKeys);
  TORCH_CHECK(gpu::valid_exact_segment_keys(keys),
              "DSPINE_ATTN_EXACT_SEGMENT must be a power of two from 64 to 1024, got ", keys);
  return keys;
}

// Launches the Hopper wgmma kernel where the dispatch (attention_heuristics.h) picks it for p;
// false where the mma.sync or CUDA-core kernels run p instead.
template <typename T>
static bool launched_sm90(gpu::PagedAttentionParams& p, bool prefill) {
  if constexpr (std::is_same<T, float>::value) {
    return false;
  } else {
    const gpu::AttentionShape shape{true, p.head_dim, p.q_heads, p.kv_heads, p.batch, p.max_q_len, p.window, prefill};
    const int forced = forced_sm90();
    gpu::AttentionDevice dev{0, 0, num_sms(), false};
    dev.cc_major = device_attribute(cudaDevAttrComputeCapabilityMajor);
    dev.cc_minor = device_attribute(cudaDevAttrComputeCapabilityMinor);
    // Asked only where it could matter: the image query costs a runtime call on first use.
    dev.sm90_runnable = forced != 0 && dev.cc_major == 9 && gpu::attention_sm90_supports(shape) &&
                        gpu::attention_sm90_runnable<T>();
    if (gpu::choose_attention_path(shape, dev, forced) != gpu::AttentionPath::kSm90) return false;
    p.num_splits = 1;  // the sm90 kernel never splits keys
    gpu::launch_attention_sm90<T>(p, stream());
    return true;
  }
}

at::Tensor paged_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& kv_lens, const at::Tensor& cu_q,
                           int64_t max_q_len, bool causal, int64_t window, double scale, int64_t max_kv_len,
                           bool exact_arg, bool prefill) {
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
  p.row_tiles_only = row_tiles_only();
  TORCH_CHECK(max_q_len * (p.q_heads / p.kv_heads) <= 64LL * 65535, "paged_attention: max_q_len is too large");
  const int exact_mode = exact_env();
  const bool exact = exact_arg || exact_mode != 0;
  // The wgmma kernel sums each row over absolute 128-key tiles from the first key, whatever the
  // call's other rows, so a prefill is exact on it too; DSPINE_ATTN_EXACT still forces the
  // mma.sync row-exact path everywhere (a measurement).
  const bool sm90_allowed = exact_mode == 0 && (!exact_arg || prefill);
  at::Tensor workspace;
  dispatch_float(q.scalar_type(), "paged_attention", [&](auto tag) {
    using T = decltype(tag);
    if (sm90_allowed && launched_sm90<T>(p, prefill)) return;
    if (!(exact && gpu::plan_exact_segments<T>(p, max_kv_len, exact_mode == 2, exact_segment_keys())))
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

// Launches of the sm90 kernel so far (0 in a build without it): the GPU tests check with it that
// the dispatch took the path they meant to test.
static int64_t attention_sm90_launches() { return gpu::attention_sm90_launches(); }
static int64_t attention_sm90_tma_launches() { return gpu::attention_sm90_tma_launches(); }

// 1 when this build has the sm90 kernel and its image runs on the current device.
static int64_t attention_sm90_available() {
  return gpu::attention_sm90_runnable<__nv_bfloat16>() && gpu::attention_sm90_runnable<__half>() ? 1 : 0;
}

}  // namespace cuda
}  // namespace dspine

TORCH_LIBRARY_FRAGMENT(dspine, m) {
  m.def("attention_sm90_launches() -> int", &dspine::cuda::attention_sm90_launches);
  m.def("attention_sm90_tma_launches() -> int", &dspine::cuda::attention_sm90_tma_launches);
  m.def("attention_sm90_available() -> int", &dspine::cuda::attention_sm90_available);
}
