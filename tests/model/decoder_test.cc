// The KV-cache decoder computes the same model as the training forward pass: the mean
// cross-entropy it implies over a sequence equals Model::forward's, position by position.
#include "atoll/model/decoder.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <string>

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

// ZAYA1's parts: the zaya router in every block (depth averaging across them; a skip bias of 0
// lets tokens skip) and residual scaling, its scales and biases moved off the identity.
void zaya_parts(ModelConfig& m) {
  m.router = "zaya", m.router_hidden_size = 8, m.top_k = 1, m.router_skip_bias = 0.0;
  m.residual_scaling = true, m.n_layers = 3;
}

// `seq_len` positions decoded with room for `max_len`.
void check_decoder_matches_forward(bool tied, int seq_len = 9, int max_len = 9, const std::string& attention = "gqa",
                                   void (*change)(ModelConfig&) = nullptr) {
  ModelConfig m = small_config(tied);
  m.attention = attention;
  if (attention == "cca") m.partial_rotary_factor = 0.5, m.cca_time0 = 3;
  m.seq_len = seq_len;
  if (change) change(m);
  Model<float> model(m, 1);
  model.init_params(11);
  Rng move(4);
  for (const ParamEntry& e : model.layout().entries())
    if (e.init == ParamInit::kOnes || e.init == ParamInit::kZeros)
      for (size_t i = 0; i < e.numel; ++i) model.params()[e.offset + i] += float(0.2 * move.normal());
  Rng rng(5);
  std::vector<int32_t> seq(m.seq_len + 1);
  for (auto& t : seq) t = int32_t(rng.below(m.vocab_size));
  const double ce = model.forward(seq.data(), seq.data() + 1, 1).ce;

  Decoder dec(m, model.params().data(), max_len);
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
TEST(Decoder, ZayaRouterAndResidualScalingMatchTrainingForward) {
  check_decoder_matches_forward(true, 9, 9, "gqa", zaya_parts);
}

// A RoPE base per layer (model.rope_layers): decoding rotates each layer with its own table, and
// grows both tables with the cache.
TEST(Decoder, PerLayerRopeBasesMatchTrainingForward) {
  auto local = [](ModelConfig& m) { m.rope_layers = {"global", "local"}, m.rope_theta_local = 3.0; };
  check_decoder_matches_forward(true, 9, 9, "gqa", local);
  check_decoder_matches_forward(true, 70, 1 << 30, "cca", local);
}

// The cache starts small and doubles (64, 128, 256 positions): decoding across the growths
// still computes the training forward pass, and a bound far beyond what is fed costs nothing.
TEST(Decoder, CacheGrowsAsTokensCome) { check_decoder_matches_forward(false, 150, 1 << 30); }
// CCA's caches (keys and values, the convolution window, the delayed value) through the growths.
TEST(Decoder, CcaCachesMatchTrainingForward) { check_decoder_matches_forward(true, 150, 1 << 30, "cca"); }

// The address space (/proc/self/statm's first field, pages) barely grows for a decoder bounded
// at four million positions that feeds a few: the cache is not allocated for the bound (it
// was: 4M positions x 8 floats x keys and values x 2 layers = 512 MiB). Virtual, not resident
// The decoding cache per token at ZAYA1-8B's attention shape (C 2048, 8 query heads and 2 KV
// heads of 128): keys and values of 2 heads, 8x below multi-head attention's 16 heads of 128,
// the same for gqa and cca; CCA adds a fixed window of 2 [q|k] rows and half a value per sequence.
TEST(Decoder, KvCacheBytesPerTokenAgainstMha) {
  ModelConfig m;
  m.dim = 2048, m.n_layers = 2, m.n_heads = 8, m.n_kv_heads = 2, m.head_dim = 128;
  m.attention_layers = {"gqa", "cca"};
  const KvCacheBytes k = kv_cache_bytes(m);
  EXPECT_EQ(k.per_token, 2 * (2 * 256 * 4.0));
  EXPECT_EQ(k.per_sequence, ((1 + 1) * 1280 + 128) * 4.0);  // the cca layer only
  EXPECT_EQ(mha_kv_cache_bytes_per_token(m), 2 * (2 * 2048 * 4.0));
  EXPECT_EQ(mha_kv_cache_bytes_per_token(m) / k.per_token, 8.0);
}

// size: the zero pages of an untouched allocation need not be resident.
TEST(Decoder, ALargeBoundAllocatesNothingUpFront) {
  const ModelConfig m = small_config(false);
  Model<float> model(m, 1);
  model.init_params(3);
  auto address_space_mib = [] {
    std::ifstream statm("/proc/self/statm");
    long pages = 0;
    statm >> pages;
    return double(pages) * double(sysconf(_SC_PAGESIZE)) / (1 << 20);
  };
  const double before = address_space_mib();
  Decoder dec(m, model.params().data(), 4'000'000);
  for (int t = 0; t < 5; ++t) dec.step(t);
  EXPECT_LT(address_space_mib() - before, 64.0) << "MiB";
  EXPECT_LE(dec.capacity(), 64);
}

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
