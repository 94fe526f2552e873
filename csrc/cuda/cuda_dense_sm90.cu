// The Hopper (sm_90a) dense GEMM (dense_sm90.cuh): its instantiations, tensor maps, launch and
// the check that its image runs on the current device. Includes CuTe (setup.py adds the CUTLASS
// include path and -DDSPINE_WITH_SM90 when it finds the headers); torch-free.
#if defined(DSPINE_WITH_SM90)

#include "sm90_host.h"  // first: before CUTLASS (sm90_host.h says why)

#include <atomic>
#include <type_traits>

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

template <typename T, int BN, int RT, bool CLUSTER>
bool launch_tile(const DenseParams& p, int splits, cudaStream_t stream) {
  using C = DenseSm90Tile<T, BN, RT>;
  DenseSm90Maps maps{};
  if (!encode_rows_map<T>(&maps.w, p.w, p.n, p.k, p.k, BN) ||
      !encode_rows_map<T>(&maps.x, p.x, p.m, p.k, p.x_stride, C::kRows))
    return false;
  constexpr auto kernel = dense_sm90_kernel<T, BN, RT, CLUSTER>;
  allow_max_dynamic_smem<kernel>();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(splits), static_cast<unsigned>(ceil_div(p.n, BN)),
                        static_cast<unsigned>(ceil_div(p.m, C::kRows)));
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(splits);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = CLUSTER ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, p, maps);  // a launch error is the caller's launch check
  return true;
}

template <typename T, int BN, int RT>
bool launch_rows(const DenseParams& p, int splits, cudaStream_t stream) {
  return splits > 1 ? launch_tile<T, BN, RT, true>(p, splits, stream) : launch_tile<T, BN, RT, false>(p, splits, stream);
}

template <typename T, int BN>
bool launch_cols(const DenseParams& p, int splits, cudaStream_t stream) {
  // Row tiles: the fewest of 16, 32, 64 rows that hold m (64 past that, more row blocks).
  if (p.m <= 16) return launch_rows<T, BN, 1>(p, splits, stream);
  if (p.m <= 32) return launch_rows<T, BN, 2>(p, splits, stream);
  return launch_rows<T, BN, 4>(p, splits, stream);
}
}  // namespace

// The sm_90a image must be what this device runs (sm90_host.h), and the driver must encode maps.
template <typename T>
bool dense_sm90_runnable() {
  static std::atomic<int> cached[64];
  return tensor_map_encoder() != nullptr &&
         sm90_images_run(cached, {reinterpret_cast<const void*>(dense_sm90_kernel<T, 64, 1, false>)});
}

template <typename T>
bool launch_dense_sm90(const DenseParams& p, int num_sms, int forced_splits, cudaStream_t stream) {
  const DenseSm90Plan plan = dense_sm90_plan(p.n, p.k, num_sms, forced_splits);
  if (ceil_div(p.n, plan.block_n) > 65535 || ceil_div(p.m, 64) > 65535) return false;  // grid y / z
  const bool launched = plan.block_n == 128 ? launch_cols<T, 128>(p, plan.splits, stream)
                                            : launch_cols<T, 64>(p, plan.splits, stream);
  if (launched) g_dense_sm90_launches.fetch_add(1, std::memory_order_relaxed);
  return launched;
}

int64_t dense_sm90_launches() { return g_dense_sm90_launches.load(std::memory_order_relaxed); }

template bool dense_sm90_runnable<__nv_bfloat16>();
template bool dense_sm90_runnable<__half>();
template bool launch_dense_sm90<__nv_bfloat16>(const DenseParams&, int, int, cudaStream_t);
template bool launch_dense_sm90<__half>(const DenseParams&, int, int, cudaStream_t);

}  // namespace gpu
}  // namespace dspine

#endif  // DSPINE_WITH_SM90
