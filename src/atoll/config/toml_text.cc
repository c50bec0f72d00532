#include "atoll/config/toml_text.h"

#include <charconv>
#include <cmath>
#include <cstdio>
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
  // TOML basic strings forbid control characters other than tab: they are written as \uXXXX,
  // so that any string a config holds prints as TOML that reads back to it.
  std::string r = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      r += '\\';
      r += ch;
    } else if ((u < 0x20 && ch != '\t') || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      r += esc;
    } else {
      r += ch;
    }
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
