// A config key set to something that does nothing in the command run is named on stderr with
// its value and the reason (config/key_effect.h), once, and the run goes on; one key given
// twice with --set is named in a warning (the last stands).
#include <gtest/gtest.h>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class IdleKeys : public CliTest {};

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST_F(IdleKeys, TrainNamesDilocoAndMuonKeysItIgnores) {
  const RunResult r = world().train(dir("run"), {"--set", "train.steps=1", "--set", "diloco.inner_steps=5", "--set",
                                                 "optim.name=adamw", "--set", "optim.ns_steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(count(r.err, "diloco.inner_steps = 5 has no effect in this run: it applies only to DiLoCo's outer steps"), 1u)
      << r.err;
  EXPECT_EQ(count(r.err, "optim.ns_steps = 3 has no effect in this run: it applies only with optim.name = muon"), 1u) << r.err;
  EXPECT_EQ(count(r.err, "has no effect"), 2u) << r.err;  // the micro config's own keys all act
}

TEST_F(IdleKeys, OneKeySetTwiceWarnsAndTheLastStands) {
  const RunResult r = world().train(dir("run"), {"--set", "train.steps=3", "--set", "train.steps=1"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(count(r.err, "--set train.steps=3 and --set train.steps=1 set one key twice: the last stands"), 1u) << r.err;
}

// A run without a validation split says at the start that no validation pass will come, and
// `atoll eval` of it names the cause (data.val_fraction = 0), not a dataset to prepare.
TEST_F(IdleKeys, NoValidationSplitIsSaidNotSilent) {
  const std::string run = dir("run");
  const RunResult r = world().train(run, {"--set", "train.steps=2", "--set", "data.val_fraction=0", "--set",
                                          "data.dir=\"" + dir("data") + "\""});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(count(r.err, "no validation pass will run"), 1u) << r.err;
  const RunResult e = run_atoll({"eval", "--checkpoint", run}, 60);
  EXPECT_TRUE(fails_clearly(e, {dir("data"), "no validation split", "data.val_fraction = 0", "--data"}));
}

}  // namespace
}  // namespace atl::testing
