#include "atoll/dist/diloco.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "atoll/core/check.h"
#include "atoll/core/fault_injection.h"
#include "atoll/core/timer.h"

namespace atl {
namespace {

// The island's counts: every rank's, summed (exact: integers in doubles, as text).
std::vector<double> island_sum(ProcessGroup& island, const std::vector<double>& mine) {
  std::string text;
  for (double c : mine) text += std::to_string(int64_t(c)) + " ";
  std::vector<double> sum(mine.size(), 0.0);
  for (const std::string& blob : island.allgather(text)) {
    std::istringstream in(blob);
    for (double& s : sum) {
      int64_t c = 0;
      in >> c;
      ATOLL_CHECK(!in.fail()) << "an island rank's expert counts";
      s += double(c);
    }
  }
  return sum;
}

// Per-slot sums of squares over the island's ranks, added in rank order (the same on every rank).
std::vector<double> island_sum_squares(ProcessGroup& island, const std::vector<double>& mine) {
  std::string text;
  char buf[40];
  for (double v : mine) std::snprintf(buf, sizeof buf, "%a ", v), text += buf;
  std::vector<double> sum(mine.size(), 0.0);
  for (const std::string& blob : island.allgather(text)) {
    std::istringstream in(blob);
    for (double& s : sum) {
      std::string v;
      in >> v;
      ATOLL_CHECK(!in.fail()) << "an island rank's expert norms";
      s += std::strtod(v.c_str(), nullptr);
    }
  }
  return sum;
}

}  // namespace

DilocoSync::DilocoSync(ProcessGroup& outer, const float* theta0, size_t n, const DilocoOptions& opts, FragmentPlan plan,
                       ProcessGroup* island)
    : opts_(opts), plan_(plan.ranges.empty() ? whole_plan(n) : std::move(plan)), theta_(theta0, theta0 + n),
      momentum_(n, 0.0f) {
  if (island != nullptr && island->size() > 1) {
    island_ = island;
    shard_ = island->rank();
    shards_ = island->size();
  }
  ATOLL_CHECK_EQ(plan_.total, n);
  const int P = plan_.count();
  make_rings(outer);
  delta_.resize(size_t(P));
  mean_.resize(size_t(P));
  for (int f = 0; f < P; ++f) delta_[size_t(f)].resize(plan_.size(f)), mean_[size_t(f)].resize(plan_.size(f));
  exchanged_.assign(size_t(P), 0);
  sent_.assign(size_t(P), 0);
  exchange_s_.assign(size_t(P), 0.0);
  outer_steps_.assign(size_t(P), 0);
  guarded_.assign(size_t(P), GuardResult{});
  sent_before_.resize(size_t(P));
  for (int f = 0; f < P && !opts_.experts.empty(); ++f) {
    const auto [lo, hi] = shard(f);
    shard_spans_.push_back(fragment_expert_spans(opts_.experts, plan_, f, lo, hi));
  }
  if (merges_experts()) {
    counts_.assign(size_t(P), std::vector<double>(opts_.expert_slots, 0.0));
    sending_ = counts_;
  }
  const int E = opts_.experts_per_layer;
  if (opts_.expert_topk > 0 && opts_.expert_topk < 1 && !opts_.experts.empty()) {
    ATOLL_CHECK(E > 0) << "diloco.expert_topk needs the experts per layer";
    int last = 0;
    for (const ExpertSpan& s : opts_.experts) last = std::max(last, s.slot);
    const size_t slots = size_t(last / E + 1) * size_t(E);  // whole layers
    for (int f = 0; f < P; ++f) {
      const auto [lo, hi] = shard(f);
      topk_.push_back(std::make_unique<ExpertTopk>(
          shard_spans_[size_t(f)], hi - lo, slots,
          TopkOptions{.experts_per_layer = E, .codec = opts_.ring.codec, .compress = opts_.ring.compress}));
    }
    unsent_.resize(size_t(P));
  }
}

void DilocoSync::add_expert_counts(const double* counts) {
  for (std::vector<double>& c : counts_)
    for (size_t s = 0; s < c.size(); ++s) c[s] += counts[s];
}

void DilocoSync::set_expert_counts(const std::vector<std::vector<double>>& counts) {
  ATOLL_CHECK(counts.size() == counts_.size()) << "expert counts of " << counts.size() << " fragments, not "
                                               << counts_.size();
  for (size_t f = 0; f < counts.size(); ++f) ATOLL_CHECK_EQ(counts[f].size(), opts_.expert_slots);
  counts_ = counts;
}

void DilocoSync::set_snapshot_counts(const std::vector<std::vector<double>>& counts) {
  ATOLL_CHECK(counts.size() == sending_.size())
      << "snapshot expert counts of " << counts.size() << " fragments, not " << sending_.size();
  for (size_t f = 0; f < counts.size(); ++f) ATOLL_CHECK_EQ(counts[f].size(), opts_.expert_slots);
  sending_ = counts;
}

DilocoSync::~DilocoSync() = default;

void DilocoSync::make_rings(ProcessGroup& outer) {
  const int rings = opts_.ring.error_feedback ? plan_.count() : 1;
  for (int r = 0; r < rings; ++r) rings_.push_back(std::make_unique<RingAllreduce>(outer, opts_.ring));
  outer_ = &outer;
}

RingAllreduce& DilocoSync::ring_of(int f) {
  ATOLL_CHECK(!rings_.empty()) << "DilocoSync: an exchange while detached from the outer group";
  return *rings_[rings_.size() == 1 ? 0 : size_t(f)];
}

const RingAllreduce& DilocoSync::ring(int f) const {
  ATOLL_CHECK(!rings_.empty()) << "DilocoSync: the ring read while detached from the outer group";
  return *rings_[rings_.size() == 1 ? 0 : size_t(f)];
}

void DilocoSync::detach() {
  if (rings_.empty()) return;
  parked_.clear();
  for (auto& r : rings_) parked_.push_back(r->residual());
  rings_.clear();  // their Gloo buffers and contexts go: the group's connections can close
  outer_ = nullptr;
}

void DilocoSync::rebind(ProcessGroup& outer) {
  detach();
  make_rings(outer);
  for (size_t r = 0; r < rings_.size(); ++r)
    if (!parked_[r].empty()) rings_[r]->set_residual(parked_[r].data(), parked_[r].size());
  parked_.clear();
}

void DilocoSync::discard(int f) {
  if (exchanged_[size_t(f)]) ring_of(f).undo_residual();
  if (exchanged_[size_t(f)] && sends_sparse()) topk_[size_t(f)]->undo();
  exchanged_[size_t(f)] = 0;
}

void outer_nesterov_step(float* theta, float* momentum, const float* mean_delta, size_t n, double lr,
                         double momentum_coef) {
  const float mu = static_cast<float>(momentum_coef), neg_lr = static_cast<float>(-lr);
  for (size_t i = 0; i < n; ++i) {
    const float m = std::fma(mu, momentum[i], mean_delta[i]);
    const float u = std::fma(mu, m, mean_delta[i]);
    momentum[i] = m;
    theta[i] = std::fma(neg_lr, u, theta[i]);
  }
}

void DilocoSync::snapshot(int f, const float* theta_local, const float* base) {
  float* d = delta_[size_t(f)].data();
  if (base == nullptr) base = theta_.data();
  for (const ElementRange& r : plan_.ranges[size_t(f)])
    for (size_t i = r.begin; i < r.end; ++i) *d++ = base[i] - theta_local[i];
  if (!merges_experts()) return;
  sending_[size_t(f)] = island_ != nullptr ? island_sum(*island_, counts_[size_t(f)]) : counts_[size_t(f)];
  std::fill(counts_[size_t(f)].begin(), counts_[size_t(f)].end(), 0.0);
}

bool DilocoSync::in_fragment(int f, const ExpertSpan& s) const {
  for (const ElementRange& r : plan_.ranges[size_t(f)])
    if (s.begin >= r.begin && s.end <= r.end) return true;
  return false;
}

std::pair<size_t, size_t> DilocoSync::shard(int f) const {
  return even_part(delta_[size_t(f)].size(), shard_, shards_);
}

void DilocoSync::pack(int f, const float* x, float* flat, size_t lo, size_t hi) const {
  size_t k = 0;  // flat position of the range's first element
  for (const ElementRange& r : plan_.ranges[size_t(f)]) {
    const size_t b = std::max(k, lo), e = std::min(k + r.size(), hi);
    if (b < e) std::memcpy(flat + b, x + r.begin + (b - k), (e - b) * sizeof(float));
    k += r.size();
  }
}

void DilocoSync::unpack(int f, const float* flat, float* x) const {
  for (const ElementRange& r : plan_.ranges[size_t(f)]) {
    std::memcpy(x + r.begin, flat, r.size() * sizeof(float));
    flat += r.size();
  }
}

void DilocoSync::share_shards(int f) {
  // Δ̄_f is spent: its buffer carries θ_f's shards, then m_f's.
  float* flat = mean_[size_t(f)].data();
  const auto [lo, hi] = shard(f);
  const std::vector<size_t> sizes = even_part_sizes(delta_[size_t(f)].size(), shards_);
  for (std::vector<float>* x : {&theta_, &momentum_}) {
    pack(f, x->data(), flat, lo, hi);
    island_->allgatherv(flat, sizes);
    unpack(f, flat, x->data());
  }
}

double DilocoSync::exchange(int f, int64_t as_step) {
  const double t0 = now_s();
  RingAllreduce& ring = ring_of(f);
  const uint64_t sent_before = ring.stats().bytes_sent;
  const auto [lo, hi] = shard(f);
  std::vector<float>& mean = mean_[size_t(f)];
  // Δ̄ in its own buffer: Δ_f stays for a retry if the outer step is not committed.
  std::copy(delta_[size_t(f)].begin() + std::ptrdiff_t(lo), delta_[size_t(f)].begin() + std::ptrdiff_t(hi),
            mean.begin() + std::ptrdiff_t(lo));
  exchanged_[size_t(f)] = 0;
  UpdateTag tag{.outer_step = as_step > 0 ? as_step : outer_step() + 1, .theta_hash = fragment_hash(f)};
  corrupt_for_fault(f, mean.data(), lo, hi, tag);
  // Both throw before anything of ours changed (mean_ is scratch: Δ_f stays for a retry).
  const ExpertWork experts{.counts = merges_experts() ? sending_[size_t(f)] : std::vector<double>{},
                           .spans = merges_experts() ? shard_spans_[size_t(f)] : std::vector<ExpertSpan>{}};
  guarded_[size_t(f)] = guard_update(*outer_, mean.data() + lo, hi - lo, tag, opts_.guard, round_,
                                     merges_experts() ? &experts : nullptr);
  const uint64_t frames = sends_sparse() ? exchange_sparse(f, ring, mean.data() + lo) : 0;
  if (!sends_sparse()) ring.mean(mean.data() + lo, hi - lo);
  exchanged_[size_t(f)] = 1;
  sent_[size_t(f)] = ring.stats().bytes_sent - sent_before + frames;
  exchange_s_[size_t(f)] = now_s() - t0;
  return exchange_s_[size_t(f)];
}

uint64_t DilocoSync::exchange_sparse(int f, RingAllreduce& ring, float* x) {
  ExpertTopk& topk = *topk_[size_t(f)];
  const GuardResult& guarded = guarded_[size_t(f)];
  // The island's ranks hold shards of the same experts: they choose from the island's norms.
  std::vector<double> norms = topk.squared_norms(x);
  if (island_ != nullptr) norms = island_sum_squares(*island_, norms);
  std::vector<bool> eligible(norms.size(), true);
  for (int s : guarded.unused_slots)  // expert_merge: no mean to send to (slots of expert-less layers too)
    if (size_t(s) < eligible.size()) eligible[size_t(s)] = false;
  bool kept = true;
  for (const UpdateIncident& i : guarded.incidents) kept = kept && !(i.kind == "dropped_update" && i.member == outer_->rank());
  const int E = opts_.experts_per_layer;
  const TopkResult res =
      topk.exchange(*outer_, x, choose_experts(norms, eligible, E, experts_to_send(opts_.expert_topk, E)), kept);
  dense_.resize(topk.dense_size());
  topk.gather_dense(x, dense_.data());
  ring.mean(dense_.data(), dense_.size());  // throws with the experts' residual not yet committed
  topk.scatter_dense(dense_.data(), x);
  topk.commit();
  unsent_[size_t(f)] = res.unsent;
  return res.bytes;
}

SyncResult DilocoSync::apply(int f, float* theta_local, double mixing) {
  ATOLL_CHECK(exchanged_[size_t(f)]) << "fragment " << f << " applied without an exchange";
  exchanged_[size_t(f)] = 0;
  const float* d = mean_[size_t(f)].data();
  const auto [lo, hi] = shard(f);
  // Experts no kept island used have no mean: their θ and m are put back after the step below.
  std::vector<std::pair<ExpertSpan, std::vector<float>>> kept_as_is;
  std::vector<int> keep = guarded_[size_t(f)].unused_slots;
  if (sends_sparse()) keep.insert(keep.end(), unsent_[size_t(f)].begin(), unsent_[size_t(f)].end());
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  for (int slot : keep)
    for (const ExpertSpan& s : opts_.experts)
      if (s.slot == slot && in_fragment(f, s)) {
        std::vector<float> was(theta_.begin() + std::ptrdiff_t(s.begin), theta_.begin() + std::ptrdiff_t(s.end));
        was.insert(was.end(), momentum_.begin() + std::ptrdiff_t(s.begin), momentum_.begin() + std::ptrdiff_t(s.end));
        kept_as_is.emplace_back(s, std::move(was));
      }
  size_t k = 0;  // flat position of the range's first element
  for (const ElementRange& r : plan_.ranges[size_t(f)]) {
    const size_t b = std::max(k, lo), e = std::min(k + r.size(), hi);
    if (b < e)
      outer_nesterov_step(theta_.data() + r.begin + (b - k), momentum_.data() + r.begin + (b - k), d + b, e - b,
                          opts_.outer_lr, opts_.outer_momentum);
    k += r.size();
  }
  for (const auto& [s, was] : kept_as_is) {
    std::copy_n(was.begin(), s.end - s.begin, theta_.begin() + std::ptrdiff_t(s.begin));
    std::copy_n(was.begin() + std::ptrdiff_t(s.end - s.begin), s.end - s.begin,
                momentum_.begin() + std::ptrdiff_t(s.begin));
  }
  if (island_ != nullptr) share_shards(f);
  const float a = float(mixing), b = float(1.0 - mixing);
  for (const ElementRange& r : plan_.ranges[size_t(f)]) {
    if (theta_local == nullptr) break;  // the delayed outer step merges nothing (outer_delay.h)
    if (mixing < 0) {
      std::memcpy(theta_local + r.begin, theta_.data() + r.begin, r.size() * sizeof(float));
    } else {  // the paper's merge: a·θ_local + (1 − a)·θ, one rounding per product (fma)
      for (size_t i = r.begin; i < r.end; ++i) theta_local[i] = std::fma(a, theta_local[i], b * theta_[i]);
    }
  }
  ++outer_steps_[size_t(f)];
  return {.outer_step = outer_step(),
          .fragment = f,
          .theta_hash = fragment_hash(f),
          .momentum_hash = fragment_momentum_hash(f),
          .bytes_sent = sent_[size_t(f)],
          .seconds = exchange_s_[size_t(f)],
          .incidents = guarded_[size_t(f)].incidents,
          .furthest_step = guarded_[size_t(f)].furthest_step,
          .round_tokens = guarded_[size_t(f)].tokens,
          .weight = guarded_[size_t(f)].weight};
}

void DilocoSync::corrupt_for_fault(int f, float* flat, size_t lo, size_t hi, UpdateTag& tag) {
  if (!fault_update_armed()) return;
  auto& [before, before_tag] = sent_before_[size_t(f)];
  const std::vector<float> now(flat + lo, flat + hi);
  const UpdateTag now_tag = tag;
  switch (fault_update()) {
    case FaultSpec::Update::kNan:
      std::fill(flat + lo, flat + hi, std::nanf(""));
      break;
    case FaultSpec::Update::kScale:
      for (size_t i = lo; i < hi; ++i) flat[i] *= 1e6f;
      break;
    case FaultSpec::Update::kFlip:
      for (size_t i = lo; i < hi; ++i) flat[i] = -flat[i];
      break;
    case FaultSpec::Update::kReplay:
      if (before.size() == hi - lo) std::copy(before.begin(), before.end(), flat + lo), tag = before_tag;
      break;
    case FaultSpec::Update::kNone:
      break;
  }
  before = now, before_tag = now_tag;  // what an honest exchange would have sent
}

SyncResult DilocoSync::sync(float* theta_local) {
  const double t0 = now_s();
  SyncResult res;
  uint64_t sent = 0;
  std::vector<UpdateIncident> incidents;
  for (int f = 0; f < fragments(); ++f) {
    snapshot(f, theta_local);
    exchange(f);
    res = apply(f, theta_local, -1.0);
    sent += res.bytes_sent;
    incidents.insert(incidents.end(), res.incidents.begin(), res.incidents.end());
  }
  res.incidents = incidents;
  if (fragments() > 1) {
    res.fragment = -1;
    res.theta_hash = theta_hash();
    res.momentum_hash = momentum_hash();
  }
  res.bytes_sent = sent;
  res.seconds = now_s() - t0;
  return res;
}

void DilocoSync::residual(float* out, int only) const {
  ATOLL_CHECK(opts_.ring.error_feedback);
  for (int f = 0; f < fragments(); ++f) {
    if (only >= 0 && f != only) continue;
    const auto [lo, hi] = shard(f);
    std::vector<float> flat(delta_[size_t(f)].size(), 0.0f);
    const std::vector<float>& r =
        rings_.empty() ? parked_[parked_.size() == 1 ? 0 : size_t(f)] : ring(f).residual();
    if (sends_sparse() && r.size() == topk_[size_t(f)]->dense_size())  // the ring's: the dense elements
      topk_[size_t(f)]->scatter_dense(r.data(), flat.data() + lo);
    else if (!sends_sparse() && r.size() == hi - lo)
      std::copy(r.begin(), r.end(), flat.begin() + std::ptrdiff_t(lo));  // else: none yet
    unpack(f, flat.data(), out);
  }
}

void DilocoSync::expert_residual(float* out, int only) const {
  ATOLL_CHECK(sends_sparse());
  for (int f = 0; f < fragments(); ++f) {
    if (only >= 0 && f != only) continue;
    const auto [lo, hi] = shard(f);
    std::vector<float> flat(delta_[size_t(f)].size(), 0.0f);
    topk_[size_t(f)]->residual(flat.data() + lo);
    unpack(f, flat.data(), out);
  }
}

void DilocoSync::set_expert_residual(const float* in) {
  ATOLL_CHECK(sends_sparse());
  for (int f = 0; f < fragments(); ++f) {
    const auto [lo, hi] = shard(f);
    float* flat = mean_[size_t(f)].data();  // scratch, as in set_residual
    pack(f, in, flat, lo, hi);
    topk_[size_t(f)]->set_residual(flat + lo);
  }
}

void DilocoSync::set_residual(const float* in) {
  ATOLL_CHECK(opts_.ring.error_feedback);
  for (int f = 0; f < fragments(); ++f) {
    const auto [lo, hi] = shard(f);
    float* flat = mean_[size_t(f)].data();  // scratch: an exchange overwrites it before any use
    pack(f, in, flat, lo, hi);
    if (std::all_of(flat + lo, flat + hi, [](float x) { return x == 0.0f; })) {
      ring_of(f).reset_residual();
    } else if (sends_sparse()) {  // the ring carries the dense elements only
      dense_.resize(topk_[size_t(f)]->dense_size());
      topk_[size_t(f)]->gather_dense(flat + lo, dense_.data());
      ring_of(f).set_residual(dense_.data(), dense_.size());
    } else {
      ring_of(f).set_residual(flat + lo, hi - lo);
    }
  }
}

int64_t DilocoSync::outer_step() const {
  int64_t s = 0;
  for (int64_t x : outer_steps_) s += x;
  return s;
}

void DilocoSync::set_fragment_outer_steps(const std::vector<int64_t>& s) {
  ATOLL_CHECK_EQ(s.size(), outer_steps_.size());
  outer_steps_ = s;
}

std::string hash_floats(const float* x, size_t n) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(x, n * sizeof(float))));
  return buf;
}

std::string DilocoSync::theta_hash() const { return hash_floats(theta_.data(), theta_.size()); }

std::string DilocoSync::momentum_hash() const { return hash_floats(momentum_.data(), momentum_.size()); }

std::string DilocoSync::fragment_hash(int f) const { return ranges_hash(theta_, f); }

std::string DilocoSync::fragment_momentum_hash(int f) const { return ranges_hash(momentum_, f); }

std::string DilocoSync::ranges_hash(const std::vector<float>& x, int f) const {
  // Streaming xxh3 over the ranges equals the one-shot hash of their concatenation, so with one
  // fragment this is the hash of the whole array.
  XXH3_state_t* s = XXH3_createState();
  ATOLL_CHECK(s != nullptr);
  XXH3_64bits_reset(s);
  for (const ElementRange& r : plan_.ranges[size_t(f)]) XXH3_64bits_update(s, x.data() + r.begin, r.size() * sizeof(float));
  const unsigned long long h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", h);
  return buf;
}

}  // namespace atl
