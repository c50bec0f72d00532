// backend/cpu/cca_conv.h (the grouped convolution as products) against the reference
// layers/cca.h, in double and float, over awkward sizes: one token, a sequence shorter than the
// padding, unit kernels, long kernels, heads of odd width, several sequences; forward (=) and
// backward (+=, onto non-zero gradients).
#include "atoll/backend/cpu/cca_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/layers/cca.h"
#include "backend/fast_vs_reference.h"

namespace atl {
namespace {

using test::max_rel;
using test::normal;

template <typename T>
void check(const CcaDims& d, double tol) {
  SCOPED_TRACE(testing::Message() << "B=" << d.B << " T=" << d.T << " NH=" << d.NH << " NKV=" << d.NKV << " HD="
                                  << d.HD << " t0=" << d.t0 << " t1=" << d.t1);
  Rng rng(uint64_t(d.T * 131 + d.HD * 7 + d.t0));
  const size_t CC = d.CC(), NX = size_t(d.N()) * CC, NY = size_t(d.B) * d.TY() * CC;
  const auto x = normal<T>(rng, NX), w0 = normal<T>(rng, CC * d.t0), b0 = normal<T>(rng, CC);
  const auto w1 = normal<T>(rng, CC * d.HD * d.t1), b1 = normal<T>(rng, CC), dz = normal<T>(rng, NX);
  std::vector<T> z(NX), y(NY), zr(NX), yr(NY);
  cpu::cca_conv_forward(z.data(), y.data(), x.data(), w0.data(), b0.data(), w1.data(), b1.data(), d);
  cca_conv_forward(zr.data(), yr.data(), x.data(), w0.data(), b0.data(), w1.data(), b1.data(), d);
  EXPECT_EQ(y, yr) << "the depthwise convolution sums in the reference's order";
  EXPECT_LT(max_rel(z, zr), tol) << "z";
  // Gradients start at the same non-zero values on both sides (+=).
  auto dx = normal<T>(rng, NX), dw0 = normal<T>(rng, CC * d.t0), db0 = normal<T>(rng, CC);
  auto dw1 = normal<T>(rng, CC * d.HD * d.t1), db1 = normal<T>(rng, CC);
  auto dxr = dx, dw0r = dw0, db0r = db0, dw1r = dw1, db1r = db1;
  std::vector<T> dy(NY), dyr(NY);
  cpu::cca_conv_backward(dx.data(), dw0.data(), db0.data(), dw1.data(), db1.data(), dy.data(), dz.data(), y.data(),
                         x.data(), w0.data(), w1.data(), d);
  cca_conv_backward(dxr.data(), dw0r.data(), db0r.data(), dw1r.data(), db1r.data(), dyr.data(), dz.data(), yr.data(),
                    x.data(), w0.data(), w1.data(), d);
  EXPECT_LT(max_rel(dy, dyr), tol) << "dy";
  EXPECT_LT(max_rel(dx, dxr), tol) << "dx";
  EXPECT_LT(max_rel(dw0, dw0r), tol) << "dw0";
  EXPECT_LT(max_rel(db0, db0r), tol) << "db0";
  EXPECT_LT(max_rel(dw1, dw1r), tol) << "dw1";
  EXPECT_LT(max_rel(db1, db1r), tol) << "db1";
}

const CcaDims kSizes[] = {
    {.B = 1, .T = 1, .C = 0, .NH = 1, .NKV = 1, .HD = 2, .t0 = 2, .t1 = 2},
    {.B = 2, .T = 2, .C = 0, .NH = 4, .NKV = 2, .HD = 4, .t0 = 3, .t1 = 3},   // shorter than the padding
    {.B = 3, .T = 9, .C = 0, .NH = 2, .NKV = 1, .HD = 6, .t0 = 1, .t1 = 1},   // unit kernels
    {.B = 2, .T = 37, .C = 0, .NH = 3, .NKV = 1, .HD = 5, .t0 = 9, .t1 = 4},  // odd heads, a long depthwise kernel
    {.B = 1, .T = 130, .C = 0, .NH = 8, .NKV = 2, .HD = 32, .t0 = 2, .t1 = 2},  // ZAYA1's kernels, > 64 channels
};

// Double: sums of up to a few hundred terms in another order, ~1e-15 of their scale: 1e-12.
TEST(CcaConv, FastMatchesReferenceInDouble) {
  for (const CcaDims& d : kSizes) check<double>(d, 1e-12);
}

// Float: the same in fp32 (unit roundoff 6e-8, sums of up to B·T·... terms): 1e-5.
TEST(CcaConv, FastMatchesReferenceInFloat) {
  for (const CcaDims& d : kSizes) check<float>(d, 1e-5);
}

}  // namespace
}  // namespace atl
