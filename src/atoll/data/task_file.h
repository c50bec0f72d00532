// Multiple-choice task files (docs/tasks.md): items of a context and several endings, one of
// them correct, scored by the log-likelihood of each ending given the context (train/task_eval.h),
// as llm.c's HellaSwag evaluation and the lm-evaluation-harness do.
//
// The format: one JSON object per line (blank lines are skipped, other fields are ignored):
//   {"context": "The sky is", "endings": ["blue.", "a fish."], "label": 0}
// HellaSwag's own field names are read as they are: "ctx" for the context (llm.c reads the same
// field), "endings", and "label" as a number or a string of digits (Hugging Face's copy). The
// file must hold at least one item; each item a non-empty context, at least two endings, each a
// non-empty string, and a label that indexes them. Every error is a DataError naming the file,
// the line and the field.
//
// Tokens: the context is encoded alone; each ending as " " + ending (lm-eval's default
// target_delimiter and llm.c's " " + ending), or as it is when it starts with whitespace. A
// sequence of context and ending longer than model.seq_len + 1 tokens loses context tokens from
// the left (the item counts as truncated); an ending that leaves no room for one context token
// is an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/data/tokenizer.h"

namespace atl {

struct TaskItem {
  std::string context;
  std::vector<std::string> endings;
  int label = 0;     // index into endings
  int64_t line = 0;  // 1-based line of the file
};

// The items of a task file's text; `origin` (the path) starts each error.
std::vector<TaskItem> parse_task_items(std::string_view text, const std::string& origin);

// A task's name: its file name without the folder and the .jsonl / .json extension.
std::string task_name(const std::string& path);

// One ending of an item as the model reads it: context then ending tokens, at most seq_len + 1.
struct TaskSequence {
  std::vector<int32_t> tokens{};  // inputs are tokens[0, n-1), targets tokens[1, n)
  int ending_tokens = 0;        // the last ending_tokens tokens are the ending's
  size_t ending_bytes = 0;      // UTF-8 bytes of the ending as written (acc_norm's divisor)
};

struct TaskItemTokens {
  std::vector<TaskSequence> endings{};
  int label = 0;
  int64_t line = 0;
  bool truncated = false;  // context tokens were dropped from the left to fit seq_len
};

struct TaskSet {
  std::string name{}, path{};
  std::vector<TaskItemTokens> items{};
  int64_t truncated = 0;  // items whose context was cut
};

// Reads, checks and tokenises a task file for a model of `seq_len` positions; throws DataError
// (file, line, field) for a bad file, PathError for a path that is not a readable file.
TaskSet load_task_set(const std::string& path, const Tokenizer& tok, int seq_len);

// Task files as a set: their names must differ (they name the metrics: task/<name>/acc).
std::vector<TaskSet> load_task_sets(const std::vector<std::string>& paths, const std::string& what,
                                    const Tokenizer& tok, int seq_len);

}  // namespace atl
