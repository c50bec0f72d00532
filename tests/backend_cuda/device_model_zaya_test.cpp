// ZAYA1's parts on the device against their CPU parts, through the whole model: the zaya router
// (model/router_zaya.cu: down-projection, depth averaging across layers, RMSNorm, the GELU MLP,
// the choice over E + 1 classes with balancing biases, the skip class reaching no expert, the
// loads left for bias balancing), residual scaling (the merges of model/norm_residual.cu) and a
// local layer's own RoPE θ (DeviceRopeTables), in fp32 (every gradient) and in bf16 products
// (a short training run with bias balancing, against the CPU's fp32 run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/model/device_model.h"
#include "atoll/model/model.h"
#include "atoll/optim/bias_balance.h"
#include "device_model_check.h"
#include "device_run_util.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::perturb_zaya_rows;
using test::zaya_config;

// The skip class's share of the slots of each zaya router in one CPU pass of `m` (the loads its
// backward leaves in the balancing row's gradient slots, loss_scale 1).
std::vector<double> skip_shares(const ModelConfig& m) {
  Model<float> cpu(m, test::kMaxBatch);
  cpu.init_params(7);
  perturb_zaya_rows(cpu);
  Rng rng(11);
  const test::Batch b = test::make_batch(rng, test::kMaxBatch, m.seq_len, m.vocab_size);
  cpu.zero_grads();
  cpu.forward_backward(b.in.data(), b.tg.data(), test::kMaxBatch);
  std::vector<double> shares;
  for (const ParamEntry* row : balanced_rows(cpu.layout())) shares.push_back(cpu.grads()[row->offset + row->numel - 1]);
  return shares;
}

// Every gradient against the CPU's (device_model_check.h's tolerances: the parts added here are
// small products and column sums of the same kind). The perturbed rows make every row's gradient
// depend on its value, and the skipped slots run the experts' kNoExpert path.
TEST(CudaDeviceModelZaya, LossAndEveryGradientMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  const ModelConfig m = zaya_config();
  for (const double share : skip_shares(m)) {  // the case is what it claims: some slots skip, not all
    EXPECT_GT(share, 0.02);
    EXPECT_LT(share, 0.98);
  }
  test::check_loss_and_every_gradient(m, false, perturb_zaya_rows);
}

// A softmax top-k router on the first layer, zaya routers after it: layer 1 averages over no
// depth (its predecessor is no zaya router), layer 2 over layer 1's; and the choice counts of
// every layer (the top-k layer's loads of the metrics, the outer step's expert weights) equal the CPU's.
TEST(CudaDeviceModelZaya, MixedRoutersMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  ModelConfig m = zaya_config();
  m.router_layers = {"topk", "zaya", "zaya"};
  m.aux_loss_coef = 0.01;
  test::check_loss_and_every_gradient(m, false, perturb_zaya_rows);

  Model<float> cpu(m, test::kMaxBatch);
  cpu.init_params(7);
  gpu::DeviceModel dev(m, test::kMaxBatch);
  dev.upload_params(cpu.params().data());
  Rng rng(3);
  cpu.zero_grads();
  dev.zero_grads();
  for (int pass = 0; pass < 2; ++pass) {  // counts add over the passes since zero_grads
    const test::Batch b = test::make_batch(rng, test::kMaxBatch, m.seq_len, m.vocab_size);
    cpu.forward_backward(b.in.data(), b.tg.data(), test::kMaxBatch);
    dev.forward_backward(b.in.data(), b.tg.data(), test::kMaxBatch);
  }
  const std::vector<double> want = cpu.topk_choice_counts(), got = dev.topk_choice_counts();
  ASSERT_EQ(got.size(), want.size());
  double routed = 0;
  for (size_t i = 0; i < size_t(m.n_experts); ++i) routed += want[i];
  EXPECT_EQ(routed, 2.0 * test::kMaxBatch * m.seq_len * m.top_k);  // layer 0's (top-k: no skipped slot)
  // Integer counts of the same choices: equal unless a near-tie of probabilities broke the
  // other way (one slot moves between two experts); allow that for two slots.
  double off = 0;
  for (size_t i = 0; i < want.size(); ++i) off += std::fabs(got[i] - want[i]);
  EXPECT_LE(off, 4.0);
  dev.zero_grads();
  for (const double c : dev.topk_choice_counts()) EXPECT_EQ(c, 0.0);
}

// Short training runs (AdamW 30 steps, Muon 10; device_run_util.h) with bias balancing after
// every optimizer step on both sides (DeviceOptimizer against Optimizer) and the loads left out
// of the clip's norm: fp32 with the tolerances of device_model_test.cpp's run (2e-3; the zaya
// router's products are tiny next to the experts'), and bf16 products against the CPU's fp32
// with device_model_bf16_test.cpp's (1e-2 on the loss, 0.2 on the norm).
TEST(CudaDeviceModelZaya, TrainingRunTracksCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  test::expect_run_tracks_cpu(zaya_config(), test::kMaxBatch, {}, Precision::kFp32,
                              {.loss = 2e-3, .norm = 2e-3, .learn = 0.1});
}

TEST(CudaDeviceModelZaya, Bf16TrainingRunTracksCpuFp32) {
  ATOLL_SKIP_WITHOUT_GPU();
  test::expect_run_tracks_cpu(zaya_config(), test::kMaxBatch, {.precision = Precision::kBf16}, Precision::kFp32,
                              {.loss = 1e-2, .norm = 0.2, .learn = 0.1});
}

}  // namespace
}  // namespace atl
