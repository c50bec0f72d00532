#include "atoll/model/router_zaya.h"

#include <algorithm>

#include "atoll/backend/cpu/linear.h"
#include "atoll/core/check.h"
#include "atoll/layers/gelu.h"
#include "atoll/layers/moe_dispatch.h"
#include "atoll/layers/rmsnorm.h"
#include "atoll/layers/router_zaya.h"
#include "atoll/model/ring_attention.h"

namespace atl {
namespace {

std::string gate_prefix(int layer) { return layer_prefix(layer) + "moe.gate."; }

// out[N,OC] += b[OC] on every row.
template <typename T>
void add_bias(T* out, const T* b, int N, int OC) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) out[size_t(n) * OC + o] += b[o];
}

// db[OC] (+=) the column sums of dout[N,OC]: each thread owns columns, so the order is fixed.
template <typename T>
void bias_grad(T* db, const T* dout, int N, int OC) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; ++o) {
    double s = 0;
    for (int n = 0; n < N; ++n) s += dout[size_t(n) * OC + o];
    db[o] += T(s);
  }
}

}  // namespace

bool zaya_depth_averaging(const ModelConfig& m, int layer) {
  return layer > 0 && m.router_at(layer) == "zaya" && m.router_at(layer - 1) == "zaya";
}

void router_zaya_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  const std::string pre = gate_prefix(layer);
  const int64_t C = m.dim, R = m.router_hidden_size, E1 = m.n_experts + 1;
  layout.add(matrix_entry(pre + "down", R, C, ParamGroup::kRouter, layer));
  layout.add(bias_entry(pre + "down_bias", R, layer));
  if (zaya_depth_averaging(m, layer)) layout.add(gain_entry(pre + "depth_scale", R, layer));
  layout.add(gain_entry(pre + "norm", R, layer));
  layout.add(matrix_entry(pre + "fc1", R, R, ParamGroup::kRouter, layer));
  layout.add(bias_entry(pre + "fc1_bias", R, layer));
  layout.add(matrix_entry(pre + "fc2", R, R, ParamGroup::kRouter, layer));
  layout.add(bias_entry(pre + "fc2_bias", R, layer));
  layout.add(matrix_entry(pre + "out", E1, R, ParamGroup::kRouter, layer));
  ParamEntry biases = bias_entry(pre + "balancing_biases", E1, layer);
  biases.group = ParamGroup::kRouter, biases.trainable = false, biases.balanced = true;
  biases.init = ParamInit::kBalancingBiases;
  layout.add(std::move(biases));
}

ZayaRouterOffsets zaya_router_offsets(const ModelConfig& m, const ParamLayout& layout, int layer) {
  const std::string pre = gate_prefix(layer);
  auto at = [&](const char* name) { return layout.at(pre + name).offset; };
  ZayaRouterOffsets o{.down = at("down"), .down_b = at("down_bias"), .norm = at("norm"), .fc1 = at("fc1"),
                      .fc1_b = at("fc1_bias"), .fc2 = at("fc2"), .fc2_b = at("fc2_bias"), .out = at("out"),
                      .biases = at("balancing_biases")};
  if (zaya_depth_averaging(m, layer)) o.depth_scale = at("depth_scale");
  return o;
}

// g: a GELU output [N,R]; d1, d2: gradients [N,R]; ds: d(s) [N,R]; carry: d(s_prev) [N,R], from
// one router's backward to the previous router's; logits and their gradient [N,E1].
template <typename T>
struct RouterZaya<T>::Scratch {
  Scratch(size_t NR, size_t NE1) : g(NR), d1(NR), d2(NR), ds(NR), carry(NR), logits(NE1), dlogits(NE1) {}
  std::vector<T> g, d1, d2, ds, carry, logits, dlogits;
};

template <typename T>
RouterZaya<T>::RouterZaya(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                          PartScratch& scratch)
    : E1_(m.n_experts + 1), K_(m.top_k), R_(m.router_hidden_size), eps_(m.norm_eps),
      depth_(zaya_depth_averaging(m, layer)) {
  at_ = zaya_router_offsets(m, layout, layer);
  const size_t N = s.max_tokens, NR = N * R_;
  sh_ = scratch.get<Scratch>(NR, N * E1_);
  s_.resize(NR), xn_.resize(NR), a1_.resize(NR), a2_.resize(NR), rstd_.resize(N), probs_.resize(N * E1_);
  choice_.resize(N * K_), topk_idx_.resize(N * K_), topk_w_.resize(N * K_);
}

template <typename T>
void RouterZaya<T>::link_previous(RouterPart<T>& prev) {
  auto* p = dynamic_cast<RouterZaya*>(&prev);
  ATOLL_CHECK_EQ(p != nullptr, depth_) << "a zaya router averages over depth exactly when the previous one is zaya";
  if (!p) return;
  ATOLL_CHECK_EQ(p->R_, R_);
  prev_ = p, p->has_next_ = true;
}

template <typename T>
RouterLosses RouterZaya<T>::forward(const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::router_dispatch));
  const int N = c.d.N, C = c.d.C, R = R_;
  const size_t NR = size_t(N) * R;
  auto P = [&](size_t off) { return c.mm.param(off); };
  T *s = s_.data(), *g = sh_->g.data();
  cpu::linear_forward(s, h, P(at_.down), N, C, R);
  add_bias(s, P(at_.down_b), N, R);
  if (depth_) {
    ATOLL_CHECK(prev_ != nullptr) << "zaya router with depth averaging not linked to the previous block's";
    const T *sp = prev_->s_.data(), *scale = P(at_.depth_scale);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n)
      for (int r = 0; r < R; ++r) s[size_t(n) * R + r] += sp[size_t(n) * R + r] * scale[r];
  }
  rmsnorm_forward(xn_.data(), rstd_.data(), s, P(at_.norm), N, R, eps_);
  cpu::linear_forward(a1_.data(), xn_.data(), P(at_.fc1), N, R, R);
  add_bias(a1_.data(), P(at_.fc1_b), N, R);
  gelu_forward(g, a1_.data(), NR);
  cpu::linear_forward(a2_.data(), g, P(at_.fc2), N, R, R);
  add_bias(a2_.data(), P(at_.fc2_b), N, R);
  gelu_forward(g, a2_.data(), NR);
  cpu::linear_forward(sh_->logits.data(), g, P(at_.out), N, R, E1_);
  zaya_route_forward(probs_.data(), choice_.data(), topk_w_.data(), sh_->logits.data(), P(at_.biases), N, E1_, K_);
  // The skip class reaches no expert: the experts compute nothing for it and add 0.
  for (size_t i = 0; i < size_t(N) * K_; ++i) topk_idx_[i] = choice_[i] == E1_ - 1 ? kNoExpert : choice_[i];
  return {};
}

// The forward in reverse; the GELU outputs are recomputed from the kept pre-activations.
template <typename T>
void RouterZaya<T>::backward(T* dh, const T* dtopk_w, const T* h, const PartContext<T>& c) {
  ScopedTimer t(c.timer(&PhaseTimes::router_dispatch));
  const int N = c.d.N, C = c.d.C, R = R_;
  const size_t NR = size_t(N) * R;
  auto P = [&](size_t off) { return c.mm.param(off); };
  T *g = sh_->g.data(), *d1 = sh_->d1.data(), *d2 = sh_->d2.data(), *ds = sh_->ds.data();
  T* carry = sh_->carry.data();
  zaya_route_backward(sh_->dlogits.data(), dtopk_w, probs_.data(), choice_.data(), N, E1_, K_);
  gelu_forward(g, a2_.data(), NR);
  std::fill(d1, d1 + NR, T(0));
  cpu::linear_backward(d1, c.grads + at_.out, sh_->dlogits.data(), g, P(at_.out), N, R, E1_);
  gelu_backward(d1, d1, a2_.data(), NR);
  bias_grad(c.grads + at_.fc2_b, d1, N, R);
  gelu_forward(g, a1_.data(), NR);
  std::fill(d2, d2 + NR, T(0));
  cpu::linear_backward(d2, c.grads + at_.fc2, d1, g, P(at_.fc2), N, R, R);
  gelu_backward(d2, d2, a1_.data(), NR);
  bias_grad(c.grads + at_.fc1_b, d2, N, R);
  std::fill(d1, d1 + NR, T(0));
  cpu::linear_backward(d1, c.grads + at_.fc1, d2, xn_.data(), P(at_.fc1), N, R, R);
  // d(s): what the next block's router handed back through carry, plus the norm's path.
  if (has_next_) std::copy(carry, carry + NR, ds);
  else std::fill(ds, ds + NR, T(0));
  rmsnorm_backward(ds, c.grads + at_.norm, d1, s_.data(), rstd_.data(), P(at_.norm), N, R);
  if (depth_) {  // d(depth_scale) and d(s_prev) = d(s) ⊙ depth_scale for the previous router
    const T *sp = prev_->s_.data(), *scale = P(at_.depth_scale);
    T* dscale = c.grads + at_.depth_scale;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; ++r) {
      double acc = 0;
      for (int n = 0; n < N; ++n) acc += double(ds[size_t(n) * R + r]) * sp[size_t(n) * R + r];
      dscale[r] += T(acc);
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n)
      for (int r = 0; r < R; ++r) carry[size_t(n) * R + r] = ds[size_t(n) * R + r] * scale[r];
  }
  bias_grad(c.grads + at_.down_b, ds, N, R);
  cpu::linear_backward(dh, c.grads + at_.down, ds, h, P(at_.down), N, C, R);
  // The loads for bias balancing: each class's share of this batch's slots, scaled as the loss.
  std::vector<int64_t> counts(E1_);
  zaya_class_counts(counts.data(), choice_.data(), N, E1_, K_);
  // Under context parallelism shares of the whole sequences' tokens, so the group's loads add up
  // to its batch's.
  const double tokens = c.zigzag ? double(c.B) * c.zigzag->T : double(N);
  for (int e = 0; e < E1_; ++e) c.grads[at_.biases + e] += T(c.loss_scale * double(counts[e]) / (tokens * K_));
}

template class RouterZaya<float>;
template class RouterZaya<double>;

}  // namespace atl
