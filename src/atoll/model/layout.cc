#include "atoll/model/layout.h"

#include "atoll/core/check.h"
#include "atoll/model/block.h"
#include "atoll/model/norm_residual.h"

namespace atl {

const char* param_group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::kEmbedding: return "embedding";
    case ParamGroup::kHead: return "head";
    case ParamGroup::kNorm: return "norm";
    case ParamGroup::kRouter: return "router";
    case ParamGroup::kAttention: return "attention";
    case ParamGroup::kExpert: return "expert";
    case ParamGroup::kConv: return "conv";
  }
  return "?";
}

ParamEntry gain_entry(std::string name, int64_t n, int layer) {
  return {.name = std::move(name), .shape = {n}, .group = ParamGroup::kNorm, .layer = layer, .matrix_cols = n,
          .init = ParamInit::kOnes};
}

ParamEntry bias_entry(std::string name, int64_t n, int layer) {
  return {.name = std::move(name), .shape = {n}, .group = ParamGroup::kNorm, .layer = layer, .matrix_cols = n,
          .init = ParamInit::kZeros};
}

ParamEntry matrix_entry(std::string name, int64_t rows, int64_t cols, ParamGroup group, int layer) {
  return {.name = std::move(name), .shape = {rows, cols}, .group = group, .layer = layer, .matrix_rows = rows,
          .matrix_cols = cols};
}

ParamEntry stacked_matrices_entry(std::string name, int64_t count, int64_t rows, int64_t cols, ParamGroup group,
                                  int layer) {
  return {.name = std::move(name), .shape = {count, rows, cols}, .group = group, .layer = layer,
          .matrix_count = count, .matrix_rows = rows, .matrix_cols = cols};
}

std::string layer_prefix(int layer) { return "layers." + std::to_string(layer) + "."; }

void ParamLayout::add(ParamEntry e) {
  e.numel = 1;
  for (int64_t d : e.shape) e.numel *= static_cast<size_t>(d);
  ATOLL_CHECK_EQ(size_t(e.matrix_count * e.matrix_rows * e.matrix_cols), e.numel) << e.name << ": matrices do not cover it";
  e.offset = total_;
  total_ += (e.numel + kAlign - 1) / kAlign * kAlign;
  entries_.push_back(std::move(e));
}

ParamLayout ParamLayout::build(const ModelConfig& m) {
  ParamLayout p;
  p.add(matrix_entry("embed", m.vocab_size, m.dim, ParamGroup::kEmbedding, -1));
  residual_merge_rows(p, m, "input", false, -1);
  for (int l = 0; l < m.n_layers; ++l) append_block_rows(p, m, l);
  p.add(gain_entry("final_norm", m.dim, -1));
  if (!m.tie_embeddings) p.add(matrix_entry("head", m.vocab_size, m.dim, ParamGroup::kHead, -1));
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
