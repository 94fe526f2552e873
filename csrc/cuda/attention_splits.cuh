// Split-KV (flash-decoding) heuristic of the paged attention's tensor-core path. Host-only,
// plain C++ over shape numbers, so it is one place to tune and reads no device memory (a launch
// stays graph-capturable). attention.cuh feeds it the kernel variant's tile shape and the
// occupancy the CUDA runtime reports for it.
#pragma once

#include <cstdint>

namespace dspine {
namespace gpu {

struct SplitInputs {
  int64_t work;           // CTAs without splitting: sequences x kv heads x row tiles
  int64_t slots;          // CTAs the GPU holds at once: SMs x CTAs per SM (occupancy API)
  int64_t max_keys;       // host bound on the keys one row tile reads (max context, window)
  int block_n;            // keys per tile of the kernel variant
};

// The most splits worth launching.
constexpr int kMaxSplits = 128;
// The most splits one output row's combine folds (combine_row): the planner's count, or the
// row-exact mode's absolute segments (attention.cuh, plan_exact_segments), whose count follows
// the context (256 reach 32K keys at 128 keys a segment).
constexpr int kMaxCombineSplits = 256;

// Why these numbers:
// - Split only while the unsplit grid leaves SMs idle (work < slots): past one full wave the
//   split's partial traffic and combine are pure overhead.
// - A split may be as short as one key tile. While the grid is below one wave the call is bound
//   by each CTA's chain of tiles (~4-5 us a 64-key tile at Qwen3-8B's heads), not by bytes, so
//   shorter chains win even though each split writes its partial rows (8 bytes per row and head
//   dim, fp32 out and back, mostly in L2). Measured (H100, 27th session, kernel_bench.py
//   --splits, a 16-token verify block of Qwen3-8B heads): at batch 1, 1K keys, 2 splits (the old
//   floor of max(256, 8 x rows) keys a split) 35.1 us, 4: 23.8, 8: 18.4, 16: 17.6; at 4K keys 8
//   splits 37.1 us, 16: 27.3, 32: 27.4. At batch 8 the fill rule below already stops at 4 splits
//   (the best measured: 35.2 us at 1K, 78.0 at 4K; 8 splits 43.9 / 86.7).
//   The kernel shares out the real kv_len's tiles at run time (ceil(tiles / splits) each), so a
//   graph captured for a long context (many splits) replayed at a short one runs few, full splits
//   and lets the rest exit at once.
// - Among the counts allowed, the smallest whose grid fills its last wave to within 5% of the
//   best fill: one split of 4 CTAs more than a wave holds costs a whole extra wave (the old
//   ceil(slots / work) rule launched 320 CTAs into 264 slots for Qwen3-8B at batch 8).
// Returns grid.y: the most splits any (sequence, kv head, row tile) may use.
inline int plan_splits(const SplitInputs& in) {
  if (in.work <= 0 || in.slots <= 0 || in.work >= in.slots || in.block_n <= 0) return 1;
  int64_t limit = (in.max_keys + in.block_n - 1) / in.block_n + 1;  // tiles; +1: unaligned start
  if (limit > kMaxSplits) limit = kMaxSplits;
  if (limit < 2) return 1;
  // Fill of the last wave, in parts per million, of a grid of work * s CTAs.
  const auto fill = [&](int64_t s) {
    const int64_t ctas = in.work * s;
    const int64_t waves = (ctas + in.slots - 1) / in.slots;
    return ctas * 1000000 / (waves * in.slots);
  };
  int64_t best = 0;
  for (int64_t s = 1; s <= limit; ++s)
    if (fill(s) > best) best = fill(s);
  int64_t splits = 1;
  while (splits < limit && fill(splits) * 100 < best * 95) ++splits;
  return static_cast<int>(splits);
}

}  // namespace gpu
}  // namespace dspine
