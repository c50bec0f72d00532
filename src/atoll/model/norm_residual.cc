#include "atoll/model/norm_residual.h"

#include "atoll/layers/rmsnorm.h"

namespace atl {

void rmsnorm_rows(ParamLayout& layout, const ModelConfig& m, const std::string& name, int layer) {
  layout.add(gain_entry(name, m.dim, layer));
}

template <typename T>
RmsNormPart<T>::RmsNormPart(const ModelConfig& m, const ParamLayout& layout, const std::string& name,
                            const PartSizes& s)
    : gain_(layout.at(name).offset), eps_(m.norm_eps), rstd_(size_t(s.max_tokens)) {}

template <typename T>
void RmsNormPart<T>::forward(T* out, const T* x, const PartContext<T>& c) {
  rmsnorm_forward(out, rstd_.data(), x, c.mm.param(gain_), c.d.N, c.d.C, eps_);
}

template <typename T>
void RmsNormPart<T>::backward(T* dx, const T* dout, const T* x, const PartContext<T>& c) {
  rmsnorm_backward(dx, c.grads + gain_, dout, x, rstd_.data(), c.mm.param(gain_), c.d.N, c.d.C);
}

template <typename T>
MidResidual<T>::MidResidual(size_t n, const PartSizes& s, PartScratch& scratch)
    : kept_(s.precision == Precision::kFp32),
      buf_(kept_ ? std::make_shared<std::vector<T>>(n) : std::shared_ptr<std::vector<T>>(scratch.get<Shared>(n))) {}

template class RmsNormPart<float>;
template class RmsNormPart<double>;
template class MidResidual<float>;
template class MidResidual<double>;

}  // namespace atl
