#include "atoll/data/word_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "atoll/core/check.h"

namespace atl {

WordCacheEncoder::WordCacheEncoder(const Tokenizer& tok, size_t max_bytes, bool plain_only)
    : tok_(tok), cached_(!plain_only && tok.word_split_refusal().empty()) {
  if (!cached_) return;
  ATOLL_CHECK(max_bytes >= kMinCacheBytes && max_bytes <= kMaxCacheBytes) << "word cache budget " << max_bytes;
  // A quarter of the budget for the slot table, the rest for the words and their ids. Both
  // arenas are reserved up front so that they never reallocate (pages are only resident once
  // written, and what is written stays within arena_limit_ together).
  slots_.resize(std::bit_floor(max_bytes / 4 / sizeof(Slot)));
  arena_limit_ = max_bytes - slots_.size() * sizeof(Slot);
  keys_.reserve(arena_limit_);
  ids_.reserve(arena_limit_ / sizeof(int32_t));
}

size_t WordCacheEncoder::memory_bytes() const {
  return slots_.size() * sizeof(Slot) + keys_.size() + ids_.size() * sizeof(int32_t);
}

void WordCacheEncoder::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  used_ = 0;
  ++clears_;
}

void WordCacheEncoder::encode(std::string_view text, std::vector<int32_t>& out) {
  if (!cached_) {
    tok_.encode(text, out);
    return;
  }
  // Words start at the text's start, at each "▁" (E2 96 81) and between two ASCII characters
  // that no piece joins (word_split.h; that includes every ' '). Neither E2 nor an ASCII byte
  // occurs inside another UTF-8 character, so a byte scan finds exactly those points.
  const auto& joined = tok_.word_split().joined;
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p < end) {
    const char* q = p + 1;
    for (; q < end; ++q) {
      const auto a = static_cast<unsigned char>(q[-1]), b = static_cast<unsigned char>(*q);
      if ((a | b) < 0x80 ? !joined[a][b] : b == 0xE2 && end - q >= 3 && q[1] == '\x96' && q[2] == '\x81') break;
    }
    encode_word(std::string_view(p, static_cast<size_t>(q - p)), out);
    p = q;
  }
}

void WordCacheEncoder::encode_word(std::string_view word, std::vector<int32_t>& out) {
  if (word.size() > kMaxCachedWordBytes) {
    ++long_words_;
    tok_.encode(word, out);
    return;
  }
  const uint64_t hash = XXH3_64bits(word.data(), word.size()) | 1;  // 0 marks an empty slot
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  for (; slots_[i].hash != 0; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == hash && s.key_len == word.size() && std::memcmp(&keys_[s.key], word.data(), word.size()) == 0) {
      ++hits_;
      out.insert(out.end(), ids_.begin() + s.ids, ids_.begin() + s.ids + s.n_ids);
      return;
    }
  }
  ++misses_;
  scratch_.clear();
  tok_.encode(word, scratch_);
  out.insert(out.end(), scratch_.begin(), scratch_.end());
  const size_t arena_after = keys_.size() + word.size() + (ids_.size() + scratch_.size()) * sizeof(int32_t);
  if (2 * (used_ + 1) > slots_.size() || arena_after > arena_limit_) {
    clear();
    i = hash & mask;  // every slot is empty now
  }
  slots_[i] = Slot{.hash = hash,
                   .key = static_cast<uint32_t>(keys_.size()),
                   .ids = static_cast<uint32_t>(ids_.size()),
                   .key_len = static_cast<uint16_t>(word.size()),
                   .n_ids = static_cast<uint16_t>(scratch_.size())};
  keys_.insert(keys_.end(), word.begin(), word.end());
  ids_.insert(ids_.end(), scratch_.begin(), scratch_.end());
  ++used_;
}

}  // namespace atl
