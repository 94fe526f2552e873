// How the Hopper dense GEMM (dense_sm90.cuh) cuts a call: output columns a CTA and k splits.
// Host-only and torch-free (tests/dense_sm90_plan_check.cpp compiles it with the host compiler in
// CI). The plan depends on n, k and the SM count only, never on the rows: a row's arithmetic
// (which k each split sums, the order the splits meet) is then the same in every call, so a row
// is bitwise the same alone, in a decode step or in a verify block.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace dspine {
namespace gpu {

constexpr int kDenseSm90StageK = 128;  // k a pipeline stage holds (two 64-column TMA boxes)
constexpr int kDenseSm90MaxSplits = 8;  // k splits = CTAs of a cluster (portable cluster size)
// A split keeps at least this many stages (its pipeline fills and drains once): fewer splits
// where k is short.
constexpr int kDenseSm90MinStagesPerSplit = 4;

struct DenseSm90Plan {
  int block_n;  // output columns a CTA: 128 or 64 (one or two m64 wgmmas a k step)
  int splits;   // k splits, 1, 2, 4 or 8: the CTAs of a cluster, reduced in rank order
  int64_t ctas_per_row_block;
};

// The weight is read once whatever the plan, so the plan is about keeping every SM streaming:
// one CTA an SM (the ring takes most of its shared memory), CTAs all doing the same work, so the
// kernel takes ceil(ctas / SMs) rounds of equal length, i.e. time ~ rounds / ctas. The plan with
// the best share of busy SM rounds, ctas / (rounds x SMs), wins; among plans within 2% of each
// other the first in the order tried: fewer splits (fewer partial sums, smaller clusters), then
// wider tiles (less re-reading of x). Qwen3-8B on 132 SMs: o (4096 x 4096) and down (k 12288)
// 64 columns x 2 splits (128 CTAs), qkv (n 6144) 64 x 4 (384), gate_up (24576) 64 x 1 (384).
// forced_splits (1, 2, 4, 8; DSPINE_DENSE_SPLITS) fixes the split count (tuning and tests).
inline DenseSm90Plan dense_sm90_plan(int64_t n, int64_t k, int num_sms, int forced_splits = 0) {
  const int64_t stages = (k + kDenseSm90StageK - 1) / kDenseSm90StageK;
  const int64_t sms = num_sms > 0 ? num_sms : 1;
  DenseSm90Plan best{128, 1, (n + 127) / 128};
  double best_share = -1.0;
  for (int splits = 1; splits <= kDenseSm90MaxSplits; splits *= 2) {
    if (forced_splits > 0 && splits != forced_splits) continue;
    if (forced_splits == 0 && splits > 1 && stages < static_cast<int64_t>(splits) * kDenseSm90MinStagesPerSplit)
      continue;
    for (int block_n : {128, 64}) {
      const int64_t ctas = (n + block_n - 1) / block_n * splits;
      const int64_t rounds = (ctas + sms - 1) / sms;
      const double share = static_cast<double>(ctas) / static_cast<double>(rounds * sms);
      if (share > best_share * 1.02) {
        best = {block_n, splits, ctas};
        best_share = share;
      }
    }
  }
  return best;
}

}  // namespace gpu
}  // namespace dspine
