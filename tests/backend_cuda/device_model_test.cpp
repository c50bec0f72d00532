// backend/cuda/device_model.cu and device_optimizer.cu against Model<float> and Optimizer on
// the CPU: the whole model's loss and every gradient, gradient accumulation, clipping, one
// optimizer step, and short training runs from the same initial parameters on the same data.
#include "atoll/model/device_model.h"

#include <cmath>
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/core/check.h"
#include "atoll/model/model.h"
#include "atoll/optim/clip.h"
#include "atoll/optim/device_optimizer.h"
#include "atoll/optim/optimizer.h"
#include "device_model_check.h"
#include "device_run_util.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::Batch;
using test::check_loss_and_every_gradient;
using test::kHeadRows;
using test::kMaxBatch;
using test::make_batch;
using test::tiny_config;

class CudaDeviceModel : public testing::TestWithParam<bool> {};  // tied embeddings or not

TEST_P(CudaDeviceModel, LossAndEveryGradientMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  check_loss_and_every_gradient(tiny_config(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Tied, CudaDeviceModel, testing::Values(false, true));

// A CCA layer after a GQA layer (attention_cca.cu against AttentionCca), kernels 3 and 2 and
// partial rotary (4 of each head's 10 entries), on the same awkward sizes.
TEST(CudaDeviceModelCca, LossAndEveryGradientMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  ModelConfig m = tiny_config(false);
  m.attention_layers = {"gqa", "cca"};
  m.cca_time0 = 3;
  m.partial_rotary_factor = 0.4;
  check_loss_and_every_gradient(m);
}

TEST(CudaDeviceModelChecks, RejectsBadBatchAndIds) {
  ATOLL_SKIP_WITHOUT_GPU();
  const ModelConfig m = tiny_config(false);
  gpu::DeviceModel dev(m, 1);
  Rng rng(3);
  Batch b = make_batch(rng, 2, m.seq_len, m.vocab_size);
  EXPECT_THROW(dev.forward(b.in.data(), b.tg.data(), 2), CheckError);  // over max_batch
  b.tg[5] = m.vocab_size;
  EXPECT_THROW(dev.forward(b.in.data(), b.tg.data(), 1), CheckError);  // target outside [0, V)
}

// Clipping: the norm is a sum of squares in double on both sides (order differs: ~1e-15
// relative); the scale float(max_norm / norm) then equals the CPU's or is one ulp away, so the
// clipped gradients agree to 1e-6 relative.
TEST(CudaDeviceOptimizer, ClipMatchesCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  const ModelConfig m = tiny_config(false);
  const ParamLayout layout = ParamLayout::build(m);
  Rng rng(5);
  std::vector<float> g = test::randn_f(rng, layout.total(), 0.01);
  OptimConfig oc;
  gpu::DeviceOptimizer opt(oc, layout);
  test::DeviceVec<float> d_g(g);
  const double want_norm = global_grad_norm(g.data(), g.size());
  const double max_norm = 0.5 * want_norm;  // so that it clips
  const double got_norm = opt.clip_grad_norm(d_g.get(), max_norm);
  EXPECT_NEAR(got_norm, want_norm, 1e-12 * want_norm);
  clip_grad_norm(g.data(), g.size(), max_norm);
  test::expect_near(d_g.host(), g, 0.0, 1e-6, "clipped gradients");
  // Below the threshold nothing changes, and the norm still comes back.
  EXPECT_NEAR(opt.clip_grad_norm(d_g.get(), 10 * want_norm), max_norm, 1e-6 * max_norm);
  test::expect_near(d_g.host(), g, 0.0, 1e-6, "unclipped gradients");
}

// Two optimizer steps from identical parameters and gradients. AdamW on the device repeats the
// CPU's arithmetic (adamw.h): bit-identical, moments included. Muon's Newton-Schulz output O
// agrees to 1e-4 absolute (muon_test.cpp); the update lr·0.2·sqrt(max(rows, cols))·O with
// lr = 1e-3 and max(rows, cols) <= 45 scales that to ~1.3e-7 per step, so parameters within
// 1e-6. The momentum buffer is elementwise fp32 (mu·buf + g): within rounding.
TEST(CudaDeviceOptimizer, OneStepMatchesCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  const ModelConfig m = tiny_config(false);
  const ParamLayout layout = ParamLayout::build(m);
  for (const char* name : {"adamw", "muon"}) {
    SCOPED_TRACE(name);
    OptimConfig oc;
    oc.name = name;
    oc.weight_decay = 0.1;
    Rng rng(9);
    std::vector<float> p = test::randn_f(rng, layout.total(), 0.02), g = test::randn_f(rng, layout.total(), 0.01);
    test::DeviceVec<float> d_p(p), d_g(g);
    Optimizer cpu(oc, layout);
    gpu::DeviceOptimizer dev(oc, layout);
    for (int step = 0; step < 2; ++step) {
      cpu.step(p.data(), g.data(), 1e-3);
      dev.step(d_p.get(), d_g.get(), 1e-3);
    }
    EXPECT_EQ(dev.step_count(), 2);
    std::vector<float> dm(layout.total()), dv(layout.total());
    dev.download_state(dm.data(), dv.data());
    if (oc.name == "adamw") {
      test::expect_equal(d_p.host(), p, "adamw parameters");
      test::expect_equal(dm, cpu.m(), "adamw m");
      test::expect_equal(dv, cpu.v(), "adamw v");
    } else {
      test::expect_near(d_p.host(), p, 1e-6, 0.0, "muon parameters");
      test::expect_near(dm, cpu.m(), 1e-7, 1e-6, "muon momentum");
    }
  }
  OptimConfig sgd;
  sgd.name = "sgd";
  EXPECT_THROW(gpu::DeviceOptimizer(sgd, layout), ConfigError);
}

// 30 steps (AdamW) and 10 (Muon) of the whole training step, clip included, from the same
// initial parameters on the same batches. The two runs start within the rounding above and
// drift apart slowly: AdamW normalises each update, so a gradient element whose sign differs
// by rounding moves by ~2·lr, but such elements have gradients near zero and move the loss
// only to second order. Measured on the CPU against itself with every gradient element
// multiplied by (1 + 1e-6·normal) each step (a pessimistic model of the GPU's rounding), this
// config, data and lr: losses within 2.3e-8 relative (AdamW, 30 steps) and 8e-9 (Muon, 10),
// gradient norms within 2.1e-7; the losses fell 6.28 -> 3.69 and 6.28 -> 5.75. 2e-3 relative
// leaves a wide margin and still catches an error in the step itself, which moves the loss by
// far more. The run must also learn: the last loss 0.1 below the first.
TEST(CudaDeviceModel, TrainingRunTracksCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  test::expect_run_tracks_cpu(tiny_config(false), kMaxBatch, {}, Precision::kFp32,
                              {.loss = 2e-3, .norm = 2e-3, .learn = 0.1});
}

}  // namespace
}  // namespace atl
