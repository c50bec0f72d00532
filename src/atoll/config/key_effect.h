// When each config key has an effect. Every key declared in config.cc has one row here, with
// the condition under which it changes what a run does (config_key_effect_test fails for a key
// without one, so a new key cannot be added without deciding). A key the user set explicitly (in
// the config file or with --set) to a value other than its default, in a run where its
// condition does not hold, is warned about: one line naming the key, its value and why it does
// nothing (optim.muon_momentum with optim.name = adamw, a diloco.* key in `atoll train`, which
// runs one island without DiLoCo). A key set to its default is not: it changes nothing either
// way, and a run's saved config.toml lists every key.
#pragma once

#include <string>
#include <vector>

#include "atoll/config/config.h"

namespace atl {

// What the command running a config is: some keys act only across islands or under the launcher.
struct RunShape {
  bool islands = false;        // DiLoCo across islands (`atoll launch`, `atoll worker`); `atoll train` is one island without it
  int n_islands = 1;           // with islands: N
  int workers_per_island = 1;  // M
  bool supervised = false;     // started and watched by `atoll launch` (restarts, the step watchdog)
};

struct KeyEffect {
  const char* key;
  const char* applies;  // when it has an effect, in words: "only with optim.name = muon"
  bool (*has_effect)(const Config& c, const RunShape& s);
};

// One row per declared key, in declaration order.
const std::vector<KeyEffect>& key_effects();

// One line per key of `given` (keys the file or --set wrote) that is set to a value other than
// its default and has no effect in `cfg` run as `shape`: "KEY = VALUE has no effect: it applies
// only ...; fix: ...".
std::vector<std::string> idle_key_lines(const Config& cfg, const std::vector<std::string>& given, const RunShape& shape);

// Logs each of idle_key_lines as a warning.
void warn_idle_keys(const Config& cfg, const std::vector<std::string>& given, const RunShape& shape);

}  // namespace atl
