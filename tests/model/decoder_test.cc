// The KV-cache decoder computes the same model as the training forward pass: the mean
// cross-entropy it implies over a sequence equals Model::forward's, position by position.
#include "atoll/model/decoder.h"

#include <gtest/gtest.h>

#include <cmath>

#include "atoll/model/model.h"

namespace atl {
namespace {

ModelConfig small_config(bool tied) {
  ModelConfig m;
  m.vocab_size = 37;
  m.dim = 16;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 4;
  m.n_experts = 4;
  m.top_k = 2;
  m.expert_hidden = 12;
  m.seq_len = 9;
  m.init_std = 0.3;
  m.tie_embeddings = tied;
  return m;
}

void check_decoder_matches_forward(bool tied) {
  const ModelConfig m = small_config(tied);
  Model<float> model(m, 1);
  model.init_params(11);
  Rng rng(5);
  std::vector<int32_t> seq(m.seq_len + 1);
  for (auto& t : seq) t = int32_t(rng.below(m.vocab_size));
  const double ce = model.forward(seq.data(), seq.data() + 1, 1).ce;

  Decoder dec(m, model.params().data(), m.seq_len);
  double sum = 0;
  for (int t = 0; t < m.seq_len; ++t) {
    const std::vector<float>& logits = dec.step(seq[t]);
    double mx = logits[0], z = 0;
    for (float x : logits) mx = std::max<double>(mx, x);
    for (float x : logits) z += std::exp(x - mx);
    sum += mx + std::log(z) - logits[seq[t + 1]];
  }
  EXPECT_NEAR(sum / m.seq_len, ce, 1e-5 * std::abs(ce));  // fp32, different summation order
}

TEST(Decoder, KvCacheMatchesTrainingForward) { check_decoder_matches_forward(false); }
TEST(Decoder, KvCacheMatchesTrainingForwardTied) { check_decoder_matches_forward(true); }

TEST(Decoder, SamplingIsSeededAndGreedyAtZeroTemperature) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -3.0f};
  Rng a(1), b(1);
  EXPECT_EQ(sample_token(logits, {.temperature = 0.0, .top_p = 1.0}, a), 1);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(sample_token(logits, {.temperature = 1.0, .top_p = 0.9}, a),
              sample_token(logits, {.temperature = 1.0, .top_p = 0.9}, b));
  // top_p small keeps only the most probable token.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits, {.temperature = 1.0, .top_p = 0.01}, a), 1);
}

}  // namespace
}  // namespace atl
