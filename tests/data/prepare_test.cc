#include "atoll/data/prepare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/data/corpus.h"
#include "atoll/data/loader.h"
#include "atoll/data/shard.h"
#include "atoll/data/tokenizer.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl {
namespace {

using testing::TempDir;

void write_jsonl(const std::string& path, const std::vector<std::string>& docs) {
  std::string lines;
  for (const auto& d : docs) lines += nlohmann::json{{"text", d}}.dump() + "\n";
  testing::write_file(path, lines);
}

std::vector<int32_t> read_all(const std::vector<std::string>& shards) {
  std::vector<int32_t> all;
  for (const auto& s : shards) {
    const auto t = read_shard(s);
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

// Splits a token stream at </s> and decodes each document.
std::vector<std::string> decode_docs(const Tokenizer& tok, const std::vector<int32_t>& stream) {
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t t : stream) {
    if (t == tok.eos_id()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(t);
    }
  }
  EXPECT_TRUE(cur.empty()) << "stream does not end with </s>";
  return docs;
}

TEST(Prepare, EndToEndShardsLoadAndDecodeToTheCorpus) {
  TempDir dir;
  const auto docs = testing::make_docs(400, 11);
  write_jsonl(dir / "corpus/a.jsonl", std::vector<std::string>(docs.begin(), docs.begin() + 200));
  write_jsonl(dir / "corpus/b.jsonl", std::vector<std::string>(docs.begin() + 200, docs.end()));
  const PrepareOptions opt{.inputs = {dir / "corpus"},
                           .out_dir = dir / "data",
                           .vocab_size = 400,
                           .val_fraction = 0.05,
                           .shard_tokens = 2000,
                           .min_val_tokens = 100};
  const PrepareResult r = prepare_data(opt);
  EXPECT_FALSE(r.reused);
  EXPECT_EQ(r.vocab_size, 400);
  EXPECT_EQ(r.documents, 400);
  EXPECT_GT(r.train_shards.size(), 1u);  // several shards of at most 2000 tokens
  ASSERT_EQ(r.val_shards.size(), 1u);
  // Documents are held out by a hash of their text: about 5% of 400 documents, 20 +- 2 sigma.
  EXPECT_GE(r.val_tokens, static_cast<int64_t>(0.02 * (r.train_tokens + r.val_tokens)));
  EXPECT_LT(r.val_tokens, r.train_tokens / 8);
  for (const auto& s : r.train_shards) EXPECT_LE(ShardView(s).size(), 2000);

  // Every document comes back exactly once, from training or validation.
  const Tokenizer tok = Tokenizer::load(r.tokenizer_path);
  auto got = decode_docs(tok, read_all(r.train_shards));
  const auto val = decode_docs(tok, read_all(r.val_shards));
  EXPECT_EQ(got.size() + val.size(), docs.size());
  got.insert(got.end(), val.begin(), val.end());
  auto want = docs;
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);

  // The loader reads the folder; ids fit the vocabulary.
  DataLoader train(r.out_dir, "train", {.seq_len = 32});
  train.check_vocab(r.vocab_size);
  EXPECT_EQ(train.n_tokens(), r.train_tokens);
  std::vector<int32_t> in(2 * 32), tg(2 * 32);
  train.next_batch(2, in.data(), tg.data());
  DataLoader valid(r.out_dir, "val", {.seq_len = 32, .shuffle = false});
  EXPECT_EQ(valid.n_tokens(), r.val_tokens);

  // meta.json records what was made from what; no temporary folder is left behind.
  std::ifstream meta_in(dir / "data/meta.json");
  const auto meta = nlohmann::json::parse(meta_in);
  EXPECT_EQ(meta["vocab_size"], 400);
  EXPECT_EQ(meta["train_tokens"], r.train_tokens);
  EXPECT_EQ(meta["inputs"][0], dir / "corpus");
  EXPECT_EQ(meta["fingerprint"].get<std::string>().size(), 16u);
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(Prepare, SameDatasetIsReusedOtherIsRefused) {
  TempDir dir;
  write_jsonl(dir / "c.jsonl", testing::make_docs(150, 12));
  PrepareOptions opt{.inputs = {dir / "c.jsonl"}, .out_dir = dir / "data", .vocab_size = 320, .min_val_tokens = 50};
  const PrepareResult first = prepare_data(opt);
  const PrepareResult again = prepare_data(opt);
  EXPECT_TRUE(again.reused);
  EXPECT_EQ(again.train_shards, first.train_shards);
  EXPECT_EQ(again.train_tokens, first.train_tokens);

  opt.vocab_size = 330;
  try {
    prepare_data(opt);
    FAIL() << "clobbered a different dataset";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("different dataset"), std::string::npos) << msg;
    EXPECT_NE(msg.find("requested_vocab_size"), std::string::npos) << msg;
  }
  opt.vocab_size = 320;
  write_jsonl(dir / "c.jsonl", testing::make_docs(150, 13));  // same name, new content
  EXPECT_THROW(prepare_data(opt), DataError);
  EXPECT_EQ(read_all(first.train_shards).size(), static_cast<size_t>(first.train_tokens));

  testing::write_file(dir / "other/notes.txt", "mine\n");  // a folder that is no dataset
  opt.out_dir = dir / "other";
  EXPECT_THROW(prepare_data(opt), DataError);
}

TEST(Prepare, OneDocumentIsSplitAtTheTail) {
  TempDir dir;
  std::string book;
  for (const auto& d : testing::make_docs(200, 14)) book += d;
  testing::write_file(dir / "book.txt", book);
  const PrepareResult r = prepare_data({.inputs = {dir / "book.txt"},
                                        .out_dir = dir / "data",
                                        .vocab_size = 320,
                                        .val_fraction = 0.001,
                                        .min_val_tokens = 200});
  EXPECT_EQ(r.val_tokens, 200);
  EXPECT_GT(r.train_tokens, 1000);
  const Tokenizer tok = Tokenizer::load(r.tokenizer_path);
  auto stream = read_all(r.train_shards);
  const auto val = read_all(r.val_shards);
  stream.insert(stream.end(), val.begin(), val.end());
  EXPECT_EQ(decode_docs(tok, stream), std::vector<std::string>{book});
}

TEST(Prepare, BadInputLeavesNothingBehind) {
  TempDir dir;
  EXPECT_THROW(prepare_data({.inputs = {dir / "missing"}, .out_dir = dir / "data"}), PathError);
  testing::write_file(dir / "c.txt", "short text\n");
  EXPECT_THROW(prepare_data({.inputs = {dir / "c.txt"}, .out_dir = dir / "data", .vocab_size = 50}), DataError);
  EXPECT_FALSE(std::filesystem::exists(dir / "data"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

// A vocabulary below what the tokenizer trainer needs for this corpus is refused before
// anything is trained or written, naming the key it came from and the minimum, which works.
TEST(Prepare, ATooSmallVocabularyIsRefusedUpFrontWithTheMinimum) {
  TempDir dir;
  write_jsonl(dir / "c.jsonl", testing::make_docs(100, 3));
  const int need = Tokenizer::min_vocab_size(read_corpus({dir / "c.jsonl"}).docs);
  for (int vocab : {2, need - 1}) {
    try {
      prepare_data({.inputs = {dir / "c.jsonl"}, .out_dir = dir / "data", .vocab_size = vocab, .vocab_key = "data.vocab_size"});
      FAIL() << "vocab " << vocab << " accepted";
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("data.vocab_size = " + std::to_string(vocab)), std::string::npos) << msg;
      EXPECT_NE(msg.find("at least " + std::to_string(need)), std::string::npos) << msg;
      EXPECT_NE(msg.find("fix: set data.vocab_size to " + std::to_string(need) + " or more"), std::string::npos) << msg;
    }
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "wrote something";
  }
  const PrepareResult r = prepare_data({.inputs = {dir / "c.jsonl"}, .out_dir = dir / "data", .vocab_size = need});
  EXPECT_EQ(r.vocab_size, need);
}

}  // namespace
}  // namespace atl
