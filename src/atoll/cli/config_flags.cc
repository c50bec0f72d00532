#include <filesystem>

#include "atoll/atoll_config.h"
#include "atoll/cli/commands.h"
#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"
#include "atoll/train/run_dir.h"

namespace atl::cli {

void ConfigFlags::add_to(CLI::App* app, const std::string& default_help) {
  app->add_option("--config", path, "TOML config file (" + default_help + ")");
  app->add_option("--set", overrides, "override a config key, e.g. --set train.steps=100 (repeatable)")
      ->type_name("KEY=VALUE");
}

Config ConfigFlags::load() {
  if (!path.empty()) check_input_file(path, "--config", "pass a .toml file to --config");
  return load_config(path, overrides, &given);
}

Config ConfigFlags::load_for_run(const std::string& run_dir, bool resume) {
  if (resume && path.empty()) {
    const Config cfg = load_run_config(run_dir, overrides);
    path = run_dir + "/config.toml";
    given.clear();
    for (const std::string& item : overrides) given.push_back(item.substr(0, item.find('=')));
    return cfg;
  }
  if (path.empty()) path = default_config_path();
  return load();
}

std::string run_dir_or_default(const std::string& given, bool resume) {
  if (resume && given.empty()) throw ConfigError("--resume needs --run-dir; fix: pass the run directory to continue");
  if (!given.empty()) check_output_dir(given, "--run-dir");
  return given.empty() ? default_run_dir() : given;
}

std::string default_config_path() {
  for (const char* dir : {".", ATOLL_SOURCE_DIR}) {
    const std::string p = std::string(dir) + "/configs/default.toml";
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

}  // namespace atl::cli
