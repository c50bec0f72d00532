// ZAYA1's router (transformers' ZayaRouter and ZayaRouterMLP, model.router = "zaya"), per token
// of the MoE input h[N,C], with R = model.router_hidden_size and E1 = E + 1 classes:
//   s      = h W_downᵀ + b_down  (+ s_prev ⊙ depth_scale)          [N,R]  the router state
//   logits = out(gelu(fc2(gelu(fc1(rmsnorm(s))))))                 [N,E1] fc1, fc2 with biases
//   p, choice, gate: layers/router_zaya.h (top K of p + balancing biases; gate = p, unbiased)
// Depth averaging: s_prev is the pre-norm state s of the previous block's router (exponential
// averaging over depth: s_l = down_l(h_l) + depth_scale_l ⊙ s_{l-1}). It exists, with its row
// depth_scale [R] (ones at init), when the previous block's router is a zaya router too; the
// first layer has none, as transformers' layer 0 has no router_states_scale. Each router keeps
// its s; the next router reads it, and in backward hands back d(s) through a buffer shared by
// the zaya routers (written by router l+1, read by router l right after: the blocks run in
// reverse), so the gradient flows into every earlier router of the chain.
// The skip class (the last) bypasses the experts: its slots get the expert id kNoExpert
// (layers/moe_dispatch.h), which the experts part neither computes nor adds (output 0, as
// transformers' masking to expert 0 with weight 0 gives, without expert 0's compute).
// No auxiliary loss: the balancing biases (row "moe.gate.balancing_biases" [E1], a buffer) are
// stepped by bias balancing after each optimizer step (optim/bias_balance.h) from the loads this
// router leaves in the row's gradient slot in backward: loss_scale * (count_e / (N*K)) per class.
// Every product stays in T under bf16 products too (small, and the choice is sensitive).
// Rows "layers.{l}.moe.gate.{down, down_bias, [depth_scale], norm, fc1, fc1_bias, fc2, fc2_bias,
// out, balancing_biases}".
#pragma once

#include <memory>
#include <vector>

#include "atoll/model/part.h"

namespace atl {

// Whether layer l's zaya router averages over depth: the previous layer's router is zaya too.
bool zaya_depth_averaging(const ModelConfig& m, int layer);

void router_zaya_rows(ParamLayout& layout, const ModelConfig& m, int layer);

// Where layer l's router rows start in the flat buffers, for the CPU part and its CUDA mirror
// (depth_scale stays 0 without depth averaging).
struct ZayaRouterOffsets {
  size_t down = 0, down_b = 0, depth_scale = 0, norm = 0, fc1 = 0, fc1_b = 0, fc2 = 0, fc2_b = 0, out = 0, biases = 0;
};
ZayaRouterOffsets zaya_router_offsets(const ModelConfig& m, const ParamLayout& layout, int layer);

template <typename T>
class RouterZaya final : public RouterPart<T> {
 public:
  RouterZaya(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch);
  size_t work_elements() const override { return 0; }
  void link_previous(RouterPart<T>& prev) override;
  RouterLosses forward(const T* h, const PartContext<T>& c) override;
  const int32_t* topk_idx() const override { return topk_idx_.data(); }
  const T* topk_w() const override { return topk_w_.data(); }
  void backward(T* dh, const T* dtopk_w, const T* h, const PartContext<T>& c) override;
  // The classes chosen in the last forward [N,K] (E = the skip class), for tests and metrics.
  const int32_t* choice() const { return choice_.data(); }
  const T* probs() const { return probs_.data(); }  // [N,E1] the unbiased probabilities

 private:
  struct Scratch;  // shared by the layers
  int E1_, K_, R_;
  double eps_;
  ZayaRouterOffsets at_;
  bool depth_;                  // this layer averages over depth (reads prev_)
  RouterZaya* prev_ = nullptr;  // the previous block's router, when depth_
  bool has_next_ = false;       // the next block's router reads this one's state
  std::shared_ptr<Scratch> sh_;
  std::vector<T> s_, xn_, a1_, a2_;  // [N,R] state, its norm, fc1 and fc2 pre-activations
  std::vector<T> rstd_;              // [N]
  std::vector<T> probs_;             // [N,E1]
  std::vector<int32_t> choice_, topk_idx_;  // [N,K]
  std::vector<T> topk_w_;                   // [N,K]
};

}  // namespace atl
