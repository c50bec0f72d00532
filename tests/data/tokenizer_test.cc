#include "atoll/core/user_path.h"
#include "atoll/data/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "atoll/core/errors.h"
#include "data/temp_dir.h"
#include "data/text_gen.h"

namespace atl {
namespace {

using testing::TempDir;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Tokenizer, TrainsAndRoundTripsText) {
  TempDir dir;
  const auto docs = testing::make_docs(300, 1);  // about 15 KB
  Tokenizer::train(docs, 400, dir / "tok.model");
  const Tokenizer tok = Tokenizer::load(dir / "tok.model");
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);

  // Whitespace runs, newlines, tabs and characters never seen in training (byte fallback)
  // all survive the round trip.
  const std::string texts[] = {docs[0],
                               "The atoll  model\n\tlearns.\n\n",
                               "  leading and trailing  ",
                               "café naïve — 日本語のテキスト, emoji 🌴🐚, Ω≈ç√",
                               "x",
                               ""};
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok.encode(text);
    for (int32_t id : ids) {
      EXPECT_GT(id, 0) << "unk in " << text;  // byte fallback: nothing is unknown
      EXPECT_LT(id, tok.vocab_size());
    }
    EXPECT_EQ(tok.decode(ids), text);
  }
  // Learned merges make common words take fewer tokens than bytes.
  const std::string common = "the island model learns from every corpus";
  EXPECT_LT(tok.encode(common).size(), common.size() * 3 / 4);
}

TEST(Tokenizer, TrainingIsDeterministic) {
  TempDir dir;
  const auto docs = testing::make_docs(200, 2);
  Tokenizer::train(docs, 350, dir / "a.model");
  Tokenizer::train(docs, 350, dir / "b.model");
  EXPECT_EQ(file_bytes(dir / "a.model"), file_bytes(dir / "b.model"));
  EXPECT_FALSE(std::filesystem::exists(dir / "a.model.tmp"));
}

TEST(Tokenizer, SmallCorpusGivesSmallerVocabulary) {
  TempDir dir;
  const auto docs = testing::make_docs(20, 3);  // far too few merges for 5000 pieces
  Tokenizer::train(docs, 5000, dir / "small.model");
  const Tokenizer tok = Tokenizer::load(dir / "small.model");
  EXPECT_LT(tok.vocab_size(), 5000);
  EXPECT_GT(tok.vocab_size(), 259);
  EXPECT_EQ(tok.decode(tok.encode(docs[0])), docs[0]);
}

TEST(Tokenizer, TooSmallVocabularyIsDataError) {
  TempDir dir;
  try {
    Tokenizer::train(testing::make_docs(50, 4), 100, dir / "tiny.model");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 100 is too small"), std::string::npos) << e.what();
  }
}

// min_vocab_size is exactly what SentencePiece needs (the oracle: its own trainer): it trains
// at the minimum and refuses one below. The corpora cover the parts of its count: characters
// that fall under the 0.9995 coverage (a few rare ones among many common), text holding the
// special pieces' spellings (replaced before counting), a line with U+2585 (skipped), spaces,
// tabs and newlines, and more distinct characters than the byte pieces.
TEST(Tokenizer, MinVocabSizeIsWhatSentencePieceNeeds) {
  std::string many;  // 300 distinct CJK characters, each a few times
  for (int i = 0; i < 900; ++i) {
    const char32_t c = 0x4E00 + char32_t(i % 300);
    many += {char(0xE0 | (c >> 12)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
  }
  const std::vector<std::vector<std::string>> corpora = {
      testing::make_docs(50, 4),
      {std::string(20000, 'a') + "bc\tdd", "xyz xyz\n"},
      {"<s> and </s> and <unk> and <0x41> are text here, \xE2\x96\x85 skips a line", "plain <0x4G> <s"},
      {many, "and some ascii"},
  };
  for (size_t i = 0; i < corpora.size(); ++i) {
    TempDir dir;
    const int need = Tokenizer::min_vocab_size(corpora[i]);
    EXPECT_GT(need, 259) << "corpus " << i;
    EXPECT_NO_THROW(Tokenizer::train(corpora[i], need, dir / "at.model")) << "corpus " << i << ", vocab " << need;
    EXPECT_THROW(Tokenizer::train(corpora[i], need - 1, dir / "below.model"), DataError) << "corpus " << i;
  }
}

TEST(Tokenizer, LoadErrors) {
  TempDir dir;
  EXPECT_THROW(Tokenizer::load(dir / "missing.model"), PathError);  // checked before it is opened (core/user_path.h)
  testing::write_file(dir / "junk.model", "this is not a protobuf");
  try {
    Tokenizer::load(dir / "junk.model");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "junk.model"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, DecodeRefusesUnknownIds) {
  TempDir dir;
  Tokenizer::train(testing::make_docs(100, 5), 330, dir / "t.model");
  const Tokenizer tok = Tokenizer::load(dir / "t.model");
  EXPECT_THROW(tok.decode({tok.vocab_size()}), DataError);
}

}  // namespace
}  // namespace atl
