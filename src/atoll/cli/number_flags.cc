#include "atoll/cli/number_flags.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "atoll/core/errors.h"

namespace atl::cli {
namespace {

// Parses all of `text` as a T; false if it is not one (or has anything after it).
template <typename T>
bool parse_all(const std::string& text, T& value) {
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, value);
  return ec == std::errc() && at == end && !text.empty();
}

std::string number_text(double x) {
  std::string s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

int64_t whole_number_flag(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
                          const std::string& example) {
  int64_t value = 0;
  if (parse_all(text, value) && value >= lo && value <= hi) return value;
  const std::string range = "from " + std::to_string(lo) + " to " + std::to_string(hi);
  throw ConfigError(flag + " " + text + " is not a whole number " + range + "; fix: pass " + flag + " " + range +
                    " in plain digits, such as " + example);
}

uint64_t seed_flag(const std::string& flag, const std::string& text) {
  uint64_t value = 0;
  if (parse_all(text, value)) return value;
  throw ConfigError(flag + " " + text + " is not a whole number from 0 to " +
                    std::to_string(std::numeric_limits<uint64_t>::max()) + "; fix: pass " + flag +
                    " in plain digits, such as 1");
}

double real_flag(const std::string& flag, const std::string& text, RealRange range, const std::string& example) {
  double value = 0;
  if (parse_all(text, value) && std::isfinite(value) && (range.lo_open ? value > range.lo : value >= range.lo) &&
      value <= range.hi)
    return value;
  std::string what = (range.lo_open ? "> " : ">= ") + number_text(range.lo);
  if (std::isfinite(range.hi)) what += " and <= " + number_text(range.hi);
  throw ConfigError(flag + " " + text + " is not a finite number " + what + "; fix: pass " + flag + " " + what +
                    ", such as " + example);
}

}  // namespace atl::cli
