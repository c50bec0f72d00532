// The MoE transformer of DESIGN.md ("The model"): pre-norm blocks
//   x += attn(rmsnorm(x));  x += moe(rmsnorm(x))
// then a final RMSNorm, the LM head and cross-entropy on the next tokens. Parameters and
// gradients are flat buffers laid out by ParamLayout; activations live in buffers sized once
// for up to `max_batch` sequences, so a step allocates nothing. Templated on the scalar type:
// float for training, double for the whole-model gradient check.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "atoll/backend/cpu/bf16.h"
#include "atoll/model/model_config.h"
#include "atoll/model/layout.h"

namespace atl {

struct LossParts {
  double ce = 0.0;   // mean cross-entropy over the N predicted tokens
  double aux = 0.0;  // Switch load-balancing loss, summed over layers
  double z = 0.0;    // router z-loss, summed over layers
  double total() const { return ce + aux + z; }
};

// The precision of the matrix products (train.precision). kBf16: inputs and weights rounded to
// bf16, products accumulated in fp32 through oneDNN (backend/cpu/gemm_bf16.h); parameters,
// gradients, optimizer state and every other operation stay fp32. Model<float> only.
enum class Precision { kFp32, kBf16 };
Precision parse_precision(const std::string& name);  // "fp32" | "bf16"; ConfigError otherwise
const char* precision_name(Precision p);

// Seconds spent per phase, accumulated until reset (for `atoll bench`).
struct PhaseTimes {
  double embed = 0, attention = 0, router_dispatch = 0, experts = 0, head_loss = 0;
  double weights_bf16 = 0;  // rounding the parameters to bf16 once per forward (bf16 products)
  double total() const { return embed + attention + router_dispatch + experts + head_loss + weights_bf16; }
};

// The sizes one block works with, for B sequences (see the legend in config.h); shared by the
// CPU model and the device model (backend/cuda/device_model.cu).
struct BlockDims {
  int T, N, C, E, K, H, QD, KVD;
};
inline BlockDims block_dims(const ModelConfig& m, int B) {
  return {m.seq_len, B * m.seq_len, m.dim, m.n_experts, m.top_k, m.expert_hidden, m.n_heads * m.head_dim,
          m.n_kv_heads * m.head_dim};
}

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

  // Matrices ~ N(0, init_std²) drawn in layout order from Rng(seed); norm gains = 1.
  void init_params(uint64_t seed);
  void zero_grads();

  // inputs, targets [B,T] (B <= max_batch). Gradients of loss_scale * (ce + aux + z) are
  // accumulated (+=) into grads(), so micro-batches sum; pass loss_scale = 1/micro-batches.
  LossParts forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale = 1.0);

  // Loss only (nothing kept for backward beyond the activation buffers).
  LossParts forward(const int32_t* inputs, const int32_t* targets, int B);

  PhaseTimes& phase_times() { return times_; }

 private:
  struct Activations;
  LossParts run(const int32_t* inputs, const int32_t* targets, int B, bool backward, double loss_scale);
  void forward_block(int l, int B);
  void backward_block(int l, int B, double loss_scale);
  double head_and_loss(const int32_t* targets, int B, bool backward, double loss_scale);
  // Block l's weights in bf16 (converted unless already held): `at(offset)` maps a flat
  // parameter offset of the block to its bf16 copy.
  struct BlockWeights16 {
    const bf16* base;
    size_t begin;
    const bf16* at(size_t offset) const { return base + (offset - begin); }
  };
  BlockWeights16 block_weights16(int l);

  bool is_bf16() const { return precision_ == Precision::kBf16; }

  ModelConfig cfg_;
  ParamLayout layout_;
  int max_batch_;
  Precision precision_;
  std::vector<T> params_, grads_;
  std::unique_ptr<Activations> act_;
  PhaseTimes times_;
};

extern template class Model<float>;
extern template class Model<double>;

// Training FLOPs per token, the peer's formula (../shared/peer/ref_moe.py flops_per_token):
// 6 * (active matrix parameters + V*C head) + 12 * L * T * (NH*HD) for attention, counting
// the full T×T matrix as the peer computes it; used for GFLOP/s and MFU so the figures compare.
double flops_per_token(const ModelConfig& m);

}  // namespace atl
