// The `atoll` subcommands (DESIGN.md "Command line"). Each registers its flags on a CLI11
// subcommand, declared once, and runs when selected. Errors are thrown (core/errors.h) and
// reported by main as one line with a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/core/collective.h"

namespace atl::cli {

// --config and --set, shared by every command that builds a config.
struct ConfigFlags {
  std::string path;
  std::vector<std::string> overrides;
  std::vector<std::string> given;  // after a load: the keys the file or --set set (config/key_effect.h)
  void add_to(CLI::App* app, const std::string& default_help);
  Config load();
  // The config of a command that writes a run: with `resume` and no --config, the run's own
  // (RUN_DIR/config.toml with --set applied; train/run_dir.h); else --config, by default
  // default_config_path(). Sets `path` to the file read. A resumed run's `given` are the keys
  // of --set (its config.toml was checked when it started).
  Config load_for_run(const std::string& run_dir, bool resume);
};

// --init-from DIR (cli/init_from.cc): replaces cfg's [model] by DIR/config.json's (logging the
// keys that changed); a --set model.* that disagrees with it is a ConfigError. Does nothing for
// an empty `dir`. refuse_init_from_resume: --init-from with --resume is a ConfigError.
void apply_init_from(Config& cfg, const std::string& dir, const std::vector<std::string>& overrides);
void refuse_init_from_resume(const std::string& dir, bool resume);

// The run directory of a command that writes a run: --run-dir, else default_run_dir() for a new
// run; --resume without --run-dir is a ConfigError.
std::string run_dir_or_default(const std::string& given, bool resume);

// The default config when --config is not given: configs/default.toml next to the sources,
// or the built-in defaults.
std::string default_config_path();

using Runner = std::function<int()>;
Runner add_train(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_generate(CLI::App& app);
Runner add_export(CLI::App& app);
Runner add_data(CLI::App& app);
Runner add_launch(CLI::App& app);  // cmd_launch.cc
Runner add_worker(CLI::App& app);  // cmd_launch.cc
Runner add_report(CLI::App& app);
Runner add_doctor(CLI::App& app);  // cmd_doctor.cc

// A sample from the model in `checkpoint_dir` (cmd_generate.cc): the prompt and its
// continuation, and a note saying why it ended before max_tokens ("" when it did not): the
// model's end-of-text, or the model's context (model.seq_len positions, prompt included), where
// generation stops. Throws DataError for a tokenizer that does not fit the model, a prompt
// longer than the context.
struct GenerateOptions {
  std::string tokenizer;  // tokenizer.model; "" = the run's
  std::string prompt;
  std::string prompt_flag = "--prompt";  // where the prompt came from, for messages
  int max_tokens = 128;
  double temperature = 0.8, top_p = 0.95;
  uint64_t seed = 0;
  // Tree-attention decoding (model/decoder.h): the group whose ranks shard the KV cache, every
  // rank running generate() with the same options; null: one process.
  Collective* group = nullptr;
};
struct Generated {
  std::string text, note;
  // Wall seconds of the prompt's prefill, of the generated tokens' steps, and of the last (up
  // to 64) of those, at the longest context (ATOLL_GENERATE_TIMING=1 prints them on stderr, for
  // bench/tree_decode.sh).
  int prompt_tokens = 0, decoded_tokens = 0, tail_tokens = 0;
  double prompt_s = 0, decode_s = 0, tail_s = 0;
};
Generated generate(const std::string& checkpoint_dir, const GenerateOptions& options);

// The text of generate() (for `train`'s sample at the end of a run).
std::string generate_text(const std::string& checkpoint_dir, const std::string& tokenizer_path,
                          const std::string& prompt, int max_tokens, double temperature, double top_p, uint64_t seed);

}  // namespace atl::cli
