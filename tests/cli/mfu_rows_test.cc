// `mfu` in metrics.jsonl rows (train.peak_gflops; docs/report.md "MFU in the rows"): the FLOP
// count is `atoll bench`'s flops_per_token, so each row's mfu equals flops_per_token x
// tokens_per_s / (workers x peak); absent by default. A launched run's rows count every worker's
// device, and its launch event and summary.txt carry the parameter count the report shows.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using json = nlohmann::json;

class MfuRowsTest : public CliTest {
 protected:
  // flops_per_token of the micro model, as `atoll bench` reports it (its last line is JSON).
  static double flops_per_token() {
    const RunResult b = run_atoll({"bench", "--config", world().config(), "--steps", "1", "--warmup", "0",
                                   "--peak-gflops", "1"});
    EXPECT_EQ(b.exit_code, 0) << b.describe();
    std::string out = b.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const std::string last = out.substr(out.rfind('\n') + 1);
    return json::parse(last)["flops_per_token"].get<double>();
  }
  // Every row's mfu against `workers` devices of `peak` GFLOP/s; returns the rows checked.
  static int check_rows(const std::string& run, int workers, double peak, double fpt) {
    int n = 0;
    for (const json& row : read_jsonl(run + "/metrics.jsonl")) {
      if (!row.contains("tokens_per_s")) continue;
      EXPECT_TRUE(row.contains("mfu")) << row.dump();
      if (!row.contains("mfu")) continue;
      const double want = fpt * row["tokens_per_s"].get<double>() * 1e-9 / (workers * peak);
      EXPECT_NEAR(row["mfu"].get<double>(), want, 1e-12 * want) << row.dump();
      ++n;
    }
    return n;
  }
};

TEST_F(MfuRowsTest, RowsCarryMfuAgainstTheGivenPeak) {
  const double fpt = flops_per_token();
  ASSERT_GT(fpt, 0);
  const std::string run = dir("run");
  const RunResult t = world().train(run, {"--set", "train.peak_gflops=50"});
  ASSERT_EQ(t.exit_code, 0) << t.describe();
  EXPECT_EQ(check_rows(run, 1, 50, fpt), 4);
  for (const json& row : read_jsonl(base_run() + "/metrics.jsonl"))
    EXPECT_FALSE(row.contains("mfu")) << "mfu without train.peak_gflops: " << row.dump();
}

TEST_F(MfuRowsTest, LaunchedRunCountsEveryWorkerAndNamesItsParameters) {
  const double fpt = flops_per_token();
  const std::string run = dir("run");
  const RunResult r = run_atoll({"launch", "--islands", "2", "--config", world().config(), "--run-dir", run, "--set",
                                 "train.steps=2", "--set", "diloco.inner_steps=2", "--set", "train.peak_gflops=50"},
                               120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_GE(check_rows(run, 2, 50, fpt), 2);
  int64_t params = 0;
  for (const json& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == "launch") params = e.value("params", int64_t(0));
  EXPECT_GT(params, 0) << "the launch event names no parameter count";
  EXPECT_NE(read_file(run + "/summary.txt").find(std::to_string(params) + " parameters"), std::string::npos)
      << read_file(run + "/summary.txt");
}

}  // namespace
}  // namespace atl::testing
