// Gathering a text corpus: which files the inputs name, checks that they hold text, and (for
// small corpora: tests, tools) all their documents in memory. `atoll data prepare` streams
// instead (document_stream.h, which describes the formats).
//
// Folders are walked recursively in sorted path order (so the document order, and with it
// the tokenizer and the shards, is the same on every machine). While walking, hidden entries
// are skipped, as are strfile index files (`x.dat` beside `x`); files reached twice (the
// `x.u8 -> x` symlinks of Debian's fortunes) are read once, and a folder reached twice (a
// symlink loop) is walked once. Pipes, devices, sockets and dangling symlinks inside a folder
// are skipped with a warning; named as an input, they are refused (core/user_path.h), as is an
// input named twice, in any spelling.
// Text must be UTF-8: a file with a NUL byte or invalid UTF-8 in its first KiB (after
// decompression) is refused as binary; stray invalid bytes later on are replaced with U+FFFD.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atl {

struct Corpus {
  std::vector<std::string> docs;   // non-empty documents, in file order
  std::vector<std::string> files;  // the files read, in order
  int64_t bytes = 0;               // total decoded size of the files read
  // Content fingerprint: FNV-1a 64 over every file's bytes and size, in order. Names are left
  // out, so the same files reached by other paths give the same fingerprint.
  uint64_t fingerprint = 0;
};

// The built-in corpus: Debian's `fortunes` package (apt-get install fortunes).
std::vector<std::string> default_corpus_paths();

// Expands inputs into the files to read, in the order described above. Throws PathError for
// an input that does not exist, is no file or folder, or names what another input names; `key`
// names the inputs in messages ("--input", or "data.input" whose entries are "data.input[i]").
// `skip_dir` (a prepare's output folder) is never walked into. Each entry skipped while walking
// is warned about and, when `skipped` is given, added to it as "PATH: why".
std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs, const std::string& key = "--input",
                                           const std::string& skip_dir = "", std::vector<std::string>* skipped = nullptr);

// Refuses a file that is not text (see above), naming it and the first bad byte. Reads at
// most its first KiB (decompressed).
void check_text_file(const std::string& file);

// Replaces each byte that does not start or continue a valid UTF-8 sequence (RFC 3629: no
// overlong forms, surrogates or code points above U+10FFFF) with U+FFFD; returns how many.
int64_t replace_invalid_utf8(std::string& text);

// The documents of one file, strictly: throws DataError for a binary file or a bad JSONL
// line (naming file and line), IoError if unreadable.
std::vector<std::string> read_documents(const std::string& file);

// All documents of all inputs, strictly as read_documents. Throws DataError when the inputs
// hold no text at all.
Corpus read_corpus(const std::vector<std::string>& inputs);

// 64-bit FNV-1a, continued from `h` (use kFnvOffset to start).
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
uint64_t fnv1a64(std::string_view bytes, uint64_t h = kFnvOffset);

}  // namespace atl
