#include "atoll/backend/cuda/expert_mlp.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/swiglu.h"

namespace atl::gpu {
namespace {

// Calls f(e, r0, n) for each expert with rows: rows [r0, r0 + n) of the routing.
template <typename F>
void for_experts(const int32_t* offsets, int E, F&& f) {
  for (int e = 0; e < E; ++e)
    if (offsets[e + 1] > offsets[e]) f(e, offsets[e], offsets[e + 1] - offsets[e]);
}

}  // namespace

void expert_mlp_forward(Blas& blas, float* out, float* a, float* b, const ExpertScratch& s, const float* x,
                        const DeviceRouting& routing, const int32_t* offsets, const float* topk_w, const float* w1,
                        const float* w3, const float* w2, int N, int E, int C, int H, int K) {
  const size_t WH = size_t(H) * C, R = size_t(N) * K;
  cudaStream_t st = blas.stream();
  dispatch_forward(s.xe, x, routing, N, C, K, st);
  for_experts(offsets, E, [&](int e, size_t r0, int n) {
    linear_forward(blas, a + r0 * H, s.xe + r0 * C, w1 + e * WH, n, C, H);  // a = x W1ᵀ
    linear_forward(blas, b + r0 * H, s.xe + r0 * C, w3 + e * WH, n, C, H);  // b = x W3ᵀ
  });
  swiglu_forward(s.g, a, b, R * H, st);
  for_experts(offsets, E, [&](int e, size_t r0, int n) {
    linear_forward(blas, s.ye + r0 * C, s.g + r0 * H, w2 + e * WH, n, H, C);  // y = g W2ᵀ
  });
  combine_forward(out, s.ye, topk_w, routing, N, C, K, st);
}

void expert_mlp_backward(Blas& blas, float* dx, float* dw1, float* dw3, float* dw2, float* dtopk_w,
                         const ExpertScratch& s, const float* dout, const float* x, const DeviceRouting& routing,
                         const int32_t* offsets, const float* topk_w, const float* a, const float* b, const float* w1,
                         const float* w3, const float* w2, int N, int E, int C, int H, int K) {
  const size_t WH = size_t(H) * C, R = size_t(N) * K;
  cudaStream_t st = blas.stream();
  dispatch_forward(s.xe, x, routing, N, C, K, st);
  swiglu_forward(s.g, a, b, R * H, st);
  for_experts(offsets, E, [&](int e, size_t r0, int n) {
    linear_forward(blas, s.ye + r0 * C, s.g + r0 * H, w2 + e * WH, n, H, C);  // ye, recomputed
  });
  combine_backward(s.dye, dtopk_w, dout, s.ye, topk_w, routing, N, C, K, st);  // dye = w dout; dw = dout · ye
  // The linear backward accumulates (+=) into d(inputs): start the row gradients at zero.
  ATOLL_CUDA_CHECK(cudaMemsetAsync(s.dg, 0, sizeof(float) * R * H, st));
  for_experts(offsets, E, [&](int e, size_t r0, int n) {  // dg = dye W2, dW2 += dyeᵀ g
    linear_backward(blas, s.dg + r0 * H, dw2 + e * WH, s.dye + r0 * C, s.g + r0 * H, w2 + e * WH, n, H, C);
  });
  float* da = s.dg;  // in place: d(gate) becomes d(W1 x)
  swiglu_backward(da, s.db, s.dg, a, b, R * H, st);
  float* dxe = s.ye;  // the expert outputs are dead from here
  ATOLL_CUDA_CHECK(cudaMemsetAsync(dxe, 0, sizeof(float) * R * C, st));
  for_experts(offsets, E, [&](int e, size_t r0, int n) {  // dxe = da W1 + db W3; dW1 += daᵀ x, dW3 += dbᵀ x
    linear_backward(blas, dxe + r0 * C, dw1 + e * WH, da + r0 * H, s.xe + r0 * C, w1 + e * WH, n, C, H);
    linear_backward(blas, dxe + r0 * C, dw3 + e * WH, s.db + r0 * H, s.xe + r0 * C, w3 + e * WH, n, C, H);
  });
  dispatch_backward(dx, dxe, routing, N, C, K, st);  // dx[token] += its rows' d(inputs)
}

}  // namespace atl::gpu
