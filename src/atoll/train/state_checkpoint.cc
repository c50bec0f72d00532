#include "atoll/train/state_checkpoint.h"

#include <algorithm>
#include <deque>

#include "atoll/ckpt/checkpoint.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/data/prepare.h"

namespace atl {
namespace {

using nlohmann::json;

// What one save gathers and writes (worker 0), and the values it assembled on the way.
struct SaveWalk {
  const StatePlace& p;
  size_t n;                               // layout().total()
  std::vector<int> members;               // islands by outer group rank
  bool writer;                            // worker 0: rank 0 of members[0]
  std::deque<std::vector<float>> held{};  // assembled or gathered values (stable addresses)
  std::vector<CheckpointBuffer> buffers{};
  json state = json::object();

  // Island i's outer group rank, or -1 when it is missing (the writer's copy stands in).
  int slot(int island) const {
    const auto it = std::find(members.begin(), members.end(), island);
    return it == members.end() ? -1 : int(it - members.begin());
  }

  // One copy per island (from its rank 0), or worker 0's alone for a run-wide entry.
  void tensor(const StateEntry& e) {
    ATOLL_CHECK(e.division != Division::kPerWorker) << e.name << ": per-worker tensors are not saved yet";
    float* mine = e.data ? e.data() : nullptr;
    if (!mine) {
      e.read(held.emplace_back(n).data());
      if (e.division == Division::kShardedInIsland && p.workers_per_island > 1)
        p.inner->allreduce_sum(held.back().data(), n);  // the ranks' shards: disjoint, so the sum is exact
      mine = held.back().data();
    }
    ATOLL_CHECK(e.division != Division::kShardedInIsland || !e.data) << e.name << ": a shard is read, not shared";
    if (e.division == Division::kRun || p.islands == 1) {
      if (writer) buffers.push_back({e.name, mine});
      return;
    }
    if (p.rank != 0) return;
    float* all = writer ? held.emplace_back(members.size() * n).data() : nullptr;  // the writer's slot unused
    p.outer->gather(mine, n * sizeof(float), all, 0);
    if (!writer) return;
    for (int i = 0; i < p.islands; ++i) {
      const int g = slot(i);
      buffers.push_back({island_kind(i, e.name), g <= 0 ? mine : all + size_t(g) * n});
    }
  }

  // Run-wide: worker 0's value; per worker: a list by global worker index; otherwise a list by
  // island of each island's rank 0's value.
  void value(const StateEntry& e) {
    const std::string mine = e.get().dump();
    if (e.division == Division::kRun) {
      if (writer) state[e.name] = json::parse(mine);
      return;
    }
    std::string island = mine;
    if (e.division == Division::kPerWorker)
      island = json(p.workers_per_island > 1 ? p.inner->allgather(mine) : std::vector<std::string>{mine}).dump();
    if (p.rank != 0) return;
    const std::vector<std::string> all = p.islands > 1 ? p.outer->allgather(island) : std::vector<std::string>{island};
    if (!writer) return;
    json list = json::array();
    for (int i = 0; i < p.islands; ++i) {
      const int g = slot(i);
      const std::string& from_island = all[size_t(std::max(g, 0))];  // a missing island: the writer's
      if (e.division != Division::kPerWorker) {
        list.push_back(json::parse(from_island));
        continue;
      }
      const json workers = json::parse(from_island);
      ATOLL_CHECK_EQ(workers.size(), size_t(p.workers_per_island));
      for (int r = 0; r < p.workers_per_island; ++r) {
        std::optional<json> absent = g < 0 && p.absent_value ? p.absent_value(i, r, e.name) : std::nullopt;
        list.push_back(absent ? *absent : json::parse(workers[size_t(r)].get<std::string>()));
      }
    }
    state[e.name] = list;
  }
};

[[noreturn]] void refuse(const std::string& dir, const std::string& problem) {
  throw ConfigError("checkpoint " + dir + " " + problem);
}

// This worker's value of a JSON entry in the manifest's state (the shape already checked).
const json& saved_value(const json& state, const StateEntry& e, int island, int worker) {
  const json& v = state.at(e.name);
  if (e.division == Division::kRun) return v;
  return v.at(size_t(e.division == Division::kPerWorker ? worker : island));
}

// Version 1 in the current format: the shape and the loader cursors from its state, and the
// registry's entries that it holds (by name: a tensor kind, a state key). Its tensors are named
// as version 2 names them.
void upgrade_v1(json& m, const std::string& dir) {
  json& st = m["state"];
  if (!st.is_object())
    throw CorruptCheckpoint("checkpoint " + dir +
                            "/manifest.json: field 'state' is not an object; fix: resume from "
                            "an older checkpoint (or start a fresh --run-dir)");
  m["islands"] = st.value("islands", 1);
  m["workers_per_island"] = st.value("workers_per_island", 1);
  if (!st.contains("loaders") && st.contains("loader")) st["loaders"] = json::array({st["loader"]});
  Config every;  // the registry of a DiLoCo run with error feedback declares every entry v1 had
  every.diloco.error_feedback = true;
  json entries = json::object();
  for (const StateEntry& e : state_registry(every, /*diloco=*/true, nullptr)) {
    bool present = st.contains(e.name);
    if (e.type == StateType::kTensor) {
      const auto& tensors = m["tensors"].get_ref<const json::object_t&>();  // sorted by name
      auto it = tensors.lower_bound(e.name + "/");
      present = it != tensors.end() && it->first.rfind(e.name + "/", 0) == 0;
    }
    if (present) entries[e.name] = describe_entry(e, m["islands"].get<int>(), m["workers_per_island"].get<int>());
  }
  m["entries"] = entries;
}

}  // namespace

std::string save_training_state(const Config& cfg, const std::string& run_dir, TrainingState& s,
                                const StatePlace& place) {
  const ParamLayout& layout = s.loop.engine->layout();
  std::vector<int> members = place.members;
  if (members.empty())
    for (int i = 0; i < place.islands; ++i) members.push_back(i);
  SaveWalk walk{.p = place, .n = layout.total(), .members = members, .writer = members[0] == place.island && place.rank == 0};
  json entries = json::object();
  for (const StateEntry& e : state_registry(cfg, s.diloco != nullptr, &s)) {
    entries[e.name] = describe_entry(e, place.islands, place.workers_per_island);
    if (e.type == StateType::kTensor)
      walk.tensor(e);
    else
      walk.value(e);
  }
  if (!walk.writer) return "";
  // Not training state but what its tokens mean: the tokenizer of the data it trains on, so
  // that readers (eval, generate) can refuse data or a tokenizer of another.
  const TokenizerFingerprint tokenizer = dataset_tokenizer_fingerprint(s.loop.train_data.shard_paths().front());
  if (!tokenizer.value.empty()) walk.state["tokenizer_fingerprint"] = tokenizer.value;
  return save_checkpoint({.run_dir = run_dir,
                          .step = s.loop.step,
                          .keep = cfg.checkpoint.keep,
                          .islands = place.islands,
                          .workers_per_island = place.workers_per_island,
                          .entries = entries},
                         cfg, layout, walk.buffers, walk.state);
}

json read_training_manifest(const std::string& dir) {
  json m = read_checkpoint_manifest(dir);
  if (m.at("format_version").get<int>() == 1) upgrade_v1(m, dir);
  return m;
}

void check_resume(const json& manifest, const std::string& dir, const Config& cfg, int islands, int workers_per_island,
                  bool diloco) {
  const int n = manifest.value("islands", 0), m = manifest.value("workers_per_island", 0);
  if (n != islands || m != workers_per_island) {
    const std::string shape = std::to_string(n) + " islands x " + std::to_string(m) + " workers";
    const std::string resume = "--islands " + std::to_string(n) + " --workers-per-island " + std::to_string(m);
    if (!diloco)
      refuse(dir, "holds a run of " + shape +
                      ", not a single-process run (1 island x 1 worker); fix: resume it with "
                      "`atoll launch " +
                      resume + " --resume`, or start a new --run-dir");
    refuse(dir, "holds a run of " + shape + ", not --islands " + std::to_string(islands) + " --workers-per-island " +
                    std::to_string(workers_per_island) + "; fix: resume with " + resume);
  }
  const json& saved = manifest.at("entries");
  const json& state = manifest.at("state");
  for (const StateEntry& e : state_registry(cfg, diloco, nullptr)) {
    const std::string field = "manifest.json entries." + e.name;
    if (!saved.contains(e.name)) {
      if (e.if_absent.empty())
        refuse(dir, "has no " + e.name + " (" + e.what + "), which this run needs (" + field +
                        " is missing); fix: "
                        "resume from a checkpoint of this run, or start a new --run-dir");
      continue;
    }
    if (saved[e.name].value("division", "") != division_name(e.division))
      refuse(dir, "saved " + e.name + " divided '" + saved[e.name].value("division", "") +
                      "', this build divides it '" + division_name(e.division) + "' (" + field +
                      "); fix: use the atoll version that wrote it");
    if (e.type != StateType::kJson) continue;
    if (!state.contains(e.name))
      refuse(dir, "has no manifest.json state." + e.name + "; fix: resume from another checkpoint");
    const json& v = state[e.name];
    const size_t copies = saved[e.name].value("copies", size_t(1));
    if (e.division != Division::kRun && (!v.is_array() || v.size() != copies))
      refuse(dir, "manifest.json state." + e.name + " is not a list of " + std::to_string(copies) +
                      "; fix: resume from another checkpoint");
    for (const json& item : e.division == Division::kRun ? json::array({v}) : v) {
      const std::string problem = e.check ? e.check(item) : "";
      if (!problem.empty()) refuse(dir, "(manifest.json state." + e.name + ") " + problem);
    }
  }
}

void restore_training_state(const std::string& dir, const json& manifest, const Config& cfg, TrainingState& s,
                            const StatePlace& place) {
  const std::vector<StateEntry> entries = state_registry(cfg, s.diloco != nullptr, &s);
  const ParamLayout& layout = s.loop.engine->layout();
  const json& saved = manifest.at("entries");
  const int worker = place.island * place.workers_per_island + place.rank;
  std::deque<std::vector<float>> staged;
  std::vector<CheckpointBuffer> buffers;
  for (const StateEntry& e : entries) {
    if (e.type != StateType::kTensor || !saved.contains(e.name)) continue;
    const std::string kind = e.division == Division::kRun ? e.name : island_kind(place.island, e.name);
    buffers.push_back({kind, e.data ? e.data() : staged.emplace_back(layout.total()).data()});
  }
  load_checkpoint(dir, cfg.model, layout, buffers);  // every tensor validated before any is copied
  std::string absent, unused;
  for (const StateEntry& e : entries) {
    if (!saved.contains(e.name)) {
      ATOLL_CHECK(!e.if_absent.empty()) << e.name << ": check_resume lets no checkpoint without it through";
      if (e.type == StateType::kTensor || e.set)  // a derived value's absence changes nothing
        absent += (absent.empty() ? "" : "; ") + e.name + ": " + e.if_absent;
      if (e.on_absent) e.on_absent();
    } else if (e.type == StateType::kTensor && !e.data) {
      e.write(staged.front().data());
      staged.pop_front();
    } else if (e.type == StateType::kJson && e.set) {
      e.set(saved_value(manifest.at("state"), e, place.island, worker));
    }
  }
  for (const auto& [name, what] : saved.items())
    if (std::none_of(entries.begin(), entries.end(), [&](const StateEntry& e) { return e.name == name; }))
      unused += (unused.empty() ? "" : ", ") + name;
  if (worker != 0) return;
  if (!absent.empty()) log_warn("checkpoint " + dir + " was written by another kind of run: " + absent);
  if (!unused.empty()) log_info("checkpoint " + dir + " also holds " + unused + ", which this run does not use");
}

}  // namespace atl
