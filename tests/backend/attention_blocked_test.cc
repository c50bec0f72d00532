// The blocked attention kernel against the plain reference (layers/attention.h), on sizes
// that are not multiples of the block, with grouped-query heads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "atoll/backend/cpu/attention.h"
#include "atoll/backend/cpu/bf16.h"
#include "atoll/core/rng.h"
#include "atoll/layers/attention.h"

namespace atl {
namespace {

template <typename T>
std::vector<T> randn(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<T> x(n);
  for (auto& v : x) v = T(rng.normal());
  return x;
}

template <typename T>
double max_rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double worst = 0, scale = 1.0;  // inputs are N(0,1): a floor of 1 keeps exact zeros (T=1 gradients) comparable
  for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::abs(double(a[i])));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / scale);
  return worst;
}

template <typename T>
void compare(int B, int T_, int NH, int NKV, int HD, double tol) {
  const size_t nq = size_t(B) * T_ * NH * HD, nk = size_t(B) * T_ * NKV * HD;
  auto q = randn<T>(nq, 1), k = randn<T>(nk, 2), v = randn<T>(nk, 3), dout = randn<T>(nq, 4);
  std::vector<T> o1(nq), o2(nq), l1(size_t(B) * NH * T_), l2(l1.size());
  attention_forward(o1.data(), l1.data(), q.data(), k.data(), v.data(), B, T_, NH, NKV, HD);
  attention_forward_blocked(o2.data(), l2.data(), q.data(), k.data(), v.data(), B, T_, NH, NKV, HD);
  EXPECT_LT(max_rel_diff(o1, o2), tol) << "out";
  EXPECT_LT(max_rel_diff(l1, l2), tol) << "lse";
  std::vector<T> dq1(nq), dk1(nk), dv1(nk), dq2(nq, T(7)), dk2(nk, T(7)), dv2(nk, T(7));  // 7: overwritten
  attention_backward(dq1.data(), dk1.data(), dv1.data(), dout.data(), o1.data(), l1.data(), q.data(), k.data(),
                     v.data(), B, T_, NH, NKV, HD);
  attention_backward_blocked(dq2.data(), dk2.data(), dv2.data(), dout.data(), o1.data(), l1.data(), q.data(), k.data(),
                             v.data(), B, T_, NH, NKV, HD);
  EXPECT_LT(max_rel_diff(dq1, dq2), tol) << "dq T=" << T_ << " NH=" << NH << " NKV=" << NKV << " HD=" << HD;
  EXPECT_LT(max_rel_diff(dk1, dk2), tol) << "dk";
  EXPECT_LT(max_rel_diff(dv1, dv2), tol) << "dv";
}

// Tolerances: the two kernels sum in different orders; double agrees to ~1e-14 of the largest
// value, float to ~1e-6 over sums of up to a few hundred terms.
TEST(AttentionBlocked, MatchesReferenceDouble) {
  for (int T_ : {1, 5, 63, 64, 65, 130}) compare<double>(2, T_, 4, 2, 8, 1e-12);
  compare<double>(1, 97, 3, 3, 5, 1e-12);
  compare<double>(2, 70, 4, 1, 16, 1e-12);
}

TEST(AttentionBlocked, MatchesReferenceFloat) {
  for (int T_ : {1, 63, 65, 200}) compare<float>(2, T_, 2, 2, 64, 2e-5);
  compare<float>(3, 129, 8, 2, 32, 2e-5);
}

// The bf16 kernel against the double reference run on the same bf16-rounded q, k, v, dout
// (and, for backward, the same bf16 output), so what remains is the kernel's own rounding:
// probabilities and score gradients rounded to bf16 before their products (relative 2^-9
// each) and the output rounded to bf16 (2^-9). Measured: up to 4.5e-3 of the largest value
// (the output), under 3e-3 for the gradients; 1e-2 leaves twice that.
void compare_bf16(int B, int T_, int NH, int NKV, int HD, double tol) {
  const size_t nq = size_t(B) * T_ * NH * HD, nk = size_t(B) * T_ * NKV * HD;
  auto q = randn<double>(nq, 1), k = randn<double>(nk, 2), v = randn<double>(nk, 3), dout = randn<double>(nq, 4);
  auto round = [](std::vector<double>& x, std::vector<bf16>& x16) {
    x16.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = float_to_bf16(float(x[i])), x[i] = bf16_to_float(x16[i]);
  };
  std::vector<bf16> q16, k16, v16, dout16, o16(nq);
  round(q, q16), round(k, k16), round(v, v16), round(dout, dout16);
  std::vector<double> o1(nq), l1(size_t(B) * NH * T_);
  std::vector<float> l2(l1.size());
  attention_forward(o1.data(), l1.data(), q.data(), k.data(), v.data(), B, T_, NH, NKV, HD);
  attention_forward_blocked_bf16(o16.data(), l2.data(), q16.data(), k16.data(), v16.data(), B, T_, NH, NKV, HD);
  std::vector<double> o2(nq), l2d(l2.begin(), l2.end());
  for (size_t i = 0; i < nq; ++i) o2[i] = bf16_to_float(o16[i]);
  EXPECT_LT(max_rel_diff(o1, o2), tol) << "out T=" << T_;
  EXPECT_LT(max_rel_diff(l1, l2d), 1e-5) << "lse (fp32 softmax of fp32 scores)";
  std::vector<double> dq1(nq), dk1(nk), dv1(nk);
  std::vector<float> dq2(nq, 7.0f), dk2(nk, 7.0f), dv2(nk, 7.0f);  // 7: overwritten
  attention_backward(dq1.data(), dk1.data(), dv1.data(), dout.data(), o2.data(), l1.data(), q.data(), k.data(),
                     v.data(), B, T_, NH, NKV, HD);
  attention_backward_blocked_bf16(dq2.data(), dk2.data(), dv2.data(), dout16.data(), o16.data(), l2.data(),
                                  q16.data(), k16.data(), v16.data(), B, T_, NH, NKV, HD);
  auto d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  EXPECT_LT(max_rel_diff(dq1, d(dq2)), tol) << "dq T=" << T_ << " NH=" << NH << " NKV=" << NKV << " HD=" << HD;
  EXPECT_LT(max_rel_diff(dk1, d(dk2)), tol) << "dk";
  EXPECT_LT(max_rel_diff(dv1, d(dv2)), tol) << "dv";
}

TEST(AttentionBlocked, Bf16MatchesReference) {
  for (int T_ : {1, 63, 65, 200}) compare_bf16(2, T_, 2, 2, 64, 1e-2);
  compare_bf16(3, 129, 8, 2, 32, 1e-2);
  compare_bf16(1, 97, 3, 3, 5, 1e-2);
}

}  // namespace
}  // namespace atl
