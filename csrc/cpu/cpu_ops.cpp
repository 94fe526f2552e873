// Thin torch bindings of the CPU kernels: checks, dtype dispatch, output allocation.
#include <ATen/Dispatch.h>

#include "../dspine_ops.h"
#include "activation.h"
#include "attention.h"
#include "injection.h"
#include "norm.h"
#include "rope.h"
#include "transition.h"
#include "verify.h"

namespace dspine {
namespace cpu {

#define DSPINE_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, TYPE, NAME, __VA_ARGS__)

// Calls f(T{}, U{}) with T the element type of the activations (`rows`) and U that of the
// tensor read beside them (`other`): the same type, or Mixed under fp32 activations, the one
// mixed pair the op's check lets by (an fp16 KV cache: check_cache_dtype; bf16 transition tables:
// check_walk_args).
template <typename Mixed, typename F>
void dispatch_pair(at::ScalarType rows, at::ScalarType other, const char* op, F&& f) {
  if (rows != other) {
    TORCH_CHECK(rows == at::kFloat && other == c10::CppTypeToScalarType<Mixed>::value, op,
                ": unsupported dtypes ", rows, " / ", other);
    f(float{}, Mixed{});
    return;
  }
  switch (rows) {  // DSPINE_DISPATCH_FLOATS's types (its name must be a literal)
    case at::kFloat: return f(float{}, float{});
    case at::kDouble: return f(double{}, double{});
    case at::kBFloat16: return f(at::BFloat16{}, at::BFloat16{});
    case at::kHalf: return f(at::Half{}, at::Half{});
    default: TORCH_CHECK(false, op, ": unsupported dtype ", rows);
  }
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  auto x = x_in.contiguous();
  check_norm_rows(x, weight, "rms_norm");
  auto out = at::empty_like(x);
  const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
  auto w = weight.contiguous();
  DSPINE_DISPATCH_FLOATS(x.scalar_type(), "rms_norm", [&] {
    rms_norm<scalar_t>(x.data_ptr<scalar_t>(), nullptr, w.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                       nullptr, rows, d, static_cast<float>(eps));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x_in, const at::Tensor& res_in,
                                                const at::Tensor& weight, double eps) {
  auto x = x_in.contiguous(), res = res_in.contiguous();
  check_norm_rows(x, weight, "add_rms_norm");
  TORCH_CHECK(res.sizes() == x.sizes() && res.scalar_type() == x.scalar_type(),
              "add_rms_norm: residual must match x");
  auto out = at::empty_like(x), sum = at::empty_like(x);
  const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
  auto w = weight.contiguous();
  DSPINE_DISPATCH_FLOATS(x.scalar_type(), "add_rms_norm", [&] {
    rms_norm<scalar_t>(x.data_ptr<scalar_t>(), res.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                       out.data_ptr<scalar_t>(), sum.data_ptr<scalar_t>(), rows, d, static_cast<float>(eps));
  });
  return {out, sum};
}

// Every position a row is rotated by must be a row of the table (rows whose slot is negative
// are padding and never read it). Host memory: checking costs nothing next to the rotation.
static void check_positions_in_table(const at::Tensor& pos, const int32_t* slots, const at::Tensor& cos_sin,
                                     const char* op) {
  const int32_t* p = pos.data_ptr<int32_t>();
  const int64_t rows = cos_sin.size(0);
  const int64_t n = pos.numel(), bad = cpu::first_outside(p, n, 0, rows, slots);
  TORCH_CHECK(bad == n, op, ": position ", p[bad], " of token ", bad, " is outside the cos/sin table (", rows,
              " positions)");  // the message is formed only on failure, where bad < n
}

// A head norm runs first, as rms_norm (the CPU has no launches to save); then the rotation.
at::Tensor rope(const at::Tensor& x_in, const at::Tensor& positions, const at::Tensor& cos_sin,
                const std::optional<at::Tensor>& norm, double eps) {
  check_token_rows(x_in, "rope");
  check_rope_table(positions, cos_sin, x_in.size(0), x_in.size(2));
  check_head_norm(norm, x_in, "rope");
  const auto x = norm ? rms_norm(x_in, *norm, eps) : x_in;
  auto out = at::empty(x.sizes(), x.options());
  auto pos = positions.contiguous();
  check_positions_in_table(pos, nullptr, cos_sin, "rope");
  DSPINE_DISPATCH_FLOATS(x.scalar_type(), "rope", [&] {
    cpu::rope<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), out.data_ptr<scalar_t>(), pos.data_ptr<int32_t>(),
                        cos_sin.data_ptr<float>(), x.size(0), x.size(1), x.size(2));
  });
  return out;
}

void write_kv(const at::Tensor& k_in, const at::Tensor& v, const at::Tensor& positions,
              const at::Tensor& cos_sin, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
              const std::optional<at::Tensor>& k_norm, double eps) {
  check_write_kv_args(k_in, v, positions, cos_sin, k_cache, v_cache, slots);
  check_head_norm(k_norm, k_in, "write_kv");
  const bool rotate = cos_sin.numel() > 0;
  auto pos = positions.contiguous();
  auto sl = slots.contiguous();
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);
  auto sp = sl.data_ptr<int32_t>();
  const int64_t bad = cpu::first_outside(sp, sl.numel(), std::numeric_limits<int64_t>::min(), capacity);
  TORCH_CHECK(bad == sl.numel(), "write_kv: slot ", sp[bad], " is outside the cache (", capacity, " slots)");
  if (rotate) check_positions_in_table(pos, sp, cos_sin, "write_kv");
  const auto k = k_norm ? rms_norm(k_in, *k_norm, eps) : k_in;
  dispatch_pair<at::Half>(k.scalar_type(), k_cache.scalar_type(), "write_kv", [&](auto row, auto cell) {
    using T = decltype(row);
    using C = decltype(cell);
    cpu::write_kv<T, C>(k.data_ptr<T>(), k.stride(0), v.data_ptr<T>(), v.stride(0),
                        rotate ? pos.data_ptr<int32_t>() : nullptr, rotate ? cos_sin.data_ptr<float>() : nullptr,
                        k_cache.data_ptr<C>(), v_cache.data_ptr<C>(), sp, k.size(0), k.size(1), k.size(2));
  });
}

// The CPU has no launches to save: the ops in turn (the norms, then rope first so that every
// position is checked against the table before anything is written).
at::Tensor rope_write_kv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                         const at::Tensor& cos_sin, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
                         const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                         double eps) {
  check_rope_write_kv_args(q, k, v, positions, cos_sin, k_cache, v_cache, slots, q_norm, k_norm);
  auto out = rope(q, positions, cos_sin, q_norm, eps);
  write_kv(k, v, positions, cos_sin, k_cache, v_cache, slots, k_norm, eps);
  return out;
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& kv_lens, const at::Tensor& cu_q,
                           int64_t max_q_len, bool causal, int64_t window, double scale, int64_t max_kv_len,
                           bool /*exact: every CPU row is summed one way already*/, bool /*prefill: likewise*/) {
  check_attention_args(q, k_cache, v_cache, block_tables, kv_lens, cu_q, max_kv_len);
  auto out = at::zeros({q.size(0), q.size(1), q.size(2)}, q.options());
  auto bt = block_tables.contiguous(), kl = kv_lens.contiguous(), cq = cu_q.contiguous();
  const int64_t batch = kl.numel();
  const int32_t* klp = kl.data_ptr<int32_t>();
  const int32_t* cqp = cq.data_ptr<int32_t>();
  const int32_t* btp = bt.data_ptr<int32_t>();
  TORCH_CHECK(cqp[0] == 0 && cqp[batch] == q.size(0), "paged_attention: cu_q must run from 0 to the number of query rows");
  // Everything the kernel indexes with is on the host here, so every bad entry is an error (each
  // check finds its first offender, then raises outside the loop: common.h, first_outside).
  const int64_t width = bt.size(1), page_size = k_cache.size(1);
  int64_t few_keys = -1, too_long = -1, past_bound = -1, no_page = -1, no_page_col = -1;
  for (int64_t b = batch - 1; b >= 0; --b) {
    const int64_t n = cqp[b + 1] - cqp[b];
    if (n < 0 || n > klp[b]) few_keys = b;
    if (klp[b] > width * page_size) too_long = b;
    if (max_kv_len > 0 && klp[b] > max_kv_len) past_bound = b;
  }
  TORCH_CHECK(few_keys < 0, "paged_attention: sequence ", few_keys, " has more queries than keys");
  TORCH_CHECK(too_long < 0, "paged_attention: block_tables is too narrow: kv_len ", too_long < 0 ? 0 : klp[too_long],
              " of sequence ", too_long, " exceeds its ", width, " pages of ", page_size, " keys");
  TORCH_CHECK(past_bound < 0, "paged_attention: kv_len ", past_bound < 0 ? 0 : klp[past_bound], " of sequence ",
              past_bound, " exceeds max_kv_len = ", max_kv_len);
  for (int64_t b = batch - 1; b >= 0; --b) {
    const int64_t col = cpu::first_missing_page(btp + b * width, cqp[b + 1] - cqp[b], klp[b], window, page_size,
                                                k_cache.size(0));
    if (col >= 0) no_page = b, no_page_col = col;
  }
  TORCH_CHECK(no_page < 0, "paged_attention: block_tables[", no_page, ", ", no_page_col, "] = ",
              no_page < 0 ? 0 : btp[no_page * width + no_page_col], " is not a page of the cache (", k_cache.size(0),
              " pages) but holds keys the sequence's queries see");
  PagedAttentionArgs a{batch, q.size(1), k_cache.size(2), q.size(2), k_cache.size(1), bt.size(1),
                       q.stride(0), causal, window, static_cast<float>(scale)};
  dispatch_pair<at::Half>(q.scalar_type(), k_cache.scalar_type(), "paged_attention", [&](auto row, auto cell) {
    using T = decltype(row);
    using C = decltype(cell);
    cpu::paged_attention<T, C>(q.data_ptr<T>(), k_cache.data_ptr<C>(), v_cache.data_ptr<C>(), out.data_ptr<T>(),
                               bt.data_ptr<int32_t>(), klp, cqp, a);
  });
  return out;
}

at::Tensor silu_mul(const at::Tensor& x_in) {
  check_silu_mul_args(x_in);
  auto x = x_in.contiguous();
  const int64_t inter = x.size(1) / 2;
  auto out = at::empty({x.size(0), inter}, x.options());
  DSPINE_DISPATCH_FLOATS(x.scalar_type(), "silu_mul", [&] {
    cpu::silu_mul<scalar_t>(x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), x.size(0), inter);
  });
  return out;
}

at::Tensor fused_injection(const at::Tensor& h_in, const at::Tensor& gate_in, const at::Tensor& fproj_in) {
  check_injection_args(h_in, gate_in, fproj_in);
  auto h = h_in.contiguous(), g = gate_in.contiguous(), f = fproj_in.contiguous();
  auto out = at::empty_like(h);
  DSPINE_DISPATCH_FLOATS(h.scalar_type(), "fused_injection", [&] {
    cpu::fused_injection<scalar_t>(h.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                                   out.data_ptr<scalar_t>(), h.size(0), h.size(1), h.size(2));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> transition_walk(
    const at::Tensor& logits_in, const at::Tensor& g_in, const at::Tensor& pred_in, const at::Tensor& succ_in,
    const at::Tensor& anchor_in, int64_t top_k, const at::Tensor& temp_in, const at::Tensor& u_in) {
  check_walk_args(logits_in, g_in, pred_in, succ_in, anchor_in, top_k, temp_in, u_in, /*bf16_tables=*/true);
  auto logits = logits_in.contiguous(), g = g_in.contiguous(), pred = pred_in.contiguous(),
       succ = succ_in.contiguous(), anchor = anchor_in.contiguous(), temp = temp_in.contiguous(),
       u = u_in.contiguous();
  const int64_t b = logits.size(0), j = logits.size(1), v = logits.size(2);
  auto tokens = at::empty({b, j}, logits.options().dtype(at::kLong));
  auto cand_ids = at::empty({b, j, top_k}, logits.options().dtype(at::kLong));
  auto cand_probs = at::empty({b, j, top_k}, logits.options().dtype(at::kFloat));
  const bool use_t = g.numel() > 0;
  TransitionArgs a{b, j, v, use_t ? g.size(2) : 0, top_k, use_t};
  // Tables of the logits' dtype, or bf16 beside fp32 logits (a quantised CPU draft keeps them in
  // bf16: half the 96 MB of the default drafter's fp32 pair, and the walk reads a few rows).
  const auto tables = use_t ? pred.scalar_type() : logits.scalar_type();
  dispatch_pair<at::BFloat16>(logits.scalar_type(), tables, "transition_walk", [&](auto row, auto cell) {
    using T = decltype(row);
    using TT = decltype(cell);
    cpu::transition_walk<T, TT>(logits.data_ptr<T>(), use_t ? g.data_ptr<T>() : nullptr,
                                use_t ? pred.data_ptr<TT>() : nullptr, use_t ? succ.data_ptr<TT>() : nullptr,
                                anchor.data_ptr<int64_t>(), temp.data_ptr<float>(), u.data_ptr<float>(),
                                tokens.data_ptr<int64_t>(), cand_ids.data_ptr<int64_t>(),
                                cand_probs.data_ptr<float>(), a);
  });
  return {tokens, cand_ids, cand_probs};
}

std::tuple<at::Tensor, at::Tensor> block_verify(
    const at::Tensor& logits_in, const at::Tensor& draft_in, const at::Tensor& cid_in, const at::Tensor& cp_in,
    const at::Tensor& temp_in, const at::Tensor& tk_in, const at::Tensor& tp_in, const at::Tensor& u_in) {
  check_verify_args(logits_in, draft_in, cid_in, cp_in, temp_in, tk_in, tp_in, u_in);
  auto logits = logits_in.contiguous(), draft = draft_in.contiguous(), cid = cid_in.contiguous(),
       cp = cp_in.contiguous(), temp = temp_in.contiguous(), tk = tk_in.contiguous(), tp = tp_in.contiguous(),
       u = u_in.contiguous();
  const int64_t b = logits.size(0), t = logits.size(1), v = logits.size(2);
  auto accept = at::empty({b}, logits.options().dtype(at::kInt));
  auto out = at::empty({b, t}, logits.options().dtype(at::kLong));
  VerifyArgs a{b, t, v, cid.size(2)};
  DSPINE_DISPATCH_FLOATS(logits.scalar_type(), "block_verify", [&] {
    cpu::block_verify<scalar_t>(logits.data_ptr<scalar_t>(), draft.data_ptr<int64_t>(), cid.data_ptr<int64_t>(),
                                cp.data_ptr<float>(), temp.data_ptr<float>(), tk.data_ptr<int32_t>(),
                                tp.data_ptr<float>(), u.data_ptr<float>(), accept.data_ptr<int32_t>(),
                                out.data_ptr<int64_t>(), a);
  });
  return {accept, out};
}

}  // namespace cpu
}  // namespace dspine
