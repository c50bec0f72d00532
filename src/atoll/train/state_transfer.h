// The run's state to an island that rejoins an elastic run (DESIGN.md "state transfer to a
// joiner"), as a walk of the state registry (state_registry.h) over the outer group of the
// view that admits it (dist/elastic_group.h).
//
// The source is the lowest island of the view that holds the state (not joining). Over outer-r<R>
// its rank R sends:
//   1. to every other worker of the group (a broadcast), a manifest: each entry's name and, for
//      a tensor, the xxh3 of its bytes as the source holds them; for a JSON entry, its value;
//   2. to each joiner (point to point), each tensor. Every joiner hashes what it received and
//      refuses a tensor whose hash is not the source's; the refusals are gathered and the
//      refused tensors sent again (at most kTransferTries rounds). A transfer still refused, or one whose source is lost, is a
//      failed admission: everyone votes it down, re-forms and tries again from the lowest
//      island then alive.
// Workers that already hold the state receive only the manifest and the rounds' refusals.
//
// What a joiner gets, by division: run-wide entries (θ, outer momentum, step, tokens, the
// optimizer's and the fragments' step counts) and the island's entries (parameters, optimizer
// moments) are the source's; per-worker entries (its data cursor) come from its own membership
// record, written by the worker it replaces at its newest committed outer step, so a restarted
// island continues its own data slice; entries sharded in the island (the error-feedback
// residual) start at zero: the lost worker's residual went with it, and another island's
// belongs to that island's rounding.
//
// The admission is voted like an outer step (admit()): nobody counts the joiners as members
// until every worker of the view agrees that the transfer succeeded.
#pragma once

#include <nlohmann/json.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/elastic_group.h"
#include "atoll/train/state_registry.h"

namespace atl {

inline constexpr int kTransferTries = 3;

struct TransferReport {
  bool ok = false;
  int source = -1;                   // the island that sent
  int rounds = 0;                    // broadcast rounds (1 when nothing was refused)
  std::vector<std::string> refused{};  // tensors refused at least once (a hash mismatch)
  std::string why{};                   // when !ok
  uint64_t bytes = 0;                  // tensor bytes broadcast by the successful transfer (refused ones sent again included)
  double seconds = 0;                  // its wall time, hashes and manifest included
};

// One transfer over `outer` (every worker of `view` calls it); joiners' buffers are written.
TransferReport transfer_state(ProcessGroup& outer, const View& view, int island, const Config& cfg, TrainingState& s);

// This worker's record for the store: its per-worker entries ({"loaders": cursor}), and back.
std::string worker_record(const Config& cfg, TrainingState& s);
void restore_worker_record(const Config& cfg, TrainingState& s, const std::string& record);
// One per-worker entry's value in a record (checkpoints of a run missing islands).
std::optional<nlohmann::json> record_value(const std::string& record, const std::string& entry);

// The messages of a transfer as a receiver reads them from a peer, checked whole against the
// entries the transfer moves (transferred_entries): the source's manifest (every such entry, a
// tensor's {"hash": "<hex>"}, a JSON entry's {"value": v} that passes the entry's check), a
// worker's refusals (a list of those tensors' names), and a worker record from the store (an
// object of per-worker entries, each passing its check). PeerLost (IoError for the record)
// naming the message and the entry otherwise, before anything is applied.
std::vector<std::string> transferred_entries(const std::vector<StateEntry>& entries);
nlohmann::json parse_transfer_manifest(const std::string& text, const std::vector<StateEntry>& entries);
std::vector<std::string> parse_refusals(const std::string& text, const std::vector<StateEntry>& entries);
nlohmann::json parse_worker_record(const std::string& record, const std::vector<StateEntry>& entries);

// Until the view's joiners hold the state: transfer, vote, and on an abort re-form and retry.
// Returns the report of the transfer that committed (ok and no joiners: nothing to do).
TransferReport admit(ElasticGroup& elastic, const Config& cfg, TrainingState& s);

}  // namespace atl
