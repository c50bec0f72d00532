// The whole-model check shared by the device-model tests (device_model_test.cpp,
// device_model_zaya_test.cpp): DeviceModel's loss and every gradient against Model<float>'s on
// the CPU, from the same parameters and batches, with the tolerances argued below; and the
// configs they share (device_model_context_parallel_test.cpp too).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "atoll/model/device_model.h"
#include "atoll/model/model.h"
#include "gpu_test_util.h"

namespace atl::test {

// Awkward on purpose: N = B*T = 3*133 = 399 tokens, which E = 4 experts do not divide and whose
// N*K = 798 routed rows no expert count divides evenly; T = 133 spans two attention tiles of
// 128 keys and is not a multiple; V = 301 is not a multiple of the cross-entropy kernel's
// 256-wide vocabulary chunk, and head_rows = 64 leaves a last LM-head chunk of 15 rows; NH = 4
// query heads share NKV = 2 key/value heads; C, H, HD odd or not a multiple of anything.
// init_std 0.2 (not 0.02) so that the router's probabilities are far from uniform and the
// gradients of every tensor are well above rounding; the z-loss is on so its gradient runs.
inline ModelConfig tiny_config(bool tie) {
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

// tiny_config's awkward sizes (N = 399 tokens, T = 133, C = 36, E = 4) with ZAYA1's parts on
// three layers, so the depth-averaging chain runs 2 -> 1 -> 0 in backward (the state's gradient
// handed back twice): the zaya router with an odd R = 11 and top-2 of E1 = 5 classes, residual
// scaling, and the middle layer local with its own RoPE base.
inline ModelConfig zaya_config() {
  ModelConfig m = tiny_config(false);
  m.n_layers = 3;
  m.router = "zaya";
  m.router_hidden_size = 11;
  m.aux_loss_coef = 0.0;
  m.z_loss_coef = 0.0;
  m.residual_scaling = true;
  m.rope_layers = {"global", "local", "global"};
  m.rope_theta_local = 500.0;
  return m;
}

// Moves the rows that start at the identity (the residual affines, the depth scales) and the
// balancing biases away from it: scales 1 ± 0.15, biases ± 0.15, and the skip class's bias near
// 0 instead of model.router_skip_bias (-1, which no token would ever pass), so that some slots
// choose the skip class and reach no expert.
inline void perturb_zaya_rows(Model<float>& cpu) {
  Rng rng(5);
  for (const ParamEntry& e : cpu.layout().entries()) {
    const bool merge = e.name.find("_merge.") != std::string::npos || e.name.rfind("input_", 0) == 0;
    const bool depth = e.name.find("depth_scale") != std::string::npos;
    if (!merge && !depth && !e.balanced) continue;
    float* p = cpu.params().data() + e.offset;
    if (e.balanced) std::fill(p, p + e.numel, 0.0f);
    for (size_t i = 0; i < e.numel; ++i) p[i] += float(0.3 * (rng.uniform() - 0.5));
  }
}

inline constexpr int kMaxBatch = 3;
inline constexpr int kHeadRows = 64;

// A tensor of the layout table out of a flat buffer.
inline std::vector<float> slice(const std::vector<float>& flat, const ParamEntry& e) {
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
inline void expect_grads_near(const std::vector<float>& gpu, const std::vector<float>& cpu, const ParamLayout& layout) {
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
inline void expect_loss_near(const LossParts& gpu, const LossParts& cpu) {
  EXPECT_NEAR(gpu.ce, cpu.ce, 1e-5 * std::fabs(cpu.ce));
  EXPECT_NEAR(gpu.aux, cpu.aux, 1e-5 * std::fabs(cpu.aux));
  EXPECT_NEAR(gpu.z, cpu.z, 1e-5 * std::fabs(cpu.z));
}

// Two micro-batches accumulated with loss_scale 1/2, the second smaller than max_batch: the
// gradients must be the sums (+=), the losses those of each batch. `prepare` may change the
// initial parameters (after init_params(7)); with_aux: the router has auxiliary losses.
inline void check_loss_and_every_gradient(const ModelConfig& m, bool with_aux = true,
                                          const std::function<void(Model<float>&)>& prepare = {}) {
  Model<float> cpu(m, kMaxBatch);
  cpu.init_params(7);
  if (prepare) prepare(cpu);
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
    if (with_aux) {
      EXPECT_GT(want.aux, 0.0);
      EXPECT_GT(want.z, 0.0);
    }
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

}  // namespace atl::test
