// One worker of a multi-process run (`atoll worker`, started by `atoll launch` or by hand):
// island I, rank R of M inside it, of N islands (DESIGN.md "DiLoCo").
//
// Placement: global worker index w = I*M + R of W = N*M; the worker reads slice w of W of the
// training data (loader.h). Groups: "island<I>" (the M workers of island I) all-reduces
// gradients every step; "outer-r<R>" (rank R of every island) runs the DiLoCo outer step
// (dist/diloco.h) every H = diloco.inner_steps steps and at the last step. Every worker of an
// island holds the same parameters; the exchange is sharded over the island's ranks (rank R
// exchanges the R-th M-th of θ over outer-r<R>, then the island all-gathers the shards), so
// the slow links carry each element once per island.
//
// Schedule: train.steps counts global steps (every worker takes each of them); train.batch_size
// is per worker; `tokens` counts the whole run (W workers' batches per step), and the batch
// ramp and learning rate schedule read those global figures, so every worker agrees on them.
//
// Start-up checks, all bounded by fault.timeout_s: the store must answer, every peer must
// arrive, and every worker's [model] section and resolved config (minus the placement keys
// train.threads, train.device and data.dir) must equal island 0 rank 0's; else an Error that
// names the difference. The initial parameters must hash the same on every island.
//
// DiLoCo may be streaming (diloco.fragments, diloco.overlap_steps: dist/streaming.h): θ is cut
// into fragments of whole layers that sync in turn, each exchange optionally overlapped with the
// next inner steps. Or the islands sync on a time budget (diloco.sync_seconds, one worker per
// island: check_time_budget_placement): each round ends on the island's clock, H the cap, the
// mean weighted by tokens, and every island adopts the round's furthest step at each commit
// (train/island_hooks.h DilocoHook), where alone checkpoints and stops happen.
//
// Elastic (docs/islands.md "Faults, membership and rejoin"): the outer groups follow the
// membership views of dist/membership.h; every outer step is voted on, and one that fails is
// discarded and retried over the islands still alive (dist/elastic_group.h, dist/streaming.h).
// A restarted worker (`join`) asks to rejoin, is admitted at a committed outer step, receives
// the run's state from a live island (train/state_transfer.h) and its data cursor from its own
// membership record, then trains on. A worker that is no longer a member (its island lost a
// worker, or the others re-formed without it) throws LeftRun: `atoll worker` exits with
// kWorkerRejoinExit and the launcher restarts it with --join.
//
// Output: metrics rows (DESIGN.md "Files") with island, rank, comm_bytes, comm_s, compute_s,
// idle_s (cumulative seconds; overlap_comm_s too when exchanges overlap), and outer_step /
// fragment / theta_hash / momentum_hash after every outer step; written to `metrics_fd` (whole
// lines; the launcher merges them into one metrics.jsonl), with the worker's phase changes as
// {"phase": NAME} lines between them (core/worker_phase.h: the launcher's live view), or, when
// -1, appended to RUN_DIR/metrics.jsonl. Worker 0 (rank 0 of the lowest island alive) evaluates and writes the
// run's events. Checkpoints hold the whole run: every entry of the state
// registry (state_registry.h: every island's parameters and moments, θ, the outer momentum, every
// worker's loader cursor, the counters), saved and restored by walks of it (state_checkpoint.h);
// every worker writes its own part in the background and rank 0 of the lowest live island commits
// it; a missing island's entries name the first live island's copies and its record's cursor).
// A checkpoint waits until no exchange is in flight. `resume_from` restarts every worker from
// such a checkpoint, of any shape (state_checkpoint.h), or from a single-process run's (DiLoCo
// then starts from θ = its parameters). After start-up the workers compare the hash of the state they must share.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "atoll/config/config.h"

namespace atl {

struct WorkerOptions {
  std::string store_url;             // redis://[:PASSWORD@]HOST:PORT
  std::string store_password;        // overrides the URL's ("" = the URL's, or none)
  std::string run_token;             // the run's token, presented before anything is written ("" = none)
  std::string run_id = "atoll";      // store key prefix: unique per run
  int island = 0, rank = 0;          // this worker
  std::string listen_address;        // where it listens for its peers (dist/listen_address.h; "" = chosen there)
  int islands = 1, workers_per_island = 1;
  std::string run_dir;               // worker 0's checkpoints (and metrics when metrics_fd < 0); worker 0
                                     // without a launcher (metrics_fd < 0) locks it (train/run_lock.h),
                                     // else the launcher holds the lock
  int metrics_fd = -1;               // >= 0: metrics rows go to this file descriptor
  bool quiet = false;                // no log lines
  std::string resume_from;           // a checkpoint of this run to continue from ("" = fresh start)
  bool join = false;                 // a restarted worker: rejoin the running run (elastic islands)
  std::string init_from;             // a fresh start's weights from this Hugging Face folder (train/init_weights.h)
  // SIGTERM/SIGINT stop the run with a checkpoint (preemption; `atoll worker`): the first worker
  // to get one posts in the store the step every worker stops at (far enough ahead that none has
  // passed it: the islands drift apart by at most diloco.inner_steps + diloco.overlap_steps);
  // each stops there, the run's checkpoint of that step written, and returns with `stopped`.
  bool stop_on_signal = false;
  // A worker that rejoins by itself (train/self_rejoin.h): when it was dropped (Unix seconds; 0:
  // it was not) and why, for its `rejoined` event; and set once it trains as a member of the run
  // (after the start-up checks or its admission), so that a start-up error is not retried.
  double dropped_at = 0;
  std::string dropped_why;
  // ... and the end of its wait: its admission must come before it (else Timeout).
  std::chrono::steady_clock::time_point rejoin_by = std::chrono::steady_clock::time_point::max();
  bool* became_member = nullptr;
};

// The exit status of `atoll worker` when the worker left the run but can rejoin it (LeftRun: its
// island lost a worker, or the others re-formed without it): the launcher restarts it with --join.
inline constexpr int kWorkerRejoinExit = 75;
// The other exit statuses of `atoll worker` a scheduler's retry policy reads (docs/cluster.md):
// a signal (SIGTERM: preemption) stopped the run at a step every worker agreed on, with that
// step's checkpoint written: retriable, by starting every worker again with --resume-from; and
// an error that a retry would only repeat (a flag, the config, the placement): not retriable.
inline constexpr int kWorkerPreemptedExit = 79;
inline constexpr int kWorkerConfigExit = 78;  // sysexits.h's EX_CONFIG

struct WorkerResult {
  int64_t steps = 0, outer_steps = 0;
  double first_loss = 0, final_loss = 0;
  std::string theta_hash;  // after the last outer step
  bool stopped = false;    // a stop (stop_on_signal) ended it before train.steps, with a checkpoint
  bool finished_before_admission = false;  // a joiner: the run ended before it was admitted (trained nothing)
};

WorkerResult run_worker(const Config& cfg, const WorkerOptions& opts);

// Islands on a time budget (diloco.sync_seconds > 0) have one worker each: an island's ranks
// would each end the round on their own clock. A ConfigError naming the keys and the fix.
void check_time_budget_placement(const DilocoConfig& d, int workers_per_island);

// The config against an island of `workers_per_island` workers: streaming fragments, the time
// budget's and the delayed outer step's placement, context parallelism, the device. `atoll
// launch` runs them before any worker starts and every worker again (check_worker_config), so a
// new rule of placement goes here, once. ConfigError.
void check_island_placement(const Config& cfg, int workers_per_island);

// The checks of the config run_worker makes before it starts anything (and `atoll doctor`):
// check_island_placement, then the memory of one worker on this host (rank `rank`'s GPU under
// train.device = cuda). ConfigError.
void check_worker_config(const Config& cfg, int workers_per_island, int rank);

// The resolved config TOML without the placement keys (what workers must agree on).
std::string shared_config_toml(const Config& cfg);

}  // namespace atl
