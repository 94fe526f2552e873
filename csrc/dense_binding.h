// What the CPU and CUDA bindings of dspine::dense_matmul share (csrc/cpu/dense_bindings.cpp,
// csrc/cuda/cuda_dense.cu): the output's sizes, the check of a caller's `out` and the two entry
// points around a backend's own argument checks (its weight layout) and launch.
#pragma once

#include <torch/all.h>

#include <vector>

namespace dspine {
namespace dense_binding {

// x [..., k] -> [..., n].
inline std::vector<int64_t> out_sizes(const at::Tensor& x, int64_t n) {
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  return sizes;
}

// `out` of the .out overload: contiguous, x's dtype and device, [..., n].
inline void check_out(const at::Tensor& out, const at::Tensor& x, int64_t n) {
  const auto sizes = out_sizes(x, n);
  TORCH_CHECK(out.device() == x.device() && out.scalar_type() == x.scalar_type() && out.is_contiguous() &&
                  out.sizes() == at::IntArrayRef(sizes),
              "dense_matmul: out must be a contiguous ", x.scalar_type(), " tensor of shape ", at::IntArrayRef(sizes),
              " on ", x.device(), " (got ", out.scalar_type(), " ", out.sizes(), " on ", out.device(), ")");
}

// The op and its .out overload over a backend's check (x_in, weight, n) -> x and run (x, weight,
// n, y): allocation, or the caller's buffer checked.
template <typename Check, typename Run>
at::Tensor matmul(const at::Tensor& x_in, const at::Tensor& weight, int64_t n, Check check, Run run) {
  const auto x = check(x_in, weight, n);
  auto y = at::empty(out_sizes(x, n), x.options());
  run(x, weight, n, y);
  return y;
}

template <typename Check, typename Run>
at::Tensor& matmul_out(const at::Tensor& x_in, const at::Tensor& weight, int64_t n, at::Tensor& out, Check check,
                       Run run) {
  const auto x = check(x_in, weight, n);
  check_out(out, x, n);
  run(x, weight, n, out);
  return out;
}

}  // namespace dense_binding
}  // namespace dspine
