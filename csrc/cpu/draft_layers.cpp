// The draft's layer loop on quantised weights in one op (CPU): the same kernels, in the same
// order, on the same tensors as the Python loop (dspine_engine/ops.py, draft_layers_loop), so the
// states are bitwise those of that loop. Why one op: a draft layer over a few rows is ~30 small
// ops, and from Python each costs a dispatch (3-5 us on the 2-core CPU) that together rivalled
// the layers' GEMMs (docs/DECISIONS.md, "CPU draft forward"). Semantics: ops.py, draft_layers.
#include <torch/all.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "../dspine_ops.h"

namespace dspine {
namespace cpu {

namespace {

// Shapes and scalars shared by every layer.
struct LayerArgs {
  std::string format;
  int64_t heads, kv_heads, head_dim, inter;
  double eps;
};

// One layer's tables, in the order of ops.py's DraftLayer (LayerTables.loop_entry).
struct Layer {
  const at::Tensor *q, *kv, *o, *gate_up, *down, *pred_gate, *gate_f_inject;
  const at::Tensor *in_norm, *q_norm, *k_norm, *post_norm, *inj_norm;
};

// The attention half: returns the o projection of the attention over [ctx; x] keys.
at::Tensor attention(const LayerArgs& a, const Layer& l, const at::Tensor& x, const at::Tensor& ctx,
                     const at::Tensor& positions, const at::Tensor& kv_positions,
                     const at::Tensor& kv_slots, const at::Tensor& cos_sin, at::Tensor& k_cache,
                     at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& kv_lens,
                     const at::Tensor& cu_q, int64_t max_q_len, int64_t window, double scale,
                     int64_t max_kv_len) {
  const int64_t h = x.size(1), kvd = a.kv_heads * a.head_dim;
  auto q = quant_matmul(x, *l.q, a.format, a.heads * a.head_dim).view({-1, a.heads, a.head_dim});
  q = rope(q, positions, cos_sin, *l.q_norm, a.eps);
  const auto kvx = quant_matmul(at::cat({ctx, x}), *l.kv, a.format, 2 * kvd);
  const int64_t n = kvx.size(0);
  const auto k = kvx.slice(1, 0, kvd).view({n, a.kv_heads, a.head_dim});
  const auto v = kvx.slice(1, kvd).view({n, a.kv_heads, a.head_dim});
  write_kv(k, v, kv_positions, cos_sin, k_cache, v_cache, kv_slots, *l.k_norm, a.eps);
  const auto attn = paged_attention(q, k_cache, v_cache, block_tables, kv_lens, cu_q, max_q_len, false,
                                    window, scale, max_kv_len, /*exact=*/false, /*prefill=*/false);
  return quant_matmul(attn.view({x.size(0), -1}), *l.o, a.format, h);
}

// The injection of a layer whose states are hidden + mlp (ops.py, _inject).
at::Tensor inject(const LayerArgs& a, const Layer& l, const at::Tensor& mlp, const at::Tensor& hidden,
                  const at::Tensor& anchor_f) {
  const int64_t bsz = anchor_f.size(0), h = hidden.size(1), blk = hidden.size(0) / bsz;
  const auto [hn, summed] = add_rms_norm(mlp, hidden, *l.inj_norm, a.eps);
  const auto fg = quant_matmul(hn, *l.pred_gate, a.format, 2 * h).view({bsz, blk, 2 * h});
  auto f = fg.slice(2, 0, h).contiguous();
  f.select(1, 0).copy_(anchor_f);  // the anchor's feature is exact
  const auto fproj = quant_matmul(f, *l.gate_f_inject, a.format, 2 * h);
  return fused_injection(summed.view({bsz, blk, h}), fg.slice(2, h), fproj).view({bsz * blk, h});
}

void check_layer_lists(const at::TensorList weights, const at::TensorList norms, int64_t layers,
                       bool injection) {
  TORCH_CHECK(layers > 0, "draft_layers: no layers (k_caches is empty)");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * (injection ? 7 : 5),
              "draft_layers: weights must hold 7 tables a layer with injection, 5 without");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == layers * (injection ? 5 : 4),
              "draft_layers: norms must hold 5 weights a layer with injection, 4 without");
}

}  // namespace

at::Tensor draft_layers(const at::Tensor& hidden_in, const at::Tensor& ctx, const at::Tensor& anchor_f,
                        at::TensorList weights, at::TensorList norms, c10::string_view format,
                        int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter, double eps,
                        const at::Tensor& positions, const at::Tensor& kv_positions,
                        const at::Tensor& kv_slots, const at::Tensor& cos_sin, at::TensorList k_caches,
                        at::TensorList v_caches, const at::Tensor& block_tables, const at::Tensor& kv_lens,
                        const at::Tensor& cu_q, int64_t max_q_len, int64_t window, double scale,
                        int64_t max_kv_len) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  const bool injection = anchor_f.numel() > 0;
  check_layer_lists(weights, norms, layers, injection);
  TORCH_CHECK(v_caches.size() == k_caches.size(), "draft_layers: one v cache a k cache");
  TORCH_CHECK(hidden_in.dim() == 2 && ctx.dim() == 2 && ctx.size(1) == hidden_in.size(1),
              "draft_layers: hidden and ctx must be [rows, hidden]");
  TORCH_CHECK(max_q_len > 0 && hidden_in.size(0) % max_q_len == 0,
              "draft_layers: hidden must hold whole blocks of max_q_len rows");
  TORCH_CHECK(!injection || (anchor_f.dim() == 2 && anchor_f.size(0) * max_q_len == hidden_in.size(0)),
              "draft_layers: anchor_f must be [blocks, hidden]");
  const LayerArgs a{std::string(format), heads, kv_heads, head_dim, inter, eps};
  const int64_t nw = injection ? 7 : 5, nn = injection ? 5 : 4;
  at::Tensor hidden = hidden_in;
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = &weights[i * nw];
    const at::Tensor* g = &norms[i * nn];
    const Layer l{w, w + 1, w + 2, w + 3, w + 4, injection ? w + 5 : nullptr, injection ? w + 6 : nullptr,
                  g, g + 1, g + 2, g + 3, injection ? g + 4 : nullptr};
    at::Tensor kc = k_caches[i], vc = v_caches[i];
    const auto x = rms_norm(hidden, *l.in_norm, eps);
    const auto o = attention(a, l, x, ctx, positions, kv_positions, kv_slots, cos_sin, kc, vc, block_tables,
                             kv_lens, cu_q, max_q_len, window, scale, max_kv_len);
    // Residual adds ride on the next norm, as in the Python loop.
    const auto [x2, summed] = add_rms_norm(o, hidden, *l.post_norm, eps);
    const auto gu = quant_matmul(x2, *l.gate_up, a.format, 2 * inter);
    const auto mlp = quant_matmul(silu_mul(gu), *l.down, a.format, hidden.size(1));
    hidden = injection ? inject(a, l, mlp, summed, anchor_f) : summed + mlp;
  }
  return hidden;
}

}  // namespace cpu
}  // namespace dspine

// CPU only, like the quantised ops it runs on (quant_bindings.cpp).
TORCH_LIBRARY_FRAGMENT(dspine, m) {
  m.def(
      "draft_layers(Tensor hidden, Tensor ctx, Tensor anchor_f, Tensor[] weights, Tensor[] norms, "
      "str format, int heads, int kv_heads, int head_dim, int inter, float eps, Tensor positions, "
      "Tensor kv_positions, Tensor kv_slots, Tensor cos_sin, Tensor(a!)[] k_caches, "
      "Tensor(b!)[] v_caches, Tensor block_tables, Tensor kv_lens, Tensor cu_q, int max_q_len, "
      "int window, float scale, int max_kv_len) -> Tensor");
}

TORCH_LIBRARY_IMPL(dspine, CPU, m) { m.impl("draft_layers", &dspine::cpu::draft_layers); }
