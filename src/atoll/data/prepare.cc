#include "atoll/data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <thread>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"
#include "atoll/core/rng.h"
#include "atoll/data/corpus.h"
#include "atoll/data/shard.h"
#include "atoll/data/tokenizer.h"

namespace atl {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "atoll-data-1";
// The meta.json fields that decide whether a folder holds "the same dataset".
constexpr const char* kIdentityKeys[] = {
    "format", "fingerprint", "requested_vocab_size", "val_fraction", "shard_tokens", "min_val_tokens", "seed"};

// Writes a stream of a known length as equal shards `<prefix>_000000.bin`, ... of at most
// shard_tokens each, holding at most one shard in memory.
class ShardSink {
 public:
  ShardSink(fs::path dir, std::string prefix, int64_t total, int64_t shard_tokens, int32_t version)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), total_(total), version_(version) {
    n_shards_ = (total + shard_tokens - 1) / shard_tokens;
  }
  void push(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      const int64_t room = shard_end(index_) - written_ - static_cast<int64_t>(buf_.size());
      const size_t n = std::min(tokens.size(), static_cast<size_t>(room));
      buf_.insert(buf_.end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
      tokens = tokens.subspan(n);
      if (written_ + static_cast<int64_t>(buf_.size()) == shard_end(index_)) flush();
    }
  }
  std::vector<std::string> finish() {
    ATOLL_CHECK_EQ(index_, n_shards_) << prefix_ << " stream ended early";
    return names_;
  }

 private:
  int64_t shard_end(int64_t i) const { return total_ * (i + 1) / n_shards_; }
  void flush() {
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06lld.bin", prefix_.c_str(), static_cast<long long>(index_));
    write_shard((dir_ / name).string(), buf_, version_);
    names_.push_back(name);
    written_ += static_cast<int64_t>(buf_.size());
    buf_.clear();
    ++index_;
  }
  fs::path dir_;
  std::string prefix_;
  int64_t total_, n_shards_ = 0, index_ = 0, written_ = 0;
  int32_t version_;
  std::vector<int32_t> buf_;
  std::vector<std::string> names_;
};

// Encodes every document on all cores; each result lands at its document's index, so the
// output does not depend on the thread count. Each document is followed by </s>.
std::vector<std::vector<int32_t>> encode_all(const Tokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<std::vector<int32_t>> out(docs.size());
  const size_t n_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < docs.size(); i += n_threads) {
        out[i] = tok.encode(docs[i]);
        out[i].push_back(tok.eos_id());
      }
    });
  }
  for (auto& th : threads) th.join();
  return out;
}

struct Split {
  std::vector<bool> is_val;  // per document
  int64_t tail = 0;          // tokens cut from the end of the training stream instead
};

Split choose_validation(const std::vector<std::vector<int32_t>>& docs, const PrepareOptions& o) {
  Split split{std::vector<bool>(docs.size(), false), 0};
  int64_t total = 0;
  for (const auto& d : docs) total += static_cast<int64_t>(d.size());
  if (o.val_fraction <= 0.0) return split;
  const int64_t cap = total / 2;
  const int64_t target = std::min(
      cap, std::max(static_cast<int64_t>(std::ceil(o.val_fraction * static_cast<double>(total))), o.min_val_tokens));
  std::vector<size_t> perm(docs.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  Rng rng(o.seed);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  int64_t val = 0;
  size_t val_docs = 0;
  for (size_t i : perm) {
    if (val >= target || val_docs + 1 >= docs.size()) break;
    const auto len = static_cast<int64_t>(docs[i].size());
    if (val + len > cap) continue;  // too big: would starve training
    split.is_val[i] = true;
    val += len;
    ++val_docs;
  }
  if (val == 0) split.tail = target;  // no document fits: cut the stream's tail
  return split;
}

json identity_of(const Corpus& corpus, const PrepareOptions& o) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(corpus.fingerprint));
  return json{{"format", kFormat},
              {"fingerprint", hex},
              {"requested_vocab_size", o.vocab_size},
              {"val_fraction", o.val_fraction},
              {"shard_tokens", o.shard_tokens},
              {"min_val_tokens", o.min_val_tokens},
              {"seed", o.seed}};
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

// The dataset already in `dir`, if it is this one; throws if `dir` holds anything else.
std::optional<PrepareResult> existing_dataset(const fs::path& dir, const json& identity) {
  std::error_code ec;
  if (!fs::exists(dir, ec) || (fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) return {};
  const fs::path meta_path = dir / "meta.json";
  json meta;
  std::ifstream in(meta_path);
  if (in) meta = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!in || !meta.is_object()) {
    throw DataError("output folder " + dir.string() +
                    " is not empty and holds no dataset "
                    "(no valid meta.json); fix: choose another --out or empty it");
  }
  for (const char* key : kIdentityKeys) {
    if (!meta.contains(key) || meta[key] != identity[key]) {
      throw DataError("output folder " + dir.string() + " holds a different dataset (meta.json " + key + " is " +
                      (meta.contains(key) ? meta[key].dump() : "missing") + ", this one has " + identity[key].dump() +
                      "); fix: choose another --out "
                      "or delete the folder");
    }
  }
  PrepareResult r = result_from_meta(dir, meta);
  for (const auto& p : r.train_shards) {
    if (!fs::exists(p))
      throw DataError("dataset " + dir.string() + " lacks " + p + "; fix: delete the folder and prepare again");
  }
  r.reused = true;
  return r;
}

void write_json(const fs::path& path, const json& j) {
  FileWriter out(path.string());  // an IoError names the path and the reason ("disk full")
  const std::string text = j.dump(2) + "\n";
  out.write(text.data(), text.size());
  out.close();
}

// Builds the whole dataset in `tmp`; returns its meta.json.
json build_dataset(const Corpus& corpus, const PrepareOptions& o, const fs::path& tmp, json meta) {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  const fs::path model_path = tmp / "tokenizer.model";
  Tokenizer::train(corpus.docs, o.vocab_size, model_path.string());
  const Tokenizer tok = Tokenizer::load(model_path.string());
  log_info("prepare: tokenizer trained, vocab " + std::to_string(tok.vocab_size()) + " in " +
           std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s");

  t0 = Clock::now();
  const auto docs = encode_all(tok, corpus.docs);
  const Split split = choose_validation(docs, o);
  int64_t train_total = 0, val_total = 0, val_docs = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    (split.is_val[i] ? val_total : train_total) += static_cast<int64_t>(docs[i].size());
    val_docs += split.is_val[i];
  }
  train_total -= split.tail;
  val_total += split.tail;
  const int32_t version = shard_version_for_vocab(tok.vocab_size());
  ShardSink train(tmp, "train", train_total, o.shard_tokens, version);
  ShardSink val(tmp, "val", val_total, o.shard_tokens, version);
  int64_t routed = 0;  // training-stream tokens so far; past train_total they are the tail
  for (size_t i = 0; i < docs.size(); ++i) {
    std::span<const int32_t> d(docs[i]);
    if (split.is_val[i]) {
      val.push(d);
      continue;
    }
    const size_t to_train = static_cast<size_t>(std::clamp<int64_t>(train_total - routed, 0, d.size()));
    train.push(d.first(to_train));
    val.push(d.subspan(to_train));
    routed += static_cast<int64_t>(d.size());
  }
  meta["vocab_size"] = tok.vocab_size();
  meta["bos_id"] = tok.bos_id();
  meta["eos_id"] = tok.eos_id();
  meta["separator"] = "eos after every document";
  meta["shard_version"] = version;
  meta["documents"] = corpus.docs.size();
  meta["val_documents"] = val_docs;
  meta["val_tail_tokens"] = split.tail;
  meta["train_tokens"] = train_total;
  meta["val_tokens"] = val_total;
  meta["train_shards"] = train.finish();
  meta["val_shards"] = val.finish();
  meta["tokenizer"] = "tokenizer.model";
  meta["tokenizer_fingerprint"] = tokenizer_fingerprint(model_path.string());
  write_json(tmp / "meta.json", meta);
  log_info("prepare: " + std::to_string(train_total) + " train + " + std::to_string(val_total) +
           " val tokens encoded and written in " +
           std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s");
  return meta;
}

// Refuses a vocabulary the tokenizer trainer cannot build for this corpus, before the
// (long) training starts, naming where the size came from and the minimum.
void check_vocab_size(const Corpus& corpus, const PrepareOptions& o, const std::vector<std::string>& inputs) {
  const int need = Tokenizer::min_vocab_size(corpus.docs);
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
  const auto start = std::chrono::steady_clock::now();
  if (o.out_dir.empty()) throw DataError("data prepare: no output folder; fix: pass --out DIR");
  ATOLL_CHECK_GT(o.shard_tokens, 0) << "shard_tokens";
  ATOLL_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0) << "val_fraction " << o.val_fraction;
  fs::path out = fs::path(o.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" -> "dir"

  const std::vector<std::string> inputs = o.inputs.empty() ? default_corpus_paths() : o.inputs;
  const Corpus corpus = read_corpus(inputs);
  log_info("prepare: " + std::to_string(corpus.files.size()) + " files, " + std::to_string(corpus.docs.size()) +
           " documents, " + std::to_string(corpus.bytes) + " bytes");
  json meta = identity_of(corpus, o);
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  if (auto r = existing_dataset(out, meta)) {
    log_info("prepare: " + out.string() + " already holds this dataset; reusing it");
    r->seconds = elapsed();
    return *r;
  }
  check_vocab_size(corpus, o, inputs);
  meta["inputs"] = inputs;
  meta["files"] = corpus.files.size();
  meta["bytes"] = corpus.bytes;

  // Build beside the target (same filesystem, so the final rename is atomic); the pid keeps
  // concurrent prepares of the same folder apart.
  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw IoError("cannot create " + tmp.string() + ": " + ec.message() + "; fix: check --out");
  try {
    meta = build_dataset(corpus, o, tmp, meta);
    fs::rename(tmp, out, ec);  // replaces an empty folder, fails on a non-empty one
    if (ec) {
      // Another prepare may have finished first: fine if it made the same dataset.
      if (auto r = existing_dataset(out, identity_of(corpus, o))) {
        fs::remove_all(tmp, ec);
        r->seconds = elapsed();
        return *r;
      }
      throw IoError("cannot rename " + tmp.string() + " to " + out.string() + ": " + ec.message());
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  PrepareResult r = result_from_meta(out, meta);
  r.seconds = elapsed();
  log_info("prepare: dataset ready in " + out.string() + " (" + std::to_string(r.seconds) + " s)");
  return r;
}

}  // namespace atl
