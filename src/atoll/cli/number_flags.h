// Numeric flags that atoll reads itself, not CLI11, so that every bad value gets atoll's one
// error line naming the flag, the value and the fix: CLI11 takes "nan" and "inf" for a
// floating-point option, wraps "-1" into an unsigned one, and prints DBL_MAX in full as a
// range's bound. A flag so read is declared as a string option (its help giving the default)
// and parsed by one of these in its command's runner.
#pragma once

#include <cstdint>
#include <string>

namespace atl::cli {

// A whole number in [lo, hi], written in plain decimal digits ('-' first where lo < 0): no
// exponent, no fraction, nothing after. Throws ConfigError naming `flag` and `text`, whose fix
// suggests `example`.
int64_t whole_number_flag(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
                          const std::string& example);

// Any whole number in [0, 2^64), as a seed.
uint64_t seed_flag(const std::string& flag, const std::string& text);

// A finite number with lo <= x (lo < x when lo_open) and x <= hi (hi may be infinity).
struct RealRange {
  double lo = 0, hi = 0;
  bool lo_open = false;
};
double real_flag(const std::string& flag, const std::string& text, RealRange range, const std::string& example);

}  // namespace atl::cli
