#include "atoll/supervise/status_model.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <set>

namespace atl {

namespace {

double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The pid in a worker's heartbeat token ("HOST:PID:NONCE", dist/membership.h); 0 if none.
pid_t token_pid(const std::string& token) {
  const size_t nonce = token.rfind(':');
  if (nonce == std::string::npos || nonce == 0) return 0;
  const size_t pid = token.rfind(':', nonce - 1);
  if (pid == std::string::npos) return 0;
  try {
    return pid_t(std::stol(token.substr(pid + 1, nonce - pid - 1)));
  } catch (const std::exception&) {
    return 0;
  }
}

int urgency(const std::string& state) {
  const auto* at = std::find_if(std::begin(kWorkerStates), std::end(kWorkerStates),
                                [&](const char* s) { return state == s; });
  return int(at - std::begin(kWorkerStates));
}

}  // namespace

StatusModel::StatusModel(const StatusModelOptions& opts) : opts_(opts) {
  workers_.resize(size_t(opts.islands * opts.workers_per_island));
  for (size_t w = 0; w < workers_.size(); ++w) {
    workers_[w].shown.island = int(w) / opts.workers_per_island;
    workers_[w].shown.rank = int(w) % opts.workers_per_island;
  }
}

void StatusModel::set_run(const std::string& run_id, const std::string& run_dir) {
  std::lock_guard<std::mutex> lock(mu_);
  run_id_ = run_id, run_dir_ = run_dir;
}

void StatusModel::set_state(const std::string& state, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == "failed") return;  // the first failure stands
  state_ = state, why_ = why;
}

void StatusModel::started(int worker, pid_t pid, bool joining) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker& w = workers_.at(size_t(worker));
  if (w.shown.pid != 0) ++w.shown.restarts;
  w.shown.pid = pid;
  w.running = true, w.finished = false, w.joined = joining, w.logged = false;
  w.own_beat_seen = w.own_beat = false;
  w.phase.clear();
}

void StatusModel::ended(int worker, bool finished) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker& w = workers_.at(size_t(worker));
  w.running = false, w.finished = finished;
}

void StatusModel::row(int worker, const nlohmann::json& r) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker& w = workers_.at(size_t(worker));
  w.logged = true;
  if (r.contains("step")) w.shown.step = r["step"].get<int64_t>();
  if (r.contains("outer_step")) w.shown.outer_step = r["outer_step"].get<int64_t>();
  if (r.contains("loss") && r["loss"].is_number()) w.shown.loss = r["loss"].get<double>(), w.loss_time = unix_now_s();
  if (r.contains("comm_bytes")) w.shown.bytes_sent = r["comm_bytes"].get<double>();
}

void StatusModel::phase(int worker, const std::string& phase) {
  static const std::set<std::string> kPhases = {"training", "exchanging", "recovering", "joining"};
  if (!kPhases.count(phase)) return;  // a worker's line is not trusted to name a state
  std::lock_guard<std::mutex> lock(mu_);
  workers_.at(size_t(worker)).phase = phase;
}

void StatusModel::heartbeats(const MembershipSnapshot& s, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  store_error_.clear();
  view_ = s.view;
  const double ttl_ms = opts_.heartbeat_ttl_s * 1000;
  for (size_t i = 0; i < workers_.size() && i < s.heartbeats.size(); ++i) {
    Worker& w = workers_[i];
    const auto& hb = s.heartbeats[i];
    w.own_beat = hb && w.shown.pid != 0 && token_pid(hb->value) == w.shown.pid;
    w.own_beat_seen = w.own_beat_seen || w.own_beat;
    // The key's age whoever wrote it: a killed worker's grows until it lapses.
    w.shown.heartbeat_age_s.reset();
    if (hb && hb->expires_at_ms > 0)
      w.shown.heartbeat_age_s = std::max(0.0, ttl_ms - double(hb->expires_at_ms - now_ms)) / 1000;
  }
}

void StatusModel::store_failed(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  store_error_ = why;
}

RunStatus StatusModel::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  RunStatus s{.run_id = run_id_, .run_dir = run_dir_, .start_time = opts_.start_time, .now = unix_now_s(),
              .state = state_, .why = why_, .steps = opts_.steps, .workers_per_island = opts_.workers_per_island,
              .heartbeat_ttl_s = opts_.heartbeat_ttl_s, .store_error = store_error_};
  if (view_) s.epoch = view_->epoch;
  for (int i = 0; i < opts_.islands; ++i) {
    IslandStatus is{.island = i, .member = view_ && view_->contains(i)};
    double loss_time = -1;
    for (int r = 0; r < opts_.workers_per_island; ++r) {
      const Worker& w = workers_[size_t(i * opts_.workers_per_island + r)];
      WorkerStatus shown = w.shown;
      shown.state = w.finished ? "done"
                    : !w.running || (w.own_beat_seen && !w.own_beat) ? "out"
                    : !w.phase.empty() ? w.phase
                    : !w.logged ? (w.joined ? "joining" : "starting")
                                : "training";
      if (r == 0 || urgency(shown.state) < urgency(is.state)) is.state = shown.state;
      is.step = r == 0 ? shown.step : std::min(is.step, shown.step);
      is.outer_step = r == 0 ? shown.outer_step : std::min(is.outer_step, shown.outer_step);
      if (shown.loss && w.loss_time > loss_time) is.loss = shown.loss, loss_time = w.loss_time;
      is.bytes_sent += shown.bytes_sent;
      if (shown.heartbeat_age_s) is.heartbeat_age_s = std::max(is.heartbeat_age_s.value_or(0), *shown.heartbeat_age_s);
      is.restarts += shown.restarts;
      is.workers.push_back(shown);
    }
    s.islands.push_back(is);
  }
  return s;
}

// JSON: unknown figures are null.
namespace {

template <class T>
nlohmann::json or_null(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json step_or_null(int64_t step) { return step < 0 ? nlohmann::json(nullptr) : nlohmann::json(step); }

}  // namespace

std::string status_json(const RunStatus& s) {
  nlohmann::json islands = nlohmann::json::array();
  for (const IslandStatus& is : s.islands) {
    nlohmann::json workers = nlohmann::json::array();
    for (const WorkerStatus& w : is.workers)
      workers.push_back({{"rank", w.rank}, {"pid", w.pid}, {"state", w.state}, {"step", step_or_null(w.step)},
                         {"outer_step", step_or_null(w.outer_step)}, {"heartbeat_age_s", or_null(w.heartbeat_age_s)},
                         {"last_loss", or_null(w.loss)}, {"bytes_sent", w.bytes_sent}, {"restarts", w.restarts}});
    islands.push_back({{"island", is.island}, {"state", is.state}, {"step", step_or_null(is.step)},
                       {"outer_step", step_or_null(is.outer_step)}, {"heartbeat_age_s", or_null(is.heartbeat_age_s)},
                       {"last_loss", or_null(is.loss)}, {"bytes_sent", is.bytes_sent}, {"restarts", is.restarts},
                       {"member", is.member}, {"workers", workers}});
  }
  const nlohmann::json j = {{"run_id", s.run_id},
                            {"run_dir", s.run_dir},
                            {"start_time", s.start_time},
                            {"now", s.now},
                            {"state", s.state},
                            {"why", s.why},
                            {"steps", s.steps},
                            {"workers_per_island", s.workers_per_island},
                            {"heartbeat_ttl_s", s.heartbeat_ttl_s},
                            {"epoch", or_null(s.epoch)},
                            {"store_error", s.store_error},
                            {"islands", islands}};
  return j.dump() + "\n";
}

// Prometheus text exposition format 0.0.4: "# HELP name text" (text with backslash and line feed
// escaped), "# TYPE name gauge", then "name{label="value",...} number" lines, every family's
// lines together. A figure not known (no heartbeat, no loss yet) has no line.
std::string prometheus_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

namespace {

std::string number_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];  // the shortest text that reads back as the same double
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

class Exposition {
 public:
  void family(const char* name, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
    name_ = name;
  }
  void sample(const std::string& labels, double v) {
    out_ += name_ + (labels.empty() ? "" : "{" + labels + "}") + " " + number_text(v) + "\n";
  }
  std::string text() const { return out_; }

 private:
  std::string out_, name_;
};

std::string label(const char* name, const std::string& value) {
  return std::string(name) + "=\"" + prometheus_label_value(value) + "\"";
}

}  // namespace

std::string status_prometheus(const RunStatus& s) {
  Exposition e;
  e.family("atoll_run_info", "The launched run: its id and folder (always 1).");
  e.sample(label("run_id", s.run_id) + "," + label("run_dir", s.run_dir), 1);
  e.family("atoll_run_start_time_seconds", "When the launcher started, in Unix seconds.");
  e.sample("", s.start_time);
  e.family("atoll_run_failed", "1 once the run has failed (a worker failed and every worker is being stopped).");
  e.sample("", s.state == "failed" ? 1 : 0);
  e.family("atoll_run_steps", "The run's last step (train.steps).");
  e.sample("", double(s.steps));
  if (s.epoch) {
    e.family("atoll_membership_epoch", "The epoch of the newest membership view.");
    e.sample("", double(*s.epoch));
  }
  const auto per_island = [&](const char* name, const char* help, auto&& value) {
    e.family(name, help);
    for (const IslandStatus& is : s.islands)
      if (const std::optional<double> v = value(is)) e.sample(label("island", std::to_string(is.island)), *v);
  };
  const auto step = [](int64_t v) { return v < 0 ? std::nullopt : std::optional<double>(double(v)); };
  per_island("atoll_island_step", "The newest step the island logged (its workers' lowest).",
             [&](const IslandStatus& is) { return step(is.step); });
  per_island("atoll_island_outer_step", "The newest outer step the island logged.",
             [&](const IslandStatus& is) { return step(is.outer_step); });
  per_island("atoll_island_heartbeat_age_seconds", "Seconds since the island's oldest heartbeat was written.",
             [](const IslandStatus& is) { return is.heartbeat_age_s; });
  per_island("atoll_island_last_loss", "The island's newest training loss.",
             [](const IslandStatus& is) { return is.loss; });
  per_island("atoll_island_bytes_sent", "Bytes the island's worker processes sent (comm_bytes; a restart starts at 0).",
             [](const IslandStatus& is) { return std::optional<double>(is.bytes_sent); });
  per_island("atoll_island_restarts", "Times the island's workers were restarted.",
             [](const IslandStatus& is) { return std::optional<double>(is.restarts); });
  per_island("atoll_island_member", "1 while the island is in the newest membership view.",
             [](const IslandStatus& is) { return std::optional<double>(is.member ? 1 : 0); });
  e.family("atoll_island_state", "1 for the island's state, 0 for the others.");
  for (const IslandStatus& is : s.islands)
    for (const char* state : kWorkerStates)
      e.sample(label("island", std::to_string(is.island)) + "," + label("state", state), is.state == state ? 1 : 0);
  return e.text();
}

}  // namespace atl
