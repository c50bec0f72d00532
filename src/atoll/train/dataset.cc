#include "atoll/train/dataset.h"

#include <xxhash.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/user_path.h"
#include "atoll/data/prepare.h"
#include "atoll/data/loader.h"
#include "atoll/data/shard_list.h"

namespace atl {
namespace fs = std::filesystem;

std::string cache_root() {
  if (const char* d = std::getenv("ATOLL_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/atoll";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/atoll";
  return ".atoll-cache";
}

namespace {

// A field of a dataset's meta.json, of the type atoll writes, or its absent value; DataError
// naming the file and field for any other type (a hand-edited or damaged meta.json).
int meta_vocab(const nlohmann::json& meta, const std::string& path) {
  const auto it = meta.find("vocab_size");
  if (it == meta.end()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > std::numeric_limits<int>::max())
    throw DataError(path + ": vocab_size is " + it->dump().substr(0, 40) +
                    ", not a vocabulary size; fix: prepare the data again (`atoll data prepare`)");
  return it->get<int>();
}
std::string meta_fingerprint(const nlohmann::json& meta, const std::string& path) {
  const auto it = meta.find("tokenizer_fingerprint");
  if (it == meta.end()) return "";
  if (!it->is_string())
    throw DataError(path + ": tokenizer_fingerprint is " + it->dump().substr(0, 40) +
                    ", not a string; fix: prepare the data again (`atoll data prepare`)");
  return it->get<std::string>();
}

int tokenizer_vocab(const std::string& dir) {
  std::ifstream f(dir + "/meta.json");
  if (!f) return 0;
  auto meta = nlohmann::json::parse(f, nullptr, false);
  return meta.is_object() ? meta_vocab(meta, dir + "/meta.json") : 0;
}

// The cache folder for these inputs: a readable name plus a hash of the absolute input paths
// and settings (prepare_data itself re-checks the contents through meta.json).
std::string cache_dir_for(const Config& cfg, int vocab) {
  std::string key = "v=";
  key.append(std::to_string(vocab)).append(";val=").append(std::to_string(cfg.data.val_fraction));
  for (const auto& in : cfg.data.input) key.append(";").append(fs::absolute(in).lexically_normal().string());
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  std::string name = cfg.data.input.empty() ? "fortunes" : fs::path(cfg.data.input[0]).filename().string();
  if (name.empty()) name = "data";
  // Built with append: GCC 12 misreports -Wrestrict on long operator+ chains.
  std::string dir = cache_root();
  dir.append("/datasets/").append(name).append("-v").append(std::to_string(vocab)).append("-");
  dir.append(hash, 10);
  return dir;
}

// Opens every train_/val_ shard (or the single .bin file) and checks them against the list and
// sizes of meta.json (data/shard_list.h): cheap (a mapping, no token is read), and it reports
// a damaged shard before the caller creates a run directory (or a launcher starts workers).
void check_shard_headers(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  list_shards(path, "train");
  if (fs::is_directory(path, ec) && has_val_split(path)) list_shards(path, "val");
}

struct MixEntry {
  std::string key;  // data.mix[1].dir, data.phases[2].mix[0].dir
  std::string dir;
};

// Each dataset of data.mix / data.phases once, with the key that first names it.
std::vector<MixEntry> mix_entries(const DataConfig& d) {
  std::vector<MixEntry> out;
  auto add = [&](const std::string& prefix, const std::vector<MixSource>& mix) {
    for (size_t i = 0; i < mix.size(); ++i) {
      bool seen = false;
      for (const MixEntry& e : out) seen = seen || e.dir == mix[i].dir;
      if (!seen) out.push_back({prefix + "[" + std::to_string(i) + "].dir", mix[i].dir});
    }
  };
  add("data.mix", d.mix);
  for (size_t p = 0; p < d.phases.size(); ++p) add("data.phases[" + std::to_string(p) + "].mix", d.phases[p].mix);
  return out;
}

// A mixture reads datasets prepared beforehand, all with one tokenizer (the model has one
// embedding table): every one must hold meta.json, and their tokenizers and vocabularies agree.
DatasetInfo resolve_mixture(const Config& cfg) {
  DatasetInfo info;
  std::string first_key, first_fp;
  const std::vector<MixEntry> entries = mix_entries(cfg.data);
  std::vector<PathEntry> paths;
  for (const MixEntry& e : entries) paths.push_back({e.key, e.dir});
  check_distinct_paths(paths, "list each dataset once per mixture, spelled the same way in every phase");
  for (const MixEntry& e : entries) {
    check_input_dir(e.dir, e.key, "run `atoll data prepare --input ... --out " + e.dir + "` or correct the path");
    const std::string meta_path = e.dir + "/meta.json";
    std::ifstream f(meta_path);
    const auto meta = f ? nlohmann::json::parse(f, nullptr, false) : nlohmann::json();
    if (!meta.is_object())
      throw DataError(e.key + " = \"" + e.dir + "\": " +
                      (fs::exists(e.dir) ? meta_path + " is missing or unreadable: not a prepared dataset"
                                         : std::string("the folder does not exist")) +
                      "; fix: run `atoll data prepare --input ... --out " + e.dir + "` or correct the path");
    const std::string fp = meta_fingerprint(meta, meta_path);
    const int vocab = meta_vocab(meta, meta_path);
    if (info.dir.empty()) {
      info.dir = e.dir, info.vocab_size = vocab, first_key = e.key, first_fp = fp;
    } else if (fp != first_fp || vocab != info.vocab_size) {
      throw DataError(e.key + " = \"" + e.dir + "\": its tokenizer (" + meta_path + ": vocab_size " +
                      std::to_string(vocab) + ", tokenizer_fingerprint " + (fp.empty() ? "none" : fp) + ") differs from " +
                      first_key + " = \"" + info.dir + "\" (vocab_size " + std::to_string(info.vocab_size) +
                      ", tokenizer_fingerprint " + (first_fp.empty() ? "none" : first_fp) +
                      "); fix: prepare every dataset of the mixture with one tokenizer (`atoll data prepare --tokenizer " +
                      info.dir + "/tokenizer.model ...`)");
    }
    if (vocab > cfg.model.vocab_size)
      throw DataError(meta_path + ": the tokenizer has " + std::to_string(vocab) + " tokens but model.vocab_size is " +
                      std::to_string(cfg.model.vocab_size) + "; fix: set model.vocab_size >= " + std::to_string(vocab));
    check_shard_headers(e.dir);
  }
  if (fs::exists(info.dir + "/tokenizer.model")) info.tokenizer_path = info.dir + "/tokenizer.model";
  return info;
}

}  // namespace

DatasetInfo resolve_dataset(const Config& cfg) {
  // Also when data.dir holds the dataset already: a list naming one input twice is a mistake.
  check_distinct_paths(list_entries("data.input", cfg.data.input), "list each input once");
  if (!data_phases(cfg.data).empty()) return resolve_mixture(cfg);
  const int vocab = cfg.data.vocab_size ? cfg.data.vocab_size : cfg.model.vocab_size;
  DatasetInfo info;
  const bool given = !cfg.data.dir.empty();
  info.dir = given ? cfg.data.dir : cache_dir_for(cfg, vocab);
  if (given && path_kind(info.dir) != PathKind::kFile) check_output_dir(info.dir, "data.dir");  // a .bin, a folder, or none yet
  const bool ready = fs::exists(info.dir + "/meta.json") || (given && fs::is_regular_file(info.dir));
  // An unfinished prepare (progress.json) is resumed below, never read as shards made elsewhere.
  const bool unfinished = fs::exists(info.dir + "/progress.json");
  const bool holds_files = fs::is_directory(info.dir) && !fs::is_empty(info.dir) && !unfinished;
  // A data.dir with nothing in it is prepared only from inputs the user named: filling it with
  // the built-in corpus would train on text nobody asked for (a typo, or data deleted since).
  if (given && !ready && !holds_files && !unfinished && cfg.data.input.empty())
    throw DataError("data.dir = \"" + info.dir + "\" " + (fs::exists(info.dir) ? "is empty" : "does not exist") +
                    " and data.input names nothing to prepare there; fix: point data.dir at prepared shards (`atoll "
                    "data prepare --input ... --out " + info.dir + "`), set data.input to prepare it there, or leave "
                    "data.dir out to train on the built-in corpus");
  if (given && !ready && holds_files) {
    // A folder of shards made elsewhere (llm.c's scripts, say): use it as it is.
  } else if (!ready) {
    PrepareOptions opt;
    opt.inputs = cfg.data.input;
    opt.out_dir = info.dir;
    opt.vocab_size = vocab;
    opt.vocab_key = cfg.data.vocab_size ? "data.vocab_size" : "model.vocab_size";
    opt.input_key = "data.input";
    opt.out_key = given ? "data.dir" : "the cache folder (ATOLL_CACHE_DIR)";
    opt.val_fraction = cfg.data.val_fraction;
    opt.min_val_tokens = int64_t(cfg.model.seq_len) + 1;
    log_info("preparing data into " + info.dir + " (tokenizer vocabulary " + std::to_string(vocab) + ")");
    PrepareResult r = prepare_data(opt);
    log_info("data ready: " + std::to_string(r.train_tokens) + " training and " + std::to_string(r.val_tokens) +
             " validation tokens in " + std::to_string(r.seconds).substr(0, 5) + " s");
  }
  if (fs::is_directory(info.dir) && fs::exists(info.dir + "/tokenizer.model"))
    info.tokenizer_path = info.dir + "/tokenizer.model";
  info.vocab_size = fs::is_directory(info.dir) ? tokenizer_vocab(info.dir) : 0;
  if (info.vocab_size > cfg.model.vocab_size)
    throw DataError(info.dir + "/meta.json: the tokenizer has " + std::to_string(info.vocab_size) +
                    " tokens but model.vocab_size is " + std::to_string(cfg.model.vocab_size) +
                    "; fix: set model.vocab_size >= " + std::to_string(info.vocab_size) +
                    " or point data.dir at data prepared with a smaller vocabulary");
  check_shard_headers(info.dir);
  return info;
}

}  // namespace atl
