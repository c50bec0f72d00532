// `atoll doctor` (supervise/doctor.h, docs/cluster.md "atoll doctor") through the real binary,
// against a redis-server on loopback with a password: every check passes on one host, and two
// doctors placed by Slurm's variables meet through the store and reach each other; a wrong or a
// missing password, no store, an interface this host lacks, a run token the run does not hold and
// a run directory on a tiny file system each give a FAIL line with its fix and exit 1; the
// doctor leaves the run directory and the run's keys in the store as they were, its own keys
// expiring; and the checkpoint size its disk check expects is that of a real checkpoint.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/membership.h"
#include "atoll/dist/store.h"
#include "atoll/supervise/redis_server.h"
#include "atoll/train/state_registry.h"
#include "ckpt/small_disk.h"
#include "cli/cli_util.h"
#include "cli/scoped_child_env.h"

namespace atl::testing {
namespace {

constexpr const char* kPassword = "doctor-test-password";
constexpr int kFailExit = 1;

// The line of `out` for `check` ("PASS store: ..."), "" when there is none.
std::string line_of(const std::string& out, const std::string& check) {
  for (const std::string& l : split_lines(out))
    if (l.size() > 5 && l.compare(5, check.size() + 1, check + ":") == 0) return l;
  return "";
}

// A port of 127.0.0.1 that nothing listens on (bound, read, closed).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("cannot bind a port on loopback");
  ::close(fd);
  return ntohs(a.sin_port);
}

class Doctor : public CliTest {
 protected:
  static void SetUpTestSuite() {
    CliTest::SetUpTestSuite();
    redis_ = new RedisServer({.password = kPassword});
  }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
    CliTest::TearDownTestSuite();
  }

  // `atoll doctor` of run `run_id` with the micro config, this test's run folder and `extra`.
  std::vector<std::string> doctor(const std::string& run_id, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = {"doctor", "--store", redis_->url(), "--run-id", run_id, "--config",
                                     world().config(), "--run-dir", dir("run"), "--timeout", "5"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  static Store store(const std::string& run_id) {
    return Store(StoreOptions{.url = redis_->url(), .password = kPassword, .run_id = run_id,
                              .timeout = std::chrono::milliseconds(5000)});
  }
  // Every key of the store and its value.
  static std::map<std::string, std::string> keys() {
    Store s = store("any");
    std::map<std::string, std::string> out;
    const std::vector<std::string> all = s.scan("*");
    const auto values = s.get_many(all);
    for (size_t i = 0; i < all.size(); ++i) out[all[i]] = values[i].value_or("(not a string)");
    return out;
  }

  static inline RedisServer* redis_ = nullptr;
};

TEST_F(Doctor, EveryCheckPassesOnOneHostWithThePasswordAndAToken) {
  const ScopedChildEnv env({std::string("ATOLL_STORE_PASSWORD=") + kPassword, "ATOLL_RUN_TOKEN=t0k3n"});
  const RunResult r = run_atoll(doctor("doctor-one", {"--peers", "1"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (const char* check : {"placement", "config", "store", "interface", "port", "clock", "run token", "disk", "peers"})
    EXPECT_EQ(line_of(r.out, check).rfind("PASS ", 0), 0u) << check << ":\n" << r.out;
  EXPECT_NE(line_of(r.out, "store").find("password from ATOLL_STORE_PASSWORD accepted"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "interface").find("127.0.0.1 (lo, the store is on this host)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("doctor: 9 pass, 0 warn, 0 fail"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir("run"))) << "the doctor made the run folder";
}

TEST_F(Doctor, TwoDoctorsPlacedBySlurmMeetAndReachEachOther) {
  const std::string run_id = "doctor-two";
  const auto before = keys();
  std::vector<std::unique_ptr<Background>> tasks;
  for (int t = 0; t < 2; ++t) {
    const ScopedChildEnv env({std::string("ATOLL_STORE_PASSWORD=") + kPassword, "ATOLL_RUN_TOKEN=t0k3n",
                              "SLURM_PROCID=" + std::to_string(t), "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=localhost",
                              "SLURM_JOB_ID=77"});
    tasks.push_back(std::make_unique<Background>(doctor(run_id, {"--wait", "30"}), dir("task" + std::to_string(t))));
  }
  for (int t = 0; t < 2; ++t) {
    const int status = tasks[size_t(t)]->wait();
    const std::string out = read_file(dir("task" + std::to_string(t)) + ".out");
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out << read_file(dir("task" + std::to_string(t)) + ".err");
    EXPECT_NE(line_of(out, "placement").find("island " + std::to_string(t) + " rank 0 of 2 island(s)"), std::string::npos) << out;
    const std::string peers = line_of(out, "peers");
    EXPECT_EQ(peers.rfind("PASS peers: met 1 of 1 other doctor(s) of run 'doctor-two'", 0), 0u) << out;
    EXPECT_NE(peers.find("reached island " + std::to_string(1 - t) + " rank 0 on "), std::string::npos) << out;
    EXPECT_NE(peers.find("every one reached this host at 127.0.0.1:"), std::string::npos) << out;
  }
  // What the doctors leave: their reports, which expire; nothing else.
  Store s = store(run_id);
  for (const auto& [key, value] : keys()) {
    if (before.count(key)) continue;
    EXPECT_EQ(key.rfind("atoll-doctor/" + run_id + "/done/", 0), 0u) << key << " left behind";
    const auto e = s.get_expiring(key);
    EXPECT_TRUE(e && e->expires_at_ms > 0) << key << " does not expire";
  }
}

TEST_F(Doctor, AWrongOrMissingPasswordFailsNamingATOLL_STORE_PASSWORD) {
  {
    const ScopedChildEnv env({"ATOLL_STORE_PASSWORD=not-the-password"});
    const RunResult r = run_atoll(doctor("doctor-pw", {"--peers", "1"}), 60);
    EXPECT_EQ(r.exit_code, kFailExit) << r.describe();
    const std::string line = line_of(r.out, "store");
    EXPECT_EQ(line.rfind("FAIL store: " + redis_->url() + " refused the password from ATOLL_STORE_PASSWORD", 0), 0u) << r.out;
    EXPECT_NE(line.find("fix: set ATOLL_STORE_PASSWORD to the store's password"), std::string::npos) << r.out;
    EXPECT_EQ(line_of(r.out, "run token").rfind("SKIP ", 0), 0u) << r.out;
  }
  const ScopedChildEnv env({"ATOLL_STORE_PASSWORD"});  // none at all
  const RunResult r = run_atoll(doctor("doctor-pw", {"--peers", "1"}), 60);
  EXPECT_EQ(r.exit_code, kFailExit) << r.describe();
  const std::string line = line_of(r.out, "store");
  EXPECT_EQ(line.rfind("FAIL store: " + redis_->url() + " requires a password and none was given", 0), 0u) << r.out;
  EXPECT_NE(line.find("fix: export ATOLL_STORE_PASSWORD="), std::string::npos) << r.out;
}

TEST_F(Doctor, NoStoreFailsNamingItsURL) {
  const std::string url = "redis://127.0.0.1:" + std::to_string(free_port());
  const RunResult r = run_atoll({"doctor", "--store", url, "--config", world().config(), "--peers", "1"}, 60);
  EXPECT_EQ(r.exit_code, kFailExit) << r.describe();
  const std::string line = line_of(r.out, "store");
  EXPECT_EQ(line.rfind("FAIL store: " + url + " unreachable within 5 s (Connection refused)", 0), 0u) << r.out;
  EXPECT_NE(line.find("fix: start redis-server there"), std::string::npos) << r.out;
}

TEST_F(Doctor, AnInterfaceThisHostLacksFails) {
  const ScopedChildEnv env({std::string("ATOLL_STORE_PASSWORD=") + kPassword});
  const RunResult r = run_atoll(doctor("doctor-iface", {"--peers", "1", "--iface", "atollnosuch0"}), 60);
  EXPECT_EQ(r.exit_code, kFailExit) << r.describe();
  const std::string line = line_of(r.out, "interface");
  EXPECT_EQ(line.rfind("FAIL interface: --iface atollnosuch0: this host has no such network interface", 0), 0u) << r.out;
  EXPECT_NE(line.find("fix:"), std::string::npos) << r.out;
  EXPECT_EQ(line_of(r.out, "port").rfind("SKIP ", 0), 0u) << r.out;
}

// A run on the store with a token and a run folder: the doctor judges a token the run does not
// hold, and none, as a worker's door would, and changes nothing of either.
TEST_F(Doctor, JudgesTheRunTokenAndLeavesTheRunAsItWas) {
  const std::string run_id = "doctor-run";
  {
    Store s = store(run_id);
    publish_run_token(s, "the-runs-token");  // as the launcher does: the store holds its verifier
    s.set(s.run_prefix() + "/members/epoch", "3");
  }
  fs::create_directories(dir("run/checkpoints"));
  write_file(dir("run/config.toml"), world().config_text());
  write_file(dir("run/events.jsonl"), "{\"event\":\"start\",\"time\":1}\n");
  write_file(dir("run/checkpoints/latest"), "step-00000002\n");
  const auto files = snapshot(dir("run"));
  const auto before = keys();
  struct Case {
    std::string token, verdict, says;
  };
  for (const Case& c : {Case{"the-runs-token", "PASS", "the token (from ATOLL_RUN_TOKEN) is run 'doctor-run''s on the store"},
                        Case{"another-token", "FAIL", "is not the token of run 'doctor-run' on the store"},
                        Case{"", "FAIL", "run 'doctor-run' is on the store with a token, and none was given"}}) {
    const ScopedChildEnv env({std::string("ATOLL_STORE_PASSWORD=") + kPassword,
                              c.token.empty() ? std::string("ATOLL_RUN_TOKEN") : "ATOLL_RUN_TOKEN=" + c.token});
    const RunResult r = run_atoll(doctor(run_id, {"--peers", "1"}), 60);
    EXPECT_EQ(r.exit_code, c.verdict == "PASS" ? 0 : kFailExit) << r.describe();
    const std::string line = line_of(r.out, "run token");
    EXPECT_EQ(line.rfind(c.verdict + " run token: ", 0), 0u) << r.out;
    EXPECT_NE(line.find(c.says), std::string::npos) << r.out;
    if (c.verdict == "FAIL") {
      EXPECT_NE(line.find("fix: give the run's token"), std::string::npos) << r.out;
    }
  }
  EXPECT_TRUE(unchanged(files, snapshot(dir("run"))));
  EXPECT_EQ(before, keys());
}

// A run folder on a tmpfs of a few MiB (its own mount namespace: root only, else skipped): the
// micro config's checkpoints (4 at a save's peak with checkpoint.keep 3) do not fit; with
// checkpoint.keep 1 they fit, but not twice.
TEST_F(Doctor, ARunFolderOnATinyFileSystemFailsOrWarns) {
  const ScopedChildEnv env({std::string("ATOLL_STORE_PASSWORD=") + kPassword, "ATOLL_RUN_TOKEN=t0k3n"});
  std::map<std::string, std::string> lines;
  const std::optional<std::string> got = on_small_disk(4096, [&](const std::string& mount) {
    std::string out;
    for (const char* keep : {"3", "1"}) {
      const RunResult r = run_atoll({"doctor", "--store", redis_->url(), "--run-id", "doctor-disk", "--config",
                                     world().config(), "--set", std::string("checkpoint.keep=") + keep, "--run-dir",
                                     mount + "/run", "--peers", "1"}, 60);
      out += "exit " + std::to_string(r.exit_code) + "\n" + line_of(r.out, "disk") + "\n";
    }
    return out;
  });
  if (!got) GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  const std::vector<std::string> l = split_lines(*got);
  ASSERT_EQ(l.size(), 4u) << *got;
  EXPECT_EQ(l[0], "exit 1") << *got;
  EXPECT_EQ(l[1].rfind("FAIL disk: ", 0), 0u) << *got;
  EXPECT_NE(l[1].find("it does not fit; fix: free space there"), std::string::npos) << *got;
  EXPECT_EQ(l[2], "exit 0") << *got;
  EXPECT_EQ(l[3].rfind("WARN disk: ", 0), 0u) << *got;
  EXPECT_NE(l[3].find("less than twice that is free"), std::string::npos) << *got;
}

// The disk check's size of a checkpoint (checkpoint_bytes_estimate) against a real one: 2 islands
// launched for 2 steps of the micro config. The estimate counts the tensors' bytes; the files add
// their safetensors headers and the manifest, a few KiB.
TEST_F(Doctor, ItsCheckpointSizeIsThatOfARealCheckpoint) {
  const std::vector<std::string> sets = {"train.steps=2", "checkpoint.every=2", "diloco.inner_steps=2",
                                         "train.eval_every=0"};
  std::vector<std::string> args = {"launch", "--islands", "2", "--config", world().config(), "--run-dir", dir("run")};
  for (const std::string& kv : sets) args.insert(args.end(), {"--set", kv});
  const RunResult r = run_atoll(args, 120);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string ckpt = dir("run/checkpoints/" + split_lines(read_file(dir("run/checkpoints/latest"))).at(0));
  double bytes = 0;
  for (const auto& f : fs::directory_iterator(ckpt)) bytes += double(f.file_size());
  const double estimate = checkpoint_bytes_estimate(load_config(world().config(), sets), 2, 1);
  EXPECT_LE(estimate, bytes) << ckpt;
  EXPECT_GE(estimate, bytes - 64 * 1024) << ckpt;
}

}  // namespace
}  // namespace atl::testing
