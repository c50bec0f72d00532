// `atoll eval`: the mean next-token loss of a checkpoint on token shards (DESIGN.md "Command line"),
// or with --task its scores on multiple-choice task files (train/task_eval.h, docs/tasks.md).
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "atoll/cli/checkpoint_model.h"
#include "atoll/cli/commands.h"
#include "atoll/cli/number_flags.h"
#include "atoll/config/toml_text.h"
#include "atoll/core/errors.h"
#include "atoll/core/file_writer.h"
#include "atoll/core/log.h"
#include "atoll/core/user_path.h"
#include "atoll/data/loader.h"
#include "atoll/data/task_file.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/model/model.h"
#include "atoll/train/dataset.h"
#include "atoll/train/task_eval.h"
#include "atoll/train/trainer.h"

namespace atl::cli {
namespace {

struct EvalResult {
  double loss = 0;     // mean cross-entropy per predicted token
  int64_t tokens = 0;  // predicted tokens evaluated
};

// The mean loss over the first `max_tokens` predicted tokens of the loader's windows (all of
// them when 0 or more than they hold), `batch` windows per forward pass. A count that ends
// inside a window evaluates that window's first n positions as a sequence of n tokens: the
// model is causal (and its RoPE angles depend on the position only), so their losses are the
// ones the whole window gives them.
// A forward pass of `batch` windows must fit in memory: the activations and scratch of the
// memory estimate at that batch (no gradients or optimizer state in eval), against what the
// machine has; a ConfigError naming --batch, instead of std::bad_alloc.
void check_eval_batch_fits(const ModelConfig& m, int batch) {
  Config c;
  c.model = m;
  c.train.batch_size = batch;
  c.train.micro_batch_size = 0;
  const MemoryEstimate e = estimate_memory(c);
  const double need = e.params * sizeof(float) + e.activations + e.scratch;
  const AvailableMemory have = available_host_memory();
  if (have.bytes <= 0 || need <= have.bytes) return;
  const int fits = int(std::max(1.0, batch * (have.bytes - e.params * sizeof(float)) / (e.activations + e.scratch)));
  throw ConfigError("eval --batch " + std::to_string(batch) + ": a forward pass of " + std::to_string(batch) +
                    " windows needs about " + bytes_text(need) + ", " + bytes_text(have.bytes) + " is available (" +
                    have.source + "); fix: pass a smaller --batch, e.g. --batch " + std::to_string(std::min(fits, batch - 1)));
}

EvalResult evaluate(const ModelConfig& m, std::vector<float>& params, DataLoader& loader, int64_t max_tokens,
                    int batch) {
  const int T = m.seq_len;
  const int64_t all = loader.n_windows() * T;
  const int64_t n = max_tokens > 0 ? std::min(max_tokens, all) : all;
  const int64_t windows = n / T;
  const int rest = int(n % T);
  // No pass holds more windows than there are: --batch 1048576 on a small shard costs nothing.
  batch = int(std::max<int64_t>(1, std::min<int64_t>(batch, windows)));
  check_eval_batch_fits(m, batch);
  std::vector<int32_t> in(size_t(batch) * T), tg(size_t(batch) * T);
  double sum = 0;
  {
    Model<float> model(m, batch);
    model.params().swap(params);  // lent, not copied: a model's parameters may be large
    for (int64_t done = 0; done < windows;) {
      const int b = int(std::min<int64_t>(batch, windows - done));
      loader.next_batch(b, in.data(), tg.data());
      sum += model.forward(in.data(), tg.data(), b).ce * b * T;
      done += b;
    }
    model.params().swap(params);
  }
  if (rest > 0) {
    ModelConfig part = m;
    part.seq_len = rest;
    Model<float> model(part, 1);
    model.params().swap(params);
    loader.next_batch(1, in.data(), tg.data());
    sum += model.forward(in.data(), tg.data(), 1).ce * rest;  // the window's first `rest` positions
    model.params().swap(params);
  }
  return {sum / double(n), n};
}

// The datasets `atoll eval` reads by default and their weights: data.dir (or the cache folder
// resolve_dataset names) alone, or for a mixture the phase the checkpoint was trained in
// (data.phases at its `tokens`), as training's val_loss weighs them.
std::vector<MixSource> default_eval_sets(const CheckpointModel& cm) {
  const std::vector<DataPhase> phases = data_phases(cm.config.data);
  if (phases.empty()) return {{.dir = resolve_dataset(cm.config).dir, .weight = 1.0}};
  const DataPhase* at = &phases.front();
  for (const DataPhase& p : phases)
    if (p.at_tokens <= cm.tokens) at = &p;
  return at->mix;
}

// `atoll eval --task`: one JSON line per task file; with `details`, one line per item there too
// (its file line, label and each ending's log-likelihood), for checking a score by hand.
void eval_tasks(CheckpointModel& cm, const std::vector<std::string>& files, const std::string& tokenizer,
                const std::string& details, int batch) {
  const Tokenizer tok = load_checkpoint_tokenizer(cm, tokenizer);
  const int T = cm.config.model.seq_len;
  const std::vector<TaskSet> sets = load_task_sets(files, "--task", tok, T);  // every file checked before any is scored
  std::string detail_lines;
  check_eval_batch_fits(cm.config.model, batch);
  Model<float> model(cm.config.model, batch);
  model.params().swap(cm.params);  // lent, not copied
  for (const TaskSet& set : sets) {
    const TaskScores s = score_task(
        set, [&](const int32_t* in, const int32_t* tg, int B, float* losses) { model.forward(in, tg, B, losses); }, T,
        batch);
    nlohmann::json out = task_json(s);
    out["file"] = set.path, out["checkpoint"] = cm.dir;
    if (s.truncated > 0)
      log_warn("eval: " + set.path + ": " + std::to_string(s.truncated) + " of " + std::to_string(s.items) +
               " items lost context tokens from the left to fit model.seq_len = " + std::to_string(T));
    std::printf("%s\n", out.dump().c_str());
    for (size_t i = 0; i < set.items.size(); ++i)
      detail_lines += nlohmann::json{{"task", set.name}, {"line", set.items[i].line}, {"label", set.items[i].label},
                                     {"loglik", s.loglik[i]}, {"truncated", set.items[i].truncated}}
                          .dump() + "\n";
  }
  model.params().swap(cm.params);
  if (!details.empty()) write_file_atomic(details, detail_lines);
}

}  // namespace

Runner add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "mean next-token loss of a checkpoint on a shard; prints one JSON object");
  struct Flags {
    std::string checkpoint, data, tokenizer, details;
    std::vector<std::string> tasks;
    int64_t tokens = 0;
    int batch = 8;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("--checkpoint", f->checkpoint, "checkpoint or run directory")->required();
  cmd->add_option("--data", f->data, "a .bin shard, or a folder (its val_*.bin); default: the run's validation split");
  cmd->add_option("--tokens", f->tokens,
                  "evaluate the first N predicted tokens, or all the shard holds if fewer (0 = the whole shard); "
                  "\"tokens\" in the output is the count evaluated")
      ->check(whole_number(0));
  cmd->add_option("--batch", f->batch, "sequences per forward pass")->check(whole_number(1, 1 << 20));
  auto* task = cmd->add_option("--task", f->tasks,
                               "a multiple-choice task file (JSONL, docs/tasks.md): prints its acc and acc_norm as one JSON "
                               "line instead of the loss (repeatable: one line per file)");
  cmd->add_option("--tokenizer", f->tokenizer, "with --task: tokenizer.model (default: the run's)")->needs(task);
  cmd->add_option("--details", f->details, "with --task: write each item's per-ending log-likelihoods here (JSONL)")
      ->needs(task);
  task->excludes("--data")->excludes("--tokens");
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    configure_threads(0);
    if (!f->data.empty()) check_input_file_or_dir(f->data, "--data", "pass a .bin shard or a prepared dataset's folder");
    CheckpointModel cm = load_checkpoint_model(f->checkpoint);
    if (!f->tasks.empty()) {
      eval_tasks(cm, f->tasks, f->tokenizer, f->details, f->batch);
      return 0;
    }
    const std::vector<MixSource> sets =
        f->data.empty() ? default_eval_sets(cm) : std::vector<MixSource>{{.dir = f->data, .weight = 1.0}};
    // A mixture: every dataset with a validation split, its loss and their mean by weight.
    nlohmann::json losses = nlohmann::json::object();
    double sum = 0, weight = 0;
    int64_t tokens = 0;
    nlohmann::json left_out = nlohmann::json::array();
    for (const MixSource& set : sets) {
      const std::string& data = set.dir;
      if (!has_val_split(data)) {
        if (sets.size() == 1)
          throw DataError("the data at " + data + " has no validation split (val_*.bin): " +
                          (f->data.empty() ? "the run was trained with data.val_fraction = " +
                                                 fmt_double(cm.config.data.val_fraction) + " or on shards without one"
                                           : std::string("--data names a folder without val_*.bin")) +
                          "; fix: pass --data a .bin shard or a folder with val_*.bin (a held-out text prepared with "
                          "the run's --tokenizer)");
        log_warn("eval: the mixture's loss leaves out " + data + ": it has no validation split (val_*.bin)");
        left_out.push_back(data);
        continue;
      }
      check_same_tokenizer(cm, dataset_tokenizer_fingerprint(data), "the data at " + data,
                           "pass --data made with the model's tokenizer (its run's data), or the --checkpoint of a "
                           "model trained on this data");
      DataLoader loader(data, "val", {.seq_len = cm.config.model.seq_len, .shuffle = false, .prefetch = false});
      loader.check_vocab(cm.config.model.vocab_size);
      const EvalResult r = evaluate(cm.config.model, cm.params, loader, f->tokens, f->batch);
      loader.check_integrity(/*wait=*/true);  // no loss of a damaged shard is reported
      losses[data] = r.loss;
      sum += set.weight * r.loss, weight += set.weight, tokens += r.tokens;
    }
    if (weight == 0)
      throw DataError("none of the mixture's datasets has a validation split (val_*.bin); fix: prepare them with a "
                      "validation share, or pass --data");
    const double loss = sum / weight;
    nlohmann::json out = {{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", tokens}, {"checkpoint", cm.dir},
                          {"data", sets.front().dir}};
    if (sets.size() > 1) out["data"] = "mixture", out["losses"] = losses;
    if (!left_out.empty()) out["left_out"] = left_out;  // never a mean that silently covers less
    std::printf("%s\n", out.dump().c_str());
    return 0;
  };
}

}  // namespace atl::cli
