#include "atoll/backend/cuda/router.h"

#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/common.cuh"
#include "atoll/core/check.h"

namespace atl::gpu {
namespace {

__global__ void router_forward_kernel(float* probs, float* lse, int32_t* topk_idx, float* topk_w, const float* logits,
                                      int N, int E, int K) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* x = logits + size_t(n) * E;
  float* p = probs + size_t(n) * E;
  float m = x[0];
  for (int e = 1; e < E; ++e) m = x[e] > m ? x[e] : m;
  float sum = 0.f;
  for (int e = 0; e < E; ++e) sum += (p[e] = expf(x[e] - m));
  for (int e = 0; e < E; ++e) p[e] /= sum;
  lse[n] = m + logf(sum);
  // Repeated selection; strict > keeps the lower index on ties (as the CPU).
  int32_t* idx = topk_idx + size_t(n) * K;
  float* w = topk_w + size_t(n) * K;
  float wsum = 0.f;
  for (int j = 0; j < K; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= idx[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    idx[j] = best;
    wsum += (w[j] = p[best]);
  }
  for (int j = 0; j < K; ++j) w[j] /= wsum;
}

// counts[e] = number of routed slots to expert e (integers: exact in any order).
__global__ void expert_counts_kernel(int32_t* counts, const int32_t* topk_idx, size_t R, int E) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < R && topk_idx[i] >= 0 && topk_idx[i] < E) atomicAdd(counts + topk_idx[i], 1);
}

// One thread per token. The CPU keeps dp[E] in a vector; here dp_e is formed twice on the fly
// (once for Σ p·dp, once per output) since a thread has no room for E doubles:
//   dp_e = aux_g f_e + Σ_{j: idx_j = e} (dw_j − Σ_l w_l dw_l) / S.
__global__ void router_backward_kernel(float* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                                       const int32_t* topk_idx, const float* topk_w, const int32_t* counts, int N,
                                       int E, int K, double aux_g, double z_g, double slots) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + size_t(n) * E;
  const int32_t* idx = topk_idx + size_t(n) * K;
  const float* w = topk_w + size_t(n) * K;
  const float* dw = dtopk_w + size_t(n) * K;
  double S = 0.0, wdw = 0.0;
  for (int j = 0; j < K; ++j) S += p[idx[j]], wdw += double(w[j]) * dw[j];
  auto dp = [&](int e) {
    double g = aux_g * (counts[e] / slots);  // f_e, formed as the CPU forms it
    for (int j = 0; j < K; ++j)
      if (idx[j] == e) g += (dw[j] - wdw) / S;
    return g;
  };
  double pdp = 0.0;
  for (int e = 0; e < E; ++e) pdp += p[e] * dp(e);
  float* dl = dlogits + size_t(n) * E;
  const double zl = z_g * lse[n];
  for (int e = 0; e < E; ++e) dl[e] = float(p[e] * (dp(e) - pdp) + zl * p[e]);
}

// Row slices of the loss sums: enough blocks to read probs at full speed, few enough that the
// final pass over them is short.
constexpr int kLossSlices = 64;

// Slice s of the rows: P[s][e] = Σ p_ne, cnt[s][e] = routed slots to e, zs[s] = Σ lse_n²,
// all in double, each thread's rows in order, then a fixed-shape block sum for z.
__global__ void router_loss_slices_kernel(double* P, double* cnt, double* zs, const float* probs, const float* lse,
                                          const int32_t* topk_idx, int N, int E, int K) {
  __shared__ double buf[kBlock];
  const int s = blockIdx.x, per = (N + kLossSlices - 1) / kLossSlices;
  const int n0 = min(N, s * per), n1 = min(N, n0 + per);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double p = 0.0, c = 0.0;
    for (int n = n0; n < n1; ++n) {
      p += probs[size_t(n) * E + e];
      for (int j = 0; j < K; ++j) c += topk_idx[size_t(n) * K + j] == e ? 1.0 : 0.0;
    }
    P[size_t(s) * E + e] = p;
    cnt[size_t(s) * E + e] = c;
  }
  double z = 0.0;
  for (int n = n0 + int(threadIdx.x); n < n1; n += blockDim.x) z += double(lse[n]) * lse[n];
  z = block_sum(z, buf);
  if (threadIdx.x == 0) zs[s] = z;
}

// One block: term_e = f_e P_e / N per expert (threads over e), then thread 0 adds the terms in
// expert order and the z slices in slice order, as layers/router.cc forms them.
__global__ void router_loss_total_kernel(double* out, const double* P, const double* cnt, const double* zs, int N,
                                         int E, int K, double aux_coef, double z_coef) {
  extern __shared__ double term[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double p = 0.0, c = 0.0;
    for (int s = 0; s < kLossSlices; ++s) p += P[size_t(s) * E + e], c += cnt[size_t(s) * E + e];
    term[e] = c / (double(N) * K) * p / N;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double fp = 0.0, z = 0.0;
  for (int e = 0; e < E; ++e) fp += term[e];
  for (int s = 0; s < kLossSlices; ++s) z += zs[s];
  out[0] = aux_coef * E * fp;
  out[1] = z_coef * z / N;
}

// One block: the slices added in slice order, per expert (threads over e) and for z (thread 0).
__global__ void router_sums_total_kernel(double* out, const double* P, const double* cnt, const double* zs, int E) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double p = 0.0, c = 0.0;
    for (int s = 0; s < kLossSlices; ++s) p += P[size_t(s) * E + e], c += cnt[size_t(s) * E + e];
    out[e] = c, out[E + e] = p;
  }
  if (threadIdx.x != 0) return;
  double z = 0.0;
  for (int s = 0; s < kLossSlices; ++s) z += zs[s];
  out[2 * E] = z;
}

}  // namespace

int64_t router_losses_scratch_doubles(int E) { return int64_t(kLossSlices) * (2 * int64_t(E) + 1); }

namespace {

// The slices of the loss sums (router_loss_slices_kernel) in scratch; false, with out[n_out]
// zeroed, when there are no tokens (no tokens, no loss: as the CPU).
struct LossSlices {
  double *P, *cnt, *zs;  // [kLossSlices, E] x2, [kLossSlices]
};
bool loss_slices(LossSlices* s, double* out, size_t n_out, const float* probs, const float* lse,
                 const int32_t* topk_idx, int N, int E, int K, double* scratch, cudaStream_t stream) {
  if (N <= 0) {
    ATOLL_CUDA_CHECK(cudaMemsetAsync(out, 0, n_out * sizeof(double), stream));
    return false;
  }
  s->P = scratch, s->cnt = s->P + size_t(kLossSlices) * E, s->zs = s->cnt + size_t(kLossSlices) * E;
  router_loss_slices_kernel<<<kLossSlices, kBlock, 0, stream>>>(s->P, s->cnt, s->zs, probs, lse, topk_idx, N, E, K);
  ATOLL_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

void router_losses(double* out, const float* probs, const float* lse, const int32_t* topk_idx, int N, int E, int K,
                   double aux_coef, double z_coef, double* scratch, cudaStream_t stream) {
  ATOLL_CHECK(E >= 1 && E <= 4096 && K >= 1 && K <= E) << "router losses E=" << E << " K=" << K;
  LossSlices s;
  if (!loss_slices(&s, out, 2, probs, lse, topk_idx, N, E, K, scratch, stream)) return;
  router_loss_total_kernel<<<1, kBlock, size_t(E) * sizeof(double), stream>>>(out, s.P, s.cnt, s.zs, N, E, K,
                                                                              aux_coef, z_coef);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void router_sums(double* out, const float* probs, const float* lse, const int32_t* topk_idx, int N, int E, int K,
                 double* scratch, cudaStream_t stream) {
  ATOLL_CHECK(E >= 1 && K >= 1 && K <= E) << "router sums E=" << E << " K=" << K;
  LossSlices s;
  if (!loss_slices(&s, out, 2 * size_t(E) + 1, probs, lse, topk_idx, N, E, K, scratch, stream)) return;
  router_sums_total_kernel<<<1, kBlock, 0, stream>>>(out, s.P, s.cnt, s.zs, E);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void router_forward(float* probs, float* lse, int32_t* topk_idx, float* topk_w, const float* logits, int N, int E,
                    int K, cudaStream_t stream) {
  ATOLL_CHECK(E >= 1 && K >= 1 && K <= E) << "router E=" << E << " K=" << K;
  if (N <= 0) return;
  router_forward_kernel<<<grid_for(N, 128), 128, 0, stream>>>(probs, lse, topk_idx, topk_w, logits, N, E, K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

void router_backward(float* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                     const int32_t* topk_idx, const float* topk_w, int N, int E, int K, double aux_coef, double z_coef,
                     double loss_scale, int32_t* scratch, cudaStream_t stream) {
  ATOLL_CHECK(E >= 1 && K >= 1 && K <= E) << "router E=" << E << " K=" << K;
  if (N <= 0) return;
  const size_t R = size_t(N) * K;
  ATOLL_CUDA_CHECK(cudaMemsetAsync(scratch, 0, sizeof(int32_t) * E, stream));
  expert_counts_kernel<<<grid_for(R), kBlock, 0, stream>>>(scratch, topk_idx, R, E);
  ATOLL_CUDA_CHECK_LAUNCH();
  router_backward_batch(dlogits, dtopk_w, probs, lse, topk_idx, topk_w, N, E, K, aux_coef, z_coef, loss_scale, scratch,
                        double(N), stream);
}

void router_backward_batch(float* dlogits, const float* dtopk_w, const float* probs, const float* lse,
                           const int32_t* topk_idx, const float* topk_w, int N, int E, int K, double aux_coef,
                           double z_coef, double loss_scale, const int32_t* batch_counts, double batch_tokens,
                           cudaStream_t stream) {
  ATOLL_CHECK(E >= 1 && K >= 1 && K <= E) << "router E=" << E << " K=" << K;
  if (N <= 0 || batch_tokens <= 0) return;
  const double Nb = batch_tokens;
  const double aux_g = loss_scale * aux_coef * E / Nb;  // d aux / d p_ni = coef * E * f_i / N
  const double z_g = loss_scale * z_coef * 2.0 / Nb;    // d z / d lse_n = 2 coef lse_n / N
  router_backward_kernel<<<grid_for(N, 128), 128, 0, stream>>>(dlogits, dtopk_w, probs, lse, topk_idx, topk_w,
                                                               batch_counts, N, E, K, aux_g, z_g, Nb * K);
  ATOLL_CUDA_CHECK_LAUNCH();
}

namespace {

// Block per expert e.
__global__ void router_choice_counts_kernel(double* counts, const int32_t* topk_idx, int64_t slots) {
  __shared__ long long buf[kBlock];
  const int e = blockIdx.x;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) count += topk_idx[i] == e;
  count = block_sum(count, buf);
  if (threadIdx.x == 0) counts[e] += double(count);
}

}  // namespace

void router_choice_counts(double* counts, const int32_t* topk_idx, int N, int E, int K, cudaStream_t stream) {
  const int64_t slots = int64_t(N) * K;
  if (slots <= 0 || E <= 0) return;
  router_choice_counts_kernel<<<E, kBlock, 0, stream>>>(counts, topk_idx, slots);
  ATOLL_CUDA_CHECK_LAUNCH();
}

}  // namespace atl::gpu
