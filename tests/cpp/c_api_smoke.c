/* The public header compiles as C99 and links from C: a serving stack in C (or any language
 * with a C FFI) can use the library. */
#include <math.h>
#include <stdio.h>

#include "dspine_kernels.h"

int main(void) {
  const float x[4] = {1.f, -2.f, 3.f, -4.f};
  const float w[4] = {1.f, 1.f, 1.f, 1.f};
  float out[4] = {0};
  const dspine_status status = dspine_cpu_rms_norm_f32(x, w, out, 1, 4, 0.f);
  if (status != DSPINE_OK) {
    fprintf(stderr, "rms_norm failed: %s\n", dspine_last_error());
    return 1;
  }
  /* mean(x^2) = 7.5, so out = x / sqrt(7.5) */
  for (int i = 0; i < 4; ++i) {
    if (fabsf(out[i] - x[i] / sqrtf(7.5f)) > 1e-6f) {
      fprintf(stderr, "out[%d] = %g, want %g\n", i, out[i], x[i] / sqrtf(7.5f));
      return 1;
    }
  }
  printf("C API smoke test passed (dspine_kernels %s)\n", dspine_version());
  return 0;
}
