// A uniform, seeded sample of a corpus's sentences for training the tokenizer, in bounded
// memory, as Llama trained its SentencePiece model on a sample (input_sentence_size).
//
// Every sentence (a document piece cut at line breaks to the trainer's sentence limit,
// tokenizer.h) gets a pseudo-random key from (seed, item ordinal, sentence index); the sample is
// the sentences with the smallest keys that fit the byte budget (bottom-k sampling). Each
// sentence is equally likely to be taken whatever its place in the corpus, the result depends
// only on the corpus and the seed (not on batching or thread count), and memory stays at the
// budget however large the corpus is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atl {

class SentenceSample {
 public:
  SentenceSample(int64_t max_bytes, uint64_t seed) : max_bytes_(max_bytes), seed_(seed) {}
  // Offers the sentences of item `ordinal`'s text.
  void add(int64_t ordinal, std::string_view text);
  // The sample, in key order (deterministic); the sample is left empty.
  std::vector<std::string> take();

  int64_t bytes() const { return bytes_; }              // held, with per-sentence overhead
  int64_t seen_bytes() const { return seen_bytes_; }    // offered
  int64_t seen_sentences() const { return seen_sentences_; }

 private:
  struct Entry {
    uint64_t key;
    std::string text;
    bool operator<(const Entry& o) const { return key < o.key; }  // max-heap on key
  };
  int64_t max_bytes_;
  uint64_t seed_;
  std::vector<Entry> heap_;
  int64_t bytes_ = 0, seen_bytes_ = 0, seen_sentences_ = 0;
};

}  // namespace atl
