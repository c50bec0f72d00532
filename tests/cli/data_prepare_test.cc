// `atoll data prepare` as a real process: a corpus far larger than the memory budget streams
// through within it, and a prepare killed with SIGKILL resumes to the shards of one that was
// never interrupted.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <csignal>
#include <fstream>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

// JSONL documents from the seeded generator, appended until the file holds `bytes`; written as
// it goes, so the test itself stays small in memory.
void write_corpus(const std::string& path, int64_t bytes, uint64_t seed) {
  std::ofstream out(path, std::ios::binary);
  int64_t n = 0;
  for (uint64_t round = 0; n < bytes; ++round) {
    for (const auto& d : make_docs(2000, seed + round)) {
      const std::string line = nlohmann::json{{"text", d}}.dump() + "\n";
      out << line;
      n += static_cast<int64_t>(line.size());
    }
  }
}

std::map<std::string, std::string> shards_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".bin") out[e.path().filename().string()] = read_file(e.path().string());
  return out;
}

// Peak RSS within the budget plus this margin: the process's code and libraries (OpenBLAS,
// oneDNN, SentencePiece) and allocator slack; the whole process peaked at 27 MB here.
constexpr int64_t kRssMarginMb = 64;

TEST(DataPrepare, StreamsACorpusFarLargerThanItsMemoryBudget) {
  TempDir dir;
  const int64_t corpus_mb = 64, budget_mb = 32;  // twice the budget; the test stays short
  write_corpus(dir / "corpus.jsonl", corpus_mb << 20, 1);
  const RunResult r = run_atoll({"data", "prepare", "--input", dir / "corpus.jsonl", "--out", dir / "d", "--vocab-size",
                                 "512", "--memory-mb", std::to_string(budget_mb), "--shard-tokens", "2000000"},
                                /*timeout_s=*/300);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_LE(r.peak_rss_kb / 1024, budget_mb + kRssMarginMb) << r.describe();
  const auto meta = nlohmann::json::parse(read_file(dir / "d/meta.json"));
  EXPECT_GT(meta["train_shards"].size(), 3u);
  EXPECT_GT(meta["documents"].get<int64_t>(), 50000);
  std::cout << "peak RSS " << r.peak_rss_kb / 1024 << " MB for a " << budget_mb << " MB budget and a " << corpus_mb
            << " MB corpus\n";
}

TEST(DataPrepare, KilledPrepareResumesToTheSameShards) {
  TempDir dir;
  write_corpus(dir / "corpus.jsonl", 6 << 20, 2);
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"data", "prepare", "--input", dir / "corpus.jsonl", "--out", out, "--vocab-size",
                                    "400", "--shard-tokens", "50000"};
  };
  const RunResult whole = run_atoll(args(dir / "whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.describe();
  {
    Background bg(args(dir / "cut"), dir / "cut-log");
    ASSERT_TRUE(wait_for_file(dir / "cut", "train_000002.bin", 120, [&] { return bg.running(); }))
        << read_file(dir / "cut-log.err");
    bg.kill9();
  }
  ASSERT_TRUE(fs::exists(dir / "cut/progress.json"));
  const auto kept = shards_of(dir / "cut");
  const RunResult resumed = run_atoll(args(dir / "cut"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.describe();
  EXPECT_EQ(resumed.out.rfind("resumed", 0), 0u) << resumed.out;
  const auto after = shards_of(dir / "cut");
  for (const auto& [name, bytes] : kept) EXPECT_EQ(after.at(name), bytes) << name;
  EXPECT_EQ(after, shards_of(dir / "whole"));
  EXPECT_FALSE(fs::exists(dir / "cut/progress.json"));

  // Ctrl-C: one line says the same command resumes; it does, to the same shards.
  Background bg(args(dir / "ctrl-c"), dir / "ctrl-c-log");
  ASSERT_TRUE(wait_for_file(dir / "ctrl-c", "train_000001.bin", 120, [&] { return bg.running(); }))
      << read_file(dir / "ctrl-c-log.err");
  ::kill(bg.pid(), SIGINT);
  const int status = bg.wait();
  const std::string err = read_file(dir / "ctrl-c-log.err");
  if (WIFSIGNALED(status)) {  // else it finished first: nothing to say
    EXPECT_EQ(WTERMSIG(status), SIGINT) << err;
    EXPECT_NE(err.find("atoll: interrupted: data prepare stopped; the shards written to " + dir / "ctrl-c" +
                       " are kept: run the same command again to resume"),
              std::string::npos)
        << err;
  }
  const RunResult again = run_atoll(args(dir / "ctrl-c"));
  ASSERT_EQ(again.exit_code, 0) << again.describe();
  EXPECT_EQ(shards_of(dir / "ctrl-c"), shards_of(dir / "whole"));
}

}  // namespace
}  // namespace atl::testing
