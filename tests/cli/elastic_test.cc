// Elastic islands through `atoll launch` on the micro model, with real processes and signals:
// a worker stopped at an exact point of the ring (ATOLL_FAULT=hang) and killed there with
// SIGKILL from outside is restarted, rejoins with its own data slice, and every outer step
// ends with equal θ and momentum hashes; an island of two workers that loses one (plain, ZeRO-1,
// or one context-parallel group) leaves as a whole and rejoins; a state transfer corrupted on the wire is refused by
// the joiner's hash check and sent again (with two fragments); a transfer whose source is lost is retried from another
// island (and the source rejoins in turn), and one whose source stops is retried within the
// heartbeat ttl; an island of two workers that loses one leaves as a
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
#include <sstream>
#include <thread>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

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
  EXPECT_GT(join["transfer_bytes"].get<double>(), 0) << join.dump();  // the figures of the join benchmark
  EXPECT_GT(join["transfer_s"].get<double>(), 0) << join.dump();
  EXPECT_GE(join["admission_wait_s"].get<double>(), 0) << join.dump();
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

// As above, but the source stops (SIGSTOP) in the transfer rather than dying, its connections
// open. The joiner's receive and the other member's wait give up on it once its heartbeat expires
// (1 s), not after fault.timeout_s (60 s here): island 2 is admitted from island 1 well within
// that. Let go, island 0 finds itself left out and leaves (it rejoins unless the run ends first).
TEST_F(ElasticLaunch, ATransferWhoseSourceStopsIsRetriedFromAnotherIslandWithinTheTtl) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=kill:island=2:outer_step=2:ring_chunk=1,hang:island=0:transfer=2");
  Background b(args(run, {"--set", "fault.timeout_s=60"}), dir("launch"));
  child_env().pop_back();
  const auto alive = [&] { return b.running(); };
  pid_t source = -1;
  ASSERT_TRUE(wait_until([&] { return (source = worker_pid(b.pid(), 0)) > 0 && process_state(source) == 'T'; }, 60,
                         alive))
      << read_file(dir("launch") + ".err");
  const auto stopped_at = std::chrono::steady_clock::now();
  const auto joined = [&] {  // island 2's join event in events.jsonl (whole lines)
    std::istringstream lines(read_file(run + "/events.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const auto e = nlohmann::json::parse(line, nullptr, false);
      if (!e.is_discarded() && e.value("event", "") == "join" && e.value("island", -1) == 2) return true;
    }
    return false;
  };
  const bool admitted = wait_until(joined, 60, alive);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  ::kill(source, SIGCONT);
  ASSERT_TRUE(admitted) << read_file(dir("launch") + ".err");
  EXPECT_LT(waited, 20.0) << "the stopped source was waited for, not given up on";
  ASSERT_TRUE(ends_with_exit_0(b));
  const RunView v = read_run(run);
  expect_agreement(v);
  std::map<int, nlohmann::json> join;  // by island
  for (const auto& e : v.events.at("join")) join[e["island"].get<int>()] = e;
  ASSERT_EQ(join.count(2), 1u);
  EXPECT_EQ(join[2]["source"], 1) << join[2].dump();
  if (join.count(0)) {  // unless the run ended first
    EXPECT_NE(join[0]["source"], 0) << join[0].dump();
  }
}

// Two workers per island: island 1 loses rank 1; rank 0 fails in the island's gradient mean and
// leaves too (exit 75), both are restarted, and the island rejoins as a whole.
TEST_F(ElasticLaunch, AnIslandThatLosesAWorkerLeavesAsAWholeAndRejoins) { lose_a_worker_and_rejoin(dir("run"), {}); }

// The same with ZeRO-1 inside the islands: the restarted ranks receive their shards of the moments
// (rank r's from rank r of the live island) and the island's parameters; θ and momentum hashes
// agree across islands at every outer step after it rejoins.
TEST_F(ElasticLaunch, AZero1IslandThatLosesAWorkerRejoinsWithEqualHashes) {
  lose_a_worker_and_rejoin(dir("run"), {"--set", "optim.zero1=true"});
}

// The same with each island one context-parallel group of 2 (train.context_parallel = 2, CCA
// layers: ring attention and the boundary exchange between the two ranks): the killed rank and
// its partner restart, the group re-forms in the rejoined island, and θ and momentum hashes agree
// across islands at every outer step. Half the steps: a group's step costs about twice a plain
// worker's (measured 70 s against 27 s at 1200 steps under load), and the rejoin still comes
// early in the run.
TEST_F(ElasticLaunch, AContextParallelIslandThatLosesAWorkerRejoinsWithEqualHashes) {
  lose_a_worker_and_rejoin(dir("run"), {"--set", "train.context_parallel=2", "--set", "model.attention=\"cca\""},
                           kSteps / 2);
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

// The restart backoff doubles in a crash loop and starts again once the worker has taken part in
// a committed outer step: island 2 killed after it rejoined and trained is restarted after the
// first delay again (0.2 s, not 0.4), and its successor killed before it could rejoin after twice
// that (0.4 s). Before, the delay doubled with every restart of the run, and a worker lost now and
// then over a long run waited minutes and could miss the run's end.
TEST_F(ElasticLaunch, TheRestartBackoffStartsAgainOnceTheWorkerContributes) {
  const std::string run = dir("run");
  Background b(args(run), dir("launch"));
  const auto alive = [&] { return b.running(); };
  const auto contributed_since = [&](int64_t outer_step) {  // island 2 logged an outer step after it
    const RunView v = read_run(run);
    for (auto it = v.theta.upper_bound(outer_step); it != v.theta.end(); ++it)
      if (it->second.count(2)) return true;
    return false;
  };
  // 1. Killed once it has trained: restart 1 after 0.2 s.
  ASSERT_TRUE(wait_until([&] { return contributed_since(2); }, 60, alive)) << read_file(dir("launch") + ".err");
  pid_t victim = worker_pid(b.pid(), 2);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  // 2. Killed after it rejoined and took part in a committed outer step: restart 2 after 0.2 s again.
  ASSERT_TRUE(wait_until([&] { return read_run(run).count("join") == 1; }, 60, alive)) << read_file(dir("launch") + ".err");
  const int64_t joined_at = read_run(run).events.at("join")[0]["outer_step"].get<int64_t>();
  ASSERT_TRUE(wait_until([&] { return contributed_since(joined_at + 1); }, 60, alive)) << read_file(dir("launch") + ".err");
  victim = worker_pid(b.pid(), 2);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  // 3. Its successor killed as soon as it starts, before it can rejoin: restart 3 after 0.4 s.
  pid_t next = -1;
  ASSERT_TRUE(wait_until([&] { return (next = worker_pid(b.pid(), 2)) > 0 && next != victim; }, 60, alive))
      << read_file(dir("launch") + ".err");
  ASSERT_EQ(read_run(run).count("join"), 1u) << "the successor rejoined before it was killed";
  ASSERT_EQ(::kill(next, SIGKILL), 0);
  ASSERT_TRUE(ends_with_exit_0(b));
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_EQ(v.count("restart"), 3u);
  std::vector<double> after;
  for (const auto& e : v.events.at("restart")) after.push_back(e["after_s"].get<double>());
  EXPECT_EQ(after, (std::vector<double>{0.2, 0.2, 0.4}));
  EXPECT_EQ(steps_with(v, 3).back(), kSteps / kH) << "whole again at the end";
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
