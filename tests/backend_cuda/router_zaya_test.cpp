// The kernels of ZAYA1's parts against their CPU references: backend/cuda/router_zaya.cu
// against layers/router_zaya.cc and model/router_zaya.cc's depth averaging and loads,
// gelu.cu against layers/gelu.cc, bias.cu and residual_affine.cu against plain loops written
// from model/router_zaya.cc's add_bias/bias_grad and model/norm_residual.cc's ResidualMerge.
#include "atoll/backend/cuda/router_zaya.h"

#include <cmath>
#include <vector>

#include "atoll/backend/cuda/bias.h"
#include "atoll/backend/cuda/gelu.h"
#include "atoll/backend/cuda/residual_affine.h"
#include "atoll/layers/gelu.h"
#include "atoll/layers/router_zaya.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

// Sizes: one token; a single class beyond the skip class; K = E1 (every class taken); rows
// above a block of threads; widths not a multiple of anything.
struct Size {
  int N, E1, K, R;
};
constexpr Size kSizes[] = {{1, 2, 1, 1}, {7, 5, 2, 11}, {9, 4, 4, 3}, {300, 17, 1, 33}, {1031, 9, 3, 257}};

// Choices exactly (continuous random logits: a near-tie within expf's ulp has probability ~1e-6),
// the skip class as kNoExpert in topk_idx with gate 0; probabilities and gates 1e-6 absolute;
// dlogits (double per token on both sides, from fp32 inputs) 1e-6 absolute.
TEST(CudaRouterZaya, RouteForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " E1=" << s.E1 << " K=" << s.K);
    Rng rng(s.N * 7 + s.E1);
    const auto logits = randn_f(rng, size_t(s.N) * s.E1, 2.0), biases = randn_f(rng, s.E1, 0.2);
    const size_t NK = size_t(s.N) * s.K;
    std::vector<float> probs(logits.size()), gate(NK), dlogits(logits.size());
    std::vector<int32_t> choice(NK);
    zaya_route_forward(probs.data(), choice.data(), gate.data(), logits.data(), biases.data(), s.N, s.E1, s.K);
    const auto dgate = randn_f(rng, NK);
    zaya_route_backward(dlogits.data(), dgate.data(), probs.data(), choice.data(), s.N, s.E1, s.K);

    DeviceVec<float> d_logits(logits), d_biases(biases), d_probs(probs.size()), d_gate(NK), d_dgate(dgate),
        d_dlogits(dlogits.size());
    DeviceVec<int32_t> d_choice(NK), d_idx(NK);
    for (auto* d : {&d_probs, &d_gate, &d_dlogits}) d->fill_nan();
    gpu::zaya_route_forward(d_probs.get(), d_choice.get(), d_gate.get(), d_idx.get(), d_logits.get(), d_biases.get(),
                            s.N, s.E1, s.K);
    EXPECT_EQ(d_choice.host(), choice);
    std::vector<int32_t> idx = choice;
    for (auto& c : idx) c = c == s.E1 - 1 ? -1 : c;
    EXPECT_EQ(d_idx.host(), idx);
    test::expect_near(d_probs.host(), probs, 1e-6, 0.0, "probs");
    test::expect_near(d_gate.host(), gate, 1e-6, 0.0, "gate");
    gpu::zaya_route_backward(d_dlogits.get(), d_dgate.get(), d_probs.get(), d_choice.get(), s.N, s.E1, s.K);
    test::expect_near(d_dlogits.host(), dlogits, 1e-6, 0.0, "dlogits");

    // The loads: count/(tokens*K) scaled, added (+=) to what the slots held; tokens = N, and
    // under context parallelism the whole sequences' tokens (here 3N: a rank holding a third).
    std::vector<int64_t> counts(s.E1);
    zaya_class_counts(counts.data(), choice.data(), s.N, s.E1, s.K);
    const auto loads0 = randn_f(rng, s.E1);
    for (const int share : {1, 3}) {
      std::vector<float> loads = loads0;
      for (int e = 0; e < s.E1; ++e) loads[e] += float(0.25 * double(counts[e]) / (double(share) * s.N * s.K));
      DeviceVec<float> d_loads(loads0);
      gpu::zaya_class_loads(d_loads.get(), d_choice.get(), s.N, s.E1, s.K, 0.25, double(share) * s.N);
      test::expect_equal(d_loads.host(), loads, share == 1 ? "loads" : "loads of a third of the tokens");
    }
  }
}

// Depth averaging: s += s_prev ⊙ scale exactly (one product and add per element, no fusion
// difference beyond an fma: 1e-6); its backward's column sums in double of N products: 1e-5
// relative to the column's sum of magnitudes; d(s_prev) = ds ⊙ scale exactly. Bias add and
// its column sums the same way.
TEST(CudaRouterZaya, DepthAveragingAndBiasMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " R=" << s.R);
    Rng rng(s.N + s.R);
    const size_t NR = size_t(s.N) * s.R;
    const auto s0 = randn_f(rng, NR), sp = randn_f(rng, NR), scale = randn_f(rng, s.R), ds = randn_f(rng, NR);
    const auto dscale0 = randn_f(rng, s.R), b = randn_f(rng, s.R);
    std::vector<float> s1 = s0, dprev(NR), dscale = dscale0, with_bias = s0, db = dscale0;
    std::vector<double> mag(s.R);
    for (int r = 0; r < s.R; ++r) {
      double acc = 0, accb = 0;
      for (int n = 0; n < s.N; ++n) {
        const size_t k = size_t(n) * s.R + r;
        s1[k] += sp[k] * scale[r];
        with_bias[k] += b[r];
        dprev[k] = ds[k] * scale[r];
        acc += double(ds[k]) * sp[k], accb += ds[k];
        mag[r] += std::fabs(double(ds[k]) * sp[k]) + std::fabs(ds[k]);
      }
      dscale[r] += float(acc), db[r] += float(accb);
    }
    DeviceVec<float> d_s(s0), d_sp(sp), d_scale(scale), d_ds(ds), d_dprev(NR), d_dscale(dscale0), d_b(b), d_wb(s0),
        d_db(dscale0);
    d_dprev.fill_nan();
    gpu::zaya_depth_forward(d_s.get(), d_sp.get(), d_scale.get(), s.N, s.R);
    gpu::zaya_depth_backward(d_dscale.get(), d_dprev.get(), d_ds.get(), d_sp.get(), d_scale.get(), s.N, s.R);
    gpu::add_bias(d_wb.get(), d_b.get(), s.N, s.R);
    gpu::bias_backward(d_db.get(), d_ds.get(), s.N, s.R);
    test::expect_near(d_s.host(), s1, 1e-6, 1e-6, "s");
    test::expect_equal(d_dprev.host(), dprev, "d(s_prev)");
    test::expect_equal(d_wb.host(), with_bias, "s + bias");
    const std::vector<float> got_dscale = d_dscale.host(), got_db = d_db.host();
    for (int r = 0; r < s.R; ++r) {
      EXPECT_NEAR(got_dscale[r], dscale[r], 1e-5 * (mag[r] + std::fabs(dscale0[r]))) << "d(scale) " << r;
      EXPECT_NEAR(got_db[r], db[r], 1e-5 * (mag[r] + std::fabs(dscale0[r]))) << "d(bias) " << r;
    }
  }
}

// Exact GELU: erff/expf against std::erf/std::exp in fp32, a few ulp: 1e-6 absolute and relative.
TEST(CudaRouterZaya, GeluMatchesCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const size_t n : {size_t(1), size_t(255), size_t(4099)}) {
    Rng rng(n);
    const auto x = randn_f(rng, n, 3.0), dout = randn_f(rng, n);
    std::vector<float> y(n), dx(n);
    gelu_forward(y.data(), x.data(), n);
    gelu_backward(dx.data(), dout.data(), x.data(), n);
    DeviceVec<float> d_x(x), d_dout(dout), d_y(n), d_dx(n);
    d_y.fill_nan(), d_dx.fill_nan();
    gpu::gelu_forward(d_y.get(), d_x.get(), n);
    gpu::gelu_backward(d_dx.get(), d_dout.get(), d_x.get(), n);
    test::expect_near(d_y.host(), y, 1e-6, 1e-6, "gelu");
    test::expect_near(d_dx.host(), dx, 1e-6, 1e-6, "gelu'");
  }
}

// Residual scaling, with and without a stream, written from ResidualMerge's loops: the forward
// to an fma's rounding (1e-6), da and d(stream) exactly, the rows' gradients (column sums in
// double of N terms) to 1e-5 of their sums of magnitudes.
TEST(CudaResidualAffine, ForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size sz : kSizes)
    for (const bool stream : {true, false}) {
      const int N = sz.N, C = sz.R;
      SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " stream=" << stream);
      Rng rng(N * 5 + C + stream);
      const size_t NC = size_t(N) * C;
      const auto a = randn_f(rng, NC), r = randn_f(rng, NC), g = randn_f(rng, NC);
      const auto as = randn_f(rng, C), ab = randn_f(rng, C), rs = randn_f(rng, C), rb = randn_f(rng, C);
      const auto grad0 = randn_f(rng, 4 * size_t(C));
      std::vector<float> out(NC), da(NC), dstream = g, grads = grad0;
      std::vector<double> mag(C);
      for (int i = 0; i < C; ++i) {
        double s_as = 0, s_g = 0, s_rs = 0;
        for (int n = 0; n < N; ++n) {
          const size_t k = size_t(n) * C + i;
          out[k] = (a[k] + ab[i]) * as[i] + (stream ? (r[k] + rb[i]) * rs[i] : 0.f);
          s_as += double(g[k]) * (a[k] + ab[i]), s_g += g[k];
          if (stream) s_rs += double(g[k]) * (r[k] + rb[i]);
          mag[i] += std::fabs(g[k]) * (std::fabs(a[k] + ab[i]) + std::fabs(r[k] + rb[i]) + 1);
          da[k] = g[k] * as[i];
          if (stream) dstream[k] = g[k] * rs[i];
        }
        grads[i] += float(s_as), grads[C + i] += float(s_g * as[i]);
        if (stream) grads[2 * C + i] += float(s_rs), grads[3 * C + i] += float(s_g * rs[i]);
      }
      DeviceVec<float> d_a(a), d_r(r), d_as(as), d_ab(ab), d_rs(rs), d_rb(rb), d_out(NC), d_da(NC), d_ds(g),
          d_grads(grad0);
      d_out.fill_nan(), d_da.fill_nan();
      const gpu::ResidualAffineRows<const float> w{d_as.get(), d_ab.get(), stream ? d_rs.get() : nullptr,
                                                   stream ? d_rb.get() : nullptr};
      float* dg = d_grads.get();
      const gpu::ResidualAffineRows<float> dw{dg, dg + C, stream ? dg + 2 * C : nullptr, stream ? dg + 3 * C : nullptr};
      gpu::residual_affine_forward(d_out.get(), d_a.get(), stream ? d_r.get() : nullptr, w, N, C);
      gpu::residual_affine_backward(d_da.get(), d_ds.get(), dw, d_a.get(), stream ? d_r.get() : nullptr, w, N, C);
      test::expect_near(d_out.host(), out, 1e-6, 1e-6, "out");
      test::expect_equal(d_da.host(), da, "da");
      test::expect_equal(d_ds.host(), dstream, "d(stream)");
      const std::vector<float> got = d_grads.host();
      for (int j = 0; j < 4 * C; ++j)
        EXPECT_NEAR(got[j], grads[j],
                    1e-5 * (mag[j % C] * (1 + std::fabs(as[j % C]) + std::fabs(rs[j % C])) + std::fabs(grad0[j])))
            << "row gradient " << j;
    }
}

}  // namespace
}  // namespace atl
