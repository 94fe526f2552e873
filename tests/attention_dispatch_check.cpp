// Host-only check of the attention dispatch (tests/test_attention_dispatch.py compiles and runs
// it with the host compiler: attention_heuristics.h is plain C++). It pins the rules the GPU
// tests cannot check without a Hopper card: a prefill goes to the wgmma kernel whatever its rows
// and batch (so a prompt's rows never depend on its neighbours), other calls only when asked for.
#include <cstdio>
#include <initializer_list>

#include "cuda/attention_heuristics.h"

using dspine::gpu::AttentionDevice;
using dspine::gpu::AttentionPath;
using dspine::gpu::AttentionShape;
using dspine::gpu::choose_attention_path;
using dspine::gpu::kSm90Auto;
using dspine::gpu::kSm90Default;

namespace {

int failures = 0;

const char* name(AttentionPath p) {
  return p == AttentionPath::kSm90 ? "sm90" : p == AttentionPath::kMma ? "mma" : "simt";
}

void expect(const char* what, const AttentionShape& s, const AttentionDevice& d, int forced, AttentionPath want) {
  const AttentionPath got = choose_attention_path(s, d, forced);
  if (got != want) {
    ++failures;
    std::printf("FAIL %s: %s, expected %s\n", what, name(got), name(want));
  }
}

// bf16, Qwen3-8B heads (32 / 8 x 128) unless changed.
AttentionShape shape(int batch, int max_q_len, bool prefill, int head_dim = 128, int window = 0, bool half = true) {
  return AttentionShape{half, head_dim, 32, 8, batch, max_q_len, window, prefill};
}

}  // namespace

int main() {
  const AttentionDevice hopper{9, 0, 132, true}, ampere{8, 0, 108, false}, no_image{9, 0, 132, false};
  const AttentionPath sm90 = AttentionPath::kSm90, mma = AttentionPath::kMma, simt = AttentionPath::kSimt;

  // The default: every prefill it supports, at any row count and batch; nothing else.
  for (int batch : {1, 2, 7, 64})
    for (int q : {1, 3, 16, 17, 300, 8192}) {
      expect("default prefill", shape(batch, q, true), hopper, kSm90Default, sm90);
      expect("default non-prefill", shape(batch, q, false), hopper, kSm90Default, mma);
      expect("auto prefill", shape(batch, q, true), hopper, kSm90Auto, sm90);
    }
  expect("default prefill, window", shape(1, 4096, true, 128, 512), hopper, kSm90Default, mma);
  expect("default prefill, head dim 256", shape(1, 4096, true, 256), hopper, kSm90Default, mma);
  expect("default prefill, head dim 64", shape(1, 5, true, 64), hopper, kSm90Default, sm90);
  expect("default prefill, fp32", shape(1, 4096, true, 128, 0, false), hopper, kSm90Default, simt);
  expect("default prefill, Ampere", shape(1, 4096, true), ampere, kSm90Default, mma);
  expect("default prefill, no sm_90a image", shape(1, 4096, true), no_image, kSm90Default, mma);
  // DSPINE_ATTN_SM90=0: never.
  expect("off, prefill", shape(1, 4096, true), hopper, 0, mma);
  // =1: every supported shape; blocks of <= 16 rows (decode) stay on mma unless a prefill.
  expect("on, long non-prefill", shape(1, 4096, false), hopper, 1, sm90);
  expect("on, decode", shape(8, 1, false), hopper, 1, mma);
  expect("on, one-token prefill", shape(1, 1, true), hopper, 1, sm90);
  // auto: the batch-dependent heuristic for the other calls (row tiles must fill the SMs).
  expect("auto, long non-prefill, few tiles", shape(1, 512, false), hopper, kSm90Auto, mma);
  expect("auto, long non-prefill, many tiles", shape(1, 8192, false), hopper, kSm90Auto, sm90);
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
