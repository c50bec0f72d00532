// A member of the run lost while the group of an admission forms (issue 19: no outer step waits
// more than 2 × fault.timeout_s after a failure). Island 2 is killed in the ring of outer step 2,
// restarted, and asks to rejoin; a commit admits it, and island 0 kills itself as it is about to
// rendezvous the admitting view's group (ATOLL_FAULT admission=1). Islands 1 and 2 must give up
// on island 0 once its heartbeat lapses (fault.heartbeat_ttl_s), not after the rendezvous's
// timeout, re-form without it, admit island 2 and commit the next outer step: from island 0's
// death to that commit at most 2 × fault.timeout_s. (Before, the rendezvous waited the timeout
// for the sizes and again for the addresses: 8 s = 2 × the timeout before the re-form began.)
#include <gtest/gtest.h>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

constexpr double kTimeoutS = 4;  // ElasticLaunch's fault.timeout_s

TEST_F(ElasticLaunch, AMemberLostAsAnAdmissionFormsIsNotWaitedForPastItsHeartbeat) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=kill:island=2:outer_step=2:ring_chunk=1,kill:island=0:admission=1");
  Background b(args(run), dir("launch"));
  child_env().pop_back();

  MetricsTail tail(run + "/metrics.jsonl");
  int64_t newest = 0, newest_at_death = -1;
  pid_t island0 = -1;
  Clock::time_point died{};
  double wait_s = -1;  // from island 0's death to the next committed outer step
  while (b.running() && wait_s < 0) {
    tail.poll([&](const nlohmann::json& r) {
      if (r.contains("theta_hash")) newest = std::max(newest, r["outer_step"].get<int64_t>());
    });
    const pid_t pid = worker_pid(b.pid(), 0);
    if (newest_at_death < 0 && island0 > 0 && pid != island0) newest_at_death = newest, died = Clock::now();
    if (newest_at_death < 0 && pid > 0) island0 = pid;
    if (newest_at_death >= 0 && newest > newest_at_death)
      wait_s = std::chrono::duration<double>(Clock::now() - died).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(ends_with_exit_0(b));
  const std::string err = read_file(dir("launch") + ".out") + read_file(dir("launch") + ".err");
  ASSERT_NE(err.find("[island 0 rank 0] ATOLL_FAULT: SIGKILL at admission 1"), std::string::npos) << err;
  ASSERT_GE(wait_s, 0) << "no outer step committed after island 0 died (after outer step " << newest_at_death << ")";
  EXPECT_LE(wait_s, 2 * kTimeoutS) << "after island 0 died at outer step " << newest_at_death << "\n" << err;
  std::printf("from island 0's death to the next committed outer step: %.2f s\n", wait_s);

  const RunView v = read_run(run);
  expect_agreement(v);
  // The admission was re-formed because the rendezvous gave up on island 0, not because it timed out.
  bool gave_up = false;
  for (const auto& e : v.events.at("abort_retry"))
    gave_up |= e["attempt"] == "admit" && e["why"].get<std::string>().find("island 0 rank 0 gone") != std::string::npos;
  EXPECT_TRUE(gave_up) << "no abort_retry of the admission naming island 0 gone";
  std::set<int> joined;
  for (const auto& e : v.events.at("join")) joined.insert(e["island"].get<int>());
  EXPECT_EQ(joined, (std::set<int>{0, 2})) << "island 2 admitted without island 0, then island 0 rejoined";
}

}  // namespace
}  // namespace atl::testing
