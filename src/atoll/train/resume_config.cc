#include "atoll/train/resume_config.h"

#include <algorithm>
#include <sstream>
#include <utility>

namespace atl {
namespace {

// The resolved config as (key, TOML value) pairs in declaration order: config_to_toml writes
// every key, "[section]" headers then "name = value" lines.
std::vector<std::pair<std::string, std::string>> key_values(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> kv;
  std::istringstream lines(config_to_toml(cfg));
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.size() > 2 && line.front() == '[' && line.back() == ']') section = line.substr(1, line.size() - 2);
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) kv.emplace_back(section + "." + line.substr(0, eq), line.substr(eq + 3));
  }
  return kv;
}

}  // namespace

namespace {
bool context_key(const std::string& key) {
  return std::find(kResumeContextKeys.begin(), kResumeContextKeys.end(), key) != kResumeContextKeys.end();
}
}  // namespace

bool ConfigChange::safe() const {
  return std::find(kResumeSafeKeys.begin(), kResumeSafeKeys.end(), key) != kResumeSafeKeys.end() || context_key(key);
}

bool ConfigChange::model() const { return key.rfind("model.", 0) == 0 && !context_key(key); }

std::string ConfigChange::text() const { return key + ": " + was + " -> " + now; }

std::vector<ConfigChange> config_changes(const Config& was, const Config& now) {
  const auto a = key_values(was), b = key_values(now);
  std::vector<ConfigChange> changes;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (a[i].second != b[i].second) changes.push_back({a[i].first, a[i].second, b[i].second});
  return changes;
}

std::string resume_safe_keys_text() {
  std::string text;
  for (std::string_view k : kResumeSafeKeys) text.append(text.empty() ? "" : ", ").append(k);
  for (std::string_view k : kResumeContextKeys) text.append(", ").append(k);
  return text;
}

}  // namespace atl
