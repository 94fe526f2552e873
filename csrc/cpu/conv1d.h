// Depthwise causal conv1d + SiLU over varlen sequences with a per-slot window, and the window
// commit after a verify block (CPU). Semantics: dspine_engine/ops.py (causal_conv1d).
#pragma once

#include <algorithm>

#include "common.h"

namespace dspine {
namespace cpu {

constexpr int64_t kConvMaxKernel = 16;  // the window lives in a stack array
constexpr int64_t kConvChannelBlock = 64;

inline float siluf(float x) { return x / (1.0f + std::exp(-x)); }

struct Conv1dArgs {
  int64_t batch, channels, kernel, width;  // width: rows of a slot (>= kernel - 1)
  int64_t x_stride;                        // elements between token rows of x
  bool checkpoint;
};

// One task per (sequence, block of channels): tokens in order, channels inner (vectorisable).
template <typename T>
void causal_conv1d(const T* x, const T* weight, T* conv_state, T* out, const int32_t* slots,
                   const int32_t* cu_q, const Conv1dArgs& a) {
  const int64_t c_all = a.channels, k = a.kernel;
  const int64_t blocks = (c_all + kConvChannelBlock - 1) / kConvChannelBlock;
  parallel_for(a.batch * blocks, [&](int64_t task) {
    const int64_t b = task / blocks, c0 = (task % blocks) * kConvChannelBlock;
    const int64_t cn = std::min(kConvChannelBlock, c_all - c0);
    const int64_t t0 = cu_q[b], n = cu_q[b + 1] - cu_q[b];
    if (slots[b] < 0) {
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < cn; ++c) out[(t0 + t) * c_all + c0 + c] = from_f<T>(0.f);
      return;
    }
    T* slot = conv_state + static_cast<int64_t>(slots[b]) * a.width * c_all;
    // hist[i] holds the input i steps into the window (oldest first), as a ring over i.
    float hist[kConvMaxKernel][kConvChannelBlock];
    for (int64_t i = 0; i < k - 1; ++i)
      for (int64_t c = 0; c < cn; ++c) hist[i][c] = to_f(slot[i * c_all + c0 + c]);
    int64_t oldest = 0;  // ring index of the oldest window row
    for (int64_t t = 0; t < n; ++t) {
      const T* xt = x + (t0 + t) * a.x_stride + c0;
      T* ot = out + (t0 + t) * c_all + c0;
      for (int64_t c = 0; c < cn; ++c) {
        const T* wc = weight + (c0 + c) * k;
        const float xv = to_f(xt[c]);
        float acc = 0.f;
        for (int64_t i = 0; i < k - 1; ++i) acc += to_f(wc[i]) * hist[(oldest + i) % (k - 1)][c];
        acc += to_f(wc[k - 1]) * xv;
        ot[c] = from_f<T>(siluf(acc));
        hist[oldest][c] = xv;  // replaces the oldest row: it becomes the newest
        if (a.checkpoint) slot[(k - 1 + t) * c_all + c0 + c] = xt[c];
      }
      oldest = (oldest + 1) % (k - 1);
    }
    if (!a.checkpoint && n > 0)
      for (int64_t i = 0; i < k - 1; ++i)
        for (int64_t c = 0; c < cn; ++c)
          slot[i * c_all + c0 + c] = from_f<T>(hist[(oldest + i) % (k - 1)][c]);
  });
}

// rows[0 : k-1] = rows[m : m+k-1] of every (leading index, slot) named by the batch.
template <typename T>
void conv_state_commit(T* conv_state, int64_t lead, int64_t num_slots, int64_t width,
                       int64_t channels, const int32_t* slots, const int32_t* num_accepted,
                       int64_t batch, int64_t kernel) {
  parallel_for(lead * batch, [&](int64_t task) {
    const int64_t l = task / batch, b = task % batch, m = num_accepted[b];
    if (slots[b] < 0 || m == 0) return;
    T* base = conv_state + (l * num_slots + slots[b]) * width * channels;
    // Row i's source (m + i) is always ahead of the rows already overwritten (< i).
    for (int64_t i = 0; i < kernel - 1; ++i)
      std::memcpy(base + i * channels, base + (m + i) * channels, channels * sizeof(T));
  });
}

}  // namespace cpu
}  // namespace dspine
