// The experts (SwiGLU MLPs over contiguous blocks of dispatched rows), and the whole MoE layer
// - router, dispatch, experts, combine - against a dense per-token computation.
#include "atoll/layers/expert_mlp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "atoll/layers/linear.h"
#include "atoll/layers/moe_dispatch.h"
#include "atoll/layers/router.h"
#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double silu(double a) { return a / (1.0 + std::exp(-a)); }

// Expert_e(x) = W2_e (silu(W1_e x) * (W3_e x)), written out for one vector.
std::vector<double> naive_expert(const double* x, const double* w1, const double* w3, const double* w2, int C, int H) {
  std::vector<double> g(H), y(C, 0.0);
  for (int h = 0; h < H; ++h) {
    double a = 0, b = 0;
    for (int c = 0; c < C; ++c) a += w1[h * C + c] * x[c], b += w3[h * C + c] * x[c];
    g[h] = silu(a) * b;
  }
  for (int c = 0; c < C; ++c)
    for (int h = 0; h < H; ++h) y[c] += w2[c * H + h] * g[h];
  return y;
}

struct Experts {
  int N, E, K, C, H;
  ExpertRouting routing;
  std::vector<int32_t> topk;
  std::vector<double> xe, w1, w3, w2, dye;
  size_t R() const { return size_t(N) * K; }
  size_t WH() const { return size_t(E) * H * C; }
};

// N=6 tokens, K=2, E=4: expert 0 receives no rows, expert 3 receives every odd token (and
// only those), experts 1 and 2 share the rest - empty, partial and uneven blocks.
Experts make_experts(uint64_t seed, int C = 5, int H = 6) {
  Experts ex{6, 4, 2, C, H, {}, {}, {}, {}, {}, {}, {}};
  for (int n = 0; n < ex.N; ++n) {
    if (n % 2 == 0) {
      ex.topk.insert(ex.topk.end(), {1, 2});
    } else {
      ex.topk.insert(ex.topk.end(), {3, n == 1 ? 2 : 1});
    }
  }
  build_routing(ex.routing, ex.topk.data(), ex.N, ex.E, ex.K);
  Rng rng(seed);
  ex.xe = randn(rng, ex.R() * C);
  const double s = 1.0 / std::sqrt(double(C));
  ex.w1 = randn(rng, ex.WH(), s);
  ex.w3 = randn(rng, ex.WH(), s);
  ex.w2 = randn(rng, ex.WH(), 1.0 / std::sqrt(double(H)));
  ex.dye = randn(rng, ex.R() * C);
  return ex;
}

struct Fwd {
  std::vector<double> ye, a, b, g;
};

Fwd forward(const Experts& ex, const std::vector<double>& xe, const std::vector<double>& w1,
            const std::vector<double>& w3, const std::vector<double>& w2) {
  const size_t RH = ex.R() * ex.H;
  Fwd f{std::vector<double>(ex.R() * ex.C, kNaN), std::vector<double>(RH, kNaN), std::vector<double>(RH, kNaN),
        std::vector<double>(RH, kNaN)};
  expert_mlp_forward(f.ye.data(), f.a.data(), f.b.data(), f.g.data(), xe.data(), w1.data(), w3.data(), w2.data(),
                     ex.routing.offsets.data(), ex.E, ex.C, ex.H);
  return f;
}

struct Bwd {
  std::vector<double> dxe, dw1, dw3, dw2;
};

// Scratch buffers start as NaN: they are documented as overwritten.
void backward(Bwd& d, const Experts& ex, const Fwd& f) {
  const size_t RH = ex.R() * ex.H;
  std::vector<double> g(RH, kNaN), da(RH, kNaN), db(RH, kNaN);
  expert_mlp_backward(d.dxe.data(), d.dw1.data(), d.dw3.data(), d.dw2.data(), g.data(), da.data(), db.data(),
                      ex.dye.data(), f.a.data(), f.b.data(), ex.xe.data(), ex.w1.data(), ex.w3.data(), ex.w2.data(),
                      ex.routing.offsets.data(), ex.E, ex.C, ex.H);
}

Bwd zero_grads(const Experts& ex) {
  return {std::vector<double>(ex.R() * ex.C, kNaN), std::vector<double>(ex.WH(), 0.0),
          std::vector<double>(ex.WH(), 0.0), std::vector<double>(ex.WH(), 0.0)};
}

TEST(ExpertMlp, RoutingHasTheIntendedShape) {
  const Experts ex = make_experts(1);
  EXPECT_EQ(ex.routing.offsets, (std::vector<int32_t>{0, 0, 5, 9, 12}));
  for (int row = ex.routing.offsets[3]; row < ex.routing.offsets[4]; ++row)
    EXPECT_EQ(ex.routing.row_token[row], 2 * (row - ex.routing.offsets[3]) + 1);
}

TEST(ExpertMlp, ForwardMatchesNaivePerRow) {
  const Experts ex = make_experts(2);
  const Fwd f = forward(ex, ex.xe, ex.w1, ex.w3, ex.w2);
  const int C = ex.C, H = ex.H;
  for (int e = 0; e < ex.E; ++e)
    for (int row = ex.routing.offsets[e]; row < ex.routing.offsets[e + 1]; ++row) {
      const auto y = naive_expert(&ex.xe[row * C], &ex.w1[e * H * C], &ex.w3[e * H * C], &ex.w2[e * C * H], C, H);
      for (int c = 0; c < C; ++c) EXPECT_NEAR(f.ye[row * C + c], y[c], 1e-14) << "row " << row;
      for (int h = 0; h < H; ++h) {
        double a = 0, b = 0;
        for (int c = 0; c < C; ++c) a += ex.w1[(e * H + h) * C + c] * ex.xe[row * C + c];
        for (int c = 0; c < C; ++c) b += ex.w3[(e * H + h) * C + c] * ex.xe[row * C + c];
        EXPECT_NEAR(f.a[row * H + h], a, 1e-14);
        EXPECT_NEAR(f.b[row * H + h], b, 1e-14);
        EXPECT_NEAR(f.g[row * H + h], silu(a) * b, 1e-14);
      }
    }
}

TEST(ExpertMlpGrad, MatchesFiniteDifferences) {
  const Experts ex = make_experts(3);
  const Fwd f = forward(ex, ex.xe, ex.w1, ex.w3, ex.w2);
  Bwd d = zero_grads(ex);
  backward(d, ex, f);
  auto L = [&](const std::vector<double>& xe, const std::vector<double>& w1, const std::vector<double>& w3,
               const std::vector<double>& w2) { return test::dot(forward(ex, xe, w1, w3, w2).ye, ex.dye); };
  EXPECT_TRUE(check_grad(
      "dxe", [&](const std::vector<double>& v) { return L(v, ex.w1, ex.w3, ex.w2); }, ex.xe, d.dxe));
  EXPECT_TRUE(check_grad(
      "dw1", [&](const std::vector<double>& v) { return L(ex.xe, v, ex.w3, ex.w2); }, ex.w1, d.dw1));
  EXPECT_TRUE(check_grad(
      "dw3", [&](const std::vector<double>& v) { return L(ex.xe, ex.w1, v, ex.w2); }, ex.w3, d.dw3));
  EXPECT_TRUE(check_grad(
      "dw2", [&](const std::vector<double>& v) { return L(ex.xe, ex.w1, ex.w3, v); }, ex.w2, d.dw2));
  // Expert 0 saw no rows: its weight gradients are exactly zero.
  const size_t one = size_t(ex.H) * ex.C;
  for (size_t i = 0; i < one; ++i) {
    EXPECT_EQ(d.dw1[i], 0.0);
    EXPECT_EQ(d.dw3[i], 0.0);
    EXPECT_EQ(d.dw2[i], 0.0);
  }
}

// dw1, dw3, dw2 are (+=): two calls on prefilled buffers add the gradient twice; expert 0's
// block keeps its prefill untouched. dxe is (=): NaN-prefilled, it comes out equal to the
// gradient both times.
TEST(ExpertMlpGrad, AccumulatesWeightGradsAndOverwritesDxe) {
  const Experts ex = make_experts(4);
  const Fwd f = forward(ex, ex.xe, ex.w1, ex.w3, ex.w2);
  Bwd g = zero_grads(ex);
  backward(g, ex, f);
  Rng rng(5);
  const auto p1 = randn(rng, ex.WH()), p3 = randn(rng, ex.WH()), p2 = randn(rng, ex.WH());
  Bwd d{std::vector<double>(ex.R() * ex.C, kNaN), p1, p3, p2};
  backward(d, ex, f);
  EXPECT_TRUE(test::accumulated("dw1", d.dw1, p1, g.dw1, 1));
  EXPECT_TRUE(test::accumulated("dw3", d.dw3, p3, g.dw3, 1));
  EXPECT_TRUE(test::accumulated("dw2", d.dw2, p2, g.dw2, 1));
  backward(d, ex, f);
  EXPECT_TRUE(test::accumulated("dw1", d.dw1, p1, g.dw1, 2));
  EXPECT_TRUE(test::accumulated("dw3", d.dw3, p3, g.dw3, 2));
  EXPECT_TRUE(test::accumulated("dw2", d.dw2, p2, g.dw2, 2));
  for (size_t i = 0; i < d.dxe.size(); ++i) EXPECT_EQ(d.dxe[i], g.dxe[i]) << i;
  const size_t one = size_t(ex.H) * ex.C;
  for (size_t i = 0; i < one; ++i) EXPECT_EQ(d.dw1[i], p1[i]);
}

TEST(ExpertMlp, FloatMatchesDouble) {
  // Awkward sizes, random routing over 5 experts.
  const int N = 13, E = 5, K = 2, C = 33, H = 65;
  Rng rng(6);
  Experts ex{N, E, K, C, H, {}, {}, {}, {}, {}, {}, {}};
  for (int n = 0; n < N; ++n) {
    const int32_t e0 = int32_t(rng.below(E));
    ex.topk.insert(ex.topk.end(), {e0, int32_t((e0 + 1 + rng.below(E - 1)) % E)});
  }
  build_routing(ex.routing, ex.topk.data(), N, E, K);
  ex.xe = randn(rng, ex.R() * C);
  ex.w1 = randn(rng, ex.WH(), 1.0 / std::sqrt(double(C)));
  ex.w3 = randn(rng, ex.WH(), 1.0 / std::sqrt(double(C)));
  ex.w2 = randn(rng, ex.WH(), 1.0 / std::sqrt(double(H)));
  ex.dye = randn(rng, ex.R() * C);
  const Fwd f = forward(ex, ex.xe, ex.w1, ex.w3, ex.w2);
  Bwd d = zero_grads(ex);
  backward(d, ex, f);
  const size_t RH = ex.R() * H;
  const auto xf = test::to_float(ex.xe), w1f = test::to_float(ex.w1), w3f = test::to_float(ex.w3),
             w2f = test::to_float(ex.w2), dyf = test::to_float(ex.dye);
  std::vector<float> ye(ex.R() * C), a(RH), b(RH), g(RH), da(RH), db(RH), dxe(ex.R() * C), dw1(ex.WH(), 0.0f),
      dw3(ex.WH(), 0.0f), dw2(ex.WH(), 0.0f);
  expert_mlp_forward(ye.data(), a.data(), b.data(), g.data(), xf.data(), w1f.data(), w3f.data(), w2f.data(),
                     ex.routing.offsets.data(), E, C, H);
  EXPECT_TRUE(test::float_close("ye", ye, f.ye));
  EXPECT_TRUE(test::float_close("a", a, f.a));
  expert_mlp_backward(dxe.data(), dw1.data(), dw3.data(), dw2.data(), g.data(), da.data(), db.data(), dyf.data(),
                      a.data(), b.data(), xf.data(), w1f.data(), w3f.data(), w2f.data(), ex.routing.offsets.data(), E,
                      C, H);
  EXPECT_TRUE(test::float_close("dxe", dxe, d.dxe));
  EXPECT_TRUE(test::float_close("dw1", dw1, d.dw1));
  EXPECT_TRUE(test::float_close("dw3", dw3, d.dw3));
  EXPECT_TRUE(test::float_close("dw2", dw2, d.dw2));
}

// ---- The whole MoE layer --------------------------------------------------------------------

struct Moe {
  int N = 9, C = 7, H = 5, E = 6, K = 2;
  std::vector<double> x, wr, w1, w3, w2;  // wr: router weight [E, C]
};

Moe make_moe(uint64_t seed) {
  Moe m;
  Rng rng(seed);
  m.x = randn(rng, m.N * m.C);
  m.wr = randn(rng, m.E * m.C);
  const size_t WH = size_t(m.E) * m.H * m.C;
  m.w1 = randn(rng, WH, 0.4);
  m.w3 = randn(rng, WH, 0.4);
  m.w2 = randn(rng, WH, 0.4);
  return m;
}

struct MoeFwd {
  std::vector<double> logits, probs, lse, topk_w, xe, ye, a, b, g, out;
  std::vector<int32_t> topk_idx;
  ExpertRouting routing;
};

MoeFwd moe_forward(const Moe& m, const std::vector<double>& x, const std::vector<double>& wr,
                   const std::vector<double>& w1, const std::vector<double>& w3, const std::vector<double>& w2) {
  const size_t R = size_t(m.N) * m.K;
  MoeFwd f;
  f.logits.resize(m.N * m.E);
  f.probs.resize(m.N * m.E);
  f.lse.resize(m.N);
  f.topk_w.resize(R);
  f.topk_idx.resize(R);
  f.xe.resize(R * m.C);
  f.ye.resize(R * m.C);
  f.a.resize(R * m.H);
  f.b.resize(R * m.H);
  f.g.resize(R * m.H);
  f.out.resize(m.N * m.C);
  linear_forward(f.logits.data(), x.data(), wr.data(), m.N, m.C, m.E);
  router_forward(f.probs.data(), f.lse.data(), f.topk_idx.data(), f.topk_w.data(), f.logits.data(), m.N, m.E, m.K);
  build_routing(f.routing, f.topk_idx.data(), m.N, m.E, m.K);
  dispatch_forward(f.xe.data(), x.data(), f.routing, m.N, m.C, m.K);
  expert_mlp_forward(f.ye.data(), f.a.data(), f.b.data(), f.g.data(), f.xe.data(), w1.data(), w3.data(), w2.data(),
                     f.routing.offsets.data(), m.E, m.C, m.H);
  combine_forward(f.out.data(), f.ye.data(), f.topk_w.data(), f.routing, m.N, m.C, m.K);
  return f;
}

// out[n] = Σ_j w[n,j] · Expert_{idx[n,j]}(x[n]): every token through its experts directly,
// no sorting, no dispatch (the forward_dense idea).
TEST(MoeLayer, DispatchExpertsCombineEqualDenseComputation) {
  const Moe m = make_moe(7);
  const MoeFwd f = moe_forward(m, m.x, m.wr, m.w1, m.w3, m.w2);
  const size_t WH = size_t(m.H) * m.C;
  std::vector<bool> used(m.E, false);
  for (int n = 0; n < m.N; ++n) {
    std::vector<double> dense(m.C, 0.0);
    for (int j = 0; j < m.K; ++j) {
      const int e = f.topk_idx[n * m.K + j];
      used[e] = true;
      const auto y = naive_expert(&m.x[n * m.C], &m.w1[e * WH], &m.w3[e * WH], &m.w2[e * WH], m.C, m.H);
      for (int c = 0; c < m.C; ++c) dense[c] += f.topk_w[n * m.K + j] * y[c];
    }
    for (int c = 0; c < m.C; ++c) EXPECT_NEAR(f.out[n * m.C + c], dense[c], 1e-14) << n << "," << c;
  }
  int n_used = 0;
  for (bool u : used) n_used += u;
  EXPECT_GE(n_used, 3) << "the test should exercise several experts";
}

// The backward chain of the layer (combine → experts → dispatch, and combine → router →
// router linear, both adding into dx) against finite differences of the whole forward. The
// routing is asserted unchanged at every perturbed point (no top-k switch crossed).
TEST(MoeLayerGrad, ChainMatchesFiniteDifferences) {
  const Moe m = make_moe(8);
  const double aux_coef = 0.1, z_coef = 0.05;
  Rng rng(9);
  const auto dout = randn(rng, m.N * m.C);
  const MoeFwd base = moe_forward(m, m.x, m.wr, m.w1, m.w3, m.w2);
  int routing_changed = 0;
  auto L = [&](const std::vector<double>& x, const std::vector<double>& wr, const std::vector<double>& w1,
               const std::vector<double>& w3, const std::vector<double>& w2) {
    const MoeFwd f = moe_forward(m, x, wr, w1, w3, w2);
    if (f.topk_idx != base.topk_idx) ++routing_changed;
    const RouterLosses l =
        router_losses(f.probs.data(), f.lse.data(), f.topk_idx.data(), m.N, m.E, m.K, aux_coef, z_coef);
    return test::dot(f.out, dout) + l.aux + l.z;
  };
  // Backward, in the order the model runs it.
  const size_t R = size_t(m.N) * m.K, WH = size_t(m.E) * m.H * m.C;
  std::vector<double> dye(R * m.C), dtopk_w(R), dxe(R * m.C), g(R * m.H), da(R * m.H), db(R * m.H);
  std::vector<double> dw1(WH, 0.0), dw3(WH, 0.0), dw2(WH, 0.0), dlogits(m.N * m.E), dx(m.N * m.C, 0.0),
      dwr(m.E * m.C, 0.0);
  combine_backward(dye.data(), dtopk_w.data(), dout.data(), base.ye.data(), base.topk_w.data(), base.routing, m.N, m.C,
                   m.K);
  expert_mlp_backward(dxe.data(), dw1.data(), dw3.data(), dw2.data(), g.data(), da.data(), db.data(), dye.data(),
                      base.a.data(), base.b.data(), base.xe.data(), m.w1.data(), m.w3.data(), m.w2.data(),
                      base.routing.offsets.data(), m.E, m.C, m.H);
  dispatch_backward(dx.data(), dxe.data(), base.routing, m.N, m.C, m.K);
  router_backward(dlogits.data(), dtopk_w.data(), base.probs.data(), base.lse.data(), base.topk_idx.data(),
                  base.topk_w.data(), m.N, m.E, m.K, aux_coef, z_coef, 1.0);
  linear_backward(dx.data(), dwr.data(), dlogits.data(), m.x.data(), m.wr.data(), m.N, m.C, m.E);

  EXPECT_TRUE(check_grad(
      "dx", [&](const std::vector<double>& v) { return L(v, m.wr, m.w1, m.w3, m.w2); }, m.x, dx));
  EXPECT_TRUE(check_grad(
      "drouter", [&](const std::vector<double>& v) { return L(m.x, v, m.w1, m.w3, m.w2); }, m.wr, dwr));
  test::GradCheckOptions some;
  some.max_coords = 60;  // 210 entries each: a random subset keeps the test fast
  EXPECT_TRUE(check_grad(
      "dw1", [&](const std::vector<double>& v) { return L(m.x, m.wr, v, m.w3, m.w2); }, m.w1, dw1, some));
  EXPECT_TRUE(check_grad(
      "dw3", [&](const std::vector<double>& v) { return L(m.x, m.wr, m.w1, v, m.w2); }, m.w3, dw3, some));
  EXPECT_TRUE(check_grad(
      "dw2", [&](const std::vector<double>& v) { return L(m.x, m.wr, m.w1, m.w3, v); }, m.w2, dw2, some));
  EXPECT_EQ(routing_changed, 0) << "a ±h perturbation changed the top-k set; pick another seed";
}

}  // namespace
}  // namespace atl
