// The sharded save (ckpt/checkpoint_plan.h, write_checkpoint_part, commit_checkpoint): writers of
// 1, 2, 3 and 5 (more writers than some copies' entries, and counts that do not divide the
// layout) each write the part the plan gives them; the committed checkpoint loads bit for bit
// through the one loader, its manifest lists every writer's file, and a missing island's copy
// (an alias) reads the first live island's bytes. A zero-byte or truncated part, or a manifest
// naming a missing file, is refused naming the file and the fix.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/ckpt/checkpoint_plan.h"
#include "atoll/core/errors.h"
#include "ckpt/ckpt_test_util.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::has;
using testing::ScratchDir;

struct Sharded {
  Config cfg;
  ParamLayout layout;
  std::map<std::string, std::vector<float>> copies;  // kind -> buffer
  Sharded() {
    cfg.model = testing::small_model();
    layout = ParamLayout::build(cfg.model);
    int seed = 1;
    for (const char* kind : {"param", "island1_param", "diloco_theta"}) copies[kind] = testing::pattern(layout.total(), seed++);
  }
  // Island 0 holds "param" (writers 0..M-1), island 1 "island1_param" (M..2M-1), θ every writer.
  std::string save(const std::string& run, int M, int64_t step, const std::map<std::string, std::string>& aliases = {}) {
    std::vector<int> all, island0, island1;
    for (int r = 0; r < M; ++r) island0.push_back(r), island1.push_back(M + r), all.push_back(r);
    for (int r = 0; r < M; ++r) all.push_back(M + r);
    const std::vector<PlanCopy> plan_copies = {{"param", island0}, {"island1_param", island1}, {"diloco_theta", all}};
    const CheckpointPlan plan = plan_checkpoint(plan_copies, layout);
    const std::string tmp = checkpoint_temp_dir(run, step, 42);
    std::vector<json> parts;
    for (int w : all) {
      std::vector<PartTensor> mine;
      for (size_t c = 0; c < plan_copies.size(); ++c)
        for (size_t e = 0; e < layout.entries().size(); ++e)
          if (plan[c][e] == w) {
            const ParamEntry& pe = layout.entries()[e];
            mine.push_back({plan_copies[c].kind + "/" + pe.name, pe.shape, copies[plan_copies[c].kind].data() + pe.offset, pe.numel});
          }
      parts.push_back(write_checkpoint_part(tmp, w, mine));
    }
    return commit_checkpoint({.run_dir = run, .temp_dir = tmp, .step = step, .islands = 2, .workers_per_island = M,
                              .aliases = aliases},
                             cfg, parts, json{{"step", step}});
  }
  void expect_loads(const std::string& dir, const std::string& kind, const std::string& as) {
    std::vector<float> got(layout.total(), 0.0f);
    load_checkpoint(dir, cfg.model, layout, {{kind, got.data()}});
    for (const auto& e : layout.entries())
      EXPECT_EQ(std::memcmp(got.data() + e.offset, copies[as].data() + e.offset, e.numel * sizeof(float)), 0)
          << kind << " " << e.name;
  }
};

TEST(ShardedCheckpoint, PlanGivesEveryEntryToOneHolderAndBalancesTheBytes) {
  const ParamLayout layout = ParamLayout::build(testing::small_model());
  for (int M : {1, 2, 3, 5}) {
    std::vector<int> holders;
    for (int r = 0; r < M; ++r) holders.push_back(10 + r);
    const CheckpointPlan plan = plan_checkpoint({{"a", holders}, {"b", holders}}, layout);
    std::map<int, size_t> bytes;
    for (const auto& copy : plan)
      for (size_t e = 0; e < copy.size(); ++e) {
        ASSERT_TRUE(copy[e] >= 10 && copy[e] < 10 + M) << copy[e];
        bytes[copy[e]] += layout.entries()[e].numel;
      }
    EXPECT_EQ(bytes.size(), size_t(M)) << "every holder writes a share";
    size_t lo = SIZE_MAX, hi = 0, largest = 0;
    for (const auto& [w, b] : bytes) lo = std::min(lo, b), hi = std::max(hi, b);
    for (const auto& e : layout.entries()) largest = std::max(largest, e.numel);
    EXPECT_LE(hi - lo, largest) << "M " << M << ": greedy balance is within one entry";
  }
}

TEST(ShardedCheckpoint, EveryWriterWritesItsPartAndAnyShapeLoadsIt) {
  for (int M : {1, 2, 3, 5}) {
    ScratchDir run;
    Sharded s;
    const std::string dir = s.save(run.str(), M, 7);
    const json m = json::parse(std::ifstream(dir + "/manifest.json"));
    EXPECT_EQ(m["files"].size(), size_t(2 * M));
    EXPECT_EQ(m["world_size"].get<int>(), 2 * M);
    for (int w = 0; w < 2 * M; ++w) EXPECT_TRUE(fs::exists(dir + "/" + checkpoint_part_name(w))) << w;
    for (const char* kind : {"param", "island1_param", "diloco_theta"}) s.expect_loads(dir, kind, kind);
    verify_checkpoint(dir, s.cfg.model);
    EXPECT_EQ(latest_checkpoint(run.str()), dir);
    EXPECT_FALSE(fs::exists(checkpoint_temp_dir(run.str(), 7, 42)));
  }
}

TEST(ShardedCheckpoint, AMissingIslandsCopyReadsTheFirstLiveIslands) {
  ScratchDir run;
  Sharded s;
  const ParamLayout& layout = s.layout;
  std::map<std::string, std::string> aliases;
  for (const auto& e : layout.entries()) aliases["island2_param/" + e.name] = "param/" + e.name;
  const std::string dir = s.save(run.str(), 2, 3, aliases);
  s.expect_loads(dir, "island2_param", "param");
}

TEST(ShardedCheckpoint, AZeroByteOrMissingPartIsRefusedNamingItAndTheFix) {
  ScratchDir run;
  Sharded s;
  const std::string old_dir = s.save(run.str(), 2, 1);
  const std::string dir = s.save(run.str(), 2, 2);
  const std::string part = dir + "/" + checkpoint_part_name(3);
  fs::resize_file(part, 0);
  try {
    verify_checkpoint(dir, s.cfg.model);
    ADD_FAILURE() << "a zero-byte part loads";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_TRUE(has(e.what(), checkpoint_part_name(3)) && has(e.what(), "truncated") && has(e.what(), "fix")) << e.what();
  }
  fs::remove(part);
  try {
    verify_checkpoint(dir, s.cfg.model);
    ADD_FAILURE() << "a checkpoint with a part missing loads";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_TRUE(has(e.what(), checkpoint_part_name(3)) && has(e.what(), "fix")) << e.what();
  }
  verify_checkpoint(old_dir, s.cfg.model);  // the older one untouched
}

}  // namespace
}  // namespace atl
