// The MoE transformer of DESIGN.md ("The model"): pre-norm blocks
//   x += attn(rmsnorm(x));  x += moe(rmsnorm(x))
// (each block composed of parts chosen per layer, model/block.h), then a final RMSNorm, the
// LM head and cross-entropy on the next tokens. Parameters and
// gradients are flat buffers laid out by ParamLayout; activations live in buffers sized once
// for up to `max_batch` sequences, so a step allocates nothing. Templated on the scalar type:
// float for training, double for the whole-model gradient check.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "atoll/model/layout.h"
#include "atoll/model/model_config.h"
#include "atoll/model/part.h"
#include "atoll/model/precision.h"

namespace atl {

struct LossParts {
  double ce = 0.0;   // mean cross-entropy over the N predicted tokens
  double aux = 0.0;  // Switch load-balancing loss, summed over layers
  double z = 0.0;    // router z-loss, summed over layers
  double total() const { return ce + aux + z; }
};

template <typename T>
class Model {
 public:
  Model(const ModelConfig& cfg, int max_batch, Precision precision = Precision::kFp32);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  int max_batch() const { return max_batch_; }
  Precision precision() const { return precision_; }
  std::vector<T>& params() { return params_; }
  std::vector<T>& grads() { return grads_; }
  const std::vector<T>& params() const { return params_; }
  T* param(const std::string& name) { return params_.data() + layout_.at(name).offset; }

  // Each row as its ParamInit says: matrices ~ N(0, init_std²) drawn in layout order from
  // Rng(seed), norm gains 1, buffers 0.
  void init_params(uint64_t seed);
  void zero_grads();
  // Slots each expert took in the training passes since zero_grads(), [L*E], every layer's (a
  // zaya router's skipped slots count for no expert). For the load metrics of the softmax top-k
  // layers (a zaya router's come from its balancing row: optim/bias_balance.h) and the outer
  // step's per-expert weights (diloco.expert_merge).
  const std::vector<double>& topk_choice_counts() const { return choice_counts_; }

  // inputs, targets [B,T] (B <= max_batch). Gradients of loss_scale * (ce + aux + z) are
  // accumulated (+=) into grads(), so micro-batches sum; pass loss_scale = 1/micro-batches.
  LossParts forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale = 1.0);

  // Loss only (nothing kept for backward beyond the activation buffers). With position_losses
  // ([B*T], =): each position's cross-entropy -log p(target | inputs up to it), the terms whose
  // mean is LossParts::ce (task scoring sums them over an ending: train/task_eval.h); under
  // context parallelism, this rank's positions only ([B*local_seq_len()]).
  LossParts forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses = nullptr);

  PhaseTimes& phase_times() { return times_; }

  // Context extension (data.phases): from now on sequences of `seq_len` tokens with RoPE base
  // `rope_theta`, at most `max_batch` of them. The parameters and gradients stay (no row depends
  // on the length); the buffers, workspaces and RoPE tables are rebuilt for the new length.
  void set_sequence(int seq_len, double rope_theta, int max_batch);

  // Context parallelism (docs/long_context.md): from now on this model holds rank
  // group.rank()'s zigzag rows of each sequence (model/ring_attention.h), inputs and targets
  // are those rows [B, T_r], attention runs round the group's ring, and the cross-entropy is
  // normalised by the whole sequences' B·T tokens, so the losses and gradients of the group's
  // ranks sum to those of one model over whole sequences. The group must outlive the model's
  // calls; null goes back to whole sequences. fp32 products only. The activation buffers are
  // made at the first pass for the tokens held (B·T_r), and made again when that changes.
  void set_context_parallel(Collective* group);
  // Tokens of each sequence this model holds: seq_len, or its share under context parallelism.
  int local_seq_len() const;

 private:
  struct State;  // the blocks, the buffers between them, the head's (model.cc)
  LossParts run(const int32_t* inputs, const int32_t* targets, int B, bool backward, double loss_scale,
                float* position_losses = nullptr);
  PartContext<T> context(int B, double loss_scale);
  void use_block_weights(PartContext<T>& c, int l);
  void count_choices(int layer, int N);  // adds layer's router choices to choice_counts_
  double head_and_loss(const int32_t* targets, int B, bool backward, double loss_scale, float* position_losses);

  ModelConfig cfg_;
  ParamLayout layout_;
  int max_batch_;
  Precision precision_;
  std::vector<T> params_, grads_;
  std::vector<double> choice_counts_;  // [L*E] topk_choice_counts()
  std::unique_ptr<State> s_;
  PhaseTimes times_;
  Collective* cp_ = nullptr;
  std::unique_ptr<ZigzagLayout> zigzag_;
};

extern template class Model<float>;
extern template class Model<double>;

// Training FLOPs per token, the formula of the PyTorch reference benchmark that atoll is
// measured against (bench/vs_pytorch.sh): 6 * (active matrix parameters + V*C head) +
// 12 * L * T * (NH*HD) for attention, counting the full T×T matrix as PyTorch's eager
// attention computes it (plus what the peer lacks: CCA's convolutions, the zaya router's MLP);
// used for GFLOP/s and MFU so the two sides' figures compare.
double flops_per_token(const ModelConfig& m);

}  // namespace atl
