// Elastic islands through `atoll launch` on the micro model, with real processes and signals:
// a worker stopped at an exact point of the ring (ATOLL_FAULT=hang) and killed there with
// SIGKILL from outside is restarted, rejoins with its own data slice, and every outer step
// ends with equal θ and momentum hashes; a state transfer corrupted on the wire is refused by
// the joiner's hash check and sent again (with two fragments); a transfer whose source is lost is retried from another
// island (and the source rejoins in turn); an island of two workers that loses one leaves as a
// whole and rejoins; a worker stopped past the heartbeat ttl is left out and the run goes on (a
// checkpoint meanwhile fills its entries from the writer's and its record), and when it is let go
// (SIGCONT) it finds itself left out, leaves and rejoins.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Polls `cond` every 20 ms for at most `seconds`, while `alive()`.
template <class Cond, class Alive>
bool wait_until(Cond&& cond, double seconds, Alive&& alive) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end && alive()) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

// The `atoll worker ... --island I` process under the launcher (its child).
pid_t worker_pid(pid_t launcher, int island) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file(entry.path() / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    const std::string stat = read_file(entry.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == launcher && cmdline.find(" worker ") != std::string::npos &&
        cmdline.find("--island " + std::to_string(island) + " ") != std::string::npos)
      return pid_t(std::stol(name));
  }
  return -1;
}

char process_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close == std::string::npos ? '?' : stat[close + 2];
}

struct RunView {
  std::map<int64_t, std::map<int, std::string>> theta, momentum;  // outer step -> island -> hash
  std::map<std::string, std::vector<nlohmann::json>> events;
  size_t count(const std::string& kind) const { return events.count(kind) ? events.at(kind).size() : 0; }
};

RunView read_run(const std::string& run) {
  RunView v;
  if (fs::exists(run + "/metrics.jsonl"))
    for (const auto& r : read_jsonl(run + "/metrics.jsonl"))
      if (r.contains("theta_hash")) {
        v.theta[r["outer_step"].get<int64_t>()][r["island"].get<int>()] = r["theta_hash"];
        v.momentum[r["outer_step"].get<int64_t>()][r["island"].get<int>()] = r.value("momentum_hash", "");
      }
  if (fs::exists(run + "/events.jsonl"))
    for (const auto& e : read_jsonl(run + "/events.jsonl")) v.events[e["event"].get<std::string>()].push_back(e);
  return v;
}

int64_t newest_outer_step(const std::string& run) {
  try {
    const RunView v = read_run(run);
    return v.theta.empty() ? 0 : v.theta.rbegin()->first;
  } catch (const std::exception&) {  // a line being written
    return 0;
  }
}

class ElasticLaunch : public CliTest {
 protected:
  static constexpr int64_t kSteps = 1200, kH = 4;
  std::vector<std::string> args(const std::string& run, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {
        "launch", "--islands", "3", "--config", world().config(), "--run-dir", run, "--stop-grace", "1",
        "--set", "train.steps=" + std::to_string(kSteps), "--set", "diloco.inner_steps=" + std::to_string(kH),
        "--set", "train.eval_every=0", "--set", "checkpoint.every=400", "--set", "optim.warmup_steps=0",
        "--set", "fault.heartbeat_s=0.2", "--set", "fault.heartbeat_ttl_s=1", "--set", "fault.timeout_s=4",
        "--set", "fault.restart_backoff_s=0.2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // Every outer step: one θ hash and one momentum hash over the islands that logged it.
  static void expect_agreement(const RunView& v, int64_t last_outer_step = kSteps / kH) {
    ASSERT_FALSE(v.theta.empty());
    for (const auto& [step, by_island] : v.theta) {
      std::set<std::string> t, m;
      for (const auto& [i, h] : by_island) t.insert(h), m.insert(v.momentum.at(step).at(i));
      EXPECT_EQ(t.size(), 1u) << "outer step " << step;
      EXPECT_EQ(m.size(), 1u) << "outer step " << step;
    }
    EXPECT_EQ(v.theta.rbegin()->first, last_outer_step) << "every outer step, each once (a retry keeps its number)";
  }

  // Starts the run with island `island` stopping itself (SIGSTOP) at the first ring message of
  // outer step 3; returns that worker's pid once it is stopped, -1 if it never was.
  pid_t launch_until_stopped(std::unique_ptr<Background>& b, const std::string& run, int island,
                             const std::vector<std::string>& extra = {}) {
    child_env().push_back("ATOLL_FAULT=hang:island=" + std::to_string(island) + ":outer_step=3:ring_chunk=1");
    b = std::make_unique<Background>(args(run, extra), dir("launch"));
    child_env().pop_back();
    pid_t pid = -1;
    const bool stopped = wait_until([&] { return (pid = worker_pid(b->pid(), island)) > 0 && process_state(pid) == 'T'; },
                                    60, [&] { return b->running(); });
    return stopped ? pid : -1;
  }

  ::testing::AssertionResult ends_with_exit_0(Background& b) const {
    const int status = b.wait();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "wait status " << status << "\n" << read_file(dir("launch") + ".err");
  }

  // The outer steps logged by `count` islands.
  static std::vector<int64_t> steps_with(const RunView& v, size_t count) {
    std::vector<int64_t> s;
    for (const auto& [step, by_island] : v.theta)
      if (by_island.size() == count) s.push_back(step);
    return s;
  }
};

TEST_F(ElasticLaunch, AWorkerKilledMidRingIsRestartedAndRejoinsWithItsOwnDataSlice) {
  const std::string run = dir("run");
  // ATOLL_FAULT stops island 2 in the ring of outer step 3; the kill comes from here.
  std::unique_ptr<Background> b;
  const pid_t victim = launch_until_stopped(b, run, 2);
  ASSERT_GT(victim, 0) << read_file(dir("launch") + ".err");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(ends_with_exit_0(*b));
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_EQ(v.count("peer_lost"), 1u);
  EXPECT_EQ(v.events.at("peer_lost")[0]["status"], "signal 9");
  EXPECT_EQ(v.events.at("peer_lost")[0]["island"], 2);
  EXPECT_EQ(v.count("restart"), 1u);
  ASSERT_EQ(v.count("abort_retry"), 1u);
  EXPECT_EQ(v.events.at("abort_retry")[0]["lost"], nlohmann::json::array({2}));
  ASSERT_EQ(v.count("join"), 1u);
  const nlohmann::json& join = v.events.at("join")[0];
  EXPECT_EQ(join["island"], 2);
  EXPECT_EQ(join["rounds"], 1);
  const std::vector<int64_t> fewer = steps_with(v, 2), whole = steps_with(v, 3);
  ASSERT_FALSE(fewer.empty());
  EXPECT_EQ(fewer.front(), 3) << "the outer step the kill hit was retried without island 2";
  EXPECT_GT(whole.back(), fewer.back()) << "whole again after the rejoin";
  // The joiner continued its own data slice (its cursor from its membership record), not the source's.
  const std::string latest = split_lines(read_file(run + "/checkpoints/latest")).at(0);
  const auto manifest = nlohmann::json::parse(read_file(run + "/checkpoints/" + latest + "/manifest.json"));
  const nlohmann::json& cursor = manifest["state"]["loaders"][2];
  EXPECT_EQ(cursor["worker"], 2) << cursor.dump();
  const RunResult e = run_atoll({"eval", "--checkpoint", run + "/checkpoints/" + latest});
  EXPECT_EQ(e.exit_code, 0) << e.describe();
}

TEST_F(ElasticLaunch, ACorruptedStateTransferIsRefusedAndSentAgain) {
  const std::string run = dir("run");
  // Two blocking fragments (H = 4): outer step 2 is fragment 1's first; 600 fragment outer steps.
  child_env().push_back("ATOLL_FAULT=kill:island=2:outer_step=2:ring_chunk=1,corrupt:island=0:transfer=1");
  const RunResult r = run_atoll(args(run, {"--set", "diloco.fragments=2"}), 120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v, 2 * kSteps / kH);
  ASSERT_EQ(v.count("join"), 1u) << r.describe();
  const nlohmann::json& join = v.events.at("join")[0];
  EXPECT_EQ(join["source"], 0);
  EXPECT_EQ(join["rounds"], 2) << join.dump();
  EXPECT_EQ(join["refused"], nlohmann::json::array({"param"})) << join.dump();
  EXPECT_NE((r.out + r.err).find("[island 0 rank 0] ATOLL_FAULT: corrupting state transfer tensor 1"), std::string::npos)
      << r.describe();
}

// Island 2 is lost; while island 0 sends it the state, island 0 is lost too: the admission is
// voted down and retried from island 1, and island 0 rejoins in turn.
TEST_F(ElasticLaunch, ATransferWhoseSourceIsLostIsRetriedFromAnotherIsland) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=kill:island=2:outer_step=2:ring_chunk=1,kill:island=0:transfer=2");
  const RunResult r = run_atoll(args(run), 120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v);
  std::map<int, nlohmann::json> join;  // by island
  for (const auto& e : v.events.at("join")) join[e["island"].get<int>()] = e;
  ASSERT_EQ(join.size(), 2u) << r.describe();
  EXPECT_EQ(v.count("join"), 2u);
  EXPECT_EQ(join[2]["source"], 1) << join[2].dump();
  EXPECT_EQ(join[0]["source"], 1) << join[0].dump();
  EXPECT_EQ(v.count("peer_lost"), 2u);
  EXPECT_EQ(v.count("restart"), 2u);
}

// Two workers per island: island 1 loses rank 1; rank 0 fails in the island's gradient mean and
// leaves too (exit 75), both are restarted, and the island rejoins as a whole.
TEST_F(ElasticLaunch, AnIslandThatLosesAWorkerLeavesAsAWholeAndRejoins) {
  const std::string run = dir("run");
  std::vector<std::string> a = args(run);
  a[2] = "2";  // --islands 2
  a.insert(a.end(), {"--workers-per-island", "2"});
  child_env().push_back("ATOLL_FAULT=kill:island=1:rank=1:outer_step=2:ring_chunk=1");
  const RunResult r = run_atoll(a, 120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v);
  std::map<int, std::string> lost;  // rank of island 1 -> status
  for (const auto& e : v.events.at("peer_lost")) {
    EXPECT_EQ(e["island"], 1) << e.dump();
    lost[e["rank"].get<int>()] = e["status"];
  }
  EXPECT_EQ(lost, (std::map<int, std::string>{{0, "exit 75"}, {1, "signal 9"}}));
  ASSERT_EQ(v.count("join"), 1u) << r.describe();  // written by the island's rank 0
  EXPECT_EQ(v.events.at("join")[0]["island"], 1);
  EXPECT_FALSE(steps_with(v, 1).empty()) << "outer steps with island 0 alone";
  EXPECT_EQ(steps_with(v, 2).back(), kSteps / kH) << "whole again at the end";
}

TEST_F(ElasticLaunch, AWorkerStoppedPastTheTtlIsLeftOutAndRejoinsWhenLetGo) {
  const std::string run = dir("run");
  std::unique_ptr<Background> b;
  // A checkpoint at step 22 (between outer steps, while island 1 is out): written by island 0.
  const pid_t stopped = launch_until_stopped(b, run, 1, {"--set", "checkpoint.every=22", "--set", "checkpoint.keep=1000"});
  ASSERT_GT(stopped, 0) << read_file(dir("launch") + ".err");
  // The others time out in the ring (fault.timeout_s), leave it out once its heartbeat expires,
  // and go on: outer steps with 2 islands.
  ASSERT_TRUE(wait_until([&] { return newest_outer_step(run) >= 6; }, 60, [&] { return b->running(); }))
      << read_file(dir("launch") + ".err");
  ASSERT_EQ(::kill(stopped, SIGCONT), 0);
  ASSERT_TRUE(ends_with_exit_0(*b));
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_EQ(v.count("abort_retry"), 1u);
  EXPECT_EQ(v.events.at("abort_retry")[0]["lost"], nlohmann::json::array({1}));
  // Let go, it finds itself left out: it leaves (exit 75) and the launcher restarts it to rejoin.
  ASSERT_EQ(v.count("peer_lost"), 1u);
  EXPECT_EQ(v.events.at("peer_lost")[0]["status"], "exit 75");
  EXPECT_EQ(v.count("join"), 1u);
  EXPECT_FALSE(steps_with(v, 2).empty());
  // The missing island's entries are the writer's copies, its data cursor its own record's.
  const auto m = nlohmann::json::parse(read_file(run + "/checkpoints/step-00000022/manifest.json"));
  for (const char* kind : {"param", "adam_m", "adam_v"}) {
    const std::string k = std::string(kind) + "/embed";
    EXPECT_EQ(m["tensors"]["island1_" + k]["xxh3"], m["tensors"][k]["xxh3"]) << kind;
    EXPECT_NE(m["tensors"]["island2_" + k]["xxh3"], m["tensors"][k]["xxh3"]) << kind << ": island 2 was there";
  }
  EXPECT_EQ(m["state"]["loaders"][1]["worker"], 1) << m["state"]["loaders"].dump();
  EXPECT_GT(m["state"]["loaders"][1]["position"].get<int64_t>(), 0);
}

TEST_F(ElasticLaunch, BadFaultSettingsAreClearErrors) {
  child_env().push_back("ATOLL_FAULT=kill:island=1:outer_step=2");
  const RunResult r = run_atoll(args(dir("run")), 60);
  child_env().pop_back();
  EXPECT_TRUE(fails_clearly(r, {"ATOLL_FAULT='kill:island=1:outer_step=2'", "go together"}));
  const RunResult ttl = run_atoll(args(dir("run2"), {"--set", "fault.heartbeat_ttl_s=0.2"}), 60);
  EXPECT_TRUE(fails_clearly(ttl, {"fault.heartbeat_ttl_s", "fault.heartbeat_s"}));
  const RunResult both = run_atoll({"worker", "--store", "redis://127.0.0.1:1", "--island", "0", "--rank", "0",
                                    "--islands", "2", "--join", "--resume-from", dir("nowhere")});
  EXPECT_TRUE(fails_clearly(both, {"--join", "--resume-from"}));
}

}  // namespace
}  // namespace atl::testing
