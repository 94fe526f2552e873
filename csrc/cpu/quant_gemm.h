// Quantised GEMV / small-M GEMM on GGUF weight blocks (CPU), and row lookups of such tables.
//
// Weights stay in their GGUF blocks (32 values along k share an fp16 scale d, and for Q4_1 an
// fp16 min m), repacked once at load into tiles of 16 output rows so that one SIMD register
// holds 16 (or 8) outputs: a tile-block is the 16 rows x 32 k of one block,
//   Q4_1: [d fp16 x16][m fp16 x16][4 x 64 B nibbles]  (320 B; byte 64 + 64p + 4n + t holds
//         element 4p+t of row n in its low nibble and element 16+4p+t in its high nibble)
//   Q8_0: [d fp16 x16][8 x 64 B int8]                 (544 B; byte 32 + 64j + 4n + t holds
//         element 4j+t of row n)
// and the weight tensor is [ceil(n/16) tiles][k/32 blocks][tile-block bytes]; rows past n are
// zero padding. Activations are quantised per row and block to int8 (d_x = amax/127, round to
// nearest even), so each block's dot product is an exact integer. Each output is then reduced
// in one fixed order, block after block, with separate multiplies and adds (no FMA):
//   acc += (d_w * d_x) * isum [+ m_w * s_x],  s_x = d_x * sum(q_x)
// The same order in every instruction set and for every number of rows is what makes a row's
// result bitwise independent of the rows computed beside it (lossless speculation) and equal
// to the PyTorch reference (dspine_engine/ops.py: quant_matmul_ref). No torch dependency.
#pragma once

#include <cstdint>

#include "isa.h"

namespace dspine {
namespace cpu {
namespace quant {

enum Format : int { kQ8_0 = 0, kQ4_1 = 1 };

constexpr int64_t kTileRows = 16;  // output rows interleaved in one tile
constexpr int64_t kBlock = 32;     // GGUF block length along k

constexpr int64_t tile_block_bytes(Format f) { return f == kQ4_1 ? 320 : 544; }

// Instruction sets with a kernel: isa.h (shared with the other SIMD kernels).
using cpu::Isa;
using cpu::active_isa;
using cpu::best_isa;
using cpu::isa_from_name;
using cpu::isa_name;

// y[m, n] = x[m, k] @ W^T for fp32 x (row-major, k a multiple of 32) and packed W.
void quant_matmul(const float* x, int64_t m, int64_t k, const uint8_t* w, Format f, int64_t n,
                  float* y);

// out[i, :] = dequantised row ids[i] of the packed table (ids already checked in [0, n)).
void quant_rows(const int64_t* ids, int64_t count, const uint8_t* w, Format f, int64_t k,
                float* out);

}  // namespace quant
}  // namespace cpu
}  // namespace dspine
