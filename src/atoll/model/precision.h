// The precision of the matrix products (train.precision), folded into a few helpers so the
// parts and the model read the same in fp32 and bf16: a product's operands are `Operand`s,
// `Products::input()` rounds an activation to bf16 only under bf16 products,
// `Products::weight()` hands out the bf16 copy of a weight only then, and `Kept` holds a
// tensor kept for backward in the precision its consumers read. The helpers are the only
// code that tests the precision (as DeviceProducts::weight() and input() in model/device_part.cuh).
// Model<double> (the gradient checks) has no bf16 path: its branches compile away.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "atoll/backend/cpu/bf16.h"

namespace atl {

// kBf16: inputs and weights rounded to bf16, products accumulated in fp32 through oneDNN
// (backend/cpu/gemm_bf16.h); parameters, gradients, optimizer state and every other operation
// stay fp32. Model<float> only.
enum class Precision { kFp32, kBf16 };
Precision parse_precision(const std::string& name);  // "fp32" | "bf16"; ConfigError otherwise
const char* precision_name(Precision p);

template <typename T>
inline constexpr bool kHasBf16 = std::is_same_v<T, float>;

// One operand of a matrix product: its values in T, and (bf16 products) in bf16.
template <typename T>
struct Operand {
  const T* f = nullptr;
  const bf16* h = nullptr;
  Operand at(size_t i) const { return {f ? f + i : nullptr, h ? h + i : nullptr}; }  // from element i on
};

// x as rounded to bf16 into out[n] (float), nothing for double.
template <typename T>
inline void round_to_bf16(bf16* out, const T* x, size_t n) {
  if constexpr (kHasBf16<T>) to_bf16(out, x, n);
}

// A tensor kept for backward: in T (fp32 products) or in bf16 (bf16 products; its T values are
// computed in scratch and rounded once by keep()).
template <typename T>
struct Kept {
  std::vector<T> f;
  std::vector<bf16> h;
  void resize(size_t n, Precision p) { p == Precision::kBf16 ? h.resize(n) : f.resize(n); }
  T* values(T* scratch) { return f.empty() ? scratch : f.data(); }  // where forward computes it
  void keep(const T* v, size_t n) {
    if (!h.empty()) round_to_bf16(h.data(), v, n);
  }
  Operand<T> operand() const { return {f.empty() ? nullptr : f.data(), h.empty() ? nullptr : h.data()}; }
};

// The matrix products of one model in its precision, over the flat parameters and (bf16) the
// bf16 copy of the block at hand. Same shapes and (=)/(+=) contracts as layers/linear.h.
template <typename T>
struct Products {
  Precision precision = Precision::kFp32;
  const T* params = nullptr;   // the flat parameters
  const bf16* w16 = nullptr;   // bf16 copy of parameters [w16_begin, ...) (bf16 products)
  size_t w16_begin = 0;

  bool is_bf16() const { return kHasBf16<T> && precision == Precision::kBf16; }
  const T* param(size_t off) const { return params + off; }
  // The weight at flat offset `off` as a product operand.
  Operand<T> weight(size_t off) const { return {params + off, is_bf16() ? w16 + (off - w16_begin) : nullptr}; }
  // x[n] as a product input: itself, and under bf16 products its rounding into buf[n].
  Operand<T> input(bf16* buf, const T* x, size_t n) const {
    if (!is_bf16()) return {x, nullptr};
    round_to_bf16(buf, x, n);
    return {x, buf};
  }
  // out[N,OC] (=) in[N,IC] · w[OC,IC]ᵀ.
  void forward(T* out, Operand<T> in, Operand<T> w, int N, int IC, int OC) const;
  // din[N,IC] (+=) dout · w; dw[OC,IC] (+=) doutᵀ · in. Either output may be null.
  void backward(T* din, T* dw, Operand<T> dout, Operand<T> in, Operand<T> w, int N, int IC, int OC) const;
};

extern template struct Products<float>;
extern template struct Products<double>;

}  // namespace atl
