// backend/cuda/adamw.cu against optim/adamw.cc.
#include "atoll/optim/adamw.cuh"

#include <cstring>

#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The GPU kernel does the CPU's fp32 operations in the CPU's order with each one rounded
// (sqrt and division are correctly rounded on both), so the result is bit-identical. A
// difference of even one ulp means the arithmetic diverged: tolerance 0.
TEST(CudaAdamW, StepsAreBitIdenticalToCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  const AdamWOptions opt{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (const size_t n : {size_t(1), size_t(255), size_t(257), size_t(70001)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    Rng rng(n);
    std::vector<float> p = randn_f(rng, n), m(n, 0.f), v(n, 0.f);
    DeviceVec<float> d_p(p), d_m(m), d_v(v), d_g(n);
    for (int64_t step = 1; step <= 3; ++step) {
      const auto g = randn_f(rng, n, 0.1);
      adamw_update(p.data(), m.data(), v.data(), g.data(), n, step, opt);
      d_g.upload(g);
      gpu::adamw_update(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, step, opt);
    }
    const auto gp = d_p.host(), gm = d_m.host(), gv = d_v.host();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(gp[i]), bits(p[i])) << "param " << i << ": " << gp[i] << " vs " << p[i];
      ASSERT_EQ(bits(gm[i]), bits(m[i])) << "m " << i;
      ASSERT_EQ(bits(gv[i]), bits(v[i])) << "v " << i;
    }
  }
}

TEST(CudaAdamW, StepZeroIsRejected) {
  ATOLL_SKIP_WITHOUT_GPU();
  DeviceVec<float> d(1);
  EXPECT_THROW(gpu::adamw_update(d.get(), d.get(), d.get(), d.get(), 1, 0, AdamWOptions{}), CheckError);
}

}  // namespace
}  // namespace atl
