// Token shards checked against their dataset's meta.json (shard_list.h, shard_verifier.h): a
// listed shard deleted, a shard added, a token count changed are refused when the data is
// opened, naming the shard; a shard overwritten with other in-range ids, or a checksum that
// does not match, is reported by check_integrity (at once with wait = true), for a folder, a
// single .bin file of a prepared folder and a mixture alike. Shards no meta.json lists keep
// loading, unchecked.
#include "atoll/data/shard_list.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "atoll/core/errors.h"
#include "atoll/data/loader.h"
#include "atoll/data/mixture_loader.h"
#include "atoll/data/shard.h"
#include "atoll/data/shard_writer.h"
#include "data/temp_dir.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr int kT = 4;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::vector<int32_t> tokens(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (first + i) % 1000;
  return t;
}

// A prepared dataset as `atoll data prepare` leaves it: train_000000/1.bin, val_000000.bin and
// meta.json listing each with its token count and checksum.
std::string make_dataset(const TempDir& root, const std::string& name) {
  const std::string dir = root / name;
  fs::create_directories(dir);
  nlohmann::json manifest = {{"train", nlohmann::json::array()}, {"val", nlohmann::json::array()}};
  auto add = [&](const std::string& split, const std::string& file, int n, int first) {
    write_shard(dir + "/" + file, tokens(n, first));
    manifest[split].push_back(ShardRecord{file, n, shard_checksum(dir + "/" + file)});
  };
  add("train", "train_000000.bin", 41, 0);
  add("train", "train_000001.bin", 33, 100);
  add("val", "val_000000.bin", 21, 500);
  testing::write_file(dir + "/meta.json", nlohmann::json{{"format", "atoll-data-2"}, {"manifest", manifest}}.dump());
  return dir;
}

// `f` throws DataError whose message names every one of `names`.
template <class F>
void expect_data_error(F&& f, const std::vector<std::string>& names) {
  try {
    f();
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    for (const std::string& n : names) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fix:"), std::string::npos) << e.what();
  }
}

DataLoader open(const std::string& path, const std::string& split = "train") {
  return DataLoader(path, split, {.seq_len = kT, .prefetch = false});
}

TEST(ShardList, AnIntactDatasetLoadsAndVerifies) {
  TempDir root;
  const std::string dir = make_dataset(root, "ds");
  const auto listed = list_shards(dir, "train");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[1].path, dir + "/train_000001.bin");
  EXPECT_EQ(listed[1].xxh3, shard_checksum(dir + "/train_000001.bin"));
  for (const char* split : {"train", "val"}) EXPECT_NO_THROW(open(dir, split).check_integrity(/*wait=*/true));
}

TEST(ShardList, TheListAndSizesAreCheckedWhenTheDataIsOpened) {
  TempDir root;
  const std::string missing = make_dataset(root, "missing");
  fs::remove(missing + "/train_000001.bin");
  expect_data_error([&] { open(missing); }, {missing + "/train_000001.bin", "meta.json", "missing"});

  const std::string added = make_dataset(root, "added");
  write_shard(added + "/train_000002.bin", tokens(41, 7));
  expect_data_error([&] { open(added); }, {added + "/train_000002.bin", "not listed", "meta.json"});

  const std::string resized = make_dataset(root, "resized");
  write_shard(resized + "/val_000000.bin", tokens(25, 500));  // a valid shard of another size
  expect_data_error([&] { open(resized, "val"); }, {resized + "/val_000000.bin", "25 tokens", "says 21"});
}

TEST(ShardList, ChangedTokensAndWrongChecksumsAreFound) {
  TempDir root;
  const std::string changed = make_dataset(root, "changed");
  write_shard(changed + "/train_000001.bin", std::vector<int32_t>(33, 7));  // in range, same count
  const DataLoader loader = open(changed);
  expect_data_error([&] { loader.check_integrity(/*wait=*/true); }, {changed + "/train_000001.bin", "checksum"});
  expect_data_error([&] { loader.check_integrity(/*wait=*/false); }, {"train_000001.bin"});  // stays reported

  const std::string lie = make_dataset(root, "lie");
  auto meta = nlohmann::json::parse(read_text(lie + "/meta.json"));
  meta["manifest"]["val"][0]["xxh3"] = "0123456789abcdef";
  testing::write_file(lie + "/meta.json", meta.dump());
  expect_data_error([&] { open(lie, "val").check_integrity(true); }, {lie + "/val_000000.bin", "0123456789abcdef"});
  // A single shard of a prepared folder is checked against the folder's meta.json.
  expect_data_error([&] { open(lie + "/val_000000.bin").check_integrity(true); }, {"val_000000.bin", "checksum"});
}

TEST(ShardList, AMixtureChecksEveryDataset) {
  TempDir root;
  const std::string good = make_dataset(root, "good"), bad = make_dataset(root, "bad");
  write_shard(bad + "/train_000000.bin", std::vector<int32_t>(41, 3));
  const MixtureLoader mix({{.at_tokens = 0, .mix = {{.dir = good, .weight = 0.5}, {.dir = bad, .weight = 0.5}}}},
                          "train", {.seq_len = kT, .prefetch = false});
  expect_data_error([&] { mix.check_integrity(/*wait=*/true); }, {bad + "/train_000000.bin", "checksum"});
}

TEST(ShardList, ShardsWithoutMetaJsonLoadUnchecked) {
  TempDir root;
  const std::string dir = make_dataset(root, "llmc");
  fs::remove(dir + "/meta.json");
  write_shard(dir + "/train_000001.bin", std::vector<int32_t>(50, 9));
  const auto listed = list_shards(dir, "train");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].xxh3, "");
  EXPECT_NO_THROW(open(dir).check_integrity(true));
  EXPECT_NO_THROW(open(dir + "/train_000001.bin").check_integrity(true));
}

}  // namespace
}  // namespace atl
