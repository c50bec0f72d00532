#include "atoll/model/norm_residual.h"

#include <algorithm>

#include "atoll/core/check.h"
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

void residual_merge_rows(ParamLayout& layout, const ModelConfig& m, const std::string& name, bool with_stream,
                         int layer) {
  if (!m.residual_scaling) return;
  if (!with_stream) {
    layout.add(gain_entry(name + "_scale", m.dim, layer));
    layout.add(bias_entry(name + "_bias", m.dim, layer));
    return;
  }
  layout.add(gain_entry(name + ".out_scale", m.dim, layer));
  layout.add(bias_entry(name + ".out_bias", m.dim, layer));
  layout.add(gain_entry(name + ".res_scale", m.dim, layer));
  layout.add(bias_entry(name + ".res_bias", m.dim, layer));
}

template <typename T>
ResidualMerge<T>::ResidualMerge(const ModelConfig& m, const ParamLayout& layout, const std::string& name,
                                bool with_stream, const PartSizes& s)
    : scaled_(m.residual_scaling), stream_(with_stream) {
  if (!scaled_) return;
  const std::string sep = with_stream ? "." : "_";
  out_scale_ = layout.at(name + sep + (with_stream ? "out_scale" : "scale")).offset;
  out_bias_ = layout.at(name + sep + (with_stream ? "out_bias" : "bias")).offset;
  if (with_stream) res_scale_ = layout.at(name + ".res_scale").offset, res_bias_ = layout.at(name + ".res_bias").offset;
  a_.resize(size_t(s.max_tokens) * m.dim);
}

template <typename T>
void ResidualMerge<T>::forward(T* out, const T* a, const T* r, const PartContext<T>& c) {
  const size_t N = c.d.N, C = c.d.C;
  ATOLL_CHECK_EQ(r != nullptr, stream_) << "a merge with a stream takes one, and only then";
  if (!scaled_) {
    if (r) residual_add(out, a, r, N * C);
    else if (out != a) std::copy(a, a + N * C, out);
    return;
  }
  std::copy(a, a + N * C, a_.data());  // before out, which may alias a
  const T *as = c.mm.param(out_scale_), *ab = c.mm.param(out_bias_);
  const T *rs = r ? c.mm.param(res_scale_) : nullptr, *rb = r ? c.mm.param(res_bias_) : nullptr;
  const T* ka = a_.data();
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; ++n)
    for (size_t i = 0; i < C; ++i) {
      const size_t k = n * C + i;
      T y = (ka[k] + ab[i]) * as[i];
      if (r) y += (r[k] + rb[i]) * rs[i];
      out[k] = y;
    }
}

template <typename T>
const T* ResidualMerge<T>::backward(T* da, T* dstream, const T* r, const PartContext<T>& c) {
  if (!scaled_) return dstream;
  const int N = c.d.N, C = c.d.C;
  const T *as = c.mm.param(out_scale_), *ab = c.mm.param(out_bias_), *ka = a_.data();
  T *das = c.grads + out_scale_, *dab = c.grads + out_bias_;
  const T *rs = stream_ ? c.mm.param(res_scale_) : nullptr, *rb = stream_ ? c.mm.param(res_bias_) : nullptr;
  T *drs = stream_ ? c.grads + res_scale_ : nullptr, *drb = stream_ ? c.grads + res_bias_ : nullptr;
  // The rows' gradients sum over tokens per channel (each thread owns channels: a fixed order).
#pragma omp parallel for schedule(static)
  for (int i = 0; i < C; ++i) {
    double s_as = 0, s_ab = 0, s_rs = 0, s_rb = 0;
    for (int n = 0; n < N; ++n) {
      const size_t k = size_t(n) * C + i;
      const double g = dstream[k];
      s_as += g * (ka[k] + ab[i]), s_ab += g;
      if (stream_) s_rs += g * (r[k] + rb[i]), s_rb += g;
    }
    das[i] += T(s_as), dab[i] += T(s_ab * as[i]);
    if (stream_) drs[i] += T(s_rs), drb[i] += T(s_rb * rs[i]);
  }
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < C; ++i) {
      const size_t k = size_t(n) * C + i;
      da[k] = dstream[k] * as[i];
      if (stream_) dstream[k] *= rs[i];
    }
  return da;
}

template <typename T>
MidResidual<T>::MidResidual(size_t n, const PartSizes& s, PartScratch& scratch)
    : kept_(s.precision == Precision::kFp32),
      buf_(kept_ ? std::make_shared<std::vector<T>>(n) : std::shared_ptr<std::vector<T>>(scratch.get<Shared>(n))) {}

template class RmsNormPart<float>;
template class RmsNormPart<double>;
template class ResidualMerge<float>;
template class ResidualMerge<double>;
template class MidResidual<float>;
template class MidResidual<double>;

}  // namespace atl
