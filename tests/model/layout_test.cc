// The layout table the parts build: today's rows in today's order (checkpoints, the HF export
// and bit-identity depend on it), each tensor's matrices as its part declares them, and a
// part kind the config does not know is a ConfigError naming the key.
#include "atoll/model/layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

TEST(Layout, RowsInOrderWithTheirMatrices) {
  ModelConfig m;
  m.vocab_size = 10, m.dim = 8, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 4;
  m.n_experts = 3, m.expert_hidden = 6;
  const ParamLayout p = ParamLayout::build(m);
  std::vector<std::string> want = {"embed"};
  for (int l = 0; l < 2; ++l)
    for (const char* n : {"attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo", "moe_norm", "moe.router", "moe.w1",
                          "moe.w3", "moe.w2"})
      want.push_back("layers." + std::to_string(l) + "." + n);
  want.insert(want.end(), {"final_norm", "head"});
  std::vector<std::string> got;
  size_t end = 0;
  for (const ParamEntry& e : p.entries()) {
    got.push_back(e.name);
    EXPECT_EQ(e.offset % ParamLayout::kAlign, 0u) << e.name;
    EXPECT_GE(e.offset, end) << e.name;
    end = e.offset + e.numel;
    EXPECT_EQ(size_t(e.n_matrices() * e.rows() * e.cols()), e.numel) << e.name;
    EXPECT_TRUE(e.trainable) << e.name;
    EXPECT_EQ(e.init == ParamInit::kOnes, e.group == ParamGroup::kNorm) << e.name;
  }
  EXPECT_EQ(got, want);
  const ParamEntry& w1 = p.at("layers.1.moe.w1");  // a stack of E matrices [H, C]
  EXPECT_EQ(w1.n_matrices(), 3);
  EXPECT_EQ(w1.rows(), 6);
  EXPECT_EQ(w1.cols(), 8);
  const ParamEntry& wq = p.at("layers.0.attn.wq");
  EXPECT_EQ(wq.n_matrices(), 1);
  EXPECT_EQ(wq.rows(), 16);
  EXPECT_EQ(wq.cols(), 8);
  EXPECT_FALSE(p.at("layers.0.attn_norm").is_hidden_matrix());
  EXPECT_TRUE(wq.is_hidden_matrix());
  m.tie_embeddings = true;
  EXPECT_EQ(ParamLayout::build(m).find("head"), nullptr);
}

TEST(Layout, UnknownPartKindIsAConfigError) {
  ModelConfig m;
  m.attention = "mla";
  try {
    ParamLayout::build(m);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.attention"), std::string::npos) << e.what();
  }
  m.attention = "gqa", m.router = "mlp";
  EXPECT_THROW(ParamLayout::build(m), ConfigError);
  // Per layer: the pattern repeats over the layers, and the error names the layer.
  m.router = "topk", m.n_layers = 4, m.attention_layers = {"gqa", "mla"};
  try {
    ParamLayout::build(m);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1's attention \"mla\""), std::string::npos) << e.what();
  }
}

// CCA's rows carry transformers' `zaya` names after "model.layers.{l}.self_attn." and its
// shapes (written out from ZayaCCAProjection / ZayaQKNorm: Conv1d weights [out, in/groups, k]),
// and say how each trains: Muon matrices, AdamW vectors, a temperature starting at 1.
TEST(Layout, CcaRowsAreUpstreamsNamesAndShapes) {
  ModelConfig m;
  m.dim = 48, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 8, m.cca_time0 = 3, m.cca_time1 = 2;
  m.attention_layers = {"gqa", "cca"};
  const ParamLayout layout = ParamLayout::build(m);
  const int64_t C = 48, QD = 32, KVD = 16, CC = 48, HD = 8;
  const std::string p = "layers.1.attn.";
  const struct {
    std::string name;
    std::vector<int64_t> shape;
    ParamGroup group;
    ParamInit init;
  } want[] = {
      {p + "qkv_proj.q_proj.weight", {QD, C}, ParamGroup::kAttention, ParamInit::kNormal},
      {p + "qkv_proj.k_proj.weight", {KVD, C}, ParamGroup::kAttention, ParamInit::kNormal},
      {p + "qkv_proj.v_proj_current.weight", {KVD / 2, C}, ParamGroup::kAttention, ParamInit::kNormal},
      {p + "qkv_proj.v_proj_delayed.weight", {KVD / 2, C}, ParamGroup::kAttention, ParamInit::kNormal},
      {p + "qkv_proj.conv_qk_depthwise.weight", {CC, 1, 3}, ParamGroup::kConv, ParamInit::kNormal},
      {p + "qkv_proj.conv_qk_depthwise.bias", {CC}, ParamGroup::kConv, ParamInit::kZeros},
      {p + "qkv_proj.conv_qk_grouped.weight", {CC, HD, 2}, ParamGroup::kAttention, ParamInit::kNormal},
      {p + "qkv_proj.conv_qk_grouped.bias", {CC}, ParamGroup::kConv, ParamInit::kZeros},
      {p + "qk_norm.temp", {2}, ParamGroup::kNorm, ParamInit::kOnes},
      {p + "o_proj.weight", {C, QD}, ParamGroup::kAttention, ParamInit::kNormal},
  };
  std::vector<std::string> names;
  for (const ParamEntry& e : layout.entries())
    if (e.layer == 1 && e.name.rfind(p, 0) == 0) names.push_back(e.name);
  ASSERT_EQ(names.size(), std::size(want));
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(names[i], want[i].name);
    const ParamEntry& e = layout.at(want[i].name);
    EXPECT_EQ(e.shape, want[i].shape);
    EXPECT_EQ(e.group, want[i].group);
    EXPECT_EQ(e.init, want[i].init);
  }
  // The grouped kernel is one [HD, HD·t1] matrix per head for Muon.
  const ParamEntry& g = layout.at(p + "qkv_proj.conv_qk_grouped.weight");
  EXPECT_EQ(g.n_matrices(), 6);
  EXPECT_EQ(g.rows(), HD);
  EXPECT_EQ(g.cols(), HD * 2);
  EXPECT_FALSE(layout.at(p + "qkv_proj.conv_qk_depthwise.bias").takes_weight_decay());
  EXPECT_NE(layout.find("layers.0.attn.wq"), nullptr);  // layer 0 stays gqa
}

TEST(Layout, PerLayerKindsRepeatOverTheLayers) {
  ModelConfig m;
  m.n_layers = 5, m.attention = "mla", m.router = "mlp";  // overridden for every layer below
  m.attention_layers = {"gqa"}, m.router_layers = {"topk", "topk"};
  for (int l = 0; l < m.n_layers; ++l) {
    EXPECT_EQ(m.attention_at(l), "gqa");
    EXPECT_EQ(m.router_at(l), "topk");
  }
  ModelConfig plain;
  plain.n_layers = 5;
  const ParamLayout a = ParamLayout::build(m), b = ParamLayout::build(plain);
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (size_t i = 0; i < a.entries().size(); ++i) {
    EXPECT_EQ(a.entries()[i].name, b.entries()[i].name);
    EXPECT_EQ(a.entries()[i].offset, b.entries()[i].offset);
  }
}

TEST(Layout, MatricesMustCoverTheTensor) {
  ParamLayout p;
  ParamEntry e = matrix_entry("w", 4, 6, ParamGroup::kAttention, 0);
  e.matrix_rows = 5;
  EXPECT_THROW(p.add(e), CheckError);
}

}  // namespace
}  // namespace atl
