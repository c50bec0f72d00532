// Compressed convolutional attention (layers/cca.h): the convolutions against PyTorch's
// recipe written out (pad [q|k] with t0-1 + t1-1 zeros, two unpadded convolutions), the
// first convolution's bias seen by the second at t < 0, the value shift's halves and its
// t = 0, then every gradient of the layer (temperature, convolution weights and biases over a
// sequence shorter than the padding) against finite differences in double, and float
// against double.
#include "atoll/layers/cca.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

// NH = 4 query heads over NKV = 2 key/value heads (GQA), kernels 3 and 2 so both paddings matter.
CcaDims dims(int T = 5, int t0 = 3, int t1 = 2) { return {.B = 2, .T = T, .C = 6, .NH = 4, .NKV = 2, .HD = 4, .t0 = t0, .t1 = t1}; }

// PyTorch's Conv1d (cross-correlation, no padding) on one sequence in[ch][time], `groups` groups.
std::vector<std::vector<double>> conv1d(const std::vector<std::vector<double>>& in, const std::vector<double>& w,
                                        const std::vector<double>& bias, int groups, int kernel) {
  const int ch = int(in.size()), len = int(in[0].size()), per = ch / groups, out_len = len - kernel + 1;
  std::vector<std::vector<double>> out(ch, std::vector<double>(out_len));
  for (int c = 0; c < ch; ++c)
    for (int i = 0; i < out_len; ++i) {
      double s = bias[c];
      for (int ci = 0; ci < per; ++ci)
        for (int j = 0; j < kernel; ++j) s += w[(size_t(c) * per + ci) * kernel + j] * in[c / per * per + ci][i + j];
      out[c][i] = s;
    }
  return out;
}

struct ConvCase {
  CcaDims d;
  std::vector<double> x, w0, b0, w1, b1;
  explicit ConvCase(const CcaDims& dd, Rng& rng) : d(dd) {
    const int CC = d.CC();
    x = randn(rng, size_t(d.N()) * CC), w0 = randn(rng, size_t(CC) * d.t0), b0 = randn(rng, CC);
    w1 = randn(rng, size_t(CC) * d.HD * d.t1, 0.5), b1 = randn(rng, CC);
  }
  std::vector<double> z() const {
    std::vector<double> y(size_t(d.B) * d.TY() * d.CC()), out(size_t(d.N()) * d.CC());
    cca_conv_forward(out.data(), y.data(), x.data(), w0.data(), b0.data(), w1.data(), b1.data(), d);
    return out;
  }
};

TEST(Cca, ConvolutionsMatchPytorchPaddingRecipe) {
  for (const CcaDims d : {dims(5, 3, 2), dims(2, 3, 3), dims(1, 2, 2), dims(4, 1, 1)}) {
    Rng rng(3);
    const ConvCase k(d, rng);
    const std::vector<double> z = k.z();
    const int CC = d.CC(), pad = d.t0 - 1 + d.t1 - 1;
    for (int b = 0; b < d.B; ++b) {
      std::vector<std::vector<double>> in(CC, std::vector<double>(d.T + pad, 0.0));
      for (int c = 0; c < CC; ++c)
        for (int t = 0; t < d.T; ++t) in[c][pad + t] = k.x[(size_t(b) * d.T + t) * CC + c];
      const auto want = conv1d(conv1d(in, k.w0, k.b0, CC, d.t0), k.w1, k.b1, d.NH + d.NKV, d.t1);
      for (int c = 0; c < CC; ++c)
        for (int t = 0; t < d.T; ++t)
          EXPECT_NEAR(z[(size_t(b) * d.T + t) * CC + c], want[c][t], 1e-12)
              << "T=" << d.T << " t0=" << d.t0 << " t1=" << d.t1 << " b=" << b << " c=" << c << " t=" << t;
    }
  }
}

// With x = 0 the depthwise output is its bias b0 at every time, padding included, so the
// grouped convolution gives b1 + Σ w1 · b0 at every t; zero padding of y (a plausible mistake)
// would change the first t1 - 1 positions.
TEST(Cca, SecondConvolutionSeesFirstBiasBeforeTimeZero) {
  const CcaDims d = dims(4, 2, 3);
  Rng rng(4);
  ConvCase k(d, rng);
  std::fill(k.x.begin(), k.x.end(), 0.0);
  const std::vector<double> z = k.z();
  const int CC = d.CC(), HD = d.HD;
  for (int c = 0; c < CC; ++c) {
    double want = k.b1[c];
    for (int ci = 0; ci < HD; ++ci)
      for (int j = 0; j < d.t1; ++j) want += k.w1[(size_t(c) * HD + ci) * d.t1 + j] * k.b0[c / HD * HD + ci];
    for (int n = 0; n < d.N(); ++n) EXPECT_NEAR(z[size_t(n) * CC + c], want, 1e-12) << "token " << n << " c " << c;
  }
}

// The flat concat [current half | previous token's half], then heads of HD: with NKV = 2 and
// HD = 4, head 0 is the current token's 4 values and head 1 the previous token's; at t = 0 of
// each sequence the previous half is zero.
TEST(Cca, ValueShiftHalvesAndFirstToken) {
  const CcaDims d = dims(3);
  const int half = d.KVD() / 2, N = d.N();
  std::vector<double> vc(size_t(N) * half), vd(vc.size()), v(size_t(N) * d.KVD());
  for (size_t i = 0; i < vc.size(); ++i) vc[i] = 1000 + double(i), vd[i] = 2000 + double(i);
  cca_value_forward(v.data(), vc.data(), vd.data(), d);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < half; ++i) {
      EXPECT_EQ(v[size_t(n) * d.KVD() + i], vc[size_t(n) * half + i]) << "head 0 is the current token";
      const double prev = n % d.T == 0 ? 0.0 : vd[size_t(n - 1) * half + i];
      EXPECT_EQ(v[size_t(n) * d.KVD() + half + i], prev) << "token " << n;
    }
}

// The whole layer's parameters as one flat vector, so one gradient check covers them all.
struct Layer {
  CcaDims d;
  size_t wq, wk, wvc, wvd, w0, b0, w1, b1, temp, wo, total;
  RopeTable<double> rope;
  explicit Layer(const CcaDims& dd, int rotary_dim) : d(dd) {
    const size_t C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
    size_t at = 0;
    auto take = [&](size_t n) { return std::exchange(at, at + n); };
    wq = take(QD * C), wk = take(KVD * C), wvc = take(KVD / 2 * C), wvd = take(KVD / 2 * C);
    w0 = take(CC * d.t0), b0 = take(CC), w1 = take(CC * d.HD * d.t1), b1 = take(CC), temp = take(d.NKV);
    wo = take(C * QD), total = at;
    rope = RopeTable<double>::build(d.T, d.HD, 10000.0, rotary_dim);
  }
  template <typename T>
  CcaWeights<T> weights(const std::vector<T>& p) const {
    const T* b = p.data();
    return {b + wq, b + wk, b + wvc, b + wvd, b + w0, b + b0, b + w1, b + b1, b + temp, b + wo};
  }
  CcaGrads<double> grads(std::vector<double>& g) const {
    double* b = g.data();
    return {b + wq, b + wk, b + wvc, b + wvd, b + w0, b + b0, b + w1, b + b1, b + temp, b + wo};
  }
};

// max_coords: 0 checks every parameter, else a random subset; the temperatures and the
// depthwise bias (what the padding carries) are always checked in full.
void check_layer_gradients(const CcaDims& d, int rotary_dim, size_t max_coords = 0) {
  const Layer L(d, rotary_dim);
  Rng rng(11);
  const size_t NC = size_t(d.N()) * d.C;
  std::vector<double> h = randn(rng, NC), p = randn(rng, L.total, 0.5), dout = randn(rng, NC);
  for (int i = 0; i < d.NKV; ++i) p[L.temp + i] = 0.7 + 0.5 * i;  // distinct temperatures per KV head
  auto loss_h = [&](const std::vector<double>& hh) {
    std::vector<double> out(NC);
    cca_forward(out.data(), hh.data(), L.weights(p), L.rope, d);
    return test::dot(out, dout);
  };
  auto loss_p = [&](const std::vector<double>& pp) {
    std::vector<double> out(NC);
    cca_forward(out.data(), h.data(), L.weights(pp), L.rope, d);
    return test::dot(out, dout);
  };
  std::vector<double> dh(NC, 0.0), g(L.total, 0.0);
  cca_backward(dh.data(), L.grads(g), dout.data(), h.data(), L.weights(p), L.rope, d);
  EXPECT_TRUE(check_grad("dh", loss_h, h, dh));
  test::GradCheckOptions opt;
  opt.max_coords = max_coords;
  EXPECT_TRUE(check_grad("dparams", loss_p, p, g, opt));
  for (const auto& [name, at, n] : {std::tuple{"dtemp", L.temp, size_t(d.NKV)}, {"db0", L.b0, size_t(d.CC())}}) {
    auto loss_part = [&](const std::vector<double>& part) {
      std::vector<double> pp = p;
      std::copy(part.begin(), part.end(), pp.begin() + long(at));
      return loss_p(pp);
    };
    EXPECT_TRUE(check_grad(name, loss_part, std::vector<double>(p.begin() + long(at), p.begin() + long(at + n)),
                           std::vector<double>(g.begin() + long(at), g.begin() + long(at + n))));
  }
  // Accumulation: a second backward adds the same gradients again.
  std::vector<double> dh2 = dh, g2 = g;
  cca_backward(dh2.data(), L.grads(g2), dout.data(), h.data(), L.weights(p), L.rope, d);
  EXPECT_TRUE(test::accumulated("dh", dh2, dh, dh, 1));
  EXPECT_TRUE(test::accumulated("dparams", g2, g, g, 1));
}

// T = 2 is shorter than the padding t0 - 1 + t1 - 1 = 3: every output reads padding, and the
// first token's value has no previous token.
TEST(CcaGrad, LayerWithSequenceShorterThanPadding) { check_layer_gradients(dims(2, 3, 2), 4); }
TEST(CcaGrad, LayerWithPartialRotary) { check_layer_gradients(dims(5, 2, 2), 2, 200); }
TEST(CcaGrad, LayerWithOneKvHeadAndUnitKernels) {
  CcaDims d = dims(4, 1, 1);
  d.NKV = 1;
  check_layer_gradients(d, 4);
}

// The temperature scales the keys: 0 makes every score 0, uniform attention over the causal
// prefix (why upstream's init of 0 is not a training init; model/attention_cca.h).
TEST(Cca, ZeroTemperatureIsUniformAttention) {
  const CcaDims d = dims(4);
  const Layer L(d, 4);
  Rng rng(2);
  std::vector<double> h = randn(rng, size_t(d.N()) * d.C), p = randn(rng, L.total, 0.5);
  for (int i = 0; i < d.NKV; ++i) p[L.temp + i] = 0.0;
  std::vector<double> out(size_t(d.N()) * d.C), again(out.size());
  cca_forward(out.data(), h.data(), L.weights(p), L.rope, d);
  // Uniform weights do not depend on the queries: new query weights change nothing.
  for (size_t i = 0; i < size_t(d.QD()) * d.C; ++i) p[L.wq + i] = 3 * rng.normal();
  cca_forward(again.data(), h.data(), L.weights(p), L.rope, d);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], again[i], 1e-12) << i;
}

TEST(Cca, FloatAgreesWithDouble) {
  const CcaDims d = dims(6, 2, 2);
  const Layer L(d, 2);
  Rng rng(7);
  const size_t NC = size_t(d.N()) * d.C;
  std::vector<double> h = randn(rng, NC), p = randn(rng, L.total, 0.5), dout = randn(rng, NC);
  std::vector<double> out(NC), dh(NC, 0.0), g(L.total, 0.0);
  cca_forward(out.data(), h.data(), L.weights(p), L.rope, d);
  cca_backward(dh.data(), L.grads(g), dout.data(), h.data(), L.weights(p), L.rope, d);
  const auto hf = test::to_float(h), pf = test::to_float(p), doutf = test::to_float(dout);
  const auto rope_f = RopeTable<float>::build(d.T, d.HD, 10000.0, 2);
  std::vector<float> outf(NC), dhf(NC, 0.f), gf(L.total, 0.f);
  cca_forward(outf.data(), hf.data(), L.weights(pf), rope_f, d);
  float* b = gf.data();
  const CcaGrads<float> G{b + L.wq, b + L.wk, b + L.wvc, b + L.wvd, b + L.w0, b + L.b0, b + L.w1, b + L.b1, b + L.temp, b + L.wo};
  cca_backward(dhf.data(), G, doutf.data(), hf.data(), L.weights(pf), rope_f, d);
  EXPECT_TRUE(test::float_close("out", outf, out));
  EXPECT_TRUE(test::float_close("dh", dhf, dh));
  EXPECT_TRUE(test::float_close("dparams", gf, g));
}

}  // namespace
}  // namespace atl
