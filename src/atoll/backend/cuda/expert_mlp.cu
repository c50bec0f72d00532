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

// Element i of a buffer of `dtype` (fp32 or bf16 bits).
const void* at(const void* p, size_t i, Dtype dtype) {
  return static_cast<const char*>(p) + i * (dtype == Dtype::kBF16 ? sizeof(uint16_t) : sizeof(float));
}

// A product's input in `dtype`: `x` itself in fp32, else its bf16 rounding into `x16`.
const void* product_input(uint16_t* x16, const float* x, size_t n, Dtype dtype, cudaStream_t st) {
  if (dtype == Dtype::kF32) return x;
  f32_to_bf16(x16, x, n, st);
  return x16;
}

}  // namespace

void expert_mlp_forward(Blas& blas, float* out, float* a, float* b, const ExpertScratch& s, const float* x,
                        const DeviceRouting& routing, const int32_t* offsets, const float* topk_w, const void* w1,
                        const void* w3, const void* w2, int N, int E, int C, int H, int K, Dtype dt) {
  const size_t WH = size_t(H) * C, R = size_t(N) * K;
  cudaStream_t st = blas.stream();
  dispatch_forward(s.xe, x, routing, N, C, K, st);
  const void* xe = product_input(s.xe16, s.xe, R * C, dt, st);
  for_experts(offsets, E, [&](int e, size_t r0, int n) {
    linear_forward(blas, a + r0 * H, at(xe, r0 * C, dt), at(w1, e * WH, dt), n, C, H, dt);  // a = x W1ᵀ
    linear_forward(blas, b + r0 * H, at(xe, r0 * C, dt), at(w3, e * WH, dt), n, C, H, dt);  // b = x W3ᵀ
  });
  swiglu_forward(s.g, a, b, R * H, st);
  const void* g = product_input(s.g16, s.g, R * H, dt, st);
  for_experts(offsets, E, [&](int e, size_t r0, int n) {
    linear_forward(blas, s.ye + r0 * C, at(g, r0 * H, dt), at(w2, e * WH, dt), n, H, C, dt);  // y = g W2ᵀ
  });
  combine_forward(out, s.ye, topk_w, routing, N, C, K, st);
}

void expert_mlp_backward(Blas& blas, float* dx, float* dw1, float* dw3, float* dw2, float* dtopk_w,
                         const ExpertScratch& s, const float* dout, const float* x, const DeviceRouting& routing,
                         const int32_t* offsets, const float* topk_w, const float* a, const float* b, const void* w1,
                         const void* w3, const void* w2, int N, int E, int C, int H, int K, Dtype dt) {
  const size_t WH = size_t(H) * C, R = size_t(N) * K;
  cudaStream_t st = blas.stream();
  dispatch_forward(s.xe, x, routing, N, C, K, st);
  const void* xe = product_input(s.xe16, s.xe, R * C, dt, st);
  swiglu_forward(s.g, a, b, R * H, st);
  const void* g = product_input(s.g16, s.g, R * H, dt, st);
  for_experts(offsets, E, [&](int e, size_t r0, int n) {  // ye, recomputed exactly as in forward
    linear_forward(blas, s.ye + r0 * C, at(g, r0 * H, dt), at(w2, e * WH, dt), n, H, C, dt);
  });
  combine_backward(s.dye, dtopk_w, dout, s.ye, topk_w, routing, N, C, K, st);  // dye = w dout; dw = dout · ye
  const void* dye = product_input(s.dye16, s.dye, R * C, dt, st);
  // The linear backward accumulates (+=) into d(inputs): start the row gradients at zero.
  ATOLL_CUDA_CHECK(cudaMemsetAsync(s.dg, 0, sizeof(float) * R * H, st));
  for_experts(offsets, E, [&](int e, size_t r0, int n) {  // dg = dye W2, dW2 += dyeᵀ g
    linear_backward(blas, s.dg + r0 * H, dw2 + e * WH, at(dye, r0 * C, dt), at(g, r0 * H, dt), at(w2, e * WH, dt), n,
                    H, C, dt);
  });
  float* da = s.dg;  // in place: d(gate) becomes d(W1 x)
  swiglu_backward(da, s.db, s.dg, a, b, R * H, st);
  const void* da_in = product_input(s.da16, da, R * H, dt, st);
  const void* db_in = product_input(s.db16, s.db, R * H, dt, st);
  float* dxe = s.ye;  // the expert outputs are dead from here
  ATOLL_CUDA_CHECK(cudaMemsetAsync(dxe, 0, sizeof(float) * R * C, st));
  for_experts(offsets, E, [&](int e, size_t r0, int n) {  // dxe = da W1 + db W3; dW1 += daᵀ x, dW3 += dbᵀ x
    linear_backward(blas, dxe + r0 * C, dw1 + e * WH, at(da_in, r0 * H, dt), at(xe, r0 * C, dt), at(w1, e * WH, dt),
                    n, C, H, dt);
    linear_backward(blas, dxe + r0 * C, dw3 + e * WH, at(db_in, r0 * H, dt), at(xe, r0 * C, dt), at(w3, e * WH, dt),
                    n, C, H, dt);
  });
  dispatch_backward(dx, dxe, routing, N, C, K, st);  // dx[token] += its rows' d(inputs)
}

}  // namespace atl::gpu
