// The flags `atoll worker` and `atoll doctor` share (docs/cluster.md): where the worker sits
// (flags, else a scheduler's environment), the store and run id, the run's secrets and the
// interface it listens on, each declared once here, so that the doctor checks the very choices
// the worker will make.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "atoll/dist/listen_address.h"
#include "atoll/train/island_trainer.h"

namespace atl::cli {

struct PlacementFlags {
  // The options, to tell given from default (a scheduler fills the others).
  CLI::Option *island = nullptr, *rank = nullptr, *islands = nullptr, *workers_per_island = nullptr,
              *store = nullptr, *run_id = nullptr, *first_island_option = nullptr;
  int first_island = 0;
  std::string iface, token_file;
};

// --store, --token-file, --island, --rank, --islands, --workers-per-island, --iface,
// --first-island, --run-id, --run-dir on `cmd`, filling `f` (which must outlive the parse).
void add_placement_flags(CLI::App* cmd, WorkerOptions& f, PlacementFlags& flags);

// The run id of a launched run from RUN_DIR/run.id when --run-id is not given; then the
// placement from the flags, else the scheduler's environment (supervise/placement.h): fills
// island, rank, islands, workers_per_island, and the store and run id where no flag gave them.
// Returns the placement's line ("placement: island 1 rank 0 of ..."). ConfigError as the worker
// refuses it.
std::string resolve_worker_placement(WorkerOptions& f, const PlacementFlags& flags);

// The address to listen on for the peers (dist/listen_address.h): --iface, else Gloo's
// GLOO_SOCKET_IFNAME (one name), else the interface that routes to the store. ConfigError.
ListenAddress choose_interface(const std::string& store_url, const std::string& iface);

// The run token (--token-file, else ATOLL_RUN_TOKEN) and the store's password
// (ATOLL_STORE_PASSWORD, unless the --store URL holds one) into f: secrets never come from the
// command line, which `ps` shows to every user.
void read_worker_secrets(WorkerOptions& f, const std::string& token_file);

}  // namespace atl::cli
