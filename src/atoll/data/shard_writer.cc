#include "atoll/data/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/file_writer.h"
#include "atoll/data/shard.h"

namespace atl {

namespace {

constexpr size_t kBufferTokens = 1 << 16;

int token_bytes(int32_t version) { return version == kShardVersionU16 ? 2 : 4; }

std::string hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

// fsync of a folder, so that a rename in it survives a power cut.
void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void to_json(nlohmann::json& j, const ShardRecord& r) {
  j = nlohmann::json{{"name", r.name}, {"tokens", r.tokens}, {"xxh3", r.xxh3}};
}
void from_json(const nlohmann::json& j, ShardRecord& r) {
  j.at("name").get_to(r.name);
  j.at("tokens").get_to(r.tokens);
  j.at("xxh3").get_to(r.xxh3);
}

std::string shard_checksum(const std::string& path, const std::atomic<bool>* stop) {
  const ShardView view(path);  // validates the header and size
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("token shard " + path + ": cannot open (" + std::strerror(errno) + ")");
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> chunk(1 << 20);
  off_t at = kShardHeaderBytes;
  while (stop == nullptr || !stop->load(std::memory_order_relaxed)) {
    const ssize_t got = ::pread(fd, chunk.data(), chunk.size(), at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    XXH3_64bits_update(state, chunk.data(), static_cast<size_t>(got));
    at += got;
  }
  ::close(fd);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hex64(h);
}

ShardStreamWriter::ShardStreamWriter(Options options) : opt_(std::move(options)), point_(opt_.resume) {
  ATOLL_CHECK_GT(opt_.shard_tokens, 0) << "shard_tokens";
  ATOLL_CHECK(opt_.version == kShardVersionU16 || opt_.version == kShardVersionU32) << opt_.version;
  buf_.reserve(kBufferTokens);
}

ShardStreamWriter::~ShardStreamWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());  // an abandoned partial shard
  }
}

std::string ShardStreamWriter::shard_name(size_t index) const {
  char name[64];
  std::snprintf(name, sizeof name, "_%06zu.bin", index);
  return opt_.prefix + name;
}

int64_t ShardStreamWriter::total_tokens() const {
  int64_t n = open_count_;
  for (const auto& s : opt_.done) n += s.tokens;
  return n;
}

void ShardStreamWriter::open_shard() {
  tmp_path_ = opt_.dir + "/" + shard_name(opt_.done.size()) + ".tmp";
  fd_ = ::open(tmp_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io_error("create", tmp_path_, errno);
  const std::vector<char> header(kShardHeaderBytes, 0);  // filled in when the shard is closed
  write_all(fd_, header.data(), header.size(), tmp_path_);
  open_count_ = 0;
}

void ShardStreamWriter::flush_buffer() {
  if (buf_.empty()) return;
  if (opt_.version == kShardVersionU16) {
    std::vector<uint16_t> narrow(buf_.begin(), buf_.end());
    write_all(fd_, narrow.data(), narrow.size() * 2, tmp_path_);
  } else {
    write_all(fd_, buf_.data(), buf_.size() * 4, tmp_path_);
  }
  buf_.clear();
}

void ShardStreamWriter::close_shard() {
  flush_buffer();
  int32_t header[3] = {kShardMagic, opt_.version, static_cast<int32_t>(open_count_)};
  if (::pwrite(fd_, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) throw_io_error("write", tmp_path_, errno);
  if (::fsync(fd_) != 0) throw_io_error("fsync", tmp_path_, errno);
  ::close(fd_);
  fd_ = -1;
  const std::string name = shard_name(opt_.done.size());
  const std::string path = opt_.dir + "/" + name;
  const std::string checksum = shard_checksum(tmp_path_);
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path, ec);
  if (ec) throw IoError("cannot rename " + tmp_path_ + " to " + path + ": " + ec.message());
  sync_dir(opt_.dir);
  opt_.done.push_back({name, open_count_, checksum});
  open_count_ = 0;
}

void ShardStreamWriter::push(int64_t ordinal, int64_t offset, std::span<const int32_t> tokens) {
  const int64_t max_id = opt_.version == kShardVersionU16 ? 65535 : std::numeric_limits<int32_t>::max();
  while (!tokens.empty()) {
    if (fd_ < 0) open_shard();
    const size_t n = std::min<size_t>(tokens.size(), static_cast<size_t>(opt_.shard_tokens - open_count_));
    for (size_t i = 0; i < n; ++i) {
      ATOLL_CHECK(tokens[i] >= 0 && tokens[i] <= max_id) << "token id " << tokens[i] << " for " << tmp_path_;
      buf_.push_back(tokens[i]);
      if (buf_.size() == kBufferTokens) flush_buffer();
    }
    open_count_ += static_cast<int64_t>(n);
    offset += static_cast<int64_t>(n);
    tokens = tokens.subspan(n);
    if (open_count_ == opt_.shard_tokens) {
      close_shard();
      point_ = tokens.empty() ? StreamPoint{ordinal + 1, 0} : StreamPoint{ordinal, offset};
      if (opt_.on_shard) opt_.on_shard();
    }
  }
}

std::vector<int32_t> ShardStreamWriter::take_tail(int64_t n) {
  ATOLL_CHECK(n >= 0 && n <= open_count_) << n << " of " << open_count_;
  std::vector<int32_t> tail(static_cast<size_t>(n));
  if (n == 0) return tail;
  flush_buffer();
  const int w = token_bytes(opt_.version);
  const off_t from = kShardHeaderBytes + (open_count_ - n) * w;
  std::vector<char> bytes(static_cast<size_t>(n) * w);
  if (::pread(fd_, bytes.data(), bytes.size(), from) != static_cast<ssize_t>(bytes.size()))
    throw_io_error("read back", tmp_path_, errno);
  for (int64_t i = 0; i < n; ++i) {
    if (w == 2) {
      uint16_t v;
      std::memcpy(&v, bytes.data() + i * 2, 2);
      tail[i] = v;
    } else {
      std::memcpy(&tail[i], bytes.data() + i * 4, 4);
    }
  }
  if (::ftruncate(fd_, from) != 0) throw_io_error("truncate", tmp_path_, errno);
  if (::lseek(fd_, 0, SEEK_END) < 0) throw_io_error("seek", tmp_path_, errno);
  open_count_ -= n;
  return tail;
}

void ShardStreamWriter::finish() {
  if (fd_ >= 0 && open_count_ > 0) close_shard();
  if (fd_ >= 0) {  // opened, then emptied by take_tail
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
    fd_ = -1;
  }
}

}  // namespace atl
