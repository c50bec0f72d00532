#include "atoll/data/corpus.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/user_path.h"
#include "atoll/data/byte_source.h"
#include "atoll/data/document_stream.h"

namespace atl {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";
constexpr size_t kSniffBytes = 1024;  // how much of a file decides "text or binary"

// Length of the valid UTF-8 sequence at p (1-4), or 0 if invalid (overlong forms, surrogates
// and code points above U+10FFFF are invalid, as RFC 3629 says). `n` bytes are available.
size_t utf8_len(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (n < len) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  }
  return len;
}

// Files under a folder, sorted, minus hidden entries and strfile indexes. Each folder is
// entered once: a symlink back to a folder above (a loop) or to one walked already is skipped
// with a warning, as is `skip` (the output folder of a prepare that sits inside its input). An
// entry that is neither a file nor a folder (a dangling symlink, a pipe, a device, a socket) is
// skipped with a warning naming it: reading a pipe would block, and a device never ends.
void walk_folder(const fs::path& dir, const std::string& skip, std::set<std::string>& entered,
                 std::vector<fs::path>& files, std::vector<std::string>* skipped) {
  const auto skip_entry = [&](const fs::path& p, const std::string& why) {
    log_warn("input " + p.string() + ": skipped, " + why);
    if (skipped) skipped->push_back(p.string() + ": " + why);
  };
  std::error_code ec;
  std::vector<fs::path> entries;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    entries.push_back(it->path());
  if (ec) throw DataError("input folder " + dir.string() + ": cannot be listed (" + ec.message() +
                          "); fix: make it readable (chmod +rx) or remove it from the inputs");
  std::sort(entries.begin(), entries.end());
  for (const fs::path& p : entries) {
    if (p.filename().string().starts_with(".")) continue;
    const PathKind kind = path_kind(p.string());
    if (kind == PathKind::kFolder) {
      const std::string id = path_identity(p.string());
      if (id == skip) {
        skip_entry(p, "it is the output folder (--out) of this prepare");
      } else if (!entered.insert(id).second) {
        skip_entry(p, "a symbolic link to a folder read already (a loop, or the same folder twice)");
      } else {
        walk_folder(p, skip, entered, files, skipped);
      }
    } else if (kind == PathKind::kFile) {
      if (p.extension() == ".dat" && fs::exists(fs::path(p).replace_extension(), ec)) continue;
      files.push_back(p);
    } else {
      skip_entry(p, "it is " + (kind == PathKind::kMissing ? std::string("a dangling symbolic link") : path_kind_text(kind)) +
                        ", not a file or folder");
    }
  }
}
}  // namespace

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::vector<std::string> default_corpus_paths() { return {kDefaultCorpus}; }

std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs, const std::string& key,
                                           const std::string& skip_dir, std::vector<std::string>* skipped) {
  const std::vector<PathEntry> entries = list_entries(key, inputs);
  for (const PathEntry& e : entries)
    check_input_file_or_dir(e.path, e.key, "pass existing files or folders (" + key + "), or leave it empty for the built-in corpus");
  check_distinct_paths(entries, "list each input once");
  const std::string skip = skip_dir.empty() ? "" : path_identity(skip_dir);
  std::vector<std::string> files;
  std::set<std::string> seen;  // identities, so symlinked duplicates are read once
  std::set<std::string> entered;
  for (const std::string& input : inputs) {
    std::vector<fs::path> found;
    if (path_kind(input) == PathKind::kFolder) {
      entered.insert(path_identity(input));
      walk_folder(input, skip, entered, found, skipped);
    } else {
      found.push_back(input);
    }
    for (const fs::path& p : found)
      if (seen.insert(path_identity(p.string())).second) files.push_back(p.string());
  }
  return files;
}

void check_text_file(const std::string& file) {
  auto source = open_byte_source(file);
  std::string head(kSniffBytes + 3, '\0');
  size_t n = 0;
  while (n < head.size()) {
    const size_t got = source->read(head.data() + n, head.size() - n);
    if (got == 0) break;
    n += got;
  }
  head.resize(n);
  if (head.starts_with("\xEF\xBB\xBF")) head.erase(0, 3);  // UTF-8 byte order mark
  const auto* p = reinterpret_cast<const unsigned char*>(head.data());
  const size_t sniff = std::min(head.size(), kSniffBytes);
  for (size_t i = 0; i < sniff;) {
    // 3 bytes past the KiB are read, so a sequence starting in it is whole unless the file ends.
    const size_t len = p[i] == 0 ? 0 : utf8_len(p + i, head.size() - i);
    if (len == 0) {
      throw DataError("input " + file + " is not UTF-8 text (" +
                      (p[i] == 0 ? std::string("NUL byte") : "invalid UTF-8") + " at byte " + std::to_string(i) +
                      "); fix: remove it from the inputs or convert it to UTF-8 (e.g. iconv -t UTF-8)");
    }
    i += len;
  }
}

int64_t replace_invalid_utf8(std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n && p[i] < 0x80) ++i;  // fast path: ASCII
  std::string clean;
  int64_t bad = 0;
  size_t done = 0;
  while (i < n) {
    const size_t len = utf8_len(p + i, n - i);
    if (len > 0) {
      i += len;
      continue;
    }
    clean.append(text, done, i - done).append("\xEF\xBF\xBD");
    ++bad;
    done = ++i;
  }
  if (bad == 0) return 0;
  clean.append(text, done, std::string::npos);
  text = std::move(clean);
  return bad;
}

std::vector<std::string> read_documents(const std::string& file) {
  check_text_file(file);
  DocumentStream stream({file});
  std::vector<std::string> docs;
  std::vector<RawItem> items;
  std::string doc;
  while (stream.next_batch(kPieceBytes, items)) {
    for (RawItem& item : items) {
      const int64_t line = item.line;
      const bool ends = item.ends_document;
      ItemText t = item_text(std::move(item));
      if (!t.problem.empty()) {
        throw DataError(file + ":" + std::to_string(line) + ": " + t.problem +
                        "; fix: each line of a .jsonl input must be one JSON object such as {\"text\": \"...\"}");
      }
      if (t.replaced_bytes > 0)
        log_warn("input " + file + ": replaced " + std::to_string(t.replaced_bytes) + " invalid UTF-8 byte(s) with U+FFFD");
      doc += t.text;
      if (ends && !doc.empty()) docs.push_back(std::move(doc));
      if (ends) doc.clear();
    }
    items.clear();
  }
  return docs;
}

Corpus read_corpus(const std::vector<std::string>& inputs) {
  Corpus corpus;
  corpus.fingerprint = kFnvOffset;
  for (const std::string& file : list_corpus_files(inputs)) {
    check_text_file(file);
    auto source = open_byte_source(file);
    std::string chunk(1 << 16, '\0');
    uint64_t size = 0;
    while (const size_t got = source->read(chunk.data(), chunk.size())) {
      corpus.fingerprint = fnv1a64(std::string_view(chunk.data(), got), corpus.fingerprint);
      size += got;
    }
    corpus.fingerprint =
        fnv1a64(std::string_view(reinterpret_cast<const char*>(&size), sizeof(size)), corpus.fingerprint);
    corpus.bytes += static_cast<int64_t>(size);
    for (std::string& doc : read_documents(file)) corpus.docs.push_back(std::move(doc));
    corpus.files.push_back(file);
  }
  if (corpus.docs.empty()) {
    std::string names;
    for (const auto& in : inputs) names += (names.empty() ? "" : ", ") + in;
    throw DataError("no text found in the inputs (" + names + "; " + std::to_string(corpus.files.size()) +
                    " file(s) read); fix: pass files "
                    "or folders that hold text (plain, fortune or .jsonl with a \"text\" field)");
  }
  return corpus;
}

}  // namespace atl
