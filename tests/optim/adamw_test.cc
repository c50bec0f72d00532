// AdamW against torch.optim.AdamW's update written out by hand: first in closed form on a
// 2x3 matrix for two steps (bias correction exercised), then against a plain double-precision
// transcription of the formulas.
#include "atoll/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "atoll/core/rng.h"

namespace atl {
namespace {

// The buffers are fp32 and each element takes about ten fp32 operations on values of order 1,
// so the result is within a few ulps (ulp(1) = 1.2e-7) of the exact value.
constexpr double kTol = 1e-6;

// torch.optim.AdamW (single tensor, amsgrad off), in double.
struct RefState {
  double p, m = 0.0, v = 0.0;
};
void ref_step(RefState* s, double g, int t, const AdamWOptions& o) {
  s->p *= 1.0 - o.lr * o.weight_decay;
  s->m = o.beta1 * s->m + (1.0 - o.beta1) * g;
  s->v = o.beta2 * s->v + (1.0 - o.beta2) * g * g;
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  s->p -= (o.lr / bc1) * s->m / (std::sqrt(s->v) / std::sqrt(bc2) + o.eps);
}

TEST(AdamW, TwoStepsByHandOn2x3) {
  const AdamWOptions opt{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f, -0.25f};     // [2, 3]
  std::vector<float> g1 = {0.5f, -1.0f, 2.0f, 0.25f, -0.125f, 4.0f};  // [2, 3]
  std::vector<float> m(6, 0.0f), v(6, 0.0f);
  const std::vector<float> p0 = p;

  // Step 1: m = 0.1 g, v = 0.05 g^2; bias corrections 0.1 and 0.05 give m^ = g, v^ = g^2, so
  // every element moves by lr * g / (|g| + eps) = lr * sign(g), after a decay of 1 - 0.01.
  adamw_update(p.data(), m.data(), v.data(), g1.data(), 6, 1, opt);
  for (int i = 0; i < 6; ++i) {
    const double g = g1[i];
    EXPECT_NEAR(m[i], 0.1 * g, kTol);
    EXPECT_NEAR(v[i], 0.05 * g * g, kTol);
    EXPECT_NEAR(p[i], p0[i] * 0.99 - 0.1 * g / (std::fabs(g) + 1e-8), kTol) << i;
  }

  // Step 2 with g2 = 2 g1: m = 0.9*0.1 g + 0.1*2g = 0.29 g, v = 0.95*0.05 g^2 + 0.05*4 g^2 =
  // 0.2475 g^2; bias corrections 1-0.81 = 0.19 and 1-0.9025 = 0.0975.
  std::vector<float> g2(6), p1 = p;
  for (int i = 0; i < 6; ++i) g2[i] = 2.0f * g1[i];
  adamw_update(p.data(), m.data(), v.data(), g2.data(), 6, 2, opt);
  for (int i = 0; i < 6; ++i) {
    const double g = g1[i];
    const double m_hat = 0.29 * g / 0.19, v_hat_sqrt = std::sqrt(0.2475 / 0.0975) * std::fabs(g);
    EXPECT_NEAR(m[i], 0.29 * g, kTol);
    EXPECT_NEAR(v[i], 0.2475 * g * g, kTol);
    EXPECT_NEAR(p[i], p1[i] * 0.99 - 0.1 * m_hat / (v_hat_sqrt + 1e-8), kTol) << i;
  }
}

TEST(AdamW, MatchesDoubleReferenceOverSeveralSteps) {
  const AdamWOptions opt{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const int n = 37;  // odd, not a multiple of any vector width
  Rng rng(7);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
  std::vector<RefState> ref(n);
  for (int i = 0; i < n; ++i) ref[i].p = p[i] = float(rng.normal());
  for (int t = 1; t <= 5; ++t) {
    for (int i = 0; i < n; ++i) g[i] = float(rng.normal() * 0.1);
    adamw_update(p.data(), m.data(), v.data(), g.data(), n, t, opt);
    for (int i = 0; i < n; ++i) ref_step(&ref[i], g[i], t, opt);
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], ref[i].p, kTol) << i;
    EXPECT_NEAR(m[i], ref[i].m, kTol) << i;
    EXPECT_NEAR(v[i], ref[i].v, kTol) << i;
  }
}

TEST(AdamW, ZeroGradientOnlyDecays) {
  // m and v stay 0, the step is 0 / (0 + eps) = 0: only the decay factor, rounded once.
  const AdamWOptions opt{.lr = 0.05, .weight_decay = 0.2};
  std::vector<float> p = {1.5f, -0.75f, 2.0f}, m(3, 0.0f), v(3, 0.0f), g(3, 0.0f);
  const std::vector<float> p0 = p;
  adamw_update(p.data(), m.data(), v.data(), g.data(), 3, 1, opt);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p[i], p0[i] * float(1.0 - 0.05 * 0.2));
  const AdamWOptions no_decay{.lr = 0.05, .weight_decay = 0.0};
  adamw_update(p.data(), m.data(), v.data(), g.data(), 3, 2, no_decay);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p[i], p0[i] * float(1.0 - 0.05 * 0.2));
}

TEST(AdamW, ParallelSpanEqualsPieces) {
  // A span large enough for the OpenMP path gives bit-identical results to the same elements
  // stepped in small serial pieces: elements are independent.
  const size_t n = (size_t{1} << 16) + 3;
  const AdamWOptions opt{.lr = 1e-2, .weight_decay = 0.1};
  Rng rng(3);
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) p[i] = float(rng.normal()), g[i] = float(rng.normal());
  std::vector<float> p2 = p, m2 = m, v2 = v;
  for (int t = 1; t <= 2; ++t) {
    adamw_update(p.data(), m.data(), v.data(), g.data(), n, t, opt);
    for (size_t i = 0; i < n; i += 1000) {
      const size_t len = std::min<size_t>(1000, n - i);
      adamw_update(p2.data() + i, m2.data() + i, v2.data() + i, g.data() + i, len, t, opt);
    }
  }
  EXPECT_EQ(p, p2);
  EXPECT_EQ(m, m2);
  EXPECT_EQ(v, v2);
}

}  // namespace
}  // namespace atl
