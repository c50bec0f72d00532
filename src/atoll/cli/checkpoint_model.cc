#include "atoll/cli/checkpoint_model.h"

#include <filesystem>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/user_path.h"

namespace atl::cli {
namespace fs = std::filesystem;

CheckpointModel load_checkpoint_model(const std::string& path) {
  check_input_dir(path, "--checkpoint",
                  "pass a checkpoint (RUN_DIR/checkpoints/step-NNNNNNNN) or a run directory that has one");
  CheckpointModel cm;
  cm.dir = resolve_checkpoint(path);
  cm.config = read_checkpoint_config(cm.dir);
  cm.layout = ParamLayout::build(cm.config.model);
  cm.params.assign(cm.layout.total(), 0.0f);
  const nlohmann::json state = load_checkpoint(cm.dir, cm.config.model, cm.layout, {{"param", cm.params.data()}});
  if (state.contains("tokenizer_fingerprint") && state["tokenizer_fingerprint"].is_string())
    cm.tokenizer = {state["tokenizer_fingerprint"].get<std::string>(), cm.dir + "/manifest.json"};
  else if (const std::string run_tok = run_tokenizer(cm.dir); !run_tok.empty())
    cm.tokenizer = {tokenizer_fingerprint(run_tok), run_tok};
  if (state.contains("tokens") && state["tokens"].is_number_integer()) cm.tokens = state["tokens"].get<int64_t>();
  // The model as trained at this point: a data phase's model.seq_len and model.rope_theta
  // (context extension) hold for eval, generate and export.
  cm.config = config_at_tokens(cm.config, cm.tokens);
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
  if (!path.empty()) check_input_file(path, "--tokenizer", "pass a SentencePiece tokenizer.model");
  const std::string tok_path = path.empty() ? run_tokenizer(cm.dir) : path;
  if (tok_path.empty())
    throw DataError(cm.dir + ": no tokenizer.model found for this checkpoint; fix: pass --tokenizer PATH");
  Tokenizer tok = Tokenizer::load(tok_path);
  if (!path.empty())
    check_same_tokenizer(cm, {tokenizer_fingerprint(path), path}, "--tokenizer " + path,
                         "leave out --tokenizer (the run's is used), or pass the tokenizer.model of the data the model "
                         "was trained on");
  const int V = cm.config.model.vocab_size;
  if (tok.vocab_size() > V)
    throw DataError("tokenizer " + tok_path + " has " + std::to_string(tok.vocab_size()) +
                    " pieces, more than the vocabulary of the model in " + cm.dir + " (model.vocab_size = " +
                    std::to_string(V) + "); fix: pass the tokenizer.model the model was trained with (--tokenizer)");
  return tok;
}

void check_same_tokenizer(const CheckpointModel& cm, const TokenizerFingerprint& theirs, const std::string& what,
                          const std::string& fix) {
  const TokenizerFingerprint& ours = cm.tokenizer;
  if (!ours.value.empty() && !theirs.value.empty()) {
    if (ours.value == theirs.value) return;
    throw DataError(what + " uses tokenizer " + theirs.value + " (from " + theirs.source + "), but the model in " +
                    cm.dir + " was trained with tokenizer " + ours.value + " (from " + ours.source +
                    "): the same token ids mean other text; fix: " + fix);
  }
  const std::string unknown =
      theirs.value.empty() ? "it has no meta.json with one, nor a tokenizer.model (made before atoll kept them, or elsewhere)"
                           : "the checkpoint keeps none, nor has its run a tokenizer.model";
  log_warn("cannot check that " + what + " was made with the tokenizer of the model in " + cm.dir +
           ": no tokenizer fingerprint: " + unknown + "; the result means something only if it was");
}

}  // namespace atl::cli
