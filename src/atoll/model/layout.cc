#include "atoll/model/layout.h"

#include "atoll/core/check.h"

namespace atl {

const char* param_group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::kEmbedding: return "embedding";
    case ParamGroup::kHead: return "head";
    case ParamGroup::kNorm: return "norm";
    case ParamGroup::kRouter: return "router";
    case ParamGroup::kAttention: return "attention";
    case ParamGroup::kExpert: return "expert";
  }
  return "?";
}

void ParamLayout::add(std::string name, std::vector<int64_t> shape, ParamGroup group, int layer) {
  ParamEntry e;
  e.name = std::move(name);
  e.shape = std::move(shape);
  e.numel = 1;
  for (int64_t d : e.shape) e.numel *= static_cast<size_t>(d);
  e.offset = total_;
  e.group = group;
  e.layer = layer;
  total_ += (e.numel + kAlign - 1) / kAlign * kAlign;
  entries_.push_back(std::move(e));
}

ParamLayout ParamLayout::build(const ModelConfig& m) {
  ParamLayout p;
  const int64_t V = m.vocab_size, C = m.dim, E = m.n_experts, H = m.expert_hidden;
  const int64_t QD = int64_t(m.n_heads) * m.head_dim, KVD = int64_t(m.n_kv_heads) * m.head_dim;
  p.add("embed", {V, C}, ParamGroup::kEmbedding, -1);
  for (int l = 0; l < m.n_layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    p.add(pre + "attn_norm", {C}, ParamGroup::kNorm, l);
    p.add(pre + "attn.wq", {QD, C}, ParamGroup::kAttention, l);
    p.add(pre + "attn.wk", {KVD, C}, ParamGroup::kAttention, l);
    p.add(pre + "attn.wv", {KVD, C}, ParamGroup::kAttention, l);
    p.add(pre + "attn.wo", {C, QD}, ParamGroup::kAttention, l);
    p.add(pre + "moe_norm", {C}, ParamGroup::kNorm, l);
    p.add(pre + "moe.router", {E, C}, ParamGroup::kRouter, l);
    p.add(pre + "moe.w1", {E, H, C}, ParamGroup::kExpert, l);
    p.add(pre + "moe.w3", {E, H, C}, ParamGroup::kExpert, l);
    p.add(pre + "moe.w2", {E, C, H}, ParamGroup::kExpert, l);
  }
  p.add("final_norm", {C}, ParamGroup::kNorm, -1);
  if (!m.tie_embeddings) p.add("head", {V, C}, ParamGroup::kHead, -1);
  return p;
}

int64_t ParamLayout::n_params() const {
  int64_t n = 0;
  for (auto& e : entries_) n += static_cast<int64_t>(e.numel);
  return n;
}

const ParamEntry* ParamLayout::find(const std::string& name) const {
  for (auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const ParamEntry& ParamLayout::at(const std::string& name) const {
  const ParamEntry* e = find(name);
  ATOLL_CHECK(e != nullptr) << "no parameter named '" << name << "'";
  return *e;
}

}  // namespace atl
