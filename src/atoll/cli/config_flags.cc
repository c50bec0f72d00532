#include <filesystem>

#include "atoll/atoll_config.h"
#include "atoll/cli/commands.h"

namespace atl::cli {

void ConfigFlags::add_to(CLI::App* app, const std::string& default_help) {
  app->add_option("--config", path, "TOML config file (" + default_help + ")");
  app->add_option("--set", overrides, "override a config key, e.g. --set train.steps=100 (repeatable)")
      ->type_name("KEY=VALUE");
}

Config ConfigFlags::load() const { return load_config(path, overrides); }

std::string default_config_path() {
  for (const char* dir : {".", ATOLL_SOURCE_DIR}) {
    const std::string p = std::string(dir) + "/configs/default.toml";
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

}  // namespace atl::cli
