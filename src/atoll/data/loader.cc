#include "atoll/data/loader.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/rng.h"
#include "atoll/data/json_integer.h"

namespace atl {

namespace fs = std::filesystem;

void to_json(nlohmann::json& j, const Cursor& c) {
  j = nlohmann::json{{"epoch", c.epoch}, {"position", c.position}, {"seq_len", c.seq_len}, {"n_windows", c.n_windows},
                     {"seed", c.seed},   {"shuffle", c.shuffle},   {"worker", c.worker},   {"n_workers", c.n_workers}};
}

void from_json(const nlohmann::json& j, Cursor& c) {
  json_integer_to(j.at("epoch"), c.epoch);
  json_integer_to(j.at("position"), c.position);
  json_integer_to(j.at("seq_len"), c.seq_len);
  json_integer_to(j.at("n_windows"), c.n_windows);
  json_integer_to(j.at("seed"), c.seed);
  j.at("shuffle").get_to(c.shuffle);
  json_integer_to(j.at("worker"), c.worker);
  json_integer_to(j.at("n_workers"), c.n_workers);
}


DataLoader::DataLoader(const std::string& path, const std::string& split, const LoaderOptions& options)
    : opt_(options), T_(options.seq_len) {
  ATOLL_CHECK_GT(T_, 0) << "seq_len";
  ATOLL_CHECK(opt_.n_workers >= 1 && opt_.worker >= 0 && opt_.worker < opt_.n_workers)
      << "worker " << opt_.worker << " of " << opt_.n_workers;
  // A shard shorter than one window (the last, partial shard of a stream, say) gives none; only
  // shards that give no window at all are an error.
  std::string short_shard;
  int64_t short_tokens = 0;
  std::vector<ListedShard> listed = list_shards(path, split);  // against meta.json: the list and sizes
  for (const ListedShard& l : listed) {
    const std::string& p = l.path;
    ShardView shard(p);
    listed_tokens_.push_back(shard.size());
    if (shard.size() < T_ + 1) {
      if (short_shard.empty()) {
        short_shard = p;
        short_tokens = shard.size();
      }
      log_warn("token shard " + p + " holds " + std::to_string(shard.size()) + " tokens, fewer than seq_len+1 = " +
               std::to_string(T_ + 1) + ": not read");
      continue;
    }
    first_window_.push_back(n_windows_);
    n_windows_ += (shard.size() - 1) / T_;
    shards_.push_back(std::move(shard));
  }
  if (n_windows_ == 0) {
    throw DataError("token shard " + short_shard + " holds " + std::to_string(short_tokens) +
                    " tokens, fewer than seq_len+1 = " + std::to_string(T_ + 1) +
                    "; fix: use a smaller model.seq_len or more data");
  }
  first_window_.push_back(n_windows_);
  ATOLL_CHECK_LE(n_windows_, int64_t{std::numeric_limits<uint32_t>::max()}) << "windows";
  slice_size_ = (n_windows_ - opt_.worker + opt_.n_workers - 1) / opt_.n_workers;
  if (slice_size_ <= 0) {
    throw DataError("data " + path + " has " + std::to_string(n_windows_) + " windows of " + std::to_string(T_ + 1) +
                    " tokens, none left for worker " + std::to_string(opt_.worker) + " of " +
                    std::to_string(opt_.n_workers) + "; fix: use fewer workers, a smaller seq_len or more data");
  }
  verifier_ = std::make_unique<ShardVerifier>(std::move(listed));  // the checksums, in the background
  prefetch_ = std::make_unique<BatchPrefetcher<Pos>>(
      [this](const Pos& from, int B, int32_t* inputs, int32_t* targets) { return fill(from, B, inputs, targets); }, T_,
      opt_.prefetch);
}

DataLoader::~DataLoader() = default;

std::shared_ptr<const std::vector<uint32_t>> DataLoader::order(int64_t epoch) const {
  std::lock_guard<std::mutex> lk(order_mu_);
  for (const auto& [e, perm] : orders_) {
    if (e == epoch) return perm;
  }
  // Fisher-Yates; the seed mixes (seed, epoch) so each epoch has its own order.
  auto perm = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(n_windows_));
  for (int64_t i = 0; i < n_windows_; ++i) (*perm)[i] = static_cast<uint32_t>(i);
  Rng rng(opt_.seed ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1)));
  for (int64_t i = n_windows_ - 1; i > 0; --i) {
    std::swap((*perm)[i], (*perm)[rng.below(static_cast<uint64_t>(i + 1))]);
  }
  if (orders_.size() >= 2) orders_.erase(orders_.begin());
  orders_.emplace_back(epoch, perm);
  return perm;
}

void DataLoader::read_window(int64_t window, int32_t* inputs, int32_t* targets) const {
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), window);
  const size_t s = static_cast<size_t>(it - first_window_.begin()) - 1;
  const int64_t start = (window - first_window_[s]) * T_;
  shards_[s].read(start, T_, inputs);
  shards_[s].read(start + 1, T_, targets);
}

DataLoader::Pos DataLoader::fill(Pos pos, int B, int32_t* inputs, int32_t* targets) const {
  std::shared_ptr<const std::vector<uint32_t>> perm;  // order of epoch perm_epoch
  int64_t perm_epoch = -1;
  for (int b = 0; b < B; ++b) {
    if (pos.position >= slice_size_) pos = {pos.epoch + 1, 0};
    if (opt_.shuffle && perm_epoch != pos.epoch) {
      perm = order(pos.epoch);
      perm_epoch = pos.epoch;
    }
    const int64_t g = opt_.worker + pos.position * opt_.n_workers;
    const int64_t window = opt_.shuffle ? (*perm)[static_cast<size_t>(g)] : g;
    read_window(window, inputs + int64_t{b} * T_, targets + int64_t{b} * T_);
    ++pos.position;
  }
  if (pos.position >= slice_size_) pos = {pos.epoch + 1, 0};
  return pos;
}

void DataLoader::next_batch(int B, int32_t* inputs, int32_t* targets) {
  pos_ = prefetch_->next(pos_, B, inputs, targets);
}

Cursor DataLoader::read_at(const Cursor& from, int B, int32_t* inputs, int32_t* targets) const {
  ATOLL_CHECK_GT(B, 0) << "batch size";
  const Pos end = fill({from.epoch, from.position}, B, inputs, targets);
  Cursor c = from;
  c.epoch = end.epoch, c.position = end.position;
  return c;
}

Cursor DataLoader::cursor() const {
  return Cursor{.epoch = pos_.epoch,
                .position = pos_.position,
                .seq_len = T_,
                .n_windows = n_windows_,
                .seed = opt_.seed,
                .shuffle = opt_.shuffle,
                .worker = opt_.worker,
                .n_workers = opt_.n_workers};
}

int64_t DataLoader::windows_at(int seq_len) const {
  ATOLL_CHECK_GT(seq_len, 0);
  int64_t n = 0;
  for (int64_t tokens : listed_tokens_)
    if (tokens >= seq_len + 1) n += (tokens - 1) / seq_len;
  return n;
}

int64_t count_windows(const std::string& path, const std::string& split, int seq_len) {
  ATOLL_CHECK_GT(seq_len, 0);
  int64_t n = 0;
  for (const ListedShard& l : list_shards(path, split)) {
    const int64_t tokens = ShardView(l.path).size();
    if (tokens >= seq_len + 1) n += (tokens - 1) / seq_len;
  }
  return n;
}

void DataLoader::set_cursor(const Cursor& c) {
  const bool same_data = c.seq_len > 0 && c.n_windows == (c.seq_len == T_ ? n_windows_ : windows_at(c.seq_len));
  if (!same_data || c.seed != opt_.seed || c.shuffle != opt_.shuffle) {
    throw DataError("data cursor was saved for another stream (seq_len " + std::to_string(c.seq_len) + ", " +
                    std::to_string(c.n_windows) + " windows, seed " + std::to_string(c.seed) +
                    ") than this one (seq_len " + std::to_string(T_) + ", " + std::to_string(n_windows_) +
                    " windows, seed " + std::to_string(opt_.seed) + "); fix: resume with the same data and train.seed");
  }
  ATOLL_CHECK(c.epoch >= 0 && c.position >= 0) << c.epoch << " " << c.position;
  prefetch_->drop();
  Pos pos{c.epoch, c.position};
  // Re-chunked at another length: the same share of the epoch, by the tokens its windows covered.
  if (c.seq_len != T_) pos.position = c.position * c.seq_len / T_;
  if (c.n_workers != opt_.n_workers) {
    // Same share of the epoch: the saved worker had taken about position * n_old windows of
    // the epoch order between all workers.
    pos.position = pos.position * c.n_workers / opt_.n_workers;
    log_warn("data cursor saved with " + std::to_string(c.n_workers) + " workers, resumed with " +
             std::to_string(opt_.n_workers) + ": a few windows may repeat or be skipped");
  }
  if (pos.position >= slice_size_) pos = {pos.epoch + 1, 0};
  pos_ = pos;
}

void DataLoader::reset() {
  prefetch_->drop();
  pos_ = Pos{};
}

void DataLoader::check_vocab(int vocab_size) const {
  for (const ShardView& s : shards_) {
    const auto [max_id, where] = s.max_token();
    if (max_id >= vocab_size) {
      throw DataError("token shard " + s.path() + " holds token id " + std::to_string(max_id) + " at position " +
                      std::to_string(where) + ", but the vocabulary has " + std::to_string(vocab_size) +
                      " ids; fix: set model.vocab_size >= " + std::to_string(max_id + 1) +
                      " or prepare the data with this vocabulary");
    }
  }
}

void DataLoader::check_integrity(bool wait) const { verifier_->check(wait); }

int64_t DataLoader::n_tokens() const {
  int64_t n = 0;
  for (const ShardView& s : shards_) n += s.size();
  return n;
}

std::vector<std::string> DataLoader::shard_paths() const {
  std::vector<std::string> paths;
  for (const ShardView& s : shards_) paths.push_back(s.path());
  return paths;
}

bool has_val_split(const std::string& path) {
  if (!fs::is_directory(path)) return true;
  if (meta_lists_split(path, "val")) return true;  // its shards checked when read: missing ones named
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().filename().string().rfind("val_", 0) == 0 && e.path().extension() == ".bin") return true;
  return false;
}

}  // namespace atl
