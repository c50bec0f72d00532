// A trained model read back from a checkpoint: its config and parameters (no optimizer state).
#pragma once

#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/data/tokenizer.h"
#include "atoll/model/layout.h"

namespace atl::cli {

struct CheckpointModel {
  std::string dir;  // the checkpoint directory
  Config config;
  ParamLayout layout;
  std::vector<float> params;  // [layout.total()]
};

// `path` is a checkpoint directory or a run directory (its newest checkpoint).
CheckpointModel load_checkpoint_model(const std::string& path);

// tokenizer.model of the run a checkpoint belongs to (RUN/checkpoints/step-N -> RUN), or "".
std::string run_tokenizer(const std::string& checkpoint_dir);

// The tokenizer to read and write the model's tokens: `path`, or the run's when "". Throws
// DataError when there is none, or when it has more pieces than the model's vocabulary (its
// ids past model.vocab_size have no embedding).
Tokenizer load_checkpoint_tokenizer(const CheckpointModel& cm, const std::string& path);

}  // namespace atl::cli
