// Seeded chaos (issue 19): a 4-island run on the micro model while this test kills (SIGKILL) and
// hangs (SIGSTOP past the heartbeat ttl, then SIGCONT) random workers at random times drawn from
// a seed, plus ATOLL_FAULT points armed at the start for what random times rarely hit: a kill in
// the ring, the source of a state transfer killed mid-transfer, a hang in the ring. Passes when
//   - no outer step waits longer than kStallTimeouts × fault.timeout_s for the next, per
//     disruption that came in that wait (no hang): the 2 ×;
//   - the launcher exits 0, and every outer step's θ and momentum hashes agree, the last one on
//     all 4 islands;
//   - the final validation loss is within 2% of the fault-free run with the same seed;
//   - no process of the run (worker or redis-server) is left once the launcher has exited.
// Random events come only after two outer steps committed since the last disruption (so that
// such overlaps are rare, from ATOLL_FAULT or the metrics' lag). At most 2 islands are disrupted at once (one is again once it has logged an outer step after
// its disruption), so the run state always has a holder. Every island must be back for the end:
// an event is drawn only while the rest of the run, at the fault-free run's pace, leaves it time
// to come back (kRejoinS after a kill, that plus the hang for a hang, whose length is capped to
// fit); counting outer steps is not enough, as the micro model runs the last hundreds of them in
// a few seconds.
//
// bench/chaos.sh runs this test at scale through the environment: ATOLL_CHAOS_EVENTS (22),
// ATOLL_CHAOS_SEED (19), ATOLL_CHAOS_STEPS (2400), ATOLL_CHAOS_KEEP (a folder to copy the chaos
// run's directory to, for its events.jsonl).
#include <algorithm>
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : fallback;
}

Clock::time_point seconds_after(Clock::time_point t, double s) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

constexpr int kIslands = 4;
constexpr int64_t kFirstEvent = 10;
constexpr double kStallTimeouts = 2;
constexpr int64_t kH = 4;
constexpr double kTimeoutS = 4, kTtlS = 1;
// A killed or let-go worker's way back: the restart backoff, a process start, admission at the
// next commit and the state transfer (join takes about 1.5 s on tiny: docs/benchmarks.md), plus
// up to one heartbeat ttl: a restarted worker waits for its dead predecessor's heartbeat to lapse
// before it takes the place (a live one's is refused).
constexpr double kRejoinS = 4 + kTtlS;
// The micro model's batch: large enough that an outer step takes tens of milliseconds, so that the
// 22 events fit in the run's first part with room for the last one's island to come back.
constexpr int kBatch = 16;

class Chaos : public CliTest {
 protected:
  std::vector<std::string> args(const std::string& run, int64_t steps) const {
    return {"launch", "--islands", std::to_string(kIslands), "--config", world().config(), "--run-dir", run,
            "--stop-grace", "1", "--set", "train.steps=" + std::to_string(steps),
            "--set", "diloco.inner_steps=" + std::to_string(kH), "--set", "train.eval_every=" + std::to_string(steps),
            "--set", "checkpoint.every=" + std::to_string(steps / 4), "--set", "optim.warmup_steps=0",
            "--set", "fault.heartbeat_s=0.2", "--set", "fault.heartbeat_ttl_s=" + std::to_string(kTtlS),
            "--set", "fault.timeout_s=" + std::to_string(kTimeoutS), "--set", "fault.restart_backoff_s=0.2",
            "--set", "fault.max_restarts=100000", "--set", "train.batch_size=" + std::to_string(kBatch)};
  }

  // Seconds per outer step of a fault-free run, between its first and last checkpoint events, so
  // that the start-up is not counted.
  static double outer_step_seconds(const std::string& run) {
    std::vector<std::pair<int64_t, double>> at;  // (step, time)
    for (const auto& row : read_jsonl(run + "/events.jsonl"))
      if (row.value("event", "") == "checkpoint") at.emplace_back(row["step"].get<int64_t>(), row["time"].get<double>());
    if (at.size() < 2 || at.back().first <= at.front().first) return 0;
    return (at.back().second - at.front().second) / (double(at.back().first - at.front().first) / double(kH));
  }

  static double final_val_loss(const std::string& run) {
    double loss = 0;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
      if (row.contains("val_loss")) loss = row["val_loss"].get<double>();
    return loss;
  }
};

// What the test knows of one island while it runs.
struct IslandState {
  pid_t pid = -1;               // its worker, as last seen
  bool disrupted = false;       // killed or stopped, and not yet back
  int64_t disrupted_at = 0;     // the newest outer step of the run then
  int64_t logged = 0;           // its newest outer step in metrics.jsonl
  pid_t stopped = -1;           // stopped by SIGSTOP (ours or ATOLL_FAULT's), to let go
  Clock::time_point let_go_at{};
};

TEST_F(Chaos, RandomKillsAndHangsFromASeedLeaveTheRunWhole) {
  const uint64_t seed = uint64_t(env_int("ATOLL_CHAOS_SEED", 19));
  const int64_t want_events = env_int("ATOLL_CHAOS_EVENTS", 22), steps = env_int("ATOLL_CHAOS_STEPS", 2400);
  const int64_t outer_steps = steps / kH;

  const std::string clean = dir("clean");
  // 600 s for the CI size; bench/chaos.sh's long runs (20,000 steps on a loaded machine) get
  // 600 s per 9,600 steps.
  const RunResult c = run_atoll(args(clean, steps), std::max<int64_t>(600, steps / 16));
  ASSERT_EQ(c.exit_code, 0) << c.describe();
  const double clean_loss = final_val_loss(clean);
  ASSERT_GT(clean_loss, 0);
  const double pace_s = outer_step_seconds(clean);
  ASSERT_GT(pace_s, 0) << "no two checkpoint events in the fault-free run";
  // The rest of the run in seconds at the fault-free pace; three quarters of it, as the islands
  // that are left run faster on a shared machine than all four.
  auto remaining_s = [&](int64_t newest) { return 0.75 * pace_s * double(outer_steps - newest); };

  const std::string run = dir("run");
  // Before the random events (from outer step kFirstEvent on): island 1 killed in the ring, island
  // 0 killed while it sends island 1 the state, island 3 stopped in the ring.
  child_env().push_back("ATOLL_FAULT=kill:island=1:outer_step=2:ring_chunk=1,kill:island=0:transfer=2,"
                        "hang:island=3:outer_step=5:ring_chunk=1");
  Background b(args(run, steps), dir("launch"));
  child_env().pop_back();

  std::mt19937_64 rng(seed);
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * double(rng() >> 11) / double(1ull << 53); };
  std::vector<IslandState> islands(kIslands);
  std::set<pid_t> seen;  // every process of the run, to check none is left
  std::map<std::string, int> tally;
  MetricsTail tail(run + "/metrics.jsonl");
  int64_t newest = 0, events = 0;
  int64_t last_disruption = 0;  // the newest outer step at the last disruption
  int64_t last_event_at = 0;    // the newest outer step at the last random event
  auto progressed_at = Clock::now();
  double longest_wait_s = 0;      // the longest wait for the next outer step, over its bound
  int64_t longest_wait_after = 0;  // the outer step it followed
  int disruptions_in_wait = 0;     // since the newest outer step
  auto next_event = seconds_after(Clock::now(), uniform(0.3, 1.5));
  std::string log;
  // Each random event's time and the newest outer step then; the seconds from it to the next
  // committed outer step (the figure bench/chaos.sh reports: median and max).
  std::vector<std::pair<Clock::time_point, int64_t>> pending;
  std::vector<double> recovery_s;

  while (b.running()) {
    const auto now = Clock::now();
    tail.poll([&](const nlohmann::json& r) {
      if (!r.contains("theta_hash")) return;
      const int64_t s = r["outer_step"].get<int64_t>();
      IslandState& is = islands[size_t(r["island"].get<int>())];
      is.logged = std::max(is.logged, s);
      if (s > newest) newest = s, progressed_at = now, disruptions_in_wait = 0;
    });
    std::erase_if(pending, [&](const auto& p) {
      if (newest <= p.second) return false;
      recovery_s.push_back(std::chrono::duration<double>(now - p.first).count());
      return true;
    });
    // The wait per disruption that came in it (at least one).
    if (const double wait_s = std::chrono::duration<double>(now - progressed_at).count() / std::max(1, disruptions_in_wait);
        newest > 0 && wait_s > longest_wait_s)
      longest_wait_s = wait_s, longest_wait_after = newest;
    if (const pid_t redis = store_pid(b.pid()); redis > 0) seen.insert(redis);
    int disrupted = 0;
    for (int i = 0; i < kIslands; ++i) {
      IslandState& is = islands[size_t(i)];
      const pid_t pid = worker_pid(b.pid(), i);
      if (pid > 0) seen.insert(pid);
      // A worker gone or stopped that this test did not touch: an ATOLL_FAULT point fired.
      if (!is.disrupted && is.pid > 0 && (pid != is.pid || process_state(is.pid) == 'T')) {
        is.disrupted = true, is.disrupted_at = newest, last_disruption = newest, ++disruptions_in_wait;
        ++tally[pid == is.pid ? "stopped by ATOLL_FAULT" : "gone by itself (ATOLL_FAULT or exit 75)"];
        if (pid == is.pid) is.stopped = pid, is.let_go_at = seconds_after(now, 2.5 * kTtlS);
      }
      is.pid = pid;
      if (is.stopped > 0 && now >= is.let_go_at) ::kill(is.stopped, SIGCONT), is.stopped = -1;
      if (is.disrupted && is.stopped < 0 && is.logged > is.disrupted_at + 1) is.disrupted = false;
      disrupted += is.disrupted;
    }
    // The next random event: on an island that is whole, while at most one other is disrupted,
    // once the run has committed an outer step since the last disruption (a stall is one event's).
    const double left_s = remaining_s(newest) - kRejoinS;  // for a hang, once the way back is counted
    if (events < want_events && now >= next_event && newest >= kFirstEvent && left_s > 1.5 * kTtlS &&
        disrupted < 2 && newest > last_disruption + 1) {
      std::vector<int> whole;
      for (int i = 0; i < kIslands; ++i)
        if (!islands[size_t(i)].disrupted && islands[size_t(i)].pid > 0) whole.push_back(i);
      if (!whole.empty()) {
        const int i = whole[size_t(rng() % whole.size())];
        IslandState& is = islands[size_t(i)];
        const bool hang = rng() % 2 == 1;
        if (is.pid > 0 && ::kill(is.pid, hang ? SIGSTOP : SIGKILL) == 0) {  // never kill(-1)
          ++events, ++tally[hang ? "hang" : "kill"], last_event_at = newest;
          pending.emplace_back(now, newest);
          is.disrupted = true, is.disrupted_at = newest, last_disruption = newest, ++disruptions_in_wait;
          // Held past the ttl: shorter than the timeout (the others may get on before it is out)
          // or longer (it is out, leaves when let go, and rejoins).
          // Capped so that the island is back before the end.
          if (hang)
            is.stopped = is.pid,
            is.let_go_at = seconds_after(now, uniform(1.5 * kTtlS, std::min(2 * kTimeoutS, left_s)));
          log += (hang ? "hang island " : "kill island ") + std::to_string(i) + " at outer step " +
                 std::to_string(newest) + "\n";
        }
      }
      next_event = seconds_after(now, uniform(0.3, 1.5));
    }
    if (longest_wait_s > 10 * kTimeoutS) break;  // hung: no need to wait for the suite's timeout
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (IslandState& is : islands)
    if (is.stopped > 0) ::kill(is.stopped, SIGCONT);
  const std::string err = read_file(dir("launch") + ".err");
  ASSERT_FALSE(b.running()) << "the run hung: no outer step for " << longest_wait_s << " s per disruption\n" << log << err;
  const int status = b.wait();
  std::string tally_text;
  for (const auto& [k, n] : tally) tally_text += k + " " + std::to_string(n) + "; ";
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + tally_text + "\n" + log);

  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status << "\n" << err;
  // Events are drawn while at most 2 islands are out and the rest of the run leaves time to come
  // back, so on a quiet machine (an outer step in ~43 ms) the run can end a few short of the
  // target (20 of 22 seen once): at least three quarters of it must come.
  EXPECT_GE(4 * events, 3 * want_events) << "the run ended with " << events << " of " << want_events << " events drawn";
  EXPECT_LE(longest_wait_s, kStallTimeouts * kTimeoutS)
      << "an outer step waited longer than " << kStallTimeouts << " x fault.timeout_s per disruption in the wait, after "
      << "outer step " << longest_wait_after;
  std::sort(recovery_s.begin(), recovery_s.end());
  if (!recovery_s.empty())
    std::printf("chaos seed %lu: %zu events followed by a committed outer step: median %.2f s, max %.2f s after the "
                "event\n", (unsigned long)seed, recovery_s.size(), recovery_s[recovery_s.size() / 2], recovery_s.back());
  std::printf("chaos seed %lu: longest wait for an outer step %.1f s per disruption (after outer step %ld); "
              "fault-free pace %.1f ms per outer step; the last event at outer step %ld of %ld\n",
              (unsigned long)seed, longest_wait_s, (long)longest_wait_after, 1e3 * pace_s, (long)last_event_at,
              (long)outer_steps);
  const RunView v = read_run(run);
  for (const auto& [step, by_island] : v.theta) {
    std::set<std::string> t, m;
    for (const auto& [i, h] : by_island) t.insert(h), m.insert(v.momentum.at(step).at(i));
    EXPECT_EQ(t.size(), 1u) << "outer step " << step;
    EXPECT_EQ(m.size(), 1u) << "outer step " << step;
  }
  ASSERT_FALSE(v.theta.empty());
  EXPECT_EQ(v.theta.rbegin()->first, outer_steps);
  EXPECT_EQ(v.theta.rbegin()->second.size(), size_t(kIslands)) << "every island holds the final θ";
  const double loss = final_val_loss(run);
  EXPECT_LT(std::abs(loss - clean_loss) / clean_loss, 0.02) << "val_loss " << loss << " against " << clean_loss;
  // Nothing left behind: every worker and redis-server seen during the run is gone.
  for (const pid_t pid : seen) {
    const std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    EXPECT_TRUE(cmdline.find(run) == std::string::npos && cmdline.rfind("redis-server", 0) != 0)
        << "process " << pid << " left behind";
  }
  if (const char* keep = std::getenv("ATOLL_CHAOS_KEEP"); keep && *keep) {
    fs::create_directories(keep);
    fs::copy(run, keep, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    std::ofstream(std::string(keep) + "/chaos.log") << "seed " << seed << ": " << tally_text << "\n" << log;
    for (const char* ext : {".out", ".err"})  // the launcher's and the workers' output
      fs::copy_file(dir("launch") + ext, std::string(keep) + "/launch" + ext, fs::copy_options::overwrite_existing);
  }
}

}  // namespace
}  // namespace atl::testing
