// The target's decoder layers on quantised weights in one op (CPU): the same kernels, in the
// same order, on the same tensors as TargetModel.forward's loop (dspine_engine/models/target.py),
// so the states are bitwise the loop's. Why one op: a step of the default model is ~300 of our
// ops and ~900 of torch's small ones (views, slices, allocations) called from Python, ~1.5 ms of a
// ~12 ms step on the 2-core CPU beside the GEMMs (docs/BENCHMARKS.md, "a round op by op").
// Layers it covers: attention with fused q|k|v (no bias, no q/k norm, no output gate), a gated
// MLP; ops.py's target_layers says which models use it. Semantics: ops.py, target_layers.
#include <torch/all.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "../dspine_ops.h"

namespace dspine {
namespace cpu {

namespace {

constexpr int64_t kTables = 4;  // qkv, o, gate_up, down
constexpr int64_t kNorms = 2;   // in, post

struct Shapes {
  int64_t heads, kv_heads, head_dim, inter;
  double eps;
};

// The layer's attention: fused q|k|v projection, RoPE + KV write, paged attention, o projection.
at::Tensor attention(const Shapes& s, const at::Tensor* w, const std::string* fmt, const at::Tensor& x,
                     const at::Tensor& positions, const at::Tensor& slots, const at::Tensor& cos_sin,
                     at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& block_tables,
                     const at::Tensor& kv_lens, const at::Tensor& cu_q, int64_t max_q_len, bool causal,
                     int64_t window, double scale, int64_t max_kv_len) {
  const int64_t n = x.size(0), q_size = s.heads * s.head_dim, kv_size = s.kv_heads * s.head_dim;
  const auto qkv = quant_matmul(x, w[0], fmt[0], q_size + 2 * kv_size);
  const auto q = qkv.slice(1, 0, q_size).view({n, s.heads, s.head_dim});
  const auto k = qkv.slice(1, q_size, q_size + kv_size).view({n, s.kv_heads, s.head_dim});
  const auto v = qkv.slice(1, q_size + kv_size, q_size + 2 * kv_size).view({n, s.kv_heads, s.head_dim});
  const auto rotated =
      rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots, std::nullopt, std::nullopt, 0.0);
  const auto attn = paged_attention(rotated, k_cache, v_cache, block_tables, kv_lens, cu_q, max_q_len, causal,
                                    window, scale, max_kv_len, /*exact=*/false, /*prefill=*/false);
  return quant_matmul(attn.view({n, q_size}), w[1], fmt[1], x.size(1));
}

}  // namespace

// Returns (hidden, residual) after the last layer (before the final norm's add) and the taps,
// hidden + residual after each layer of `tap_layers` (ascending, distinct), as the loop does.
std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> target_layers(
    const at::Tensor& hidden_in, at::TensorList weights, const std::vector<std::string>& formats, at::TensorList norms,
    at::IntArrayRef windows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter, double eps,
    const at::Tensor& positions, const at::Tensor& slots, const at::Tensor& cos_sin, at::TensorList k_caches,
    at::TensorList v_caches, const at::Tensor& block_tables, const at::Tensor& kv_lens, const at::Tensor& cu_q,
    int64_t max_q_len, bool causal, double scale, int64_t max_kv_len, at::IntArrayRef tap_layers) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(layers > 0 && v_caches.size() == k_caches.size(), "target_layers: one k and one v cache a layer");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kTables * layers &&
                  static_cast<int64_t>(formats.size()) == kTables * layers,
              "target_layers: weights and formats must hold 4 tables a layer (qkv, o, gate_up, down)");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == kNorms * layers,
              "target_layers: norms must hold 2 weights a layer (in, post)");
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == layers, "target_layers: one window a layer");
  TORCH_CHECK(hidden_in.dim() == 2, "target_layers: hidden must be [tokens, hidden]");
  for (size_t t = 0; t < tap_layers.size(); ++t)
    TORCH_CHECK(tap_layers[t] >= 0 && tap_layers[t] < layers && (t == 0 || tap_layers[t] > tap_layers[t - 1]),
                "target_layers: tap_layers must be distinct layers in ascending order");
  const Shapes s{heads, kv_heads, head_dim, inter, eps};
  at::Tensor hidden = hidden_in, residual, x;
  std::vector<at::Tensor> taps;
  size_t next_tap = 0;
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = &weights[kTables * i];
    const std::string* f = &formats[kTables * i];  // each checked by quant_matmul
    if (i == 0) {
      x = rms_norm(hidden, norms[0], eps);
      residual = hidden;
    } else {
      std::tie(x, residual) = add_rms_norm(hidden, residual, norms[kNorms * i], eps);
    }
    at::Tensor kc = k_caches[i], vc = v_caches[i];
    hidden = attention(s, w, f, x, positions, slots, cos_sin, kc, vc, block_tables, kv_lens, cu_q, max_q_len,
                       causal, windows[i], scale, max_kv_len);
    std::tie(x, residual) = add_rms_norm(hidden, residual, norms[kNorms * i + 1], eps);
    hidden = quant_matmul(silu_mul(quant_matmul(x, w[2], f[2], 2 * inter)), w[3], f[3], hidden_in.size(1));
    if (next_tap < tap_layers.size() && tap_layers[next_tap] == i) {
      taps.push_back(hidden + residual);  // the layer's output, before the next norm
      ++next_tap;
    }
  }
  return {hidden, residual, taps};
}

}  // namespace cpu
}  // namespace dspine

// CPU only, like the quantised ops it runs on (quant_bindings.cpp).
TORCH_LIBRARY_FRAGMENT(dspine, m) {
  m.def(
      "target_layers(Tensor hidden, Tensor[] weights, str[] formats, Tensor[] norms, int[] windows, "
      "int heads, int kv_heads, int head_dim, int inter, float eps, Tensor positions, Tensor slots, "
      "Tensor cos_sin, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, Tensor block_tables, Tensor kv_lens, "
      "Tensor cu_q, int max_q_len, bool causal, float scale, int max_kv_len, int[] tap_layers) "
      "-> (Tensor, Tensor, Tensor[])");
}

TORCH_LIBRARY_IMPL(dspine, CPU, m) { m.impl("target_layers", &dspine::cpu::target_layers); }
