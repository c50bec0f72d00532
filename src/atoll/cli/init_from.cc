// `--init-from DIR` (ckpt/import_hf.h, docs/weights.md): the run's [model] from DIR/config.json.
#include <map>
#include <sstream>

#include "atoll/ckpt/import_hf.h"
#include "atoll/cli/commands.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/user_path.h"

namespace atl::cli {
namespace {

// "key = value" lines of the [model] TOML, by key.
std::map<std::string, std::string> model_values(const ModelConfig& m) {
  std::map<std::string, std::string> out;
  std::istringstream in(model_config_to_toml(m));
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos && line[0] != '#' && line[0] != '[') out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

}  // namespace

void refuse_init_from_resume(const std::string& dir, bool resume) {
  if (!dir.empty() && resume)
    throw ConfigError("--init-from " + dir + " with --resume: a resumed run continues from its own checkpoint "
                      "(fix: leave out --init-from to resume, or start a new run in another --run-dir)");
}

void apply_init_from(Config& cfg, const std::string& dir, const std::vector<std::string>& overrides) {
  if (dir.empty()) return;
  check_input_dir(dir, "--init-from", "pass a Hugging Face model folder (config.json and *.safetensors)");
  HfSource src = read_hf_source(dir, cfg.model);
  // Upcycling: a dense model (Llama, Mistral) with --set model.n_experts=E > 1 (and model.top_k=K,
  // else min(2, E)) starts every expert from its MLP.
  std::map<std::string, std::string> set;
  for (const std::string& o : overrides)
    if (o.rfind("model.", 0) == 0)
      set[o.substr(6, o.find('=') == std::string::npos ? std::string::npos : o.find('=') - 6)] = o;
  if (src.layout == HfExpertLayout::kDense && set.count("n_experts") && cfg.model.n_experts > 1) {
    upcycle_hf_source(src, cfg.model.n_experts, set.count("top_k") ? cfg.model.top_k : std::min(2, cfg.model.n_experts));
    log_info("--init-from " + dir + ": upcycling the dense " + src.architecture + " to " +
             std::to_string(src.model.n_experts) + " experts, top " + std::to_string(src.model.top_k) +
             " (every expert a copy of its MLP, the router zero)");
  }
  const auto ours = model_values(cfg.model), theirs = model_values(src.model);
  for (const auto& [key, o] : set) {
    if (ours.count(key) && theirs.count(key) && ours.at(key) != theirs.at(key))
      throw ConfigError("--set model." + key + " = " + ours.at(key) + " disagrees with " + dir + "/config.json, which gives " +
                        theirs.at(key) + " (fix: leave out --set model." + key + "; the model's shape is its checkpoint's)");
  }
  std::string changed;
  for (const auto& [k, v] : theirs)
    if (ours.count(k) && ours.at(k) != v) changed += (changed.empty() ? "" : ", ") + k + ": " + ours.at(k) + " -> " + v;
  log_info("--init-from " + dir + ": " + src.architecture + "; [model] from its config.json" +
           (changed.empty() ? " (no key changed)" : ": " + changed));
  cfg.model = src.model;
  validate_config(cfg, dir + "/config.json");
}

}  // namespace atl::cli
