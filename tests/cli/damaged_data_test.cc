// Damaged token shards never train or evaluate without a word (data/shard_list.h): a shard
// overwritten with other in-range ids, a shard meta.json lists but that was deleted, a
// meta.json checksum that does not match. `atoll train` stops with one line naming the shard
// before any checkpoint of it commits; a listed shard missing is refused before the run folder
// is made; `atoll eval` reports no loss of a damaged shard; a mixture checks every dataset.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class DamagedData : public CliTest {
 protected:
  // A copy of the micro world's prepared data.
  std::string copy_of_data(const std::string& name) const {
    base_run();  // prepares it
    const std::string to = dir(name);
    fs::copy(world().data_dir(), to, fs::copy_options::recursive);
    return to;
  }
  // Overwrites the token bytes of `shard` with id 7, keeping its header and size.
  static void overwrite_in_range(const std::string& shard) {
    std::string bytes = read_file(shard);
    for (size_t i = 1024; i + 1 < bytes.size(); i += 2) bytes[i] = 7, bytes[i + 1] = 0;
    write_file(shard, bytes);
  }
};

TEST_F(DamagedData, TrainStopsOnAShardThatChangedBeforeItsCheckpointCommits) {
  const std::string data = copy_of_data("data");
  overwrite_in_range(data + "/train_000000.bin");
  const RunResult r = world().train(dir("run"), {"--set", "data.dir=" + data});
  EXPECT_TRUE(fails_clearly(r, {data + "/train_000000.bin", "checksum", "meta.json"}));
  for (const auto& e : fs::directory_iterator(dir("run") + "/checkpoints"))
    EXPECT_EQ(e.path().filename().string().rfind("step-", 0), std::string::npos) << "committed: " << e.path();
}

TEST_F(DamagedData, AListedShardDeletedIsRefusedBeforeTheRunStarts) {
  const std::string data = copy_of_data("data");
  fs::remove(data + "/val_000000.bin");
  EXPECT_TRUE(fails_clearly(world().train(dir("run"), {"--set", "data.dir=" + data}),
                            {data + "/val_000000.bin", "meta.json", "missing"}));
  EXPECT_FALSE(fs::exists(dir("run")));
  EXPECT_TRUE(fails_clearly(run_atoll({"eval", "--checkpoint", base_run(), "--data", data}),
                            {data + "/val_000000.bin", "missing"}));
}

TEST_F(DamagedData, EvalAndMixturesCheckTheChecksums) {
  const std::string data = copy_of_data("data");
  auto meta = nlohmann::json::parse(read_file(data + "/meta.json"));
  meta["manifest"]["val"][0]["xxh3"] = "0123456789abcdef";
  write_file(data + "/meta.json", meta.dump());
  EXPECT_TRUE(fails_clearly(run_atoll({"eval", "--checkpoint", base_run(), "--data", data}),
                            {data + "/val_000000.bin", "checksum", "0123456789abcdef"}));
  // A mixture of the intact data and this one: training stops, naming the damaged dataset's shard.
  std::string config = world().config_text();
  const std::string data_lines = "input = [\"" + world().corpus() + "\"]\ndir = \"" + world().data_dir() + "\"\n";
  ASSERT_NE(config.find(data_lines), std::string::npos) << config;
  config.replace(config.find(data_lines), data_lines.size(),
                 "mix = [{dir = \"" + world().data_dir() + "\", weight = 0.5}, {dir = \"" + data + "\", weight = 0.5}]\n");
  write_file(dir("mix.toml"), config);
  const RunResult r = run_atoll({"train", "--config", dir("mix.toml"), "--run-dir", dir("run"), "--no-sample"});
  EXPECT_TRUE(fails_clearly(r, {data + "/val_000000.bin", "checksum"}));
}

}  // namespace
}  // namespace atl::testing
