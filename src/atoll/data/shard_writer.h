// Writing a token stream as fixed-size llm.c shards (shard.h), the way `atoll data prepare`
// does at any corpus size: `<prefix>_000000.bin`, `<prefix>_000001.bin`, ... of exactly
// shard_tokens tokens each, the last one shorter. Tokens go to `<name>.tmp` as they come (memory
// stays a 64 Ki-token buffer whatever the shard size); a full shard gets its header, is
// fsynced and renamed into place, so a reader (or a resumed prepare) sees whole shards only.
//
// Resuming: each finished shard moves the stream's commit point, the first item (document
// piece, by ordinal; document_stream.h) whose tokens are not all in finished shards and how
// many of its tokens are. A writer built with the shards already done and that point continues
// the stream exactly, when it is given the same items from that point on.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

namespace atl {

// One row of a dataset's manifest.
struct ShardRecord {
  std::string name;  // file name in the dataset folder
  int64_t tokens = 0;
  std::string xxh3;  // XXH3-64 of the token bytes (the file after its 1024-byte header), hex
  bool operator==(const ShardRecord&) const = default;
};
void to_json(nlohmann::json& j, const ShardRecord& r);
void from_json(const nlohmann::json& j, ShardRecord& r);

struct StreamPoint {
  int64_t item = 0;    // ordinal of the first item not wholly in finished shards
  int64_t tokens = 0;  // how many of its tokens are
};

// XXH3-64 of a shard file's token bytes, hex. Throws DataError if it is not a valid shard.
// `stop` (optional) ends the reading early when it turns true (the result is then meaningless).
std::string shard_checksum(const std::string& path, const std::atomic<bool>* stop = nullptr);

class ShardStreamWriter {
 public:
  struct Options {
    std::string dir, prefix;
    int64_t shard_tokens = 0;
    int32_t version = 0;               // shard.h: 1 = uint16 tokens, 2 = uint32
    std::vector<ShardRecord> done;     // shards already finished (resuming)
    StreamPoint resume;                // where the stream stood after them
    std::function<void()> on_shard;    // called after each shard is in place
  };
  explicit ShardStreamWriter(Options options);
  ~ShardStreamWriter();
  ShardStreamWriter(const ShardStreamWriter&) = delete;
  ShardStreamWriter& operator=(const ShardStreamWriter&) = delete;

  // Items before the resume point are in finished shards already; of the item at it, the first
  // skip(ordinal) tokens are.
  bool needs(int64_t ordinal) const { return ordinal >= opt_.resume.item; }
  int64_t skip(int64_t ordinal) const { return ordinal == opt_.resume.item ? opt_.resume.tokens : 0; }

  // Appends the tokens of item `ordinal` from its token `offset` on (the rest of the item).
  void push(int64_t ordinal, int64_t offset, std::span<const int32_t> tokens);
  // Removes the last n tokens (at most what the open shard holds) and returns them.
  std::vector<int32_t> take_tail(int64_t n);
  // Writes the last, partial shard.
  void finish();

  int64_t open_tokens() const { return open_count_; }  // in the shard being written
  int64_t total_tokens() const;
  const std::vector<ShardRecord>& shards() const { return opt_.done; }
  StreamPoint point() const { return point_; }

 private:
  void open_shard();
  void flush_buffer();
  void close_shard();
  std::string shard_name(size_t index) const;

  Options opt_;
  StreamPoint point_;
  int fd_ = -1;
  std::string tmp_path_;
  int64_t open_count_ = 0;
  std::vector<int32_t> buf_;
};

}  // namespace atl
