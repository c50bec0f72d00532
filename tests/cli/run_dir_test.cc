// The run directory through the real binary: one writer at a time (RUN/.lock, a stale lock of a
// dead process taken over), what `--resume` means (an atoll run with its own config.toml; the
// keys that may change and the rest refused by name; a run without a checkpoint yet starts over
// and says so), leftover temporary directories of interrupted writes cleaned at the next start,
// a data.dir that does not exist refused, and the one-line config summary on the console.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "atoll/config/config.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// The pid of a process that has ended (forked, exited and reaped).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// The events of `run` named `name`.
std::vector<json> events(const std::string& run, const std::string& name) {
  std::vector<json> r;
  for (const auto& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == name) r.push_back(e);
  return r;
}

class RunDirTest : public CliTest {
 protected:
  // A run that goes on until it is stopped: many steps, a checkpoint every 2.
  std::vector<std::string> long_run(const std::string& run) const {
    return {"train", "--config", world().config(), "--run-dir", run, "--no-sample", "--set", "train.steps=100000",
            "--set", "checkpoint.every=2", "--set", "train.eval_every=0"};
  }
  // `atoll train --resume --run-dir RUN --no-sample` plus `extra`: no --config, the run's own.
  static RunResult resume(const std::string& run, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"train", "--resume", "--run-dir", run, "--no-sample"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_atoll(args);
  }
};

// ---------------------------------------------------------------------------------------------
// One writer at a time.

TEST_F(RunDirTest, ASecondWriterIsRefusedWhileTheRunIsGoing) {
  base_run();  // the data prepared first
  const std::string run = dir("run");
  Background first(long_run(run), dir("first"));
  ASSERT_TRUE(wait_for_file(run + "/checkpoints", "latest", 60, [&] { return first.running(); }))
      << read_file(dir("first") + ".err");
  const std::string pid = std::to_string(first.pid()), host = host_name();

  // The brief's reproduction: a --resume while the first run is going.
  const RunResult again = world().train(run, {"--resume", "--set", "train.steps=6"});
  EXPECT_TRUE(fails_clearly(again, {run, "pid " + pid, host}));
  // A fresh start into the same folder, and a launch, are refused the same way.
  const RunResult fresh = world().train(run);
  EXPECT_TRUE(fails_clearly(fresh, {run, "pid " + pid}));
  const RunResult launch = run_atoll({"launch", "--resume", "--run-dir", run, "--islands", "1"});
  EXPECT_TRUE(fails_clearly(launch, {run, "pid " + pid}));

  ASSERT_TRUE(first.running()) << "the first run ended early: " << read_file(dir("first") + ".err");
  first.kill9();
  // Nothing of the refused writers reached the run: one start, no resume, no launch.
  EXPECT_EQ(events(run, "start").size(), 1u);
  EXPECT_EQ(events(run, "resume").size(), 0u);
  EXPECT_EQ(events(run, "launch").size(), 0u);
}

TEST_F(RunDirTest, AStaleLockOfADeadProcessIsTakenOver) {
  const std::string run = copy_of_base_run();
  const pid_t gone = dead_pid();
  write_file(run + "/.lock", json({{"pid", gone}, {"host", host_name()}}).dump() + "\n");
  const RunResult r = resume(run, {"--set", "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find("stale lock"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pid " + std::to_string(gone)), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run + "/.lock")) << "the lock outlived the run that held it";
}

// ---------------------------------------------------------------------------------------------
// What --resume means.

TEST_F(RunDirTest, ResumeOfAFolderThatIsNotARunChangesNothing) {
  write_file(dir("mine/summary.txt"), "my own notes\n");
  const auto before = snapshot(dir());
  // With the config given, and without it.
  EXPECT_TRUE(fails_clearly(world().train(dir("mine"), {"--resume"}), {dir("mine"), "config.toml", "--run-dir"}));
  EXPECT_TRUE(fails_clearly(resume(dir("mine")), {dir("mine"), "config.toml", "--run-dir"}));
  // A folder that does not exist (a typo) is not created.
  EXPECT_TRUE(fails_clearly(world().train(dir("typo"), {"--resume"}), {dir("typo"), "--run-dir"}));
  EXPECT_TRUE(fails_clearly(resume(dir("typo")), {dir("typo"), "--run-dir"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
  EXPECT_FALSE(fs::exists(dir("typo")));
}

// A copy of an atoll config among the user's own files (the names a run writes included) is not
// a run: --resume of `atoll train` and `atoll launch`, and a fresh start, are refused and change
// nothing, rather than starting over and replacing the user's files.
TEST_F(RunDirTest, AFolderWithACopyOfAConfigButNoRunIsRefusedAndKept) {
  const std::string proj = dir("proj");
  write_file(proj + "/config.toml", world().config_text());
  write_file(proj + "/metrics.jsonl", "my own metrics log\n");
  write_file(proj + "/events.jsonl", "my events\n{\"event\": \"start\"}\n");  // not a run's: no time
  write_file(proj + "/summary.txt", "my summary\n");
  const auto before = snapshot(dir());
  EXPECT_TRUE(fails_clearly(resume(proj, {"--set", "train.steps=2"}), {proj, "config.toml", "checkpoints", "events.jsonl"}));
  EXPECT_TRUE(fails_clearly(world().train(proj, {"--resume"}), {proj, "config.toml", "checkpoints"}));
  EXPECT_TRUE(fails_clearly(run_atoll({"launch", "--resume", "--run-dir", proj, "--islands", "1"}), {proj, "config.toml"}));
  EXPECT_TRUE(fails_clearly(world().train(proj), {proj, "config.toml"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
}

TEST_F(RunDirTest, ResumeOfARunWithoutACheckpointStartsOverAndSaysSo) {
  const std::string run = copy_of_base_run();
  fs::remove_all(run + "/checkpoints");
  const RunResult r = resume(run);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find("no checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("starting over"), std::string::npos) << r.err;
  const auto over = events(run, "start_over");
  ASSERT_EQ(over.size(), 1u) << read_file(run + "/events.jsonl");
  EXPECT_NE(over[0]["reason"].get<std::string>().find("no checkpoint"), std::string::npos);
  // The run again from step 1, each step logged once.
  const auto rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["step"].get<int64_t>(), int64_t(i + 1));
}

TEST_F(RunDirTest, ResumeWithDamagedCheckpointsOnlyIsRefused) {
  // Checkpoints exist but none is complete: starting over would overwrite them.
  const std::string run = copy_of_base_run();
  for (const char* step : {"step-00000002", "step-00000004"})
    write_file(run + "/checkpoints/" + step + "/manifest.json", "{ damaged");
  const auto before = snapshot(run);
  EXPECT_TRUE(fails_clearly(resume(run), {run + "/checkpoints", "manifest.json"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

TEST_F(RunDirTest, ResumeUsesTheRunsOwnConfig) {
  const std::string run = copy_of_base_run();
  const RunResult r = resume(run, {"--set", "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const auto rows = read_jsonl(run + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(load_config(run + "/config.toml").train.steps, 6);
  // The softmax router's expert loads, every layer, on every step (Model::topk_choice_counts).
  const int layers = load_config(run + "/config.toml").model.n_layers;
  for (const auto& row : rows) {
    ASSERT_TRUE(row.contains("load_entropy")) << row.dump();
    ASSERT_EQ(row["load_layer"].size(), size_t(layers)) << row.dump();
    for (int l = 0; l < layers; ++l) {
      EXPECT_GT(row["load_entropy"][l].get<double>(), 0.0) << row.dump();
      EXPECT_LE(row["load_entropy"][l].get<double>(), 1.0 + 1e-12) << row.dump();
      EXPECT_LE(row["load_min"][l].get<double>(), row["load_max"][l].get<double>()) << row.dump();
    }
  }
  // The safe change is named in the log and in the resume event.
  EXPECT_NE(r.err.find("train.steps"), std::string::npos) << r.err;
  const auto resumed = events(run, "resume");
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0]["config_changes"].dump(), json({"train.steps: 4 -> 6"}).dump());
}

TEST_F(RunDirTest, LaunchResumeUsesTheRunsOwnConfig) {
  const std::string run = dir("run");
  const RunResult first = run_atoll({"launch", "--config", world().config(), "--run-dir", run, "--islands", "1",
                                     "--set", "train.eval_every=0", "--set", "diloco.inner_steps=2"});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  const RunResult r =
      run_atoll({"launch", "--resume", "--run-dir", run, "--islands", "1", "--set", "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(read_jsonl(run + "/metrics.jsonl").size(), 6u);
  EXPECT_EQ(load_config(run + "/config.toml").diloco.inner_steps, 2);
  const auto resumed = events(run, "resume");
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0]["step"].get<int64_t>(), 4);
}

TEST_F(RunDirTest, ResumeRefusesAnUnsafeChangeNamingIt) {
  const std::string run = copy_of_base_run();
  const auto before = snapshot(run);
  // By --set, and by a --config that differs.
  EXPECT_TRUE(fails_clearly(resume(run, {"--set", "optim.lr=0.01"}),
                            {"optim.lr", "0.003", "0.01", "--allow-config-change", run + "/config.toml"}));
  write_file(dir("other.toml"), world().config_text() + "\n[diloco]\ncodec = \"int4\"\n");
  EXPECT_TRUE(fails_clearly(
      run_atoll({"train", "--resume", "--run-dir", run, "--config", dir("other.toml"), "--no-sample"}),
      {"diloco.codec", "\"int8\"", "\"int4\"", "--allow-config-change"}));
  // train.steps may change; the unsafe key is still named.
  EXPECT_TRUE(fails_clearly(resume(run, {"--set", "train.steps=6", "--set", "data.val_fraction=0.1"}),
                            {"data.val_fraction"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));

  // Asked for explicitly, the change goes through and is recorded.
  const RunResult r = resume(run, {"--set", "optim.lr=0.01", "--set", "train.steps=6", "--allow-config-change"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(load_config(run + "/config.toml").optim.lr, 0.01);
  const auto resumed = events(run, "resume");
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_NE(resumed[0]["config_changes"].dump().find("optim.lr: 0.003 -> 0.01"), std::string::npos)
      << resumed[0].dump();
}

// ---------------------------------------------------------------------------------------------
// Leftovers of interrupted writes.

TEST_F(RunDirTest, LeftoverTemporaryDirectoriesAreCleanedAtTheNextStart) {
  const std::string run = copy_of_base_run();
  const std::string dead = std::to_string(dead_pid()), alive = std::to_string(::getpid());
  // Checkpoint writes belong to the run's writer: gone once the lock is free, whatever the pid.
  const std::string ck_dead = run + "/checkpoints/step-00000003.tmp-" + dead;
  const std::string ck_alive = run + "/checkpoints/step-00000005.tmp-" + alive;
  // An export into the run folder: removed only when its writer has ended.
  const std::string out_dead = run + "/hf.tmp-" + dead, out_alive = run + "/hf2.tmp-" + alive;
  for (const auto& d : {ck_dead, ck_alive, out_dead, out_alive}) write_file(d + "/part", "half written");
  const RunResult r = resume(run, {"--set", "train.steps=6"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (const auto& d : {ck_dead, ck_alive, out_dead}) {
    EXPECT_FALSE(fs::exists(d)) << d;
    EXPECT_NE(r.err.find(d), std::string::npos) << "the removal of " << d << " is not logged: " << r.err;
  }
  EXPECT_TRUE(fs::exists(out_alive)) << "an export still being written was removed";
}

// ---------------------------------------------------------------------------------------------
// data.dir.

TEST_F(RunDirTest, ADataDirThatDoesNotExistIsAnErrorNamingTheKey) {
  // Without data.input there is nothing to prepare: the built-in corpus must not fill it.
  std::string text = world().config_text();
  const size_t at = text.find("input = [");
  text.erase(at, text.find('\n', at) + 1 - at);
  text = text.replace(text.find(world().data_dir()), world().data_dir().size(), dir("nowhere"));
  write_file(dir("no-input.toml"), text);
  const auto before = snapshot(dir());
  const RunResult r = run_atoll({"train", "--config", dir("no-input.toml"), "--run-dir", dir("run"), "--no-sample"});
  EXPECT_TRUE(fails_clearly(r, {"data.dir", dir("nowhere"), "data.input"}));
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
  EXPECT_FALSE(fs::exists(dir("nowhere")));
  EXPECT_FALSE(fs::exists(dir("run")));
}

TEST_F(RunDirTest, ResumeAfterTheDataWasDeletedIsAnError) {
  // A run on a data.dir without data.input: its data cannot be made again.
  base_run();  // prepares the micro data
  fs::copy(world().data_dir(), dir("data"), fs::copy_options::recursive);
  std::string text = world().config_text();
  const size_t at = text.find("input = [");
  text.erase(at, text.find('\n', at) + 1 - at);
  text = text.replace(text.find(world().data_dir()), world().data_dir().size(), dir("data"));
  write_file(dir("own-data.toml"), text);
  const std::string run = dir("run");
  const RunResult first =
      run_atoll({"train", "--config", dir("own-data.toml"), "--run-dir", run, "--no-sample", "--set", "train.steps=2"});
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  fs::remove_all(dir("data"));
  const auto before = snapshot(run);
  EXPECT_TRUE(fails_clearly(resume(run, {"--set", "train.steps=4"}), {"data.dir", dir("data")}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
  EXPECT_FALSE(fs::exists(dir("data")));
}

// ---------------------------------------------------------------------------------------------
// The console.

TEST_F(RunDirTest, TheConsoleShowsOneConfigLineAndPrintConfigShowsItAll) {
  const RunResult r = world().train(dir("run"), {"--set", "train.steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out.find("[model]"), std::string::npos) << r.out;
  EXPECT_LT(split_lines(r.out).size(), 12u) << r.out;
  bool summary = false;
  for (const auto& line : split_lines(r.out))
    summary = summary || (line.find("adamw") != std::string::npos && line.find("fp32") != std::string::npos &&
                          line.find(dir("run")) != std::string::npos && line.find("2 steps") != std::string::npos);
  EXPECT_TRUE(summary) << "no one-line summary (optimizer, precision, steps, run dir): " << r.out;

  const RunResult p = world().train(dir("run2"), {"--set", "train.steps=2", "--print-config"});
  ASSERT_EQ(p.exit_code, 0) << p.describe();
  EXPECT_NE(p.out.find("[model]\nvocab_size = 384\n"), std::string::npos) << p.out;
}

// configs/tiny.toml checkpoints often enough that a stopped run resumes (docs/checkpoints.md's example).
TEST(TinyConfig, CheckpointsOftenEnoughToResume) {
  const char* src = std::getenv("ATOLL_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const Config c = load_config(std::string(src) + "/configs/tiny.toml");
  EXPECT_GT(c.checkpoint.every, 0);
  EXPECT_LE(c.checkpoint.every * 4, c.train.steps);
}

}  // namespace
}  // namespace atl::testing
