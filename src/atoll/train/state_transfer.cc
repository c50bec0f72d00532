// State transfer to joiners (see state_transfer.h).
#include "atoll/train/state_transfer.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"
#include "atoll/dist/diloco.h"

namespace atl {
namespace {

using nlohmann::json;

bool transferred(const StateEntry& e) {
  if (e.division == Division::kPerWorker || e.division == Division::kShardedInIsland) return false;
  return e.type == StateType::kTensor ? bool(e.data || e.zero_shard) : bool(e.set);
}

// The entry's buffer: its own, or a ZeRO-1 shard read into `staged` (zeros elsewhere). Rank r
// of every island holds the same shard, and the outer group joins the ranks r: the source's
// shard is the one the joiner keeps (write, after the broadcast).
float* held(const StateEntry& e, std::vector<float>& staged, size_t n) {
  if (e.data) return e.data();
  staged.resize(n);
  e.read(staged.data());
  return staged.data();
}

// The root's bytes to everyone: length first, then the bytes.
std::string broadcast_text(ProcessGroup& g, const std::string& text, int root) {
  uint64_t size = text.size();
  g.broadcast(&size, sizeof size, root);
  std::string out = g.rank() == root ? text : std::string(size, '\0');
  g.broadcast(out.data(), size, root);
  return out;
}

[[noreturn]] void bad_message(const std::string& what, const std::string& problem) {
  throw PeerLost("state transfer: " + what + " " + problem + "; the peer runs another build or config");
}

// Why a JSON entry's check refuses the value ("" when it takes it; an entry without a check
// takes any value).
std::string value_problem(const StateEntry& e, const json& v) {
  const std::string problem = e.check ? e.check(v) : "";
  return problem.empty() ? "" : "entry '" + e.name + "' " + problem;
}

}  // namespace

std::vector<std::string> transferred_entries(const std::vector<StateEntry>& entries) {
  std::vector<std::string> names;
  for (const StateEntry& e : entries)
    if (transferred(e)) names.push_back(e.name);
  return names;
}

json parse_transfer_manifest(const std::string& text, const std::vector<StateEntry>& entries) {
  const json m = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object()) bad_message("the source's manifest", "is not a JSON object");
  for (const StateEntry& e : entries) {
    if (!transferred(e)) continue;
    const auto it = m.find(e.name);
    if (it == m.end() || !it->is_object()) bad_message("the source's manifest", "lacks entry '" + e.name + "'");
    if (e.type == StateType::kTensor) {
      const auto hash = it->find("hash");
      if (hash == it->end() || !hash->is_string())
        bad_message("the source's manifest", "entry '" + e.name + "' has no hash");
    } else {
      if (!it->contains("value")) bad_message("the source's manifest", "entry '" + e.name + "' has no value");
      if (const std::string p = value_problem(e, it->at("value")); !p.empty()) bad_message("the source's manifest", p);
    }
  }
  return m;
}

std::vector<std::string> parse_refusals(const std::string& text, const std::vector<StateEntry>& entries) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) bad_message("a worker's refusals", "are not a JSON list");
  std::vector<std::string> names;
  for (const json& name : j) {
    const bool known = name.is_string() && std::any_of(entries.begin(), entries.end(), [&](const StateEntry& e) {
                         return e.type == StateType::kTensor && transferred(e) && e.name == name.get<std::string>();
                       });
    if (!known) bad_message("a worker's refusals", "name " + name.dump() + ", not a tensor the transfer sends");
    names.push_back(name.get<std::string>());
  }
  return names;
}

json parse_worker_record(const std::string& record, const std::vector<StateEntry>& entries) {
  const json r = json::parse(record, nullptr, /*allow_exceptions=*/false);
  std::string problem = r.is_object() ? "" : "is not a JSON object";
  for (const StateEntry& e : entries)
    if (problem.empty() && e.division == Division::kPerWorker && r.contains(e.name)) problem = value_problem(e, r.at(e.name));
  if (!problem.empty())
    throw IoError("the worker record in the store " + problem + ": " + record.substr(0, 200) +
                  "; fix: the store holds another run's or another build's keys: start the run with a fresh store");
  return r;
}

TransferReport transfer_state(ProcessGroup& outer, const View& view, int island, const Config& cfg, TrainingState& s) {
  s.fence();  // the broadcast writes the receivers' state: the save in flight copies it first
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int> holders = view.holders();
  ATOLL_CHECK(!holders.empty()) << view.describe();
  const int root = view.position(holders.front());
  const bool source = outer.rank() == root, joining = view.is_joining(island);
  const size_t n = s.loop.engine->layout().total();
  const std::vector<StateEntry> entries = state_registry(cfg, true, &s);
  TransferReport report{.source = holders.front()};

  json manifest = json::object();
  std::vector<float> staged;  // a ZeRO-1 shard's entry, whole
  if (source)
    for (const StateEntry& e : entries) {
      if (!transferred(e)) continue;
      manifest[e.name] = e.type == StateType::kTensor ? json{{"hash", hash_floats(held(e, staged, n), n)}}
                                                       : json{{"value", e.get()}};
    }
  manifest = parse_transfer_manifest(broadcast_text(outer, manifest.dump(), root), entries);

  // The tensors go from the source to each joiner directly; the members that hold the state
  // already take no part (they wait in the round's all-gather), so none of them receives the
  // state again, and one stopped is no obstacle until that all-gather.
  std::vector<int> joiners;  // their ranks in the group
  for (int island_j : view.joining) joiners.push_back(view.position(island_j));
  std::vector<float> wire(source ? n : 0);
  std::vector<std::string> pending;
  for (const StateEntry& e : entries)
    if (transferred(e) && e.type == StateType::kTensor) pending.push_back(e.name);
  while (!pending.empty()) {
    if (++report.rounds > kTransferTries) {
      report.why = "tensor(s) refused " + std::to_string(kTransferTries) + " times";
      return report;
    }
    std::vector<std::string> mine;  // refused here
    for (const std::string& name : pending) {
      if (!source && !joining) break;  // a member: nothing to read, send or receive
      const StateEntry& e = *std::find_if(entries.begin(), entries.end(), [&](const StateEntry& x) { return x.name == name; });
      float* buffer = held(e, staged, n);
      if (source && fault_transfer_tensor()) {  // ATOLL_FAULT corrupt: one flipped byte on the wire only
        std::copy(buffer, buffer + n, wire.begin());
        reinterpret_cast<unsigned char*>(wire.data())[n * sizeof(float) / 2] ^= 0x5a;
        buffer = wire.data();
      }
      if (source)
        for (int j : joiners) outer.send(buffer, n * sizeof(float), j);
      else
        outer.recv(buffer, n * sizeof(float), root);
      report.bytes += n * sizeof(float);
      if (joining && hash_floats(buffer, n) != manifest.at(name).at("hash").get<std::string>()) mine.push_back(name);
      else if (joining && !e.data) e.write(buffer);
    }
    pending.clear();
    for (const std::string& blob : outer.allgather(json(mine).dump()))
      for (const std::string& name : parse_refusals(blob, entries))
        if (std::find(pending.begin(), pending.end(), name) == pending.end()) pending.push_back(name);
    for (const std::string& name : pending)
      if (std::find(report.refused.begin(), report.refused.end(), name) == report.refused.end())
        report.refused.push_back(name);
  }
  if (joining) {
    for (const StateEntry& e : entries) {
      if (transferred(e) && e.type == StateType::kJson) e.set(manifest.at(e.name).at("value"));
      if (e.division == Division::kShardedInIsland && e.type == StateType::kTensor && e.write) {
        const std::vector<float> zeros(n, 0.0f);  // the residual starts afresh (header comment)
        e.write(zeros.data());
      }
    }
  }
  report.ok = true;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string worker_record(const Config& cfg, TrainingState& s) {
  json r = json::object();
  for (const StateEntry& e : state_registry(cfg, true, &s))
    if (e.division == Division::kPerWorker && e.get) r[e.name] = e.get();
  return r.dump();
}

void restore_worker_record(const Config& cfg, TrainingState& s, const std::string& record) {
  const json r = parse_worker_record(record, state_registry(cfg, true, &s));
  for (const StateEntry& e : state_registry(cfg, true, &s))
    if (e.division == Division::kPerWorker && e.set && r.contains(e.name)) e.set(r[e.name]);
}

std::optional<json> record_value(const std::string& record, const std::string& entry) {
  const json r = json::parse(record, nullptr, false);
  if (r.is_discarded() || !r.contains(entry)) return std::nullopt;
  return r[entry];
}

TransferReport admit(ElasticGroup& elastic, const Config& cfg, TrainingState& s) {
  TransferReport report{.ok = true};
  while (!elastic.view().joining.empty()) {
    report = TransferReport{};
    if (!elastic.formed()) {
      report.why = "the group of " + elastic.view().describe() + " did not form: " + elastic.formation_error();
    } else {
      try {
        report = transfer_state(elastic.group(), elastic.view(), elastic.island(), cfg, s);
      } catch (const PeerLost& e) {
        report.why = e.what();
      } catch (const Timeout& e) {
        report.why = e.what();
      }
    }
    const Decision d = elastic.decide(kAdmitAttempt, report.ok, false);
    if (d.commit) {
      elastic.admitted();
      return report;
    }
    elastic.reform(kAdmitAttempt, report.ok ? d.why : report.why);
  }
  return report;
}

}  // namespace atl
