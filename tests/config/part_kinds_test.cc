// The table of part kinds (model/part_kinds.h), one conformance test over every entry (here
// under config/ because the config is one of the table's readers: a test links the part it
// tests and those below it). A model whose layers are all of the kind builds its rows from the
// entry, constructs its part, trains a step and decodes; the config accepts the kind by name and reads its keys; the costs agree with
// the part's buffers (work elements exactly, kept bytes linear in the batch, the decode cache and
// FLOPs as the totals sum them). And the positions parts receive: RoPE at an offset, per run.
#include "atoll/model/part_kinds.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/core/errors.h"
#include "atoll/core/rng.h"
#include "atoll/model/attention_core.h"
#include "atoll/model/decoder.h"
#include "atoll/model/model.h"

namespace atl {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 37, m.dim = 16, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 4;
  m.n_experts = 4, m.top_k = 2, m.expert_hidden = 12, m.seq_len = 9, m.init_std = 0.3;
  m.router_hidden_size = 8, m.cca_time0 = 2, m.cca_time1 = 3;
  return m;
}

template <class Kind>
void expect_entry_complete(const Kind& k) {
  EXPECT_FALSE(k.name.empty());
  EXPECT_FALSE(k.help.empty()) << k.name;
  EXPECT_TRUE(k.rows && k.make_f32 && k.make_f64 && k.validate && k.macs_per_token && k.kept_bytes && k.work_bytes &&
              k.shared_bytes && k.decode_cache && k.boundary_tokens)
      << k.name << " has an empty slot";
}

// A config with every layer of the kind trains one step, and its loss is finite; decoding three
// tokens gives finite logits. The rows the kind appends are the layer's rows under its prefix.
void expect_model_runs(const ModelConfig& m, const std::string& what) {
  const ParamLayout layout = ParamLayout::build(m);
  Model<float> model(m, 2);
  std::vector<int32_t> tok(2 * m.seq_len), tgt(2 * m.seq_len);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t(i * 7 % m.vocab_size), tgt[i] = int32_t(i * 5 % m.vocab_size);
  model.init_params(m.init_seed);
  const double loss = model.forward_backward(tok.data(), tgt.data(), 2).total();
  EXPECT_TRUE(std::isfinite(loss)) << what;
  Decoder dec(m, model.params().data(), 3);
  for (int32_t t : {1, 2, 3})
    for (float v : dec.step(t)) ASSERT_TRUE(std::isfinite(v)) << what;
}

TEST(PartKinds, EveryAttentionKindBuildsTrainsDecodesAndCostsWhatItAllocates) {
  std::set<std::string_view> names;
  for (const AttentionKind& k : attention_kinds()) {
    SCOPED_TRACE(std::string(k.name));
    expect_entry_complete(k);
    EXPECT_TRUE(names.insert(k.name).second) << "two entries named " << k.name;
    ModelConfig m = small_model();
    m.attention = std::string(k.name);
    EXPECT_EQ(&attention_kind_at(m, 1), &k);
    EXPECT_EQ(k.validate(m, 0), "");
    EXPECT_EQ(validate_part_kinds(m), "");
    // Its rows, alone in a layout, are exactly layer 0's attention rows of the whole model.
    ParamLayout alone;
    k.rows(alone, m, 0);
    const ParamLayout whole = ParamLayout::build(m);
    ASSERT_GT(alone.entries().size(), 0u);
    for (const ParamEntry& e : alone.entries()) {
      EXPECT_EQ(e.name.rfind("layers.0.attn.", 0), 0u) << e.name;
      EXPECT_EQ(whole.at(e.name).numel, e.numel) << e.name;
    }
    // The work it asks for is the work its part uses, fp32, for a batch of 2 sequences.
    PartScratch scratch;
    const PartSizes sizes{.max_batch = 2, .max_tokens = 2 * m.seq_len, .precision = Precision::kFp32};
    auto part = k.make_f32(m, whole, 0, sizes, scratch);
    auto part64 = k.make_f64(m, whole, 0, sizes, scratch);
    ASSERT_TRUE(part && part64);
    const CostShape one{.B = 1, .T = double(m.seq_len)}, two{.B = 2, .T = double(m.seq_len)};
    EXPECT_EQ(k.work_bytes(m, two), 4.0 * double(part->work_elements()));
    EXPECT_GT(k.kept_bytes(m, one), 0.0);
    EXPECT_DOUBLE_EQ(k.kept_bytes(m, two), 2 * k.kept_bytes(m, one));
    EXPECT_GT(k.macs_per_token(m), 0.0);
    // Decoding keeps at least every position's keys and values; nothing per sequence is negative.
    const KvCacheBytes cache = k.decode_cache(m);
    EXPECT_GE(cache.per_token, 2.0 * m.n_kv_heads * m.head_dim * sizeof(float));
    EXPECT_GE(cache.per_sequence, 0.0);
    EXPECT_GE(k.boundary_tokens(m), 0);
    // The totals are the sums over the layers.
    EXPECT_DOUBLE_EQ(kv_cache_bytes(m).per_token, m.n_layers * cache.per_token);
    EXPECT_DOUBLE_EQ(kv_cache_bytes(m).per_sequence, m.n_layers * cache.per_sequence);
    // The config accepts it by name, and its keys are config keys that act only with it.
    std::vector<std::string> declared;
    for (const ConfigKeyInfo& key : config_keys()) declared.push_back(key.key);
    for (std::string_view key : k.keys) {
      EXPECT_NE(std::find(declared.begin(), declared.end(), key), declared.end()) << key;
      EXPECT_TRUE(part_kind_reads(m, key)) << key;
    }
    Config cfg;
    cfg.model = m;
    EXPECT_NO_THROW(validate_config(cfg, "test"));
    expect_model_runs(m, std::string(k.name));
  }
  EXPECT_EQ(attention_kind_names(), (std::vector<std::string>{"gqa", "cca"}));
}

TEST(PartKinds, EveryRouterKindBuildsTrainsDecodesAndCostsWhatItAllocates) {
  std::set<std::string_view> names;
  for (const RouterKind& k : router_kinds()) {
    SCOPED_TRACE(std::string(k.name));
    expect_entry_complete(k);
    EXPECT_TRUE(names.insert(k.name).second) << "two entries named " << k.name;
    ModelConfig m = small_model();
    m.router = std::string(k.name);
    EXPECT_EQ(&router_kind_at(m, 0), &k);
    EXPECT_EQ(k.validate(m, 1), "");
    ParamLayout alone;
    k.rows(alone, m, 0);
    const ParamLayout whole = ParamLayout::build(m);
    ASSERT_GT(alone.entries().size(), 0u);
    for (const ParamEntry& e : alone.entries()) {
      EXPECT_EQ(e.name.rfind("layers.0.moe.", 0), 0u) << e.name;
      EXPECT_EQ(whole.at(e.name).numel, e.numel) << e.name;
    }
    PartScratch scratch;
    const PartSizes sizes{.max_batch = 2, .max_tokens = 2 * m.seq_len, .precision = Precision::kFp32};
    ASSERT_TRUE(k.make_f32(m, whole, 0, sizes, scratch) && k.make_f64(m, whole, 0, sizes, scratch));
    const CostShape one{.B = 1, .T = double(m.seq_len)}, two{.B = 2, .T = double(m.seq_len)};
    EXPECT_GT(k.kept_bytes(m, one), 0.0);
    EXPECT_DOUBLE_EQ(k.kept_bytes(m, two), 2 * k.kept_bytes(m, one));
    EXPECT_GT(k.macs_per_token(m), 0.0);
    EXPECT_EQ(k.boundary_tokens(m), 0) << "a router looks at one token";
    for (std::string_view key : k.keys) EXPECT_TRUE(part_kind_reads(m, key)) << key;
    Config cfg;
    cfg.model = m;
    EXPECT_NO_THROW(validate_config(cfg, "test"));
    expect_model_runs(m, std::string(k.name));
  }
  EXPECT_EQ(router_kind_names(), (std::vector<std::string>{"topk", "zaya"}));
}

// The FLOP count is six times the multiply-adds the kinds count, the experts' and the head's.
TEST(PartKinds, FlopsPerTokenSumsTheKindsOfEveryLayer) {
  ModelConfig m = small_model();
  m.n_layers = 3, m.attention_layers = {"gqa", "cca"}, m.router_layers = {"zaya", "topk", "zaya"};
  double macs = double(m.vocab_size) * m.dim;
  for (int l = 0; l < m.n_layers; ++l)
    macs += attention_kind_at(m, l).macs_per_token(m) + router_kind_at(m, l).macs_per_token(m) +
            m.top_k * 3.0 * m.dim * m.expert_hidden;
  EXPECT_DOUBLE_EQ(flops_per_token(m), 6 * macs);
  // A mixed model trains and decodes as well.
  expect_model_runs(m, "mixed");
}

TEST(PartKinds, AnUnknownNameIsAConfigErrorListingTheKinds) {
  ModelConfig m = small_model();
  m.attention_layers = {"gqa", "mla"};
  try {
    attention_kind_at(m, 1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1's attention \"mla\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"gqa\" or \"cca\""), std::string::npos) << e.what();
  }
  EXPECT_FALSE(part_kind_reads(m, "model.cca_time0"));  // neither layer is cca; "mla" reads nothing
  EXPECT_EQ(attention_kind_at(m, 0).name, "gqa");
}

// CCA reads back across a chunk boundary, GQA does not (context parallelism's exchange).
TEST(PartKinds, BoundaryTokensAreTheConvolutionWindow) {
  ModelConfig m = small_model();
  EXPECT_EQ(boundary_tokens(m), 0);
  m.attention_layers = {"gqa", "cca"}, m.cca_time0 = 3, m.cca_time1 = 4;
  EXPECT_EQ(boundary_tokens(m), 2 + 3);
  m.cca_time0 = 1, m.cca_time1 = 1;
  EXPECT_EQ(boundary_tokens(m), 1) << "the value shift reads the previous token";
}

// Positions: a run of tokens rotated at its start equals the same rows of the whole sequence
// rotated from 0, and backward at the same positions undoes it, for one run and for two (the
// zigzag layout's chunks r and 2P-1-r).
TEST(PartKinds, RopeAtPositionsRotatesEachRunFromItsStart) {
  const int B = 2, T = 12, NHX = 3, HD = 8;
  const auto table = RopeTable<double>::build(T, HD, 10000.0);
  Rng rng(5);
  std::vector<double> whole(size_t(B) * T * NHX * HD);
  for (auto& v : whole) v = rng.uniform() - 0.5;
  std::vector<double> rotated = whole;
  rope_forward(rotated.data(), table, B, T, NHX, HD);
  const size_t row = size_t(NHX) * HD;
  // Chunks of 3 tokens: a worker holding chunks 1 and 2 of 4 (positions 3..5 and 6..8).
  const int len = 3;
  const TokenPositions pos{.runs = 2, .start = {3, 6}, .len = {len, len}};
  std::vector<double> mine(size_t(B) * 2 * len * row);
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < 2; ++r)
      std::copy_n(whole.data() + (size_t(b) * T + pos.start[r]) * row, len * row,
                  mine.data() + (size_t(b) * 2 * len + size_t(r) * len) * row);
  std::vector<double> back = mine;
  rope_at(mine.data(), table, B, 2 * len, NHX, HD, pos, false);
  for (int b = 0; b < B; ++b)
    for (int r = 0; r < 2; ++r)
      for (size_t i = 0; i < len * row; ++i)
        ASSERT_EQ(mine[(size_t(b) * 2 * len + size_t(r) * len) * row + i],
                  rotated[(size_t(b) * T + pos.start[r]) * row + i]);
  rope_at(mine.data(), table, B, 2 * len, NHX, HD, pos, true);
  for (size_t i = 0; i < mine.size(); ++i) ASSERT_NEAR(mine[i], back[i], 1e-15);
  // One run at an offset: rope_backward takes the offset forward took.
  std::vector<double> one(whole.begin() + 5 * row, whole.begin() + 9 * row), orig = one;
  rope_forward(one.data(), table, 1, 4, NHX, HD, 5);
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], rotated[5 * row + i]);
  rope_backward(one.data(), table, 1, 4, NHX, HD, 5);
  for (size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(one[i], orig[i], 1e-15);
}

}  // namespace
}  // namespace atl
