#include "atoll/data/shard_verifier.h"

#include <filesystem>

#include "atoll/core/errors.h"
#include "atoll/data/shard_writer.h"

namespace atl {

ShardVerifier::ShardVerifier(std::vector<ListedShard> shards) : shards_(std::move(shards)) {
  std::erase_if(shards_, [](const ListedShard& s) { return s.xxh3.empty(); });
  if (shards_.empty()) done_ = true;
  else thread_ = std::thread([this] { run(); });
}

ShardVerifier::~ShardVerifier() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ShardVerifier::run() {
  std::string error;
  for (const ListedShard& s : shards_) {
    std::string sum;
    try {
      sum = shard_checksum(s.path, &stop_);
    } catch (const Error& e) {
      error = e.what();
    }
    if (stop_) return;
    if (error.empty() && sum != s.xxh3) {
      const std::string meta = (std::filesystem::path(s.path).parent_path() / "meta.json").string();
      error = "token shard " + s.path + " fails its checksum (xxh3 " + sum + ", " + meta + " says " + s.xxh3 +
              "): it changed since `atoll data prepare` wrote it; fix: put back the shard as it was written, or "
              "prepare the dataset again into an empty folder";
    }
    if (!error.empty()) break;
  }
  std::lock_guard<std::mutex> lk(mu_);
  error_ = error;
  done_ = true;
  cv_.notify_all();
}

void ShardVerifier::check(bool wait) const {
  std::unique_lock<std::mutex> lk(mu_);
  if (wait) cv_.wait(lk, [this] { return done_; });
  if (!error_.empty()) throw DataError(error_);
}

}  // namespace atl
