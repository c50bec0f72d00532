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
#pragma once

#include <string>
#include <string_view>

namespace atl {

// "" when a model (a serialized ModelProto, as in a .model file) satisfies every condition
// above; otherwise the first one it fails, in words, for the log.
std::string word_split_refusal(std::string_view model_proto);

}  // namespace atl
