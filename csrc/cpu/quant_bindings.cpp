// Torch bindings of the quantised CPU kernels (quant_gemm.h): argument checks and allocation.
// CPU only: there is no CUDA version (docs/DECISIONS.md), and CUDA tensors get a clear error.
#include <torch/all.h>

#include <cstdlib>
#include <string>
#include <torch/library.h>

#include "quant_gemm.h"

namespace dspine {
namespace cpu {

namespace {

quant::Format parse_format(c10::string_view name, const char* op) {
  if (name == "q8_0") return quant::kQ8_0;
  if (name == "q4_1") return quant::kQ4_1;
  TORCH_CHECK(false, op, ": unknown weight format '", std::string(name), "' (use q8_0 or q4_1)");
}

void check_isa_override(const char* op) {
  const char* env = std::getenv("DSPINE_CPU_ISA");
  quant::Isa isa;
  TORCH_CHECK(env == nullptr || !*env || quant::isa_from_name(env, &isa), op, ": DSPINE_CPU_ISA='",
              env, "' is not one of scalar, avx2, avx512");
}

// The packed table of `rows` rows of `k` values: uint8 [ceil(rows/16), k/32, tile-block bytes].
void check_packed(const at::Tensor& w, quant::Format f, int64_t rows, int64_t k, const char* op) {
  TORCH_CHECK(w.device().is_cpu(), op, ": the quantised kernels run on the CPU only (weight is on ",
              w.device(), "); use dtype float32/bfloat16 on other devices");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.is_contiguous(), op,
              ": weight must be a contiguous uint8 [tiles, blocks, tile_bytes] packed table");
  TORCH_CHECK(rows > 0, op, ": the table must have at least one row");
  TORCH_CHECK(w.size(0) == (rows + quant::kTileRows - 1) / quant::kTileRows &&
                  w.size(1) * quant::kBlock == k && w.size(2) == quant::tile_block_bytes(f),
              op, ": weight shape ", w.sizes(), " does not hold ", rows, " rows of ", k,
              " values in this format");
}

}  // namespace

at::Tensor quant_matmul(const at::Tensor& x_in, const at::Tensor& weight, c10::string_view format,
                        int64_t out_features) {
  const auto f = parse_format(format, "quant_matmul");
  TORCH_CHECK(x_in.device().is_cpu(), "quant_matmul: the quantised kernels run on the CPU only (x is on ",
              x_in.device(), ")");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() >= 1, "quant_matmul: x must be fp32 [..., k]");
  const int64_t k = x_in.size(-1);
  TORCH_CHECK(k > 0 && k % quant::kBlock == 0, "quant_matmul: k = ", k, " must be a positive multiple of 32");
  check_packed(weight, f, out_features, k, "quant_matmul");
  check_isa_override("quant_matmul");
  auto x = x_in.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = out_features;
  auto y = at::empty(sizes, x.options());
  quant::quant_matmul(x.data_ptr<float>(), x.numel() / k, k, weight.data_ptr<uint8_t>(), f, out_features,
                      y.data_ptr<float>());
  return y;
}

at::Tensor quant_embedding(const at::Tensor& ids_in, const at::Tensor& weight, c10::string_view format,
                           int64_t num_rows) {
  const auto f = parse_format(format, "quant_embedding");
  TORCH_CHECK(ids_in.device().is_cpu(), "quant_embedding: the quantised kernels run on the CPU only");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "quant_embedding: ids must be int64");
  TORCH_CHECK(weight.dim() == 3, "quant_embedding: weight must be a packed [tiles, blocks, tile_bytes] table");
  const int64_t k = weight.size(1) * quant::kBlock;
  check_packed(weight, f, num_rows, k, "quant_embedding");
  auto ids = ids_in.contiguous();
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    TORCH_CHECK(p[i] >= 0 && p[i] < num_rows, "quant_embedding: id ", p[i], " is outside [0, ", num_rows, ")");
  auto sizes = ids.sizes().vec();
  sizes.push_back(k);
  auto out = at::empty(sizes, ids.options().dtype(at::kFloat));
  quant::quant_rows(p, ids.numel(), weight.data_ptr<uint8_t>(), f, k, out.data_ptr<float>());
  return out;
}

// The instruction set the kernels run with now (0 scalar, 1 avx2, 2 avx512; ops.quant_isa).
int64_t quant_isa() {
  check_isa_override("quant_isa");
  return static_cast<int64_t>(quant::active_isa());
}

}  // namespace cpu
}  // namespace dspine

// Registered here rather than in ops.cpp: CPU-only ops with their own schema fragment.
TORCH_LIBRARY_FRAGMENT(dspine, m) {
  m.def("quant_matmul(Tensor x, Tensor weight, str format, int out_features) -> Tensor");
  m.def("quant_embedding(Tensor ids, Tensor weight, str format, int num_rows) -> Tensor");
  m.def("quant_isa() -> int", &dspine::cpu::quant_isa);
}

TORCH_LIBRARY_IMPL(dspine, CPU, m) {
  m.impl("quant_matmul", &dspine::cpu::quant_matmul);
  m.impl("quant_embedding", &dspine::cpu::quant_embedding);
}
