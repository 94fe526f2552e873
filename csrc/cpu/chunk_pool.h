// A tiny thread pool for many short parallel loops (the quantised GEMVs: ~120 a decoded token,
// and every CPU kernel's parallel_for: common.h).
//
// Why not an OpenMP region: a region ends at a barrier that waits for every thread of the team
// to arrive, so on a machine whose cores are shared with other processes a loop waits a whole
// scheduler time slice whenever one helper has lost its core (measured: 2-thread decode fell
// from ~80 to 1-4 tokens/s under a load of 4-8 on 2 cores). Here chunks are claimed from one
// atomic counter and the caller waits only for chunks someone has claimed: a helper that is
// not running claims nothing, and the caller does its share. Helpers spin briefly between
// loops (decode issues them ~50 us apart), then sleep on a condition variable.
//
// Which thread runs a chunk never changes what the chunk computes.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace dspine {
namespace cpu {

class ChunkPool {
 public:
  using Body = void (*)(void* ctx, int64_t chunk);

  // The process-wide pool (never destroyed: helpers blocked at exit need no join).
  static ChunkPool& instance() {
    static ChunkPool* pool = new ChunkPool();
    return *pool;
  }

  // Runs body(ctx, c) for c in [0, chunks) on the caller and up to threads - 1 helpers.
  // A call from inside a chunk (a parallel loop nested in another) runs serially: the pool
  // runs one job at a time, and the outer job's caller is waiting for this chunk.
  void run(int64_t chunks, int threads, Body body, void* ctx) {
    if (chunks <= 1 || threads <= 1 || in_chunk()) {
      for (int64_t c = 0; c < chunks; ++c) body(ctx, c);
      return;
    }
    std::lock_guard<std::mutex> one_job(submit_);  // concurrent callers take turns
    ensure_helpers(threads - 1);
    body_.store(body);
    ctx_.store(ctx);
    chunks_.store(chunks);
    helpers_wanted_.store(threads - 1);
    done_.store(0);
    const uint64_t gen = generation_.load() + 1;
    next_.store(gen << 32);
    generation_.store(gen);  // publishes the fields above (every access is seq_cst)
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      wake_.notify_all();
    }
    work(gen, body, ctx, chunks);
    for (int spins = 0; done_.load() < chunks; ++spins) {
      if (spins < 4096)
        _mm_pause();
      else
        std::this_thread::yield();  // a helper holds a chunk but lost its core
    }
    // Seal the finished job before its fields are reused: a helper that read them late can
    // never claim a chunk of it (nor of the next job, whose generation differs).
    next_.store(gen << 32 | 0xffffffffu);
  }

 private:
  ChunkPool() = default;

  static bool& in_chunk() {
    static thread_local bool inside = false;
    return inside;
  }

  // Claims and runs chunks of job `gen` until none is left; a stale job's claim fails.
  void work(uint64_t gen, Body body, void* ctx, int64_t chunks) {
    for (;;) {
      uint64_t v = next_.load();
      if ((v >> 32) != gen || static_cast<int64_t>(v & 0xffffffffu) >= chunks) return;
      if (!next_.compare_exchange_weak(v, v + 1)) continue;
      in_chunk() = true;
      body(ctx, static_cast<int64_t>(v & 0xffffffffu));
      in_chunk() = false;
      done_.fetch_add(1);
    }
  }

  void ensure_helpers(int n) {
    while (static_cast<int>(helpers_.size()) < n) {
      const int index = static_cast<int>(helpers_.size());
      helpers_.emplace_back([this, index] { helper_loop(index); });
      helpers_.back().detach();
    }
  }

  void helper_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t gen = generation_.load();
      for (int spins = 0; gen == seen && spins < kSpins; ++spins) {
        _mm_pause();
        gen = generation_.load();
      }
      if (gen == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        sleeping_.fetch_sub(1);
        gen = generation_.load();
      }
      seen = gen;
      if (index < helpers_wanted_.load())
        work(gen, body_.load(), ctx_.load(),
             chunks_.load());
    }
  }

  static constexpr int kSpins = 20000;  // ~0.5 ms of pause before a helper sleeps

  std::mutex submit_, mu_;
  std::condition_variable wake_;
  std::vector<std::thread> helpers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> next_{0};  // generation << 32 | next chunk to claim
  std::atomic<int64_t> done_{0};
  std::atomic<int64_t> chunks_{0};
  std::atomic<int> sleeping_{0}, helpers_wanted_{0};
  std::atomic<Body> body_{nullptr};
  std::atomic<void*> ctx_{nullptr};
};

}  // namespace cpu
}  // namespace dspine
