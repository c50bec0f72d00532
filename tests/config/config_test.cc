#include "atoll/config/config.h"

#include <gtest/gtest.h>

#include "atoll/config/outer_delay_rules.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

TEST(Config, DefaultsRoundTripThroughToml) {
  Config c = parse_config("", "defaults");
  c.model.n_layers = 7;
  c.data.input = {"a.txt", "b dir/"};
  c.optim.lr = 1.5e-3;
  std::string text = config_to_toml(c);
  Config d = parse_config(text, "round-trip");
  EXPECT_EQ(config_to_toml(d), text);
  EXPECT_EQ(d.model.n_layers, 7);
  EXPECT_EQ(d.data.input.size(), 2u);
  EXPECT_DOUBLE_EQ(d.optim.lr, 1.5e-3);
}

// Strings with quotes, backslashes and control characters (found by fuzz_config: a --set
// value holding a NUL printed as TOML that did not read back, so config.toml would not resume).
TEST(Config, EveryStringPrintsAsTomlThatReadsBack) {
  Config c = parse_config("", "defaults");
  c.data.input = {std::string("a\0b", 3), "tab\there", "line\nbreak\r", "q\"uo\\te", "\x1f\x7f"};
  const std::string text = config_to_toml(c);
  const Config d = parse_config(text, "round-trip");
  EXPECT_EQ(d.data.input, c.data.input);
  EXPECT_EQ(config_to_toml(d), text);
  // A bare --set string must be UTF-8, as TOML's strings are.
  EXPECT_NO_THROW(parse_config("", "x", {"data.input=caf\xc3\xa9"}));
  for (const char* bad : {"data.input=x\xff", "data.input=\xc0\xaf", "data.input=\xed\xa0\x80", "data.input=\xe2\x82"})
    EXPECT_THROW(parse_config("", "x", {bad}), ConfigError) << bad;
}

TEST(Config, OverridesParseByDeclaredType) {
  Config c = parse_config("[model]\nn_layers = 2\n", "t.toml",
                          {"model.n_layers=3", "optim.name=muon", "optim.lr=0.01", "model.tie_embeddings=true",
                           "data.input=a.txt,b.txt"});
  EXPECT_EQ(c.model.n_layers, 3);
  EXPECT_EQ(c.optim.name, "muon");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.01);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.data.input, (std::vector<std::string>{"a.txt", "b.txt"}));
}

std::string error_of(const std::string& text, std::vector<std::string> overrides = {}) {
  try {
    parse_config(text, "bad.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, UnknownKeyIsNamedWithSuggestion) {
  std::string e = error_of("[model]\nn_layer = 2\n");
  EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_layer"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'model.n_layers'"), std::string::npos) << e;
  EXPECT_NE(error_of("[modle]\nx=1\n").find("unknown section"), std::string::npos);
  EXPECT_NE(error_of("", {"train.stepz=3"}).find("train.steps"), std::string::npos);
}

TEST(Config, WrongTypesAndRangesAreNamed) {
  EXPECT_NE(error_of("[model]\nn_layers = \"four\"\n").find("model.n_layers: expected an integer"), std::string::npos);
  EXPECT_NE(error_of("[optim]\nlr = -1.0\n").find("optim.lr: value -1.0 is out of range"), std::string::npos);
  EXPECT_NE(error_of("[optim]\nname = \"lion\"\n").find("use one of: adamw, muon, sgd"), std::string::npos);
  EXPECT_NE(error_of("[model]\nn_heads = 3\nn_kv_heads = 2\n").find("must divide"), std::string::npos);
  EXPECT_NE(error_of("[model]\nn_layers = 2\n[model]\n").find("bad.toml:"), std::string::npos);
  EXPECT_NE(error_of("", {"train.steps"}).find("expected key=value"), std::string::npos);
}

TEST(Config, AFloatForAnIntegerAndAStringForAListAreNamedAsSuch) {
  // --set train.steps=1e1 is the float 10 to TOML: the message must not read "got 10".
  const std::string f = error_of("", {"train.steps=1e1"});
  EXPECT_NE(f.find("train.steps: expected an integer, got the floating-point number"), std::string::npos) << f;
  EXPECT_NE(f.find("no decimal point or exponent"), std::string::npos) << f;
  // In a file a list is written as a list; only --set takes "a,b" for one.
  const std::string l = error_of("[model]\nrouter_layers = \"zaya\"\n");
  EXPECT_NE(l.find("model.router_layers: expected a list of strings, got the string"), std::string::npos) << l;
  EXPECT_NE(l.find("[\"zaya\"]"), std::string::npos) << l;
  EXPECT_NE(error_of("[data]\ninput = \"notes.txt\"\n").find("data.input: expected a list"), std::string::npos);
  const Config c = parse_config("", "defaults", {"data.input=a.txt,b.txt"});
  EXPECT_EQ(c.data.input, (std::vector<std::string>{"a.txt", "b.txt"}));
}

TEST(Config, FaultKeysHaveHealingDefaultsAndTheTtlMustExceedTheHeartbeat) {
  const Config c = parse_config("", "defaults");
  EXPECT_GT(c.fault.max_restarts, 0) << "a run left alone heals itself";
  EXPECT_GT(c.fault.heartbeat_ttl_s, c.fault.heartbeat_s);
  const Config d = parse_config("[fault]\nheartbeat_s = 0.5\nheartbeat_ttl_s = 2\nmax_restarts = 0\n", "f.toml");
  EXPECT_EQ(d.fault.max_restarts, 0);
  EXPECT_DOUBLE_EQ(d.fault.heartbeat_ttl_s, 2.0);
  const std::string e = error_of("[fault]\nheartbeat_s = 2\nheartbeat_ttl_s = 2\n");
  EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("fault.heartbeat_ttl_s"), std::string::npos) << e;
  EXPECT_NE(e.find("fix"), std::string::npos) << e;
  EXPECT_NE(error_of("", {"fault.max_restarts=-1"}).find("fault.max_restarts"), std::string::npos);
}

TEST(Config, PerLayerPartKindsAreChecked) {
  Config c = parse_config("[model]\nn_layers = 4\nattention_layers = [\"gqa\", \"gqa\"]\n", "t.toml",
                          {"model.router_layers=topk"});
  EXPECT_EQ(c.model.attention_layers.size(), 2u);
  EXPECT_EQ(c.model.router_at(3), "topk");
  EXPECT_EQ(parse_config(config_to_toml(c), "round-trip").model.attention_layers, c.model.attention_layers);
  EXPECT_NE(error_of("[model]\nattention_layers = [\"gqa\", \"ring\"]\n").find("model.attention_layers[1] = \"ring\""),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nn_layers = 1\nrouter_layers = [\"topk\", \"topk\"]\n").find("at most one kind per layer"),
            std::string::npos);
}

// A RoPE base per layer: model.rope_layers repeats global/local over the layers, the local ones
// rotating with model.rope_theta_local; it round-trips, and an unknown kind is refused by name.
TEST(Config, PerLayerRopeBases) {
  Config c = parse_config("[model]\nn_layers = 3\nrope_theta = 1e6\nrope_layers = [\"local\", \"global\"]\n", "t.toml",
                          {"model.rope_theta_local=500"});
  EXPECT_EQ(c.model.rope_theta_at(0), 500.0);
  EXPECT_EQ(c.model.rope_theta_at(1), 1e6);
  EXPECT_EQ(c.model.rope_theta_at(2), 500.0);
  EXPECT_TRUE(c.model.any_rope_local());
  const Config back = parse_config(config_to_toml(c), "round-trip");
  EXPECT_EQ(back.model.rope_layers, c.model.rope_layers);
  EXPECT_EQ(back.model.rope_theta_local, 500.0);
  EXPECT_FALSE(parse_config("", "t.toml").model.any_rope_local());
  EXPECT_NE(error_of("[model]\nrope_layers = [\"global\", \"sliding\"]\n").find("model.rope_layers[1] = \"sliding\""),
            std::string::npos);
}

// CCA attention and partial rotary: the kinds and keys load and round-trip; combinations that
// cannot mean a model are refused naming the keys (KV heads not dividing the query heads, a
// rotary part that is odd or empty).
TEST(Config, CcaAndPartialRotaryCombinationsAreChecked) {
  Config c = parse_config("[model]\nn_layers = 2\nattention_layers = [\"gqa\", \"cca\"]\ncca_time0 = 3\n"
                          "partial_rotary_factor = 0.5\n", "t.toml", {"model.cca_time1=4"});
  EXPECT_EQ(c.model.attention_at(1), "cca");
  EXPECT_EQ(c.model.cca_time0, 3);
  EXPECT_EQ(c.model.cca_time1, 4);
  EXPECT_EQ(c.model.rotary_dim(), c.model.head_dim / 2);
  const Config back = parse_config(config_to_toml(c), "round-trip");
  EXPECT_EQ(back.model.cca_time1, 4);
  EXPECT_EQ(back.model.partial_rotary_factor, 0.5);
  const std::string heads = error_of("[model]\nattention = \"cca\"\nn_heads = 3\nn_kv_heads = 2\n");
  EXPECT_NE(heads.find("model.n_kv_heads (2) must divide model.n_heads (3)"), std::string::npos) << heads;
  const std::string odd = error_of("[model]\nhead_dim = 6\npartial_rotary_factor = 0.5\n");
  EXPECT_NE(odd.find("model.partial_rotary_factor"), std::string::npos) << odd;
  EXPECT_NE(odd.find("fix"), std::string::npos) << odd;
  EXPECT_NE(error_of("[model]\nhead_dim = 4\npartial_rotary_factor = 0.25\n").find("at least 2"), std::string::npos);
  EXPECT_NE(error_of("[model]\nattention = \"mla\"\n").find("model.attention"), std::string::npos);
}

// diloco.outer_delay = 1 takes fragments (each its own delayed step); an overlap (nothing left to
// hide) and a time budget are refused naming both keys and the fix.
TEST(Config, TheDelayedOuterStepTakesFragmentsButNotAnOverlapOrATimeBudget) {
  const Config c = parse_config("[model]\nn_layers = 4\n", "t.toml", {"diloco.outer_delay=1", "diloco.fragments=2"});
  EXPECT_EQ(c.diloco.fragments, 2);
  for (const std::string key : {"diloco.overlap_steps=1", "diloco.sync_seconds=5"}) {
    const std::string e = error_of("[model]\nn_layers = 4\n", {"diloco.outer_delay=1", "diloco.fragments=2", key});
    EXPECT_NE(e.find("diloco.outer_delay"), std::string::npos) << e;
    EXPECT_NE(e.find(key.substr(0, key.find('='))), std::string::npos) << e;
    EXPECT_NE(e.find("fix"), std::string::npos) << e;
  }
  // The sparse expert exchange with several workers per island: its island sums would share the
  // island's group with the next round's inner steps.
  Config sparse = c;
  sparse.diloco.expert_topk = 0.25;
  EXPECT_NO_THROW(check_outer_delay_placement(sparse.diloco, 1));
  try {
    check_outer_delay_placement(sparse.diloco, 2);
    ADD_FAILURE() << "not refused";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    for (const char* k : {"diloco.outer_delay", "diloco.expert_topk", "--workers-per-island 2", "fix"})
      EXPECT_NE(what.find(k), std::string::npos) << what;
  }
  sparse.diloco.outer_delay = 0;
  EXPECT_NO_THROW(check_outer_delay_placement(sparse.diloco, 2));
}

}  // namespace
}  // namespace atl
