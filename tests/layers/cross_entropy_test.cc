// Cross-entropy: forward returns Σ_n (lse_n − logits[n, target_n]); backward writes
// dlogits (=) = scale * (softmax − onehot), possibly in place over the logits.
#include "atoll/layers/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "atoll/core/check.h"
#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

TEST(CrossEntropy, ForwardMatchesDirectComputation) {
  const int N = 4, V = 11;
  Rng rng(1);
  const auto logits = randn(rng, N * V, 2.0);
  const std::vector<int32_t> targets = {0, 10, 3, 3};
  std::vector<double> lse(N);
  const double loss = cross_entropy_forward(lse.data(), logits.data(), targets.data(), N, V);
  double expect = 0.0;
  for (int n = 0; n < N; ++n) {
    double s = 0.0;
    for (int v = 0; v < V; ++v) s += std::exp(logits[n * V + v]);
    EXPECT_NEAR(lse[n], std::log(s), 1e-14);
    expect += std::log(s) - logits[n * V + targets[n]];
  }
  EXPECT_NEAR(loss, expect, 1e-13);
  // lse may be null; uniform logits give exactly log V per row.
  std::vector<double> zeros(N * V, 0.0);
  EXPECT_NEAR(cross_entropy_forward<double>(nullptr, zeros.data(), targets.data(), N, V), N * std::log(double(V)),
              1e-13);
}

// Huge logits (1e4) must not overflow: the max is subtracted before exponentiating.
TEST(CrossEntropy, StableForLargeLogits) {
  const int N = 2, V = 5;
  Rng rng(2);
  auto logits = randn(rng, N * V);
  const std::vector<int32_t> targets = {1, 4};
  const double base = cross_entropy_forward<double>(nullptr, logits.data(), targets.data(), N, V);
  for (auto& x : logits) x += 1e4;
  std::vector<float> lf(test::to_float(logits)), lsef(N);
  const double shifted = cross_entropy_forward<double>(nullptr, logits.data(), targets.data(), N, V);
  EXPECT_NEAR(shifted, base, 1e-11);
  const double shifted_f = cross_entropy_forward(lsef.data(), lf.data(), targets.data(), N, V);
  EXPECT_TRUE(std::isfinite(shifted_f));
  EXPECT_NEAR(shifted_f, base, 1e-2);  // float logits near 1e4 are only good to ~1e-3
}

TEST(CrossEntropy, RejectsTargetsOutsideVocabulary) {
  const int V = 3;
  std::vector<double> logits(2 * V, 0.0);
  const std::vector<int32_t> hi = {0, 3}, lo = {-1, 0};
  EXPECT_THROW(cross_entropy_forward<double>(nullptr, logits.data(), hi.data(), 2, V), CheckError);
  EXPECT_THROW(cross_entropy_forward<double>(nullptr, logits.data(), lo.data(), 2, V), CheckError);
}

TEST(CrossEntropyGrad, MatchesFiniteDifferences) {
  const int N = 4, V = 11;
  const double scale = 0.37;  // e.g. 1 / (tokens in the batch)
  Rng rng(3);
  const auto logits = randn(rng, N * V, 2.0);
  const std::vector<int32_t> targets = {0, 10, 3, 3};
  std::vector<double> lse(N), dlogits(N * V, std::numeric_limits<double>::quiet_NaN());
  cross_entropy_forward(lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V, scale);
  auto loss = [&](const std::vector<double>& x) {
    return scale * cross_entropy_forward<double>(nullptr, x.data(), targets.data(), N, V);
  };
  EXPECT_TRUE(check_grad("dlogits", loss, logits, dlogits));
  // Each row of softmax − onehot sums to zero.
  for (int n = 0; n < N; ++n) {
    double s = 0.0;
    for (int v = 0; v < V; ++v) s += dlogits[n * V + v];
    EXPECT_NEAR(s, 0.0, 1e-15);
  }
}

// dlogits == logits: the model overwrites each chunk of logits with its gradient.
TEST(CrossEntropyGrad, InPlaceMatchesOutOfPlace) {
  const int N = 5, V = 17;
  Rng rng(4);
  const auto logits = randn(rng, N * V, 3.0);
  const std::vector<int32_t> targets = {16, 0, 5, 5, 9};
  std::vector<double> lse(N), d(N * V);
  cross_entropy_forward(lse.data(), logits.data(), targets.data(), N, V);
  cross_entropy_backward(d.data(), logits.data(), lse.data(), targets.data(), N, V, 0.5);
  auto buf = logits;
  cross_entropy_backward(buf.data(), buf.data(), lse.data(), targets.data(), N, V, 0.5);
  for (int i = 0; i < N * V; ++i) EXPECT_EQ(buf[i], d[i]) << i;
  // The same in float.
  auto lf = test::to_float(logits);
  std::vector<float> lsef(N), df(N * V);
  cross_entropy_forward(lsef.data(), lf.data(), targets.data(), N, V);
  cross_entropy_backward(df.data(), lf.data(), lsef.data(), targets.data(), N, V, 0.5f);
  cross_entropy_backward(lf.data(), lf.data(), lsef.data(), targets.data(), N, V, 0.5f);
  for (int i = 0; i < N * V; ++i) EXPECT_EQ(lf[i], df[i]) << i;
}

TEST(CrossEntropy, FloatMatchesDouble) {
  const int N = 7, V = 130;
  Rng rng(5);
  const auto logits = randn(rng, N * V, 2.0);
  std::vector<int32_t> targets(N);
  for (auto& t : targets) t = int32_t(rng.below(V));
  std::vector<double> lse(N), d(N * V);
  const double loss = cross_entropy_forward(lse.data(), logits.data(), targets.data(), N, V);
  const auto lf = test::to_float(logits);
  std::vector<float> lsef(N), df(N * V);
  const double lossf = cross_entropy_forward(lsef.data(), lf.data(), targets.data(), N, V);
  EXPECT_NEAR(lossf, loss, 1e-5 * std::abs(loss));
  EXPECT_TRUE(test::float_close("lse", lsef, lse));
  cross_entropy_backward(d.data(), logits.data(), lse.data(), targets.data(), N, V, 1.0 / N);
  cross_entropy_backward(df.data(), lf.data(), lsef.data(), targets.data(), N, V, 1.0f / N);
  EXPECT_TRUE(test::float_close("dlogits", df, d));
}

}  // namespace
}  // namespace atl
