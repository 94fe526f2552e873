// Host-only check (tests/test_sm90_tma_layout.py compiles and runs it): the sm90 attention
// kernel's K/V stage layout (CuTe's 128-byte-swizzled K-major tiles, Sm90Tile::SmemLayoutK) puts
// every element where a TMA box with CU_TENSOR_MAP_SWIZZLE_128B writes it, so the kernel's TMA
// loads (sm90_tma_tile: one box of the tile's 128 rows x 64 columns per column half h) land
// where its cp.async rows do and where wgmma reads. TMA's swizzle, per 1,024-byte block of 8 rows of
// 128 bytes: the 16-byte chunk index of a row is XORed with the row's index in the block.
#include <cstdint>
#include <cstdio>

#include "cuda/attention_sm90.cuh"

template <typename T, int D>
long mismatches() {
  using C = dspine::gpu::Sm90Tile<T, D>;
  using E = typename C::E;
  static E buf[C::kKVBytes / sizeof(E) + 1024];
  E* base = reinterpret_cast<E*>((reinterpret_cast<uintptr_t>(buf) + 1023) & ~uintptr_t(1023));
  auto stages = cute::make_tensor(cute::make_smem_ptr(base), typename C::SmemLayoutK{});
  long bad = 0;
  for (int s = 0; s < C::kStages; ++s)
    for (int r = 0; r < C::kBlockN; ++r)
      for (int c = 0; c < D; ++c) {
        const long got = reinterpret_cast<const char*>(&stages(r, c, s)) - reinterpret_cast<const char*>(base);
        const int byte = (c % 64) * 2, half = c / 64;
        const long box_base = static_cast<long>(s) * C::kBlockN * D * 2 + static_cast<long>(half) * C::kBlockN * 128;
        const long want = box_base + r * 128 + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15);
        if (got != want && bad++ < 5)
          std::printf("D=%d stage %d row %d col %d: layout byte %ld, TMA byte %ld\n", D, s, r, c, got, want);
      }
  std::printf("head dim %d, %d stages: %ld mismatches\n", D, C::kStages, bad);
  return bad;
}

int main() {
  const long bad = mismatches<__nv_bfloat16, 128>() + mismatches<__nv_bfloat16, 64>() +
                   mismatches<__half, 128>() + mismatches<__half, 64>();
  return bad == 0 ? 0 : 1;
}
