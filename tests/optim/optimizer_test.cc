// The Optimizer's walk over the layout table: which tensors get Muon and which AdamW (checked
// against direct calls of the two updates), weight decay only where the table says, and a
// resumed optimizer (state buffers and step count restored) equal to an uninterrupted one.
#include "atoll/optim/optimizer.h"

#include <gtest/gtest.h>

#include <vector>

#include "atoll/core/check.h"
#include "atoll/core/rng.h"

namespace atl {
namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 16, m.dim = 8, m.n_layers = 2, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4;
  m.n_experts = 3, m.top_k = 1, m.expert_hidden = 12;
  return m;
}

OptimConfig optim_config(const char* name) {
  OptimConfig c;
  c.name = name;
  c.weight_decay = 0.1;
  return c;
}

std::vector<float> random_buffer(const ParamLayout& layout, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> b(layout.total(), 0.0f);  // padding stays 0
  for (const ParamEntry& e : layout.entries())
    for (size_t i = 0; i < e.numel; ++i) b[e.offset + i] = float(rng.normal());
  return b;
}

// The expected result of two steps, by direct calls on each tensor of the table.
std::vector<float> direct_steps(const ParamLayout& layout, const OptimConfig& cfg, std::vector<float> p,
                                const std::vector<float>* grads, const double* lrs) {
  std::vector<float> m(layout.total(), 0.0f), v(layout.total(), 0.0f);
  MuonWorkspace ws;
  for (int t = 1; t <= 2; ++t) {
    const float* g = grads[t - 1].data();
    for (const ParamEntry& e : layout.entries()) {
      const double wd = e.group == ParamGroup::kNorm ? 0.0 : cfg.weight_decay;
      if (cfg.name == "muon" && (e.group == ParamGroup::kAttention || e.group == ParamGroup::kExpert)) {
        const MuonOptions o{.lr = lrs[t - 1], .momentum = cfg.muon_momentum, .weight_decay = wd, .ns_steps = 5};
        const size_t per = size_t(e.rows() * e.cols());
        for (int64_t k = 0; k < e.n_matrices(); ++k) {
          const size_t off = e.offset + k * per;
          muon_update(p.data() + off, m.data() + off, g + off, int(e.rows()), int(e.cols()), o, &ws);
        }
      } else {
        const AdamWOptions o{
            .lr = lrs[t - 1], .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = cfg.eps, .weight_decay = wd};
        adamw_update(p.data() + e.offset, m.data() + e.offset, v.data() + e.offset, g + e.offset, e.numel, t, o);
      }
    }
  }
  return p;
}

void check_against_direct(const char* name) {
  const ParamLayout layout = ParamLayout::build(tiny_model());
  const OptimConfig cfg = optim_config(name);
  const std::vector<float> p0 = random_buffer(layout, 1);
  const std::vector<float> grads[2] = {random_buffer(layout, 2), random_buffer(layout, 3)};
  const double lrs[2] = {0.01, 0.02};
  Optimizer opt(cfg, layout);
  std::vector<float> p = p0;
  for (int t = 0; t < 2; ++t) opt.step(p.data(), grads[t].data(), lrs[t]);
  EXPECT_EQ(opt.step_count(), 2);
  const std::vector<float> want = direct_steps(layout, cfg, p0, grads, lrs);
  for (const ParamEntry& e : layout.entries())
    for (size_t i = 0; i < e.numel; ++i) {
      // The same functions on the same data: bit-identical (Muon matrices run on single-threaded
      // BLAS in the optimizer, but these tiny products never split across BLAS threads anyway).
      ASSERT_EQ(p[e.offset + i], want[e.offset + i]) << name << " " << e.name << "[" << i << "]";
    }
}

TEST(Optimizer, MuonGroupsMatchDirectCalls) { check_against_direct("muon"); }
TEST(Optimizer, AdamwEverywhereMatchesDirectCalls) { check_against_direct("adamw"); }

TEST(Optimizer, MuonGroupsByTable) {
  // With zero gradients every method reduces to its decay, which tells the groups apart:
  // AdamW with decay scales by 1 - lr wd, a norm gain (no decay) is unchanged. With a
  // gradient, AdamW writes the second moment and Muon leaves it 0.
  const ParamLayout layout = ParamLayout::build(tiny_model());
  Optimizer opt(optim_config("muon"), layout);
  std::vector<float> p = random_buffer(layout, 4);
  const std::vector<float> p0 = p, g = random_buffer(layout, 5);
  const std::vector<float> zero(layout.total(), 0.0f);
  opt.step(p.data(), zero.data(), 0.5);
  const ParamEntry& norm = layout.at("layers.0.attn_norm");
  const ParamEntry& embed = layout.at("embed");
  for (size_t i = 0; i < norm.numel; ++i) EXPECT_EQ(p[norm.offset + i], p0[norm.offset + i]);
  for (size_t i = 0; i < embed.numel; ++i)
    EXPECT_EQ(p[embed.offset + i], p0[embed.offset + i] * float(1.0 - 0.5 * 0.1));

  opt.step(p.data(), g.data(), 0.01);
  for (const ParamEntry& e : layout.entries()) {
    bool any_v = false;
    for (size_t i = 0; i < e.numel; ++i) any_v |= opt.v()[e.offset + i] != 0.0f;
    EXPECT_EQ(any_v, !e.is_hidden_matrix()) << e.name << " (" << param_group_name(e.group) << ")";
  }
  EXPECT_GT(opt.times().muon_s, 0.0);
}

// Muon reads the matrices from the row, not from the shape: a 3-D kernel [out, in, width]
// declared as one [out, in*width] matrix steps exactly as that 2-D matrix does. A buffer
// (trainable = false) is never stepped: it keeps its value and no optimizer state.
TEST(Optimizer, MuonReadsMatricesFromTheRowAndSkipsBuffers) {
  auto layout_with = [](ParamEntry kernel) {
    ParamLayout p;
    p.add(matrix_entry("embed", 16, 8, ParamGroup::kEmbedding, -1));
    p.add(std::move(kernel));
    ParamEntry bias = matrix_entry("bias", 1, 4, ParamGroup::kRouter, 0);
    bias.shape = {4}, bias.trainable = false, bias.init = ParamInit::kZeros;
    p.add(std::move(bias));
    return p;
  };
  ParamEntry conv = matrix_entry("conv", 4, 6, ParamGroup::kAttention, 0);
  conv.shape = {4, 3, 2};
  const ParamLayout as_3d = layout_with(conv), as_2d = layout_with(matrix_entry("conv", 4, 6, ParamGroup::kAttention, 0));
  ASSERT_EQ(as_3d.total(), as_2d.total());
  Optimizer a(optim_config("muon"), as_3d), b(optim_config("muon"), as_2d);
  std::vector<float> pa = random_buffer(as_3d, 7), pb = pa;
  const std::vector<float> p0 = pa, g = random_buffer(as_3d, 8);
  a.step(pa.data(), g.data(), 0.01), b.step(pb.data(), g.data(), 0.01);
  EXPECT_EQ(pa, pb);
  const ParamEntry& conv_row = as_3d.at("conv");
  EXPECT_NE(pa[conv_row.offset], p0[conv_row.offset]);
  const ParamEntry& bias = as_3d.at("bias");
  for (size_t i = 0; i < bias.numel; ++i) {
    EXPECT_EQ(pa[bias.offset + i], p0[bias.offset + i]);
    EXPECT_EQ(a.m()[bias.offset + i], 0.0f);
    EXPECT_EQ(a.v()[bias.offset + i], 0.0f);
  }
}

TEST(Optimizer, ResumedEqualsUninterrupted) {
  const ParamLayout layout = ParamLayout::build(tiny_model());
  const OptimConfig cfg = optim_config("muon");
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 3; ++t) grads.push_back(random_buffer(layout, 10 + t));
  Optimizer a(cfg, layout);
  std::vector<float> pa = random_buffer(layout, 6), pb = pa;
  for (int t = 0; t < 3; ++t) a.step(pa.data(), grads[t].data(), 0.01);

  Optimizer b(cfg, layout);
  for (int t = 0; t < 2; ++t) b.step(pb.data(), grads[t].data(), 0.01);
  Optimizer c(cfg, layout);  // as loaded from a checkpoint of b
  auto from = b.state_buffers(), to = c.state_buffers();
  ASSERT_EQ(from.size(), 2u);
  EXPECT_EQ(from[0].first, "adam_m");
  EXPECT_EQ(from[1].first, "adam_v");
  for (size_t k = 0; k < from.size(); ++k) {
    EXPECT_EQ(to[k].second->size(), layout.total());
    *to[k].second = *from[k].second;
  }
  c.set_step_count(b.step_count());
  c.step(pb.data(), grads[2].data(), 0.01);
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(a.m(), c.m());
  EXPECT_EQ(a.v(), c.v());
}

TEST(Optimizer, RejectsUnknownName) {
  const ParamLayout layout = ParamLayout::build(tiny_model());
  EXPECT_THROW(Optimizer(optim_config("lion"), layout), CheckError);
}

}  // namespace
}  // namespace atl
