// train.context_parallel = P in real runs (docs/long_context.md): `atoll launch` islands of M
// workers as D = M/P groups of P ranks that split each sequence (ring attention, zigzag rows).
//   - P = 2 on one island logs the losses of `atoll train` (P = 1) on the same config within
//     1e-5 relative for 20 steps, and the same validation loss (step 10): T = 29 (not divisible by
//     2P), GQA (2 query heads on 1 key/value head), MoE with the balancing and z losses. Both
//     ranks of the group log the group's loss (the same bits).
//   - Its checkpoint (whole tensors) resumes at P = 1 on one worker and continues with the
//     same losses; `atoll train`'s resumes as a 2-way group likewise.
//   - With data.phases doubling the length mid-run (context extension), the same.
//   - Two DiLoCo islands of a 2-way group each: the θ hashes agree across islands at every
//     outer step, and the losses are those of two islands of one worker (P = 1) within 1e-5.
//   - zaya1-tiny's kinds (CCA attention, the zaya router, residual scaling, tied embeddings) at
//     P = 2: the CCA boundary exchange in a real run logs `atoll train`'s losses too.
//   - The benchmarks' switches (ATOLL_RING_OVERLAP=0, ATOLL_RING_SYNC=1) leave the losses bit-equal.
//   - Bad placements are refused before any worker starts, naming the key and the fix.
// The tolerance: P = 2 adds the same terms in other orders (attention's log-sum-exp merge, the
// gradients' sum over the group), float rounding compounding over 20 AdamW steps (measured
// below 1e-6 here).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/scoped_child_env.h"

namespace atl::testing {
namespace {

constexpr double kRelative = 1e-5;
constexpr double kGradNormRelative = 1e-3;

class ContextParallel : public CliTest {
 protected:
  static std::vector<std::string> sets(int steps) {
    std::vector<std::string> a;
    for (const std::string& kv : {"train.steps=" + std::to_string(steps), std::string("train.eval_every=10"),
                                 std::string("checkpoint.every=10"), std::string("checkpoint.keep=5"),
                                 std::string("model.seq_len=29"), std::string("model.z_loss_coef=0.01"),
                                 std::string("train.peak_gflops=1000")})
      a.insert(a.end(), {"--set", kv});
    return a;
  }
  RunResult launch(const std::string& run, int N, int M, int P, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {"launch", "--config", world().config(), "--run-dir", run, "--islands",
                                  std::to_string(N), "--workers-per-island", std::to_string(M), "--set",
                                  "train.context_parallel=" + std::to_string(P)};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_atoll(a, 300);
  }
  // (100 x island + rank, step) -> the row.
  static std::map<std::pair<int, int64_t>, nlohmann::json> rows(const std::string& run) {
    std::map<std::pair<int, int64_t>, nlohmann::json> r;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
      if (row.contains("loss")) r[{row.value("island", 0) * 100 + row.value("rank", 0), row["step"].get<int64_t>()}] = row;
    return r;
  }
  static double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }
};

TEST_F(ContextParallel, TwoRanksLogTheLossesOfOneProcessAndResumeEitherWay) {
  base_run();  // the data prepared once
  const std::string one = dir("one"), cp2 = dir("cp2");
  const RunResult a = world().train(one, sets(20));
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  const RunResult b = launch(cp2, 1, 2, 2, sets(20));
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  const auto ra = rows(one), rb = rows(cp2);
  int compared = 0, validated = 0;
  for (int64_t step = 1; step <= 20; ++step) {
    const nlohmann::json &x = ra.at({0, step}), &y = rb.at({0, step}), &y1 = rb.at({1, step});
    EXPECT_LE(rel(y["loss"], x["loss"]), kRelative) << "step " << step << ": " << y["loss"] << " vs " << x["loss"];
    EXPECT_LE(rel(y["aux_loss"], x["aux_loss"]), kRelative) << "aux_loss, step " << step;
    // The gradient's scale too (AdamW's step would hide a wrong one): the group's, averaged
    // over the island, is one worker's. Looser than the loss: AdamW moves entries whose
    // gradient is near 0 by up to lr whatever its rounding, and the norm sums entries with
    // cancellation (measured up to 1.3e-4 by step 20); a wrong scale would be off by P.
    EXPECT_LE(rel(y["grad_norm"], x["grad_norm"]), kGradNormRelative) << "grad_norm, step " << step;
    EXPECT_EQ(y1["loss"], y["loss"]) << "rank 1 logs its group's loss, step " << step;
    // MFU per device: mfu / tokens_per_s is flops_per_token / (devices x peak), and the group's
    // tokens are computed on 2 devices.
    const double per_token_one = x["mfu"].get<double>() / x["tokens_per_s"].get<double>(),
                 per_token_cp2 = y["mfu"].get<double>() / y["tokens_per_s"].get<double>();
    EXPECT_NEAR(per_token_cp2 / per_token_one, 0.5, 1e-3) << "mfu, step " << step;
    ++compared;
    // A launched run's last step is also an outer step (one island's: θ moves by the outer
    // optimizer), which comes before that step's validation: compared where none came.
    if (!x.contains("val_loss") || !y.contains("val_loss") || y.contains("theta_hash")) continue;
    EXPECT_LE(rel(y["val_loss"], x["val_loss"]), kRelative) << "val_loss, step " << step;
    ++validated;
  }
  EXPECT_EQ(compared, 20);
  EXPECT_EQ(validated, 1);  // step 10

  // The P = 2 checkpoint of step 10 resumes on one worker (P = 1) with the same losses.
  const std::string resumed = dir("resumed");
  fs::copy(cp2, resumed, fs::copy_options::recursive);
  fs::remove_all(resumed + "/checkpoints/step-00000020");
  std::ofstream(resumed + "/checkpoints/latest") << "step-00000010\n";
  std::vector<std::string> resume_args = sets(20);
  resume_args.push_back("--resume");
  const RunResult c = launch(resumed, 1, 1, 1, resume_args);
  ASSERT_EQ(c.exit_code, 0) << c.describe();
  const auto rc = rows(resumed);
  for (int64_t step = 11; step <= 20; ++step)
    EXPECT_LE(rel(rc.at({0, step})["loss"], rb.at({0, step})["loss"]), kRelative) << "resumed at P = 1, step " << step;

  // And back: `atoll train`'s checkpoint of step 10 resumes as a 2-way group.
  const std::string back = dir("back");
  fs::copy(one, back, fs::copy_options::recursive);
  fs::remove_all(back + "/checkpoints/step-00000020");
  std::ofstream(back + "/checkpoints/latest") << "step-00000010\n";
  const RunResult d = launch(back, 1, 2, 2, resume_args);
  ASSERT_EQ(d.exit_code, 0) << d.describe();
  const auto rd = rows(back);
  for (int64_t step = 11; step <= 20; ++step)
    EXPECT_LE(rel(rd.at({0, step})["loss"], ra.at({0, step})["loss"]), kRelative) << "resumed at P = 2, step " << step;
}

// Context extension on top (data.phases): after 4 steps at T = 29 the phase doubles the length
// and raises RoPE's base; the group re-cuts its zigzag rows and still logs `atoll train`'s losses.
TEST_F(ContextParallel, APhaseThatDoublesTheLengthReCutsTheRows) {
  base_run();
  const std::string mix = "mix = [{dir = \"" + world().data_dir() + "\"}]";
  const std::vector<std::string> phases = {
      "--set", "data.input=[]", "--set", "data.dir=\"\"", "--set", "train.steps=8", "--set", "train.eval_every=0",
      "--set", "model.seq_len=29", "--set",
      "data.phases=[{at_tokens = 0, " + mix + "}, {at_tokens = " + std::to_string(4 * 4 * 29) + ", " + mix +
          ", model.seq_len = 58, model.rope_theta = 40000.0}]"};
  const std::string one = dir("one"), cp2 = dir("cp2");
  const RunResult a = world().train(one, phases);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  const RunResult b = launch(cp2, 1, 2, 2, phases);
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  const auto ra = rows(one), rb = rows(cp2);
  for (int64_t step = 1; step <= 8; ++step) {
    EXPECT_EQ(rb.at({0, step})["seq_len"], step <= 4 ? 29 : 58) << "step " << step;
    EXPECT_LE(rel(rb.at({0, step})["loss"], ra.at({0, step})["loss"]), kRelative) << "step " << step;
  }
}

TEST_F(ContextParallel, TwoIslandsOfTwoWayGroupsAgreeOnTheta) {
  base_run();
  const std::vector<std::string> extra = {"--set", "train.steps=6", "--set", "diloco.inner_steps=3", "--set",
                                          "train.eval_every=0", "--set", "model.seq_len=29"};
  const std::string cp2 = dir("cp2"), one = dir("one");
  const RunResult a = launch(cp2, 2, 2, 2, extra), b = launch(one, 2, 1, 1, extra);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  const auto ra = rows(cp2), rb = rows(one);
  int hashes = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    for (int island : {0, 1}) {
      const nlohmann::json& y = ra.at({100 * island, step});
      EXPECT_LE(rel(y["loss"], rb.at({100 * island, step})["loss"]), kRelative) << "island " << island << " step " << step;
    }
    if (ra.at({0, step}).contains("theta_hash")) {
      ++hashes;
      for (int w : {1, 100, 101}) EXPECT_EQ(ra.at({w, step})["theta_hash"], ra.at({0, step})["theta_hash"]) << step;
    }
  }
  EXPECT_EQ(hashes, 2);  // after steps 3 and 6
}

// CCA reads 2 tokens back at its default kernels (cca_time0 = cca_time1 = 2) and its value shift
// 1: chunks of T = 29 over 2P = 4 hold 7 or 8 tokens, so each rank's convolutions take their
// boundary rows from the other rank (and rank 1's second chunk from its own first).
TEST_F(ContextParallel, ZayaKindsWithCcaLogTheLossesOfOneProcess) {
  base_run();
  std::vector<std::string> zaya;
  for (const std::string kv : {"model.attention=\"cca\"", "model.router=\"zaya\"", "model.router_hidden_size=8",
                               "model.top_k=1", "model.residual_scaling=true", "model.tie_embeddings=true",
                               "model.seq_len=29", "train.steps=6", "train.eval_every=0"})
    zaya.insert(zaya.end(), {"--set", kv});
  const std::string one = dir("one"), cp2 = dir("cp2");
  const RunResult a = world().train(one, zaya);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  const RunResult b = launch(cp2, 1, 2, 2, zaya);
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  EXPECT_NE(read_file(cp2 + "/config.toml").find("attention = \"cca\""), std::string::npos);
  const auto ra = rows(one), rb = rows(cp2);
  for (int64_t step = 1; step <= 6; ++step) {
    EXPECT_LE(rel(rb.at({0, step})["loss"], ra.at({0, step})["loss"]), kRelative)
        << "step " << step << ": " << rb.at({0, step})["loss"] << " vs " << ra.at({0, step})["loss"];
    EXPECT_EQ(rb.at({1, step})["loss"], rb.at({0, step})["loss"]) << "step " << step;
  }
}

// The benchmarks' switches move only the waits: each transfer waited for before computing
// (ATOLL_RING_OVERLAP=0) and every transfer preceded by a meeting of the neighbours
// (ATOLL_RING_SYNC=1, its time logged as ring_sync_s) log the same losses to the bit.
TEST_F(ContextParallel, TheBenchSwitchesMoveTheWaitsNotTheLosses) {
  base_run();
  const std::vector<std::string> five = {"--set", "train.steps=5", "--set", "train.eval_every=0", "--set",
                                         "checkpoint.every=0", "--set", "model.seq_len=29"};
  const RunResult a = launch(dir("overlapped"), 1, 2, 2, five);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  RunResult b;
  {
    ScopedChildEnv bench({"ATOLL_RING_OVERLAP=0", "ATOLL_RING_SYNC=1"});
    b = launch(dir("synced"), 1, 2, 2, five);
  }
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  const auto ra = rows(dir("overlapped")), rb = rows(dir("synced"));
  for (int rank = 0; rank < 2; ++rank)
    for (int64_t step = 1; step <= 5; ++step) {
      const nlohmann::json &x = ra.at({rank, step}), &y = rb.at({rank, step});
      EXPECT_EQ(y["loss"], x["loss"]) << "rank " << rank << ", step " << step;
      EXPECT_FALSE(x.contains("ring_sync_s")) << "no meeting without the switch";
      ASSERT_TRUE(y.contains("ring_sync_s")) << y.dump();
      EXPECT_GT(y["ring_sync_s"].get<double>(), 0.0);
      EXPECT_GT(y["ring_compute_s"].get<double>(), 0.0);
    }
}

TEST_F(ContextParallel, BadPlacementsAreRefusedBeforeAnyWorkerStarts) {
  base_run();
  const RunResult odd = launch(dir("odd"), 1, 3, 2, {"--set", "train.steps=1"});
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_NE(odd.err.find("train.context_parallel = 2 must divide --workers-per-island (3)"), std::string::npos)
      << odd.err;
  const RunResult single = world().train(dir("single"), {"--set", "train.context_parallel=2"});
  EXPECT_NE(single.exit_code, 0);
  EXPECT_NE(single.err.find("atoll launch"), std::string::npos) << single.err;
  // CCA's chunks must hold its window (cca_time0-1 + cca_time1-1 = 4 here): ⌊13/4⌋ = 3 do not.
  const RunResult cca = launch(dir("cca"), 1, 2, 2,
                               {"--set", "model.attention=\"cca\"", "--set", "model.cca_time0=3", "--set",
                                "model.cca_time1=3", "--set", "model.seq_len=13"});
  EXPECT_NE(cca.exit_code, 0);
  EXPECT_NE(cca.err.find("chunks of 3 tokens, fewer than the 4 tokens"), std::string::npos) << cca.err;
  EXPECT_FALSE(fs::exists(dir("cca") + "/metrics.jsonl")) << "refused before any worker wrote";
  // The benchmarks' plain split (contiguous chunks) has no CCA boundary exchange: refused with CCA,
  // and a layout that is not one is refused too, each before any worker writes.
  const std::vector<std::string> cca_ok = {"--set", "model.attention=\"cca\"", "--set", "train.steps=1"};
  {
    ScopedChildEnv plain({"ATOLL_CP_LAYOUT=plain"});
    const RunResult r = launch(dir("plain_cca"), 1, 2, 2, cca_ok);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("under ATOLL_CP_LAYOUT=plain: the plain split is for benchmarks of GQA only"),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(dir("plain_cca") + "/metrics.jsonl")) << "refused before any worker wrote";
  }
  {
    ScopedChildEnv bogus({"ATOLL_CP_LAYOUT=diagonal"});
    const RunResult r = launch(dir("bogus_layout"), 1, 2, 2, {"--set", "train.steps=1"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("ATOLL_CP_LAYOUT = \"diagonal\" is not a layout of context parallelism"), std::string::npos)
        << r.err;
  }
}

}  // namespace
}  // namespace atl::testing
