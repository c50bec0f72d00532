#include "atoll/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"
#include "atoll/data/corpus.h"

namespace atl {

namespace {

// SentencePiece skips training sentences longer than max_sentence_length bytes, so longer
// documents are fed in pieces cut at line breaks (or, for a giant line, at a UTF-8 boundary).
constexpr size_t kMaxSentenceBytes = 16384;
// Beyond this many sentences SentencePiece would sample with its own unseeded RNG; instead we
// pass an evenly spaced subset ourselves, which keeps training deterministic.
constexpr size_t kMaxTrainSentences = 2'000'000;
// Rare characters beyond this share of the text are spelled in bytes, not given pieces.
constexpr double kCharacterCoverage = 0.9995;
constexpr int kSpecialPieces = 3, kBytePieces = 256;  // <unk> <s> </s>; <0x00>..<0xFF>

}  // namespace

void split_sentences(std::string_view doc, std::vector<std::string_view>& out) {
  while (doc.size() > kMaxSentenceBytes) {
    size_t cut = doc.rfind('\n', kMaxSentenceBytes - 1);
    if (cut == std::string_view::npos || cut == 0) {
      cut = kMaxSentenceBytes;
      while (cut > 0 && (static_cast<unsigned char>(doc[cut]) & 0xC0) == 0x80) --cut;
    } else {
      cut += 1;  // keep the newline with the first piece
    }
    out.push_back(doc.substr(0, cut));
    doc.remove_prefix(cut);
  }
  if (!doc.empty()) out.push_back(doc);
}

namespace {

// Feeds in-memory sentences to the trainer without copying the corpus.
class SentenceList : public sentencepiece::SentenceIterator {
 public:
  explicit SentenceList(const std::vector<std::string_view>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override {
    ++i_;
    if (!done()) cur_.assign(s_[i_]);
  }
  const std::string& value() const override { return cur_; }
  sentencepiece::util::Status status() const override { return {}; }
  void rewind() {
    i_ = 0;
    if (!s_.empty()) cur_.assign(s_[0]);
  }

 private:
  const std::vector<std::string_view>& s_;
  size_t i_ = 0;
  std::string cur_;
};

// The sentences the trainer sees: documents cut to its sentence limit and, past
// kMaxTrainSentences, an evenly spaced subset.
std::vector<std::string_view> training_sentences(const std::vector<std::string>& docs) {
  std::vector<std::string_view> sentences;
  for (const std::string& d : docs) split_sentences(d, sentences);
  if (sentences.size() > kMaxTrainSentences) {
    std::vector<std::string_view> subset(kMaxTrainSentences);
    for (size_t i = 0; i < kMaxTrainSentences; ++i) subset[i] = sentences[i * sentences.size() / kMaxTrainSentences];
    log_info("tokenizer: training on " + std::to_string(kMaxTrainSentences) + " of " +
             std::to_string(sentences.size()) + " sentences (evenly spaced)");
    sentences = std::move(subset);
  }
  return sentences;
}

// Length of the special piece's spelling at the start of `s` ("<unk>", "<s>", "</s>", or a byte
// piece "<0x41>", upper-case hex), 0 if none: SentencePiece replaces these with a space before
// it counts characters.
size_t special_spelling_at(std::string_view s) {
  for (std::string_view w : {"<unk>", "<s>", "</s>"})
    if (s.starts_with(w)) return w.size();
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  if (s.size() >= 6 && s.starts_with("<0x") && hex(s[3]) && hex(s[4]) && s[5] == '>') return 6;
  return 0;
}

// Counts the code points of one training sentence as SentencePiece's trainer does
// (TrainerInterface::LoadSentences): a sentence holding U+2585 (its stand-in for rare
// characters) is skipped, special pieces' spellings become spaces, a space becomes U+2581.
void count_characters(std::string_view s, std::unordered_map<char32_t, int64_t>& counts, int64_t& total) {
  if (s.find("\xE2\x96\x85") != std::string_view::npos) return;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    if (const size_t special = special_spelling_at(s.substr(i))) {
      c = 0x2581;
      i += special;
    } else {
      const auto b = static_cast<unsigned char>(s[i]);
      const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;  // documents are valid UTF-8
      c = len == 1 ? b : char32_t(b & (0x7F >> len));
      for (size_t k = 1; k < len && i + k < s.size(); ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      i += len;
      if (c == ' ') c = 0x2581;
    }
    if (c == 0) continue;  // SentencePiece drops NUL
    ++counts[c];
    ++total;
  }
}

std::unordered_map<std::string, std::string> trainer_args(int vocab_size, bool hard_limit) {
  return {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", hard_limit ? "true" : "false"},
      {"byte_fallback", "true"},
      {"character_coverage", std::to_string(kCharacterCoverage)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", log_level() == LogLevel::kDebug ? "0" : "2"},
  };
}

}  // namespace

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

int Tokenizer::min_vocab_size(const std::vector<std::string>& docs) {
  std::unordered_map<char32_t, int64_t> counts;
  int64_t total = 0;
  for (std::string_view s : training_sentences(docs)) count_characters(s, counts, total);
  std::vector<int64_t> by_count;
  for (const auto& [c, n] : counts) by_count.push_back(n);
  std::sort(by_count.rbegin(), by_count.rend());
  // The most frequent characters until they cover character_coverage of the text. Compared as
  // SentencePiece compares them: the share as a float against the float setting.
  int required = 0;
  int64_t covered = 0;
  for (int64_t n : by_count) {
    if (float(double(covered) / double(total)) >= float(kCharacterCoverage)) break;
    covered += n;
    ++required;
  }
  return kSpecialPieces + kBytePieces + required;
}

void Tokenizer::train(const std::vector<std::string>& docs, int vocab_size, const std::string& model_path) {
  const std::vector<std::string_view> sentences = training_sentences(docs);
  if (sentences.empty()) throw DataError("tokenizer: no text to train on; fix: pass inputs with text");

  SentenceList it(sentences);
  std::string proto;
  it.rewind();
  auto status = sentencepiece::SentencePieceTrainer::Train(trainer_args(vocab_size, true), &it, &proto);
  if (!status.ok() && status.ToString().find("Vocabulary size too high") != std::string::npos) {
    // A small corpus has fewer distinct merges than asked for: take what it has.
    log_warn("tokenizer: the corpus is too small for vocab_size " + std::to_string(vocab_size) +
             "; training a smaller vocabulary (hard_vocab_limit=false)");
    it.rewind();
    proto.clear();
    status = sentencepiece::SentencePieceTrainer::Train(trainer_args(vocab_size, false), &it, &proto);
  }
  if (!status.ok()) {
    const std::string msg = status.ToString();
    if (msg.find("smaller than required_chars") != std::string::npos) {
      throw DataError("tokenizer: vocab_size " + std::to_string(vocab_size) +
                      " is too small for this corpus (it needs 256 byte pieces + 3 specials + "
                      "its characters; SentencePiece says: " +
                      msg + "); fix: raise --vocab-size / data.vocab_size");
    }
    throw DataError("tokenizer: SentencePiece training failed for vocab_size " + std::to_string(vocab_size) + ": " +
                    msg);
  }
  write_file_atomic(model_path, proto);
}

Tokenizer Tokenizer::load(const std::string& model_path) {
  check_input_file(model_path, "tokenizer model", "run `atoll data prepare` or point to the dataset's tokenizer.model");
  Tokenizer t;
  const auto status = t.sp_->Load(model_path);
  if (!status.ok()) {
    throw DataError("tokenizer model " + model_path + " is not a valid SentencePiece model (" + status.ToString() +
                    "); fix: regenerate it with `atoll data prepare`");
  }
  t.path_ = model_path;
  t.word_split_ = atl::word_split(t.sp_->serialized_model_proto());
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  encode(text, ids);
  return ids;
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  ATOLL_CHECK(status.ok()) << "SentencePiece Encode: " << status.ToString();
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int v = vocab_size();
  for (int32_t id : ids) {
    if (id < 0 || id >= v) {
      throw DataError("tokenizer " + path_ + ": cannot decode id " + std::to_string(id) + " (vocabulary has " +
                      std::to_string(v) +
                      " ids); fix: the model's "
                      "vocab_size must match the tokenizer's");
    }
  }
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  ATOLL_CHECK(status.ok()) << "SentencePiece Decode: " << status.ToString();
  return text;
}

std::string Tokenizer::piece(int32_t id) const {
  ATOLL_CHECK(id >= 0 && id < vocab_size()) << id;
  return sp_->IdToPiece(id);
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int Tokenizer::bos_id() const { return sp_->bos_id(); }
int Tokenizer::eos_id() const { return sp_->eos_id(); }
int Tokenizer::unk_id() const { return sp_->unk_id(); }
int Tokenizer::pad_id() const { return sp_->pad_id(); }

std::string tokenizer_fingerprint(const std::string& model_path) {
  check_input_file(model_path, "tokenizer model", "check the path");
  std::ifstream in(model_path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in) throw DataError("cannot read tokenizer model " + model_path + "; fix: check the path and its permissions");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(bytes.str())));
  return hex;
}

}  // namespace atl
