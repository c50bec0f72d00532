#include "atoll/data/shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "atoll/core/errors.h"
#include "data/temp_dir.h"

namespace atl {
namespace {

using testing::TempDir;
using testing::write_file;

// Raw llm.c-style file: header ints, then a token body given as bytes.
std::string raw_shard(int32_t magic, int32_t version, int32_t count, const std::string& body) {
  int32_t header[kShardHeaderInts] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  return std::string(reinterpret_cast<const char*>(header), sizeof(header)) + body;
}

// Expects a DataError whose message names `path` and contains `what`.
template <typename F>
void expect_data_error(F&& f, const std::string& path, const std::string& what) {
  try {
    f();
    FAIL() << "no DataError for " << path;
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(Shard, RoundTripUint16) {
  TempDir dir;
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 70000; ++i) tokens.push_back((i * 7919) % 65536);
  tokens.push_back(65535);
  const std::string path = dir / "a.bin";
  write_shard(path, tokens);
  EXPECT_EQ(std::filesystem::file_size(path), 1024 + tokens.size() * 2);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(read_shard(path), tokens);
  ShardView view(path);
  EXPECT_EQ(view.version(), kShardVersionU16);
  EXPECT_EQ(view.size(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(view.token(3), tokens[3]);
  EXPECT_EQ(view.max_token().first, 65535);
}

TEST(Shard, RoundTripUint32) {
  TempDir dir;
  const std::vector<int32_t> tokens = {0, 65535, 65536, 100000, 2147483647, 5};
  const std::string path = dir / "b.bin";
  write_shard(path, tokens);  // the largest id picks version 2
  EXPECT_EQ(std::filesystem::file_size(path), 1024 + tokens.size() * 4);
  EXPECT_EQ(read_shard(path), tokens);
  ShardView view(path);
  EXPECT_EQ(view.version(), kShardVersionU32);
  EXPECT_EQ(view.max_token(), (std::pair<int64_t, int64_t>{2147483647, 4}));

  // Forcing version 2 for small ids works too (a dataset with a large vocabulary).
  write_shard(path, std::vector<int32_t>{1, 2, 3}, kShardVersionU32);
  EXPECT_EQ(ShardView(path).version(), kShardVersionU32);
  EXPECT_EQ(read_shard(path), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(shard_version_for_vocab(65536), kShardVersionU16);
  EXPECT_EQ(shard_version_for_vocab(65537), kShardVersionU32);
}

TEST(Shard, EmptyShard) {
  TempDir dir;
  write_shard(dir / "e.bin", {});
  EXPECT_TRUE(read_shard(dir / "e.bin").empty());
}

TEST(Shard, HandWrittenLlmcFileLoads) {
  TempDir dir;
  const uint16_t body[5] = {10, 20, 30, 40, 65000};
  write_file(dir / "llmc.bin", raw_shard(20240520, 1, 5, std::string(reinterpret_cast<const char*>(body), 10)));
  EXPECT_EQ(read_shard(dir / "llmc.bin"), (std::vector<int32_t>{10, 20, 30, 40, 65000}));
}

TEST(Shard, BadMagicIsDataError) {
  TempDir dir;
  const std::string path = dir / "magic.bin";
  write_file(path, raw_shard(12345, 1, 0, ""));
  expect_data_error([&] { read_shard(path); }, path, "bad magic 12345");
}

TEST(Shard, WrongVersionIsDataError) {
  TempDir dir;
  const std::string path = dir / "version.bin";
  write_file(path, raw_shard(20240520, 3, 1, "abcd"));
  expect_data_error([&] { read_shard(path); }, path, "unknown version 3");
}

TEST(Shard, TruncatedIsDataError) {
  TempDir dir;
  const std::string path = dir / "trunc.bin";
  write_file(path, raw_shard(20240520, 1, 5, std::string(8, '\0')));  // 4 of 5 tokens
  expect_data_error([&] { read_shard(path); }, path, "truncated");
  write_file(path, std::string(100, '\0'));  // not even a header
  expect_data_error([&] { read_shard(path); }, path, "truncated");
}

TEST(Shard, MissingFileIsDataError) {
  TempDir dir;
  const std::string path = dir / "none.bin";
  expect_data_error([&] { read_shard(path); }, path, "cannot open");
}

}  // namespace
}  // namespace atl
