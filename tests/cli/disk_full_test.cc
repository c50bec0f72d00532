// A full disk under a run or a data folder ends the command with one error line that says
// "disk full" and names the file, with the fix (a tmpfs of the test's own, ckpt/small_disk.h;
// skipped where the tests may not mount one). Under `atoll launch` too: the launcher's own write
// that fails (a metrics row) stops every worker and ends in that one line, not in an abort, and
// leaves no lock, no half-written checkpoint and no worker behind.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "ckpt/small_disk.h"
#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

class DiskFull : public CliTest {};

// What a run that ended left in its folder that it should not have: temporary files and folders
// (`*.tmp*`: a partial checkpoint holds the space the error asks to free) and the lock.
std::string left_behind(const std::string& run) {
  std::string left;
  for (const auto& e : fs::recursive_directory_iterator(run))
    if (e.path().filename().string().find(".tmp") != std::string::npos || e.path().filename() == ".lock")
      left += "left behind: " + e.path().string() + "\n";
  return left;
}

// The micro run's checkpoint (~1 MiB with its moments) does not fit on 256 KiB; its config,
// tokenizer, events and metrics do. The failed checkpoint write removes its partial
// `checkpoints/step-N.tmp-PID` before the error ends the run (it was left for the next start).
TEST_F(DiskFull, TrainingSaysWhichFileFilledTheDisk) {
  base_run();  // the data, prepared on the real disk
  const auto r = on_small_disk(256, [&](const std::string& disk) {
    const RunResult run = world().train(disk + "/run");
    const auto verdict = fails_clearly(run, {"disk full (No space left on device)", disk + "/run/checkpoints/", "fix: free space"});
    return std::string(verdict ? "clear: " : "unclear: ") + verdict.message() + "\n" + left_behind(disk + "/run");
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_EQ(r->rfind("clear: ", 0), 0u) << *r;
  EXPECT_EQ(r->find("left behind"), std::string::npos) << *r;
}

TEST_F(DiskFull, DataPreparationSaysWhichFileFilledTheDisk) {
  const auto r = on_small_disk(64, [&](const std::string& disk) {
    const RunResult run =
        run_atoll({"data", "prepare", "--input", world().corpus(), "--out", disk + "/data", "--vocab-size", "384"});
    const auto verdict = fails_clearly(run, {"disk full (No space left on device)", disk + "/data", "fix: free space"});
    return std::string(verdict ? "clear: " : "unclear: ") + verdict.message();
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_EQ(r->rfind("clear: ", 0), 0u) << *r;
}

// Writes zeros to `path` until the disk under it is full.
void fill_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  const std::string block(65536, '\0');
  while (fd >= 0 && ::write(fd, block.data(), block.size()) > 0) {
  }
  for (size_t n = 4096; fd >= 0 && n > 0; n /= 2)  // the last pages' worth, down to one byte
    while (::write(fd, block.data(), n) > 0) {
    }
  if (fd >= 0) ::close(fd);
}

// Two islands train until the disk fills under them (a file of the test's own takes what is left
// once the first rows are logged): the launcher cannot write the next row. It used to end in
// std::terminate (exit 134, "terminate called after throwing an instance of 'atl::IoError'"),
// its workers killed mid-write, the lock and their checkpoint folders left on the full disk.
TEST_F(DiskFull, ALaunchStopsEveryWorkerAndEndsInOneLine) {
  base_run();  // the data, prepared on the real disk
  const auto r = on_small_disk(2048, [&](const std::string& disk) {
    const std::string run = disk + "/run";
    Background b({"launch", "--islands", "2", "--config", world().config(), "--run-dir", run, "--stop-grace", "2",
                  "--set", "train.steps=1000000", "--set", "diloco.inner_steps=4", "--set", "train.eval_every=0",
                  "--set", "checkpoint.every=0", "--set", "checkpoint.grace_s=5"},
                 dir("launch"));
    const auto alive = [&] { return b.running(); };
    if (!wait_for_file(run, "metrics.jsonl", 60, alive) || !wait_for_text(run + "/metrics.jsonl", "\"step\"", 60, alive))
      return "no metrics row: " + read_file(dir("launch") + ".err");
    fill_disk(disk + "/filler");
    const int status = b.wait();
    RunResult result;
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.err = read_file(dir("launch") + ".err");
    result.command = "atoll launch (wait status " + std::to_string(status) + ")";
    std::string problems;
    if (const auto verdict = fails_clearly(result, {"disk full (No space left on device)", run + "/", "fix: free space"});
        !verdict)
      problems += std::string(verdict.message()) + "\n";
    problems += left_behind(run);
    const auto left = processes([&](const std::string& cmdline) {
      return cmdline.find(" worker ") != std::string::npos && cmdline.find(run) != std::string::npos;
    });
    if (!left.empty())
      problems += std::to_string(left.size()) + " worker(s) still running after the launcher ended\n";
    return problems.empty() ? std::string("clean") : problems;
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_EQ(*r, "clean");
}

}  // namespace
}  // namespace atl::testing
