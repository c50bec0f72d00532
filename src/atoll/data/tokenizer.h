// The tokenizer: a SentencePiece BPE model (https://github.com/google/sentencepiece).
//
// Training settings, chosen so that text survives a round trip and a corpus names one model:
//   - BPE with byte_fallback: a character outside the vocabulary is spelled as its UTF-8
//     bytes (<0x..> pieces), so every input is encodable and decode(encode(s)) == s.
//   - identity normalization, no extra-whitespace removal, no dummy prefix: newlines, tabs
//     and runs of spaces are kept exactly (the defaults would fold them away).
//   - character_coverage 0.9995: rare characters fall back to bytes instead of taking
//     vocabulary slots (byte fallback makes that lossless).
//   - split_by_whitespace (SentencePiece's default): no piece holds a space after its start, so
//     text is encoded word by word and a word cache gives SentencePiece's ids exactly
//     (word_split.h, word_cache.h; `atoll data prepare` encodes that way).
//   - one training thread: SentencePiece's multi-threaded trainer gives a slightly different
//     model from run to run (measured on 0.1.97), and one corpus must give one model.
// Ids: 0 = <unk> (never produced, thanks to byte fallback), 1 = <s> (BOS), 2 = </s> (EOS),
// then the 256 byte pieces, then the learned pieces. No padding id.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/data/word_split.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace atl {

class Tokenizer {
 public:
  // Trains a model on `docs` (each document is one training sentence; documents longer than
  // SentencePiece's sentence limit are cut at line breaks) and writes it to `model_path`
  // (through a temporary file, then renamed). If the corpus has too few distinct merges for
  // `vocab_size`, training is retried without the hard limit and the model comes out smaller
  // (logged; read vocab_size() of the loaded model). Throws DataError when `vocab_size` is
  // below what the corpus needs (256 byte pieces + 3 specials + its characters).
  static void train(const std::vector<std::string>& docs, int vocab_size, const std::string& model_path);

  // The smallest vocab_size train() accepts for `docs`: 3 special pieces + 256 byte pieces + the
  // characters SentencePiece must give pieces of their own (the most frequent ones, until they
  // cover character_coverage of the text), counted as its trainer counts them.
  static int min_vocab_size(const std::vector<std::string>& docs);

  // Loads a model file. Throws DataError if it is missing or not a SentencePiece model.
  static Tokenizer load(const std::string& model_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Thread-safe (SentencePiece's Encode/Decode are const). SentencePiece's own Encode; for
  // speed, encode through a WordCacheEncoder (word_cache.h), which gives the same ids.
  std::vector<int32_t> encode(std::string_view text) const;
  void encode(std::string_view text, std::vector<int32_t>& out) const;  // appends to `out`
  std::string decode(const std::vector<int32_t>& ids) const;  // ids must be < vocab_size()
  std::string piece(int32_t id) const;                        // the piece's surface, for debugging

  int vocab_size() const;  // V
  int bos_id() const;
  int eos_id() const;
  int unk_id() const;
  int pad_id() const;  // -1: none
  const std::string& path() const { return path_; }
  // "" if this model encodes word by word, so that a word cache gives its exact ids
  // (word_split.h); otherwise why not, e.g. "it adds a dummy prefix".
  const std::string& word_split_refusal() const { return word_split_.refusal; }
  const WordSplit& word_split() const { return word_split_; }  // where its text may be cut

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_;
  WordSplit word_split_;
};

// Cuts a document into the sentences the trainer takes: pieces of at most its sentence limit
// (16 KiB), cut after a line break where there is one, else at a UTF-8 character boundary.
void split_sentences(std::string_view doc, std::vector<std::string_view>& out);

// A tokenizer's fingerprint: FNV-1a 64 (corpus.h) of its model file's bytes, as 16 hex digits,
// so that data and models made with different tokenizers can be told apart. Throws DataError
// if the file cannot be read.
std::string tokenizer_fingerprint(const std::string& model_path);

}  // namespace atl
