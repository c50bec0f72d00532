// The pre-norm of a sub-layer and the residual around it (DESIGN.md: x += f(rmsnorm(x))):
// RmsNormPart is RMSNorm with a gain [C] (layers/rmsnorm.h); residual_add is the stream's add;
// MidResidual holds the stream between a block's two sub-layers for backward.
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
