// kill -9 across the save path (ckpt/checkpoint.h commit order): a 2-island x 2-worker run that
// saves every 2 steps dies as a whole (ATOLL_FAULT=crash: the worker SIGKILLs the launcher,
// every worker dies with it, then itself) at seeded points: a part half written on the
// background writer while training goes on (tensor), a part durable but not handed on (part),
// the manifest written but not renamed (manifest), renamed but `latest` not moved (rename), and
// `latest` moved (latest), in the 1st to 4th save, on any worker; and in the copy of the saved
// tensors into staging (copy), which runs on the background writer while the next step computes. Every time `latest` (when one
// was committed) loads, names a committed step (the newest the commit order allows), and
// `--resume` continues to the same losses and θ hashes as the uninterrupted run, bit for bit,
// leaving no temporary directory behind. bench/ckpt_crash_loop.sh runs hundreds of points.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;
using Rows = std::map<std::tuple<int, int, int64_t>, std::pair<double, std::string>>;

constexpr int kSaves = 4;  // steps 2, 4, 6, 8

struct Point {
  std::string where;
  int save = 1, island = 0, rank = 0;
  std::string spec() const {
    return "crash:island=" + std::to_string(island) + ":rank=" + std::to_string(rank) + ":ckpt=" + where +
           ":save=" + std::to_string(save);
  }
};

// `count` points drawn from `seed`: the committer's points on island 0 rank 0, the parts' on any worker.
std::vector<Point> seeded_points(unsigned seed, int count) {
  const char* const wheres[] = {"tensor", "part", "manifest", "rename", "latest"};
  std::mt19937 rng(seed);
  std::vector<Point> points;
  for (int i = 0; i < count; ++i) {
    Point p{.where = wheres[rng() % 5], .save = int(1 + rng() % kSaves)};
    if (p.where == "tensor" || p.where == "part") p.island = int(rng() % 2), p.rank = int(rng() % 2);
    points.push_back(p);
  }
  return points;
}

class CheckpointCrash : public CliTest {
 protected:
  std::vector<std::string> args(const std::string& run, bool resume) const {
    std::vector<std::string> a = {"launch", "--islands", "2", "--workers-per-island", "2", "--config",
                                  world().config(), "--run-dir", run};
    for (const char* kv : {"train.steps=8", "train.eval_every=0", "checkpoint.every=2", "checkpoint.keep=2",
                           "diloco.inner_steps=2", "optim.warmup_steps=2", "fault.max_restarts=0"})
      a.insert(a.end(), {"--set", kv});
    if (resume) a.push_back("--resume");
    return a;
  }
  static Rows rows(const std::string& run) {
    Rows r;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      const auto key = std::make_tuple(row["island"].get<int>(), row["rank"].get<int>(), row["step"].get<int64_t>());
      EXPECT_FALSE(r.count(key)) << "step " << std::get<2>(key) << " logged twice in " << run;
      r[key] = {row["loss"].get<double>(), row.value("theta_hash", "")};
    }
    return r;
  }
  const Rows& reference() {
    static Rows ref;
    if (ref.empty()) {
      const std::string run = world().path("crash-reference");
      const RunResult r = run_atoll(args(run, false), 120);
      if (r.exit_code != 0) throw std::runtime_error("the uninterrupted run failed: " + r.describe());
      ref = rows(run);
    }
    return ref;
  }

  void crash_and_resume(const Point& p, int trial) {
    SCOPED_TRACE(p.spec());
    const Rows& ref = reference();
    ASSERT_EQ(ref.size(), 32u);
    const std::string run = dir("run-" + std::to_string(trial));
    child_env().push_back("ATOLL_FAULT=" + p.spec());
    const RunResult crashed = run_atoll(args(run, false), 120);
    child_env().pop_back();
    ASSERT_EQ(crashed.exit_code, -1) << "the fault did not kill the run: " << crashed.describe();
    const std::string latest_file = run + "/checkpoints/latest";
    int64_t latest = -1;
    if (fs::exists(latest_file)) {
      const std::string name = split_lines(read_file(latest_file)).at(0);
      latest = std::stoll(name.substr(5));
      const RunResult e = run_atoll({"eval", "--checkpoint", run + "/checkpoints/" + name});
      ASSERT_EQ(e.exit_code, 0) << "latest does not load: " << e.describe();
      const json m = json::parse(read_file(run + "/checkpoints/" + name + "/manifest.json"));
      EXPECT_EQ(m["step"].get<int64_t>(), latest);
      EXPECT_EQ(m["files"].size(), 4u);
    }
    // The newest step the commit order allows: a committer's crash is exact; a part's may come
    // before the committer finished the previous save's commit.
    auto named = [](int64_t step) { return step > 0 ? step : int64_t(-1); };  // step 0: no checkpoint yet
    const int64_t done = 2 * (p.save - 1), committed = p.where == "latest" ? 2 * p.save : done;
    if (p.where == "copy" || p.where == "tensor" || p.where == "part") {
      EXPECT_TRUE(latest == named(done) || latest == named(done - 2)) << "latest step " << latest;
    } else {
      EXPECT_EQ(latest, named(committed));
    }
    const RunResult resumed = run_atoll(args(run, true), 120);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.describe();
    const Rows got = rows(run);
    ASSERT_EQ(got.size(), ref.size());
    for (const auto& [key, v] : ref) {
      ASSERT_TRUE(got.count(key));
      EXPECT_EQ(got.at(key).first, v.first) << "island " << std::get<0>(key) << " rank " << std::get<1>(key)
                                            << " step " << std::get<2>(key);
      EXPECT_EQ(got.at(key).second, v.second) << "step " << std::get<2>(key);
    }
    for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path() << " left behind";
  }

  void run_points(unsigned seed) {
    int trial = 0;
    for (const Point& p : seeded_points(seed, 5)) crash_and_resume(p, trial++);
  }
};

// 4 x 5 = 20 seeded points, in 4 tests so each stays short.
TEST_F(CheckpointCrash, SeededPointsA) { run_points(1); }
TEST_F(CheckpointCrash, SeededPointsB) { run_points(2); }
TEST_F(CheckpointCrash, SeededPointsC) { run_points(3); }
TEST_F(CheckpointCrash, SeededPointsD) { run_points(4); }

// kill -9 while the background copy of the saved tensors runs (one tensor copied, the next step
// going on): the previous checkpoint stays `latest`, and the run resumes from it bit-identically.
TEST_F(CheckpointCrash, DuringTheOverlappedCopy) {
  int trial = 0;
  for (const Point& p : {Point{.where = "copy", .save = 1, .island = 0, .rank = 0},
                         Point{.where = "copy", .save = 2, .island = 1, .rank = 1},
                         Point{.where = "copy", .save = 4, .island = 0, .rank = 1}})
    crash_and_resume(p, trial++);
}

}  // namespace
}  // namespace atl::testing
