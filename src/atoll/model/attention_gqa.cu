// The device side of model/attention_gqa.h: grouped-query causal attention with RoPE over
// backend/cuda/{linear,rope,attention}.h.
//   out = wo · attention(rope(h wqᵀ), rope(h wkᵀ), h wvᵀ)
// Keeps q, k, v (after RoPE), the attention output and each row's log-sum-exp per layer, all in
// fp32: unlike the CPU, attention itself runs in fp32 on fp32 q, k, v under bf16 products too.
// The RoPE table and the gradients' buffers are shared by the layers. Under context parallelism
// (DevicePartSizes::zigzag) RoPE rotates by the tokens' places in their sequences and attention
// runs round the group's ring (model/device_ring_attention.h), whose buffers the layers share.
#include "atoll/backend/cuda/attention.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/rope.h"
#include "atoll/core/check.h"
#include "atoll/layers/rope.h"
#include "atoll/model/device_part.cuh"
#include "atoll/model/device_ring_attention.h"

namespace atl::gpu {
namespace {

class DeviceAttentionGqa final : public DeviceAttentionPart {
 public:
  DeviceAttentionGqa(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
                     DevicePartScratch& scratch, Carver& carve)
      : NH_(m.n_heads), NKV_(m.n_kv_heads), HD_(m.head_dim), sh_(scratch.get<Scratch>(m, s, carve)),
        ring_(scratch.get<DeviceRingScratch>(m, s, carve)), rope_(scratch.get<DeviceRopeTables>(m, carve)->of(m, layer)) {
    const std::string pre = layer_prefix(layer) + "attn.";
    wq_ = layout.at(pre + "wq").offset, wk_ = layout.at(pre + "wk").offset;
    wv_ = layout.at(pre + "wv").offset, wo_ = layout.at(pre + "wo").offset;
    const size_t N = s.max_tokens, QD = size_t(NH_) * HD_, KVD = size_t(NKV_) * HD_;
    q_ = carve.take<float>(N * QD), k_ = carve.take<float>(N * KVD), v_ = carve.take<float>(N * KVD);
    att_ = carve.take<float>(N * QD), lse_ = carve.take<float>(size_t(s.max_batch) * NH_ * m.seq_len);
  }

  void forward(float* out, const float* h, const DeviceContext& c) override {
    const auto [T_, N, C, E, K, H, QD, KVD] = c.d;
    const DeviceProducts& mm = c.mm;
    const void* h1 = mm.input(mm.in16, h, size_t(N) * C);
    linear_forward(*mm.blas, q_, h1, mm.weight(wq_), N, C, QD, mm.dt);
    linear_forward(*mm.blas, k_, h1, mm.weight(wk_), N, C, KVD, mm.dt);
    linear_forward(*mm.blas, v_, h1, mm.weight(wv_), N, C, KVD, mm.dt);
    rope_at(q_, rope_, c.B, T_, NH_, HD_, c.pos, false);
    rope_at(k_, rope_, c.B, T_, NKV_, HD_, c.pos, false);
    if (c.cp) ring_attention_forward(att_, lse_, q_, k_, v_, c.B, ring(), *c.cp);
    else attention_forward(att_, lse_, q_, k_, v_, c.B, T_, NH_, NKV_, HD_);
    linear_forward(*mm.blas, out, mm.input(mm.in16, att_, size_t(N) * QD), mm.weight(wo_), N, QD, C, mm.dt);
  }

  void backward(float* dh, const float* dout, const float* h, const DeviceContext& c) override {
    const auto [T_, N, C, E, K, H, QD, KVD] = c.d;
    const DeviceProducts& mm = c.mm;
    Scratch& s = *sh_;
    float* g = c.grads;
    ATOLL_CUDA_CHECK(cudaMemset(s.datt, 0, sizeof(float) * N * QD));
    linear_backward(*mm.blas, s.datt, g + wo_, mm.input(mm.dout16, dout, size_t(N) * C),
                    mm.input(mm.in16, att_, size_t(N) * QD), mm.weight(wo_), N, QD, C, mm.dt);
    if (c.cp) ring_attention_backward(s.dq, s.dk, s.dv, s.datt, att_, lse_, q_, k_, v_, c.B, ring(), *c.cp);
    else attention_backward(s.dq, s.dk, s.dv, s.datt, att_, lse_, q_, k_, v_, c.B, T_, NH_, NKV_, HD_, s.attn_scratch);
    rope_at(s.dq, rope_, c.B, T_, NH_, HD_, c.pos, true);
    rope_at(s.dk, rope_, c.B, T_, NKV_, HD_, c.pos, true);
    const void* h1 = mm.input(mm.in16, h, size_t(N) * C);
    // dout16 holds one projection's d(output) at a time: each product is queued before the next
    // rounding overwrites it (one stream).
    linear_backward(*mm.blas, dh, g + wq_, mm.input(mm.dout16, s.dq, size_t(N) * QD), h1, mm.weight(wq_), N, C, QD,
                    mm.dt);
    linear_backward(*mm.blas, dh, g + wk_, mm.input(mm.dout16, s.dk, size_t(N) * KVD), h1, mm.weight(wk_), N, C, KVD,
                    mm.dt);
    linear_backward(*mm.blas, dh, g + wv_, mm.input(mm.dout16, s.dv, size_t(N) * KVD), h1, mm.weight(wv_), N, C, KVD,
                    mm.dt);
  }

 private:
  // Shared by the layers: the gradients' buffers.
  struct Scratch {
    Scratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve) {
      const size_t N = s.max_tokens, QD = size_t(m.n_heads) * m.head_dim, KVD = size_t(m.n_kv_heads) * m.head_dim;
      dq = carve.take<float>(N * QD), dk = carve.take<float>(N * KVD), dv = carve.take<float>(N * KVD);
      datt = carve.take<float>(N * QD);
      attn_scratch = carve.take<float>(size_t(attention_scratch_floats(s.max_batch, m.seq_len, m.n_heads)));
    }
    float *dq, *dk, *dv, *datt;  // [N,QD], [N,KVD] x2, [N,QD]
    float* attn_scratch;         // attention_scratch_floats(B, T, NH)
  };

  DeviceRingBuffers& ring() { return ring_->buffers(); }

  int NH_, NKV_, HD_;
  size_t wq_, wk_, wv_, wo_;
  std::shared_ptr<Scratch> sh_;
  std::shared_ptr<DeviceRingScratch> ring_;  // context parallelism's ring, shared by the layers
  DeviceRopeTable rope_;  // this layer's (model.rope_layers), from the shared DeviceRopeTables
  float *q_, *k_, *v_;  // after RoPE [N,QD], [N,KVD], [N,KVD]
  float *att_, *lse_;   // attention out [N,QD], row log-sum-exp [B,NH,T]
};

}  // namespace

namespace {

// One RoPE table of base theta [T, RD/2].
DeviceRopeTable carve_rope_table(const ModelConfig& m, double theta, Carver& carve) {
  const size_t half = size_t(m.seq_len) * (m.rotary_dim() / 2);
  float* cos = carve.take<float>(half);
  float* sin = carve.take<float>(half);
  if (carve.allocates()) {
    const RopeTable<float> rope = RopeTable<float>::build(m.seq_len, m.head_dim, theta, m.rotary_dim());
    ATOLL_CHECK_EQ(rope.cos.size(), half);
    copy_to_device(cos, rope.cos.data(), sizeof(float) * rope.cos.size());
    copy_to_device(sin, rope.sin.data(), sizeof(float) * rope.sin.size());
  }
  return {cos, sin, m.seq_len, m.head_dim, m.rotary_dim()};
}

}  // namespace

// RoPE of x[B,T,NHX,HD] in place at the tokens' positions (model/attention_core.h's rope_at):
// one call for whole sequences, else one per sequence and run.
void rope_at(float* x, const DeviceRopeTable& table, int B, int T_, int NHX, int HD, const TokenPositions& pos,
             bool backward) {
  auto rotate = [&](float* at, int batch, int len, int pos0) {
    if (backward) rope_backward(at, table, batch, len, NHX, HD, pos0);
    else rope_forward(at, table, batch, len, NHX, HD, pos0);
  };
  if (pos.runs == 1) return rotate(x, B, T_, pos.start[0]);
  ATOLL_CHECK(pos.runs <= TokenPositions::kMaxRuns && pos.len[0] + pos.len[1] == T_)
      << pos.runs << " runs of " << pos.len[0] << " + " << pos.len[1] << " tokens for T=" << T_;
  for (int b = 0; b < B; ++b)
    for (int r = 0, at = 0; r < pos.runs; at += pos.len[r++])
      rotate(x + (size_t(b) * T_ + at) * NHX * HD, 1, pos.len[r], pos.start[r]);
}

DeviceRingScratch::DeviceRingScratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve) {
  if (s.zigzag && carve.allocates())
    ring = std::make_unique<DeviceRingBuffers>(
        RingDims{.B = s.max_batch, .NH = m.n_heads, .NKV = m.n_kv_heads, .HD = m.head_dim}, *s.zigzag);
}

DeviceRingBuffers& DeviceRingScratch::buffers() {
  ATOLL_CHECK(ring) << "a context-parallel call to a model built for whole sequences";
  return *ring;
}

DeviceRopeTables::DeviceRopeTables(const ModelConfig& m, Carver& carve)
    : global(carve_rope_table(m, m.rope_theta, carve)),
      local(m.any_rope_local() ? carve_rope_table(m, m.rope_theta_local, carve) : DeviceRopeTable{}) {}

std::unique_ptr<DeviceAttentionPart> make_device_attention_gqa(const ModelConfig& m, const ParamLayout& layout,
                                                               int layer, const DevicePartSizes& s,
                                                               DevicePartScratch& scratch, Carver& carve) {
  return std::make_unique<DeviceAttentionGqa>(m, layout, layer, s, scratch, carve);
}

}  // namespace atl::gpu
