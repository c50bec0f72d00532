// atoll's OpenMP spin default (cli/openmp_wait.h): when the user sets neither OMP_WAIT_POLICY
// nor GOMP_SPINCOUNT, the real binary restarts itself once so that GNU libgomp starts with
// GOMP_SPINCOUNT = kAtollSpinCount; a user's own setting is kept. What libgomp actually parsed
// is read from libgomp itself: OMP_DISPLAY_ENV=verbose makes it print its settings to stderr
// when it starts, once per process image.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "atoll/cli/openmp_wait.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

constexpr const char* kBlockStart = "OPENMP DISPLAY ENVIRONMENT BEGIN";

// Every "GOMP_SPINCOUNT = '...'" value libgomp printed, one per start of libgomp.
std::vector<std::string> spin_counts_printed(const std::string& err) {
  std::vector<std::string> values;
  const std::string key = "GOMP_SPINCOUNT = '";
  for (const auto& line : split_lines(err)) {
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    const size_t from = at + key.size();
    values.push_back(line.substr(from, line.find('\'', from) - from));
  }
  return values;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `atoll --version` with libgomp printing its settings and the two wait variables as given
// (a bare name removes the variable, so the parent's own setting cannot leak in).
RunResult version_with(const std::string& wait_policy, const std::string& spin_count) {
  child_env() = {"OMP_DISPLAY_ENV=verbose", wait_policy, spin_count};
  return run_atoll({"--version"});
}

// A user's own setting: libgomp starts once, with the spin count that setting means.
void expect_kept(const std::string& wait_policy, const std::string& spin_count, const std::string& parsed) {
  const RunResult r = version_with(wait_policy, spin_count);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(spin_counts_printed(r.err), std::vector<std::string>{parsed}) << r.describe();
  EXPECT_EQ(count_of(r.err, kBlockStart), 1) << "no restart: " << r.describe();
}

TEST(OpenmpWait, NeitherSetStartsLibgompWithAtollsSpinCount) {
  const RunResult r = version_with("OMP_WAIT_POLICY", "GOMP_SPINCOUNT");
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  // The first image ran with libgomp's default (300000), the restarted one with atoll's.
  const std::vector<std::string> counts = spin_counts_printed(r.err);
  ASSERT_FALSE(counts.empty()) << r.describe();
  EXPECT_EQ(counts.back(), cli::kAtollSpinCount) << r.describe();
  EXPECT_EQ(count_of(r.err, kBlockStart), 2) << "one restart, not a loop: " << r.describe();
  EXPECT_EQ(split_lines(r.out).size(), 1u) << "the command ran once: " << r.describe();
}

TEST(OpenmpWait, UsersWaitPolicyIsKept) { expect_kept("OMP_WAIT_POLICY=active", "GOMP_SPINCOUNT", "30000000000"); }

TEST(OpenmpWait, UsersSpinCountIsKept) { expect_kept("OMP_WAIT_POLICY", "GOMP_SPINCOUNT=5", "5"); }

// The restarted process is the one the caller started (same pid, so its exit code and
// signals reach the caller) and it sees the same arguments.
TEST(OpenmpWait, TheRestartKeepsArgumentsAndExitCode) {
  child_env() = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"};
  const RunResult r = run_atoll({"train", "--config", "/nonexistent/atoll-openmp-wait.toml"});
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  ASSERT_EQ(r.error_lines().size(), 1u) << r.describe();
  EXPECT_NE(r.error_lines()[0].find("/nonexistent/atoll-openmp-wait.toml"), std::string::npos) << r.describe();
}

// The processes atoll starts see the user's environment, not atoll's restart setting:
// `atoll launch` gives its worker OMP_WAIT_POLICY=passive, so the worker's libgomp must start
// with passive's spin count (0), not with the launcher's GOMP_SPINCOUNT.
TEST(OpenmpWait, ALaunchedWorkerMakesItsOwnChoice) {
  MicroWorld world;
  child_env() = {"ATOLL_CACHE_DIR=" + world.path("cache"), "OMP_DISPLAY_ENV=verbose", "OMP_WAIT_POLICY",
                 "GOMP_SPINCOUNT"};
  const RunResult r = run_atoll({"launch", "--islands", "1", "--config", world.config(), "--run-dir",
                                 world.path("run"), "--set", "train.steps=1"},
                                120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::vector<std::string> worker_counts, launcher_counts;  // the worker's lines carry its name
  for (const auto& line : split_lines(r.out + "\n" + r.err)) {
    const std::vector<std::string> v = spin_counts_printed(line);
    auto& to = line.find("island 0 rank 0") != std::string::npos ? worker_counts : launcher_counts;
    to.insert(to.end(), v.begin(), v.end());
  }
  EXPECT_EQ(worker_counts, std::vector<std::string>{"0"}) << r.describe();
  EXPECT_EQ(launcher_counts, (std::vector<std::string>{"300000", cli::kAtollSpinCount}))
      << "the launcher's two starts, libgomp's default then atoll's: " << r.describe();
}

}  // namespace
}  // namespace atl::testing
