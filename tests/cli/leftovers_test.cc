// What killed processes leave behind. A launcher killed outright (kill -9) leaves no file with
// its store's password in /tmp (nor in TMPDIR): redis-server gets its config through a pipe and
// logs to a file without a name; a later start of the run is not hindered. An export interrupted
// before its rename leaves OUT.tmp-PID (the size of the model): the next export into OUT removes
// it once that process has ended, naming it, and leaves a live export's and other names alone.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

class Leftovers : public CliTest {};

// The regular files directly in `dir` (up to 1 MiB each) whose bytes hold `secret`.
std::vector<std::string> files_holding(const std::string& dir, const std::string& secret) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (!e.is_regular_file(ec2) || e.file_size(ec2) > (1u << 20) || ec2) continue;
    if (read_file(e.path()).find(secret) != std::string::npos) found.push_back(e.path().string());
  }
  return found;
}

TEST_F(Leftovers, AKilledLauncherLeavesNoFileWithItsStorePassword) {
  const std::string run = dir("run"), tmp = dir("tmp");
  fs::create_directories(tmp);
  child_env().push_back("TMPDIR=" + tmp);
  const std::vector<std::string> args = {"launch", "--islands", "2", "--config", world().config(), "--run-dir", run,
                                         "--set", "train.steps=100000", "--set", "diloco.inner_steps=4", "--set",
                                         "train.eval_every=0", "--set", "checkpoint.every=0"};
  {
    Background b(args, dir("launch"));
    const auto alive = [&] { return b.running(); };
    ASSERT_TRUE(wait_for_file(run, "metrics.jsonl", 60, alive) && wait_for_text(run + "/metrics.jsonl", "\"step\"", 60, alive))
        << read_file(dir("launch") + ".err");
    const pid_t store = store_pid(b.pid());
    ASSERT_GT(store, 0);
    b.kill9();
    // The store follows its launcher (its parent-death signal); wait until it is gone.
    ASSERT_TRUE(wait_until([&] { return ::kill(store, 0) != 0; }, 20, [] { return true; }));
  }
  const std::string password = read_file(run + "/store.password");
  ASSERT_GE(password.size(), 16u);
  EXPECT_EQ(files_holding("/tmp", password), std::vector<std::string>{});
  EXPECT_EQ(files_holding(tmp, password), std::vector<std::string>{});
  EXPECT_TRUE(fs::is_empty(tmp)) << "a temporary file was left in TMPDIR";
  // The next start takes the run over (its lock is free) and leaves nothing behind either.
  std::vector<std::string> resume = args;
  resume.insert(resume.end(), {"--resume", "--set", "train.steps=8"});
  const RunResult r = run_atoll(resume, 60);
  child_env().pop_back();
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(fs::is_empty(tmp));
  EXPECT_FALSE(fs::exists(run + "/.lock"));
}

TEST_F(Leftovers, TheNextExportRemovesTheTemporaryFolderOfAnExportThatEnded) {
  const std::string out = dir("hf");
  const pid_t gone = ::fork();  // a pid whose process has ended
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ::waitpid(gone, nullptr, 0);
  const std::string stale = out + ".tmp-" + std::to_string(gone), live = out + ".tmp-" + std::to_string(::getpid()),
                    other = dir("other.tmp-" + std::to_string(gone));
  for (const std::string& d : {stale, live, other}) {
    fs::create_directories(d);
    write_file(d + "/model.safetensors", std::string(4096, 'x'));
  }
  const RunResult r = run_atoll({"export", "--checkpoint", base_run(), "--format", "hf", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(fs::exists(stale)) << r.describe();
  EXPECT_NE(r.err.find("removed " + stale + ", left by an interrupted export"), std::string::npos) << r.describe();
  EXPECT_TRUE(fs::exists(live + "/model.safetensors")) << "the folder of a live process was removed";
  EXPECT_TRUE(fs::exists(other + "/model.safetensors")) << "a folder of another name was removed";
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
}

}  // namespace
}  // namespace atl::testing
