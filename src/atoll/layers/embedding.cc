#include "atoll/layers/embedding.h"

#include <cstddef>
#include <cstring>

#include "atoll/core/check.h"

namespace atl {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C, int V) {
  for (int n = 0; n < N; ++n) {
    const int32_t tok = tokens[n];
    ATOLL_CHECK(tok >= 0 && tok < V) << "token id " << tok << " at position " << n << " outside vocabulary of " << V;
    std::memcpy(out + size_t(n) * C, wte + size_t(tok) * C, sizeof(T) * C);
  }
}

template <typename T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C) {
  for (int n = 0; n < N; ++n) {
    T* dst = dwte + size_t(tokens[n]) * C;
    const T* src = dout + size_t(n) * C;
    for (int c = 0; c < C; ++c) dst[c] += src[c];
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int, int, int);
template void embedding_forward<double>(double*, const int32_t*, const double*, int, int, int);
template void embedding_backward<float>(float*, const float*, const int32_t*, int, int);
template void embedding_backward<double>(double*, const double*, const int32_t*, int, int);

}  // namespace atl
