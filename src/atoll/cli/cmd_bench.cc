#include <cstdio>

#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/train/bench.h"

namespace atl::cli {

Runner add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "time training steps on synthetic tokens: tokens/s, GFLOP/s, MFU, phases");
  struct Flags {
    ConfigFlags config;
    BenchOptions opts;
  };
  auto f = std::make_shared<Flags>();
  f->config.add_to(cmd, "default: configs/default.toml");
  cmd->add_option("--steps", f->opts.steps, "timed steps (default 3)")->check(whole_number(1, 1 << 20));
  cmd->add_option("--warmup", f->opts.warmup, "untimed steps first (default 1)")->check(whole_number(0, 1 << 20));
  cmd->add_option("--peak-gflops", f->opts.peak_gflops,
                  "MFU against this peak (GFLOP/s, e.g. the vendor's) instead of the measured one")
      ->check(finite_number(0, 1e12, /*lo_open=*/true));
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    if (f->config.path.empty()) f->config.path = default_config_path();
    const Config cfg = f->config.load();
    nlohmann::json r = run_bench(cfg, f->opts);
    r["config"] = f->config.path;
    std::printf("%s\n", r.dump().c_str());
    return 0;
  };
}

}  // namespace atl::cli
