// layers/linear.h with bf16 products (gemm_bf16.h): inputs, output gradients and weights in
// bf16, outputs and gradients fp32. Same shapes and (=)/(+=) contract as the fp32 layer.
#pragma once

#include "atoll/backend/cpu/gemm_bf16.h"

namespace atl {

// out[N,OC] (=) in[N,IC] · w[OC,IC]ᵀ.
inline void linear_forward_bf16(float* out, const bf16* in, const bf16* w, int N, int IC, int OC) {
  gemm_bf16(false, true, N, OC, IC, 1.0f, in, IC, w, IC, 0.0f, out, OC);
}

// din[N,IC] (+=) dout · w; dw[OC,IC] (+=) doutᵀ · in. Either output may be null (skipped).
inline void linear_backward_bf16(float* din, float* dw, const bf16* dout, const bf16* in, const bf16* w, int N, int IC,
                                 int OC) {
  if (din) gemm_bf16(false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, din, IC);
  if (dw) gemm_bf16(true, false, OC, IC, N, 1.0f, dout, OC, in, IC, 1.0f, dw, IC);
}

}  // namespace atl
