// A trained model read back from a checkpoint: its config and parameters (no optimizer state).
#pragma once

#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/data/prepare.h"
#include "atoll/data/tokenizer.h"
#include "atoll/model/layout.h"

namespace atl::cli {

struct CheckpointModel {
  std::string dir;  // the checkpoint directory
  Config config;
  ParamLayout layout;
  std::vector<float> params;  // [layout.total()]
  // The tokenizer it was trained with: the manifest's tokenizer_fingerprint or, for a
  // checkpoint from before that was kept, the fingerprint of its run's tokenizer.model; empty
  // when neither exists.
  TokenizerFingerprint tokenizer;
  int64_t tokens = 0;  // tokens trained on (every worker's), from the manifest; 0 when absent
};

// `path` is a checkpoint directory or a run directory (its newest checkpoint).
CheckpointModel load_checkpoint_model(const std::string& path);

// tokenizer.model of the run a checkpoint belongs to (RUN/checkpoints/step-N -> RUN), or "".
std::string run_tokenizer(const std::string& checkpoint_dir);

// The tokenizer to read and write the model's tokens: `path`, or the run's when "". Throws
// DataError when there is none, when it has more pieces than the model's vocabulary (its ids
// past model.vocab_size have no embedding), or when it is not the one the model was trained
// with (check_same_tokenizer).
Tokenizer load_checkpoint_tokenizer(const CheckpointModel& cm, const std::string& path);

// Throws DataError naming both fingerprints, their files and `fix` when `theirs` (the tokenizer
// of `what`) is not the one the model was trained with; logs one warning, and lets it pass,
// when either is unknown (data or checkpoints from before fingerprints were kept).
void check_same_tokenizer(const CheckpointModel& cm, const TokenizerFingerprint& theirs, const std::string& what,
                          const std::string& fix);

}  // namespace atl::cli
