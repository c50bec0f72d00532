#include "atoll/data/tokenizer_sample.h"

#include <xxhash.h>

#include <algorithm>

#include "atoll/data/tokenizer.h"

namespace atl {

namespace {

constexpr int64_t kEntryOverhead = 64;  // the string and heap entry around each sentence

}  // namespace

void SentenceSample::add(int64_t ordinal, std::string_view text) {
  std::vector<std::string_view> sentences;
  split_sentences(text, sentences);
  for (size_t i = 0; i < sentences.size(); ++i) {
    const uint64_t id[2] = {static_cast<uint64_t>(ordinal), i};
    const uint64_t key = XXH3_64bits_withSeed(id, sizeof id, seed_);
    const int64_t cost = static_cast<int64_t>(sentences[i].size()) + kEntryOverhead;
    ++seen_sentences_;
    seen_bytes_ += static_cast<int64_t>(sentences[i].size());
    if (bytes_ + cost > max_bytes_ && (heap_.empty() || key >= heap_.front().key)) continue;
    heap_.push_back({key, std::string(sentences[i])});
    std::push_heap(heap_.begin(), heap_.end());
    bytes_ += cost;
    while (bytes_ > max_bytes_ && !heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end());
      bytes_ -= static_cast<int64_t>(heap_.back().text.size()) + kEntryOverhead;
      heap_.pop_back();
    }
  }
}

std::vector<std::string> SentenceSample::take() {
  std::sort_heap(heap_.begin(), heap_.end());
  std::vector<std::string> out;
  out.reserve(heap_.size());
  for (Entry& e : heap_) out.push_back(std::move(e.text));
  heap_.clear();
  bytes_ = 0;
  return out;
}

}  // namespace atl
