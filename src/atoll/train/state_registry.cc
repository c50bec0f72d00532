#include "atoll/train/state_registry.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "atoll/core/check.h"
#include "atoll/model/layout.h"

namespace atl {
namespace {

using nlohmann::json;

// A counter saved as a JSON integer.
std::string integer_check(const json& v) { return v.is_number_integer() ? "" : "is not an integer"; }

// Error feedback's residual or the sparse exchange's, as a checkpoint saves it: with a delayed
// outer step's exchange in flight, as it was before that exchange (dist/delay_inputs.h); and back.
void read_residual(const TrainingState* s, DelayInputs::Residual which, float* out) {
  if (s->delay) return s->delay->inputs().read(*s->diloco, which, s->delay->pending_list(), out);
  if (which == DelayInputs::Residual::kRing) return s->diloco->residual(out);
  s->diloco->expert_residual(out);
}

void write_residual(TrainingState* s, DelayInputs::Residual which, const float* in) {
  if (which == DelayInputs::Residual::kRing) s->diloco->set_residual(in);
  else s->diloco->set_expert_residual(in);
  if (s->delay) s->delay->inputs().forget();
}

// diloco_delay_pending: a list of flags, one per fragment; a run of one fragment writes its flag
// alone (a checkpoint of one fragment reads as before fragments had their own).
nlohmann::json pending_json(const OuterDelay& delay) {
  const std::vector<bool>& p = delay.pending_list();
  return p.size() == 1 ? json(bool(p[0])) : json(p);
}

std::string pending_check(const Config& cfg, const json& v) {
  if (v.is_boolean() && cfg.diloco.fragments == 1) return "";
  if (v.is_array() && int(v.size()) == cfg.diloco.fragments &&
      std::all_of(v.begin(), v.end(), [](const json& b) { return b.is_boolean(); }))
    return "";
  const std::string n = v.is_array() ? std::to_string(v.size()) : "1";
  return "is " + v.dump() + ", not a true or false per fragment of diloco.fragments = " +
         std::to_string(cfg.diloco.fragments) + "; fix: resume with --set diloco.fragments=" + n;
}

// Expert counts saved as a list per fragment of a count per expert of each layer.
std::string expert_counts_check(const Config& cfg, const json& v) {
  const size_t slots = size_t(cfg.model.n_layers) * size_t(cfg.model.n_experts);
  if (!v.is_array() || int(v.size()) != cfg.diloco.fragments) return "is not a list per fragment";
  for (const json& f : v) {
    if (!f.is_array() || f.size() != slots) return "does not hold a count per expert of each layer";
    for (const json& c : f)
      if (!c.is_number() || c.get<double>() < 0) return "holds " + c.dump() + ", not a count";
  }
  return "";
}

}  // namespace

const char* division_name(Division d) {
  switch (d) {
    case Division::kRun: return "run";
    case Division::kPerIsland: return "per_island";
    case Division::kReplicatedInIsland: return "replicated_in_island";
    case Division::kShardedInIsland: return "sharded_in_island";
    case Division::kPerWorker: return "per_worker";
  }
  return "?";
}

// Every piece of training state, declared once. The accessors capture `live` (and `cfg`) and are
// called only by the walks that move values; the declarations alone serve the resume check.
std::vector<StateEntry> state_registry(const Config& cfg, bool diloco, TrainingState* live) {
  using D = Division;
  const auto T = StateType::kTensor, J = StateType::kJson;
  TrainingState* s = live;
  auto engine = [s]() -> Engine& { return *s->loop.engine; };
  std::vector<StateEntry> r;
  r.push_back({.name = "param", .type = T, .owner = "engine", .division = D::kReplicatedInIsland,
               .what = "the parameters", .data = [=] { return engine().host().params; }});
  r.push_back({.name = "adam_m", .type = T, .owner = "engine", .division = D::kReplicatedInIsland,
               .what = "the optimizer's first moment (Muon's momentum for hidden matrices)",
               .data = [=] { return engine().host().m; }});
  r.push_back({.name = "adam_v", .type = T, .owner = "engine", .division = D::kReplicatedInIsland,
               .what = "the optimizer's second moment", .data = [=] { return engine().host().v; }});
  if (s && s->loop.engine->zero1())  // ZeRO-1: the moments are this rank's shard (engine.h moments())
    for (StateEntry* e : {&r[1], &r[2]}) {
      const bool first = e->name == "adam_m";
      auto shard = [=] { return engine().moments().shard; };
      auto at = [=] { return first ? engine().moments().m : engine().moments().v; };
      e->data = nullptr;
      e->zero_shard = shard;
      e->zero_data = at;
      e->read = [=](float* out) {
        std::fill(out, out + engine().layout().total(), 0.0f);
        std::copy_n(at(), shard().size(), out + shard().lo);
      };
      e->write = [=](const float* in) { std::copy_n(in + shard().lo, shard().size(), at()); };
    }
  r.push_back({.name = "step", .type = J, .owner = "driver", .division = D::kRun, .what = "steps done",
               .get = [s] { return json(s->loop.step); },
               .set = [s](const json& v) { s->loop.step = v.get<int64_t>(); }, .check = integer_check});
  r.push_back({.name = "tokens", .type = J, .owner = "driver", .division = D::kRun,
               .what = "tokens trained on (every worker's)", .get = [s] { return json(s->loop.tokens); },
               .set = [s](const json& v) { s->loop.tokens = v.get<int64_t>(); }, .check = integer_check});
  r.push_back({.name = "optimizer_step", .type = J, .owner = "engine", .division = D::kRun,
               .what = "the optimizer's step count", .get = [=] { return json(engine().optimizer_steps()); },
               .set = [=](const json& v) { engine().set_optimizer_steps(v.get<int64_t>()); },
               .check = integer_check});
  r.push_back({.name = "loaders", .type = J, .owner = "loader", .division = D::kPerWorker,
               .what = "the training data cursor", .get = [s] { return s->loop.train_data.cursor_json(); },
               .set = [s](const json& v) { s->loop.train_data.set_cursor_json(v); },
               .check = [](const json& v) { return MixtureLoader::cursor_json_problem(v); }});
  if (!diloco) return r;
  r.push_back({.name = "diloco_theta", .type = T, .owner = "diloco", .division = D::kRun,
               .what = "DiLoCo's global parameters θ", .data = [s] { return s->diloco->theta().data(); },
               .if_absent = "θ starts from the restored parameters",
               .on_absent = [=] {
                 const float* p = engine().host().params;
                 std::copy(p, p + s->diloco->theta().size(), s->diloco->theta().begin());
               }});
  r.push_back({.name = "diloco_momentum", .type = T, .owner = "diloco", .division = D::kRun,
               .what = "DiLoCo's outer momentum", .data = [s] { return s->diloco->momentum().data(); },
               .if_absent = "the outer momentum starts from zero"});
  // With the delayed outer step the residuals are saved as they were before the exchange in
  // flight, which a resumed run redoes (dist/delay_inputs.h).
  if (cfg.diloco.error_feedback)
    r.push_back({.name = "diloco_residual", .type = T, .owner = "diloco", .division = D::kShardedInIsland,
                 .what = "the island's quantization residual (diloco.error_feedback)",
                 .read = [s](float* out) { read_residual(s, DelayInputs::Residual::kRing, out); },
                 .write = [s](const float* in) { write_residual(s, DelayInputs::Residual::kRing, in); },
                 .if_absent = "the quantization residual starts from zero"});
  if (cfg.diloco.expert_topk > 0 && cfg.diloco.expert_topk < 1)
    r.push_back({.name = "diloco_expert_residual", .type = T, .owner = "diloco", .division = D::kShardedInIsland,
                 .what = "the island's experts not yet sent, and their quantization error (diloco.expert_topk)",
                 .read = [s](float* out) { read_residual(s, DelayInputs::Residual::kExperts, out); },
                 .write = [s](const float* in) { write_residual(s, DelayInputs::Residual::kExperts, in); },
                 .if_absent = "the expert residual starts from zero"});
  if (cfg.diloco.expert_merge == "tokens")
    r.push_back({.name = "diloco_expert_counts", .type = J, .owner = "diloco", .division = D::kPerWorker,
                 .what = "this worker's tokens per expert since each fragment's last outer step (diloco.expert_merge)",
                 .get = [s] { return json(s->diloco->expert_counts()); },
                 .set = [s](const json& v) { s->diloco->set_expert_counts(v.get<std::vector<std::vector<double>>>()); },
                 .check = [&cfg](const json& v) { return expert_counts_check(cfg, v); },
                 .if_absent = "the expert counts of the round in progress start from zero"});
  // The delayed outer step (dist/outer_delay.h): a checkpoint is taken right after an exchange
  // started (DilocoHook::can_checkpoint), so the Δs in flight (one per fragment) and the island's
  // eager starts are saved, and a resumed run starts those exchanges again
  // (StreamingDiloco::resume_in_flight).
  if (cfg.diloco.outer_delay > 0) {
    r.push_back({.name = "diloco_delay_pending", .type = J, .owner = "diloco", .division = D::kRun,
                 .what = "whether each fragment's Δ awaits its mean (diloco.outer_delay)",
                 .get = [s] { return pending_json(*s->delay); },
                 .set = [s](const json& v) {
                   if (v.is_boolean()) s->delay->set_pending(v.get<bool>());
                   else s->delay->set_pending_list(v.get<std::vector<bool>>());
                 },
                 .check = [&cfg](const json& v) { return pending_check(cfg, v); },
                 .if_absent = "nothing is in flight: the next round starts from θ",
                 .on_absent = [s] { s->delay->set_pending(false); }});
    r.push_back({.name = "diloco_delay_delta", .type = T, .owner = "diloco", .division = D::kReplicatedInIsland,
                 .what = "the island's Δs whose exchanges are in flight, in θ's layout (diloco.outer_delay)",
                 .data = [s] { return s->delay->layout_delta(*s->diloco); },
                 .if_absent = "nothing is in flight"});
    r.push_back({.name = "diloco_delay_start", .type = T, .owner = "diloco", .division = D::kReplicatedInIsland,
                 .what = "where the island's round began, its eager start (diloco.outer_delay)",
                 .data = [s] { return s->delay->start().data(); },
                 .if_absent = "nothing is in flight: the round starts from θ"});
    // The island's expert counts (its ranks' summed) that the exchange in flight carries.
    if (cfg.diloco.expert_merge == "tokens")
      r.push_back({.name = "diloco_delay_expert_counts", .type = J, .owner = "diloco", .division = D::kPerIsland,
                   .what = "the island's tokens per expert that the exchange in flight carries (diloco.outer_delay)",
                   .get = [s] { return json(s->diloco->snapshot_counts()); },
                   .set = [s](const json& v) {
                     s->diloco->set_snapshot_counts(v.get<std::vector<std::vector<double>>>());
                   },
                   .check = [&cfg](const json& v) { return expert_counts_check(cfg, v); },
                   .if_absent = "the exchange in flight weighs no expert: each keeps θ"});
  }
  r.push_back({.name = "fragment_outer_steps", .type = J, .owner = "diloco", .division = D::kRun,
               .what = "outer steps done per fragment",
               .get = [s] { return json(s->diloco->fragment_outer_steps()); },
               .set = [s](const json& v) { s->diloco->set_fragment_outer_steps(v.get<std::vector<int64_t>>()); },
               .check = [&cfg](const json& v) -> std::string {
                 if (!v.is_array()) return "is not a list";
                 for (const json& n : v)
                   if (!n.is_number_integer()) return "holds " + n.dump() + ", not a count";
                 if (int(v.size()) == cfg.diloco.fragments) return "";
                 const std::string p = std::to_string(v.size());
                 return "was written with diloco.fragments = " + p + ", not " + std::to_string(cfg.diloco.fragments) +
                        "; fix: resume with --set diloco.fragments=" + p;
               },
               .if_absent = "the outer step counts start from zero"});
  r.push_back({.name = "outer_step", .type = J, .owner = "diloco", .division = D::kRun,
               .what = "outer steps done (the sum of fragment_outer_steps)",
               .get = [s] { return json(s->diloco->outer_step()); }, .check = integer_check,
               .if_absent = "derived from fragment_outer_steps"});
  return r;
}

json describe_entry(const StateEntry& e, int islands, int workers_per_island) {
  int copies = islands;
  if (e.division == Division::kRun) copies = 1;
  if (e.division == Division::kPerWorker) copies = islands * workers_per_island;
  return {{"type", e.type == StateType::kTensor ? "tensor" : "json"},
          {"owner", e.owner},
          {"division", division_name(e.division)},
          {"copies", copies}};
}

double checkpoint_bytes_estimate(const Config& cfg, int islands, int workers_per_island) {
  const double floats = double(ParamLayout::build(cfg.model).total());
  double bytes = 0;
  for (const StateEntry& e : state_registry(cfg, /*diloco=*/true, nullptr))
    if (e.type == StateType::kTensor)
      bytes += describe_entry(e, islands, workers_per_island)["copies"].get<double>() * floats * sizeof(float);
  return bytes;
}

std::string island_kind(int island, const std::string& name) {
  return island == 0 ? name : "island" + std::to_string(island) + "_" + name;
}

std::string state_hash(const std::vector<StateEntry>& entries, const ParamLayout& layout,
                       const std::vector<Division>& divisions) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h(XXH3_createState(), XXH3_freeState);
  ATOLL_CHECK(h != nullptr);
  XXH3_64bits_reset(h.get());
  std::vector<float> staged;
  for (const StateEntry& e : entries) {
    if (std::find(divisions.begin(), divisions.end(), e.division) == divisions.end() || e.zero_shard) continue;
    XXH3_64bits_update(h.get(), e.name.data(), e.name.size() + 1);  // with its terminator: names separate
    if (e.type == StateType::kJson) {
      const std::string text = e.get().dump();
      XXH3_64bits_update(h.get(), text.data(), text.size());
      continue;
    }
    const float* x = e.data ? e.data() : nullptr;
    if (!x) {
      staged.assign(layout.total(), 0.0f);
      e.read(staged.data());
      x = staged.data();
    }
    for (const ParamEntry& p : layout.entries()) XXH3_64bits_update(h.get(), x + p.offset, p.numel * sizeof(float));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(h.get())));
  return buf;
}

}  // namespace atl
