#include "atoll/model/router_topk.h"

#include <cstring>
#include <string>

#include "atoll/backend/cpu/linear.h"
#include "atoll/core/check.h"
#include "atoll/core/collective.h"

namespace atl {
RouterSums router_sums_over_group(const RouterSums& mine, Collective& group) {
  const size_t E = mine.slots.size();
  std::vector<double> flat(mine.slots);
  flat.insert(flat.end(), mine.prob.begin(), mine.prob.end());
  flat.push_back(mine.z), flat.push_back(mine.tokens);
  const std::vector<std::string> all =
      group.allgather(std::string(reinterpret_cast<const char*>(flat.data()), flat.size() * sizeof(double)));
  RouterSums total{.slots = std::vector<double>(E, 0.0), .prob = std::vector<double>(E, 0.0), .z = 0.0, .tokens = 0.0};
  for (const std::string& blob : all) {
    ATOLL_CHECK_EQ(blob.size(), flat.size() * sizeof(double)) << "router sums of another expert count";
    std::memcpy(flat.data(), blob.data(), blob.size());
    const RouterSums part{.slots = std::vector<double>(flat.begin(), flat.begin() + E),
                          .prob = std::vector<double>(flat.begin() + E, flat.begin() + 2 * E),
                          .z = flat[2 * E],
                          .tokens = flat[2 * E + 1]};
    total.add(part);
  }
  return total;
}

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
  if (!c.cp) return router_losses(probs_.data(), lse_.data(), topk_idx_.data(), N, E_, K_, aux_coef_, z_coef_);
  // Context parallelism: the balancing loss is a product of means over the whole batch, so the
  // group adds its sums first; each rank reports 1/P of the batch's losses, so the group's
  // reports add up to them, and its backward takes the batch's shares.
  batch_ = router_sums_over_group(router_sums(probs_.data(), lse_.data(), topk_idx_.data(), N, E_, K_), *c.cp);
  RouterLosses out = router_losses(batch_, K_, aux_coef_, z_coef_);
  out.aux /= c.cp->size(), out.z /= c.cp->size();
  return out;
}

template <typename T>
void RouterTopk<T>::backward(T* dh, const T* dtopk_w, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::router_dispatch));
  const int N = c.d.N, C = c.d.C;
  if (c.cp)
    router_backward(sh_->dlogits.data(), dtopk_w, probs_.data(), lse_.data(), topk_idx_.data(), topk_w_.data(), N,
                    E_, K_, aux_coef_, z_coef_, c.loss_scale, renormalize_, batch_);
  else
    router_backward(sh_->dlogits.data(), dtopk_w, probs_.data(), lse_.data(), topk_idx_.data(), topk_w_.data(), N,
                    E_, K_, aux_coef_, z_coef_, c.loss_scale, renormalize_);
  cpu::linear_backward(dh, c.grads + w_, sh_->dlogits.data(), h, c.mm.param(w_), N, C, E_);
}

template class RouterTopk<float>;
template class RouterTopk<double>;

}  // namespace atl
