// `atoll worker` placed by a scheduler (docs/cluster.md), through the real binary: two tasks
// with Slurm's variables and no placement flags train a 2-island run, each printing the place it
// took; a task count that is not --islands x --workers-per-island, and a command-line mistake,
// exit kWorkerConfigExit (78) with one clear line; SIGTERM to a worker started by hand writes a
// checkpoint and exits kWorkerPreemptedExit (79), so a scheduler's retry policy tells them apart.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "cli/scoped_child_env.h"
#include "cli/store_fixture.h"

namespace atl::testing {
namespace {

constexpr int kConfigExit = 78, kPreemptedExit = 79;  // train/island_trainer.h, documented in docs/cluster.md

class SchedulerPlacement : public CliTestWithStore {
 protected:
  // `atoll worker` with the micro config and no placement flags.
  std::vector<std::string> worker(const std::string& run_dir, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"worker", "--config", world().config(), "--run-dir", run_dir,
                                     "--set", "diloco.inner_steps=2", "--set", "fault.timeout_s=30"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

TEST_F(SchedulerPlacement, TwoSlurmTasksTrainTwoIslandsAndSayWhereTheySit) {
  base_run();  // the data, prepared before the workers start
  std::vector<std::unique_ptr<Background>> tasks;
  for (int t = 0; t < 2; ++t) {
    const ScopedChildEnv env({"SLURM_PROCID=" + std::to_string(t), "SLURM_NTASKS=2", "SLURM_LOCALID=" + std::to_string(t),
                              "SLURM_JOB_NODELIST=localhost", "SLURMD_NODENAME=localhost", "SLURM_JOB_ID=4242",
                              "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(redis_->port())});
    tasks.push_back(std::make_unique<Background>(worker(dir("run")), dir("task" + std::to_string(t))));  // one shared run folder, as in the sbatch script
  }
  std::string theta[2];
  for (int t = 0; t < 2; ++t) {
    const int status = tasks[size_t(t)]->wait();
    const std::string out = read_file(dir("task" + std::to_string(t)) + ".out");
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out << read_file(dir("task" + std::to_string(t)) + ".err");
    const std::string placed = "placement: island " + std::to_string(t) + " rank 0 of 2 island(s) x 1 worker(s) (slurm "
                               "SLURM_PROCID=" + std::to_string(t) + " of SLURM_NTASKS=2, local task " +
                               std::to_string(t) + " on localhost, hosts localhost); store redis://127.0.0.1:" +
                               std::to_string(redis_->port()) + ", run id slurm-4242";
    EXPECT_NE(out.find(placed), std::string::npos) << out;
    const size_t at = out.find(", theta ");
    ASSERT_NE(at, std::string::npos) << out;
    theta[t] = out.substr(at);
  }
  EXPECT_EQ(theta[0], theta[1]) << "the two islands end with different θ";
  EXPECT_TRUE(fs::exists(dir("run") + "/checkpoints/latest")) << "no checkpoint in the shared run folder";
}

TEST_F(SchedulerPlacement, ATaskCountThatIsNotIslandsTimesWorkersIsAConfigError) {
  const ScopedChildEnv env({"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_JOB_NODELIST=node[01-03]"});
  const auto before = snapshot(dir());
  const RunResult r = run_atoll(worker(dir("run"), {"--islands", "2"}), 60);
  EXPECT_TRUE(fails_clearly(r, {"SLURM_NTASKS=3 tasks, but --islands 2 x --workers-per-island 1 = 2"}));
  EXPECT_EQ(r.exit_code, kConfigExit) << r.describe();
  EXPECT_TRUE(unchanged(before, snapshot(dir())));
}

TEST_F(SchedulerPlacement, ACommandLineMistakeIsAConfigError) {
  const RunResult r = run_atoll({"worker", "--island", "x", "--rank", "0", "--islands", "1"}, 60);
  EXPECT_EQ(r.exit_code, kConfigExit) << r.describe();
  const RunResult none = run_atoll({"worker", "--config", world().config()}, 60);  // no flags, no scheduler
  EXPECT_TRUE(fails_clearly(none, {"no placement", "--island I --rank R --islands N"}));
  EXPECT_EQ(none.exit_code, kConfigExit) << none.describe();
}

TEST_F(SchedulerPlacement, SigtermCheckpointsAndExitsRetriable) {
  base_run();
  Background w(worker(dir("run"), {"--store", redis_->url(), "--run-id", "preempt", "--island", "0", "--rank", "0",
                                   "--islands", "1", "--set", "train.steps=100000", "--set", "train.eval_every=0",
                                   "--set", "checkpoint.every=0", "--quiet"}),
               dir("worker"));
  ASSERT_TRUE(wait_for_file(dir("run"), "metrics.jsonl", 60, [&] { return w.running(); }))
      << read_file(dir("worker") + ".err");
  ASSERT_EQ(::kill(w.pid(), SIGTERM), 0);
  const int status = w.wait();
  ASSERT_TRUE(WIFEXITED(status)) << "ended by a signal";
  EXPECT_EQ(WEXITSTATUS(status), kPreemptedExit) << read_file(dir("worker") + ".err");
  EXPECT_TRUE(fs::exists(dir("run") + "/checkpoints/latest")) << "no checkpoint written before the exit";
}

// Interfaces (dist/listen_address.h): each mistake is refused before the store is dialled (the
// store below is an address nothing answers), with one line naming the interface and the fix.
TEST_F(SchedulerPlacement, ABadInterfaceIsAConfigErrorNamingIt) {
  const std::vector<std::string> remote = {"--store", "redis://198.51.100.7:6379", "--island", "0", "--rank", "0",
                                           "--islands", "2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), remote.begin(), remote.end());
    return worker(dir("run"), extra);
  };
  RunResult r = run_atoll(with({"--iface", "nosuch0"}), 60);
  EXPECT_TRUE(fails_clearly(r, {"--iface nosuch0: this host has no such network interface", "lo 127.0.0.1"}));
  EXPECT_EQ(r.exit_code, kConfigExit) << r.describe();
  r = run_atoll(with({"--iface", "lo"}), 60);
  EXPECT_TRUE(fails_clearly(r, {"--iface lo is the loopback interface", "198.51.100.7", "could not reach this one"}));
  EXPECT_EQ(r.exit_code, kConfigExit) << r.describe();
  {
    const ScopedChildEnv env({"GLOO_SOCKET_IFNAME=lo,eth0"});
    r = run_atoll(with({}), 60);
    EXPECT_TRUE(fails_clearly(r, {"GLOO_SOCKET_IFNAME=lo,eth0 names several interfaces"}));
  }
  {
    const ScopedChildEnv env({"GLOO_SOCKET_IFNAME=lo"});
    r = run_atoll(with({}), 60);
    EXPECT_TRUE(fails_clearly(r, {"GLOO_SOCKET_IFNAME lo is the loopback interface"}));
  }
}

}  // namespace
}  // namespace atl::testing
