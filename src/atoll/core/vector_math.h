// Vector exp for the elementwise loops (SwiGLU, softmax, cross-entropy). glibc's libmvec has
// SIMD versions of expf and exp (AVX-512: 16 floats or 8 doubles per call; glibc documents at
// most 4 ulp of error), but <math.h> declares them only under -ffast-math. Without them every
// exp in a `#pragma omp simd` loop is a scalar call, which cost ~10% of a training step. The
// declarations here give those loops the vector versions without fast-math's other effects.
// Include this before any loop that should vectorize exp; elsewhere nothing changes.
#pragma once

#include <cmath>

#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__FAST_MATH__) && !defined(__CUDACC__) && !defined(__HIPCC__)
extern "C" {
float expf(float) noexcept __attribute__((__simd__("notinbranch")));
double exp(double) noexcept __attribute__((__simd__("notinbranch")));
}
#endif
