// Token shards in llm.c's `.bin` format, so shards made by llm.c's data scripts load unchanged.
//
// Layout (all little-endian):
//   header: 256 x int32. header[0] = 20240520 (magic), header[1] = version,
//           header[2] = token count N; the rest is zero.
//   body:   version 1: N x uint16 tokens (llm.c's format; vocabularies up to 65,536 ids).
//           version 2: N x uint32 tokens (atoll's extension for vocabularies above 65,536;
//           llm.c itself does not read it).
// The file size is therefore exactly 1024 + N * (2 or 4) bytes; anything else is corrupt.
// The token count is an int32 as in llm.c, so a shard holds at most 2^31 - 1 tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace atl {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersionU16 = 1;
constexpr int32_t kShardVersionU32 = 2;
constexpr int kShardHeaderInts = 256;
constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// The version a dataset of this vocabulary is written with: uint16 while every id fits.
inline int32_t shard_version_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? kShardVersionU16 : kShardVersionU32;
}

// Writes `tokens` to `path` (to `path.tmp`, then renamed, so a reader never sees half a file).
// version 0 picks the narrowest one that holds the largest token. Token ids must be
// non-negative and fit the version (checked). Throws IoError when the file cannot be written.
void write_shard(const std::string& path, std::span<const int32_t> tokens, int32_t version = 0);

// Reads and validates a whole shard. Throws DataError naming the file for a bad magic, an
// unknown version or a size that disagrees with the token count (truncated or padded).
std::vector<int32_t> read_shard(const std::string& path);

// A shard mapped read-only into memory (validated as read_shard does), so that large shards
// cost no heap and pages load on first touch. Movable, not copyable.
class ShardView {
 public:
  explicit ShardView(const std::string& path);
  ~ShardView();
  ShardView(ShardView&& other) noexcept;
  ShardView& operator=(ShardView&& other) noexcept;
  ShardView(const ShardView&) = delete;
  ShardView& operator=(const ShardView&) = delete;

  const std::string& path() const { return path_; }
  int32_t version() const { return version_; }
  int64_t size() const { return n_tokens_; }  // N
  int32_t token(int64_t i) const;
  // Copies tokens [start, start + count) into out[count] as int32 (range checked).
  void read(int64_t start, int64_t count, int32_t* out) const;
  // The largest id (read unsigned, so a uint32 id above 2^31 is not mistaken for a small
  // one) and its first position; (-1, -1) for an empty shard.
  std::pair<int64_t, int64_t> max_token() const;

 private:
  void unmap();
  std::string path_;
  int32_t version_ = 0;
  int64_t n_tokens_ = 0;
  void* map_ = nullptr;  // whole file
  size_t map_bytes_ = 0;
  const uint8_t* body_ = nullptr;  // first token
};

}  // namespace atl
