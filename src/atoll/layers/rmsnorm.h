// RMSNorm (Llama/Mixtral): out = x / sqrt(mean(x²) + eps) * weight.
#pragma once

namespace atl {

// out[N,C] (=), rstd[N] (=) 1/sqrt(mean(x²)+eps) kept for backward.
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* weight, int N, int C, double eps);

// din[N,C] (+=, the residual stream's gradient), dweight[C] (+=).
// With xh = x*rstd and g = dout*weight: din += rstd * (g - xh * mean(g*xh)).
template <typename T>
void rmsnorm_backward(T* din, T* dweight, const T* dout, const T* in, const T* rstd, const T* weight, int N, int C);

}  // namespace atl
