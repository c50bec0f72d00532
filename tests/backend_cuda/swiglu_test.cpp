// backend/cuda/swiglu.cu against layers/swiglu.cc.
#include "atoll/backend/cuda/swiglu.h"

#include "atoll/layers/swiglu.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

// Elementwise fp32 on both sides; expf on the device is within 2 ulp of the host's exp, and
// the GPU may fuse multiply-adds, so a few ulp relative: 1e-6 relative + 1e-7 absolute.
TEST(CudaSwiGlu, ForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const size_t n : {size_t(1), size_t(255), size_t(257), size_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    Rng rng(n);
    const auto a = randn_f(rng, n, 3.0), b = randn_f(rng, n), dout = randn_f(rng, n);
    std::vector<float> out(n), da(n), db(n);
    swiglu_forward(out.data(), a.data(), b.data(), n);
    swiglu_backward(da.data(), db.data(), dout.data(), a.data(), b.data(), n);

    DeviceVec<float> d_a(a), d_b(b), d_dout(dout), d_out(n), d_db(n);
    d_out.fill_nan();
    d_db.fill_nan();
    gpu::swiglu_forward(d_out.get(), d_a.get(), d_b.get(), n);
    test::expect_near(d_out.host(), out, 1e-7, 1e-6, "out");
    // da aliases dout, as the expert MLP calls it.
    gpu::swiglu_backward(d_dout.get(), d_db.get(), d_dout.get(), d_a.get(), d_b.get(), n);
    test::expect_near(d_dout.host(), da, 1e-7, 1e-6, "da");
    test::expect_near(d_db.host(), db, 1e-7, 1e-6, "db");
  }
}

}  // namespace
}  // namespace atl
