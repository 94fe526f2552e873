// Host-only check of the Hopper dense GEMM's plan (tests/test_dense_sm90_plan.py compiles and runs
// it with the host compiler: dense_sm90_plan.h is plain C++). It pins what the GPU tests cannot
// see on one card: every plan is one the kernel can run, each split keeps its pipeline busy, a
// forced split count is taken, and the projections of the round's shapes fill the SMs.
#include <cstdio>

#include "cuda/dense_sm90_plan.h"

namespace gpu = dspine::gpu;
using gpu::DenseSm90Plan;

namespace {

int failures = 0;

void fail(const char* what, long n, long k, int sms, const DenseSm90Plan& p) {
  ++failures;
  std::printf("FAIL %s: n %ld k %ld sms %d -> %d columns x %d splits (%ld CTAs)\n", what, n, k, sms, p.block_n,
              p.splits, static_cast<long>(p.ctas_per_row_block));
}

double busy_share(const DenseSm90Plan& p, int sms) {
  const long rounds = (p.ctas_per_row_block + sms - 1) / sms;
  return static_cast<double>(p.ctas_per_row_block) / static_cast<double>(rounds * sms);
}

// What the kernel can run, and a split never thinner than its pipeline.
void check_valid(long n, long k, int sms) {
  const DenseSm90Plan p = gpu::dense_sm90_plan(n, k, sms);
  const long stages = (k + gpu::kDenseSm90StageK - 1) / gpu::kDenseSm90StageK;
  const bool shape_ok = (p.block_n == 64 || p.block_n == 128) &&
                        (p.splits == 1 || p.splits == 2 || p.splits == 4 || p.splits == 8) &&
                        p.block_n % p.splits == 0;
  if (!shape_ok) fail("a plan the kernel cannot run", n, k, sms, p);
  if (p.splits > 1 && stages < static_cast<long>(p.splits) * gpu::kDenseSm90MinStagesPerSplit)
    fail("a split shorter than the pipeline", n, k, sms, p);
  if (p.ctas_per_row_block != (n + p.block_n - 1) / p.block_n * p.splits) fail("CTA count", n, k, sms, p);
  for (int forced : {1, 2, 4, 8}) {
    const DenseSm90Plan f = gpu::dense_sm90_plan(n, k, sms, forced);
    if (f.splits != forced) fail("forced splits not taken", n, k, sms, f);
  }
}

void expect(long n, long k, int sms, int block_n, int splits) {
  const DenseSm90Plan p = gpu::dense_sm90_plan(n, k, sms);
  if (p.block_n != block_n || p.splits != splits) fail("round projection", n, k, sms, p);
  if (busy_share(p, sms) < 0.95) fail("SMs idle in the plan", n, k, sms, p);
}

}  // namespace

int main() {
  for (int sms : {1, 78, 108, 114, 132})
    for (long n : {1L, 7L, 64L, 65L, 576L, 960L, 4096L, 6144L, 24576L, 151936L})
      for (long k : {32L, 96L, 128L, 576L, 1536L, 4096L, 12288L}) check_valid(n, k, sms);
  // Qwen3-8B's projections on an H100 / H200 (132 SMs): o, qkv, gate_up, down, lm_head.
  expect(4096, 4096, 132, 64, 2);
  expect(6144, 4096, 132, 64, 4);
  expect(24576, 4096, 132, 64, 1);
  expect(4096, 12288, 132, 64, 2);
  expect(151936, 4096, 132, 128, 1);
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
