#include <cstdio>

#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/data/prepare.h"

namespace atl::cli {

Runner add_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "data tools");
  data->require_subcommand(1);
  auto* cmd = data->add_subcommand("prepare", "tokenize text into llm.c-format shards plus a validation shard");
  auto opts = std::make_shared<PrepareOptions>();
  cmd->add_option("--input", opts->inputs, "text files, folders or .jsonl (default: the built-in fortunes corpus)");
  cmd->add_option("--out", opts->out_dir, "output folder")->required();
  cmd->add_option("--vocab-size", opts->vocab_size, "tokenizer vocabulary (default 4096); at least what the corpus needs: 256 byte pieces, 3 special ones and "
                  "its characters (a smaller one is refused with the minimum)")->check(whole_number(64, 1 << 20));
  cmd->add_option("--val-fraction", opts->val_fraction, "share held out for validation (default 0.02)")
      ->check(finite_number(0.0, 0.5));
  return [cmd, opts]() -> int {
    if (!cmd->parsed()) return -1;
    PrepareResult r = prepare_data(*opts);
    std::printf("%s %s: %ld documents, vocabulary %d, %ld training tokens in %zu shard(s), %ld validation tokens (%.1f s)\n",
                r.reused ? "reused" : "prepared", r.out_dir.c_str(), long(r.documents), r.vocab_size,
                long(r.train_tokens), r.train_shards.size(), long(r.val_tokens), r.seconds);
    return 0;
  };
}

}  // namespace atl::cli
