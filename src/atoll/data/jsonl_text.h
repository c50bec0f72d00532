// The "text" of a JSONL line of the common shape {"text": "..."}, decoded in one pass without
// building a JSON value: nlohmann's parser (a character at a time, a DOM per line) was about a
// fifth of `atoll data prepare`'s encoding pass once encoding went through the word cache.
#pragma once

#include <string>
#include <string_view>

namespace atl {

// True, with the string's value in `text`, when `line` is exactly one JSON object with the one
// key "text" (spelled without escapes) and a string value, with JSON whitespace around the
// tokens; the value is decoded as nlohmann::json decodes it (the escapes \" \\ \/ \b \f \n \r \t
// and \uXXXX with surrogate pairs). False, leaving `text` unspecified, for anything else — other
// keys, another shape, a raw control character, a lone surrogate, a bad escape, bytes after the
// object — which the caller then parses with nlohmann::json (the reference). `line` must be
// valid UTF-8 (item_text repairs it first), as nlohmann requires of a string's bytes.
bool simple_jsonl_text(std::string_view line, std::string& text);

}  // namespace atl
