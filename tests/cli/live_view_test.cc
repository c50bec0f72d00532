// `atoll launch --status-port` (supervise/live_view.h) through the real binary and real HTTP
// requests over loopback: the live view answers while two islands train, shows island 1 out
// within its heartbeat ttl (plus slack) of a kill -9 from outside, then joining, then training
// again after its restart; /metrics and /health answer, and the launcher still ends cleanly on
// SIGTERM with the server running. A port already taken is refused before anything is written.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include "cli/elastic_util.h"

namespace atl::testing {
namespace {

class LiveView : public CliTest {
 protected:
  // Two islands on the micro model with fast fault settings: a lost worker is restarted after 2 s
  // (so it shows out that long) and waits for its predecessor's heartbeat (ttl 3 s) to lapse
  // before it asks to rejoin (so it shows joining a second or more): windows that a poll every
  // 20 ms does not miss on a loaded machine. The run is long: SIGTERM ends it.
  std::vector<std::string> args(const std::string& run) const {
    return {"launch", "--islands", "2", "--config", world().config(), "--run-dir", run, "--stop-grace", "1",
            "--status-port", "0", "--set", "train.steps=100000", "--set", "diloco.inner_steps=4", "--set",
            "train.eval_every=0", "--set", "checkpoint.every=0", "--set", "optim.warmup_steps=0", "--set",
            "fault.heartbeat_s=0.2", "--set", "fault.heartbeat_ttl_s=3", "--set", "fault.timeout_s=6", "--set",
            "fault.restart_backoff_s=2"};
  }
};

// GET `path`; nullopt when the server does not answer.
std::optional<httplib::Result> get(httplib::Client& client, const std::string& path) {
  httplib::Result r = client.Get(path);
  if (!r) return std::nullopt;
  return r;
}

TEST_F(LiveView, ShowsAKilledIslandOutThenJoiningThenTrainingAgain) {
  const std::string run = dir("run");
  Background b(args(run), dir("launch"));
  const auto alive = [&] { return b.running(); };
  ASSERT_TRUE(wait_for_file(dir(), "launch.out", 30, alive));
  ASSERT_TRUE(wait_for_text(dir("launch.out"), "live view: http://127.0.0.1:", 60, alive)) << read_file(dir("launch.err"));
  std::smatch m;
  const std::string out = read_file(dir("launch.out"));
  ASSERT_TRUE(std::regex_search(out, m, std::regex("live view: http://127\\.0\\.0\\.1:([0-9]+)/"))) << out;
  httplib::Client client("127.0.0.1", std::stoi(m[1]));
  client.set_read_timeout(30, 0);  // a loaded machine; nothing here is timed

  // The islands' states, by island, from /status.json (empty when it does not answer).
  nlohmann::json status;
  const auto island = [&](int i) -> nlohmann::json {
    if (auto r = get(client, "/status.json"); r && (*r)->status == 200) status = nlohmann::json::parse((*r)->body);
    return status.is_null() ? nlohmann::json() : status["islands"][size_t(i)];
  };
  const auto state_of = [&](int i) {
    const nlohmann::json is = island(i);
    return is.is_null() ? std::string() : is["state"].get<std::string>();
  };
  // Training, or in an outer step's exchange (every 4th step here).
  const auto working = [&](int i) {
    const std::string s = state_of(i);
    return s == "training" || s == "exchanging";
  };
  ASSERT_TRUE(wait_until([&] { return working(0) && working(1); }, 60, alive))
      << status.dump() << read_file(dir("launch.err"));
  EXPECT_EQ(status["run_dir"], fs::absolute(run).string());
  EXPECT_FALSE(status["run_id"].get<std::string>().empty());
  EXPECT_GT(status["start_time"].get<double>(), 0);
  // Every figure known once the first outer step is logged and the store read after it.
  ASSERT_TRUE(wait_until([&] {
    const nlohmann::json is = island(1);
    return !is["outer_step"].is_null() && !is["heartbeat_age_s"].is_null() && !is["last_loss"].is_null() &&
           is["member"].get<bool>();
  }, 30, alive)) << status.dump();
  EXPECT_GT(island(1)["bytes_sent"].get<double>(), 0) << status.dump();

  auto health = get(client, "/health");
  ASSERT_TRUE(health);
  EXPECT_EQ((*health)->status, 200);
  EXPECT_EQ((*health)->body, "ok\n");
  auto metrics = get(client, "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ((*metrics)->status, 200);
  EXPECT_NE((*metrics)->body.find("# TYPE atoll_island_step gauge\natoll_island_step{island=\"0\"} "), std::string::npos)
      << (*metrics)->body;
  EXPECT_NE((*metrics)->body.find("atoll_island_state{island=\"1\",state=\"out\"} 0\n"), std::string::npos);

  // kill -9 island 1's worker from outside: out within the heartbeat ttl (3 s) plus slack for a
  // loaded machine, then joining (its restart), then training again.
  const pid_t victim = worker_pid(b.pid(), 1);
  ASSERT_GT(victim, 0);
  const int64_t step_at_kill = island(1)["step"].get<int64_t>();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(wait_until([&] { return state_of(1) == "out"; }, 3 + 20, alive)) << status.dump();
  ASSERT_TRUE(wait_until([&] { return state_of(1) == "joining"; }, 60, alive)) << status.dump();
  EXPECT_EQ(island(1)["restarts"], 1);
  EXPECT_NE(island(1)["workers"][0]["pid"], victim);
  ASSERT_TRUE(wait_until([&] { return working(1) && island(1)["step"].get<int64_t>() > step_at_kill; },
                         60, alive))
      << status.dump() << read_file(dir("launch.err"));
  EXPECT_TRUE(working(0)) << status.dump();
  metrics = get(client, "/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE((*metrics)->body.find("atoll_island_restarts{island=\"1\"} 1\n"), std::string::npos) << (*metrics)->body;

  // SIGTERM: the launcher stops the run and ends, the server with it.
  ASSERT_EQ(::kill(b.pid(), SIGTERM), 0);
  EXPECT_TRUE(wait_until([&] { return !b.running(); }, 60, [] { return true; })) << "the launcher did not end after SIGTERM";
  EXPECT_FALSE(get(client, "/health")) << "the server stops with the launcher";
}

TEST_F(LiveView, APortAlreadyTakenIsRefusedBeforeAnythingIsWritten) {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(sock, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const std::string run = dir("run");
  std::vector<std::string> a = args(run);
  *(std::find(a.begin(), a.end(), "--status-port") + 1) = port;
  const RunResult r = run_atoll(a, 60);
  ::close(sock);
  EXPECT_TRUE(fails_clearly(r, {"--status-port " + port, "in use"}));
  EXPECT_FALSE(fs::exists(run)) << "refused before the run directory was made";
}

}  // namespace
}  // namespace atl::testing
