// Schemas of torch.ops.dspine.* and their CPU/CUDA registrations (from op_table.h), the shared
// argument checks and the Python module.
#include <torch/extension.h>

#include "dspine_ops.h"

namespace dspine {

// A KV cache holds the activations' dtype, or, on the CPU only, fp16 under fp32 activations:
// the CPU kernels widen the cache's rows as they read them and round new rows as they write
// them (the GGUF path's fp16 cache, docs/DECISIONS.md). The CUDA kernels have one element type
// per call, so a mixed call there is refused here, before any launch, never run wrong.
void check_cache_dtype(const at::Tensor& x, const at::Tensor& cache, const char* op, const char* x_name) {
  if (x.scalar_type() == cache.scalar_type()) return;
  const bool fp16_under_fp32 = x.scalar_type() == at::kFloat && cache.scalar_type() == at::kHalf;
  TORCH_CHECK(!fp16_under_fp32 || x.is_cpu(), op, ": an fp16 cache under fp32 ", x_name,
              " runs on the CPU only; on CUDA the cache must have the ", x_name, " dtype (", x.scalar_type(), ")");
  TORCH_CHECK(fp16_under_fp32, op, ": cache dtype ", cache.scalar_type(), " does not fit ", x_name, " dtype ",
              x.scalar_type(), " (the cache must have the ", x_name,
              " dtype, or be fp16 under fp32 ", x_name, " on the CPU)");
}

void check_attention_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const at::Tensor& kv_lens,
                          const at::Tensor& cu_q, int64_t max_kv_len) {
  TORCH_CHECK(q.dim() == 3, "paged_attention: q must be [tokens, heads, head_dim]");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2), "paged_attention: q heads must be contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_attention: caches must both be [pages, page_size, kv_heads, head_dim]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_attention: caches must be contiguous");
  TORCH_CHECK(k_cache.size(3) == q.size(2), "paged_attention: head_dim of q and cache differ");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "paged_attention: q heads must be a multiple of kv heads");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "paged_attention: k and v cache dtypes differ");
  check_cache_dtype(q, k_cache, "paged_attention", "q");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && kv_lens.scalar_type() == at::kInt &&
                  cu_q.scalar_type() == at::kInt,
              "paged_attention: block_tables, kv_lens and cu_q must be int32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.is_contiguous(), "paged_attention: block_tables must be [batch, max_pages]");
  TORCH_CHECK(kv_lens.numel() == block_tables.size(0) && cu_q.numel() == kv_lens.numel() + 1,
              "paged_attention: batch sizes of block_tables, kv_lens, cu_q disagree");
  // max_kv_len is the caller's host-side bound on every kv_len (0: none given). It is what lets
  // CUDA, whose kv_lens stay on the device, refuse a table too narrow for the context: there a
  // key without a page would read as a zero key and give a wrong result without an error.
  TORCH_CHECK(max_kv_len >= 0, "paged_attention: max_kv_len must be >= 0 (0: not known)");
  TORCH_CHECK(max_kv_len <= block_tables.size(1) * k_cache.size(1), "paged_attention: block_tables is too narrow: ",
              block_tables.size(1), " pages of ", k_cache.size(1), " keys cannot hold max_kv_len = ", max_kv_len);
}

void check_verify_args(const at::Tensor& logits, const at::Tensor& draft_tokens,
                       const at::Tensor& cand_ids, const at::Tensor& cand_probs,
                       const at::Tensor& temperature, const at::Tensor& top_k,
                       const at::Tensor& top_p, const at::Tensor& uniforms) {
  TORCH_CHECK(logits.dim() == 3 && logits.size(1) >= 1, "block_verify: logits must be [batch, T, vocab]");
  const auto b = logits.size(0), t = logits.size(1);
  TORCH_CHECK(draft_tokens.dim() == 2 && draft_tokens.size(0) == b && draft_tokens.size(1) == t - 1 &&
                  draft_tokens.scalar_type() == at::kLong,
              "block_verify: draft_tokens must be int64 [batch, T-1]");
  TORCH_CHECK(cand_ids.dim() == 3 && cand_ids.size(0) == b && cand_ids.size(1) == t - 1 &&
                  cand_ids.scalar_type() == at::kLong,
              "block_verify: cand_ids must be int64 [batch, T-1, K]");
  TORCH_CHECK(cand_probs.sizes() == cand_ids.sizes() && cand_probs.scalar_type() == at::kFloat,
              "block_verify: cand_probs must be fp32 shaped like cand_ids");
  TORCH_CHECK(temperature.numel() == b && temperature.scalar_type() == at::kFloat, "block_verify: temperature must be fp32 [batch]");
  TORCH_CHECK(top_k.numel() == b && top_k.scalar_type() == at::kInt, "block_verify: top_k must be int32 [batch]");
  TORCH_CHECK(top_p.numel() == b && top_p.scalar_type() == at::kFloat, "block_verify: top_p must be fp32 [batch]");
  TORCH_CHECK(uniforms.dim() == 2 && uniforms.size(0) == b && uniforms.size(1) == t && uniforms.scalar_type() == at::kFloat,
              "block_verify: uniforms must be fp32 [batch, T]");
}

void check_walk_args(const at::Tensor& logits, const at::Tensor& g, const at::Tensor& pred_table,
                     const at::Tensor& succ_table, const at::Tensor& anchor, int64_t top_k,
                     const at::Tensor& temperature, const at::Tensor& uniforms, bool bf16_tables) {
  TORCH_CHECK(logits.dim() == 3, "transition_walk: logits must be [batch, J, vocab]");
  const auto b = logits.size(0), j = logits.size(1), v = logits.size(2);
  TORCH_CHECK(top_k >= 1 && top_k <= v, "transition_walk: top_k must be in [1, vocab]");
  if (g.numel() > 0) {
    TORCH_CHECK(g.dim() == 3 && g.size(0) == b && g.size(1) == j, "transition_walk: g must be [batch, J, rank]");
    TORCH_CHECK(pred_table.dim() == 2 && pred_table.size(0) == v && pred_table.size(1) == g.size(2) &&
                    succ_table.sizes() == pred_table.sizes(),
                "transition_walk: tables must be [vocab, rank] matching g");
    const auto table = pred_table.scalar_type();
    const bool table_ok = table == logits.scalar_type() ||
                          (bf16_tables && table == at::kBFloat16 && logits.scalar_type() == at::kFloat);
    TORCH_CHECK(g.scalar_type() == logits.scalar_type() && succ_table.scalar_type() == table && table_ok,
                "transition_walk: g and tables must have the logits dtype (the CPU also takes bf16 tables "
                "with fp32 logits)");
  }
  TORCH_CHECK(anchor.numel() == b && anchor.scalar_type() == at::kLong, "transition_walk: anchor must be int64 [batch]");
  TORCH_CHECK(temperature.numel() == b && temperature.scalar_type() == at::kFloat, "transition_walk: temperature must be fp32 [batch]");
  TORCH_CHECK(uniforms.dim() == 2 && uniforms.size(0) == b && uniforms.size(1) == j && uniforms.scalar_type() == at::kFloat,
              "transition_walk: uniforms must be fp32 [batch, J]");
}

void check_norm_rows(const at::Tensor& x, const at::Tensor& w, const char* name) {
  TORCH_CHECK(x.is_contiguous(), name, ": input must be contiguous");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1), name, ": weight must match the last dim");
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), name, ": weight dtype must match the input");
  TORCH_CHECK(x.size(-1) < INT32_MAX, name, ": rows are too long");
}

void check_rope_table(const at::Tensor& positions, const at::Tensor& cos_sin, int64_t n, int64_t d) {
  TORCH_CHECK(positions.scalar_type() == at::kInt && positions.numel() == n, "rope: positions must be int32 [tokens]");
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.dim() == 2 && cos_sin.size(1) == d &&
                  cos_sin.is_contiguous(),
              "rope: cos_sin must be a contiguous fp32 [max_positions, head_dim] table");
  TORCH_CHECK(d % 2 == 0, "rope: head_dim must be even");
  TORCH_CHECK(cos_sin.size(0) < INT32_MAX, "rope: cos_sin has too many positions");
}

// [tokens, heads, d] tensors may be row views of a fused projection: heads and d contiguous.
void check_token_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 3, name, ": expected [tokens, heads, head_dim]");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), name, ": heads must be contiguous");
}

void check_head_norm(const std::optional<at::Tensor>& norm, const at::Tensor& x, const char* op) {
  if (!norm) return;
  const at::Tensor& w = *norm;
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(2) && w.is_contiguous() && w.scalar_type() == x.scalar_type() &&
                  w.device() == x.device(),
              op, ": a head norm must be a contiguous [head_dim] weight of the rows' dtype and device");
}

void check_write_kv_args(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                         const at::Tensor& cos_sin, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, const at::Tensor& slots) {
  check_token_rows(k, "write_kv");
  check_token_rows(v, "write_kv");
  TORCH_CHECK(k.sizes() == v.sizes(), "write_kv: k and v must have the same shape");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.sizes() == v_cache.sizes(),
              "write_kv: caches must be contiguous [pages, page_size, kv_heads, head_dim]");
  TORCH_CHECK(k_cache.size(2) == k.size(1) && k_cache.size(3) == k.size(2), "write_kv: cache head layout differs from k");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "write_kv: k and v dtypes differ");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "write_kv: k and v cache dtypes differ");
  check_cache_dtype(k, k_cache, "write_kv", "k/v");
  TORCH_CHECK(slots.scalar_type() == at::kInt && slots.numel() == k.size(0), "write_kv: slots must be int32 [tokens]");
  if (cos_sin.numel() > 0) check_rope_table(positions, cos_sin, k.size(0), k.size(2));
}

void check_rope_write_kv_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& positions, const at::Tensor& cos_sin,
                              const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slots,
                              const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm) {
  check_token_rows(q, "rope_write_kv");
  TORCH_CHECK(cos_sin.numel() > 0, "rope_write_kv: needs a cos/sin table (write_kv copies keys unrotated)");
  check_write_kv_args(k, v, positions, cos_sin, k_cache, v_cache, slots);  // checks the table for k
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.scalar_type() == k.scalar_type(),
              "rope_write_kv: q must be [tokens, heads, head_dim] with k's tokens, head_dim and dtype");
  check_head_norm(q_norm, q, "rope_write_kv");
  check_head_norm(k_norm, k, "rope_write_kv");
}

void check_silu_mul_args(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "silu_mul: x must be [rows, 2 * inter], got ", x.sizes());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "silu_mul: x must be a floating tensor, got ",
              x.scalar_type());
}

void check_injection_args(const at::Tensor& h, const at::Tensor& gate_h, const at::Tensor& fproj) {
  TORCH_CHECK(h.dim() == 3, "fused_injection: h must be [n, block, hidden]");
  TORCH_CHECK(gate_h.sizes() == h.sizes(), "fused_injection: gate_h must match h");
  TORCH_CHECK(fproj.dim() == 3 && fproj.size(0) == h.size(0) && fproj.size(1) == h.size(1) &&
                  fproj.size(2) == 2 * h.size(2),
              "fused_injection: fproj must be [n, block, 2*hidden]");
  TORCH_CHECK(gate_h.scalar_type() == h.scalar_type() && fproj.scalar_type() == h.scalar_type(),
              "fused_injection: dtypes must match");
}

}  // namespace dspine

TORCH_LIBRARY(dspine, m) {
#define DSPINE_DEFINE_OP(name, ret, params, schema) m.def(#name schema);
  DSPINE_OPS(DSPINE_DEFINE_OP)
#undef DSPINE_DEFINE_OP
}

TORCH_LIBRARY_IMPL(dspine, CPU, m) {
#define DSPINE_IMPL_CPU(name, ...) m.impl(#name, &dspine::cpu::name);
  DSPINE_OPS(DSPINE_IMPL_CPU)
#undef DSPINE_IMPL_CPU
}

#ifdef DSPINE_WITH_CUDA
TORCH_LIBRARY_IMPL(dspine, CUDA, m) {
#define DSPINE_IMPL_CUDA(name, ...) m.impl(#name, &dspine::cuda::name);
  DSPINE_OPS(DSPINE_IMPL_CUDA)
#undef DSPINE_IMPL_CUDA
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dspine_engine kernels (registered as torch.ops.dspine.*)";
#ifdef DSPINE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
