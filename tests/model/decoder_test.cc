// The KV-cache decoder computes the same model as the training forward pass: the mean
// cross-entropy it implies over a sequence equals Model::forward's, position by position. Its
// prefill leaves what token-by-token decoding leaves (below).
#include "atoll/model/decoder.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "atoll/core/check.h"
#include "atoll/model/model.h"
#include "model/logit_compare.h"

namespace atl {
namespace {

using testing::greedy;
using testing::logit_error;

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

// Parameters at random, the gains and biases moved off their identity values (so that a part
// that skipped them would show).
void init_off_identity(Model<float>& model) {
  model.init_params(11);
  Rng move(4);
  for (const ParamEntry& e : model.layout().entries())
    if (e.init == ParamInit::kOnes || e.init == ParamInit::kZeros)
      for (size_t i = 0; i < e.numel; ++i) model.params()[e.offset + i] += float(0.2 * move.normal());
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
  init_off_identity(model);
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
  {  // the OpenMP team, and its threads' malloc arenas (address space, 64 MiB each), made first
    Decoder warm(m, model.params().data(), 8);
    for (int t = 0; t < 5; ++t) warm.step(t);
  }
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

// Decoder::prefill feeds a block of tokens at once (the blocks' batched kernels, the block's
// attention against the cache before it) and leaves what token-by-token decoding leaves: the
// same logits after the prompt and at every step after it (within 1e-5 of the largest |logit|:
// fp32, the same terms summed in another order; the measured worst is printed), the same
// greedy tokens. GQA (with q/k norm and q/k/v biases) and CCA with ZAYA1's router and residual
// scaling (zaya1-tiny's kinds); prompts that are no multiple of the block, blocks shorter than
// CCA's convolution window, prompts of several query tiles and key chunks, a prefill after steps.
ModelConfig prefill_model(const std::string& attention) {
  ModelConfig m = small_config(false);
  m.attention = attention, m.seq_len = 32;
  if (attention == "gqa") m.qk_norm = "head", m.qkv_bias = true;
  if (attention == "cca") m.cca_time0 = 2, m.cca_time1 = 3, m.partial_rotary_factor = 0.5, zaya_parts(m);
  return m;
}

// A prompt of `len` tokens prefilled `block` at a time (after `steps_first` of them fed by step)
// against the same prompt token by token, then `gen` greedy tokens on each.
void check_prefill(const std::string& attention, int len, int block, int steps_first = 0, int gen = 8) {
  const ModelConfig m = prefill_model(attention);
  Model<float> model(m, 1);
  init_off_identity(model);
  const std::vector<float>& params = model.params();
  Rng rng(7);
  std::vector<int32_t> prompt(len);
  for (int32_t& t : prompt) t = int32_t(rng.below(m.vocab_size));
  const int max_len = len + gen;
  Decoder one(m, params.data(), max_len), pre(m, params.data(), max_len, nullptr, block);
  const std::string what = attention + ", prompt " + std::to_string(len) + ", block " + std::to_string(block) +
                           ", " + std::to_string(steps_first) + " steps first";
  std::vector<float> a, b;
  for (int32_t t : prompt) a = one.step(t);
  for (int i = 0; i < steps_first; ++i) b = pre.step(prompt[i]);
  b = pre.prefill(prompt.data() + steps_first, len - steps_first);
  EXPECT_EQ(pre.pos(), len) << what;
  double worst = logit_error(a, b);
  for (int i = 0; i < gen; ++i) {
    const int32_t ta = greedy(a), tb = greedy(b);
    EXPECT_EQ(ta, tb) << what << ": greedy token " << i << " after the prompt";
    a = one.step(ta), b = pre.step(tb);
    worst = std::max(worst, logit_error(a, b));
  }
  EXPECT_LE(worst, 1e-5) << what;
  std::printf("%s: worst logit error %.3g\n", what.c_str(), worst);
}

TEST(DecoderPrefill, GqaMatchesTokenByToken) {
  for (int len : {1, 7, 13}) check_prefill("gqa", len, 5);
  check_prefill("gqa", 13, 64);  // the whole prompt in one block
  check_prefill("gqa", 9, 4, 3);  // steps, then a prefill that continues from position 3
}

TEST(DecoderPrefill, CcaMatchesTokenByToken) {
  for (int len : {1, 7, 13}) check_prefill("cca", len, 5);
  check_prefill("cca", 13, 2);  // blocks shorter than the convolutions' window (3 rows back)
  check_prefill("cca", 9, 4, 3);
}

// Several query tiles (64 rows) and key chunks (512 keys) in one pass, and a block that starts
// past the first chunk of keys.
TEST(DecoderPrefill, LongPromptsMatchTokenByToken) {
  check_prefill("gqa", 600, 530, 0, 2);
  check_prefill("cca", 600, 530, 0, 2);
}

// A block of at most max_block tokens a pass, and a prefill past the bound is refused.
TEST(DecoderPrefill, TheBlockIsBoundedByTheCache) {
  const ModelConfig m = prefill_model("gqa");
  Model<float> model(m, 1);
  init_off_identity(model);
  const std::vector<float>& params = model.params();
  EXPECT_EQ(Decoder(m, params.data(), 10, nullptr, 4096).max_block(), 10);
  EXPECT_EQ(Decoder(m, params.data(), 10).max_block(), 1);
  Decoder dec(m, params.data(), 6, nullptr, 4);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7};
  try {
    dec.prefill(ids.data(), 7);
    ADD_FAILURE() << "a prefill of 7 positions into a cache of 6 ran";
  } catch (const CheckError& e) {
    EXPECT_NE(std::string(e.what()).find("decoder cache is full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dec.pos(), 0);  // nothing was fed
  dec.prefill(ids.data(), 6);
  EXPECT_EQ(dec.pos(), 6);
}

}  // namespace
}  // namespace atl
