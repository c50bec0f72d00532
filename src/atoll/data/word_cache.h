// Encoding through a cache of words, as Hugging Face tokenizers and tiktoken do, exactly equal
// to SentencePiece's Encode for the models that allow it (word_split.h says which, and why).
//
// The text is cut where word_split.h allows: before each ' ' and each literal U+2581, and
// between two ASCII characters that no piece joins. So a run of spaces gives words of one space
// each, and tabs and newlines stay inside words unless the vocabulary allows a cut. A word of
// at most kMaxCachedWordBytes is looked up in the cache and, on a miss, encoded by SentencePiece
// alone and remembered; a longer word (a line of CJK text without spaces, a long run of
// symbols) is encoded directly. Most words of a corpus are frequent ones, so encoding becomes
// hash lookups.
//
// Memory: the cache is bounded by `max_bytes` (its slot table, keys and ids together); when a
// new word would not fit, it is emptied and starts again (frequent words come back at once).
// One encoder per thread: it is not thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "atoll/data/tokenizer.h"

namespace atl {

constexpr size_t kMaxCachedWordBytes = 64;

class WordCacheEncoder {
 public:
  // The cache is used only if tok.word_split_refusal() is empty; otherwise encode() is
  // Tokenizer::encode, as it is with `plain_only`. max_bytes lies in [kMinCacheBytes,
  // kMaxCacheBytes] (offsets are 32-bit).
  WordCacheEncoder(const Tokenizer& tok, size_t max_bytes, bool plain_only = false);

  // Appends the ids of `text` to `out`: the same ids as tok.encode(text).
  void encode(std::string_view text, std::vector<int32_t>& out);

  bool uses_cache() const { return cached_; }
  size_t memory_bytes() const;  // what the cache holds now, in bytes (at most max_bytes)
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int64_t clears() const { return clears_; }
  int64_t long_words() const { return long_words_; }  // encoded directly, not cached

  static constexpr size_t kMinCacheBytes = 64 << 10, kMaxCacheBytes = size_t{1} << 30;

 private:
  // An open-addressing slot: the word's hash (0 = empty), its bytes in keys_, its ids in ids_.
  struct Slot {
    uint64_t hash = 0;
    uint32_t key = 0, ids = 0;
    uint16_t key_len = 0, n_ids = 0;
  };
  void encode_word(std::string_view word, std::vector<int32_t>& out);
  void clear();

  const Tokenizer& tok_;
  bool cached_;
  std::vector<Slot> slots_;  // a power of two; at most half of them used
  size_t used_ = 0, arena_limit_ = 0;
  std::vector<char> keys_;
  std::vector<int32_t> ids_;
  std::vector<int32_t> scratch_;
  int64_t hits_ = 0, misses_ = 0, clears_ = 0, long_words_ = 0;
};

}  // namespace atl
