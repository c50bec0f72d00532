// `atoll export --format hf`: a checkpoint as a Hugging Face Mixtral model, or ZAYA1 for a model
// with its parts (ckpt/export_hf.h, ckpt/export_zaya.h).
#include <cstdio>

#include "atoll/ckpt/export_hf.h"
#include "atoll/cli/checkpoint_model.h"
#include "atoll/cli/commands.h"
#include "atoll/core/user_path.h"
#include "atoll/data/tokenizer.h"

namespace atl::cli {

Runner add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "write a checkpoint as a Hugging Face Mixtral model");
  struct Flags {
    std::string checkpoint, format = "hf", out;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint or run directory")->required();
  cmd->add_option("--format", f->format, "export format (hf)")->check(CLI::IsMember({"hf"}));
  cmd->add_option("--out", f->out,
                  "output folder: new, empty, or an earlier export (atoll's files in it are replaced, "
                  "files you added are kept)")
      ->required();
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    check_output_dir(f->out, "--out");
    CheckpointModel cm = load_checkpoint_model(f->checkpoint);
    const std::string tok = run_tokenizer(cm.dir);
    HfSpecialTokens special;
    if (!tok.empty()) {
      const Tokenizer t = Tokenizer::load(tok);
      special = {.bos = t.bos_id(), .eos = t.eos_id(), .unk = t.unk_id(), .pad = t.pad_id()};
      if (special.bos >= 0) special.bos_piece = t.piece(special.bos);
      if (special.eos >= 0) special.eos_piece = t.piece(special.eos);
      if (special.unk >= 0) special.unk_piece = t.piece(special.unk);
      if (special.pad >= 0) special.pad_piece = t.piece(special.pad);
    }
    export_hf(f->out, cm.config.model, cm.layout, cm.params.data(), tok, special);
    std::printf("exported %s to %s (config.json, model.safetensors%s; atoll-export.json lists them)\n",
                cm.dir.c_str(), f->out.c_str(), tok.empty() ? "" : ", tokenizer.model, tokenizer_config.json");
    return 0;
  };
}

}  // namespace atl::cli
