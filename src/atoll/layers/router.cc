#include "atoll/layers/router.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace atl {

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

void RouterSums::add(const RouterSums& o) {
  for (size_t e = 0; e < slots.size(); ++e) slots[e] += o.slots[e], prob[e] += o.prob[e];
  z += o.z, tokens += o.tokens;
}

template <typename T>
RouterSums router_sums(const T* probs, const T* lse, const int32_t* topk_idx, int N, int E, int K) {
  RouterSums s{.slots = std::vector<double>(E, 0.0), .prob = std::vector<double>(E, 0.0), .z = 0.0, .tokens = double(N)};
  for (size_t i = 0; i < size_t(N) * K; ++i) s.slots[topk_idx[i]] += 1.0;
  for (int n = 0; n < N; ++n) {
    for (int e = 0; e < E; ++e) s.prob[e] += probs[size_t(n) * E + e];
    s.z += double(lse[n]) * lse[n];
  }
  return s;
}

RouterLosses router_losses(const RouterSums& s, int K, double aux_coef, double z_coef) {
  RouterLosses out;
  const double N = s.tokens;
  if (N == 0) return out;
  const int E = int(s.slots.size());
  double fp = 0.0;
  for (int e = 0; e < E; ++e) fp += s.slots[e] / (N * K) * s.prob[e] / N;
  out.aux = aux_coef * E * fp;
  out.z = z_coef * s.z / N;
  return out;
}

template <typename T>
RouterLosses router_losses(const T* probs, const T* lse, const int32_t* topk_idx, int N, int E, int K,
                           double aux_coef, double z_coef) {
  return router_losses(router_sums(probs, lse, topk_idx, N, E, K), K, aux_coef, z_coef);
}

template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const T* lse, const int32_t* topk_idx,
                     const T* topk_w, int N, int E, int K, double aux_coef, double z_coef, double loss_scale,
                     bool renormalize) {
  RouterSums own{.slots = std::vector<double>(E, 0.0), .prob = {}, .z = 0.0, .tokens = double(N)};
  for (size_t i = 0; i < size_t(N) * K; ++i) own.slots[topk_idx[i]] += 1.0;
  router_backward(dlogits, dtopk_w, probs, lse, topk_idx, topk_w, N, E, K, aux_coef, z_coef, loss_scale, renormalize,
                  own);
}

template <typename T>
void router_backward(T* dlogits, const T* dtopk_w, const T* probs, const T* lse, const int32_t* topk_idx,
                     const T* topk_w, int N, int E, int K, double aux_coef, double z_coef, double loss_scale,
                     bool renormalize, const RouterSums& batch) {
  const double Nb = batch.tokens;
  std::vector<double> f(E, 0.0);  // the batch's share of routed slots per expert
  for (int e = 0; e < E && Nb > 0; ++e) f[e] = batch.slots[e] / (Nb * K);
  const double aux_g = loss_scale * aux_coef * E / Nb;  // d aux / d p_ni = coef * E * f_i / N
  const double z_g = loss_scale * z_coef * 2.0 / Nb;    // d z / d lse_n = 2 coef lse_n / N
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
template void router_backward<float>(float*, const float*, const float*, const float*, const int32_t*, const float*,
                                     int, int, int, double, double, double, bool, const RouterSums&);
template void router_backward<double>(double*, const double*, const double*, const double*, const int32_t*,
                                      const double*, int, int, int, double, double, double, bool, const RouterSums&);
template RouterSums router_sums<float>(const float*, const float*, const int32_t*, int, int, int);
template RouterSums router_sums<double>(const double*, const double*, const int32_t*, int, int, int);

}  // namespace atl
