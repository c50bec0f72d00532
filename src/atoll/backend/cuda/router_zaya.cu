#include "atoll/backend/cuda/router_zaya.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

__global__ void zaya_route_forward_kernel(float* probs, int32_t* choice, float* gate, int32_t* topk_idx,
                                          const float* logits, const float* biases, int N, int E1, int K) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int skip = E1 - 1;
  const float* x = logits + size_t(n) * E1;
  float* p = probs + size_t(n) * E1;
  float m = x[0];
  for (int e = 1; e < E1; ++e) m = fmaxf(m, x[e]);
  float sum = 0.f;
  for (int e = 0; e < E1; ++e) sum += (p[e] = expf(x[e] - m));
  for (int e = 0; e < E1; ++e) p[e] /= sum;
  // Top-K of the biased probabilities by repeated selection; strict > keeps the lower index.
  int32_t* c = choice + size_t(n) * K;
  for (int j = 0; j < K; ++j) {
    int best = -1;
    float best_v = 0.f;
    for (int e = 0; e < E1; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= c[i] == e;
      const float v = p[e] + biases[e];
      if (!taken && (best < 0 || v > best_v)) best = e, best_v = v;
    }
    c[j] = best;
    gate[size_t(n) * K + j] = best == skip ? 0.f : p[best];
    topk_idx[size_t(n) * K + j] = best == skip ? -1 : best;  // kNoExpert
  }
}

__global__ void zaya_route_backward_kernel(float* dlogits, const float* dgate, const float* probs,
                                           const int32_t* choice, int N, int E1, int K) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int skip = E1 - 1;
  const float* p = probs + size_t(n) * E1;
  const int32_t* c = choice + size_t(n) * K;
  const float* dg = dgate + size_t(n) * K;
  float* dl = dlogits + size_t(n) * E1;
  // d(gate_j)/d(p_e) = [e = c_j] (not the skip class); softmax: dl = p (dp − Σ p dp).
  double pdp = 0;
  for (int j = 0; j < K; ++j)
    if (c[j] != skip) pdp += double(p[c[j]]) * dg[j];
  for (int e = 0; e < E1; ++e) dl[e] = float(-double(p[e]) * pdp);
  for (int j = 0; j < K; ++j)
    if (c[j] != skip) dl[c[j]] += p[c[j]] * dg[j];
}

__global__ void zaya_depth_forward_kernel(float* s, const float* s_prev, const float* scale, size_t n, int R) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) s[i] += s_prev[i] * scale[i % R];
}

// Block per column r: the column sum of ds ⊙ s_prev, then that column of dprev.
__global__ void zaya_depth_backward_kernel(float* dscale, float* dprev, const float* ds, const float* s_prev,
                                           const float* scale, int N, int R) {
  __shared__ double buf[kBlock];
  const int r = blockIdx.x;
  double acc = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    const size_t k = size_t(n) * R + r;
    acc += double(ds[k]) * s_prev[k];
    dprev[k] = ds[k] * scale[r];
  }
  acc = block_sum(acc, buf);
  if (threadIdx.x == 0) dscale[r] += float(acc);
}

// Block per class e: its slots counted (integers: exact in any order), as a share of all_slots.
__global__ void zaya_class_loads_kernel(float* loads, const int32_t* choice, int64_t slots, double loss_scale,
                                        double all_slots) {
  __shared__ long long buf[kBlock];
  const int e = blockIdx.x;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) count += choice[i] == e;
  count = block_sum(count, buf);
  if (threadIdx.x == 0) loads[e] += float(loss_scale * double(count) / all_slots);
}

}  // namespace

void zaya_route_forward(float* probs, int32_t* choice, float* gate, int32_t* topk_idx, const float* logits,
                        const float* biases, int N, int E1, int K, cudaStream_t stream) {
  ATOLL_CHECK(K >= 1 && K <= E1) << "K " << K << " of " << E1 << " classes";
  if (N <= 0) return;
  zaya_route_forward_kernel<<<grid_for(N), kBlock, 0, stream>>>(probs, choice, gate, topk_idx, logits, biases, N, E1,
                                                                K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void zaya_route_backward(float* dlogits, const float* dgate, const float* probs, const int32_t* choice, int N, int E1,
                         int K, cudaStream_t stream) {
  if (N <= 0) return;
  zaya_route_backward_kernel<<<grid_for(N), kBlock, 0, stream>>>(dlogits, dgate, probs, choice, N, E1, K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void zaya_depth_forward(float* s, const float* s_prev, const float* scale, int N, int R, cudaStream_t stream) {
  const size_t n = size_t(N) * R;
  if (n == 0) return;
  zaya_depth_forward_kernel<<<grid_for(n), kBlock, 0, stream>>>(s, s_prev, scale, n, R);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void zaya_depth_backward(float* dscale, float* dprev, const float* ds, const float* s_prev, const float* scale, int N,
                         int R, cudaStream_t stream) {
  if (R <= 0) return;
  zaya_depth_backward_kernel<<<R, kBlock, 0, stream>>>(dscale, dprev, ds, s_prev, scale, N, R);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void zaya_class_loads(float* loads, const int32_t* choice, int N, int E1, int K, double loss_scale, double tokens,
                      cudaStream_t stream) {
  const int64_t slots = int64_t(N) * K;
  if (slots <= 0) return;
  zaya_class_loads_kernel<<<E1, kBlock, 0, stream>>>(loads, choice, slots, loss_scale, tokens * K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
