#include "atoll/model/router_topk.h"

#include "atoll/backend/cpu/linear.h"

namespace atl {

void router_topk_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  layout.add(matrix_entry(layer_prefix(layer) + "moe.router", m.n_experts, m.dim, ParamGroup::kRouter, layer));
}

template <typename T>
struct RouterTopk<T>::Scratch {
  explicit Scratch(size_t n) : logits(n), dlogits(n) {}
  std::vector<T> logits, dlogits;  // [N,E]
};

template <typename T>
RouterTopk<T>::RouterTopk(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                          PartScratch& scratch)
    : E_(m.n_experts), K_(m.top_k), renormalize_(m.router_renormalize), aux_coef_(m.aux_loss_coef),
      z_coef_(m.z_loss_coef),
      w_(layout.at(layer_prefix(layer) + "moe.router").offset),
      sh_(scratch.get<Scratch>(size_t(s.max_tokens) * m.n_experts)) {
  const size_t N = s.max_tokens;
  probs_.resize(N * E_), lse_.resize(N), topk_idx_.resize(N * K_), topk_w_.resize(N * K_);
}

template <typename T>
RouterLosses RouterTopk<T>::forward(const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::router_dispatch));
  const int N = c.d.N, C = c.d.C;
  cpu::linear_forward(sh_->logits.data(), h, c.mm.param(w_), N, C, E_);
  router_forward(probs_.data(), lse_.data(), topk_idx_.data(), topk_w_.data(), sh_->logits.data(), N, E_, K_,
                 renormalize_);
  return router_losses(probs_.data(), lse_.data(), topk_idx_.data(), N, E_, K_, aux_coef_, z_coef_);
}

template <typename T>
void RouterTopk<T>::backward(T* dh, const T* dtopk_w, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::router_dispatch));
  const int N = c.d.N, C = c.d.C;
  router_backward(sh_->dlogits.data(), dtopk_w, probs_.data(), lse_.data(), topk_idx_.data(), topk_w_.data(), N, E_,
                  K_, aux_coef_, z_coef_, c.loss_scale, renormalize_);
  cpu::linear_backward(dh, c.grads + w_, sh_->dlogits.data(), h, c.mm.param(w_), N, C, E_);
}

template class RouterTopk<float>;
template class RouterTopk<double>;

}  // namespace atl
