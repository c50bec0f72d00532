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
// AdamW for embeddings, head, norms and router) and whether it takes weight decay. kConv: a
// convolution's per-channel kernel or a bias vector (CCA's depthwise kernel and biases), not a
// matrix: AdamW without decay, like the norm gains.
enum class ParamGroup { kEmbedding, kHead, kNorm, kRouter, kAttention, kExpert, kConv };

const char* param_group_name(ParamGroup g);

// How a tensor's values start (Model::init_params): drawn ~ N(0, init_std²) in layout order,
// ones (norm gains, scales), zeros (biases), or a router's balancing biases: zeros but the last
// element, the skip class's bias, which is model.router_skip_bias.
enum class ParamInit { kNormal, kOnes, kZeros, kBalancingBiases };

// One row of the table. A part says what its tensor is: how it divides into 2-D matrices
// (`matrix_count` matrices of [matrix_rows, matrix_cols], stacked along the leading dimension;
// a vector is one 1 x n matrix), and whether gradients train it: a buffer (trainable = false)
// lives in the flat arrays and checkpoints like a parameter, but its gradient is always zero
// and the optimizer never steps it. A balanced buffer (a router's balancing biases) is the one
// exception: its router leaves its expert loads in the row's gradient slot, which rides on the
// island's gradient mean, is left out of the gradient norm, and feeds the bias balancing step
// that follows each optimizer step (optim/bias_balance.h).
struct ParamEntry {
  std::string name;            // e.g. "layers.3.attn.wq"
  std::vector<int64_t> shape;  // row-major; matrices are [out, in]; experts [E, out, in]
  size_t offset = 0;           // in elements, into every flat buffer
  size_t numel = 0;
  ParamGroup group = ParamGroup::kNorm;
  int layer = -1;              // block index, -1 outside the blocks
  int64_t matrix_count = 1;
  int64_t matrix_rows = 1, matrix_cols = 1;
  bool trainable = true;
  bool balanced = false;  // a buffer stepped by bias balancing (trainable = false)
  ParamInit init = ParamInit::kNormal;

  // Hidden matrices that Muon orthogonalises (one [out, in] matrix per expert).
  bool is_hidden_matrix() const {
    return trainable && (group == ParamGroup::kAttention || group == ParamGroup::kExpert);
  }
  // Decoupled weight decay applies to matrices, not to norm gains or convolution vectors.
  bool takes_weight_decay() const { return group != ParamGroup::kNorm && group != ParamGroup::kConv; }
  // Number of 2-D matrices in the tensor and their shape (rows, cols), as the part declared them.
  int64_t n_matrices() const { return matrix_count; }
  int64_t rows() const { return matrix_rows; }
  int64_t cols() const { return matrix_cols; }
};

// Rows as parts declare them: a gain vector [n] (ones, norm group), a matrix [rows, cols], and
// a stack of `count` matrices [count, rows, cols] (the experts).
ParamEntry gain_entry(std::string name, int64_t n, int layer);
// A bias vector [n] (zeros, norm group: AdamW without weight decay).
ParamEntry bias_entry(std::string name, int64_t n, int layer);
ParamEntry matrix_entry(std::string name, int64_t rows, int64_t cols, ParamGroup group, int layer);
ParamEntry stacked_matrices_entry(std::string name, int64_t count, int64_t rows, int64_t cols, ParamGroup group,
                                  int layer);

// "layers.{l}.", the prefix of block l's rows.
std::string layer_prefix(int layer);

class ParamLayout {
 public:
  // The layout of the model family of DESIGN.md for this config: embed, then each block's rows
  // as its parts append them (model/block.h; today {attn_norm, wq, wk, wv, wo, moe_norm, router,
  // w1, w3, w2}), final_norm, head (absent when tied). Offsets are aligned to kAlign elements
  // (64 bytes for fp32).
  static ParamLayout build(const ModelConfig& m);

  // Appends a row at the next aligned offset (fills offset and numel; checks the matrices
  // cover the tensor).
  void add(ParamEntry e);

  static constexpr size_t kAlign = 16;

  const std::vector<ParamEntry>& entries() const { return entries_; }
  size_t total() const { return total_; }             // elements in each flat buffer
  int64_t n_params() const;                            // sum of numel (no padding)
  const ParamEntry& at(const std::string& name) const;  // throws CheckError if absent
  const ParamEntry* find(const std::string& name) const;

 private:
  std::vector<ParamEntry> entries_;
  size_t total_ = 0;
};

}  // namespace atl
