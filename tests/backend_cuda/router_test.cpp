// backend/cuda/router.cu against layers/router.cc.
#include "atoll/backend/cuda/router.h"

#include <cmath>

#include "atoll/layers/router.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Size {
  int N, E, K;
  bool ties;  // integer logits: many exactly equal probabilities, decided by the lower index
};
constexpr Size kSizes[] = {{1, 1, 1, false}, {5, 3, 2, false}, {7, 8, 8, true}, {300, 64, 6, false}, {129, 5, 2, true}};

std::vector<float> make_logits(Rng& rng, const Size& s) {
  auto x = randn_f(rng, size_t(s.N) * s.E, 2.0);
  if (s.ties)
    for (auto& v : x) v = std::round(v);
  return x;
}

// Choices must agree exactly: with continuous random logits a near-tie within the 2-ulp
// difference of expf and exp has probability ~1e-6 per pair, and exact ties see equal values
// on both sides. Probabilities and weights: fp32 softmax over E terms, 1e-6 absolute.
TEST(CudaRouter, ForwardMatchesCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " E=" << s.E << " K=" << s.K << " ties=" << s.ties);
    Rng rng(s.N * 3 + s.E);
    const auto logits = make_logits(rng, s);
    std::vector<float> probs(logits.size()), lse(s.N), w(size_t(s.N) * s.K);
    std::vector<int32_t> idx(size_t(s.N) * s.K);
    router_forward(probs.data(), lse.data(), idx.data(), w.data(), logits.data(), s.N, s.E, s.K);

    DeviceVec<float> d_logits(logits), d_probs(probs.size()), d_lse(s.N), d_w(w.size());
    DeviceVec<int32_t> d_idx(idx.size());
    gpu::router_forward(d_probs.get(), d_lse.get(), d_idx.get(), d_w.get(), d_logits.get(), s.N, s.E, s.K);
    EXPECT_EQ(d_idx.host(), idx);
    test::expect_near(d_probs.host(), probs, 1e-6, 1e-5, "probs");
    test::expect_near(d_lse.host(), lse, 1e-6, 1e-6, "lse");
    test::expect_near(d_w.host(), w, 1e-6, 1e-5, "topk_w");
  }
}

// Both sides start from the CPU's forward results. The per-token arithmetic is in double on
// both; only the fp32 inputs' products and the final rounding to float remain: 1e-6 absolute.
TEST(CudaRouter, BackwardMatchesCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  const double aux = 0.01, z = 0.001, loss_scale = 0.5;
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " E=" << s.E << " K=" << s.K);
    Rng rng(s.N * 5 + s.E);
    const auto logits = make_logits(rng, s);
    std::vector<float> probs(logits.size()), lse(s.N), w(size_t(s.N) * s.K), dlogits(logits.size());
    std::vector<int32_t> idx(size_t(s.N) * s.K);
    router_forward(probs.data(), lse.data(), idx.data(), w.data(), logits.data(), s.N, s.E, s.K);
    const auto dw = randn_f(rng, w.size());
    router_backward(dlogits.data(), dw.data(), probs.data(), lse.data(), idx.data(), w.data(), s.N, s.E, s.K, aux, z,
                    loss_scale);

    DeviceVec<float> d_probs(probs), d_lse(lse), d_w(w), d_dw(dw), d_dlogits(dlogits.size());
    DeviceVec<int32_t> d_idx(idx), d_scratch(s.E);
    d_dlogits.fill_nan();
    gpu::router_backward(d_dlogits.get(), d_dw.get(), d_probs.get(), d_lse.get(), d_idx.get(), d_w.get(), s.N, s.E, s.K,
                         aux, z, loss_scale, d_scratch.get());
    test::expect_near(d_dlogits.host(), dlogits, 1e-6, 1e-6, "dlogits");
  }
}

}  // namespace
}  // namespace atl
