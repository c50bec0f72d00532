// The live view of a launched run (`atoll launch --status-port`, docs/islands.md "The live view"):
// what each island is doing, collected where the launcher already stands, and rendered as JSON
// (/status.json), Prometheus text (/metrics) and one self-contained HTML page (/). The transport
// is status_server.h's; everything here is plain data, so the renderers are tested without a socket.
//
// Where each figure comes from (the cleanest source of each; no file is tailed):
//  - step, outer step, last loss, bytes sent (comm_bytes): the worker's metrics rows, which pass
//    through the launcher on their way to metrics.jsonl (row(), as each is written);
//  - the process: started, restarted with --join, ended, from the supervisor and the restart
//    policy (launch.cc), the moment it happens (started(), ended());
//  - the phase a live worker reports (training, exchanging, recovering, joining): its phase lines
//    on the same pipe as its rows (core/worker_phase.h; phase());
//  - liveness as its peers judge it: its heartbeat key in the store (dist/membership.h
//    read_membership), read by the server's refresh thread on its own connection (heartbeats()),
//    so a slow store never stalls the launcher. Heartbeat age = ttl - time left to expiry.
//
// A worker's state, the first that holds:
//   done        its process finished the run (exit 0)
//   out         its process is not running (lost, failed, or waiting to be restarted), or it runs
//               but the heartbeat it wrote lapsed (stopped or hung past fault.heartbeat_ttl_s: its
//               peers count it lost)
//   <phase>     the phase it last reported: joining (a restarted worker waiting for admission or
//               receiving the run's state), recovering (re-forming after an aborted outer step),
//               exchanging (an outer step's exchange), training
//   joining     restarted with --join, no row logged yet
//   starting    no row logged yet (loading, the start-up rendezvous)
//   training
// An island's state is its workers' most urgent one, in the order out, joining, recovering,
// starting, exchanging, training, done.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "atoll/dist/membership.h"

namespace atl {

// The states of the list above, most urgent first (an island takes the first of its workers').
inline constexpr const char* kWorkerStates[] = {"out", "joining", "recovering", "starting", "exchanging", "training", "done"};

struct WorkerStatus {
  int island = 0, rank = 0;
  pid_t pid = 0;                      // of its newest process (0: none yet)
  std::string state = "starting";
  int64_t step = -1, outer_step = -1;  // -1: none logged
  std::optional<double> loss = {};     // of its newest row that had one
  double bytes_sent = 0;               // comm_bytes of its newest row (the process's, cumulative)
  std::optional<double> heartbeat_age_s = {};  // nullopt: no heartbeat key in the store
  int restarts = 0;
};

struct IslandStatus {
  int island = 0;
  std::string state = {};
  int64_t step = -1, outer_step = -1;     // the lowest of its workers'
  std::optional<double> loss = {};        // of the island's newest row that had one
  double bytes_sent = 0;                  // summed over its workers
  std::optional<double> heartbeat_age_s = {};  // the oldest of its workers'
  int restarts = 0;                       // summed over its workers
  bool member = false;                    // in the newest membership view
  std::vector<WorkerStatus> workers = {};
};

struct RunStatus {
  std::string run_id, run_dir;
  double start_time = 0;         // Unix seconds
  double now = 0;                // Unix seconds, when the snapshot was taken
  std::string state = "starting";  // starting, running, then finished, interrupted or failed (the first failure stands)
  std::string why;               // failed: the reason
  int64_t steps = 0;             // train.steps
  int workers_per_island = 1;
  double heartbeat_ttl_s = 0;
  std::optional<uint64_t> epoch = {};  // of the newest membership view
  std::string store_error;        // the store's last read failed: why ("" when it answered)
  std::vector<IslandStatus> islands = {};
};

struct StatusModelOptions {
  int islands = 1, workers_per_island = 1;
  int64_t steps = 0;
  double heartbeat_ttl_s = 5;
  double start_time = 0;  // Unix seconds
};

// The launcher writes, the server's threads read: every method takes the one mutex.
class StatusModel {
 public:
  explicit StatusModel(const StatusModelOptions& opts);

  void set_run(const std::string& run_id, const std::string& run_dir);
  void set_state(const std::string& state, const std::string& why = "");
  void started(int worker, pid_t pid, bool joining);  // worker = island * M + rank
  void ended(int worker, bool finished);              // finished: exit 0
  void row(int worker, const nlohmann::json& r);
  void phase(int worker, const std::string& phase);  // one of core/worker_phase.h's names; others are ignored
  // `now_ms`: Unix ms on this machine's clock, against which the heartbeats' expiries are read.
  void heartbeats(const MembershipSnapshot& s, int64_t now_ms);
  void store_failed(const std::string& why);

  RunStatus snapshot() const;

 private:
  struct Worker {
    WorkerStatus shown;
    bool running = false, finished = false, joined = false, logged = false;
    bool own_beat_seen = false;  // this process's heartbeat was in the store at some read
    bool own_beat = false;       // ... and at the newest read
    std::string phase;           // "" until it reports one
    double loss_time = 0;        // when its newest loss came
  };
  mutable std::mutex mu_;
  StatusModelOptions opts_;
  std::string run_id_, run_dir_, state_ = "starting", why_, store_error_;
  std::optional<View> view_;
  std::vector<Worker> workers_;
};

// Renderings of a snapshot. JSON: unknown figures are null. Prometheus text exposition format
// 0.0.4: one family per figure with its # HELP and # TYPE lines, labels `island` (and `state`).
std::string status_json(const RunStatus& s);
std::string status_prometheus(const RunStatus& s);
// A label value as the text format writes it: backslash, double quote and line feed escaped.
std::string prometheus_label_value(const std::string& value);
// The HTML page: one table of the islands, refreshed from status.json every second by the page's
// own script; it loads nothing else (no network request beyond status.json).
const std::string& status_page();

}  // namespace atl
