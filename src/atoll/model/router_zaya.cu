// The device side of model/router_zaya.h: ZAYA1's router over backend/cuda/{linear, bias,
// rmsnorm, gelu, router_zaya}.h, the CPU part's steps in the same order. Every product stays
// fp32 under bf16 products too, as on the CPU. Keeps per layer what backward needs (the state s,
// its norm, the MLP's pre-activations, rstd, the probabilities and the choice); the GELU output,
// the gradients' buffers and the logits are shared by the layers, and so is `carry`, the
// gradient of the state handed from one router's backward to the previous router's (the blocks
// run in reverse, so router l reads it right after router l+1 wrote it).
#include "atoll/backend/cuda/bias.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/gelu.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/rmsnorm.h"
#include "atoll/backend/cuda/router_zaya.h"
#include "atoll/core/check.h"
#include "atoll/model/device_part.cuh"
#include "atoll/model/router_zaya.h"

namespace atl::gpu {
namespace {

class DeviceRouterZaya final : public DeviceRouterPart {
 public:
  DeviceRouterZaya(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
                   DevicePartScratch& scratch, Carver& carve)
      : E1_(m.n_experts + 1),
        K_(m.top_k),
        R_(m.router_hidden_size),
        eps_(m.norm_eps),
        depth_(zaya_depth_averaging(m, layer)),
        sh_(scratch.get<Scratch>(m, s, carve)) {
    at_ = zaya_router_offsets(m, layout, layer);
    const size_t N = s.max_tokens, NR = N * R_;
    s_ = carve.take<float>(NR), xn_ = carve.take<float>(NR), a1_ = carve.take<float>(NR), a2_ = carve.take<float>(NR);
    rstd_ = carve.take<float>(N), probs_ = carve.take<float>(N * E1_);
    choice_ = carve.take<int32_t>(N * K_), topk_idx_ = carve.take<int32_t>(N * K_);
    topk_w_ = carve.take<float>(N * K_);
  }

  void link_previous(DeviceRouterPart& prev) override {
    auto* p = dynamic_cast<DeviceRouterZaya*>(&prev);
    ATOLL_CHECK_EQ(p != nullptr, depth_) << "a zaya router averages over depth exactly when the previous one is zaya";
    if (!p) return;
    ATOLL_CHECK_EQ(p->R_, R_);
    prev_ = p, p->has_next_ = true;
  }

  void forward(double* losses, const float* h, const DeviceContext& c) override {
    const int N = c.d.N, C = c.d.C, R = R_;
    const size_t NR = size_t(N) * R;
    Blas& blas = *c.mm.blas;
    auto P = [&](size_t off) { return c.mm.param(off); };
    float* g = sh_->g;
    linear_forward(blas, s_, h, P(at_.down), N, C, R);  // fp32 in both modes, as the CPU
    add_bias(s_, P(at_.down_b), N, R);
    if (depth_) {
      ATOLL_CHECK(prev_ != nullptr) << "zaya router with depth averaging not linked to the previous block's";
      zaya_depth_forward(s_, prev_->s_, P(at_.depth_scale), N, R);
    }
    rmsnorm_forward(xn_, rstd_, s_, P(at_.norm), N, R, eps_);
    linear_forward(blas, a1_, xn_, P(at_.fc1), N, R, R);
    add_bias(a1_, P(at_.fc1_b), N, R);
    gelu_forward(g, a1_, NR);
    linear_forward(blas, a2_, g, P(at_.fc2), N, R, R);
    add_bias(a2_, P(at_.fc2_b), N, R);
    gelu_forward(g, a2_, NR);
    linear_forward(blas, sh_->logits, g, P(at_.out), N, R, E1_);
    zaya_route_forward(probs_, choice_, topk_w_, topk_idx_, sh_->logits, P(at_.biases), N, E1_, K_);
    ATOLL_CUDA_CHECK(cudaMemsetAsync(losses, 0, 2 * sizeof(double), nullptr));  // no auxiliary loss
  }
  const int32_t* topk_idx() const override { return topk_idx_; }
  const float* topk_w() const override { return topk_w_; }

  // The forward in reverse; the GELU outputs are recomputed from the kept pre-activations.
  void backward(float* dh, const float* dtopk_w, const float* h, const DeviceContext& c) override {
    const int N = c.d.N, C = c.d.C, R = R_;
    const size_t NR = size_t(N) * R;
    Blas& blas = *c.mm.blas;
    auto P = [&](size_t off) { return c.mm.param(off); };
    Scratch& s = *sh_;
    float* grads = c.grads;
    zaya_route_backward(s.dlogits, dtopk_w, probs_, choice_, N, E1_, K_);
    gelu_forward(s.g, a2_, NR);
    zero(s.d1, NR);
    linear_backward(blas, s.d1, grads + at_.out, s.dlogits, s.g, P(at_.out), N, R, E1_);
    gelu_backward(s.d1, s.d1, a2_, NR);
    bias_backward(grads + at_.fc2_b, s.d1, N, R);
    gelu_forward(s.g, a1_, NR);
    zero(s.d2, NR);
    linear_backward(blas, s.d2, grads + at_.fc2, s.d1, s.g, P(at_.fc2), N, R, R);
    gelu_backward(s.d2, s.d2, a1_, NR);
    bias_backward(grads + at_.fc1_b, s.d2, N, R);
    zero(s.d1, NR);
    linear_backward(blas, s.d1, grads + at_.fc1, s.d2, xn_, P(at_.fc1), N, R, R);
    // d(s): what the next block's router handed back through carry, plus the norm's path.
    if (has_next_)
      ATOLL_CUDA_CHECK(cudaMemcpyAsync(s.ds, s.carry, sizeof(float) * NR, cudaMemcpyDeviceToDevice, nullptr));
    else
      zero(s.ds, NR);
    rmsnorm_backward(s.ds, grads + at_.norm, s.d1, s_, rstd_, P(at_.norm), N, R);
    // d(depth_scale), and d(s_prev) = d(s) ⊙ depth_scale into carry for the previous router.
    if (depth_) zaya_depth_backward(grads + at_.depth_scale, s.carry, s.ds, prev_->s_, P(at_.depth_scale), N, R);
    bias_backward(grads + at_.down_b, s.ds, N, R);
    linear_backward(blas, dh, grads + at_.down, s.ds, h, P(at_.down), N, C, R);
    // The loads for bias balancing: each class's share of this batch's slots, scaled as the loss;
    // under context parallelism shares of the whole sequences' tokens, so the group's loads add up
    // to its batch's (as the CPU router).
    const double tokens = c.zigzag ? double(c.B) * c.zigzag->T : double(N);
    zaya_class_loads(grads + at_.biases, choice_, N, E1_, K_, c.loss_scale, tokens);
  }

 private:
  static void zero(float* p, size_t n) { ATOLL_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(float) * n, nullptr)); }

  // Shared by the layers: g a GELU output, d1 and d2 gradients, ds d(s), carry d(s_prev) [N,R];
  // the logits and their gradient [N,E1].
  struct Scratch {
    Scratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve) {
      const size_t N = s.max_tokens, NR = N * m.router_hidden_size, NE1 = N * (m.n_experts + 1);
      g = carve.take<float>(NR), d1 = carve.take<float>(NR), d2 = carve.take<float>(NR);
      ds = carve.take<float>(NR), carry = carve.take<float>(NR);
      logits = carve.take<float>(NE1), dlogits = carve.take<float>(NE1);
    }
    float *g, *d1, *d2, *ds, *carry;  // [N,R]
    float *logits, *dlogits;          // [N,E1]
  };

  int E1_, K_, R_;
  double eps_;
  bool depth_;  // this layer averages over depth (reads prev_)
  ZayaRouterOffsets at_;
  DeviceRouterZaya* prev_ = nullptr;  // the previous block's router, when depth_
  bool has_next_ = false;             // the next block's router reads this one's state
  std::shared_ptr<Scratch> sh_;
  float *s_, *xn_, *a1_, *a2_;   // [N,R] state, its norm, fc1 and fc2 pre-activations
  float *rstd_, *probs_;         // [N], [N,E1] the unbiased probabilities
  int32_t *choice_, *topk_idx_;  // [N,K] the classes (E = skip), the expert ids (skip: kNoExpert)
  float* topk_w_;                // [N,K] the gates
};

}  // namespace

std::unique_ptr<DeviceRouterPart> make_device_router_zaya(const ModelConfig& m, const ParamLayout& layout, int layer,
                                                          const DevicePartSizes& s, DevicePartScratch& scratch,
                                                          Carver& carve) {
  return std::make_unique<DeviceRouterZaya>(m, layout, layer, s, scratch, carve);
}

}  // namespace atl::gpu
