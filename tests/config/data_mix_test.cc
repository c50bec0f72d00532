// data.mix and data.phases: parsed from inline tables and [[data.mix]] arrays, written back, and
// every bad value refused with the file, the key and the fix.
#include <gtest/gtest.h>

#include "atoll/config/config.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

std::string error_of(const std::string& text, std::vector<std::string> overrides = {}) {
  try {
    parse_config(text, "mix.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DataMix, ParsesAndRoundTrips) {
  const Config c = parse_config("[data]\nmix = [{dir = \"web\", weight = 0.7}, {dir = \"code\", weight = 3}]\n", "m.toml");
  ASSERT_EQ(c.data.mix.size(), 2u);
  EXPECT_EQ(c.data.mix[0], (MixSource{"web", 0.7}));
  EXPECT_EQ(c.data.mix[1], (MixSource{"code", 3.0}));
  EXPECT_EQ(parse_config(config_to_toml(c), "round-trip").data.mix, c.data.mix);
  ASSERT_EQ(data_phases(c.data).size(), 1u);
  EXPECT_EQ(data_phases(c.data)[0].mix, c.data.mix);

  // TOML's array-of-tables form; a weight left out of a mixture of one dataset is 1.
  const Config t = parse_config("[[data.mix]]\ndir = \"a\"\nweight = 1\n[[data.mix]]\ndir = \"b\"\nweight = 2\n", "t.toml");
  EXPECT_EQ(t.data.mix, (std::vector<MixSource>{{"a", 1.0}, {"b", 2.0}}));
  EXPECT_EQ(parse_config("[[data.mix]]\ndir = \"a\"\n", "one.toml").data.mix, (std::vector<MixSource>{{"a", 1.0}}));

  const Config p = parse_config(
      "[data]\nphases = [{at_tokens = 0, mix = [{dir = \"web\"}]}, {at_tokens = 2000000, mix = [{dir = \"web\", weight = "
      "1}, {dir = \"code\", weight = 1}]}]\n",
      "p.toml");
  ASSERT_EQ(p.data.phases.size(), 2u);
  EXPECT_EQ(p.data.phases[1].at_tokens, 2000000);
  EXPECT_EQ(parse_config(config_to_toml(p), "round-trip").data.phases, p.data.phases);
  EXPECT_EQ(data_phases(p.data), p.data.phases);
  EXPECT_TRUE(data_phases(Config{}.data).empty());
  EXPECT_TRUE(parse_config("[data]\nmix = []\nphases = []\n", "empty.toml").data.mix.empty()) << "[] is no mixture";

  const Config s = parse_config("", "set", {"data.mix=[{dir = \"x\", weight = 2}]"});
  EXPECT_EQ(s.data.mix, (std::vector<MixSource>{{"x", 2.0}}));
}

// Context extension: ZAYA1's 4k -> 32k with theta raised and a smaller batch, written back as
// dotted keys; config_at_tokens puts a phase's settings in force from its at_tokens on.
TEST(DataMix, PhaseSettingsRoundTripAndApply) {
  const Config x = parse_config(
      "[model]\nseq_len = 4096\n[data]\nphases = [{at_tokens = 0, mix = [{dir = \"web\"}]}, {at_tokens = 1000, mix = "
      "[{dir = \"long\"}], model = {seq_len = 32768, rope_theta = 1000000}, train.batch_size = 2}]\n",
      "x.toml");
  ASSERT_EQ(x.data.phases.size(), 2u);
  EXPECT_EQ(x.data.phases[0], (DataPhase{.at_tokens = 0, .mix = {{"web", 1.0}}}));
  EXPECT_EQ(x.data.phases[1],
            (DataPhase{.at_tokens = 1000, .mix = {{"long", 1.0}}, .seq_len = 32768, .rope_theta = 1e6, .batch_size = 2}));
  EXPECT_EQ(parse_config(config_to_toml(x), "round-trip").data.phases, x.data.phases) << config_to_toml(x);
  for (const int64_t tokens : {int64_t{0}, int64_t{999}, int64_t{1000}, int64_t{5000}}) {
    const Config at = config_at_tokens(x, tokens);
    const bool extended = tokens >= 1000;
    EXPECT_EQ(at.model.seq_len, extended ? 32768 : 4096) << tokens;
    EXPECT_EQ(at.model.rope_theta, extended ? 1e6 : x.model.rope_theta) << tokens;
    EXPECT_EQ(at.train.batch_size, extended ? 2 : x.train.batch_size) << tokens;
  }
  EXPECT_EQ(config_at_tokens(Config{}, 5).model.seq_len, Config{}.model.seq_len) << "no phases: the config itself";
}

TEST(DataMix, BadValuesAreNamed) {
  struct Case {
    std::string text, must_contain;
  };
  for (const Case& c : std::vector<Case>{
           {"[data]\nmix = [{dir = \"a\", weight = 0}]\n", "data.mix[0].weight: weight 0 is not a number > 0"},
           {"[data]\nmix = [{dir = \"a\", weight = 1}, {dir = \"b\", weight = -0.5}]\n", "data.mix[1].weight"},
           {"[data]\nmix = [{dir = \"a\", weight = \"much\"}]\n", "data.mix[0].weight"},
           {"[data]\nmix = [{weight = 1}]\n", "data.mix[0].dir"},
           {"[data]\nmix = [{dir = \"a\", weight = 1}, {dir = \"b\"}]\n", "data.mix[1].weight: no weight given for \"b\" in a mixture of 2 datasets"},
           {"[data]\nmix = [{dir = \"a\", wieght = 1}]\n", "data.mix[0].wieght: unknown key"},
           {"[data]\nmix = [{dir = \"a\", weight = 1}, {dir = \"a\", weight = 1}]\n", "listed twice"},
           {"[data]\nmix = \"a\"\n", "data.mix: expected a non-empty list"},
           {"[data]\nmix = [{dir = \"a\", weight = 1}]\ndir = \"b\"\n", "data.mix is set together with data.dir"},
           {"[data]\nmix = [{dir = \"a\", weight = 1}]\ninput = [\"x.txt\"]\n", "data.mix is set together with data.input"},
           {"[data]\nmix = [{dir = \"a\", weight = 1}]\nphases = [{at_tokens = 0, mix = [{dir = \"a\", weight = 1}]}]\n",
            "data.mix and data.phases are both set"},
           {"[data]\nphases = [{at_tokens = 5, mix = [{dir = \"a\", weight = 1}]}]\n", "data.phases[0].at_tokens: the first phase must start at 0"},
           {"[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\", weight = 1}]}, {at_tokens = 0, mix = [{dir = \"b\", weight = 1}]}]\n",
            "data.phases[1].at_tokens: phases must start at increasing token counts"},
           {"[data]\nphases = [{at_tokens = 0}]\n", "data.phases[0].mix: missing"},
           {"[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\", weight = -1}]}]\n", "data.phases[0].mix[0].weight"},
           {"[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\", weight = 1}], seq_len = 9}]\n",
            "data.phases[0].seq_len: unknown key; fix: a phase holds at_tokens, mix and optionally model.seq_len, "
            "model.rope_theta and train.batch_size"},
           // Context extension: a phase sets model.seq_len, model.rope_theta and train.batch_size, nothing else.
           {"[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}], model.dim = 64}]\n",
            "data.phases[0].model.dim: a phase cannot set model.dim; fix: a phase may set model.seq_len, model.rope_theta "
            "and train.batch_size"},
           {"[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}], optim.lr = 0.1}]\n", "data.phases[0].optim: unknown key"},
           {"[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}], model.seq_len = 0}]\n", "data.phases[0].model.seq_len"},
           {"[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}], model.rope_theta = \"big\"}]\n",
            "data.phases[0].model.rope_theta: expected a number >= 1"},
           {"[model]\nseq_len = 64\n[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}]}, {at_tokens = 9, mix = [{dir = "
            "\"a\"}], model.seq_len = 32}]\n",
            "data.phases[1] trains at model.seq_len = 32, shorter than the 64 of data.phases[0]"},
           {"[train]\nbatch_size = 8\nmicro_batch_size = 4\n[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}]}, "
            "{at_tokens = 9, mix = [{dir = \"a\"}], train.batch_size = 6}]\n",
            "(with the settings of data.phases[1]): train.micro_batch_size (4) must divide train.batch_size (6)"},
           {"[model]\nattention = \"cca\"\nseq_len = 64\n[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}], "
            "model.seq_len = 2}]\n",
            "(with the settings of data.phases[0]): model.seq_len = 2 is shorter than the attention's convolution window (3 tokens"},
       }) {
    const std::string e = error_of(c.text);
    EXPECT_NE(e.find("mix.toml"), std::string::npos) << c.text << "\n" << e;
    EXPECT_NE(e.find(c.must_contain), std::string::npos) << c.text << "\n" << e;
    EXPECT_NE(e.find("fix"), std::string::npos) << c.text << "\n" << e;
  }
  // Phase settings run on the GPU too (the CUDA engine's set_sequence): the config takes them.
  EXPECT_EQ(error_of("[train]\ndevice = \"cuda\"\n[data]\nphases = [{at_tokens = 0, mix = [{dir = \"a\"}], "
                     "model.seq_len = 64}]\n"),
            "");
  // From --set, the error names the --set item.
  const std::string e = error_of("", {"data.mix=[{dir = \"a\", weight = 0}]"});
  EXPECT_NE(e.find("--set data.mix="), std::string::npos) << e;
}

}  // namespace
}  // namespace atl
