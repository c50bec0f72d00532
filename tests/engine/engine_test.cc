// The engine's contract (engine/engine.h) on the CPU engine: one step through the interface
// equals the same step on Model<float> and Optimizer by hand, bit for bit (micro-batch
// accumulation included); the host copies are the working state; the step count moves with
// the optimizer; and train.device = cuda is refused with the fix in a build without CUDA.
#include "atoll/engine/engine.h"

#include <gtest/gtest.h>

#include <vector>

#include "atoll/core/errors.h"
#include "atoll/core/rng.h"
#include "atoll/engine/cuda_engine.h"
#include "atoll/optim/clip.h"

namespace atl {
namespace {

Config tiny_config() {
  Config c;
  ModelConfig& m = c.model;
  m.vocab_size = 16, m.dim = 8, m.n_layers = 2, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4;
  m.n_experts = 3, m.top_k = 1, m.expert_hidden = 12, m.seq_len = 6;
  c.train.batch_size = 4, c.train.micro_batch_size = 2;
  c.optim.name = "muon";
  c.optim.grad_clip = 0.5;
  return c;
}

std::vector<int32_t> tokens(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng.below(16));
  return t;
}

TEST(EngineTest, CpuStepEqualsTheModelAndOptimizerByHand) {
  const Config c = tiny_config();
  const int mb = micro_batch(c.train), T = c.model.seq_len, n_micro = c.train.batch_size / mb;
  const std::vector<int32_t> in = tokens(size_t(c.train.batch_size) * T, 1), tg = tokens(in.size(), 2);

  std::unique_ptr<Engine> engine = make_engine(c);
  EXPECT_EQ(engine->device_name(), "cpu");
  engine->init_params(7);
  engine->to_device(kAllState);
  Model<float> model(c.model, mb);
  model.init_params(7);
  Optimizer opt(c.optim, model.layout());

  for (int step = 0; step < 3; ++step) {
    engine->zero_grads();
    model.zero_grads();
    for (int i = 0; i < n_micro; ++i) {
      const size_t at = size_t(i) * mb * T;
      const LossParts a = engine->forward_backward(in.data() + at, tg.data() + at, mb, 1.0 / n_micro);
      const LossParts b = model.forward_backward(in.data() + at, tg.data() + at, mb, 1.0 / n_micro);
      EXPECT_EQ(a.total(), b.total());
    }
    EXPECT_EQ(engine->clip_grads(c.optim.grad_clip),
              clip_grad_norm(model.grads().data(), model.grads().size(), c.optim.grad_clip));
    engine->optimizer_step(1e-2);
    opt.step(model.params().data(), model.grads().data(), 1e-2);
  }
  engine->to_host(kAllState);
  const HostBuffers h = engine->host();
  const size_t n = engine->layout().total();
  EXPECT_EQ(std::vector<float>(h.params, h.params + n), model.params());
  EXPECT_EQ(std::vector<float>(h.m, h.m + n), opt.m());
  EXPECT_EQ(std::vector<float>(h.v, h.v + n), opt.v());
  EXPECT_EQ(engine->optimizer_steps(), 3);
  engine->set_optimizer_steps(11);
  EXPECT_EQ(engine->optimizer_steps(), 11);
  EXPECT_FALSE(engine->has_island_mean());
}

TEST(EngineTest, CudaIsRefusedWithTheFixWhereNotBuilt) {
  if (cuda_engine_built()) GTEST_SKIP() << "this build has the CUDA engine";
  Config c = tiny_config();
  c.train.device = "cuda";
  try {
    make_engine(c);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fix:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atl
