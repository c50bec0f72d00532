#include "atoll/train/metrics_log.h"

#include <chrono>

namespace atl {

std::vector<TbScalar> tb_scalars_of_row(const nlohmann::json& row) {
  std::vector<TbScalar> out;
  if (!row.is_object()) return out;
  std::string prefix;
  if (row.contains("island") && row["island"].is_number_integer()) {
    prefix = "island" + std::to_string(row["island"].get<int64_t>()) + "/";
    if (row.contains("rank") && row["rank"].is_number_integer() && row["rank"].get<int64_t>() != 0)
      prefix += "rank" + std::to_string(row["rank"].get<int64_t>()) + "/";
  }
  const auto numeric = [](const nlohmann::json& v) { return v.is_number() && !v.is_boolean(); };
  if (row.contains("loss") && numeric(row["loss"])) out.push_back({prefix + "loss", row["loss"].get<float>()});
  // The names of a list's entries: the layers of the load lists, else their positions.
  std::vector<std::string> layers;
  if (row.contains("load_layer") && row["load_layer"].is_array())
    for (const auto& l : row["load_layer"]) layers.push_back("layer" + (l.is_number() ? std::to_string(l.get<int64_t>()) : "?"));
  for (const auto& [key, v] : row.items()) {
    if (key == "loss" || key == "step" || key == "island" || key == "rank" || key == "load_layer") continue;
    if (numeric(v)) {
      out.push_back({prefix + key, v.get<float>()});
    } else if (v.is_object()) {
      const std::string name = key == "val_losses" ? "val_loss" : key;
      for (const auto& [k, x] : v.items())
        if (numeric(x)) out.push_back({prefix + name + "/" + k, x.get<float>()});
    } else if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i)
        if (numeric(v[i]))
          out.push_back({prefix + key + "/" + (i < layers.size() ? layers[i] : std::to_string(i)), v[i].get<float>()});
    }
  }
  return out;
}

namespace {
double now_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir)
    : tb_dir_(run_dir + "/tb"), created_(now_epoch()), jsonl_(run_dir + "/metrics.jsonl") {}

void MetricsLog::write(const nlohmann::json& row) {
  jsonl_.write(row);
  if (row.contains("step") && row["step"].is_number_integer()) {
    const int64_t island = row.contains("island") && row["island"].is_number_integer() ? row["island"].get<int64_t>() : -1;
    auto it = tb_.find(island);
    if (it == tb_.end())
      it = tb_.emplace(island, TbWriter(tb_dir_, created_, island < 0 ? "" : ".island" + std::to_string(island))).first;
    it->second.add(row["step"].get<int64_t>(), tb_scalars_of_row(row), now_epoch());
  }
  if (on_eval && is_eval_row(row)) on_eval();
}

}  // namespace atl
