// The live view's model and renderings (supervise/status_model.h), without a socket: the states
// a worker's process, rows, phase and heartbeat give, an island's most urgent state, JSON with
// nulls for what is not known, and Prometheus text that a strict reading of the exposition
// format (0.0.4) accepts, with label values escaped.
#include "atoll/supervise/status_model.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace atl {
namespace {

// Two islands of two workers.
const StatusModelOptions kTwoByTwo{.islands = 2, .workers_per_island = 2, .steps = 40, .heartbeat_ttl_s = 2, .start_time = 1000};

// Every worker started (pids 100 + w).
void start_all(StatusModel& m) {
  for (int w = 0; w < 4; ++w) m.started(w, 100 + w, false);
}

// Heartbeats of the given workers (token "host:PID:nonce"), written `age_ms` ago with a 2 s ttl.
MembershipSnapshot beats(const std::map<int, pid_t>& pids, int64_t now_ms, int64_t age_ms) {
  MembershipSnapshot s;
  s.heartbeats.resize(4);
  for (const auto& [w, pid] : pids)
    s.heartbeats[size_t(w)] = Store::Expiring{.value = "h:" + std::to_string(pid) + ":7", .expires_at_ms = now_ms - age_ms + 2000};
  s.view = View{.epoch = 3, .islands = {0, 1}, .joining = {}, .tokens = {}};
  return s;
}

TEST(StatusModel, StatesFollowTheProcessItsRowsAndItsHeartbeat) {
  StatusModel m(kTwoByTwo);
  start_all(m);
  EXPECT_EQ(m.snapshot().islands[0].state, "starting");
  for (int w = 0; w < 4; ++w) m.row(w, {{"step", 5 + w}, {"outer_step", 1}, {"loss", 4.0 + w}, {"comm_bytes", 1000 * (w + 1)}});
  m.heartbeats(beats({{0, 100}, {1, 101}, {2, 102}, {3, 103}}, 50000, 500), 50000);
  RunStatus s = m.snapshot();
  ASSERT_EQ(s.islands.size(), 2u);
  const IslandStatus& i1 = s.islands[1];
  EXPECT_EQ(i1.state, "training");
  EXPECT_EQ(i1.step, 7);  // the lowest of its workers' (7, 8)
  EXPECT_EQ(i1.outer_step, 1);
  EXPECT_DOUBLE_EQ(i1.bytes_sent, 3000 + 4000);
  ASSERT_TRUE(i1.heartbeat_age_s.has_value());
  EXPECT_NEAR(*i1.heartbeat_age_s, 0.5, 1e-9);
  EXPECT_TRUE(i1.member);
  EXPECT_EQ(s.epoch, 3u);

  // Island 1 rank 1 killed: out at once (its process ended), while its old heartbeat still ages.
  m.ended(3, false);
  m.heartbeats(beats({{0, 100}, {1, 101}, {2, 102}, {3, 103}}, 51000, 1500), 51000);
  s = m.snapshot();
  EXPECT_EQ(s.islands[1].state, "out") << "an island is its most urgent worker's state";
  EXPECT_EQ(s.islands[1].workers[0].state, "training");
  EXPECT_NEAR(*s.islands[1].heartbeat_age_s, 1.5, 1e-9);
  EXPECT_EQ(s.islands[0].state, "training");

  // Restarted (--join): joining until it logs a row, though the dead one's heartbeat lingers.
  m.started(3, 203, true);
  EXPECT_EQ(m.snapshot().islands[1].state, "joining");
  EXPECT_EQ(m.snapshot().islands[1].restarts, 1);
  m.phase(3, "recovering");
  EXPECT_EQ(m.snapshot().islands[1].state, "recovering") << "a reported phase stands over the guess";
  m.phase(3, "out\"<b>");
  EXPECT_EQ(m.snapshot().islands[1].state, "recovering") << "only the phases a worker reports are taken";
  m.phase(3, "training");
  m.row(3, {{"step", 9}});
  m.heartbeats(beats({{0, 100}, {1, 101}, {2, 102}, {3, 203}}, 52000, 100), 52000);
  EXPECT_EQ(m.snapshot().islands[1].state, "training");

  // A live process whose own heartbeat lapsed (stopped past the ttl): out.
  m.heartbeats(beats({{0, 100}, {2, 102}, {3, 203}}, 53000, 100), 53000);
  s = m.snapshot();
  EXPECT_EQ(s.islands[0].workers[1].state, "out");
  EXPECT_FALSE(s.islands[0].workers[1].heartbeat_age_s.has_value());
  EXPECT_EQ(s.islands[0].state, "out");

  m.ended(2, true), m.ended(3, true);
  EXPECT_EQ(m.snapshot().islands[1].state, "done");
}

TEST(StatusModel, JsonHasEveryFieldAndNullsForWhatIsNotKnown) {
  StatusModel m(kTwoByTwo);
  start_all(m);
  m.set_run("run-1", "/runs/a");
  m.row(0, {{"step", 3}, {"loss", 5.5}});
  const nlohmann::json j = nlohmann::json::parse(status_json(m.snapshot()));
  EXPECT_EQ(j["run_id"], "run-1");
  EXPECT_EQ(j["run_dir"], "/runs/a");
  EXPECT_EQ(j["start_time"], 1000.0);
  EXPECT_EQ(j["state"], "starting");
  EXPECT_TRUE(j["epoch"].is_null());
  ASSERT_EQ(j["islands"].size(), 2u);
  const nlohmann::json& i0 = j["islands"][0];
  for (const char* key : {"island", "state", "step", "outer_step", "heartbeat_age_s", "last_loss", "bytes_sent", "restarts",
                          "member", "workers"})
    EXPECT_TRUE(i0.contains(key)) << key;
  EXPECT_TRUE(i0["step"].is_null()) << "rank 1 logged nothing yet: the island's lowest step is not known";
  EXPECT_EQ(i0["workers"][0]["step"], 3);
  EXPECT_EQ(i0["last_loss"], 5.5);
  EXPECT_TRUE(i0["heartbeat_age_s"].is_null());
  EXPECT_TRUE(j["islands"][1]["last_loss"].is_null());
}

// A strict reading of the text exposition format: every family has one # HELP and one # TYPE
// line before its samples, its samples are together, names and label names are valid, label
// values are quoted with only \\, \" and \n escaped, and every value is a number.
::testing::AssertionResult valid_exposition(const std::string& text, std::map<std::string, std::vector<std::string>>* samples) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter|untyped))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*\})? ([-+]?[0-9.eE+-]+|NaN|[+-]Inf))");
  if (text.empty() || text.back() != '\n') return ::testing::AssertionFailure() << "no final line feed";
  std::istringstream in(text);
  std::string line, family;
  std::set<std::string> done;
  bool typed = false;
  for (int n = 1; std::getline(in, line); ++n) {
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      if (done.count(m[1])) return ::testing::AssertionFailure() << "line " << n << ": family again: " << line;
      if (!family.empty()) done.insert(family);
      family = m[1], typed = false;
    } else if (std::regex_match(line, m, type)) {
      if (m[1] != family || typed) return ::testing::AssertionFailure() << "line " << n << ": TYPE out of place: " << line;
      typed = true;
    } else if (std::regex_match(line, m, sample)) {
      if (m[1] != family || !typed) return ::testing::AssertionFailure() << "line " << n << ": sample outside its family: " << line;
      (*samples)[family].push_back(line);
    } else {
      return ::testing::AssertionFailure() << "line " << n << " is not of the format: " << line;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(StatusModel, PrometheusTextIsValidAndEscapesLabelValues) {
  EXPECT_EQ(prometheus_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  StatusModel m(kTwoByTwo);
  start_all(m);
  m.set_run("run-1", "/runs/odd \"dir\"\\with\nbreak");
  m.row(0, {{"step", 3}, {"outer_step", 0}, {"loss", 5.5}, {"comm_bytes", 123}});
  m.heartbeats(beats({{0, 100}}, 9000, 250), 9000);
  m.ended(2, false);
  const std::string text = status_prometheus(m.snapshot());
  std::map<std::string, std::vector<std::string>> samples;
  ASSERT_TRUE(valid_exposition(text, &samples)) << text;
  EXPECT_NE(text.find(R"(run_dir="/runs/odd \"dir\"\\with\nbreak")"), std::string::npos) << text;
  EXPECT_EQ(samples["atoll_island_bytes_sent"],
            (std::vector<std::string>{R"(atoll_island_bytes_sent{island="0"} 123)", R"(atoll_island_bytes_sent{island="1"} 0)"}));
  EXPECT_EQ(samples["atoll_island_heartbeat_age_seconds"],
            (std::vector<std::string>{R"(atoll_island_heartbeat_age_seconds{island="0"} 0.25)"}))
      << "island 1 has no heartbeat: no sample";
  EXPECT_TRUE(samples["atoll_island_step"].empty()) << "no island has every worker's step yet";
  EXPECT_EQ(samples["atoll_island_state"].size(), 2 * std::size(kWorkerStates));
  EXPECT_NE(text.find(R"(atoll_island_state{island="1",state="out"} 1)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(atoll_island_state{island="0",state="starting"} 1)"), std::string::npos) << text;
  EXPECT_NE(text.find("atoll_run_failed 0\n"), std::string::npos);
  m.set_state("failed", "island 1 rank 0 failed");
  EXPECT_NE(status_prometheus(m.snapshot()).find("atoll_run_failed 1\n"), std::string::npos);
}

TEST(StatusModel, ThePageLoadsNothingButStatusJson) {
  const std::string& page = status_page();
  EXPECT_NE(page.find("<table"), std::string::npos);
  EXPECT_NE(page.find("fetch(\"status.json\""), std::string::npos);
  for (const char* outside : {"http://", "https://", "//cdn", "<link", "src=", "@import", "url("})
    EXPECT_EQ(page.find(outside), std::string::npos) << outside;
  EXPECT_EQ(page.find("innerHTML"), std::string::npos) << "values go in as text, never markup";
}

}  // namespace
}  // namespace atl
