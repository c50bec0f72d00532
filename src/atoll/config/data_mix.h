// data.mix and data.phases in config files: read from TOML (every bad value named by its full
// key, e.g. data.phases[1].mix[0].weight) and written back as inline tables.
#pragma once

#include <toml++/toml.h>

#include <functional>
#include <string>
#include <vector>

#include "atoll/config/config.h"

namespace atl {

// Reports a bad value (the key, what is wrong, the fix) by throwing ConfigError; config.cc's
// reader passes one that blames the file or the --set item.
using ConfigFail = std::function<void(const std::string& key, const std::string& problem, const std::string& fix)>;

// `n` is the value of `key`. An empty list means none (config_to_toml writes the default so).
std::vector<MixSource> read_data_mix(const toml::node& n, const std::string& key, const ConfigFail& fail);
std::vector<DataPhase> read_data_phases(const toml::node& n, const std::string& key, const ConfigFail& fail);

std::string data_mix_toml(const std::vector<MixSource>& mix);       // [{dir = "a", weight = 0.7}, ...]
std::string data_phases_toml(const std::vector<DataPhase>& phases);  // [{at_tokens = 0, mix = [...]}, ...]

}  // namespace atl
