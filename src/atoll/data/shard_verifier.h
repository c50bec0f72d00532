// Checks token shards against the checksums their dataset's meta.json holds (shard_list.h), on
// one background thread per reader, so a run starts at once whatever the size of its data and
// the reading overlaps training. A damaged shard is reported by check() from the moment it is
// found; check(wait = true) first waits until every shard is checked: the run calls it before a
// checkpoint commits (nothing trained on damaged data is ever saved), eval before it reports.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "atoll/data/shard_list.h"

namespace atl {

class ShardVerifier {
 public:
  // Starts checking the shards that have a checksum (the others are skipped).
  explicit ShardVerifier(std::vector<ListedShard> shards);
  // Stops the check in flight (between two reads) and joins.
  ~ShardVerifier();
  ShardVerifier(const ShardVerifier&) = delete;
  ShardVerifier& operator=(const ShardVerifier&) = delete;

  // Throws DataError naming the first shard found damaged (its checksum against meta.json's,
  // and the fix). With `wait`, first waits until every shard has been checked.
  void check(bool wait) const;

 private:
  void run();

  std::vector<ListedShard> shards_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;  // every shard checked (or the first damaged one found)
  std::string error_;  // the first damaged shard's message
  std::thread thread_;  // last: it reads the members above
};

}  // namespace atl
