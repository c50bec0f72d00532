// Linear without bias: out = in · wᵀ, w [OC, IC]; din and dw accumulate (+=).
#include "atoll/layers/linear.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

std::vector<double> forward(const std::vector<double>& in, const std::vector<double>& w, int N, int IC, int OC) {
  std::vector<double> out(size_t(N) * OC, std::numeric_limits<double>::quiet_NaN());  // (=): NaN must vanish
  linear_forward(out.data(), in.data(), w.data(), N, IC, OC);
  return out;
}

TEST(Linear, ForwardMatchesNaiveProduct) {
  const int N = 5, IC = 7, OC = 3;
  Rng rng(1);
  const auto in = test::randint(rng, N * IC, 5), w = test::randint(rng, OC * IC, 5);
  const auto out = forward(in, w, N, IC, OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = 0.0;
      for (int i = 0; i < IC; ++i) s += in[n * IC + i] * w[o * IC + i];
      EXPECT_EQ(out[n * OC + o], s) << n << "," << o;  // integers: exact
    }
}

TEST(LinearGrad, MatchesFiniteDifferences) {
  const int N = 5, IC = 7, OC = 3;
  Rng rng(2);
  const auto in = randn(rng, N * IC), w = randn(rng, OC * IC), dout = randn(rng, N * OC);
  std::vector<double> din(in.size(), 0.0), dw(w.size(), 0.0);
  linear_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  EXPECT_TRUE(check_grad(
      "din", [&](const std::vector<double>& x) { return test::dot(forward(x, w, N, IC, OC), dout); }, in, din));
  EXPECT_TRUE(check_grad(
      "dw", [&](const std::vector<double>& x) { return test::dot(forward(in, x, N, IC, OC), dout); }, w, dw));
}

// din and dw are (+=). Integer data make every product and sum exact, so the check is bit for
// bit whatever order the BLAS adds in. Either output may be null and is then skipped.
TEST(LinearGrad, AccumulatesIntoPrefilledBuffersAndSkipsNull) {
  const int N = 6, IC = 5, OC = 4;
  Rng rng(3);
  const auto in = test::randint(rng, N * IC, 4), w = test::randint(rng, OC * IC, 4);
  const auto dout = test::randint(rng, N * OC, 4);
  std::vector<double> gin(in.size(), 0.0), gw(w.size(), 0.0);
  linear_backward(gin.data(), gw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  const auto pin = test::randint(rng, in.size(), 50), pw = test::randint(rng, w.size(), 50);
  auto din = pin, dw = pw;
  linear_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  linear_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  for (size_t i = 0; i < din.size(); ++i) EXPECT_EQ(din[i], pin[i] + 2 * gin[i]) << i;
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(dw[i], pw[i] + 2 * gw[i]) << i;

  auto din_only = pin;
  linear_backward(din_only.data(), static_cast<double*>(nullptr), dout.data(), in.data(), w.data(), N, IC, OC);
  for (size_t i = 0; i < din.size(); ++i) EXPECT_EQ(din_only[i], pin[i] + gin[i]) << i;
  auto dw_only = pw;
  linear_backward(static_cast<double*>(nullptr), dw_only.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(dw_only[i], pw[i] + gw[i]) << i;
}

// The checker itself must flag wrong gradients, or every test above passes vacuously: a
// gradient off by 1e-4 relative in one coordinate, a transposed one, and a NaN.
TEST(GradCheckHelper, FlagsWrongGradients) {
  const int N = 3, IC = 4, OC = 2;
  Rng rng(9);
  const auto in = randn(rng, N * IC), w = randn(rng, OC * IC), dout = randn(rng, N * OC);
  std::vector<double> dw(w.size(), 0.0);
  linear_backward(static_cast<double*>(nullptr), dw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
  auto loss = [&](const std::vector<double>& x) { return test::dot(forward(in, x, N, IC, OC), dout); };
  ASSERT_TRUE(check_grad("dw", loss, w, dw));
  auto off = dw;
  off[5] *= 1 + 1e-4;
  EXPECT_FALSE(check_grad("dw", loss, w, off));
  std::vector<double> transposed(dw.size());
  for (int o = 0; o < OC; ++o)
    for (int i = 0; i < IC; ++i) transposed[i * OC + o] = dw[o * IC + i];
  EXPECT_FALSE(check_grad("dw", loss, w, transposed));
  auto nan = dw;
  nan[0] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(check_grad("dw", loss, w, nan));
  test::GradCheckOptions subset;
  subset.max_coords = 5;
  EXPECT_TRUE(check_grad("dw", loss, w, dw, subset));
}

TEST(Linear, FloatMatchesDouble) {
  for (auto [N, IC, OC] : {std::tuple{1, 1, 1}, {7, 33, 65}, {13, 130, 7}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " IC=" << IC << " OC=" << OC);
    Rng rng(4);
    const auto in = randn(rng, N * IC), w = randn(rng, OC * IC), dout = randn(rng, N * OC);
    const auto out = forward(in, w, N, IC, OC);
    std::vector<float> outf(out.size());
    const auto inf = test::to_float(in), wf = test::to_float(w), df = test::to_float(dout);
    linear_forward(outf.data(), inf.data(), wf.data(), N, IC, OC);
    EXPECT_TRUE(test::float_close("out", outf, out));
    std::vector<double> din(in.size(), 0.0), dw(w.size(), 0.0);
    std::vector<float> dinf(in.size(), 0.0f), dwf(w.size(), 0.0f);
    linear_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), N, IC, OC);
    linear_backward(dinf.data(), dwf.data(), df.data(), inf.data(), wf.data(), N, IC, OC);
    EXPECT_TRUE(test::float_close("din", dinf, din));
    EXPECT_TRUE(test::float_close("dw", dwf, dw));
  }
}

}  // namespace
}  // namespace atl
