// The parameter layout table: one row per tensor {name, shape, offset, group}. Parameters,
// gradients and every optimizer state are flat arrays of layout.total() elements laid out by
// this one table; optimizer steps, all-reduce, checkpoint I/O, hashing and export are loops
// over it, never hand-kept lists of tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "atoll/model/model_config.h"

namespace atl {

// What a tensor is, which decides its optimizer (DESIGN.md: Muon for hidden 2-D matrices,
// AdamW for embeddings, head, norms and router) and whether it takes weight decay.
enum class ParamGroup { kEmbedding, kHead, kNorm, kRouter, kAttention, kExpert };

const char* param_group_name(ParamGroup g);

struct ParamEntry {
  std::string name;            // e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;  // row-major; matrices are [out, in]; experts [E, out, in]
  size_t offset = 0;           // in elements, into every flat buffer
  size_t numel = 0;
  ParamGroup group = ParamGroup::kNorm;
  int layer = -1;              // block index, -1 outside the blocks

  // Hidden matrices that Muon orthogonalises (one [out, in] matrix per expert).
  bool is_hidden_matrix() const { return group == ParamGroup::kAttention || group == ParamGroup::kExpert; }
  // Decoupled weight decay applies to matrices, not to norm gains.
  bool takes_weight_decay() const { return group != ParamGroup::kNorm; }
  // Number of 2-D matrices in the tensor and their shape (rows, cols).
  int64_t n_matrices() const { return shape.size() == 3 ? shape[0] : 1; }
  int64_t rows() const { return shape.size() >= 2 ? shape[shape.size() - 2] : 1; }
  int64_t cols() const { return shape.back(); }
};

class ParamLayout {
 public:
  // The layout of the model family of DESIGN.md for this config, in this order:
  // embed, then per layer {attn_norm, wq, wk, wv, wo, moe_norm, router, w1, w3, w2}, final_norm,
  // head (absent when tied). Offsets are aligned to kAlign elements (64 bytes for fp32).
  static ParamLayout build(const ModelConfig& m);

  static constexpr size_t kAlign = 16;

  const std::vector<ParamEntry>& entries() const { return entries_; }
  size_t total() const { return total_; }             // elements in each flat buffer
  int64_t n_params() const;                            // sum of numel (no padding)
  const ParamEntry& at(const std::string& name) const;  // throws CheckError if absent
  const ParamEntry* find(const std::string& name) const;

 private:
  void add(std::string name, std::vector<int64_t> shape, ParamGroup group, int layer);
  std::vector<ParamEntry> entries_;
  size_t total_ = 0;
};

}  // namespace atl
