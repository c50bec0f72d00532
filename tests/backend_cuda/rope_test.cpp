// backend/cuda/rope.cu against layers/rope.cc.
#include "atoll/backend/cuda/rope.h"

#include "atoll/layers/rope.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Size {
  int B, T, NHX, HD, pos0, RD = 0;  // RD: rotated entries per head (partial rotary), 0 = HD
};
// Odd HD (last element untouched), one position, pos0 > 0 (decoding, and a context-parallel
// chunk's backward), more pairs than a block, partial rotary.
constexpr Size kSizes[] = {{1, 1, 1, 2, 0},     {2, 5, 3, 7, 0},     {1, 3, 2, 8, 9},
                           {3, 37, 5, 64, 2},   {2, 5, 3, 8, 0, 4},  {1, 3, 2, 10, 9, 4}};

// Two products and a sum per element on both sides, the GPU possibly fused: a few ulp of
// O(1) values, so 1e-6 absolute.
TEST(CudaRope, ForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NHX=" << s.NHX << " HD=" << s.HD
                                    << " pos0=" << s.pos0 << " RD=" << s.RD);
    const auto table = RopeTable<float>::build(s.pos0 + s.T + 3, s.HD, 10000.0, s.RD);
    Rng rng(s.T * 7 + s.HD);
    const auto x = randn_f(rng, size_t(s.B) * s.T * s.NHX * s.HD);
    std::vector<float> fwd = x, bwd = x;
    rope_forward(fwd.data(), table, s.B, s.T, s.NHX, s.HD, s.pos0);
    rope_backward(bwd.data(), table, s.B, s.T, s.NHX, s.HD, s.pos0);

    DeviceVec<float> d_cos(table.cos), d_sin(table.sin), d_fwd(x), d_bwd(x);
    const gpu::DeviceRopeTable dt{d_cos.get(), d_sin.get(), table.seq_len, table.head_dim, table.rotary_dim};
    gpu::rope_forward(d_fwd.get(), dt, s.B, s.T, s.NHX, s.HD, s.pos0);
    gpu::rope_backward(d_bwd.get(), dt, s.B, s.T, s.NHX, s.HD, s.pos0);
    test::expect_near(d_fwd.host(), fwd, 1e-6, 0.0, "forward");
    test::expect_near(d_bwd.host(), bwd, 1e-6, 0.0, "backward");
  }
}

TEST(CudaRope, RejectsPositionsPastTheTable) {
  ATOLL_SKIP_WITHOUT_GPU();
  const auto table = RopeTable<float>::build(4, 8, 10000.0);
  DeviceVec<float> d_cos(table.cos), d_sin(table.sin), d_x(size_t(5) * 8);
  const gpu::DeviceRopeTable dt{d_cos.get(), d_sin.get(), table.seq_len, table.head_dim};
  EXPECT_THROW(gpu::rope_forward(d_x.get(), dt, 1, 5, 1, 8), CheckError);
  EXPECT_THROW(gpu::rope_forward(d_x.get(), dt, 1, 2, 1, 8, 3), CheckError);
}

}  // namespace
}  // namespace atl
