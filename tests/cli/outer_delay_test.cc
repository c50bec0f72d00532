// The delayed outer step (diloco.outer_delay = 1, dist/outer_delay.h) through `atoll launch` on
// the micro model, with real processes: two islands train with every exchange behind the next
// round and log equal θ hashes at every outer step; one island killed in the ring of an exchange
// in flight (ATOLL_FAULT) does not end the run: the other retries that outer step alone at its
// wait point, the lost island is restarted, rejoins (the pipeline drains for it) and the hashes
// still agree; a run resumed from a checkpoint taken with an exchange in flight logs the same
// losses and hashes as the uninterrupted run, bit for bit (also 2 x 2 workers with ZeRO-1, and
// with error feedback, per-expert token weights and the sparse expert exchange, whose state in
// flight the checkpoint saves as it was before the exchange); the same with two fragments (one
// exchange in flight per fragment: a kill mid-exchange, and a resume with both in flight); and the
// combinations it cannot run are refused naming the keys (and the placement it cannot run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

class OuterDelayLaunch : public ElasticLaunch {
 protected:
  // (island, rank, step) -> {loss, theta_hash or ""}.
  static std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>> rows(const std::string& run) {
    std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>> r;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
      r[{row["island"].get<int>(), row["rank"].get<int>(), row["step"].get<int64_t>()}] = {
          row["loss"].get<double>(), row.value("theta_hash", "")};
    return r;
  }
  // P: diloco.fragments.
  void expect_resume_in_flight_exact(const std::string& name, int M, const std::vector<std::string>& extra,
                                     int P = 1);
};

TEST_F(OuterDelayLaunch, AnIslandKilledMidExchangeLeavesTheRunGoingWithEqualHashes) {
  const std::string run = dir("run");
  std::vector<std::string> a = args(run, {"--set", "diloco.outer_delay=1"});
  a[2] = "2";  // --islands 2
  // Outer step 2's exchange starts at step 8 and runs behind steps 9-12: island 1 dies in it.
  child_env().push_back("ATOLL_FAULT=kill:island=1:outer_step=2:ring_chunk=1");
  const RunResult r = run_atoll(a, 120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v);
  ASSERT_EQ(v.count("peer_lost"), 1u) << r.describe();
  EXPECT_EQ(v.events.at("peer_lost")[0]["island"], 1);
  ASSERT_GE(v.count("abort_retry"), 1u);
  EXPECT_EQ(v.events.at("abort_retry")[0]["lost"], json::array({1}));
  ASSERT_EQ(v.count("join"), 1u) << r.describe();
  EXPECT_EQ(v.events.at("join")[0]["island"], 1);
  const std::vector<int64_t> alone = steps_with(v, 1), whole = steps_with(v, 2);
  ASSERT_FALSE(alone.empty());
  // Outer step 2 (the exchange the kill hit) is retried without island 1 at step 12. When that
  // commit also admits the restarted island, the same step exchanges round 3's Δ at once (the
  // pipeline drains for the joiner), and the row of step 12 logs outer step 3, island 0 alone.
  EXPECT_GE(alone.front(), 2);
  EXPECT_LE(alone.front(), 3) << "the outer step whose exchange the kill hit was retried without island 1";
  EXPECT_EQ(whole.back(), kSteps / kH) << "whole again at the end";
}

// With two fragments (H = 4, offsets 0 and 2) fragment 1's exchange of outer step 2 starts at
// step 6 and runs behind fragment 0's of step 8: island 1 dies in it. Island 0 votes fragment 0's
// next exchange down as it starts (island 1 is lost), retries fragment 1's alone at step 10 and
// redoes fragment 0's over the new group at its wait point; the restarted island rejoins at a
// commit, for which every exchange in flight is finished and every fragment synced.
TEST_F(OuterDelayLaunch, WithFragmentsAnIslandKilledMidExchangeLeavesTheRunGoingWithEqualHashes) {
  const std::string run = dir("run-fragments");
  const int64_t steps = 200;
  std::vector<std::string> a = args(run, {"--set", "diloco.outer_delay=1", "--set", "diloco.fragments=2"});
  a[2] = "2";  // --islands 2
  std::replace(a.begin(), a.end(), "train.steps=" + std::to_string(kSteps), "train.steps=" + std::to_string(steps));
  child_env().push_back("ATOLL_FAULT=kill:island=1:outer_step=2:ring_chunk=1");
  const RunResult r = run_atoll(a, 120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  // Each fragment: its regular syncs and the final one, and one more at the admission: fragment
  // 1's round in progress is synced with fragment 0's there, so that nothing is in flight.
  const int64_t last = 2 * (steps / kH) + 1;
  expect_agreement(v, last);
  ASSERT_EQ(v.count("peer_lost"), 1u) << r.describe();
  EXPECT_EQ(v.events.at("peer_lost")[0]["island"], 1);
  ASSERT_GE(v.count("abort_retry"), 1u);
  EXPECT_EQ(v.events.at("abort_retry")[0]["lost"], json::array({1}));
  ASSERT_EQ(v.count("join"), 1u) << r.describe();
  const std::vector<int64_t> alone = steps_with(v, 1), whole = steps_with(v, 2);
  ASSERT_FALSE(alone.empty());
  // Island 1 dies in outer step 2's exchange, which may run before it logs outer step 1 (at its
  // step 8). Island 0 retries 2 at step 10; when that commit also admits the restarted island, the
  // same step finishes 3 (fragment 0's, run again over the new group) and syncs both fragments
  // (4, 5), and its row logs the last: island 0 logs 5 alone at the latest.
  EXPECT_LE(alone.front(), 5);
  EXPECT_EQ(whole.back(), last) << "whole again at the end";
}

// A run of 2 islands x M workers, 30 steps of H = 5 with a checkpoint every 10, cut at the
// checkpoint of step 10 (round 2's Δ in flight; with 2 fragments also fragment 1's, started at
// step 7) and resumed: every row's loss and θ hash equal the uninterrupted run's. `extra`: more
// --set pairs.
void OuterDelayLaunch::expect_resume_in_flight_exact(const std::string& name, int M,
                                                     const std::vector<std::string>& extra, int P) {
  SCOPED_TRACE(name);
  const std::string full = dir(name + "-full"), cut = dir(name + "-cut");
  std::vector<std::string> base = {
      "launch", "--islands", "2", "--workers-per-island", std::to_string(M), "--config", world().config(),
      "--set", "train.steps=30", "--set", "diloco.inner_steps=5", "--set", "diloco.outer_delay=1", "--set",
      "train.eval_every=0", "--set", "checkpoint.every=10", "--set", "checkpoint.keep=20", "--set",
      "optim.warmup_steps=2", "--set", std::string("optim.zero1=") + (M > 1 ? "true" : "false"),
      "--set", "diloco.fragments=" + std::to_string(P)};
  base.insert(base.end(), extra.begin(), extra.end());
  auto with_dir = [&](const std::string& d) {
    std::vector<std::string> a = base;
    a.insert(a.end(), {"--run-dir", d});
    return a;
  };
  const RunResult a = run_atoll(with_dir(full), 120);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  // The checkpoint of step 10 holds round 2's Δ, whose exchange was in flight.
  const json m = json::parse(read_file(full + "/checkpoints/step-00000010/manifest.json"));
  EXPECT_EQ(m["state"]["diloco_delay_pending"], P == 1 ? json(true) : json(std::vector<bool>(size_t(P), true)))
      << m["state"].dump();
  fs::copy(full, cut, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(cut + "/checkpoints"))
    if (e.path().filename().string().rfind("step-", 0) == 0 && std::stoll(e.path().filename().string().substr(5)) > 10)
      fs::remove_all(e.path());
  std::ofstream(cut + "/checkpoints/latest") << "step-00000010\n";
  std::vector<std::string> resume = with_dir(cut);
  resume.push_back("--resume");
  const RunResult b = run_atoll(resume, 120);
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  const auto x = rows(full), y = rows(cut);
  ASSERT_EQ(x.size(), 60u * size_t(M));
  ASSERT_EQ(y.size(), 60u * size_t(M));
  size_t hashes = 0;
  for (const auto& [key, want] : x) {
    ASSERT_TRUE(y.count(key));
    EXPECT_EQ(y.at(key).first, want.first) << "island " << std::get<0>(key) << " step " << std::get<2>(key);
    EXPECT_EQ(y.at(key).second, want.second) << "island " << std::get<0>(key) << " step " << std::get<2>(key);
    hashes += !want.second.empty();
  }
  // Outer steps logged at steps 10, 15, 20, 25 and 30 by every worker; with 2 fragments also
  // fragment 1's at 12, 17, 22 and 27.
  EXPECT_EQ(hashes, 2u * (P == 1 ? 5u : 9u) * size_t(M));
  // Every worker logs the same θ hash at each outer step (checked above for the islands' rows
  // against the full run; here across the islands of one run).
  std::map<int64_t, std::set<std::string>> by_step;
  for (const auto& [key, v] : x)
    if (!v.second.empty()) by_step[std::get<2>(key)].insert(v.second);
  for (const auto& [step, seen] : by_step) EXPECT_EQ(seen.size(), 1u) << "step " << step;
}

// 2 islands of one worker, and of two with ZeRO-1 (each rank exchanges its shard of Δ and holds
// the island's whole Δ and eager start, which the checkpoint saves once per island).
TEST_F(OuterDelayLaunch, ResumedFromACheckpointWithAnExchangeInFlightLogsTheSameLossesAndHashes) {
  for (const int M : {1, 2}) expect_resume_in_flight_exact("plain" + std::to_string(M), M, {});
}

// Two fragments, both exchanges in flight at the checkpoint, with error feedback: each
// fragment's residual is saved as it was before its own exchange started (dist/delay_inputs.h);
// also 2 workers per island with ZeRO-1 (each rank exchanges its shard of each fragment's Δ).
TEST_F(OuterDelayLaunch, WithFragmentsAResumeWithEveryExchangeInFlightIsExact) {
  for (const int M : {1, 2})
    expect_resume_in_flight_exact("fragments" + std::to_string(M), M, {"--set", "diloco.error_feedback=true"}, 2);
}

// The state the exchange in flight reads besides Δ, saved as it was before that exchange
// (dist/delay_inputs.h): error feedback's residual (2 workers: each rank's shard of it), and
// with the zaya router (top-1 of 4 experts: experts an island skips in a round) the island's
// per-expert token counts the exchange carries, and the sparse exchange's residual of the
// experts not sent with the ring's of the dense elements. Restoring the residual as it was
// after the exchange, or the counts as zeros, changes the θ hashes after the resume.
TEST_F(OuterDelayLaunch, ErrorFeedbackTokenWeightsAndSparseExpertsResumeExactlyWithAnExchangeInFlight) {
  const std::vector<std::string> zaya = {"--set", "model.router=\"zaya\"", "--set", "model.top_k=1", "--set",
                                         "model.router_hidden_size=8"};
  expect_resume_in_flight_exact("error-feedback", 2, {"--set", "diloco.error_feedback=true"});
  std::vector<std::string> tokens = zaya;
  tokens.insert(tokens.end(), {"--set", "diloco.expert_merge=tokens"});
  expect_resume_in_flight_exact("expert-merge", 1, tokens);
  std::vector<std::string> topk = zaya;
  topk.insert(topk.end(), {"--set", "diloco.expert_topk=0.25", "--set", "diloco.error_feedback=true"});
  expect_resume_in_flight_exact("expert-topk", 1, topk);
}

TEST_F(OuterDelayLaunch, CombinationsItCannotRunAreRefusedNamingTheKeys) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"diloco.overlap_steps", "1"}, {"diloco.sync_seconds", "5"}}) {
    const RunResult r = run_atoll({"launch", "--islands", "2", "--config", world().config(), "--run-dir",
                                   dir("refused-" + key), "--set", "diloco.outer_delay=1", "--set", key + "=" + value});
    EXPECT_TRUE(fails_clearly(r, {"diloco.outer_delay", key})) << r.describe();
  }
  // The sparse expert exchange with 2 workers per island (its island sums would share the island's
  // group with the next round's inner steps), refused at launch.
  const RunResult r = run_atoll({"launch", "--islands", "2", "--workers-per-island", "2", "--config",
                                 world().config(), "--run-dir", dir("refused-topk"), "--set", "diloco.outer_delay=1",
                                 "--set", "diloco.expert_topk=0.25"});
  EXPECT_TRUE(fails_clearly(r, {"diloco.outer_delay", "diloco.expert_topk", "--workers-per-island"})) << r.describe();
}

}  // namespace
}  // namespace atl::testing
