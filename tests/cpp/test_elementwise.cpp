// RMSNorm, add + RMSNorm, RoPE, the paged KV write and the fused injection against naive double
// references, including the aliasing (in-place) uses the header allows.
#include <cmath>

#include "test_util.h"

namespace dspine_test {
namespace {

// ---- RMSNorm --------------------------------------------------------------------------------

std::vector<double> rms_norm_naive(const std::vector<double>& x, const std::vector<float>& w, int64_t rows,
                                   int64_t dim, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double sum_sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += x[r * dim + i] * x[r * dim + i];
    const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = x[r * dim + i] * inv_rms * w[i];
  }
  return out;
}

void rms_norm_case(Rng& rng, int64_t rows, int64_t dim, float eps) {
  Case c(str("rms_norm rows=", rows, " dim=", dim, " eps=", eps));
  const auto x = rng.normals(rows * dim, 3.f);
  const auto w = rng.normals(dim);
  auto out = poisoned(x.size());
  check_ok(dspine_cpu_rms_norm_f32(x.data(), w.data(), out.data(), rows, dim, eps), "rms_norm");
  check_close("out", out, rms_norm_naive(to_double(x), w, rows, dim, eps), 1e-5, 1e-5);

  auto in_place = x;
  check_ok(dspine_cpu_rms_norm_f32(in_place.data(), w.data(), in_place.data(), rows, dim, eps), "rms_norm in place");
  check_same_bits("in-place out", in_place, out);
}

void add_rms_norm_case(Rng& rng, int64_t rows, int64_t dim, float eps) {
  Case c(str("add_rms_norm rows=", rows, " dim=", dim, " eps=", eps));
  const auto x = rng.normals(rows * dim, 2.f), res = rng.normals(rows * dim, 2.f);
  const auto w = rng.normals(dim);
  auto out = poisoned(x.size()), sum = poisoned(x.size());
  check_ok(dspine_cpu_add_rms_norm_f32(x.data(), res.data(), w.data(), out.data(), sum.data(), rows, dim, eps),
           "add_rms_norm");
  std::vector<double> want_sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) want_sum[i] = static_cast<double>(x[i]) + res[i];
  check_close("residual_out", sum, want_sum, 1e-6, 1e-6);
  // The normalised output is defined on the stored (fp32-rounded) sum.
  check_close("out", out, rms_norm_naive(to_double(sum), w, rows, dim, eps), 1e-5, 1e-5);

  // The pre-norm residual stream updated in place: out over x, the sum over the residual.
  auto x_io = x, res_io = res;
  check_ok(dspine_cpu_add_rms_norm_f32(x_io.data(), res_io.data(), w.data(), x_io.data(), res_io.data(), rows, dim,
                                       eps),
           "add_rms_norm in place");
  check_same_bits("in-place out", x_io, out);
  check_same_bits("in-place residual_out", res_io, sum);

  // The crossed aliasing: out over the residual, the sum over x.
  x_io = x, res_io = res;
  check_ok(dspine_cpu_add_rms_norm_f32(x_io.data(), res_io.data(), w.data(), res_io.data(), x_io.data(), rows, dim,
                                       eps),
           "add_rms_norm crossed in place");
  check_same_bits("crossed out", res_io, out);
  check_same_bits("crossed residual_out", x_io, sum);
}

// ---- RoPE -----------------------------------------------------------------------------------

// Row p = [cos(p * f_i) for i < D/2, sin(p * f_i) for i < D/2], f_i = theta^(-2i/D), as fp32.
std::vector<float> rope_table(int64_t rows, int64_t head_dim, double theta) {
  const int64_t half = head_dim / 2;
  std::vector<float> table(rows * head_dim);
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
      table[p * head_dim + i] = static_cast<float>(std::cos(angle));
      table[p * head_dim + half + i] = static_cast<float>(std::sin(angle));
    }
  return table;
}

// One head vector rotated by the table row of `pos` (rotate-half form).
void rotate_naive(const float* in, double* out, const float* table_row, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double c = table_row[i], s = table_row[half + i];
    out[i] = in[i] * c - in[half + i] * s;
    out[half + i] = in[half + i] * c + in[i] * s;
  }
}

void rope_case(Rng& rng, int64_t tokens, int64_t heads, int64_t head_dim, int64_t pad) {
  Case c(str("rope tokens=", tokens, " heads=", heads, " head_dim=", head_dim, " row padding=", pad));
  const int64_t table_rows = 97, row = heads * head_dim, stride = row + pad;
  const auto table = rope_table(table_rows, head_dim, 10000.0);
  // x rows are views into a wider buffer (a fused projection); the padding must never be read.
  std::vector<float> x(tokens * stride, kNaN);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < row; ++i) x[t * stride + i] = rng.normal();
  std::vector<int32_t> positions(tokens);
  for (auto& p : positions) p = static_cast<int32_t>(rng.integer(0, table_rows - 1));

  auto out = poisoned(tokens * row);
  check_ok(dspine_cpu_rope_f32(x.data(), stride, out.data(), positions.data(), table.data(), table_rows, tokens,
                               heads, head_dim),
           "rope");
  std::vector<double> want(tokens * row);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      rotate_naive(&x[t * stride + h * head_dim], &want[t * row + h * head_dim], &table[positions[t] * head_dim],
                   head_dim);
  check_close("out", out, want, 1e-5, 1e-5);

  if (pad == 0) {
    auto in_place = x;
    check_ok(dspine_cpu_rope_f32(in_place.data(), stride, in_place.data(), positions.data(), table.data(), table_rows,
                                 tokens, heads, head_dim),
             "rope in place");
    check_same_bits("in-place out", in_place, out);
  }
}

// ---- paged KV write -------------------------------------------------------------------------

void write_kv_case(Rng& rng, int64_t tokens, int64_t kv_heads, int64_t head_dim, int64_t pages, int64_t page_size,
                   bool rotate) {
  Case c(str("write_kv tokens=", tokens, " kv_heads=", kv_heads, " head_dim=", head_dim, " pages=", pages,
             " page_size=", page_size, " rope=", rotate));
  const int64_t row = kv_heads * head_dim, k_stride = row + 3, v_stride = row + 1, table_rows = 64;
  const int64_t num_slots = pages * page_size;
  const auto table = rope_table(table_rows, head_dim, 500.0);
  std::vector<float> k(tokens * k_stride, kNaN), v(tokens * v_stride, kNaN);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < row; ++i) {
      k[t * k_stride + i] = rng.normal();
      v[t * v_stride + i] = rng.normal();
    }
  // Distinct random slots, about a quarter of the tokens padding (-1).
  std::vector<int32_t> all_slots(num_slots);
  for (int64_t s = 0; s < num_slots; ++s) all_slots[s] = static_cast<int32_t>(s);
  rng.shuffle(all_slots);
  std::vector<int32_t> slots(tokens), positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    slots[t] = rng.coin(0.25) ? -1 : all_slots[t];
    positions[t] = static_cast<int32_t>(rng.integer(0, table_rows - 1));
  }

  // Caches start as NaN: written slots must hold exactly k/v (or rope(k)), the rest stay NaN.
  auto k_cache = poisoned(num_slots * row), v_cache = poisoned(num_slots * row);
  check_ok(dspine_cpu_write_kv_f32(k.data(), k_stride, v.data(), v_stride, positions.data(),
                                   rotate ? table.data() : nullptr, table_rows, k_cache.data(), v_cache.data(),
                                   num_slots, slots.data(), tokens, kv_heads, head_dim),
           "write_kv");

  std::vector<double> want_k(num_slots * row, std::nan("")), want_v(num_slots * row, std::nan(""));
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    const int64_t dst = slots[t] * row;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float* src = &k[t * k_stride + h * head_dim];
      if (rotate) {
        rotate_naive(src, &want_k[dst + h * head_dim], &table[positions[t] * head_dim], head_dim);
      } else {
        for (int64_t i = 0; i < head_dim; ++i) want_k[dst + h * head_dim + i] = src[i];
      }
    }
    for (int64_t i = 0; i < row; ++i) want_v[dst + i] = v[t * v_stride + i];
  }
  int64_t nan_mismatch = 0;
  for (size_t i = 0; i < want_k.size(); ++i) {
    const bool written = !std::isnan(want_k[i]);
    if (written) continue;
    nan_mismatch += !std::isnan(k_cache[i]) + !std::isnan(v_cache[i]);
    k_cache[i] = v_cache[i] = 0.f;  // compare only the written slots below
    want_k[i] = want_v[i] = 0.0;
  }
  check(nan_mismatch == 0, str(nan_mismatch, " cache values outside the written slots were modified"));
  check_close("k_cache", k_cache, want_k, rotate ? 1e-5 : 0.0, rotate ? 1e-5 : 0.0);
  check_close("v_cache", v_cache, want_v, 0.0, 0.0);
}

// ---- fused injection ------------------------------------------------------------------------

void injection_case(Rng& rng, int64_t n, int64_t block, int64_t hidden) {
  Case c(str("fused_injection n=", n, " block=", block, " hidden=", hidden));
  const auto h = rng.normals(n * block * hidden), gate = rng.normals(n * block * hidden, 2.f);
  const auto fproj = rng.normals(n * block * 2 * hidden, 2.f);
  auto out = poisoned(h.size());
  check_ok(dspine_cpu_fused_injection_f32(h.data(), gate.data(), fproj.data(), out.data(), n, block, hidden),
           "fused_injection");
  std::vector<double> want(h.size());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < block; ++j)
      for (int64_t x = 0; x < hidden; ++x) {
        const int64_t i = (s * block + j) * hidden + x;
        if (j == 0) {
          want[i] = h[i];  // the anchor receives nothing
          continue;
        }
        const int64_t pred = (s * block + j - 1) * 2 * hidden;  // the predecessor's projections
        const double g = 1.0 / (1.0 + std::exp(-(static_cast<double>(gate[i]) + fproj[pred + x])));
        want[i] = h[i] + g * fproj[pred + hidden + x];
      }
  check_close("out", out, want, 1e-5, 1e-5);

  auto in_place = h;
  check_ok(dspine_cpu_fused_injection_f32(in_place.data(), gate.data(), fproj.data(), in_place.data(), n, block,
                                          hidden),
           "fused_injection in place");
  check_same_bits("in-place out", in_place, out);
}

}  // namespace

void test_norm() {
  Rng rng(1);
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {17, 64}, {5, 129}, {2, 1000}}) {
    rms_norm_case(rng, rows, dim, 1e-6f);
    add_rms_norm_case(rng, rows, dim, 1e-5f);
  }
  rms_norm_case(rng, 4, 3, 0.5f);  // eps large enough to matter
}

void test_rope() {
  Rng rng(2);
  rope_case(rng, 1, 1, 2, 0);
  rope_case(rng, 7, 3, 6, 0);
  rope_case(rng, 13, 4, 64, 5);
  rope_case(rng, 5, 2, 128, 0);
  rope_case(rng, 9, 5, 34, 17);  // odd half (17): no pairing assumption beyond even head_dim
}

void test_write_kv() {
  Rng rng(3);
  for (bool rotate : {true, false}) {
    write_kv_case(rng, 1, 1, 2, 1, 1, rotate);
    write_kv_case(rng, 11, 2, 6, 4, 3, rotate);
    write_kv_case(rng, 20, 3, 64, 3, 16, rotate);
    write_kv_case(rng, 7, 1, 10, 7, 1, rotate);  // page size 1
  }
}

void test_injection() {
  Rng rng(4);
  injection_case(rng, 1, 1, 5);
  injection_case(rng, 3, 16, 37);
  injection_case(rng, 2, 5, 128);
  injection_case(rng, 4, 2, 1);
}

}  // namespace dspine_test
