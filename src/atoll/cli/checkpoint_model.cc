#include "atoll/cli/checkpoint_model.h"

#include <filesystem>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/errors.h"

namespace atl::cli {
namespace fs = std::filesystem;

CheckpointModel load_checkpoint_model(const std::string& path) {
  CheckpointModel cm;
  cm.dir = resolve_checkpoint(path);
  cm.config = read_checkpoint_config(cm.dir);
  cm.layout = ParamLayout::build(cm.config.model);
  cm.params.assign(cm.layout.total(), 0.0f);
  load_checkpoint(cm.dir, cm.config.model, cm.layout, {{"param", cm.params.data()}});
  return cm;
}

std::string run_tokenizer(const std::string& checkpoint_dir) {
  const fs::path p = fs::path(checkpoint_dir).lexically_normal();
  for (fs::path dir : {p, p.parent_path(), p.parent_path().parent_path()}) {
    if (dir.empty()) continue;
    if (fs::exists(dir / "tokenizer.model")) return (dir / "tokenizer.model").string();
  }
  return "";
}

Tokenizer load_checkpoint_tokenizer(const CheckpointModel& cm, const std::string& path) {
  const std::string tok_path = path.empty() ? run_tokenizer(cm.dir) : path;
  if (tok_path.empty())
    throw DataError(cm.dir + ": no tokenizer.model found for this checkpoint; fix: pass --tokenizer PATH");
  Tokenizer tok = Tokenizer::load(tok_path);
  const int V = cm.config.model.vocab_size;
  if (tok.vocab_size() > V)
    throw DataError("tokenizer " + tok_path + " has " + std::to_string(tok.vocab_size()) +
                    " pieces, more than the vocabulary of the model in " + cm.dir + " (model.vocab_size = " +
                    std::to_string(V) + "); fix: pass the tokenizer.model the model was trained with (--tokenizer)");
  return tok;
}

}  // namespace atl::cli
