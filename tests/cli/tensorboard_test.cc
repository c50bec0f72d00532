// The TensorBoard files of real runs read back by an independent reader
// (tests/scripts/read_tfevents.py: its own CRC-32C and protobuf decoding) equal metrics.jsonl:
// every numeric field of every row, at the row's step, to float32 rounding. A single-process
// run logs plain tags ("loss"); a 2-island launch logs each island's rows under "island<I>/".
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class TensorboardTest : public CliTest {
 protected:
  // The reader's {"files", "file_version", "scalars": {tag: {step: value}}} for a run folder.
  static nlohmann::json read_back(const std::string& run) {
    const char* src = std::getenv("ATOLL_SOURCE_DIR");
    const std::string script = std::string(src ? src : ".") + "/tests/scripts/read_tfevents.py";
    std::string out;
    FILE* p = ::popen(("python3 " + script + " " + run).c_str(), "r");
    if (p == nullptr) throw std::runtime_error("cannot run python3");
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = ::pclose(p);
    if (rc != 0) throw std::runtime_error("read_tfevents.py failed: " + out);
    return nlohmann::json::parse(out);
  }
  // Every numeric top-level field of every row is the scalar prefix(row) + field at its step.
  static void expect_rows_match(const std::string& run, bool per_island) {
    const nlohmann::json tb = read_back(run);
    EXPECT_GE(tb["files"].get<int>(), 1);
    EXPECT_EQ(tb["file_version"], "brain.Event:2");
    const auto rows = read_jsonl(run + "/metrics.jsonl");
    ASSERT_FALSE(rows.empty());
    int checked = 0;
    for (const auto& row : rows) {
      if (!row.contains("step")) continue;
      std::string prefix;
      if (per_island) {
        ASSERT_TRUE(row.contains("island")) << row.dump();
        prefix = "island" + std::to_string(row["island"].get<int>()) + "/";
      }
      const std::string step = std::to_string(row["step"].get<int64_t>());
      for (const auto& [key, v] : row.items()) {
        if (key == "step" || key == "island" || key == "rank" || !v.is_number()) continue;
        const std::string tag = prefix + key;
        ASSERT_TRUE(tb["scalars"].contains(tag) && tb["scalars"][tag].contains(step)) << tag << " at step " << step;
        const double want = double(v.get<float>()), got = tb["scalars"][tag][step].get<double>();
        EXPECT_EQ(got, want) << tag << " at step " << step;  // both are the float32 of the row's value
        ++checked;
      }
      if (row.contains("val_loss")) {
        EXPECT_TRUE(tb["scalars"].contains(prefix + "val_loss"));
      }
    }
    EXPECT_GT(checked, 10);
  }
};

TEST_F(TensorboardTest, SingleRunReadsBackEqualToMetrics) {
  expect_rows_match(base_run(), /*per_island=*/false);
  // The load lists become one curve per layer.
  const nlohmann::json tb = read_back(base_run());
  if (read_jsonl(base_run() + "/metrics.jsonl").front().contains("load_entropy")) {
    EXPECT_TRUE(tb["scalars"].contains("load_entropy/layer0")) << tb["scalars"].dump().substr(0, 500);
  }
}

TEST_F(TensorboardTest, EveryIslandHasItsOwnTags) {
  const std::string run = dir("run");
  const RunResult r = run_atoll({"launch", "--config", world().config(), "--run-dir", run, "--islands", "2", "--set",
                                 "train.steps=6", "--set", "diloco.inner_steps=2", "--set", "checkpoint.every=0"},
                                120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  expect_rows_match(run, /*per_island=*/true);
  const nlohmann::json tb = read_back(run);
  EXPECT_TRUE(tb["scalars"].contains("island0/loss"));
  EXPECT_TRUE(tb["scalars"].contains("island1/loss"));
}

}  // namespace
}  // namespace atl::testing
