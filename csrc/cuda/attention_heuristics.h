// Which paged attention kernel runs a call: the one place that decides it (host-only, plain C++
// over shape numbers and device facts, so it reads no device memory and a launch stays
// graph-capturable). The binding (cuda_attention.cu) fills the inputs and launches the answer.
//
//   kSimt  fp32, or a head dim without a tensor-core instantiation (CUDA cores)
//   kMma   the mma.sync kernel (attention.cuh): every GPU from sm_80, every mode, split-KV
//   kSm90  the warp-specialised wgmma kernel (attention_sm90.cuh): Hopper, row tiles only
#pragma once

#include <cstdint>

namespace dspine {
namespace gpu {

enum class AttentionPath { kSimt = 0, kMma = 1, kSm90 = 2 };

struct AttentionShape {
  bool half_precision;  // bf16 / fp16 (fp32 always runs on CUDA cores)
  int head_dim, q_heads, kv_heads, batch, max_q_len, window;
  // A prompt's prefill: every row of these sequences is computed by this call and by no other
  // (the engine prefills whole prompts and never preempts), so which kernel computes them may
  // follow the call's kind without a row ever meeting its other rounding.
  bool prefill = false;
};

struct AttentionDevice {
  int cc_major, cc_minor, num_sms;
  bool sm90_runnable;  // the sm_90a image of the kernel exists and runs on this device
};

// DSPINE_ATTN_SM90: unset the default below, 0 never the sm90 path, 1 the sm90 path for every
// shape it supports (tests compare the two paths on the same inputs with it), auto the
// batch-dependent heuristic below. The default takes the sm90 path for prefill calls only, every
// one whose dtype, head dim and window it supports, whatever its rows and batch: the choice then
// follows the model and the call's kind, never the neighbours (docs/DECISIONS.md, "Attention
// dispatch never depends on the batch", and "Prefill on the wgmma kernel by default"). The
// heuristic looks at the whole batch (its tile count), so under auto the same rows could go
// either way in two batches, and bf16 rounds the two kernels differently.
constexpr int kSm90Auto = -1;
constexpr int kSm90Default = -2;

// Rows (query, head pairs) of the sm90 kernel's tile: 2 consumer warpgroups x 64 rows.
constexpr int kSm90BlockM = 128;

// Shapes the sm90 kernel implements. Everything else stays on the mma.sync kernel:
// - sliding windows (window > 0): the sm90 kernel shares the mma.sync kernel's key ranges and
//   masks (visible_keys, cta_work), so it should handle them, but no window case has run on it
//   yet: enabling them is this line plus window cases in the GPU tests;
// - head dims other than 64 / 128 (256 would need a smaller key tile to fit two stages);
// - blocks of <= 16 rows (decode, short verify blocks): the key-split mma.sync variant exists for
//   them, and a 128-row wgmma tile would be mostly padding. A prefill takes the sm90 path at any
//   row count (even a one-token prompt), or its rows would go one way or the other with the
//   batch's longest prompt.
inline bool attention_sm90_supports(const AttentionShape& s) {
  if (!s.half_precision || s.window > 0) return false;
  if (s.head_dim != 64 && s.head_dim != 128) return false;
  if (s.kv_heads <= 0 || s.q_heads % s.kv_heads != 0) return false;
  const int64_t rows = static_cast<int64_t>(s.max_q_len) * (s.q_heads / s.kv_heads);
  return s.prefill ? rows > 0 : rows > 16;
}

inline AttentionPath choose_attention_path(const AttentionShape& s, const AttentionDevice& d, int forced_sm90) {
  const bool mma = s.half_precision && (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256);
  if (!mma) return AttentionPath::kSimt;
  const bool hopper = d.cc_major == 9 && d.cc_minor == 0 && d.sm90_runnable;
  if (!hopper || forced_sm90 == 0 || !attention_sm90_supports(s)) return AttentionPath::kMma;
  if (forced_sm90 == 1 || s.prefill) return AttentionPath::kSm90;
  if (forced_sm90 == kSm90Default) return AttentionPath::kMma;
  // Heuristic: the sm90 kernel never splits keys, so it only pays when its row tiles alone fill
  // the GPU (one CTA per SM: 160 KB of shared memory at head dim 128). A smaller grid (a short
  // prefill chunk, a verify block of a few sequences) keeps the split-KV mma.sync kernel.
  // Unmeasured threshold (issue 12): revisit with the H200 numbers of kernel_bench.py.
  const int64_t rows = static_cast<int64_t>(s.max_q_len) * (s.q_heads / s.kv_heads);
  const int64_t tiles = static_cast<int64_t>(s.batch) * s.kv_heads * ((rows + kSm90BlockM - 1) / kSm90BlockM);
  return rows >= kSm90BlockM && tiles >= d.num_sms ? AttentionPath::kSm90 : AttentionPath::kMma;
}

// How the sm90 producer announces its loads (attention_sm90.cuh): the async announcer (arrivals
// handed to the copy unit, every free stage's load in flight) at head dim 128, the waiting one
// at 64. Measured side by side (H100, 26th session, kernel_bench.py --modes prefill --sm90
// compare, causal, batch 1): head dim 128 (Qwen3-8B) 4K 848 -> 778 us, 8K 3099 -> 2787 us
// with async; head dim 64 (SmolLM2) 4K 138 -> 147 us, 8K 466 -> 509 us, slower: its tiles are
// half the bytes and four stages deep, so the waiting producer already keeps them fed and the
// async arrivals only add barrier traffic. forced: "async" or "wait" (DSPINE_SM90_ARRIVE, the
// tests run both), anything else the default.
inline bool sm90_async_arrivals(int head_dim, const char* forced) {
  if (forced != nullptr && forced[0] != '\0') {
    if (forced[0] == 'a') return true;   // async
    if (forced[0] == 'w') return false;  // wait
  }
  return head_dim >= 128;
}

// Whether the sm90 producer may load whole tiles by TMA (attention_sm90.cuh, Sm90LoadMaps): one
// 128-row box per 64 columns for each tile on 128 consecutive cache slots, the rest by cp.async.
// The kernel checks a tile's pages with one lane each, so a tile may touch at most 32 pages, and
// finds them by a shift: pages of a power of two of at least 8 keys (16 pages a tile at most). forced: "cp.async" (DSPINE_SM90_LOADS, the tests and
// benchmarks run both) takes cp.async for every tile. Measured (H100, 32nd session, 8K prefill,
// Qwen3-8B heads): 128-row boxes 975 us against cp.async's 1,150; 16-row boxes, one a page, were
// 1,233-1,271, slower than cp.async, which is why a tile goes by TMA only whole.
inline bool sm90_tma_loads(int page_size, const char* forced) {
  if (forced != nullptr && forced[0] == 'c') return false;  // cp.async
  return page_size >= 8 && (page_size & (page_size - 1)) == 0;
}

}  // namespace gpu
}  // namespace dspine
