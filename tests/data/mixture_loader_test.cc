// Mixture tests on the exact oracle of tokens that name their place: dataset d's shard s holds
// tokens d*100000 + s*10000 + i, so a window's first token names its dataset, shard and window.
#include "atoll/data/mixture_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "atoll/core/errors.h"
#include "data/temp_dir.h"

namespace atl {
namespace {

using testing::TempDir;

constexpr int kT = 4;

// Dataset d: `shards` train shards of `windows` windows each.
std::string make_dataset(const TempDir& root, int d, int shards, int windows) {
  const std::string dir = root / ("ds" + std::to_string(d));
  std::filesystem::create_directories(dir);
  for (int s = 0; s < shards; ++s) {
    std::vector<int32_t> tokens(size_t(windows) * kT + 1);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(d * 100000 + s * 10000 + int(i));
    char name[64];
    std::snprintf(name, sizeof name, "/train_%06d.bin", s);
    write_shard(dir + name, tokens);
  }
  return dir;
}

int dataset_of(int32_t token) { return token / 100000; }

// First tokens of the windows of one batch of B.
std::vector<int32_t> starts(MixtureLoader& loader, int B) {
  std::vector<int32_t> x(size_t(B) * kT), y(size_t(B) * kT), out;
  loader.next_batch(B, x.data(), y.data());
  for (int b = 0; b < B; ++b) {
    EXPECT_EQ(y[size_t(b) * kT], x[size_t(b) * kT] + 1) << "targets are the inputs shifted by one";
    out.push_back(x[size_t(b) * kT]);
  }
  return out;
}

std::vector<DataPhase> one_phase(std::vector<MixSource> mix) { return {DataPhase{.at_tokens = 0, .mix = std::move(mix)}}; }

class MixtureTest : public ::testing::Test {
 protected:
  TempDir root_;
  std::string a_ = make_dataset(root_, 0, 2, 50), b_ = make_dataset(root_, 1, 1, 70), c_ = make_dataset(root_, 2, 3, 20);
};

// Smooth weighted round-robin: after n windows, dataset i has given n*p_i windows to within
// less than max(1, N-1) (the bound from the schedule's construction in mixture_loader.h), at
// every prefix, whatever the batch sizes; here N = 3, so within 2 windows over 2000.
TEST_F(MixtureTest, ProportionsHoldAtEveryPrefix) {
  const std::vector<double> w = {0.5, 0.3, 0.2};
  MixtureLoader loader(one_phase({{a_, w[0]}, {b_, w[1]}, {c_, w[2]}}), "train", {.seq_len = kT, .seed = 7});
  loader.enter_phase(0);
  std::vector<int64_t> count(3, 0);
  double worst = 0;
  for (int64_t n = 1; n <= 2000; ++n) {
    ++count[size_t(dataset_of(starts(loader, 1)[0]))];
    for (size_t i = 0; i < 3; ++i) worst = std::max(worst, std::abs(double(count[i]) - double(n) * w[i]));
  }
  EXPECT_LT(worst, 2.0);
  EXPECT_EQ(count[0], 1000);
  EXPECT_EQ(count[1], 600);
  EXPECT_EQ(count[2], 400);
}

// The schedule does not depend on how the windows are cut into batches.
TEST_F(MixtureTest, BatchSizesDoNotChangeTheWindows) {
  const auto phases = one_phase({{a_, 3}, {b_, 1}, {c_, 1}});
  MixtureLoader ones(phases, "train", {.seq_len = kT, .seed = 3});
  MixtureLoader mixed(phases, "train", {.seq_len = kT, .seed = 3});
  std::vector<int32_t> expect, got;
  for (int i = 0; i < 300; ++i) expect.push_back(starts(ones, 1)[0]);
  for (int B : {7, 1, 64, 13, 100, 115}) {
    auto s = starts(mixed, B);
    got.insert(got.end(), s.begin(), s.end());
  }
  EXPECT_EQ(got, expect);
}

// A saved cursor, restored into a new loader, gives the windows the original goes on to give,
// across epochs of the smaller datasets.
TEST_F(MixtureTest, ResumeContinuesTheSameWindows) {
  const auto phases = one_phase({{a_, 0.6}, {b_, 0.25}, {c_, 0.15}});
  MixtureLoader original(phases, "train", {.seq_len = kT, .seed = 11});
  original.enter_phase(0);
  for (int i = 0; i < 37; ++i) starts(original, 5);
  const nlohmann::json saved = original.cursor_json();
  EXPECT_EQ(MixtureLoader::cursor_json_problem(saved), "");
  MixtureLoader resumed(phases, "train", {.seq_len = kT, .seed = 11});
  resumed.set_cursor_json(nlohmann::json::parse(saved.dump()));  // through text, as a checkpoint holds it
  EXPECT_EQ(resumed.enter_phase(0), -1) << "the restored phase has already started";
  EXPECT_EQ(resumed.cursor(), original.cursor());
  for (int i = 0; i < 60; ++i) ASSERT_EQ(starts(resumed, 8), starts(original, 8)) << "batch " << i;
}

// Each worker draws its own slice of every dataset: no window is read by two workers, and
// together they read every window of each dataset once per epoch.
TEST_F(MixtureTest, WorkerSlicesAreDisjoint) {
  const auto phases = one_phase({{a_, 1}, {b_, 1}});  // 100 and 70 windows
  std::map<int32_t, int> readers;
  for (int w = 0; w < 3; ++w) {
    MixtureLoader loader(phases, "train", {.seq_len = kT, .seed = 5, .worker = w, .n_workers = 3});
    loader.enter_phase(0);
    // 46 windows: 23 of each dataset, within both datasets' slices (>= 23 windows per worker).
    for (int32_t s : starts(loader, 46)) ++readers[s];
  }
  for (const auto& [start, n] : readers) EXPECT_EQ(n, 1) << "window at token " << start << " read by " << n << " workers";
  EXPECT_EQ(readers.size(), 3u * 46u);
}

// A one-dataset stream is the plain loader's, and its checkpoint cursor is DataLoader's Cursor
// (checkpoints from before mixtures existed load unchanged).
TEST_F(MixtureTest, OneDatasetIsThePlainLoader) {
  MixtureLoader mix(one_phase({{a_, 1}}), "train", {.seq_len = kT, .seed = 9});
  DataLoader plain(a_, "train", {.seq_len = kT, .seed = 9});
  EXPECT_EQ(mix.enter_phase(0), -1) << "a single dataset reports no phase";
  std::vector<int32_t> x(6 * kT), y(6 * kT);
  for (int i = 0; i < 30; ++i) {
    plain.next_batch(6, x.data(), y.data());
    std::vector<int32_t> expect;
    for (int b = 0; b < 6; ++b) expect.push_back(x[size_t(b) * kT]);
    ASSERT_EQ(starts(mix, 6), expect);
  }
  EXPECT_EQ(mix.cursor_json(), nlohmann::json(plain.cursor()));
}

// Phases: the mixture changes at its token count, picks start again while each dataset goes on
// where it was, and a resume inside the second phase continues it exactly.
TEST_F(MixtureTest, PhasesSwitchAtTheirTokensAndResumeInside) {
  const std::vector<DataPhase> phases = {{.at_tokens = 0, .mix = {{a_, 1}}},
                                         {.at_tokens = 1000, .mix = {{a_, 1}, {b_, 3}}}};
  MixtureLoader loader(phases, "train", {.seq_len = kT, .seed = 1});
  EXPECT_EQ(loader.enter_phase(0), 0);
  EXPECT_EQ(loader.enter_phase(999), -1);
  for (int32_t s : starts(loader, 10)) EXPECT_EQ(dataset_of(s), 0);
  EXPECT_EQ(loader.enter_phase(1000), 1);
  EXPECT_EQ(loader.enter_phase(5000), -1) << "a phase starts once";
  std::vector<int> count(2, 0);
  for (int32_t s : starts(loader, 40)) ++count[size_t(dataset_of(s))];
  EXPECT_EQ(count[0], 10);
  EXPECT_EQ(count[1], 30);
  // The weights become 30-bit integers: shares exact to about 1e-9.
  ASSERT_EQ(loader.shares().size(), 2u);
  EXPECT_NEAR(loader.shares()[0], 0.25, 1e-9);
  EXPECT_NEAR(loader.shares()[1], 0.75, 1e-9);

  const nlohmann::json saved = loader.cursor_json();
  EXPECT_EQ(saved.at("phase"), 1);
  MixtureLoader resumed(phases, "train", {.seq_len = kT, .seed = 1});
  resumed.set_cursor_json(saved);
  EXPECT_EQ(resumed.enter_phase(5000), -1) << "resumed inside phase 1: no new phase";
  for (int i = 0; i < 20; ++i) ASSERT_EQ(starts(resumed, 7), starts(loader, 7));
}

TEST_F(MixtureTest, CursorOfAnotherStreamIsRefused) {
  MixtureLoader ab(one_phase({{a_, 1}, {b_, 1}}), "train", {.seq_len = kT, .seed = 1});
  MixtureLoader ac(one_phase({{a_, 1}, {c_, 1}}), "train", {.seq_len = kT, .seed = 1});
  MixtureLoader only_a(one_phase({{a_, 1}}), "train", {.seq_len = kT, .seed = 1});
  MixtureLoader other_seed(one_phase({{a_, 1}, {b_, 1}}), "train", {.seq_len = kT, .seed = 2});
  starts(ab, 3);
  const MixCursor before = ac.cursor();
  EXPECT_THROW(ac.set_cursor_json(ab.cursor_json()), DataError);  // ds1 is not in ac's mixture
  EXPECT_EQ(ac.cursor(), before) << "a refused cursor changes nothing";
  EXPECT_THROW(only_a.set_cursor_json(ab.cursor_json()), DataError);
  EXPECT_THROW(ab.set_cursor_json(only_a.cursor_json()), DataError);
  EXPECT_THROW(other_seed.set_cursor_json(ab.cursor_json()), DataError);
  EXPECT_NE(MixtureLoader::cursor_json_problem(nlohmann::json{{"phase", 0}, {"sources", {{{"dir", "x"}}}}}), "");
}

TEST_F(MixtureTest, MissingDatasetIsNamed) {
  try {
    MixtureLoader loader(one_phase({{a_, 1}, {root_ / "nowhere", 1}}), "train", {.seq_len = kT});
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atl
