// A damaged newest checkpoint does not block a resume: `atoll train --resume` and `atoll launch
// --resume` fall back to the newest checkpoint that reads back intact (every tensor checked
// against its manifest's size and xxh3), say so on stderr and with a `checkpoint_skipped` event,
// and keep the damaged one (moved aside as step-NNNNNNNN.damaged, byte for byte). The resumed run
// continues exactly as the uninterrupted one did. When every checkpoint is damaged the resume is
// refused, changing nothing, with a fix that does not send the user to an older checkpoint.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using nlohmann::json;

// The events of `run` named `name`.
std::vector<json> events(const std::string& run, const std::string& name) {
  std::vector<json> r;
  for (const auto& e : read_jsonl(run + "/events.jsonl"))
    if (e["event"] == name) r.push_back(e);
  return r;
}

// The loss of each step of metrics.jsonl (the last row of a step wins).
std::map<int64_t, double> losses(const std::string& run) {
  std::map<int64_t, double> r;
  for (const auto& row : read_jsonl(run + "/metrics.jsonl")) r[row["step"].get<int64_t>()] = row["loss"].get<double>();
  return r;
}

// Ways to damage a rank file, as a disk or a careless copy does.
void remove_file(const std::string& path) { fs::remove(path); }
void truncate_file(const std::string& path) { fs::resize_file(path, fs::file_size(path) / 2); }
void flip_a_byte(const std::string& path) {  // in the last tensor's data, not its header
  std::string bytes = read_file(path);
  bytes[bytes.size() - 3] ^= 0x10;
  write_file(path, bytes);
}

class DamagedCheckpoint : public CliTest {
 protected:
  static RunResult resume(const std::string& run, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train", "--resume", "--run-dir", run, "--no-sample"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_atoll(args);
  }
  // The resume passed over `damaged` (a step-* dir, kept aside byte for byte as `kept`) and
  // continued from `from`.
  static void expect_skipped(const RunResult& r, const std::string& run, const std::string& damaged,
                             const std::string& file, const std::map<std::string, std::string>& kept,
                             const std::string& from) {
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.err.find(damaged + " is damaged"), std::string::npos) << r.err;
    const auto skipped = events(run, "checkpoint_skipped");
    ASSERT_EQ(skipped.size(), 1u) << read_file(run + "/events.jsonl");
    EXPECT_EQ(skipped[0]["checkpoint"], run + "/checkpoints/" + damaged);
    EXPECT_NE(skipped[0]["reason"].get<std::string>().find(file), std::string::npos) << skipped[0];
    EXPECT_EQ(skipped[0]["moved_to"], run + "/checkpoints/" + damaged + ".damaged");
    EXPECT_TRUE(skipped[0].contains("time"));
    const auto resumed = events(run, "resume");
    ASSERT_FALSE(resumed.empty());
    EXPECT_EQ(resumed.back()["checkpoint"], run + "/checkpoints/" + from);
    EXPECT_TRUE(unchanged(kept, snapshot(run + "/checkpoints/" + damaged + ".damaged")));
  }
};

TEST_F(DamagedCheckpoint, TrainResumesFromTheNewestIntactCheckpoint) {
  const std::map<int64_t, double> base = losses(base_run());  // steps 1-4, checkpoints at 2 and 4
  const std::vector<std::pair<std::string, void (*)(const std::string&)>> damages = {
      {"missing", remove_file}, {"truncated", truncate_file}, {"flipped", flip_a_byte}};
  for (const auto& [name, damage] : damages) {
    SCOPED_TRACE(name);
    const std::string run = copy_of_base_run(name);
    damage(run + "/checkpoints/step-00000004/rank-00000.safetensors");
    const auto kept = snapshot(run + "/checkpoints/step-00000004");
    const RunResult r = resume(run, {});
    expect_skipped(r, run, "step-00000004", "rank-00000.safetensors", kept, "step-00000002");
    // Steps 3 and 4 again, exactly as the uninterrupted run trained them; its step 4 saved anew.
    EXPECT_EQ(losses(run), base) << read_file(run + "/metrics.jsonl");
    EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-00000004\n");
    // A later resume finds the new checkpoint intact and skips nothing more.
    const RunResult again = resume(run, {"--set", "train.steps=6"});
    ASSERT_EQ(again.exit_code, 0) << again.describe();
    EXPECT_EQ(events(run, "checkpoint_skipped").size(), 1u);
    EXPECT_TRUE(fs::exists(run + "/checkpoints/step-00000004.damaged"));
  }
}

TEST_F(DamagedCheckpoint, EveryCheckpointDamagedIsRefusedAndChangesNothing) {
  const std::string run = copy_of_base_run();
  flip_a_byte(run + "/checkpoints/step-00000004/rank-00000.safetensors");
  remove_file(run + "/checkpoints/step-00000002/rank-00000.safetensors");
  const auto before = snapshot(run);
  const RunResult r = resume(run, {"--set", "train.steps=6"});
  EXPECT_TRUE(fails_clearly(r, {run + "/checkpoints", "step-00000004", "step-00000002", "rank-00000.safetensors"}));
  EXPECT_EQ(r.err.find("older checkpoint"), std::string::npos) << r.err;
  const RunResult l = run_atoll({"launch", "--resume", "--run-dir", run, "--islands", "1"});
  EXPECT_TRUE(fails_clearly(l, {run + "/checkpoints", "step-00000004", "step-00000002"}));
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

// launch --resume: the launcher picks the checkpoint for every worker, so all agree on it.
TEST_F(DamagedCheckpoint, LaunchResumesEveryWorkerFromTheNewestIntactCheckpoint) {
  const std::string run = dir("islands");
  const std::vector<std::string> launch = {"launch", "--config", world().config(), "--run-dir", run, "--islands", "2",
                                           "--set", "diloco.inner_steps=2", "--set", "train.eval_every=0"};
  const RunResult first = run_atoll(launch);
  ASSERT_EQ(first.exit_code, 0) << first.describe();
  remove_file(run + "/checkpoints/step-00000004/rank-00001.safetensors");
  const auto kept = snapshot(run + "/checkpoints/step-00000004");
  std::vector<std::string> again = launch;
  again.insert(again.end(), {"--resume", "--set", "train.steps=6"});
  const RunResult r = run_atoll(again);
  expect_skipped(r, run, "step-00000004", "rank-00001.safetensors", kept, "step-00000002");
  EXPECT_EQ(read_file(run + "/checkpoints/latest"), "step-00000006\n");
}

}  // namespace
}  // namespace atl::testing
