#include "atoll/layers/moe_dispatch.h"

#include <cstddef>
#include <cstring>

#include "atoll/core/check.h"

namespace atl {

void build_routing(ExpertRouting& r, const int32_t* topk_idx, int N, int E, int K) {
  const size_t R = size_t(N) * K;
  r.offsets.assign(E + 1, 0);
  r.slot_row.resize(R);
  for (size_t i = 0; i < R; ++i) {
    ATOLL_CHECK(topk_idx[i] == kNoExpert || (topk_idx[i] >= 0 && topk_idx[i] < E))
        << "expert id " << topk_idx[i] << " outside [0, " << E << ")";
    if (topk_idx[i] != kNoExpert) ++r.offsets[topk_idx[i] + 1];
  }
  for (int e = 0; e < E; ++e) r.offsets[e + 1] += r.offsets[e];
  r.row_token.resize(size_t(r.offsets[E]));
  std::vector<int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (size_t i = 0; i < R; ++i) {
    if (topk_idx[i] == kNoExpert) {
      r.slot_row[i] = -1;
      continue;
    }
    const int32_t row = next[topk_idx[i]]++;
    r.row_token[row] = int32_t(i / K);
    r.slot_row[i] = row;
  }
}

template <typename T>
void dispatch_forward(T* xe, const T* x, const ExpertRouting& r, int, int C, int) {
  const int64_t R = int64_t(r.row_token.size());
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < R; ++row)
    std::memcpy(xe + size_t(row) * C, x + size_t(r.row_token[row]) * C, sizeof(T) * C);
}

template <typename T>
void dispatch_backward(T* dx, const T* dxe, const ExpertRouting& r, int N, int C, int K) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < K; ++j) {
      if (r.slot_row[size_t(n) * K + j] < 0) continue;
      const T* src = dxe + size_t(r.slot_row[size_t(n) * K + j]) * C;
      T* dst = dx + size_t(n) * C;
      for (int c = 0; c < C; ++c) dst[c] += src[c];
    }
}

template <typename T>
void combine_forward(T* out, const T* ye, const T* topk_w, const ExpertRouting& r, int N, int C, int K) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* o = out + size_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = 0;
    for (int j = 0; j < K; ++j) {
      if (r.slot_row[size_t(n) * K + j] < 0) continue;
      const T w = topk_w[size_t(n) * K + j];
      const T* y = ye + size_t(r.slot_row[size_t(n) * K + j]) * C;
      for (int c = 0; c < C; ++c) o[c] += w * y[c];
    }
  }
}

template <typename T>
void combine_backward(T* dye, T* dtopk_w, const T* dout, const T* ye, const T* topk_w, const ExpertRouting& r, int N,
                      int C, int K) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* g = dout + size_t(n) * C;
    for (int j = 0; j < K; ++j) {
      if (r.slot_row[size_t(n) * K + j] < 0) {
        dtopk_w[size_t(n) * K + j] = 0;
        continue;
      }
      const size_t row = size_t(r.slot_row[size_t(n) * K + j]);
      const T w = topk_w[size_t(n) * K + j];
      const T* y = ye + row * C;
      T* dy = dye + row * C;
      T acc = 0;
      for (int c = 0; c < C; ++c) {
        dy[c] = w * g[c];
        acc += g[c] * y[c];
      }
      dtopk_w[size_t(n) * K + j] = acc;
    }
  }
}

#define ATOLL_INSTANTIATE(T)                                                                                     \
  template void dispatch_forward<T>(T*, const T*, const ExpertRouting&, int, int, int);                          \
  template void dispatch_backward<T>(T*, const T*, const ExpertRouting&, int, int, int);                         \
  template void combine_forward<T>(T*, const T*, const T*, const ExpertRouting&, int, int, int);                 \
  template void combine_backward<T>(T*, T*, const T*, const T*, const T*, const ExpertRouting&, int, int, int);
ATOLL_INSTANTIATE(float)
ATOLL_INSTANTIATE(double)
#undef ATOLL_INSTANTIATE

}  // namespace atl
