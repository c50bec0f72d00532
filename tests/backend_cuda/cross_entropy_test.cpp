// backend/cuda/cross_entropy.cu against layers/cross_entropy.cc.
#include "atoll/backend/cuda/cross_entropy.h"

#include <cmath>

#include "atoll/layers/cross_entropy.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Size {
  int N, V;
};
// V = 1; V below the 256-column chunk; V not a multiple of it; a GPT-2-sized vocabulary.
constexpr Size kSizes[] = {{1, 1}, {3, 5}, {17, 1000}, {4, 50257}};

// The CPU sums exp in double, the GPU in fp32 over V/256 terms per thread and a tree: a
// relative error ~1e-6 in the sum, so 1e-5 absolute on lse ~ log V and on each loss.
// Gradients are scale·softmax values in [0, 1]: 1e-6 absolute.
TEST(CudaCrossEntropy, ForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V);
    Rng rng(s.N + s.V);
    auto logits = randn_f(rng, size_t(s.N) * s.V, 3.0);
    logits[0] += 40.f;  // one large logit: the online max must rescale correctly
    const auto targets = test::randint_ids(rng, s.N, s.V);
    std::vector<float> lse(s.N), dlogits(logits.size());
    const double total = cross_entropy_forward(lse.data(), logits.data(), targets.data(), s.N, s.V);
    const float scale = 1.f / float(s.N);
    cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), s.N, s.V, scale);

    DeviceVec<float> d_logits(logits), d_loss(s.N), d_lse(s.N);
    DeviceVec<int32_t> d_targets(targets);
    gpu::cross_entropy_forward(d_loss.get(), d_lse.get(), d_logits.get(), d_targets.get(), s.N, s.V);
    test::expect_near(d_lse.host(), lse, 1e-5, 1e-6, "lse");
    double gpu_total = 0.0;
    for (const float l : d_loss.host()) gpu_total += l;
    EXPECT_NEAR(gpu_total, total, 1e-5 * s.N);
    // In place, as the model calls it, from the CPU's lse.
    d_lse.upload(lse);
    gpu::cross_entropy_backward(d_logits.get(), d_logits.get(), d_lse.get(), d_targets.get(), s.N, s.V, scale);
    test::expect_near(d_logits.host(), dlogits, 1e-6, 1e-5, "dlogits");
  }
}

TEST(CudaCrossEntropy, BadTargetGivesNan) {
  ATOLL_SKIP_WITHOUT_GPU();
  DeviceVec<float> d_logits(std::vector<float>{0.f, 1.f, 2.f}), d_loss(1), d_lse(1);
  DeviceVec<int32_t> d_targets(std::vector<int32_t>{3});
  gpu::cross_entropy_forward(d_loss.get(), d_lse.get(), d_logits.get(), d_targets.get(), 1, 3);
  EXPECT_TRUE(std::isnan(d_loss.host()[0]));
}

}  // namespace
}  // namespace atl
