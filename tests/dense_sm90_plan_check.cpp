// Host-only check of the Hopper dense GEMM's plan (tests/test_dense_sm90_plan.py compiles and runs
// it with the host compiler: dense_sm90_plan.h is plain C++). It pins what the GPU tests cannot
// see on one card: every plan is one the kernel can run, the CTAs' unit ranges cover the call once
// and differ by at most one unit, each tile's contributors are the CTAs the kernel waits for, the
// kernel's bookkeeping (replayed on the host) writes every tile once from every unit once, the
// knobs are taken, and the projections of the round's shapes use every SM.
#include <cstdio>
#include <initializer_list>
#include <vector>

#include "cuda/dense_sm90_plan.h"

namespace gpu = dspine::gpu;
using gpu::DenseSm90Plan;

namespace {

int failures = 0;

void fail(const char* what, long n, long k, int sms, const DenseSm90Plan& p) {
  ++failures;
  std::printf("FAIL %s: n %ld k %ld sms %d -> %d columns, %ld tiles x %ld stages over %d CTAs\n", what, n, k, sms,
              p.block_n, static_cast<long>(p.tiles), static_cast<long>(p.stages), p.ctas);
}

// The CTA whose range holds unit u, by a linear search (the kernel's first_cta_of_tile walks down).
int cta_of_unit(const DenseSm90Plan& p, long u) {
  int c = 0;
  while (c + 1 < p.ctas && p.unit_begin(c + 1) <= u) ++c;
  return c;
}

void check_ranges(long n, long k, int sms, const DenseSm90Plan& p) {
  if (p.unit_begin(0) != 0 || p.unit_begin(p.ctas) != p.units) fail("ranges do not cover the call", n, k, sms, p);
  long shortest = p.units, longest = 0;
  for (int c = 0; c < p.ctas; ++c) {
    const long len = p.unit_begin(c + 1) - p.unit_begin(c);
    shortest = len < shortest ? len : shortest;
    longest = len > longest ? len : longest;
  }
  if (shortest < 1) fail("a CTA with no units", n, k, sms, p);
  if (longest - shortest > 1) fail("ranges differ by more than one unit", n, k, sms, p);
  // Each tile's owner (the CTA with its last unit) finds the CTA with its first unit.
  for (long t = 0; t < p.tiles; ++t) {
    const int owner = cta_of_unit(p, (t + 1) * p.stages - 1);
    if (p.first_cta_of_tile(t, owner) != cta_of_unit(p, t * p.stages)) fail("a tile's first contributor", n, k, sms, p);
  }
}

// Replays the kernel's bookkeeping (the plan's ends_tile / holds_tile_start / leaves_partial /
// first_cta_of_tile, as dense_sm90.cuh uses them) and checks that every tile's output is written
// once, from every one of its units once: directly by a CTA that holds the whole tile, or by its
// owner from the partials of the CTAs it waits for (each of which left one for that tile) and its
// own first piece.
void check_bookkeeping(long n, long k, int sms, const DenseSm90Plan& p) {
  std::vector<int> writes(p.tiles, 0), summed(p.units, 0);
  std::vector<long> partial_tile(p.ctas, -1);  // the tile a CTA's partials belong to
  for (int c = 0; c < p.ctas; ++c)
    if (p.leaves_partial(c)) partial_tile[c] = (p.unit_begin(c + 1) - 1) / p.stages;
  for (int c = 0; c < p.ctas; ++c) {
    const long u0 = p.unit_begin(c), u1 = p.unit_begin(c + 1);
    long piece_start = u0;
    for (long u = u0; u < u1; ++u) {
      if (!p.ends_tile(u)) continue;
      const long t = u / p.stages;
      if (p.holds_tile_start(c, t)) {
        for (long v = piece_start; v <= u; ++v) ++summed[v];
        if (piece_start != t * p.stages) fail("a whole tile not begun at its start", n, k, sms, p);
      } else {  // the fix-up: contributors first (in CTA order), this piece last
        if (piece_start != u0) fail("a fix-up piece that is not the CTA's first", n, k, sms, p);
        for (int f = p.first_cta_of_tile(t, c); f < c; ++f) {
          if (partial_tile[f] != t) fail("a waited-for CTA left no partials for the tile", n, k, sms, p);
          const long f0 = p.unit_begin(f) > t * p.stages ? p.unit_begin(f) : t * p.stages;
          for (long v = f0; v < p.unit_begin(f + 1); ++v) ++summed[v];
          partial_tile[f] = -2;  // read once
        }
        for (long v = piece_start; v <= u; ++v) ++summed[v];
      }
      ++writes[t];
      piece_start = u + 1;
    }
  }
  for (long t = 0; t < p.tiles; ++t)
    if (writes[t] != 1) fail("a tile written other than once", n, k, sms, p);
  for (long u = 0; u < p.units; ++u)
    if (summed[u] != 1) fail("a unit summed other than once", n, k, sms, p);
  for (int c = 0; c < p.ctas; ++c)
    if (partial_tile[c] >= 0) fail("partials nobody reads", n, k, sms, p);
}

// What the kernel can run.
void check_valid(long n, long k, int sms) {
  const DenseSm90Plan p = gpu::dense_sm90_plan(n, k, sms);
  const bool shape_ok = (p.block_n == 64 || p.block_n == 128) && p.tiles == (n + p.block_n - 1) / p.block_n &&
                        p.stages == (k + gpu::kDenseSm90StageK - 1) / gpu::kDenseSm90StageK &&
                        p.units == p.tiles * p.stages;
  if (!shape_ok) fail("a plan the kernel cannot run", n, k, sms, p);
  const long most = (p.units + gpu::kDenseSm90MinUnitsPerCta - 1) / gpu::kDenseSm90MinUnitsPerCta;
  if (p.ctas < 1 || p.ctas > sms || p.ctas > most) fail("CTA count", n, k, sms, p);
  check_ranges(n, k, sms, p);
  check_bookkeeping(n, k, sms, p);
  for (int width : {64, 128}) {
    const DenseSm90Plan f = gpu::dense_sm90_plan(n, k, sms, width);
    if (f.block_n != width) fail("forced width not taken", n, k, sms, f);
  }
  for (int ctas : {1, 3, sms}) {
    const DenseSm90Plan f = gpu::dense_sm90_plan(n, k, sms, 0, ctas);
    long want = ctas < sms ? ctas : sms;
    want = want < f.units ? want : f.units;
    if (f.ctas != want) fail("forced CTA count not taken", n, k, sms, f);
    check_ranges(n, k, sms, f);
    check_bookkeeping(n, k, sms, f);
  }
}

void expect(long n, long k, int sms, int block_n) {
  const DenseSm90Plan p = gpu::dense_sm90_plan(n, k, sms);
  if (p.block_n != block_n || p.ctas != sms) fail("round projection", n, k, sms, p);
}

}  // namespace

int main() {
  for (int sms : {1, 78, 108, 114, 132})
    for (long n : {1L, 7L, 64L, 65L, 576L, 960L, 4096L, 6144L, 24576L, 151936L})
      for (long k : {32L, 96L, 128L, 576L, 1536L, 4096L, 12288L}) check_valid(n, k, sms);
  // Qwen3-8B's projections on an H100 / H200 (132 SMs), one CTA an SM: o, qkv, gate_up, down, lm_head.
  expect(4096, 4096, 132, 128);
  expect(6144, 4096, 132, 128);
  expect(24576, 4096, 132, 128);
  expect(4096, 12288, 132, 128);
  expect(151936, 4096, 132, 128);
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
