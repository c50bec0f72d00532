// Linear map without bias, weights [out, in] as in PyTorch: out = in · wᵀ.
#pragma once

namespace atl {

// out[N,OC] (=) in[N,IC] · w[OC,IC]ᵀ.
template <typename T>
void linear_forward(T* out, const T* in, const T* w, int N, int IC, int OC);

// din[N,IC] (+=) dout · w; dw[OC,IC] (+=) doutᵀ · in. Either output may be null (skipped).
template <typename T>
void linear_backward(T* din, T* dw, const T* dout, const T* in, const T* w, int N, int IC, int OC);

}  // namespace atl
