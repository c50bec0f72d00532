#include "atoll/model/precision.h"

#include "atoll/backend/cpu/linear_bf16.h"
#include "atoll/core/errors.h"
#include "atoll/backend/cpu/linear.h"

namespace atl {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  throw ConfigError(std::string("train.precision = \"").append(name).append("\" is not one of fp32, bf16"));
}

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

template <typename T>
void Products<T>::forward(T* out, Operand<T> in, Operand<T> w, int N, int IC, int OC) const {
  if constexpr (kHasBf16<T>)
    if (is_bf16()) return linear_forward_bf16(out, in.h, w.h, N, IC, OC);
  cpu::linear_forward(out, in.f, w.f, N, IC, OC);
}

template <typename T>
void Products<T>::backward(T* din, T* dw, Operand<T> dout, Operand<T> in, Operand<T> w, int N, int IC, int OC) const {
  if constexpr (kHasBf16<T>)
    if (is_bf16()) return linear_backward_bf16(din, dw, dout.h, in.h, w.h, N, IC, OC);
  cpu::linear_backward(din, dw, dout.f, in.f, w.f, N, IC, OC);
}

template struct Products<float>;
template struct Products<double>;

}  // namespace atl
