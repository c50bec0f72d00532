// `atoll data prepare` through the word cache (word_cache.h): the same shards as SentencePiece's
// own Encode, and the guard that stops prepare when the two differ.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "atoll/core/check.h"
#include "atoll/data/prepare.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_file;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::map<std::string, std::string> shard_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".bin") out[e.path().filename().string()] = file_bytes(e.path().string());
  return out;
}

// Prose, and documents with runs of spaces, tabs, CRLF, CJK, emoji, combining marks, a literal
// U+2581 and long words; a plain-text file with invalid UTF-8 (prepare makes it U+FFFD).
void write_corpus(const TempDir& dir, int docs) {
  const std::vector<std::string> odd = {"  two  spaces\tand a tab\r\nCRLF", " leading", "trailing ",
                                        "日本語のテキスト と 🌴🐚 e\xCC\x81", "a\xE2\x96\x81" "b \xE2\x96\x81 c",
                                        std::string(90, 'z') + " " + std::string(200, ' ') + "end"};
  std::string lines;
  int i = 0;
  for (const std::string& d : testing::make_docs(docs, 31)) {
    lines += nlohmann::json{{"text", d + odd[i % odd.size()]}}.dump() + "\n";
    ++i;
  }
  write_file(dir / "in/a.jsonl", lines);
  write_file(dir / "in/b.txt", testing::make_docs(1, 32)[0] + std::string(2000, 'x') + " bad \xFF\xC3 bytes \xE2\x96 end");
}

TEST(PrepareEncode, WordCacheAndExactEncodeGiveTheSameShards) {
  TempDir dir;
  write_corpus(dir, 3000);
  PrepareOptions o{.inputs = {dir / "in"}, .vocab_size = 500, .shard_tokens = 5000, .threads = 2};
  o.out_dir = dir / "fast";
  prepare_data(o);
  o.out_dir = dir / "exact";
  o.tokenizer = dir / "fast/tokenizer.model";
  o.exact_encode = true;
  prepare_data(o);
  o.out_dir = dir / "small-cache";  // 32 MB: caches of 64 KiB, emptied again and again
  o.exact_encode = false;
  o.memory_mb = 32;
  prepare_data(o);
  const auto fast = shard_files(dir / "fast");
  EXPECT_GT(fast.size(), 5u);
  EXPECT_EQ(fast, shard_files(dir / "exact"));
  EXPECT_EQ(fast, shard_files(dir / "small-cache"));
}

// A cache that gives wrong ids (a fake bug) stops prepare at the first item the guard checks,
// with the item, its file and the way around it; no shard is written.
TEST(PrepareEncode, GuardStopsPrepareWhenTheCacheDiffers) {
  TempDir dir;
  write_corpus(dir, 3000);
  PrepareOptions o{.inputs = {dir / "in"}, .out_dir = dir / "d", .vocab_size = 500, .shard_tokens = 5000};
  o.tamper_word_cache = [](std::vector<int32_t>& ids) { ids.push_back(ids.empty() ? 3 : ids.back()); };
  try {
    prepare_data(o);
    FAIL() << "prepare wrote shards from a tampered cache";
  } catch (const CheckError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the word cache encoded " + (dir / "in/a.jsonl") + ":"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fix: run again with --exact-encode"), std::string::npos) << msg;
  }
  EXPECT_TRUE(shard_files(dir / "d").empty());
  EXPECT_FALSE(fs::exists(dir / "d/meta.json"));
  // --exact-encode goes around it (the tampered cache is not used) and resumes the folder.
  o.exact_encode = true;
  EXPECT_FALSE(shard_files(prepare_data(o).out_dir).empty());
}

}  // namespace
}  // namespace atl
