// The instruction set the CPU kernels run with, shared by every kernel that has SIMD versions
// (quant_gemm.cpp, attention_avx512.h). The library is built once and must run on CPUs without
// AVX-512, so kernels are chosen at run time: the best level the CPU has, unless DSPINE_CPU_ISA
// (scalar, avx2, avx512) asks for a lower one. It is read at every call so that tests can run
// every level in one process; a process that does not change it gets one level throughout,
// which is what keeps a row's result independent of the call it is computed in.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>

// GCC 12 flags its own AVX-512 intrinsics (an undefined placeholder operand): the headers of
// AVX-512 kernels open with DSPINE_AVX512_QUIET_BEGIN and close with DSPINE_AVX512_QUIET_END.
#if defined(__GNUC__) && !defined(__clang__)
#define DSPINE_AVX512_QUIET_BEGIN                          \
  _Pragma("GCC diagnostic push")                           \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")    \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DSPINE_AVX512_QUIET_END _Pragma("GCC diagnostic pop")
#else
#define DSPINE_AVX512_QUIET_BEGIN
#define DSPINE_AVX512_QUIET_END
#endif

namespace dspine {
namespace cpu {

// Levels in increasing order; kAvx512Vnni is AVX-512 F/BW/VL with VNNI.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2 };

// Every feature named in a kernel's target attribute must be present (the AVX-512 kernels are
// compiled with AVX2/FMA/F16C too, and the AVX2 kernels convert fp16 scales with F16C), or the
// kernel could meet an instruction the CPU lacks. __builtin_cpu_supports also checks that the
// OS saves the wider registers.
inline Isa detect_isa() {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
    return Isa::kAvx512Vnni;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

inline Isa best_isa() {
  static const Isa best = detect_isa();
  return best;
}

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

inline bool isa_from_name(const char* name, Isa* isa) {
  for (Isa candidate : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni})
    if (std::strcmp(name, isa_name(candidate)) == 0) {
      *isa = candidate;
      return true;
    }
  return false;
}

inline Isa active_isa() {
  const char* env = std::getenv("DSPINE_CPU_ISA");
  Isa asked;
  if (env == nullptr || !*env || !isa_from_name(env, &asked)) return best_isa();
  return std::min(asked, best_isa());
}

}  // namespace cpu
}  // namespace dspine
