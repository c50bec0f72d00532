// A real partition (issue 38): three emulated hosts (tests/net/emulated_hosts.sh), the store on
// host 0, one island per host started by hand (`atoll worker`, no launcher to restart anyone).
// Host 2's link is cut (down at the router: no SIGSTOP, its process runs on) past the heartbeat
// ttl, then restored. The others must commit outer steps without it meanwhile; host 2 must rejoin
// by itself (fault.rejoin_timeout_s) through state transfer, log outer steps after the cut and hold
// the final one; every worker exits 0; the islands' theta hashes agree at every outer step more
// than one of them logged; host 2's events.jsonl has `dropped` and `rejoined`. Needs root (network
// namespaces): skipped with the reason otherwise. Only addresses inside the namespaces it makes;
// every wait bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_util.h"
#include "net/ns_process.h"

namespace atl::testing {
namespace {

using Clock = std::chrono::steady_clock;

// island -> theta_hash, per outer step, over the three hosts' metrics.jsonl.
using Hashes = std::map<int64_t, std::map<int, std::string>>;

class Partition : public EmulatedHostsTest {
 protected:
  Partition() : EmulatedHostsTest("atlp") {}
  std::string run(int i) const { return dir("run" + std::to_string(i)); }

  // The newest outer step island i's host logged (0: none yet).
  int64_t newest_outer_step(int i) const {
    int64_t n = 0;
    for (const auto& row : read_jsonl(run(i) + "/metrics.jsonl"))
      if (row.contains("outer_step") && row.contains("theta_hash")) n = std::max(n, row["outer_step"].get<int64_t>());
    return n;
  }
  Hashes hashes() const {
    Hashes h;
    for (int i = 0; i < 3; ++i)
      for (const auto& row : read_jsonl(run(i) + "/metrics.jsonl"))
        if (row.contains("outer_step") && row.contains("theta_hash"))
          h[row["outer_step"].get<int64_t>()][row.value("island", i)] = row["theta_hash"].get<std::string>();
    return h;
  }
  static bool has_event(const std::string& run_dir, const std::string& event) {
    for (const auto& row : read_jsonl(run_dir + "/events.jsonl"))
      if (row.value("event", "") == event) return true;
    return false;
  }
};

// Waits up to `timeout_s` for `done()`; false on timeout.
template <typename F>
bool wait_until(double timeout_s, F&& done) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

TEST_F(Partition, AHostCutPastTheTtlRejoinsByItselfOnceItsLinkIsBack) {
  base_run();  // prepares the micro world's data once, so that the three workers only read it
  const std::string up = "NETEM=" + netem() + " " + script() + " up " + name_ + " 3 --link 2:5:1:0 2>&1";
  ASSERT_EQ(std::system((up + " >" + dir("hosts.log")).c_str()), 0) << read_file(dir("hosts.log"));
  const std::string store = "10.79.0.2";
  start(
      0,
      {"redis-server", "--bind", store, "--port", "6390", "--protected-mode", "no", "--save", "", "--appendonly", "no"},
      "redis.log");
  ASSERT_TRUE(wait_until(20, [&] { return read_file(dir("redis.log")).find("Ready to accept") != std::string::npos; }))
      << read_file(dir("redis.log"));
  // A short ttl and timeout, so that the cut is noticed in seconds; steps many enough that the
  // run outlasts the cut and the rejoin on a loaded machine.
  std::vector<NsProcess*> workers;
  for (int i = 0; i < 3; ++i)
    workers.push_back(&start(i, {atoll_bin(), "worker",
                                 "--store",   "redis://" + store + ":6390",
                                 "--island",  std::to_string(i),
                                 "--rank",    "0",
                                 "--islands", "3",
                                 "--run-id",  "part",
                                 "--config",  world().config(),
                                 "--run-dir", run(i),
                                 "--set",     "train.steps=1000",
                                 "--set",     "diloco.inner_steps=5",
                                 "--set",     "train.batch_size=16",
                                 "--set",     "train.eval_every=0",
                                 "--set",     "checkpoint.every=0",
                                 "--set",     "optim.warmup_steps=0",
                                 "--set",     "fault.heartbeat_s=0.2",
                                 "--set",     "fault.heartbeat_ttl_s=1",
                                 "--set",     "fault.timeout_s=3",
                                 "--set",     "fault.rejoin_timeout_s=60"},
                             "worker" + std::to_string(i) + ".log"));
  auto log = [&](int i) { return read_file(dir("worker" + std::to_string(i) + ".log")); };
  ASSERT_TRUE(wait_until(60, [&] { return newest_outer_step(2) >= 3 || !workers[2]->running(); })) << log(2);
  ASSERT_TRUE(workers[2]->running()) << log(2);

  // The cut: host 2's cable pulled at the router. The others must drop it (its heartbeat lapses
  // within the ttl) and commit outer steps without it.
  ASSERT_EQ(std::system((script() + " cut " + name_ + " 2").c_str()), 0);
  const int64_t at_cut = newest_outer_step(0);
  const auto cut_at = Clock::now();
  ASSERT_TRUE(wait_until(30, [&] { return newest_outer_step(0) >= at_cut + 3 || !workers[0]->running(); }))
      << "islands 0 and 1 committed no outer step without host 2: " << log(0);
  // Host 2 notices: its store does not answer within fault.timeout_s (3 s), so it is cut for longer.
  std::this_thread::sleep_for(std::chrono::seconds(4) - (Clock::now() - cut_at));
  const int64_t at_restore = newest_outer_step(0);
  ASSERT_EQ(std::system((script() + " restore " + name_ + " 2").c_str()), 0);

  for (int i = 0; i < 3; ++i) EXPECT_EQ(workers[size_t(i)]->wait(120), 0) << "worker " << i << ":\n" << log(i);
  const Hashes h = hashes();
  std::set<int64_t> host2;
  for (const auto& [step, by_island] : h) {
    if (by_island.count(2)) host2.insert(step);
    std::set<std::string> distinct;
    for (const auto& [island, hash] : by_island) distinct.insert(hash);
    EXPECT_EQ(distinct.size(), 1u) << "theta hashes differ at outer step " << step;
  }
  ASSERT_FALSE(h.empty());
  // Islands 0 and 1 went on without host 2: outer steps it never logged, between the cut and the restore.
  bool without_host2 = false;
  for (int64_t s = at_cut + 1; s <= at_restore; ++s) without_host2 = without_host2 || (h.count(s) && !host2.count(s));
  EXPECT_TRUE(without_host2) << "outer steps " << at_cut << ".." << at_restore << " all on host 2 too";
  ASSERT_FALSE(host2.empty());
  EXPECT_GT(*host2.rbegin(), at_restore) << "host 2 logged no outer step after its link came back:\n" << log(2);
  EXPECT_EQ(*host2.rbegin(), h.rbegin()->first) << "host 2 does not hold the final outer step:\n" << log(2);
  EXPECT_TRUE(has_event(run(2), "dropped")) << read_file(run(2) + "/events.jsonl");
  EXPECT_TRUE(has_event(run(2), "rejoined")) << read_file(run(2) + "/events.jsonl");
  EXPECT_NE(log(2).find("back in the run by itself"), std::string::npos) << log(2);
}

}  // namespace
}  // namespace atl::testing
