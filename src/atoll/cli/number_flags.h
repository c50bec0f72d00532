// Checks for the numbers on the command line, one per flag declaration: the value must read as a
// number of the flag's kind, be finite and lie in the flag's bounds; otherwise parsing stops with
// "takes a whole number in [1, 256], got 0" after the flag's name, which main prints as one
// "atoll: error:" line with the fix. CLI11's own Range lets NaN through (every comparison with
// it is false) and states the largest double as a bound.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>

namespace atl::cli {

// Whole numbers in [lo, hi].
CLI::Validator whole_number(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max());

// Finite numbers in [lo, hi], or (lo, hi] when lo_open.
CLI::Validator finite_number(double lo, double hi, bool lo_open = false);

}  // namespace atl::cli
