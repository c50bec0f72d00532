#include "atoll/ckpt/hf_tables.h"

#include "atoll/core/check.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

// Our name (within a block, after "layers.{i}.") -> the HF names after "model.layers.{i}.", one
// column per expert layout. "{e}" names one matrix per expert (split along dim 0). A fused name
// gathers `half` of each expert's rows: 0 the whole matrix, 1 the first half of 2H rows (w1,
// gate), 2 the second (w3, up). "" : the layout has no such tensor (Qwen2-MoE's q/k/v biases and
// shared expert have names in the Qwen layouts only, per-expert or fused).
struct HfName {
  const char* ours;
  const char* per_expert;
  const char* fused;
  int half;
  const char* dense;
  const char* per_expert_mlp;  // Qwen3-MoE's and OLMoE's names of one matrix per expert
};
constexpr HfName kBlockNames[] = {
    {"attn_norm", "input_layernorm.weight", "input_layernorm.weight", 0, "input_layernorm.weight",
     "input_layernorm.weight"},
    {"attn.wq", "self_attn.q_proj.weight", "self_attn.q_proj.weight", 0, "self_attn.q_proj.weight",
     "self_attn.q_proj.weight"},
    {"attn.wk", "self_attn.k_proj.weight", "self_attn.k_proj.weight", 0, "self_attn.k_proj.weight",
     "self_attn.k_proj.weight"},
    {"attn.wv", "self_attn.v_proj.weight", "self_attn.v_proj.weight", 0, "self_attn.v_proj.weight",
     "self_attn.v_proj.weight"},
    {"attn.wo", "self_attn.o_proj.weight", "self_attn.o_proj.weight", 0, "self_attn.o_proj.weight",
     "self_attn.o_proj.weight"},
    {"attn.bq", "", "self_attn.q_proj.bias", 0, "", "self_attn.q_proj.bias"},
    {"attn.bk", "", "self_attn.k_proj.bias", 0, "", "self_attn.k_proj.bias"},
    {"attn.bv", "", "self_attn.v_proj.bias", 0, "", "self_attn.v_proj.bias"},
    {"attn.q_norm", "self_attn.q_norm.weight", "self_attn.q_norm.weight", 0, "self_attn.q_norm.weight",
     "self_attn.q_norm.weight"},
    {"attn.k_norm", "self_attn.k_norm.weight", "self_attn.k_norm.weight", 0, "self_attn.k_norm.weight",
     "self_attn.k_norm.weight"},
    {"moe_norm", "post_attention_layernorm.weight", "post_attention_layernorm.weight", 0,
     "post_attention_layernorm.weight", "post_attention_layernorm.weight"},
    {"moe.router", "block_sparse_moe.gate.weight", "mlp.gate.weight", 0, "", "mlp.gate.weight"},
    {"moe.w1", "block_sparse_moe.experts.{e}.w1.weight", "mlp.experts.gate_up_proj", 1, "mlp.gate_proj.weight",
     "mlp.experts.{e}.gate_proj.weight"},
    {"moe.w2", "block_sparse_moe.experts.{e}.w2.weight", "mlp.experts.down_proj", 0, "mlp.down_proj.weight",
     "mlp.experts.{e}.down_proj.weight"},
    {"moe.w3", "block_sparse_moe.experts.{e}.w3.weight", "mlp.experts.gate_up_proj", 2, "mlp.up_proj.weight",
     "mlp.experts.{e}.up_proj.weight"},
    {"moe.shared_w1", "", "mlp.shared_expert.gate_proj.weight", 0, "", "mlp.shared_expert.gate_proj.weight"},
    {"moe.shared_w3", "", "mlp.shared_expert.up_proj.weight", 0, "", "mlp.shared_expert.up_proj.weight"},
    {"moe.shared_w2", "", "mlp.shared_expert.down_proj.weight", 0, "", "mlp.shared_expert.down_proj.weight"},
    {"moe.shared_gate", "", "mlp.shared_expert_gate.weight", 0, "", "mlp.shared_expert_gate.weight"},
};
struct HfTopName {
  const char* ours;
  const char* theirs;
};
constexpr HfTopName kTopNames[] = {
    {"embed", "model.embed_tokens.weight"},
    {"final_norm", "model.norm.weight"},
    {"head", "lm_head.weight"},
};

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

[[noreturn]] void no_name(const ParamEntry& e, HfExpertLayout lay) {
  throw Error("cannot map parameter '" + e.name + "' to the " + std::string(expert_layout_name(lay)) +
              " layout: transformers has no tensor for it there (fix: use this architecture's own layout)");
}

}  // namespace

const char* expert_layout_name(HfExpertLayout l) {
  switch (l) {
    case HfExpertLayout::kPerExpert: return "per-expert";
    case HfExpertLayout::kFused: return "fused";
    case HfExpertLayout::kDense: return "dense";
    case HfExpertLayout::kPerExpertMlp: return "per-expert-mlp";
  }
  return "?";
}

std::vector<HfPiece> hf_mixtral_pieces(const ParamLayout& layout, HfExpertLayout lay) {
  std::vector<HfPiece> out;
  for (const auto& e : layout.entries()) {
    const auto whole = [&](const std::string& name) {
      const int64_t rows = e.shape.empty() ? 1 : numel_of(e.shape) / e.shape.back();
      out.push_back({name, e.shape, 0, rows, e.offset});
    };
    bool done = false;
    for (const auto& n : kTopNames)
      if (e.name == n.ours) whole(n.theirs), done = true;
    if (done) continue;
    const std::string pre = "layers." + std::to_string(e.layer) + ".";
    const HfName* row = nullptr;
    if (e.layer >= 0 && e.name.compare(0, pre.size(), pre) == 0)
      for (const auto& n : kBlockNames)
        if (e.name.substr(pre.size()) == n.ours) row = &n;
    if (!row) no_name(e, lay);
    const std::string hf_pre = "model." + pre;
    const bool stacked = std::string(row->per_expert).find("{e}") != std::string::npos;
    const char* column = lay == HfExpertLayout::kFused          ? row->fused
                         : lay == HfExpertLayout::kPerExpertMlp ? row->per_expert_mlp
                         : lay == HfExpertLayout::kDense        ? row->dense
                                                                : row->per_expert;
    if (!*column && !(lay == HfExpertLayout::kDense && std::string(row->ours) == "moe.router")) no_name(e, lay);
    if (lay == HfExpertLayout::kDense) {
      if (!*column) continue;  // the router: zeroed by the caller
      if (stacked) {
        if (e.shape[0] != 1)
          throw Error("a dense (Llama/Mistral) layout holds one expert, not model.n_experts = " +
                      std::to_string(e.shape[0]));
        out.push_back({hf_pre + row->dense, {e.shape[1], e.shape[2]}, 0, e.shape[1], e.offset});
      } else {
        whole(hf_pre + row->dense);
      }
    } else if (!stacked) {
      whole(hf_pre + column);
    } else {
      ATOLL_CHECK_EQ(e.shape.size(), size_t(3)) << e.name;
      const int64_t E = e.shape[0], R = e.shape[1], W = e.shape[2];
      const size_t per_expert = size_t(R * W);
      for (int64_t x = 0; x < E; ++x) {
        const size_t off = e.offset + size_t(x) * per_expert;
        if (lay == HfExpertLayout::kPerExpert || lay == HfExpertLayout::kPerExpertMlp) {
          std::string n = lay == HfExpertLayout::kPerExpert ? row->per_expert : row->per_expert_mlp;
          n.replace(n.find("{e}"), 3, std::to_string(x));
          out.push_back({hf_pre + n, {R, W}, 0, R, off});
        } else if (row->half == 0) {
          out.push_back({hf_pre + row->fused, {E, R, W}, x * R, R, off});
        } else {  // gate_up_proj [E, 2R, W]: w1 rows first, then w3's
          out.push_back({hf_pre + row->fused, {E, 2 * R, W}, x * 2 * R + (row->half - 1) * R, R, off});
        }
      }
    }
  }
  return out;
}

std::vector<HfTensor> hf_mixtral_tensors(const ParamLayout& layout, HfExpertLayout lay) {
  ATOLL_CHECK(lay == HfExpertLayout::kPerExpert || lay == HfExpertLayout::kPerExpertMlp) << expert_layout_name(lay);
  std::vector<HfTensor> out;
  for (const HfPiece& p : hf_mixtral_pieces(layout, lay)) out.push_back({p.name, p.shape, p.offset});
  return out;
}

}  // namespace atl
