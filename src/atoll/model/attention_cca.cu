// The device side of model/attention_cca.h: compressed convolutional attention over
// backend/cuda/{linear,cca,rope,attention}.h, the CPU part's steps in the same order.
// Keeps [q|k] before and after the depthwise convolution, q and k before their norm with the
// norms' inverses, q, k (after norm and RoPE), v, the attention output and each row's
// log-sum-exp per layer, all in fp32 (as attention_gqa.cu, attention runs in fp32 under bf16
// products too). The RoPE tables (DeviceRopeTables) and the gradients' buffers are shared by the layers.
//
// Context parallelism (DevicePartSizes::zigzag), as the CPU part: the [q|k] rows and the
// depthwise output are laid out per run (model/cca_boundary.h: each chunk with the lag rows of the
// chunk before it), the boundary messages are gathered on the device into one block, copied to
// the host, exchanged with the neighbours (model/chunk_boundary.h, over the group's Collective: the
// ring's transport and reason, model/device_ring_attention.h) and copied back; the convolutions run
// per run, RoPE at the chunks' positions, attention round the ring (DeviceRingScratch, shared with
// the GQA layers). Backward returns the boundary rows' gradients the same way.
#include <algorithm>
#include <string>
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/attention.h"
#include "atoll/backend/cuda/cca.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/elementwise.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/rope.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/model/attention_cca.h"
#include "atoll/model/cca_boundary.h"
#include "atoll/model/chunk_boundary.h"
#include "atoll/model/device_part.cuh"
#include "atoll/model/device_ring_attention.h"

namespace atl::gpu {
namespace {

void device_copy(float* to, const float* from, size_t n) {
  if (n) ATOLL_CUDA_CHECK(cudaMemcpyAsync(to, from, n * sizeof(float), cudaMemcpyDeviceToDevice, nullptr));
}

// Under context parallelism every chunk must hold the rows its successor reads (the config
// refuses shorter ones, config/context_parallel.h; this is the backstop, before any exchange).
void check_chunks(const ModelConfig& m, const ZigzagLayout& z) {
  const int need = std::max(m.cca_time0 - 1 + m.cca_time1 - 1, 1);
  if (z.contiguous)
    throw ConfigError("CCA under train.context_parallel runs on the zigzag layout (its boundary exchange pairs the "
                      "zigzag neighbours); fix: unset ATOLL_CP_LAYOUT");
  for (int c = 0; c < 2 * z.P; ++c)
    if (z.chunk_len(c) < need)
      throw ConfigError("train.context_parallel = " + std::to_string(z.P) + " cuts model.seq_len = " +
                        std::to_string(z.T) + " into chunks of " + std::to_string(z.chunk_len(c)) +
                        " tokens, fewer than the " + std::to_string(need) +
                        " tokens of the previous chunk CCA reads; fix: raise model.seq_len to at least " +
                        std::to_string(2 * z.P * need) + " or lower train.context_parallel");
}

class DeviceAttentionCca final : public DeviceAttentionPart {
 public:
  DeviceAttentionCca(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
                     DevicePartScratch& scratch, Carver& carve)
      : m_(m), lag_(m.cca_time0 - 1 + m.cca_time1 - 1), sh_(scratch.get<Scratch>(m, s, carve)),
        ring_(scratch.get<DeviceRingScratch>(m, s, carve)),
        rope_(scratch.get<DeviceRopeTables>(m, carve)->of(m, layer)) {
    const std::string pre = layer_prefix(layer) + "attn.", qkv = pre + "qkv_proj.";
    auto at = [&](const std::string& name) { return layout.at(name).offset; };
    wq_ = at(qkv + "q_proj.weight"), wk_ = at(qkv + "k_proj.weight");
    wvc_ = at(qkv + "v_proj_current.weight"), wvd_ = at(qkv + "v_proj_delayed.weight");
    w0_ = at(qkv + "conv_qk_depthwise.weight"), b0_ = at(qkv + "conv_qk_depthwise.bias");
    w1_ = at(qkv + "conv_qk_grouped.weight"), b1_ = at(qkv + "conv_qk_grouped.bias");
    temp_ = at(pre + "qk_norm.temp"), wo_ = at(pre + "o_proj.weight");
    const CcaDims d = cca_dims(m, s.max_batch, m.seq_len);
    const size_t N = s.max_tokens;
    x_ = carve.take<float>(cca_x_rows_max(s.max_tokens, s.max_batch, lag_) * d.CC());
    y_ = carve.take<float>(cca_y_rows_max(s.max_tokens, s.max_batch, lag_, d.t1) * d.CC());
    q_ = carve.take<float>(N * d.QD()), k_ = carve.take<float>(N * d.KVD());
    rq_ = carve.take<float>(N * d.NH), rk_ = carve.take<float>(N * d.NKV);
    qn_ = carve.take<float>(N * d.QD()), kn_ = carve.take<float>(N * d.KVD()), v_ = carve.take<float>(N * d.KVD());
    att_ = carve.take<float>(N * d.QD()), lse_ = carve.take<float>(size_t(s.max_batch) * d.NH * m.seq_len);
  }

  void forward(float* out, const float* h, const DeviceContext& c) override {
    const CcaDims d = cca_dims(m_, c.B, c.d.T);
    const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
    const CcaRuns R = cca_runs(c.pos, c.B, d.T, lag_, d.t1);
    const DeviceProducts& mm = c.mm;
    Scratch& s = *sh_;
    float *z = s.dz, *vc = s.dvc, *vd = s.dvd;  // backward's buffers, free during forward
    const void* h1 = mm.input(mm.in16, h, size_t(N) * C);
    linear_forward(*mm.blas, q_, h1, mm.weight(wq_), N, C, QD, mm.dt);  // qp and kp, packed into x
    linear_forward(*mm.blas, k_, h1, mm.weight(wk_), N, C, KVD, mm.dt);
    cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
      pack_rows(x_ + xr * CC, q_ + l * QD, k_ + l * KVD, n, QD, KVD);
    });
    linear_forward(*mm.blas, vc, h1, mm.weight(wvc_), N, C, KVD / 2, mm.dt);
    linear_forward(*mm.blas, vd, h1, mm.weight(wvd_), N, C, KVD / 2, mm.dt);
    if (c.cp) boundary_forward(vd, c);
    for (int i = 0; i < R.n; ++i) {  // each run over [boundary | its tokens]
      const CcaRun& u = R.run[i];
      cca_conv_forward(z + u.x_row * CC, y_ + u.y_row * CC, x_ + u.x_row * CC, mm.param(w0_), mm.param(b0_),
                       mm.param(w1_), mm.param(b1_), cca_dims(m_, c.B, u.rows()));
    }
    cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
      cca_qk_mean_forward(q_ + l * QD, k_ + l * KVD, z + xr * CC, x_ + xr * CC, cca_dims(m_, 1, n));
    });
    cca_qk_norm_forward(qn_, kn_, rq_, rk_, q_, k_, mm.param(temp_), d);
    rope_at(qn_, rope_, c.B, d.T, d.NH, d.HD, c.pos, false);
    rope_at(kn_, rope_, c.B, d.T, d.NKV, d.HD, c.pos, false);
    cca_value_forward(v_, vc, vd, d);
    if (c.cp) shift_values(c);
    if (c.cp) ring_attention_forward(att_, lse_, qn_, kn_, v_, c.B, ring_->buffers(), *c.cp);
    else attention_forward(att_, lse_, qn_, kn_, v_, c.B, d.T, d.NH, d.NKV, d.HD);
    linear_forward(*mm.blas, out, mm.input(mm.in16, att_, size_t(N) * QD), mm.weight(wo_), N, QD, C, mm.dt);
  }

  void backward(float* dh, const float* dout, const float* h, const DeviceContext& c) override {
    const CcaDims d = cca_dims(m_, c.B, c.d.T);
    const int N = d.N(), C = d.C, QD = d.QD(), KVD = d.KVD(), CC = d.CC();
    const CcaRuns R = cca_runs(c.pos, c.B, d.T, lag_, d.t1);
    const DeviceProducts& mm = c.mm;
    Scratch& s = *sh_;
    float* g = c.grads;
    ATOLL_CUDA_CHECK(cudaMemset(s.datt, 0, sizeof(float) * N * QD));
    linear_backward(*mm.blas, s.datt, g + wo_, mm.input(mm.dout16, dout, size_t(N) * C),
                    mm.input(mm.in16, att_, size_t(N) * QD), mm.weight(wo_), N, QD, C, mm.dt);
    if (c.cp)
      ring_attention_backward(s.dqn, s.dkn, s.dv, s.datt, att_, lse_, qn_, kn_, v_, c.B, ring_->buffers(), *c.cp);
    else
      attention_backward(s.dqn, s.dkn, s.dv, s.datt, att_, lse_, qn_, kn_, v_, c.B, d.T, d.NH, d.NKV, d.HD,
                         s.attn_scratch);
    rope_at(s.dqn, rope_, c.B, d.T, d.NH, d.HD, c.pos, true);
    rope_at(s.dkn, rope_, c.B, d.T, d.NKV, d.HD, c.pos, true);
    cca_qk_norm_backward(s.dq, s.dk, g + temp_, s.part, s.dqn, s.dkn, q_, k_, rq_, rk_, mm.param(temp_), d);
    ATOLL_CUDA_CHECK(cudaMemset(s.dx, 0, sizeof(float) * R.x_rows * CC));
    // The boundary rows' outputs are dropped: their dz stays 0 (whole sequences have none).
    if (c.cp) ATOLL_CUDA_CHECK(cudaMemset(s.dz, 0, sizeof(float) * R.x_rows * CC));
    cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
      cca_qk_mean_backward(s.dz + xr * CC, s.dx + xr * CC, s.dq + l * QD, s.dk + l * KVD, cca_dims(m_, 1, n));
    });
    for (int i = 0; i < R.n; ++i) {
      const CcaRun& u = R.run[i];
      cca_conv_backward(s.dx + u.x_row * CC, g + w0_, g + b0_, g + w1_, g + b1_, s.dy + u.y_row * CC,
                        s.dz + u.x_row * CC, y_ + u.y_row * CC, x_ + u.x_row * CC, mm.param(w0_), mm.param(w1_),
                        cca_dims(m_, c.B, u.rows()));
    }
    cca_value_backward(s.dvc, s.dvd, s.dv, d);
    if (c.cp) boundary_backward(c);
    cca_for_each_span(R, c.B, d.T, [&](size_t l, size_t xr, int n) {
      unpack_rows(s.dq + l * QD, s.dk + l * KVD, s.dx + xr * CC, n, QD, KVD);  // d(qp), d(kp)
    });
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
  // Shared by the layers: the gradients' buffers, and under context parallelism the boundary
  // messages ([tails | heads] on the device, and their host copies the group exchanges).
  struct Scratch {
    Scratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve) {
      const CcaDims d = cca_dims(m, s.max_batch, m.seq_len);
      const int lag = m.cca_time0 - 1 + m.cca_time1 - 1;
      const size_t N = s.max_tokens, x_rows = cca_x_rows_max(s.max_tokens, s.max_batch, lag);
      datt = carve.take<float>(N * d.QD()), dqn = carve.take<float>(N * d.QD()), dq = carve.take<float>(N * d.QD());
      dkn = carve.take<float>(N * d.KVD()), dv = carve.take<float>(N * d.KVD()), dk = carve.take<float>(N * d.KVD());
      dvc = carve.take<float>(N * d.KVD() / 2), dvd = carve.take<float>(N * d.KVD() / 2);
      dz = carve.take<float>(x_rows * d.CC()), dx = carve.take<float>(x_rows * d.CC());
      dy = carve.take<float>(cca_y_rows_max(s.max_tokens, s.max_batch, lag, d.t1) * d.CC());
      part = carve.take<float>(N * d.NKV);
      attn_scratch = carve.take<float>(size_t(attention_scratch_floats(s.max_batch, m.seq_len, m.n_heads)));
      if (s.zigzag) {
        check_chunks(m, *s.zigzag);
        const size_t msgs = size_t(TokenPositions::kMaxRuns) * s.max_batch * (size_t(lag) * d.CC() + d.KVD() / 2);
        tails = carve.take<float>(msgs), heads = carve.take<float>(msgs);
        host_tails.resize(carve.allocates() ? msgs : 0), host_heads.resize(host_tails.size());
      }
    }
    float *datt, *dqn, *dq, *dkn, *dv, *dk, *dvc, *dvd;  // [N,QD] x3, [N,KVD] x3, [N,KVD/2] x2
    float *dz, *dx, *dy, *part;                          // [x rows,CC] x2, [y rows,CC], [N,NKV]
    float* attn_scratch;                                 // attention_scratch_floats(B, T, NH)
    float *tails = nullptr, *heads = nullptr;            // [runs, B, W] (model/cca_boundary.h)
    std::vector<float> host_tails, host_heads;
  };

  CcaBoundary boundary(const DeviceContext& c) const {
    ATOLL_CHECK(c.zigzag && c.pos.runs == TokenPositions::kMaxRuns)
        << "CCA on chunks of sequences runs in a context-parallel group";
    return cca_boundary(cca_runs(c.pos, c.B, c.d.T, lag_, m_.cca_time1), c.B, c.d.T, lag_, cc(), kvd());
  }
  int cc() const { return (m_.n_heads + m_.n_kv_heads) * m_.head_dim; }
  int kvd() const { return m_.n_kv_heads * m_.head_dim; }

  // Before the convolutions: each run's last lag x rows and its last token's delayed half
  // (vd) to the next chunk's holder; the predecessors' into the runs' boundary rows of x. The
  // heads stay on the device for shift_values.
  void boundary_forward(const float* vd, const DeviceContext& c) {
    Scratch& s = *sh_;
    const CcaBoundary p = boundary(c);
    for (const CcaMessage& msg : p.msgs) {
      device_copy(s.tails + msg.msg, x_ + msg.tail_x, p.x_floats);
      device_copy(s.tails + msg.msg + p.x_floats, vd + msg.last_vd, p.half);
    }
    copy_to_host(s.host_tails.data(), s.tails, sizeof(float) * p.floats());  // waits for the queue
    float* heads = s.host_heads.data();
    const float* tails = s.host_tails.data();
    chunk_tails_forward(heads, heads + p.per_run, tails, tails + p.per_run, p.per_run, *c.cp);
    copy_to_device(s.heads, heads, sizeof(float) * p.floats());
    for (const CcaMessage& msg : p.msgs)
      if (msg.has_pred) device_copy(x_ + msg.head_x, s.heads + msg.msg, p.x_floats);
  }

  // The value shift at each run's first token: the predecessor's delayed half, or 0 where the
  // run starts its sequence (cca_value_forward took the row before in the local layout).
  void shift_values(const DeviceContext& c) {
    const CcaBoundary p = boundary(c);
    for (const CcaMessage& msg : p.msgs)
      if (msg.has_pred) device_copy(v_ + msg.first_v, sh_->heads + msg.msg + p.x_floats, p.half);
      else ATOLL_CUDA_CHECK(cudaMemsetAsync(v_ + msg.first_v, 0, sizeof(float) * p.half, nullptr));
  }

  // Backward, after the convolutions' and the value shift's: the gradients of each run's
  // boundary rows (dx) and of the delayed half its first token read (dv) go back to the chunk
  // before's holder, which adds them to its tail rows' dx and sets its last token's dvd.
  void boundary_backward(const DeviceContext& c) {
    Scratch& s = *sh_;
    const CcaBoundary p = boundary(c);
    for (const CcaMessage& msg : p.msgs)
      if (msg.has_pred) {
        device_copy(s.heads + msg.msg, s.dx + msg.head_x, p.x_floats);
        device_copy(s.heads + msg.msg + p.x_floats, s.dv + msg.first_v, p.half);
      }
    copy_to_host(s.host_heads.data(), s.heads, sizeof(float) * p.floats());
    float* dtails = s.host_tails.data();
    const float* dheads = s.host_heads.data();
    chunk_heads_backward(dtails, dtails + p.per_run, dheads, dheads + p.per_run, p.per_run, *c.cp);
    copy_to_device(s.tails, dtails, sizeof(float) * p.floats());
    for (const CcaMessage& msg : p.msgs) {
      add(s.dx + msg.tail_x, s.dx + msg.tail_x, s.tails + msg.msg, p.x_floats);
      device_copy(s.dvd + msg.last_vd, s.tails + msg.msg + p.x_floats, p.half);
    }
  }

  ModelConfig m_;
  int lag_;  // t0-1 + t1-1: the pre-convolution rows a chunk reads before itself
  size_t wq_, wk_, wvc_, wvd_, w0_, b0_, w1_, b1_, temp_, wo_;
  std::shared_ptr<Scratch> sh_;
  std::shared_ptr<DeviceRingScratch> ring_;  // context parallelism's ring, shared by the layers
  DeviceRopeTable rope_;  // this layer's (model.rope_layers), from the shared DeviceRopeTables
  float *x_, *y_;                    // per run (model/cca_boundary.h): [x rows,CC] pre-convolution [q|k]; [y rows,CC]
  float *q_, *k_, *rq_, *rk_;        // before the norm [N,QD], [N,KVD]; 1/‖·‖ [N,NH], [N,NKV]
  float *qn_, *kn_, *v_, *att_, *lse_;  // after norm and RoPE; values; attention out; [B,NH,T]
};

}  // namespace

std::unique_ptr<DeviceAttentionPart> make_device_attention_cca(const ModelConfig& m, const ParamLayout& layout,
                                                               int layer, const DevicePartSizes& s,
                                                               DevicePartScratch& scratch, Carver& carve) {
  return std::make_unique<DeviceAttentionCca>(m, layout, layer, s, scratch, carve);
}

}  // namespace atl::gpu
