// The save side of state_checkpoint.h: the plan on the training thread, the copy into staging
// and the part written on the background thread, the commit by the lowest live worker.
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>

#include "atoll/ckpt/background_writer.h"
#include "atoll/ckpt/checkpoint.h"
#include "atoll/ckpt/checkpoint_plan.h"
#include "atoll/ckpt/file_io.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/data/prepare.h"
#include "atoll/train/state_checkpoint.h"

namespace atl {
namespace {

using nlohmann::json;

// What one save needs once the training thread has let go: this worker's part (its planned
// tensors: first the live buffers, then, once the background thread copied them, the staging
// copy) and JSON values; on the committer, what it alone needs to assemble the manifest from
// every worker's part.
struct Snapshot {
  int64_t step = 0;
  int writer = 0;              // this worker's global index
  bool committer = false;      // rank 0 of the lowest live island
  std::vector<int> writers{};  // every live worker, ascending
  std::vector<PartTensor> tensors{};
  std::vector<uint64_t> source_xxh3{};  // ATOLL_CHECK_SNAPSHOT: each tensor's at save(), to check the copy
  json values = json::object();  // this worker's value of each JSON entry
  // Committer only.
  int islands = 1, workers_per_island = 1;
  std::vector<int> members{};  // live islands, ascending
  json entries = json::object();
  std::map<std::string, std::string> aliases{};
  std::vector<std::pair<std::string, Division>> json_entries{};
  std::map<std::pair<int, std::string>, json> absent{};  // (missing worker, entry) -> its value
  std::string tokenizer{};
};

// The manifest's "state": run-wide values from the committer's own, per island a list by island
// (from each live island's rank 0; a missing island: the first live island's), per worker a list
// by global worker index (a missing worker: its absent value, else the same rank of the first
// live island).
json assemble_state(const Snapshot& s, const std::map<int, json>& values) {
  json state = json::object();
  const int M = s.workers_per_island;
  auto live = [&](int island) { return std::find(s.members.begin(), s.members.end(), island) != s.members.end(); };
  for (const auto& [name, division] : s.json_entries) {
    if (division == Division::kRun) {
      state[name] = s.values.at(name);
      continue;
    }
    json list = json::array();
    for (int i = 0; i < s.islands; ++i) {
      const int from_island = live(i) ? i : s.members.front();
      if (division != Division::kPerWorker) {
        list.push_back(values.at(from_island * M).at(name));
        continue;
      }
      for (int r = 0; r < M; ++r) {
        auto absent = s.absent.find({i * M + r, name});
        list.push_back(!live(i) && absent != s.absent.end() ? absent->second : values.at(from_island * M + r).at(name));
      }
    }
    state[name] = list;
  }
  if (!s.tokenizer.empty()) state["tokenizer_fingerprint"] = s.tokenizer;
  return state;
}

uint64_t xxh3_of(const PartTensor& t) { return XXH3_64bits(t.data, t.numel * sizeof(float)); }

// Test hooks, read once per process (see state_checkpoint.h Checkpointer::fence).
bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

}  // namespace

StorePartExchange::StorePartExchange(const StoreOptions& store) : store_(std::make_unique<Store>(store)) {}

StorePartExchange::~StorePartExchange() = default;

std::string StorePartExchange::key(int64_t step, int writer) const {
  return store_->run_prefix() + "/ckpt/" + std::to_string(step) + "/" + std::to_string(writer);
}

void StorePartExchange::put(int64_t step, int writer, const json& part) { store_->set(key(step, writer), part.dump()); }

std::optional<std::vector<json>> StorePartExchange::collect(int64_t step, const std::vector<int>& writers) {
  std::vector<std::string> keys;
  for (int w : writers) keys.push_back(key(step, w));
  try {
    store_->wait(keys);
  } catch (const Timeout&) {
    return std::nullopt;
  }
  std::vector<json> parts;
  for (const auto& v : store_->get_many(keys)) {
    if (!v) return std::nullopt;
    parts.push_back(json::parse(*v));
  }
  for (const std::string& k : keys) store_->erase(k);
  return parts;
}

struct Checkpointer::Impl {
  const Config& cfg;
  std::string run_dir;
  TrainingState& state;
  CheckpointerOptions opts;
  std::vector<float> staging{};   // this worker's planned tensors of the save in flight (the writer thread's)
  std::deque<std::vector<float>> assembled{};  // sharded entries summed over the island
  std::string last_dir{};         // newest committed by this process (written by the writer thread)
  std::string tokenizer{};
  bool tokenizer_read = false;
  bool check_snapshot = false;  // ATOLL_CHECK_SNAPSHOT (always in debug builds)
  bool skip_fence = false;      // ATOLL_TEST_SKIP_CKPT_FENCE: a test shows what the fence prevents
  BackgroundWriter writer{};      // last: its thread stops before the rest goes

  Snapshot snapshot(const StatePlace& p);
  void copy(Snapshot& s);
  void write(const Snapshot& s);
};

Checkpointer::Checkpointer(const Config& cfg, std::string run_dir, TrainingState& s, CheckpointerOptions opts)
    : impl_(new Impl{.cfg = cfg, .run_dir = std::move(run_dir), .state = s, .opts = std::move(opts)}) {
#ifndef NDEBUG
  impl_->check_snapshot = true;
#endif
  impl_->check_snapshot = impl_->check_snapshot || env_set("ATOLL_CHECK_SNAPSHOT");
  impl_->skip_fence = env_set("ATOLL_TEST_SKIP_CKPT_FENCE");
  s.fence = [this] { (void)fence(); };
}

Checkpointer::~Checkpointer() { impl_->state.fence = [] {}; }

Snapshot Checkpointer::Impl::snapshot(const StatePlace& p) {
  const ParamLayout& layout = state.loop.engine->layout();
  const size_t n = layout.total();
  const int M = p.workers_per_island;
  Snapshot s{.step = state.loop.step, .writer = p.island * M + p.rank, .islands = p.islands, .workers_per_island = M};
  s.members = p.members;
  if (s.members.empty())
    for (int i = 0; i < p.islands; ++i) s.members.push_back(i);
  for (int i : s.members)
    for (int r = 0; r < M; ++r) s.writers.push_back(i * M + r);
  s.committer = s.writer == s.writers.front();
  ATOLL_CHECK(opts.exchange != nullptr || s.writers.size() == 1) << "a save of several workers needs a part exchange";

  // The copies to write, their holders, and this worker's data of each: element o of the
  // layout at base[o - lo] for lo <= o < hi (a ZeRO-1 shard's bounds; else the whole buffer).
  struct Held {
    const float* base = nullptr;
    size_t lo = 0, hi = 0;
  };
  std::vector<PlanCopy> copies;
  std::vector<Held> mine;
  assembled.clear();
  for (const StateEntry& e : state_registry(cfg, state.diloco != nullptr, &state)) {
    if (s.committer) s.entries[e.name] = describe_entry(e, p.islands, M);
    if (e.type == StateType::kJson) {
      s.values[e.name] = e.get();
      if (s.committer) s.json_entries.emplace_back(e.name, e.division);
      continue;
    }
    ATOLL_CHECK(e.division != Division::kPerWorker) << e.name << ": per-worker tensors are not saved yet";
    if (e.zero_shard) {  // ZeRO-1: each rank writes its own shard's tensors of its island's copy
      ATOLL_CHECK(e.division == Division::kReplicatedInIsland) << e.name;
      const std::vector<ZeroShard> shards = zero_shards(layout, M);
      for (int i : s.members) {
        std::vector<int> holders, writers;
        for (int r = 0; r < M; ++r) holders.push_back(i * M + r);
        for (const ParamEntry& pe : layout.entries())
          for (int r = 0; r < M; ++r)
            if (shards[r].contains(pe.offset)) writers.push_back(i * M + r);
        copies.push_back({island_kind(i, e.name), holders, writers});
        const ZeroShard mine_shard = e.zero_shard();
        mine.push_back(i == p.island ? Held{e.zero_data(), mine_shard.lo, mine_shard.hi} : Held{});
      }
      for (int i = 0; i < p.islands; ++i)
        if (std::find(s.members.begin(), s.members.end(), i) == s.members.end())
          for (const ParamEntry& pe : layout.entries())
            s.aliases[island_kind(i, e.name) + "/" + pe.name] = island_kind(s.members.front(), e.name) + "/" + pe.name;
      continue;
    }
    const float* data = e.data ? e.data() : nullptr;
    if (!data) {  // a sharded entry: the island's whole, summed from its ranks' disjoint shards (exact)
      ATOLL_CHECK(e.division == Division::kShardedInIsland) << e.name << ": only a shard is read, not shared";
      std::vector<float>& whole = assembled.emplace_back(n, 0.0f);
      e.read(whole.data());
      if (M > 1) p.inner->allreduce_sum(whole.data(), n);
      data = whole.data();
    }
    if (e.division == Division::kRun) {
      copies.push_back({e.name, s.writers});
      mine.push_back({data, 0, n});
      continue;
    }
    for (int i = 0; i < p.islands; ++i) {
      const std::string kind = island_kind(i, e.name);
      if (std::find(s.members.begin(), s.members.end(), i) == s.members.end()) {
        for (const ParamEntry& pe : layout.entries())
          s.aliases[kind + "/" + pe.name] = island_kind(s.members.front(), e.name) + "/" + pe.name;
        continue;
      }
      std::vector<int> holders;
      for (int r = 0; r < M; ++r) holders.push_back(i * M + r);
      copies.push_back({kind, holders});
      mine.push_back(i == p.island ? Held{data, 0, n} : Held{});
    }
  }

  // This worker's share, as pointers into the live buffers: the background thread copies them
  // (Impl::copy) while the next step reads them.
  const CheckpointPlan plan = plan_checkpoint(copies, layout);
  for (size_t c = 0; c < copies.size(); ++c)
    for (size_t e = 0; e < layout.entries().size(); ++e) {
      if (plan[c][e] != s.writer) continue;
      const ParamEntry& pe = layout.entries()[e];
      const Held& h = mine[c];
      ATOLL_CHECK(h.base != nullptr && pe.offset >= h.lo && pe.offset + pe.numel <= h.hi)
          << copies[c].kind << "/" << pe.name << " planned on a worker that does not hold it";
      s.tensors.push_back({copies[c].kind + "/" + pe.name, pe.shape, h.base + (pe.offset - h.lo), pe.numel});
      if (check_snapshot) s.source_xxh3.push_back(xxh3_of(s.tensors.back()));
    }
  if (s.committer) {
    for (int i = 0; i < p.islands; ++i) {
      if (std::find(s.members.begin(), s.members.end(), i) != s.members.end() || !p.absent_value) continue;
      for (int r = 0; r < M; ++r)
        for (const auto& [name, division] : s.json_entries)
          if (division == Division::kPerWorker)
            if (std::optional<json> v = p.absent_value(i, r, name)) s.absent[{i * M + r, name}] = *v;
    }
    // Not training state but what its tokens mean: the tokenizer of the data it trains on, so
    // that readers (eval, generate) can refuse data or a tokenizer of another.
    if (!tokenizer_read)
      tokenizer = dataset_tokenizer_fingerprint(state.loop.train_data.shard_paths().front()).value, tokenizer_read = true;
    s.tokenizer = tokenizer;
  }
  return s;
}

// On the background thread, first: the planned tensors copied from the live buffers into
// staging, then the training thread released (BackgroundWriter::fence returns). The training
// thread reads these buffers meanwhile but writes none of them before its fence, so the copy is
// the state at the save's step; ATOLL_CHECK_SNAPSHOT proves it for a run by comparing each
// copy's checksum with its source's at save().
void Checkpointer::Impl::copy(Snapshot& s) {
  size_t total = 0;
  for (const PartTensor& t : s.tensors) total += t.numel;
  staging.resize(total);
  size_t at = 0;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    PartTensor& t = s.tensors[i];
    std::memcpy(staging.data() + at, t.data, t.numel * sizeof(float));
    t.data = staging.data() + at;
    at += t.numel;
    if (i == 0) fault_checkpoint("copy");  // a copy begun, not finished: the step goes on meanwhile
  }
  if (s.tensors.empty()) fault_checkpoint("copy");
  writer.release();
  for (size_t i = 0; i < s.source_xxh3.size(); ++i)
    ATOLL_CHECK(xxh3_of(s.tensors[i]) == s.source_xxh3[i])
        << opts.who << ": " << s.tensors[i].name << " of the checkpoint of step " << s.step
        << " changed between save() and its copy: a write to saved state before Checkpointer::fence (a bug)";
}

// On the background thread, after the copy: the part, then (committer) every part and the commit.
void Checkpointer::Impl::write(const Snapshot& s) {
  const std::string tmp = checkpoint_temp_dir(run_dir, s.step, opts.token);
  // The only writer clears the folder of a crash's leftover and removes it if its write fails (a
  // full disk); with several, the committer abandons a save whose part did not arrive, and the
  // launcher's end or the next start removes the folder (train/run_dir.h remove_leftover_writes).
  const json part = opts.exchange ? write_checkpoint_part(tmp, s.writer, s.tensors) : write_only_checkpoint_part(tmp, s.tensors);
  if (opts.exchange) opts.exchange->put(s.step, s.writer, {{"part", part}, {"values", s.values}});
  if (!s.committer) return;
  std::vector<json> parts;
  std::map<int, json> values;
  if (!opts.exchange) {
    parts.push_back(part);
    values[s.writer] = s.values;
  } else {
    const std::optional<std::vector<json>> got = opts.exchange->collect(s.step, s.writers);
    if (!got) {  // a writer is lost: the run goes on from the previous checkpoint; the next start removes tmp
      log_warn(opts.who + ": checkpoint of step " + std::to_string(s.step) + " abandoned: not every worker's part " +
               "arrived within fault.timeout_s; the previous checkpoint stays the newest");
      return;
    }
    for (size_t i = 0; i < got->size(); ++i) {
      parts.push_back((*got)[i].at("part"));
      values[s.writers[i]] = (*got)[i].at("values");
    }
  }
  const std::string dir = commit_checkpoint({.run_dir = run_dir,
                                             .temp_dir = tmp,
                                             .step = s.step,
                                             .keep = cfg.checkpoint.keep,
                                             .islands = s.islands,
                                             .workers_per_island = s.workers_per_island,
                                             .entries = s.entries,
                                             .aliases = s.aliases},
                                            cfg, parts, assemble_state(s, values));
  last_dir = dir;
  if (opts.on_commit) opts.on_commit(dir, s.step);
}

SaveReport Checkpointer::save(const StatePlace& place) {
  const double t0 = now_s();
  SaveReport r;
  r.wait_s = 0;
  {
    const double w0 = now_s();
    impl_->writer.wait();  // the previous save first: saves never pile up
    r.wait_s = now_s() - w0;
  }
  fault_checkpoint_save();
  // Nothing trained on a damaged shard is saved: every shard's checksum is known first.
  impl_->state.loop.check_data(/*wait=*/true);
  // Parameters and moments from the GPU (a no-op on the CPU): the host copy the background
  // thread reads, which nothing writes before the fence (to_host is its only writer).
  impl_->state.loop.engine->to_host(kAllState);
  auto snap = std::make_shared<Snapshot>(impl_->snapshot(place));
  impl_->writer.submit([impl = impl_.get(), snap] {
    impl->copy(*snap);
    impl->write(*snap);
  });
  r.stall_s = now_s() - t0;
  if (const double w = impl_->writer.last_job_s(); w >= 0) r.write_s = w;
  return r;
}

std::optional<double> Checkpointer::fence() {
  if (impl_->skip_fence) return std::nullopt;
  return impl_->writer.fence();
}

std::string Checkpointer::finish() {
  impl_->writer.wait();
  return impl_->last_dir;
}

std::string save_training_state(const Config& cfg, const std::string& run_dir, TrainingState& s,
                                const StatePlace& place) {
  Checkpointer c(cfg, run_dir, s, {.token = uint64_t(::getpid())});
  c.save(place);
  return c.finish();
}

}  // namespace atl
