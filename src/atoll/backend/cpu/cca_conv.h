// layers/cca.h's two causal convolutions over [q|k] (cca_conv_forward/_backward) on the fast
// products of gemm.h: what the CCA part runs. Same shapes, padding and (=)/(+=) contract as the
// reference, which it is tested against (tests/backend/cca_conv_test.cc).
//
// The grouped convolution is HD-wide products: for each sequence, head g and tap j,
//   z_g[T,HD] += y_g[j .. j+T-1, HD] · W_gjᵀ,   W_gj[co,ci] = w1[g·HD+co, ci, j],
// read in place with a leading dimension of CC (W_gj repacked once per call); its backward is the
// same products transposed. The depthwise convolution and the biases are loops over channels
// with the channel innermost (vectorised), each sum in a fixed order.
#pragma once

#include "atoll/layers/cca.h"

namespace atl::cpu {

// y[B,TY,CC] (=), z[B,T,CC] (=) from x[B,T,CC]; w0[CC,t0], b0[CC], w1[CC,HD,t1], b1[CC].
template <typename T>
void cca_conv_forward(T* z, T* y, const T* x, const T* w0, const T* b0, const T* w1, const T* b1, const CcaDims& d);

// dx[B,T,CC] (+=), dw0, db0, dw1, db1 (+=) from dz[B,T,CC]; dy[B,TY,CC] is scratch (=).
template <typename T>
void cca_conv_backward(T* dx, T* dw0, T* db0, T* dw1, T* db1, T* dy, const T* dz, const T* y, const T* x,
                       const T* w0, const T* w1, const CcaDims& d);

}  // namespace atl::cpu
