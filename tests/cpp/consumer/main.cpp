// One decode step of attention through the installed library: a query attends to three keys in
// a two-page cache whose V rows are 1, 2, 3; with equal scores the output is their mean, 2.
#include <cmath>
#include <cstdio>
#include <vector>

#include <dspine_kernels.h>

int main() {
  const int64_t head_dim = 4, page_size = 2;
  std::vector<float> q(head_dim, 0.f), out(head_dim, NAN);
  std::vector<float> k_cache(2 * page_size * head_dim, 0.f), v_cache(2 * page_size * head_dim, 0.f);
  // Positions 0, 1 live in page 1 and position 2 in page 0 (pages need not be in order).
  const int page_of[3] = {1, 1, 0}, offset_of[3] = {0, 1, 0};
  for (int pos = 0; pos < 3; ++pos)
    for (int64_t x = 0; x < head_dim; ++x) v_cache[(page_of[pos] * page_size + offset_of[pos]) * head_dim + x] = pos + 1.f;
  const std::vector<int32_t> block_tables = {1, 0}, kv_lens = {3}, cu_q = {0, 1};

  dspine_attention_args args{};
  args.batch = 1;
  args.q_heads = args.kv_heads = 1;
  args.head_dim = head_dim;
  args.num_pages = 2;
  args.page_size = page_size;
  args.max_pages = 2;
  args.causal = 1;
  args.scale = 0.5f;
  if (dspine_cpu_paged_attention_f32(q.data(), k_cache.data(), v_cache.data(), out.data(), block_tables.data(),
                                     kv_lens.data(), cu_q.data(), &args) != DSPINE_OK) {
    std::fprintf(stderr, "paged_attention failed: %s\n", dspine_last_error());
    return 1;
  }
  for (float x : out)
    if (std::fabs(x - 2.f) > 1e-6f) {
      std::fprintf(stderr, "got %g, want 2\n", x);
      return 1;
    }
  std::printf("consumer OK: dspine_kernels %s\n", dspine_version());
  return 0;
}
