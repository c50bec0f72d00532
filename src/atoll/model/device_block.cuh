// One transformer block on the device (model/block.h's Block), composed of the device parts
// (model/device_part.cuh) chosen per layer by the config, model.attention and model.router:
//   xmid   = merge(attention(attn_norm(x)), x)
//   x_next = merge(experts(moe_norm(xmid), router(moe_norm(xmid))), xmid)
// where merge(a, r) is the residual add a + r, or ZAYA1's residual scaling (DeviceResidualMerge).
// Forward calls the parts in that order; backward calls them in reverse.
#pragma once

#include <memory>

#include "atoll/model/device_part.cuh"

namespace atl::gpu {

// The buffers the blocks pass between their parts, shared by all blocks (and the head, which
// uses tmp, dx and dh too): [N,C] each unless said.
struct DeviceBlockBuffers {
  DeviceBlockBuffers() = default;
  DeviceBlockBuffers(const ModelConfig& m, int max_tokens, Carver& carve);
  float* hn = nullptr;       // a norm's output (recomputed in backward rather than kept)
  float* tmp = nullptr;      // a sub-layer's output before its residual add
  float *dx = nullptr, *dh = nullptr;  // d(residual stream), d(norm output)
  float* dtopk_w = nullptr;  // [N,K] d(combine weights), experts -> router
};

class DeviceBlock {
 public:
  // Throws ConfigError when model.attention or model.router names no known part.
  DeviceBlock(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
              DevicePartScratch& scratch, DeviceBlockBuffers& buf, Carver& carve);

  // x_next[N,C] (=) from x[N,C]; the router's auxiliary losses (aux, z) to losses[2] (=).
  void forward(float* x_next, const float* x, double* losses, const DeviceContext& c);
  // On entry buf.dx holds d(x_next); on exit d(x). x as in forward.
  void backward(const float* x, const DeviceContext& c);

  // Links this block's router to the previous block's (ZAYA1's depth averaging), once, in
  // layer order, before any forward (as Block::link_previous on the CPU).
  void link_previous(DeviceBlock& prev) { router_->link_previous(*prev.router_); }
  // The experts the router chose in the last forward [N,K] (device; kNoExpert for a skipped slot).
  const int32_t* router_choice() const { return router_->topk_idx(); }

 private:
  DeviceBlockBuffers& buf_;
  DeviceRmsNorm attn_norm_;
  std::unique_ptr<DeviceAttentionPart> attention_;
  DeviceResidualMerge attn_merge_;
  float* xmid_;  // [N,C] the residual stream between the two sub-layers, kept for backward
  DeviceRmsNorm moe_norm_;
  std::unique_ptr<DeviceRouterPart> router_;
  std::unique_ptr<DeviceExpertsPart> experts_;
  DeviceResidualMerge moe_merge_;
};

}  // namespace atl::gpu
