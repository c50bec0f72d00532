// Model::topk_choice_counts, what the load metrics of a softmax top-k router and the outer
// step's per-expert weights (diloco.expert_merge) are computed from: every slot the training
// passes since zero_grads() gave an expert, per layer; nothing from a loss-only forward
// (validation); a zaya router's skipped slots go to no expert.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/model/model.h"

namespace atl {
namespace {

ModelConfig mixed_routers() {
  ModelConfig m;
  m.vocab_size = 29, m.dim = 16, m.n_layers = 3, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 8;
  m.n_experts = 5, m.top_k = 2, m.expert_hidden = 8, m.seq_len = 7, m.init_std = 0.3;
  m.router_hidden_size = 4;
  m.router_layers = {"topk", "zaya", "topk"};  // layer 1: the zaya router
  return m;
}

// N + 1 tokens: inputs [0, N), targets [1, N].
std::vector<int32_t> random_tokens(const ModelConfig& m, int N) {
  Rng rng(9);
  std::vector<int32_t> tokens(size_t(N) + 1);
  for (auto& t : tokens) t = int32_t(rng.below(m.vocab_size));
  return tokens;
}

double layer_sum(const std::vector<double>& counts, int layer, int E) {
  return std::accumulate(counts.begin() + layer * E, counts.begin() + (layer + 1) * E, 0.0);
}

TEST(RouterChoiceCounts, CountEverySlotOfTheTrainingPassesOnly) {
  const ModelConfig m = mixed_routers();
  const int B = 2, N = B * m.seq_len, E = m.n_experts;
  Model<float> model(m, B);
  model.init_params(3);
  const std::vector<int32_t> tokens = random_tokens(m, N);

  model.zero_grads();
  model.forward_backward(tokens.data(), tokens.data() + 1, B, 0.5);
  model.forward_backward(tokens.data(), tokens.data() + 1, B, 0.5);  // a second micro-batch adds
  const std::vector<double> trained = model.topk_choice_counts();
  ASSERT_EQ(trained.size(), size_t(m.n_layers) * E);
  EXPECT_EQ(layer_sum(trained, 0, E), 2.0 * N * m.top_k);
  EXPECT_EQ(layer_sum(trained, 1, E), 2.0 * N * m.top_k) << "the zaya router: its skip bias (-1) keeps the skip class below every expert";
  EXPECT_EQ(layer_sum(trained, 2, E), 2.0 * N * m.top_k);
  // Top-2 of 5 never picks one expert twice for a token: no expert exceeds one slot per token.
  for (int e = 0; e < E; ++e) EXPECT_LE(trained[e], 2.0 * N);

  model.forward(tokens.data(), tokens.data() + 1, B);  // validation leaves the counts alone
  EXPECT_EQ(model.topk_choice_counts(), trained);

  model.zero_grads();
  const std::vector<double> cleared = model.topk_choice_counts();
  EXPECT_EQ(std::accumulate(cleared.begin(), cleared.end(), 0.0), 0.0);
}

// A skip class whose bias dwarfs every probability takes one of each token's K = 2 slots: the
// zaya layer counts the other slot only.
TEST(RouterChoiceCounts, AZayaRoutersSkippedSlotsGoToNoExpert) {
  ModelConfig m = mixed_routers();
  m.router_skip_bias = 1e4;
  const int B = 2, N = B * m.seq_len, E = m.n_experts;
  Model<float> model(m, B);
  model.init_params(3);
  const std::vector<int32_t> tokens = random_tokens(m, N);
  model.zero_grads();
  model.forward_backward(tokens.data(), tokens.data() + 1, B);
  const std::vector<double> trained = model.topk_choice_counts();
  EXPECT_EQ(layer_sum(trained, 1, E), double(N));
  EXPECT_EQ(layer_sum(trained, 0, E), double(N) * m.top_k);  // the top-k layers have no skip class
}

}  // namespace
}  // namespace atl
