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
#include "atoll/config/key_effect.h"
#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/dist/listen_address.h"
#include "atoll/dist/store.h"
#include "atoll/supervise/launch.h"
#include "atoll/supervise/placement.h"
#include "atoll/supervise/run_secrets.h"
#include "atoll/train/island_trainer.h"
#include "atoll/train/resume_config.h"
#include "atoll/train/self_rejoin.h"

namespace atl::cli {

// Islands and workers per island `atoll launch` starts on one machine (each a process).
constexpr int kMaxLocalIslands = 256;
constexpr int kIntMax = std::numeric_limits<int>::max();

namespace {

// The worker's placement and store flags, to tell given from default (a scheduler fills the others).
struct WorkerFlagsGiven {
  CLI::Option *island, *rank, *islands, *workers_per_island, *store, *run_id;
  const int* first_island;
};

std::optional<int> given_int(const CLI::Option* o, int value) {
  return o->count() > 0 ? std::optional<int>(value) : std::nullopt;
}

// The address to listen on for the peers (dist/listen_address.h): --iface, else Gloo's
// GLOO_SOCKET_IFNAME (one name), else the interface that routes to the store.
ListenAddress choose_interface(const std::string& store_url, const std::string& iface) {
  if (!iface.empty()) return choose_listen_address(store_url, iface, "--iface");
  const char* gloo = std::getenv("GLOO_SOCKET_IFNAME");
  if (gloo == nullptr || *gloo == '\0') return choose_listen_address(store_url);
  if (std::string(gloo).find(',') != std::string::npos)
    throw ConfigError(std::string("GLOO_SOCKET_IFNAME=") + gloo + " names several interfaces; atoll listens on one; fix: "
                      "name one interface, or pass --iface NAME");
  return choose_listen_address(store_url, gloo, "GLOO_SOCKET_IFNAME");
}

// The placement from the flags, else the scheduler's environment (supervise/placement.h): fills
// island, rank, islands, workers_per_island, and the store and run id where no flag gave them;
// then the address to listen on.
void place_worker(WorkerOptions& f, const WorkerFlagsGiven& given, const std::string& iface) {
  // A worker placed by its flags (as `atoll launch` starts them, perhaps inside a Slurm job) does
  // not fail on a scheduler variable it would not use.
  SchedulerEnv env;
  try {
    env = read_scheduler_env([](const char* name) { return std::getenv(name); });
  } catch (const ConfigError&) {
    if (given.island->count() == 0 || given.store->count() == 0) throw;
  }
  const Placement p = resolve_placement({.island = given_int(given.island, f.island),
                                         .rank = given_int(given.rank, f.rank),
                                         .islands = given_int(given.islands, f.islands),
                                         .workers_per_island = given_int(given.workers_per_island, f.workers_per_island),
                                         .first_island = *given.first_island},
                                        env);
  f.island = p.island, f.rank = p.rank, f.islands = p.islands, f.workers_per_island = p.workers_per_island;
  if (given.store->count() == 0) {
    if (env.store_url.empty())
      throw ConfigError("--store is required" + std::string(env.source.empty() ? "" : " (" + env.source + " names no store)") +
                        "; fix: pass --store redis://HOST:PORT, or set MASTER_ADDR and MASTER_PORT to the store's host "
                        "and port");
    f.store_url = env.store_url;
  }
  if (given.run_id->count() == 0 && f.run_id == "atoll" && !env.run_id.empty()) f.run_id = env.run_id;
  const ListenAddress listen = choose_interface(f.store_url, iface);
  f.listen_address = listen.address;
  if (!f.quiet) {
    std::printf("%s; store %s, run id %s; listening on %s (%s, %s)\n", describe_placement(p, env).c_str(),
                f.store_url.c_str(), f.run_id.c_str(), listen.address.c_str(),
                listen.iface.empty() ? "no interface" : listen.iface.c_str(), listen.why.c_str());
    std::fflush(stdout);
  }
}

int run_worker_command(WorkerOptions& fo, ConfigFlags& config, const WorkerFlagsGiven& given, const std::string& token_file,
                       const std::string& iface) {
  WorkerOptions* f = &fo;
  // Flags that cannot go together are named before any path is looked at.
  if (f->join && !f->resume_from.empty())
    throw ConfigError("--join takes the run's state from a live island, --resume-from from a checkpoint; fix: give one");
  if (!f->run_dir.empty()) check_output_dir(f->run_dir, "--run-dir");
  if (!f->resume_from.empty()) check_input_dir(f->resume_from, "--resume-from", "pass a checkpoint of the run");
  // A launched run's id is in its folder: `--run-dir` alone joins it.
  if (given.run_id->count() == 0 && !f->run_dir.empty())
    if (const std::optional<std::string> id = read_run_id(f->run_dir)) f->run_id = *id;
  place_worker(*f, given, iface);
  // Secrets come from a file or the environment, never the command line (`ps` shows it to all).
  if (!token_file.empty()) f->run_token = read_secret_file(token_file, "--token-file");
  else if (const char* t = std::getenv("ATOLL_RUN_TOKEN")) f->run_token = t;
  if (const char* p = std::getenv("ATOLL_STORE_PASSWORD"); p && parse_store_url(f->store_url).password.empty())
    f->store_password = p;
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
  auto* store = cmd->add_option("--store", f->store_url,
                                "rendezvous store, redis://HOST:PORT or redis://:PASSWORD@HOST:PORT (or the password in "
                                "ATOLL_STORE_PASSWORD); default under a scheduler: redis://MASTER_ADDR:MASTER_PORT, or "
                                "port 6379 of Slurm's first host (docs/cluster.md)");
  auto token_file = std::make_shared<std::string>();
  cmd->add_option("--token-file", *token_file,
                  "the run's token (RUN_DIR/run.token, written by `atoll launch`); default: ATOLL_RUN_TOKEN");
  // Placement: the flags, else a scheduler's environment (supervise/placement.h).
  auto* island = cmd->add_option("--island", f->island, "this worker's island, 0..N-1 (default: from Slurm, torchrun or "
                                 "a Kubernetes Indexed Job: docs/cluster.md)")->check(whole_number(0, kIntMax - 1));
  auto* rank = cmd->add_option("--rank", f->rank, "this worker's rank inside its island, 0..M-1 (default: as --island)")
                   ->check(whole_number(0, kIntMax - 1));
  auto* islands = cmd->add_option("--islands", f->islands, "N: islands in the run (default under Slurm or torchrun: "
                                  "the task count / M)")->check(whole_number(1, kIntMax));
  auto* per_island = cmd->add_option("--workers-per-island", f->workers_per_island, "M: workers per island")
                         ->check(whole_number(1, kIntMax));
  auto iface = std::make_shared<std::string>();
  cmd->add_option("--iface", *iface, "listen for the peers on this network interface's IPv4 address (default: "
                  "GLOO_SOCKET_IFNAME, one name, else the interface that routes to the store)");
  auto first_island = std::make_shared<int>(0);
  cmd->add_option("--first-island", *first_island, "K: a scheduler's task t is island K + t / M (a site whose "
                  "scheduler numbers its tasks from 0 while other sites hold islands 0..K-1); default 0")
      ->check(whole_number(0, kIntMax - 1));
  auto* run_id = cmd->add_option("--run-id", f->run_id,
                                 "store key prefix shared by every worker of the run, unique per run; default: "
                                 "RUN_DIR/run.id (a launched run's) with --run-dir, else slurm-<SLURM_JOB_ID> or "
                                 "TORCHELASTIC_RUN_ID under a scheduler, else 'atoll'");
  cmd->add_option("--run-dir", f->run_dir, "run directory (island 0 rank 0 writes checkpoints there)");
  cmd->add_option("--metrics-fd", f->metrics_fd, "write metrics rows to this file descriptor (used by `atoll launch`)")
      ->check(whole_number(0, kIntMax));
  cmd->add_flag("--quiet", f->quiet, "no log lines");
  cmd->add_option("--resume-from", f->resume_from, "continue from this checkpoint of the run (used by `atoll launch --resume`)");
  cmd->add_option("--init-from", f->init_from, "a fresh start's weights from this Hugging Face folder (passed by `atoll launch --init-from`)");
  cmd->add_flag("--join", f->join, "rejoin a running run: a restarted worker takes the run's state from a live island at the next outer step");
  const WorkerFlagsGiven given{.island = island, .rank = rank, .islands = islands, .workers_per_island = per_island,
                               .store = store, .run_id = run_id, .first_island = first_island.get()};
  return [cmd, f, config, token_file, first_island, iface, given]() -> int {
    if (!cmd->parsed()) return -1;
    // Every error a retry would repeat (a flag, the config, the placement) exits kWorkerConfigExit,
    // so that a scheduler's retry policy tells it from a preemption (docs/cluster.md).
    try {
      return run_worker_command(*f, *config, given, *token_file, *iface);
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
