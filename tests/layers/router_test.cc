// MoE router: softmax over experts, top-k by probability (ties to the lower index), weights
// renormalised; the Switch load-balancing loss and the router z-loss.
#include "atoll/layers/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

struct Routed {
  std::vector<double> probs, lse, topk_w;
  std::vector<int32_t> topk_idx;
};

Routed route(const std::vector<double>& logits, int N, int E, int K) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Routed r{std::vector<double>(size_t(N) * E, nan), std::vector<double>(N, nan),
           std::vector<double>(size_t(N) * K, nan), std::vector<int32_t>(size_t(N) * K, -7)};
  router_forward(r.probs.data(), r.lse.data(), r.topk_idx.data(), r.topk_w.data(), logits.data(), N, E, K);
  return r;
}

// Logits whose sorted values are at least `gap` apart in every row: a random permutation of
// 0, −gap·1.x, −gap·2.x, ... . A finite-difference step h moves a logit by h ≪ gap, so the
// top-k set cannot change under ±h: the kink of the selection is never crossed.
std::vector<double> separated_logits(Rng& rng, int N, int E, double gap) {
  std::vector<double> logits(size_t(N) * E);
  std::vector<int> perm(E);
  for (int n = 0; n < N; ++n) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int e = E - 1; e > 0; --e) std::swap(perm[e], perm[rng.below(uint64_t(e) + 1)]);
    for (int e = 0; e < E; ++e) logits[size_t(n) * E + perm[e]] = 1.0 - gap * (e + 0.2 * rng.uniform());
  }
  return logits;
}

TEST(Router, ProbabilitiesAndLseMatchSoftmax) {
  const int N = 4, E = 7, K = 2;
  Rng rng(1);
  const auto logits = randn(rng, N * E, 2.0);
  const Routed r = route(logits, N, E, K);
  for (int n = 0; n < N; ++n) {
    double s = 0.0;
    for (int e = 0; e < E; ++e) s += std::exp(logits[n * E + e]);
    EXPECT_NEAR(r.lse[n], std::log(s), 1e-14);
    double psum = 0.0;
    for (int e = 0; e < E; ++e) {
      EXPECT_NEAR(r.probs[n * E + e], std::exp(logits[n * E + e]) / s, 1e-15);
      psum += r.probs[n * E + e];
    }
    EXPECT_NEAR(psum, 1.0, 1e-15);
  }
}

TEST(Router, TopKSortedDescendingWithTiesToLowerIndex) {
  const int E = 5, K = 3;
  // Row 0: three-way tie at 3 among 1, 2, 4. Row 1: all equal. Row 2: tie for the last slot
  // between 0 and 3 (0 wins). Row 3: descending order differs from index order.
  const std::vector<double> logits = {1,  3,   3, 0,  3,  //
                                      0,  0,   0, 0,  0,  //
                                      2,  5,   4, 2,  1,  //
                                      -1, 0.5, 3, -2, 2};
  const std::vector<int32_t> expect = {1, 2, 4, 0, 1, 2, 1, 2, 0, 2, 4, 1};
  const Routed r = route(logits, 4, E, K);
  EXPECT_EQ(r.topk_idx, expect);
  // Equal probabilities renormalise to exactly equal weights.
  for (int j = 0; j < K; ++j) EXPECT_NEAR(r.topk_w[j], 1.0 / 3, 1e-15);
}

// On random rows: distinct experts, probabilities non-increasing along the slots, nothing left
// out that beats the last chosen one, weights p/Σp summing to 1.
TEST(Router, TopKPropertiesOnRandomRows) {
  for (auto [E, K] : {std::pair{8, 2}, {5, 1}, {6, 6}, {9, 4}}) {
    SCOPED_TRACE(testing::Message() << "E=" << E << " K=" << K);
    const int N = 33;
    Rng rng(2);
    const auto logits = randn(rng, N * E, 1.5);
    const Routed r = route(logits, N, E, K);
    for (int n = 0; n < N; ++n) {
      const double* p = &r.probs[n * E];
      const int32_t* idx = &r.topk_idx[n * K];
      const double* w = &r.topk_w[n * K];
      std::vector<bool> chosen(E, false);
      double psum = 0.0, wsum = 0.0;
      for (int j = 0; j < K; ++j) {
        ASSERT_TRUE(idx[j] >= 0 && idx[j] < E);
        EXPECT_FALSE(chosen[idx[j]]) << "expert chosen twice";
        chosen[idx[j]] = true;
        if (j > 0) {
          EXPECT_GE(p[idx[j - 1]], p[idx[j]]);
        }
        psum += p[idx[j]];
        wsum += w[j];
      }
      for (int j = 0; j < K; ++j) EXPECT_NEAR(w[j], p[idx[j]] / psum, 1e-15);
      EXPECT_NEAR(wsum, 1.0, 1e-15);
      for (int e = 0; e < E; ++e)
        if (!chosen[e]) {
          EXPECT_LE(p[e], p[idx[K - 1]]);
        }
      if (K == 1) {
        EXPECT_EQ(w[0], 1.0);
      }
    }
  }
}

// aux = coef · E · Σ_i f_i P_i and z = coef · mean_n lse_n², written out here.
TEST(Router, LossesMatchDirectComputation) {
  const int N = 7, E = 6, K = 2;
  const double aux_coef = 0.01, z_coef = 0.001;
  Rng rng(3);
  const auto logits = randn(rng, N * E, 2.0);
  const Routed r = route(logits, N, E, K);
  std::vector<double> f(E, 0.0), P(E, 0.0);
  for (int32_t e : r.topk_idx) f[e] += 1.0 / (N * K);
  double z = 0.0;
  for (int n = 0; n < N; ++n) {
    double s = 0.0;
    for (int e = 0; e < E; ++e) s += std::exp(logits[n * E + e]);
    for (int e = 0; e < E; ++e) P[e] += std::exp(logits[n * E + e]) / s / N;
    z += std::log(s) * std::log(s) / N;
  }
  double aux = 0.0;
  for (int e = 0; e < E; ++e) aux += aux_coef * E * f[e] * P[e];
  const RouterLosses l = router_losses(r.probs.data(), r.lse.data(), r.topk_idx.data(), N, E, K, aux_coef, z_coef);
  EXPECT_NEAR(l.aux, aux, 1e-15);
  EXPECT_NEAR(l.z, z_coef * z, 1e-15);
}

// Closed forms: uniform router probabilities give aux = coef whatever the routing (Σ f_i = 1,
// P_i = 1/E), and z = coef · (log E)². No tokens: both zero.
TEST(Router, LossesClosedForms) {
  const int N = 5, E = 4, K = 2;
  const std::vector<double> logits(N * E, 0.0);
  const Routed r = route(logits, N, E, K);
  const RouterLosses l = router_losses(r.probs.data(), r.lse.data(), r.topk_idx.data(), N, E, K, 0.02, 0.5);
  EXPECT_NEAR(l.aux, 0.02, 1e-16);
  EXPECT_NEAR(l.z, 0.5 * std::log(4.0) * std::log(4.0), 1e-15);
  const RouterLosses none = router_losses<double>(nullptr, nullptr, nullptr, 0, E, K, 0.02, 0.5);
  EXPECT_EQ(none.aux, 0.0);
  EXPECT_EQ(none.z, 0.0);
  // Everything on expert 0 with p_0 = 1 is the worst imbalance: aux = coef · E.
  const std::vector<double> peaked = {0, -1000, -1000, -1000};
  const Routed one = route(peaked, 1, E, 1);
  EXPECT_NEAR(router_losses(one.probs.data(), one.lse.data(), one.topk_idx.data(), 1, E, 1, 0.02, 0.0).aux, 0.02 * E,
              1e-15);
}

// The loss seen by the router: the combine's Σ_j w_j · dtopk_w_j (a linear stand-in for the
// rest of the network) plus loss_scale · (aux + z). The routing is asserted to be the same at
// every perturbed point, so the finite differences never straddle a top-k switch.
TEST(RouterGrad, MatchesFiniteDifferencesAwayFromTopKKink) {
  const int N = 6, E = 5, K = 2;
  const double loss_scale = 0.7;
  struct Case {
    const char* name;
    bool combine;
    double aux_coef, z_coef;
  };
  for (const Case c : {Case{"combine only", true, 0.0, 0.0}, Case{"aux only", false, 0.3, 0.0},
                       Case{"z only", false, 0.0, 0.2}, Case{"all terms", true, 0.3, 0.2}}) {
    SCOPED_TRACE(c.name);
    Rng rng(4);
    // Sorted logits ≥ 0.8 apart, so the k-th and (k+1)-th probabilities differ by a factor
    // e^0.8 ≈ 2.2, while a step of h = 1e-5 changes their ratio by at most e^2e-5 − 1 ≈ 2e-5.
    const auto logits = separated_logits(rng, N, E, 0.8);
    auto dtopk_w = randn(rng, N * K);
    if (!c.combine) std::fill(dtopk_w.begin(), dtopk_w.end(), 0.0);
    const Routed base = route(logits, N, E, K);
    for (int n = 0; n < N; ++n) {  // the margin really is there
      const double* p = &base.probs[n * E];
      double kth_next = 0.0;
      for (int e = 0; e < E; ++e)
        if (std::find(&base.topk_idx[n * K], &base.topk_idx[n * K] + K, e) == &base.topk_idx[n * K] + K)
          kth_next = std::max(kth_next, p[e]);
      ASSERT_GT(p[base.topk_idx[n * K + K - 1]], 2.0 * kth_next);
    }
    int routing_changed = 0;
    auto loss = [&](const std::vector<double>& x) {
      const Routed r = route(x, N, E, K);
      if (r.topk_idx != base.topk_idx) ++routing_changed;
      const RouterLosses l =
          router_losses(r.probs.data(), r.lse.data(), r.topk_idx.data(), N, E, K, c.aux_coef, c.z_coef);
      return test::dot(r.topk_w, dtopk_w) + loss_scale * (l.aux + l.z);
    };
    std::vector<double> dlogits(N * E, std::numeric_limits<double>::quiet_NaN());
    router_backward(dlogits.data(), dtopk_w.data(), base.probs.data(), base.lse.data(), base.topk_idx.data(),
                    base.topk_w.data(), N, E, K, c.aux_coef, c.z_coef, loss_scale);
    EXPECT_TRUE(check_grad("dlogits", loss, logits, dlogits));
    EXPECT_EQ(routing_changed, 0) << "a ±h perturbation changed the top-k set";
    if (!c.combine && c.z_coef == 0.0) {
      // The aux loss must contribute something, or the "aux only" case checks nothing.
      double mag = 0;
      for (double g : dlogits) mag += std::abs(g);
      EXPECT_GT(mag, 1e-3);
    }
  }
}

// K = 1: the single weight is identically 1, so the combine gradient vanishes; only the
// auxiliary losses reach the logits.
TEST(RouterGrad, TopOneCombineGradientIsZero) {
  const int N = 4, E = 3, K = 1;
  Rng rng(5);
  const auto logits = separated_logits(rng, N, E, 1.0);
  const auto dtopk_w = randn(rng, N * K);
  const Routed r = route(logits, N, E, K);
  std::vector<double> dlogits(N * E);
  router_backward(dlogits.data(), dtopk_w.data(), r.probs.data(), r.lse.data(), r.topk_idx.data(), r.topk_w.data(), N,
                  E, K, 0.0, 0.0, 1.0);
  for (double g : dlogits) EXPECT_NEAR(g, 0.0, 1e-16);
}

TEST(Router, FloatMatchesDouble) {
  const int N = 37, E = 9, K = 3;
  Rng rng(6);
  const auto logits = separated_logits(rng, N, E, 0.5);  // same routing in float and double
  const auto dtopk_w = randn(rng, N * K);
  const Routed r = route(logits, N, E, K);
  const auto lf = test::to_float(logits);
  std::vector<float> probs(N * E), lse(N), w(N * K);
  std::vector<int32_t> idx(N * K);
  router_forward(probs.data(), lse.data(), idx.data(), w.data(), lf.data(), N, E, K);
  EXPECT_EQ(idx, r.topk_idx);
  EXPECT_TRUE(test::float_close("probs", probs, r.probs));
  EXPECT_TRUE(test::float_close("lse", lse, r.lse));
  EXPECT_TRUE(test::float_close("topk_w", w, r.topk_w));
  const RouterLosses ld = router_losses(r.probs.data(), r.lse.data(), r.topk_idx.data(), N, E, K, 0.01, 0.001);
  const RouterLosses lf_ = router_losses(probs.data(), lse.data(), idx.data(), N, E, K, 0.01, 0.001);
  EXPECT_NEAR(lf_.aux, ld.aux, 1e-5 * ld.aux);
  EXPECT_NEAR(lf_.z, ld.z, 1e-5 * ld.z);
  std::vector<double> dl(N * E);
  std::vector<float> dlf(N * E);
  const auto dwf = test::to_float(dtopk_w);
  router_backward(dl.data(), dtopk_w.data(), r.probs.data(), r.lse.data(), r.topk_idx.data(), r.topk_w.data(), N, E, K,
                  0.01, 0.001, 1.0);
  router_backward(dlf.data(), dwf.data(), probs.data(), lse.data(), idx.data(), w.data(), N, E, K, 0.01, 0.001, 1.0);
  EXPECT_TRUE(test::float_close("dlogits", dlf, dl));
}

}  // namespace
}  // namespace atl
