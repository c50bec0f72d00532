// backend/cuda/muon.cu against optim/muon.cc.
#include "atoll/optim/muon.cuh"

#include "atoll/backend/cuda/arena.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Shape {
  int rows, cols;
};
// 1×1; wide; tall (transposed onto the wide orientation); square; odd sizes past a 16-tile.
constexpr Shape kShapes[] = {{1, 1}, {3, 17}, {45, 7}, {32, 32}, {67, 129}};

// Five iterations of three fp32 products each; the products match the CPU's to summation
// order (~1e-7 relative). The quintic's slope a = 3.4445 at small singular values can magnify
// a perturbation up to 3.4445^5 ~ 500x over five steps: ~5e-5 on O(1) entries, so 1e-4 absolute.
TEST(CudaMuon, NewtonSchulzMatchesCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  gpu::Blas blas;
  for (const Shape s : kShapes) {
    SCOPED_TRACE(testing::Message() << s.rows << "x" << s.cols);
    Rng rng(s.rows * 100 + s.cols);
    const auto in = randn_f(rng, size_t(s.rows) * s.cols);
    std::vector<float> want(in.size());
    newton_schulz(want.data(), in.data(), s.rows, s.cols, 5);
    gpu::DeviceArena arena(size_t(gpu::newton_schulz_scratch_floats(s.rows, s.cols)) * sizeof(float));
    DeviceVec<float> d_in(in), d_out(in.size());
    d_out.fill_nan();
    gpu::newton_schulz(d_out.get(), d_in.get(), s.rows, s.cols, 5, blas,
                       arena.alloc<float>(size_t(gpu::newton_schulz_scratch_floats(s.rows, s.cols))));
    test::expect_near(d_out.host(), want, 1e-4, 0.0, "newton_schulz");
  }
}

// Two steps of the whole update (momentum, Nesterov, Newton-Schulz, decay, RMS scaling).
TEST(CudaMuon, UpdateMatchesCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  gpu::Blas blas;
  const MuonOptions opt{.lr = 0.02, .momentum = 0.95, .weight_decay = 0.1, .ns_steps = 5};
  for (const Shape s : kShapes) {
    SCOPED_TRACE(testing::Message() << s.rows << "x" << s.cols);
    Rng rng(s.rows + s.cols);
    const size_t n = size_t(s.rows) * s.cols;
    std::vector<float> p = randn_f(rng, n, 0.02), mom(n, 0.f);
    DeviceVec<float> d_p(p), d_mom(mom), d_g(n);
    gpu::DeviceArena arena(size_t(gpu::muon_scratch_floats(s.rows, s.cols)) * sizeof(float));
    float* scratch = arena.alloc<float>(size_t(gpu::muon_scratch_floats(s.rows, s.cols)));
    MuonWorkspace ws;
    for (int step = 0; step < 2; ++step) {
      const auto g = randn_f(rng, n, 0.1);
      muon_update(p.data(), mom.data(), g.data(), s.rows, s.cols, opt, &ws);
      d_g.upload(g);
      gpu::muon_update(d_p.get(), d_mom.get(), d_g.get(), s.rows, s.cols, opt, blas, scratch);
    }
    // The update is lr·0.2·sqrt(max(rows, cols))·O <= 0.045·O here, so O's 1e-4 becomes 4.5e-6
    // per step: 1e-5 absolute over two steps. Momentum is one multiply-add per step (fused or
    // not): a few ulp.
    test::expect_near(d_p.host(), p, 1e-5, 0.0, "param");
    test::expect_near(d_mom.host(), mom, 1e-7, 1e-6, "momentum");
  }
}

}  // namespace
}  // namespace atl
