// Plain SGD: the update against its closed form, weight decay only where the layout says, and
// linearity in the gradient (the property the DiLoCo H=1 equivalence rests on, sgd.h).
#include "atoll/optim/sgd.h"

#include <gtest/gtest.h>

#include <cmath>

#include <vector>

#include "atoll/core/rng.h"
#include "atoll/optim/optimizer.h"

namespace atl {
namespace {

TEST(Sgd, UpdateIsDecayThenGradientStep) {
  // Sizes 0, 1, odd, and above the parallel threshold.
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1} << 16}) {
    Rng rng(n + 1);
    std::vector<float> p(n), g(n);
    for (size_t i = 0; i < n; ++i) p[i] = float(rng.normal()), g[i] = float(rng.normal());
    std::vector<float> q = p;
    sgd_update(q.data(), g.data(), n, {.lr = 0.25, .weight_decay = 0.5});
    // decay = 1 - 0.125 and lr = 0.25 are exact; the kernel (-O3) may fuse a multiply-add that
    // this file (-O1) does not, so the fp32 results may differ by a rounding of the terms.
    for (size_t i = 0; i < n; ++i) {
      const double want = double(p[i]) * 0.875 - 0.25 * double(g[i]);
      const double terms = std::abs(double(p[i]) * 0.875) + std::abs(0.25 * double(g[i]));
      ASSERT_LE(std::abs(double(q[i]) - want), terms * 0x1p-23) << i;  // the rounding of the terms
    }
  }
}

TEST(Sgd, OptimizerAppliesDecayOnlyWhereTheTableSays) {
  ModelConfig m;
  m.vocab_size = 16, m.dim = 8, m.n_layers = 1, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4;
  m.n_experts = 2, m.top_k = 1, m.expert_hidden = 12;
  const ParamLayout layout = ParamLayout::build(m);
  OptimConfig cfg;
  cfg.name = "sgd";
  cfg.weight_decay = 0.5;
  Optimizer opt(cfg, layout);
  std::vector<float> p(layout.total(), 1.0f), g(layout.total(), 0.0f);
  opt.step(p.data(), g.data(), 0.5);
  EXPECT_EQ(opt.step_count(), 1);
  for (const ParamEntry& e : layout.entries())
    EXPECT_EQ(p[e.offset], e.takes_weight_decay() ? 0.75f : 1.0f) << e.name;
}

// The mean of two SGD steps from the same point equals one step on the mean gradient, to
// rounding (|diff| within a few ulps of the parameters).
TEST(Sgd, IsLinearInTheGradient) {
  const size_t n = 1000;
  Rng rng(3);
  std::vector<float> p(n), g1(n), g2(n), gm(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = float(rng.normal()), g1[i] = float(rng.normal()), g2[i] = float(rng.normal());
    gm[i] = (g1[i] + g2[i]) * 0.5f;
  }
  std::vector<float> a = p, b = p, c = p;
  const SgdOptions o{.lr = 0.01, .weight_decay = 0.1};
  sgd_update(a.data(), g1.data(), n, o);
  sgd_update(b.data(), g2.data(), n, o);
  sgd_update(c.data(), gm.data(), n, o);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR((a[i] + b[i]) * 0.5f, c[i], 1e-6f * (1 + std::abs(c[i]))) << i;
}

}  // namespace
}  // namespace atl
