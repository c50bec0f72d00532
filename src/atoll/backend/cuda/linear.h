// Linear map without bias on the device; semantics of layers/linear.h (weights [out, in],
// out = in · wᵀ), as products through the BLAS wrapper (fp32 accumulation). `in` names the
// element type of the inputs and the weight: bf16 takes both as raw bf16 bits (the rounded
// copies of the bf16 product mode). Device pointers.
#pragma once

#include "atoll/backend/cuda/blas.h"

namespace atl::gpu {

// out[N,OC] (=) in[N,IC] · w[OC,IC]ᵀ.
void linear_forward(Blas& blas, float* out, const void* in, const void* w, int N, int IC, int OC,
                    Dtype dtype = Dtype::kF32);

// din[N,IC] (+=) dout · w; dw[OC,IC] (+=) doutᵀ · in. Either output may be null (skipped).
// dout, in and w are all of `dtype`.
void linear_backward(Blas& blas, float* din, float* dw, const void* dout, const void* in, const void* w, int N, int IC,
                     int OC, Dtype dtype = Dtype::kF32);

}  // namespace atl::gpu
