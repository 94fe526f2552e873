// Torch bindings of the row-invariant dense GEMM (dense_gemm.h): argument checks, dtype dispatch
// and allocation, or checks of the caller's output (the .out overload). The CUDA backend (rows of
// the checkpoint-layout weight) is csrc/cuda/cuda_dense.cu.
#include <torch/all.h>

#include <torch/library.h>

#include "../dense_binding.h"
#include "dense_gemm.h"

namespace dspine {
namespace cpu {

namespace {

// x [..., k] and the packed weight [ceil(n / 64), k, 64] of one dtype; returns x contiguous.
at::Tensor check_args(const at::Tensor& x, const at::Tensor& weight, int64_t n) {
  const char* op = "dense_matmul";
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), op,
              ": a CPU kernel (x on ", x.device(), ", weight on ", weight.device(), ")");
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, op,
              ": x must be float32, bfloat16 or float16, got ", t);
  TORCH_CHECK(weight.scalar_type() == t, op, ": weight dtype ", weight.scalar_type(),
              " differs from x's ", t);
  TORCH_CHECK(x.dim() >= 1, op, ": x must be [..., k]");
  const int64_t k = x.size(-1);
  TORCH_CHECK(n > 0, op, ": out_features must be positive, got ", n);
  TORCH_CHECK(weight.dim() == 3 && weight.is_contiguous() &&
                  weight.size(0) == (n + dense::kPanel - 1) / dense::kPanel && weight.size(1) == k &&
                  weight.size(2) == dense::kPanel,
              op, ": weight must be a contiguous packed [ceil(n/64), k, 64] table (ops.dense_pack) of ",
              n, " outputs and k = ", k, ", got ", weight.sizes());
  return x.contiguous();
}

void run(const at::Tensor& x, const at::Tensor& weight, int64_t n, at::Tensor& y) {
  const int64_t k = x.size(-1), count = y.numel() / n;  // rows (also when k = 0)
  switch (x.scalar_type()) {
    case at::kFloat:
      return dense::dense_matmul(x.data_ptr<float>(), count, k, weight.data_ptr<float>(), n, y.data_ptr<float>());
    case at::kBFloat16:
      return dense::dense_matmul(x.data_ptr<at::BFloat16>(), count, k, weight.data_ptr<at::BFloat16>(), n,
                                 y.data_ptr<at::BFloat16>());
    default:
      return dense::dense_matmul(x.data_ptr<at::Half>(), count, k, weight.data_ptr<at::Half>(), n,
                                 y.data_ptr<at::Half>());
  }
}

}  // namespace

at::Tensor dense_matmul(const at::Tensor& x_in, const at::Tensor& weight, int64_t out_features) {
  return dense_binding::matmul(x_in, weight, out_features, check_args, run);
}

// Into a caller's buffer (a preallocated activation, or a guarded or poisoned one in the tests).
at::Tensor& dense_matmul_out(const at::Tensor& x_in, const at::Tensor& weight, int64_t out_features,
                             at::Tensor& out) {
  return dense_binding::matmul_out(x_in, weight, out_features, out, check_args, run);
}

}  // namespace cpu
}  // namespace dspine

// Registered here rather than in ops.cpp: the op's schema fragment (its weight is laid out per
// device, so it is not an op-table row); the CUDA backend registers in csrc/cuda/cuda_dense.cu.
TORCH_LIBRARY_FRAGMENT(dspine, m) {
  m.def("dense_matmul(Tensor x, Tensor weight, int out_features) -> Tensor");
  m.def("dense_matmul.out(Tensor x, Tensor weight, int out_features, *, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(dspine, CPU, m) {
  m.impl("dense_matmul", &dspine::cpu::dense_matmul);
  m.impl("dense_matmul.out", &dspine::cpu::dense_matmul_out);
}
