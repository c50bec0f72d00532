#include "atoll/layers/cca.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/layers/attention.h"
#include "atoll/layers/linear.h"

namespace atl {

// Loops run over channels (parallel) and then time, so every sum has one fixed order whatever
// the thread count, and each weight gradient belongs to one channel's iteration.

template <typename T>
void cca_conv_forward(T* z, T* y, const T* x, const T* w0, const T* b0, const T* w1, const T* b1, const CcaDims& d) {
  const int CC = d.CC(), TY = d.TY(), t0 = d.t0, t1 = d.t1, HD = d.HD, lag = (t1 - 1) + (t0 - 1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < d.B; ++b)
    for (int c = 0; c < CC; ++c)
      for (int u = 0; u < TY; ++u) {
        // y at time u - (t1-1) reads x at times u - lag .. u - (t1-1); before 0 they are the padding.
        T s = b0[c];
        for (int j = 0; j < t0; ++j) {
          const int tx = u - lag + j;
          if (tx >= 0) s += w0[size_t(c) * t0 + j] * x[(size_t(b) * d.T + tx) * CC + c];
        }
        y[(size_t(b) * TY + u) * CC + c] = s;
      }
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < d.B; ++b)
    for (int c = 0; c < CC; ++c) {
      const int g0 = c / HD * HD;  // the first channel of c's group (head)
      for (int t = 0; t < d.T; ++t) {
        T s = b1[c];
        for (int ci = 0; ci < HD; ++ci)
          for (int j = 0; j < t1; ++j)
            s += w1[(size_t(c) * HD + ci) * t1 + j] * y[(size_t(b) * TY + t + j) * CC + g0 + ci];
        z[(size_t(b) * d.T + t) * CC + c] = s;
      }
    }
}

template <typename T>
void cca_conv_backward(T* dx, T* dw0, T* db0, T* dw1, T* db1, T* dy, const T* dz, const T* y, const T* x,
                       const T* w0, const T* w1, const CcaDims& d) {
  const int CC = d.CC(), TY = d.TY(), t0 = d.t0, t1 = d.t1, HD = d.HD, lag = (t1 - 1) + (t0 - 1);
  // The grouped convolution: db1, dw1 per output channel, each summed over the tokens and then
  // added once; dy per input channel from its group.
#pragma omp parallel for schedule(static)
  for (int c = 0; c < CC; ++c) {
    const int g0 = c / HD * HD;
    T sb = 0;
    for (int b = 0; b < d.B; ++b)
      for (int t = 0; t < d.T; ++t) sb += dz[(size_t(b) * d.T + t) * CC + c];
    db1[c] += sb;
    for (int ci = 0; ci < HD; ++ci)
      for (int j = 0; j < t1; ++j) {
        T s = 0;
        for (int b = 0; b < d.B; ++b)
          for (int t = 0; t < d.T; ++t)
            s += dz[(size_t(b) * d.T + t) * CC + c] * y[(size_t(b) * TY + t + j) * CC + g0 + ci];
        dw1[(size_t(c) * HD + ci) * t1 + j] += s;
      }
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < d.B; ++b)
    for (int c2 = 0; c2 < CC; ++c2) {
      const int g0 = c2 / HD * HD, ci = c2 - g0;
      for (int u = 0; u < TY; ++u) {
        T s = 0;
        for (int j = 0; j < t1; ++j) {
          const int t = u - j;
          if (t < 0 || t >= d.T) continue;
          const T* g = dz + (size_t(b) * d.T + t) * CC + g0;
          for (int co = 0; co < HD; ++co) s += g[co] * w1[(size_t(g0 + co) * HD + ci) * t1 + j];
        }
        dy[(size_t(b) * TY + u) * CC + c2] = s;
      }
    }
  // The depthwise convolution: every y, padding times included, carries b0.
#pragma omp parallel for schedule(static)
  for (int c = 0; c < CC; ++c) {
    T sb = 0;
    for (int b = 0; b < d.B; ++b)
      for (int u = 0; u < TY; ++u) sb += dy[(size_t(b) * TY + u) * CC + c];
    db0[c] += sb;
    for (int j = 0; j < t0; ++j) {
      T s = 0;
      for (int b = 0; b < d.B; ++b)
        for (int u = 0; u < TY; ++u) {
          const int tx = u - lag + j;
          if (tx >= 0) s += dy[(size_t(b) * TY + u) * CC + c] * x[(size_t(b) * d.T + tx) * CC + c];
        }
      dw0[size_t(c) * t0 + j] += s;
    }
    for (int b = 0; b < d.B; ++b)
      for (int tx = 0; tx < d.T; ++tx) {
        T s = 0;
        for (int j = 0; j < t0; ++j) {
          const int u = tx + lag - j;
          if (u < TY) s += dy[(size_t(b) * TY + u) * CC + c] * w0[size_t(c) * t0 + j];
        }
        dx[(size_t(b) * d.T + tx) * CC + c] += s;
      }
  }
}

template <typename T>
void cca_qk_mean_forward(T* q, T* k, const T* z, const T* x, const CcaDims& d) {
  const int CC = d.CC(), QD = d.QD(), HD = d.HD, G = d.NH / d.NKV;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.N(); ++n) {
    const T* xr = x + size_t(n) * CC;
    const T* zr = z + size_t(n) * CC;
    T* qr = q + size_t(n) * QD;
    T* kr = k + size_t(n) * d.KVD();
    for (int hk = 0; hk < d.NKV; ++hk)
      for (int i = 0; i < HD; ++i) {
        const T kp = xr[QD + hk * HD + i];
        T mk = 0;
        for (int g = 0; g < G; ++g) {
          const int hq = hk * G + g;
          const T mq = (xr[hq * HD + i] + kp) / T(2);
          qr[hq * HD + i] = zr[hq * HD + i] + mq;
          mk += mq;
        }
        kr[hk * HD + i] = zr[QD + hk * HD + i] + mk / T(G);
      }
  }
}

template <typename T>
void cca_qk_mean_backward(T* dz, T* dx, const T* dq, const T* dk, const CcaDims& d) {
  const int CC = d.CC(), QD = d.QD(), HD = d.HD, G = d.NH / d.NKV;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.N(); ++n) {
    const T* dqr = dq + size_t(n) * QD;
    const T* dkr = dk + size_t(n) * d.KVD();
    T* dzr = dz + size_t(n) * CC;
    T* dxr = dx + size_t(n) * CC;
    std::copy(dqr, dqr + QD, dzr);
    std::copy(dkr, dkr + d.KVD(), dzr + QD);
    for (int hk = 0; hk < d.NKV; ++hk)
      for (int i = 0; i < HD; ++i) {
        T dkp = 0;
        for (int g = 0; g < G; ++g) {
          const int hq = hk * G + g;
          const T dmq = dqr[hq * HD + i] + dkr[hk * HD + i] / T(G);
          dxr[hq * HD + i] += dmq / T(2);
          dkp += dmq / T(2);
        }
        dxr[QD + hk * HD + i] += dkp;
      }
  }
}

namespace {

// One head: out = in · scale / max(‖in‖, eps); returns 1 / max(‖in‖, eps).
template <typename T>
T normalise_head(T* out, const T* in, int HD, T scale) {
  T ss = 0;
  for (int i = 0; i < HD; ++i) ss += in[i] * in[i];
  const T r = T(1) / std::max(std::sqrt(ss), T(kCcaNormEps));
  for (int i = 0; i < HD; ++i) out[i] = in[i] * scale * r;
  return r;
}

// One head: dx (=) r (du − u (u·du)) with u = x r, du = dout · scale; returns u·dout (for dtemp).
template <typename T>
T normalise_head_backward(T* dx, const T* dout, const T* x, T r, int HD, T scale) {
  T udu = 0, udout = 0;
  for (int i = 0; i < HD; ++i) udout += x[i] * r * dout[i];
  udu = udout * scale;
  for (int i = 0; i < HD; ++i) dx[i] = r * (dout[i] * scale - x[i] * r * udu);
  return udout;
}

}  // namespace

template <typename T>
void cca_qk_norm_forward(T* qn, T* kn, T* rq, T* rk, const T* q, const T* k, const T* temp, const CcaDims& d) {
  const int HD = d.HD;
  const T s = std::sqrt(T(HD));
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.N(); ++n) {
    for (int h = 0; h < d.NH; ++h) {
      const size_t o = (size_t(n) * d.NH + h) * HD;
      rq[size_t(n) * d.NH + h] = normalise_head(qn + o, q + o, HD, s);
    }
    for (int h = 0; h < d.NKV; ++h) {
      const size_t o = (size_t(n) * d.NKV + h) * HD;
      rk[size_t(n) * d.NKV + h] = normalise_head(kn + o, k + o, HD, s * temp[h]);
    }
  }
}

template <typename T>
void cca_qk_norm_backward(T* dq, T* dk, T* dtemp, const T* dqn, const T* dkn, const T* q, const T* k, const T* rq,
                          const T* rk, const T* temp, const CcaDims& d) {
  const int HD = d.HD;
  const T s = std::sqrt(T(HD));
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.N(); ++n)
    for (int h = 0; h < d.NH; ++h) {
      const size_t o = (size_t(n) * d.NH + h) * HD;
      normalise_head_backward(dq + o, dqn + o, q + o, rq[size_t(n) * d.NH + h], HD, s);
    }
  // dtemp sums over tokens: serial over n per head, a fixed order.
  for (int h = 0; h < d.NKV; ++h) {
    T acc = 0;
    for (int n = 0; n < d.N(); ++n) {
      const size_t o = (size_t(n) * d.NKV + h) * HD;
      acc += s * normalise_head_backward(dk + o, dkn + o, k + o, rk[size_t(n) * d.NKV + h], HD, s * temp[h]);
    }
    dtemp[h] += acc;
  }
}

template <typename T>
void cca_value_forward(T* v, const T* vc, const T* vd, const CcaDims& d) {
  const int half = d.KVD() / 2;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.N(); ++n) {
    T* vr = v + size_t(n) * d.KVD();
    std::copy(vc + size_t(n) * half, vc + size_t(n + 1) * half, vr);
    if (n % d.T == 0)
      std::fill(vr + half, vr + 2 * half, T(0));  // no previous token (upstream's v_proj_delayed(0), no bias)
    else
      std::copy(vd + size_t(n - 1) * half, vd + size_t(n) * half, vr + half);
  }
}

template <typename T>
void cca_value_backward(T* dvc, T* dvd, const T* dv, const CcaDims& d) {
  const int half = d.KVD() / 2;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < d.N(); ++n) {
    const T* dvr = dv + size_t(n) * d.KVD();
    std::copy(dvr, dvr + half, dvc + size_t(n) * half);
    T* o = dvd + size_t(n) * half;
    if ((n + 1) % d.T == 0)
      std::fill(o, o + half, T(0));  // the last token's delayed half feeds no one
    else
      std::copy(dvr + d.KVD() + half, dvr + 2 * d.KVD(), o);
  }
}

namespace {

// Everything the layer computes on the way to its output, [N, ...] each.
template <typename T>
struct CcaActs {
  explicit CcaActs(const CcaDims& d)
      : qp(size_t(d.N()) * d.QD()), kp(size_t(d.N()) * d.KVD()), x(size_t(d.N()) * d.CC()),
        y(size_t(d.B) * d.TY() * d.CC()), z(x.size()), q(qp.size()), k(kp.size()), qn(qp.size()), kn(kp.size()),
        rq(size_t(d.N()) * d.NH), rk(size_t(d.N()) * d.NKV), vc(size_t(d.N()) * d.KVD() / 2), vd(vc.size()),
        v(kp.size()), att(qp.size()), lse(size_t(d.B) * d.NH * d.T) {}
  std::vector<T> qp, kp, x, y, z, q, k, qn, kn, rq, rk, vc, vd, v, att, lse;
};

template <typename T>
void run_forward(CcaActs<T>& a, const T* h, const CcaWeights<T>& w, const RopeTable<T>& rope, const CcaDims& d) {
  const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
  linear_forward(a.qp.data(), h, w.wq, N, C, QD);
  linear_forward(a.kp.data(), h, w.wk, N, C, KVD);
  for (int n = 0; n < N; ++n) {
    std::copy_n(a.qp.data() + size_t(n) * QD, QD, a.x.data() + size_t(n) * CC);
    std::copy_n(a.kp.data() + size_t(n) * KVD, KVD, a.x.data() + size_t(n) * CC + QD);
  }
  cca_conv_forward(a.z.data(), a.y.data(), a.x.data(), w.w0, w.b0, w.w1, w.b1, d);
  cca_qk_mean_forward(a.q.data(), a.k.data(), a.z.data(), a.x.data(), d);
  cca_qk_norm_forward(a.qn.data(), a.kn.data(), a.rq.data(), a.rk.data(), a.q.data(), a.k.data(), w.temp, d);
  rope_forward(a.qn.data(), rope, d.B, d.T, d.NH, d.HD);
  rope_forward(a.kn.data(), rope, d.B, d.T, d.NKV, d.HD);
  linear_forward(a.vc.data(), h, w.wvc, N, C, KVD / 2);
  linear_forward(a.vd.data(), h, w.wvd, N, C, KVD / 2);
  cca_value_forward(a.v.data(), a.vc.data(), a.vd.data(), d);
  attention_forward(a.att.data(), a.lse.data(), a.qn.data(), a.kn.data(), a.v.data(), d.B, d.T, d.NH, d.NKV, d.HD);
}

}  // namespace

template <typename T>
void cca_forward(T* out, const T* h, const CcaWeights<T>& w, const RopeTable<T>& rope, const CcaDims& d) {
  CcaActs<T> a(d);
  run_forward(a, h, w, rope, d);
  linear_forward(out, a.att.data(), w.wo, d.N(), d.QD(), d.C);
}

template <typename T>
void cca_backward(T* dh, const CcaGrads<T>& g, const T* dout, const T* h, const CcaWeights<T>& w,
                  const RopeTable<T>& rope, const CcaDims& d) {
  const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
  CcaActs<T> a(d);
  run_forward(a, h, w, rope, d);
  std::vector<T> datt(a.att.size(), T(0)), dqn(a.qn.size()), dkn(a.kn.size()), dv(a.v.size());
  linear_backward(datt.data(), g.wo, dout, a.att.data(), w.wo, N, QD, C);
  attention_backward(dqn.data(), dkn.data(), dv.data(), datt.data(), a.att.data(), a.lse.data(), a.qn.data(),
                     a.kn.data(), a.v.data(), d.B, d.T, d.NH, d.NKV, d.HD);
  rope_backward(dqn.data(), rope, d.B, d.T, d.NH, d.HD);
  rope_backward(dkn.data(), rope, d.B, d.T, d.NKV, d.HD);
  std::vector<T> dq(a.q.size()), dk(a.k.size()), dz(a.z.size()), dx(a.x.size(), T(0)), dy(a.y.size());
  cca_qk_norm_backward(dq.data(), dk.data(), g.temp, dqn.data(), dkn.data(), a.q.data(), a.k.data(), a.rq.data(),
                       a.rk.data(), w.temp, d);
  cca_qk_mean_backward(dz.data(), dx.data(), dq.data(), dk.data(), d);
  cca_conv_backward(dx.data(), g.w0, g.b0, g.w1, g.b1, dy.data(), dz.data(), a.y.data(), a.x.data(), w.w0, w.w1, d);
  for (int n = 0; n < N; ++n) {
    std::copy_n(dx.data() + size_t(n) * CC, QD, dq.data() + size_t(n) * QD);
    std::copy_n(dx.data() + size_t(n) * CC + QD, KVD, dk.data() + size_t(n) * KVD);
  }
  linear_backward(dh, g.wq, dq.data(), h, w.wq, N, C, QD);
  linear_backward(dh, g.wk, dk.data(), h, w.wk, N, C, KVD);
  std::vector<T> dvc(a.vc.size()), dvd(a.vd.size());
  cca_value_backward(dvc.data(), dvd.data(), dv.data(), d);
  linear_backward(dh, g.wvc, dvc.data(), h, w.wvc, N, C, KVD / 2);
  linear_backward(dh, g.wvd, dvd.data(), h, w.wvd, N, C, KVD / 2);
}

#define ATOLL_CCA_INSTANTIATE(T)                                                                                   \
  template void cca_conv_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, const CcaDims&);      \
  template void cca_conv_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*,      \
                                     const CcaDims&);                                                              \
  template void cca_qk_mean_forward<T>(T*, T*, const T*, const T*, const CcaDims&);                                \
  template void cca_qk_mean_backward<T>(T*, T*, const T*, const T*, const CcaDims&);                               \
  template void cca_qk_norm_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const CcaDims&);              \
  template void cca_qk_norm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,     \
                                        const T*, const CcaDims&);                                                 \
  template void cca_value_forward<T>(T*, const T*, const T*, const CcaDims&);                                      \
  template void cca_value_backward<T>(T*, T*, const T*, const CcaDims&);                                           \
  template void cca_forward<T>(T*, const T*, const CcaWeights<T>&, const RopeTable<T>&, const CcaDims&);            \
  template void cca_backward<T>(T*, const CcaGrads<T>&, const T*, const T*, const CcaWeights<T>&,                  \
                                const RopeTable<T>&, const CcaDims&);
ATOLL_CCA_INSTANTIATE(float)
ATOLL_CCA_INSTANTIATE(double)
#undef ATOLL_CCA_INSTANTIATE

}  // namespace atl
