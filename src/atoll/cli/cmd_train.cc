#include <cstdio>
#include <filesystem>
#include <fstream>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/cli/commands.h"
#include "atoll/core/log.h"
#include "atoll/train/trainer.h"

namespace atl::cli {

Runner add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a model (no arguments: the default config on the built-in corpus)");
  struct Flags {
    ConfigFlags config;
    std::string run_dir;
    bool resume = false;
    bool no_sample = false;
    bool help_config = false;
  };
  auto f = std::make_shared<Flags>();
  f->config.add_to(cmd, "default: configs/default.toml");
  cmd->add_option("--run-dir", f->run_dir, "run directory (default: runs/<date-time>)");
  cmd->add_flag("--resume", f->resume, "continue the run in --run-dir from its newest checkpoint");
  cmd->add_flag("--no-sample", f->no_sample, "do not print a generated sample at the end");
  cmd->add_flag("--help-config", f->help_config, "list every config key (type, default, allowed values, meaning) and exit");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    if (f->help_config) {
      std::printf("%s", config_help_text().c_str());
      return 0;
    }
    if (f->config.path.empty()) f->config.path = default_config_path();
    const Config cfg = f->config.load();
    std::printf("# resolved config (%s)\n%s\n", f->config.path.empty() ? "built-in defaults" : f->config.path.c_str(),
                config_to_toml(cfg).c_str());
    TrainResult r = train(cfg, {.run_dir = f->run_dir, .resume = f->resume});
    char summary[1024];
    std::snprintf(summary, sizeof summary,
                  "run %s: %ld steps, %ld tokens in %.1f s (%.0f tokens/s); train loss %.4f -> %.4f%s\n"
                  "final checkpoint %s\n",
                  r.run_dir.c_str(), long(r.steps), long(r.tokens), r.seconds, r.tokens / std::max(r.seconds, 1e-9),
                  r.first_loss, r.final_loss,
                  r.final_val_loss >= 0 ? (", validation loss " + std::to_string(r.final_val_loss).substr(0, 6)).c_str() : "",
                  r.checkpoint.c_str());
    std::printf("\n%s", summary);
    std::ofstream(r.run_dir + "/summary.txt") << summary;
    if (!f->no_sample && !r.tokenizer_path.empty()) {
      std::printf("\nsample (temperature 0.8):\n%s\n",
                  generate_text(r.checkpoint, r.tokenizer_path, "", 96, 0.8, 0.95, uint64_t(cfg.train.seed)).c_str());
    }
    return 0;
  };
}

}  // namespace atl::cli
