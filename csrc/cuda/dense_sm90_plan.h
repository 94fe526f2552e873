// How the Hopper dense GEMM (dense_sm90.cuh) shares a call among its CTAs: stream-K. The weight
// is cut into units of 128 k of one column tile (a pipeline stage), numbered tile by tile
// (unit u is stage u % stages of tile u / stages), and CTA c of G takes the contiguous units
// [c U / G, (c + 1) U / G): every CTA streams the same number of weight bytes (+-1 stage), one
// round, whatever the shape, and the pipeline never drains between tiles. A tile cut between
// CTAs is finished by the CTA holding its last unit (its "owner"): it adds the partial sums the
// earlier CTAs left in the workspace, in CTA order, to its own.
//
// Host-only and torch-free (tests/dense_sm90_plan_check.cpp compiles it with the host compiler in
// CI); the kernel uses the same unit arithmetic. The plan depends on n, k and the SM count only,
// never on the rows: which units a CTA sums and the order the pieces meet are then the same in
// every call, so a row is bitwise the same alone, in a decode step or in a verify block.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSPINE_PLAN_HD __host__ __device__
#else
#define DSPINE_PLAN_HD
#endif

namespace dspine {
namespace gpu {

constexpr int kDenseSm90StageK = 128;  // k a unit (pipeline stage) holds: two 64-k TMA boxes
constexpr int kDenseSm90MaxRows = 128;  // rows a launch (two warpgroups of 64); more are more launches
// A CTA takes at least this many units (small weights use fewer CTAs, so a tile is not cut into
// more pieces than its k holds stages of a short pipeline).
constexpr int kDenseSm90MinUnitsPerCta = 4;

struct DenseSm90Plan {
  int block_n = 64;     // output columns a tile: 64 or 128 (one or two m64 wgmmas a k step)
  int64_t tiles = 0;    // ceil(n / block_n)
  int64_t stages = 0;   // units a tile: ceil(k / 128)
  int64_t units = 0;    // tiles x stages
  int ctas = 1;         // G: one a streaming SM, at most units / kDenseSm90MinUnitsPerCta

  // The first unit of CTA c (c = ctas: the end of the last CTA's range).
  DSPINE_PLAN_HD int64_t unit_begin(int c) const { return units * c / ctas; }
  // The kernel's bookkeeping, here so the host check can replay it: a piece ends at a tile's last
  // unit (y is written, or kept for a fix-up) or at the CTA's last unit (partials for the owner).
  DSPINE_PLAN_HD bool ends_tile(int64_t u) const { return u % stages == stages - 1; }
  // Whether CTA c holds tile t's first unit (then a piece of t it ends is the whole tile).
  DSPINE_PLAN_HD bool holds_tile_start(int c, int64_t t) const { return unit_begin(c) <= t * stages; }
  // Whether CTA c's range ends inside a tile (its last piece goes to the workspace).
  DSPINE_PLAN_HD bool leaves_partial(int c) const { return unit_begin(c + 1) % stages != 0; }
  // The CTA that holds the first unit of tile t (the first of its contributors).
  DSPINE_PLAN_HD int first_cta_of_tile(int64_t t, int owner) const {
    int c = owner;
    while (unit_begin(c) > t * stages) --c;
    return c;
  }
};

// Tiles of 128 columns halve the re-reads of x (one x stage for every 128 weight rows instead of
// 64) where n is large; 64 where n is small keeps the padding of a last, partial tile low.
// forced_block_n (64 or 128; DSPINE_DENSE_SM90_BN) and forced_ctas (1..num_sms;
// DSPINE_DENSE_SM90_CTAS) fix either (tuning and tests: a forced G moves the cuts, so a test can
// put them anywhere).
inline DenseSm90Plan dense_sm90_plan(int64_t n, int64_t k, int num_sms, int forced_block_n = 0, int forced_ctas = 0) {
  DenseSm90Plan p;
  p.block_n = forced_block_n == 64 || forced_block_n == 128 ? forced_block_n : (n >= 2048 ? 128 : 64);
  p.tiles = (n + p.block_n - 1) / p.block_n;
  p.stages = (k + kDenseSm90StageK - 1) / kDenseSm90StageK;
  p.units = p.tiles * p.stages;
  const int64_t by_units = (p.units + kDenseSm90MinUnitsPerCta - 1) / kDenseSm90MinUnitsPerCta;
  int64_t ctas = num_sms > 0 ? num_sms : 1;
  if (forced_ctas > 0) ctas = forced_ctas < ctas ? forced_ctas : ctas;
  else if (by_units < ctas) ctas = by_units;
  if (ctas > p.units) ctas = p.units;  // never an empty range
  p.ctas = static_cast<int>(ctas > 0 ? ctas : 1);
  return p;
}

}  // namespace gpu
}  // namespace dspine
