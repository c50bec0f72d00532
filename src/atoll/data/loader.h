// The data loader: fixed-length training windows over token shards, deterministic and
// resumable.
//
// Windows are llm.c's (and `atoll eval`'s): window i of a shard holds tokens [i*T, i*T+T+1);
// its inputs are the first T tokens, its targets the T tokens after each input. A shard of N
// tokens has floor((N-1)/T) windows; the tail that does not fill one is not used.
//
// Order: the windows of all shards, shards sorted by name, are numbered 0..W-1. Without
// shuffle an epoch visits them in that order; with shuffle, epoch e visits them in a
// Fisher-Yates permutation drawn from Rng(seed, e) (core/rng.h, the same on every machine).
// Worker w of n takes positions w, w+n, w+2n, ... of each epoch's order: the workers' slices
// are disjoint and together cover every window once per epoch (slice sizes differ by at most
// one window). Batches run on across epoch boundaries.
//
// The state is a Cursor (epoch, position in this worker's slice), so a loader restored with
// set_cursor yields exactly the batches the original would have, whatever the batch sizes.
// Batches are a pure function of (cursor, size), so a background thread prepares the next one
// (batch_prefetcher.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "atoll/data/batch_prefetcher.h"
#include "atoll/data/shard.h"
#include "atoll/data/shard_verifier.h"

namespace atl {

struct LoaderOptions {
  int seq_len = 0;       // T
  uint64_t seed = 0;     // window order when shuffling
  int worker = 0;        // this worker's index (rank), 0 <= worker < n_workers
  int n_workers = 1;     // workers sharing the stream
  bool shuffle = true;   // false: windows in shard order (validation, eval)
  bool prefetch = true;  // prepare the next batch on a background thread
};

// Where a loader stands, plus what it was made for (checked by set_cursor). Saved in
// checkpoints as JSON (to_json / from_json below).
struct Cursor {
  int64_t epoch = 0;
  int64_t position = 0;  // windows of this worker's slice of `epoch` already delivered
  // The stream the cursor belongs to.
  int seq_len = 0;
  int64_t n_windows = 0;  // W, all shards
  uint64_t seed = 0;
  bool shuffle = true;
  int worker = 0;
  int n_workers = 1;
  bool operator==(const Cursor&) const = default;
};
void to_json(nlohmann::json& j, const Cursor& c);
void from_json(const nlohmann::json& j, Cursor& c);

// Whether `path` has a validation split: a folder with a val_*.bin shard or whose meta.json
// lists one, or a single .bin file (which serves both splits).
bool has_val_split(const std::string& path);

// The windows of `seq_len` tokens the shards of `path` (split as DataLoader reads it) hold, all
// workers', without reading a token: to check a later data phase's length before the run starts.
int64_t count_windows(const std::string& path, const std::string& split, int seq_len);

class DataLoader {
 public:
  // `path` is a folder, whose `<split>_*.bin` shards are read (split "train" or "val"), or a
  // single .bin file (llm.c's own shards load unchanged). Throws DataError when there are no
  // shards, a shard is shorter than T+1 tokens, or the shards disagree with the list and sizes
  // of the dataset's meta.json (shard_list.h); their checksums are checked in the background
  // (check_integrity).
  DataLoader(const std::string& path, const std::string& split, const LoaderOptions& options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Fills the next B windows: inputs[B, T] and targets[B, T] (overwritten). B may change
  // from call to call (a batch-size ramp).
  void next_batch(int B, int32_t* inputs, int32_t* targets);
  // The B windows that follow `from` (a cursor of this stream), without moving this loader:
  // returns the cursor after them. Safe from any thread (MixtureLoader reads its sources so).
  Cursor read_at(const Cursor& from, int B, int32_t* inputs, int32_t* targets) const;

  Cursor cursor() const;
  // Continues from a saved cursor. Throws DataError if it belongs to another stream (other
  // shards, seed or shuffle). A cursor saved with another worker count is mapped to the same
  // share of the epoch (approximately: resharding may repeat or skip a few windows). A cursor of
  // another seq_len over the same shards (context extension: a data phase or a --resume at a
  // new model.seq_len) re-chunks: the same epoch, its position scaled by the tokens it covered
  // (position * saved seq_len / seq_len, rounded down); the windows of the new length are
  // another permutation, so some text of the epoch may come again at the new length.
  void set_cursor(const Cursor& cursor);
  void reset();  // back to the start of epoch 0 (validation passes)

  // Throws DataError naming the shard, position and id if any token id is >= vocab_size.
  void check_vocab(int vocab_size) const;
  // Throws DataError naming the shard if one failed its meta.json checksum so far; with `wait`,
  // once every shard has been checked (shard_verifier.h).
  void check_integrity(bool wait) const;

  int seq_len() const { return T_; }
  int64_t n_windows() const { return n_windows_; }           // W, all workers
  int64_t windows_at(int seq_len) const;                     // W at another length, the same shards
  int64_t windows_per_epoch() const { return slice_size_; }  // this worker's share
  int64_t n_tokens() const;
  std::vector<std::string> shard_paths() const;

 private:
  struct Pos {
    int64_t epoch = 0;
    int64_t position = 0;
    bool operator==(const Pos&) const = default;
  };
  Pos fill(Pos pos, int B, int32_t* inputs, int32_t* targets) const;
  void read_window(int64_t window, int32_t* inputs, int32_t* targets) const;
  std::shared_ptr<const std::vector<uint32_t>> order(int64_t epoch) const;

  LoaderOptions opt_;
  int T_ = 0;
  std::vector<ShardView> shards_;
  std::vector<int64_t> listed_tokens_;  // every listed shard's tokens, those too short for T_ too
  std::vector<int64_t> first_window_;  // window number of each shard's window 0, then W
  int64_t n_windows_ = 0;
  int64_t slice_size_ = 0;
  Pos pos_;

  // Permutations of the last two epochs used (one in use, one the prefetch may cross into).
  mutable std::mutex order_mu_;
  mutable std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<uint32_t>>>> orders_;

  std::unique_ptr<ShardVerifier> verifier_;
  std::unique_ptr<BatchPrefetcher<Pos>> prefetch_;  // last: its thread reads the members above
};

}  // namespace atl
