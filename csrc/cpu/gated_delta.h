// The gated delta rule (Gated DeltaNet layers of hybrid targets), CPU: the token-by-token update
// (decode and verify blocks, with the ReplaySSM ring), the replay of an accepted prefix onto the
// checkpoint, and the chunked prefill. Semantics: dspine_engine/ops.py (gated_delta_*).
//
// One task per (sequence, v-head): its [dk, dv] fp32 state stays in a private buffer while the
// task walks its tokens. The two state operations (decay, then the rank-1 update) are the same
// functions in the update and in the replay, with explicit fma, so a replay reproduces the state
// of a plain decode bit for bit.
#pragma once

#include <algorithm>
#include <vector>

#include "common.h"

namespace dspine {
namespace cpu {

constexpr float kGdnL2Eps = 1e-6f;
constexpr int64_t kGdnChunk = 64;  // tokens solved together by the chunked prefill

struct GatedDeltaArgs {
  int64_t batch, hk, hv, dk, dv;
  int64_t q_stride, k_stride, v_stride, a_stride, b_stride;  // elements between token rows
  int64_t ring_len;                                          // R; 0 = no ring (update in place)
};

// x / sqrt(sum x^2 + eps) * scale, in fp32.
template <typename T>
inline void gdn_l2norm(const T* x, float* out, int64_t d, float scale) {
  float ss = 0.f;
  for (int64_t i = 0; i < d; ++i) {
    out[i] = to_f(x[i]);
    ss += out[i] * out[i];
  }
  const float inv = scale / std::sqrt(ss + kGdnL2Eps);
  for (int64_t i = 0; i < d; ++i) out[i] *= inv;
}

inline float softplusf(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// g = -exp(A_log) * softplus(a + dt_bias): the log of the per-token decay.
inline float gdn_log_decay(float a, float a_log, float dt_bias) {
  return -std::exp(a_log) * softplusf(a + dt_bias);
}

// S *= exp(g) over a [dk, dv] state.
inline void gdn_decay(float* s, int64_t n, float decay) {
  for (int64_t i = 0; i < n; ++i) s[i] *= decay;
}

// S += k u^T (explicit fma: the same rounding wherever it runs).
inline void gdn_rank1(float* s, const float* k, const float* u, int64_t dk, int64_t dv) {
  for (int64_t i = 0; i < dk; ++i) {
    float* row = s + i * dv;
    const float ki = k[i];
    for (int64_t j = 0; j < dv; ++j) row[j] = std::fma(ki, u[j], row[j]);
  }
}

// y = S^T x for a [dk, dv] state.
inline void gdn_read(const float* s, const float* x, float* y, int64_t dk, int64_t dv) {
  for (int64_t j = 0; j < dv; ++j) y[j] = 0.f;
  for (int64_t i = 0; i < dk; ++i) {
    const float* row = s + i * dv;
    const float xi = x[i];
    for (int64_t j = 0; j < dv; ++j) y[j] = std::fma(row[j], xi, y[j]);
  }
}

// The token inputs of the rule (rows strided by GatedDeltaArgs) and the gate parameters.
template <typename T>
struct GdnInputs {
  const T *q, *k, *v, *a, *b;
  const float *a_log, *dt_bias;
};

// One (sequence, v-head) task: its tokens t0..t0+n-1 and its slot's [dk, dv] state.
struct GdnHead {
  int64_t slot, h, kh, t0, n;
  float* state;
};

// Runs fn(head) for every (sequence, v-head) in parallel; padding sequences (slot < 0) get zero
// output rows instead.
template <typename T, typename F>
void for_each_head(const GatedDeltaArgs& a, float* state, T* out, const int32_t* slots,
                   const int32_t* cu_q, F&& fn) {
  parallel_for(a.batch * a.hv, [&](int64_t task) {
    const int64_t b = task / a.hv, h = task % a.hv, t0 = cu_q[b], n = cu_q[b + 1] - cu_q[b];
    if (slots[b] < 0) {
      for (int64_t t = t0; t < t0 + n; ++t)
        for (int64_t j = 0; j < a.dv; ++j) out[(t * a.hv + h) * a.dv + j] = from_f<T>(0.f);
      return;
    }
    const int64_t slot = slots[b];
    fn(GdnHead{slot, h, h / (a.hv / a.hk), t0, n, state + (slot * a.hv + h) * a.dk * a.dv});
  });
}

// q^ and k^ (normalised, fp32), the log decay g and beta of token t for one head.
template <typename T>
inline void gdn_token(const GdnInputs<T>& in, const GatedDeltaArgs& a, const GdnHead& hd,
                      int64_t t, float* qn, float* kn, float& g, float& beta) {
  gdn_l2norm(in.k + t * a.k_stride + hd.kh * a.dk, kn, a.dk, 1.0f);
  gdn_l2norm(in.q + t * a.q_stride + hd.kh * a.dk, qn, a.dk,
             1.0f / std::sqrt(static_cast<float>(a.dk)));
  g = gdn_log_decay(to_f(in.a[t * a.a_stride + hd.h]), in.a_log[hd.h], in.dt_bias[hd.h]);
  beta = sigmoidf(to_f(in.b[t * a.b_stride + hd.h]));
}

template <typename T>
void gated_delta_recurrent(const GdnInputs<T>& in, float* state, T* out, const int32_t* slots,
                           const int32_t* cu_q, float* ring_k, float* ring_u, float* ring_g,
                           float* states_out, const GatedDeltaArgs& a) {
  const int64_t dk = a.dk, dv = a.dv, ratio = a.hv / a.hk, R = a.ring_len;
  for_each_head(a, state, out, slots, cu_q, [&](const GdnHead& hd) {
    const int64_t h = hd.h;
    std::vector<float> s(hd.state, hd.state + dk * dv), kn(dk), qn(dk), u(dv), o(dv);
    for (int64_t i = 0; i < hd.n; ++i) {
      const int64_t t = hd.t0 + i;
      float g, beta;
      gdn_token(in, a, hd, t, qn.data(), kn.data(), g, beta);
      gdn_decay(s.data(), dk * dv, std::exp(g));
      gdn_read(s.data(), kn.data(), u.data(), dk, dv);
      const T* vt = in.v + t * a.v_stride + h * dv;
      for (int64_t j = 0; j < dv; ++j) u[j] = beta * (to_f(vt[j]) - u[j]);
      gdn_rank1(s.data(), kn.data(), u.data(), dk, dv);
      gdn_read(s.data(), qn.data(), o.data(), dk, dv);
      for (int64_t j = 0; j < dv; ++j) out[(t * a.hv + h) * dv + j] = from_f<T>(o[j]);
      if (R > 0) {
        const int64_t row = hd.slot * R + i;
        if (h % ratio == 0) std::copy(kn.begin(), kn.end(), ring_k + (row * a.hk + hd.kh) * dk);
        std::copy(u.begin(), u.end(), ring_u + (row * a.hv + h) * dv);
        ring_g[row * a.hv + h] = g;
      }
      if (states_out) std::copy(s.begin(), s.end(), states_out + (t * a.hv + h) * dk * dv);
    }
    if (R == 0) std::copy(s.begin(), s.end(), hd.state);
  });
}

// Replays the first num_accepted[b] ring records onto each slot's checkpoint, for `lead`
// stacked layers: state [lead, S, hv, dk, dv], ring_k [lead, S, R, hk, dk], ring_u [lead, S, R,
// hv, dv], ring_g [lead, S, R, hv].
inline void gated_delta_replay(float* state, const float* ring_k, const float* ring_u,
                               const float* ring_g, const int32_t* slots,
                               const int32_t* num_accepted, int64_t lead, int64_t num_slots,
                               int64_t batch, int64_t ring_len, int64_t hk, int64_t hv,
                               int64_t dk, int64_t dv) {
  const int64_t ratio = hv / hk;
  parallel_for(lead * batch * hv, [&](int64_t task) {
    const int64_t h = task % hv, b = (task / hv) % batch, l = task / (hv * batch);
    if (slots[b] < 0) return;
    const int64_t ls = l * num_slots + slots[b];  // (layer, slot) row
    float* s = state + (ls * hv + h) * dk * dv;
    for (int64_t t = 0; t < num_accepted[b]; ++t) {
      const int64_t row = ls * ring_len + t;
      gdn_decay(s, dk * dv, std::exp(ring_g[row * hv + h]));
      gdn_rank1(s, ring_k + (row * hk + h / ratio) * dk, ring_u + (row * hv + h) * dv, dk, dv);
    }
  });
}

// One chunk of L <= kGdnChunk tokens of one v-head (see ops._gdn_chunk_step for the algebra).
// kc, qc [L, dk] normalised; vc [L, dv] is overwritten by the updates u; g, beta [L].
struct GdnChunkScratch {
  std::vector<float> kc, qc, vc, cum, beta, sys, att, ks, o;
  GdnChunkScratch(int64_t dk, int64_t dv)
      : kc(kGdnChunk * dk), qc(kGdnChunk * dk), vc(kGdnChunk * dv), cum(kGdnChunk),
        beta(kGdnChunk), sys(kGdnChunk * kGdnChunk), att(kGdnChunk * kGdnChunk), ks(dv), o(dv) {}
};

inline float dotf(const float* x, const float* y, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * y[i];
  return acc;
}

// Solves the chunk's updates into c.vc, writes its outputs (fp32) to o_rows [L, dv] and carries
// the state s [dk, dv] to the chunk's end.
inline void gdn_chunk(GdnChunkScratch& c, int64_t len, int64_t dk, int64_t dv, float* s,
                      float* o_rows) {
  float *K = c.kc.data(), *Q = c.qc.data(), *U = c.vc.data(), *G = c.cum.data();
  float *A = c.sys.data(), *P = c.att.data();
  for (int64_t i = 1; i < len; ++i) G[i] += G[i - 1];  // cumulative log decay
  // Right-hand sides beta_i (v_i - e^{G_i} S^T k_i), and the lower-triangular system A.
  for (int64_t i = 0; i < len; ++i) {
    gdn_read(s, K + i * dk, c.ks.data(), dk, dv);
    const float e = std::exp(G[i]);
    for (int64_t j = 0; j < dv; ++j) U[i * dv + j] = c.beta[i] * (U[i * dv + j] - e * c.ks[j]);
    for (int64_t j = 0; j < i; ++j)
      A[i * kGdnChunk + j] = c.beta[i] * std::exp(G[i] - G[j]) * dotf(K + i * dk, K + j * dk, dk);
    for (int64_t j = 0; j <= i; ++j)
      P[i * kGdnChunk + j] = std::exp(G[i] - G[j]) * dotf(Q + i * dk, K + j * dk, dk);
  }
  // Forward substitution: u_i = rhs_i - sum_{j<i} A_ij u_j.
  for (int64_t i = 1; i < len; ++i)
    for (int64_t j = 0; j < i; ++j) {
      const float aij = A[i * kGdnChunk + j];
      for (int64_t x = 0; x < dv; ++x) U[i * dv + x] -= aij * U[j * dv + x];
    }
  // o_i = e^{G_i} S^T q_i + sum_{j<=i} P_ij u_j (S still at the chunk start).
  for (int64_t i = 0; i < len; ++i) {
    gdn_read(s, Q + i * dk, c.o.data(), dk, dv);
    const float e = std::exp(G[i]);
    float* oi = o_rows + i * dv;
    for (int64_t x = 0; x < dv; ++x) oi[x] = e * c.o[x];
    for (int64_t j = 0; j <= i; ++j) {
      const float pij = P[i * kGdnChunk + j];
      for (int64_t x = 0; x < dv; ++x) oi[x] += pij * U[j * dv + x];
    }
  }
  // S = e^{G_L} S + sum_j e^{G_L - G_j} k_j u_j^T.
  const float g_end = G[len - 1];
  gdn_decay(s, dk * dv, std::exp(g_end));
  for (int64_t j = 0; j < len; ++j) {
    const float w = std::exp(g_end - G[j]);
    for (int64_t i = 0; i < dk; ++i) {
      const float kij = w * K[j * dk + i];
      float* row = s + i * dv;
      for (int64_t x = 0; x < dv; ++x) row[x] += kij * U[j * dv + x];
    }
  }
}

template <typename T>
void gated_delta_chunk(const GdnInputs<T>& in, float* state, T* out, const int32_t* slots,
                       const int32_t* cu_q, const GatedDeltaArgs& a) {
  const int64_t dk = a.dk, dv = a.dv;
  for_each_head(a, state, out, slots, cu_q, [&](const GdnHead& hd) {
    std::vector<float> s(hd.state, hd.state + dk * dv), o(kGdnChunk * dv);
    GdnChunkScratch c(dk, dv);
    for (int64_t c0 = 0; c0 < hd.n; c0 += kGdnChunk) {
      const int64_t len = std::min(kGdnChunk, hd.n - c0);
      for (int64_t i = 0; i < len; ++i) {
        const int64_t t = hd.t0 + c0 + i;
        gdn_token(in, a, hd, t, c.qc.data() + i * dk, c.kc.data() + i * dk, c.cum[i], c.beta[i]);
        const T* vt = in.v + t * a.v_stride + hd.h * dv;
        for (int64_t j = 0; j < dv; ++j) c.vc[i * dv + j] = to_f(vt[j]);
      }
      gdn_chunk(c, len, dk, dv, s.data(), o.data());
      for (int64_t i = 0; i < len; ++i)
        for (int64_t j = 0; j < dv; ++j)
          out[((hd.t0 + c0 + i) * a.hv + hd.h) * dv + j] = from_f<T>(o[i * dv + j]);
    }
    std::copy(s.begin(), s.end(), hd.state);
  });
}

}  // namespace cpu
}  // namespace dspine
