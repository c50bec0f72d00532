// layers/linear.h on the fast products of gemm.h (fp32 through oneDNN's sgemm, fp64 through
// OpenBLAS): what the model runs. Same shapes and (=)/(+=) contract as the reference layer,
// which it is tested against (tests/backend/linear_test.cc).
#pragma once

namespace atl::cpu {

// out[N,OC] (=) in[N,IC] · w[OC,IC]ᵀ.
template <typename T>
void linear_forward(T* out, const T* in, const T* w, int N, int IC, int OC);

// din[N,IC] (+=) dout · w; dw[OC,IC] (+=) doutᵀ · in. Either output may be null (skipped).
template <typename T>
void linear_backward(T* din, T* dw, const T* dout, const T* in, const T* w, int N, int IC, int OC);

}  // namespace atl::cpu
