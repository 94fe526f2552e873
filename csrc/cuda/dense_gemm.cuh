// Dense GEMM for few rows (CUDA): y[m, n] = sum_k x[m, k] W[n, k], bf16 / fp16 in, fp32
// accumulators, one reduction order per output whatever the rows of the call.
// Semantics: dspine_engine/ops.py:dense_matmul (the CPU kernel's op; here W keeps the
// checkpoint's [n, k] layout).
//
// Why our own: a verify block's projections have 16 rows a sequence, where cuBLAS picks split-K
// kernels that read the weights at 63-84% of the copy bandwidth on the H200 plus a separate
// reduction launch (step_table.py --kernels: o_proj, qkv and down at batch 1), and its choice
// of kernel changes with the row count, so a position's row in a verify block need not be
// bitwise its decode-step row. Here the row count never changes an output's arithmetic:
//
// CTA = 4 warps over 8 * NT output columns (W rows) and ROWS rows of x (more CTAs over more rows).
// k is cut into chunks of 32; warp w takes chunks w, w + 4, w + 8, ... (the four warps read
// neighbouring bytes of each W row at once). A lane loads 16 bytes of a W row per chunk
// (row 8j + g of the CTA's columns, k 8t .. 8t + 7, g = lane / 4, t = lane % 4) and of each of
// its x rows, and two m16n8k16 mmas take the chunk: the mma's k index is permuted so that each
// lane's 8 contiguous elements are exactly the ones its fragments need (step s uses elements
// 4s .. 4s + 3 of the lane's 8: b0 / a0 / a1 the first pair, b1 / a2 / a3 the second). A
// permutation of k changes nothing in a dot product but the order the products meet, and that
// order is the same for every output. The warps' partial sums are added in warp order 0..3
// (through shared memory) and rounded once. An output's bits thus depend on its x row, its W
// row and k alone: not on the rows, ROWS, NT or the grid of the call.
#pragma once

#include "mma.cuh"

namespace dspine {
namespace gpu {

struct DenseParams {
  const void* x;     // [m, k] rows, x_stride elements apart (k contiguous)
  const void* w;     // [n, k] contiguous
  void* y;           // [m, n] contiguous
  int64_t x_stride;
  int m, n, k;       // k a multiple of kDenseChunk
};

constexpr int kDenseWarps = 4;   // split k in a CTA
constexpr int kDenseChunk = 32;  // k a warp takes a step (one 16-byte load a lane a row)

// The loads are volatile asm, as the mmas are, so that the PTX keeps a batch's loads before its
// first mma. ptxas schedules the SASS itself and may still move them (it sank each chunk's loads
// under a per-chunk guard: docs/KERNELS.md); `sass-dense` in h200_quick.sh shows what it did.
// 16 bytes of a weight row, read once: not kept in L1, a 256-byte L2 prefetch (rows stream).
__device__ __forceinline__ uint4 load_weight_16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// 16 bytes of an x row, cached (every CTA of an SM reads the same rows); zeros where !valid
// (p must still be mapped). Predicated rather than branched, so a batch's loads stay together.
__device__ __forceinline__ uint4 load_rows_16(const void* p, bool valid) {
  uint4 r;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "r"(static_cast<int>(valid)));
  return r;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Tile shape: ROWS rows of x (8: only the mma's upper 8 rows are loaded), NT column tiles of 8.
template <int ROWS, int NT>
struct DenseTile {
  static constexpr int kMTiles = ROWS <= 16 ? 1 : ROWS / 16;  // m16 tiles
  static constexpr bool kUpperOnly = ROWS <= 8;               // rows g + 8 are all past m
  static constexpr int kHalves = kUpperOnly ? 1 : 2;
  static constexpr int kCols = 8 * NT;
  // Chunks a warp loads before it multiplies (register budget: <= ~96 registers of loads).
  static constexpr int kBatch = kMTiles >= 2 ? 2 : 4;
  static constexpr int kThreads = kDenseWarps * kWarpSize;
  static_assert(ROWS == 8 || ROWS == 16 || ROWS == 32 || ROWS == 64, "rows a CTA: 8, 16, 32 or 64");
  static_assert(NT == 1 || NT == 2 || NT == 4, "column tiles a CTA: 1, 2 or 4");
};

// The cp.async variant (RING): each warp streams its chunks through a private ring of shared
// memory, kStages - 1 chunks in flight, and reads a chunk back once its copies landed. A lane's
// pieces (NT of W, then its x rows) sit at [stage][piece][lane]: it reads only what it copied, so
// its own cp.async.wait_group is all the ordering needed. Why it exists: the register batches
// rely on the compiler keeping a batch's loads together, which it did not always do; copies in
// flight cannot be moved, and they take no registers. Same chunks, same order of arithmetic: the
// two variants agree bitwise.
template <int ROWS, int NT>
struct DenseRing {
  using Tile = DenseTile<ROWS, NT>;
  static constexpr int kPieces = NT + Tile::kMTiles * Tile::kHalves;  // 16-byte pieces a lane a chunk
  static constexpr int kStageBytes = kPieces * kWarpSize * 16;        // one warp's chunk
  static constexpr int kStages = 12288 / kStageBytes < 2 ? 2 : 12288 / kStageBytes > 8 ? 8 : 12288 / kStageBytes;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kDenseWarps) * kStages * kStageBytes;
};

// One chunk of the warp: acc[mt][j] += x rows (mt) . W rows (j) over its 32 k.
template <typename T, typename Tile, int MT, int NT>
__device__ __forceinline__ void dense_chunk(float (&acc)[MT][NT][4], const uint4 (&wv)[NT],
                                            const uint4 (&xv)[MT][2]) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint32_t a[4] = {word(xv[mt][0], 2 * s), Tile::kUpperOnly ? 0u : word(xv[mt][1], 2 * s),
                             word(xv[mt][0], 2 * s + 1), Tile::kUpperOnly ? 0u : word(xv[mt][1], 2 * s + 1)};
#pragma unroll
      for (int j = 0; j < NT; ++j) mma_16816<T>(acc[mt][j], a, word(wv[j], 2 * s), word(wv[j], 2 * s + 1));
    }
  }
}

// grid: ceil(m / ROWS) x ceil(n / (8 NT)) CTAs in one dimension, the row blocks of a column tile
// adjacent (they run together and share the tile's weight bytes in L2); block: 128 threads.
template <typename T, int ROWS, int NT, bool RING>
__global__ void __launch_bounds__(DenseTile<ROWS, NT>::kThreads) dense_rows_kernel(const DenseParams p) {
  join_chain();  // launch.cuh
  using Tile = DenseTile<ROWS, NT>;
  constexpr int MT = Tile::kMTiles, B = Tile::kBatch;
  __shared__ float partial[kDenseWarps - 1][MT][NT][4][kWarpSize];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int row_blocks = static_cast<int>(ceil_div(p.m, ROWS));
  const int col0 = static_cast<int>(blockIdx.x / row_blocks) * Tile::kCols;
  const int row0 = static_cast<int>(blockIdx.x % row_blocks) * ROWS;
  const T* w = static_cast<const T*>(p.w);
  const T* x = static_cast<const T*>(p.x);

  // This lane's W rows (clamped inside W: a column past n is computed and never stored) and x
  // rows (past m: row 0's address, loaded as zeros).
  const T* wrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int col = min(col0 + 8 * j + g, p.n - 1);
    wrow[j] = w + static_cast<int64_t>(col) * p.k + 8 * t;
  }
  const T* xrow[MT][2];
  uint32_t xvalid = 0;  // bit 2 mt + h: row 16 mt + 8 h + g is inside x
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * mt + 8 * h + g;
      const bool valid = row < p.m && h < Tile::kHalves;
      xvalid |= static_cast<uint32_t>(valid) << (2 * mt + h);
      xrow[mt][h] = x + static_cast<int64_t>(valid ? row : 0) * p.x_stride + 8 * t;
    }

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;

  // Chunk c's 16-byte pieces of this lane's W and x rows.
  const auto load_chunk = [&](int c, uint4(&wv)[NT], uint4(&xv)[MT][2]) {
    const int64_t k0 = static_cast<int64_t>(c) * kDenseChunk;
#pragma unroll
    for (int j = 0; j < NT; ++j) wv[j] = load_weight_16(wrow[j] + k0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < Tile::kHalves; ++h) xv[mt][h] = load_rows_16(xrow[mt][h] + k0, xvalid >> (2 * mt + h) & 1u);
  };
  const int chunks = p.k / kDenseChunk;
  if constexpr (RING) {
    using R = DenseRing<ROWS, NT>;
    constexpr int S = R::kStages;
    extern __shared__ __align__(16) unsigned char dense_smem[];
    uint4* ring = reinterpret_cast<uint4*>(dense_smem) + warp * S * R::kPieces * kWarpSize + lane;
    const auto piece = [&](int stage, int i) { return ring + (stage * R::kPieces + i) * kWarpSize; };
    const auto issue = [&](int c, int stage) {
      const int64_t k0 = static_cast<int64_t>(c) * kDenseChunk;
#pragma unroll
      for (int j = 0; j < NT; ++j) cp_async_16(piece(stage, j), wrow[j] + k0, true);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < Tile::kHalves; ++h)
          cp_async_16(piece(stage, NT + mt * Tile::kHalves + h), xrow[mt][h] + k0, xvalid >> (2 * mt + h) & 1u);
    };
    const int mine = chunks > warp ? (chunks - warp + kDenseWarps - 1) / kDenseWarps : 0;  // chunks warp + 4i
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
      if (i < mine) issue(warp + i * kDenseWarps, i);
      cp_async_commit();  // one group a chunk, empty past the warp's last
    }
    for (int i = 0; i < mine; ++i) {
      const int ahead = i + S - 1;  // its stage is chunk i - 1's, read into registers last step
      if (ahead < mine) issue(warp + ahead * kDenseWarps, ahead % S);
      cp_async_commit();
      cp_async_wait<S - 1>();  // chunk i's group has landed
      uint4 wv[NT], xv[MT][2];
#pragma unroll
      for (int j = 0; j < NT; ++j) wv[j] = *piece(i % S, j);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < Tile::kHalves; ++h) xv[mt][h] = *piece(i % S, NT + mt * Tile::kHalves + h);
      dense_chunk<T, Tile, MT, NT>(acc, wv, xv);
    }
    cp_async_wait<0>();  // the trailing empty groups
  } else {
    // Whole batches, every load issued before the first mma. No guard in the batch: with one
    // per chunk the compiler sank each chunk's loads under its guard, next to its mmas, and one
    // chunk was in flight at a time (SASS on the H100; the kernel ran at 1.1-2.2 TB/s).
    int c0 = warp;
    for (; c0 + (B - 1) * kDenseWarps < chunks; c0 += B * kDenseWarps) {
      uint4 wv[B][NT], xv[B][MT][2];
#pragma unroll
      for (int b = 0; b < B; ++b) load_chunk(c0 + b * kDenseWarps, wv[b], xv[b]);
#pragma unroll
      for (int b = 0; b < B; ++b) dense_chunk<T, Tile, MT, NT>(acc, wv[b], xv[b]);
    }
    for (; c0 < chunks; c0 += kDenseWarps) {  // the warp's last chunks, one at a time (same order)
      uint4 wv[NT], xv[MT][2];
      load_chunk(c0, wv, xv);
      dense_chunk<T, Tile, MT, NT>(acc, wv, xv);
    }
  }

  // Warps 1..3 hand their sums to warp 0, which adds them in warp order and writes.
  if (warp > 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) partial[warp - 1][mt][j][e][lane] = acc[mt][j][e];
  }
  __syncthreads();
  if (warp != 0) return;
  T* y = static_cast<T*>(p.y);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = acc[mt][j][e];
#pragma unroll
        for (int from = 0; from < kDenseWarps - 1; ++from) v += partial[from][mt][j][e][lane];
        const int row = row0 + 16 * mt + g + (e >= 2 ? 8 : 0);
        const int col = col0 + 8 * j + 2 * t + (e & 1);
        if (row < p.m && col < p.n) y[static_cast<int64_t>(row) * p.n + col] = from_float<T>(v);
      }
    }
  }
}

// ---- host ------------------------------------------------------------------------------------

// Rows a CTA takes: the fewest of 8, 16, 32, 64 that hold m (64 past that, more CTAs for the rest).
inline int dense_tile_rows(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64; }

// Column tiles a CTA takes: the widest (fewest re-reads of x) that still gives every SM three
// CTAs, as many warps as keep enough weight bytes in flight; forced (1, 2, 4) fixes it.
inline int dense_tile_cols(int64_t n, int64_t row_blocks, int num_sms, int forced = 0) {
  if (forced == 1 || forced == 2 || forced == 4) return forced;
  for (int nt : {4, 2}) {
    if (ceil_div(n, 8 * nt) * row_blocks >= 3LL * num_sms) return nt;
  }
  return 1;
}

// Which loader streams the weights: the cp.async ring (DenseRing) or register batches; the same
// bits either way. The ring keeps more chunks in flight per warp (up to 7), which pays where the
// grid is small: few column tiles (n < 16384: one CTA per 8 columns is at most ~4 CTAs an SM on
// 132 SMs) and rows few enough that a chunk's x pieces stay small beside its weight piece (m <= 8:
// one x piece a lane). Measured (H100, 27th session, cuda_dense_gemm.py, cold weights, us, ring /
// registers): Qwen3-8B down 39.0 / 59.1 at 1 row, 48.4 / 59.3 at 8; o 14.3 / 20.2, 16.6 / 20.3;
// qkv 20.8 / 23.1, 22.8 / 23.4; SmolLM2's four projections 0.42-1.05x at 1-8 rows; but qkv at
// 16 rows 29.5 / 23.7, gate_up (n = 24576) 78.7 / 69.4 and lm_head 487 / 410 at 1 row.
// forced: 1 the ring, 0 the register batches (DSPINE_DENSE_RING), anything else this rule.
inline bool dense_use_ring(int64_t m, int64_t n, int forced) {
  if (forced == 0 || forced == 1) return forced == 1;
  return m <= 8 && n < 16384;
}

template <typename T, int ROWS, int NT, bool RING>
void launch_dense_tile(const DenseParams& p, cudaStream_t stream) {
  constexpr auto kernel = dense_rows_kernel<T, ROWS, NT, RING>;
  const int64_t ctas = ceil_div(p.n, 8 * NT) * ceil_div(p.m, ROWS);  // < 2^31 for m, n < 2^31
  size_t smem = 0;
  if constexpr (RING) {
    smem = DenseRing<ROWS, NT>::kSmemBytes;
    allow_max_dynamic_smem<kernel>();
  }
  launch_kernel(kernel, Launch(static_cast<unsigned>(ctas), DenseTile<ROWS, NT>::kThreads, smem, stream), p);
}

template <typename T, int ROWS, bool RING>
void launch_dense_rows(const DenseParams& p, int nt, cudaStream_t stream) {
  switch (nt) {
    case 4: return launch_dense_tile<T, ROWS, 4, RING>(p, stream);
    case 2: return launch_dense_tile<T, ROWS, 2, RING>(p, stream);
    default: return launch_dense_tile<T, ROWS, 1, RING>(p, stream);
  }
}

template <typename T, bool RING>
void launch_dense_variant(const DenseParams& p, int rows, int nt, cudaStream_t stream) {
  switch (rows) {
    case 8: return launch_dense_rows<T, 8, RING>(p, nt, stream);
    case 16: return launch_dense_rows<T, 16, RING>(p, nt, stream);
    case 32: return launch_dense_rows<T, 32, RING>(p, nt, stream);
    default: return launch_dense_rows<T, 64, RING>(p, nt, stream);
  }
}

// p's shapes checked by the caller (k % kDenseChunk == 0, 16-byte aligned rows, m, n > 0).
// forced_cols / forced_ring: dense_tile_cols's and dense_use_ring's overrides.
template <typename T>
void launch_dense_matmul(const DenseParams& p, int num_sms, int forced_cols, int forced_ring, cudaStream_t stream) {
  const int rows = dense_tile_rows(p.m);
  const int nt = dense_tile_cols(p.n, ceil_div(p.m, rows), num_sms, forced_cols);
  if (dense_use_ring(p.m, p.n, forced_ring))
    launch_dense_variant<T, true>(p, rows, nt, stream);
  else
    launch_dense_variant<T, false>(p, rows, nt, stream);
}

}  // namespace gpu
}  // namespace dspine
