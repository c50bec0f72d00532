// The process-level resume check: `atoll train` killed with SIGKILL right after its first
// checkpoint appears, then `atoll train --resume`, logs the same per-step losses as an
// uninterrupted run (bit for bit: the JSON numbers round-trip doubles).
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

class KillAndResume : public CliTest {
 protected:
  // 15 steps, a checkpoint every 5. The model is a little larger than the micro one so that a
  // step takes ~20 ms: the killer reacts to checkpoints/latest through inotify long before the
  // run could finish.
  std::vector<std::string> args(const std::string& run) const {
    std::vector<std::string> a = {"train", "--config", world().config(), "--run-dir", run, "--no-sample"};
    for (const char* kv : {"train.steps=15", "checkpoint.every=5", "train.eval_every=4", "model.dim=64",
                           "model.expert_hidden=128", "model.seq_len=128", "train.batch_size=8"})
      a.insert(a.end(), {"--set", kv});
    return a;
  }
  static std::map<int64_t, json> by_step(const std::string& run) {
    std::map<int64_t, json> rows;
    for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
      const int64_t step = row.at("step").get<int64_t>();
      EXPECT_FALSE(rows.count(step)) << "step " << step << " logged twice in " << run;
      rows[step] = row;
    }
    return rows;
  }
};

TEST_F(KillAndResume, ResumedRunLogsTheSameLosses) {
  base_run();  // prepares the data, so both runs start the same way
  const std::string full = dir("full"), killed = dir("killed");
  const RunResult a = run_atoll(args(full));
  ASSERT_EQ(a.exit_code, 0) << a.describe();

  {
    Background b(args(killed), dir("killed-log"));
    const bool appeared = wait_for_file(killed + "/checkpoints", "latest", 60.0, [&] { return b.running(); });
    const int status = b.kill9();
    ASSERT_TRUE(appeared) << "no checkpoint appeared; stderr:\n" << read_file(dir("killed-log.err"));
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the run ended before it was killed (status " << status << "); make its steps slower";
  }
  // Killed mid-run: no end event, a complete checkpoint to resume from.
  const std::string latest = split_lines(read_file(killed + "/checkpoints/latest")).at(0);
  const int64_t ck_step = std::stoll(latest.substr(5));
  ASSERT_GE(ck_step, 5);
  ASSERT_LT(ck_step, 15) << "the run reached its last checkpoint before the kill";
  for (const auto& e : read_jsonl(killed + "/events.jsonl")) EXPECT_NE(e["event"], "end");
  RecordProperty("killed_after_checkpoint", static_cast<int>(ck_step));
  RecordProperty("steps_logged_when_killed", static_cast<int>(read_jsonl(killed + "/metrics.jsonl").size()));

  const RunResult resumed = run_atoll([&] {
    auto v = args(killed);
    v.push_back("--resume");
    return v;
  }());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.describe();

  bool saw_resume = false;
  for (const auto& e : read_jsonl(killed + "/events.jsonl")) {
    if (e["event"] == "resume") {
      saw_resume = true;
      EXPECT_EQ(e["step"].get<int64_t>(), ck_step);
    }
  }
  EXPECT_TRUE(saw_resume);

  const auto ra = by_step(full), rb = by_step(killed);
  ASSERT_EQ(ra.size(), 15u);
  ASSERT_EQ(rb.size(), 15u);
  for (int64_t s = 1; s <= 15; ++s) {
    ASSERT_TRUE(ra.count(s) && rb.count(s)) << "step " << s;
    EXPECT_EQ(ra.at(s)["loss"].get<double>(), rb.at(s)["loss"].get<double>()) << "step " << s;
    EXPECT_EQ(ra.at(s)["tokens"], rb.at(s)["tokens"]) << "step " << s;
    EXPECT_EQ(ra.at(s)["lr"].get<double>(), rb.at(s)["lr"].get<double>()) << "step " << s;
    EXPECT_EQ(ra.at(s).contains("val_loss"), rb.at(s).contains("val_loss")) << "step " << s;
    if (s > ck_step && ra.at(s).contains("val_loss")) {
      EXPECT_EQ(ra.at(s)["val_loss"].get<double>(), rb.at(s)["val_loss"].get<double>()) << "step " << s;
    }
  }
  // The final checkpoints hold the same parameters.
  const std::string fa = full + "/checkpoints/step-00000015/manifest.json";
  const std::string fb = killed + "/checkpoints/step-00000015/manifest.json";
  const json ma = json::parse(read_file(fa)), mb = json::parse(read_file(fb));
  for (const auto& [name, meta] : ma["tensors"].items()) EXPECT_EQ(meta["xxh3"], mb["tensors"][name]["xxh3"]) << name;
  // A single-process run's checkpoint is a run of 1 island x 1 worker (ckpt/checkpoint.h).
  EXPECT_EQ(mb["islands"], 1);
  EXPECT_EQ(mb["workers_per_island"], 1);
  EXPECT_EQ(mb["state"]["loaders"].size(), 1u);
}

}  // namespace
}  // namespace atl::testing
