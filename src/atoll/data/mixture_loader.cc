#include "atoll/data/mixture_loader.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/data/json_integer.h"

namespace atl {

namespace {

using json = nlohmann::json;

// Dataset i's shuffle seed: the run's seed for the first, so that a one-dataset stream is the
// plain loader's; mixed with i for the others, so that datasets are not shuffled alike.
uint64_t source_seed(uint64_t seed, size_t i) { return seed ^ (0xD1B54A32D192ED03ULL * i); }

// A phase's weights as integers of 30 bits, the largest 2^30 (none below 1), zero for datasets
// the phase does not draw from.
std::vector<int64_t> integer_weights(const DataPhase& phase, const std::vector<std::string>& dirs) {
  double top = 0;
  for (const MixSource& s : phase.mix) top = std::max(top, s.weight);
  std::vector<int64_t> w(dirs.size(), 0);
  for (const MixSource& s : phase.mix) {
    const size_t i = size_t(std::find(dirs.begin(), dirs.end(), s.dir) - dirs.begin());
    w[i] = std::max<int64_t>(1, std::llround(s.weight / top * double(int64_t{1} << 30)));
  }
  return w;
}

std::string dir_list(const std::vector<std::string>& dirs) {
  std::string s;
  for (const std::string& d : dirs) s += (s.empty() ? "" : ", ") + d;
  return "[" + s + "]";
}

}  // namespace

MixtureLoader::MixtureLoader(const std::vector<DataPhase>& phases, const std::string& split,
                             const LoaderOptions& options)
    : options_(options), split_(split), phases_(phases) {
  ATOLL_CHECK(!phases_.empty() && phases_.front().at_tokens == 0) << "phases";
  T_ = phase_seq_len(0);
  for (const DataPhase& p : phases_) {
    ATOLL_CHECK(!p.mix.empty()) << "empty phase";
    for (const MixSource& s : p.mix) {
      ATOLL_CHECK(s.weight > 0) << s.dir << " weight " << s.weight;
      if (std::find(dirs_.begin(), dirs_.end(), s.dir) == dirs_.end()) dirs_.push_back(s.dir);
    }
  }
  single_ = dirs_.size() == 1 && phases_.size() == 1;
  for (const DataPhase& p : phases_) int_weights_.push_back(integer_weights(p, dirs_));
  for (size_t i = 0; i < dirs_.size(); ++i) {
    LoaderOptions o = options;
    o.seq_len = T_;
    o.seed = source_seed(options.seed, i);
    o.prefetch = false;  // this loader prefetches whole batches
    try {
      sources_.push_back(std::make_unique<DataLoader>(dirs_[i], split, o));
    } catch (const DataError& e) {
      if (single_) throw;
      throw DataError("data mixture dataset " + dirs_[i] + ": " + e.what());
    }
    state_.sources.push_back(sources_.back()->cursor());
  }
  state_.picks.assign(dirs_.size(), 0);
  // A later phase's length must leave every dataset it reads a window for this worker: said now,
  // not when the phase starts.
  for (size_t p = 1; p < phases_.size(); ++p) {
    if (phase_seq_len(int(p)) == T_) continue;
    for (const MixSource& s : phases_[p].mix) {
      const int64_t w = count_windows(s.dir, split, phase_seq_len(int(p)));
      if (w <= options.worker)
        throw DataError("data.phases[" + std::to_string(p) + "].model.seq_len = " + std::to_string(phase_seq_len(int(p))) +
                        ": the " + split + " split of " + s.dir + " holds " + std::to_string(w) + " windows of " +
                        std::to_string(phase_seq_len(int(p)) + 1) + " tokens, none left for worker " +
                        std::to_string(options.worker) + " of " + std::to_string(options.n_workers) +
                        "; fix: a shorter model.seq_len for that phase, fewer workers or more data");
    }
  }
  prefetch_ = std::make_unique<BatchPrefetcher<MixCursor>>(
      [this](const MixCursor& from, int B, int32_t* inputs, int32_t* targets) { return fill(from, B, inputs, targets); },
      T_, options.prefetch);
}

int MixtureLoader::phase_seq_len(int phase) const {
  const DataPhase& p = phases_[size_t(std::max(0, phase))];
  return p.seq_len ? p.seq_len : options_.seq_len;
}

void MixtureLoader::rechunk(int seq_len) {
  prefetch_.reset();  // its thread reads the loaders replaced below
  for (size_t i = 0; i < sources_.size(); ++i) {
    LoaderOptions o = options_;
    o.seq_len = seq_len, o.seed = source_seed(options_.seed, i), o.prefetch = false;
    sources_[i] = std::make_unique<DataLoader>(dirs_[i], split_, o);
    sources_[i]->set_cursor(state_.sources[i]);  // the same share of its epoch, in windows of the new length
    state_.sources[i] = sources_[i]->cursor();
  }
  T_ = seq_len;
  prefetch_ = std::make_unique<BatchPrefetcher<MixCursor>>(
      [this](const MixCursor& from, int B, int32_t* inputs, int32_t* targets) { return fill(from, B, inputs, targets); },
      T_, options_.prefetch);
}

int MixtureLoader::enter_phase(int64_t tokens) {
  int p = 0;
  while (p + 1 < int(phases_.size()) && phases_[size_t(p) + 1].at_tokens <= tokens) ++p;
  if (p <= state_.phase) return -1;
  prefetch_->drop();
  state_.phase = p;
  state_.picks.assign(dirs_.size(), 0);
  if (phase_seq_len(p) != T_) rechunk(phase_seq_len(p));
  return single_ ? -1 : p;
}

size_t MixtureLoader::pick(const MixCursor& s) const {
  const std::vector<int64_t>& w = int_weights_[size_t(std::max(0, s.phase))];
  __int128 total = 0, n = 0;
  for (size_t i = 0; i < w.size(); ++i) total += w[i], n += s.picks[i];
  size_t best = 0;
  __int128 best_score = 0;
  bool found = false;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == 0) continue;
    const __int128 score = (n + 1) * w[i] - __int128(s.picks[i]) * total;
    if (!found || score > best_score) best = i, best_score = score, found = true;
  }
  return best;
}

MixCursor MixtureLoader::fill(const MixCursor& from, int B, int32_t* inputs, int32_t* targets) const {
  MixCursor s = from;
  if (single_) {
    s.sources[0] = sources_[0]->read_at(s.sources[0], B, inputs, targets);
    return s;
  }
  // Plan the batch (which dataset gives each window), then read each dataset's windows at once.
  std::vector<std::vector<int>> slots(dirs_.size());
  for (int b = 0; b < B; ++b) {
    const size_t i = pick(s);
    ++s.picks[i];
    slots[i].push_back(b);
  }
  std::vector<int32_t> x, y;
  for (size_t i = 0; i < dirs_.size(); ++i) {
    const int k = int(slots[i].size());
    if (k == 0) continue;
    x.resize(size_t(k) * T_), y.resize(size_t(k) * T_);
    s.sources[i] = sources_[i]->read_at(s.sources[i], k, x.data(), y.data());
    for (int j = 0; j < k; ++j) {
      std::copy_n(x.data() + int64_t{j} * T_, T_, inputs + int64_t{slots[i][j]} * T_);
      std::copy_n(y.data() + int64_t{j} * T_, T_, targets + int64_t{slots[i][j]} * T_);
    }
  }
  return s;
}

void MixtureLoader::next_batch(int B, int32_t* inputs, int32_t* targets) {
  state_ = prefetch_->next(state_, B, inputs, targets);
}

std::vector<double> MixtureLoader::shares() const {
  const std::vector<int64_t>& w = int_weights_[size_t(std::max(0, state_.phase))];
  double total = 0;
  for (int64_t x : w) total += double(x);
  std::vector<double> out;
  for (int64_t x : w) out.push_back(double(x) / total);
  return out;
}

json MixtureLoader::cursor_json() const {
  if (single_) return json(state_.sources[0]);
  json sources = json::array();
  for (size_t i = 0; i < dirs_.size(); ++i)
    sources.push_back({{"dir", dirs_[i]}, {"picks", state_.picks[i]}, {"cursor", state_.sources[i]}});
  return {{"phase", state_.phase}, {"sources", sources}};
}

std::string MixtureLoader::cursor_json_problem(const json& j) {
  try {
    if (!j.is_object() || !j.contains("sources")) {
      (void)j.get<Cursor>();
      return "";
    }
    int phase = 0;
    json_integer_to(j.at("phase"), phase);
    for (const json& s : j.at("sources")) {
      (void)s.at("dir").get<std::string>();
      int64_t picks = 0;
      json_integer_to(s.at("picks"), picks);
      (void)s.at("cursor").get<Cursor>();
    }
    return "";
  } catch (const json::exception& e) {
    return std::string("is not a data cursor (") + e.what() + ")";
  }
}

void MixtureLoader::set_cursor_json(const json& j) {
  const bool saved_mix = j.is_object() && j.contains("sources");
  if (saved_mix == single_) {
    throw DataError(std::string("the data cursor was saved for ") + (saved_mix ? "a data mixture" : "a single dataset") +
                    ", and this run reads " + (single_ ? "a single dataset" : "the mixture " + dir_list(dirs_)) +
                    "; fix: resume with the data settings (data.dir, data.mix, data.phases) the run was started with");
  }
  prefetch_->drop();
  if (single_) {
    sources_[0]->set_cursor(j.get<Cursor>());  // checks that it belongs to this stream
    state_.sources[0] = sources_[0]->cursor();
    state_.phase = -1;  // enter_phase sets it; one dataset has one phase
    return;
  }
  MixCursor s;
  s.phase = j.at("phase").get<int>();
  if (s.phase >= int(phases_.size()))
    throw DataError("the data cursor was saved in data phase " + std::to_string(s.phase) + ", but this run has " +
                    std::to_string(phases_.size()) + " phases; fix: resume with the run's data.phases");
  if (phase_seq_len(s.phase) != T_) rechunk(phase_seq_len(s.phase));  // the saved phase's windows
  s.picks.assign(dirs_.size(), 0);
  for (size_t i = 0; i < dirs_.size(); ++i) s.sources.push_back(sources_[i]->cursor());
  for (const json& saved : j.at("sources")) {
    const std::string dir = saved.at("dir").get<std::string>();
    const auto it = std::find(dirs_.begin(), dirs_.end(), dir);
    if (it == dirs_.end())
      throw DataError("the data cursor was saved for a mixture with dataset " + dir + ", which this run's mixture " +
                      dir_list(dirs_) + " lacks; fix: keep every dataset of the run in data.mix or data.phases");
    const size_t i = size_t(it - dirs_.begin());
    try {
      sources_[i]->set_cursor(saved.at("cursor").get<Cursor>());
    } catch (const DataError& e) {
      throw DataError("data mixture dataset " + dir + ": " + e.what());
    }
    s.sources[i] = sources_[i]->cursor();
    s.picks[i] = saved.at("picks").get<int64_t>();
  }
  state_ = s;
}

void MixtureLoader::check_vocab(int vocab_size) const {
  for (const auto& s : sources_) s->check_vocab(vocab_size);
}

}  // namespace atl
