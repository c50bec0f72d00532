// configs/zaya1-tiny.toml (CCA, the zaya router with bias balancing, residual scaling) on the
// CUDA engine against the CPU engine (engine/engine.h), the way the trainer drives them: from
// the same initial parameters and batches, a few steps of zero_grads, forward_backward, clip,
// optimizer_step (with its bias balancing), and the loads each engine leaves for the metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/engine/engine.h"
#include "atoll/optim/bias_balance.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

// The shipped config as `atoll train --config configs/zaya1-tiny.toml` reads it, at 2 sequences
// a step (the CPU side's time) and on the device `device`. $ATOLL_SOURCE_DIR, where set, names
// the folder holding configs/ (the GPU kit runs this binary far from the source tree).
Config zaya1_tiny(const char* device) {
  const char* env = std::getenv("ATOLL_SOURCE_DIR");
  const std::string root = env != nullptr && *env != '\0' ? env : ATOLL_SOURCE_DIR;
  return load_config(root + "/configs/zaya1-tiny.toml",
                     {"train.batch_size=2", std::string("train.device=\"") + device + "\""});
}

// The balanced rows' slots of a flat host buffer: each zaya router's loads (grads) or biases.
std::vector<float> balanced_slots(const float* flat, const ParamLayout& layout) {
  std::vector<float> out;
  for (const ParamEntry* row : balanced_rows(layout))
    out.insert(out.end(), flat + row->offset, flat + row->offset + row->numel);
  return out;
}
std::vector<float> loads(Engine& e) {
  e.to_host(kGrads);
  return balanced_slots(e.host().grads, e.layout());
}
std::vector<float> balanced_params(Engine& e) {
  e.to_host(kParams);
  return balanced_slots(e.host().params, e.layout());
}

// Five steps at the config's lr. The fp32 step tracks the CPU's to ~1e-6 relative
// (device_model_test.cpp); over five steps 2e-3 relative on the loss and the gradient norm
// leaves a wide margin and still catches a part computed wrongly (O(1) of the loss's change).
// The loads are shares of the same choices (exact unless a near-tie breaks the other way: one
// slot of N = 512, 2e-3); the balancing biases move by about optim.bias_balance_lr a step on
// both sides, so they agree to a tenth of that.
TEST(CudaZayaEngine, Zaya1TinyTracksTheCpuEngine) {
  ATOLL_SKIP_WITHOUT_GPU();
  const Config gc = zaya1_tiny("cuda"), cc = zaya1_tiny("cpu");
  ASSERT_FALSE(balanced_rows(ParamLayout::build(cc.model)).empty());
  std::unique_ptr<Engine> gpu = make_engine(gc), cpu = make_engine(cc);
  cpu->init_params(3);
  gpu->init_params(3);
  gpu->to_device(kParams);
  const int B = cc.train.batch_size, T = cc.model.seq_len;
  Rng rng(17);
  for (int step = 0; step < 5; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const test::Batch b = test::make_batch(rng, B, T, cc.model.vocab_size);
    cpu->zero_grads();
    gpu->zero_grads();
    const LossParts want = cpu->forward_backward(b.in.data(), b.tg.data(), B, 1.0);
    const LossParts got = gpu->forward_backward(b.in.data(), b.tg.data(), B, 1.0);
    ASSERT_TRUE(std::isfinite(got.ce));
    EXPECT_NEAR(got.ce, want.ce, 2e-3 * want.ce);
    const std::vector<float> want_loads = loads(*cpu), got_loads = loads(*gpu);
    test::expect_near(got_loads, want_loads, 2.5e-3, 0.0, "router loads");
    const double want_norm = cpu->clip_grads(cc.optim.grad_clip), got_norm = gpu->clip_grads(gc.optim.grad_clip);
    EXPECT_NEAR(got_norm, want_norm, 2e-3 * want_norm);
    const double lr = cc.optim.lr;
    cpu->optimizer_step(lr);
    gpu->optimizer_step(lr);
    test::expect_near(balanced_params(*gpu), balanced_params(*cpu), 0.1 * cc.optim.bias_balance_lr, 0.0,
                      "balancing biases");
  }
  EXPECT_EQ(gpu->optimizer_steps(), 5);
  EXPECT_TRUE(gpu->topk_choice_counts().size() == cpu->topk_choice_counts().size());
}

}  // namespace
}  // namespace atl
