// CUDA backend of dspine::dense_matmul (schema: csrc/cpu/dense_bindings.cpp): argument checks,
// allocation through the caching allocator, launch on the current stream (graph-capturable).
// On CUDA the weight keeps the checkpoint layout [n, k] (ops.dense_pack leaves it as it is).
#include <type_traits>

#include <torch/library.h>

#include "../dense_binding.h"
#include "binding.h"
#include "dense_gemm.cuh"
#include "dense_sm90.h"

namespace dspine {
namespace cuda {

namespace {

// x [..., k] bf16/fp16 and weight [n, k] of its dtype; returns x contiguous and 16-byte aligned.
at::Tensor check_dense_args(const at::Tensor& x_in, const at::Tensor& weight, int64_t n) {
  const char* op = "dense_matmul";
  check_device(op, x_in, weight);
  const auto t = x_in.scalar_type();
  TORCH_CHECK(t == at::kBFloat16 || t == at::kHalf, op, ": on CUDA x must be bfloat16 or float16, got ", t);
  TORCH_CHECK(weight.scalar_type() == t, op, ": weight dtype ", weight.scalar_type(), " differs from x's ", t);
  TORCH_CHECK(x_in.dim() >= 1, op, ": x must be [..., k]");
  const int64_t k = x_in.size(-1);
  TORCH_CHECK(n > 0, op, ": out_features must be positive, got ", n);
  TORCH_CHECK(k > 0 && k % gpu::kDenseChunk == 0, op, ": on CUDA k must be a positive multiple of ",
              gpu::kDenseChunk, ", got ", k);
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(0) == n && weight.size(1) == k, op,
              ": on CUDA the weight must be a contiguous [out_features, k] = [", n, ", ", k, "] tensor, got ",
              weight.sizes());
  TORCH_CHECK(gpu::is_aligned16(weight.data_ptr()), op, ": the weight must start on a 16-byte boundary");
  TORCH_CHECK(n <= INT32_MAX && k <= INT32_MAX, op, ": n and k must fit in 32 bits");
  auto x = x_in.contiguous();
  return gpu::is_aligned16(x.data_ptr()) ? x : x.clone();  // a view at an odd offset
}

void run(const at::Tensor& x, const at::Tensor& weight, int64_t n, at::Tensor& y) {
  const int64_t k = x.size(-1), m = x.numel() / k;
  if (m == 0) return;
  // The grid is one dimension of CTAs (at most ceil(m / 8) x ceil(n / 8) of them).
  TORCH_CHECK(gpu::ceil_div(m, 8) * gpu::ceil_div(n, 8) <= INT32_MAX, "dense_matmul: ", m, " rows x ", n,
              " outputs is too large a call");
  const c10::cuda::CUDAGuard guard(x.device());
  gpu::DenseParams p;
  p.x = x.data_ptr();
  p.w = weight.data_ptr();
  p.y = y.data_ptr();
  p.x_stride = k;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  // DSPINE_DENSE_COLS (1, 2, 4): column tiles a CTA; DSPINE_DENSE_RING: 1 the cp.async ring, 0
  // the register batches (unset: gpu::dense_use_ring). Tuning aids read at every call; the
  // result does not change with either.
  const int forced_cols = env_int("DSPINE_DENSE_COLS", 0);
  const int forced_ring = env_int("DSPINE_DENSE_RING", -1);
  // On Hopper the TMA / wgmma kernel (dense_sm90.cuh) takes every call; DSPINE_DENSE_SM90=0 keeps
  // the mma.sync kernel (a measurement aid: the two round differently, so a process should not
  // mix them). DSPINE_DENSE_SM90_BN (64, 128) and DSPINE_DENSE_SM90_CTAS (1 .. SMs) fix the sm90
  // kernel's tile width and CTA count (tests, tuning; each choice is row-exact on its own);
  // DSPINE_DENSE_SM90_WIDE one wgmma for a warpgroup's 32 or 64 rows (1, the default since the
  // 37th session: rows stay exact, and on the H100 it took the Qwen3-8B lm_head's 128 rows from
  // 515 to 460 us) or one m64n16k16 for each 16 rows (0).
  const bool sm90 = env_int("DSPINE_DENSE_SM90", 1) != 0;
  const int sms = num_sms();
  gpu::DenseSm90Knobs knobs;
  knobs.block_n = env_int("DSPINE_DENSE_SM90_BN", 0);
  knobs.ctas = env_int("DSPINE_DENSE_SM90_CTAS", 0);
  const int wide = env_int("DSPINE_DENSE_SM90_WIDE", 1);
  TORCH_CHECK(wide == 0 || wide == 1, "dense_matmul: DSPINE_DENSE_SM90_WIDE must be 0 or 1, got ", wide);
  knobs.wide = wide == 1;
  TORCH_CHECK(knobs.block_n == 0 || knobs.block_n == 64 || knobs.block_n == 128,
              "dense_matmul: DSPINE_DENSE_SM90_BN must be 64 or 128, got ", knobs.block_n);
  TORCH_CHECK(knobs.ctas >= 0 && knobs.ctas <= sms, "dense_matmul: DSPINE_DENSE_SM90_CTAS must be 1 to ", sms,
              " (the SM count), got ", knobs.ctas);
  dispatch_float(x.scalar_type(), "dense_matmul", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same<T, float>::value) {
      if (sm90 && gpu::dense_sm90_runnable<T>()) {
        TORCH_CHECK(gpu::launch_dense_sm90<T>(p, sms, knobs, stream()),
                    "dense_matmul: the driver refused a tensor map for the weight or x, or the Hopper kernel's "
                    "workspace could not be allocated");
      } else {
        gpu::launch_dense_matmul<T>(p, sms, forced_cols, forced_ring, stream());
      }
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor dense_matmul(const at::Tensor& x_in, const at::Tensor& weight, int64_t out_features) {
  return dense_binding::matmul(x_in, weight, out_features, check_dense_args, run);
}

// Into a caller's buffer (a preallocated activation, or a guarded or poisoned one in the tests).
at::Tensor& dense_matmul_out(const at::Tensor& x_in, const at::Tensor& weight, int64_t out_features,
                             at::Tensor& out) {
  return dense_binding::matmul_out(x_in, weight, out_features, out, check_dense_args, run);
}

// Launches of the Hopper kernel so far (0 in a build without it): the GPU tests check with it
// that a call took the path they meant to test.
static int64_t dense_sm90_launches() { return gpu::dense_sm90_launches(); }

// 1 when this build has the Hopper kernel and its image runs on the current device (the engine's
// Dense takes it then under DSPINE_DENSE_CUDA=auto; the tests and benchmarks ask before they
// compare kernels).
static int64_t dense_sm90_available() {
  return gpu::dense_sm90_runnable<__nv_bfloat16>() && gpu::dense_sm90_runnable<__half>() ? 1 : 0;
}

}  // namespace cuda
}  // namespace dspine

TORCH_LIBRARY_FRAGMENT(dspine, m) {
  m.def("dense_sm90_launches() -> int", &dspine::cuda::dense_sm90_launches);
  m.def("dense_sm90_available() -> int", &dspine::cuda::dense_sm90_available);
}

TORCH_LIBRARY_IMPL(dspine, CUDA, m) {
  m.impl("dense_matmul", &dspine::cuda::dense_matmul);
  m.impl("dense_matmul.out", &dspine::cuda::dense_matmul_out);
}
