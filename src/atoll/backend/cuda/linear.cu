#include "atoll/backend/cuda/linear.h"

namespace atl::gpu {

void linear_forward(Blas& blas, float* out, const void* in, const void* w, int N, int IC, int OC, Dtype dtype) {
  blas.gemm(false, true, N, OC, IC, 1.0f, in, IC, w, IC, 0.0f, out, OC, dtype);
}

void linear_backward(Blas& blas, float* din, float* dw, const void* dout, const void* in, const void* w, int N, int IC,
                     int OC, Dtype dtype) {
  if (din) blas.gemm(false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, din, IC, dtype);
  if (dw) blas.gemm(true, false, OC, IC, N, 1.0f, dout, OC, in, IC, 1.0f, dw, IC, dtype);
}

}  // namespace atl::gpu
