#include "atoll/layers/rope.h"

#include <cmath>
#include <cstddef>

#include "atoll/core/check.h"

namespace atl {

template <typename T>
RopeTable<T> RopeTable<T>::build(int seq_len, int head_dim, double theta, int rotary_dim) {
  RopeTable t;
  t.seq_len = seq_len;
  t.head_dim = head_dim;
  t.rotary_dim = rotary_dim > 0 ? rotary_dim : head_dim;
  ATOLL_CHECK(t.rotary_dim <= head_dim) << "rotary dim " << t.rotary_dim << " of " << head_dim;
  const int half = t.rotary_dim / 2;
  t.cos.resize(size_t(seq_len) * half);
  t.sin.resize(size_t(seq_len) * half);
  for (int pos = 0; pos < seq_len; ++pos)
    for (int i = 0; i < half; ++i) {
      const double inv_freq = 1.0 / std::pow(theta, double(2 * i) / t.rotary_dim);
      const double angle = double(pos) * inv_freq;
      t.cos[size_t(pos) * half + i] = T(std::cos(angle));
      t.sin[size_t(pos) * half + i] = T(std::sin(angle));
    }
  return t;
}

namespace {
// sign = +1 rotates forward, -1 applies the transpose (inverse rotation).
template <typename T>
void rotate(T* x, const RopeTable<T>& table, int B, int T_, int NHX, int HD, T sign, int pos0) {
  ATOLL_CHECK(pos0 + T_ <= table.seq_len && HD == table.head_dim) << "rope table built for T=" << table.seq_len;
  const int half = table.rotary_dim / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_; ++t) {
      const T* c = table.cos.data() + size_t(pos0 + t) * half;
      const T* s = table.sin.data() + size_t(pos0 + t) * half;
      for (int h = 0; h < NHX; ++h) {
        T* v = x + ((size_t(b) * T_ + t) * NHX + h) * HD;
        for (int i = 0; i < half; ++i) {
          const T x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c[i] - sign * x2 * s[i];
          v[i + half] = x2 * c[i] + sign * x1 * s[i];
        }
      }
    }
}
}  // namespace

template <typename T>
void rope_forward(T* x, const RopeTable<T>& table, int B, int T_, int NHX, int HD, int pos0) {
  rotate(x, table, B, T_, NHX, HD, T(1), pos0);
}

template <typename T>
void rope_backward(T* dx, const RopeTable<T>& table, int B, int T_, int NHX, int HD, int pos0) {
  rotate(dx, table, B, T_, NHX, HD, T(-1), pos0);
}

template struct RopeTable<float>;
template struct RopeTable<double>;
template void rope_forward<float>(float*, const RopeTable<float>&, int, int, int, int, int);
template void rope_forward<double>(double*, const RopeTable<double>&, int, int, int, int, int);
template void rope_backward<float>(float*, const RopeTable<float>&, int, int, int, int, int);
template void rope_backward<double>(double*, const RopeTable<double>&, int, int, int, int, int);

}  // namespace atl
