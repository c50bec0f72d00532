#include "atoll/train/loop.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "atoll/core/check.h"
#include "atoll/core/collective.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/model/ring_attention.h"

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

// Every validation split must hold a window at every length the phases train at (validation
// follows the phase's length): said before the run starts.
void check_val_lengths(const Config& c, const MixtureLoader& data) {
  for (size_t p = 0; p < data.phases().size(); ++p) {
    const int T = config_in_phase(c, data.phases()[p]).model.seq_len;
    if (T == c.model.seq_len && p > 0) continue;
    for (const std::string& dir : data.dirs())
      if (has_val_split(dir) && count_windows(dir, "val", T) == 0)
        throw DataError("data.phases[" + std::to_string(p) + "].model.seq_len = " + std::to_string(T) +
                        ": the validation split of " + dir + " holds no window of " + std::to_string(T + 1) +
                        " tokens; fix: a shorter model.seq_len for that phase, or a larger validation split");
  }
}

// The group's sum of each rank's loss parts, added in rank order in double (every rank the same bits).
LossParts sum_over_group(const LossParts& mine, Collective& group) {
  const double mine3[3] = {mine.ce, mine.aux, mine.z};
  LossParts sum;
  for (const std::string& blob : group.allgather(std::string(reinterpret_cast<const char*>(mine3), sizeof mine3))) {
    ATOLL_CHECK_EQ(blob.size(), sizeof mine3);
    double p[3];
    std::memcpy(p, blob.data(), sizeof p);
    sum.ce += p[0], sum.aux += p[1], sum.z += p[2];
  }
  return sum;
}

// Validation and task scores run on whole sequences on the worker that evaluates alone (its
// group's other ranks are not in the call): context parallelism is off for the scope.
class WholeSequences {
 public:
  explicit WholeSequences(Loop& loop) : loop_(loop), cp_(loop.cp) {
    if (cp_) loop_.engine->set_context_parallel(nullptr);
  }
  ~WholeSequences() {
    if (cp_) loop_.engine->set_context_parallel(cp_);
  }

 private:
  Loop& loop_;
  Collective* cp_;
};

}  // namespace

Loop::Loop(const Config& c, const std::string& data_dir, const LoopOptions& opts)
    : run_cfg(c),
      cfg(config_in_phase(c, phases_of(c, data_dir).front())),
      train_data(phases_of(c, data_dir), "train",
                 {.seq_len = c.model.seq_len, .seed = uint64_t(c.train.seed), .worker = opts.worker,
                  .n_workers = opts.n_workers}),
      in(size_t(micro_batch(cfg.train)) * cfg.model.seq_len),
      tg(size_t(micro_batch(cfg.train)) * cfg.model.seq_len) {
  train_data.check_vocab(c.model.vocab_size);
  tasks = load_eval_tasks(cfg, train_data.dirs().front());
  if (train_data.phases().size() > 1) check_val_lengths(c, train_data);
  open_val_data();
  for (const auto& v : val_data)
    if (v) v->check_vocab(c.model.vocab_size);
  // A validation figure that leaves out a dataset it claims to cover, or that never comes, is
  // said once at the start (by the first worker), never left silent.
  if (opts.worker == 0) {
    for (const TaskSet& t : tasks)
      if (t.truncated > 0)
        log_warn("train.eval_tasks: " + t.path + ": " + std::to_string(t.truncated) + " of " +
                 std::to_string(t.items.size()) + " items lose context tokens from the left to fit model.seq_len = " +
                 std::to_string(cfg.model.seq_len));
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
  engine = make_engine(cfg, {.device_index = opts.device_index, .island_rank = opts.island_rank,
                           .island_size = opts.island_size});
}

void Loop::open_val_data() {
  val_data.clear();
  for (const std::string& dir : train_data.dirs()) {
    val_data.emplace_back();
    if (!has_val_split(dir)) continue;
    val_data.back() = std::make_unique<DataLoader>(
        dir, "val", LoaderOptions{.seq_len = cfg.model.seq_len, .shuffle = false, .prefetch = false});
  }
}

void Loop::enter_phase() {
  const int started = train_data.enter_phase(tokens);
  const DataPhase& phase = train_data.phases()[size_t(train_data.phase())];
  const Config now = config_in_phase(run_cfg, phase);
  nlohmann::json changes = nlohmann::json::array();
  auto note = [&](const char* key, auto was, auto is) {  // ints stay ints in the event
    if (was != is) changes.push_back({{"key", key}, {"was", was}, {"now", is}});
  };
  note("model.seq_len", cfg.model.seq_len, now.model.seq_len);
  note("model.rope_theta", cfg.model.rope_theta, now.model.rope_theta);
  note("train.batch_size", cfg.train.batch_size, now.train.batch_size);
  if (!changes.empty()) {
    const bool new_length = now.model.seq_len != cfg.model.seq_len;
    cfg = now;
    ATOLL_CHECK_EQ(train_data.seq_len(), cfg.model.seq_len) << "the loader re-chunks with the phase";
    engine->set_sequence(cfg.model.seq_len, cfg.model.rope_theta, micro_batch(cfg.train));
    in.assign(size_t(micro_batch(cfg.train)) * cfg.model.seq_len, 0);
    tg.assign(in.size(), 0);
    if (cp) set_context_parallel(cp);  // this rank's rows at the new length and batch
    if (new_length) open_val_data();
  }
  if (started < 0 || !on_data_phase) return;
  nlohmann::json mix = nlohmann::json::array();
  for (const MixSource& s : phase.mix) mix.push_back({{"dir", s.dir}, {"weight", s.weight}});
  nlohmann::json fields = {{"phase", started},
                           {"at_tokens", phase.at_tokens},
                           {"tokens", tokens},
                           {"step", step},
                           {"mix", mix},
                           {"seq_len", cfg.model.seq_len},
                           {"rope_theta", cfg.model.rope_theta},
                           {"batch_size", cfg.train.batch_size}};
  if (!changes.empty()) fields["changes"] = changes;
  on_data_phase(fields);
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
  LossParts loss;
  for (int i = 0; i < n_micro; ++i) {
    train_data.next_batch(mb, in.data(), tg.data());
    const int32_t *x = in.data(), *y = tg.data();
    double scale = 1.0 / n_micro;
    if (cp) {  // this rank's rows; its share of the group's gradient times P (loop.h)
      const ZigzagLayout z = context_layout(cfg.model.seq_len, cp->size());
      zigzag_take(cp_in.data(), in.data(), mb, 1, z, cp->rank());
      zigzag_take(cp_tg.data(), tg.data(), mb, 1, z, cp->rank());
      x = cp_in.data(), y = cp_tg.data(), scale *= cp->size();
    }
    LossParts part = engine->forward_backward(x, y, mb, scale);
    loss.ce += part.ce / n_micro, loss.aux += part.aux / n_micro, loss.z += part.z / n_micro;
  }
  return cp ? sum_over_group(loss, *cp) : loss;
}

void Loop::set_context_parallel(Collective* group) {
  engine->set_context_parallel(group);
  cp = group;
  const int Tr = group ? context_layout(cfg.model.seq_len, group->size()).local_len(group->rank()) : 0;
  cp_in.assign(size_t(micro_batch(cfg.train)) * Tr, 0);
  cp_tg.assign(size_t(micro_batch(cfg.train)) * Tr, 0);
}

bool Loop::has_val() const {
  return std::any_of(val_data.begin(), val_data.end(), [](const auto& v) { return v != nullptr; });
}

double Loop::validate() {
  const WholeSequences whole(*this);
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
  const WholeSequences whole(*this);
  std::vector<TaskScores> scores;
  const auto losses = [&](const int32_t* x, const int32_t* y, int B, float* l) { engine->forward(x, y, B, l); };
  for (const TaskSet& set : tasks) scores.push_back(score_task(set, losses, cfg.model.seq_len, micro_batch(cfg.train)));
  return scores;
}

}  // namespace atl
