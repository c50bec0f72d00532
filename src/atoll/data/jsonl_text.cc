#include "atoll/data/jsonl_text.h"

#include <cstdint>

namespace atl {

namespace {

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void skip_space(std::string_view& s) {
  while (!s.empty() && is_json_space(s.front())) s.remove_prefix(1);
}

bool consume(std::string_view& s, std::string_view token) {
  skip_space(s);
  if (!s.starts_with(token)) return false;
  s.remove_prefix(token.size());
  return true;
}

// Four hex digits of a \u escape; -1 if they are not.
int32_t hex4(std::string_view s) {
  if (s.size() < 4) return -1;
  int32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Decodes the JSON string at the start of `s` (after its opening quote) into `out` and moves
// `s` past its closing quote; false for what nlohmann::json refuses in a string.
bool decode_string(std::string_view& s, std::string& out) {
  out.clear();
  size_t i = 0;
  while (true) {
    size_t run = i;  // copy the plain bytes up to the next quote, backslash or control character
    while (run < s.size() && s[run] != '"' && s[run] != '\\' && static_cast<unsigned char>(s[run]) >= 0x20) ++run;
    out.append(s.data() + i, run - i);
    if (run == s.size() || static_cast<unsigned char>(s[run]) < 0x20) return false;  // unterminated, raw control
    if (s[run] == '"') {
      s.remove_prefix(run + 1);
      return true;
    }
    if (run + 1 == s.size()) return false;
    const char e = s[run + 1];
    i = run + 2;
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        int32_t c = hex4(s.substr(i));
        if (c < 0 || (c >= 0xDC00 && c <= 0xDFFF)) return false;  // bad digits, a lone low surrogate
        i += 4;
        if (c >= 0xD800 && c <= 0xDBFF) {  // a high surrogate needs its low one next
          if (s.substr(i, 2) != "\\u") return false;
          const int32_t lo = hex4(s.substr(i + 2));
          if (lo < 0xDC00 || lo > 0xDFFF) return false;
          c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
          i += 6;
        }
        append_utf8(out, static_cast<char32_t>(c));
        break;
      }
      default:
        return false;
    }
  }
}

}  // namespace

bool simple_jsonl_text(std::string_view line, std::string& text) {
  if (!consume(line, "{") || !consume(line, "\"text\"") || !consume(line, ":") || !consume(line, "\"")) return false;
  if (!decode_string(line, text) || !consume(line, "}")) return false;
  skip_space(line);
  return line.empty();
}

}  // namespace atl
