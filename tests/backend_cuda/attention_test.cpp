// backend/cuda/attention.cu against layers/attention.cc.
#include "atoll/backend/cuda/attention.h"

#include "atoll/layers/attention.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Size {
  int B, T, NH, NKV, HD;
};
// T = 1; T not a multiple of the 128-key tile and longer than one tile (several online-softmax
// rescalings); grouped-query heads (NH/NKV = 3); odd HD; HD larger than the block.
constexpr Size kSizes[] = {
    {1, 1, 1, 1, 1}, {2, 7, 2, 1, 5}, {1, 129, 3, 1, 16}, {2, 300, 6, 2, 33}, {1, 131, 2, 2, 160}};

// fp32 on both sides; the GPU sums the T scores and the T·HD products in another order
// (tiles, a rescaled online softmax) than the CPU. Each output is a convex combination of O(1)
// values, so errors stay near T·eps ~ 300 · 6e-8 ≈ 2e-5: 1e-4 absolute. Gradients sum up to
// T·group terms of O(1): 2e-4 absolute + 1e-4 relative.
TEST(CudaAttention, ForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV
                                    << " HD=" << s.HD);
    Rng rng(s.T * 13 + s.HD);
    const size_t nq = size_t(s.B) * s.T * s.NH * s.HD, nk = size_t(s.B) * s.T * s.NKV * s.HD;
    const auto q = randn_f(rng, nq), k = randn_f(rng, nk), v = randn_f(rng, nk), dout = randn_f(rng, nq);
    std::vector<float> out(nq), lse(size_t(s.B) * s.NH * s.T), dq(nq), dk(nk), dv(nk);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HD);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                       v.data(), s.B, s.T, s.NH, s.NKV, s.HD);

    DeviceVec<float> d_q(q), d_k(k), d_v(v), d_dout(dout), d_out(nq), d_lse(lse.size()), d_dq(nq), d_dk(nk), d_dv(nk),
        d_scratch(gpu::attention_scratch_floats(s.B, s.T, s.NH));
    for (auto* d : {&d_out, &d_lse, &d_dq, &d_dk, &d_dv}) d->fill_nan();
    gpu::attention_forward(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(), s.B, s.T, s.NH, s.NKV, s.HD);
    test::expect_near(d_out.host(), out, 1e-4, 0.0, "out");
    test::expect_near(d_lse.host(), lse, 1e-4, 1e-5, "lse");
    // Backward from the CPU's forward results, so the two backward passes see the same inputs.
    d_out.upload(out);
    d_lse.upload(lse);
    gpu::attention_backward(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(), d_out.get(), d_lse.get(), d_q.get(),
                            d_k.get(), d_v.get(), s.B, s.T, s.NH, s.NKV, s.HD, d_scratch.get());
    test::expect_near(d_dq.host(), dq, 2e-4, 1e-4, "dq");
    test::expect_near(d_dk.host(), dk, 2e-4, 1e-4, "dk");
    test::expect_near(d_dv.host(), dv, 2e-4, 1e-4, "dv");
  }
}

}  // namespace
}  // namespace atl
