// Rotary position embedding (rotate-half). Forward rotates in place; backward applies the
// inverse (transposed) rotation, which is also the gradient of Σ rope(x) · dout.
#include "atoll/layers/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "atoll/core/check.h"
#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

constexpr double kTheta = 10000.0;

TEST(Rope, TableMatchesAngles) {
  const int T = 9, HD = 8;
  const auto tab = RopeTable<double>::build(T, HD, kTheta);
  ASSERT_EQ(tab.cos.size(), size_t(T * HD / 2));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < HD / 2; ++i) {
      const double angle = t * std::pow(kTheta, -2.0 * i / HD);
      EXPECT_NEAR(tab.cos[t * HD / 2 + i], std::cos(angle), 1e-15);
      EXPECT_NEAR(tab.sin[t * HD / 2 + i], std::sin(angle), 1e-15);
    }
}

// Against the rotate-half formula written out, with angles computed here.
TEST(Rope, ForwardMatchesRotateHalfFormula) {
  const int B = 2, T = 5, NHX = 3, HD = 8, half = HD / 2;
  Rng rng(1);
  const auto x = randn(rng, B * T * NHX * HD);
  auto y = x;
  rope_forward(y.data(), RopeTable<double>::build(T, HD, kTheta), B, T, NHX, HD);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NHX; ++h) {
        const size_t o = ((size_t(b) * T + t) * NHX + h) * HD;
        for (int i = 0; i < half; ++i) {
          const double a = t * std::pow(kTheta, -2.0 * i / HD);
          EXPECT_NEAR(y[o + i], x[o + i] * std::cos(a) - x[o + i + half] * std::sin(a), 1e-14);
          EXPECT_NEAR(y[o + i + half], x[o + i + half] * std::cos(a) + x[o + i] * std::sin(a), 1e-14);
        }
        if (t == 0) {  // angle 0: cos 1, sin 0 exactly, the identity
          for (int d = 0; d < HD; ++d) EXPECT_EQ(y[o + d], x[o + d]);
        }
      }
}

TEST(Rope, BackwardInvertsForward) {
  const int B = 2, T = 7, NHX = 3, HD = 10;
  Rng rng(2);
  const auto x = randn(rng, B * T * NHX * HD);
  const auto tab = RopeTable<double>::build(T, HD, kTheta);
  auto y = x;
  rope_forward(y.data(), tab, B, T, NHX, HD);
  rope_backward(y.data(), tab, B, T, NHX, HD);
  // cos² + sin² = 1 only to rounding of the table: a few ulps.
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-15 * (1 + std::abs(x[i]))) << i;
  // The rotation preserves norms per head.
  auto z = x;
  rope_forward(z.data(), tab, B, T, NHX, HD);
  for (size_t o = 0; o < x.size(); o += HD) {
    double nx = 0, nz = 0;
    for (int d = 0; d < HD; ++d) nx += x[o + d] * x[o + d], nz += z[o + d] * z[o + d];
    EXPECT_NEAR(nz, nx, 1e-14 * nx);
  }
}

// A table longer than the sequence is fine (rows 0..T-1 are used); a shorter one is refused.
TEST(Rope, ChecksTableSize) {
  const int B = 1, T = 4, NHX = 1, HD = 4;
  std::vector<double> x(B * T * NHX * HD, 1.0);
  EXPECT_NO_THROW(rope_forward(x.data(), RopeTable<double>::build(8, HD, kTheta), B, T, NHX, HD));
  EXPECT_THROW(rope_forward(x.data(), RopeTable<double>::build(3, HD, kTheta), B, T, NHX, HD), CheckError);
  EXPECT_THROW(rope_backward(x.data(), RopeTable<double>::build(8, 6, kTheta), B, T, NHX, HD), CheckError);
}

// Decoding with a KV cache rotates a window of positions pos0 .. pos0+T-1: it must equal the
// same rows of a rotation of the whole sequence, bit for bit (same table rows, same arithmetic).
TEST(Rope, OffsetWindowMatchesFullSequence) {
  const int B = 2, T = 9, NHX = 3, HD = 6, W = 4;
  Rng rng(6);
  const auto x = randn(rng, B * T * NHX * HD);
  const auto tab = RopeTable<double>::build(T, HD, kTheta);
  auto full = x;
  rope_forward(full.data(), tab, B, T, NHX, HD);
  const size_t row = size_t(NHX) * HD;
  for (int pos0 = 0; pos0 + W <= T; ++pos0) {
    std::vector<double> win(B * W * row);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < W; ++t)
        for (size_t i = 0; i < row; ++i) win[(b * W + t) * row + i] = x[(b * T + pos0 + t) * row + i];
    rope_forward(win.data(), tab, B, W, NHX, HD, pos0);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < W; ++t)
        for (size_t i = 0; i < row; ++i)
          ASSERT_EQ(win[(b * W + t) * row + i], full[(b * T + pos0 + t) * row + i]) << "pos0=" << pos0;
  }
  std::vector<double> win(B * W * row, 1.0);
  EXPECT_THROW(rope_forward(win.data(), tab, B, W, NHX, HD, T - W + 1), CheckError);  // past the table
}

// Partial rotary (transformers' partial_rotary_factor): the first RD entries of each head
// rotate as a head of RD would (angles t * theta^(-2i/RD)), the other HD - RD pass through.
TEST(Rope, PartialRotaryRotatesTheFirstEntriesAsAHeadOfThatSize) {
  const int B = 2, T = 5, NHX = 3, HD = 8, RD = 4;
  Rng rng(8);
  const auto x = randn(rng, B * T * NHX * HD);
  auto y = x;
  rope_forward(y.data(), RopeTable<double>::build(T, HD, kTheta, RD), B, T, NHX, HD);
  std::vector<double> first(B * T * NHX * RD);
  for (size_t hd = 0; hd < first.size() / RD; ++hd)
    for (int i = 0; i < RD; ++i) first[hd * RD + i] = x[hd * HD + i];
  rope_forward(first.data(), RopeTable<double>::build(T, RD, kTheta), B, T, NHX, RD);
  for (size_t hd = 0; hd < first.size() / RD; ++hd) {
    for (int i = 0; i < RD; ++i) EXPECT_EQ(y[hd * HD + i], first[hd * RD + i]) << hd << "," << i;
    for (int i = RD; i < HD; ++i) EXPECT_EQ(y[hd * HD + i], x[hd * HD + i]) << "passes through: " << hd << "," << i;
  }
  auto back = y;
  rope_backward(back.data(), RopeTable<double>::build(T, HD, kTheta, RD), B, T, NHX, HD);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-15 * (1 + std::abs(x[i]))) << i;
  EXPECT_THROW(RopeTable<double>::build(T, HD, kTheta, HD + 2), CheckError);  // more than a head
}

// rope is linear and orthogonal, so the gradient of Σ rope(x)·dout is rope_backward(dout).
TEST(RopeGrad, MatchesFiniteDifferences) {
  const int B = 2, T = 5, NHX = 3, HD = 8;
  Rng rng(3);
  const auto x = randn(rng, B * T * NHX * HD), dout = randn(rng, x.size());
  const auto tab = RopeTable<double>::build(T, HD, kTheta);
  auto dx = dout;
  rope_backward(dx.data(), tab, B, T, NHX, HD);
  auto loss = [&](const std::vector<double>& v) {
    auto y = v;
    rope_forward(y.data(), tab, B, T, NHX, HD);
    return test::dot(y, dout);
  };
  test::GradCheckOptions opt;
  opt.max_coords = 60;  // a linear map: 60 of the 240 coordinates, spread over b, t, h, d
  EXPECT_TRUE(check_grad("dx", loss, x, dx, opt));
}

// The point of RoPE: q rotated at t and k rotated at s have a dot product that depends only on
// t − s. The same q (and k) is placed at every position of a sequence and rotated.
TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const int T = 12, HD = 16;
  Rng rng(4);
  const auto q0 = randn(rng, HD), k0 = randn(rng, HD);
  std::vector<double> q(T * HD), k(T * HD);
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < HD; ++d) q[t * HD + d] = q0[d], k[t * HD + d] = k0[d];
  const auto tab = RopeTable<double>::build(T, HD, kTheta);
  rope_forward(q.data(), tab, 1, T, 1, HD);
  rope_forward(k.data(), tab, 1, T, 1, HD);
  auto score = [&](int t, int s) {
    double acc = 0;
    for (int d = 0; d < HD; ++d) acc += q[t * HD + d] * k[s * HD + d];
    return acc;
  };
  for (int delta = -(T - 1); delta < T; ++delta) {
    const int t0 = delta > 0 ? delta : 0;
    const double ref = score(t0, t0 - delta);
    for (int t = t0; t < T && t - delta < T; ++t)
      EXPECT_NEAR(score(t, t - delta), ref, 1e-12) << "t=" << t << " s=" << t - delta;
  }
  // And it does depend on t − s (else the test would pass for the identity).
  EXPECT_GT(std::abs(score(3, 0) - score(0, 0)), 1e-3);
}

TEST(Rope, FloatMatchesDouble) {
  const int B = 3, T = 13, NHX = 5, HD = 18;  // HD/2 = 9: odd, not a vector width
  Rng rng(5);
  const auto x = randn(rng, B * T * NHX * HD);
  auto y = x;
  rope_forward(y.data(), RopeTable<double>::build(T, HD, kTheta), B, T, NHX, HD);
  auto yf = test::to_float(x);
  const auto tabf = RopeTable<float>::build(T, HD, kTheta);
  rope_forward(yf.data(), tabf, B, T, NHX, HD);
  EXPECT_TRUE(test::float_close("rope_forward", yf, y));
  auto g = x;
  rope_backward(g.data(), RopeTable<double>::build(T, HD, kTheta), B, T, NHX, HD);
  auto gf = test::to_float(x);
  rope_backward(gf.data(), tabf, B, T, NHX, HD);
  EXPECT_TRUE(test::float_close("rope_backward", gf, g));
}

}  // namespace
}  // namespace atl
