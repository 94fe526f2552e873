// The gated delta rule (Gated DeltaNet layers of hybrid targets), CUDA: the token-by-token update
// (decode and verify blocks, with the ReplaySSM ring), the replay of an accepted prefix onto the
// checkpoint, and the chunked prefill. Semantics: dspine_engine/ops.py (gated_delta_*).
//
// A block owns (sequence, v-head, 32 state columns): 8 warps, lane = column. In the recurrent and
// replay kernels the [dk, 32] state tile lives in registers (warp w holds rows w, w+8, ...); the
// per-token key/query vectors are normalised once into shared memory and read as broadcasts. The
// two state operations (decay, rank-1 update) are written with __fmul_rn / __fmaf_rn in both the
// update and the replay, so a replay reproduces a plain decode's state bit for bit.
// The chunked prefill keeps the tile in shared memory and solves 32 tokens at a time: the
// lower-triangular system by one warp (a column per lane, no block barrier), the rest as small
// shared-memory products. Slots outside the state are skipped (no host reads of device memory).
#pragma once

#include <type_traits>

#include "common.cuh"

namespace dspine {
namespace gpu {

constexpr int kGdnWarps = 8;
constexpr int kGdnThreads = kGdnWarps * kWarpSize;
constexpr int kGdnCols = kWarpSize;  // state columns per block
constexpr int kGdnMaxDim = 256;
constexpr int kGdnChunkLen = 32;
constexpr float kGdnL2Eps = 1e-6f;

struct GdnParams {
  const void *q, *k, *v, *a, *b;
  const float *a_log, *dt_bias;
  float* state;
  void* out;
  const int32_t *slots, *cu_q;
  float *ring_k, *ring_u, *ring_g, *states_out;  // null when absent
  int64_t q_stride, k_stride, v_stride, a_stride, b_stride, num_slots;
  int batch, hk, hv, dk, dv, ring_len;
};

struct GdnReplayParams {
  float* state;
  const float *ring_k, *ring_u, *ring_g;
  const int32_t *slots, *num_accepted;
  int64_t lead, num_slots;
  int batch, ring_len, hk, hv, dk, dv;
};

__device__ __forceinline__ float gdn_log_decay(float a, float a_log, float dt_bias) {
  const float x = a + dt_bias;
  return -__expf(a_log) * (x > 20.f ? x : log1pf(__expf(x)));
}

__device__ __forceinline__ float gdn_sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// dst[0:d] = src * scale / sqrt(sum src^2 + eps) in fp32, by the whole block. Ends synchronised.
template <typename T>
__device__ void gdn_load_l2norm(const T* src, float* dst, int d, float scale, float* scratch) {
  float ss = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float f = to_float(src[i]);
    dst[i] = f;
    ss += f * f;
  }
  const float inv = scale * rsqrtf(block_sum(ss, scratch) + kGdnL2Eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] *= inv;
  __syncthreads();
}

// Zeroes this block's columns of a skipped (padding) sequence's output rows.
template <typename T>
__device__ void gdn_zero_tile(const GdnParams& p, int64_t t0, int n, int h, int col0) {
  T* out = static_cast<T*>(p.out);
  for (int e = threadIdx.x; e < n * kGdnCols; e += blockDim.x) {
    const int col = col0 + e % kGdnCols;
    if (col < p.dv) out[((t0 + e / kGdnCols) * p.hv + h) * p.dv + col] = from_float<T>(0.f);
  }
}

template <typename T, int ROWS>
__global__ void __launch_bounds__(kGdnThreads) gated_delta_recurrent_kernel(GdnParams p) {
  join_chain();  // launch.cuh
  __shared__ float kbuf[kGdnMaxDim], qbuf[kGdnMaxDim], red[kGdnWarps][kGdnCols], scratch[kGdnWarps];
  const int b = blockIdx.x, h = blockIdx.y, lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int col0 = blockIdx.z * kGdnCols, col = col0 + lane, dk = p.dk, dv = p.dv;
  const bool live = col < dv;
  const int ratio = p.hv / p.hk, kh = h / ratio;
  const int64_t t0 = p.cu_q[b];
  const int n = p.cu_q[b + 1] - p.cu_q[b], slot = p.slots[b];
  if (slot < 0 || slot >= p.num_slots) return gdn_zero_tile<T>(p, t0, n, h, col0);
  float* st = p.state + (static_cast<int64_t>(slot) * p.hv + h) * dk * dv;
  float s[ROWS];
#pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    const int i = warp + kGdnWarps * m;
    s[m] = (i < dk && live) ? st[static_cast<int64_t>(i) * dv + col] : 0.f;
  }
  const T *q = static_cast<const T*>(p.q), *k = static_cast<const T*>(p.k), *v = static_cast<const T*>(p.v);
  const T *a = static_cast<const T*>(p.a), *bb = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  const float scale = rsqrtf(static_cast<float>(dk));
  const bool ring = p.ring_len > 0;
  for (int it = 0; it < n; ++it) {
    const int64_t t = t0 + it;
    __syncthreads();  // the previous token's buffers are no longer read
    gdn_load_l2norm(k + t * p.k_stride + kh * dk, kbuf, dk, 1.f, scratch);
    gdn_load_l2norm(q + t * p.q_stride + kh * dk, qbuf, dk, scale, scratch);
    const float g = gdn_log_decay(to_float(a[t * p.a_stride + h]), p.a_log[h], p.dt_bias[h]);
    const float beta = gdn_sigmoid(to_float(bb[t * p.b_stride + h]));
    const float decay = __expf(g);
    float part = 0.f;
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const int i = warp + kGdnWarps * m;
      s[m] = __fmul_rn(s[m], decay);
      if (i < dk) part = __fmaf_rn(s[m], kbuf[i], part);
    }
    red[warp][lane] = part;
    __syncthreads();
    float kv = 0.f;
#pragma unroll
    for (int w = 0; w < kGdnWarps; ++w) kv += red[w][lane];
    const float u = beta * ((live ? to_float(v[t * p.v_stride + h * dv + col]) : 0.f) - kv);
    part = 0.f;
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const int i = warp + kGdnWarps * m;
      if (i < dk) {
        s[m] = __fmaf_rn(kbuf[i], u, s[m]);
        part = __fmaf_rn(s[m], qbuf[i], part);
      }
    }
    __syncthreads();  // every thread has read kv from red
    red[warp][lane] = part;
    __syncthreads();
    if (warp == 0 && live) {
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < kGdnWarps; ++w) o += red[w][lane];
      out[(t * p.hv + h) * dv + col] = from_float<T>(o);
    }
    if (ring && it < p.ring_len) {
      const int64_t row = static_cast<int64_t>(slot) * p.ring_len + it;
      if (warp == 0 && live) p.ring_u[(row * p.hv + h) * dv + col] = u;
      if (blockIdx.z == 0 && h % ratio == 0)
        for (int i = threadIdx.x; i < dk; i += blockDim.x) p.ring_k[(row * p.hk + kh) * dk + i] = kbuf[i];
      if (blockIdx.z == 0 && threadIdx.x == 0) p.ring_g[row * p.hv + h] = g;
    }
    if (p.states_out && live) {
      float* so = p.states_out + (t * p.hv + h) * dk * dv;
#pragma unroll
      for (int m = 0; m < ROWS; ++m) {
        const int i = warp + kGdnWarps * m;
        if (i < dk) so[static_cast<int64_t>(i) * dv + col] = s[m];
      }
    }
  }
  if (!ring && live) {
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const int i = warp + kGdnWarps * m;
      if (i < dk) st[static_cast<int64_t>(i) * dv + col] = s[m];
    }
  }
}

template <int ROWS>
__global__ void __launch_bounds__(kGdnThreads) gated_delta_replay_kernel(GdnReplayParams p) {
  join_chain();  // launch.cuh
  __shared__ float kbuf[kGdnMaxDim];
  const int64_t lb = blockIdx.x;  // leading index * batch + b
  const int b = static_cast<int>(lb % p.batch), h = blockIdx.y;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int col = blockIdx.z * kGdnCols + lane, dk = p.dk, dv = p.dv;
  const int slot = p.slots[b], steps = min(p.num_accepted[b], p.ring_len);
  if (slot < 0 || slot >= p.num_slots || steps <= 0) return;
  const bool live = col < dv;
  const int64_t ls = (lb / p.batch) * p.num_slots + slot;  // (leading index, slot)
  float* st = p.state + (ls * p.hv + h) * dk * dv;
  float s[ROWS];
#pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    const int i = warp + kGdnWarps * m;
    s[m] = (i < dk && live) ? st[static_cast<int64_t>(i) * dv + col] : 0.f;
  }
  const int kh = h / (p.hv / p.hk);
  for (int t = 0; t < steps; ++t) {
    const int64_t row = ls * p.ring_len + t;
    __syncthreads();
    for (int i = threadIdx.x; i < dk; i += blockDim.x) kbuf[i] = p.ring_k[(row * p.hk + kh) * dk + i];
    __syncthreads();
    const float decay = __expf(p.ring_g[row * p.hv + h]);
    const float u = live ? p.ring_u[(row * p.hv + h) * dv + col] : 0.f;
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const int i = warp + kGdnWarps * m;
      s[m] = __fmul_rn(s[m], decay);
      if (i < dk) s[m] = __fmaf_rn(kbuf[i], u, s[m]);
    }
  }
  if (live) {
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const int i = warp + kGdnWarps * m;
      if (i < dk) st[static_cast<int64_t>(i) * dv + col] = s[m];
    }
  }
}

// Shared memory of the chunked kernel, in floats: the state tile, K and Q of a chunk, the
// updates U, the system A, the intra-chunk attention P, and G, beta and the tail decays.
inline size_t gdn_chunk_smem_floats(int dk) {
  const int c = kGdnChunkLen;
  return static_cast<size_t>(dk) * kGdnCols + 2 * static_cast<size_t>(c) * dk + c * kGdnCols + 2 * c * c + 3 * c;
}

template <typename T>
__global__ void __launch_bounds__(kGdnThreads) gated_delta_chunk_kernel(GdnParams p) {
  join_chain();  // launch.cuh
  extern __shared__ float smem[];
  constexpr int C = kGdnChunkLen;
  const int dk = p.dk, dv = p.dv;
  float* S = smem;
  float* K = S + dk * kGdnCols;
  float* Q = K + C * dk;
  float* U = Q + C * dk;
  float* A = U + C * kGdnCols;
  float* P = A + C * C;
  float *G = P + C * C, *beta = G + C, *tail = beta + C;
  const int b = blockIdx.x, h = blockIdx.y, lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int col0 = blockIdx.z * kGdnCols, col = col0 + lane;
  const int ratio = p.hv / p.hk, kh = h / ratio;
  const int64_t t0 = p.cu_q[b];
  const int n = p.cu_q[b + 1] - p.cu_q[b], slot = p.slots[b];
  if (slot < 0 || slot >= p.num_slots) return gdn_zero_tile<T>(p, t0, n, h, col0);
  float* st = p.state + (static_cast<int64_t>(slot) * p.hv + h) * dk * dv;
  for (int e = threadIdx.x; e < dk * kGdnCols; e += blockDim.x) {
    const int c = col0 + e % kGdnCols;
    S[e] = c < dv ? st[static_cast<int64_t>(e / kGdnCols) * dv + c] : 0.f;
  }
  const T *q = static_cast<const T*>(p.q), *k = static_cast<const T*>(p.k), *v = static_cast<const T*>(p.v);
  const T *a = static_cast<const T*>(p.a), *bb = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  const float scale = rsqrtf(static_cast<float>(dk));
  for (int c0 = 0; c0 < n; c0 += C) {
    const int len = min(C, n - c0);
    __syncthreads();  // the previous chunk is done with every buffer
    // Normalised keys and queries (a warp per token), g, beta, and the chunk's values into U.
    for (int r = warp; r < len; r += kGdnWarps) {
      const int64_t t = t0 + c0 + r;
      const T *kr = k + t * p.k_stride + kh * dk, *qr = q + t * p.q_stride + kh * dk;
      float ssk = 0.f, ssq = 0.f;
      for (int i = lane; i < dk; i += kWarpSize) {
        const float fk = to_float(kr[i]), fq = to_float(qr[i]);
        K[r * dk + i] = fk;
        Q[r * dk + i] = fq;
        ssk += fk * fk;
        ssq += fq * fq;
      }
      const float ik = rsqrtf(warp_sum(ssk) + kGdnL2Eps), iq = scale * rsqrtf(warp_sum(ssq) + kGdnL2Eps);
      for (int i = lane; i < dk; i += kWarpSize) {
        K[r * dk + i] *= ik;
        Q[r * dk + i] *= iq;
      }
      if (lane == 0) {
        G[r] = gdn_log_decay(to_float(a[t * p.a_stride + h]), p.a_log[h], p.dt_bias[h]);
        beta[r] = gdn_sigmoid(to_float(bb[t * p.b_stride + h]));
      }
      U[r * kGdnCols + lane] = col < dv ? to_float(v[t * p.v_stride + h * dv + col]) : 0.f;
    }
    __syncthreads();
    if (warp == 0) {  // cumulative log decay, and the decays to the chunk's end
      const float cum = warp_inclusive_scan(lane < len ? G[lane] : 0.f);
      const float end = __shfl_sync(kFullMask, cum, len - 1);
      if (lane < len) {
        G[lane] = cum;
        tail[lane] = __expf(end - cum);
      }
    }
    __syncthreads();
    // A[i][j] = beta_i e^{G_i - G_j} k_i.k_j (j < i), P[i][j] = e^{G_i - G_j} q_i.k_j (j <= i).
    for (int e = warp; e < len * len; e += kGdnWarps) {
      const int i = e / len, j = e % len;
      if (j > i) continue;
      float kk = 0.f, qk = 0.f;
      for (int x = lane; x < dk; x += kWarpSize) {
        kk += K[i * dk + x] * K[j * dk + x];
        qk += Q[i * dk + x] * K[j * dk + x];
      }
      kk = warp_sum(kk);
      qk = warp_sum(qk);
      if (lane == 0) {
        const float d = __expf(G[i] - G[j]);
        A[i * C + j] = j < i ? beta[i] * d * kk : 0.f;
        P[i * C + j] = d * qk;
      }
    }
    // Right-hand sides beta_i (v_i - e^{G_i} S^T k_i), and e^{G_i} S^T q_i, from the chunk-start S.
    float o_acc[C / kGdnWarps];
#pragma unroll
    for (int x = 0; x < C / kGdnWarps; ++x) {
      const int i = warp + kGdnWarps * x;
      o_acc[x] = 0.f;
      if (i >= len) continue;
      float ks = 0.f, qs = 0.f;
      for (int r = 0; r < dk; ++r) {
        const float sv = S[r * kGdnCols + lane];
        ks += K[i * dk + r] * sv;
        qs += Q[i * dk + r] * sv;
      }
      const float e = __expf(G[i]);
      U[i * kGdnCols + lane] = beta[i] * (U[i * kGdnCols + lane] - e * ks);
      o_acc[x] = e * qs;
    }
    __syncthreads();
    // Forward substitution u_i = rhs_i - sum_{j<i} A_ij u_j: one warp, a column per lane.
    if (warp == 0) {
      for (int i = 1; i < len; ++i) {
        float acc = U[i * kGdnCols + lane];
        for (int j = 0; j < i; ++j) acc -= A[i * C + j] * U[j * kGdnCols + lane];
        U[i * kGdnCols + lane] = acc;
      }
    }
    __syncthreads();
    // Outputs o_i = e^{G_i} S^T q_i + sum_{j<=i} P_ij u_j, and the state carried to the chunk's end.
#pragma unroll
    for (int x = 0; x < C / kGdnWarps; ++x) {
      const int i = warp + kGdnWarps * x;
      if (i >= len) continue;
      float o = o_acc[x];
      for (int j = 0; j <= i; ++j) o += P[i * C + j] * U[j * kGdnCols + lane];
      if (col < dv) out[((t0 + c0 + i) * p.hv + h) * dv + col] = from_float<T>(o);
    }
    const float e_end = __expf(G[len - 1]);
    for (int r = warp; r < dk; r += kGdnWarps) {
      float sv = e_end * S[r * kGdnCols + lane];
      for (int j = 0; j < len; ++j) sv += tail[j] * K[j * dk + r] * U[j * kGdnCols + lane];
      S[r * kGdnCols + lane] = sv;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < dk * kGdnCols; e += blockDim.x) {
    const int c = col0 + e % kGdnCols;
    if (c < dv) st[static_cast<int64_t>(e / kGdnCols) * dv + c] = S[e];
  }
}

// Register rows per thread of the recurrent and replay kernels: the smallest that covers dk.
template <typename F>
void gdn_dispatch_rows(int dk, F&& f) {
  if (dk <= 4 * kGdnWarps) {
    f(std::integral_constant<int, 4>{});
  } else if (dk <= 8 * kGdnWarps) {
    f(std::integral_constant<int, 8>{});
  } else if (dk <= 16 * kGdnWarps) {
    f(std::integral_constant<int, 16>{});
  } else {
    f(std::integral_constant<int, 32>{});
  }
}

inline dim3 gdn_grid(int64_t seqs, int hv, int dv) {
  return dim3(static_cast<unsigned>(seqs), static_cast<unsigned>(hv), static_cast<unsigned>(ceil_div(dv, kGdnCols)));
}

template <typename T>
void launch_gated_delta_recurrent(const GdnParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.hv == 0) return;
  gdn_dispatch_rows(p.dk, [&](auto rows) {
    launch_kernel(gated_delta_recurrent_kernel<T, decltype(rows)::value>, Launch(gdn_grid(p.batch, p.hv, p.dv), kGdnThreads, 0, stream), p);
  });
}

inline void launch_gated_delta_replay(const GdnReplayParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.lead == 0 || p.hv == 0) return;
  gdn_dispatch_rows(p.dk, [&](auto rows) {
    launch_kernel(gated_delta_replay_kernel<decltype(rows)::value>, Launch(gdn_grid(p.lead * p.batch, p.hv, p.dv), kGdnThreads, 0, stream), p);
  });
}

// Returns false when the chunk's working set does not fit the device's shared memory.
template <typename T>
bool launch_gated_delta_chunk(const GdnParams& p, cudaStream_t stream) {
  const size_t bytes = gdn_chunk_smem_floats(p.dk) * sizeof(float);
  if (bytes > static_cast<size_t>(allow_max_dynamic_smem<gated_delta_chunk_kernel<T>>())) return false;
  if (p.batch == 0 || p.hv == 0) return true;
  launch_kernel(gated_delta_chunk_kernel<T>, Launch(gdn_grid(p.batch, p.hv, p.dv), kGdnThreads, bytes, stream), p);
  return true;
}

}  // namespace gpu
}  // namespace dspine
