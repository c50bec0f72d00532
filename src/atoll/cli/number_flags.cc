#include "atoll/cli/number_flags.h"

#include <charconv>
#include <cmath>
#include <string>

namespace atl::cli {
namespace {

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
