// `atoll generate`: text sampled from a checkpoint through the KV-cache decoder: the prompt
// prefilled in blocks of up to 4096 tokens (Decoder::prefill: the blocks' batched kernels, each
// block's attention against the cache before it), then token by token.
//
// Generation stops at the model's context: the positions fed (the start-of-text token, the
// prompt, then each generated token but the last) never exceed model.seq_len, the length the
// model was trained on, so a prompt of P positions gets at most seq_len - P + 1 tokens. When
// that cuts --max-tokens short, or the model ends the text, a note on stderr says so.
// --workers P decodes over P processes with tree attention (docs/long_context.md).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <thread>

#include "atoll/cli/checkpoint_model.h"
#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/ckpt/file_io.h"
#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/data/tokenizer.h"
#include "atoll/dist/group.h"
#include "atoll/model/decoder.h"
#include "atoll/supervise/launcher.h"
#include "atoll/supervise/process.h"
#include "atoll/supervise/redis_server.h"
#include "atoll/train/bench.h"
#include "atoll/train/trainer.h"

namespace atl::cli {
namespace {

// Bench only (bench/tree_decode.sh): the prompt's and the generated tokens' step times, and this
// process's peak RSS (under tree attention it keeps 1/P of the cache).
void print_timing(const Generated& g) {
  const char* on = std::getenv("ATOLL_GENERATE_TIMING");
  if (!on || std::string(on) != "1") return;
  std::fprintf(stderr,
               "timing: prefill %d tokens %.3f s, then %d tokens %.3f s; the last %d %.3f ms per token, "
               "at context %d; peak RSS %.0f MiB\n",
               g.prompt_tokens, g.prompt_s, g.decoded_tokens, g.decode_s, g.tail_tokens,
               g.tail_tokens > 0 ? 1e3 * g.tail_s / g.tail_tokens : 0.0, g.prompt_tokens + g.decoded_tokens,
               peak_rss_mib());
}

// More is a typing slip: no model has such a context, and generation stops at the context.
constexpr int64_t kMaxTokensLimit = 1'000'000;
// Prompt tokens a prefill pass takes: its buffers (activations of every layer, not kept across
// passes) are sized for this many, whatever the prompt's length.
constexpr int kPrefillBlock = 4096;

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// `--workers P` (tree-attention decoding): this process is rank 0; it starts a redis-server on
// loopback for the rendezvous and P-1 copies of itself as ranks 1..P-1 (hidden flags
// --tree-rank, --tree-store, --tree-run), which decode the same tokens with their shards of the
// KV cache and print nothing. Sampling is the same on every rank (the same seed, and the
// all-reduces leave every rank the same logits), so the ranks stay in step with no broadcast.
struct TreeFlags {
  int workers = 1, rank = 0;
  std::string store, run;
};

Generated generate_tree(const std::string& checkpoint, const std::vector<std::string>& helper_args, GenerateOptions o,
                        const TreeFlags& t) {
  const auto timeout = std::chrono::milliseconds(120000);
  // The P processes share the cores: each takes its share of threads (OpenMP threads that spin
  // after a parallel region would otherwise starve the peers every all-reduce waits for).
  configure_threads(std::max(1, int(std::thread::hardware_concurrency()) / t.workers));
  if (t.rank > 0) {  // a helper
    Store store(StoreOptions{.url = t.store, .run_id = t.run, .timeout = timeout});
    ProcessGroup g(store, GroupOptions{.name = "tree", .rank = t.rank, .size = t.workers, .timeout = timeout});
    o.group = &g;
    return generate(checkpoint, o);
  }
  RedisServer redis;
  const std::string run = "generate-" + std::to_string(::getpid());
  std::vector<Process> helpers;
  for (int r = 1; r < t.workers; ++r) {
    std::vector<std::string> argv = {self_executable(), "generate", "--checkpoint", checkpoint};
    argv.insert(argv.end(), helper_args.begin(), helper_args.end());
    for (const std::string& a : {std::string("--workers"), std::to_string(t.workers), std::string("--tree-rank"),
                                 std::to_string(r), std::string("--tree-store"), redis.url(), std::string("--tree-run"),
                                 run})
      argv.push_back(a);
    helpers.push_back(Process::spawn(ProcessSpec{.argv = argv}));
  }
  Store store(StoreOptions{.url = redis.url(), .run_id = run, .timeout = timeout});
  ProcessGroup g(store, GroupOptions{.name = "tree", .rank = 0, .size = t.workers, .timeout = timeout});
  o.group = &g;
  Generated out = generate(checkpoint, o);
  for (size_t i = 0; i < helpers.size(); ++i) {
    const ExitStatus s = helpers[i].wait();
    if (s.exit_code != 0)
      throw Error("--workers " + std::to_string(t.workers) + ": decoding rank " + std::to_string(i + 1) + " ended with " +
                  s.describe() + "; fix: rerun without --workers, or see its message above");
  }
  return out;
}

// --prompt-file: the file's text, less one final newline (what a shell's $(cat FILE) drops, so
// that `echo TEXT > FILE` gives the prompt TEXT).
std::string read_prompt_file(const std::string& path) {
  check_input_file(path, "--prompt-file", "pass a readable text file, or the text itself with --prompt");
  std::string text = read_text_file(path);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace

Generated generate(const std::string& checkpoint_dir, const GenerateOptions& o) {
  CheckpointModel cm = load_checkpoint_model(checkpoint_dir);
  const Tokenizer tok = load_checkpoint_tokenizer(cm, o.tokenizer);
  const int T = cm.config.model.seq_len;
  // Training documents follow an end-of-document token, so a prompt starts after one too.
  std::vector<int32_t> ids = {tok.eos_id()};
  for (int32_t id : tok.encode(o.prompt)) ids.push_back(id);
  const int P = int(ids.size());
  if (P > T)
    throw DataError(o.prompt_flag + " is " + std::to_string(P - 1) +
                    " tokens, and with the start-of-text token more than the context of the model in " + cm.dir +
                    " (model.seq_len = " + std::to_string(T) + " positions); fix: shorten the prompt to at most " +
                    std::to_string(T - 1) + " tokens");
  const int room = T - P + 1;  // tokens the context leaves: the last one sampled is never fed
  const int n = std::min(o.max_tokens, room);
  Generated g;
  if (n == 0) {
    g.text = o.prompt;
    return g;
  }
  Decoder dec(cm.config.model, cm.params.data(), P + n - 1, o.group, std::min(P, kPrefillBlock));
  Rng rng(o.seed);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &dec.prefill(ids.data(), P);
  const auto t1 = std::chrono::steady_clock::now();
  // Only the tokenizer's ids are drawn: a model's vocabulary may be larger than its tokenizer's.
  const SampleOptions sampling{.temperature = o.temperature, .top_p = o.top_p, .vocab = tok.vocab_size()};
  std::vector<int32_t> out;
  bool ended = false;
  const int tail_from = std::max(0, n - 1 - 64);  // the steps timed at the end of the context
  auto tail0 = t1;
  for (int i = 0; i < n; ++i) {
    if (i == tail_from) tail0 = std::chrono::steady_clock::now();
    const int32_t next = sample_token(*logits, sampling, rng);
    if ((ended = next == tok.eos_id())) break;
    out.push_back(next);
    if (i + 1 < n) logits = &dec.step(next), ++g.decoded_tokens, g.tail_tokens += i >= tail_from;
  }
  const auto t2 = std::chrono::steady_clock::now();
  g.prompt_tokens = P;
  g.prompt_s = std::chrono::duration<double>(t1 - t0).count();
  g.decode_s = std::chrono::duration<double>(t2 - t1).count();
  g.tail_s = std::chrono::duration<double>(t2 - tail0).count();
  const std::string continuation = tok.decode(out);
  g.text = o.prompt + continuation;
  const std::string after = "end-of-text after " + std::to_string(out.size()) + " tokens)";
  if (ended)
    g.note = is_blank(continuation) ? "(the model ended the text at once: " + after : "(the model ended the text: " + after;
  else if (n < o.max_tokens)
    g.note = "(stopped at the model's context: model.seq_len = " + std::to_string(T) + " positions, the prompt took " +
             std::to_string(P) + " with its start-of-text token, so " + std::to_string(n) + " of --max-tokens " +
             std::to_string(o.max_tokens) + " were generated)";
  return g;
}

std::string generate_text(const std::string& checkpoint_dir, const std::string& tokenizer_path,
                          const std::string& prompt, int max_tokens, double temperature, double top_p, uint64_t seed) {
  return generate(checkpoint_dir, {.tokenizer = tokenizer_path,
                                   .prompt = prompt,
                                   .max_tokens = max_tokens,
                                   .temperature = temperature,
                                   .top_p = top_p,
                                   .seed = seed})
      .text;
}

Runner add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate",
                                 "sample text from a checkpoint (the prompt prefilled in blocks, then a KV-cache "
                                 "step per token); stops at end-of-text, at --max-tokens, or at the model's context "
                                 "(model.seq_len positions, prompt included), and says why on stderr");
  struct Flags {
    std::string checkpoint, prompt, prompt_file, tokenizer;
    std::string max_tokens = "128", temperature = "0.8", top_p = "0.95", seed = "0";
    std::string workers = "1", tree_rank = "0", tree_store, tree_run;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint or run directory")->required();
  auto* prompt = cmd->add_option("--prompt", f->prompt, "text to continue (at most model.seq_len - 1 tokens)");
  cmd->add_option("--prompt-file", f->prompt_file,
                  "read the text to continue from this file (one final newline dropped), for a prompt longer than a "
                  "command line holds; not with --prompt")
      ->type_name("PATH")
      ->excludes(prompt);
  cmd->add_option("--max-tokens", f->max_tokens,
                  "tokens to generate, 0 to " + std::to_string(kMaxTokensLimit) +
                      " (default 128); fewer when the model's context is reached first")
      ->type_name("N");
  cmd->add_option("--temperature", f->temperature, "sampling temperature, a finite number >= 0; 0 = greedy (default 0.8)")
      ->type_name("T");
  cmd->add_option("--top-p", f->top_p, "nucleus sampling mass, > 0 and <= 1 (default 0.95)")->type_name("P");
  cmd->add_option("--seed", f->seed, "sampling seed, a whole number >= 0 (default 0)")->type_name("S");
  cmd->add_option("--tokenizer", f->tokenizer, "tokenizer.model (default: the run's)");
  cmd->add_option("--workers", f->workers,
                  "processes to decode over, 1 to 64 (default 1): tree attention shards the KV cache over them and "
                  "gives the same text as one process")
      ->type_name("P");
  // Set by rank 0 of --workers for the processes it starts (not for users).
  cmd->add_option("--tree-rank", f->tree_rank)->group("");
  cmd->add_option("--tree-store", f->tree_store)->group("");
  cmd->add_option("--tree-run", f->tree_run)->group("");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    const bool from_file = !f->prompt_file.empty();
    const GenerateOptions o{
        .tokenizer = f->tokenizer,
        .prompt = from_file ? read_prompt_file(f->prompt_file) : f->prompt,
        .prompt_flag = from_file ? "--prompt-file " + f->prompt_file : "--prompt",
        .max_tokens = int(whole_number_flag("--max-tokens", f->max_tokens, 0, kMaxTokensLimit, "128")),
        .temperature = real_flag("--temperature", f->temperature, {.lo = 0, .hi = INFINITY}, "0.8 (0 = greedy)"),
        .top_p = real_flag("--top-p", f->top_p, {.lo = 0, .hi = 1, .lo_open = true}, "0.95"),
        .seed = seed_flag("--seed", f->seed)};
    const TreeFlags tree{.workers = int(whole_number_flag("--workers", f->workers, 1, 64, "1")),
                         .rank = int(whole_number_flag("--tree-rank", f->tree_rank, 0, 63, "0")),
                         .store = f->tree_store,
                         .run = f->tree_run};
    if (tree.workers == 1) {
      const Generated g = generate(f->checkpoint, o);
      std::printf("%s\n", g.text.c_str());
      std::fflush(stdout);
      if (!g.note.empty()) std::fprintf(stderr, "%s\n", g.note.c_str());
      print_timing(g);
      return 0;
    }
    // The helpers get this command's flags as given.
    std::vector<std::string> args = {from_file ? "--prompt-file" : "--prompt",
                                     from_file ? f->prompt_file : f->prompt,
                                     "--max-tokens",
                                     f->max_tokens,
                                     "--temperature",
                                     f->temperature,
                                     "--top-p",
                                     f->top_p,
                                     "--seed",
                                     f->seed};
    if (!f->tokenizer.empty()) args.push_back("--tokenizer"), args.push_back(f->tokenizer);
    const Generated g = generate_tree(f->checkpoint, args, o, tree);
    if (tree.rank > 0) return 0;
    std::printf("%s\n", g.text.c_str());
    std::fflush(stdout);
    if (!g.note.empty()) std::fprintf(stderr, "%s\n", g.note.c_str());
    print_timing(g);
    return 0;
  };
}

}  // namespace atl::cli
