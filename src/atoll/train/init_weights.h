// `--init-from DIR` in a run (`atoll train`, `atoll launch` and its workers; docs/weights.md):
// the Hugging Face folder checked against the run and its weights read (ckpt/import_hf.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "atoll/config/config.h"
#include "atoll/train/dataset.h"

namespace atl {

// Checks that DIR's config.json gives the run's [model] (the caller applied it: cli apply_init_from)
// and that its tokenizer.model is the one the data was prepared with (DataError naming both and the
// `atoll data prepare --tokenizer` fix), then reads its weights into `params` (laid out by
// cfg.model; nullptr: checks every file only). Returns the `init_from` event's fields.
nlohmann::json init_from_hf(const std::string& dir, const Config& cfg, const DatasetInfo& data, float* params);

}  // namespace atl
