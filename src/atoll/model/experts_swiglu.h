// The MoE experts: E SwiGLU MLPs Expert_e(x) = W2_e(silu(W1_e x) * (W3_e x)), with the dispatch
// of each token to its K chosen experts and the weighted combine of their outputs
// (layers/moe_dispatch.h), fused into one pass over chunks of dispatched rows
// (backend/cpu/expert_mlp.h, expert_mlp_bf16.h). Rows "layers.{l}.moe.{w1,w3,w2}", each a stack
// of E matrices; keeps the routing and the pre-activations (bf16 products: W1 x only). With
// model.shared_expert_hidden > 0 a gated shared expert adds to the routed output
// (model/shared_expert.h; its rows follow w2).
#pragma once

#include <memory>
#include <vector>

#include "atoll/layers/moe_dispatch.h"
#include "atoll/model/part.h"
#include "atoll/model/shared_expert.h"

namespace atl {

// The experts' rows, and the shared expert's when the config has one.
void experts_swiglu_rows(ParamLayout& layout, const ModelConfig& m, int layer);

template <typename T>
class ExpertsSwiglu final : public ExpertsPart<T> {
 public:
  // Dispatched rows alive at once in the fused experts (fewer when R = N*K is smaller).
  static constexpr int kChunk = 2048;

  ExpertsSwiglu(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch);
  size_t work_elements() const override;  // the chunk's fp32 scratch (bf16 products: d(gate))
  void forward(T* out, const T* h, const int32_t* topk_idx, const T* topk_w, const PartContext<T>& c) override;
  void backward(T* dh, T* dtopk_w, const T* dout, const T* h, const T* topk_w, const PartContext<T>& c) override;

 private:
  struct Scratch;  // shared by the layers: row weights, bf16 chunk buffers
  void set_row_weights(const T* topk_w, int N);
  int E_, K_, C_, H_, chunk_;
  size_t w1_, w3_, w2_;
  std::shared_ptr<Scratch> sh_;
  ExpertRouting routing_;
  std::vector<T> a_, b_;  // [R,H] pre-activations W1 x, W3 x (fp32 products)
  std::vector<bf16> a16_;  // [R+pad,H] W1 x in bf16 (bf16 products; W3 x is recomputed)
  std::unique_ptr<SharedExpert<T>> shared_;  // model.shared_expert_hidden > 0
};

}  // namespace atl
