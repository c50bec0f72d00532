#include "atoll/data/task_file.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "atoll/core/errors.h"
#include "atoll/core/user_path.h"

namespace atl {
namespace {

using json = nlohmann::json;

// "FILE:LINE: field "NAME": what; fix: ..." (the one shape of every error of a task file).
[[noreturn]] void bad(const std::string& origin, int64_t line, const std::string& field, const std::string& what) {
  throw DataError(origin + ":" + std::to_string(line) + ": " + (field.empty() ? "" : "field \"" + field + "\": ") +
                  what + "; fix: each line must be {\"context\": \"...\", \"endings\": [\"...\", \"...\"], \"label\": N} "
                  "(or HellaSwag's ctx/endings/label; docs/tasks.md)");
}

std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// The label as a number, or HellaSwag's string of digits (Hugging Face's copy of the file).
int label_of(const json& v, size_t n, const std::string& origin, int64_t line) {
  int64_t label = -1;
  if (v.is_number_integer()) {
    label = v.get<int64_t>();
  } else if (v.is_string() && !v.get<std::string>().empty() && v.get<std::string>().size() < 10 &&
             v.get<std::string>().find_first_not_of("0123456789") == std::string::npos) {
    label = std::stoll(v.get<std::string>());
  } else {
    bad(origin, line, "label", shown(v) + " is not an ending's index (a whole number, or a string of digits)");
  }
  if (label < 0 || label >= int64_t(n))
    bad(origin, line, "label", std::to_string(label) + " is out of range for " + std::to_string(n) +
                                   " endings (the first is 0)");
  return int(label);
}

TaskItem item_of(const json& row, const std::string& origin, int64_t line) {
  TaskItem item;
  item.line = line;
  const bool ours = row.contains("context"), theirs = row.contains("ctx");
  if (ours && theirs) bad(origin, line, "context", "the line has both \"context\" and \"ctx\"; keep one");
  if (!ours && !theirs) bad(origin, line, "context", "missing (\"context\", or HellaSwag's \"ctx\")");
  const char* ctx_key = ours ? "context" : "ctx";
  const json& ctx = row.at(ctx_key);
  if (!ctx.is_string()) bad(origin, line, ctx_key, shown(ctx) + " is not a string");
  item.context = ctx.get<std::string>();
  if (item.context.empty()) bad(origin, line, ctx_key, "empty (an ending is scored given its context)");
  if (!row.contains("endings")) bad(origin, line, "endings", "missing");
  const json& endings = row.at("endings");
  if (!endings.is_array()) bad(origin, line, "endings", shown(endings) + " is not a list of strings");
  if (endings.size() < 2)
    bad(origin, line, "endings", "holds " + std::to_string(endings.size()) + " ending(s); an item needs at least 2");
  for (size_t i = 0; i < endings.size(); ++i) {
    const std::string field = "endings[" + std::to_string(i) + "]";
    if (!endings[i].is_string()) bad(origin, line, field, shown(endings[i]) + " is not a string");
    if (endings[i].get<std::string>().empty()) bad(origin, line, field, "empty");
    item.endings.push_back(endings[i].get<std::string>());
  }
  if (!row.contains("label")) bad(origin, line, "label", "missing (the index of the correct ending)");
  item.label = label_of(row.at("label"), item.endings.size(), origin, line);
  return item;
}

// The ending as it follows the context: after one space unless it brings its own whitespace.
std::string continuation(const std::string& ending) {
  const char c = ending.front();
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return ending;
  std::string s = " ";
  return s += ending;
}

TaskItemTokens tokenize_item(const TaskItem& item, const Tokenizer& tok, int seq_len, const std::string& origin) {
  TaskItemTokens out{.label = item.label, .line = item.line};
  const std::vector<int32_t> ctx = tok.encode(item.context);
  if (ctx.empty()) bad(origin, item.line, "context", "tokenises to nothing");
  for (size_t i = 0; i < item.endings.size(); ++i) {
    const std::string field = "endings[" + std::to_string(i) + "]";
    const std::vector<int32_t> end = tok.encode(continuation(item.endings[i]));
    if (end.empty()) bad(origin, item.line, field, "tokenises to nothing");
    // The model sees seq_len inputs: context and ending fit in seq_len + 1 tokens, at least one
    // of them context (the first ending token is predicted from it).
    if (int64_t(end.size()) > seq_len)
      bad(origin, item.line, field, "is " + std::to_string(end.size()) + " tokens; model.seq_len = " +
                                        std::to_string(seq_len) + " leaves room for at most " +
                                        std::to_string(seq_len) + " (and one token of context)");
    const size_t keep = std::min(ctx.size(), size_t(seq_len) + 1 - end.size());
    out.truncated = out.truncated || keep < ctx.size();
    TaskSequence s{.ending_tokens = int(end.size()), .ending_bytes = item.endings[i].size()};
    s.tokens.assign(ctx.end() - int64_t(keep), ctx.end());
    s.tokens.insert(s.tokens.end(), end.begin(), end.end());
    out.endings.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::vector<TaskItem> parse_task_items(std::string_view text, const std::string& origin) {
  std::vector<TaskItem> items;
  int64_t line = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view s = text.substr(at, end - at);
    at = end + 1, ++line;
    if (s.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json row;
    try {
      row = json::parse(s);
    } catch (const json::parse_error& e) {
      bad(origin, line, "", "not valid JSON (at byte " + std::to_string(e.byte) + " of the line)");
    }
    if (!row.is_object()) bad(origin, line, "", "not a JSON object but " + shown(row));
    items.push_back(item_of(row, origin, line));
  }
  if (items.empty()) throw DataError(origin + ": holds no items; fix: one JSON object per line (docs/tasks.md)");
  return items;
}

std::string task_name(const std::string& path) {
  std::filesystem::path p(path);
  std::string name = p.filename().string();
  for (const char* ext : {".jsonl", ".json"})
    if (name.size() > std::string(ext).size() && name.ends_with(ext)) return name.substr(0, name.size() - std::string(ext).size());
  return name;
}

TaskSet load_task_set(const std::string& path, const Tokenizer& tok, int seq_len) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot be read; fix: pass a readable task file (docs/tasks.md)");
  std::stringstream ss;
  ss << in.rdbuf();
  TaskSet set{.name = task_name(path), .path = path};
  for (const TaskItem& item : parse_task_items(ss.str(), path)) {
    set.items.push_back(tokenize_item(item, tok, seq_len, path));
    set.truncated += set.items.back().truncated;
  }
  return set;
}

std::vector<TaskSet> load_task_sets(const std::vector<std::string>& paths, const std::string& what,
                                    const Tokenizer& tok, int seq_len) {
  std::vector<TaskSet> sets;
  std::map<std::string, std::string> named;  // name -> the entry that took it
  for (const PathEntry& e : list_entries(what, paths)) {
    check_input_file(e.path, e.key, "pass a task file (docs/tasks.md)");
    const std::string name = task_name(e.path), entry = e.key + " = \"" + e.path + "\"";
    if (named.count(name))
      throw DataError(entry + " has the task name \"" + name + "\" of " + named[name] +
                      "; fix: rename one file (a task's name is its file name, and names its metrics)");
    named[name] = entry;
    sets.push_back(load_task_set(e.path, tok, seq_len));
  }
  return sets;
}

}  // namespace atl
