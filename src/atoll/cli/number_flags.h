// Numbers on the command line, two ways, both ending in one "atoll: error:" line that names the
// flag, the value and the fix (CLI11's own Range lets NaN and inf through, wraps "-1" into an
// unsigned option, and states the largest double as a bound):
//  - validators for CLI11 options (whole_number, finite_number): the value must read as a number
//    of the flag's kind, be finite and lie in the flag's bounds, else parsing stops with "takes a
//    whole number in [1, 256], got 0" after the flag's name;
//  - parsers for flags declared as string options and read in the command's runner
//    (whole_number_flag, seed_flag, real_flag), where the error wants the flag's own example.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>

namespace atl::cli {

// Whole numbers in [lo, hi].
CLI::Validator whole_number(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());

// Finite numbers in [lo, hi], or (lo, hi] when lo_open.
CLI::Validator finite_number(double lo, double hi, bool lo_open = false);

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
