#include "atoll/data/prepare.h"

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <thread>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"
#include "atoll/core/user_path.h"
#include "atoll/data/corpus.h"
#include "atoll/data/document_stream.h"
#include "atoll/data/shard.h"
#include "atoll/data/shard_writer.h"
#include "atoll/data/tokenizer.h"
#include "atoll/data/tokenizer_sample.h"
#include "atoll/data/word_cache.h"

namespace atl {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kFormat = "atoll-data-2";
// The meta.json / progress.json fields that decide whether a folder holds "the same dataset".
constexpr const char* kIdentityKeys[] = {"format",         "fingerprint",    "requested_vocab_size",
                                         "given_tokenizer", "sample_bytes",   "val_fraction",
                                         "shard_tokens",   "min_val_tokens", "seed"};
// Memory, measured (docs/data.md): SentencePiece's BPE trainer peaks at about this many bytes
// per byte of its training text, and a process of atoll's libraries starts at about kBaseMb.
constexpr int64_t kTrainerBytesPerSampleByte = 16;
constexpr int64_t kBaseMb = 24;
constexpr int kMaxWarningsPerKind = 10;  // then only counted
constexpr double kProgressEverySeconds = 10.0;
// The word caches (word_cache.h), one per encoding thread, take this share of the budget
// beside the process, and at most kMaxCacheBytesPerThread each: a corpus's frequent words fit
// in far less (measured on source code: 64 MB holds a quarter million words).
constexpr int64_t kCacheShareOfBudget = 16;
constexpr size_t kMaxCacheBytesPerThread = size_t{64} << 20;
// 1 item in kGuardEvery is encoded both through the word cache and by SentencePiece alone, and
// the two compared (docs/data.md: what it costs).
constexpr uint64_t kGuardEvery = 256;

std::string hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

// The inputs' fingerprint without reading them: size and modification time of every file, in
// order (names left out: the same files reached by other paths give the same fingerprint).
std::string stat_fingerprint(const std::vector<std::string>& files) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const auto& f : files) {
    struct stat s {};
    if (::stat(f.c_str(), &s) != 0) throw DataError("input " + f + " vanished while preparing; fix: keep the inputs in place");
    const int64_t v[3] = {static_cast<int64_t>(s.st_size), static_cast<int64_t>(s.st_mtim.tv_sec),
                          static_cast<int64_t>(s.st_mtim.tv_nsec)};
    XXH3_64bits_update(st, v, sizeof v);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return hex64(h);
}

void write_json(const fs::path& path, const json& j) { write_file_atomic(path.string(), j.dump(2) + "\n", /*sync=*/true); }

std::optional<json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return json();  // present but unreadable
  return j;
}

// Throws unless `have` (a meta.json or progress.json) has the identity `want`.
void check_identity(const fs::path& file, const json& have, const json& want) {
  for (const char* key : kIdentityKeys) {
    const json a = have.contains(key) ? have[key] : json(), b = want.contains(key) ? want[key] : json();
    if (a != b) {
      throw DataError("output folder " + file.parent_path().string() + " holds a different dataset (" +
                      file.filename().string() + " " + key + " is " + (a.is_null() ? "missing" : a.dump()) +
                      ", this one has " + (b.is_null() ? "none" : b.dump()) +
                      "); fix: choose another --out or delete the folder");
    }
  }
}

PrepareResult result_from_meta(const fs::path& dir, const json& meta) {
  PrepareResult r;
  r.out_dir = dir.string();
  r.tokenizer_path = (dir / "tokenizer.model").string();
  r.vocab_size = meta.at("vocab_size").get<int>();
  r.documents = meta.at("documents").get<int64_t>();
  r.train_tokens = meta.at("train_tokens").get<int64_t>();
  r.val_tokens = meta.at("val_tokens").get<int64_t>();
  for (const auto& n : meta.at("train_shards")) r.train_shards.push_back((dir / n.get<std::string>()).string());
  for (const auto& n : meta.at("val_shards")) r.val_shards.push_back((dir / n.get<std::string>()).string());
  return r;
}

// Refuses a vocabulary the tokenizer trainer cannot build for this sample, before the (long)
// training starts, naming where the size came from and the minimum.
void check_vocab_size(const std::vector<std::string>& sample, const PrepareOptions& o,
                      const std::vector<std::string>& inputs) {
  const int need = Tokenizer::min_vocab_size(sample);
  if (o.vocab_size >= need) return;
  const bool flag = o.vocab_key.starts_with("--");
  const std::string set = flag ? "pass " + o.vocab_key + " " : "set " + o.vocab_key + " to ";
  std::string names;
  for (const auto& in : inputs) names += (names.empty() ? "" : ", ") + in;
  throw DataError(o.vocab_key + (flag ? " " : " = ") + std::to_string(o.vocab_size) +
                  " is too small for a tokenizer of " + names + ": it needs at least " + std::to_string(need) +
                  " (3 special pieces, 256 byte pieces and " + std::to_string(need - 259) +
                  " characters of their own); fix: " + set + std::to_string(need) + " or more");
}

// Runs fn(i, t) for i in [0, n) on `threads` threads (t: the thread's index; dynamic: items
// differ in size) while the calling thread runs `meanwhile`.
template <class Fn, class Meanwhile>
void parallel_for(int threads, size_t n, Fn&& fn, Meanwhile&& meanwhile) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        for (size_t i = next++; i < n; i = next++) fn(i, t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mu);
        if (!error) error = std::current_exception();
        next = n;
      }
    });
  }
  try {
    meanwhile();
  } catch (...) {
    for (auto& th : pool) th.join();
    throw;
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

// The warnings about bad input: the first few of each kind in full, then counts.
class InputReport {
 public:
  explicit InputReport(const std::vector<std::string>& files) : files_(files) {}
  void bad_line(uint32_t file, int64_t line, const std::string& problem) {
    const int64_t n = ++counts_[problem];
    if (n <= kMaxWarningsPerKind)
      log_warn(files_[file] + ":" + std::to_string(line) + ": " + problem + "; line skipped" +
               (n == kMaxWarningsPerKind ? " (further lines like it are only counted)" : ""));
  }
  void replaced(uint32_t file, int64_t line, int64_t bytes) {
    replaced_ += bytes;
    if (++replaced_items_ <= kMaxWarningsPerKind)
      log_warn(files_[file] + ":" + std::to_string(line) + ": " + std::to_string(bytes) +
               " invalid UTF-8 byte(s) replaced with U+FFFD");
  }
  void finish(const DocumentStream& stream) {
    for (const auto& f : stream.empty_files()) log_warn("input " + f + " is empty; skipped");
    for (const auto& f : stream.truncated_files())
      log_warn("input " + f + ": the compressed stream is cut short (truncated file); kept the documents before the cut");
  }
  json summary(const DocumentStream& stream) const {
    json lines = json::object();
    int64_t total = 0;
    for (const auto& [problem, n] : counts_) {
      lines[problem] = n;
      total += n;
    }
    if (total > 0) log_warn("prepare: skipped " + std::to_string(total) + " bad JSONL line(s): " + lines.dump());
    return json{{"lines", lines},
                {"invalid_utf8_bytes", replaced_},
                {"empty_files", stream.empty_files()},
                {"truncated_files", stream.truncated_files()}};
  }

 private:
  const std::vector<std::string>& files_;
  std::map<std::string, int64_t> counts_;
  int64_t replaced_ = 0, replaced_items_ = 0;
};

// A progress line every kProgressEverySeconds: bytes read, tokens written, speed, ETA.
class Progress {
 public:
  Progress(std::string what, int64_t total_bytes) : what_(std::move(what)), total_(total_bytes) {}
  void update(int64_t bytes, int64_t tokens, bool last = false) {
    const auto now = Clock::now();
    if (!last && std::chrono::duration<double>(now - shown_).count() < kProgressEverySeconds) return;
    shown_ = now;
    const double s = std::max(1e-9, std::chrono::duration<double>(now - start_).count());
    const double mbs = static_cast<double>(bytes) / 1e6 / s;
    const double eta = bytes > 0 ? s * static_cast<double>(total_ - bytes) / static_cast<double>(bytes) : 0.0;
    char line[256];
    std::snprintf(line, sizeof line, "%s: %.1f / %.1f MB read, %.2f M tokens, %.1f MB/s, %s %.0f s", what_.c_str(),
                  bytes / 1e6, total_ / 1e6, tokens / 1e6, mbs, last ? "took" : "ETA", last ? s : eta);
    log_info(line);
  }

 private:
  std::string what_;
  int64_t total_;
  Clock::time_point start_ = Clock::now(), shown_ = Clock::now();
};

int64_t total_size(const std::vector<std::string>& files) {
  int64_t n = 0;
  std::error_code ec;
  for (const auto& f : files) n += static_cast<int64_t>(fs::file_size(f, ec));
  return n;
}

int thread_count(const PrepareOptions& o) {
  return o.threads > 0 ? o.threads : static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 64));
}

// Each encoding thread's word cache, in bytes: kCacheShareOfBudget of the budget beside the
// process, split between the threads.
size_t cache_bytes(const PrepareOptions& o) {
  const int64_t share = ((o.memory_mb - kBaseMb) << 20) / kCacheShareOfBudget / thread_count(o);
  return std::clamp<size_t>(static_cast<size_t>(std::max<int64_t>(share, 0)), WordCacheEncoder::kMinCacheBytes,
                            kMaxCacheBytesPerThread);
}

// Bytes of input per batch: two batches (one being encoded, the next being read) and their
// tokens must fit the budget beside the process itself and the word caches.
size_t batch_bytes(const PrepareOptions& o) {
  const int64_t caches_mb = static_cast<int64_t>(cache_bytes(o) * static_cast<size_t>(thread_count(o)) >> 20);
  const int64_t mb = std::clamp<int64_t>((o.memory_mb - kBaseMb - caches_mb) / 8, 1, 256);
  return static_cast<size_t>(mb) << 20;
}

// The tokenizer's sample size: asked for, or kDefaultSampleMb, within what the budget leaves
// for the trainer.
int64_t sample_bytes(const PrepareOptions& o) {
  const int64_t fits = std::max<int64_t>(1 << 20, ((o.memory_mb - kBaseMb) << 20) / kTrainerBytesPerSampleByte);
  const int64_t want = (o.tokenizer_sample_mb > 0 ? o.tokenizer_sample_mb : kDefaultSampleMb) << 20;
  if (o.tokenizer_sample_mb > 0 && want > fits) {
    throw DataError("--tokenizer-sample-mb " + std::to_string(o.tokenizer_sample_mb) + " does not fit --memory-mb " +
                    std::to_string(o.memory_mb) + " (the trainer needs about " +
                    std::to_string(kTrainerBytesPerSampleByte) + " bytes per sample byte); fix: at most " +
                    std::to_string(fits >> 20) + ", or raise --memory-mb");
  }
  return std::min(want, fits);
}

// Pass 1: the tokenizer's training sample.
// `truncated` receives the compressed files found cut short (named when no text is found).
std::vector<std::string> draw_sample(const std::vector<std::string>& files, const PrepareOptions& o, int64_t budget,
                                     std::vector<std::string>& truncated) {
  SentenceSample sample(budget, o.seed);
  DocumentStream stream(files);
  Progress progress("prepare: tokenizer sample", total_size(files));
  std::vector<RawItem> batch, next;
  std::vector<ItemText> texts;
  stream.next_batch(batch_bytes(o), batch);
  while (!batch.empty()) {
    texts.assign(batch.size(), {});
    next.clear();
    parallel_for(
        thread_count(o), batch.size(), [&](size_t i, int) { texts[i] = item_text(std::move(batch[i])); },
        [&] { stream.next_batch(batch_bytes(o), next); });
    for (size_t i = 0; i < batch.size(); ++i) sample.add(batch[i].ordinal, texts[i].text);
    std::swap(batch, next);
    progress.update(stream.disk_bytes(), 0);
  }
  log_info("prepare: tokenizer sample of " + std::to_string(sample.bytes() >> 20) + " MB from " +
           std::to_string(sample.seen_bytes() >> 20) + " MB (" + std::to_string(sample.seen_sentences()) +
           " sentences), seed " + std::to_string(o.seed));
  truncated = stream.truncated_files();
  return sample.take();
}

bool held_out(uint64_t document_key, const PrepareOptions& o) {
  if (o.val_fraction <= 0.0) return false;
  const uint64_t h = XXH3_64bits_withSeed(&document_key, sizeof document_key, o.seed);
  return static_cast<double>(h) < o.val_fraction * 0x1.0p64;
}

// One item's tokens, computed on a worker thread.
struct Encoded {
  std::vector<int32_t> tokens;
  std::string problem;
  int64_t replaced = 0;
  int split = -1;  // 0 train, 1 validation, -1 nothing (bad line, blank text)
  bool document = false;  // ends a (non-blank) document
};

// The tokens of a document piece: encoded in kPieceBytes pieces cut at line breaks, so the
// encoder's working memory stays small on huge documents (decoding gives the text back).
// `encode(piece, out)` appends a piece's ids: the word cache's, or SentencePiece's own.
template <class Encode>
void encode_text(Encode&& encode, std::string_view text, std::vector<int32_t>& out) {
  while (!text.empty()) {
    size_t cut = text.size();
    if (cut > kPieceBytes) {
      cut = text.rfind('\n', kPieceBytes - 1);
      cut = cut == std::string_view::npos ? kPieceBytes : cut + 1;
      while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
      if (cut == 0) cut = text.size();
    }
    encode(text.substr(0, cut), out);
    text.remove_prefix(cut);
  }
}

struct Streams {
  ShardStreamWriter* of[2];
};

// Whether the guard checks this item: 1 in kGuardEvery, by a seeded hash of its ordinal, so
// the same items are checked on every run (the constant keeps the choice apart from the
// validation split's hashes under the same seed).
bool guarded(int64_t ordinal, const PrepareOptions& o) {
  return XXH3_64bits_withSeed(&ordinal, sizeof ordinal, o.seed ^ 0x9e3779b97f4a7c15ull) % kGuardEvery == 0;
}

// The guard: the word cache's tokens of an item must be SentencePiece's own. A difference is a
// bug in the cache (or a model it wrongly accepted); prepare stops before the item is written.
void check_against_sentencepiece(const std::vector<int32_t>& fast, std::string_view text, const Tokenizer& tok,
                                 const std::string& file, int64_t line, int64_t ordinal) {
  std::vector<int32_t> plain;
  encode_text([&](std::string_view piece, std::vector<int32_t>& out) { tok.encode(piece, out); }, text, plain);
  if (fast == plain) return;
  const auto diff = std::mismatch(fast.begin(), fast.end(), plain.begin(), plain.end());
  ATOLL_CHECK(false) << "prepare: the word cache encoded " << file << ":" << line << " (item " << ordinal
                     << ") differently from SentencePiece (" << fast.size() << " vs " << plain.size()
                     << " tokens, first difference at token " << (diff.first - fast.begin())
                     << "); no shard holds that item; fix: run again with --exact-encode (SentencePiece's Encode "
                        "only, about 10x slower), and report this with the tokenizer model";
}

Encoded encode_item(RawItem&& item, const Tokenizer& tok, WordCacheEncoder& enc, const PrepareOptions& o,
                    const Streams& s, const std::string& file) {
  Encoded e;
  const bool is_text = item.kind == RawItem::kText;
  const bool ends = item.ends_document;
  const int64_t ordinal = item.ordinal;
  const uint64_t text_key = item.document_key;
  const int64_t line = item.line;
  ItemText t = item_text(std::move(item));
  e.problem = std::move(t.problem);
  e.replaced = t.replaced_bytes;
  if (!e.problem.empty() || (!is_text && t.text.empty())) return e;
  const uint64_t key = is_text ? text_key : XXH3_64bits(t.text.data(), t.text.size());
  e.split = held_out(key, o) ? 1 : 0;
  e.document = ends;
  if (!s.of[e.split]->needs(ordinal)) return e;  // in finished shards already
  encode_text([&](std::string_view piece, std::vector<int32_t>& out) { enc.encode(piece, out); }, t.text, e.tokens);
  if (enc.uses_cache() && guarded(ordinal, o)) {
    if (o.tamper_word_cache) o.tamper_word_cache(e.tokens);
    check_against_sentencepiece(e.tokens, t.text, tok, file, line, ordinal);
  }
  if (ends) e.tokens.push_back(tok.eos_id());
  return e;
}

struct Pass2Result {
  int64_t documents = 0, val_documents = 0, tail = 0;
  json skipped;
};

// Pass 2: every document encoded, in corpus order, into the two streams.
Pass2Result encode_corpus(const std::vector<std::string>& files, const Tokenizer& tok, const PrepareOptions& o,
                          ShardStreamWriter& train, ShardStreamWriter& val) {
  const Streams streams{{&train, &val}};
  DocumentStream stream(files);
  InputReport report(stream.files());
  Progress progress("prepare: encoding", total_size(files));
  Pass2Result r;
  // One word cache per thread, kept across batches. --exact-encode gives the cache a model it
  // refuses, so that every item takes SentencePiece's Encode.
  std::vector<std::unique_ptr<WordCacheEncoder>> encoders;
  for (int t = 0; t < thread_count(o); ++t)
    encoders.push_back(std::make_unique<WordCacheEncoder>(tok, cache_bytes(o), o.exact_encode));
  if (encoders[0]->uses_cache()) {
    log_info("prepare: encoding through a word cache (exactly SentencePiece's ids; " +
             std::to_string(cache_bytes(o) >> 10) + " KiB per thread; 1 item in " + std::to_string(kGuardEvery) +
             " checked against SentencePiece's Encode)");
  } else {
    log_info("prepare: encoding with SentencePiece's Encode, without the word cache: " +
             (o.exact_encode ? std::string("--exact-encode") : "the tokenizer does not split at spaces (" + tok.word_split_refusal() + ")"));
  }
  std::vector<RawItem> batch, next;
  std::vector<Encoded> encoded;
  std::vector<int64_t> ordinals;
  stream.next_batch(batch_bytes(o), batch);
  while (!batch.empty()) {
    encoded.assign(batch.size(), {});
    ordinals.resize(batch.size());
    std::vector<std::pair<uint32_t, int64_t>> where(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      ordinals[i] = batch[i].ordinal;
      where[i] = {batch[i].file, batch[i].line};
    }
    next.clear();
    parallel_for(
        thread_count(o), batch.size(),
        [&](size_t i, int t) {
          encoded[i] = encode_item(std::move(batch[i]), tok, *encoders[t], o, streams, stream.files()[where[i].first]);
        },
        [&] { stream.next_batch(batch_bytes(o), next); });
    for (size_t i = 0; i < encoded.size(); ++i) {
      Encoded& e = encoded[i];
      if (!e.problem.empty()) report.bad_line(where[i].first, where[i].second, e.problem);
      if (e.replaced > 0) report.replaced(where[i].first, where[i].second, e.replaced);
      if (e.split < 0) continue;
      r.documents += e.document;
      r.val_documents += e.document && e.split == 1;
      ShardStreamWriter& w = *streams.of[e.split];
      if (!w.needs(ordinals[i])) continue;
      const int64_t skip = w.skip(ordinals[i]);
      ATOLL_CHECK_LE(skip, static_cast<int64_t>(e.tokens.size())) << "resume point inside item " << ordinals[i];
      w.push(ordinals[i], skip, std::span<const int32_t>(e.tokens).subspan(static_cast<size_t>(skip)));
      e.tokens = {};
    }
    std::swap(batch, next);
    progress.update(stream.disk_bytes(), train.total_tokens() + val.total_tokens());
  }
  progress.update(stream.disk_bytes(), train.total_tokens() + val.total_tokens(), /*last=*/true);
  if (encoders[0]->uses_cache()) {
    int64_t hits = 0, misses = 0, clears = 0, long_words = 0;
    for (const auto& e : encoders) {
      hits += e->hits();
      misses += e->misses();
      clears += e->clears();
      long_words += e->long_words();
    }
    log_info("prepare: word cache: " + std::to_string(hits) + " hits, " + std::to_string(misses) + " misses, " +
             std::to_string(long_words) + " words too long to cache, emptied " + std::to_string(clears) + " times");
  }
  report.finish(stream);
  r.skipped = report.summary(stream);
  return r;
}

json progress_json(const json& identity, const std::string& tokenizer_fp, const ShardStreamWriter* train,
                   const ShardStreamWriter* val) {
  json p = identity;
  p["tokenizer_fingerprint"] = tokenizer_fp;
  auto stream = [](const ShardStreamWriter* w) {
    if (w == nullptr) return json{{"shards", json::array()}, {"item", 0}, {"tokens", 0}};
    return json{{"shards", w->shards()}, {"item", w->point().item}, {"tokens", w->point().tokens}};
  };
  p["train"] = stream(train);
  p["val"] = stream(val);
  return p;
}

// Where a stream stood in progress.json; its shards must all be there.
ShardStreamWriter::Options resume_options(const fs::path& dir, const json& progress, const std::string& split) {
  ShardStreamWriter::Options w;
  const json& s = progress.at(split);
  w.done = s.at("shards").get<std::vector<ShardRecord>>();
  w.resume = {s.at("item").get<int64_t>(), s.at("tokens").get<int64_t>()};
  for (const auto& rec : w.done) {
    std::error_code ec;
    const auto size = fs::file_size(dir / rec.name, ec);
    const bool sized = size == static_cast<uintmax_t>(kShardHeaderBytes + rec.tokens * 2) ||
                       size == static_cast<uintmax_t>(kShardHeaderBytes + rec.tokens * 4);
    if (ec || !sized) {
      throw DataError("unfinished dataset " + dir.string() + ": shard " + rec.name +
                      " listed in progress.json is missing or damaged; fix: delete the folder and prepare again");
    }
  }
  return w;
}

}  // namespace

TokenizerFingerprint dataset_tokenizer_fingerprint(const std::string& data_path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(data_path, ec) ? fs::path(data_path) : fs::path(data_path).parent_path();
  const fs::path meta_path = dir / "meta.json", model_path = dir / "tokenizer.model";
  std::ifstream in(meta_path);
  const json meta = in ? json::parse(in, nullptr, /*allow_exceptions=*/false) : json();
  if (meta.is_object() && meta.contains("tokenizer_fingerprint") && meta["tokenizer_fingerprint"].is_string())
    return {meta["tokenizer_fingerprint"].get<std::string>(), meta_path.string()};
  if (fs::exists(model_path, ec)) return {tokenizer_fingerprint(model_path.string()), model_path.string()};
  return {};
}

PrepareResult prepare_data(const PrepareOptions& o) {
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  if (o.out_dir.empty()) throw DataError("data prepare: no output folder; fix: pass --out DIR");
  ATOLL_CHECK_GT(o.shard_tokens, 0) << "shard_tokens";
  ATOLL_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0) << "val_fraction " << o.val_fraction;
  fs::path out = fs::path(o.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" -> "dir"

  check_output_dir(out.string(), o.out_key);
  if (!o.tokenizer.empty()) check_input_file(o.tokenizer, "--tokenizer", "pass a SentencePiece tokenizer.model");
  const std::vector<std::string> inputs = o.inputs.empty() ? default_corpus_paths() : o.inputs;
  std::vector<std::string> skipped_entries;  // dangling links, pipes, loops: counted in meta.json
  const std::vector<std::string> files =
      list_corpus_files(inputs, o.inputs.empty() ? "the built-in corpus (apt-get install fortunes)" : o.input_key,
                        out.string(), &skipped_entries);
  for (const auto& f : files) check_text_file(f);  // a binary file is refused before any work
  const int64_t sample_budget = o.tokenizer.empty() ? sample_bytes(o) : 0;
  json identity{{"format", kFormat},
                {"fingerprint", stat_fingerprint(files)},
                {"val_fraction", o.val_fraction},
                {"shard_tokens", o.shard_tokens},
                {"min_val_tokens", o.min_val_tokens},
                {"seed", o.seed}};
  if (o.tokenizer.empty()) {
    identity["requested_vocab_size"] = o.vocab_size;
    identity["sample_bytes"] = sample_budget;
  } else {
    identity["given_tokenizer"] = tokenizer_fingerprint(o.tokenizer);  // throws if unreadable
  }

  // What the folder holds already: this dataset (reuse it), this dataset unfinished (resume),
  // nothing, or something else (refused).
  std::optional<json> progress;
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
    if (auto meta = read_json(out / "meta.json")) {
      check_identity(out / "meta.json", *meta, identity);
      PrepareResult r = result_from_meta(out, *meta);
      for (const auto& p : r.train_shards)
        if (!fs::exists(p)) throw DataError("dataset " + out.string() + " lacks " + p + "; fix: delete the folder and prepare again");
      log_info("prepare: " + out.string() + " already holds this dataset; reusing it");
      r.reused = true;
      r.seconds = elapsed();
      return r;
    }
    progress = read_json(out / "progress.json");
    if (!progress) {
      throw DataError("output folder " + out.string() +
                      " is not empty and holds no dataset (no valid meta.json); fix: choose another --out or empty it");
    }
    check_identity(out / "progress.json", *progress, identity);
  }

  const fs::path model_path = out / "tokenizer.model";
  const bool created = !fs::exists(out, ec);
  const bool resumed = progress.has_value();
  if (!progress) {
    std::vector<std::string> sample;
    if (o.tokenizer.empty()) {
      std::vector<std::string> truncated;
      sample = draw_sample(files, o, sample_budget, truncated);
      if (sample.empty()) {
        std::string names, cut;
        for (const auto& in : inputs) names += (names.empty() ? "" : ", ") + in;
        for (const auto& f : truncated) cut += (cut.empty() ? "" : ", ") + f;
        if (!cut.empty())  // a compressed file cut before its first whole block holds no document
          throw DataError("no text found in the inputs (" + names + "): the compressed file(s) " + cut +
                          " are cut short before their first complete document (truncated); fix: copy or download them again");
        throw DataError("no text found in the inputs (" + names + "; " + std::to_string(files.size()) +
                        " file(s)); fix: pass files or folders that hold text (plain, fortune or .jsonl with a \"text\" field)");
      }
      check_vocab_size(sample, o, inputs);
    }
    fs::create_directories(out, ec);
    if (ec) throw IoError("cannot create " + out.string() + ": " + ec.message() + "; fix: check --out");
    try {
      if (o.tokenizer.empty()) {
        const auto t0 = Clock::now();
        Tokenizer::train(sample, o.vocab_size, model_path.string());
        log_info("prepare: tokenizer trained in " + std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s");
      } else {
        Tokenizer::load(o.tokenizer);  // refuses a file that is no SentencePiece model
        std::ifstream in(o.tokenizer, std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        write_file_atomic(model_path.string(), bytes, /*sync=*/true);
      }
      progress = progress_json(identity, tokenizer_fingerprint(model_path.string()), nullptr, nullptr);
      write_json(out / "progress.json", *progress);
    } catch (...) {
      if (created) fs::remove_all(out, ec);
      throw;
    }
  } else {
    log_info("prepare: resuming the unfinished dataset in " + out.string());
    if (!fs::exists(model_path) || tokenizer_fingerprint(model_path.string()) != progress->value("tokenizer_fingerprint", ""))
      throw DataError("unfinished dataset " + out.string() +
                      ": tokenizer.model is missing or differs from progress.json; fix: delete the folder and prepare again");
    for (const auto& e : fs::directory_iterator(out))  // partial shards of the interrupted run
      if (e.path().extension() == ".tmp") fs::remove(e.path(), ec);
  }

  const Tokenizer tok = Tokenizer::load(model_path.string());
  const int32_t version = shard_version_for_vocab(tok.vocab_size());
  const std::string tokenizer_fp = progress->at("tokenizer_fingerprint").get<std::string>();
  std::unique_ptr<ShardStreamWriter> train, val;
  bool finishing = false;
  auto save_progress = [&] {
    if (!finishing) write_json(out / "progress.json", progress_json(identity, tokenizer_fp, train.get(), val.get()));
  };
  for (const char* split : {"train", "val"}) {
    ShardStreamWriter::Options w = resume_options(out, *progress, split);
    w.dir = out.string();
    w.prefix = split;
    w.shard_tokens = o.shard_tokens;
    w.version = version;
    w.on_shard = [&, split] {
      save_progress();
      const auto& done = (std::string(split) == "train" ? train : val)->shards();
      log_info("prepare: " + done.back().name + " written (" + std::to_string(done.back().tokens) + " tokens)");
      if (o.on_shard) o.on_shard(done.back().name);
    };
    (std::string(split) == "train" ? train : val) = std::make_unique<ShardStreamWriter>(std::move(w));
  }
  const auto t0 = Clock::now();
  Pass2Result p = encode_corpus(files, tok, o, *train, *val);
  if (p.documents == 0) {
    throw DataError("no text found in the inputs (" + std::to_string(files.size()) +
                    " file(s)); fix: pass files or folders that hold text (plain, fortune or .jsonl with a \"text\" field)");
  }

  // A small corpus: make sure both streams hold something (see prepare.h).
  finishing = true;
  if (o.val_fraction > 0.0) {
    if (train->total_tokens() == 0 && val->shards().empty()) {
      const auto all = val->take_tail(val->open_tokens());
      train->push(0, 0, all);
    }
    // Too little held out (a corpus of a few documents): top validation up to its share.
    const int64_t total = train->total_tokens() + val->total_tokens();
    const int64_t share = std::max(static_cast<int64_t>(std::ceil(o.val_fraction * static_cast<double>(total))), o.min_val_tokens);
    const int64_t need = val->total_tokens() < o.min_val_tokens ? share - val->total_tokens() : 0;
    if (need > 0) {
      p.tail = std::min({need, train->total_tokens() / 2, train->open_tokens()});
      const auto tail = train->take_tail(p.tail);
      val->push(0, 0, tail);
    }
  }
  train->finish();
  val->finish();

  json meta = identity;
  meta["inputs"] = inputs;
  meta["files"] = files.size();
  meta["bytes"] = total_size(files);
  meta["vocab_size"] = tok.vocab_size();
  meta["bos_id"] = tok.bos_id();
  meta["eos_id"] = tok.eos_id();
  meta["separator"] = "eos after every document";
  meta["shard_version"] = version;
  meta["documents"] = p.documents;
  meta["val_documents"] = p.val_documents;
  meta["val_tail_tokens"] = p.tail;
  meta["train_tokens"] = train->total_tokens();
  meta["val_tokens"] = val->total_tokens();
  meta["manifest"] = json{{"train", train->shards()}, {"val", val->shards()}};
  json names = json::array();
  for (const auto& s : train->shards()) names.push_back(s.name);
  meta["train_shards"] = names;
  names = json::array();
  for (const auto& s : val->shards()) names.push_back(s.name);
  meta["val_shards"] = names;
  meta["skipped"] = p.skipped;
  meta["skipped"]["entries"] = skipped_entries;
  meta["tokenizer"] = "tokenizer.model";
  meta["tokenizer_fingerprint"] = tokenizer_fp;
  write_json(out / "meta.json", meta);
  fs::remove(out / "progress.json", ec);
  log_info("prepare: " + std::to_string(train->total_tokens()) + " train + " + std::to_string(val->total_tokens()) +
           " val tokens encoded and written in " + std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s");

  PrepareResult r = result_from_meta(out, meta);
  r.resumed = resumed;
  r.seconds = elapsed();
  log_info("prepare: dataset ready in " + out.string() + " (" + std::to_string(r.seconds) + " s)");
  return r;
}

}  // namespace atl
