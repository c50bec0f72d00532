// `atoll eval --task` and train.eval_tasks (docs/tasks.md). The scores of the micro model on the
// task files shipped for the tests (tests/data/tasks) equal an independent computation:
// tests/reference/task_scores.py tokenises with SentencePiece itself, runs the numpy Mixtral
// forward of tests/reference/hf_moe.py on the model's Hugging Face export (exact lengths, no
// padding) and sums the endings' log-probabilities; it shares no code with atoll. Skipped without
// python3-numpy and python3-sentencepiece (scripts/setup.sh installs them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.h"

namespace atl::testing {
namespace {

using json = nlohmann::json;

std::string source(const std::string& rel) {
  const char* src = std::getenv("ATOLL_SOURCE_DIR");
  return std::string(src ? src : ".") + "/" + rel;
}
std::string tiny_mc() { return source("tests/data/tasks/tiny_mc.jsonl"); }
std::string tiny_hellaswag() { return source("tests/data/tasks/tiny_hellaswag.jsonl"); }

std::vector<json> json_lines(const std::string& text) {
  std::vector<json> out;
  size_t at = 0;
  for (size_t end; (end = text.find('\n', at)) != std::string::npos; at = end + 1)
    if (end > at) out.push_back(json::parse(text.substr(at, end - at)));
  return out;
}

std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (pclose(p) != 0) ADD_FAILURE() << cmd << " failed: " << out;
  return out;
}

class EvalTaskTest : public CliTest {};

// acc, acc_norm, items and the truncated count equal the reference's exactly; each ending's
// log-likelihood within 1e-5: atoll sums fp32 position losses (each lse - logit rounded to
// fp32, about 1e-7 relative of a loss near ln 384) over at most 32 positions, the reference in
// float64; they agree to about 1e-6, and a wrong position, shift or delimiter moves a sum by
// a whole token's log-probability (several nats).
TEST_F(EvalTaskTest, ScoresEqualIndependentLogLikelihoods) {
  if (std::system("/usr/bin/python3 -c 'import numpy, sentencepiece' 2>/dev/null") != 0)
    GTEST_SKIP() << "no python3-numpy or python3-sentencepiece (scripts/setup.sh installs them)";
  const std::string run = base_run(), hf = dir("hf"), details = dir("details.jsonl");
  const RunResult x = run_atoll({"export", "--checkpoint", run, "--format", "hf", "--out", hf});
  ASSERT_EQ(x.exit_code, 0) << x.describe();
  const RunResult e = run_atoll({"eval", "--checkpoint", run, "--task", tiny_mc(), "--task", tiny_hellaswag(),
                                 "--details", details});
  ASSERT_EQ(e.exit_code, 0) << e.describe();
  const std::vector<json> ours = json_lines(e.out), item_lines = json_lines(read_file(details));
  const std::vector<json> theirs = json_lines(run_command(
      "/usr/bin/python3 '" + source("tests/reference/task_scores.py") + "' '" + hf + "' '" + run +
      "/tokenizer.model' " + std::to_string(MicroWorld::kSeqLen) + " '" + tiny_mc() + "' '" + tiny_hellaswag() + "'"));
  ASSERT_EQ(ours.size(), 2u) << e.out;
  ASSERT_EQ(theirs.size(), 2u);
  size_t line = 0;
  int64_t truncated = 0;
  for (size_t t = 0; t < 2; ++t) {
    SCOPED_TRACE(theirs[t]["task"].get<std::string>());
    EXPECT_EQ(ours[t]["task"], theirs[t]["task"]);
    EXPECT_EQ(ours[t]["items"], theirs[t]["items"]);
    EXPECT_EQ(ours[t]["truncated"], theirs[t]["truncated"]);
    EXPECT_EQ(ours[t]["acc"].get<double>(), theirs[t]["acc"].get<double>());
    EXPECT_EQ(ours[t]["acc_norm"].get<double>(), theirs[t]["acc_norm"].get<double>());
    truncated += theirs[t]["truncated"].get<int64_t>();
    for (const json& ll : theirs[t]["loglik"]) {
      ASSERT_LT(line, item_lines.size());
      const json& mine = item_lines[line++]["loglik"];
      ASSERT_EQ(mine.size(), ll.size());
      for (size_t k = 0; k < ll.size(); ++k)
        EXPECT_NEAR(mine[k].get<double>(), ll[k].get<double>(), 1e-5) << "item " << line << " ending " << k;
    }
  }
  EXPECT_EQ(line, item_lines.size());
  EXPECT_EQ(ours[0]["items"], 20);
  EXPECT_GT(truncated, 0) << "no item's context was cut: the truncation is not exercised";
}

// Errors name the file, the line and the field; nothing is printed as a score.
TEST_F(EvalTaskTest, BadTaskFilesAreNamed) {
  const std::string run = base_run();
  struct Case {
    std::string text, want;
  };
  const std::string long_ending(200, 'x');
  const std::vector<Case> cases = {
      {"{\"context\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 0}\n{\"context\": \"a\", \"endings\": [\"b\"", ":2: not valid JSON"},
      {"{\"context\": \"a\", \"endings\": [\"b\", \"c\"]}\n", ":1: field \"label\": missing"},
      {"{\"context\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 2}\n", ":1: field \"label\": 2 is out of range for 2"},
      {"\n{\"context\": \"a\", \"endings\": [], \"label\": 0}\n", ":2: field \"endings\": holds 0 ending(s)"},
      {"{\"endings\": [\"b\", \"c\"], \"label\": 0}\n", ":1: field \"context\": missing"},
      {"{\"context\": \"a\", \"endings\": [\"b\", \"" + long_ending + "\"], \"label\": 0}\n",
       ":1: field \"endings[1]\": is "},
      {"", ": holds no items"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string file = dir("bad" + std::to_string(i) + ".jsonl");
    write_file(file, cases[i].text);
    const RunResult r = run_atoll({"eval", "--checkpoint", run, "--task", tiny_mc(), "--task", file});
    EXPECT_NE(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.err.find(file + cases[i].want), std::string::npos) << "case " << i << ": " << r.err;
    EXPECT_EQ(r.out.find("acc"), std::string::npos) << "a score printed before every file was checked: " << r.out;
  }
  const RunResult missing = run_atoll({"eval", "--checkpoint", run, "--task", dir("nothing.jsonl")});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nothing.jsonl"), std::string::npos) << missing.err;
  const RunResult twice = run_atoll({"eval", "--checkpoint", run, "--task", tiny_mc(), "--task", tiny_mc()});
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_NE(twice.err.find("task name \"tiny_mc\""), std::string::npos) << twice.err;
}

// train.eval_tasks scores the tasks at each evaluation (steps 2 and 4 of the micro run): the
// rows carry task/<name>/acc and acc_norm, equal to `atoll eval --task` on that step's
// checkpoint, and the TensorBoard file and the report take them as they take val_loss.
TEST_F(EvalTaskTest, TrainingWritesTaskScoresAtEachEvaluation) {
  const std::string run = dir("run");
  const RunResult t = world().train(run, {"--set", "train.eval_tasks=[\"" + tiny_mc() + "\"]"});
  ASSERT_EQ(t.exit_code, 0) << t.describe();
  std::vector<int64_t> steps;
  for (const json& row : read_jsonl(run + "/metrics.jsonl")) {
    if (!row.contains("task/tiny_mc/acc")) {
      EXPECT_FALSE(row.contains("val_loss")) << row.dump();  // every evaluation scores the tasks
      continue;
    }
    const int64_t step = row["step"].get<int64_t>();
    steps.push_back(step);
    char name[32];
    std::snprintf(name, sizeof name, "step-%08ld", long(step));
    const RunResult e = run_atoll({"eval", "--checkpoint", run + "/checkpoints/" + name, "--task", tiny_mc()});
    ASSERT_EQ(e.exit_code, 0) << e.describe();
    const json ours = json::parse(e.out);
    EXPECT_EQ(row["task/tiny_mc/acc"].get<double>(), ours["acc"].get<double>()) << "step " << step;
    EXPECT_EQ(row["task/tiny_mc/acc_norm"].get<double>(), ours["acc_norm"].get<double>()) << "step " << step;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4}));
  const std::string tb = run_command("python3 '" + source("tests/scripts/read_tfevents.py") + "' '" + run + "'");
  const json scalars = json::parse(tb)["scalars"];
  EXPECT_TRUE(scalars.contains("task/tiny_mc/acc") && scalars["task/tiny_mc/acc"].size() == 2) << tb;
  EXPECT_TRUE(scalars.contains("task/tiny_mc/acc_norm")) << tb;
  const std::string page = read_file(run + "/report.html");
  EXPECT_NE(page.find("task/tiny_mc/acc"), std::string::npos);
  EXPECT_EQ(page.find("does not chart (a newer or other format?): task/"), std::string::npos);

  // A task file that is not there stops the run before it trains, naming the key.
  const RunResult bad = world().train(dir("bad-run"), {"--set", "train.eval_tasks=[\"" + dir("none.jsonl") + "\"]"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("train.eval_tasks[0]"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace atl::testing
