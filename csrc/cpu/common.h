// Small helpers shared by the CPU kernels. No torch dependency: these headers also build into
// the plain C++ library (CMakeLists.txt) that non-Python serving stacks link.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(_OPENMP)
#include <omp.h>
#if defined(__x86_64__) || defined(_M_X64)
#define DSPINE_PARALLEL_ON_CHUNK_POOL 1
#include "chunk_pool.h"
#endif
#endif

namespace dspine {
namespace cpu {

// Element types convert through float; c10::BFloat16 / c10::Half provide these casts, and a
// plain float instantiation needs nothing else.
template <typename T>
inline float to_f(T x) { return static_cast<float>(x); }
template <typename T>
inline T from_f(float x) { return static_cast<T>(x); }

// Whether T is IEEE binary16 (c10::Half in the torch bindings), told by its numeric_limits so
// this header needs no torch: the kernels widen rows of it with F16C where the ISA allows.
template <typename T>
constexpr bool kIsFp16 = sizeof(T) == 2 && std::numeric_limits<T>::is_specialized &&
                         std::numeric_limits<T>::is_iec559 && std::numeric_limits<T>::digits == 11;

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The kernels' own thread count, apart from torch's intra-op threads (ops.set_cpu_threads,
// the engine's cpu_threads): 0 = follow torch.set_num_threads. Apart because the two pools
// share the cores: torch's OpenMP workers spin after every small torch op between our kernels,
// taking the core a chunk-pool helper needs (docs/DECISIONS.md, "CPU threads"). One counter per
// process (a function-local static of an inline function is one object across the library).
constexpr int kMaxKernelThreads = 4096;  // the most a setter accepts (torch op and C API)
inline std::atomic<int>& kernel_threads() {
  static std::atomic<int> threads{0};
  return threads;
}

// The threads a parallel loop may use: the kernels' own count when set, else torch's
// (torch.set_num_threads) under OpenMP, else one.
inline int max_threads() {
  const int own = kernel_threads().load(std::memory_order_relaxed);
  if (own > 0) return own;
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// A "parallel for" over [0, n), items claimed one at a time. Built with OpenMP on x86 it runs
// on the chunk pool (chunk_pool.h: the caller never waits at a barrier for a helper that has
// lost its core, which an OpenMP region does: measured, a 3-row top-k of the draft walk took
// 4.7 ms under a load of 3 on 2 cores), with the kernels' threads
// (max_threads: cpu_threads, else torch.set_num_threads); elsewhere an OpenMP loop, or serial
// without OpenMP.
template <typename F>
inline void parallel_for(int64_t n, F&& fn) {
#if defined(DSPINE_PARALLEL_ON_CHUNK_POOL)
  using Fn = std::remove_reference_t<F>;
  const ChunkPool::Body body = [](void* ctx, int64_t i) { (*static_cast<Fn*>(ctx))(i); };
  ChunkPool::instance().run(n, max_threads(), body,
                            const_cast<void*>(static_cast<const void*>(&fn)));
#elif defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) num_threads(max_threads()) if (n > 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
#else
  for (int64_t i = 0; i < n; ++i) fn(i);
#endif
}

// Loops whose whole work (items x elements each touches) is below this run on the calling
// thread: an OpenMP region costs 5-60 us to open and close (measured on 2 cores: a 4-row
// add_rms_norm 61 us against 5 us for one row), far more than a few thousand elements of
// work, and under load its barrier waits for a helper that lost its core. What one item
// computes does not depend on the thread that runs it, so results are unchanged.
constexpr int64_t kSerialWork = int64_t{1} << 16;

template <typename F>
inline void parallel_for(int64_t n, int64_t work_per_item, F&& fn) {
  if (n * work_per_item < kSerialWork) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  } else {
    parallel_for(n, std::forward<F>(fn));
  }
}

// The index of the first entry of p[0, n) outside [lo, hi), or n; entries whose skip[i] is
// negative (padding rows) are ignored. A full scan with no early exit on purpose: the same
// check written as a loop around TORCH_CHECK crashed when it threw, in an -O3 -march=native
// build on an AVX-512 host (the quantised embedding's id check; docs/DECISIONS.md).
template <typename T>
inline int64_t first_outside(const T* p, int64_t n, int64_t lo, int64_t hi, const int32_t* skip = nullptr) {
  int64_t first = n;
  for (int64_t i = n - 1; i >= 0; --i) {
    const bool outside = static_cast<int64_t>(p[i]) < lo || static_cast<int64_t>(p[i]) >= hi;
    if (outside && (skip == nullptr || skip[i] >= 0)) first = i;
  }
  return first;
}

}  // namespace cpu
}  // namespace dspine
