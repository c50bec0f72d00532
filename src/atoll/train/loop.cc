#include "atoll/train/loop.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "atoll/core/errors.h"
#include "atoll/core/log.h"

namespace atl {

namespace {

// train.eval_tasks tokenised with the tokenizer of the data (a mixture's datasets share one).
std::vector<TaskSet> load_eval_tasks(const Config& c, const std::string& data_dir) {
  if (c.train.eval_tasks.empty()) return {};
  const std::string model = data_dir + "/tokenizer.model";
  if (!std::filesystem::exists(model))
    throw DataError("train.eval_tasks needs the text's tokenizer, and the data at " + data_dir +
                    " has no tokenizer.model (shards made elsewhere); fix: prepare the data with `atoll data prepare`, "
                    "or set train.eval_tasks = []");
  return load_task_sets(c.train.eval_tasks, "train.eval_tasks", Tokenizer::load(model), c.model.seq_len);
}

// The phases a run draws from: the config's mixture, or data_dir alone.
std::vector<DataPhase> phases_of(const Config& c, const std::string& data_dir) {
  std::vector<DataPhase> phases = data_phases(c.data);
  if (phases.empty()) phases.push_back({.at_tokens = 0, .mix = {{.dir = data_dir, .weight = 1.0}}});
  return phases;
}

}  // namespace

Loop::Loop(const Config& c, const std::string& data_dir, const LoopOptions& opts)
    : cfg(c),
      train_data(phases_of(c, data_dir), "train",
                 {.seq_len = c.model.seq_len, .seed = uint64_t(c.train.seed), .worker = opts.worker,
                  .n_workers = opts.n_workers}),
      in(size_t(micro_batch(c.train)) * c.model.seq_len),
      tg(size_t(micro_batch(c.train)) * c.model.seq_len) {
  train_data.check_vocab(c.model.vocab_size);
  tasks = load_eval_tasks(c, train_data.dirs().front());
  for (const std::string& dir : train_data.dirs()) {
    val_data.emplace_back();
    if (!has_val_split(dir)) continue;
    val_data.back() = std::make_unique<DataLoader>(dir, "val",
                                                   LoaderOptions{.seq_len = c.model.seq_len, .shuffle = false, .prefetch = false});
    val_data.back()->check_vocab(c.model.vocab_size);
  }
  // A validation figure that leaves out a dataset it claims to cover, or that never comes, is
  // said once at the start (by the first worker), never left silent.
  if (opts.worker == 0) {
    for (const TaskSet& t : tasks)
      if (t.truncated > 0)
        log_warn("train.eval_tasks: " + t.path + ": " + std::to_string(t.truncated) + " of " +
                 std::to_string(t.items.size()) + " items lose context tokens from the left to fit model.seq_len = " +
                 std::to_string(c.model.seq_len));
    const std::vector<std::string> dirs = train_data.dirs();
    if (!has_val() && c.train.eval_every > 0)
      log_warn("train.eval_every = " + std::to_string(c.train.eval_every) + ": no validation pass will run, the data (" +
               dirs.front() + ") has no validation split (val_*.bin); fix: prepare it with a validation share "
               "(data.val_fraction > 0), or set train.eval_every = 0");
    for (size_t i = 0; i < dirs.size() && dirs.size() > 1 && has_val(); ++i)
      if (!val_data[i])
        log_warn("val_loss leaves out " + dirs[i] + ": it has no validation split (val_*.bin); fix: prepare it with a "
                 "validation share (`atoll data prepare --val-fraction`)");
  }
  engine = make_engine(c, {.device_index = opts.device_index, .island_rank = opts.island_rank,
                           .island_size = opts.island_size});
}

void Loop::check_data(bool wait) const {
  train_data.check_integrity(wait);
  for (const auto& v : val_data)
    if (v) v->check_integrity(wait);
}

LossParts Loop::gradients(int batch) {
  const int mb = micro_batch(cfg.train);
  const int n_micro = batch / mb;
  check_data(/*wait=*/false);  // a damaged shard found so far stops the run here
  engine->zero_grads();
  if (const int p = train_data.enter_phase(tokens); p >= 0 && on_data_phase) {
    const DataPhase& phase = train_data.phases()[size_t(p)];
    nlohmann::json mix = nlohmann::json::array();
    for (const MixSource& s : phase.mix) mix.push_back({{"dir", s.dir}, {"weight", s.weight}});
    on_data_phase({{"phase", p}, {"at_tokens", phase.at_tokens}, {"tokens", tokens}, {"step", step}, {"mix", mix}});
  }
  LossParts loss;
  for (int i = 0; i < n_micro; ++i) {
    train_data.next_batch(mb, in.data(), tg.data());
    LossParts part = engine->forward_backward(in.data(), tg.data(), mb, 1.0 / n_micro);
    loss.ce += part.ce / n_micro, loss.aux += part.aux / n_micro, loss.z += part.z / n_micro;
  }
  return loss;
}

bool Loop::has_val() const {
  return std::any_of(val_data.begin(), val_data.end(), [](const auto& v) { return v != nullptr; });
}

double Loop::validate() {
  const int mb = micro_batch(cfg.train), T = cfg.model.seq_len;
  std::vector<int32_t> x(size_t(mb) * T), y(size_t(mb) * T);
  // One dataset's mean loss over its first eval_batches micro-batches.
  auto loss_of = [&](DataLoader& val) {
    const int64_t windows = std::min<int64_t>(int64_t(cfg.train.eval_batches) * mb, val.n_windows());
    val.reset();
    double sum = 0;
    for (int64_t done = 0; done < windows;) {
      const int b = int(std::min<int64_t>(mb, windows - done));
      val.next_batch(b, x.data(), y.data());
      sum += engine->forward(x.data(), y.data(), b).ce * b;
      done += b;
    }
    return sum / double(windows);
  };
  // Datasets outside the current phase are not measured; if none inside it has a validation
  // split, every dataset that has one counts alike.
  std::vector<double> share = train_data.shares();
  bool any = false;
  for (size_t i = 0; i < val_data.size(); ++i) any = any || (val_data[i] && share[i] > 0);
  if (!any) share.assign(share.size(), 1.0);
  val_losses.assign(val_data.size(), std::nan(""));
  double sum = 0, weight = 0;
  for (size_t i = 0; i < val_data.size(); ++i) {
    if (!val_data[i] || share[i] == 0) continue;
    val_losses[i] = loss_of(*val_data[i]);
    sum += share[i] * val_losses[i], weight += share[i];
  }
  return sum / weight;
}

std::vector<TaskScores> Loop::score_tasks() {
  std::vector<TaskScores> scores;
  const auto losses = [&](const int32_t* x, const int32_t* y, int B, float* l) { engine->forward(x, y, B, l); };
  for (const TaskSet& set : tasks) scores.push_back(score_task(set, losses, cfg.model.seq_len, micro_batch(cfg.train)));
  return scores;
}

}  // namespace atl
