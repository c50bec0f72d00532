// SwiGLU gate: out = silu(a) * b; da, db overwritten (=); da may alias dout.
#include "atoll/layers/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

std::vector<double> forward(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size(), std::numeric_limits<double>::quiet_NaN());
  swiglu_forward(out.data(), a.data(), b.data(), a.size());
  return out;
}

TEST(SwiGlu, ForwardMatchesDefinition) {
  Rng rng(1);
  const auto a = test::randu(rng, 41, -8.0, 8.0), b = randn(rng, 41);
  const auto out = forward(a, b);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(out[i], a[i] / (1.0 + std::exp(-a[i])) * b[i], 1e-15 * (1 + std::abs(out[i]))) << i;
  // Saturated ends: silu(a) -> a for large a, -> 0 for very negative a, finite throughout.
  const std::vector<double> big = {-800.0, 800.0}, one = {1.0, 1.0};
  const auto sat = forward(big, one);
  EXPECT_EQ(sat[0], -0.0);
  EXPECT_EQ(sat[1], 800.0);
}

TEST(SwiGluGrad, MatchesFiniteDifferences) {
  const size_t n = 37;
  Rng rng(2);
  const auto a = test::randu(rng, n, -4.0, 4.0), b = randn(rng, n), dout = randn(rng, n);
  std::vector<double> da(n, std::numeric_limits<double>::quiet_NaN()), db = da;
  swiglu_backward(da.data(), db.data(), dout.data(), a.data(), b.data(), n);
  EXPECT_TRUE(check_grad(
      "da", [&](const std::vector<double>& x) { return test::dot(forward(x, b), dout); }, a, da));
  EXPECT_TRUE(check_grad(
      "db", [&](const std::vector<double>& x) { return test::dot(forward(a, x), dout); }, b, db));
}

// The experts call swiglu_backward(da, db, da, ...) to reuse the dg buffer as da.
TEST(SwiGluGrad, InPlaceDoutAliasingDaGivesSameResult) {
  const size_t n = 29;
  Rng rng(3);
  const auto a = randn(rng, n, 2.0), b = randn(rng, n), dout = randn(rng, n);
  std::vector<double> da(n), db(n), db2(n);
  swiglu_backward(da.data(), db.data(), dout.data(), a.data(), b.data(), n);
  std::vector<double> buf = dout;
  swiglu_backward(buf.data(), db2.data(), buf.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(buf[i], da[i]) << i;
    EXPECT_EQ(db2[i], db[i]) << i;
  }
}

TEST(SwiGlu, FloatMatchesDouble) {
  const size_t n = 131;
  Rng rng(4);
  const auto a = randn(rng, n, 3.0), b = randn(rng, n), dout = randn(rng, n);
  const auto af = test::to_float(a), bf = test::to_float(b), df = test::to_float(dout);
  std::vector<float> outf(n), daf(n), dbf(n);
  swiglu_forward(outf.data(), af.data(), bf.data(), n);
  EXPECT_TRUE(test::float_close("out", outf, forward(a, b)));
  std::vector<double> da(n), db(n);
  swiglu_backward(da.data(), db.data(), dout.data(), a.data(), b.data(), n);
  swiglu_backward(daf.data(), dbf.data(), df.data(), af.data(), bf.data(), n);
  EXPECT_TRUE(test::float_close("da", daf, da));
  EXPECT_TRUE(test::float_close("db", dbf, db));
}

}  // namespace
}  // namespace atl
