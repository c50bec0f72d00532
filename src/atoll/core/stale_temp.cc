// Finding and removing the temporary folders of writers that have ended (see stale_temp.h).
#include "atoll/core/stale_temp.h"

#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <filesystem>
#include <limits>

#include "atoll/core/log.h"

namespace atl {

namespace fs = std::filesystem;

std::optional<int64_t> temp_owner(const std::string& name) {
  const size_t at = name.rfind(".tmp-");
  if (at == std::string::npos || at == 0 || at + 5 == name.size() || name.size() - (at + 5) > 18 ||
      name.find_first_not_of("0123456789", at + 5) != std::string::npos)
    return std::nullopt;
  return int64_t(std::stoll(name.substr(at + 5)));
}

bool process_alive(int64_t pid) {
  if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) return false;
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

std::vector<std::string> remove_stale_temps(const std::string& dir, const std::string& base, const std::string& what) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir.empty() ? "." : dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::optional<int64_t> pid = temp_owner(name);
    if (!pid || name.substr(0, name.rfind(".tmp-")) != base || process_alive(*pid)) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (rm) {
      log_warn("cannot remove " + e.path().string() + ", left by an interrupted " + what + ": " + rm.message());
      continue;
    }
    log_info("removed " + e.path().string() + ", left by an interrupted " + what + " (process " +
             std::to_string(*pid) + " has ended)");
    removed.push_back(e.path().string());
  }
  return removed;
}

}  // namespace atl
