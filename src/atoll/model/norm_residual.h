// The pre-norm of a sub-layer and the residual around it (DESIGN.md: x += f(rmsnorm(x))):
// RmsNormPart is RMSNorm with a gain [C] (layers/rmsnorm.h); residual_add is the stream's add;
// ResidualMerge is where a sub-layer's output joins the stream (the add, or ZAYA1's residual
// scaling); MidResidual holds the stream between a block's two sub-layers for backward.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "atoll/model/part.h"

namespace atl {

// One norm row: the gain `name` [C], ones at init.
void rmsnorm_rows(ParamLayout& layout, const ModelConfig& m, const std::string& name, int layer);

template <typename T>
class RmsNormPart {
 public:
  RmsNormPart(const ModelConfig& m, const ParamLayout& layout, const std::string& name, const PartSizes& s);
  // out[N,C] (=) rmsnorm(x) * gain; keeps rstd [N]. Backward needs out again: the block
  // recomputes it by calling forward (N*C per norm not kept). Decoding: forward on one token.
  void forward(T* out, const T* x, const PartContext<T>& c);
  // dx[N,C] (+=), d(gain) (+=) from dout[N,C]; x as in forward.
  void backward(T* dx, const T* dout, const T* x, const PartContext<T>& c);

 private:
  size_t gain_;
  double eps_;
  std::vector<T> rstd_;  // [N]
};

// out = a + b over n elements (out may be a), split over the threads.
template <typename T>
void residual_add(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Where a sub-layer's output a[N,C] joins the stream r[N,C]. Plain: out = a + r (no rows).
// With model.residual_scaling (ZAYA1; transformers' ZayaResidualScaling, bias before scale):
//   out = (a + a_bias) ⊙ a_scale + (r + r_bias) ⊙ r_scale        per channel [C]
// rows "{name}.{out_scale,out_bias,res_scale,res_bias}", scales 1 and biases 0 at init (the
// identity). Without a stream (after the embedding: rows "{name}_scale", "{name}_bias") it is
// out = (a + a_bias) ⊙ a_scale, or nothing at all when not scaled.
void residual_merge_rows(ParamLayout& layout, const ModelConfig& m, const std::string& name, bool with_stream,
                         int layer);

template <typename T>
class ResidualMerge {
 public:
  ResidualMerge(const ModelConfig& m, const ParamLayout& layout, const std::string& name, bool with_stream,
                const PartSizes& s);
  bool scaled() const { return scaled_; }
  // out[N,C] (=) from a[N,C] and r[N,C] (null without a stream); out may alias a or r. Keeps a
  // when scaled: the scales' gradients need it.
  void forward(T* out, const T* a, const T* r, const PartContext<T>& c);
  // On entry dstream[N,C] holds d(out); on exit d(r) = d(out) ⊙ r_scale (in place). d(a) is
  // written to da[N,C] (=) and returned, or, plain, d(a) = d(out) and dstream is returned as it
  // is. The rows' gradients (+=); r as in forward.
  const T* backward(T* da, T* dstream, const T* r, const PartContext<T>& c);

 private:
  bool scaled_, stream_;
  size_t out_scale_ = 0, out_bias_ = 0, res_scale_ = 0, res_bias_ = 0;
  static constexpr int kMergeRows = 64;  // rows per chunk of backward's sums
  std::vector<T> a_;                      // [N,C] the sub-layer's output (scaled only)
  std::vector<double> partial_;           // [chunks, 4, C] backward's per-chunk sums
};

// The residual stream between a block's sub-layers, xmid = x + attention(h1), which the MoE
// half reads in forward and again in backward. Kept per block with fp32 products; with bf16
// products (the memory-lean mode) one buffer serves every block and backward recomputes it
// from the attention's kept output (one product per block instead of N*C values kept).
template <typename T>
class MidResidual {
 public:
  MidResidual(size_t n, const PartSizes& s, PartScratch& scratch);
  T* data() { return buf_->data(); }
  bool kept() const { return kept_; }

 private:
  struct Shared : std::vector<T> {
    explicit Shared(size_t n) : std::vector<T>(n) {}
  };
  bool kept_;
  std::shared_ptr<std::vector<T>> buf_;
};

}  // namespace atl
