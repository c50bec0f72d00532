#include "atoll/layers/swiglu.h"

#include "atoll/layers/swiglu_kernel.h"

namespace atl {

template <typename T>
void swiglu_forward(T* out, const T* a, const T* b, size_t n) {
  swiglu_forward_kernel(out, a, b, n);
}

template <typename T>
void swiglu_backward(T* da, T* db, const T* dout, const T* a, const T* b, size_t n) {
  swiglu_backward_kernel(da, db, dout, a, b, n);
}

template void swiglu_forward<float>(float*, const float*, const float*, size_t);
template void swiglu_forward<double>(double*, const double*, const double*, size_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, size_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*, size_t);

}  // namespace atl
