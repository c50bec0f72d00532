// Ctrl-C (SIGINT) and SIGTERM to a real `atoll train`: the current step finishes, a checkpoint
// of it is written, the console says where the run can resume from and the exact command, the
// exit status is 0 for SIGTERM (preemption: stopped as asked) and 128 + 2 for Ctrl-C, and
// events.jsonl ends with `interrupted`; the printed command resumes the run. A second signal
// exits at once, naming the last complete checkpoint, and so does SIGTERM with
// checkpoint.grace_s = 0 (no time for a final checkpoint).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

class Interrupt : public CliTest {
 protected:
  // Runs until stopped; checkpoint.every = 3, so the checkpoint of the interrupted step is the
  // stop's own unless it falls on a multiple of 3. The model is larger than the micro one so
  // that a step takes ~50 ms: the second signal arrives while the step of the first finishes.
  std::vector<std::string> args(const std::string& run) const {
    std::vector<std::string> a = {"train", "--config", world().config(), "--run-dir", run, "--no-sample"};
    for (const char* kv : {"train.steps=100000", "checkpoint.every=3", "train.eval_every=0", "model.dim=64",
                           "model.expert_hidden=128", "model.seq_len=128", "train.batch_size=16"})
      a.insert(a.end(), {"--set", kv});
    return a;
  }
  // Starts the run and waits for its first checkpoint: training is under way.
  std::unique_ptr<Background> start(const std::string& run, const std::string& log,
                                    const std::vector<std::string>& more = {}) const {
    std::vector<std::string> a = args(run);
    a.insert(a.end(), more.begin(), more.end());
    auto b = std::make_unique<Background>(a, log);
    EXPECT_TRUE(wait_for_file(run + "/checkpoints", "latest", 60, [&] { return b->running(); }))
        << read_file(log + ".err");
    return b;
  }
};

// The words after "resume with: " on a line of `text`, split at spaces (the test's paths have none).
std::vector<std::string> resume_command(const std::string& text) {
  for (const auto& line : split_lines(text)) {
    const size_t at = line.find("resume with: ");
    if (at == std::string::npos) continue;
    std::istringstream words(line.substr(at + 13));
    std::vector<std::string> argv;
    for (std::string w; words >> w;) argv.push_back(w);
    return argv;
  }
  return {};
}

void stops_cleanly_on(int sig, const std::string& run, const std::string& log,
                      std::unique_ptr<Background> b) {
  ASSERT_TRUE(b->running());
  ::kill(b->pid(), sig);
  const int status = b->wait();
  const std::string err = read_file(log + ".err");
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping: " << status << "\n" << err;
  EXPECT_EQ(WEXITSTATUS(status), sig == SIGTERM ? 0 : 128 + sig) << err;

  // The last step logged has a complete checkpoint, named by `latest`.
  const auto rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_FALSE(rows.empty());
  const int64_t last = rows.back()["step"].get<int64_t>();
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(last));
  EXPECT_EQ(read_file(run + "/checkpoints/latest"), std::string(name) + "\n");
  EXPECT_TRUE(fs::exists(run + "/checkpoints/" + name + "/manifest.json"));
  const auto ev = read_jsonl(run + "/events.jsonl");
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back()["event"], "interrupted");
  EXPECT_EQ(ev.back()["signal"].get<int>(), sig);
  EXPECT_EQ(ev.back()["step"].get<int64_t>(), last);
  EXPECT_NE(ev.back()["checkpoint"].get<std::string>().find(name), std::string::npos);
  EXPECT_NE(err.find(name), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(run + "/.lock"));

  // The printed command continues the run (two more steps), every step logged once.
  std::vector<std::string> cmd = resume_command(err);
  ASSERT_GE(cmd.size(), 5u) << "no 'resume with: ' command in:\n" << err;
  EXPECT_EQ(std::vector<std::string>(cmd.begin() + 1, cmd.end()),
            std::vector<std::string>({"train", "--resume", "--run-dir", run}));
  cmd.erase(cmd.begin());
  cmd.insert(cmd.end(), {"--no-sample", "--set", "train.steps=" + std::to_string(last + 2)});
  const RunResult r = run_atoll(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const auto after = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(after.size(), size_t(last + 2));
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i]["step"].get<int64_t>(), int64_t(i + 1));
}

TEST_F(Interrupt, CtrlCFinishesTheStepWritesACheckpointAndSaysHowToResume) {
  base_run();  // the data prepared first
  const std::string run = dir("run"), log = dir("log");
  stops_cleanly_on(SIGINT, run, log, start(run, log));
}

TEST_F(Interrupt, SigtermStopsTheSameWay) {
  base_run();
  const std::string run = dir("run"), log = dir("log");
  stops_cleanly_on(SIGTERM, run, log, start(run, log));
}

TEST_F(Interrupt, ASecondCtrlCExitsAtOnceNamingTheLastCheckpoint) {
  base_run();
  std::string run, err;
  int status = 0;
  // The first stop can finish its step and checkpoint before the second signal arrives (a tiny
  // step, a busy machine): then the run stopped cleanly, which is another test's case; try again.
  for (int attempt = 0; attempt < 5; ++attempt) {
    run = dir("run" + std::to_string(attempt));
    const std::string log = dir("log" + std::to_string(attempt));
    auto b = start(run, log);
    ::kill(b->pid(), SIGINT);
    // The second once the first was taken (two signals sent at once may arrive as one).
    ASSERT_TRUE(wait_for_text(log + ".err", "atoll: interrupted:", 60, [&] { return b->running(); }))
        << read_file(log + ".err");
    ::kill(b->pid(), SIGINT);
    status = b->wait();
    err = read_file(log + ".err");
    if (err.find("stopped by signal") == std::string::npos) break;
  }
  ASSERT_TRUE(WIFEXITED(status)) << status << "\n" << err;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << err;
  EXPECT_NE(err.find("interrupted again"), std::string::npos) << err;
  EXPECT_NE(err.find("last complete checkpoint: " + run + "/checkpoints/step-"), std::string::npos) << err;
  // The named checkpoint is complete.
  const RunResult e = run_atoll({"eval", "--checkpoint", run});
  EXPECT_EQ(e.exit_code, 0) << e.describe();
}

TEST_F(Interrupt, SigtermWithoutGraceExitsAtOnceNamingTheLastCheckpoint) {
  base_run();
  const std::string run = dir("run"), log = dir("log");
  auto b = start(run, log, {"--set", "checkpoint.grace_s=0"});
  ::kill(b->pid(), SIGTERM);
  const int status = b->wait();
  const std::string err = read_file(log + ".err");
  ASSERT_TRUE(WIFEXITED(status)) << status << "\n" << err;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << err;
  EXPECT_NE(err.find("checkpoint.grace_s = 0"), std::string::npos) << err;
  EXPECT_NE(err.find("last complete checkpoint: " + run + "/checkpoints/step-"), std::string::npos) << err;
  const RunResult e = run_atoll({"eval", "--checkpoint", run});
  EXPECT_EQ(e.exit_code, 0) << e.describe();
}

}  // namespace
}  // namespace atl::testing
