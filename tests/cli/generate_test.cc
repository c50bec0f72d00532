// `atoll generate` says what it does: every numeric flag is checked (one clear error line), it
// stops at the model's context and says so, it explains a sample that ends at once, it refuses
// a tokenizer larger than the model's vocabulary, and a large --max-tokens costs nothing until
// tokens are generated. Most cases run on hand-made checkpoints whose output is known: every
// weight zero except an embedding of ones, final-norm gains of one and one head row of ones,
// so the model predicts that row's token at every position, whatever the input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/config/config.h"
#include "atoll/data/tokenizer.h"
#include "atoll/model/layout.h"
#include "cli/cli_util.h"

namespace atl::testing {
namespace {

class Generate : public CliTest {
 protected:
  // A run folder `name` whose one checkpoint always predicts `token`, beside the base run's
  // tokenizer.model.
  std::string run_predicting(const std::string& name, int32_t token, int vocab = MicroWorld::kVocab) {
    Config cfg = parse_config(world().config_text(), "the micro config");  // the micro model, with `vocab`
    cfg.model.vocab_size = vocab;
    const ParamLayout layout = ParamLayout::build(cfg.model);
    std::vector<float> params(layout.total(), 0.0f);
    for (const char* ones : {"embed", "final_norm"}) {
      const ParamEntry& e = layout.at(ones);
      std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(e.offset), e.numel, 1.0f);
    }
    const size_t C = static_cast<size_t>(cfg.model.dim);
    std::fill_n(params.begin() + static_cast<std::ptrdiff_t>(layout.at("head").offset + static_cast<size_t>(token) * C),
                C, 1.0f);
    const std::string run = dir(name);
    save_checkpoint({.run_dir = run, .step = 1}, cfg, layout, {{"param", params.data()}}, nlohmann::json::object());
    fs::copy_file(tokenizer(), run + "/tokenizer.model");
    return run;
  }

  static std::string tokenizer() { return base_run() + "/tokenizer.model"; }

  // The start-of-text token and the prompt's tokens: the positions a prompt takes.
  static int prompt_positions(const std::string& prompt) {
    return 1 + static_cast<int>(Tokenizer::load(tokenizer()).encode(prompt).size());
  }
};

TEST_F(Generate, EveryNumericFlagIsChecked) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--temperature", "nan"}, {"--temperature", "inf"}, {"--temperature", "-1"},   {"--temperature", "warm"},
      {"--top-p", "0"},         {"--top-p", "1.5"},       {"--top-p", "nan"},        {"--top-p", "-0.1"},
      {"--max-tokens", "-1"},   {"--max-tokens", "1e3"},  {"--max-tokens", "1000000000"},
      {"--max-tokens", "2147483647"},                     {"--max-tokens", "many"},  {"--seed", "-1"},
      {"--seed", "1.5"},        {"--seed", "abc"},        {"--workers", "0"},        {"--workers", "65"},
      {"--workers", "two"}};
  const std::string run = base_run();
  const auto before = snapshot(run);
  for (const auto& [flag, value] : bad) {
    const RunResult r = run_atoll({"generate", "--checkpoint", run, "--prompt", "The sea", flag, value});
    EXPECT_TRUE(fails_clearly(r, {flag, value})) << flag << " " << value;
  }
  EXPECT_TRUE(unchanged(before, snapshot(run)));
}

// --workers P: tree attention shards the KV cache over P processes (model/decoder.h) and gives
// one process's greedy text (the acceptance check's case: ../shared/acceptance/longctx.sh).
TEST_F(Generate, TreeAttentionOverWorkersGivesOneProcessesText) {
  const std::vector<std::string> args = {"generate", "--checkpoint", base_run(), "--prompt", "The island",
                                         "--temperature", "0", "--max-tokens", "24"};
  const RunResult one = run_atoll(args);
  ASSERT_EQ(one.exit_code, 0) << one.describe();
  for (const char* P : {"2", "3"}) {
    std::vector<std::string> tree_args = args;
    tree_args.insert(tree_args.end(), {"--workers", P});
    const RunResult tree = run_atoll(tree_args);
    ASSERT_EQ(tree.exit_code, 0) << tree.describe();
    EXPECT_EQ(tree.out, one.out) << "--workers " << P;
  }
}

// --prompt-file: the file's text, less one final newline, is the prompt: the same text as
// --prompt, also with --workers (its helpers read the file too); a long prompt is prefilled.
TEST_F(Generate, APromptFileIsThePrompt) {
  const std::string file = dir("prompt.txt");
  write_file(file, "The island\n");
  const std::vector<std::string> tail = {"--temperature", "0", "--max-tokens", "12"};
  std::vector<std::string> by_flag = {"generate", "--checkpoint", base_run(), "--prompt", "The island"};
  std::vector<std::string> by_file = {"generate", "--checkpoint", base_run(), "--prompt-file", file};
  by_flag.insert(by_flag.end(), tail.begin(), tail.end());
  by_file.insert(by_file.end(), tail.begin(), tail.end());
  const RunResult a = run_atoll(by_flag), b = run_atoll(by_file);
  ASSERT_EQ(a.exit_code, 0) << a.describe();
  ASSERT_EQ(b.exit_code, 0) << b.describe();
  EXPECT_EQ(b.out, a.out);
  by_file.insert(by_file.end(), {"--workers", "2"});
  const RunResult tree = run_atoll(by_file);
  ASSERT_EQ(tree.exit_code, 0) << tree.describe();
  EXPECT_EQ(tree.out, a.out);
}

TEST_F(Generate, ABadPromptFileIsRefused) {
  const std::string missing = dir("no-such-prompt.txt");
  EXPECT_TRUE(fails_clearly(run_atoll({"generate", "--checkpoint", base_run(), "--prompt-file", missing}),
                            {"--prompt-file", missing}));
  EXPECT_TRUE(fails_clearly(run_atoll({"generate", "--checkpoint", base_run(), "--prompt-file", dir()}),
                            {"--prompt-file", dir()}));
  const std::string file = dir("both.txt");
  write_file(file, "The sea");
  EXPECT_TRUE(fails_clearly(
      run_atoll({"generate", "--checkpoint", base_run(), "--prompt-file", file, "--prompt", "The sea"}),
      {"--prompt-file", "--prompt"}));
  // Longer than the context: the message names the file.
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "island ";
  write_file(file, prompt);
  EXPECT_TRUE(fails_clearly(run_atoll({"generate", "--checkpoint", base_run(), "--prompt-file", file}),
                            {"--prompt-file " + file, "model.seq_len", "32"}));
}

TEST_F(Generate, ASampleThatEndsAtOnceIsExplained) {
  const std::string run = run_predicting("eos", Tokenizer::load(tokenizer()).eos_id());
  const RunResult r = run_atoll({"generate", "--checkpoint", run, "--prompt", "The sea", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out, "The sea\n");
  EXPECT_NE(r.err.find("(the model ended the text at once: end-of-text after 0 tokens)"), std::string::npos)
      << r.describe();
}

TEST_F(Generate, StopsAtTheModelsContextAndSaysSo) {
  const std::string run = run_predicting("ah", 'a' + 3);  // byte piece <0x61>, "a": never the end
  const std::string prompt = "The sea";
  const int generated = MicroWorld::kSeqLen - prompt_positions(prompt) + 1;
  const RunResult r = run_atoll({"generate", "--checkpoint", run, "--prompt", prompt, "--max-tokens", "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.out, prompt + std::string(static_cast<size_t>(generated), 'a') + "\n");
  EXPECT_NE(r.err.find("model.seq_len = 32"), std::string::npos) << r.describe();
  EXPECT_NE(r.err.find(std::to_string(generated) + " of --max-tokens 1000"), std::string::npos) << r.describe();
  // Fewer tokens than the context holds: no note.
  const RunResult few = run_atoll({"generate", "--checkpoint", run, "--prompt", prompt, "--max-tokens", "5"});
  ASSERT_EQ(few.exit_code, 0) << few.describe();
  EXPECT_EQ(few.out, prompt + "aaaaa\n");
  EXPECT_EQ(few.err.find("model.seq_len"), std::string::npos) << few.describe();
}

TEST_F(Generate, TheLargestMaxTokensIsCheap) {
  // The cache grows with the tokens generated, and they stop at the context: this finishes at
  // once (it used to allocate the cache for every requested token up front).
  const std::string run = run_predicting("ah", 'a' + 3);
  const RunResult r = run_atoll({"generate", "--checkpoint", run, "--prompt", "x", "--max-tokens", "1000000"}, 30.0);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.err.find("model.seq_len = 32"), std::string::npos) << r.describe();
}

TEST_F(Generate, APromptLongerThanTheContextIsRefused) {
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "island ";
  const RunResult r = run_atoll({"generate", "--checkpoint", base_run(), "--prompt", prompt});
  EXPECT_TRUE(fails_clearly(r, {"--prompt", "model.seq_len", "32"}));
}

TEST_F(Generate, ATokenizerLargerThanTheModelIsRefused) {
  const int pieces = Tokenizer::load(tokenizer()).vocab_size();
  ASSERT_GT(pieces, 300);
  const std::string run = run_predicting("small", 5, /*vocab=*/300);
  const RunResult r = run_atoll({"generate", "--checkpoint", run, "--prompt", "The island reef"});
  EXPECT_TRUE(fails_clearly(r, {run + "/tokenizer.model", std::to_string(pieces), "300", "model.vocab_size"}));
}

}  // namespace
}  // namespace atl::testing
