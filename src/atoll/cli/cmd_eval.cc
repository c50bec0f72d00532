// `atoll eval`, `atoll generate` and `atoll export`: the commands that read a checkpoint.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "atoll/ckpt/export_hf.h"
#include "atoll/cli/checkpoint_model.h"
#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/core/errors.h"
#include "atoll/data/loader.h"
#include "atoll/data/tokenizer.h"
#include "atoll/model/decoder.h"
#include "atoll/model/model.h"
#include "atoll/train/dataset.h"
#include "atoll/train/trainer.h"

namespace atl::cli {
namespace fs = std::filesystem;

Runner add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "mean next-token loss of a checkpoint on a shard; prints one JSON object");
  struct Flags {
    std::string checkpoint, data;
    int64_t tokens = 0;
    int batch = 8;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint or run directory")->required();
  cmd->add_option("--data", f->data, "a .bin shard, or a folder (its val_*.bin); default: the run's validation split");
  cmd->add_option("--tokens", f->tokens, "evaluate at most this many predicted tokens (0 = the whole shard)")
      ->check(whole_number(0));
  cmd->add_option("--batch", f->batch, "sequences per forward pass")->check(whole_number(1, 1 << 20));
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    configure_threads(0);
    CheckpointModel cm = load_checkpoint_model(f->checkpoint);
    const std::string data = f->data.empty() ? resolve_dataset(cm.config).dir : f->data;
    const int T = cm.config.model.seq_len;
    DataLoader loader(data, "val", {.seq_len = T, .shuffle = false, .prefetch = false});
    loader.check_vocab(cm.config.model.vocab_size);
    int64_t windows = loader.n_windows();
    if (f->tokens > 0) windows = std::min<int64_t>(windows, (f->tokens + T - 1) / T);
    Model<float> model(cm.config.model, f->batch);
    model.params() = cm.params;
    std::vector<int32_t> in(size_t(f->batch) * T), tg(size_t(f->batch) * T);
    double sum = 0;
    for (int64_t done = 0; done < windows;) {
      const int b = int(std::min<int64_t>(f->batch, windows - done));
      loader.next_batch(b, in.data(), tg.data());
      sum += model.forward(in.data(), tg.data(), b).ce * b * T;
      done += b;
    }
    const double n = double(windows) * T, loss = sum / n;
    nlohmann::json out = {{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", int64_t(n)},
                          {"checkpoint", cm.dir}, {"data", data}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  };
}

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
  cmd->add_option("--max-tokens", f->max_tokens, "tokens to generate (default 128)")->check(whole_number(1, 1 << 24));
  cmd->add_option("--temperature", f->temperature, "sampling temperature, 0 = greedy (default 0.8)")
      ->check(finite_number(0.0, 1e6));
  cmd->add_option("--top-p", f->top_p, "nucleus sampling mass (default 0.95)")->check(finite_number(0.0, 1.0));
  cmd->add_option("--seed", f->seed, "sampling seed (default 0)")->check(whole_number(0));
  cmd->add_option("--tokenizer", f->tokenizer, "tokenizer.model (default: the run's)");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    std::printf("%s\n", generate_text(f->checkpoint, f->tokenizer, f->prompt, f->max_tokens, f->temperature, f->top_p,
                                      f->seed).c_str());
    return 0;
  };
}

Runner add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand("export", "write a checkpoint as a Hugging Face Mixtral model");
  struct Flags {
    std::string checkpoint, format = "hf", out;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint or run directory")->required();
  cmd->add_option("--format", f->format, "export format (hf)")->check(CLI::IsMember({"hf"}));
  cmd->add_option("--out", f->out, "output folder (must not hold other files)")->required();
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    CheckpointModel cm = load_checkpoint_model(f->checkpoint);
    export_hf(f->out, cm.config.model, cm.layout, cm.params.data());
    const std::string tok = run_tokenizer(cm.dir);
    if (!tok.empty()) fs::copy_file(tok, f->out + "/tokenizer.model", fs::copy_options::overwrite_existing);
    std::printf("exported %s to %s (config.json, model.safetensors%s)\n", cm.dir.c_str(), f->out.c_str(),
                tok.empty() ? "" : ", tokenizer.model");
    return 0;
  };
}

}  // namespace atl::cli
