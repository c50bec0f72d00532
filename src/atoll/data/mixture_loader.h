// The training stream of a run: one prepared dataset, or several drawn from in proportion to
// their weights (data.mix), with mixtures that change at token counts (data.phases).
//
// Each dataset is read by its own DataLoader (loader.h) with this worker's slice, so workers and
// islands draw disjoint windows of every dataset, exactly as from a single one. Which dataset
// gives each window comes from smooth weighted round-robin (nginx's upstream balancer): with the
// phase's weights as integers W_i summing to S, after n windows of the phase the next comes from
// the dataset with the largest (n+1)*W_i - picks_i*S (ties: the first listed), and picks_i grows
// by one. Why this and not a seeded random draw: it is exact at every prefix - picks_i differs
// from n*W_i/S by less than max(1, N-1) windows for N datasets (the scores sum to zero and the
// chosen one is >= 0 before it loses S, so each stays above -S) - it interleaves the datasets
// evenly instead of in runs, and its whole state is the pick counts, the same on every worker.
// Weights are turned into integers of 30 bits (proportions exact to 1e-9) so that every machine
// picks the same dataset, with or without fused multiply-add.
//
// A phase starts at the first batch of a step whose token count (every worker's tokens, the
// driver's count) has reached its at_tokens; its pick counts start at zero, while each dataset
// continues where it stopped. The state (phase, picks, each dataset's cursor) is a MixCursor,
// saved in checkpoints (cursor_json), so a resumed run continues the same windows in the same
// phase. Batches are a pure function of (cursor, B): the next is prepared in the background.
//
// A phase may train at its own sequence length (DataPhase::seq_len, context extension): when it
// starts, every dataset's loader is rebuilt at the new length and continues from its cursor
// re-chunked (DataLoader::set_cursor: the same epoch, the position scaled by the tokens read), so
// the change is as deterministic as the rest and a resumed run re-chunks the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/data/batch_prefetcher.h"
#include "atoll/data/loader.h"

namespace atl {

struct MixCursor {
  int phase = -1;               // the phase drawn from; -1 before the first batch
  std::vector<int64_t> picks;   // windows drawn from each dataset since the phase began
  std::vector<Cursor> sources;  // where each dataset's loader stands
  bool operator==(const MixCursor&) const = default;
};

class MixtureLoader {
 public:
  // `phases` as data_phases() gives them (at least one, the first at 0); every dataset is read
  // from `dir`/<split>_*.bin, in windows of options.seq_len tokens or the phase's own seq_len.
  // Dataset i shuffles with seed `options.seed` mixed with i (the first one with the seed itself,
  // so a one-dataset stream is DataLoader's). Throws DataError as DataLoader does, naming the
  // dataset, also when a later phase's length leaves a dataset of it no window for this worker.
  MixtureLoader(const std::vector<DataPhase>& phases, const std::string& split, const LoaderOptions& options);

  // Selects the phase for `tokens` trained so far (call before each step's batches). Returns the
  // phase's index when it starts now (for the data_phase event), else -1. A single dataset has no
  // phases to report: -1.
  int enter_phase(int64_t tokens);

  // Fills the next B windows: inputs[B, T] and targets[B, T] (overwritten).
  void next_batch(int B, int32_t* inputs, int32_t* targets);

  MixCursor cursor() const { return state_; }
  // The cursor as checkpoints hold it: a single dataset's is DataLoader's Cursor (as before
  // mixtures existed); a mixture's is {phase, sources: [{dir, picks, cursor}]}.
  nlohmann::json cursor_json() const;
  // Continues from a saved cursor. Throws DataError when it belongs to another stream: other
  // datasets (a dataset of the saved mixture missing here), seq_len, seed or data. A dataset new
  // in this run's mixture starts at its beginning.
  void set_cursor_json(const nlohmann::json& j);
  // Why `j` is not a data cursor ("" when it is one), for checking a checkpoint before loading.
  static std::string cursor_json_problem(const nlohmann::json& j);

  // Throws DataError naming the shard if any token id is >= vocab_size.
  void check_vocab(int vocab_size) const;
  // DataLoader::check_integrity of every dataset.
  void check_integrity(bool wait) const {
    for (const auto& s : sources_) s->check_integrity(wait);
  }

  bool mixes() const { return !single_; }
  const std::vector<std::string>& dirs() const { return dirs_; }
  const std::vector<DataPhase>& phases() const { return phases_; }
  // The current phase's share of each dataset (phase 0 before the first batch), summing to 1.
  std::vector<double> shares() const;
  std::vector<std::string> shard_paths() const { return sources_.front()->shard_paths(); }
  int seq_len() const { return T_; }  // the current phase's
  int phase() const { return std::max(0, state_.phase); }  // the current phase (0 before the first batch)

 private:
  int phase_seq_len(int phase) const;
  void rechunk(int seq_len);  // every dataset's loader at seq_len, continuing from its cursor
  MixCursor fill(const MixCursor& from, int B, int32_t* inputs, int32_t* targets) const;
  size_t pick(const MixCursor& s) const;

  LoaderOptions options_;  // seq_len: the run's own (model.seq_len), for phases that set none
  std::string split_;
  int T_ = 0;
  bool single_ = false;
  std::vector<DataPhase> phases_;
  std::vector<std::string> dirs_;                       // every dataset of every phase, first use first
  std::vector<std::vector<int64_t>> int_weights_;       // [phase][dataset] W_i, 0 when not in the phase
  std::vector<std::unique_ptr<DataLoader>> sources_;  // [dataset], read through read_at
  MixCursor state_;
  std::unique_ptr<BatchPrefetcher<MixCursor>> prefetch_;  // last: its thread reads the members above
};

}  // namespace atl
