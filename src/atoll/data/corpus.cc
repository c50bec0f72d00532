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

// Refuses binary files (NUL or invalid UTF-8 in the first KiB; a sequence cut by the KiB
// boundary is fine) and replaces later invalid bytes with U+FFFD.
void check_text(const std::string& path, std::string& bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  const size_t sniff = std::min(n, kSniffBytes);
  for (size_t i = 0; i < sniff;) {
    const size_t len = p[i] == 0 ? 0 : utf8_len(p + i, n - i);
    if (len == 0) {
      throw DataError("input " + path + " is not UTF-8 text (" +
                      (p[i] == 0 ? std::string("NUL byte") : "invalid UTF-8") + " at byte " + std::to_string(i) +
                      "); fix: remove it from the inputs or convert it to "
                      "UTF-8 (e.g. iconv -t UTF-8)");
    }
    i += len;
  }
  std::string clean;
  size_t bad = 0, done = 0;
  for (size_t i = 0; i < n;) {
    const size_t len = utf8_len(p + i, n - i);
    if (len > 0) {
      i += len;
      continue;
    }
    clean.append(bytes, done, i - done).append("\xEF\xBF\xBD");
    ++bad;
    done = ++i;
  }
  if (bad == 0) return;
  clean.append(bytes, done, std::string::npos);
  bytes = std::move(clean);
  log_warn("input " + path + ": replaced " + std::to_string(bad) + " invalid UTF-8 byte(s) with U+FFFD");
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot read input " + path + ": " + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError("error while reading input " + path);
  return bytes;
}

// The file's extension in lower case (".jsonl" for "x.JSONL"): formats follow the extension
// whatever its case.
std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos; }

std::vector<std::string> split_jsonl(const std::string& path, const std::string& bytes) {
  std::vector<std::string> docs;
  size_t pos = 0;
  for (int64_t line_no = 1; pos < bytes.size(); ++line_no) {
    size_t end = bytes.find('\n', pos);
    if (end == std::string::npos) end = bytes.size();
    const std::string_view line(bytes.data() + pos, end - pos);
    pos = end + 1;
    if (is_blank(line)) continue;
    const auto where = path + ":" + std::to_string(line_no);
    nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded()) {
      throw DataError(where +
                      ": not valid JSON; fix: each line of a .jsonl input must be one "
                      "JSON object such as {\"text\": \"...\"}");
    }
    const auto it = obj.is_object() ? obj.find("text") : obj.end();
    if (!obj.is_object() || it == obj.end() || !it->is_string()) {
      throw DataError(where +
                      ": no string field \"text\"; fix: each line of a .jsonl input "
                      "must be a JSON object such as {\"text\": \"...\"}");
    }
    std::string text = it->get<std::string>();
    if (!is_blank(text)) docs.push_back(std::move(text));
  }
  return docs;
}

// Splits at lines holding only `%` (tolerating a CR) when the file has any; otherwise the
// whole file is one document. The newline that ends a fortune's last line is dropped.
std::vector<std::string> split_text(const std::string& bytes) {
  std::vector<std::string> docs;
  std::string cur;
  bool fortune = false;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find('\n', pos);
    const size_t next = end == std::string::npos ? bytes.size() : end + 1;
    if (end == std::string::npos) end = bytes.size();
    const std::string_view line(bytes.data() + pos, end - pos);
    if (line == "%" || line == "%\r") {
      fortune = true;
      if (!cur.empty() && cur.back() == '\n') cur.pop_back();
      if (!is_blank(cur)) docs.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.append(bytes, pos, next - pos);
    }
    pos = next;
  }
  if (fortune && !cur.empty() && cur.back() == '\n') cur.pop_back();
  if (!is_blank(cur)) docs.push_back(std::move(cur));
  return docs;
}

std::vector<std::string> split_documents(const std::string& path, std::string& bytes) {
  if (bytes.starts_with("\xEF\xBB\xBF")) bytes.erase(0, 3);  // UTF-8 byte order mark
  check_text(path, bytes);
  if (lower_extension(path) == ".jsonl") return split_jsonl(path, bytes);
  return split_text(bytes);
}

// Files under a folder, sorted, minus hidden entries and strfile indexes.
std::vector<fs::path> walk_folder(const fs::path& dir) {
  std::vector<fs::path> files;
  auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink);
  for (; it != fs::recursive_directory_iterator(); ++it) {
    const fs::path& p = it->path();
    if (p.filename().string().starts_with(".")) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    if (p.extension() == ".dat" && fs::exists(fs::path(p).replace_extension())) continue;
    files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  return files;
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

std::vector<std::string> list_corpus_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  std::set<fs::path> seen;  // canonical paths, so symlinked duplicates are read once
  auto add = [&](const fs::path& p) {
    if (seen.insert(fs::weakly_canonical(p)).second) files.push_back(p.string());
  };
  for (const std::string& input : inputs) {
    std::error_code ec;
    const auto status = fs::status(input, ec);
    if (ec || !fs::exists(status)) {
      throw DataError("input " + input +
                      " does not exist; fix: pass existing files or folders "
                      "(--input / data.input), or leave it empty for the built-in corpus");
    }
    if (fs::is_directory(status)) {
      for (const fs::path& p : walk_folder(input)) add(p);
    } else {
      add(input);
    }
  }
  return files;
}

std::vector<std::string> read_documents(const std::string& file) {
  std::string bytes = read_bytes(file);
  return split_documents(file, bytes);
}

Corpus read_corpus(const std::vector<std::string>& inputs) {
  Corpus corpus;
  corpus.fingerprint = kFnvOffset;
  for (const std::string& file : list_corpus_files(inputs)) {
    std::string bytes = read_bytes(file);
    const uint64_t size = bytes.size();
    corpus.fingerprint =
        fnv1a64(std::string_view(reinterpret_cast<const char*>(&size), sizeof(size)), corpus.fingerprint);
    corpus.fingerprint = fnv1a64(bytes, corpus.fingerprint);
    corpus.bytes += static_cast<int64_t>(size);
    for (std::string& doc : split_documents(file, bytes)) corpus.docs.push_back(std::move(doc));
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
