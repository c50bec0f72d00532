// The device side of model/experts_swiglu.h: E SwiGLU experts with the dispatch of each token to
// its K chosen experts and the weighted combine, over backend/cuda/{moe_dispatch,expert_mlp}.h.
// Keeps the routing and the pre-activations W1 x, W3 x per layer; the experts' chunk buffers
// are shared by the layers.
#include <vector>

#include "atoll/backend/cuda/expert_mlp.h"
#include "atoll/backend/cuda/moe_dispatch.h"
#include "atoll/core/check.h"
#include "atoll/model/device_part.cuh"

namespace atl::gpu {
namespace {

class DeviceExpertsSwiglu final : public DeviceExpertsPart {
 public:
  DeviceExpertsSwiglu(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
                      DevicePartScratch& scratch, Carver& carve)
      : layer_(layer), host_offsets_(size_t(m.n_experts) + 1), sh_(scratch.get<Scratch>(m, s, carve)) {
    const std::string pre = layer_prefix(layer) + "moe.";
    w1_ = layout.at(pre + "w1").offset, w3_ = layout.at(pre + "w3").offset, w2_ = layout.at(pre + "w2").offset;
    const size_t R = size_t(s.max_tokens) * m.top_k, H = m.expert_hidden, E = m.n_experts;
    a_ = carve.take<float>(R * H), b_ = carve.take<float>(R * H);
    routing_ = {carve.take<int32_t>(E + 1), carve.take<int32_t>(R), carve.take<int32_t>(R)};
  }

  void forward(float* out, const float* h, const int32_t* topk_idx, const float* topk_w,
               const DeviceContext& c) override {
    const auto [T_, N, C, E, K, H, QD, KVD] = c.d;
    const DeviceProducts& mm = c.mm;
    build_routing(routing_, topk_idx, N, E, K, c.ids);
    // The experts' products need each expert's row count on the host: one copy of offsets [E+1]
    // per layer, which waits for the layer so far (the one synchronisation inside a forward).
    // Backward reuses this copy.
    std::vector<int32_t>& off = host_offsets_;
    copy_to_host(off.data(), routing_.offsets, sizeof(int32_t) * (E + 1));
    // off[E] < N*K when the zaya router's skip class left slots to no expert.
    ATOLL_CHECK(off[0] == 0 && off[E] <= N * K) << "routing offsets of layer " << layer_;
    expert_mlp_forward(*mm.blas, out, a_, b_, sh_->experts, h, routing_, off.data(), topk_w, mm.weight(w1_),
                       mm.weight(w3_), mm.weight(w2_), N, E, C, H, K, mm.dt);
  }

  void backward(float* dh, float* dtopk_w, const float* dout, const float* h, const float* topk_w,
                const DeviceContext& c) override {
    const auto [T_, N, C, E, K, H, QD, KVD] = c.d;
    const DeviceProducts& mm = c.mm;
    float* g = c.grads;
    expert_mlp_backward(*mm.blas, dh, g + w1_, g + w3_, g + w2_, dtopk_w, sh_->experts, dout, h, routing_,
                        host_offsets_.data(), topk_w, a_, b_, mm.weight(w1_), mm.weight(w3_), mm.weight(w2_), N, E,
                        C, H, K, mm.dt);
  }

 private:
  // Shared by the layers: the experts' buffers over the R = N*K dispatched rows.
  struct Scratch {
    Scratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve) {
      const size_t R = size_t(s.max_tokens) * m.top_k, C = m.dim, H = m.expert_hidden;
      experts = {carve.take<float>(R * C), carve.take<float>(R * C), carve.take<float>(R * C),
                 carve.take<float>(R * H), carve.take<float>(R * H), carve.take<float>(R * H),
                 nullptr, nullptr, nullptr, nullptr, nullptr};
      if (!s.bf16) return;
      experts.xe16 = carve.take<uint16_t>(R * C), experts.dye16 = carve.take<uint16_t>(R * C);
      experts.g16 = carve.take<uint16_t>(R * H), experts.da16 = carve.take<uint16_t>(R * H);
      experts.db16 = carve.take<uint16_t>(R * H);
    }
    ExpertScratch experts;  // [R,C] x3, [R,H] x3; bf16 copies (bf16 products only)
  };

  int layer_;
  size_t w1_, w3_, w2_;
  std::vector<int32_t> host_offsets_;  // [E+1] the routing offsets, read back in forward
  std::shared_ptr<Scratch> sh_;
  float *a_, *b_;           // expert pre-activations [R,H]
  DeviceRouting routing_;   // offsets [E+1], row_token [R], slot_row [R]
};

}  // namespace

std::unique_ptr<DeviceExpertsPart> make_device_experts_swiglu(const ModelConfig& m, const ParamLayout& layout,
                                                              int layer, const DevicePartSizes& s,
                                                              DevicePartScratch& scratch, Carver& carve) {
  return std::make_unique<DeviceExpertsSwiglu>(m, layout, layer, s, scratch, carve);
}

}  // namespace atl::gpu
