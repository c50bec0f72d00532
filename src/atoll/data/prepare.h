// `atoll data prepare`: a corpus of any size -> a dataset folder that the loader reads, in
// memory bounded by a budget, on every core, resumable after a crash.
//
// The dataset folder holds:
//   tokenizer.model               the SentencePiece model (tokenizer.h): trained on a sample of
//                                 the corpus, or the given --tokenizer copied byte for byte
//   train_000000.bin, ...         training tokens, llm.c shard format (shard.h), shard_tokens
//                                 tokens each, the last one shorter
//   val_000000.bin, ...           held-out validation tokens (absent when val_fraction = 0)
//   meta.json                     written last: settings, input fingerprint, vocabulary,
//                                 tokenizer_fingerprint, token counts, and the manifest: every
//                                 shard with its token count and XXH3-64 checksum
//   progress.json                 only while unfinished: the shards done and where each stream
//                                 stands (shard_writer.h), for resuming
//
// Two passes over the inputs, both streamed (document_stream.h). The first draws the
// tokenizer's training sample (tokenizer_sample.h; skipped with a given tokenizer); the second
// encodes batches of documents on `threads` threads and appends each document, followed by
// </s> (eos_id), to the training or the validation stream in corpus order, so the shards do not
// depend on the thread count.
//
// Validation split, by document: a document is held out when a seeded hash of its text (of its
// first 64 KiB piece for a long text file) falls below val_fraction. A document's split depends
// on nothing else, so adding data later never moves a training document into validation or
// back. When the hash leaves validation with fewer than min_val_tokens (a small corpus), the
// tail of the training stream is moved over to make val_fraction of the tokens (at least
// min_val_tokens), at most half of it; when it leaves training empty,
// the held-out documents train and the tail is cut from them.
//
// Memory: `memory_mb` bounds the whole process: the tokenizer sample and the trainer's working
// set in the first pass, two batches of documents and their tokens in the second.
//
// Interrupted (killed, the machine lost): running the same command again keeps the shards that
// were finished, re-reads the inputs without encoding what they hold, and gives the same shards
// as a run that was never interrupted. An out_dir holding a finished dataset of the same
// inputs and settings is reused; one holding anything else is refused and left as it was.
//
// Bad input is skipped where skipping is right, with a warning naming the file and line and the
// counts in meta.json ("skipped"): a JSONL line that is not JSON or has no string "text", an
// empty file, the cut-off end of a truncated .gz/.zst; invalid UTF-8 bytes become U+FFFD. A
// file that is not text at all (NUL or invalid UTF-8 in its first KiB) is refused up front.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace atl {

struct PrepareOptions {
  std::vector<std::string> inputs{};  // files, folders, .jsonl, .gz/.zst; empty = default corpus
  std::string out_dir{};
  int vocab_size = 4096;  // requested; a small corpus may give fewer
  std::string vocab_key = "--vocab-size";  // where vocab_size came from, for messages
  std::string input_key = "--input";       // where inputs and out_dir came from, for messages
  std::string out_key = "--out";
  std::string tokenizer{};  // a SentencePiece model to use as it is ("" = train one)
  double val_fraction = 0.02;
  // Tokens per shard. llm.c writes 100 M-token shards of FineWeb's 10 B tokens; atoll's
  // corpora are a few GB, so a tenth of that gives tens of shards to spread over workers.
  int64_t shard_tokens = 10'000'000;
  int64_t min_val_tokens = 4097;  // one 4096-token sequence and its last target
  uint64_t seed = 1337;           // validation split and tokenizer sample
  int64_t memory_mb = 2048;       // budget for the whole process
  int64_t tokenizer_sample_mb = 0;  // 0: kDefaultSampleMb, or less when the budget needs it
  int threads = 0;                  // encoding threads; 0 = every core
  std::function<void(const std::string&)> on_shard{};  // after each shard is in place (its name)
  // SentencePiece's Encode for every document, without the word cache (word_cache.h): the way
  // around a mismatch the guard reports; about 10x slower.
  bool exact_encode = false;
  // Tests: changes the word cache's tokens of each item the guard checks (a fake cache bug).
  std::function<void(std::vector<int32_t>&)> tamper_word_cache{};
};

// The tokenizer sample when none is asked for, in MB (docs/data.md: how it was chosen).
constexpr int64_t kDefaultSampleMb = 100;

struct PrepareResult {
  std::string out_dir;
  std::string tokenizer_path;
  int vocab_size = 0;  // of the tokenizer
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> train_shards;  // full paths
  std::vector<std::string> val_shards;
  bool reused = false;   // out_dir already held this dataset
  bool resumed = false;  // out_dir held this dataset, unfinished
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
// vocab_size below what the tokenizer needs for the corpus (Tokenizer::min_vocab_size, on the
// sample; checked before anything is trained or written), IoError when files cannot be written.
PrepareResult prepare_data(const PrepareOptions& options);

}  // namespace atl
