// End-to-end engine checks without data files: a tiny model memorises one fixed batch, and
// two runs with the same seed and thread count produce bit-identical losses.
#include <gtest/gtest.h>

#include "atoll/core/rng.h"
#include "atoll/model/model.h"
#include "atoll/optim/clip.h"
#include "atoll/optim/optimizer.h"
#include "atoll/optim/schedule.h"

namespace atl {
namespace {

ModelConfig micro_model() {
  ModelConfig m;
  m.vocab_size = 64;
  m.dim = 32;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.head_dim = 16;
  m.n_experts = 4;
  m.top_k = 2;
  m.expert_hidden = 48;
  m.seq_len = 16;
  return m;
}

// Trains on batches from `next` and returns the loss (ce) of every step.
template <class NextBatch>
std::vector<double> train_losses(const OptimConfig& oc, int steps, int B, NextBatch next) {
  const ModelConfig m = micro_model();
  Model<float> model(m, B);
  model.init_params(3);
  Optimizer opt(oc, model.layout());
  std::vector<int32_t> in(size_t(B) * m.seq_len), tg(size_t(B) * m.seq_len);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    next(in, tg);
    model.zero_grads();
    losses.push_back(model.forward_backward(in.data(), tg.data(), B).ce);
    clip_grad_norm(model.grads().data(), model.grads().size(), oc.grad_clip);
    opt.step(model.params().data(), model.grads().data(), lr_at(oc, s, steps));
  }
  return losses;
}

OptimConfig optim(const std::string& name, double lr) {
  OptimConfig oc;
  oc.name = name;
  oc.lr = lr;
  oc.warmup_steps = 10;
  oc.schedule = "constant";
  oc.weight_decay = 0.0;
  return oc;
}

void expect_overfits(const OptimConfig& oc) {
  Rng rng(1);
  const int B = 4, T = micro_model().seq_len;
  std::vector<int32_t> fin(B * T), ftg(B * T);
  for (int i = 0; i < B * T; ++i) fin[i] = int32_t(rng.below(64)), ftg[i] = int32_t(rng.below(64));
  auto losses = train_losses(oc, 300, B, [&](auto& in, auto& tg) { in = fin, tg = ftg; });
  EXPECT_GT(losses.front(), 3.5);  // ~ln(64) = 4.16 at init
  EXPECT_LT(losses.back(), 0.05) << oc.name << " did not memorise the batch";
}

TEST(Overfit, AdamWMemorisesOneBatch) { expect_overfits(optim("adamw", 1e-2)); }
TEST(Overfit, MuonMemorisesOneBatch) { expect_overfits(optim("muon", 1e-2)); }

TEST(Determinism, SameSeedSameThreadsGivesBitIdenticalLosses) {
  for (const char* name : {"adamw", "muon"}) {
    auto run = [&] {
      Rng rng(42);
      return train_losses(optim(name, 3e-3), 25, 3, [&](auto& in, auto& tg) {
        for (size_t i = 0; i < in.size(); ++i) in[i] = int32_t(rng.below(64)), tg[i] = int32_t(rng.below(64));
      });
    };
    const auto a = run(), b = run();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << name << " step " << i;  // bit for bit
  }
}

}  // namespace
}  // namespace atl
