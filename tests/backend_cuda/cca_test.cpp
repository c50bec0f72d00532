// backend/cuda/cca.cu against layers/cca.cc: the convolutions (forward, and backward onto
// non-zero gradients), the qk-mean skip, the q/k norm with the temperature, the value shift and
// the row packing, over a sequence shorter than the padding, odd heads and several sequences.
#include "atoll/backend/cuda/cca.h"

#include <algorithm>

#include "atoll/layers/cca.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

const CcaDims kSizes[] = {
    {.B = 2, .T = 2, .C = 0, .NH = 4, .NKV = 2, .HD = 4, .t0 = 3, .t1 = 3},
    {.B = 3, .T = 37, .C = 0, .NH = 3, .NKV = 1, .HD = 5, .t0 = 2, .t1 = 4},
    {.B = 1, .T = 130, .C = 0, .NH = 8, .NKV = 2, .HD = 32, .t0 = 2, .t1 = 2},
};

// fp32 sums of up to B·T products (weight gradients) in the same order on both sides, the GPU
// possibly fusing multiply-adds: a few ulps of the sums' scale, so 1e-4 relative, 1e-5 absolute.
constexpr double kAtol = 1e-5, kRtol = 1e-4;

TEST(CudaCca, ConvolutionsMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const CcaDims& d : kSizes) {
    SCOPED_TRACE(testing::Message() << "B=" << d.B << " T=" << d.T << " HD=" << d.HD);
    Rng rng(uint64_t(d.T + d.HD));
    const size_t CC = d.CC(), NX = size_t(d.N()) * CC, NY = size_t(d.B) * d.TY() * CC;
    const auto x = randn_f(rng, NX), w0 = randn_f(rng, CC * d.t0), b0 = randn_f(rng, CC);
    const auto w1 = randn_f(rng, CC * d.HD * d.t1, 0.3), b1 = randn_f(rng, CC), dz = randn_f(rng, NX);
    auto dx = randn_f(rng, NX), dw0 = randn_f(rng, CC * d.t0), db0 = randn_f(rng, CC);
    auto dw1 = randn_f(rng, CC * d.HD * d.t1), db1 = randn_f(rng, CC);
    DeviceVec<float> gx(x), gw0(w0), gb0(b0), gw1(w1), gb1(b1), gdz(dz), gz(NX), gy(NY), gdy(NY);
    DeviceVec<float> gdx(dx), gdw0(dw0), gdb0(db0), gdw1(dw1), gdb1(db1);
    std::vector<float> z(NX), y(NY), dy(NY);
    cca_conv_forward(z.data(), y.data(), x.data(), w0.data(), b0.data(), w1.data(), b1.data(), d);
    cca_conv_backward(dx.data(), dw0.data(), db0.data(), dw1.data(), db1.data(), dy.data(), dz.data(), y.data(),
                      x.data(), w0.data(), w1.data(), d);
    gz.fill_nan(), gy.fill_nan(), gdy.fill_nan();
    gpu::cca_conv_forward(gz.get(), gy.get(), gx.get(), gw0.get(), gb0.get(), gw1.get(), gb1.get(), d);
    gpu::cca_conv_backward(gdx.get(), gdw0.get(), gdb0.get(), gdw1.get(), gdb1.get(), gdy.get(), gdz.get(), gy.get(),
                           gx.get(), gw0.get(), gw1.get(), d);
    test::expect_near(gy.host(), y, kAtol, kRtol, "y");
    test::expect_near(gz.host(), z, kAtol, kRtol, "z");
    test::expect_near(gdy.host(), dy, kAtol, kRtol, "dy");
    test::expect_near(gdx.host(), dx, kAtol, kRtol, "dx");
    test::expect_near(gdw0.host(), dw0, kAtol, kRtol, "dw0");
    test::expect_near(gdb0.host(), db0, kAtol, kRtol, "db0");
    test::expect_near(gdw1.host(), dw1, kAtol, kRtol, "dw1");
    test::expect_near(gdb1.host(), db1, kAtol, kRtol, "db1");
  }
}

TEST(CudaCca, MeanNormValueAndPackingMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const CcaDims& d : kSizes) {
    SCOPED_TRACE(testing::Message() << "B=" << d.B << " T=" << d.T << " HD=" << d.HD);
    Rng rng(uint64_t(3 * d.T + d.HD));
    const size_t N = d.N(), CC = d.CC(), QD = d.QD(), KVD = d.KVD();
    const auto x = randn_f(rng, N * CC), z = randn_f(rng, N * CC), temp = randn_f(rng, d.NKV);
    const auto dq_in = randn_f(rng, N * QD), dk_in = randn_f(rng, N * KVD);
    const auto vc = randn_f(rng, N * KVD / 2), vd = randn_f(rng, N * KVD / 2), dv = randn_f(rng, N * KVD);
    std::vector<float> q(N * QD), k(N * KVD), qn(q.size()), kn(k.size()), rq(N * d.NH), rk(N * d.NKV);
    cca_qk_mean_forward(q.data(), k.data(), z.data(), x.data(), d);
    cca_qk_norm_forward(qn.data(), kn.data(), rq.data(), rk.data(), q.data(), k.data(), temp.data(), d);
    std::vector<float> dq(q.size()), dk(k.size()), dtemp(d.NKV, 0.5f), dz(N * CC), dx(N * CC, 0.25f);
    cca_qk_norm_backward(dq.data(), dk.data(), dtemp.data(), dq_in.data(), dk_in.data(), q.data(), k.data(),
                         rq.data(), rk.data(), temp.data(), d);
    cca_qk_mean_backward(dz.data(), dx.data(), dq.data(), dk.data(), d);
    std::vector<float> v(N * KVD), dvc(N * KVD / 2), dvd(N * KVD / 2);
    cca_value_forward(v.data(), vc.data(), vd.data(), d);
    cca_value_backward(dvc.data(), dvd.data(), dv.data(), d);

    DeviceVec<float> gx(x), gz(z), gtemp(temp), gdqi(dq_in), gdki(dk_in), gvc(vc), gvd(vd), gdv(dv);
    DeviceVec<float> gq(q.size()), gk(k.size()), gqn(q.size()), gkn(k.size()), grq(rq.size()), grk(rk.size());
    DeviceVec<float> gdq(q.size()), gdk(k.size()), gdtemp(dtemp), gpart(N * d.NKV), gdz(N * CC);
    DeviceVec<float> gdx(std::vector<float>(N * CC, 0.25f)), gv(v.size()), gdvc(dvc.size()), gdvd(dvd.size());
    gpu::cca_qk_mean_forward(gq.get(), gk.get(), gz.get(), gx.get(), d);
    gpu::cca_qk_norm_forward(gqn.get(), gkn.get(), grq.get(), grk.get(), gq.get(), gk.get(), gtemp.get(), d);
    gdtemp.upload(std::vector<float>(d.NKV, 0.5f));
    gpu::cca_qk_norm_backward(gdq.get(), gdk.get(), gdtemp.get(), gpart.get(), gdqi.get(), gdki.get(), gq.get(),
                              gk.get(), grq.get(), grk.get(), gtemp.get(), d);
    gpu::cca_qk_mean_backward(gdz.get(), gdx.get(), gdq.get(), gdk.get(), d);
    gpu::cca_value_forward(gv.get(), gvc.get(), gvd.get(), d);
    gpu::cca_value_backward(gdvc.get(), gdvd.get(), gdv.get(), d);
    test::expect_near(gq.host(), q, kAtol, kRtol, "q");
    test::expect_near(gk.host(), k, kAtol, kRtol, "k");
    test::expect_near(gqn.host(), qn, kAtol, kRtol, "qn");
    test::expect_near(gkn.host(), kn, kAtol, kRtol, "kn");
    test::expect_near(gdq.host(), dq, kAtol, kRtol, "dq");
    test::expect_near(gdk.host(), dk, kAtol, kRtol, "dk");
    test::expect_near(gdtemp.host(), dtemp, kAtol, kRtol, "dtemp");
    test::expect_near(gdz.host(), dz, kAtol, kRtol, "dz");
    test::expect_near(gdx.host(), dx, kAtol, kRtol, "dx");
    test::expect_equal(gv.host(), v, "v");
    test::expect_equal(gdvc.host(), dvc, "dvc");
    test::expect_equal(gdvd.host(), dvd, "dvd");
    // Packing [q | k] rows and back.
    DeviceVec<float> packed(N * CC), uq(q.size()), uk(k.size());
    gpu::pack_rows(packed.get(), gq.get(), gk.get(), int(N), int(QD), int(KVD));
    gpu::unpack_rows(uq.get(), uk.get(), packed.get(), int(N), int(QD), int(KVD));
    test::expect_equal(uq.host(), gq.host(), "unpacked q");
    test::expect_equal(uk.host(), gk.host(), "unpacked k");
    const std::vector<float> p = packed.host();
    EXPECT_EQ(p[QD], gk.host()[0]) << "row 0's k follows its q";
  }
}

}  // namespace
}  // namespace atl
