// The CUDA entry points of dspine_kernels_cuda.h: the shape checks of the CPU API, then the fp32
// launch of the kernel templates in csrc/cuda. Index arrays stay on the device (never read
// here), so every call is asynchronous and graph-capturable; scratch memory is stream-ordered.
#include "dspine_kernels_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "capi_internal.h"
#include "cuda/attention.cuh"
#include "cuda/injection.cuh"
#include "cuda/norm.cuh"
#include "cuda/rope.cuh"
#include "cuda/transition.cuh"
#include "cuda/verify.cuh"

static_assert(std::is_same<dspine_cuda_stream, cudaStream_t>::value,
              "dspine_cuda_stream must be cudaStream_t under another name");

namespace {

using namespace dspine::capi;

void cuda_check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess) throw CudaFailure{concat(op, ": ", what, ": ", cudaGetErrorString(err))};
}

void check_launch(const char* op) { cuda_check(cudaGetLastError(), op, "kernel launch"); }

// The kernels index with int: sizes past INT_MAX are rejected instead of wrapping.
void require_int(int64_t value, const char* op, const char* name) {
  require(value >= 0 && value <= INT_MAX, op, ": ", name, " = ", value, " is too large for the CUDA kernels");
}

int device_attribute(cudaDeviceAttr attr, const char* op) {
  int device = 0, value = 0;
  cuda_check(cudaGetDevice(&device), op, "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&value, attr, device), op, "cudaDeviceGetAttribute");
  return value;
}

// Stream-ordered scratch memory, given back on `stream` when the call returns (or throws).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream, const char* op) : stream_(stream) {
    if (bytes > 0) cuda_check(cudaMallocAsync(&ptr_, bytes, stream), op, "cudaMallocAsync");
  }
  ~StreamScratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// Rows of `row_len` floats may use 16-byte loads when every row starts 16-byte aligned.
bool rows_vectorisable(const void* base, int64_t row_len) {
  return dspine::gpu::is_aligned16(base) && (row_len * static_cast<int64_t>(sizeof(float))) % 16 == 0;
}

dspine::gpu::PagedAttentionParams attention_params(const float* q, const float* k_cache, const float* v_cache,
                                                   float* out, const int32_t* block_tables, const int32_t* kv_lens,
                                                   const int32_t* cu_q, int64_t num_q_tokens, int64_t max_q_len,
                                                   const dspine_attention_args& a) {
  dspine::gpu::PagedAttentionParams p{};
  p.q = q;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.out = out;
  p.block_tables = block_tables;
  p.kv_lens = kv_lens;
  p.cu_q = cu_q;
  p.q_row_stride = attention_q_stride(a);
  p.num_tokens = num_q_tokens;
  p.num_pages = a.num_pages;
  p.batch = static_cast<int>(a.batch);
  p.q_heads = static_cast<int>(a.q_heads);
  p.kv_heads = static_cast<int>(a.kv_heads);
  p.head_dim = static_cast<int>(a.head_dim);
  p.page_size = static_cast<int>(a.page_size);
  p.max_pages = static_cast<int>(a.max_pages);
  p.max_q_len = static_cast<int>(max_q_len);
  p.window = a.window > 0 ? static_cast<int>(std::min<int64_t>(a.window, INT_MAX)) : 0;
  p.causal = a.causal != 0;
  p.scale = a.scale;
  return p;
}

void check_attention_limits(const dspine_attention_args& a, int64_t num_q_tokens, int64_t max_q_len) {
  const char* op = "cuda paged_attention";
  for (auto [value, name] : {std::pair<int64_t, const char*>{a.batch, "batch"}, {a.q_heads, "q_heads"},
                             {a.page_size, "page_size"}, {a.max_pages, "max_pages"}, {num_q_tokens, "num_q_tokens"},
                             {max_q_len, "max_q_len"}})
    require_int(value, op, name);
  require(a.head_dim <= dspine::gpu::kSimtMaxHeadDim, op, ": head_dim must be <= ", dspine::gpu::kSimtMaxHeadDim);
  require(max_q_len * (a.q_heads / a.kv_heads) <= 64LL * 65535, op, ": max_q_len is too large");
}

}  // namespace

extern "C" {

dspine_status dspine_cuda_rms_norm_f32(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                                       float eps, dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda rms_norm";
    if (!norm_has_work(op, rows, dim)) return;
    require_int(dim, op, "dim");
    require_ptrs(op, {{x, "x"}, {weight, "weight"}, {out, "out"}});
    dspine::gpu::launch_rms_norm<float>(x, nullptr, weight, out, nullptr, rows, static_cast<int>(dim), eps, stream);
    check_launch(op);
  });
}

dspine_status dspine_cuda_add_rms_norm_f32(const float* x, const float* residual, const float* weight, float* out,
                                           float* residual_out, int64_t rows, int64_t dim, float eps,
                                           dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda add_rms_norm";
    if (!norm_has_work(op, rows, dim)) return;
    require_int(dim, op, "dim");
    require_ptrs(op, {{x, "x"}, {residual, "residual"}, {weight, "weight"}, {out, "out"},
                      {residual_out, "residual_out"}});
    require(out != residual_out, op, ": out and residual_out must be different buffers");
    dspine::gpu::launch_rms_norm<float>(x, residual, weight, out, residual_out, rows, static_cast<int>(dim), eps,
                                        stream);
    check_launch(op);
  });
}

dspine_status dspine_cuda_rope_f32(const float* x, int64_t x_token_stride, float* out, const int32_t* positions,
                                   const float* cos_sin, int64_t cos_sin_rows, int64_t tokens, int64_t heads,
                                   int64_t head_dim, dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda rope";
    if (!rope_has_work(op, x_token_stride, tokens, heads, head_dim)) return;
    require_int(heads, op, "heads");
    require_int(head_dim, op, "head_dim");
    require_int(cos_sin_rows, op, "cos_sin_rows");
    require_ptrs(op, {{x, "x"}, {out, "out"}, {positions, "positions"}, {cos_sin, "cos_sin"}});
    dspine::gpu::launch_rope<float>(x, x_token_stride, out, positions, cos_sin, static_cast<int>(cos_sin_rows), tokens,
                                    static_cast<int>(heads), static_cast<int>(head_dim), stream);
    check_launch(op);
  });
}

dspine_status dspine_cuda_write_kv_f32(const float* k, int64_t k_token_stride, const float* v,
                                       int64_t v_token_stride, const int32_t* positions, const float* cos_sin,
                                       int64_t cos_sin_rows, float* k_cache, float* v_cache, int64_t num_slots,
                                       const int32_t* slots, int64_t tokens, int64_t kv_heads, int64_t head_dim,
                                       dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda write_kv";
    const bool rotate = cos_sin != nullptr;
    if (!write_kv_has_work(op, k_token_stride, v_token_stride, num_slots, tokens, kv_heads, head_dim, rotate)) return;
    require_int(kv_heads, op, "kv_heads");
    require_int(head_dim, op, "head_dim");
    require_ptrs(op, {{k, "k"}, {v, "v"}, {slots, "slots"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}});
    if (rotate) {
      require_ptr(positions, op, "positions");
      require_int(cos_sin_rows, op, "cos_sin_rows");
    }
    dspine::gpu::launch_write_kv<float>(k, k_token_stride, v, v_token_stride, rotate ? positions : nullptr, cos_sin,
                                        rotate ? static_cast<int>(cos_sin_rows) : 0, k_cache, v_cache, slots,
                                        num_slots, tokens, static_cast<int>(kv_heads), static_cast<int>(head_dim),
                                        stream);
    check_launch(op);
  });
}

dspine_status dspine_cuda_paged_attention_f32(const float* q, const float* k_cache, const float* v_cache, float* out,
                                              const int32_t* block_tables, const int32_t* kv_lens,
                                              const int32_t* cu_q, int64_t num_q_tokens, int64_t max_q_len,
                                              const dspine_attention_args* args, dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda paged_attention";
    if (!attention_has_work(op, args)) return;
    const dspine_attention_args& a = *args;
    require_nonnegative(num_q_tokens, op, "num_q_tokens");
    require_nonnegative(max_q_len, op, "max_q_len");
    if (num_q_tokens == 0 || max_q_len == 0) return;
    check_attention_limits(a, num_q_tokens, max_q_len);
    require_ptrs(op, {{q, "q"}, {out, "out"}, {k_cache, "k_cache"}, {v_cache, "v_cache"},
                      {block_tables, "block_tables"}, {kv_lens, "kv_lens"}, {cu_q, "cu_q"}});
    auto p = attention_params(q, k_cache, v_cache, out, block_tables, kv_lens, cu_q, num_q_tokens, max_q_len, a);
    // fp32 runs on CUDA cores without split-KV today; the split path is kept correct regardless.
    // No host bound on the context here (0): the table width stands in.
    dspine::gpu::plan_attention_splits<float>(p, device_attribute(cudaDevAttrMultiProcessorCount, op), 0);
    StreamScratch scratch(dspine::gpu::attention_workspace_floats(p) * sizeof(float), stream, op);
    if (p.num_splits > 1) dspine::gpu::bind_attention_workspace(p, reinterpret_cast<float*>(scratch.bytes()));
    dspine::gpu::launch_paged_attention<float>(p, stream);
    check_launch(op);
  });
}

dspine_status dspine_cuda_fused_injection_f32(const float* h, const float* gate_h, const float* fproj, float* out,
                                              int64_t n, int64_t block, int64_t hidden, dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda fused_injection";
    if (!injection_has_work(op, n, block, hidden)) return;
    require_int(block, op, "block");
    require_int(hidden, op, "hidden");
    require_ptrs(op, {{h, "h"}, {gate_h, "gate_h"}, {fproj, "fproj"}, {out, "out"}});
    dspine::gpu::launch_fused_injection<float>(h, gate_h, fproj, out, n, static_cast<int>(block),
                                               static_cast<int>(hidden), stream);
    check_launch(op);
  });
}

dspine_status dspine_cuda_transition_walk_f32(const float* logits, const float* g, const float* pred_table,
                                              const float* succ_table, const int64_t* anchor,
                                              const float* temperature, const float* uniforms, int64_t* tokens,
                                              int64_t* cand_ids, float* cand_probs, int64_t batch, int64_t positions,
                                              int64_t vocab, int64_t rank, int64_t top_k, dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda transition_walk";
    if (!walk_has_work(op, batch, positions, vocab, rank, top_k)) return;
    require(top_k <= dspine::gpu::kWalkMaxK, op, ": top_k must be <= ", dspine::gpu::kWalkMaxK, " on CUDA");
    require_int(vocab, op, "vocab");
    require_int(rank, op, "rank");
    require_int(batch * positions, op, "batch * positions");
    require_walk_ptrs(op, logits, g, pred_table, succ_table, anchor, temperature, uniforms, tokens, cand_ids,
                      cand_probs, rank);
    // Scratch: the candidates' logits [batch, J, K], the pair scores [batch, J, K, K] (floats),
    // then the arrival counters [batch].
    const size_t vals_bytes = static_cast<size_t>(batch * positions * top_k) * sizeof(float);
    const size_t pair_bytes = vals_bytes * static_cast<size_t>(top_k);
    StreamScratch scratch(vals_bytes + pair_bytes + static_cast<size_t>(batch) * sizeof(int), stream, op);
    int* arrivals = reinterpret_cast<int*>(scratch.bytes() + vals_bytes + pair_bytes);
    cuda_check(cudaMemsetAsync(arrivals, 0, static_cast<size_t>(batch) * sizeof(int), stream), op, "cudaMemsetAsync");

    dspine::gpu::WalkParams p{};
    p.logits = logits;
    p.g = rank > 0 ? g : nullptr;
    p.pred = rank > 0 ? pred_table : nullptr;
    p.succ = rank > 0 ? succ_table : nullptr;
    p.anchor = anchor;
    p.temperature = temperature;
    p.uniforms = uniforms;
    p.tokens = tokens;
    p.cand_ids = cand_ids;
    p.cand_probs = cand_probs;
    p.cand_vals = reinterpret_cast<float*>(scratch.bytes());
    p.pair = reinterpret_cast<float*>(scratch.bytes() + vals_bytes);
    p.arrivals = arrivals;
    p.batch = static_cast<int>(batch);
    p.positions = static_cast<int>(positions);
    p.vocab = static_cast<int>(vocab);
    p.rank = static_cast<int>(rank);
    p.top_k = static_cast<int>(top_k);
    p.vec_ok = rows_vectorisable(logits, vocab);
    const size_t smem = dspine::gpu::walk_smem_bytes(p, sizeof(float));
    require(smem <= static_cast<size_t>(dspine::gpu::walk_smem_limit<float>()), op,
            ": positions * top_k^2 is too large for shared memory");
    dspine::gpu::launch_transition_walk<float>(p, stream);
    check_launch(op);
  });
}

dspine_status dspine_cuda_block_verify_f32(const float* logits, const int64_t* draft_tokens, const int64_t* cand_ids,
                                           const float* cand_probs, const float* temperature, const int32_t* top_k,
                                           const float* top_p, const float* uniforms, int32_t* accept_len,
                                           int64_t* out_tokens, int64_t batch, int64_t block, int64_t vocab,
                                           int64_t cand, dspine_cuda_stream stream) {
  return guarded([&] {
    const char* op = "cuda block_verify";
    if (!verify_has_work(op, batch, block, vocab, cand)) return;
    require_verify_ptrs(op, logits, draft_tokens, cand_ids, cand_probs, temperature, top_k, top_p, uniforms,
                        accept_len, out_tokens, block, cand);
    require_int(vocab, op, "vocab");
    require_int(cand, op, "cand");
    require_int(batch * block, op, "batch * block");

    dspine::gpu::VerifyParams p{};
    p.logits = logits;
    p.draft_tokens = draft_tokens;
    p.cand_ids = cand_ids;
    p.cand_probs = cand_probs;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.uniforms = uniforms;
    p.accept_len = accept_len;
    p.out_tokens = out_tokens;
    p.batch = static_cast<int>(batch);
    p.block = static_cast<int>(block);
    p.vocab = static_cast<int>(vocab);
    p.cand = static_cast<int>(cand);
    p.chunk_len = dspine::gpu::row_chunk_len(vocab);
    p.vec_ok = rows_vectorisable(logits, vocab);
    // Scratch: verify.cuh's one workspace (cudaMallocAsync: 256-byte aligned), counters zeroed.
    const dspine::gpu::VerifyWorkspace w =
        dspine::gpu::plan_verify(p, device_attribute(cudaDevAttrMultiProcessorCount, op));
    StreamScratch scratch(w.bytes, stream, op);
    dspine::gpu::bind_verify_workspace(p, w, scratch.bytes());
    cuda_check(cudaMemsetAsync(p.arrivals, 0, w.counter_bytes, stream), op, "cudaMemsetAsync");
    dspine::gpu::launch_block_verify<float>(p, stream);
    check_launch(op);
  });
}

}  // extern "C"
