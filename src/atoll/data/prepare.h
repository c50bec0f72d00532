// `atoll data prepare`: a corpus -> a dataset folder that the loader reads.
//
// The dataset folder holds:
//   tokenizer.model               the SentencePiece model trained on the corpus (tokenizer.h)
//   train_000000.bin, ...         training tokens, llm.c shard format (shard.h)
//   val_000000.bin, ...           held-out validation tokens (absent when val_fraction = 0)
//   meta.json                     what was made from what: settings, input fingerprint,
//                                 vocabulary, tokenizer_fingerprint (tokenizer.h), token
//                                 counts, shard names
// Token stream: every document is encoded and followed by </s> (eos_id), documents in corpus
// order. Shards of a stream have equal sizes (within one token), at most shard_tokens each.
//
// Validation hold-out, deterministic in (inputs, seed): documents are visited in a
// permutation drawn from Rng(seed) and moved to validation until it holds
// max(val_fraction * tokens, min_val_tokens) tokens, never more than half of them and never
// the last training document. When no document fits (a corpus of one or two big files), the
// tail of the training stream is cut off instead.
//
// The folder is built under a temporary sibling name and renamed when complete, so an
// interrupted prepare never leaves a half dataset. An existing non-empty out_dir is reused
// when its meta.json describes the same dataset (same input contents and settings) and
// refused otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atl {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, folders, .jsonl; empty = default corpus
  std::string out_dir;
  int vocab_size = 4096;  // requested; a small corpus may give fewer
  std::string vocab_key = "--vocab-size";  // where vocab_size came from, for messages
  double val_fraction = 0.02;
  int64_t shard_tokens = 100'000'000;  // few large shards, as ZAYA1 bundled them
  int64_t min_val_tokens = 4097;       // one 4096-token sequence and its last target
  uint64_t seed = 1337;                // validation hold-out
};

struct PrepareResult {
  std::string out_dir;
  std::string tokenizer_path;
  int vocab_size = 0;  // of the trained tokenizer
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> train_shards;  // full paths
  std::vector<std::string> val_shards;
  bool reused = false;  // out_dir already held this dataset
  double seconds = 0.0;
};

// Which tokenizer made the tokens at `data_path` (a dataset folder, or a .bin file: then the
// folder holding it): meta.json's tokenizer_fingerprint or, for data prepared before that was
// kept, the fingerprint of the folder's tokenizer.model. `source` is the file it was read from;
// both are empty when the folder has neither (shards made elsewhere, such as llm.c's).
struct TokenizerFingerprint {
  std::string value, source;
};
TokenizerFingerprint dataset_tokenizer_fingerprint(const std::string& data_path);

// Throws DataError for bad inputs (corpus.h), an out_dir that holds something else, or a
// vocab_size below what the tokenizer needs for the corpus (Tokenizer::min_vocab_size; checked
// before anything is trained or written), IoError when files cannot be written.
PrepareResult prepare_data(const PrepareOptions& options);

}  // namespace atl
