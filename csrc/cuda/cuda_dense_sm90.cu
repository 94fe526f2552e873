// The Hopper (sm_90a) dense GEMM (dense_sm90.cuh): its instantiations, tensor maps, launch and
// the check that its image runs on the current device. Includes CuTe (setup.py adds the CUTLASS
// include path and -DDSPINE_WITH_SM90 when it finds the headers); torch-free.
#if defined(DSPINE_WITH_SM90)

#include "sm90_host.h"  // first: before CUTLASS (sm90_host.h says why)

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "dense_sm90.cuh"
#include "dense_sm90.h"

namespace dspine {
namespace gpu {

namespace {
std::atomic<int64_t> g_dense_sm90_launches{0};

// A row-major [rows, k] matrix (rows `stride` elements apart) as a 2-D tensor map, boxes of
// box_rows x 64 k in the 128-byte swizzle; coordinates past either end read as zeros.
template <typename T>
bool encode_rows_map(CUtensorMap* map, const void* data, int64_t rows, int64_t k, int64_t stride, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride) * sizeof(T)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  return encode_swizzled_map<T>(map, 2, data, dims, strides, box);
}

// One workspace per device and stream (launches on one stream are ordered, so they may share
// it; two streams may not): 2 G partial slots of 128 rows x 128 columns (fp32) and G flags, G =
// the SM count. Allocated at the first launch on the stream and never freed; the flags start at 0
// (set on a private stream, outside any capture, so a first launch inside a CUDA graph's capture
// finds them ready too) and every launch leaves them at 0.
DenseSm90Workspace workspace_for(cudaStream_t stream, int num_sms) {
  static std::mutex lock;
  static std::map<std::pair<int, cudaStream_t>, DenseSm90Workspace> spaces;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return {nullptr, nullptr};
  const std::lock_guard<std::mutex> guard(lock);
  const auto key = std::make_pair(device, stream);
  const auto found = spaces.find(key);
  if (found != spaces.end()) return found->second;
  const size_t partial_bytes = static_cast<size_t>(num_sms) * 2 * kSlotFloats * sizeof(float);
  const size_t bytes = partial_bytes + static_cast<size_t>(num_sms) * sizeof(int);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // allocation is legal during a capture
  cudaThreadExchangeStreamCaptureMode(&mode);
  void* base = nullptr;
  cudaStream_t init = nullptr;
  bool ok = cudaMalloc(&base, bytes) == cudaSuccess &&
            cudaStreamCreateWithFlags(&init, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMemsetAsync(static_cast<char*>(base) + partial_bytes, 0, bytes - partial_bytes, init) == cudaSuccess &&
            cudaStreamSynchronize(init) == cudaSuccess;
  if (init != nullptr) cudaStreamDestroy(init);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (!ok) {
    if (base != nullptr) cudaFree(base);
    cudaGetLastError();  // the caller reports the failure (launch_dense_sm90 returns false)
    return {nullptr, nullptr};
  }
  DenseSm90Workspace w{static_cast<float*>(base), reinterpret_cast<int*>(static_cast<char*>(base) + partial_bytes)};
  spaces.emplace(key, w);
  return w;
}

// One launch: up to 128 rows of x (p.x, p.y already at the launch's first row).
template <typename T, int BN, int RT, int WG, bool WIDE>
bool launch_rows(const DenseParams& p, const DenseSm90Plan& plan, const DenseSm90Workspace& work,
                 cudaStream_t stream) {
  using C = DenseSm90Tile<T, BN, RT, WG, WIDE>;
  DenseSm90Maps maps{};
  if (!encode_rows_map<T>(&maps.w, p.w, p.n, p.k, p.k, BN) ||
      !encode_rows_map<T>(&maps.x, p.x, p.m, p.k, p.x_stride, C::kGroupRows))
    return false;
  constexpr auto kernel = dense_sm90_kernel<T, BN, RT, WG, WIDE>;
  allow_max_dynamic_smem<kernel>();
  // Cooperative: all CTAs resident, so an owner's wait always ends (launch.cuh: or chained).
  launch_kernel(kernel, Launch(plan.ctas, C::kThreads, C::kSmemBytes, stream, /*cooperative=*/true), p, maps, plan,
                work);  // a launch error is the caller's launch check
  return true;
}

// launch_rows in the wide or the narrow wgmma form, as the knob says.
template <typename T, int BN, int RT, int WG>
bool launch_rows_as(bool wide, const DenseParams& p, const DenseSm90Plan& plan, const DenseSm90Workspace& work,
                    cudaStream_t stream) {
  return wide ? launch_rows<T, BN, RT, WG, true>(p, plan, work, stream)
              : launch_rows<T, BN, RT, WG, false>(p, plan, work, stream);
}

template <typename T, int BN>
bool launch_cols(const DenseParams& p, const DenseSm90Plan& plan, const DenseSm90Workspace& work, bool wide,
                 cudaStream_t stream) {
  // Row tiles: the fewest of 16, 32, 64 rows (one warpgroup) or 128 (two) that hold the launch's
  // rows; 16 rows are one m64n16k16 either way.
  if (p.m <= 16) return launch_rows<T, BN, 1, 1, false>(p, plan, work, stream);
  if (p.m <= 32) return launch_rows_as<T, BN, 2, 1>(wide, p, plan, work, stream);
  if (p.m <= 64) return launch_rows_as<T, BN, 4, 1>(wide, p, plan, work, stream);
  return launch_rows_as<T, BN, 4, 2>(wide, p, plan, work, stream);
}
}  // namespace

// The sm_90a image must be what this device runs (sm90_host.h), and the driver must encode maps.
template <typename T>
bool dense_sm90_runnable() {
  static std::atomic<int> cached[64];
  return tensor_map_encoder() != nullptr &&
         sm90_images_run(cached, {reinterpret_cast<const void*>(dense_sm90_kernel<T, 64, 1, 1, false>)});
}

template <typename T>
bool launch_dense_sm90(const DenseParams& p, int num_sms, const DenseSm90Knobs& knobs, cudaStream_t stream) {
  const DenseSm90Plan plan = dense_sm90_plan(p.n, p.k, num_sms, knobs.block_n, knobs.ctas);
  const DenseSm90Workspace work = workspace_for(stream, num_sms);
  if (work.partials == nullptr) return false;
  // 128 rows a launch, in order on the stream (they share the workspace).
  for (int row0 = 0; row0 < p.m; row0 += kDenseSm90MaxRows) {
    DenseParams part = p;
    part.m = p.m - row0 < kDenseSm90MaxRows ? p.m - row0 : kDenseSm90MaxRows;
    part.x = static_cast<const T*>(p.x) + static_cast<int64_t>(row0) * p.x_stride;
    part.y = static_cast<T*>(p.y) + static_cast<int64_t>(row0) * p.n;
    const bool launched = plan.block_n == 128 ? launch_cols<T, 128>(part, plan, work, knobs.wide, stream)
                                              : launch_cols<T, 64>(part, plan, work, knobs.wide, stream);
    if (!launched) return false;
    g_dense_sm90_launches.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

int64_t dense_sm90_launches() { return g_dense_sm90_launches.load(std::memory_order_relaxed); }

template bool dense_sm90_runnable<__nv_bfloat16>();
template bool dense_sm90_runnable<__half>();
template bool launch_dense_sm90<__nv_bfloat16>(const DenseParams&, int, const DenseSm90Knobs&, cudaStream_t);
template bool launch_dense_sm90<__half>(const DenseParams&, int, const DenseSm90Knobs&, cudaStream_t);

}  // namespace gpu
}  // namespace dspine

#endif  // DSPINE_WITH_SM90
