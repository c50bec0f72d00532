#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fstream>

#include "atoll/cli/commands.h"
#include "atoll/config/key_effect.h"
#include "atoll/train/report.h"
#include "atoll/train/resume_config.h"
#include "atoll/train/trainer.h"

namespace atl::cli {
namespace {

// `word` as the shell reads it back: as it is when it holds no special characters, else in
// single quotes.
std::string shell_word(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+-") ==
                           std::string::npos)
    return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a model (no arguments: the default config on the built-in corpus)");
  struct Flags {
    ConfigFlags config;
    std::string run_dir;
    bool resume = false;
    bool allow_config_change = false;
    bool print_config = false;
    bool no_sample = false;
    bool help_config = false;
    std::string init_from;
  };
  auto f = std::make_shared<Flags>();
  f->config.add_to(cmd, "default: configs/default.toml; with --resume: the run's config.toml");
  cmd->add_option("--run-dir", f->run_dir, "run directory (default: runs/<date-time>)");
  cmd->add_flag("--resume", f->resume,
                "continue the run in --run-dir from its newest checkpoint, with its own config.toml; --set may change " +
                    resume_safe_keys_text() + "; a run without a checkpoint yet starts over from step 0");
  cmd->add_flag("--allow-config-change", f->allow_config_change,
                "with --resume: let --set or --config change other keys too (never a [model] key)");
  cmd->add_option("--init-from", f->init_from,
                  "a new run starts from this Hugging Face model folder (config.json, safetensors, tokenizer.model; "
                  "docs/weights.md): its [model] and weights, a fresh optimizer");
  cmd->add_flag("--print-config", f->print_config, "print the whole resolved config (always saved as RUN_DIR/config.toml)");
  cmd->add_flag("--no-sample", f->no_sample, "do not print a generated sample at the end");
  cmd->add_flag("--help-config", f->help_config, "list every config key (type, default, allowed values, meaning) and exit");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    if (f->help_config) {
      std::printf("%s", config_help_text().c_str());
      return 0;
    }
    const std::string run_dir = run_dir_or_default(f->run_dir, f->resume);
    refuse_init_from_resume(f->init_from, f->resume);  // before the run's config is read
    Config cfg = f->config.load_for_run(run_dir, f->resume);
    apply_init_from(cfg, f->init_from, f->config.overrides);
    warn_idle_keys(cfg, f->config.given, {.islands = false});  // one island, no DiLoCo, no launcher
    if (f->print_config)
      std::printf("# resolved config (%s)\n%s\n", f->config.path.empty() ? "built-in defaults" : f->config.path.c_str(),
                  config_to_toml(cfg).c_str());
    else
      std::printf("%s\n", describe_run(cfg, run_dir).c_str());
    std::fflush(stdout);
    const TrainResult r = train(cfg, {.run_dir = run_dir,
                                      .resume = f->resume,
                                      .allow_config_change = f->allow_config_change,
                                      .stop_on_signal = true,
                                      .init_from = f->init_from});
    std::printf("\n%s", r.summary.c_str());
    std::fflush(stdout);
    if (r.stopped_by != 0) {
      // program_invocation_name: argv[0] as the user typed it, so the command runs as printed.
      std::fprintf(stderr, "atoll: stopped by signal %d after step %ld; the run can resume from %s\nresume with: %s train --resume --run-dir %s\n",
                   r.stopped_by, long(r.steps), r.checkpoint.c_str(), shell_word(program_invocation_name).c_str(),
                   shell_word(r.run_dir).c_str());
      // SIGTERM is how a preemptible machine asks a job to stop: the run did as asked, with its
      // final checkpoint written (stop_signals.h), so it succeeded. Ctrl-C keeps the shell's 130.
      return r.stopped_by == SIGTERM ? 0 : 128 + r.stopped_by;
    }
    if (!f->no_sample && !r.tokenizer_path.empty()) {
      const std::string sample =
          generate_text(r.checkpoint, r.tokenizer_path, "", 96, 0.8, 0.95, uint64_t(cfg.train.seed));
      std::printf("\nsample (temperature 0.8):\n%s\n", sample.c_str());
      // Kept with the run's figures, and so on its report page.
      std::ofstream(r.run_dir + "/summary.txt", std::ios::app) << "\nsample (temperature 0.8):\n" << sample << "\n";
      write_run_report(r.run_dir);
    }
    return 0;
  };
}

}  // namespace atl::cli
