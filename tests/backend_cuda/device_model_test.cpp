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
#include "device_run_util.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

// Awkward on purpose: N = B*T = 3*133 = 399 tokens, which E = 4 experts do not divide and whose
// N*K = 798 routed rows no expert count divides evenly; T = 133 spans two attention tiles of
// 128 keys and is not a multiple; V = 301 is not a multiple of the cross-entropy kernel's
// 256-wide vocabulary chunk, and head_rows = 64 leaves a last LM-head chunk of 15 rows; NH = 4
// query heads share NKV = 2 key/value heads; C, H, HD odd or not a multiple of anything.
// init_std 0.2 (not 0.02) so that the router's probabilities are far from uniform and the
// gradients of every tensor are well above rounding; the z-loss is on so its gradient runs.
ModelConfig tiny_config(bool tie) {
  ModelConfig m;
  m.vocab_size = 301;
  m.dim = 36;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 10;
  m.n_experts = 4;
  m.top_k = 2;
  m.expert_hidden = 45;
  m.seq_len = 133;
  m.aux_loss_coef = 0.01;
  m.z_loss_coef = 0.001;
  m.tie_embeddings = tie;
  m.init_std = 0.2;
  return m;
}
constexpr int kMaxBatch = 3;
constexpr int kHeadRows = 64;

using test::Batch;
using test::make_batch;

// A tensor of the layout table out of a flat buffer.
std::vector<float> slice(const std::vector<float>& flat, const ParamEntry& e) {
  return {flat.begin() + long(e.offset), flat.begin() + long(e.offset + e.numel)};
}

// Every tensor's gradient, GPU against CPU. Both sides run the same fp32 operations with
// different summation orders (cuBLAS vs OpenBLAS, the experts' rows combined in slot order
// here and in expert order on the CPU, block reductions vs serial loops). A sum of k fp32
// terms carries up to ~k·2^-24 of the sum of their magnitudes; with k <= 798 (the routed rows
// behind an expert weight gradient) that is ~5e-5 of the largest terms, and the backward pass
// chains about a dozen such products and reductions from the loss to the embedding: errors of
// ~1e-4 of a tensor's largest gradient where terms cancel. Hence, per tensor: every element
// within 1e-3 of the tensor's largest |gradient| (10x margin), and the difference's norm within
// 1e-4 of the gradient's norm (the typical error is ~1e-6). A wrong index, a missing term or a
// gradient written (=) instead of added (+=) is off by O(1) of the tensor's scale.
void expect_grads_near(const std::vector<float>& gpu, const std::vector<float>& cpu, const ParamLayout& layout) {
  for (const ParamEntry& e : layout.entries()) {
    const std::vector<float> g = slice(gpu, e), c = slice(cpu, e);
    double scale = 0, diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      scale = std::max(scale, std::fabs(double(c[i])));
      diff2 += (double(g[i]) - c[i]) * (double(g[i]) - c[i]);
      norm2 += double(c[i]) * c[i];
    }
    SCOPED_TRACE(e.name);
    EXPECT_GT(scale, 0.0) << "a gradient of zero tests nothing";
    test::expect_near(g, c, 1e-3 * scale, 0.0, e.name.c_str());
    EXPECT_LE(std::sqrt(diff2), 1e-4 * std::sqrt(norm2));
  }
}

// Losses: the cross-entropy is a mean of N fp32 per-position losses (~6 each) summed in double
// on both sides; the per-position values differ by the logits' rounding (~1e-6 relative), so
// 1e-5 relative. aux and z are sums of router probabilities and log-sum-exps in double: 1e-5.
void expect_loss_near(const LossParts& gpu, const LossParts& cpu) {
  EXPECT_NEAR(gpu.ce, cpu.ce, 1e-5 * std::fabs(cpu.ce));
  EXPECT_NEAR(gpu.aux, cpu.aux, 1e-5 * std::fabs(cpu.aux));
  EXPECT_NEAR(gpu.z, cpu.z, 1e-5 * std::fabs(cpu.z));
}

class CudaDeviceModel : public testing::TestWithParam<bool> {};  // tied embeddings or not

// Two micro-batches accumulated with loss_scale 1/2, the second smaller than max_batch: the
// gradients must be the sums (+=), the losses those of each batch.
void check_loss_and_every_gradient(const ModelConfig& m) {
  Model<float> cpu(m, kMaxBatch);
  cpu.init_params(7);
  gpu::DeviceModel dev(m, kMaxBatch, {.head_rows = kHeadRows});
  ASSERT_EQ(dev.layout().total(), cpu.layout().total());
  dev.upload_params(cpu.params().data());
  cpu.zero_grads();
  dev.zero_grads();
  Rng rng(11);
  for (const int B : {kMaxBatch, 2}) {
    SCOPED_TRACE(testing::Message() << "B=" << B);
    const Batch b = make_batch(rng, B, m.seq_len, m.vocab_size);
    const LossParts want = cpu.forward_backward(b.in.data(), b.tg.data(), B, 0.5);
    const LossParts got = dev.forward_backward(b.in.data(), b.tg.data(), B, 0.5);
    expect_loss_near(got, want);
    EXPECT_GT(want.aux, 0.0);
    EXPECT_GT(want.z, 0.0);
  }
  std::vector<float> grads(cpu.layout().total());
  dev.download_grads(grads.data());
  expect_grads_near(grads, cpu.grads(), cpu.layout());

  // forward() gives the same loss and leaves the gradients alone.
  const Batch b = make_batch(rng, kMaxBatch, m.seq_len, m.vocab_size);
  expect_loss_near(dev.forward(b.in.data(), b.tg.data(), kMaxBatch), cpu.forward(b.in.data(), b.tg.data(), kMaxBatch));
  std::vector<float> after(grads.size());
  dev.download_grads(after.data());
  test::expect_equal(after, grads, "gradients after forward()");

  // The parameters come back as they went up.
  std::vector<float> params(cpu.layout().total());
  dev.download_params(params.data());
  test::expect_equal(params, cpu.params(), "downloaded parameters");
}

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
