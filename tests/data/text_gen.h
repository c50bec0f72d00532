// A small synthetic English-like corpus for tokenizer and prepare tests: documents of a few
// sentences drawn from fixed word lists by a seeded Rng, so every run sees the same text.
#pragma once

#include <cctype>
#include <string>
#include <vector>

#include "atoll/core/rng.h"

namespace atl::testing {

inline std::vector<std::string> make_docs(int n_docs, uint64_t seed) {
  static const char* kWords[] = {"the",     "a",      "island", "model", "token",  "expert", "router", "learns",
                                 "from",    "every",  "small",  "large", "corpus", "of",     "text",   "and",
                                 "then",    "writes", "sea",    "wind",  "coral",  "reef",   "atoll",  "lagoon",
                                 "quickly", "slowly", "café",   "naïve", "shards", "loss",   "falls",  "rises",
                                 "over",    "under",  "night",  "day",   "with",   "its",    "own",    "gradient",
                                 "step",    "forty",  "2024",   "is",    "not"};
  constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  Rng rng(seed);
  std::vector<std::string> docs;
  for (int d = 0; d < n_docs; ++d) {
    std::string doc;
    const int sentences = 1 + static_cast<int>(rng.below(4));
    for (int s = 0; s < sentences; ++s) {
      const int words = 3 + static_cast<int>(rng.below(9));
      for (int w = 0; w < words; ++w) {
        std::string word = kWords[rng.below(kNumWords)];
        if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
        doc += (w == 0 ? "" : " ") + word;
      }
      doc += rng.below(5) == 0 ? "?\n" : ".  ";
    }
    docs.push_back(doc);
  }
  return docs;
}

}  // namespace atl::testing
