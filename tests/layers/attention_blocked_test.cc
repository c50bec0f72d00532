// The blocked attention kernel against the plain reference (layers/attention.h), on sizes
// that are not multiples of the block, with grouped-query heads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "atoll/backend/cpu/attention.h"
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

}  // namespace
}  // namespace atl
