// `atoll doctor` across emulated hosts (tests/net/emulated_hosts.sh): the store with a password
// on host 0; two doctors placed by Slurm's variables, one per host, meet through it and reach each
// other at the addresses that route to the store; `--iface lo` on host 1, whose store is on
// another host, fails naming the fix; with host 1's link cut, its doctor fails to reach the store
// and host 0's fails to meet it within --wait. Needs root (network namespaces): skipped with the
// reason otherwise. Only addresses inside the namespaces it makes; every wait bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/scoped_child_env.h"
#include "net/ns_process.h"

namespace atl::testing {
namespace {

constexpr const char* kPassword = "hosts-doctor-password";
constexpr const char* kStore = "redis://10.79.0.2:6391";

// The line of `out` for `check` ("PASS store: ..."), "" when there is none.
std::string line_of(const std::string& out, const std::string& check) {
  for (const std::string& l : split_lines(out))
    if (l.size() > 5 && l.compare(5, check.size() + 1, check + ":") == 0) return l;
  return "";
}

class DoctorHosts : public EmulatedHostsTest {
 protected:
  DoctorHosts() : EmulatedHostsTest("atld") {}
  void SetUp() override {
    EmulatedHostsTest::SetUp();
    if (IsSkipped()) return;
    const std::string up = "NETEM=" + netem() + " " + script() + " up " + name_ + " 2 2>&1 >" + dir("hosts.log");
    ASSERT_EQ(std::system(up.c_str()), 0) << read_file(dir("hosts.log"));
    start(0, {"redis-server", "--bind", "10.79.0.2", "--port", "6391", "--requirepass", kPassword, "--protected-mode",
              "no", "--save", "", "--appendonly", "no"},
          "redis.log");
    for (int i = 0; i < 200 && read_file(dir("redis.log")).find("Ready to accept") == std::string::npos; ++i)
      ::usleep(50000);  // bounded: 10 s
    ASSERT_NE(read_file(dir("redis.log")).find("Ready to accept"), std::string::npos) << read_file(dir("redis.log"));
  }

  // A doctor on host h as Slurm's task h of 2, with `extra` flags; its output goes to doctor<h>.log.
  NsProcess& doctor(int h, const std::vector<std::string>& extra = {}) {
    const ScopedChildEnv env({std::string("ATOLL_STORE_PASSWORD=") + kPassword, "ATOLL_RUN_TOKEN=t0k3n",
                              "SLURM_PROCID=" + std::to_string(h), "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=h[0-1]",
                              "SLURM_JOB_ID=42"});
    std::vector<std::string> argv = {atoll_bin(), "doctor", "--store", kStore, "--config", world().config(),
                                     "--run-dir", dir("run"), "--timeout", "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return start(h, argv, "doctor" + std::to_string(h) + ".log");
  }
  std::string log(int h) const { return dir("doctor" + std::to_string(h) + ".log"); }
};

TEST_F(DoctorHosts, TwoHostsMeetAndReachEachOtherAtTheirRoutesToTheStore) {
  NsProcess& d0 = doctor(0, {"--wait", "30"});
  NsProcess& d1 = doctor(1, {"--wait", "30"});
  for (int h = 0; h < 2; ++h) {
    const int code = (h == 0 ? d0 : d1).wait(60);
    const std::string out = read_file(log(h));
    ASSERT_EQ(code, 0) << out;
    const std::string me = "10.79." + std::to_string(h) + ".2", other = "10.79." + std::to_string(1 - h) + ".2";
    EXPECT_EQ(line_of(out, "interface"), "PASS interface: " + me + " (eth0, the route to the store)") << out;
    const std::string peers = line_of(out, "peers");
    EXPECT_EQ(peers.rfind("PASS peers: met 1 of 1 other doctor(s) of run 'slurm-42'", 0), 0u) << out;
    EXPECT_NE(peers.find("reached island " + std::to_string(1 - h) + " rank 0 on "), std::string::npos) << out;
    EXPECT_NE(peers.find("(" + other + ":"), std::string::npos) << out;
    EXPECT_NE(peers.find("every one reached this host at " + me + ":"), std::string::npos) << out;
  }
}

TEST_F(DoctorHosts, LoopbackWhileTheStoreIsOnAnotherHostFails) {
  NsProcess& d = doctor(1, {"--iface", "lo", "--peers", "1"});
  EXPECT_EQ(d.wait(60), 1);
  const std::string out = read_file(log(1));
  const std::string line = line_of(out, "interface");
  EXPECT_EQ(line.rfind("FAIL interface: --iface lo is the loopback interface (127.0.0.1), but the store 10.79.0.2", 0), 0u)
      << out;
  EXPECT_NE(line.find("fix: name the interface that reaches the other hosts"), std::string::npos) << out;
}

TEST_F(DoctorHosts, AHostCutOffFailsToReachTheStoreAndTheOtherFailsToMeetIt) {
  ASSERT_EQ(std::system((script() + " cut " + name_ + " 1").c_str()), 0);
  NsProcess& d0 = doctor(0, {"--wait", "2"});
  NsProcess& d1 = doctor(1, {"--wait", "2"});
  EXPECT_EQ(d1.wait(60), 1);
  EXPECT_EQ(line_of(read_file(log(1)), "store").rfind("FAIL store: redis://10.79.0.2:6391 unreachable within 2 s", 0), 0u)
      << read_file(log(1));
  EXPECT_EQ(d0.wait(60), 1);
  const std::string peers = line_of(read_file(log(0)), "peers");
  EXPECT_EQ(peers.rfind("FAIL peers: met 0 of 1 other doctor(s) of run 'slurm-42' within 2 s", 0), 0u) << read_file(log(0));
  EXPECT_NE(peers.find("fix: start `atoll doctor` on every host at once"), std::string::npos) << peers;
}

}  // namespace
}  // namespace atl::testing
