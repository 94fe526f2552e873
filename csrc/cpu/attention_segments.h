// Key segments of the CPU paged attention (attention.h): a row's keys are cut into segments of
// kSegmentKeys at absolute positions; each segment gives the row a partial online softmax (max,
// sum, unnormalised output) from a fresh start, and the partials are folded in segment order.
//
// Why every row is computed this way, split over threads or not: a long row's segments can then
// run on different threads (flash-decoding: a batch-1 decode has one row per kv head, too few
// work items for the threads) while its result stays what the row gives alone, on any thread
// count. The segments and the fold are the arithmetic; which thread runs a segment is not. So
// the boundaries are absolute (never relative to the first key a tile or a window sees) and the
// fold is one fixed formula, left to right from the row's first segment holding a key.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_step.h"

namespace dspine {
namespace cpu {
namespace attn {

// Keys per segment: segment s holds keys [s * kSegmentKeys, (s + 1) * kSegmentKeys). A whole
// number of chunks, so a chunk never straddles two segments. 256 keys of SmolLM2-135M's heads
// are ~25 us of one thread's work: long enough to pay for handing it to another thread, short
// enough that a 1K-context decode has 4 segments a kv head (12 items for 2 threads).
constexpr int64_t kSegmentKeys = 8 * kKeyChunk;
static_assert(kSegmentKeys % kKeyChunk == 0, "segments are whole chunks");

// One row's online-softmax state: max, sum and unnormalised output (head_dim floats).
struct RowState {
  float* m;
  float* l;
  float* acc;
};

// Folds a segment's partial p into the row's result r (the fold of its earlier segments).
// A partial with sum 0 saw no key with a finite score and is the identity (its state is the
// fresh one: nothing to add, and adding it would turn exp(-inf - -inf) into NaN). A NaN sum is
// not 0, so a NaN always reaches the output. While r is empty (sum 0) the partial is copied:
// a row with one segment gets exactly its single pass.
inline void fold_segment(const RowState& r, const RowState& p, int64_t d) {
  if (*p.l == 0.f) return;
  if (*r.l == 0.f) {
    *r.m = *p.m;
    *r.l = *p.l;
    std::copy(p.acc, p.acc + d, r.acc);
    return;
  }
  const float m_new = std::max(*r.m, *p.m);
  const float a = std::exp(*r.m - m_new), b = std::exp(*p.m - m_new);
  *r.l = *r.l * a + *p.l * b;
  for (int64_t x = 0; x < d; ++x) r.acc[x] = r.acc[x] * a + p.acc[x] * b;
  *r.m = m_new;
}

// The segments [first, end) that hold keys lo .. hi.
inline int64_t first_segment(int64_t lo) { return lo / kSegmentKeys; }
inline int64_t end_segment(int64_t hi) { return hi / kSegmentKeys + 1; }

}  // namespace attn
}  // namespace cpu
}  // namespace dspine
