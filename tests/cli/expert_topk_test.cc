// The sparse expert exchange (diloco.expert_topk) through `atoll launch` on the micro model (4
// experts per layer: expert_topk = 0.25 sends one expert of each layer per island and round):
// every outer step ends with one θ hash over the islands, and each island sends fewer bytes than
// with the dense exchange; an island killed in the ring of an outer step is restarted and rejoins,
// the outer step is retried without it and the hashes still agree; refused on a dense model and
// with an overlapped exchange. (A resumed run: island_resume_test.cc, case "expert-topk".)
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

// Each worker's last comm_bytes, summed.
double bytes_sent(const std::string& run) {
  std::map<std::pair<int, int>, double> last;
  for (const auto& row : read_jsonl(run + "/metrics.jsonl"))
    if (row.contains("comm_bytes")) last[{row["island"].get<int>(), row["rank"].get<int>()}] = row["comm_bytes"].get<double>();
  double sum = 0;
  for (const auto& [who, b] : last) sum += b;
  return sum;
}

TEST_F(ShortLaunch, SparseExpertsAgreeEverywhereAndSendFewerBytes) {
  const Outcome dense = run("dense", "", {});
  const Outcome sparse = run("sparse", "", {}, {"--set", "diloco.expert_topk=0.25"});  // run() checks the hashes
  EXPECT_TRUE(std::isfinite(sparse.val_loss)) << sparse.describe;
  EXPECT_GT(sparse.val_loss, 0) << sparse.describe;
  const double a = bytes_sent(dir("dense")), b = bytes_sent(dir("sparse"));
  // The micro model's experts are most of its parameters; one in four is sent, but an all-gather
  // of 3 islands sends each frame twice: well under the dense exchange, not a quarter of it.
  EXPECT_LT(b, 0.8 * a) << "sparse " << b << " bytes, dense " << a;
}

TEST_F(ElasticLaunch, AnIslandKilledMidExchangeWithSparseExpertsRejoinsAndTheHashesAgree) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=kill:island=2:outer_step=2:ring_chunk=1");
  const RunResult r = run_atoll(args(run, {"--set", "train.steps=200", "--set", "diloco.expert_topk=0.25"}), 120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const RunView v = read_run(run);
  expect_agreement(v, 200 / kH);
  EXPECT_EQ(v.count("peer_lost"), 1u) << r.describe();
  EXPECT_EQ(v.count("abort_retry"), 1u) << r.describe();
  EXPECT_FALSE(steps_with(v, 2).empty()) << "outer steps without island 2";
  EXPECT_EQ(v.count("join"), 1u) << r.describe();
}

TEST_F(CliTest, SparseExpertsAreRefusedOnADenseModelAndWithAnOverlappedExchange) {
  const RunResult dense = run_atoll({"launch", "--islands", "2", "--config", world().config(), "--run-dir", dir("a"),
                                     "--set", "model.n_experts=1", "--set", "model.top_k=1", "--set",
                                     "diloco.expert_topk=0.5"});
  EXPECT_TRUE(fails_clearly(dense, {"diloco.expert_topk", "model.n_experts"}));
  const RunResult overlap = run_atoll({"launch", "--islands", "2", "--config", world().config(), "--run-dir",
                                       dir("b"), "--set", "diloco.overlap_steps=1", "--set", "diloco.expert_topk=0.5"});
  EXPECT_TRUE(fails_clearly(overlap, {"diloco.expert_topk", "diloco.overlap_steps"}));
}

}  // namespace
}  // namespace atl::testing
