// Bias balancing (optim/bias_balance.h): a router whose probabilities favour one expert spreads
// its load toward even once its balancing biases are stepped from the load error; the loads'
// statistics; and the gradient norm leaving the load slots out.
#include "atoll/optim/bias_balance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/layers/router_zaya.h"
#include "atoll/optim/clip.h"

namespace atl {
namespace {

// A layout of one balanced row of E+1 classes, as a zaya router declares it.
ParamLayout one_router(int E) {
  ParamLayout layout;
  ParamEntry b = bias_entry("layers.0.moe.gate.balancing_biases", E + 1, 0);
  b.trainable = false, b.balanced = true, b.init = ParamInit::kBalancingBiases;
  layout.add(b);
  return layout;
}

// The load shares of a step: the router's choice over fixed probabilities plus the biases,
// counted into the row's gradient slot as the router's backward does (loss scale 1).
void route(std::vector<float>& grads, const std::vector<float>& probs, const float* biases, int N, int E1) {
  std::vector<float> p(probs.size()), gate(N);
  std::vector<int32_t> choice(N);
  std::vector<float> logits(probs.size());
  for (size_t i = 0; i < probs.size(); ++i) logits[i] = std::log(probs[i]);
  zaya_route_forward(p.data(), choice.data(), gate.data(), logits.data(), biases, N, E1, 1);
  std::vector<int64_t> counts(E1);
  zaya_class_counts(counts.data(), choice.data(), N, E1, 1);
  for (int e = 0; e < E1; ++e) grads[e] = float(double(counts[e]) / N);
}

// Probabilities that favour expert 0 for every token (0.5 against ~0.14 for the others): with
// zero biases every token goes to expert 0. Stepping the biases from the load error brings the
// load near even: the entropy of the load rises from 0 to near 1 and no expert keeps more than
// twice its share. The skip class (bias -1, the transformers default) is never chosen, and its
// bias never moves.
TEST(BiasBalance, RouterBiasedTowardOneExpertConvergesToEvenLoad) {
  const int E = 4, E1 = E + 1, N = 512;
  const ParamLayout layout = one_router(E);
  std::vector<float> params(layout.total(), 0.0f), m(layout.total(), 0.0f), v(layout.total(), 0.0f);
  std::vector<float> grads(layout.total(), 0.0f);
  params[E] = -1.0f;
  Rng rng(3);
  std::vector<float> probs(size_t(N) * E1);
  for (int n = 0; n < N; ++n) {
    double z = 0;
    for (int e = 0; e < E1; ++e) z += probs[n * E1 + e] = float(e == 0 ? 3.5 : 1.0 + 0.2 * rng.uniform());
    for (int e = 0; e < E1; ++e) probs[n * E1 + e] = float(probs[n * E1 + e] / z);
  }
  route(grads, probs, params.data(), N, E1);
  const RouterLoad first = router_load(grads.data(), layout.entries()[0]);
  EXPECT_EQ(first.max_load, 1.0);
  EXPECT_EQ(first.min_load, 0.0);
  EXPECT_NEAR(first.entropy, 0.0, 1e-12);
  const AdamWOptions opt{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  RouterLoad last;
  for (int t = 1; t <= 300; ++t) {
    balance_biases(params.data(), m.data(), v.data(), grads.data(), layout, t, opt);
    route(grads, probs, params.data(), N, E1);
    last = router_load(grads.data(), layout.entries()[0]);
  }
  EXPECT_GT(last.entropy, 0.95);
  EXPECT_LT(last.max_load, 2.0 / E);
  EXPECT_GT(last.min_load, 0.5 / E);
  EXPECT_EQ(last.skip_share, 0.0);
  EXPECT_EQ(params[E], -1.0f) << "the skip class's bias is never stepped";
  EXPECT_LT(params[0], params[1]) << "the favoured expert's bias fell below the others'";
}

// The skip class's slots count in skip_share but not in the experts' shares.
TEST(BiasBalance, LoadStatisticsLeaveTheSkipClassOut) {
  const ParamLayout layout = one_router(2);
  const std::vector<float> grads = {0.3f, 0.1f, 0.6f};  // expert 0, expert 1, skip
  const RouterLoad load = router_load(grads.data(), layout.entries()[0]);
  EXPECT_NEAR(load.max_load, 0.75, 1e-6);
  EXPECT_NEAR(load.min_load, 0.25, 1e-6);
  EXPECT_NEAR(load.skip_share, 0.6, 1e-6);
  EXPECT_NEAR(load.entropy, -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)) / std::log(2.0), 1e-6);
}

// A softmax router's load from its slot counts: the same statistics, no skip class.
TEST(BiasBalance, LoadFromCountsOfASoftmaxRouter) {
  const std::vector<double> counts = {6, 2, 0, 0};
  const RouterLoad load = router_load_from_counts(3, counts.data(), counts.size());
  EXPECT_EQ(load.layer, 3);
  EXPECT_DOUBLE_EQ(load.max_load, 0.75);
  EXPECT_DOUBLE_EQ(load.min_load, 0.0);
  EXPECT_DOUBLE_EQ(load.skip_share, 0.0);
  EXPECT_NEAR(load.entropy, -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)) / std::log(4.0), 1e-12);
  const std::vector<double> none(4, 0.0);
  EXPECT_EQ(router_load_from_counts(0, none.data(), 4).entropy, 0.0) << "no slot taken: nothing to measure";
}

// The gradient norm leaves the balanced rows' slots out, and without such rows is what it was.
TEST(BiasBalance, GradientNormLeavesTheLoadsOut) {
  std::vector<float> g = {3.0f, 0.5f, 0.5f, 4.0f};
  std::vector<float> h = g;
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), g.size(), 0.0, {{1, 2}}), 5.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(h.data(), h.size(), 0.0), std::sqrt(25.5));
  EXPECT_DOUBLE_EQ(clip_grad_norm(g.data(), g.size(), 1.0, {{1, 2}}), 5.0);
  EXPECT_FLOAT_EQ(g[0], 0.6f);
  EXPECT_FLOAT_EQ(g[1], 0.1f);  // scaled with the rest: the loads are read as ratios
}

}  // namespace
}  // namespace atl
