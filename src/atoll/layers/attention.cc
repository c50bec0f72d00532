#include "atoll/layers/attention.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace atl {
namespace {

template <typename T>
inline T dot(const T* a, const T* b, int n) {
  T acc = 0;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int B, int T_, int NH, int NKV, int HD) {
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int group = NH / NKV;
#pragma omp parallel
  {
    std::vector<T> score(T_);  // one row of scaled scores, s <= t
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h) {
        const int kh = h / group;
        for (int t = 0; t < T_; ++t) {
          const T* qt = q + ((size_t(b) * T_ + t) * NH + h) * HD;
          T m = -std::numeric_limits<T>::infinity();
          for (int s = 0; s <= t; ++s) {
            score[s] = dot(qt, k + ((size_t(b) * T_ + s) * NKV + kh) * HD, HD) * scale;
            m = score[s] > m ? score[s] : m;
          }
          T sum = 0;
          for (int s = 0; s <= t; ++s) sum += (score[s] = std::exp(score[s] - m));
          T* o = out + ((size_t(b) * T_ + t) * NH + h) * HD;
          for (int d = 0; d < HD; ++d) o[d] = 0;
          const T inv = T(1) / sum;
          for (int s = 0; s <= t; ++s) {
            const T p = score[s] * inv;
            const T* vs = v + ((size_t(b) * T_ + s) * NKV + kh) * HD;
            for (int d = 0; d < HD; ++d) o[d] += p * vs[d];
          }
          lse[(size_t(b) * NH + h) * T_ + t] = m + std::log(sum);
        }
      }
  }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q, const T* k,
                        const T* v, int B, int T_, int NH, int NKV, int HD) {
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int group = NH / NKV;
  // Each (b, kv head) owns its dk/dv rows and the dq rows of its query heads: no races.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; ++b)
    for (int kh = 0; kh < NKV; ++kh) {
      for (int t = 0; t < T_; ++t) {
        T* dkt = dk + ((size_t(b) * T_ + t) * NKV + kh) * HD;
        T* dvt = dv + ((size_t(b) * T_ + t) * NKV + kh) * HD;
        for (int d = 0; d < HD; ++d) dkt[d] = dvt[d] = 0;
      }
      for (int h = kh * group; h < (kh + 1) * group; ++h)
        for (int t = 0; t < T_; ++t) {
          const size_t qi = ((size_t(b) * T_ + t) * NH + h) * HD;
          const T* qt = q + qi;
          const T* dot_ = dout + qi;
          T* dqt = dq + qi;
          for (int d = 0; d < HD; ++d) dqt[d] = 0;
          const T D = dot(dot_, out + qi, HD);
          const T l = lse[(size_t(b) * NH + h) * T_ + t];
          for (int s = 0; s <= t; ++s) {
            const size_t ki = ((size_t(b) * T_ + s) * NKV + kh) * HD;
            const T p = std::exp(dot(qt, k + ki, HD) * scale - l);
            const T ds = p * (dot(dot_, v + ki, HD) - D) * scale;
            T* dks = dk + ki;
            T* dvs = dv + ki;
            const T* ks = k + ki;
            for (int d = 0; d < HD; ++d) {
              dqt[d] += ds * ks[d];
              dks[d] += ds * qt[d];
              dvs[d] += p * dot_[d];
            }
          }
        }
    }
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, int, int, int, int,
                                       int);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*, int, int, int,
                                        int, int);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, int, int, int, int, int);
template void attention_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, int, int, int, int, int);

}  // namespace atl
