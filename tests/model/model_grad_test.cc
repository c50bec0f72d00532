// Whole-model checks: the hand-written backward of the full MoE transformer against finite
// differences of its forward in double precision, and gradient accumulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "atoll/core/rng.h"
#include "atoll/model/model.h"

namespace atl {
namespace {

ModelConfig micro_config() {
  ModelConfig m;
  m.vocab_size = 13;
  m.dim = 8;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 1;  // grouped-query attention on purpose
  m.head_dim = 4;
  m.n_experts = 3;
  m.top_k = 2;
  m.expert_hidden = 6;
  m.seq_len = 5;
  m.aux_loss_coef = 0.05;
  m.z_loss_coef = 0.01;
  m.init_std = 0.5;  // large weights so the check is not dominated by tiny numbers
  return m;
}

std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng.below(V));
  return t;
}

void perturb_norm_gains(Model<double>& model, uint64_t seed) {
  // Norm gains start at 1; move them so their gradients are generic, not symmetric.
  Rng rng(seed);
  for (const ParamEntry& e : model.layout().entries())
    if (e.group == ParamGroup::kNorm)
      for (size_t i = 0; i < e.numel; ++i) model.params()[e.offset + i] = 1.0 + 0.3 * rng.normal();
}

// floor: the scale below which an error is judged absolute (central differences round to ~2e-11
// times the loss; rows whose gradients are ~1e-7 need a floor above that).
void check_model_gradient(const ModelConfig& m, double floor = 1e-6) {
  const int B = 2, N = B * m.seq_len;
  Model<double> model(m, B);
  model.init_params(7);
  perturb_norm_gains(model, 8);
  auto in = random_tokens(N, m.vocab_size, 1), tg = random_tokens(N, m.vocab_size, 2);
  model.zero_grads();
  model.forward_backward(in.data(), tg.data(), B);
  const std::vector<double> grad = model.grads();

  // Central differences at two step sizes: where they disagree the step crossed a top-k
  // switch (a kink of the routing), and that coordinate says nothing about the backward.
  auto loss_at = [&](size_t i, double h) {
    const double old = model.params()[i];
    model.params()[i] = old + h;
    const double lp = model.forward(in.data(), tg.data(), B).total();
    model.params()[i] = old - h;
    const double lm = model.forward(in.data(), tg.data(), B).total();
    model.params()[i] = old;
    return (lp - lm) / (2 * h);
  };
  Rng pick(3);
  int checked = 0, kinks = 0;
  double worst = 0.0;
  for (const ParamEntry& e : model.layout().entries()) {
    if (!e.trainable) continue;  // a buffer: its gradient slot holds no gradient (a router's loads)
    const size_t n_samples = std::min<size_t>(e.numel, 12);
    for (size_t s = 0; s < n_samples; ++s) {
      const size_t i = e.offset + (e.numel <= 12 ? s : pick.below(e.numel));
      const double n1 = loss_at(i, 1e-5), n2 = loss_at(i, 5e-6);
      if (std::abs(n1 - n2) > 1e-6 * (std::abs(n1) + 1e-3)) {
        ++kinks;
        continue;
      }
      // Central differences at h=5e-6 in double: truncation ~h² and rounding ~1e-16/h ~ 2e-11.
      const double err = std::abs(n2 - grad[i]) / std::max(floor, std::abs(n2) + std::abs(grad[i]));
      worst = std::max(worst, err);
      EXPECT_LT(err, 1e-5) << e.name << "[" << i - e.offset << "]: backward " << grad[i] << " numeric " << n2;
      ++checked;
    }
  }
  EXPECT_LE(kinks, checked / 20) << "too many coordinates crossed a routing switch";
  EXPECT_GT(checked, 100);
  std::printf("checked %d coordinates (%d skipped at routing kinks), worst relative error %.2e\n", checked, kinks,
              worst);
}

TEST(ModelGrad, WholeModelMatchesFiniteDifferences) { check_model_gradient(micro_config()); }

TEST(ModelGrad, TiedEmbeddingsAndDenseModel) {
  ModelConfig m = micro_config();
  m.tie_embeddings = true;
  m.n_experts = 1;
  m.top_k = 1;
  m.n_kv_heads = 2;
  check_model_gradient(m);
}

// A CCA layer after a GQA layer (model.attention_layers), partial rotary, and convolution
// kernels longer than one token: every row of both kinds against finite differences.
TEST(ModelGrad, CcaLayerMatchesFiniteDifferences) {
  ModelConfig m = micro_config();
  m.attention_layers = {"gqa", "cca"};
  m.cca_time0 = 3;
  m.cca_time1 = 2;
  m.partial_rotary_factor = 0.5;
  check_model_gradient(m);
}

// ZAYA1's parts: the zaya router in every block (its depth averaging chains the routers, so the
// gradient of layer 0's router rows includes what flows back from layer 1's), a skip bias of 0
// so some tokens skip, and residual scaling moved off the identity by the perturbation. The
// router's rows reach the loss through gates of ~1/(E+1), so some of their gradients are ~1e-7:
// the absolute floor is 1e-5 (errors of 1e-10 there are the differences' rounding).
TEST(ModelGrad, ZayaRouterAndResidualScaling) {
  ModelConfig m = micro_config();
  m.router = "zaya", m.router_hidden_size = 4, m.top_k = 1, m.router_skip_bias = 0.0;
  m.residual_scaling = true;
  check_model_gradient(m, 1e-5);
}

// Two micro-batches with loss_scale 1/2 accumulate the gradient of one double batch. The
// Switch loss is a statistic of the whole batch (f_i·P_i over its tokens), not a mean of
// per-token terms, so it is turned off here; everything else is per token.
TEST(ModelGrad, AccumulationOfTwoMicroBatchesEqualsDoubleBatch) {
  ModelConfig m = micro_config();
  m.aux_loss_coef = 0.0;
  const int N = m.seq_len;
  auto in = random_tokens(2 * N, m.vocab_size, 4), tg = random_tokens(2 * N, m.vocab_size, 5);
  Model<double> model(m, 2);
  model.init_params(9);
  model.zero_grads();
  const double whole = model.forward_backward(in.data(), tg.data(), 2).total();
  const std::vector<double> g_whole = model.grads();
  model.zero_grads();
  double halves = model.forward_backward(in.data(), tg.data(), 1, 0.5).total() / 2;
  halves += model.forward_backward(in.data() + N, tg.data() + N, 1, 0.5).total() / 2;
  EXPECT_NEAR(whole, halves, 1e-12);
  for (size_t i = 0; i < g_whole.size(); ++i) ASSERT_NEAR(g_whole[i], model.grads()[i], 1e-12) << "index " << i;
}

TEST(ModelGrad, FloatModelAgreesWithDouble) {
  ModelConfig m = micro_config();
  m.init_std = 0.02;
  const int B = 3, N = B * m.seq_len;
  auto in = random_tokens(N, m.vocab_size, 6), tg = random_tokens(N, m.vocab_size, 7);
  Model<double> md(m, B);
  Model<float> mf(m, B);
  md.init_params(1);
  mf.init_params(1);
  md.zero_grads();
  mf.zero_grads();
  const double ld = md.forward_backward(in.data(), tg.data(), B).total();
  const double lf = mf.forward_backward(in.data(), tg.data(), B).total();
  EXPECT_NEAR(ld, lf, 1e-5 * std::abs(ld));  // fp32 rounding over a few hundred operations
  double num = 0, den = 0;
  for (size_t i = 0; i < md.grads().size(); ++i) {
    num += std::pow(md.grads()[i] - mf.grads()[i], 2);
    den += std::pow(md.grads()[i], 2);
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4);
}

}  // namespace
}  // namespace atl
