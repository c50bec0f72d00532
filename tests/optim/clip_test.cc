// Global gradient norm and clipping: known norms, exact scaling, thread-count independence.
#include "atoll/optim/clip.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "atoll/core/rng.h"

namespace atl {
namespace {

TEST(GradNorm, KnownVectors) {
  const std::vector<float> v = {3.0f, 4.0f};
  EXPECT_EQ(global_grad_norm(v.data(), 2), 5.0);
  EXPECT_EQ(global_grad_norm(v.data(), 0), 0.0);
  // 1,000,003 elements of 0.5 (several blocks and a ragged end): the squares are multiples of
  // 0.25, so every partial sum is exact in double and the norm is exactly 0.5 sqrt(n).
  const size_t n = 1000003;
  const std::vector<float> halves(n, 0.5f);
  EXPECT_EQ(global_grad_norm(halves.data(), n), 0.5 * std::sqrt(double(n)));
}

TEST(GradNorm, SameForEveryThreadCount) {
  const size_t n = 300001;
  Rng rng(1);
  std::vector<float> g(n);
  for (float& x : g) x = float(rng.normal());
  long double ref = 0.0L;  // the sum in extended precision, a different order
  for (float x : g) ref += (long double)x * x;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = global_grad_norm(g.data(), n);
  for (int threads : {2, 3, 4}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(global_grad_norm(g.data(), n), one) << threads;  // bit-identical
  }
  omp_set_num_threads(saved);
  // Double accumulation over 3e5 positive terms: relative error well below 1e-12.
  EXPECT_NEAR(one, std::sqrt(double(ref)), 1e-12 * one);
}

TEST(ClipGradNorm, ScalesExactly) {
  const size_t n = 70001;
  Rng rng(2);
  std::vector<float> g(n);
  for (float& x : g) x = float(rng.normal());
  const std::vector<float> g0 = g;
  const double norm = global_grad_norm(g.data(), n), max_norm = norm / 4;
  EXPECT_EQ(clip_grad_norm(g.data(), n, max_norm), norm);  // the norm before clipping
  const float scale = float(max_norm / norm);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(g[i], g0[i] * scale) << i;
  // Each element is rounded once (relative 6e-8): the new norm is max_norm to ~1e-7.
  EXPECT_NEAR(global_grad_norm(g.data(), n), max_norm, 1e-6 * max_norm);
}

TEST(ClipGradNorm, LeavesGradientsAloneWhenNotNeeded) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_EQ(clip_grad_norm(g.data(), 2, 5.0), 5.0);  // norm == max: no clip
  EXPECT_EQ(clip_grad_norm(g.data(), 2, 0.0), 5.0);  // 0 = off
  EXPECT_EQ(g, (std::vector<float>{3.0f, 4.0f}));
  g[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(clip_grad_norm(g.data(), 2, 1.0)));
  EXPECT_EQ(g[0], 3.0f);  // a non-finite norm does not spread into the gradients
}

}  // namespace
}  // namespace atl
