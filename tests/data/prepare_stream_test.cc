// `atoll data prepare` at scale, in process: compressed and bad inputs, the thread count, the
// document split, a given tokenizer, and resuming after an interruption. The real-process tests
// (kill -9, peak memory) are in tests/cli/data_prepare_test.cc.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "atoll/core/errors.h"
#include "atoll/data/corpus.h"
#include "atoll/data/prepare.h"
#include "atoll/data/shard.h"
#include "atoll/data/tokenizer.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_file;

std::string jsonl(const std::vector<std::string>& docs) {
  std::string lines;
  for (const auto& d : docs) lines += nlohmann::json{{"text", d}}.dump() + "\n";
  return lines;
}

std::string gzip(const std::string& bytes) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, bytes.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& bytes) {
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), bytes.data(), bytes.size(), 3));
  return out;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json meta_of(const std::string& dir) { return nlohmann::json::parse(file_bytes(dir + "/meta.json")); }

// Every shard's bytes, by name.
std::map<std::string, std::string> shard_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".bin") out[e.path().filename().string()] = file_bytes(e.path().string());
  return out;
}

// The documents of a token stream split at </s>, decoded.
std::multiset<std::string> decode_docs(const PrepareResult& r, const std::vector<std::string>& shards) {
  const Tokenizer tok = Tokenizer::load(r.tokenizer_path);
  std::multiset<std::string> docs;
  std::vector<int32_t> cur;
  for (const auto& s : shards) {
    for (int32_t t : read_shard(s)) {
      if (t == tok.eos_id()) {
        docs.insert(tok.decode(cur));
        cur.clear();
      } else {
        cur.push_back(t);
      }
    }
  }
  EXPECT_TRUE(cur.empty());
  return docs;
}


TEST(PrepareStream, CompressedInputsReadAsTheirText) {
  TempDir dir;
  const auto docs = testing::make_docs(300, 21);
  const std::vector<std::string> a(docs.begin(), docs.begin() + 100), b(docs.begin() + 100, docs.begin() + 200),
      c(docs.begin() + 200, docs.end());
  write_file(dir / "in/a.jsonl", jsonl(a));
  write_file(dir / "in/b.JSONL.gz", gzip(jsonl(b)));
  write_file(dir / "in/c.jsonl.ZST", zstd(jsonl(c)));
  EXPECT_EQ(read_documents(dir / "in/b.JSONL.gz"), b);
  EXPECT_EQ(read_documents(dir / "in/c.jsonl.ZST"), c);
  std::string text;
  for (const auto& d : a) text += d;
  write_file(dir / "t.txt.gz", gzip(text) + gzip(text));  // two gzip members, as `cat` makes them
  EXPECT_EQ(read_documents(dir / "t.txt.gz"), std::vector<std::string>{text + text});

  const PrepareResult r = prepare_data({.inputs = {dir / "in"}, .out_dir = dir / "d", .vocab_size = 400, .shard_tokens = 3000,
                                        .min_val_tokens = 1});
  EXPECT_EQ(r.documents, 300);
  auto got = decode_docs(r, r.train_shards);
  const auto val = decode_docs(r, r.val_shards);
  got.insert(val.begin(), val.end());
  EXPECT_EQ(got, std::multiset<std::string>(docs.begin(), docs.end()));
  // The manifest lists every shard with its token count and checksum.
  const auto meta = meta_of(dir / "d");
  ASSERT_EQ(meta["manifest"]["train"].size(), r.train_shards.size());
  int64_t sum = 0;
  for (const auto& rec : meta["manifest"]["train"]) {
    EXPECT_EQ(ShardView(dir / ("d/" + rec["name"].get<std::string>())).size(), rec["tokens"].get<int64_t>());
    EXPECT_EQ(rec["xxh3"].get<std::string>().size(), 16u);
    sum += rec["tokens"].get<int64_t>();
  }
  EXPECT_EQ(sum, r.train_tokens);
  for (size_t i = 0; i + 1 < r.train_shards.size(); ++i) EXPECT_EQ(ShardView(r.train_shards[i]).size(), 3000);
  EXPECT_FALSE(fs::exists(dir / "d/progress.json"));
}

// Bad lines, an empty file, invalid bytes and a cut-off .zst are skipped and counted; the rest
// is prepared.
TEST(PrepareStream, BadInputIsSkippedAndCounted) {
  TempDir dir;
  const auto docs = testing::make_docs(200, 22);
  std::string lines = jsonl(std::vector<std::string>(docs.begin(), docs.begin() + 100));
  lines += "{\"text\": oops}\n{\"body\": \"no text\"}\n[1, 2]\n{\"text\": \"caf\xE9 bytes\"}\n";
  write_file(dir / "in/a.jsonl", lines);
  write_file(dir / "in/b_empty.txt", "");
  const std::string full = zstd(jsonl(testing::make_docs(3000, 30)));  // several zstd blocks
  write_file(dir / "in/c.jsonl.zst", full.substr(0, full.size() * 2 / 3));
  fs::create_symlink("nowhere", dir / "in/d_dangling");  // skipped, and counted
  const PrepareResult r = prepare_data({.inputs = {dir / "in"}, .out_dir = dir / "d", .vocab_size = 400});
  const auto meta = meta_of(dir / "d");
  // The line `oops`, and the .zst's last line, cut in the middle.
  EXPECT_EQ(meta["skipped"]["lines"]["not valid JSON"], 2) << meta["skipped"].dump();
  EXPECT_EQ(meta["skipped"]["lines"]["no string field \"text\""], 2) << meta["skipped"].dump();
  EXPECT_EQ(meta["skipped"]["invalid_utf8_bytes"], 1);
  EXPECT_EQ(meta["skipped"]["empty_files"], nlohmann::json::array({dir / "in/b_empty.txt"}));
  EXPECT_EQ(meta["skipped"]["truncated_files"], nlohmann::json::array({dir / "in/c.jsonl.zst"}));
  EXPECT_EQ(meta["skipped"]["entries"],
            nlohmann::json::array({dir / "in/d_dangling" + ": it is a dangling symbolic link, not a file or folder"}));
  // The good lines, the repaired one, and the .zst's lines before the cut.
  EXPECT_GT(r.documents, 101 + 1000);
  EXPECT_LT(r.documents, 101 + 3000);
}

// A small .zst cut before its first whole document: the error says it is cut short, not only
// that there is no text.
TEST(PrepareStream, ACompressedFileCutBeforeItsFirstDocumentIsNamedAsTruncated) {
  TempDir dir;
  const std::string full = zstd(jsonl(testing::make_docs(50, 31)));
  write_file(dir / "in/small.jsonl.zst", full.substr(0, full.size() / 3));
  try {
    prepare_data({.inputs = {dir / "in"}, .out_dir = dir / "d", .vocab_size = 400});
    FAIL() << "prepared a truncated file that holds no whole document";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("small.jsonl.zst are cut short"), std::string::npos) << m;
    EXPECT_NE(m.find("fix:"), std::string::npos) << m;
  }
}

// A different dataset in the output folder is refused and left as it was.
TEST(PrepareStream, NothingPreparedIsOverwritten) {
  TempDir dir;
  write_file(dir / "a.jsonl", jsonl(testing::make_docs(100, 23)));
  prepare_data({.inputs = {dir / "a.jsonl"}, .out_dir = dir / "d", .vocab_size = 320});
  const auto before = shard_files(dir / "d");
  const std::string meta_before = file_bytes(dir / "d/meta.json");
  write_file(dir / "b.jsonl", jsonl(testing::make_docs(100, 24)));
  EXPECT_THROW(prepare_data({.inputs = {dir / "b.jsonl"}, .out_dir = dir / "d", .vocab_size = 320}), DataError);
  EXPECT_EQ(shard_files(dir / "d"), before);
  EXPECT_EQ(file_bytes(dir / "d/meta.json"), meta_before);
}

// One thread or several, small batches or large: the same shards, byte for byte.
TEST(PrepareStream, ThreadCountDoesNotChangeTheShards) {
  TempDir dir;
  const auto docs = testing::make_docs(12000, 25);  // about 1 MB: several batches at 128 MB
  write_file(dir / "in/a.jsonl", jsonl(std::vector<std::string>(docs.begin(), docs.begin() + 6000)));
  std::string book;
  for (size_t i = 6000; i < docs.size(); ++i) book += docs[i];
  write_file(dir / "in/book.txt", book);  // one document of several 64 KiB pieces
  PrepareOptions o{.inputs = {dir / "in"}, .vocab_size = 500, .shard_tokens = 20000, .memory_mb = 128, .threads = 1};
  o.out_dir = dir / "one";
  const PrepareResult one = prepare_data(o);
  o.out_dir = dir / "four";
  o.threads = 4;
  o.memory_mb = 2048;
  prepare_data(o);
  EXPECT_GT(one.train_shards.size(), 3u);
  EXPECT_EQ(shard_files(dir / "one"), shard_files(dir / "four"));
  EXPECT_EQ(file_bytes(dir / "one/tokenizer.model"), file_bytes(dir / "four/tokenizer.model"));
}

// A document's split depends on its text alone: adding files later moves no document from
// training to validation or back.
TEST(PrepareStream, AddingDataKeepsEachDocumentsSplit) {
  TempDir dir;
  const auto docs = testing::make_docs(600, 26);
  write_file(dir / "a.jsonl", jsonl(std::vector<std::string>(docs.begin(), docs.begin() + 300)));
  write_file(dir / "b.jsonl", jsonl(std::vector<std::string>(docs.begin() + 300, docs.end())));
  PrepareOptions o{.inputs = {dir / "a.jsonl"}, .out_dir = dir / "small", .vocab_size = 400, .val_fraction = 0.1,
                   .min_val_tokens = 1};
  const PrepareResult small = prepare_data(o);
  o.inputs = {dir / "a.jsonl", dir / "b.jsonl"};
  o.out_dir = dir / "big";
  const PrepareResult big = prepare_data(o);
  const auto small_val = decode_docs(small, small.val_shards), big_val = decode_docs(big, big.val_shards);
  EXPECT_GT(small_val.size(), 10u);
  for (const auto& d : small_val) EXPECT_EQ(big_val.count(d), small_val.count(d)) << d;
  for (const auto& d : decode_docs(small, small.train_shards)) EXPECT_EQ(big_val.count(d), 0u) << d;
}

TEST(PrepareStream, AGivenTokenizerIsUsedAsItIs) {
  TempDir dir;
  write_file(dir / "a.jsonl", jsonl(testing::make_docs(200, 27)));
  const PrepareResult first = prepare_data({.inputs = {dir / "a.jsonl"}, .out_dir = dir / "d1", .vocab_size = 350});
  write_file(dir / "b.jsonl", jsonl(testing::make_docs(200, 28)));
  const PrepareResult r =
      prepare_data({.inputs = {dir / "b.jsonl"}, .out_dir = dir / "d2", .tokenizer = first.tokenizer_path});
  EXPECT_EQ(file_bytes(r.tokenizer_path), file_bytes(first.tokenizer_path));
  EXPECT_EQ(r.vocab_size, 350);
  EXPECT_EQ(meta_of(dir / "d2")["tokenizer_fingerprint"], meta_of(dir / "d1")["tokenizer_fingerprint"]);
  write_file(dir / "junk.model", "not a model");
  EXPECT_THROW(prepare_data({.inputs = {dir / "b.jsonl"}, .out_dir = dir / "d3", .tokenizer = dir / "junk.model"}),
               DataError);
  EXPECT_FALSE(fs::exists(dir / "d3"));
}

// Interrupted after its second shard (an exception from the shard hook, in place of a crash),
// prepare resumes: the shards done are kept, and the result is the uninterrupted one.
TEST(PrepareStream, InterruptedPrepareResumesToTheSameShards) {
  TempDir dir;
  write_file(dir / "a.jsonl", jsonl(testing::make_docs(3000, 29)));
  PrepareOptions o{.inputs = {dir / "a.jsonl"}, .vocab_size = 400, .shard_tokens = 5000};
  o.out_dir = dir / "whole";
  prepare_data(o);
  o.out_dir = dir / "cut";
  int shards = 0;
  o.on_shard = [&](const std::string&) {
    if (++shards == 2) throw IoError("interrupted");
  };
  EXPECT_THROW(prepare_data(o), IoError);
  ASSERT_TRUE(fs::exists(dir / "cut/progress.json"));
  const auto kept = shard_files(dir / "cut");
  EXPECT_EQ(kept.size(), 2u);
  std::vector<std::string> written;
  o.on_shard = [&](const std::string& name) { written.push_back(name); };
  const PrepareResult r = prepare_data(o);
  EXPECT_TRUE(r.resumed);
  for (const auto& name : written) EXPECT_EQ(kept.count(name), 0u) << name << " written again";
  EXPECT_EQ(shard_files(dir / "cut"), shard_files(dir / "whole"));
  EXPECT_EQ(meta_of(dir / "cut")["manifest"], meta_of(dir / "whole")["manifest"]);
}

}  // namespace
}  // namespace atl
