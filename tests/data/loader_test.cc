// Loader tests on the exact oracle of tokens equal to their positions: shard s holds
// tokens s*10000 + i, so a window's first token names its shard and place.
#include "atoll/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "atoll/core/errors.h"
#include "data/temp_dir.h"

namespace atl {
namespace {

using testing::TempDir;

constexpr int kT = 4;

// Writes shards of the given lengths as train_000000.bin, ... with tokens s*10000 + i.
void make_shards(const TempDir& dir, const std::vector<int>& lengths, const std::string& split = "train") {
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<int32_t> tokens(lengths[s]);
    for (int i = 0; i < lengths[s]; ++i) tokens[i] = static_cast<int32_t>(s * 10000 + i);
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06zu.bin", split.c_str(), s);
    write_shard(dir / name, tokens);
  }
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader, int B) {
  Batch b{std::vector<int32_t>(B * loader.seq_len()), std::vector<int32_t>(B * loader.seq_len())};
  loader.next_batch(B, b.inputs.data(), b.targets.data());
  return b;
}

// First tokens of the windows a loader yields over `n` single-window batches.
std::vector<int32_t> window_starts(DataLoader& loader, int64_t n) {
  std::vector<int32_t> starts;
  for (int64_t i = 0; i < n; ++i) starts.push_back(next(loader, 1).inputs[0]);
  return starts;
}

TEST(Loader, WindowsAreExactInShardOrder) {
  TempDir dir;
  make_shards(dir, {10 * kT + 3, 3 * kT + 1});  // 10 windows (tail unused), then 3
  DataLoader loader(dir.path().string(), "train", {.seq_len = kT, .shuffle = false});
  ASSERT_EQ(loader.n_windows(), 13);
  std::vector<int32_t> expected_starts;
  for (int i = 0; i < 10; ++i) expected_starts.push_back(i * kT);
  for (int i = 0; i < 3; ++i) expected_starts.push_back(10000 + i * kT);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int32_t start : expected_starts) {
      const Batch b = next(loader, 1);
      for (int t = 0; t < kT; ++t) {
        EXPECT_EQ(b.inputs[t], start + t);
        EXPECT_EQ(b.targets[t], start + t + 1);
      }
    }
  }
  EXPECT_EQ(loader.cursor().epoch, 2);
}

TEST(Loader, BatchesConcatenateWindows) {
  TempDir dir;
  make_shards(dir, {20 * kT + 1});
  DataLoader loader(dir.path().string(), "train", {.seq_len = kT, .shuffle = false});
  const Batch b = next(loader, 3);
  for (int i = 0; i < 3 * kT; ++i) {
    EXPECT_EQ(b.inputs[i], i);
    EXPECT_EQ(b.targets[i], i + 1);
  }
}

TEST(Loader, WorkerSlicesAreDisjointAndCoverEveryWindowEachEpoch) {
  TempDir dir;
  make_shards(dir, {11 * kT + 1, 6 * kT + 2});  // 17 windows: uneven for 2, 3 and 4 workers
  for (int n : {1, 2, 3, 4}) {
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::multiset<int32_t> seen;
      for (int w = 0; w < n; ++w) {
        DataLoader loader(dir.path().string(), "train", {.seq_len = kT, .seed = 7, .worker = w, .n_workers = n});
        loader.set_cursor(Cursor{.epoch = epoch,
                                 .position = 0,
                                 .seq_len = kT,
                                 .n_windows = 17,
                                 .seed = 7,
                                 .shuffle = true,
                                 .worker = w,
                                 .n_workers = n});
        EXPECT_LE(std::abs(loader.windows_per_epoch() - 17 / n), 1);
        for (int32_t s : window_starts(loader, loader.windows_per_epoch())) seen.insert(s);
        EXPECT_EQ(loader.cursor().epoch, epoch + 1);  // exactly one epoch consumed
      }
      EXPECT_EQ(seen.size(), 17u) << n << " workers";
      EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), 17u) << "overlap, " << n;
    }
  }
}

TEST(Loader, SameSeedSameOrderOtherSeedOtherOrder) {
  TempDir dir;
  make_shards(dir, {50 * kT + 1});
  auto order = [&](uint64_t seed, int64_t n) {
    DataLoader loader(dir.path().string(), "train", {.seq_len = kT, .seed = seed});
    return window_starts(loader, n);
  };
  const auto a = order(1, 100);
  EXPECT_EQ(a, order(1, 100));
  EXPECT_NE(a, order(2, 100));
  // Each epoch is a permutation of all windows, and epochs differ from each other.
  const std::vector<int32_t> e0(a.begin(), a.begin() + 50), e1(a.begin() + 50, a.end());
  EXPECT_NE(e0, e1);
  EXPECT_EQ(std::set<int32_t>(e0.begin(), e0.end()).size(), 50u);
  EXPECT_EQ(std::set<int32_t>(e1.begin(), e1.end()).size(), 50u);
}

TEST(Loader, RestoredCursorGivesIdenticalBatches) {
  TempDir dir;
  make_shards(dir, {23 * kT + 1, 9 * kT + 1});  // 32 windows
  for (bool prefetch : {false, true}) {
    const LoaderOptions opt{.seq_len = kT, .seed = 3, .worker = 1, .n_workers = 2, .prefetch = prefetch};
    DataLoader a(dir.path().string(), "train", opt);
    for (int B : {1, 3, 2}) next(a, B);
    const nlohmann::json saved = a.cursor();  // through JSON, as a checkpoint stores it
    // Batch sizes change, and 13 + 16 windows run past the 16-window epoch.
    std::vector<Batch> expected;
    for (int B : {5, 5, 1, 7, 4, 8}) expected.push_back(next(a, B));
    EXPECT_GE(a.cursor().epoch, 1);

    DataLoader b(dir.path().string(), "train", opt);
    next(b, 2);  // wherever it was before
    b.set_cursor(saved.get<Cursor>());
    std::vector<Batch> got;
    for (int B : {5, 5, 1, 7, 4, 8}) got.push_back(next(b, B));
    EXPECT_EQ(got, expected) << "prefetch " << prefetch;
    EXPECT_EQ(a.cursor(), b.cursor());
  }
}

TEST(Loader, PrefetchGivesTheSameBatches) {
  TempDir dir;
  make_shards(dir, {40 * kT + 1, 7 * kT + 1});
  DataLoader on(dir.path().string(), "train", {.seq_len = kT, .seed = 9, .prefetch = true});
  DataLoader off(dir.path().string(), "train", {.seq_len = kT, .seed = 9, .prefetch = false});
  for (int B : {1, 1, 4, 4, 4, 2, 8, 8, 3, 16, 16, 16, 5}) {
    EXPECT_EQ(next(on, B), next(off, B)) << "B " << B;
  }
  EXPECT_EQ(on.cursor(), off.cursor());
}

TEST(Loader, ResetStartsOver) {
  TempDir dir;
  make_shards(dir, {8 * kT + 1}, "val");
  DataLoader loader(dir.path().string(), "val", {.seq_len = kT, .shuffle = false});
  const Batch first = next(loader, 3);
  next(loader, 2);
  loader.reset();
  EXPECT_EQ(next(loader, 3), first);
}

TEST(Loader, SingleBinFileLoads) {
  TempDir dir;
  make_shards(dir, {5 * kT + 1, 9 * kT + 1});
  DataLoader loader(dir / "train_000001.bin", "train", {.seq_len = kT, .shuffle = false});
  EXPECT_EQ(loader.n_windows(), 9);
  EXPECT_EQ(next(loader, 1).inputs[0], 10000);
}

TEST(Loader, ErrorsNameTheProblem) {
  TempDir dir;
  try {
    DataLoader loader(dir.path().string(), "train", {.seq_len = kT});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no train_*.bin shards"), std::string::npos) << e.what();
  }
  make_shards(dir, {kT});  // one token short of a window
  try {
    DataLoader loader(dir.path().string(), "train", {.seq_len = kT});
    FAIL();
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("train_000000.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("smaller model.seq_len"), std::string::npos) << msg;
  }
}

TEST(Loader, CheckVocabNamesFileAndId) {
  TempDir dir;
  make_shards(dir, {3 * kT + 1, 2 * kT + 1});  // largest id: 10000 + 8
  DataLoader loader(dir.path().string(), "train", {.seq_len = kT});
  EXPECT_NO_THROW(loader.check_vocab(10009));
  try {
    loader.check_vocab(10008);
    FAIL();
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("train_000001.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("token id 10008"), std::string::npos) << msg;
  }
}

TEST(Loader, CursorOfAnotherStreamIsRefused) {
  TempDir dir;
  make_shards(dir, {10 * kT + 1});
  DataLoader a(dir.path().string(), "train", {.seq_len = kT, .seed = 1});
  DataLoader b(dir.path().string(), "train", {.seq_len = kT, .seed = 2});
  EXPECT_THROW(b.set_cursor(a.cursor()), DataError);
}

TEST(Loader, CursorMapsToAnotherWorkerCount) {
  TempDir dir;
  make_shards(dir, {40 * kT + 1});
  DataLoader a(dir.path().string(), "train", {.seq_len = kT, .worker = 0, .n_workers = 4});
  next(a, 6);  // 6 of 10 windows of this worker's slice: 24 of 40 of the epoch
  DataLoader b(dir.path().string(), "train", {.seq_len = kT, .worker = 0, .n_workers = 2});
  b.set_cursor(a.cursor());
  EXPECT_EQ(b.cursor().epoch, 0);
  EXPECT_EQ(b.cursor().position, 12);  // 12 of 20: the same share of the epoch
}

// Context extension: a cursor of another length over the same shards re-chunks (the same epoch,
// the position scaled by the tokens read); one of other shards is still refused.
TEST(Loader, CursorReChunksAtAnotherSeqLen) {
  TempDir dir;
  make_shards(dir, {40 * kT + 1, 3 * kT});  // the second holds 2 windows of kT, none of 4 kT
  DataLoader a(dir.path().string(), "train", {.seq_len = kT, .seed = 3});
  next(a, 14);  // 14 of 42 windows: 56 tokens of the epoch
  DataLoader b(dir.path().string(), "train", {.seq_len = 4 * kT, .seed = 3});
  EXPECT_EQ(b.windows_at(kT), a.n_windows());
  EXPECT_EQ(b.n_windows(), 10);
  b.set_cursor(a.cursor());
  EXPECT_EQ(b.cursor().epoch, 0);
  EXPECT_EQ(b.cursor().position, 3);  // 56 tokens are 3 whole windows of 16 (rounded down)
  EXPECT_EQ(b.cursor().seq_len, 4 * kT);
  // Back at the first length, from there: 3 windows of 16 tokens are 12 of 4.
  a.set_cursor(b.cursor());
  EXPECT_EQ(a.cursor().position, 12);
  EXPECT_EQ(count_windows(dir.path().string(), "train", 4 * kT), 10);

  TempDir other;
  make_shards(other, {20 * kT + 1});
  DataLoader c(other.path().string(), "train", {.seq_len = 4 * kT, .seed = 3});
  EXPECT_THROW(c.set_cursor(a.cursor()), DataError);  // 42 windows of kT there, 20 here
}

}  // namespace
}  // namespace atl
