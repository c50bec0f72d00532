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

[[noreturn]] void refuse(const std::string& dir, const std::string& problem) {
  throw ConfigError("checkpoint " + dir + " " + problem);
}

// Version 1 in the current format: the shape and the loader cursors from its state, and the
// registry's entries that it holds (by name: a tensor kind, a state key). Its tensors are named
// as version 2 names them.
void upgrade_v1(json& m, const std::string& dir) {
  json& st = m["state"];
  if (!st.is_object())
    throw CorruptCheckpoint("checkpoint " + dir +
                            "/manifest.json: field 'state' is not an object; fix: use another checkpoint of "
                            "the run (`--resume` falls back to the newest intact one by itself)");
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

json read_training_manifest(const std::string& dir) {
  json m = read_checkpoint_manifest(dir);
  if (m.at("format_version").get<int>() == 1) upgrade_v1(m, dir);
  return m;
}

void check_resume(const json& manifest, const std::string& dir, const Config& cfg, int islands, int workers_per_island,
                  bool diloco) {
  const int n = manifest.value("islands", 0), m = manifest.value("workers_per_island", 0);
  if (!diloco && (n != islands || m != workers_per_island)) {
    const std::string shape = std::to_string(n) + " islands x " + std::to_string(m) + " workers";
    const std::string resume = "--islands " + std::to_string(n) + " --workers-per-island " + std::to_string(m);
    refuse(dir, "holds a run of " + shape +
                    ", not a single-process run (1 island x 1 worker); fix: resume it with "
                    "`atoll launch " +
                    resume + " --resume`, or start a new --run-dir");
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
  s.fence();  // a save in flight copies the state this overwrites first
  const std::vector<StateEntry> entries = state_registry(cfg, s.diloco != nullptr, &s);
  const ParamLayout& layout = s.loop.engine->layout();
  const json& saved = manifest.at("entries");
  const int worker = place.island * place.workers_per_island + place.rank;
  // Another shape (state_checkpoint.h): an island beyond the saved ones starts as a joiner, a
  // worker beyond the saved ones continues the cursor of saved worker w mod (N·M).
  const int saved_islands = manifest.value("islands", 1);
  const int saved_workers = saved_islands * manifest.value("workers_per_island", 1);
  const bool joiner = place.island >= saved_islands;
  auto kind_of = [&](const StateEntry& e) {
    if (e.division == Division::kRun) return e.name;
    return island_kind(joiner ? 0 : place.island, e.name);
  };
  auto restored = [&](const StateEntry& e) {  // a joiner's residual starts from zero
    return saved.contains(e.name) && !(joiner && e.division == Division::kShardedInIsland);
  };
  std::deque<std::vector<float>> staged;
  std::vector<CheckpointBuffer> buffers;
  for (const StateEntry& e : entries) {
    if (e.type != StateType::kTensor || !restored(e)) continue;
    buffers.push_back({kind_of(e), e.data ? e.data() : staged.emplace_back(layout.total()).data()});
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
      if (!restored(e)) continue;
      e.write(staged.front().data());
      staged.pop_front();
    } else if (e.type == StateType::kJson && e.set) {
      const json& v = manifest.at("state").at(e.name);
      if (e.division == Division::kRun) e.set(v);
      else if (e.division == Division::kPerWorker) e.set(v.at(size_t(worker % saved_workers)));
      else e.set(v.at(size_t(joiner ? 0 : place.island)));
    }
  }
  if (joiner && s.diloco && saved.contains("diloco_theta")) {  // a joiner's parameters: θ
    const std::vector<float>& theta = s.diloco->theta();
    std::copy(theta.begin(), theta.end(), s.loop.engine->host().params);
  }
  for (const auto& [name, what] : saved.items())
    if (std::none_of(entries.begin(), entries.end(), [&n = name](const StateEntry& e) { return e.name == n; }))
      unused += (unused.empty() ? "" : ", ") + name;
  if (worker != 0) return;
  if (!absent.empty()) log_warn("checkpoint " + dir + " was written by another kind of run: " + absent);
  if (!unused.empty()) log_info("checkpoint " + dir + " also holds " + unused + ", which this run does not use");
}

json describe_reshape(const json& manifest, int islands, int workers_per_island) {
  const int n = manifest.value("islands", 1), m = manifest.value("workers_per_island", 1);
  if (n == islands && m == workers_per_island) return nullptr;
  auto shape = [](int a, int b) { return std::to_string(a) + "x" + std::to_string(b); };
  json e = {{"from", shape(n, m)}, {"to", shape(islands, workers_per_island)},
            {"kept", "theta, outer momentum and counters; the parameters and moments of islands 0.." +
                         std::to_string(std::min(n, islands) - 1)}};
  if (islands > n)
    e["joined"] = "islands " + std::to_string(n) + ".." + std::to_string(islands - 1) +
                  " start as joiners: parameters from theta, moments from island 0's, residual zero";
  if (islands < n)
    e["dropped"] = "islands " + std::to_string(islands) + ".." + std::to_string(n - 1) +
                   ": their parameters, moments and residual (local progress since their last outer step)";
  e["data"] = n * m == islands * workers_per_island
                  ? "every worker continues its own cursor"
                  : "worker w continues saved worker (w mod " + std::to_string(n * m) +
                        ")'s cursor, mapped to the same share of the epoch (a few windows may repeat or be skipped)";
  return e;
}

}  // namespace atl
