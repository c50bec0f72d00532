#include "atoll/backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "atoll/backend/cpu/gemm.h"
#include "atoll/backend/cpu/gemm_bf16.h"
#include "atoll/core/vector_math.h"

namespace atl {
namespace {

constexpr int kBlock = 64;  // query rows per tile

// Strided views of one head: row t of head h of sequence b in a [B,T,heads,HD] tensor.
struct HeadView {
  size_t base, ld;  // element offset of row 0, elements between rows
};
inline HeadView head(int b, int h, int T_, int heads, int HD) {
  return {(size_t(b) * T_ * heads + h) * HD, size_t(heads) * HD};
}

// s[r, 0..n) = scale * q_r · k_s for the rows of a query block, causally masked, then
// turned into probabilities exp(s − lse_r). When `lse_in` is null the softmax is computed and
// its log-sum-exp written to lse_out; otherwise the saved one is used (backward).
template <typename T>
void block_probs(T* s, int rows, int n, int t0, const T* qb, size_t ldq, const T* k0, size_t ldk, int HD, T scale,
                 const T* lse_in, T* lse_out);

// The softmax part of block_probs on scores already in s.
template <typename T>
void block_softmax(T* s, int rows, int n, int t0, const T* lse_in, T* lse_out) {
  for (int r = 0; r < rows; ++r) {
    T* row = s + size_t(r) * n;
    const int valid = t0 + r + 1;  // keys 0..t0+r
    T l;
    if (lse_in) {
      l = lse_in[r];
    } else {
      T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
      for (int j = 0; j < valid; ++j) m = std::max(m, row[j]);
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < valid; ++j) sum += std::exp(row[j] - m);
      l = m + std::log(sum);
      lse_out[r] = l;
    }
#pragma omp simd
    for (int j = 0; j < valid; ++j) row[j] = std::exp(row[j] - l);
    for (int j = valid; j < n; ++j) row[j] = 0;
  }
}

template <typename T>
void block_probs(T* s, int rows, int n, int t0, const T* qb, size_t ldq, const T* k0, size_t ldk, int HD, T scale,
                 const T* lse_in, T* lse_out) {
  gemm<T>(false, true, rows, n, HD, scale, qb, int(ldq), k0, int(ldk), T(0), s, n);
  block_softmax(s, rows, n, t0, lse_in, lse_out);
}

inline float widen(bf16 x) { return bf16_to_float(x); }
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }

// The softmax backward of a query block, shared by the fp32 and bf16 paths: with dp = dO Vᵀ on
// entry, dp (=) dS = P ∘ (dP − D) · scale, where D_r = dO_r · O_r. out and dob point at the
// block's first row of O and dO (leading dimension ld), in the stored type In.
template <typename T, typename In>
void block_dscores(T* dp, const T* p, T* D, const In* out, const In* dob, size_t ld, int rows, int n, int HD,
                   T scale) {
  for (int r = 0; r < rows; ++r) {
    const In* o = out + r * ld;
    const In* g = dob + r * ld;
    T acc = 0;
    for (int d = 0; d < HD; ++d) acc += T(widen(g[d])) * T(widen(o[d]));
    D[r] = acc;
  }
  for (int r = 0; r < rows; ++r) {
    T* dr = dp + size_t(r) * n;
    const T* pr = p + size_t(r) * n;
#pragma omp simd
    for (int j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - D[r]) * scale;
  }
}

}  // namespace

template <typename T>
void attention_forward_blocked(T* out, T* lse, const T* q, const T* k, const T* v, int B, int T_, int NH, int NKV,
                               int HD) {
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int group = NH / NKV, n_blocks = (T_ + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<T> s(size_t(kBlock) * T_);
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int blk = 0; blk < n_blocks; ++blk) {
          const int t0 = blk * kBlock, rows = std::min(kBlock, T_ - t0), n = t0 + rows;
          const HeadView hq = head(b, h, T_, NH, HD), hk = head(b, h / group, T_, NKV, HD);
          block_probs(s.data(), rows, n, t0, q + hq.base + t0 * hq.ld, hq.ld, k + hk.base, hk.ld, HD, scale,
                      static_cast<const T*>(nullptr), lse + (size_t(b) * NH + h) * T_ + t0);
          gemm<T>(false, false, rows, HD, n, T(1), s.data(), n, v + hk.base, int(hk.ld), T(0),
                  out + hq.base + t0 * hq.ld, int(hq.ld));
        }
  }
}

template <typename T>
void attention_backward_blocked(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                                const T* k, const T* v, int B, int T_, int NH, int NKV, int HD) {
  const T scale = T(1.0 / std::sqrt(double(HD)));
  const int group = NH / NKV, n_blocks = (T_ + kBlock - 1) / kBlock;
  // Each (b, kv head) owns its dk/dv rows and the dq rows of its query heads: no races.
#pragma omp parallel
  {
    std::vector<T> p(size_t(kBlock) * T_), dp(size_t(kBlock) * T_), D(kBlock);
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; ++b)
      for (int kh = 0; kh < NKV; ++kh) {
        const HeadView hk = head(b, kh, T_, NKV, HD);
        for (int t = 0; t < T_; ++t)
          for (int d = 0; d < HD; ++d) dk[hk.base + t * hk.ld + d] = dv[hk.base + t * hk.ld + d] = 0;
        for (int h = kh * group; h < (kh + 1) * group; ++h)
          for (int blk = 0; blk < n_blocks; ++blk) {
            const int t0 = blk * kBlock, rows = std::min(kBlock, T_ - t0), n = t0 + rows;
            const HeadView hq = head(b, h, T_, NH, HD);
            const T* qb = q + hq.base + t0 * hq.ld;
            const T* dob = dout + hq.base + t0 * hq.ld;
            block_probs(p.data(), rows, n, t0, qb, hq.ld, k + hk.base, hk.ld, HD, scale,
                        lse + (size_t(b) * NH + h) * T_ + t0, static_cast<T*>(nullptr));
            // dP = dO Vᵀ, then dS (block_dscores).
            gemm<T>(false, true, rows, n, HD, T(1), dob, int(hq.ld), v + hk.base, int(hk.ld), T(0), dp.data(), n);
            block_dscores(dp.data(), p.data(), D.data(), out + hq.base + t0 * hq.ld, dob, hq.ld, rows, n, HD, scale);
            gemm<T>(false, false, rows, HD, n, T(1), dp.data(), n, k + hk.base, int(hk.ld), T(0),
                    dq + hq.base + t0 * hq.ld, int(hq.ld));                                              // dQ = dS K
            gemm<T>(true, false, n, HD, rows, T(1), dp.data(), n, qb, int(hq.ld), T(1), dk + hk.base, int(hk.ld));  // dK += dSᵀ Q
            gemm<T>(true, false, n, HD, rows, T(1), p.data(), n, dob, int(hq.ld), T(1), dv + hk.base, int(hk.ld));  // dV += Pᵀ dO
          }
      }
  }
}

void attention_forward_blocked_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T_,
                                    int NH, int NKV, int HD) {
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const int group = NH / NKV, n_blocks = (T_ + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<float> s(size_t(kBlock) * T_);
    std::vector<bf16> p16(size_t(kBlock) * T_);
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int blk = 0; blk < n_blocks; ++blk) {
          const int t0 = blk * kBlock, rows = std::min(kBlock, T_ - t0), n = t0 + rows;
          const HeadView hq = head(b, h, T_, NH, HD), hk = head(b, h / group, T_, NKV, HD);
          gemm_bf16(false, true, rows, n, HD, scale, q + hq.base + t0 * hq.ld, int(hq.ld), k + hk.base, int(hk.ld),
                    0.0f, s.data(), n);
          block_softmax(s.data(), rows, n, t0, static_cast<const float*>(nullptr), lse + (size_t(b) * NH + h) * T_ + t0);
          to_bf16(p16.data(), s.data(), size_t(rows) * n);
          gemm_bf16_out(false, false, rows, HD, n, 1.0f, p16.data(), n, v + hk.base, int(hk.ld),
                        out + hq.base + t0 * hq.ld, int(hq.ld));
        }
  }
}

void attention_backward_blocked_bf16(float* dq, float* dk, float* dv, const bf16* dout, const bf16* out,
                                     const float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T_,
                                     int NH, int NKV, int HD) {
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const int group = NH / NKV, n_blocks = (T_ + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<float> p(size_t(kBlock) * T_), dp(size_t(kBlock) * T_), D(kBlock);
    std::vector<bf16> p16(size_t(kBlock) * T_), ds16(size_t(kBlock) * T_);
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; ++b)
      for (int kh = 0; kh < NKV; ++kh) {
        const HeadView hk = head(b, kh, T_, NKV, HD);
        for (int t = 0; t < T_; ++t)
          for (int d = 0; d < HD; ++d) dk[hk.base + t * hk.ld + d] = dv[hk.base + t * hk.ld + d] = 0;
        for (int h = kh * group; h < (kh + 1) * group; ++h)
          for (int blk = 0; blk < n_blocks; ++blk) {
            const int t0 = blk * kBlock, rows = std::min(kBlock, T_ - t0), n = t0 + rows;
            const HeadView hq = head(b, h, T_, NH, HD);
            const bf16* qb = q + hq.base + t0 * hq.ld;
            const bf16* dob = dout + hq.base + t0 * hq.ld;
            gemm_bf16(false, true, rows, n, HD, scale, qb, int(hq.ld), k + hk.base, int(hk.ld), 0.0f, p.data(), n);
            block_softmax(p.data(), rows, n, t0, lse + (size_t(b) * NH + h) * T_ + t0, static_cast<float*>(nullptr));
            // dP = dO Vᵀ, then dS (block_dscores).
            gemm_bf16(false, true, rows, n, HD, 1.0f, dob, int(hq.ld), v + hk.base, int(hk.ld), 0.0f, dp.data(), n);
            block_dscores(dp.data(), p.data(), D.data(), out + hq.base + t0 * hq.ld, dob, hq.ld, rows, n, HD, scale);
            to_bf16(ds16.data(), dp.data(), size_t(rows) * n);
            to_bf16(p16.data(), p.data(), size_t(rows) * n);
            gemm_bf16(false, false, rows, HD, n, 1.0f, ds16.data(), n, k + hk.base, int(hk.ld), 0.0f,
                      dq + hq.base + t0 * hq.ld, int(hq.ld));                                                     // dQ = dS K
            gemm_bf16(true, false, n, HD, rows, 1.0f, ds16.data(), n, qb, int(hq.ld), 1.0f, dk + hk.base, int(hk.ld));  // dK += dSᵀ Q
            gemm_bf16(true, false, n, HD, rows, 1.0f, p16.data(), n, dob, int(hq.ld), 1.0f, dv + hk.base, int(hk.ld));  // dV += Pᵀ dO
          }
      }
  }
}

template void attention_forward_blocked<float>(float*, float*, const float*, const float*, const float*, int, int,
                                               int, int, int);
template void attention_forward_blocked<double>(double*, double*, const double*, const double*, const double*, int,
                                                int, int, int, int);
template void attention_backward_blocked<float>(float*, float*, float*, const float*, const float*, const float*,
                                                const float*, const float*, const float*, int, int, int, int, int);
template void attention_backward_blocked<double>(double*, double*, double*, const double*, const double*,
                                                 const double*, const double*, const double*, const double*, int, int,
                                                 int, int, int);

}  // namespace atl
