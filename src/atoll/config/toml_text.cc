#include "atoll/config/toml_text.h"

#include <charconv>
#include <cmath>
#include <sstream>

namespace atl {

std::string fmt_double(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // Shortest text that reads back to the same double (1e-06, not 9.9999999999999995e-07).
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  std::string r(buf, res.ptr);
  if (r.find_first_of(".eEn") == std::string::npos) r += ".0";
  return r;
}

std::string quote(const std::string& s) {
  std::string r = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') r += '\\';
    r += ch;
  }
  return r + "\"";
}

std::string node_repr(const toml::node& n) {
  std::ostringstream s;
  n.visit([&](auto&& v) {
    if constexpr (toml::is_string<decltype(v)>) s << quote(v.get());
    else if constexpr (toml::is_value<decltype(v)>) s << v.get();
    else if constexpr (toml::is_array<decltype(v)>) s << "a list";
    else s << "a table";
  });
  return s.str();
}

}  // namespace atl
