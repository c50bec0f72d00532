#include "atoll/model/shared_expert.h"

#include <algorithm>
#include <cmath>

#include "atoll/layers/swiglu.h"

namespace atl {

void shared_expert_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  const std::string pre = layer_prefix(layer) + "moe.";
  const int64_t C = m.dim, HS = m.shared_expert_hidden;
  layout.add(matrix_entry(pre + "shared_w1", HS, C, ParamGroup::kExpert, layer));
  layout.add(matrix_entry(pre + "shared_w3", HS, C, ParamGroup::kExpert, layer));
  layout.add(matrix_entry(pre + "shared_w2", C, HS, ParamGroup::kExpert, layer));
  layout.add(matrix_entry(pre + "shared_gate", 1, C, ParamGroup::kRouter, layer));
}

// Backward's gradients: d(y) [N,C], d(g) then d(a) [N,HS], d(b) [N,HS], d(gate logit) [N]; under
// bf16 products the operands rounded to bf16: g [N,HS] and one gradient at a time [N, max(C,HS)].
template <typename T>
struct SharedExpert<T>::Scratch {
  Scratch(const ModelConfig& m, const PartSizes& s) {
    const size_t N = s.max_tokens, C = m.dim, HS = m.shared_expert_hidden;
    dy.resize(N * C), da.resize(N * HS), db.resize(N * HS), dz.resize(N);
    if (s.precision != Precision::kBf16) return;
    g16.resize(N * HS), d16.resize(N * std::max(C, HS)), z16.resize(N);
  }
  std::vector<T> dy, da, db, dz;
  std::vector<bf16> g16, d16, z16;
};

template <typename T>
SharedExpert<T>::SharedExpert(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                              PartScratch& scratch)
    : C_(m.dim), HS_(m.shared_expert_hidden), sh_(scratch.get<Scratch>(m, s)) {
  const std::string pre = layer_prefix(layer) + "moe.";
  w1_ = layout.at(pre + "shared_w1").offset, w3_ = layout.at(pre + "shared_w3").offset;
  w2_ = layout.at(pre + "shared_w2").offset, gate_ = layout.at(pre + "shared_gate").offset;
  const size_t N = s.max_tokens;
  a_.resize(N * HS_), b_.resize(N * HS_), g_.resize(N * HS_), y_.resize(N * C_), s_.resize(N);
}

template <typename T>
void SharedExpert<T>::forward(T* out, Operand<T> in, const PartContext<T>& c) {
  const int N = c.d.N;
  const size_t NH = size_t(N) * HS_;
  c.mm.forward(a_.data(), in, c.mm.weight(w1_), N, C_, HS_);
  c.mm.forward(b_.data(), in, c.mm.weight(w3_), N, C_, HS_);
  swiglu_forward(g_.data(), a_.data(), b_.data(), NH);
  c.mm.forward(y_.data(), c.mm.input(sh_->g16.data(), g_.data(), NH), c.mm.weight(w2_), N, HS_, C_);
  c.mm.forward(s_.data(), in, c.mm.weight(gate_), N, C_, 1);
  for (size_t n = 0; n < size_t(N); ++n) {
    const T s = s_[n] = T(1) / (T(1) + std::exp(-s_[n]));
    for (int i = 0; i < C_; ++i) out[n * C_ + i] += s * y_[n * C_ + i];
  }
}

// The forward in reverse: the gate (d(logit) = <dout, y> s (1 - s)) and d(y) = s dout, then W2s,
// the SwiGLU, W1s and W3s, and the gate's product.
template <typename T>
void SharedExpert<T>::backward(T* dh, const T* dout, Operand<T> in, const PartContext<T>& c) {
  const int N = c.d.N;
  const size_t NH = size_t(N) * HS_;
  T *dy = sh_->dy.data(), *da = sh_->da.data(), *db = sh_->db.data(), *dz = sh_->dz.data();
  bf16* d16 = sh_->d16.data();
  for (size_t n = 0; n < size_t(N); ++n) {
    const T s = s_[n];
    T ds = 0;
    for (int i = 0; i < C_; ++i) ds += dout[n * C_ + i] * y_[n * C_ + i], dy[n * C_ + i] = s * dout[n * C_ + i];
    dz[n] = ds * s * (T(1) - s);
  }
  std::fill(da, da + NH, T(0));
  c.mm.backward(da, c.grads + w2_, c.mm.input(d16, dy, size_t(N) * C_), c.mm.input(sh_->g16.data(), g_.data(), NH),
                c.mm.weight(w2_), N, HS_, C_);
  swiglu_backward(da, db, da, a_.data(), b_.data(), NH);  // d(g) in da becomes d(a)
  c.mm.backward(dh, c.grads + w1_, c.mm.input(d16, da, NH), in, c.mm.weight(w1_), N, C_, HS_);
  c.mm.backward(dh, c.grads + w3_, c.mm.input(d16, db, NH), in, c.mm.weight(w3_), N, C_, HS_);
  c.mm.backward(dh, c.grads + gate_, c.mm.input(sh_->z16.data(), dz, size_t(N)), in, c.mm.weight(gate_), N, C_, 1);
}

template class SharedExpert<float>;
template class SharedExpert<double>;

}  // namespace atl
