#include "atoll/layers/router.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace atl {
namespace {

// f_i: share of routed slots per expert (a count, so exact and order-independent).
std::vector<double> expert_fractions(const int32_t* topk_idx, int N, int E, int K) {
  std::vector<double> f(E, 0.0);
  for (size_t i = 0; i < size_t(N) * K; ++i) f[topk_idx[i]] += 1.0;
  for (auto& x : f) x /= double(N) * K;
  return f;
}

}  // namespace

template <typename T>
void router_forward(T* probs, T* lse, int32_t* topk_idx, T* topk_w, const T* logits, int N, int E, int K,
                    bool renormalize) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + size_t(n) * E;
    T* p = probs + size_t(n) * E;
    T m = x[0];
    for (int e = 1; e < E; ++e) m = x[e] > m ? x[e] : m;
    T sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(x[e] - m));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    lse[n] = m + std::log(sum);
    // Top-k by repeated selection (K is small); strict > keeps the lower index on ties.
    int32_t* idx = topk_idx + size_t(n) * K;
    T* w = topk_w + size_t(n) * K;
    T wsum = 0;
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
    if (renormalize)
      for (int j = 0; j < K; ++j) w[j] /= wsum;
  }
}

template <typename T>
RouterLosses router_losses(const T* probs, const T* lse, const int32_t* topk_idx, int N, int E, int K,
                           double aux_coef, double z_coef) {
  RouterLosses out;
  if (N == 0) return out;
  const std::vector<double> f = expert_fractions(topk_idx, N, E, K);
  std::vector<double> P(E, 0.0);
  double z = 0.0;
  for (int n = 0; n < N; ++n) {
    for (int e = 0; e < E; ++e) P[e] += probs[size_t(n) * E + e];
    z += double(lse[n]) * lse[n];
  }
  double fp = 0.0;
  for (int e = 0; e < E; ++e) fp += f[e] * P[e] / N;
  out.aux = aux_coef * E * fp;
  out.z = z_coef * z / N;
  return out;
}

template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const T* lse, const int32_t* topk_idx,
                     const T* topk_w, int N, int E, int K, double aux_coef, double z_coef, double loss_scale,
                     bool renormalize) {
  const std::vector<double> f = expert_fractions(topk_idx, N, E, K);
  const double aux_g = loss_scale * aux_coef * E / N;  // d aux / d p_ni = coef * E * f_i / N
  const double z_g = loss_scale * z_coef * 2.0 / N;    // d z / d lse_n = 2 coef lse_n / N
#pragma omp parallel
  {
    std::vector<double> dp(E);
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const T* p = probs + size_t(n) * E;
      const int32_t* idx = topk_idx + size_t(n) * K;
      const T* w = topk_w + size_t(n) * K;
      const T* dw = dtopk_w + size_t(n) * K;
      for (int e = 0; e < E; ++e) dp[e] = aux_g * f[e];
      // w_j = p_j / S with S = Σ_j p_j over the chosen experts: dp_j = (dw_j − Σ_l w_l dw_l) / S.
      // Without renormalising, w_j = p_j: dp_j = dw_j.
      double S = 0.0, wdw = 0.0;
      for (int j = 0; j < K; ++j) S += p[idx[j]], wdw += double(w[j]) * dw[j];
      if (!renormalize) S = 1.0, wdw = 0.0;
      for (int j = 0; j < K; ++j) dp[idx[j]] += (dw[j] - wdw) / S;
      double pdp = 0.0;
      for (int e = 0; e < E; ++e) pdp += p[e] * dp[e];
      T* dl = dlogits + size_t(n) * E;
      for (int e = 0; e < E; ++e) dl[e] = T(p[e] * (dp[e] - pdp) + z_g * lse[n] * p[e]);
    }
  }
}

template void router_forward<float>(float*, float*, int32_t*, float*, const float*, int, int, int, bool);
template void router_forward<double>(double*, double*, int32_t*, double*, const double*, int, int, int, bool);
template RouterLosses router_losses<float>(const float*, const float*, const int32_t*, int, int, int, double, double);
template RouterLosses router_losses<double>(const double*, const double*, const int32_t*, int, int, int, double,
                                            double);
template void router_backward<float>(float*, const float*, const float*, const float*, const int32_t*, const float*,
                                     int, int, int, double, double, double, bool);
template void router_backward<double>(double*, const double*, const double*, const double*, const int32_t*,
                                      const double*, int, int, int, double, double, double, bool);

}  // namespace atl
