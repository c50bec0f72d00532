// A corpus read as a stream of items, in bounded memory, for `atoll data prepare`.
//
// Formats, decided per file by its name (extensions in any case; `.gz` / `.zst` are
// decompressed on the fly and the extension before them decides: x.jsonl.zst is JSONL):
//   *.jsonl   one JSON object per line with a string field "text": one item per line. The
//             line is only cut out here; parsing it (item_text) runs on the worker threads.
//   fortune   a text file with lines holding only `%` (strfile(1)): each stretch between such
//             lines is a document; the newline that ends a fortune's last line is dropped.
//   text      any other file: the whole file is one document.
// A text document longer than kPieceBytes comes as several items cut at line breaks (a line
// longer than that is one item of its own); only the last one has ends_document set, so the
// token stream gets one </s> per document. Blank documents are skipped, as is a leading UTF-8
// byte order mark. Every item has an ordinal (0, 1, 2, ... over the whole corpus) that does not
// depend on how the stream is batched: resuming and the tokenizer sample are keyed on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "atoll/data/byte_source.h"

namespace atl {

constexpr size_t kPieceBytes = 64 << 10;        // text documents come in items of about this size
constexpr size_t kMaxLineBytes = 256ull << 20;  // a longer JSONL line is skipped, not held

struct RawItem {
  enum Kind : uint8_t { kJsonLine, kText };
  std::string bytes;  // the line (kJsonLine, without its newline) or the text (kText)
  int64_t ordinal = 0;
  int64_t line = 0;  // 1-based line of the file where the item starts
  uint32_t file = 0;  // index into the stream's files
  Kind kind = kText;
  bool ends_document = true;
  uint64_t document_key = 0;  // kText: hash of the document's first item (split by document)
};

// The text of an item: a JSONL line parsed (its "text" field), or the text itself, with invalid
// UTF-8 bytes replaced by U+FFFD. `problem` is set (and the text left empty) for a line that is
// not a JSON object with a string "text", naming what is wrong; blank text is not a problem.
struct ItemText {
  std::string text;
  std::string problem;  // "" = fine
  int64_t replaced_bytes = 0;
};
ItemText item_text(RawItem&& item);

// Hash of a document's text that decides its split (validation or training): XXH3-64 seeded.
uint64_t document_hash(const std::string& text, uint64_t seed);

class DocumentStream {
 public:
  explicit DocumentStream(std::vector<std::string> files);
  ~DocumentStream();

  // Appends items to `out` until they hold about `max_bytes`; false when the corpus is done
  // (nothing appended). Throws DataError for corrupt compressed data.
  bool next_batch(size_t max_bytes, std::vector<RawItem>& out);

  const std::vector<std::string>& files() const { return files_; }
  int64_t disk_bytes() const { return done_disk_bytes_ + (source_ ? source_->disk_bytes() : 0); }
  // Files whose compressed stream was cut short (what was decoded before the cut is kept).
  const std::vector<std::string>& truncated_files() const { return truncated_; }
  const std::vector<std::string>& empty_files() const { return empty_; }

 private:
  bool open_next_file();
  void close_file();
  bool read_line(std::string& line);  // appends one line with its '\n'; false at end of file
  bool next_jsonl(RawItem& item);
  bool next_text(RawItem& item);

  std::vector<std::string> files_;
  size_t next_file_ = 0;
  uint32_t file_ = 0;
  std::unique_ptr<ByteSource> source_;
  bool jsonl_ = false;
  std::string buf_;  // decoded bytes not yet cut into lines
  size_t pos_ = 0;
  bool at_eof_ = false;
  int64_t line_no_ = 0, file_bytes_ = 0;
  // Text documents: the current document, its first line, whether the file has `%` lines.
  std::string doc_;
  int64_t doc_line_ = 0;
  bool doc_started_ = false, fortune_ = false;
  uint64_t doc_key_ = 0;
  int64_t ordinal_ = 0, done_disk_bytes_ = 0;
  std::vector<std::string> truncated_, empty_;
};

}  // namespace atl
