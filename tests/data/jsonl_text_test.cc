// The one-pass decoder of {"text": "..."} lines against nlohmann::json, the reference: on lines
// built from the awkward parts of JSON (every escape, surrogate pairs and lone surrogates, raw
// control characters, other keys and values, whitespace, a BOM, bytes after the object), item_text
// gives what nlohmann gives, and the fast path declines every line it cannot decode exactly.
#include "atoll/data/jsonl_text.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "atoll/core/rng.h"
#include "atoll/data/corpus.h"
#include "atoll/data/document_stream.h"

namespace atl {
namespace {

// What item_text gave before the fast path: nlohmann's parse of the repaired line.
ItemText reference(std::string line) {
  ItemText out;
  out.replaced_bytes = replace_invalid_utf8(line);
  const nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) {
    out.problem = "not valid JSON";
  } else if (!obj.is_object() || !obj.contains("text") || !obj["text"].is_string()) {
    out.problem = "no string field \"text\"";
  } else {
    out.text = obj["text"].get<std::string>();
    if (out.text.find_first_not_of(" \t\r\n\f\v") == std::string::npos) out.text.clear();
  }
  return out;
}

std::string pick(Rng& rng, const std::vector<std::string>& options) { return options[rng.below(options.size())]; }

std::string random_line(Rng& rng) {
  static const std::vector<std::string> kGoodParts = {
      "plain words", " ", "é", "日本", "🌴", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u0041",
      "\\u00e9", "\\u00E9", "\\u65e5", "\\ud83c\\udf34", "\\uD83C\\uDF34", "\\u0000", "\x7f", "'", "{}", ":"};
  static const std::vector<std::string> kBadParts = {"\\ud83c", "\\udf34", "\\ud83c\\u0041", "\\ud83cx", "\\u12",
                                                     "\\u12g4", "\\x", "\\", "\x01", "\t", "\n"};
  std::string value;
  const int parts = static_cast<int>(rng.below(8));
  for (int i = 0; i < parts; ++i) value += pick(rng, rng.below(8) == 0 ? kBadParts : kGoodParts);
  const std::string ws = pick(rng, {"", "", " ", "\t", "\r", " \n "});
  std::string line = pick(rng, {"", "", "", " ", "\xEF\xBB\xBF", "["}) + "{" + ws;
  line += pick(rng, {"\"text\"", "\"text\"", "\"text\"", "\"tex\\u0074\"", "\"Text\"", "\"id\": 3, \"text\""});
  line += pick(rng, {"", " "}) + ":" + ws;
  line += pick(rng, {"\"" + value + "\"", "\"" + value + "\"", "\"" + value + "\"", "\"" + value, "42", "null",
                     "[\"a\"]"});
  line += pick(rng, {"", "", "", ", \"id\": 1", ", \"text\": \"again\""}) + ws;
  line += pick(rng, {"}", "}", "}", "}}", ""});
  line += pick(rng, {"", "", "", " ", "\r", "x", "]"});
  return line;
}

TEST(JsonlText, EqualsNlohmannOnAwkwardLines) {
  Rng rng(41);
  int fast = 0;
  for (int i = 0; i < 60000; ++i) {
    const std::string line = random_line(rng);
    const ItemText want = reference(line);
    std::string text;
    if (simple_jsonl_text(line, text)) {
      ++fast;
      ASSERT_TRUE(want.problem.empty()) << "fast path took a line nlohmann refuses: " << line;
      ASSERT_EQ(text.find_first_not_of(" \t\r\n\f\v") == std::string::npos ? "" : text, want.text) << line;
    }
    const ItemText got = item_text(RawItem{.bytes = line, .kind = RawItem::kJsonLine});
    ASSERT_EQ(got.problem, want.problem) << line;
    ASSERT_EQ(got.text, want.text) << line;
  }
  EXPECT_GT(fast, 1000);  // about 1 line in 40 has the common shape and decodes
}

TEST(JsonlText, DecodesTheCommonShape) {
  std::string text;
  ASSERT_TRUE(simple_jsonl_text(R"({"text": "a\tb\n\u00e9\ud83c\udf34 \"q\" \\ \/"})", text));
  EXPECT_EQ(text, "a\tb\n\xC3\xA9\xF0\x9F\x8C\xB4 \"q\" \\ /");
  EXPECT_TRUE(simple_jsonl_text(" {\"text\":\"\"} \r", text));
  EXPECT_EQ(text, "");
  EXPECT_FALSE(simple_jsonl_text(R"({"text": "x", "id": 1})", text));  // other keys: nlohmann's
  EXPECT_FALSE(simple_jsonl_text(R"({"text": "\ud83c"})", text));      // lone surrogate: refused there
}

}  // namespace
}  // namespace atl
