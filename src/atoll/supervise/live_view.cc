#include "atoll/supervise/live_view.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "atoll/core/errors.h"
#include "atoll/dist/membership.h"

namespace atl {

LiveView::LiveView(const LiveViewOptions& opts, const Config& cfg, double start_time)
    : opts_(opts),
      model_({.islands = opts.islands, .workers_per_island = opts.workers_per_island, .steps = cfg.train.steps,
              .heartbeat_ttl_s = cfg.fault.heartbeat_ttl_s, .start_time = start_time}),
      pids_(size_t(opts.islands * opts.workers_per_island), 0),
      running_(pids_.size(), false) {
  if (opts.port < 0) return;
  server_ = std::make_unique<StatusServer>(
      model_, StatusServerOptions{.host = opts.host, .port = opts.port, .refresh = [this] { refresh(); }});
  std::printf("live view: %s (status.json, metrics, health)\n", server_->url().c_str());
  std::fflush(stdout);
}

LiveView::~LiveView() { server_.reset(); }  // before the members its threads use

void LiveView::set_run(const std::string& run_id, const std::string& run_dir, const StoreOptions& store) {
  model_.set_run(run_id, std::filesystem::absolute(run_dir).string());
  std::lock_guard<std::mutex> lock(store_mu_);
  store_options_ = store;
  // Its own connection, quick to give up: the launcher restarts its store, and the view says so
  // meanwhile rather than waiting the run's fault.timeout_s.
  store_options_->timeout = std::min(store_options_->timeout, std::chrono::milliseconds(1000));
}

void LiveView::refresh() {
  std::optional<StoreOptions> options;
  {
    std::lock_guard<std::mutex> lock(store_mu_);
    options = store_options_;
  }
  if (!options || store_closed_) return;
  try {
    if (!store_) store_ = std::make_unique<Store>(*options);
    const MembershipSnapshot s = read_membership(*store_, opts_.islands, opts_.workers_per_island);
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
    model_.heartbeats(s, now_ms);
  } catch (const Error& e) {
    store_.reset();  // connect again at the next refresh
    model_.store_failed(e.what());
  }
}

void LiveView::tick(const Supervisor& sup) {
  if (!on()) return;
  for (size_t i = 0; i < pids_.size(); ++i) {
    const bool running = sup.running(int(i));
    if (running && sup.pid(int(i)) != pids_[i]) {
      model_.started(int(i), sup.pid(int(i)), /*joining=*/pids_[i] != 0);  // a restart joins the run
      pids_[i] = sup.pid(int(i));
    } else if (!running && running_[i]) {
      const ExitStatus& e = sup.status(int(i));
      model_.ended(int(i), e.exited && e.signal == 0 && e.exit_code == 0);
    }
    running_[i] = running;
  }
}

void LiveView::row(int worker, const nlohmann::json& r) {
  if (on()) model_.row(worker, r);
}

void LiveView::phase(int worker, const std::string& phase) {
  if (on()) model_.phase(worker, phase);
}

void LiveView::set_state(const std::string& state, const std::string& why) {
  if (on()) model_.set_state(state, why);
}

}  // namespace atl
