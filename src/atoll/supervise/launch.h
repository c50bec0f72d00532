// The launch policy of `atoll launch`: N islands of M workers on this machine, DiLoCo across the
// islands. The command line only parses flags into LaunchOptions and calls launch().
//
// launch():
//  1. validates the streaming settings, prints one line on the run (train/trainer.h
//     describe_run; the whole config with `print_config`), opens the run directory
//     (train/run_dir.h: new, or with `resume` the same run, whose newest checkpoint must suit N
//     and M; refused before any worker starts) and takes its lock for the whole launch: the
//     workers it starts do not lock; then prepares the data once (so the workers find it ready);
//  2. starts redis-server on loopback with a fresh password (redis_server.h) unless `store` is
//     given (redis://[:PASSWORD@]HOST:PORT), which must then answer PING (else Timeout at once,
//     with the fix; a refused password is a ConfigError);
//  3. writes RUN_DIR/config.toml and tokenizer.model, the run's token in RUN_DIR/run.token and
//     its own store's password in RUN_DIR/store.password (run_secrets.h; both mode 0600), the
//     token to the store (every worker must present it), truncates metrics.jsonl after the resumed
//     step, and writes the events `launch` (and `resume` or `start_over`) to RUN_DIR/events.jsonl;
//  4. spawns the N·M `atoll worker` processes (the running executable itself) through the
//     Supervisor (launcher.h), with train.threads = cores / (N·M) when the config says 0, and
//     OMP_WAIT_POLICY=passive, ATOLL_RUN_TOKEN and ATOLL_STORE_PASSWORD in their environment
//     (never on their command lines, which `ps` shows to every user);
//  5. shows their output with each worker's name in front, writes their metrics rows, whole
//     lines, into the one RUN_DIR/metrics.jsonl (their phase lines go to the live view only), and drives one progress line from worker 0's
//     rows with every island's latest loss;
//  6. with `status_port` (>= 0), serves the live view of the islands while the run trains
//     (live_view.h; bound in step 1, before the run directory is opened, so a taken port is
//     refused before anything is written);
//  7. stops Redis and reports how the run ended (RUN_DIR/summary.txt when it ran to the end).
// Returns 0 when the run finished, 3 when the θ hashes of an outer step ever differed, 128 + the
// signal when SIGINT/SIGTERM stopped the run (event `interrupted`). A worker lost after the run
// started (a signal, or exit kWorkerRejoinExit) is restarted with --join after a backoff while
// another island is whole, up to fault.max_restarts times in a row without progress (a new step
// or a committed outer step in between starts the count again; events `peer_lost`, `restart`;
// docs/islands.md "Faults, membership and rejoin"); once a worker has finished, one that never
// logged the last step is stopped after the grace and ignored. A worker that fails otherwise
// stops every other worker and is thrown as Error "island I rank R failed (exit 1), every worker
// stopped: <its error>" (event `worker_failed`). An error of the launcher itself (a metrics or
// events line it cannot write to a full disk, a store it cannot restart) stops every worker too
// and is thrown as it is. However the run ends, the store is stopped, the checkpoint folders the
// workers left half written are removed (each named), and the lock is let go.
#pragma once

#include <chrono>
#include <string>

#include "atoll/config/config.h"

namespace atl {

struct LaunchOptions {
  Config config = {};                          // resolved from --config and --set
  std::string config_path = {};                // where it came from ("" = the built-in defaults)
  int islands = 1;                             // N: DiLoCo across them
  int workers_per_island = 1;                  // M: data parallel inside an island
  std::string store = {};                      // redis://HOST:PORT; "" = start redis-server on loopback
  std::string run_dir = {};                    // "" = default_run_dir()
  std::chrono::milliseconds stop_grace{5000};  // a stopped worker's time before SIGKILL
  bool resume = false;                         // continue the run in run_dir from its newest checkpoint
  bool allow_config_change = false;            // resume with keys changed beyond kResumeSafeKeys
  bool print_config = false;                   // print the whole resolved config, not one line
  std::string init_from = {};                  // a new run's weights from this Hugging Face folder (docs/weights.md)
  int status_port = -1;                        // the live view (live_view.h): -1 none, 0 a free port
  std::string status_host = "127.0.0.1";       // where the live view listens
};

// Runs the whole launch (see above); returns the exit status.
int launch(const LaunchOptions& opts);

}  // namespace atl
