// `atoll bench` flags an MFU above 100% as a disturbed measurement (the peak measured while the
// machine was busy, or a wrong peak given): the JSON line says "mfu_disturbed": true and the
// human output says why, rather than printing an impossible utilisation as if it were real.
// --peak-gflops sets the peak, so the test chooses which side of 100% the run lands on.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class BenchMfu : public CliTest {
 protected:
  // `atoll bench` on the micro config, one timed step, against `peak` GFLOP/s.
  std::pair<RunResult, nlohmann::json> bench(const std::string& peak) {
    const RunResult r =
        run_atoll({"bench", "--config", world().config(), "--steps", "1", "--warmup", "0", "--peak-gflops", peak});
    const auto lines = split_lines(r.out);
    std::string last;
    for (const auto& l : lines)
      if (!l.empty()) last = l;
    return {r, nlohmann::json::parse(last, nullptr, false)};
  }
};

TEST_F(BenchMfu, AboveOneHundredPercentIsFlaggedAsDisturbed) {
  const auto [r, j] = bench("1e-9");  // any real step beats a peak of 1 FLOP/s
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_GT(j.at("mfu").get<double>(), 1.0) << r.out;
  EXPECT_EQ(j.at("peak_gflops").get<double>(), 1e-9) << r.out;
  EXPECT_EQ(j.at("mfu_disturbed"), true) << r.out;
  EXPECT_NE(r.out.find("above 100%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("disturbed"), std::string::npos) << r.out;
}

TEST_F(BenchMfu, BelowOneHundredPercentIsNotFlagged) {
  const auto [r, j] = bench("1e9");  // an exaflop: no CPU step comes near it
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_LT(j.at("mfu").get<double>(), 1.0) << r.out;
  EXPECT_EQ(j.at("mfu_disturbed"), false) << r.out;
  EXPECT_EQ(r.out.find("above 100%"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace atl::testing
