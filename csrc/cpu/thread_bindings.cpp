// The kernels' thread count (common.h kernel_threads): ops.set_cpu_threads / ops.cpu_threads.
// CPU-only settings with their own schema fragment, as quant_bindings.cpp's quant_isa.
#include <torch/all.h>

#include "common.h"

namespace dspine {
namespace cpu {

// n > 0 fixes the kernels' threads; 0 makes them follow torch.set_num_threads again.
void set_cpu_threads(int64_t n) {
  TORCH_CHECK(n >= 0 && n <= kMaxKernelThreads, "set_cpu_threads: n must be 0 (follow torch) or 1..",
              kMaxKernelThreads, ", got ", n);
  kernel_threads().store(static_cast<int>(n));
}

// The count set (0 = following torch).
int64_t cpu_threads() { return kernel_threads().load(); }

}  // namespace cpu
}  // namespace dspine

TORCH_LIBRARY_FRAGMENT(dspine, m) {
  m.def("set_cpu_threads(int n) -> ()", &dspine::cpu::set_cpu_threads);
  m.def("cpu_threads() -> int", &dspine::cpu::cpu_threads);
}
