// Whether a SentencePiece model encodes text word by word: the condition under which
// WordCacheEncoder (word_cache.h) gives exactly SentencePiece's ids.
//
// SentencePiece's BPE encoder (bpe_model.cc) starts from the characters of the normalized text
// and repeatedly merges the adjacent pair whose concatenation is a piece, best score first. A
// merge can only create a piece of the vocabulary. If no piece holds U+2581 (the escaped space,
// "▁") after its first character, no merge ever joins a symbol to a following "▁", so the text
// falls apart into words that are encoded independently: each word begins at a "▁" (or at the
// start) and runs to the next one. Encoding each word alone then gives the same merges in the
// same order within it, and byte fallback spells an unknown symbol by its own bytes, so
//   encode(text) == encode(word 1) + encode(word 2) + ...
// The normalized text must be the input with ' ' replaced by "▁" and nothing else changed, so
// that the words are cut before each ' ' (and before a literal "▁") of the input itself: the
// "identity" rule without a character map, no dummy prefix, no whitespace removal, spaces
// escaped, and the space a prefix of the word (treat_whitespace_as_suffix off). User-defined
// pieces are matched in the text before BPE runs and could span a space, so there must be none.
// Byte fallback must be on, so that an unknown character is spelled by its own bytes wherever
// the text is cut (atoll's models have it; <unk> handling is not relied upon).
//
// The same argument cuts words further: a merged symbol is always a piece, so if no piece holds
// character a directly followed by character b, no symbol ever spans a boundary between a and
// b, and the text may be cut there too. The cut points come from the vocabulary: for a code
// corpus's tokenizer, "#define RTLD_NOLOAD\t0x00004\n" falls into "#", "define", " RTLD", "_",
// "NOLOAD", "\t", "0x00004", "\n".
// They are kept for ASCII pairs only (a table of 128 x 128; ' ' stands for "▁"), which never
// cuts a UTF-8 character in two.
#pragma once

#include <array>
#include <bitset>
#include <string>
#include <string_view>

namespace atl {

struct WordSplit {
  // "" when the model (a serialized ModelProto, as in a .model file) satisfies every condition
  // above; otherwise the first one it fails, in words, for the log.
  std::string refusal;
  // joined[a][b]: some piece holds ASCII a directly followed by ASCII b (' ' for "▁"), so text
  // must not be cut between them. Every pair is joined when the model is refused.
  std::array<std::bitset<128>, 128> joined;
};

WordSplit word_split(std::string_view model_proto);

}  // namespace atl
