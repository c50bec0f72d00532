#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/data/prepare.h"

namespace atl::cli {

namespace {

// Ctrl-C or SIGTERM during a prepare: say that the same command resumes it (the shards written
// so far are kept, data/prepare.h), then die of the signal as before. Only write(2) and
// raise(3) in the handler: the line is composed before any work starts.
std::string g_interrupted_line;

void on_interrupt(int sig) {
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, g_interrupted_line.data(), g_interrupted_line.size());
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void say_how_to_resume_on_interrupt(const std::string& out_dir) {
  g_interrupted_line = "atoll: interrupted: data prepare stopped; the shards written to " + out_dir +
                       " are kept: run the same command again to resume\n";
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
}

}  // namespace

Runner add_data(CLI::App& app) {
  auto* data = app.add_subcommand("data", "data tools");
  data->require_subcommand(1);
  auto* cmd = data->add_subcommand("prepare", "tokenize text into llm.c-format shards plus validation shards (streamed, "
                                              "resumable: run the same command again after an interruption)");
  auto opts = std::make_shared<PrepareOptions>();
  cmd->add_option("--input", opts->inputs,
                  "text files, folders, .jsonl, and any of them as .gz or .zst (default: the built-in fortunes corpus)");
  cmd->add_option("--out", opts->out_dir, "output folder")->required();
  cmd->add_option("--vocab-size", opts->vocab_size, "tokenizer vocabulary (default 4096); at least what the corpus needs: 256 byte pieces, 3 special ones and "
                  "its characters (a smaller one is refused with the minimum)")->check(whole_number(64, 1 << 20));
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "use this SentencePiece model (copied byte for byte) instead of training one; --vocab-size is then ignored");
  cmd->add_option("--val-fraction", opts->val_fraction, "share of documents held out for validation, chosen by a hash of "
                  "each document (default 0.02)")->check(finite_number(0.0, 0.5));
  cmd->add_option("--memory-mb", opts->memory_mb, "memory budget for the whole process in MB (default 2048)")
      ->check(whole_number(32, int64_t{1} << 30));
  cmd->add_option("--shard-tokens", opts->shard_tokens, "tokens per shard (default 10000000)")
      ->check(whole_number(1024, (int64_t{1} << 31) - 1));
  cmd->add_option("--tokenizer-sample-mb", opts->tokenizer_sample_mb,
                  "text the tokenizer is trained on, a uniform sample of the corpus, in MB (default 100, less when "
                  "--memory-mb needs it)")->check(whole_number(1, 1 << 20));
  cmd->add_option("--threads", opts->threads, "encoding threads (default: every core)")->check(whole_number(1, 1024));
  cmd->add_option("--seed", opts->seed, "seed of the validation split and the tokenizer sample (default 1337)");
  cmd->add_flag("--exact-encode", opts->exact_encode,
               "encode with SentencePiece's Encode alone, without the word cache (same tokens, about 10x slower)");
  return [cmd, opts]() -> int {
    if (!cmd->parsed()) return -1;
    say_how_to_resume_on_interrupt(opts->out_dir);
    PrepareResult r = prepare_data(*opts);
    std::printf("%s %s: %ld documents, vocabulary %d, %ld training tokens in %zu shard(s), %ld validation tokens (%.1f s)\n",
                r.reused ? "reused" : r.resumed ? "resumed and prepared" : "prepared", r.out_dir.c_str(),
                long(r.documents), r.vocab_size, long(r.train_tokens), r.train_shards.size(), long(r.val_tokens),
                r.seconds);
    return 0;
  };
}

}  // namespace atl::cli
