// Helpers of the elastic-island tests through `atoll launch` (elastic_test.cc, trust_test.cc,
// straggler_test.cc, watchdog_test.cc, restart_cap_test.cc, leftovers_test.cc, disk_full_test.cc):
// finding processes by their command line (a worker or the store under the launcher), reading a
// run's hashes and events, and the launch arguments of a short 3-island run on the micro model
// with fast fault settings; ShortLaunch, a shorter run with one fault (bad_update_test.cc,
// rollback_test.cc); MetricsTail, metrics.jsonl read as it grows (chaos_test.cc,
// admission_loss_test.cc).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {

using Clock = std::chrono::steady_clock;

// Polls `cond` every 20 ms for at most `seconds`, while `alive()`.
template <class Cond, class Alive>
inline bool wait_until(Cond&& cond, double seconds, Alive&& alive) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end && alive()) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

// Every process whose command line (arguments joined by spaces, with a trailing space) satisfies
// `match`: {pid, its parent's pid}.
template <class Match>
inline std::vector<std::pair<pid_t, pid_t>> processes(Match&& match) {
  std::vector<std::pair<pid_t, pid_t>> found;
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
    if (match(cmdline)) found.push_back({pid_t(std::stol(name)), ppid});
  }
  return found;
}

// A child of the launcher whose command line satisfies `match`; -1 if none.
template <class Match>
inline pid_t child_pid(pid_t launcher, Match&& match) {
  for (const auto& [pid, ppid] : processes(match))
    if (ppid == launcher) return pid;
  return -1;
}

// The `atoll worker ... --island I` process under the launcher (its child).
inline pid_t worker_pid(pid_t launcher, int island) {
  return child_pid(launcher, [&](const std::string& cmdline) {
    return cmdline.find(" worker ") != std::string::npos &&
           cmdline.find("--island " + std::to_string(island) + " ") != std::string::npos;
  });
}

// The launcher's own redis-server.
inline pid_t store_pid(pid_t launcher) {
  return child_pid(launcher, [](const std::string& cmdline) { return cmdline.rfind("redis-server", 0) == 0; });
}

inline char process_state(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close == std::string::npos ? '?' : stat[close + 2];
}

struct RunView {
  std::map<int64_t, std::map<int, std::string>> theta, momentum;  // outer step -> island -> hash
  std::map<std::string, std::vector<nlohmann::json>> events;
  size_t count(const std::string& kind) const { return events.count(kind) ? events.at(kind).size() : 0; }
};

inline RunView read_run(const std::string& run) {
  RunView v;
  if (fs::exists(run + "/metrics.jsonl"))
    for (const auto& r : read_jsonl_whole_lines(run + "/metrics.jsonl"))
      if (r.contains("theta_hash")) {
        v.theta[r["outer_step"].get<int64_t>()][r["island"].get<int>()] = r["theta_hash"];
        v.momentum[r["outer_step"].get<int64_t>()][r["island"].get<int>()] = r.value("momentum_hash", "");
      }
  if (fs::exists(run + "/events.jsonl"))
    for (const auto& e : read_jsonl_whole_lines(run + "/events.jsonl"))
      v.events[e["event"].get<std::string>()].push_back(e);
  return v;
}

inline int64_t newest_outer_step(const std::string& run) {
  try {
    const RunView v = read_run(run);
    return v.theta.empty() ? 0 : v.theta.rbegin()->first;
  } catch (const std::exception&) {  // a line being written
    return 0;
  }
}

// Reads metrics.jsonl rows as they are appended (whole lines only).
class MetricsTail {
 public:
  explicit MetricsTail(std::string path) : path_(std::move(path)) {}
  template <class Fn>
  void poll(Fn&& row) {
    std::ifstream f(path_);
    if (!f) return;
    f.seekg(offset_);
    std::string line;
    while (std::getline(f, line)) {
      if (f.eof()) break;  // a line still being written
      offset_ += std::streamoff(line.size() + 1);
      try {
        row(nlohmann::json::parse(line));
      } catch (const nlohmann::json::exception&) {
      }
    }
  }

 private:
  std::string path_;
  std::streamoff offset_ = 0;
};

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

  // Two workers per island: island 1 loses rank 1; rank 0 fails in the island's gradient mean and
  // leaves too (exit 75), both are restarted, and the island rejoins as a whole (`extra`: more
  // launch arguments; `steps`: the run's length).
  void lose_a_worker_and_rejoin(const std::string& run, const std::vector<std::string>& extra,
                                int64_t steps = kSteps) {
    std::vector<std::string> a = args(run);
    a[2] = "2";  // --islands 2
    std::replace(a.begin(), a.end(), "train.steps=" + std::to_string(kSteps), "train.steps=" + std::to_string(steps));
    a.insert(a.end(), {"--workers-per-island", "2"});
    a.insert(a.end(), extra.begin(), extra.end());
    child_env().push_back("ATOLL_FAULT=kill:island=1:rank=1:outer_step=2:ring_chunk=1");
    const RunResult r = run_atoll(a, 120);
    child_env().pop_back();
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const RunView v = read_run(run);
    expect_agreement(v, steps / kH);
    std::map<int, std::string> lost;  // rank of island 1 -> status
    for (const auto& e : v.events.at("peer_lost")) {
      EXPECT_EQ(e["island"], 1) << e.dump();
      lost[e["rank"].get<int>()] = e["status"];
    }
    EXPECT_EQ(lost, (std::map<int, std::string>{{0, "exit 75"}, {1, "signal 9"}}));
    ASSERT_EQ(v.count("join"), 1u) << r.describe();  // written by the island's rank 0
    EXPECT_EQ(v.events.at("join")[0]["island"], 1);
    EXPECT_FALSE(steps_with(v, 1).empty()) << "outer steps with island 0 alone";
    EXPECT_EQ(steps_with(v, 2).back(), steps / kH) << "whole again at the end";
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

// A short launch on the micro model: 3 islands, 48 steps, H = 4 (twelve outer steps), one
// evaluation at the end, with ATOLL_FAULT = `fault` ("" = none). Expects exit 0 and equal θ
// hashes at every outer step; returns the final validation loss and the events of `kinds`.
class ShortLaunch : public CliTest {
 protected:
  struct Outcome {
    double val_loss = 0;
    std::vector<nlohmann::json> events;
    std::string describe;
  };

  Outcome run(const std::string& name, const std::string& fault, const std::set<std::string>& kinds,
              const std::vector<std::string>& extra = {}) {
    const std::string run = dir(name);
    if (!fault.empty()) child_env().push_back("ATOLL_FAULT=" + fault);
    std::vector<std::string> a = {"launch", "--islands", "3", "--config", world().config(), "--run-dir", run,
                                  "--set", "train.steps=48", "--set", "diloco.inner_steps=4", "--set",
                                  "train.eval_every=48", "--set", "checkpoint.every=0", "--set",
                                  "optim.warmup_steps=0"};
    a.insert(a.end(), extra.begin(), extra.end());
    const RunResult r = run_atoll(a, 60);
    if (!fault.empty()) child_env().pop_back();
    Outcome o;
    o.describe = r.describe();
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    std::map<int64_t, std::set<std::string>> hashes;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      if (row.contains("val_loss")) o.val_loss = row["val_loss"].get<double>();
      if (row.contains("theta_hash")) hashes[row["outer_step"].get<int64_t>()].insert(row["theta_hash"]);
    }
    EXPECT_EQ(hashes.size(), 12u) << name;
    for (const auto& [step, h] : hashes) EXPECT_EQ(h.size(), 1u) << name << ": outer step " << step;
    for (const auto& e : read_jsonl(run + "/events.jsonl"))
      if (kinds.count(e["event"].get<std::string>())) o.events.push_back(e);
    return o;
  }
};

}  // namespace atl::testing
