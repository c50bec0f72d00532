// `atoll launch` and `atoll worker` through the real binary, on the micro model: a 3-island run
// whose θ hashes agree after every outer step and whose loss falls; streaming DiLoCo's fragments
// agreeing and syncing on schedule, and its bad values refused; the H=1 equivalence of
// DiLoCo and data parallel with SGD inner steps; a data-parallel warm start before DiLoCo; a worker with another model refused; a peer
// that never arrives and an unreachable store ending in a bounded, clear error; a launch run
// holding summary.txt and tokenizer.model for generate and export; the run directory's lock held
// by the launcher, and by a worker 0 started by hand.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "atoll/supervise/redis_server.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using Clock = std::chrono::steady_clock;

class LaunchTest : public CliTest {
 protected:
  static std::string latest_checkpoint_manifest(const std::string& run) {
    return run + "/checkpoints/" + split_lines(read_file(run + "/checkpoints/latest")).at(0) + "/manifest.json";
  }
  RunResult launch(const std::string& run, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"launch", "--config", world().config(), "--run-dir", run,
                                     "--set", "train.eval_every=0", "--set", "checkpoint.every=0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_atoll(args, 120);
  }
  // The same settings as 2 islands (dir("islands")) and as 1 island of 2 workers (dir("ddp")).
  void launch_islands_and_ddp(const std::vector<std::string>& common) {
    for (const auto& [run, shape] : {std::pair<std::string, std::vector<std::string>>{"islands", {"--islands", "2"}},
                                     {"ddp", {"--islands", "1", "--workers-per-island", "2"}}}) {
      std::vector<std::string> v = shape;
      v.insert(v.end(), common.begin(), common.end());
      const RunResult r = launch(dir(run), v);
      ASSERT_EQ(r.exit_code, 0) << run << ": " << r.describe();
    }
  }
  // Loss by (global worker index, step) of a run of M workers per island; worker = island * M + rank.
  static std::map<std::pair<int, int64_t>, double> worker_losses(const std::string& run, int M) {
    std::map<std::pair<int, int64_t>, double> l;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
      l[{row["island"].get<int>() * M + row["rank"].get<int>(), row["step"].get<int64_t>()}] = row["loss"].get<double>();
    return l;
  }
};

TEST_F(LaunchTest, ThreeIslandsAgreeOnThetaAfterEveryOuterStepAndTheLossFalls) {
  const std::string run = dir("run");
  const RunResult r = launch(run, {"--islands", "3", "--set", "train.steps=8", "--set", "diloco.inner_steps=2",
                                   "--set", "diloco.codec=int8", "--set", "optim.warmup_steps=0"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  std::map<int64_t, std::set<std::string>> hashes;
  std::map<int, std::vector<double>> loss;  // per island
  std::set<std::pair<int, int>> workers;
  for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
    ASSERT_TRUE(row.contains("island") && row.contains("rank") && row.contains("comm_bytes")) << row.dump();
    workers.insert({row["island"].get<int>(), row["rank"].get<int>()});
    loss[row["island"].get<int>()].push_back(row["loss"].get<double>());
    if (row.contains("theta_hash")) hashes[row["outer_step"].get<int64_t>()].insert(row["theta_hash"].get<std::string>());
  }
  EXPECT_EQ(workers.size(), 3u);
  ASSERT_EQ(hashes.size(), 4u);  // steps 2, 4, 6, 8
  for (const auto& [step, h] : hashes) EXPECT_EQ(h.size(), 1u) << "outer step " << step;
  for (const auto& [island, l] : loss) {
    ASSERT_EQ(l.size(), 8u);
    EXPECT_LT(l.back(), l.front()) << "island " << island;
  }
  // Island 0 rank 0 checkpointed the DiLoCo state.
  const std::string ckpt = run + "/checkpoints/step-00000008/manifest.json";
  ASSERT_TRUE(fs::exists(ckpt));
  const auto manifest = nlohmann::json::parse(read_file(ckpt));
  EXPECT_TRUE(manifest["tensors"].contains("diloco_theta/embed")) << manifest["tensors"].dump().substr(0, 300);
  EXPECT_TRUE(manifest["tensors"].contains("diloco_momentum/embed"));
  EXPECT_EQ(manifest["state"]["outer_step"].get<int>(), 4);
}

// Streaming DiLoCo (dist/streaming.h) through the real binary: 2 fragments of 3 layers and 3 of 5
// (P not dividing L), blocking and overlapped. Every island logs the same θ hash for every
// fragment sync (keyed by the run-wide outer_step), each fragment syncs as often as its staggered
// schedule says, the last step is the full sync of every fragment (fragment -1), and the loss
// falls.
TEST_F(LaunchTest, StreamingFragmentsAgreeOnThetaAndSyncOnSchedule) {
  struct Case {
    int layers, P, tau;
    int64_t H, steps;
  };
  for (const Case c : {Case{3, 2, 0, 4, 14}, Case{3, 2, 1, 4, 14}, Case{5, 3, 0, 6, 20}, Case{5, 3, 1, 6, 20}}) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "L%dP%dtau%d", c.layers, c.P, c.tau);
    const std::string name = buf;
    const std::string run = dir(name);
    const RunResult r = launch(run, {"--islands", "2", "--set", "model.n_layers=" + std::to_string(c.layers), "--set",
                                     "train.steps=" + std::to_string(c.steps), "--set",
                                     "diloco.inner_steps=" + std::to_string(c.H), "--set",
                                     "diloco.fragments=" + std::to_string(c.P), "--set",
                                     "diloco.overlap_steps=" + std::to_string(c.tau), "--set", "optim.warmup_steps=0"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    std::map<int64_t, std::set<std::string>> hashes;  // by outer_step: fragment/hash
    std::map<int, std::map<int, int>> syncs;           // island -> fragment -> count
    std::map<int, std::vector<double>> loss;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      const int island = row["island"].get<int>();
      loss[island].push_back(row["loss"].get<double>());
      if (c.tau > 0) {
        EXPECT_TRUE(row.contains("overlap_comm_s")) << row.dump();
      }
      if (!row.contains("theta_hash")) continue;
      const int f = row["fragment"].get<int>();
      hashes[row["outer_step"].get<int64_t>()].insert(std::to_string(f) + "/" + row["theta_hash"].get<std::string>());
      syncs[island][f]++;
      if (f < 0) {
        EXPECT_EQ(row["step"].get<int64_t>(), c.steps) << name;
      }
    }
    for (const auto& [step, h] : hashes) EXPECT_EQ(h.size(), 1u) << name << " outer step " << step;
    for (const auto& [island, per] : syncs) {
      EXPECT_EQ(per.at(-1), 1) << name;
      for (int f = 0; f < c.P; ++f) {
        // Regular syncs at offset_f + kH (k >= 1) below the last step, offset_f = f*H/P.
        int expected = 0;
        for (int64_t t = f * c.H / c.P + c.H; t < c.steps; t += c.H) ++expected;
        EXPECT_EQ(per.count(f) ? per.at(f) : 0, expected) << name << " island " << island << " fragment " << f;
      }
    }
    for (const auto& [island, l] : loss) {
      ASSERT_EQ(l.size(), size_t(c.steps));
      EXPECT_LT(l.back(), l.front()) << name << " island " << island;
    }
    // The checkpoint counts every fragment's outer steps, the final full sync included.
    const auto state = nlohmann::json::parse(read_file(latest_checkpoint_manifest(run)))["state"];
    ASSERT_EQ(state["fragment_outer_steps"].size(), size_t(c.P)) << state.dump();
    for (int f = 0; f < c.P; ++f)
      EXPECT_EQ(state["fragment_outer_steps"][size_t(f)].get<int>(), syncs[0][f] + 1) << name << " fragment " << f;
  }
}

TEST_F(LaunchTest, BadStreamingValuesAreClearErrorsNamingTheKey) {
  RunResult r = launch(dir("p"), {"--islands", "2", "--set", "diloco.fragments=3"});  // the micro model has 2 layers
  EXPECT_TRUE(fails_clearly(r, {"diloco.fragments", "model.n_layers"}));
  r = launch(dir("tau"), {"--islands", "2", "--set", "diloco.fragments=2", "--set", "diloco.inner_steps=6", "--set",
                          "diloco.overlap_steps=3"});
  EXPECT_TRUE(fails_clearly(r, {"diloco.overlap_steps", "diloco.inner_steps / diloco.fragments", "at most 2"}));
  r = launch(dir("mix"), {"--islands", "2", "--set", "diloco.mixing=1.5"});
  EXPECT_TRUE(fails_clearly(r, {"diloco.mixing"}));
  EXPECT_FALSE(fs::exists(dir("p") + "/config.toml"));
}

// DiLoCo with H = 1, fp32, outer lr 1 and no momentum averages the islands' parameters after
// every step. With plain SGD inner steps (linear in the gradient) that is exactly a step on the
// mean gradient, i.e. data parallel: 2 islands equal 1 island of 2 workers to rounding, worker
// by worker (the same data slices). With AdamW it would not (sgd.h, docs/islands.md). Gradient
// clipping is off because clipping each island's gradient is not linear either.
// comm_bytes is training traffic: checkpoints gathered to their writer every 2 steps leave it as
// it is without them (the DiLoCo-versus-data-parallel byte count must not depend on checkpoints).
TEST_F(LaunchTest, CheckpointGathersAreNotCountedInCommBytes) {
  std::map<std::string, std::map<std::pair<int, int>, uint64_t>> bytes;  // run -> worker -> last comm_bytes
  for (const std::string every : {"0", "2"}) {
    const RunResult r = launch(dir("every" + every), {"--islands", "2", "--workers-per-island", "2", "--set",
                                                      "train.steps=6", "--set", "diloco.inner_steps=3", "--set",
                                                      "checkpoint.every=" + every});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    for (const auto& row : read_jsonl(dir("every" + every) + "/metrics.jsonl"))
      bytes[every][{row["island"].get<int>(), row["rank"].get<int>()}] = row["comm_bytes"].get<uint64_t>();
  }
  EXPECT_EQ(bytes["2"], bytes["0"]);
  EXPECT_EQ(bytes["0"].size(), 4u);
}

TEST_F(LaunchTest, SgdWithHOneEqualsDataParallel) {
  const std::vector<std::string> common = {"--set", "optim.name=sgd", "--set", "optim.lr=0.5", "--set",
                                           "optim.grad_clip=0", "--set", "optim.warmup_steps=0", "--set",
                                           "train.steps=4", "--set", "diloco.inner_steps=1", "--set",
                                           "diloco.codec=fp32", "--set", "diloco.outer_lr=1.0", "--set",
                                           "diloco.outer_momentum=0.0"};
  ASSERT_NO_FATAL_FAILURE(launch_islands_and_ddp(common));
  const auto la = worker_losses(dir("islands"), 1), lb = worker_losses(dir("ddp"), 2);
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 8u);
  for (const auto& [key, v] : la) {
    ASSERT_TRUE(lb.count(key));
    // Rounding: Δ = θ - θ_local and θ - mean(Δ) each round once in fp32, against one gradient
    // all-reduce; over 4 steps the loss moves by ~1e-6 relative. 1e-4 leaves a wide margin
    // while the loss itself moves by far more (checked below).
    EXPECT_NEAR(v, lb.at(key), 1e-4) << "worker " << key.first << " step " << key.second;
  }
  EXPECT_GT(std::abs(la.at({0, 1}) - la.at({0, 4})), 1e-2) << "the loss hardly moved: the test would prove nothing";
}

// diloco.dp_warmup_steps = 3: steps 1-3 share every gradient across the islands, so 2 islands
// log exactly the losses of 1 island of 2 workers (each island's gradient is one worker's, and
// the mean of two is the same sum either way) up to step 4, whose loss is computed from the
// parameters after step 3. DiLoCo then starts from the warm parameters: the hash of θ at step 3
// agrees across islands (outer_step 0), its outer steps follow at steps 3 + 2k and the last
// step, and the islands leave data parallel (step 5's loss differs).
TEST_F(LaunchTest, DataParallelWarmStartThenDiloco) {
  const std::vector<std::string> common = {"--set", "train.steps=6", "--set", "diloco.inner_steps=2", "--set",
                                           "diloco.dp_warmup_steps=3", "--set", "optim.warmup_steps=0"};
  ASSERT_NO_FATAL_FAILURE(launch_islands_and_ddp(common));
  const auto la = worker_losses(dir("islands"), 1), lb = worker_losses(dir("ddp"), 2);
  std::map<int64_t, std::set<std::string>> hashes;  // outer step -> θ hashes of the islands
  std::map<int64_t, int64_t> outer_at;              // outer step -> the step it followed
  for (const auto& row : read_jsonl(dir("islands") + "/metrics.jsonl")) {
    if (!row.contains("theta_hash")) continue;
    hashes[row["outer_step"].get<int64_t>()].insert(row["theta_hash"].get<std::string>());
    outer_at[row["outer_step"].get<int64_t>()] = row["step"].get<int64_t>();
  }
  ASSERT_EQ(la.size(), 12u);
  ASSERT_EQ(lb.size(), 12u);
  for (int w = 0; w < 2; ++w) {
    for (int64_t s = 1; s <= 4; ++s) EXPECT_EQ(la.at({w, s}), lb.at({w, s})) << "worker " << w << " step " << s;
    EXPECT_NE(la.at({w, 5}), lb.at({w, 5})) << "worker " << w << ": still data parallel after the warm start";
  }
  EXPECT_EQ(outer_at, (std::map<int64_t, int64_t>{{0, 3}, {1, 5}, {2, 6}}));
  for (const auto& [outer, h] : hashes) EXPECT_EQ(h.size(), 1u) << "outer step " << outer;
  bool started = false;
  for (const auto& e : read_jsonl(dir("islands") + "/events.jsonl"))
    if (e["event"] == "diloco_start") started = e["step"].get<int64_t>() == 3;
  EXPECT_TRUE(started);
}

// SIGINT to the launcher (Ctrl-C) stops every worker and its redis-server; the newest complete
// checkpoint loads (`atoll eval`). While it runs, the run directory is locked.
TEST_F(LaunchTest, SigintStopsTheWholeRunLeavingALoadableCheckpoint) {
  const std::string run = dir("run");
  Background b({"launch", "--config", world().config(), "--run-dir", run, "--islands", "2", "--set",
                "train.steps=100000", "--set", "train.eval_every=0", "--set", "checkpoint.every=2", "--set",
                "diloco.inner_steps=2"},
               dir("launch"));
  ASSERT_TRUE(wait_for_file(run + "/checkpoints", "latest", 60, [&] { return b.running(); }))
      << read_file(dir("launch") + ".err");
  // The launcher holds the run's lock for its workers: another writer is refused.
  EXPECT_TRUE(fails_clearly(world().train(run, {"--resume"}), {run, "pid " + std::to_string(b.pid())}));
  const auto t0 = Clock::now();
  ::kill(b.pid(), SIGINT);
  const int status = b.wait();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << status;
  const std::string err = read_file(dir("launch") + ".err");
  EXPECT_NE(err.find("every worker stopped"), std::string::npos) << err;
  const RunResult e = run_atoll({"eval", "--checkpoint", run});
  EXPECT_EQ(e.exit_code, 0) << e.describe();
}

// A launch run holds what a single run holds: summary.txt and tokenizer.model, so `atoll
// generate` and `atoll export` work on it and the export carries the tokenizer.
TEST_F(LaunchTest, ARunHoldsSummaryAndTokenizerSoGenerateAndExportWork) {
  const std::string run = dir("run");
  const RunResult r = launch(run, {"--islands", "2", "--set", "train.steps=4", "--set", "diloco.inner_steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(fs::exists(run + "/tokenizer.model"));
  const std::string summary = read_file(run + "/summary.txt");
  EXPECT_NE(summary.find("2 islands"), std::string::npos) << summary;
  EXPECT_NE(summary.find("final checkpoint " + run + "/checkpoints/step-00000004"), std::string::npos) << summary;
  const RunResult g = run_atoll({"generate", "--checkpoint", run, "--prompt", "The island", "--max-tokens", "8"});
  ASSERT_EQ(g.exit_code, 0) << g.describe();
  EXPECT_EQ(g.out.rfind("The island", 0), 0u) << g.out;
  const RunResult x = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", dir("hf")});
  ASSERT_EQ(x.exit_code, 0) << x.describe();
  EXPECT_EQ(read_file(dir("hf") + "/tokenizer.model"), read_file(run + "/tokenizer.model"));
}

class WorkerTest : public CliTest {
 protected:
  static void SetUpTestSuite() {
    CliTest::SetUpTestSuite();
    server_ = new RedisServer();
  }
  static void TearDownTestSuite() {
    delete server_;
    CliTest::TearDownTestSuite();
  }
  std::vector<std::string> worker(const std::string& run_id, int island, int islands,
                                  const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"worker",  "--config",  world().config(), "--store", server_->url(),
                                     "--island", std::to_string(island), "--rank", "0", "--islands",
                                     std::to_string(islands), "--run-id", run_id, "--run-dir",
                                     dir("run-" + std::to_string(island)), "--quiet", "--set", "fault.timeout_s=5"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  static inline RedisServer* server_ = nullptr;
};

TEST_F(WorkerTest, AWorkerWithAnotherModelIsRefusedNamingTheDifference) {
  // Data prepared first, so both workers start at once.
  ASSERT_EQ(world().train(dir("prep"), {"--set", "train.steps=1"}).exit_code, 0);
  Background other(worker("differ", 1, 2, {"--set", "model.expert_hidden=64"}), dir("other"));
  const RunResult r = run_atoll(worker("differ", 0, 2));
  EXPECT_TRUE(fails_clearly(r, {"island 0 rank 0", "model config", "expert_hidden"}));
  other.wait();
  const std::string other_err = read_file(dir("other") + ".err");
  EXPECT_NE(other_err.find("expert_hidden"), std::string::npos) << other_err;
}

// Worker 0 started by hand (no launcher) writes the run folder, so it takes the run's lock.
TEST_F(WorkerTest, AHandStartedWorkerZeroTakesTheRunsLock) {
  base_run();  // the data prepared first
  const std::string run = dir("run-0");
  Background busy({"train", "--config", world().config(), "--run-dir", run, "--no-sample", "--set",
                   "train.steps=100000", "--set", "checkpoint.every=2", "--set", "checkpoint.keep=1000000", "--set",
                   "train.eval_every=0"},  // keep: the step-2 checkpoint named below must stay
                  dir("busy"));
  ASSERT_TRUE(wait_for_file(run + "/checkpoints", "latest", 60, [&] { return busy.running(); }))
      << read_file(dir("busy") + ".err");
  const RunResult r = run_atoll(worker("locked", 0, 1, {"--resume-from", run + "/checkpoints/step-00000002"}));
  EXPECT_TRUE(fails_clearly(r, {run, "pid " + std::to_string(busy.pid())}));
}

TEST_F(WorkerTest, APeerThatNeverArrivesEndsInABoundedError) {
  ASSERT_EQ(world().train(dir("prep"), {"--set", "train.steps=1"}).exit_code, 0);
  const auto t0 = Clock::now();
  const RunResult r = run_atoll(worker("alone", 0, 2, {"--set", "fault.timeout_s=2"}));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(fails_clearly(r, {"island 0 rank 0", "fault.timeout_s"}));
  EXPECT_LT(s, 30.0) << "the wait is bounded by fault.timeout_s = 2 (plus start-up)";
}

TEST_F(LaunchTest, AnUnreachableStoreIsAClearErrorAndNothingIsStarted) {
  const auto t0 = Clock::now();
  const RunResult r = launch(dir("run"), {"--islands", "2", "--store", "redis://127.0.0.1:1", "--set", "fault.timeout_s=2"});
  EXPECT_TRUE(fails_clearly(r, {"--store", "redis://127.0.0.1:1"}));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30.0);
  EXPECT_FALSE(fs::exists(dir("run") + "/config.toml"));
}

}  // namespace
}  // namespace atl::testing
