// The live view's transport (supervise/status_server.h) over real loopback HTTP: every path
// answers with its content type, /health turns 503 once the run has failed, the refresh runs on
// its own thread, and an address already taken is refused at once with a one-line ConfigError.
#include "atoll/supervise/status_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "atoll/core/errors.h"

namespace atl {
namespace {

TEST(StatusServer, ServesEveryPathOverLoopback) {
  StatusModel model({.islands = 2, .workers_per_island = 1, .steps = 10, .heartbeat_ttl_s = 1, .start_time = 5});
  model.set_run("run-7", "/runs/r");
  model.started(0, 42, false);
  model.row(0, {{"step", 4}, {"loss", 3.25}});
  std::atomic<int> refreshed{0};
  StatusServer server(model, {.port = 0, .refresh_every = std::chrono::milliseconds(10), .refresh = [&] { ++refreshed; }});
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(server.port()) + "/");
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);  // a loaded machine; nothing is timed

  auto res = client.Get("/status.json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const nlohmann::json j = nlohmann::json::parse(res->body);
  EXPECT_EQ(j["run_id"], "run-7");
  EXPECT_EQ(j["islands"][0]["step"], 4);
  EXPECT_EQ(j["islands"][0]["state"], "training");
  EXPECT_EQ(j["islands"][1]["state"], "out") << "never started";

  res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(res->body.find("atoll_island_step{island=\"0\"} 4\n"), std::string::npos) << res->body;

  res = client.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, status_page());

  res = client.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok\n");
  model.set_state("failed", "island 1 rank 0 failed (exit 1)");
  res = client.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "failed: island 1 rank 0 failed (exit 1)\n");

  res = client.Get("/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (refreshed < 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GE(refreshed, 2) << "the refresh runs again and again on its own thread";
}

TEST(StatusServer, ATakenPortIsRefusedWithTheFix) {
  StatusModel model({});
  StatusServer first(model, {.port = 0});
  try {
    StatusServer second(model, {.port = first.port()});
    FAIL() << "a second server bound the same port";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--status-port " + std::to_string(first.port())), std::string::npos) << what;
    EXPECT_NE(what.find("Address already in use"), std::string::npos) << what;
    EXPECT_NE(what.find("fix"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace atl
