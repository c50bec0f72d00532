#include "atoll/cli/number_flags.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string>

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

std::string text(double x) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, res.ptr);
}

// A check that reads the whole value as a T (from_chars: no sign other than '-', no spaces) and
// takes it when inside(v); `bounds` ("[1, 256]", ">= 0") is shown in --help and in the error.
template <class T, class Inside>
CLI::Validator number_check(const std::string& kind, const std::string& bounds, Inside inside) {
  const std::string allowed = (bounds[0] == '[' || bounds[0] == '(' ? "in " : "") + bounds;
  return CLI::Validator(
      [kind, allowed, inside](std::string& input) -> std::string {
        T v{};
        const char* end = input.data() + input.size();
        const auto res = std::from_chars(input.data(), end, v);
        if (res.ec != std::errc() || res.ptr != end || !inside(v)) return "takes " + kind + " " + allowed + ", got " + input;
        return "";
      },
      bounds);
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

CLI::Validator whole_number(int64_t lo, int64_t hi) {
  const std::string bounds = hi == std::numeric_limits<int64_t>::max()
                                 ? ">= " + std::to_string(lo)
                                 : "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return number_check<int64_t>("a whole number", bounds, [lo, hi](int64_t v) { return v >= lo && v <= hi; });
}

CLI::Validator finite_number(double lo, double hi, bool lo_open) {
  const std::string bounds = std::isinf(hi) ? (lo_open ? "> " : ">= ") + text(lo)
                                            : (lo_open ? "(" : "[") + text(lo) + ", " + text(hi) + "]";
  return number_check<double>("a finite number", bounds, [lo, hi, lo_open](double v) {
    return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
  });
}

}  // namespace atl::cli
