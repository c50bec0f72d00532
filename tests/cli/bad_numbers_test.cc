// Every number on the command line is checked where it enters: a negative, zero, NaN, infinite
// or out-of-range value where it means nothing gives one "atoll: error:" line naming the flag,
// what it takes and the fix, a non-zero exit, at once, and nothing written. Table-driven: one
// row per flag and bad value, for every command. The same for config values given with --set
// that used to pass and fail later with advice pointing elsewhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

struct BadFlag {
  std::vector<std::string> args;  // the command line, the bad flag last
  std::string flag;               // what the error must name
};

// Required flags come first so that the bad value is the only thing wrong. A checkpoint or
// store that does not exist is never reached: the flags are refused before anything runs.
std::vector<BadFlag> bad_flags(const std::string& d) {
  const std::string ck = d + "/no-checkpoint";
  const std::string run = d + "/run";  // were a bad flag let through, the run would show up here
  const std::vector<std::string> worker = {"worker", "--store", "redis://127.0.0.1:1", "--island", "0", "--rank", "0",
                                           "--islands", "1", "--run-dir", run};
  auto w = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = worker;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto launch = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"launch", "--run-dir", run};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  return {
      {launch({"--islands", "0"}), "--islands"},
      {launch({"--islands", "-2"}), "--islands"},
      {launch({"--islands", "nan"}), "--islands"},
      {launch({"--islands", "2", "--workers-per-island", "0"}), "--workers-per-island"},
      {launch({"--islands", "2", "--stop-grace", "nan"}), "--stop-grace"},
      {launch({"--islands", "2", "--stop-grace", "inf"}), "--stop-grace"},
      {launch({"--islands", "2", "--stop-grace", "-1"}), "--stop-grace"},
      {launch({"--islands", "2", "--stop-grace", "1e300"}), "--stop-grace"},
      {w({"--islands", "0"}), "--islands"},
      {w({"--island", "-1"}), "--island"},
      {w({"--rank", "-1"}), "--rank"},
      {w({"--workers-per-island", "0"}), "--workers-per-island"},
      {w({"--metrics-fd", "-7"}), "--metrics-fd"},
      {{"bench", "--steps", "-1"}, "--steps"},
      {{"bench", "--steps", "0"}, "--steps"},
      {{"bench", "--steps", "nan"}, "--steps"},
      {{"bench", "--warmup", "-1"}, "--warmup"},
      {{"bench", "--peak-gflops", "0"}, "--peak-gflops"},
      {{"bench", "--peak-gflops", "nan"}, "--peak-gflops"},
      {{"eval", "--checkpoint", ck, "--tokens", "-5"}, "--tokens"},
      {{"eval", "--checkpoint", ck, "--tokens", "nan"}, "--tokens"},
      {{"eval", "--checkpoint", ck, "--batch", "0"}, "--batch"},
      {{"generate", "--checkpoint", ck, "--max-tokens", "0"}, "--max-tokens"},
      {{"generate", "--checkpoint", ck, "--temperature", "nan"}, "--temperature"},
      {{"generate", "--checkpoint", ck, "--temperature", "inf"}, "--temperature"},
      {{"generate", "--checkpoint", ck, "--temperature", "-1"}, "--temperature"},
      {{"generate", "--checkpoint", ck, "--top-p", "nan"}, "--top-p"},
      {{"generate", "--checkpoint", ck, "--top-p", "1.5"}, "--top-p"},
      {{"generate", "--checkpoint", ck, "--seed", "-1"}, "--seed"},
      {{"data", "prepare", "--out", d + "/out", "--vocab-size", "10"}, "--vocab-size"},
      {{"data", "prepare", "--out", d + "/out", "--vocab-size", "nan"}, "--vocab-size"},
      {{"data", "prepare", "--out", d + "/out", "--val-fraction", "nan"}, "--val-fraction"},
      {{"data", "prepare", "--out", d + "/out", "--val-fraction", "0.9"}, "--val-fraction"},
  };
}

class BadNumbers : public CliTest {};

TEST_F(BadNumbers, EveryFlagRefusesWhatItCannotMean) {
  for (const BadFlag& b : bad_flags(dir())) {
    const auto before = snapshot(dir());
    const RunResult r = run_atoll(b.args, 30);
    EXPECT_TRUE(fails_clearly(r, {b.flag, b.args.back()})) << r.command;
    EXPECT_TRUE(unchanged(before, snapshot(dir()))) << r.command;
  }
}

TEST_F(BadNumbers, AMissingOrUnknownFlagIsOneClearLineToo) {
  EXPECT_TRUE(fails_clearly(run_atoll({"bench", "--steps"}), {"--steps", "atoll bench --help"}));
  EXPECT_TRUE(fails_clearly(run_atoll({"bench", "--stepz", "3"}), {"--stepz", "atoll bench --help"}));
  EXPECT_TRUE(fails_clearly(run_atoll({"eval"}), {"--checkpoint", "atoll eval --help"}));
  EXPECT_TRUE(fails_clearly(run_atoll({"data", "prepare"}), {"--out", "atoll data prepare --help"}));
}

TEST_F(BadNumbers, HelpStillExitsZero) {
  const RunResult r = run_atoll({"launch", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.out.find("--islands"), std::string::npos) << r.out;
}

// Config values that loaded before and failed only during training, with advice that pointed at
// another key (a NaN loss blamed on the learning rate).
TEST_F(BadNumbers, ConfigValuesThatUsedToFailLateFailAtOnce) {
  for (const std::string set : {"optim.beta1=1.0", "optim.eps=0.0", "optim.lr=inf", "fault.timeout_s=0.0",
                                "diloco.outer_momentum=1.0", "optim.muon_momentum=1.0"}) {
    const auto before = snapshot(dir());
    const RunResult r = world().train(dir("run"), {"--set", set});
    EXPECT_TRUE(fails_clearly(r, {"--set " + set, set.substr(0, set.find('='))}));
    EXPECT_TRUE(unchanged(before, snapshot(dir()))) << set << ": the run started before the value was refused";
  }
}

}  // namespace
}  // namespace atl::testing
