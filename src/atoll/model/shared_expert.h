// The shared expert of the experts part (model.shared_expert_hidden = HS > 0; Qwen2-MoE's
// shared_expert and shared_expert_gate): one SwiGLU MLP that every token passes through, scaled
// by a sigmoid gate of its own, added to the routed experts' output:
//   out += sigmoid(h · w_gate) * W2s(silu(W1s h) * (W3s h))
// Rows "layers.{l}.moe.{shared_w1, shared_w3}" [HS, C], "moe.shared_w2" [C, HS] (hidden matrices,
// as the experts'), "moe.shared_gate" [1, C] (AdamW, as the router). Keeps W1s h, W3s h and their
// SwiGLU [N, HS], the MLP's output [N, C] and the gate [N] in fp32 (the products run in the
// model's precision).
#pragma once

#include <memory>
#include <vector>

#include "atoll/model/part.h"

namespace atl {

void shared_expert_rows(ParamLayout& layout, const ModelConfig& m, int layer);

template <typename T>
class SharedExpert {
 public:
  SharedExpert(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch);
  // out[N,C] (+=) the gated shared expert of h[N,C]; `in` is h as a product operand.
  void forward(T* out, Operand<T> in, const PartContext<T>& c);
  // dh[N,C] (+=) and the rows' gradients (+=) from dout[N,C]; `in` as in forward.
  void backward(T* dh, const T* dout, Operand<T> in, const PartContext<T>& c);

 private:
  struct Scratch;  // backward's gradients and the bf16 operands, shared by the layers
  int C_, HS_;
  size_t w1_, w3_, w2_, gate_;
  std::shared_ptr<Scratch> sh_;
  std::vector<T> a_, b_, g_;  // [N,HS] W1s h, W3s h, silu(a) * b
  std::vector<T> y_;          // [N,C] the MLP's output before the gate
  std::vector<T> s_;          // [N] sigmoid(h · w_gate)
};

}  // namespace atl
