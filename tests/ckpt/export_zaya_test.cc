// The ZAYA1 export's names and shapes against a table written by hand from transformers'
// modeling_zaya.py (ZayaModel, ZayaDecoderLayer, ZayaResidualScaling, ZayaRouter,
// ZayaRouterMLP, ZayaExperts: an oracle independent of the mapping), and the choice of
// architecture: Mixtral stays Mixtral, a mix neither expresses is refused naming its keys.
#include "atoll/ckpt/export_zaya.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "atoll/core/errors.h"
#include "ckpt/ckpt_test_util.h"

namespace atl {
namespace {

using Shape = std::vector<int64_t>;

// Upstream's tensors of ZAYA1's router, experts, residual scaling and the model around the
// blocks, for C, L, E, moe_intermediate_size H, router_hidden_size R; the attention's are CCA's.
std::map<std::string, Shape> upstream_non_attention(int64_t V, int64_t C, int L, int64_t E, int64_t H, int64_t R) {
  std::map<std::string, Shape> want = {{"model.embed_tokens.weight", {V, C}},
                                       {"model.input_hidden_states_scale", {C}},
                                       {"model.input_hidden_states_bias", {C}},
                                       {"model.norm.weight", {C}}};
  for (int i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    want[p + "input_layernorm.weight"] = {C};
    want[p + "post_attention_layernorm.weight"] = {C};
    for (const char* s : {"post_attention_residual_scale.", "post_mlp_residual_scale."})
      for (const char* t : {"hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"})
        want[p + s + t] = {C};
    want[p + "mlp.gate.down_proj.weight"] = {R, C};
    want[p + "mlp.gate.down_proj.bias"] = {R};
    if (i >= 1) want[p + "mlp.gate.router_states_scale"] = {R};  // use_eda = layer_idx != 0
    want[p + "mlp.gate.router_mlp.norm.weight"] = {R};
    want[p + "mlp.gate.router_mlp.fc1.weight"] = {R, R};
    want[p + "mlp.gate.router_mlp.fc1.bias"] = {R};
    want[p + "mlp.gate.router_mlp.fc2.weight"] = {R, R};
    want[p + "mlp.gate.router_mlp.fc2.bias"] = {R};
    want[p + "mlp.gate.router_mlp.out_proj.weight"] = {E + 1, R};
    want[p + "mlp.gate.balancing_biases"] = {E + 1};
    want[p + "mlp.experts.gate_up_proj"] = {E, 2 * H, C};
    want[p + "mlp.experts.down_proj"] = {E, C, H};
  }
  return want;
}

ModelConfig zaya_router_model() {
  ModelConfig m = testing::small_model(/*tied=*/true);
  m.router = "zaya", m.top_k = 1, m.router_hidden_size = 12, m.residual_scaling = true, m.n_layers = 3;
  return m;
}

// Every row of our zaya router, experts, residual scaling, embedding and final norm has its
// upstream name, and its shape is upstream's (the experts' W1 row names the packed gate_up_proj,
// [E, 2H, C]; W3 has no name of its own). Attention rows have none until atoll has CCA.
TEST(ExportZaya, RowsHaveTheirUpstreamNamesAndShapes) {
  const ModelConfig m = zaya_router_model();
  const ParamLayout layout = ParamLayout::build(m);
  std::map<std::string, Shape> got;
  for (const ParamEntry& e : layout.entries()) {
    const std::string name = hf_zaya_name(e);
    if (e.name.find(".attn.") != std::string::npos || e.name.find("moe.w3") != std::string::npos) {
      EXPECT_EQ(name, "") << e.name;
      continue;
    }
    ASSERT_NE(name, "") << e.name << " has no upstream name";
    Shape shape = e.shape;
    if (e.name.find("moe.w1") != std::string::npos) shape = {m.n_experts, 2 * int64_t(m.expert_hidden), m.dim};
    EXPECT_TRUE(got.emplace(name, shape).second) << name << " named twice";
  }
  EXPECT_EQ(got, upstream_non_attention(m.vocab_size, m.dim, m.n_layers, m.n_experts, m.expert_hidden,
                                        m.router_hidden_size));
}

// CCA's rows, as the cca branch names them, map onto ZayaAttention's tensors (upstream:
// self_attn.qkv_proj = ZayaCCAProjection, self_attn.qk_norm = ZayaQKNorm, self_attn.o_proj).
TEST(ExportZaya, CcaRowsMapOntoZayaAttention) {
  const std::map<std::string, std::string> want = {
      {"attn.qkv_proj.q_proj.weight", "self_attn.qkv_proj.q_proj.weight"},
      {"attn.qkv_proj.k_proj.weight", "self_attn.qkv_proj.k_proj.weight"},
      {"attn.qkv_proj.v_proj_current.weight", "self_attn.qkv_proj.v_proj_current.weight"},
      {"attn.qkv_proj.v_proj_delayed.weight", "self_attn.qkv_proj.v_proj_delayed.weight"},
      {"attn.qkv_proj.conv_qk_depthwise.weight", "self_attn.qkv_proj.conv_qk_depthwise.weight"},
      {"attn.qkv_proj.conv_qk_depthwise.bias", "self_attn.qkv_proj.conv_qk_depthwise.bias"},
      {"attn.qkv_proj.conv_qk_grouped.weight", "self_attn.qkv_proj.conv_qk_grouped.weight"},
      {"attn.qkv_proj.conv_qk_grouped.bias", "self_attn.qkv_proj.conv_qk_grouped.bias"},
      {"attn.qk_norm.temp", "self_attn.qk_norm.temp"},
      {"attn.o_proj.weight", "self_attn.o_proj.weight"}};
  for (const auto& [ours, theirs] : want) {
    ParamEntry e;
    e.name = "layers.2." + ours, e.layer = 2;
    EXPECT_EQ(hf_zaya_name(e), "model.layers.2." + theirs);
  }
}

TEST(ExportZaya, MixtralStaysMixtral) {
  EXPECT_EQ(hf_architecture(testing::small_model()), HfArchitecture::kMixtral);
  ModelConfig same = testing::small_model();  // a local layer with the global base is a global one
  same.rope_layers = {"global", "local"}, same.rope_theta_local = same.rope_theta;
  EXPECT_EQ(hf_architecture(same), HfArchitecture::kMixtral);
}

// hf_architecture(m) refuses with a ConfigError naming each of `words`.
void expect_refused(const ModelConfig& m, const std::vector<const char*>& words) {
  try {
    hf_architecture(m);
    ADD_FAILURE() << "not refused";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    for (const char* w : words) EXPECT_NE(what.find(w), std::string::npos) << w << " not in: " << what;
  }
}

// Mixtral has one rope_theta: two RoPE bases are refused naming the keys.
TEST(ExportZaya, MixtralWithTwoRopeBasesIsRefused) {
  ModelConfig m = testing::small_model();
  m.rope_layers = {"global", "local"}, m.rope_theta_local = 7.0;
  expect_refused(m, {"model.rope_layers", "model.rope_theta_local", "rope_theta", "fix:"});
}

// A shared expert makes Qwen2-MoE (with q/k/v biases or without); q/k/v biases without a shared
// expert, or a shared expert beside a q/k norm, have no architecture and are refused naming the keys.
TEST(ExportZaya, SharedExpertIsQwen2Moe) {
  ModelConfig m = testing::small_model();
  m.shared_expert_hidden = 8;
  EXPECT_EQ(hf_architecture(m), HfArchitecture::kQwen2Moe);
  m.qkv_bias = true;
  EXPECT_EQ(hf_architecture(m), HfArchitecture::kQwen2Moe);
  ModelConfig bias_only = testing::small_model(), with_norm = m;
  bias_only.qkv_bias = true;
  with_norm.qk_norm = "head";
  for (const ModelConfig* bad : {&bias_only, &with_norm})
    expect_refused(*bad, {"Qwen2-MoE", "model.shared_expert_hidden", "model.qk_norm", "model.qkv_bias", "fix:"});
}

// A mix neither architecture expresses is refused, with the keys that make it and the fix.
TEST(ExportZaya, AMixIsRefusedNamingItsKeys) {
  ModelConfig scaled = testing::small_model();
  scaled.residual_scaling = true;  // Mixtral has no residual scaling
  ModelConfig mixed = testing::small_model();
  mixed.router_layers = {"topk", "zaya"};
  ModelConfig zaya_gqa = zaya_router_model();  // ZAYA1's attention is CCA
  ModelConfig zaya_top2 = zaya_router_model();
  zaya_top2.top_k = 2;  // transformers' ZAYA routes top-1 only
  for (const ModelConfig* m : {&scaled, &mixed, &zaya_gqa, &zaya_top2})
    expect_refused(*m, {"model.attention", "model.router", "model.top_k", "model.residual_scaling", "fix:"});
}

}  // namespace
}  // namespace atl
