// Finds or makes the token shards a run trains on: `data.dir` when it is given, otherwise a
// cache folder named after the inputs and vocabulary, prepared on first use (the built-in
// corpus when `data.input` is empty), so `atoll train` works with no arguments. A mixture
// (data.mix, data.phases) is checked instead: its datasets must be prepared, with one tokenizer.
#pragma once

#include <string>

#include "atoll/config/config.h"

namespace atl {

struct DatasetInfo {
  std::string dir;             // holds train_*.bin, val_*.bin, tokenizer.model, meta.json (a mixture: its first)
  std::string tokenizer_path;  // "" when the folder has no tokenizer (llm.c shards)
  int vocab_size = 0;          // of the tokenizer, 0 if unknown
};

// The cache root: $ATOLL_CACHE_DIR, else $XDG_CACHE_HOME/atoll, else ~/.cache/atoll.
std::string cache_root();

// Prepares the data if needed. Throws DataError (with the file and the fix) for bad inputs, or
// when the tokenizer's vocabulary exceeds model.vocab_size, or for a mixture whose dataset is
// not prepared or has another tokenizer than the first.
DatasetInfo resolve_dataset(const Config& cfg);

}  // namespace atl
