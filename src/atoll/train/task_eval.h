// Scores of multiple-choice tasks (data/task_file.h) by the log-likelihood of each ending given
// its context, as llm.c's HellaSwag evaluation and the lm-evaluation-harness score them:
//   loglik(ending) = Σ over the ending's tokens of log p(token | everything before it)
//   acc      = share of items whose correct ending has the largest loglik
//   acc_norm = the same with loglik divided by the ending's length in UTF-8 bytes
// (lm-eval's acc_norm divides by the ending's length in characters, the same for ASCII text;
// llm.c's divides by its tokens). A tie goes to the first ending, as numpy's argmax.
//
// Each ending is one sequence of the model's seq_len positions: context and ending tokens, then
// padding that the causal model never lets reach them (every part is causal and routes each
// token on its own), scored by the position losses of one forward pass (Model::forward).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "atoll/data/task_file.h"

namespace atl {

// Fills losses[B*T] with each position's cross-entropy for inputs and targets [B,T]
// (Model::forward's position_losses, or an Engine's).
using PositionLossFn = std::function<void(const int32_t* inputs, const int32_t* targets, int B, float* losses)>;

struct TaskScores {
  std::string name;
  int64_t items = 0, truncated = 0;
  double acc = 0, acc_norm = 0;
  std::vector<std::vector<double>> loglik{};  // [item][ending]
};

// Scores every item of `set`, `batch` sequences of seq_len positions per call of `losses`.
TaskScores score_task(const TaskSet& set, const PositionLossFn& losses, int seq_len, int batch);

// {"task", "items", "acc", "acc_norm", "truncated"}: a task's line of `atoll eval --task`.
nlohmann::json task_json(const TaskScores& s);

}  // namespace atl
