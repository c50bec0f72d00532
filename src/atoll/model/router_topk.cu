// The device side of model/router_topk.h: Mixtral's top-K router over backend/cuda/router.h. Its
// product stays fp32 under bf16 products too, as on the CPU. Keeps probabilities, log-sum-exps
// and the choice per layer; the logits, their gradient and the losses' scratch are shared.
// Under context parallelism the losses are the batch's: each rank's sums (slots and
// probabilities per expert, Σ lse²) come to the host, the group adds them
// (router_sums_over_group, the CPU router's own), and the losses and the backward's slot shares
// are taken from the total, as RouterTopk does on the CPU.
#include <vector>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/router.h"
#include "atoll/model/device_part.cuh"
#include "atoll/model/router_topk.h"

namespace atl::gpu {
namespace {

class DeviceRouterTopk final : public DeviceRouterPart {
 public:
  DeviceRouterTopk(const ModelConfig& m, const ParamLayout& layout, int layer, const DevicePartSizes& s,
                   DevicePartScratch& scratch, Carver& carve)
      : E_(m.n_experts), K_(m.top_k), aux_coef_(m.aux_loss_coef), z_coef_(m.z_loss_coef),
        w_(layout.at(layer_prefix(layer) + "moe.router").offset), sh_(scratch.get<Scratch>(m, s, carve)) {
    const size_t N = s.max_tokens;
    probs_ = carve.take<float>(N * E_), lse_ = carve.take<float>(N);
    topk_idx_ = carve.take<int32_t>(N * K_), topk_w_ = carve.take<float>(N * K_);
  }

  void forward(double* losses, const float* h, const DeviceContext& c) override {
    const int N = c.d.N, C = c.d.C;
    linear_forward(*c.mm.blas, sh_->logits, h, c.mm.param(w_), N, C, E_);  // fp32 in both modes, as the CPU
    router_forward(probs_, lse_, topk_idx_, topk_w_, sh_->logits, N, E_, K_);
    if (!c.cp) return router_losses(losses, probs_, lse_, topk_idx_, N, E_, K_, aux_coef_, z_coef_, sh_->loss_scratch);
    // Each rank reports 1/P of the batch's losses, so the group's reports add up to them.
    batch_ = router_sums_over_group(rank_sums(N), *c.cp);
    const RouterLosses mine = atl::router_losses(batch_, K_, aux_coef_, z_coef_);
    const double out[2] = {mine.aux / c.cp->size(), mine.z / c.cp->size()};
    copy_to_device(losses, out, sizeof out);
  }
  const int32_t* topk_idx() const override { return topk_idx_; }
  const float* topk_w() const override { return topk_w_; }

  void backward(float* dh, const float* dtopk_w, const float* h, const DeviceContext& c) override {
    const int N = c.d.N, C = c.d.C;
    if (c.cp) {  // the batch's slot shares (integers, exact as int32) and token count
      std::vector<int32_t> counts(batch_.slots.begin(), batch_.slots.end());
      copy_to_device(sh_->counts, counts.data(), sizeof(int32_t) * counts.size());
      router_backward_batch(sh_->dlogits, dtopk_w, probs_, lse_, topk_idx_, topk_w_, N, E_, K_, aux_coef_, z_coef_,
                            c.loss_scale, sh_->counts, batch_.tokens);
    } else {
      router_backward(sh_->dlogits, dtopk_w, probs_, lse_, topk_idx_, topk_w_, N, E_, K_, aux_coef_, z_coef_,
                      c.loss_scale, sh_->counts);
    }
    linear_backward(*c.mm.blas, dh, c.grads + w_, sh_->dlogits, h, c.mm.param(w_), N, C, E_);
  }

 private:
  // This rank's sums over its N tokens (layers/router.h's RouterSums), read back from the device.
  RouterSums rank_sums(int N) {
    std::vector<double> flat(2 * size_t(E_) + 1);
    router_sums(sh_->sums, probs_, lse_, topk_idx_, N, E_, K_, sh_->loss_scratch);
    copy_to_host(flat.data(), sh_->sums, sizeof(double) * flat.size());
    return {.slots = std::vector<double>(flat.begin(), flat.begin() + E_),
            .prob = std::vector<double>(flat.begin() + E_, flat.begin() + 2 * E_),
            .z = flat[2 * size_t(E_)],
            .tokens = double(N)};
  }

  // Shared by the layers.
  struct Scratch {
    Scratch(const ModelConfig& m, const DevicePartSizes& s, Carver& carve) {
      const size_t N = s.max_tokens, E = m.n_experts;
      logits = carve.take<float>(N * E), dlogits = carve.take<float>(N * E);
      counts = carve.take<int32_t>(E);
      loss_scratch = carve.take<double>(size_t(router_losses_scratch_doubles(int(E))));
      sums = carve.take<double>(2 * E + 1);
    }
    float *logits, *dlogits;  // [N,E]
    int32_t* counts;          // [E] router_backward's scratch; under context parallelism the batch's slots
    double* loss_scratch;     // router_losses_scratch_doubles(E)
    double* sums;             // [2E+1] a rank's router_sums (context parallelism)
  };

  int E_, K_;
  double aux_coef_, z_coef_;
  size_t w_;
  std::shared_ptr<Scratch> sh_;
  float *probs_, *lse_;  // [N,E], [N]
  int32_t* topk_idx_;    // [N,K]
  float* topk_w_;        // [N,K]
  RouterSums batch_;     // context parallelism: the group's sums of the last forward
};

}  // namespace

std::unique_ptr<DeviceRouterPart> make_device_router_topk(const ModelConfig& m, const ParamLayout& layout, int layer,
                                                          const DevicePartSizes& s, DevicePartScratch& scratch,
                                                          Carver& carve) {
  return std::make_unique<DeviceRouterTopk>(m, layout, layer, s, scratch, carve);
}

}  // namespace atl::gpu
