// The messages of a state transfer as a receiver reads them (train/state_transfer.h): checked
// whole against the registry's entries, so a peer's malformed or foreign message is a PeerLost
// (a record from the store an IoError) before anything is applied.
#include <gtest/gtest.h>

#include "atoll/core/errors.h"
#include "atoll/train/state_transfer.h"

namespace atl {
namespace {

using nlohmann::json;

struct Messages : ::testing::Test {
  Config cfg;
  std::vector<StateEntry> entries = state_registry(cfg, /*diloco=*/true, nullptr);
  json manifest() const {
    json m = json::object();
    for (const StateEntry& e : entries)
      if (e.type == StateType::kTensor && e.division != Division::kShardedInIsland) m[e.name] = {{"hash", "00"}};
    m["step"] = {{"value", 4}};
    m["tokens"] = {{"value", 400}};
    m["optimizer_step"] = {{"value", 4}};
    m["fragment_outer_steps"] = {{"value", {1}}};
    return m;
  }
};

TEST_F(Messages, TheSourcesManifestIsCheckedEntryByEntry) {
  EXPECT_NO_THROW(parse_transfer_manifest(manifest().dump(), entries));
  EXPECT_THROW(parse_transfer_manifest("{", entries), PeerLost);
  json m = manifest();
  m.erase("diloco_theta");
  EXPECT_THROW(parse_transfer_manifest(m.dump(), entries), PeerLost);
  m = manifest();
  m["param"] = {{"hash", 5}};
  EXPECT_THROW(parse_transfer_manifest(m.dump(), entries), PeerLost);
  m = manifest();
  m["step"] = {{"value", "four"}};
  EXPECT_THROW(parse_transfer_manifest(m.dump(), entries), PeerLost);
  m = manifest();
  m["fragment_outer_steps"] = {{"value", {1.5}}};
  EXPECT_THROW(parse_transfer_manifest(m.dump(), entries), PeerLost);
  m = manifest();
  m["fragment_outer_steps"] = {{"value", {1, 2}}};  // another diloco.fragments
  EXPECT_THROW(parse_transfer_manifest(m.dump(), entries), PeerLost);
}

// The sender looks each refused name up among its entries: one it does not send is refused
// here rather than looked up.
TEST_F(Messages, RefusalsNameOnlyTensorsTheTransferSends) {
  EXPECT_EQ(parse_refusals(R"(["param", "diloco_theta"])", entries),
            (std::vector<std::string>{"param", "diloco_theta"}));
  EXPECT_TRUE(parse_refusals("[]", entries).empty());
  for (const char* bad : {R"(["nope"])", R"(["step"])", R"(["diloco_residual"])", "[1]", "{}", "x"})
    EXPECT_THROW(parse_refusals(bad, entries), PeerLost) << bad;
}

TEST_F(Messages, AWorkerRecordFromTheStoreIsChecked) {
  EXPECT_NO_THROW(parse_worker_record("{}", entries));
  for (const char* bad : {"not json", "[]", R"({"loaders": "x"})", R"({"loaders": {"epoch": "1"}})",
                          // A float where the cursor holds an integer (past int64: a cast would be undefined).
                          R"({"loaders": {"epoch": 1e30, "position": 5, "seq_len": 64, "n_windows": 100, "seed": 7,
                                          "shuffle": true, "worker": 1, "n_workers": 2}})"})
    EXPECT_THROW(parse_worker_record(bad, entries), IoError) << bad;
}

}  // namespace
}  // namespace atl
