#include "atoll/data/shard_list.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/data/shard.h"
#include "atoll/data/shard_writer.h"

namespace atl {
namespace fs = std::filesystem;

namespace {

// What meta.json of `dir` lists, by split and name; nullopt when it has no manifest.
std::optional<std::map<std::string, std::map<std::string, ShardRecord>>> manifest_of(const fs::path& dir) {
  std::ifstream f(dir / "meta.json");
  if (!f) return std::nullopt;
  const auto meta = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("manifest") || !meta["manifest"].is_object()) return std::nullopt;
  const std::string where = (dir / "meta.json").string();
  std::map<std::string, std::map<std::string, ShardRecord>> out;
  for (const auto& [split, rows] : meta["manifest"].items()) {
    try {
      for (const ShardRecord& r : rows.get<std::vector<ShardRecord>>()) {
        // A name stays inside its folder: no path, no "..".
        if (r.name.empty() || r.name.find('/') != std::string::npos || r.name == "." || r.name == "..")
          throw DataError(where + " lists '" + r.name + "' in manifest." + split +
                          ", which is not a shard's file name; fix: prepare the dataset again into an empty folder");
        out[split][r.name] = r;
      }
    } catch (const nlohmann::json::exception& e) {
      throw DataError(where + ": manifest." + split + " is malformed (" + e.what() +
                      "); fix: prepare the dataset again into an empty folder");
    }
  }
  return out;
}

void warn_unchecked(const std::string& dir, const std::string& why) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lk(mu);
  if (warned.insert(dir).second)
    log_warn("token shards in " + dir + " are read unchecked (" + why +
             "): their sizes and checksums cannot be compared with what `atoll data prepare` wrote");
}

std::vector<std::string> find_shards(const std::string& path, const std::string& split) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  if (!fs::is_directory(path, ec)) {
    throw DataError("data path " + path + " does not exist; fix: run `atoll data prepare --out " + path +
                    "` or point data.dir/--data at a folder of shards or a .bin file");
  }
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.starts_with(split + "_") && name.ends_with(".bin")) shards.push_back(e.path().string());
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

std::string fix_for(const std::string& dir) {
  return "fix: put back the shard as `atoll data prepare` wrote it, or prepare the dataset again into an empty "
         "folder (`atoll data prepare --input ... --out " + dir + "`)";
}

}  // namespace

bool meta_lists_split(const std::string& dir, const std::string& split) {
  const auto manifest = manifest_of(dir);
  return manifest && manifest->count(split) && !manifest->at(split).empty();
}

std::vector<ListedShard> list_shards(const std::string& path, const std::string& split) {
  const bool single = fs::is_regular_file(path);
  const fs::path dir = single ? fs::path(path).parent_path() : fs::path(path);
  const std::string meta_path = (dir / "meta.json").string();
  const auto manifest = manifest_of(dir.empty() ? fs::path(".") : dir);
  std::map<std::string, ShardRecord> listed;  // file name -> record
  if (manifest && single) {
    for (const auto& [s, rows] : *manifest)
      if (rows.count(fs::path(path).filename().string())) listed = rows;
  } else if (manifest && manifest->count(split)) {
    listed = manifest->at(split);
  }
  const bool checked = manifest && (single ? !listed.empty() : manifest->count(split) > 0);
  if (!checked)
    warn_unchecked(dir.string(), manifest ? meta_path + " does not list them" : "no meta.json beside them");
  if (checked && !single)  // every listed shard present
    for (const auto& [name, r] : listed)
      if (!fs::exists(dir / name))
        throw DataError("token shard " + (dir / name).string() + " is listed in " + meta_path + " but missing; " +
                        fix_for(dir.string()));
  std::vector<ListedShard> out;
  for (const std::string& p : find_shards(path, split)) {
    const std::string name = fs::path(p).filename().string();
    if (!checked) {
      out.push_back({p, ""});
      continue;
    }
    const auto it = listed.find(name);
    if (it == listed.end())
      throw DataError("token shard " + p + " is not listed in " + meta_path +
                      " (a shard added after `atoll data prepare`?); fix: move it out of the folder, or prepare the "
                      "dataset again into an empty folder");
    const ShardView shard(p);  // its header against its size
    if (shard.size() != it->second.tokens)
      throw DataError("token shard " + p + " holds " + std::to_string(shard.size()) + " tokens, " + meta_path +
                      " says " + std::to_string(it->second.tokens) + "; " + fix_for(dir.string()));
    out.push_back({p, it->second.xxh3});
  }
  if (out.empty())
    throw DataError("no " + split + "_*.bin shards in " + path + "; fix: run `atoll data prepare --out " + path +
                    "` or pass a single .bin file");
  return out;
}

}  // namespace atl
