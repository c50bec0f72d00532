// Context extension on the GPU (docs/long_context.md): DeviceModel::set_sequence and the CUDA
// engine's set_sequence. A model grown from T to 2T tokens (and a new RoPE base) must compute
// what a model built at 2T from the same parameters computes, and keep its gradients, choice
// counts and (in the engine) the optimizer's moments across the change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/engine/engine.h"
#include "device_model_check.h"

namespace atl {
namespace {

using test::Batch;
using test::make_batch;
using test::tiny_config;

// The largest |a - b| over the largest |b|.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, big = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    diff = std::max(diff, std::fabs(double(a[i]) - b[i])), big = std::max(big, std::fabs(double(b[i])));
  return big > 0 ? diff / big : diff;
}

std::vector<float> grads_of(const gpu::DeviceModel& d) {
  std::vector<float> g(d.layout().total());
  d.download_grads(g.data());
  return g;
}

// Both models run the same kernels on the same shapes and parameters, so they should agree bit
// for bit; 1e-6 of the largest value leaves room for a BLAS that picks another algorithm for
// another buffer address (a different arena), and still catches a stale RoPE table (the base
// changes the rotation of every position past 0 by O(1)) or buffers sized for T (positions
// past T read garbage).
TEST(CudaSetSequence, LongerSequenceComputesWhatAFreshModelComputes) {
  ATOLL_SKIP_WITHOUT_GPU();
  ModelConfig m = tiny_config(false);
  m.seq_len = 67;  // 2T = 134 spans two attention tiles of 128 keys; T = 67 one
  Model<float> host(m, 1);
  host.init_params(5);
  gpu::DeviceModel grown(m, 2, {.head_rows = test::kHeadRows});
  grown.upload_params(host.params().data());
  Rng rng(23);
  // A step at T first, so the gradients and choice counts hold something to keep.
  const Batch shortb = make_batch(rng, 2, m.seq_len, m.vocab_size);
  grown.zero_grads();
  grown.forward_backward(shortb.in.data(), shortb.tg.data(), 2, 1.0);
  const std::vector<float> grads_before = grads_of(grown);
  const std::vector<double> counts_before = grown.topk_choice_counts();

  const int T2 = 2 * m.seq_len, B2 = 3;
  const double theta2 = 40000.0;
  grown.set_sequence(T2, theta2, B2);
  EXPECT_EQ(grown.config().seq_len, T2);
  EXPECT_EQ(grown.config().rope_theta, theta2);
  EXPECT_EQ(grown.max_batch(), B2);
  test::expect_equal(grads_of(grown), grads_before, "gradients kept across set_sequence");
  EXPECT_EQ(grown.topk_choice_counts(), counts_before);
  std::vector<float> params(host.params().size());
  grown.download_params(params.data());
  test::expect_equal(params, host.params(), "parameters kept across set_sequence");

  ModelConfig m2 = m;
  m2.seq_len = T2, m2.rope_theta = theta2;
  gpu::DeviceModel fresh(m2, B2, {.head_rows = test::kHeadRows});
  fresh.upload_params(host.params().data());
  const Batch b = make_batch(rng, B2, T2, m.vocab_size);
  std::vector<float> got(size_t(B2) * T2), want(got.size());
  const LossParts lg = grown.forward(b.in.data(), b.tg.data(), B2, got.data());
  const LossParts lw = fresh.forward(b.in.data(), b.tg.data(), B2, want.data());
  EXPECT_LE(rel_diff(got, want), 1e-6) << "per-position losses at 2T";
  EXPECT_NEAR(lg.ce, lw.ce, 1e-6 * lw.ce);
  EXPECT_NEAR(lg.aux, lw.aux, 1e-6 * lw.aux);

  grown.zero_grads();
  fresh.zero_grads();
  grown.forward_backward(b.in.data(), b.tg.data(), B2, 1.0);
  fresh.forward_backward(b.in.data(), b.tg.data(), B2, 1.0);
  EXPECT_LE(rel_diff(grads_of(grown), grads_of(fresh)), 1e-6) << "gradients at 2T";

  // The CPU model at 2T agrees too (the device model's own check, at the new length).
  host.set_sequence(T2, theta2, 1);
  const Batch one = make_batch(rng, 1, T2, m.vocab_size);
  test::expect_loss_near(grown.forward(one.in.data(), one.tg.data(), 1), host.forward(one.in.data(), one.tg.data(), 1));
}

// The engine the trainer drives (Loop::enter_phase calls set_sequence between steps): the CUDA
// engine across a phase change tracks the CPU engine across the same change. AdamW's moments
// from the steps at T shape the steps at 2T, so a lost or reset moment shows in the loss. The
// fp32 step tracks the CPU's to ~1e-6 relative a step (device_model_test.cpp); 1e-4 over four
// steps, where a reset moment changes the update by O(1).
TEST(CudaSetSequence, EngineKeepsTheOptimizerStateAcrossAPhase) {
  ATOLL_SKIP_WITHOUT_GPU();
  Config cfg;
  cfg.model = tiny_config(false);
  cfg.model.seq_len = 40;
  cfg.train.batch_size = 2;
  cfg.optim.name = "adamw";
  cfg.optim.lr = 3e-3;
  Config gc = cfg;
  gc.train.device = "cuda";
  std::unique_ptr<Engine> gpu = make_engine(gc), cpu = make_engine(cfg);
  cpu->init_params(9);
  gpu->init_params(9);
  gpu->to_device(kParams);
  Rng rng(31);
  int T = cfg.model.seq_len;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step << " T=" << T);
    if (step == 2) {
      T = 2 * cfg.model.seq_len;
      cpu->set_sequence(T, 20000.0, 2);
      gpu->set_sequence(T, 20000.0, 2);
    }
    const Batch b = make_batch(rng, 2, T, cfg.model.vocab_size);
    cpu->zero_grads();
    gpu->zero_grads();
    const LossParts want = cpu->forward_backward(b.in.data(), b.tg.data(), 2, 1.0);
    const LossParts got = gpu->forward_backward(b.in.data(), b.tg.data(), 2, 1.0);
    EXPECT_NEAR(got.ce, want.ce, 1e-4 * want.ce);
    cpu->clip_grads(1.0);
    gpu->clip_grads(1.0);
    cpu->optimizer_step(cfg.optim.lr);
    gpu->optimizer_step(cfg.optim.lr);
  }
  EXPECT_EQ(gpu->optimizer_steps(), 4);
}

}  // namespace
}  // namespace atl
