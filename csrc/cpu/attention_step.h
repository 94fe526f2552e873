// One online-softmax step of the CPU paged attention (attention.h): the rows of a work item
// against one chunk of keys. This file holds what every version of the step shares (the chunk and
// row layout), the portable step, and the SIMD step over a kernel set (attention_avx512.h,
// attention_avx2.h).
//
// What a step computes for a row must depend only on the row, the chunk and the keys the row sees
// in it, never on the other rows of the call: a verify block's row must equal the same row decoded
// alone, bit for bit (lossless speculation). Every step keeps that by computing every row with the
// same code and the same operation order, and by never touching a row with a key it does not see
// (not even a zero-weight multiply-add, which would turn -0 into +0 or an inf value into NaN).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dspine {
namespace cpu {
namespace attn {

// Keys per step. Chunk c holds keys [c * kKeyChunk, (c + 1) * kKeyChunk): boundaries are
// absolute positions, so a row meets the same chunks whatever the rows beside it (with a window,
// chunks starting at the first key the tile sees would move the softmax's rescaling points).
constexpr int64_t kKeyChunk = 32;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The SIMD steps' e^x for x <= 0 (a score minus the running max), within ~2 ulp: x = n ln2 + r
// with |r| <= ln2/2 (ln2 in two parts so that n ln2 is nearly exact), e^r by its Taylor series
// to r^7 (coefficients highest first; error < 1e-8), times 2^n. x is clamped at kExpFloor (e^-87
// is far below any sum it joins, and the unseen lanes are masked anyway).
constexpr float kExpFloor = -87.f, kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpTaylor[8] = {1.f / 5040.f, 1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f};

// One chunk of keys: fp32 rows of its keys k0 + [j0, j1) (the lanes the item's rows can see).
struct KeyChunk {
  int64_t k0;  // absolute position of lane 0
  int j0, j1;
  const float* const* k;  // k[j]: key row of lane j (head_dim floats), for j in [j0, j1)
  const float* const* v;  // v[j]: value row
};

// The rows of one work item. q is pre-scaled; acc, m, l are the running output, max and sum.
// Per step: mask[i] bit j says row i sees key k0 + j; s holds kKeyChunk scores, then
// probabilities, per row; corr the rescaling of the row's output.
struct Rows {
  int64_t n, d;
  const float* q;
  float *acc, *m, *l, *s, *corr;
  const uint32_t* mask;
};

// Lanes j of the chunk at k0 with lo <= k0 + j <= hi.
inline uint32_t lane_mask(int64_t lo, int64_t hi, int64_t k0) {
  const int64_t a = std::max<int64_t>(lo - k0, 0), b = std::min<int64_t>(hi - k0, kKeyChunk - 1);
  if (a > b) return 0;
  return static_cast<uint32_t>(((uint64_t{1} << (b - a + 1)) - 1) << a);
}

// The first and one past the last lane set in a nonzero mask.
inline int first_lane(uint32_t mask) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_ctz(mask);
#else
  int j = 0;
  while (!(mask >> j & 1u)) ++j;
  return j;
#endif
}

inline int end_lane(uint32_t mask) {
#if defined(__GNUC__) || defined(__clang__)
  return 32 - __builtin_clz(mask);
#else
  int j = 32;
  while (!(mask >> (j - 1) & 1u)) --j;
  return j;
#endif
}

// The step in plain C++: per row and key a dot product over head_dim (vectorised by the
// compiler, the same reduction for every row), then the softmax update.
inline void portable_step(const KeyChunk& c, const Rows& rw) {
  const int64_t d = rw.d;
  for (int64_t i = 0; i < rw.n; ++i) {
    const uint32_t vis = rw.mask[i];
    if (vis == 0) continue;  // the row sees no key of this chunk
    const float* q = rw.q + i * d;
    float* s = rw.s + i * kKeyChunk;
    float cmax = kNegInf;
    for (int j = c.j0; j < c.j1; ++j) {
      if (!(vis >> j & 1u)) continue;
      const float* k = c.k[j];
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t x = 0; x < d; ++x) dot += q[x] * k[x];
      s[j] = dot;
      cmax = std::max(cmax, dot);
    }
    if (cmax == kNegInf) continue;
    const float m_new = std::max(rw.m[i], cmax);
    const float corr = std::exp(rw.m[i] - m_new);  // exp(-inf) = 0 on the first visible chunk
    float* acc = rw.acc + i * d;
    if (corr != 1.f) {
      for (int64_t x = 0; x < d; ++x) acc[x] *= corr;
    }
    float lsum = rw.l[i] * corr;
    for (int j = c.j0; j < c.j1; ++j) {
      if (!(vis >> j & 1u)) continue;
      const float p = std::exp(s[j] - m_new);
      lsum += p;
      const float* v = c.v[j];
#pragma omp simd
      for (int64_t x = 0; x < d; ++x) acc[x] += p * v[x];
    }
    rw.l[i] = lsum;
    rw.m[i] = m_new;
  }
}

// The step for a SIMD kernel set K (attention_avx512.h, attention_avx2.h: each lane of a score
// one key, of an output one dim of head_dim): keys transposed once, scores of K::kScoreRows rows
// at a time, the softmax row by row, outputs K::kOutputRows rows at a time. kt is scratch for the
// transposed keys (head_dim x kKeyChunk floats).
template <class K>
void simd_step(const KeyChunk& c, const Rows& rw, float* kt) {
  const int64_t d = rw.d;
  transpose_keys(K{}, c, d, kt);
  for (int64_t r0 = 0; r0 < rw.n; r0 += K::kScoreRows)
    score_tile(K{}, static_cast<int>(std::min<int64_t>(K::kScoreRows, rw.n - r0)), rw.q + r0 * d, d, kt,
               rw.s + r0 * kKeyChunk);
  for (int64_t i = 0; i < rw.n; ++i)
    rw.corr[i] = softmax_row(K{}, rw.s + i * kKeyChunk, rw.mask[i], rw.m + i, rw.l + i);
  for (int64_t r0 = 0; r0 < rw.n; r0 += K::kOutputRows) {
    const int rows = static_cast<int>(std::min<int64_t>(K::kOutputRows, rw.n - r0));
    uint32_t any = 0;
    bool full = true;  // every row sees the same lanes: a row's visible lanes are contiguous,
                       // so then each sees all of [j0, j1) and nothing needs masking
    for (int r = 0; r < rows; ++r) {
      any |= rw.mask[r0 + r];
      full = full && rw.mask[r0 + r] == rw.mask[r0];
    }
    if (any == 0) continue;  // no row of the tile sees this chunk: nothing changes
    const int j0 = first_lane(any), j1 = end_lane(any);
    accumulate(K{}, full, rows, rw.acc + r0 * d, d, rw.corr + r0, rw.s + r0 * kKeyChunk, rw.mask + r0, c.v,
               j0, j1);
  }
}

}  // namespace attn
}  // namespace cpu
}  // namespace dspine
