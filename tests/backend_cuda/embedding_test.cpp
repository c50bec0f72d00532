// backend/cuda/embedding.cu and sort.cu against layers/embedding.cc.
#include "atoll/backend/cuda/embedding.h"

#include <algorithm>
#include <numeric>

#include "atoll/backend/cuda/arena.h"
#include "atoll/backend/cuda/sort.h"
#include "atoll/layers/embedding.h"
#include "gpu_test_util.h"

namespace atl {
namespace {

using test::DeviceVec;
using test::randn_f;

struct Size {
  int N, C, V;
};
// One token; C below and above a block; V not a power of two (and past 2^16: five digit
// passes); N larger than the sort block's thread count with many repeated tokens.
constexpr Size kSizes[] = {{1, 1, 1}, {5, 3, 2}, {300, 257, 17}, {1000, 33, 70001}, {4099, 8, 5}};

TEST(CudaSort, StableSortMatchesStdStableSort) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const int limit : {1, 2, 16, 17, 1000, 1 << 20}) {
    for (const int n : {1, 255, 256, 257, 5000}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " limit=" << limit);
      Rng rng(n * 31 + limit);
      const auto keys = test::randint_ids(rng, n, limit);
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
      DeviceVec<int32_t> d_keys(keys), d_sorted(n), d_order(n), d_scratch(gpu::sort_scratch_ints(n));
      gpu::stable_sort_by_key(d_sorted.get(), d_order.get(), d_keys.get(), n, limit, d_scratch.get());
      const auto got_order = d_order.host(), got_sorted = d_sorted.host();
      ASSERT_EQ(got_order, order);
      for (int i = 0; i < n; ++i) ASSERT_EQ(got_sorted[i], keys[order[i]]) << i;
    }
  }
}

// Forward is a copy: exact. Sorted backward adds each token's rows in position order onto
// dwte, the CPU's order, so it is exact too. Atomic backward adds in any order: the largest
// case sums ~820 unit normals per element (N = 4099, V = 5), a random-walk rounding error of
// about sqrt(820)·6e-8·30 ≈ 5e-5 on partial sums up to ~30: 2e-4 absolute + 1e-5 relative.
TEST(CudaEmbedding, ForwardAndBackwardMatchCpu) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Size s : kSizes) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " V=" << s.V);
    Rng rng(s.N + s.V);
    const auto tokens = test::randint_ids(rng, s.N, s.V);
    const auto wte = randn_f(rng, size_t(s.V) * s.C), dout = randn_f(rng, size_t(s.N) * s.C);
    const auto dwte0 = randn_f(rng, size_t(s.V) * s.C);
    std::vector<float> out(size_t(s.N) * s.C), dwte = dwte0;
    embedding_forward(out.data(), tokens.data(), wte.data(), s.N, s.C, s.V);
    embedding_backward(dwte.data(), dout.data(), tokens.data(), s.N, s.C);

    DeviceVec<int32_t> d_tok(tokens), d_scratch(gpu::embedding_scratch_ints(s.N));
    DeviceVec<float> d_wte(wte), d_dout(dout), d_out(out.size()), d_sorted(dwte0), d_atomic(dwte0);
    d_out.fill_nan();
    gpu::check_ids(d_tok.get(), s.N, s.V, "token");
    gpu::embedding_forward(d_out.get(), d_tok.get(), d_wte.get(), s.N, s.C, s.V);
    gpu::embedding_backward(d_sorted.get(), d_dout.get(), d_tok.get(), s.N, s.C, s.V, gpu::Scatter::kSorted,
                            d_scratch.get());
    gpu::embedding_backward(d_atomic.get(), d_dout.get(), d_tok.get(), s.N, s.C, s.V, gpu::Scatter::kAtomic, nullptr);
    test::expect_equal(d_out.host(), out, "out");
    test::expect_equal(d_sorted.host(), dwte, "dwte (sorted)");
    test::expect_near(d_atomic.host(), dwte, 2e-4, 1e-5, "dwte (atomic)");
  }
}

TEST(CudaEmbedding, CheckIdsNamesTheBadToken) {
  ATOLL_SKIP_WITHOUT_GPU();
  DeviceVec<int32_t> d_tok(std::vector<int32_t>{0, 3, 9, 2});
  EXPECT_NO_THROW(gpu::check_ids(d_tok.get(), 4, 10, "token"));
  try {
    gpu::check_ids(d_tok.get(), 4, 9, "token");
    FAIL() << "expected CheckError";
  } catch (const CheckError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9 at position 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atl
