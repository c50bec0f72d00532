// config/key_effect.h: every declared key states when it has an effect, and a key the user set
// to a non-default value where it has none is named with its value and the reason.
#include "atoll/config/key_effect.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "atoll/atoll_config.h"
#include "atoll/core/errors.h"

namespace atl {
namespace {

const RunShape kTrain{};  // `atoll train`: one island, no DiLoCo, no launcher
const RunShape kLaunch2{.islands = true, .n_islands = 2, .workers_per_island = 1, .supervised = true};
const RunShape kLaunch3x2{.islands = true, .n_islands = 3, .workers_per_island = 2, .supervised = true};
const RunShape kWorker3{.islands = true, .n_islands = 3, .workers_per_island = 1, .supervised = false};

// The keys the lines name ("KEY = ..." at the start of each line).
std::set<std::string> idle(const std::string& toml, const std::vector<std::string>& overrides, const RunShape& shape) {
  std::vector<std::string> given;
  const Config c = parse_config(toml, "t.toml", overrides, &given);
  std::set<std::string> keys;
  for (const std::string& line : idle_key_lines(c, given, shape)) keys.insert(line.substr(0, line.find(" = ")));
  return keys;
}

// A new key cannot be declared without deciding when it has an effect.
TEST(KeyEffect, EveryDeclaredKeyStatesWhenItHasAnEffect) {
  std::set<std::string> declared, stated;
  for (const ConfigKeyInfo& k : config_keys()) declared.insert(k.key);
  for (const KeyEffect& e : key_effects()) {
    EXPECT_TRUE(declared.count(e.key)) << e.key << " has a row but is not a declared key";
    EXPECT_TRUE(stated.insert(e.key).second) << e.key << " has two rows";
    EXPECT_NE(e.has_effect, nullptr) << e.key;
    EXPECT_GT(std::string(e.applies).size(), 5u) << e.key;
  }
  for (const std::string& k : declared) EXPECT_TRUE(stated.count(k)) << k << " states no condition in config/key_effect.cc";
}

TEST(KeyEffect, KeysThatDoNothingHereAreNamedWithValueAndReason) {
  struct Case {
    std::vector<std::string> set;
    RunShape shape;
    std::set<std::string> idle;
  };
  const std::vector<Case> cases = {
      // DiLoCo and the islands' faults in `atoll train`, which runs one island without them.
      {{"diloco.inner_steps=5", "diloco.codec=int4", "fault.timeout_s=5", "fault.max_restarts=9", "train.steps=20"},
       kTrain, {"diloco.inner_steps", "diloco.codec", "fault.timeout_s", "fault.max_restarts"}},
      {{"diloco.inner_steps=5", "diloco.codec=int4", "fault.timeout_s=5", "fault.max_restarts=9"}, kLaunch2, {}},
      // A hand-started worker has no launcher to restart it.
      {{"fault.max_restarts=9", "fault.step_timeout_s=10", "fault.heartbeat_s=0.5"}, kWorker3,
       {"fault.max_restarts", "fault.step_timeout_s"}},
      // The whole run as a warm start: no outer step ever happens.
      {{"train.steps=20", "diloco.dp_warmup_steps=20", "diloco.outer_lr=0.5"}, kLaunch2, {"diloco.outer_lr"}},
      {{"train.steps=20", "diloco.dp_warmup_steps=10", "diloco.outer_lr=0.5"}, kLaunch2, {}},
      {{"diloco.mixing=0.2"}, kLaunch2, {"diloco.mixing"}},
      {{"diloco.mixing=0.2", "diloco.overlap_steps=2"}, kLaunch2, {}},
      {{"fault.min_cosine=0.1", "fault.outer_deadline_s=3"}, kLaunch2, {"fault.min_cosine"}},
      {{"fault.min_cosine=0.1", "fault.outer_deadline_s=3"}, kLaunch3x2, {}},
      {{"fault.spike_window=8"}, kLaunch2, {"fault.spike_window"}},
      {{"optim.zero1=true"}, kLaunch2, {"optim.zero1"}},
      {{"optim.zero1=true"}, kLaunch3x2, {}},
      // The optimizer and the schedule.
      {{"optim.name=adamw", "optim.muon_momentum=0.9", "optim.ns_steps=3"}, kTrain, {"optim.muon_momentum", "optim.ns_steps"}},
      {{"optim.name=muon", "optim.muon_momentum=0.9", "optim.ns_steps=3"}, kTrain, {}},
      {{"optim.name=sgd", "optim.beta1=0.8"}, kTrain, {"optim.beta1"}},
      {{"optim.schedule=cosine", "optim.decay_frac=0.5"}, kTrain, {"optim.decay_frac"}},
      {{"optim.schedule=constant", "optim.min_lr_ratio=0.5"}, kTrain, {"optim.min_lr_ratio"}},
      // The model's parts.
      {{"model.attention=gqa", "model.cca_time0=3"}, kTrain, {"model.cca_time0"}},
      {{"model.attention_layers=gqa,cca", "model.cca_time0=3", "model.attention=cca"}, kTrain, {"model.attention"}},
      {{"model.n_experts=1", "model.top_k=1", "model.aux_loss_coef=0.1", "model.z_loss_coef=0.1"}, kTrain,
       {"model.aux_loss_coef", "model.z_loss_coef"}},
      {{"model.router=topk", "model.router_hidden_size=64", "optim.bias_balance_lr=0.01"}, kTrain,
       {"model.router_hidden_size", "optim.bias_balance_lr"}},
      {{"model.router=zaya", "model.router_hidden_size=64", "model.aux_loss_coef=0.1"}, kTrain, {"model.aux_loss_coef"}},
      {{"model.rope_theta_local=500"}, kTrain, {"model.rope_theta_local"}},
      {{"model.rope_layers=local", "model.rope_theta=500"}, kTrain, {"model.rope_theta"}},
      // Training cadence and data.
      {{"train.batch_ramp_start=2"}, kTrain, {"train.batch_ramp_start"}},
      {{"data.val_fraction=0", "train.eval_every=5", "train.eval_batches=2"}, kTrain,
       {"train.eval_every", "train.eval_batches"}},
      {{"train.eval_every=0", "train.eval_batches=2"}, kTrain, {"train.eval_batches"}},
  };
  for (const Case& k : cases) {
    std::string what;
    for (const auto& s : k.set) what += s + " ";
    EXPECT_EQ(idle("", k.set, k.shape), k.idle) << what;
  }
  // From the file as from --set; a mixture's datasets are prepared already.
  EXPECT_EQ(idle("[data]\nvocab_size = 512\nmix = [{dir = \"a\", weight = 1}]\n", {}, kTrain),
            std::set<std::string>{"data.vocab_size"});
}

TEST(KeyEffect, KeysLeftAtTheirDefaultsOrNotSetAreNotNamed) {
  // Set explicitly, but to the default: it changes nothing either way (a saved config.toml lists every key).
  EXPECT_TRUE(idle("[diloco]\ninner_steps = 100\ncodec = \"int8\"\n", {}, kTrain).empty());
  EXPECT_TRUE(idle(config_to_toml(Config{}), {}, kTrain).empty());
  // Not set: the default of an idle key is no user's choice.
  EXPECT_TRUE(idle("", {"optim.name=adamw"}, kTrain).empty());
}

TEST(KeyEffect, TheLineNamesKeyValueAndWhyAndAFix) {
  std::vector<std::string> given;
  const Config c = parse_config("", "t.toml", {"optim.name=adamw", "optim.muon_momentum=0.9"}, &given);
  const std::vector<std::string> lines = idle_key_lines(c, given, kTrain);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("optim.muon_momentum = 0.9 has no effect in this run: it applies only with optim.name = muon", 0), 0u)
      << lines[0];
  EXPECT_NE(lines[0].find("fix: "), std::string::npos);
}

// The configs shipped in configs/ set no key that does nothing where they are meant to run.
TEST(KeyEffect, ShippedConfigsSetNoIdleKey) {
  for (const auto& e : std::filesystem::directory_iterator(std::string(ATOLL_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    std::vector<std::string> given;
    const Config c = load_config(e.path().string(), {}, &given);
    EXPECT_TRUE(idle_key_lines(c, given, kTrain).empty()) << e.path() << ": " << idle_key_lines(c, given, kTrain)[0];
  }
}

// One key given twice with --set: the last stands (scripts add defaults before the caller's
// values); the warning that names both is checked through the binary (cli_idle_keys_test).
TEST(KeyEffect, OneKeySetTwiceTakesTheLast) {
  EXPECT_EQ(parse_config("", "t.toml", {"train.steps=3", "train.steps=5"}).train.steps, 5);
}

}  // namespace
}  // namespace atl
