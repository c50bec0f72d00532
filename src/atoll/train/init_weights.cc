#include "atoll/train/init_weights.h"

#include <sstream>

#include "atoll/ckpt/import_hf.h"
#include "atoll/core/errors.h"
#include "atoll/data/tokenizer.h"

namespace atl {

nlohmann::json init_from_hf(const std::string& dir, const Config& cfg, const DatasetInfo& data, float* params) {
  HfSource src = read_hf_source(dir, cfg.model);
  // An upcycled run (cli apply_init_from): its [model] has the experts a dense source lacks.
  if (src.layout == HfExpertLayout::kDense && cfg.model.n_experts > 1)
    upcycle_hf_source(src, cfg.model.n_experts, cfg.model.top_k);
  const std::string want = model_config_to_toml(src.model), have = model_config_to_toml(cfg.model);
  if (want != have) {
    std::istringstream a(want), b(have);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {}
    throw ConfigError("--init-from " + dir + ": the run's [model] is not what its config.json gives (the run has " + lb +
                      ", config.json " + la + "; fix: start the run with --init-from, which takes [model] from config.json)");
  }
  // The imported model's tokenizer must be the one the data was prepared with: the same ids.
  const std::string ours = tokenizer_fingerprint(src.tokenizer_path);
  const std::string theirs = data.tokenizer_path.empty() ? "" : tokenizer_fingerprint(data.tokenizer_path);
  if (ours != theirs)
    throw DataError("the data in " + data.dir + " was " +
                    (theirs.empty() ? std::string("prepared without a tokenizer.model") : "tokenized by " + data.tokenizer_path) +
                    ", not by the imported model's " + src.tokenizer_path + ": its ids would mean other text to the model "
                    "(fix: atoll data prepare --tokenizer " + src.tokenizer_path + " --input ... --out DIR, then --set data.dir=DIR)");
  return import_hf_weights(src, params);
}

}  // namespace atl
