// `atoll doctor` (supervise/doctor.h, docs/cluster.md "atoll doctor"): the worker's own flags
// (cli/worker_flags.h), so that a job script checks its hosts by running `atoll doctor` where it
// would run `atoll worker`, plus how many doctors meet and how long they wait.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>

#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/cli/worker_flags.h"
#include "atoll/core/errors.h"
#include "atoll/dist/store.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/supervise/doctor.h"
#include "atoll/supervise/placement.h"
#include "atoll/supervise/run_secrets.h"

namespace atl::cli {

namespace {

struct DoctorFlags {
  WorkerOptions worker;
  ConfigFlags config;
  PlacementFlags placement;
  CLI::Option* peers_given = nullptr;
  int peers = 1;
  double wait_s = 60, timeout_s = 5;
};

// The placement, as `atoll worker` resolves it; a doctor started by hand without one (no
// --island, no scheduler) checks this host as any worker's. Returns whether it has a place.
bool check_placement(DoctorFlags& d, const std::function<void(const DoctorLine&)>& report) {
  WorkerOptions& f = d.worker;
  const PlacementFlags& given = d.placement;
  try {
    bool scheduler = true;  // a malformed variable: resolved (and refused) as the worker does
    try {
      scheduler = !read_scheduler_env([](const char* n) { return std::getenv(n); }).source.empty();
    } catch (const ConfigError&) {
    }
    const bool by_hand = given.island->count() == 0 && !scheduler;
    if (by_hand) {
      if (given.run_id->count() == 0 && !f.run_dir.empty())
        if (const std::optional<std::string> id = read_run_id(f.run_dir)) f.run_id = *id;
      report({.verdict = Verdict::kPass, .check = "placement",
              .found = "none given (no --island, no scheduler's variables): this host is checked as any worker's; run "
                       "id " + f.run_id});
      return false;
    }
    const std::string placement = resolve_worker_placement(f, given);
    if (f.island >= f.islands || f.rank >= f.workers_per_island)
      throw ConfigError("--island " + std::to_string(f.island) + " --rank " + std::to_string(f.rank) + " is outside " +
                        std::to_string(f.islands) + " island(s) x " + std::to_string(f.workers_per_island) +
                        " worker(s); fix: islands are numbered 0..N-1, ranks 0..M-1");
    report({.verdict = Verdict::kPass, .check = "placement", .found = placement.substr(placement.find(':') + 2) +
            "; store " + redact_store_url(f.store_url) + ", run id " + f.run_id});
    return true;
  } catch (const ConfigError& e) {
    report({.verdict = Verdict::kFail, .check = "placement", .found = e.what()});
    return false;
  }
}

// The config, checked as `atoll worker` checks it before it starts anything.
std::optional<Config> check_config(DoctorFlags& d, const std::function<void(const DoctorLine&)>& report) {
  try {
    if (d.config.path.empty()) d.config.path = default_config_path();
    Config cfg = d.config.load();
    check_worker_config(cfg, d.worker.workers_per_island, d.worker.rank);
    report({.verdict = Verdict::kPass, .check = "config",
            .found = (d.config.path.empty() ? std::string("the built-in defaults") : d.config.path) +
                     " parses and passes the worker's checks (memory: " +
                     bytes_text(estimate_memory(cfg, d.worker.workers_per_island).host) + " per worker fits)"});
    return cfg;
  } catch (const Error& e) {
    report({.verdict = Verdict::kFail, .check = "config", .found = e.what()});
    return std::nullopt;
  }
}

int run_doctor_command(DoctorFlags& d) {
  int counts[4] = {};
  auto report = [&counts](const DoctorLine& line) {
    ++counts[int(line.verdict)];
    std::printf("%s\n", doctor_line_text(line).c_str());
    std::fflush(stdout);
  };
  WorkerOptions& f = d.worker;
  const bool placed = check_placement(d, report);
  const std::optional<Config> cfg = check_config(d, report);
  DoctorOptions o{.store_url = f.store_url, .run_id = f.run_id, .run_dir = f.run_dir};
  try {
    read_worker_secrets(f, d.placement.token_file);
  } catch (const ConfigError& e) {
    report({.verdict = Verdict::kFail, .check = "run token", .found = e.what()});
    o.token_unreadable = true;
  }
  o.store_password = f.store_password;
  o.password_from = !f.store_password.empty() ? "ATOLL_STORE_PASSWORD" : "";
  if (!f.store_url.empty() && o.password_from.empty()) {
    try {
      if (!parse_store_url(f.store_url).password.empty()) o.password_from = "the --store URL";
    } catch (const ConfigError&) {  // reported by the store check
    }
  }
  o.run_token = f.run_token;
  if (!f.run_token.empty()) o.token_from = d.placement.token_file.empty() ? "ATOLL_RUN_TOKEN" : "--token-file " + d.placement.token_file;
  o.choose_interface = [&] { return choose_interface(f.store_url, d.placement.iface); };
  o.config = cfg ? &*cfg : nullptr;
  o.islands = f.islands, o.workers_per_island = f.workers_per_island;
  if (placed) o.who = "island " + std::to_string(f.island) + " rank " + std::to_string(f.rank);
  o.peers = d.peers_given->count() > 0 ? d.peers : placed ? f.islands * f.workers_per_island : 1;
  o.peers_wait = std::chrono::milliseconds(int64_t(d.wait_s * 1000));
  o.timeout = std::chrono::milliseconds(int64_t(d.timeout_s * 1000));
  o.report = report;
  run_doctor_checks(o);
  std::printf("doctor: %d pass, %d warn, %d fail%s\n", counts[0], counts[1], counts[2],
              counts[3] ? (", " + std::to_string(counts[3]) + " not checked").c_str() : "");
  return counts[int(Verdict::kFail)] > 0 ? 1 : 0;
}

}  // namespace

Runner add_doctor(CLI::App& app) {
  auto* cmd = app.add_subcommand("doctor", "check from this host, before a multi-host run, what breaks runs: the store "
                                 "and its password, the interface and the links to the other hosts, the clock, the "
                                 "ports, the run token, free disk, the config; PASS/WARN/FAIL per line with the fix "
                                 "(docs/cluster.md); writes nothing in the run");
  auto d = std::make_shared<DoctorFlags>();
  d->config.add_to(cmd, "default: configs/default.toml");
  add_placement_flags(cmd, d->worker, d->placement);
  d->peers_given = cmd->add_option("--peers", d->peers, "doctors that meet through the store and try the links between "
                                   "them, this one included, each started on its host with the same --run-id (default: "
                                   "the run's workers, N x M, when placed; else 1: no meeting)")
                       ->check(whole_number(1, 100000));
  cmd->add_option("--wait", d->wait_s, "seconds to wait for the other doctors, and for their reports (default 60)")
      ->check(finite_number(0.1, 86400.0));
  cmd->add_option("--timeout", d->timeout_s, "seconds each connection and store command may take (default 5)")
      ->check(finite_number(0.1, 3600.0));
  return [cmd, d]() -> int {
    if (!cmd->parsed()) return -1;
    return run_doctor_command(*d);
  };
}

}  // namespace atl::cli
