// The device side of model/attention_cca.h: compressed convolutional attention over
// backend/cuda/{linear,cca,rope,attention}.h, the CPU part's steps in the same order.
// Keeps [q|k] before and after the depthwise convolution, q and k before their norm with the
// norms' inverses, q, k (after norm and RoPE), v, the attention output and each row's
// log-sum-exp per layer, all in fp32 (as attention_gqa.cu, attention runs in fp32 under bf16
// products too). The RoPE tables (DeviceRopeTables) and the gradients' buffers are shared by the layers.
#include "atoll/backend/cuda/attention.h"
#include "atoll/backend/cuda/cca.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/rope.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/model/attention_cca.h"
#include "atoll/model/device_part.cuh"

namespace atl::gpu {
namespace {

class DeviceAttentionCca final : public DeviceAttentionPart {
 public:
  DeviceAttentionCca(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
                     DevicePartScratch& scratch, Carver& carve)
      : m_(m), sh_(scratch.get<Scratch>(m, s, carve)), rope_(scratch.get<DeviceRopeTables>(m, carve)->of(m, layer)) {
    const std::string pre = layer_prefix(layer) + "attn.", qkv = pre + "qkv_proj.";
    auto at = [&](const std::string& name) { return layout.at(name).offset; };
    wq_ = at(qkv + "q_proj.weight"), wk_ = at(qkv + "k_proj.weight");
    wvc_ = at(qkv + "v_proj_current.weight"), wvd_ = at(qkv + "v_proj_delayed.weight");
    w0_ = at(qkv + "conv_qk_depthwise.weight"), b0_ = at(qkv + "conv_qk_depthwise.bias");
    w1_ = at(qkv + "conv_qk_grouped.weight"), b1_ = at(qkv + "conv_qk_grouped.bias");
    temp_ = at(pre + "qk_norm.temp"), wo_ = at(pre + "o_proj.weight");
    const CcaDims d = cca_dims(m, s.max_batch, m.seq_len);
    const size_t N = s.max_tokens;
    x_ = carve.take<float>(N * d.CC()), y_ = carve.take<float>(size_t(s.max_batch) * d.TY() * d.CC());
    q_ = carve.take<float>(N * d.QD()), k_ = carve.take<float>(N * d.KVD());
    rq_ = carve.take<float>(N * d.NH), rk_ = carve.take<float>(N * d.NKV);
    qn_ = carve.take<float>(N * d.QD()), kn_ = carve.take<float>(N * d.KVD()), v_ = carve.take<float>(N * d.KVD());
    att_ = carve.take<float>(N * d.QD()), lse_ = carve.take<float>(size_t(s.max_batch) * d.NH * m.seq_len);
  }

  void forward(float* out, const float* h, const DeviceContext& c) override {
    const CcaDims d = cca_dims(m_, c.B, c.d.T);
    const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD();
    const DeviceProducts& mm = c.mm;
    Scratch& s = *sh_;
    float *z = s.dz, *vc = s.dvc, *vd = s.dvd;  // backward's buffers, free during forward
    const void* h1 = mm.input(mm.in16, h, size_t(N) * C);
    linear_forward(*mm.blas, q_, h1, mm.weight(wq_), N, C, QD, mm.dt);  // qp and kp, packed into x
    linear_forward(*mm.blas, k_, h1, mm.weight(wk_), N, C, KVD, mm.dt);
    pack_rows(x_, q_, k_, N, QD, KVD);
    cca_conv_forward(z, y_, x_, mm.param(w0_), mm.param(b0_), mm.param(w1_), mm.param(b1_), d);
    cca_qk_mean_forward(q_, k_, z, x_, d);
    cca_qk_norm_forward(qn_, kn_, rq_, rk_, q_, k_, mm.param(temp_), d);
    rope_forward(qn_, rope_, c.B, d.T, d.NH, d.HD);
    rope_forward(kn_, rope_, c.B, d.T, d.NKV, d.HD);
    linear_forward(*mm.blas, vc, h1, mm.weight(wvc_), N, C, KVD / 2, mm.dt);
    linear_forward(*mm.blas, vd, h1, mm.weight(wvd_), N, C, KVD / 2, mm.dt);
    cca_value_forward(v_, vc, vd, d);
    attention_forward(att_, lse_, qn_, kn_, v_, c.B, d.T, d.NH, d.NKV, d.HD);
    linear_forward(*mm.blas, out, mm.input(mm.in16, att_, size_t(N) * QD), mm.weight(wo_), N, QD, C, mm.dt);
  }

  void backward(float* dh, const float* dout, const float* h, const DeviceContext& c) override {
    const CcaDims d = cca_dims(m_, c.B, c.d.T);
    const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
    const DeviceProducts& mm = c.mm;
    Scratch& s = *sh_;
    float* g = c.grads;
    ATOLL_CUDA_CHECK(cudaMemset(s.datt, 0, sizeof(float) * N * QD));
    linear_backward(*mm.blas, s.datt, g + wo_, mm.input(mm.dout16, dout, size_t(N) * C),
                    mm.input(mm.in16, att_, size_t(N) * QD), mm.weight(wo_), N, QD, C, mm.dt);
    attention_backward(s.dqn, s.dkn, s.dv, s.datt, att_, lse_, qn_, kn_, v_, c.B, d.T, d.NH, d.NKV, d.HD,
                       s.attn_scratch);
    rope_backward(s.dqn, rope_, c.B, d.T, d.NH, d.HD);
    rope_backward(s.dkn, rope_, c.B, d.T, d.NKV, d.HD);
    cca_qk_norm_backward(s.dq, s.dk, g + temp_, s.part, s.dqn, s.dkn, q_, k_, rq_, rk_, mm.param(temp_), d);
    ATOLL_CUDA_CHECK(cudaMemset(s.dx, 0, sizeof(float) * N * CC));
    cca_qk_mean_backward(s.dz, s.dx, s.dq, s.dk, d);
    cca_conv_backward(s.dx, g + w0_, g + b0_, g + w1_, g + b1_, s.dy, s.dz, y_, x_, mm.param(w0_), mm.param(w1_), d);
    unpack_rows(s.dq, s.dk, s.dx, N, QD, KVD);  // d(qp), d(kp)
    cca_value_backward(s.dvc, s.dvd, s.dv, d);
    const void* h1 = mm.input(mm.in16, h, size_t(N) * C);
    // dout16 holds one projection's d(output) at a time: each product is queued before the next
    // rounding overwrites it (one stream).
    const struct { const float* d; size_t w; int out; } proj[] = {
        {s.dq, wq_, QD}, {s.dk, wk_, KVD}, {s.dvc, wvc_, KVD / 2}, {s.dvd, wvd_, KVD / 2}};
    for (const auto& p : proj)
      linear_backward(*mm.blas, dh, g + p.w, mm.input(mm.dout16, p.d, size_t(N) * p.out), h1, mm.weight(p.w), N, C,
                      p.out, mm.dt);
  }

 private:
  // Shared by the layers: the gradients' buffers.
  struct Scratch {
    Scratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve) {
      const CcaDims d = cca_dims(m, s.max_batch, m.seq_len);
      const size_t N = s.max_tokens;
      datt = carve.take<float>(N * d.QD()), dqn = carve.take<float>(N * d.QD()), dq = carve.take<float>(N * d.QD());
      dkn = carve.take<float>(N * d.KVD()), dv = carve.take<float>(N * d.KVD()), dk = carve.take<float>(N * d.KVD());
      dvc = carve.take<float>(N * d.KVD() / 2), dvd = carve.take<float>(N * d.KVD() / 2);
      dz = carve.take<float>(N * d.CC()), dx = carve.take<float>(N * d.CC());
      dy = carve.take<float>(size_t(s.max_batch) * d.TY() * d.CC()), part = carve.take<float>(N * d.NKV);
      attn_scratch = carve.take<float>(size_t(attention_scratch_floats(s.max_batch, m.seq_len, m.n_heads)));
    }
    float *datt, *dqn, *dq, *dkn, *dv, *dk, *dvc, *dvd;  // [N,QD] x3, [N,KVD] x3, [N,KVD/2] x2
    float *dz, *dx, *dy, *part;                          // [N,CC] x2, [B,TY,CC], [N,NKV]
    float* attn_scratch;                                 // attention_scratch_floats(B, T, NH)
  };

  ModelConfig m_;
  size_t wq_, wk_, wvc_, wvd_, w0_, b0_, w1_, b1_, temp_, wo_;
  std::shared_ptr<Scratch> sh_;
  DeviceRopeTable rope_;  // this layer's (model.rope_layers), from the shared DeviceRopeTables
  float *x_, *y_;                    // [N,CC] pre-convolution [q|k]; [B,TY,CC] depthwise output
  float *q_, *k_, *rq_, *rk_;        // before the norm [N,QD], [N,KVD]; 1/‖·‖ [N,NH], [N,NKV]
  float *qn_, *kn_, *v_, *att_, *lse_;  // after norm and RoPE; values; attention out; [B,NH,T]
};

}  // namespace

std::unique_ptr<DeviceAttentionPart> make_device_attention_cca(const ModelConfig& m, const ParamLayout& layout,
                                                               int layer, const DevicePartSizes& s,
                                                               DevicePartScratch& scratch, Carver& carve) {
  if (s.zigzag)  // its convolutions need the previous chunk's tokens: the CPU's boundary exchange only
    throw ConfigError("CCA layers with train.context_parallel > 1 run on the CPU engine only (the device CCA has no "
                      "boundary exchange between chunks); fix: train.device = \"cpu\", or train.context_parallel = 1");
  return std::make_unique<DeviceAttentionCca>(m, layout, layer, s, scratch, carve);
}

}  // namespace atl::gpu
