// Values as config files and config errors write them, shared by config.cc and data_mix.cc.
#pragma once

#include <toml++/toml.h>

#include <string>

namespace atl {

// Shortest text that reads back to the same double, always with a '.' or exponent ("1.0", "1e-06").
std::string fmt_double(double x);
// A TOML basic string: "a \"b\"".
std::string quote(const std::string& s);
// A node as an error message shows it: the value, or "a list", "a table".
std::string node_repr(const toml::node& n);

}  // namespace atl
