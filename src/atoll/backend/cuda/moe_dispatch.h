// MoE dispatch and combine on the device; semantics and row order of layers/moe_dispatch.h:
// the R = N*K (token, slot) pairs sorted by expert, tokens ascending within an expert, so each
// expert owns one contiguous block of rows. A slot of expert id kNoExpert (-1, the zaya router's
// skip class) sorts after every expert's rows and gets slot_row -1: no expert computes it, it
// adds 0 to its token and gets no gradient. Device pointers.
#pragma once

#include <cstdint>

#include "atoll/backend/cuda/vendor.h"

namespace atl::gpu {

// ExpertRouting's three arrays, in device memory owned by the caller.
struct DeviceRouting {
  int32_t* offsets = nullptr;    // [E+1] first row of each expert; offsets[E] = R less the skipped slots
  int32_t* row_token = nullptr;  // [R] token of each row
  int32_t* slot_row = nullptr;   // [R] row of (token n, slot j) at n*K + j; -1 for a skipped slot
};

// Builds the routing from topk_idx[N,K] (expert ids in [0, E) or kNoExpert: not checked;
// check_ids in arena.h does with one synchronisation). A stable sort of the slots by expert id (sort.h);
// scratch: routing_scratch_ints(N, K) int32.
void build_routing(const DeviceRouting& routing, const int32_t* topk_idx, int N, int E, int K, int32_t* scratch,
                   cudaStream_t stream = nullptr);
int64_t routing_scratch_ints(int N, int K);

// xe[R,C] (=) x[row_token[r]].
void dispatch_forward(float* xe, const float* x, const DeviceRouting& routing, int N, int C, int K,
                      cudaStream_t stream = nullptr);

// dx[N,C] (+=) the K rows of dxe[R,C] of each token, slots in order (bit-identical to the CPU).
void dispatch_backward(float* dx, const float* dxe, const DeviceRouting& routing, int N, int C, int K,
                       cudaStream_t stream = nullptr);

// out[N,C] (=) Σ_j topk_w[n,j] * ye[row of (n, j)], slots in order.
void combine_forward(float* out, const float* ye, const float* topk_w, const DeviceRouting& routing, int N, int C,
                     int K, cudaStream_t stream = nullptr);

// dye[R,C] (=) w * dout; dtopk_w[N,K] (=) dout · ye (block reduction per slot).
void combine_backward(float* dye, float* dtopk_w, const float* dout, const float* ye, const float* topk_w,
                      const DeviceRouting& routing, int N, int C, int K, cudaStream_t stream = nullptr);

}  // namespace atl::gpu
