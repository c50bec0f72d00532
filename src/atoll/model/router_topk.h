// Mixtral's router (layers/router.h): p = softmax(h wᵀ) over E experts, the top K by
// probability with weights renormalised to sum to 1 (model.router_renormalize; else the
// probabilities as they are), plus the Switch load-balancing loss and
// the router z-loss (coefficients model.aux_loss_coef, model.z_loss_coef). Its product stays
// in T under bf16 products too (E columns: cheap, and the choice of experts is sensitive).
// Row "layers.{l}.moe.router" [E,C]; keeps probabilities, log-sum-exps and the choice.
#pragma once

#include <memory>
#include <vector>

#include "atoll/model/part.h"

namespace atl {

void router_topk_rows(ParamLayout& layout, const ModelConfig& m, int layer);

// Context parallelism: the group's total of every rank's router sums, added in rank order in
// double on every rank (an all-gather of 2E+2 doubles), so every rank holds the same bits. The
// CPU router and its device mirror (router_topk.cu) both take their losses from it.
RouterSums router_sums_over_group(const RouterSums& mine, Collective& group);

template <typename T>
class RouterTopk final : public RouterPart<T> {
 public:
  RouterTopk(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch);
  size_t work_elements() const override { return 0; }
  RouterLosses forward(const T* h, const PartContext<T>& c) override;
  const int32_t* topk_idx() const override { return topk_idx_.data(); }
  const T* topk_w() const override { return topk_w_.data(); }
  void backward(T* dh, const T* dtopk_w, const T* h, const PartContext<T>& c) override;

 private:
  struct Scratch;  // shared by the layers: the logits and their gradient
  int E_, K_;
  bool renormalize_;
  double aux_coef_, z_coef_;
  size_t w_;
  std::shared_ptr<Scratch> sh_;
  std::vector<T> probs_, lse_;      // [N,E], [N]
  std::vector<int32_t> topk_idx_;   // [N,K]
  std::vector<T> topk_w_;           // [N,K]
  RouterSums batch_;                // context parallelism: the group's sums of the last forward
};

}  // namespace atl
