// backend/cuda/rmsnorm.cu against layers/rmsnorm.cc.
#include "atoll/backend/cuda/rmsnorm.h"

#include "atoll/layers/rmsnorm.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

// Sizes: one element; a row shorter than a block; rows longer than a block and not a
// multiple of it; many rows.
struct Size {
  int N, C;
};
constexpr Size kSizes[] = {{1, 1}, {3, 7}, {7, 300}, {33, 4097}, {129, 64}};
constexpr double kEps = 1e-5;

// fp32 throughout on both sides; the sums of C squares and of C products differ only in
// order (GPU tree vs CPU serial in double), a relative error of a few 1e-7 for C ~ 4k. Values
// are O(1), so 1e-5 relative plus 1e-5 absolute (for the cancellation in g − xh·mean) holds
// with margin. dweight sums N products per column in the same order, but the GPU may fuse
// multiply-adds: 1e-5 relative of the column's absolute sum, bounded by 1e-4 here.
TEST(CudaRmsNorm, ForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    Rng rng(11 + s.N);
    const auto x = randn_f(rng, size_t(s.N) * s.C), dout = randn_f(rng, size_t(s.N) * s.C);
    auto w = randn_f(rng, s.C, 0.2);
    for (auto& v : w) v += 1.f;
    const auto din0 = randn_f(rng, size_t(s.N) * s.C), dw0 = randn_f(rng, s.C);  // += targets

    std::vector<float> out(x.size()), rstd(s.N), din = din0, dw = dw0;
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), s.N, s.C, kEps);
    rmsnorm_backward(din.data(), dw.data(), dout.data(), x.data(), rstd.data(), w.data(), s.N, s.C);

    DeviceVec<float> d_x(x), d_w(w), d_dout(dout), d_out(x.size()), d_rstd(s.N), d_din(din0), d_dw(dw0);
    d_out.fill_nan();
    d_rstd.fill_nan();
    gpu::rmsnorm_forward(d_out.get(), d_rstd.get(), d_x.get(), d_w.get(), s.N, s.C, kEps);
    gpu::rmsnorm_backward(d_din.get(), d_dw.get(), d_dout.get(), d_x.get(), d_rstd.get(), d_w.get(), s.N, s.C);

    test::expect_near(d_out.host(), out, 1e-5, 1e-5, "out");
    test::expect_near(d_rstd.host(), rstd, 0.0, 1e-5, "rstd");
    test::expect_near(d_din.host(), din, 1e-5, 1e-5, "din");
    test::expect_near(d_dw.host(), dw, 1e-4, 1e-5, "dweight");
  }
}

}  // namespace
}  // namespace atl
