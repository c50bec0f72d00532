// The emulated hosts of tests/net/emulated_hosts.sh, themselves tested: a probe's round trip
// shows a link's delay, a counted stream shows its loss, and a cut link carries nothing until it
// is restored. Needs root (network namespaces): skipped with the reason otherwise. Only addresses
// inside the namespaces the test makes; every wait bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

namespace {

std::string env_or(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v && *v ? v : def;
}

std::string script() { return env_or("ATOLL_SOURCE_DIR", ".") + "/tests/net/emulated_hosts.sh"; }
std::string netem() { return env_or("ATOLL_NETEM", "build/tests/atoll_netem"); }

// Runs `cmd` with a shell, returns its stdout; `rc` its status.
std::string run(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  if (rc) *rc = status;
  return out;
}

class EmulatedHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::getuid() != 0) GTEST_SKIP() << "needs root for network namespaces (ip netns)";
    if (std::system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs iproute2's ip";
    name_ = "atlt" + std::to_string(::getpid() % 100000);
  }
  void TearDown() override {
    if (!name_.empty()) run(env() + script() + " down " + name_ + " 2>&1");
  }
  std::string env() const { return "NETEM=" + netem() + " "; }
  // Hosts 0..n-1 with the given links ("I:DELAY_MS:JITTER_MS:LOSS"), and an echo server on each.
  void up(int n, const std::string& links) {
    int rc = 0;
    const std::string out = run(env() + script() + " up " + name_ + " " + std::to_string(n) + " " + links + " 2>&1", &rc);
    ASSERT_EQ(rc, 0) << out;
    for (int i = 0; i < n; ++i)
      std::system(("ip netns exec " + host(i) + " " + netem() + " echo --port 7007 --max-s 120 >/dev/null 2>&1 &").c_str());
  }
  std::string host(int i) const { return name_ + "-h" + std::to_string(i); }
  static std::string addr(int i) { return "10.79." + std::to_string(i) + ".2"; }
  // A counted stream of UDP probes from host a to host b's echo server.
  nlohmann::json probe(int a, int b, int count, int interval_ms = 2, int wait_ms = 2000) const {
    const std::string out = run("ip netns exec " + host(a) + " " + netem() + " probe --to " + addr(b) +
                                " --port 7007 --count " + std::to_string(count) + " --interval-ms " +
                                std::to_string(interval_ms) + " --wait-ms " + std::to_string(wait_ms));
    return nlohmann::json::parse(out, nullptr, false);
  }
  // Waits (bounded) until b's echo server answers a single probe.
  bool echo_ready(int a, int b) const {
    for (int t = 0; t < 40; ++t) {
      const nlohmann::json r = probe(a, b, 1, 0, 250);
      if (!r.is_discarded() && r["received"] == 1) return true;
    }
    return false;
  }
  std::string name_;
};

TEST_F(EmulatedHosts, AProbesRoundTripShowsTheLinksDelay) {
  up(3, "--link 2:20:2:0");  // host 2 is 20 ms (±2) from the router: 40 ms a round trip from host 0
  ASSERT_TRUE(echo_ready(0, 2));
  ASSERT_TRUE(echo_ready(0, 1));
  const nlohmann::json far = probe(0, 2, 40, 5);
  const nlohmann::json near = probe(0, 1, 40, 5);
  ASSERT_EQ(far["received"], 40) << far.dump();
  ASSERT_EQ(near["received"], 40) << near.dump();
  // The forwarder never releases a packet early: 2 x (20 - 2) ms is a floor whatever the load.
  EXPECT_GE(far["rtt_ms_min"].get<double>(), 36.0) << far.dump();
  // Host 1's link has no delay: its fastest round trip is below the far one's floor (the fastest
  // of 40, so a loaded machine does not make it fail).
  EXPECT_LT(near["rtt_ms_min"].get<double>(), 36.0) << near.dump();
}

TEST_F(EmulatedHosts, ACountedStreamShowsTheLinksLoss) {
  up(2, "--link 1:0:0:0.2");
  ASSERT_TRUE(echo_ready(0, 1));  // (its probes are lost too, 36% of them: up to 40 tries)
  const nlohmann::json r = probe(0, 1, 400, 1);
  // Each probe crosses link 1 twice (there and back): kept with 0.8 x 0.8 = 0.64, 256 of 400
  // expected, standard deviation 9.6: the bounds are 7 deviations out, far from 0 and from 400.
  const int got = r["received"].get<int>();
  EXPECT_GT(got, 190) << r.dump();
  EXPECT_LT(got, 322) << r.dump();
}

TEST_F(EmulatedHosts, ACutLinkCarriesNothingUntilRestored) {
  up(3, "");
  ASSERT_TRUE(echo_ready(0, 2));
  ASSERT_EQ(std::system((script() + " cut " + name_ + " 2").c_str()), 0);
  const nlohmann::json cut = probe(0, 2, 20, 5, 300);
  EXPECT_EQ(cut["received"], 0) << cut.dump();
  EXPECT_EQ(probe(0, 1, 5, 5)["received"], 5) << "the other hosts stay connected";
  ASSERT_EQ(std::system((script() + " restore " + name_ + " 2").c_str()), 0);
  EXPECT_TRUE(echo_ready(0, 2)) << "host 2 is not reachable after its link is restored";
}

}  // namespace
