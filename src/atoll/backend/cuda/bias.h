// A linear layer's bias on the device (ZAYA1's router MLP, model/router_zaya.cu): the add in
// forward and the column sums that are its gradient, as model/router_zaya.cc's add_bias and
// bias_grad. Device pointers.
#pragma once

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// out[N,OC] (+=) b[OC] on every row.
void add_bias(float* out, const float* b, int N, int OC, cudaStream_t stream = nullptr);

// db[OC] (+=) the column sums of dout[N,OC], in double: one block per column, a fixed tree, so
// the sums are the same run to run.
void bias_backward(float* db, const float* dout, int N, int OC, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
