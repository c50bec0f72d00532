#include "atoll/layers/linear.h"

#include "atoll/layers/blas.h"

namespace atl {

template <typename T>
void linear_forward(T* out, const T* in, const T* w, int N, int IC, int OC) {
  blas_gemm<T>(false, true, N, OC, IC, T(1), in, IC, w, IC, T(0), out, OC);
}

template <typename T>
void linear_backward(T* din, T* dw, const T* dout, const T* in, const T* w, int N, int IC, int OC) {
  if (din) blas_gemm<T>(false, false, N, IC, OC, T(1), dout, OC, w, IC, T(1), din, IC);
  if (dw) blas_gemm<T>(true, false, OC, IC, N, T(1), dout, OC, in, IC, T(1), dw, IC);
}

template void linear_forward<float>(float*, const float*, const float*, int, int, int);
template void linear_forward<double>(double*, const double*, const double*, int, int, int);
template void linear_backward<float>(float*, float*, const float*, const float*, const float*, int, int, int);
template void linear_backward<double>(double*, double*, const double*, const double*, const double*, int, int, int);

}  // namespace atl
