// `atoll report` through the real binary, and its page opened in headless Chromium (skipped, with
// a message, where chromium is not installed; scripts/setup.sh installs it): a 3-island run with
// a worker killed mid-run gets a page that loads nothing from the network, draws every chart
// (canvas elements), holds as many points in the loss chart as metrics.jsonl has loss rows, and
// places one marker per events.jsonl incident. Bad input gives a page with a note, or a clear
// error, never a crash or an empty page.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

std::string chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (fs::exists(p)) return p;
  return "";
}

// The DOM of `page` after its scripts ran, from headless Chromium (no sandbox: tests run as root).
std::string rendered_dom(const std::string& page, const std::string& profile) {
  const std::string cmd = "timeout 120 " + chromium() +
                          " --headless --no-sandbox --disable-gpu --disable-background-networking "
                          "--disable-component-update --no-first-run --user-data-dir=" + profile +
                          " --virtual-time-budget=10000 --dump-dom file://" + page + " 2>/dev/null";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ::pclose(p);
  return out;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The value of attribute `attr` on the element whose data-chart is `chart` ("" if none).
std::string chart_attr(const std::string& dom, const std::string& chart, const std::string& attr) {
  const std::regex tag("<div[^>]*data-chart=\"" + chart + "\"[^>]*>");
  std::smatch m;
  if (!std::regex_search(dom, m, tag)) return "";
  std::smatch a;
  const std::string t = m.str();
  if (!std::regex_search(t, a, std::regex(attr + "=\"([^\"]*)\""))) return "";
  return a[1].str();
}

// No element loads anything: no src or href to a URL (the acceptance check's pattern) and no
// script that asks for one.
void expect_offline(const std::string& html) {
  EXPECT_FALSE(std::regex_search(html, std::regex("<(script|link|img|iframe)[^>]+(src|href)=")));
  EXPECT_EQ(html.find("fetch("), std::string::npos);
  EXPECT_EQ(html.find("XMLHttpRequest"), std::string::npos);
}

class ReportTest : public CliTest {};

TEST_F(ReportTest, AKilledWorkerRunRendersOfflineWithEveryIncident) {
  const std::string run = dir("run");
  child_env().push_back("ATOLL_FAULT=kill:island=2:outer_step=3:ring_chunk=1");
  const RunResult r = run_atoll({"launch", "--islands", "3", "--config", world().config(), "--run-dir", run,
                                 "--stop-grace", "1", "--set", "train.steps=48", "--set", "diloco.inner_steps=4",
                                 "--set", "train.eval_every=16", "--set", "checkpoint.every=0", "--set",
                                 "fault.heartbeat_s=0.2", "--set", "fault.heartbeat_ttl_s=1", "--set",
                                 "fault.timeout_s=4", "--set", "fault.restart_backoff_s=0.2"},
                                120);
  child_env().pop_back();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const auto events = read_jsonl(run + "/events.jsonl");
  bool lost = false;
  for (const auto& e : events) lost |= e["event"] == "peer_lost" || e["event"] == "restart";
  ASSERT_TRUE(lost) << "the killed worker left no incident: " << read_file(run + "/events.jsonl");
  // The run wrote its own page; `atoll report` writes the same from the files.
  ASSERT_TRUE(fs::exists(run + "/report.html"));
  const std::string page = dir("report.html");
  const RunResult rep = run_atoll({"report", run, "--out", page});
  ASSERT_EQ(rep.exit_code, 0) << rep.describe();
  const std::string html = read_file(page);
  expect_offline(html);
  if (chromium().empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium): rendering not checked";
  const std::string dom = rendered_dom(page, dir("profile"));
  ASSERT_NE(dom.find("data-rendered"), std::string::npos) << dom.substr(0, 2000);
  EXPECT_EQ(dom.find("id=\"report-error\""), std::string::npos) << dom.substr(0, 3000);
  // Loss, lr, grad_norm, tokens/s, bytes sent, expert load x4 and the timeline, each a canvas.
  EXPECT_GE(count(dom, "<canvas"), 8);
  // The loss chart: a line per island and the evaluations as points, one point per row.
  int loss_rows = 0, val_rows = 0;
  std::map<std::string, double> last_time;  // per worker: time_s never goes back, even across a restart
  for (const auto& row : read_jsonl(run + "/metrics.jsonl")) {
    loss_rows += row.contains("loss");
    val_rows += row.contains("val_loss");
    if (!row.contains("time_s") || !row.contains("island")) continue;
    const std::string who = row["island"].dump() + "." + row.value("rank", nlohmann::json(0)).dump();
    const double t = row["time_s"].get<double>();
    if (last_time.count(who)) {
      EXPECT_GE(t, last_time[who]) << who << " at step " << row.value("step", -1);
    }
    last_time[who] = t;
  }
  EXPECT_GT(val_rows, 0);
  EXPECT_EQ(chart_attr(dom, "loss", "data-points"), std::to_string(loss_rows + val_rows));
  // Every series of the loss chart has its own legend label (val_loss's points name themselves).
  std::set<std::string> labels;
  int n_labels = 0;
  std::stringstream legend(chart_attr(dom, "loss", "data-labels"));
  for (std::string l; std::getline(legend, l, '|'); ++n_labels) labels.insert(l);
  EXPECT_GT(n_labels, 1);
  EXPECT_EQ(size_t(n_labels), labels.size()) << chart_attr(dom, "loss", "data-labels");
  EXPECT_EQ(chart_attr(dom, "lr", "data-points"), std::to_string(loss_rows));
  EXPECT_EQ(chart_attr(dom, "timeline", "data-incidents"), std::to_string(events.size()));
  EXPECT_EQ(count(dom, "class=\"incident\""), int(events.size()));
}

TEST_F(ReportTest, DamagedFilesGiveAPageWithANote) {
  const std::string run = copy_of_base_run();
  {
    std::ofstream m(run + "/metrics.jsonl", std::ios::app);
    m << "{\"step\": 5, \"tokens\": 640, \"loss\": 5.1, \"new_field\": 3}\n{\"step\": 6, \"loss\": 5.";  // cut short
  }
  const RunResult r = run_atoll({"report", run, "--out", dir("damaged.html")});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string html = read_file(dir("damaged.html"));
  EXPECT_NE(html.find("cut short?"), std::string::npos);
  EXPECT_NE(html.find("new_field"), std::string::npos);
  // No metrics at all: the page says so.
  const std::string bare = dir("bare");
  fs::create_directories(bare);
  fs::copy_file(run + "/config.toml", bare + "/config.toml");
  const RunResult b = run_atoll({"report", bare});
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  EXPECT_NE(read_file(bare + "/report.html").find("no metrics.jsonl"), std::string::npos);
  // A folder that is no run: one clear error.
  const RunResult n = run_atoll({"report", dir("nothing-here")});
  EXPECT_TRUE(fails_clearly(n, {"nothing-here", "not a run directory", "fix:"}));
  if (chromium().empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium): rendering not checked";
  for (const std::string& page : {dir("damaged.html"), bare + "/report.html"}) {
    const std::string dom = rendered_dom(page, dir("profile"));
    EXPECT_NE(dom.find("data-rendered"), std::string::npos) << page;
    EXPECT_EQ(dom.find("id=\"report-error\""), std::string::npos) << dom.substr(0, 3000);
    EXPECT_NE(dom.find("class=\"note\""), std::string::npos) << page;
  }
}

}  // namespace
}  // namespace atl::testing
