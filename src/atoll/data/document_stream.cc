#include "atoll/data/document_stream.h"

#include <xxhash.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>

#include "atoll/core/errors.h"
#include "atoll/data/corpus.h"
#include "atoll/data/jsonl_text.h"

namespace atl {

namespace {

constexpr size_t kReadChunk = 1 << 20;

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos; }

bool is_fortune_separator(std::string_view line) {
  return line == "%\n" || line == "%\r\n" || line == "%" || line == "%\r";
}

bool is_jsonl(const std::string& path) {
  std::filesystem::path p(path);
  if (compression_of(path) != Compression::kNone) p = p.stem();  // x.jsonl.zst -> x.jsonl
  std::string ext = p.extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".jsonl";
}

}  // namespace

ItemText item_text(RawItem&& item) {
  ItemText out;
  out.replaced_bytes = replace_invalid_utf8(item.bytes);
  if (item.kind == RawItem::kText) {
    out.text = std::move(item.bytes);
    return out;
  }
  if (item.bytes.empty()) {  // DocumentStream drops lines too long to hold
    out.problem = "a line longer than " + std::to_string(kMaxLineBytes >> 20) + " MiB";
    return out;
  }
  if (simple_jsonl_text(item.bytes, out.text)) {  // the common shape, decoded in one pass
    if (is_blank(out.text)) out.text.clear();
    return out;
  }
  out.text.clear();
  nlohmann::json obj = nlohmann::json::parse(item.bytes, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) {
    out.problem = "not valid JSON";
    return out;
  }
  const auto it = obj.is_object() ? obj.find("text") : obj.end();
  if (!obj.is_object() || it == obj.end() || !it->is_string()) {
    out.problem = "no string field \"text\"";
    return out;
  }
  out.text = std::move(it->get_ref<std::string&>());
  if (is_blank(out.text)) out.text.clear();
  return out;
}

uint64_t document_hash(const std::string& text, uint64_t seed) { return XXH3_64bits_withSeed(text.data(), text.size(), seed); }

DocumentStream::DocumentStream(std::vector<std::string> files) : files_(std::move(files)) {}
DocumentStream::~DocumentStream() = default;

bool DocumentStream::open_next_file() {
  if (next_file_ >= files_.size()) return false;
  file_ = static_cast<uint32_t>(next_file_++);
  source_ = open_byte_source(files_[file_]);
  jsonl_ = is_jsonl(files_[file_]);
  buf_.clear();
  pos_ = 0;
  at_eof_ = false;
  line_no_ = file_bytes_ = 0;
  doc_.clear();
  doc_started_ = fortune_ = false;
  return true;
}

void DocumentStream::close_file() {
  if (file_bytes_ == 0) empty_.push_back(files_[file_]);
  if (source_->truncated()) truncated_.push_back(files_[file_]);
  done_disk_bytes_ += source_->disk_bytes();
  source_.reset();
}

bool DocumentStream::read_line(std::string& line) {
  while (true) {
    const size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      line.append(buf_, pos_, nl + 1 - pos_);
      pos_ = nl + 1;
      return true;
    }
    line.append(buf_, pos_, std::string::npos);
    buf_.clear();
    pos_ = 0;
    if (at_eof_) return !line.empty();
    buf_.resize(kReadChunk);
    const size_t got = source_->read(buf_.data(), buf_.size());
    buf_.resize(got);
    at_eof_ = got == 0;
    if (file_bytes_ == 0 && buf_.starts_with("\xEF\xBB\xBF")) pos_ = 3;  // UTF-8 byte order mark
    file_bytes_ += static_cast<int64_t>(got);
    if (line.size() > kMaxLineBytes) return true;  // the caller drops it
  }
}

bool DocumentStream::next_jsonl(RawItem& item) {
  std::string line;
  while (true) {
    line.clear();
    if (!read_line(line)) return false;
    ++line_no_;
    if (line.size() > kMaxLineBytes) {
      // Too long to hold: skip to its end (counted as a bad line by item_text's caller).
      while (!line.ends_with('\n')) {
        line.clear();
        if (!read_line(line)) break;
      }
      line.clear();
      item = RawItem{.bytes = "", .line = line_no_, .file = file_, .kind = RawItem::kJsonLine};
      return true;
    }
    if (line.ends_with('\n')) line.pop_back();
    if (is_blank(line)) continue;
    item = RawItem{.bytes = std::move(line), .line = line_no_, .file = file_, .kind = RawItem::kJsonLine};
    return true;
  }
}

bool DocumentStream::next_text(RawItem& item) {
  auto emit = [&](bool ends) {
    if (!doc_started_) doc_key_ = XXH3_64bits(doc_.data(), doc_.size());
    item = RawItem{.bytes = std::move(doc_),
                   .line = doc_line_,
                   .file = file_,
                   .kind = RawItem::kText,
                   .ends_document = ends,
                   .document_key = doc_key_};
    doc_.clear();
    doc_started_ = !ends;
    return true;
  };
  std::string line;
  while (true) {
    line.clear();
    if (!read_line(line)) {
      if (fortune_ && doc_.ends_with('\n')) doc_.pop_back();
      if (doc_started_ || !is_blank(doc_)) return emit(true);
      return false;
    }
    ++line_no_;
    if (is_fortune_separator(line)) {
      fortune_ = true;
      if (doc_.ends_with('\n')) doc_.pop_back();
      if (doc_started_ || !is_blank(doc_)) {
        emit(true);
        doc_line_ = line_no_ + 1;
        return true;
      }
      doc_.clear();
      doc_line_ = line_no_ + 1;
      continue;
    }
    if (doc_.empty() && !doc_started_) doc_line_ = line_no_;
    if (!doc_.empty() && doc_.size() + line.size() > kPieceBytes) {
      emit(false);
      doc_line_ = line_no_;
      doc_ = std::move(line);
      return true;
    }
    doc_ += line;
  }
}

bool DocumentStream::next_batch(size_t max_bytes, std::vector<RawItem>& out) {
  size_t bytes = 0;
  const size_t start = out.size();
  while (bytes < max_bytes) {
    if (!source_ && !open_next_file()) break;
    RawItem item;
    if (!(jsonl_ ? next_jsonl(item) : next_text(item))) {
      close_file();
      continue;
    }
    item.ordinal = ordinal_++;
    bytes += item.bytes.size() + 64;
    out.push_back(std::move(item));
  }
  return out.size() > start;
}

}  // namespace atl
