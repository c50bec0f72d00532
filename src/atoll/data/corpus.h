// Gathering a text corpus: inputs (files, folders, JSONL) -> a list of documents.
//
// Formats, decided per file (extensions in any case: x.JSONL is JSONL):
//   *.jsonl   one JSON object per line with a string field "text"; blank lines are skipped.
//   fortune   a text file with lines holding only `%` (the `fortune` format, strfile(1)):
//             each stretch between such lines is a document.
//   text      any other file: the whole file is one document.
// Folders are walked recursively in sorted path order (so the document order, and with it
// the tokenizer and the shards, is the same on every machine). While walking, hidden entries
// are skipped, as are strfile index files (`x.dat` beside `x`); files reached twice (the
// `x.u8 -> x` symlinks of Debian's fortunes, or an input named twice) are read once.
// Text must be UTF-8: a file with a NUL byte or invalid UTF-8 in its first KiB is refused as
// binary; stray invalid bytes later on are replaced with U+FFFD (and logged).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atl {

struct Corpus {
  std::vector<std::string> docs;   // non-empty documents, in file order
  std::vector<std::string> files;  // the files read, in order
  int64_t bytes = 0;               // total size of the files read
  // Content fingerprint: FNV-1a 64 over every file's size and bytes, in order. Names are left
  // out, so the same files reached by other paths give the same fingerprint.
  uint64_t fingerprint = 0;
};

// The built-in corpus: Debian's `fortunes` package (apt-get install fortunes).
std::vector<std::string> default_corpus_paths();

// Expands inputs into the files to read, in the order described above. Throws DataError for
// a path that does not exist.
std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs);

// The documents of one file (format chosen by name and content, as above). Throws DataError
// for a binary file or a bad JSONL line (naming file and line), IoError if unreadable.
std::vector<std::string> read_documents(const std::string& file);

// All documents of all inputs. Throws DataError when the inputs hold no text at all.
Corpus read_corpus(const std::vector<std::string>& inputs);

// 64-bit FNV-1a, continued from `h` (use kFnvOffset to start).
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnvOffset);

}  // namespace atl
