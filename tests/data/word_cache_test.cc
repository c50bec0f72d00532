#include "atoll/data/word_cache.h"

#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include "atoll/core/rng.h"
#include "atoll/data/word_split.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl {
namespace {

using testing::TempDir;

// Text made to trip a word splitter: runs of spaces, leading and trailing spaces, tabs,
// newlines, CRLF, CJK, emoji, combining marks, a literal U+2581 (SentencePiece's escaped
// space) and broken pieces of it, invalid UTF-8 bytes, NUL, words longer than the cache takes,
// and empty strings. `valid`: only valid UTF-8 without NUL (the tokenizer trainer's input).
std::vector<std::string> awkward_texts(int n, uint64_t seed, bool valid = false) {
  std::vector<std::string> kParts = {
      "the", "island", "Model", "learns", "2024", "café", "naïve", " ", "  ", "   ", "\t", "\n", "\r\n", " \n ",
      "日本語のテキスト", "🌴🐚", "e\xCC\x81", "\xE2\x96\x81", "\xE2\x96\x81\xE2\x96\x81", ".", ",", "<s>", "</s>",
      "<0x41>", std::string("coral").append(80, 'x'), std::string(70, '-'),
      std::string("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E").append(30, 'a'), "reef", "lagoon",
  };
  if (!valid)
    for (std::string bad : {"\xE2\x96", "\xE2 ", "\x96\x81", "\xFF", "\xC3", "\xF0\x9F", "\xE2\xE2\x96\x81"})
      kParts.push_back(bad);
  if (!valid) kParts.push_back(std::string(1, '\0'));
  Rng rng(seed);
  std::vector<std::string> texts = {"", " ", "  ", "x", " x", "x ", "\xE2\x96\x81", std::string(300, ' ')};
  for (int i = 0; i < n; ++i) {
    std::string t;
    const int parts = static_cast<int>(rng.below(40));
    for (int k = 0; k < parts; ++k) t += kParts[rng.below(kParts.size())];
    texts.push_back(t);
  }
  return texts;
}

// A corpus whose tokenizer learns pieces for the awkward parts too (words after spaces, CJK).
std::vector<std::string> training_docs() {
  std::vector<std::string> docs = testing::make_docs(400, 11);
  for (const std::string& t : awkward_texts(200, 12, /*valid=*/true)) docs.push_back(t);
  return docs;
}

// The oracle: SentencePiece's own Encode, text by text, against the word cache. A small cache
// (cleared many times over) and a large one.
void expect_equal_to_sentencepiece(const Tokenizer& tok, size_t cache_bytes, const std::vector<std::string>& texts) {
  WordCacheEncoder enc(tok, cache_bytes);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass runs on a warm cache
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids = {7};  // encode appends
      enc.encode(texts[i], ids);
      std::vector<int32_t> want = {7};
      tok.encode(texts[i], want);
      ASSERT_EQ(ids, want) << "text " << i << " (pass " << pass << "): \"" << texts[i] << "\"";
    }
  }
  EXPECT_LE(enc.memory_bytes(), cache_bytes);
}

TEST(WordCache, EqualsSentencePieceOnAwkwardText) {
  TempDir dir;
  Tokenizer::train(training_docs(), 700, dir / "tok.model");
  const Tokenizer tok = Tokenizer::load(dir / "tok.model");
  ASSERT_EQ(tok.word_split_refusal(), "");
  const std::vector<std::string> texts = awkward_texts(3000, 13);
  expect_equal_to_sentencepiece(tok, 64 << 20, texts);
  expect_equal_to_sentencepiece(tok, WordCacheEncoder::kMinCacheBytes, texts);
  for (const std::string& doc : testing::make_docs(300, 14)) {  // plain prose, as most corpora
    std::vector<int32_t> ids;
    WordCacheEncoder(tok, WordCacheEncoder::kMinCacheBytes).encode(doc, ids);
    ASSERT_EQ(ids, tok.encode(doc)) << doc;
  }
}

TEST(WordCache, CachesFrequentWordsAndStaysInItsBound) {
  TempDir dir;
  Tokenizer::train(training_docs(), 700, dir / "tok.model");
  const Tokenizer tok = Tokenizer::load(dir / "tok.model");
  WordCacheEncoder big(tok, 64 << 20), small(tok, WordCacheEncoder::kMinCacheBytes);
  std::vector<int32_t> ids;
  for (const std::string& t : testing::make_docs(2000, 15)) big.encode(t, ids);
  for (const std::string& t : awkward_texts(3000, 15)) {
    small.encode(t, ids);
    ASSERT_LE(small.memory_bytes(), WordCacheEncoder::kMinCacheBytes);
  }
  EXPECT_TRUE(big.uses_cache());
  EXPECT_GT(big.hits(), 20 * big.misses());  // prose: a hundred distinct words, thousands of uses
  EXPECT_EQ(big.clears(), 0);
  EXPECT_GT(small.clears(), 0);  // full: emptied and started again (its results checked above)
}

// Trains a model with SentencePiece's trainer directly, with settings atoll never uses.
std::string train_with(const TempDir& dir, const std::string& name, const std::string& flags) {
  const std::string input = dir / "corpus.txt";
  std::string text;
  for (const std::string& d : testing::make_docs(300, 16)) text += d + "\n";
  testing::write_file(input, text);
  // `flags` first: SentencePiece keeps the first of a repeated flag.
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      flags + " --input=" + input + " --model_prefix=" + (dir / name) +
      " --vocab_size=400 --hard_vocab_limit=false --byte_fallback=true --minloglevel=2 --num_threads=1");
  EXPECT_TRUE(status.ok()) << status.ToString();
  return dir / (name + ".model");
}

// Models that do not encode word by word take SentencePiece's Encode, and say why.
TEST(WordCache, ModelsThatDoNotSplitAtSpacesTakeThePlainPath) {
  TempDir dir;
  const std::string identity = " --normalization_rule_name=identity --add_dummy_prefix=false "
                               "--remove_extra_whitespaces=false";
  const std::pair<std::string, std::string> cases[] = {
      {"--model_type=bpe", "normalization is \"nmt_nfkc\""},  // SentencePiece's defaults, as Llama's
      {"--model_type=bpe --normalization_rule_name=identity", "dummy prefix"},
      {"--model_type=unigram" + identity, "not a BPE model"},
      {"--model_type=bpe --split_by_whitespace=false" + identity, "split_by_whitespace"},
      {"--model_type=bpe --user_defined_symbols=island" + identity, "user-defined pieces (\"island\")"},
      {"--model_type=bpe --treat_whitespace_as_suffix=true" + identity, "whitespace as a suffix"},
      {"--model_type=bpe --byte_fallback=false" + identity, "no byte fallback"},
  };
  int n = 0;
  for (const auto& [flags, why] : cases) {
    const Tokenizer tok = Tokenizer::load(train_with(dir, std::string("m").append(std::to_string(n++)), flags));
    EXPECT_NE(tok.word_split_refusal().find(why), std::string::npos) << flags << ": " << tok.word_split_refusal();
    WordCacheEncoder enc(tok, 1 << 20);
    EXPECT_FALSE(enc.uses_cache()) << flags;
    for (const std::string& t : awkward_texts(200, 17)) {
      std::vector<int32_t> ids;
      enc.encode(t, ids);
      ASSERT_EQ(ids, tok.encode(t)) << flags;
    }
  }
  // The same trainer with atoll's settings qualifies (the cases above differ in one setting).
  EXPECT_EQ(Tokenizer::load(train_with(dir, "ok", "--model_type=bpe" + identity)).word_split_refusal(), "");
}

TEST(WordCache, UnreadableModelProtoIsRefused) {
  EXPECT_NE(word_split("\x0A\x05\x0A").refusal, "");  // a piece cut short
  EXPECT_NE(word_split("").refusal, "");              // no pieces, no specs: the defaults (unigram)
}

}  // namespace
}  // namespace atl
