#include "atoll/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/file_writer.h"

namespace atl {

// The format is little-endian and the code reads it in place; a big-endian port would add
// byte swaps here and in ShardView::read.
static_assert(std::endian::native == std::endian::little, "shards are read in place");

namespace {

int token_bytes(int32_t version) { return version == kShardVersionU16 ? 2 : 4; }

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw DataError("token shard " + path + ": " + what +
                  "; fix: regenerate it with `atoll data prepare` (or llm.c's data scripts)");
}

}  // namespace

void write_shard(const std::string& path, std::span<const int32_t> tokens, int32_t version) {
  ATOLL_CHECK_LE(tokens.size(), static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      << "a shard holds at most 2^31-1 tokens (llm.c's int32 count): " << path;
  int32_t max_id = 0;
  for (int32_t t : tokens) {
    ATOLL_CHECK_GE(t, 0) << "negative token id for " << path;
    max_id = std::max(max_id, t);
  }
  if (version == 0) version = max_id <= 65535 ? kShardVersionU16 : kShardVersionU32;
  ATOLL_CHECK(version == kShardVersionU16 || version == kShardVersionU32) << version;
  ATOLL_CHECK(version != kShardVersionU16 || max_id <= 65535)
      << "token id " << max_id << " does not fit a uint16 shard: " << path;

  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = path + ".tmp";
  {
    FileWriter out(tmp);  // an IoError names the path and the reason (a full disk: "disk full")
    out.write(header, sizeof(header));
    // Narrow in chunks rather than building a second full-size copy of the tokens.
    constexpr size_t kChunk = 1 << 16;
    std::vector<uint16_t> narrow(version == kShardVersionU16 ? kChunk : 0);
    for (size_t i = 0; i < tokens.size(); i += kChunk) {
      const size_t n = std::min(kChunk, tokens.size() - i);
      if (version == kShardVersionU16) {
        for (size_t j = 0; j < n; ++j) narrow[j] = static_cast<uint16_t>(tokens[i + j]);
        out.write(narrow.data(), n * 2);
      } else {
        out.write(tokens.data() + i, n * 4);
      }
    }
    out.close();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw IoError("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

std::vector<int32_t> read_shard(const std::string& path) {
  ShardView view(path);
  std::vector<int32_t> tokens(static_cast<size_t>(view.size()));
  view.read(0, view.size(), tokens.data());
  return tokens;
}

ShardView::ShardView(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw DataError("token shard " + path + ": cannot open (" + std::strerror(errno) +
                    "); fix: check the path, or run `atoll data prepare` to make shards");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    corrupt(path, "not a regular file");
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    corrupt(path, "file is " + std::to_string(file_bytes) + " bytes, shorter than the " +
                      std::to_string(kShardHeaderBytes) + "-byte header (truncated)");
  }
  map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw IoError("cannot map token shard " + path + ": " + std::strerror(errno));
  }
  map_bytes_ = static_cast<size_t>(file_bytes);

  int32_t header[3];
  std::memcpy(header, map_, sizeof(header));
  try {
    if (header[0] != kShardMagic) {
      corrupt(path, "bad magic " + std::to_string(header[0]) + " (expected " + std::to_string(kShardMagic) +
                        "): not an llm.c/atoll token shard");
    }
    if (header[1] != kShardVersionU16 && header[1] != kShardVersionU32) {
      corrupt(path, "unknown version " + std::to_string(header[1]) + " (known: 1 = uint16 tokens, 2 = uint32 tokens)");
    }
    version_ = header[1];
    n_tokens_ = header[2];
    const int64_t expected = kShardHeaderBytes + n_tokens_ * token_bytes(version_);
    if (n_tokens_ < 0 || expected != file_bytes) {
      corrupt(path, "header says " + std::to_string(n_tokens_) + " tokens (" + std::to_string(expected) +
                        " bytes) but the file is " + std::to_string(file_bytes) + " bytes (truncated or corrupt)");
    }
  } catch (...) {
    unmap();
    throw;
  }
  body_ = static_cast<const uint8_t*>(map_) + kShardHeaderBytes;
}

ShardView::~ShardView() { unmap(); }

void ShardView::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  body_ = nullptr;
}

ShardView::ShardView(ShardView&& other) noexcept { *this = std::move(other); }

ShardView& ShardView::operator=(ShardView&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    version_ = other.version_;
    n_tokens_ = other.n_tokens_;
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    body_ = std::exchange(other.body_, nullptr);
    other.n_tokens_ = 0;
  }
  return *this;
}

int32_t ShardView::token(int64_t i) const {
  ATOLL_CHECK(i >= 0 && i < n_tokens_) << i << " outside " << path_;
  if (version_ == kShardVersionU16) {
    uint16_t v;
    std::memcpy(&v, body_ + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, body_ + i * 4, 4);
  return static_cast<int32_t>(v);
}

void ShardView::read(int64_t start, int64_t count, int32_t* out) const {
  ATOLL_CHECK(start >= 0 && count >= 0 && start + count <= n_tokens_)
      << "[" << start << ", " << start + count << ") outside " << path_ << " of " << n_tokens_;
  if (version_ == kShardVersionU16) {
    const uint8_t* p = body_ + start * 2;
    for (int64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      out[i] = v;
    }
  } else {
    std::memcpy(out, body_ + start * 4, static_cast<size_t>(count) * 4);
  }
}

std::pair<int64_t, int64_t> ShardView::max_token() const {
  int64_t best = -1;
  int64_t where = -1;
  for (int64_t i = 0; i < n_tokens_; ++i) {
    int64_t t;
    if (version_ == kShardVersionU16) {
      uint16_t v;
      std::memcpy(&v, body_ + i * 2, 2);
      t = v;
    } else {
      uint32_t v;
      std::memcpy(&v, body_ + i * 4, 4);
      t = v;
    }
    if (t > best) {
      best = t;
      where = i;
    }
  }
  return {best, where};
}

}  // namespace atl
