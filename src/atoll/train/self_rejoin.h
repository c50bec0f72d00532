// A worker without a launcher (`atoll worker` by hand, under srun, in a Kubernetes pod) that the
// others dropped rejoins by itself (docs/cluster.md "A cut link"): nobody would restart it with
// --join, as `atoll launch` restarts its own.
//
// Dropped means it left the run after it had trained in it: LeftRun (the others re-formed without
// it, it was late for a round, its island lost a worker), StoreLost or Timeout (the store did not
// answer: its link is cut), PeerLost. It then writes `dropped` to RUN_DIR/events.jsonl, waits for
// the store to answer a PING, and runs again as a joiner (run_worker with `join`: the run's state
// by hash-verified transfer from a live island, its data cursor from its record), then trains on.
// Tries go on for fault.rejoin_timeout_s from the drop; after that LeftRun (exit 75, as before).
// A first start that fails before it trained is not retried (a start-up error stays one), nor is
// any other error (a config, the data, a refusal at the door).
//
// The store is the run's one arbiter: only workers that reach it vote, re-form and commit, so a
// partition never splits the run into two halves that both train on. The side without the store
// waits here (each try bounded by fault.timeout_s) and says so in its log and its `dropped` event.
#pragma once

#include "atoll/config/config.h"
#include "atoll/train/island_trainer.h"

namespace atl {

// run_worker, again as a joiner after each drop while fault.rejoin_timeout_s allows, for a worker
// without a launcher (opts.metrics_fd < 0); run_worker alone otherwise, or with the key at 0.
WorkerResult run_worker_rejoining(const Config& cfg, const WorkerOptions& opts);

}  // namespace atl
