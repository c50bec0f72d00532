// `atoll generate`: text sampled from a checkpoint, token by token through the KV-cache decoder.
#include <cstdio>

#include "atoll/cli/checkpoint_model.h"
#include "atoll/cli/commands.h"
#include "atoll/core/errors.h"
#include "atoll/data/tokenizer.h"
#include "atoll/model/decoder.h"

namespace atl::cli {

std::string generate_text(const std::string& checkpoint_dir, const std::string& tokenizer_path,
                          const std::string& prompt, int max_tokens, double temperature, double top_p, uint64_t seed) {
  CheckpointModel cm = load_checkpoint_model(checkpoint_dir);
  const std::string tok_path = tokenizer_path.empty() ? run_tokenizer(cm.dir) : tokenizer_path;
  if (tok_path.empty())
    throw DataError(cm.dir + ": no tokenizer.model found for this checkpoint; fix: pass --tokenizer PATH");
  Tokenizer tok = Tokenizer::load(tok_path);
  // Training documents follow an end-of-document token, so a prompt starts after one too.
  std::vector<int32_t> ids = {tok.eos_id()};
  for (int32_t id : tok.encode(prompt)) ids.push_back(id);
  Decoder dec(cm.config.model, cm.params.data(), int(ids.size()) + max_tokens);
  Rng rng(seed);
  const std::vector<float>* logits = nullptr;
  for (int32_t id : ids) logits = &dec.step(id);
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    const int32_t next = sample_token(*logits, {.temperature = temperature, .top_p = top_p}, rng);
    if (next == tok.eos_id() || next >= tok.vocab_size()) break;
    out.push_back(next);
    if (i + 1 < max_tokens) logits = &dec.step(next);
  }
  return prompt + tok.decode(out);
}

Runner add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint (KV cache)");
  struct Flags {
    std::string checkpoint, prompt, tokenizer;
    int max_tokens = 128;
    double temperature = 0.8, top_p = 0.95;
    uint64_t seed = 0;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint or run directory")->required();
  cmd->add_option("--prompt", f->prompt, "text to continue");
  cmd->add_option("--max-tokens", f->max_tokens, "tokens to generate (default 128)")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", f->temperature, "sampling temperature, 0 = greedy (default 0.8)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", f->top_p, "nucleus sampling mass (default 0.95)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", f->seed, "sampling seed (default 0)");
  cmd->add_option("--tokenizer", f->tokenizer, "tokenizer.model (default: the run's)");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    std::printf("%s\n", generate_text(f->checkpoint, f->tokenizer, f->prompt, f->max_tokens, f->temperature, f->top_p,
                                      f->seed).c_str());
    return 0;
  };
}

}  // namespace atl::cli
