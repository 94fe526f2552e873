// Torch bindings of the quantised CPU kernels (quant_gemm.h): argument checks and allocation, or
// checks of the caller's output (the .out overloads).
// CPU only: there is no CUDA version (docs/DECISIONS.md), and CUDA tensors get a clear error.
#include <torch/all.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>
#include <torch/library.h>

#include "../dspine_ops.h"
#include "common.h"
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

// `out` must be exactly the tensor the op would allocate: kernels write it densely, row by row.
void check_out(const at::Tensor& out, at::IntArrayRef sizes, const char* op) {
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous() &&
                  out.sizes() == sizes,
              op, ": out must be a contiguous fp32 CPU tensor of shape ", sizes, " (got ",
              out.scalar_type(), " ", out.sizes(), " on ", out.device(), ")");
}

// x checked and made contiguous, with the shape of its product with a table of `out_features` rows.
struct MatmulInput {
  at::Tensor x;
  quant::Format f;
  std::vector<int64_t> out_sizes;
};

MatmulInput check_matmul(const at::Tensor& x_in, const at::Tensor& weight, c10::string_view format,
                         int64_t out_features) {
  const auto f = parse_format(format, "quant_matmul");
  TORCH_CHECK(x_in.device().is_cpu(), "quant_matmul: the quantised kernels run on the CPU only (x is on ",
              x_in.device(), ")");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.dim() >= 1, "quant_matmul: x must be fp32 [..., k]");
  const int64_t k = x_in.size(-1);
  TORCH_CHECK(k > 0 && k % quant::kBlock == 0, "quant_matmul: k = ", k, " must be a positive multiple of 32");
  check_packed(weight, f, out_features, k, "quant_matmul");
  check_isa_override("quant_matmul");
  auto sizes = x_in.sizes().vec();
  sizes.back() = out_features;
  return {x_in.contiguous(), f, std::move(sizes)};
}

// ids checked (every one in [0, num_rows)) and made contiguous, with the shape of their rows.
struct EmbeddingInput {
  at::Tensor ids;
  quant::Format f;
  int64_t k;
  std::vector<int64_t> out_sizes;
};

EmbeddingInput check_embedding(const at::Tensor& ids_in, const at::Tensor& weight, c10::string_view format,
                               int64_t num_rows) {
  const auto f = parse_format(format, "quant_embedding");
  TORCH_CHECK(ids_in.device().is_cpu(), "quant_embedding: the quantised kernels run on the CPU only");
  TORCH_CHECK(ids_in.scalar_type() == at::kLong, "quant_embedding: ids must be int64");
  TORCH_CHECK(weight.dim() == 3, "quant_embedding: weight must be a packed [tiles, blocks, tile_bytes] table");
  const int64_t k = weight.size(1) * quant::kBlock;
  check_packed(weight, f, num_rows, k, "quant_embedding");
  auto ids = ids_in.contiguous();
  const int64_t* p = ids.data_ptr<int64_t>();
  const int64_t bad = first_outside(p, ids.numel(), 0, num_rows);
  // TORCH_CHECK forms its message only when the check fails, so p[bad] is then in range.
  TORCH_CHECK(bad == ids.numel(), "quant_embedding: id ", p[bad], " is outside [0, ", num_rows, ")");
  auto sizes = ids.sizes().vec();
  sizes.push_back(k);
  return {std::move(ids), f, k, std::move(sizes)};
}

void run_matmul(const MatmulInput& in, const at::Tensor& weight, int64_t out_features, at::Tensor& out) {
  const int64_t k = in.x.size(-1);
  quant::quant_matmul(in.x.data_ptr<float>(), in.x.numel() / k, k, weight.data_ptr<uint8_t>(), in.f,
                      out_features, out.data_ptr<float>());
}

void run_embedding(const EmbeddingInput& in, const at::Tensor& weight, at::Tensor& out) {
  quant::quant_rows(in.ids.data_ptr<int64_t>(), in.ids.numel(), weight.data_ptr<uint8_t>(), in.f, in.k,
                    out.data_ptr<float>());
}

}  // namespace

at::Tensor quant_matmul(const at::Tensor& x, const at::Tensor& weight, c10::string_view format,
                        int64_t out_features) {
  const auto in = check_matmul(x, weight, format, out_features);
  auto y = at::empty(in.out_sizes, in.x.options());
  run_matmul(in, weight, out_features, y);
  return y;
}

// Into a caller's buffer (a preallocated activation, or a guarded one in the tests).
at::Tensor& quant_matmul_out(const at::Tensor& x, const at::Tensor& weight, c10::string_view format,
                             int64_t out_features, at::Tensor& out) {
  const auto in = check_matmul(x, weight, format, out_features);
  check_out(out, in.out_sizes, "quant_matmul");
  run_matmul(in, weight, out_features, out);
  return out;
}

at::Tensor quant_embedding(const at::Tensor& ids, const at::Tensor& weight, c10::string_view format,
                           int64_t num_rows) {
  const auto in = check_embedding(ids, weight, format, num_rows);
  auto out = at::empty(in.out_sizes, in.ids.options().dtype(at::kFloat));
  run_embedding(in, weight, out);
  return out;
}

at::Tensor& quant_embedding_out(const at::Tensor& ids, const at::Tensor& weight, c10::string_view format,
                                int64_t num_rows, at::Tensor& out) {
  const auto in = check_embedding(ids, weight, format, num_rows);
  check_out(out, in.out_sizes, "quant_embedding");
  run_embedding(in, weight, out);
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
  m.def("quant_matmul.out(Tensor x, Tensor weight, str format, int out_features, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("quant_embedding.out(Tensor ids, Tensor weight, str format, int num_rows, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("quant_isa() -> int", &dspine::cpu::quant_isa);
}

TORCH_LIBRARY_IMPL(dspine, CPU, m) {
  m.impl("quant_matmul", &dspine::cpu::quant_matmul);
  m.impl("quant_embedding", &dspine::cpu::quant_embedding);
  m.impl("quant_matmul.out", &dspine::cpu::quant_matmul_out);
  m.impl("quant_embedding.out", &dspine::cpu::quant_embedding_out);
}
