// The device side of the block parts (model/part.h), for gpu::DeviceModel (model/device_model.h).
// Each CPU part's CUDA mirror sits beside it with the same structure: attention_gqa.cu,
// attention_cca.cu, router_topk.cu, router_zaya.cu, experts_swiglu.cu and norm_residual.cu each
// hold that part's device buffers (what it keeps for backward), its forward and its backward over
// the kernels of backend/cuda/, with the offsets of its rows read from the layout table by name
// (the rows themselves are declared once, by the CPU part). model/device_block.cu composes them
// per layer in model/block.cc's order. There is no decode step on the device (`atoll generate`
// runs on the CPU).
//
// Buffers: every buffer comes from the model's one device arena through a Carver. A part takes
// what it keeps per layer in its constructor; scratch that no call keeps comes from a pool shared
// by every layer's part of one kind (DevicePartScratch, as PartScratch on the CPU). The model is built twice, once
// with a counting Carver to size the arena and once to hand the buffers out, so the two passes
// can never disagree; nothing but Carver::allocates() tells them apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/blas.h"
#include "atoll/backend/cuda/rope.h"
#include "atoll/model/device_ring_attention.h"
#include "atoll/model/part.h"
#include "atoll/model/ring_attention.h"

namespace atl::gpu {

// Hands out buffers from `arena`, or with no arena only counts the bytes they would take.
class Carver {
 public:
  explicit Carver(DeviceArena* arena) : arena_(arena) {}
  template <typename T>
  T* take(size_t n) {
    bytes_ += (n * sizeof(T) + DeviceArena::kAlign - 1) / DeviceArena::kAlign * DeviceArena::kAlign;
    return arena_ ? arena_->alloc<T>(n) : nullptr;
  }
  size_t bytes() const { return bytes_; }
  bool allocates() const { return arena_ != nullptr; }  // false: the counting pass (no device work)

 private:
  DeviceArena* arena_;
  size_t bytes_ = 0;
};

// Scratch shared by every layer's part of one kind: the first part that asks creates it (and so
// carves it once). As model/part.h's PartScratch, keyed by the address of a static per type
// instead of a std::map on std::type_index, which crashes hipcc's device compilation (clang 15).
class DevicePartScratch {
 public:
  template <class S, class... Args>
  std::shared_ptr<S> get(Args&&... args) {
    static const char tag = 0;  // one address per S
    for (auto& [key, item] : items_)
      if (key == &tag) return std::static_pointer_cast<S>(item);
    auto item = std::make_shared<S>(std::forward<Args>(args)...);
    items_.emplace_back(&tag, item);
    return item;
  }

 private:
  std::vector<std::pair<const void*, std::shared_ptr<void>>> items_;
};

// What a device part carves for: at most max_batch sequences of the config's seq_len, or under
// context parallelism this rank's T_r tokens of each.
struct DevicePartSizes {
  int max_batch = 1;
  int max_tokens = 1;  // max_batch * seq_len, or max_batch * T_r
  bool bf16 = false;   // bf16 products (train.precision = bf16)
  // Context parallelism (model/ring_attention.h): how the group splits each sequence; null: the
  // model holds whole sequences.
  const ZigzagLayout* zigzag = nullptr;
};

// The precision of the matrix products, folded into two helpers so the parts carry no precision
// branches (the device counterpart of model/precision.h's Products): weight() hands out a
// product's weight, the fp32 parameter or its bf16 copy; input() hands out a product's input,
// x itself in fp32, else its bf16 rounding into x16 (in16 or dout16).
struct DeviceProducts {
  Blas* blas = nullptr;  // on the default stream, like every kernel here
  Dtype dt = Dtype::kF32;
  const float* params = nullptr;  // [layout.total()]
  const uint16_t* w16 = nullptr;  // [layout.total()] the parameters rounded once per forward (bf16 only)
  uint16_t* in16 = nullptr;       // [N, max(C,QD,KVD)] a product's bf16 input (bf16 only)
  uint16_t* dout16 = nullptr;     // [N, max(C,QD,KVD)] a product's bf16 d(output) (bf16 only)

  const float* param(size_t off) const { return params + off; }
  const void* weight(size_t off) const {
    return dt == Dtype::kBF16 ? static_cast<const void*>(w16 + off) : static_cast<const void*>(params + off);
  }
  const void* input(uint16_t* x16, const float* x, size_t n) const {
    if (dt == Dtype::kF32) return x;
    f32_to_bf16(x16, x, n);
    return x16;
  }
};

// What one call of a device part sees (as PartContext on the CPU).
struct DeviceContext {
  int B;              // sequences
  BlockDims d;        // d.N = B * T tokens
  DeviceProducts mm;  // params, bf16 weights, the products
  float* grads;       // flat gradients (+=)
  double loss_scale;  // factor of the loss whose gradient backward accumulates
  int32_t* ids;       // integer scratch shared by the parts and the embedding backward
                      // (at least routing_scratch_ints(N, K))
  TokenPositions pos{};  // where the tokens sit in their sequences (default: whole, from 0)
  // Context parallelism: the group holding the other chunks of these sequences (attention runs
  // round its ring, CCA exchanges its boundary rows with it, the top-k routers add their sums over
  // it) and how it splits them; null: whole sequences.
  Collective* cp = nullptr;
  const ZigzagLayout* zigzag = nullptr;
};

// Causal mixing across positions: out[N,C] from the normed residual h[N,C].
class DeviceAttentionPart {
 public:
  virtual ~DeviceAttentionPart() = default;
  // out[N,C] (=); keeps what backward needs.
  virtual void forward(float* out, const float* h, const DeviceContext& c) = 0;
  // dh[N,C] (+=) and the weight gradients (+=) from dout[N,C]; h as in forward.
  virtual void backward(float* dh, const float* dout, const float* h, const DeviceContext& c) = 0;
};

// Chooses K experts per token: topk_idx[N,K] (kNoExpert, -1, for a slot no expert computes),
// topk_w[N,K], and this layer's auxiliary losses, left on the device in losses[2] (aux, z).
// As RouterPart on the CPU, a router may read the previous block's router state (ZAYA1's depth
// averaging): the model links each block's router to the previous one once, in layer order.
class DeviceRouterPart {
 public:
  virtual ~DeviceRouterPart() = default;
  virtual void link_previous(DeviceRouterPart& prev) { (void)prev; }
  virtual void forward(double* losses, const float* h, const DeviceContext& c) = 0;
  virtual const int32_t* topk_idx() const = 0;
  virtual const float* topk_w() const = 0;
  // dh[N,C] (+=) and the router's gradients (+=) from dtopk_w[N,K] and loss_scale times the
  // auxiliary losses' gradients.
  virtual void backward(float* dh, const float* dtopk_w, const float* h, const DeviceContext& c) = 0;
};

// The experts with dispatch and combine: out[n] = Σ_j topk_w[n,j] Expert_topk_idx[n,j](h[n]).
class DeviceExpertsPart {
 public:
  virtual ~DeviceExpertsPart() = default;
  // out[N,C] (=); keeps what backward needs.
  virtual void forward(float* out, const float* h, const int32_t* topk_idx, const float* topk_w,
                       const DeviceContext& c) = 0;
  // dh[N,C] (+=), dtopk_w[N,K] (=) and the experts' gradients (+=) from dout[N,C].
  virtual void backward(float* dh, float* dtopk_w, const float* dout, const float* h, const float* topk_w,
                        const DeviceContext& c) = 0;
};

// RMSNorm with a gain [C] (norm_residual.cu; RmsNormPart on the CPU). Keeps rstd [N]; backward
// needs the output again, which the block recomputes by calling forward.
class DeviceRmsNorm {
 public:
  DeviceRmsNorm(const ModelConfig& m, const ParamLayout& layout, const std::string& name, const DevicePartSizes& s,
                Carver& carve);
  // out[N,C] (=) rmsnorm(x) * gain.
  void forward(float* out, const float* x, const DeviceContext& c);
  // dx[N,C] (+=), d(gain) (+=) from dout[N,C]; x as in forward.
  void backward(float* dx, const float* dout, const float* x, const DeviceContext& c);

 private:
  size_t gain_;
  double eps_;
  float* rstd_;  // [N]
};

// Where a sub-layer's output joins the residual stream (norm_residual.cu; ResidualMerge on the
// CPU): the plain add, or with model.residual_scaling ZAYA1's per-channel affines
// (backend/cuda/residual_affine.h), rows "{name}.{out_scale,out_bias,res_scale,res_bias}", or
// "{name}_scale", "{name}_bias" without a stream (after the embedding).
class DeviceResidualMerge {
 public:
  DeviceResidualMerge(const ModelConfig& m, const ParamLayout& layout, const std::string& name, bool with_stream,
                      const DevicePartSizes& s, Carver& carve);
  // out[N,C] (=) from a[N,C] and r[N,C] (null without a stream); out may alias a or r. Keeps a
  // when scaled (the scales' gradients need it).
  void forward(float* out, const float* a, const float* r, const DeviceContext& c);
  // On entry dstream[N,C] holds d(out); on exit d(r). Returns d(a): da[N,C] (=) when scaled,
  // else dstream itself. The rows' gradients (+=); r as in forward.
  const float* backward(float* da, float* dstream, const float* r, const DeviceContext& c);

 private:
  bool scaled_, stream_;
  size_t out_scale_ = 0, out_bias_ = 0, res_scale_ = 0, res_bias_ = 0;
  float* a_ = nullptr;  // [N,C] the sub-layer's output (scaled only)
};

// The RoPE tables [T, RD/2] carved from the arena and (allocating pass) uploaded from
// RopeTable<float>: model.rope_theta's, and model.rope_theta_local's when some layer is local
// (model.rope_layers). One set shared by every attention part (DevicePartScratch), as
// attention_core.h's rope_of on the CPU.
struct DeviceRopeTables {
  DeviceRopeTables(const ModelConfig& m, Carver& carve);
  const DeviceRopeTable& of(const ModelConfig& m, int layer) const { return m.rope_local_at(layer) ? local : global; }
  DeviceRopeTable global, local;  // local: empty without local layers
};

// RoPE of x[B,T,NHX,HD] in place at the tokens' positions (model/attention_core.h's rope_at):
// one call for whole sequences, else one per sequence and run. backward: the transpose.
void rope_at(float* x, const DeviceRopeTable& table, int B, int T, int NHX, int HD, const TokenPositions& pos,
             bool backward);

// The ring's buffers under context parallelism (model/device_ring_attention.h), one set shared by
// every attention layer of any kind (DevicePartScratch). Not the arena's: sized by the largest
// rank's share (8 blocks of max_batch·T_r·KVD floats), made by the allocating pass only.
struct DeviceRingScratch {
  DeviceRingScratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve);
  DeviceRingBuffers& buffers();  // checks that the model was built for a group
  std::unique_ptr<DeviceRingBuffers> ring;  // null: whole sequences, or the counting pass
};

// The parts of each kind, one per file (the choice between kinds is model/device_block.cu's).
std::unique_ptr<DeviceAttentionPart> make_device_attention_gqa(const ModelConfig& m, const ParamLayout& layout,
                                                               int layer, const DevicePartSizes& s,
                                                               DevicePartScratch& scratch, Carver& carve);
std::unique_ptr<DeviceAttentionPart> make_device_attention_cca(const ModelConfig& m, const ParamLayout& layout,
                                                               int layer, const DevicePartSizes& s,
                                                               DevicePartScratch& scratch, Carver& carve);
std::unique_ptr<DeviceRouterPart> make_device_router_topk(const ModelConfig& m, const ParamLayout& layout, int layer,
                                                          const DevicePartSizes& s, DevicePartScratch& scratch,
                                                          Carver& carve);
std::unique_ptr<DeviceRouterPart> make_device_router_zaya(const ModelConfig& m, const ParamLayout& layout, int layer,
                                                          const DevicePartSizes& s, DevicePartScratch& scratch,
                                                          Carver& carve);
std::unique_ptr<DeviceExpertsPart> make_device_experts_swiglu(const ModelConfig& m, const ParamLayout& layout,
                                                              int layer, const DevicePartSizes& s,
                                                              DevicePartScratch& scratch, Carver& carve);

}  // namespace atl::gpu
