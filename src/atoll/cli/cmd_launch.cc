// The flags of `atoll launch` (the local supervisor of a multi-island run; its policy is
// supervise/launch.h) and `atoll worker` (one process of it, on any host; train/island_trainer.h).
// docs/islands.md describes both.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>

#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/cli/worker_flags.h"
#include "atoll/config/key_effect.h"
#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/supervise/launch.h"
#include "atoll/train/island_trainer.h"
#include "atoll/train/resume_config.h"
#include "atoll/train/self_rejoin.h"

namespace atl::cli {

// Islands and workers per island `atoll launch` starts on one machine (each a process).
constexpr int kMaxLocalIslands = 256;
constexpr int kIntMax = std::numeric_limits<int>::max();

namespace {

// `atoll worker`'s place in the run (cli/worker_flags.h), printed with the address it listens on.
void place_worker(WorkerOptions& f, const PlacementFlags& given) {
  const std::string placement = resolve_worker_placement(f, given);
  const ListenAddress listen = choose_interface(f.store_url, given.iface);
  f.listen_address = listen.address;
  if (!f.quiet) {
    std::printf("%s; store %s, run id %s; listening on %s (%s, %s)\n", placement.c_str(), f.store_url.c_str(),
                f.run_id.c_str(), listen.address.c_str(), listen.iface.empty() ? "no interface" : listen.iface.c_str(),
                listen.why.c_str());
    std::fflush(stdout);
  }
}

int run_worker_command(WorkerOptions& fo, ConfigFlags& config, const PlacementFlags& given) {
  WorkerOptions* f = &fo;
  // Flags that cannot go together are named before any path is looked at.
  if (f->join && !f->resume_from.empty())
    throw ConfigError("--join takes the run's state from a live island, --resume-from from a checkpoint; fix: give one");
  if (!f->run_dir.empty()) check_output_dir(f->run_dir, "--run-dir");
  if (!f->resume_from.empty()) check_input_dir(f->resume_from, "--resume-from", "pass a checkpoint of the run");
  place_worker(*f, given);
  read_worker_secrets(*f, given.token_file);
  if (f->island >= f->islands)
    throw ConfigError("--island " + std::to_string(f->island) + " is not below --islands " + std::to_string(f->islands) +
                      "; fix: islands are numbered 0..N-1");
  if (f->rank >= f->workers_per_island)
    throw ConfigError("--rank " + std::to_string(f->rank) + " is not below --workers-per-island " +
                      std::to_string(f->workers_per_island) + "; fix: ranks are numbered 0..M-1");
  if (config.path.empty()) config.path = default_config_path();
  f->stop_on_signal = true;  // SIGTERM (preemption, or the launcher stopping it): a checkpoint, then kWorkerPreemptedExit
  WorkerResult r;
  try {
    const Config cfg = config.load();
    if (!f->quiet)  // a worker `atoll launch` started: the launcher warned already
      warn_idle_keys(cfg, config.given,
                     {.islands = true, .n_islands = f->islands, .workers_per_island = f->workers_per_island});
    r = run_worker_rejoining(cfg, *f);  // one started by hand rejoins by itself (fault.rejoin_timeout_s)
  } catch (const LeftRun& e) {  // the launcher restarts it with --join
    std::fprintf(stderr, "atoll: error: %s; fix: restart this worker with --join (atoll launch does)\n", e.what());
    return kWorkerRejoinExit;
  }
  if (r.finished_before_admission) {
    if (!f->quiet) std::printf("island %d rank %d: the run finished before this worker was admitted; it trained nothing\n", f->island, f->rank);
    return 0;
  }
  if (!f->quiet)
    std::printf("island %d rank %d: %s%ld steps, %ld outer steps, loss %.4f -> %.4f, theta %s\n", f->island, f->rank,
                r.stopped ? "stopped by a signal after " : "", long(r.steps), long(r.outer_steps), r.first_loss, r.final_loss, r.theta_hash.c_str());
  return r.stopped ? kWorkerPreemptedExit : 0;
}

}  // namespace

Runner add_worker(CLI::App& app) {
  auto* cmd = app.add_subcommand("worker", "one worker process of a multi-island run (started by `atoll launch`, or by hand on any host)");
  auto f = std::make_shared<WorkerOptions>();
  auto config = std::make_shared<ConfigFlags>();
  config->add_to(cmd, "default: configs/default.toml");
  auto given = std::make_shared<PlacementFlags>();
  add_placement_flags(cmd, *f, *given);
  cmd->add_option("--metrics-fd", f->metrics_fd, "write metrics rows to this file descriptor (used by `atoll launch`)")
      ->check(whole_number(0, kIntMax));
  cmd->add_flag("--quiet", f->quiet, "no log lines");
  cmd->add_option("--resume-from", f->resume_from, "continue from this checkpoint of the run (used by `atoll launch --resume`)");
  cmd->add_option("--init-from", f->init_from, "a fresh start's weights from this Hugging Face folder (passed by `atoll launch --init-from`)");
  cmd->add_flag("--join", f->join, "rejoin a running run: a restarted worker takes the run's state from a live island at the next outer step");
  return [cmd, f, config, given]() -> int {
    if (!cmd->parsed()) return -1;
    // Every error a retry would repeat (a flag, the config, the placement) exits kWorkerConfigExit,
    // so that a scheduler's retry policy tells it from a preemption (docs/cluster.md).
    try {
      return run_worker_command(*f, *config, *given);
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "atoll: error: %s\n", e.what());
      return kWorkerConfigExit;
    }
  };
}

namespace {

// The flags fill LaunchOptions directly, but for the config (loaded once parsed) and the grace
// (given in seconds).
struct LaunchFlags {
  ConfigFlags config;
  LaunchOptions launch;
  double stop_grace_s = 5.0;
};

}  // namespace

Runner add_launch(CLI::App& app) {
  auto* cmd = app.add_subcommand("launch", "run N islands (x M workers) on this machine: DiLoCo across islands");
  auto f = std::make_shared<LaunchFlags>();
  f->config.add_to(cmd, "default: configs/default.toml; with --resume: the run's config.toml");
  cmd->add_option("--islands", f->launch.islands, "N: islands (DiLoCo across them)")->required()->check(whole_number(1, kMaxLocalIslands));
  cmd->add_option("--workers-per-island", f->launch.workers_per_island, "M: workers per island (data parallel inside it)")
      ->check(whole_number(1, kMaxLocalIslands));
  cmd->add_option("--store", f->launch.store,
                  "use this Redis store, redis://HOST:PORT or redis://:PASSWORD@HOST:PORT (default: start redis-server "
                  "on loopback with a fresh password)");
  cmd->add_option("--run-dir", f->launch.run_dir, "run directory (default: runs/<date-time>)");
  cmd->add_option("--stop-grace", f->stop_grace_s, "seconds a stopped worker gets before SIGKILL")->check(finite_number(0.0, 1e6));
  cmd->add_flag("--resume", f->launch.resume,
                "continue the run in --run-dir from its newest checkpoint, with its own config.toml (same --islands and "
                "--workers-per-island); --set may change " + resume_safe_keys_text() +
                    "; a run without a checkpoint yet starts over from step 0");
  cmd->add_flag("--allow-config-change", f->launch.allow_config_change,
                "with --resume: let --set or --config change other keys too (never a [model] key)");
  cmd->add_option("--init-from", f->launch.init_from,
                  "a new run starts from this Hugging Face model folder (docs/weights.md): its [model] and weights");
  cmd->add_option("--status-port", f->launch.status_port,
                  "serve the live view of the islands on this port while the run trains: / (a page), /status.json, "
                  "/metrics (Prometheus), /health; 0 picks a free port (printed); default: none")
      ->check(whole_number(0, 65535));
  auto* status_host = cmd->add_option("--status-host", f->launch.status_host,
                  "the address the live view listens on (default 127.0.0.1: this machine only; 0.0.0.0: every "
                  "interface, readable by anyone who reaches it)");
  cmd->add_flag("--print-config", f->launch.print_config,
                "print the whole resolved config (always saved as RUN_DIR/config.toml)");
  return [cmd, f, status_host]() -> int {
    if (!cmd->parsed()) return -1;
    if (status_host->count() > 0 && f->launch.status_port < 0)
      throw ConfigError("--status-host without --status-port; fix: add --status-port PORT (0 picks a free one)");
    f->launch.run_dir = run_dir_or_default(f->launch.run_dir, f->launch.resume);
    refuse_init_from_resume(f->launch.init_from, f->launch.resume);
    f->launch.config = f->config.load_for_run(f->launch.run_dir, f->launch.resume);
    apply_init_from(f->launch.config, f->launch.init_from, f->config.overrides);
    warn_idle_keys(f->launch.config, f->config.given,
                   {.islands = true,
                    .n_islands = f->launch.islands,
                    .workers_per_island = f->launch.workers_per_island,
                    .supervised = true});
    f->launch.config_path = f->config.path;
    f->launch.stop_grace = std::chrono::milliseconds(int64_t(f->stop_grace_s * 1000));
    return launch(f->launch);
  };
}

}  // namespace atl::cli
