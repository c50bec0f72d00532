// The launcher's side of the live view (`atoll launch --status-port`; status_model.h says what
// is shown and where each figure comes from, status_server.h how it is served): one object that
// launch() feeds from the places it already stands (its supervisor's tick, each worker's rows
// and phase lines, the restart policy's verdicts), so launch() itself gains a few lines only.
// Without --status-port it does nothing.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/store.h"
#include "atoll/supervise/launcher.h"
#include "atoll/supervise/status_model.h"
#include "atoll/supervise/status_server.h"

namespace atl {

struct LiveViewOptions {
  int port = -1;  // -1: no live view; 0: a free port; else that port
  std::string host = "127.0.0.1";
  int islands = 1, workers_per_island = 1;
};

class LiveView {
 public:
  // Binds the address now (ConfigError if it cannot) and prints the URL on stdout.
  LiveView(const LiveViewOptions& opts, const Config& cfg, double start_time);
  ~LiveView();  // stops serving
  LiveView(const LiveView&) = delete;
  LiveView& operator=(const LiveView&) = delete;

  bool on() const { return server_ != nullptr; }
  // The run's id and folder, and the store its heartbeats are read from (a connection of its own).
  void set_run(const std::string& run_id, const std::string& run_dir, const StoreOptions& store);
  // Every supervisor tick: processes started (a new pid: a restart joins) and ended since the last.
  void tick(const Supervisor& sup);
  void row(int worker, const nlohmann::json& r);
  void phase(int worker, const std::string& phase);
  void set_state(const std::string& state, const std::string& why = "");
  // Before the store goes away: no more reads of it.
  void close_store() { store_closed_ = true; }

 private:
  void refresh();  // on the server's refresh thread

  LiveViewOptions opts_;
  StatusModel model_;
  std::mutex store_mu_;
  std::optional<StoreOptions> store_options_;
  std::unique_ptr<Store> store_;  // the refresh thread's only
  std::atomic<bool> store_closed_{false};
  std::vector<pid_t> pids_;
  std::vector<bool> running_;
  std::unique_ptr<StatusServer> server_;  // last: stopped first
};

}  // namespace atl
