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
  m.attention = "cca";
  try {
    ParamLayout::build(m);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.attention"), std::string::npos) << e.what();
  }
  m.attention = "gqa", m.router = "mlp";
  EXPECT_THROW(ParamLayout::build(m), ConfigError);
  // Per layer: the pattern repeats over the layers, and the error names the layer.
  m.router = "topk", m.n_layers = 4, m.attention_layers = {"gqa", "cca"};
  try {
    ParamLayout::build(m);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1's attention \"cca\""), std::string::npos) << e.what();
  }
}

TEST(Layout, PerLayerKindsRepeatOverTheLayers) {
  ModelConfig m;
  m.n_layers = 5, m.attention = "cca", m.router = "mlp";  // overridden for every layer below
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
