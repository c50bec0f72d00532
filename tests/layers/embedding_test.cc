// Token embedding: forward is a row gather (exact), backward a scatter-add (+=).
#include "atoll/layers/embedding.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "atoll/core/check.h"
#include "grad_check.h"

namespace atl {
namespace {

using test::check_grad;
using test::randn;

TEST(Embedding, ForwardGathersRowsExactly) {
  const int V = 5, C = 3, N = 7;
  std::vector<double> wte(V * C);
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c) wte[v * C + c] = 10 * v + c;  // row v holds 10v + c
  const std::vector<int32_t> tokens = {4, 0, 2, 2, 4, 1, 2};
  std::vector<double> out(N * C, -1.0);
  embedding_forward(out.data(), tokens.data(), wte.data(), N, C, V);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[n * C + c], 10 * tokens[n] + c) << n << "," << c;
}

TEST(Embedding, RejectsTokensOutsideVocabulary) {
  const int V = 4, C = 2;
  std::vector<float> wte(V * C, 1.0f), out(2 * C);
  const std::vector<int32_t> bad_hi = {1, 4}, bad_lo = {-1, 0};
  EXPECT_THROW(embedding_forward(out.data(), bad_hi.data(), wte.data(), 2, C, V), CheckError);
  EXPECT_THROW(embedding_forward(out.data(), bad_lo.data(), wte.data(), 2, C, V), CheckError);
}

// Repeated tokens (2 three times, 4 twice) and an unused row (3) that must get zero gradient.
TEST(EmbeddingGrad, MatchesFiniteDifferences) {
  const int V = 5, C = 3, N = 7;
  const std::vector<int32_t> tokens = {4, 0, 2, 2, 4, 1, 2};
  Rng rng(1);
  const auto wte = randn(rng, V * C);
  const auto dout = randn(rng, N * C);
  auto loss = [&](const std::vector<double>& w) {
    std::vector<double> out(N * C);
    embedding_forward(out.data(), tokens.data(), w.data(), N, C, V);
    return test::dot(out, dout);
  };
  std::vector<double> dwte(V * C, 0.0);
  embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C);
  EXPECT_TRUE(check_grad("dwte", loss, wte, dwte));
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[3 * C + c], 0.0) << "unused token row";
}

// dwte is (+=): a second call on a prefilled buffer adds the same gradient again. Integer
// values keep every sum exact, so the comparison is bit for bit.
TEST(EmbeddingGrad, AccumulatesIntoPrefilledBuffer) {
  const int V = 5, C = 3, N = 7;
  const std::vector<int32_t> tokens = {4, 0, 2, 2, 4, 1, 2};
  Rng rng(2);
  const auto dout = test::randint(rng, N * C, 9);
  const auto prefill = test::randint(rng, V * C, 100);
  std::vector<double> g(V * C, 0.0);
  embedding_backward(g.data(), dout.data(), tokens.data(), N, C);
  std::vector<double> acc = prefill;
  embedding_backward(acc.data(), dout.data(), tokens.data(), N, C);
  embedding_backward(acc.data(), dout.data(), tokens.data(), N, C);
  for (int i = 0; i < V * C; ++i) EXPECT_EQ(acc[i], prefill[i] + 2 * g[i]) << i;
}

TEST(Embedding, FloatMatchesDouble) {
  const int V = 13, C = 37, N = 29;
  Rng rng(3);
  const auto wte = randn(rng, V * C);
  const auto dout = randn(rng, N * C);
  std::vector<int32_t> tokens(N);
  for (auto& t : tokens) t = int32_t(rng.below(V));
  std::vector<double> out(N * C), dw(V * C, 0.0);
  std::vector<float> outf(N * C), dwf(V * C, 0.0f);
  embedding_forward(out.data(), tokens.data(), wte.data(), N, C, V);
  embedding_forward(outf.data(), tokens.data(), test::to_float(wte).data(), N, C, V);
  EXPECT_TRUE(test::float_close("out", outf, out, 1e-7));  // a copy: only the rounding to float
  embedding_backward(dw.data(), dout.data(), tokens.data(), N, C);
  embedding_backward(dwf.data(), test::to_float(dout).data(), tokens.data(), N, C);
  EXPECT_TRUE(test::float_close("dwte", dwf, dw));
}

}  // namespace
}  // namespace atl
