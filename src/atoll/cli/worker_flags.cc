#include "atoll/cli/worker_flags.h"

#include <cstdlib>
#include <limits>
#include <optional>

#include "atoll/cli/number_flags.h"
#include "atoll/core/errors.h"
#include "atoll/dist/store.h"
#include "atoll/supervise/placement.h"
#include "atoll/supervise/run_secrets.h"

namespace atl::cli {

namespace {

constexpr int kIntMax = std::numeric_limits<int>::max();

std::optional<int> given_int(const CLI::Option* o, int value) {
  return o->count() > 0 ? std::optional<int>(value) : std::nullopt;
}

}  // namespace

void add_placement_flags(CLI::App* cmd, WorkerOptions& f, PlacementFlags& flags) {
  flags.store = cmd->add_option("--store", f.store_url,
                                "rendezvous store, redis://HOST:PORT or redis://:PASSWORD@HOST:PORT (or the password in "
                                "ATOLL_STORE_PASSWORD); default under a scheduler: redis://MASTER_ADDR:MASTER_PORT, or "
                                "port 6379 of Slurm's first host (docs/cluster.md)");
  cmd->add_option("--token-file", flags.token_file,
                  "the run's token (RUN_DIR/run.token, written by `atoll launch`); default: ATOLL_RUN_TOKEN");
  flags.island = cmd->add_option("--island", f.island, "this worker's island, 0..N-1 (default: from Slurm, torchrun or "
                                 "a Kubernetes Indexed Job: docs/cluster.md)")->check(whole_number(0, kIntMax - 1));
  flags.rank = cmd->add_option("--rank", f.rank, "this worker's rank inside its island, 0..M-1 (default: as --island)")
                   ->check(whole_number(0, kIntMax - 1));
  flags.islands = cmd->add_option("--islands", f.islands, "N: islands in the run (default under Slurm or torchrun: "
                                  "the task count / M)")->check(whole_number(1, kIntMax));
  flags.workers_per_island = cmd->add_option("--workers-per-island", f.workers_per_island, "M: workers per island")
                                 ->check(whole_number(1, kIntMax));
  cmd->add_option("--iface", flags.iface, "listen for the peers on this network interface's IPv4 address (default: "
                  "GLOO_SOCKET_IFNAME, one name, else the interface that routes to the store)");
  flags.first_island_option =
      cmd->add_option("--first-island", flags.first_island, "K: this job holds islands K.. of the run, its scheduler's "
                      "task t is island K + t / M (a site of several; 0 too); default: the job holds the whole run")
          ->check(whole_number(0, kIntMax - 1));
  flags.run_id = cmd->add_option("--run-id", f.run_id,
                                 "store key prefix shared by every worker of the run, unique per run; default: "
                                 "RUN_DIR/run.id (a launched run's) with --run-dir, else slurm-<SLURM_JOB_ID> or "
                                 "TORCHELASTIC_RUN_ID under a scheduler, else 'atoll'");
  cmd->add_option("--run-dir", f.run_dir, "run directory (island 0 rank 0 writes checkpoints there)");
}

std::string resolve_worker_placement(WorkerOptions& f, const PlacementFlags& given) {
  // A launched run's id is in its folder: `--run-dir` alone joins it.
  if (given.run_id->count() == 0 && !f.run_dir.empty())
    if (const std::optional<std::string> id = read_run_id(f.run_dir)) f.run_id = *id;
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
                                         .first_island = given_int(given.first_island_option, given.first_island)},
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
  return describe_placement(p, env);
}

ListenAddress choose_interface(const std::string& store_url, const std::string& iface) {
  if (!iface.empty()) return choose_listen_address(store_url, iface, "--iface");
  const char* gloo = std::getenv("GLOO_SOCKET_IFNAME");
  if (gloo == nullptr || *gloo == '\0') return choose_listen_address(store_url);
  if (std::string(gloo).find(',') != std::string::npos)
    throw ConfigError(std::string("GLOO_SOCKET_IFNAME=") + gloo + " names several interfaces; atoll listens on one; fix: "
                      "name one interface, or pass --iface NAME");
  return choose_listen_address(store_url, gloo, "GLOO_SOCKET_IFNAME");
}

void read_worker_secrets(WorkerOptions& f, const std::string& token_file) {
  if (!token_file.empty()) f.run_token = read_secret_file(token_file, "--token-file");
  else if (const char* t = std::getenv("ATOLL_RUN_TOKEN")) f.run_token = t;
  if (const char* p = std::getenv("ATOLL_STORE_PASSWORD"); p && parse_store_url(f.store_url).password.empty())
    f.store_password = p;
}

}  // namespace atl::cli
