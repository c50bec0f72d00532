// A full disk under a run or a data folder ends the command with one error line that says
// "disk full" and names the file, with the fix (a tmpfs of the test's own, ckpt/small_disk.h;
// skipped where the tests may not mount one).
#include <gtest/gtest.h>

#include <string>

#include "ckpt/small_disk.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class DiskFull : public CliTest {};

// The micro run's checkpoint (~1 MiB with its moments) does not fit on 256 KiB; its config,
// tokenizer, events and metrics do.
TEST_F(DiskFull, TrainingSaysWhichFileFilledTheDisk) {
  base_run();  // the data, prepared on the real disk
  const auto r = on_small_disk(256, [&](const std::string& disk) {
    const RunResult run = world().train(disk + "/run");
    const auto verdict = fails_clearly(run, {"disk full (No space left on device)", disk + "/run/checkpoints/", "fix: free space"});
    return std::string(verdict ? "clear: " : "unclear: ") + verdict.message();
  });
  if (!r) GTEST_SKIP() << "cannot mount a tmpfs here";
  EXPECT_EQ(r->rfind("clear: ", 0), 0u) << *r;
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

}  // namespace
}  // namespace atl::testing
