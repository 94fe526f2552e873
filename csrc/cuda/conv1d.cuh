// Depthwise causal conv1d + SiLU over varlen sequences with a per-slot window, and the window
// commit after a verify block (CUDA). Semantics: dspine_engine/ops.py (causal_conv1d).
//
// Outputs: one thread per (channel, token tile), every token's K inputs read from x or, for the
// first K-1 tokens of a sequence, from the slot's window. The window update of a prefill/decode
// runs as a second launch (it overwrites rows the first launch reads). Slots outside the state
// and tokens past a slot's ring rows are skipped: nothing is read back on the host.
#pragma once

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kConvThreads = 128;
constexpr int kConvTokenTile = 16;

struct Conv1dParams {
  const void* x;
  const void* weight;
  void* state;
  void* out;
  const int32_t* slots;
  const int32_t* cu_q;
  int64_t x_stride, num_slots;
  int batch, channels, kernel, width, max_q_len;
  bool checkpoint;
};

template <typename T>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_kernel(Conv1dParams p) {
  join_chain();  // launch.cuh
  const int c = blockIdx.x * kConvThreads + threadIdx.x, b = blockIdx.z;
  if (c >= p.channels) return;
  const int t0 = p.cu_q[b], n = p.cu_q[b + 1] - t0, k = p.kernel;
  const int first = blockIdx.y * kConvTokenTile, last = min(n, first + kConvTokenTile);
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const int slot = p.slots[b];
  if (slot < 0 || slot >= p.num_slots) {
    for (int t = first; t < last; ++t) out[static_cast<int64_t>(t0 + t) * p.channels + c] = from_float<T>(0.f);
    return;
  }
  T* window = static_cast<T*>(p.state) + static_cast<int64_t>(slot) * p.width * p.channels;
  const T* w = static_cast<const T*>(p.weight) + static_cast<int64_t>(c) * k;
  for (int t = first; t < last; ++t) {
    float acc = 0.f;
    for (int i = 0; i < k; ++i) {
      const int src = t - (k - 1) + i;  // < 0: a window row
      const T v = src >= 0 ? x[static_cast<int64_t>(t0 + src) * p.x_stride + c]
                           : window[static_cast<int64_t>(k - 1 + src) * p.channels + c];
      acc += to_float(w[i]) * to_float(v);
    }
    out[static_cast<int64_t>(t0 + t) * p.channels + c] = from_float<T>(acc / (1.f + __expf(-acc)));
    if (p.checkpoint && k - 1 + t < p.width)  // rows after the window: the block, for the commit
      window[static_cast<int64_t>(k - 1 + t) * p.channels + c] = x[static_cast<int64_t>(t0 + t) * p.x_stride + c];
  }
}

// The new window: the last K-1 rows of (window ++ x_b). Row i's source (row n+i of the
// concatenation) is never a row this thread has already overwritten.
template <typename T>
__global__ void __launch_bounds__(kConvThreads) conv_window_update_kernel(Conv1dParams p) {
  join_chain();  // launch.cuh
  const int c = blockIdx.x * kConvThreads + threadIdx.x, b = blockIdx.y;
  const int slot = p.slots[b];
  if (c >= p.channels || slot < 0 || slot >= p.num_slots) return;
  const int t0 = p.cu_q[b], n = p.cu_q[b + 1] - t0, k = p.kernel;
  if (n == 0) return;
  const T* x = static_cast<const T*>(p.x);
  T* window = static_cast<T*>(p.state) + static_cast<int64_t>(slot) * p.width * p.channels;
  for (int i = 0; i < k - 1; ++i) {
    const int src = n + i - (k - 1);  // index into x_b, or a window row when negative
    window[static_cast<int64_t>(i) * p.channels + c] =
        src >= 0 ? x[static_cast<int64_t>(t0 + src) * p.x_stride + c] : window[static_cast<int64_t>(n + i) * p.channels + c];
  }
}

template <typename T>
void launch_causal_conv1d(const Conv1dParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.channels == 0 || p.max_q_len == 0) return;
  const unsigned cblocks = static_cast<unsigned>(ceil_div(p.channels, kConvThreads));
  const dim3 grid(cblocks, static_cast<unsigned>(ceil_div(p.max_q_len, kConvTokenTile)), p.batch);
  launch_kernel(causal_conv1d_kernel<T>, Launch(grid, kConvThreads, 0, stream), p);
  if (!p.checkpoint) launch_kernel(conv_window_update_kernel<T>, Launch(dim3(cblocks, p.batch), kConvThreads, 0, stream), p);
}

// rows[0 : K-1] = rows[m : m+K-1] of each (leading index, slot); one thread per channel.
template <typename T>
__global__ void __launch_bounds__(kConvThreads)
conv_state_commit_kernel(T* state, const int32_t* slots, const int32_t* num_accepted, int64_t num_slots,
                         int width, int channels, int kernel, int batch) {
  join_chain();  // launch.cuh
  const int c = blockIdx.y * kConvThreads + threadIdx.x;
  const int64_t lb = blockIdx.x;  // leading index * batch + b
  const int b = static_cast<int>(lb % batch);
  const int slot = slots[b], m = num_accepted[b];
  if (c >= channels || slot < 0 || slot >= num_slots || m <= 0 || m + kernel - 1 > width) return;
  T* base = state + ((lb / batch) * num_slots + slot) * width * channels;
  for (int i = 0; i < kernel - 1; ++i)
    base[static_cast<int64_t>(i) * channels + c] = base[static_cast<int64_t>(m + i) * channels + c];
}

template <typename T>
void launch_conv_state_commit(T* state, const int32_t* slots, const int32_t* num_accepted, int64_t lead,
                              int64_t num_slots, int width, int channels, int kernel, int batch,
                              cudaStream_t stream) {
  if (lead == 0 || batch == 0 || channels == 0) return;
  const dim3 grid(static_cast<unsigned>(lead * batch), static_cast<unsigned>(ceil_div(channels, kConvThreads)));
  launch_kernel(conv_state_commit_kernel<T>, Launch(grid, kConvThreads, 0, stream), state, slots, num_accepted, num_slots, width, channels, kernel, batch);
}

}  // namespace gpu
}  // namespace dspine
