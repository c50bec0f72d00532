#include "atoll/model/device_block.cuh"

#include "atoll/backend/cuda/check.h"
#include "atoll/core/errors.h"
#include "atoll/model/part_kinds.h"

namespace atl::gpu {
namespace {

// The GPU constructors of the part kinds (model/part_kinds.h), by the table's names: the table
// itself is linked by CPU-only builds too, which have no device code to point at. A kind the
// table marks `gpu` has an entry here (tests/model/part_kinds_test.cc lists them for the GPU build).
template <class Make>
struct DeviceKind {
  std::string_view name;
  Make make;
};
using MakeAttention = std::unique_ptr<DeviceAttentionPart> (*)(const ModelConfig&, const ParamLayout&, int,
                                                               const DevicePartSizes&, DevicePartScratch&, Carver&);
using MakeRouter = std::unique_ptr<DeviceRouterPart> (*)(const ModelConfig&, const ParamLayout&, int,
                                                         const DevicePartSizes&, DevicePartScratch&, Carver&);
const DeviceKind<MakeAttention> kDeviceAttentions[] = {{"gqa", make_device_attention_gqa},
                                                       {"cca", make_device_attention_cca}};
const DeviceKind<MakeRouter> kDeviceRouters[] = {{"topk", make_device_router_topk}, {"zaya", make_device_router_zaya}};

template <class Make, size_t N>
Make device_make(const DeviceKind<Make> (&kinds)[N], std::string_view name, int layer, const char* what) {
  for (const auto& k : kinds)
    if (k.name == name) return k.make;
  throw ConfigError("layer " + std::to_string(layer) + "'s " + what + " \"" + std::string(name) +
                    "\" has no GPU mirror; fix: choose a kind with one, or train.device = cpu");
}

std::unique_ptr<DeviceAttentionPart> make_attention(const ModelConfig& m, const ParamLayout& layout, int layer,
                                                    const DevicePartSizes& s, DevicePartScratch& scratch, Carver& carve) {
  if (m.attention_at(layer) == "gqa" && m.qk_norm != "none")
    throw ConfigError("model.qk_norm = \"" + m.qk_norm + "\" (q/k RMSNorm) is not on the GPU yet; fix: train with "
                      "train.device = \"cpu\"");
  if (m.attention_at(layer) == "gqa" && m.qkv_bias)
    throw ConfigError("model.qkv_bias = true (q/k/v projection biases) is not on the GPU yet; fix: train with "
                      "train.device = \"cpu\"");
  const AttentionKind& kind = attention_kind_at(m, layer);  // a name not in the table: ConfigError
  return device_make(kDeviceAttentions, kind.name, layer, "attention")(m, layout, layer, s, scratch, carve);
}

std::unique_ptr<DeviceRouterPart> make_router(const ModelConfig& m, const ParamLayout& layout, int layer,
                                              const DevicePartSizes& s, DevicePartScratch& scratch, Carver& carve) {
  if (m.shared_expert_hidden > 0)  // asked here, before the experts are built
    throw ConfigError("model.shared_expert_hidden = " + std::to_string(m.shared_expert_hidden) +
                      " (a shared expert) is not on the GPU yet; fix: train with train.device = \"cpu\"");
  if (m.router_at(layer) == "topk" && !m.router_renormalize && m.n_experts > 1)
    throw ConfigError("model.router_renormalize = false is not on the GPU yet; fix: train with train.device = \"cpu\"");
  const RouterKind& kind = router_kind_at(m, layer);
  return device_make(kDeviceRouters, kind.name, layer, "router")(m, layout, layer, s, scratch, carve);
}

}  // namespace

DeviceBlockBuffers::DeviceBlockBuffers(const ModelConfig& m, int max_tokens, Carver& carve) {
  const size_t NC = size_t(max_tokens) * m.dim;
  hn = carve.take<float>(NC), tmp = carve.take<float>(NC);
  dx = carve.take<float>(NC), dh = carve.take<float>(NC);
  dtopk_w = carve.take<float>(size_t(max_tokens) * m.top_k);
}

DeviceBlock::DeviceBlock(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
                         DevicePartScratch& scratch, DeviceBlockBuffers& buf, Carver& carve)
    : buf_(buf),
      attn_norm_(m, layout, layer_prefix(layer) + "attn_norm", s, carve),
      attention_(make_attention(m, layout, layer, s, scratch, carve)),
      attn_merge_(m, layout, layer_prefix(layer) + "attn_merge", true, s, carve),
      xmid_(carve.take<float>(size_t(s.max_tokens) * m.dim)),
      moe_norm_(m, layout, layer_prefix(layer) + "moe_norm", s, carve),
      router_(make_router(m, layout, layer, s, scratch, carve)),
      experts_(make_device_experts_swiglu(m, layout, layer, s, scratch, carve)),
      moe_merge_(m, layout, layer_prefix(layer) + "moe_merge", true, s, carve) {}

void DeviceBlock::forward(float* x_next, const float* x, double* losses, const DeviceContext& c) {
  attn_norm_.forward(buf_.hn, x, c);
  attention_->forward(buf_.tmp, buf_.hn, c);
  attn_merge_.forward(xmid_, buf_.tmp, x, c);
  moe_norm_.forward(buf_.hn, xmid_, c);
  router_->forward(losses, buf_.hn, c);
  experts_->forward(buf_.tmp, buf_.hn, router_->topk_idx(), router_->topk_w(), c);
  moe_merge_.forward(x_next, buf_.tmp, xmid_, c);
}

// The forward in reverse. The norms' outputs are recomputed (rstd as kept, the same values).
// A merge's backward leaves d(stream) in dx and hands back d(sub-layer output): dx itself for
// the plain add, else buf_.tmp (free once xmid is at hand).
void DeviceBlock::backward(const float* x, const DeviceContext& c) {
  const size_t NC = size_t(c.d.N) * c.d.C;
  moe_norm_.forward(buf_.hn, xmid_, c);
  const float* dmoe = moe_merge_.backward(buf_.tmp, buf_.dx, xmid_, c);
  ATOLL_CUDA_CHECK(cudaMemset(buf_.dh, 0, sizeof(float) * NC));
  experts_->backward(buf_.dh, buf_.dtopk_w, dmoe, buf_.hn, router_->topk_w(), c);
  router_->backward(buf_.dh, buf_.dtopk_w, buf_.hn, c);
  moe_norm_.backward(buf_.dx, buf_.dh, xmid_, c);
  attn_norm_.forward(buf_.hn, x, c);
  const float* dattn = attn_merge_.backward(buf_.tmp, buf_.dx, x, c);
  ATOLL_CUDA_CHECK(cudaMemset(buf_.dh, 0, sizeof(float) * NC));
  attention_->backward(buf_.dh, dattn, buf_.hn, c);
  attn_norm_.backward(buf_.dx, buf_.dh, x, c);
}

}  // namespace atl::gpu
