#include "atoll/layers/router_zaya.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "atoll/core/check.h"

namespace atl {

template <typename T>
void zaya_route_forward(T* probs, int32_t* choice, T* gate, const T* logits, const T* biases, int N, int E1,
                        int K) {
  ATOLL_CHECK(K >= 1 && K <= E1) << "K " << K << " of " << E1 << " classes";
  const int skip = E1 - 1;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + size_t(n) * E1;
    T* p = probs + size_t(n) * E1;
    T m = x[0];
    for (int e = 1; e < E1; ++e) m = std::max(m, x[e]);
    T sum = 0;
    for (int e = 0; e < E1; ++e) sum += (p[e] = std::exp(x[e] - m));
    for (int e = 0; e < E1; ++e) p[e] /= sum;
    // Top-K of the biased probabilities by repeated selection (K is small); in T (float in
    // training, as transformers adds its fp32 biases to fp32 probabilities). Strict > keeps the
    // lower index on ties.
    int32_t* c = choice + size_t(n) * K;
    T* g = gate + size_t(n) * K;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      T best_v = 0;
      for (int e = 0; e < E1; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= c[i] == e;
        const T v = p[e] + biases[e];
        if (!taken && (best < 0 || v > best_v)) best = e, best_v = v;
      }
      c[j] = best;
      g[j] = best == skip ? T(0) : p[best];
    }
  }
}

template <typename T>
void zaya_route_backward(T* dlogits, const T* dgate, const T* probs, const int32_t* choice, int N, int E1, int K) {
  const int skip = E1 - 1;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* p = probs + size_t(n) * E1;
    const int32_t* c = choice + size_t(n) * K;
    const T* dg = dgate + size_t(n) * K;
    T* dl = dlogits + size_t(n) * E1;
    // d(gate_j)/d(p_e) = [e = c_j] (not the skip class); softmax: dl = p (dp − Σ p dp).
    double pdp = 0;
    for (int j = 0; j < K; ++j)
      if (c[j] != skip) pdp += double(p[c[j]]) * dg[j];
    for (int e = 0; e < E1; ++e) dl[e] = T(-double(p[e]) * pdp);
    for (int j = 0; j < K; ++j)
      if (c[j] != skip) dl[c[j]] += p[c[j]] * dg[j];
  }
}

void zaya_class_counts(int64_t* counts, const int32_t* choice, int N, int E1, int K) {
  std::fill(counts, counts + E1, int64_t(0));
  for (size_t i = 0; i < size_t(N) * K; ++i) {
    ATOLL_CHECK(choice[i] >= 0 && choice[i] < E1) << "class " << choice[i] << " of " << E1;
    ++counts[choice[i]];
  }
}

template void zaya_route_forward<float>(float*, int32_t*, float*, const float*, const float*, int, int, int);
template void zaya_route_forward<double>(double*, int32_t*, double*, const double*, const double*, int, int, int);
template void zaya_route_backward<float>(float*, const float*, const float*, const int32_t*, int, int, int);
template void zaya_route_backward<double>(double*, const double*, const double*, const int32_t*, int, int, int);

}  // namespace atl
