// Resuming a multi-island run (`atoll launch --resume`): the checkpoint holds every island's
// parameters and optimizer moments, θ, the outer momentum, every worker's loader cursor and the
// per-fragment outer step counts, so a run resumed from a checkpoint logs the same losses and θ
// hashes as the uninterrupted run, bit for bit (JSON numbers round-trip doubles). Checked from a
// checkpoint of the uninterrupted run itself (deterministic), across 2 islands x 2 workers, with
// streaming fragments overlapped, with error feedback, with Muon as the inner optimizer (its
// momentum travels in adam_m), with per-expert token weights (the round's counts so far), with the sparse expert exchange (each island's residual of unsent experts), inside and after a data-parallel warm start, and after a real
// stop (SIGINT to the launcher). A resume on another island shape keeps θ and what fits
// (state_checkpoint.h). One checkpoint format for every kind of run: a single-process `atoll train` writes the
// manifest of a run of 1 island x 1 worker, and `atoll train --resume` and `atoll launch --islands 1
// --workers-per-island 1 --resume` continue each other's checkpoints.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

class IslandResume : public CliTest {
 protected:
  std::vector<std::string> args(const std::string& run, const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {"launch", "--config", world().config(), "--run-dir", run};
    for (const char* kv : {"train.eval_every=0", "checkpoint.every=5", "checkpoint.keep=20", "optim.warmup_steps=2"})
      a.insert(a.end(), {"--set", kv});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // (island, rank, step) -> {loss, theta_hash or ""}; every key once.
  static std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>> rows(const std::string& run) {
    std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>> r;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      const auto key = std::make_tuple(row["island"].get<int>(), row["rank"].get<int>(), row["step"].get<int64_t>());
      EXPECT_FALSE(r.count(key)) << "step " << std::get<2>(key) << " logged twice in " << run;
      r[key] = {row["loss"].get<double>(), row.value("theta_hash", "")};
    }
    return r;
  }
  // The run in `from` copied to `to` as it stood at its checkpoint of `step` (later ones gone).
  static void cut_at(const std::string& from, const std::string& to, int64_t step) {
    fs::copy(from, to, fs::copy_options::recursive);
    for (const auto& e : fs::directory_iterator(to + "/checkpoints"))
      if (e.path().filename().string().rfind("step-", 0) == 0 && std::stoll(e.path().filename().string().substr(5)) > step)
        fs::remove_all(e.path());
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld\n", static_cast<long long>(step));
    std::ofstream(to + "/checkpoints/latest") << name;
  }
  static void expect_same_rows(const std::string& full, const std::string& resumed, size_t n) {
    const auto a = rows(full), b = rows(resumed);
    ASSERT_EQ(a.size(), n);
    ASSERT_EQ(b.size(), n);
    for (const auto& [key, v] : a) {
      ASSERT_TRUE(b.count(key));
      EXPECT_EQ(b.at(key).first, v.first) << "island " << std::get<0>(key) << " rank " << std::get<1>(key) << " step "
                                          << std::get<2>(key);
      EXPECT_EQ(b.at(key).second, v.second) << "step " << std::get<2>(key);
    }
  }
};

TEST_F(IslandResume, ResumedFromACheckpointLogsTheSameLossesAndHashes) {
  struct Case {
    std::string name;
    std::vector<std::string> extra;
    size_t rows;
  };
  const std::vector<Case> cases = {
      {"workers", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                   "diloco.inner_steps=3"}, 48},
      {"streaming", {"--islands", "2", "--set", "train.steps=15", "--set", "model.n_layers=3", "--set",
                     "diloco.inner_steps=4", "--set", "diloco.fragments=2", "--set", "diloco.overlap_steps=1"}, 30},
      // The error-feedback residuals (one per fragment, sharded over the island's 2 ranks) resume too.
      {"error-feedback", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                          "model.n_layers=3", "--set", "diloco.inner_steps=2", "--set", "diloco.fragments=2", "--set",
                          "diloco.error_feedback=true"}, 48},
      // MuLoCo: Muon's momentum (adam_m) for the hidden matrices, AdamW's moments for the rest.
      {"muon", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                "diloco.inner_steps=3", "--set", "optim.name=muon"}, 48},
      // Cut inside the data-parallel warm start (θ is still the initial one) and after it.
      {"warm-start-7", {"--islands", "2", "--set", "train.steps=12", "--set", "diloco.inner_steps=3", "--set",
                        "diloco.dp_warmup_steps=7"}, 24},
      {"warm-start-4", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                        "diloco.inner_steps=3", "--set", "diloco.dp_warmup_steps=4"}, 48},
      // Per-expert token weights: the cut at step 5 falls inside the round of steps 5-8, whose
      // counts so far (per worker) the checkpoint holds.
      {"expert-merge", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                        "diloco.inner_steps=4", "--set", "diloco.expert_merge=tokens"}, 48},
      // The sparse expert exchange: each island's residual of the experts it did not send at the
      // outer step of step 4 (sharded over its 2 ranks), beside the ring's for the dense elements.
      {"expert-topk", {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=12", "--set",
                       "diloco.inner_steps=4", "--set", "diloco.expert_topk=0.25", "--set",
                       "diloco.error_feedback=true"}, 48}};
  for (const Case& c : cases) {
    const std::string full = dir(c.name + "-full"), cut = dir(c.name + "-cut");
    const RunResult a = run_atoll(args(full, c.extra), 120);
    ASSERT_EQ(a.exit_code, 0) << a.describe();
    cut_at(full, cut, 5);
    auto v = args(cut, c.extra);
    v.push_back("--resume");
    const RunResult b = run_atoll(v, 120);
    ASSERT_EQ(b.exit_code, 0) << b.describe();
    expect_same_rows(full, cut, c.rows);
    bool saw_resume = false;
    for (const auto& e : read_jsonl(cut + "/events.jsonl"))
      if (e["event"] == "resume") saw_resume = e["step"].get<int64_t>() == 5;
    EXPECT_TRUE(saw_resume) << c.name;
  }
}

// A real stop: SIGINT to the launcher right after its first checkpoint, then --resume. The model
// is larger than the micro one so that steps take long enough for the stop to land mid-run.
TEST_F(IslandResume, StoppedRunResumesToTheSameResult) {
  const std::vector<std::string> extra = {"--islands", "2", "--set", "train.steps=20", "--set", "diloco.inner_steps=4",
                                          "--set", "model.dim=64", "--set", "model.expert_hidden=128", "--set",
                                          "model.seq_len=128", "--set", "train.batch_size=8"};
  const std::string full = dir("full"), stopped = dir("stopped");
  const RunResult a = run_atoll(args(full, extra), 180);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  {
    Background b(args(stopped, extra), dir("stopped-log"));
    const bool appeared = wait_for_file(stopped + "/checkpoints", "latest", 120.0, [&] { return b.running(); });
    ::kill(b.pid(), SIGINT);
    const int status = b.wait();
    ASSERT_TRUE(appeared) << read_file(dir("stopped-log.err"));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT)
        << "the run ended before it was stopped (status " << status << "); make its steps slower";
  }
  const std::string latest = split_lines(read_file(stopped + "/checkpoints/latest")).at(0);
  const int64_t ck_step = std::stoll(latest.substr(5));
  ASSERT_GE(ck_step, 5);
  ASSERT_LT(ck_step, 20);
  RecordProperty("stopped_after_checkpoint", static_cast<int>(ck_step));
  auto v = args(stopped, extra);
  v.push_back("--resume");
  const RunResult r = run_atoll(v, 180);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  expect_same_rows(full, stopped, 40);
}

// The pids of a process's children (/proc/PID/task/PID/children).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children"));
  for (pid_t c; in >> c;) out.push_back(c);
  return out;
}

// Preemption: SIGTERM to the launcher, or to one worker alone, stops the whole run at one step
// with a checkpoint of it, the launcher exits 0 with a `preempted` event, and --resume continues
// to the same losses and θ hashes as the uninterrupted run.
TEST_F(IslandResume, SigtermWritesAFinalCheckpointAndTheRunResumesFromIt) {
  const std::vector<std::string> extra = {"--islands", "2", "--set", "train.steps=30", "--set", "diloco.inner_steps=4",
                                          "--set", "model.dim=64", "--set", "model.expert_hidden=128", "--set",
                                          "model.seq_len=128", "--set", "train.batch_size=8"};
  const std::string full = dir("full");
  const RunResult a = run_atoll(args(full, extra), 180);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  for (const bool to_worker : {false, true}) {
    SCOPED_TRACE(to_worker ? "SIGTERM to island 1's worker" : "SIGTERM to the launcher");
    const std::string run = dir(to_worker ? "worker" : "launcher");
    {
      Background b(args(run, extra), run + "-log");
      ASSERT_TRUE(wait_for_file(run + "/checkpoints", "latest", 120.0, [&] { return b.running(); }))
          << read_file(run + "-log.err");
      pid_t target = b.pid();
      if (to_worker) {
        const std::vector<pid_t> kids = children_of(b.pid());
        ASSERT_GE(kids.size(), 2u);
        target = kids.back();  // spawned last: island 1's worker (redis-server, if any, came first)
      }
      ::kill(target, SIGTERM);
      const int status = b.wait();
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "status " << status << "\n" << read_file(run + "-log.err");
    }
    const std::string latest = split_lines(read_file(run + "/checkpoints/latest")).at(0);
    const int64_t stopped_at = std::stoll(latest.substr(5));
    ASSERT_LT(stopped_at, 30) << "the run ended before it was stopped; make its steps slower";
    int64_t last_logged = 0;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) last_logged = std::max(last_logged, row["step"].get<int64_t>());
    EXPECT_EQ(last_logged, stopped_at) << "no step is lost: the checkpoint is of the last step taken";
    bool preempted = false;
    for (const auto& e : read_jsonl(run + "/events.jsonl")) preempted = preempted || e["event"] == "preempted";
    EXPECT_TRUE(preempted);
    auto v = args(run, extra);
    v.push_back("--resume");
    const RunResult r = run_atoll(v, 180);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    expect_same_rows(full, run, 60);
  }
}

// Step -> loss of a run's metrics (every step once).
std::map<int64_t, double> losses(const std::string& run) {
  std::map<int64_t, double> r;
  for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
    const int64_t step = row["step"].get<int64_t>();
    EXPECT_FALSE(r.count(step)) << "step " << step << " logged twice in " << run;
    r[step] = row["loss"].get<double>();
  }
  return r;
}

std::set<std::string> keys(const json& j) {
  std::set<std::string> k;
  for (const auto& [key, value] : j.items()) k.insert(key);
  return k;
}

TEST_F(IslandResume, TrainAndLaunchShareOneCheckpointFormat) {
  // diloco.inner_steps beyond train.steps: a 1 x 1 launch's only outer step follows the last
  // step, so its 10 losses are the single-process run's.
  const std::vector<std::string> steps = {"--set", "train.steps=10", "--set", "diloco.inner_steps=100"};
  const std::vector<std::string> one = {"--islands", "1", "--workers-per-island", "1"};
  auto train_args = [&](const std::string& run) {
    std::vector<std::string> a = args(run, steps);
    a[0] = "train";
    a.push_back("--no-sample");
    return a;
  };
  auto launch_args = [&](const std::string& run) {
    std::vector<std::string> a = args(run, steps);
    a.insert(a.end(), one.begin(), one.end());
    return a;
  };
  const std::string trained = dir("train"), launched = dir("launch"), wide = dir("wide");
  RunResult r = run_atoll(train_args(trained), 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  r = run_atoll(launch_args(launched), 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  r = run_atoll(args(wide, {"--islands", "2", "--workers-per-island", "2", "--set", "train.steps=5", "--set",
                            "diloco.inner_steps=2"}), 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();

  // The same manifest layout: the same top-level keys, the shape, every worker's cursor, and the
  // single-process run's entries a subset of the multi-island run's, described alike.
  auto manifest = [](const std::string& run, const char* step) {
    return json::parse(read_file(run + "/checkpoints/" + step + "/manifest.json"));
  };
  const json mt = manifest(trained, "step-00000010"), ml = manifest(launched, "step-00000010"),
             mw = manifest(wide, "step-00000005");
  EXPECT_EQ(keys(mt), keys(mw));
  EXPECT_EQ(keys(mt), keys(ml));
  EXPECT_EQ(mt["format_version"], mw["format_version"]);
  EXPECT_EQ(mt["islands"], 1);
  EXPECT_EQ(mt["workers_per_island"], 1);
  EXPECT_EQ(mw["islands"], 2);
  EXPECT_EQ(mw["workers_per_island"], 2);
  EXPECT_EQ(mt["state"]["loaders"].size(), 1u);
  EXPECT_EQ(mw["state"]["loaders"].size(), 4u);
  EXPECT_TRUE(mw["tensors"].contains("island1_param/embed"));
  for (const auto& [name, entry] : mt["entries"].items()) {
    ASSERT_TRUE(mw["entries"].contains(name)) << name;
    for (const char* k : {"type", "owner", "division"}) EXPECT_EQ(entry[k], mw["entries"][name][k]) << name;
  }
  for (const std::string& key : keys(mt["state"])) EXPECT_TRUE(mw["state"].contains(key)) << key;
  EXPECT_EQ(keys(ml["entries"]), keys(mw["entries"]));

  const auto reference = losses(trained);
  ASSERT_EQ(reference.size(), 10u);
  EXPECT_EQ(losses(launched), reference);

  // Each command resumes the other's checkpoint of step 5 and logs the same losses, bit for bit.
  const std::string train_then_launch = dir("train-then-launch"), launch_then_train = dir("launch-then-train");
  cut_at(trained, train_then_launch, 5);
  auto v = launch_args(train_then_launch);
  v.push_back("--resume");
  r = run_atoll(v, 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(losses(train_then_launch), reference);
  cut_at(launched, launch_then_train, 5);
  v = train_args(launch_then_train);
  v.push_back("--resume");
  r = run_atoll(v, 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(losses(launch_then_train), reference);

  // Shapes that do not agree are refused, naming the fix.
  const auto before = snapshot(wide);
  v = {"train", "--resume", "--run-dir", wide, "--no-sample"};  // with the run's own config
  EXPECT_TRUE(fails_clearly(run_atoll(v), {"2 islands x 2 workers", "atoll launch --islands 2 --workers-per-island 2"}));
  EXPECT_TRUE(unchanged(before, snapshot(wide)));
}

// A checkpoint of N islands x M workers resumes as another shape, 2x2 -> 2x1 -> 1x2 -> 3x1: each
// resume runs on from the checkpoint's step, logs a `reshape` event saying what was kept and
// dropped, and its islands agree on θ after every outer step. Every worker writes its own part.
TEST_F(IslandResume, ResumesOnAnotherShape) {
  const std::string run = dir("run");
  struct Shape {
    int islands, workers;
    int64_t steps;
  };
  const std::vector<Shape> shapes = {{2, 2, 4}, {2, 1, 8}, {1, 2, 12}, {3, 1, 16}};
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Shape& sh = shapes[k];
    std::vector<std::string> extra = {"--islands", std::to_string(sh.islands), "--workers-per-island",
                                      std::to_string(sh.workers), "--set", "train.steps=" + std::to_string(sh.steps),
                                      "--set", "diloco.inner_steps=2"};
    if (k > 0) extra.push_back("--resume");
    const RunResult r = run_atoll(args(run, extra), 120);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const std::string latest = split_lines(read_file(run + "/checkpoints/latest")).at(0);
    char want[32];
    std::snprintf(want, sizeof want, "step-%08lld", static_cast<long long>(sh.steps));
    ASSERT_EQ(latest, want);
    const json m = json::parse(read_file(run + "/checkpoints/" + latest + "/manifest.json"));
    EXPECT_EQ(m["files"].size(), size_t(sh.islands * sh.workers)) << "every worker writes its own part";
    EXPECT_EQ(m["world_size"].get<int>(), sh.islands * sh.workers);
    const RunResult e = run_atoll({"eval", "--checkpoint", run});
    EXPECT_EQ(e.exit_code, 0) << e.describe();
    if (k == 0) continue;
    const Shape& before = shapes[k - 1];
    json reshape;
    for (const auto& ev : read_jsonl(run + "/events.jsonl"))
      if (ev["event"] == "reshape") reshape = ev;
    ASSERT_FALSE(reshape.is_null()) << "no reshape event after resuming as " << sh.islands << "x" << sh.workers;
    EXPECT_EQ(reshape["from"], std::to_string(before.islands) + "x" + std::to_string(before.workers));
    EXPECT_EQ(reshape["to"], std::to_string(sh.islands) + "x" + std::to_string(sh.workers));
    EXPECT_EQ(reshape["step"].get<int64_t>(), before.steps);
    EXPECT_EQ(reshape.contains("dropped"), sh.islands < before.islands);
    EXPECT_EQ(reshape.contains("joined"), sh.islands > before.islands);
    // Every step of this leg logged by every worker, and the islands' θ equal at each outer step.
    std::map<int64_t, std::set<std::string>> hashes;
    size_t rows = 0;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      if (row["step"].get<int64_t>() <= before.steps) continue;
      ++rows;
      if (row.contains("theta_hash")) hashes[row["outer_step"].get<int64_t>()].insert(row["theta_hash"].get<std::string>());
    }
    EXPECT_EQ(rows, size_t((sh.steps - before.steps) * sh.islands * sh.workers));
    ASSERT_FALSE(hashes.empty());
    for (const auto& [outer, h] : hashes) EXPECT_EQ(h.size(), 1u) << "outer step " << outer;
  }
}

}  // namespace
}  // namespace atl::testing
