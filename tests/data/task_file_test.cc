// The task file format (data/task_file.h, docs/tasks.md): our field names and HellaSwag's, and an
// error that names the file, the line and the field for each way a line can be wrong.
#include "atoll/data/task_file.h"

#include <gtest/gtest.h>

#include "atoll/core/errors.h"

namespace atl {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_task_items(text, "t.jsonl");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(TaskFile, ReadsOurFieldsAndHellaSwags) {
  const auto items = parse_task_items(
      "{\"context\": \"The sky is\", \"endings\": [\"blue.\", \"a fish.\"], \"label\": 0, \"other\": 1}\n"
      "\n  \r\n"
      "{\"ind\": 4, \"ctx\": \"A man\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": \"3\", \"split\": \"val\"}",
      "t.jsonl");
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].context, "The sky is");
  EXPECT_EQ(items[0].endings, (std::vector<std::string>{"blue.", "a fish."}));
  EXPECT_EQ(items[0].label, 0);
  EXPECT_EQ(items[0].line, 1);
  EXPECT_EQ(items[1].context, "A man");
  EXPECT_EQ(items[1].label, 3);
  EXPECT_EQ(items[1].line, 4);
  EXPECT_EQ(task_name("/a/b/hellaswag_val.jsonl"), "hellaswag_val");
  EXPECT_EQ(task_name("arc.json"), "arc");
}

TEST(TaskFile, EachErrorNamesLineAndField) {
  const std::string ok = "{\"context\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 1}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {ok + "{\"context\": \"a\",", "t.jsonl:2: not valid JSON"},
      {ok + "[1, 2]", "t.jsonl:2: not a JSON object"},
      {"{\"context\": \"a\", \"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 0}", "t.jsonl:1: field \"context\": the line has both"},
      {"{\"context\": 3, \"endings\": [\"b\", \"c\"], \"label\": 0}", "t.jsonl:1: field \"context\": 3 is not a string"},
      {"{\"context\": \"\", \"endings\": [\"b\", \"c\"], \"label\": 0}", "t.jsonl:1: field \"context\": empty"},
      {"{\"context\": \"a\", \"label\": 0}", "t.jsonl:1: field \"endings\": missing"},
      {"{\"context\": \"a\", \"endings\": \"b\", \"label\": 0}", "t.jsonl:1: field \"endings\": \"b\" is not a list"},
      {"{\"context\": \"a\", \"endings\": [\"b\"], \"label\": 0}", "t.jsonl:1: field \"endings\": holds 1 ending(s)"},
      {"{\"context\": \"a\", \"endings\": [\"b\", 7], \"label\": 0}", "t.jsonl:1: field \"endings[1]\": 7 is not a string"},
      {"{\"context\": \"a\", \"endings\": [\"\", \"c\"], \"label\": 0}", "t.jsonl:1: field \"endings[0]\": empty"},
      {"{\"context\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": -1}", "t.jsonl:1: field \"label\": -1 is out of range for 2"},
      {"{\"context\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": \"B\"}", "t.jsonl:1: field \"label\": \"B\" is not"},
      {"{\"context\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 1.5}", "t.jsonl:1: field \"label\": 1.5 is not"},
      {"\n\n", "t.jsonl: holds no items"},
  };
  for (const auto& [text, want] : cases) EXPECT_NE(error_of(text).find(want), std::string::npos) << text << " -> " << error_of(text);
  EXPECT_EQ(error_of(ok), "");
}

}  // namespace
}  // namespace atl
