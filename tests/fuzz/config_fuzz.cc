// The TOML config and --set overrides (config/config.h) over any bytes. Input: the TOML text,
// then optionally a line "%%" followed by one `--set key=value` per line. A config that parses
// must print (config_to_toml) as a TOML text that parses back to the same config.
#include <optional>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "fuzz/fuzz_target.h"

ATOLL_FUZZ_TARGET(config) {
  const std::string input(atl::fuzz::as_text(data, size));
  const size_t split = input.find("\n%%\n");
  const std::string toml = input.substr(0, split);
  std::vector<std::string> sets;
  if (split != std::string::npos) {
    for (size_t pos = split + 4; pos <= input.size();) {
      size_t end = input.find('\n', pos);
      if (end == std::string::npos) end = input.size();
      sets.push_back(input.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  std::optional<atl::Config> cfg;
  atl::fuzz::fuzz_reject([&] { cfg = atl::parse_config(toml, "fuzz.toml", sets); });
  if (!cfg) return 0;
  // Accepted: the printed config must read back as it is (a throw here is a bug too).
  const std::string printed = atl::config_to_toml(*cfg);
  if (atl::config_to_toml(atl::parse_config(printed, "printed")) != printed) __builtin_trap();
  return 0;
}
