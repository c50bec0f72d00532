#include "atoll/layers/cross_entropy.h"

#include <cmath>
#include <cstddef>

#include "atoll/core/vector_math.h"
#include "atoll/core/check.h"

namespace atl {

template <typename T>
double cross_entropy_forward(T* lse, const T* logits, const int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n)
    ATOLL_CHECK(targets[n] >= 0 && targets[n] < V) << "target id " << targets[n] << " outside vocabulary of " << V;
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + size_t(n) * V;
    T m = x[0];
#pragma omp simd reduction(max : m)
    for (int v = 1; v < V; ++v) m = x[v] > m ? x[v] : m;
    // Each term in T (vector exp, x - m <= 0 so no overflow), the sum in double.
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) sum += double(std::exp(x[v] - m));
    const double l = double(m) + std::log(sum);
    if (lse) lse[n] = T(l);
    total += l - double(x[targets[n]]);
  }
  return total;
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int N, int V, T scale) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = logits + size_t(n) * V;
    T* d = dlogits + size_t(n) * V;
    const T l = lse[n];
#pragma omp simd
    for (int v = 0; v < V; ++v) d[v] = scale * std::exp(x[v] - l);
    d[targets[n]] -= scale;
  }
}

template double cross_entropy_forward<float>(float*, const float*, const int32_t*, int, int);
template double cross_entropy_forward<double>(double*, const double*, const int32_t*, int, int);
template void cross_entropy_backward<float>(float*, const float*, const float*, const int32_t*, int, int, float);
template void cross_entropy_backward<double>(double*, const double*, const double*, const int32_t*, int, int, double);

}  // namespace atl
