// The CUDA entry points (dspine_kernels_cuda.h): the attention, walk and verify cases of the CPU
// tests against the same naive references (reference.h); the element-wise ops against the CPU
// entry points, which test_elementwise.cpp checks against naive references. Exits with 77
// (ctest: skipped) when no CUDA device is present.
#include <cuda_runtime.h>

#include <cstdlib>

#include "dspine_kernels_cuda.h"
#include "reference.h"

namespace dspine_test {
namespace {

void cuda_or_die(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}

// A device copy of a host vector (empty vectors give a NULL pointer, as the API allows).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    if (size_ == 0) return;
    cuda_or_die(cudaMalloc(&ptr_, size_ * sizeof(T)), "cudaMalloc");
    cuda_or_die(cudaMemcpy(ptr_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  std::vector<T> to_host() const {
    std::vector<T> host(size_);
    cuda_or_die(cudaDeviceSynchronize(), "kernel");
    if (size_) cuda_or_die(cudaMemcpy(host.data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t size_;
};

cudaStream_t test_stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s;
    cuda_or_die(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }();
  return stream;
}

// ---- element-wise ops: CUDA == CPU ------------------------------------------------------------

void norm_case(Rng& rng, int64_t rows, int64_t dim) {
  Case scope(str("cuda add_rms_norm rows=", rows, " dim=", dim));
  const auto x = rng.normals(rows * dim, 2.f), res = rng.normals(rows * dim, 2.f), w = rng.normals(dim);
  auto out = poisoned(x.size()), sum = poisoned(x.size()), plain = poisoned(x.size());
  check_ok(dspine_cpu_add_rms_norm_f32(x.data(), res.data(), w.data(), out.data(), sum.data(), rows, dim, 1e-6f),
           "cpu add_rms_norm");
  check_ok(dspine_cpu_rms_norm_f32(x.data(), w.data(), plain.data(), rows, dim, 1e-6f), "cpu rms_norm");
  const auto nan_rows = poisoned(x.size());
  DeviceArray<float> dx(x), dres(res), dw(w), dout(nan_rows), dsum(nan_rows), dplain(nan_rows);
  check_ok(dspine_cuda_add_rms_norm_f32(dx.get(), dres.get(), dw.get(), dout.get(), dsum.get(), rows, dim, 1e-6f,
                                        test_stream()),
           "cuda add_rms_norm");
  check_ok(dspine_cuda_rms_norm_f32(dx.get(), dw.get(), dplain.get(), rows, dim, 1e-6f, test_stream()),
           "cuda rms_norm");
  check_close("out", dout.to_host(), to_double(out), 1e-5, 1e-5);
  check_close("residual_out", dsum.to_host(), to_double(sum), 0.0, 0.0);
  check_close("rms_norm out", dplain.to_host(), to_double(plain), 1e-5, 1e-5);
}

void rope_and_write_kv_case(Rng& rng, int64_t tokens, int64_t heads, int64_t head_dim, int64_t pad) {
  Case scope(str("cuda rope/write_kv tokens=", tokens, " heads=", heads, " head_dim=", head_dim, " pad=", pad));
  const int64_t table_rows = 50, row = heads * head_dim, stride = row + pad, num_slots = tokens + 5;
  std::vector<float> table(table_rows * head_dim);
  for (auto& x : table) x = rng.uniform(-1.f, 1.f);  // any table: both sides read the same one
  std::vector<float> x(tokens * stride, kNaN);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < row; ++i) x[t * stride + i] = rng.normal();
  std::vector<int32_t> positions(tokens), slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    positions[t] = static_cast<int32_t>(rng.integer(0, table_rows - 1));
    slots[t] = rng.coin(0.2) ? -1 : static_cast<int32_t>(num_slots - 1 - t);
  }
  auto rotated = poisoned(tokens * row), k_cache = poisoned(num_slots * row), v_cache = poisoned(num_slots * row);
  check_ok(dspine_cpu_rope_f32(x.data(), stride, rotated.data(), positions.data(), table.data(), table_rows, tokens,
                               heads, head_dim),
           "cpu rope");
  check_ok(dspine_cpu_write_kv_f32(x.data(), stride, x.data(), stride, positions.data(), table.data(), table_rows,
                                   k_cache.data(), v_cache.data(), num_slots, slots.data(), tokens, heads, head_dim),
           "cpu write_kv");
  DeviceArray<float> dx(x), dtable(table), drot(poisoned(tokens * row)), dk(poisoned(num_slots * row)),
      dv(poisoned(num_slots * row));
  DeviceArray<int32_t> dpos(positions), dslots(slots);
  check_ok(dspine_cuda_rope_f32(dx.get(), stride, drot.get(), dpos.get(), dtable.get(), table_rows, tokens, heads,
                                head_dim, test_stream()),
           "cuda rope");
  check_ok(dspine_cuda_write_kv_f32(dx.get(), stride, dx.get(), stride, dpos.get(), dtable.get(), table_rows, dk.get(),
                                    dv.get(), num_slots, dslots.get(), tokens, heads, head_dim, test_stream()),
           "cuda write_kv");
  check_close("rope out", drot.to_host(), to_double(rotated), 1e-5, 1e-5);
  // Unwritten slots stay NaN on both sides: compare bit patterns.
  auto k_got = dk.to_host();
  for (size_t i = 0; i < k_got.size(); ++i)
    if (std::fabs(k_got[i] - k_cache[i]) <= 1e-5f * (1.f + std::fabs(k_cache[i]))) k_got[i] = k_cache[i];
  check_same_bits("k_cache", k_got, k_cache);
  check_same_bits("v_cache", dv.to_host(), v_cache);
}

void injection_case(Rng& rng, int64_t n, int64_t block, int64_t hidden) {
  Case scope(str("cuda fused_injection n=", n, " block=", block, " hidden=", hidden));
  const auto h = rng.normals(n * block * hidden), gate = rng.normals(h.size()), fproj = rng.normals(2 * h.size());
  auto out = poisoned(h.size());
  check_ok(dspine_cpu_fused_injection_f32(h.data(), gate.data(), fproj.data(), out.data(), n, block, hidden),
           "cpu fused_injection");
  DeviceArray<float> dh(h), dgate(gate), dfproj(fproj), dout(poisoned(h.size()));
  check_ok(dspine_cuda_fused_injection_f32(dh.get(), dgate.get(), dfproj.get(), dout.get(), n, block, hidden,
                                           test_stream()),
           "cuda fused_injection");
  check_close("out", dout.to_host(), to_double(out), 1e-5, 1e-5);
}

// ---- attention, walk, verify: CUDA == naive reference ------------------------------------------

void attention_case(const AttentionCase& c, uint64_t seed) {
  Case scope(str("cuda ", c.describe(), " seed=", seed));
  Rng rng(seed);
  const PagedInputs in = make_attention_inputs(c, rng);
  const int64_t num_q = in.cu_q.back();
  DeviceArray<float> dq(in.q), dk(in.k_cache), dv(in.v_cache), dout(poisoned(num_q * c.q_heads * c.head_dim));
  DeviceArray<int32_t> dtables(in.block_tables), dkv(in.kv_lens), dcu(in.cu_q);
  if (!check_ok(dspine_cuda_paged_attention_f32(dq.get(), dk.get(), dv.get(), dout.get(), dtables.get(), dkv.get(),
                                                dcu.get(), num_q, in.max_q_len, &in.args, test_stream()),
                "cuda paged_attention"))
    return;
  check_close("out", dout.to_host(), attention_naive(c, in), 2e-5, 1e-4);
}

struct DeviceWalk {
  DeviceArray<float> logits, g, pred, succ, temperature, uniforms, cand_probs;
  DeviceArray<int64_t> anchor, tokens, cand_ids;
  DeviceWalk(const WalkCase& c, const WalkInputs& in)
      : logits(in.logits), g(in.g), pred(in.pred), succ(in.succ), temperature(in.temperature),
        uniforms(in.uniforms), cand_probs(poisoned(c.batch * c.positions * c.top_k)), anchor(in.anchor),
        tokens(std::vector<int64_t>(c.batch * c.positions, -7)),
        cand_ids(std::vector<int64_t>(c.batch * c.positions * c.top_k, -7)) {}

  dspine_status run(const WalkCase& c, cudaStream_t stream) const {
    return dspine_cuda_transition_walk_f32(logits.get(), g.get(), pred.get(), succ.get(), anchor.get(),
                                           temperature.get(), uniforms.get(), tokens.get(), cand_ids.get(),
                                           cand_probs.get(), c.batch, c.positions, c.vocab, c.rank, c.top_k, stream);
  }

  void check_against(const WalkOutputs& want) const {
    check_equal("cand_ids", cand_ids.to_host(), want.cand_ids);
    check_equal("tokens", tokens.to_host(), want.tokens);
    check_close("cand_probs", cand_probs.to_host(), want.cand_probs, 1e-6, 1e-5);
  }
};

void walk_case(const WalkCase& c, uint64_t seed) {
  Case scope(str("cuda ", c.describe(), " seed=", seed));
  WalkInputs in = make_walk_inputs(c, seed);
  const WalkOutputs want = walk_naive(c, in);
  const DeviceWalk dev(c, in);
  if (check_ok(dev.run(c, test_stream()), "cuda transition_walk")) dev.check_against(want);
}

// The walk (stream-ordered scratch, counter memset, launch) captured in a CUDA graph and replayed.
void walk_in_graph(const WalkCase& c, uint64_t seed) {
  Case scope(str("cuda graph ", c.describe(), " seed=", seed));
  WalkInputs in = make_walk_inputs(c, seed);
  const WalkOutputs want = walk_naive(c, in);
  const DeviceWalk dev(c, in);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_or_die(cudaStreamBeginCapture(test_stream(), cudaStreamCaptureModeThreadLocal), "begin capture");
  const dspine_status status = dev.run(c, test_stream());
  cuda_or_die(cudaStreamEndCapture(test_stream(), &graph), "end capture");
  if (!check_ok(status, "cuda transition_walk under capture")) return;
  cuda_or_die(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int replay = 0; replay < 2; ++replay) cuda_or_die(cudaGraphLaunch(exec, test_stream()), "graph launch");
  dev.check_against(want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

void verify_case(const VerifyCase& c, uint64_t seed) {
  Case scope(str("cuda ", c.describe(), " seed=", seed));
  VerifyInputs in = make_verify_inputs(c, seed);
  const VerifyOutputs want = verify_naive(c, in);
  DeviceArray<float> logits(in.logits), cand_probs(in.cand_probs), temperature(in.temperature), top_p(in.top_p),
      uniforms(in.uniforms);
  DeviceArray<int64_t> drafts(in.draft_tokens), cand_ids(in.cand_ids), out(std::vector<int64_t>(c.batch * c.block, -7));
  DeviceArray<int32_t> top_k(in.top_k), accept(std::vector<int32_t>(c.batch, -7));
  if (!check_ok(dspine_cuda_block_verify_f32(logits.get(), drafts.get(), cand_ids.get(), cand_probs.get(),
                                             temperature.get(), top_k.get(), top_p.get(), uniforms.get(),
                                             accept.get(), out.get(), c.batch, c.block, c.vocab, c.cand,
                                             test_stream()),
                "cuda block_verify"))
    return;
  check_equal("accept_len", accept.to_host(), want.accept_len);
  check_equal("out_tokens", out.to_host(), want.out_tokens);
}

// ---- groups -------------------------------------------------------------------------------------

void test_cuda_elementwise() {
  Rng rng(11);
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {17, 64}, {5, 129}, {9, 4096}})
    norm_case(rng, rows, dim);
  rope_and_write_kv_case(rng, 1, 1, 2, 0);
  rope_and_write_kv_case(rng, 13, 4, 64, 5);
  rope_and_write_kv_case(rng, 9, 5, 34, 0);
  rope_and_write_kv_case(rng, 33, 8, 128, 0);
  injection_case(rng, 1, 1, 5);
  injection_case(rng, 3, 16, 37);
  injection_case(rng, 2, 16, 1024);
}

void test_cuda_attention() {
  uint64_t seed = 100;
  for (const auto& c : named_attention_cases()) attention_case(c, ++seed);
  for (const auto& c : random_attention_cases(60, 12345)) attention_case(c, ++seed);
}

void test_cuda_transition_walk() {
  uint64_t seed = 200;
  for (const auto& c : walk_cases()) walk_case(c, ++seed);
  walk_in_graph({4, 15, 50, 8, 8, false}, ++seed);
}

void test_cuda_block_verify() {
  uint64_t seed = 300;
  for (const auto& c : verify_cases()) verify_case(c, ++seed);
}

void test_cuda_errors() {
  const float* none = nullptr;
  std::vector<float> host(4, 1.f);
  DeviceArray<float> x(host);
  Case scope("cuda errors");
  check_status(dspine_cuda_rms_norm_f32(x.get(), none, x.get(), 1, 4, 1e-6f, test_stream()),
               DSPINE_INVALID_ARGUMENT, "cuda rms_norm weight NULL");
  check_status(dspine_cuda_transition_walk_f32(x.get(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, 1, 1, 100, 0, 33, test_stream()),
               DSPINE_INVALID_ARGUMENT, "cuda transition_walk top_k 33");
  check(std::string(dspine_last_error()).find("top_k must be <= 32") != std::string::npos,
        str("top_k limit message: ", dspine_last_error()));
}

}  // namespace
}  // namespace dspine_test

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;  // SKIP_RETURN_CODE in tests/cpp/CMakeLists.txt
  }
  using namespace dspine_test;
  return run_test_groups(argc, argv, {{"elementwise", test_cuda_elementwise},
                                      {"attention", test_cuda_attention},
                                      {"transition_walk", test_cuda_transition_walk},
                                      {"block_verify", test_cuda_block_verify},
                                      {"errors", test_cuda_errors}});
}
