// backend/cuda/moe_dispatch.cu against layers/moe_dispatch.cc.
#include "atoll/backend/cuda/moe_dispatch.h"

#include <cmath>

#include "atoll/layers/moe_dispatch.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Size {
  int N, C, E, K;
};
// One token; E not dividing the tokens; more rows than the sort's 256 threads; experts that
// receive nothing (E = 64 > R for the small case, and by chance for the large one); C longer
// than a block and not a multiple of it.
constexpr Size kSizes[] = {{1, 1, 1, 1}, {7, 5, 3, 2}, {10, 3, 64, 2}, {300, 33, 8, 3}, {1000, 257, 64, 2}};

// K distinct experts per token, as the router makes them.
std::vector<int32_t> make_topk(Rng& rng, const Size& s) {
  std::vector<int32_t> idx(size_t(s.N) * s.K);
  for (int n = 0; n < s.N; ++n)
    for (int j = 0; j < s.K; ++j) {
      int32_t e;
      bool dup;
      do {
        e = int32_t(rng.below(uint64_t(s.E)));
        dup = false;
        for (int i = 0; i < j; ++i) dup |= idx[size_t(n) * s.K + i] == e;
      } while (dup && s.K <= s.E);
      idx[size_t(n) * s.K + j] = e;
    }
  return idx;
}

// The routing, dispatch and combine of topk on the device against the CPU's. Only the rows of
// the routed slots (offsets[E] of them) are compared where a kernel writes rows: the rows of
// skipped slots (kNoExpert) belong to no expert. ye's rows past offsets[E] hold NaN: a kernel
// that read them would poison its output.
// Routing and the copies are exact. dispatch_backward adds the same rows in the same order,
// so it is exact too. combine: K products summed, the GPU possibly fusing: 1e-6 absolute;
// dtopk_w is a dot of C terms in a tree: 1e-5 absolute + 1e-5 relative.
void expect_matches_cpu(const Size& s, const std::vector<int32_t>& topk, Rng& rng) {
  const size_t R = size_t(s.N) * s.K;
  ExpertRouting routing;
  build_routing(routing, topk.data(), s.N, s.E, s.K);
  const size_t routed = size_t(routing.offsets[s.E]);
  auto ye = randn_f(rng, R * s.C);
  for (size_t i = routed * s.C; i < ye.size(); ++i) ye[i] = std::nanf("");
  const auto x = randn_f(rng, size_t(s.N) * s.C), dxe = randn_f(rng, R * s.C);
  const auto w = randn_f(rng, R), dout = randn_f(rng, size_t(s.N) * s.C), dx0 = randn_f(rng, x.size());
  std::vector<float> xe(R * s.C), dx = dx0, out(x.size()), dye(R * s.C), dw(R);
  dispatch_forward(xe.data(), x.data(), routing, s.N, s.C, s.K);
  dispatch_backward(dx.data(), dxe.data(), routing, s.N, s.C, s.K);
  combine_forward(out.data(), ye.data(), w.data(), routing, s.N, s.C, s.K);
  combine_backward(dye.data(), dw.data(), dout.data(), ye.data(), w.data(), routing, s.N, s.C, s.K);

  DeviceVec<int32_t> d_topk(topk), d_offsets(s.E + 1), d_row_token(R), d_slot_row(R),
      d_scratch(gpu::routing_scratch_ints(s.N, s.K));
  const gpu::DeviceRouting dr{d_offsets.get(), d_row_token.get(), d_slot_row.get()};
  gpu::build_routing(dr, d_topk.get(), s.N, s.E, s.K, d_scratch.get());
  EXPECT_EQ(d_offsets.host(), routing.offsets);
  const std::vector<int32_t> row_token = d_row_token.host();
  EXPECT_EQ(std::vector<int32_t>(row_token.begin(), row_token.begin() + long(routed)),
            std::vector<int32_t>(routing.row_token.begin(), routing.row_token.begin() + long(routed)));
  EXPECT_EQ(d_slot_row.host(), routing.slot_row);

  DeviceVec<float> d_x(x), d_dxe(dxe), d_ye(ye), d_w(w), d_dout(dout), d_xe(xe.size()), d_dx(dx0), d_out(out.size()),
      d_dye(dye.size()), d_dw(R);
  for (auto* d : {&d_xe, &d_out, &d_dye, &d_dw}) d->fill_nan();
  gpu::dispatch_forward(d_xe.get(), d_x.get(), dr, s.N, s.C, s.K);
  gpu::dispatch_backward(d_dx.get(), d_dxe.get(), dr, s.N, s.C, s.K);
  gpu::combine_forward(d_out.get(), d_ye.get(), d_w.get(), dr, s.N, s.C, s.K);
  gpu::combine_backward(d_dye.get(), d_dw.get(), d_dout.get(), d_ye.get(), d_w.get(), dr, s.N, s.C, s.K);
  const auto head = [&](const std::vector<float>& v) {  // the routed rows
    return std::vector<float>(v.begin(), v.begin() + long(routed * s.C));
  };
  test::expect_equal(head(d_xe.host()), head(xe), "xe");
  test::expect_equal(d_dx.host(), dx, "dx");
  test::expect_near(d_out.host(), out, 1e-6, 1e-6, "out");
  test::expect_equal(head(d_dye.host()), head(dye), "dye");
  test::expect_near(d_dw.host(), dw, 1e-5, 1e-5, "dtopk_w");
}

TEST(CudaMoeDispatch, RoutingDispatchAndCombineMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " E=" << s.E << " K=" << s.K);
    Rng rng(s.N * 11 + s.E);
    expect_matches_cpu(s, make_topk(rng, s), rng);
  }
}

// Slots of expert id kNoExpert (the zaya router's skip class; every third slot, and the whole
// first token's): the same routing as the CPU (those slots sort after every expert's rows,
// slot_row -1), no row of theirs is read, they add 0 to their token and get d(weight) 0.
TEST(CudaMoeDispatch, SkippedSlotsReachNoExpert) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " E=" << s.E << " K=" << s.K);
    Rng rng(s.N * 13 + s.E);
    auto topk = make_topk(rng, s);
    for (size_t i = 0; i < topk.size(); ++i)
      if (i % 3 == 2 || i < size_t(s.K)) topk[i] = kNoExpert;
    expect_matches_cpu(s, topk, rng);
  }
}

}  // namespace
}  // namespace atl
