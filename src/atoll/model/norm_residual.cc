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
  const T *as = c.mm.param(out_scale_), *ab = c.mm.param(out_bias_);
  const T *rs = r ? c.mm.param(res_scale_) : nullptr, *rb = r ? c.mm.param(res_bias_) : nullptr;
  T* ka = a_.data();
  // One pass: keep a (read before out is written, which may alias it) and merge. Memory-bound,
  // so the copy rides in the same sweep rather than its own.
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; ++n) {
    const size_t row = n * C;
    if (r) {
#pragma omp simd
      for (size_t i = 0; i < C; ++i) {
        const T av = a[row + i];
        ka[row + i] = av;
        out[row + i] = (av + ab[i]) * as[i] + (r[row + i] + rb[i]) * rs[i];
      }
    } else {
#pragma omp simd
      for (size_t i = 0; i < C; ++i) {
        const T av = a[row + i];
        ka[row + i] = av;
        out[row + i] = (av + ab[i]) * as[i];
      }
    }
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
  // One sweep over the rows in fixed chunks: each chunk writes d(a) and d(r) and sums its rows'
  // share of the rows' gradients (double); the chunks are then added in order, so the bits do
  // not depend on the thread count. A per-channel sweep down the columns instead reads the
  // [N,C] arrays with a stride of C, twice as much traffic as this.
  const int nsum = stream_ ? 4 : 2, chunks = (N + kMergeRows - 1) / kMergeRows;
  partial_.resize(size_t(chunks) * nsum * C);
  double* part = partial_.data();
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < chunks; ++ch) {
    double* p = part + size_t(ch) * nsum * C;
    std::fill(p, p + size_t(nsum) * C, 0.0);
    const int n_end = std::min(N, (ch + 1) * kMergeRows);
    for (int n = ch * kMergeRows; n < n_end; ++n) {
      const size_t row = size_t(n) * C;
      if (stream_) {
#pragma omp simd
        for (int i = 0; i < C; ++i) {
          const T g = dstream[row + i];
          p[i] += double(g) * double(ka[row + i] + ab[i]);
          p[C + i] += double(g);
          p[2 * C + i] += double(g) * double(r[row + i] + rb[i]);
          p[3 * C + i] += double(g);
          da[row + i] = g * as[i];
          dstream[row + i] = g * rs[i];
        }
      } else {
#pragma omp simd
        for (int i = 0; i < C; ++i) {
          const T g = dstream[row + i];
          p[i] += double(g) * double(ka[row + i] + ab[i]);
          p[C + i] += double(g);
          da[row + i] = g * as[i];
        }
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < C; ++i) {
    double s[4] = {0, 0, 0, 0};
    for (int ch = 0; ch < chunks; ++ch)
      for (int j = 0; j < nsum; ++j) s[j] += part[(size_t(ch) * nsum + j) * C + i];
    das[i] += T(s[0]), dab[i] += T(s[1] * as[i]);
    if (stream_) drs[i] += T(s[2]), drb[i] += T(s[3] * rs[i]);
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
