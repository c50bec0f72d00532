#include "atoll/model/experts_swiglu.h"

#include <algorithm>

#include "atoll/backend/cpu/expert_mlp.h"
#include "atoll/backend/cpu/expert_mlp_bf16.h"

namespace atl {

void experts_swiglu_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  const std::string pre = layer_prefix(layer) + "moe.";
  const int64_t C = m.dim, E = m.n_experts, H = m.expert_hidden;
  layout.add(stacked_matrices_entry(pre + "w1", E, H, C, ParamGroup::kExpert, layer));
  layout.add(stacked_matrices_entry(pre + "w3", E, H, C, ParamGroup::kExpert, layer));
  layout.add(stacked_matrices_entry(pre + "w2", E, C, H, ParamGroup::kExpert, layer));
  if (m.shared_expert_hidden > 0) shared_expert_rows(layout, m, layer);
}

// wrow/dwrow: each dispatched row's combine weight [R] and its gradient. Under bf16 products:
// the MoE input and d(out) in bf16 [N,C], and one chunk's dispatched rows, d(out) rows [chunk,C],
// gate, d(W3 x) [chunk,H] in bf16, outputs or d(inputs) [chunk,C] in fp32 (`chunk` points at
// them, with d(gate) in the work buffer).
template <typename T>
struct ExpertsSwiglu<T>::Scratch {
  Scratch(const ModelConfig& m, const PartSizes& s, int chunk) {
    const size_t N = s.max_tokens, R = N * m.top_k, C = m.dim, H = m.expert_hidden;
    wrow.resize(R), dwrow.resize(R);
    if (s.precision != Precision::kBf16) return;
    y.resize(chunk * C), x16.resize(chunk * C), dy16.resize(chunk * C), g16.resize(chunk * H), db16.resize(chunk * H);
    in16.resize(N * C), dout16.resize(N * C);
  }
  std::vector<T> wrow, dwrow;
  std::vector<float> y;
  std::vector<bf16> x16, dy16, g16, db16, in16, dout16;
  ExpertChunkBf16 chunk(int rows, float* dg) {
    return {rows, x16.data(), dy16.data(), g16.data(), db16.data(), y.data(), dg};
  }
};

template <typename T>
ExpertsSwiglu<T>::ExpertsSwiglu(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                                PartScratch& scratch)
    : E_(m.n_experts), K_(m.top_k), C_(m.dim), H_(m.expert_hidden) {
  const size_t R = size_t(s.max_tokens) * K_;
  // A chunk of at least R rows holds every expert's rows in one piece, as kChunk does.
  chunk_ = int(std::min<size_t>(kChunk, (R + kExpertRowPad - 1) / kExpertRowPad * kExpertRowPad));
  sh_ = scratch.get<Scratch>(m, s, chunk_);
  const std::string pre = layer_prefix(layer) + "moe.";
  w1_ = layout.at(pre + "w1").offset, w3_ = layout.at(pre + "w3").offset, w2_ = layout.at(pre + "w2").offset;
  if (s.precision == Precision::kBf16) {
    a16_.resize((R + kExpertRowPad) * H_);
  } else {
    a_.resize(R * H_), b_.resize(R * H_);
  }
  if (m.shared_expert_hidden > 0) shared_ = std::make_unique<SharedExpert<T>>(m, layout, layer, s, scratch);
}

template <typename T>
size_t ExpertsSwiglu<T>::work_elements() const {
  return a16_.empty() ? ExpertChunk<T>::elements(chunk_, C_, H_) : size_t(chunk_) * H_;
}

// Each dispatched row's combine weight, from its token's slot.
template <typename T>
void ExpertsSwiglu<T>::set_row_weights(const T* topk_w, int N) {
  const int32_t* slot_row = routing_.slot_row.data();
  T* wrow = sh_->wrow.data();
  for (size_t i = 0; i < size_t(N) * K_; ++i)
    if (slot_row[i] >= 0) wrow[slot_row[i]] = topk_w[i];
}

template <typename T>
void ExpertsSwiglu<T>::forward(T* out, const T* h, const int32_t* topk_idx, const T* topk_w, const PartContext<T>& c) {
  const int N = c.d.N;
  {
    ScopedTimer t(c.timer(&PhaseTimes::router_dispatch));
    build_routing(routing_, topk_idx, N, E_, K_);
    set_row_weights(topk_w, N);
  }
  ScopedTimer t(c.timer(&PhaseTimes::experts));
  const int32_t *row_token = routing_.row_token.data(), *offsets = routing_.offsets.data();
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C_);
  const Operand<T> w1 = c.mm.weight(w1_), w3 = c.mm.weight(w3_), w2 = c.mm.weight(w2_);
  bool done = false;
  if constexpr (kHasBf16<T>)
    if (in.h) {
      expert_mlp_forward_bf16(out, a16_.data(), sh_->chunk(chunk_, c.work), in.h, row_token, sh_->wrow.data(), w1.h,
                              w3.h, w2.h, offsets, N, E_, C_, H_);
      done = true;
    }
  if (!done)
    expert_mlp_forward_fused(out, a_.data(), b_.data(), ExpertChunk<T>::carve(c.work, chunk_, C_, H_), in.f,
                             row_token, sh_->wrow.data(), w1.f, w3.f, w2.f, offsets, N, E_, C_, H_);
  if (shared_) shared_->forward(out, in, c);
}

template <typename T>
void ExpertsSwiglu<T>::backward(T* dh, T* dtopk_w, const T* dout, const T* h, const T* topk_w,
                                const PartContext<T>& c) {
  const int N = c.d.N;
  {
    ScopedTimer t(c.timer(&PhaseTimes::router_dispatch));
    set_row_weights(topk_w, N);  // the weight gradient comes back from the experts' backward
  }
  ScopedTimer t(c.timer(&PhaseTimes::experts));  // d(expert inputs) go straight to their tokens in dh
  const int32_t *row_token = routing_.row_token.data(), *offsets = routing_.offsets.data();
  const Operand<T> in = c.mm.input(sh_->in16.data(), h, size_t(N) * C_);
  const Operand<T> dy = c.mm.input(sh_->dout16.data(), dout, size_t(N) * C_);
  const Operand<T> w1 = c.mm.weight(w1_), w3 = c.mm.weight(w3_), w2 = c.mm.weight(w2_);
  T *dw1 = c.grads + w1_, *dw3 = c.grads + w3_, *dw2 = c.grads + w2_, *dwrow = sh_->dwrow.data();
  bool done = false;
  if constexpr (kHasBf16<T>)
    if (in.h) {
      expert_mlp_backward_bf16(dh, dw1, dw3, dw2, dwrow, sh_->chunk(chunk_, c.work), dy.h, in.h, row_token,
                               sh_->wrow.data(), a16_.data(), w1.h, w3.h, w2.h, offsets, E_, C_, H_);
      done = true;
    }
  if (!done)
    expert_mlp_backward_fused(dh, dw1, dw3, dw2, dwrow, ExpertChunk<T>::carve(c.work, chunk_, C_, H_), dy.f, in.f,
                              row_token, sh_->wrow.data(), a_.data(), b_.data(), w1.f, w3.f, w2.f, offsets, E_, C_,
                              H_);
  const int32_t* slot_row = routing_.slot_row.data();
  for (size_t i = 0; i < size_t(N) * K_; ++i) dtopk_w[i] = slot_row[i] >= 0 ? dwrow[slot_row[i]] : T(0);
  if (shared_) shared_->backward(dh, dout, in, c);
}

template class ExpertsSwiglu<float>;
template class ExpertsSwiglu<double>;

}  // namespace atl
