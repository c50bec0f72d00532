// ZeRO-1 inside an island (optim.zero1, optim/zero_shard.h) in real `atoll launch` runs of one
// island of M workers over Gloo, against the same run unsharded:
//   M = 2: the same losses at every step and the same checkpoint (parameters and both
//          moments), bit for bit: the reduce-scatter adds two floats as the all-reduce does,
//          and the shard's step is the unsharded step's arithmetic; the gradient norm (summed
//          per shard, then over the island, in double) to 1e-12 relative;
//   M = 3: the three-way sum runs in another order (ring from rank r+1), so values differ by
//          rounding: losses within kLossBound after 6 steps (measured ~1e-6).
// The micro model's tensors do not divide by M (vocabulary 384 x 32 and 48-wide experts over
// 2 or 3 shards of whole tensors). A ZeRO-1 run resumed from its own checkpoint continues bit
// for bit, and its checkpoint resumes on another M (moments re-dealt to the new shards).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/config/config.h"
#include "atoll/model/layout.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

constexpr double kLossBound = 1e-4;  // |loss(ZeRO-1) - loss(unsharded)| at M = 3, any step of 6

class Zero1 : public CliTest {
 protected:
  RunResult launch(const std::string& run, int M, bool zero, const std::vector<std::string>& extra = {},
                   int N = 1) const {
    std::vector<std::string> a = {"launch", "--config", world().config(), "--run-dir", run, "--islands", std::to_string(N),
                                  "--workers-per-island", std::to_string(M), "--set",
                                  std::string("optim.zero1=") + (zero ? "true" : "false")};
    for (const char* kv : {"train.eval_every=0", "train.steps=6", "checkpoint.every=3", "checkpoint.keep=5",
                           "optim.schedule=constant", "optim.grad_clip=0.5"})
      a.insert(a.end(), {"--set", kv});
    a.insert(a.end(), extra.begin(), extra.end());
    return run_atoll(a, 180);
  }
  // (100 x island + rank, step) -> {loss, grad_norm}.
  using Rows = std::map<std::pair<int, int64_t>, std::pair<double, double>>;
  static Rows rows(const std::string& run) {
    Rows r;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
      r[{row.value("island", 0) * 100 + row["rank"].get<int>(), row["step"].get<int64_t>()}] = {row["loss"].get<double>(),
                                                                 row["grad_norm"].get<double>()};
    return r;
  }
  // The same run unsharded (plain) and with ZeRO-1 (zero), M workers: their rows, each M x 6.
  std::pair<Rows, Rows> both(const std::string& plain, const std::string& zero, int M,
                             const std::vector<std::string>& extra, int N = 1) const {
    const RunResult a = launch(plain, M, false, extra, N), b = launch(zero, M, true, extra, N);
    EXPECT_EQ(a.exit_code, 0) << a.describe();
    EXPECT_EQ(b.exit_code, 0) << b.describe();
    Rows ra = rows(plain), rb = rows(zero);
    EXPECT_EQ(ra.size(), size_t(6 * M * N));
    EXPECT_EQ(rb.size(), size_t(6 * M * N));
    return {ra, rb};
  }
  // A tensor kind of a checkpoint, whole, by the layout.
  std::vector<float> tensor(const std::string& dir, const std::string& kind, const std::vector<std::string>& sets) const {
    const Config cfg = load_config(world().config(), sets);
    const ParamLayout layout = ParamLayout::build(cfg.model);
    std::vector<float> b(layout.total(), 0.0f);
    load_checkpoint(dir, cfg.model, layout, {{kind, b.data()}});
    return b;
  }
  void expect_same_checkpoint(const std::string& a, const std::string& b, const std::vector<std::string>& sets = {}) const {
    for (const char* kind : {"param", "adam_m", "adam_v"}) {
      const std::vector<float> x = tensor(a, kind, sets), y = tensor(b, kind, sets);
      ASSERT_EQ(x.size(), y.size());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << kind << ": " << a << " vs " << b;
    }
  }
};

TEST_F(Zero1, TwoWorkersMatchTheUnshardedRunBitForBit) {
  base_run();  // the data prepared first
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--set", "optim.name=adamw"},
        std::vector<std::string>{"--set", "optim.name=muon", "--set", "model.router=zaya"}}) {
    const std::string tag = extra[1].substr(11);
    const std::string plain = dir("plain-" + tag), zero = dir("zero-" + tag);
    const auto [ra, rb] = both(plain, zero, 2, extra);
    ASSERT_FALSE(HasFailure());
    for (const auto& [key, v] : ra) {
      EXPECT_EQ(rb.at(key).first, v.first) << tag << " rank " << key.first << " step " << key.second;
      // The norm's squares are summed per shard, then over the island: another order in double.
      EXPECT_NEAR(rb.at(key).second, v.second, 1e-12 * v.second) << tag << " grad_norm, rank " << key.first;
    }
    std::vector<std::string> sets;
    for (size_t i = 1; i < extra.size(); i += 2) sets.push_back(extra[i]);
    expect_same_checkpoint(plain + "/checkpoints/step-00000003", zero + "/checkpoints/step-00000003", sets);
    expect_same_checkpoint(plain + "/checkpoints/step-00000006", zero + "/checkpoints/step-00000006", sets);
  }
}

// Two islands of two, through the data-parallel warm start (each rank averages its shard across
// islands) and the outer steps, with each expert's Δ weighted by its islands' tokens
// (diloco.expert_merge: each rank's counts, summed over the island): still the unsharded run,
// losses and θ bit for bit.
TEST_F(Zero1, TwoIslandsWithAWarmStartMatchTheUnshardedRun) {
  base_run();
  const std::vector<std::string> extra = {"--set", "diloco.dp_warmup_steps=2", "--set", "diloco.inner_steps=2",
                                          "--set", "diloco.expert_merge=tokens"};
  const auto [ra, rb] = both(dir("plain"), dir("zero"), 2, extra, 2);
  ASSERT_FALSE(HasFailure());
  for (const auto& [key, v] : ra) EXPECT_EQ(rb.at(key).first, v.first) << "worker " << key.first << " step " << key.second;
  expect_same_checkpoint(dir("plain") + "/checkpoints/step-00000006", dir("zero") + "/checkpoints/step-00000006");
}

TEST_F(Zero1, ThreeWorkersMatchTheUnshardedRunToRounding) {
  base_run();
  const std::vector<std::string> extra = {"--set", "optim.name=muon", "--set", "model.router=zaya"};
  const std::string plain = dir("plain"), zero = dir("zero");
  const auto [ra, rb] = both(plain, zero, 3, extra);
  ASSERT_FALSE(HasFailure());
  for (const auto& [key, v] : ra)
    EXPECT_LE(std::fabs(rb.at(key).first - v.first), kLossBound) << "rank " << key.first << " step " << key.second;
}

TEST_F(Zero1, ResumesBitForBitAndOnAnotherM) {
  base_run();
  const std::string full = dir("full"), cut = dir("cut");
  ASSERT_EQ(launch(full, 2, true).exit_code, 0);
  // The full run as it stood at its checkpoint of step 3 (a run of 3 steps would differ: its
  // last step is an outer step).
  fs::copy(full, cut, fs::copy_options::recursive);
  fs::remove_all(cut + "/checkpoints/step-00000006");
  std::ofstream(cut + "/checkpoints/latest") << "step-00000003\n";
  const std::string saved = dir("saved");
  fs::copy(cut, saved, fs::copy_options::recursive);  // the ZeRO-1 checkpoint of step 3, for the other shapes
  const RunResult resumed = launch(cut, 2, true, {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.describe();
  const auto ra = rows(full), rb = rows(cut);
  ASSERT_EQ(rb.size(), ra.size());
  for (const auto& [key, v] : ra) EXPECT_EQ(rb.at(key).first, v.first) << "rank " << key.first << " step " << key.second;
  expect_same_checkpoint(full + "/checkpoints/step-00000006", cut + "/checkpoints/step-00000006");

  // On M = 3 (shards of thirds) and M = 1 (unsharded): the same state resumes, and ZeRO-1 on 3
  // workers continues as the unsharded 3 do, to rounding.
  std::map<std::string, Rows> after;
  for (const auto& [name, M, zero] : {std::tuple{"m3zero", 3, true}, {"m3plain", 3, false}, {"m1", 1, true}}) {
    const std::string run = dir(name);
    fs::copy(saved, run, fs::copy_options::recursive);
    const RunResult r = launch(run, M, zero, {"--resume"});
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.describe();
    after[name] = rows(run);
  }
  for (const auto& [key, v] : after["m3plain"]) {
    if (key.second <= 3) continue;
    EXPECT_LE(std::fabs(after["m3zero"].at(key).first - v.first), kLossBound) << "rank " << key.first << " step " << key.second;
  }
  EXPECT_TRUE(after["m1"].count({0, 6}));
}

}  // namespace
}  // namespace atl::testing
