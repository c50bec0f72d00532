// Trust at the door, through `atoll launch` on the micro model with real processes: the run's
// token and its store's password live in owner-only files and reach the workers through their
// environment, never a command line that `ps` shows; a worker started by hand with a wrong or
// missing token, or a wrong store password, or with the right ones as an island that is running,
// is refused with a clear error and the run goes on untouched (no worker lost, no re-forming, no
// join); docs/islands.md's recipe (`--run-dir RUN_DIR`, which reads the run id from RUN_DIR/run.id)
// reaches the run, and a worker without it is told which run the store holds; a user's own store
// with a password is given as redis://:PASSWORD@HOST:PORT, and a wrong one is a clear error before
// any worker starts.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>

#include "atoll/supervise/redis_server.h"
#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

using TrustAtTheDoor = ElasticLaunch;

std::string cmdline_of(pid_t pid) {
  std::string c = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& ch : c)
    if (ch == '\0') ch = ' ';
  return c;
}

// The value after `flag` in a command line read by cmdline_of.
std::string flag_value(const std::string& cmdline, const std::string& flag) {
  const size_t at = cmdline.find(" " + flag + " ");
  if (at == std::string::npos) return "";
  const size_t from = at + flag.size() + 2;
  return cmdline.substr(from, cmdline.find(' ', from) - from);
}

unsigned file_mode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? unsigned(st.st_mode & 0777) : 0u;
}

TEST_F(TrustAtTheDoor, AWrongOrMissingTokenIsRefusedAndTheRunGoesOnUntouched) {
  const std::string run = dir("run");
  std::vector<std::string> a = args(run);
  a[2] = "2";  // --islands 2
  Background b(a, dir("launch"));
  ASSERT_TRUE(wait_until([&] { return newest_outer_step(run) >= 2; }, 60, [&] { return b.running(); }))
      << read_file(dir("launch") + ".err");
  EXPECT_EQ(file_mode(run + "/run.token"), 0600u);
  EXPECT_EQ(file_mode(run + "/store.password"), 0600u);
  const std::string token = split_lines(read_file(run + "/run.token")).at(0);
  const std::string password = split_lines(read_file(run + "/store.password")).at(0);
  ASSERT_EQ(token.size(), 64u);
  ASSERT_EQ(password.size(), 64u);
  const pid_t worker = worker_pid(b.pid(), 1);
  ASSERT_GT(worker, 0);
  const std::string worker_cmd = cmdline_of(worker);
  EXPECT_EQ(worker_cmd.find(token), std::string::npos) << "ps shows the run token: " << worker_cmd;
  EXPECT_EQ(worker_cmd.find(password), std::string::npos) << "ps shows the store password: " << worker_cmd;
  const std::string store = flag_value(worker_cmd, "--store"), run_id = flag_value(worker_cmd, "--run-id");
  ASSERT_EQ(store.rfind("redis://", 0), 0u) << worker_cmd;
  EXPECT_EQ(split_lines(read_file(run + "/run.id")), std::vector<std::string>{run_id}) << "the run id is in the run folder";
  const std::string with_password = "redis://:" + password + "@" + store.substr(8);

  // Island 1 is alive: a worker that took its place would make the run lose it. Each joins by the
  // docs/islands.md's recipe: the run folder names the run (RUN_DIR/run.id).
  auto intruder = [&](const std::string& store_url, const std::vector<std::string>& extra,
                      const std::vector<std::string>& run_flags = {"--run-dir", ""}) {
    std::vector<std::string> w = {"worker", "--store", store_url, "--island", "1", "--rank", "0", "--islands", "2",
                                  "--config", run + "/config.toml", "--join", "--quiet"};
    for (const std::string& f : run_flags) w.push_back(f.empty() ? run : f);
    w.insert(w.end(), extra.begin(), extra.end());
    return run_atoll(w, 60);
  };
  // With the run's token and password: refused, since island 1 is running, naming that process.
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult duplicate = intruder(with_password, {"--token-file", run + "/run.token"});
  const double duplicate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(fails_clearly(duplicate, {"worker 1.0: refused: island 1 rank 0 is running (pid " +
                                            std::to_string(worker) + ", host ", "fix: stop that process first"}));
  EXPECT_LT(duplicate_s, 10.0) << "refused within about a heartbeat (0.2 s) of reaching the store";
  // Without the run's id (no --run-dir, no --run-id): run 'atoll' is not on the store; told at once
  // which run is.
  EXPECT_TRUE(fails_clearly(intruder(with_password, {"--token-file", run + "/run.token"}, {}),
                            {"--join, but run 'atoll' is not on", "the store holds run '" + run_id + "'", "RUN_DIR/run.id"}));
  write_file(dir("wrong.token"), std::string(64, 'a') + "\n");
  EXPECT_TRUE(fails_clearly(intruder(with_password, {"--token-file", dir("wrong.token")}),
                            {"worker 1.0: refused", "is not the token of run", "--token-file RUN_DIR/run.token"}));
  EXPECT_TRUE(fails_clearly(intruder(with_password, {}), {"worker 1.0: refused", "none was given"}));
  EXPECT_TRUE(fails_clearly(intruder("redis://:wrong@" + store.substr(8), {"--token-file", run + "/run.token"}),
                            {"store refused the password", "redis://:PASSWORD@HOST:PORT"}));
  EXPECT_TRUE(fails_clearly(intruder(store, {"--token-file", run + "/run.token"}), {"store requires a password"}));

  ASSERT_TRUE(ends_with_exit_0(b));
  const RunView v = read_run(run);
  expect_agreement(v);
  EXPECT_EQ(v.count("peer_lost"), 0u);
  EXPECT_EQ(v.count("abort_retry"), 0u);
  EXPECT_EQ(v.count("join"), 0u);
  EXPECT_EQ(steps_with(v, 2).size(), v.theta.size()) << "every outer step had both islands";
}

TEST_F(TrustAtTheDoor, AUsersStoreTakesItsPasswordInTheUrl) {
  RedisServer server(RedisServerOptions{.password = "users-own-password"});
  const std::string hostport = "127.0.0.1:" + std::to_string(server.port());
  std::vector<std::string> a = args(dir("run"), {"--set", "train.steps=8", "--store", "redis://:users-own-password@" + hostport});
  a[2] = "2";
  const RunResult r = run_atoll(a, 60);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(fs::exists(dir("run") + "/store.password")) << "the user's password is the user's to keep";
  EXPECT_EQ(file_mode(dir("run") + "/run.token"), 0600u);
  std::vector<std::string> wrong = args(dir("run2"), {"--set", "train.steps=8", "--store", "redis://:nope@" + hostport});
  wrong[2] = "2";
  const RunResult w = run_atoll(wrong, 60);
  EXPECT_TRUE(fails_clearly(w, {"store refused the password", "redis://:PASSWORD@HOST:PORT"}));
  EXPECT_EQ((w.out + w.err).find("nope"), std::string::npos) << "the message shows the password";
}

}  // namespace
}  // namespace atl::testing
