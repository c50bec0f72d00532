#include "atoll/cli/checkpoint_model.h"

#include <filesystem>

#include "atoll/ckpt/checkpoint.h"

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

}  // namespace atl::cli
