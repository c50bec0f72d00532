#include "atoll/config/key_effect.h"

#include "atoll/core/log.h"
#include "atoll/model/part_kinds.h"

namespace atl {
namespace {

using C = const Config&;
using S = const RunShape&;

bool always(C, S) { return true; }

bool any_router(C c, const char* kind) {
  for (int l = 0; l < c.model.n_layers; ++l)
    if (c.model.router_at(l) == kind) return true;
  return false;
}
bool any_rope_global(C c) {
  for (int l = 0; l < c.model.n_layers; ++l)
    if (!c.model.rope_local_at(l)) return true;
  return false;
}
// The softmax top-k router's losses act only with a choice to make: with one expert its
// probabilities are 1 whatever the logits (the zaya router has its own skip class and no losses).
bool topk_choice(C c, S) { return c.model.n_experts > 1 && any_router(c, "topk"); }
bool zaya_router(C c, S) { return any_router(c, "zaya"); }
// A key only some part kinds read (model/part_kinds.h) acts when some layer is of such a kind.
template <const char* kKey>
bool kind_reads(C c, S) {
  return part_kind_reads(c.model, kKey);
}
constexpr char kCcaTime0[] = "model.cca_time0", kCcaTime1[] = "model.cca_time1", kQkNorm[] = "model.qk_norm";
constexpr char kQkvBias[] = "model.qkv_bias";
constexpr char kRouterHidden[] = "model.router_hidden_size", kRouterSkipBias[] = "model.router_skip_bias";
bool adam_moments(C c, S) { return c.optim.name != "sgd"; }  // muon steps the rest with AdamW
bool muon(C c, S) { return c.optim.name == "muon"; }
bool validation(C c, S) {  // a prepared split to validate on: none when atoll prepares with val_fraction 0
  return !(c.data.val_fraction == 0 && c.data.dir.empty() && data_phases(c.data).empty());
}
bool one_dataset(C c, S) { return data_phases(c.data).empty(); }  // a mixture's datasets are prepared already
bool islands(C, S s) { return s.islands; }
// The outer steps of DiLoCo happen only after the data-parallel warm start.
bool outer_steps(C c, S s) { return s.islands && c.diloco.dp_warmup_steps < c.train.steps; }
bool peers(C, S s) { return s.islands && s.n_islands > 1; }
bool supervised(C, S s) { return s.supervised; }

const char* kIslands = "only across islands (`atoll launch`, `atoll worker`); `atoll train` runs one island without DiLoCo";
const char* kOuter =
    "only to DiLoCo's outer steps: across islands (`atoll launch`, `atoll worker`), after diloco.dp_warmup_steps "
    "(below train.steps)";
const char* kSupervised = "only to workers started by `atoll launch` (it restarts and watches them)";

}  // namespace

const std::vector<KeyEffect>& key_effects() {
  static const std::vector<KeyEffect> table = {
      {"model.vocab_size", "always", always},
      {"model.dim", "always", always},
      {"model.n_layers", "always", always},
      {"model.n_heads", "always", always},
      {"model.n_kv_heads", "always (gqa and cca attention both have key/value heads)", always},
      {"model.head_dim", "always", always},
      {"model.n_experts", "always", always},
      {"model.top_k", "always (validated against model.n_experts)", always},
      {"model.expert_hidden", "always", always},
      {"model.seq_len", "always", always},
      {"model.rope_theta", "only to global RoPE layers (model.rope_layers not all local)",
       [](C c, S) { return any_rope_global(c); }},
      {"model.rope_layers", "always", always},
      {"model.rope_theta_local", "only to local RoPE layers (\"local\" in model.rope_layers)",
       [](C c, S) { return c.model.any_rope_local(); }},
      {"model.partial_rotary_factor", "always", always},
      {"model.cca_time0", "only to cca attention (model.attention or model.attention_layers)",
       kind_reads<kCcaTime0>},
      {"model.cca_time1", "only to cca attention (model.attention or model.attention_layers)", kind_reads<kCcaTime1>},
      {"model.norm_eps", "always", always},
      {"model.aux_loss_coef", "only to the topk router with model.n_experts > 1", topk_choice},
      {"model.z_loss_coef", "only to the topk router with model.n_experts > 1", topk_choice},
      {"model.tie_embeddings", "always", always},
      {"model.init_std", "always", always},
      {"model.init_seed", "always", always},
      {"model.attention", "only when model.attention_layers is empty (the per-layer list wins)",
       [](C c, S) { return c.model.attention_layers.empty(); }},
      {"model.router", "only when model.router_layers is empty (the per-layer list wins)",
       [](C c, S) { return c.model.router_layers.empty(); }},
      {"model.qk_norm", "only to gqa attention (model.attention or model.attention_layers)", kind_reads<kQkNorm>},
      {"model.router_renormalize", "only to the topk router with model.n_experts > 1", topk_choice},
      {"model.qkv_bias", "only to gqa attention (model.attention or model.attention_layers)", kind_reads<kQkvBias>},
      {"model.shared_expert_hidden", "always", always},
      {"model.attention_layers", "always", always},
      {"model.router_layers", "always", always},
      {"model.residual_scaling", "always", always},
      {"model.router_hidden_size", "only to the zaya router (model.router or model.router_layers)",
       kind_reads<kRouterHidden>},
      {"model.router_skip_bias", "only to the zaya router (model.router or model.router_layers)",
       kind_reads<kRouterSkipBias>},

      {"train.steps", "always", always},
      {"train.batch_size", "always", always},
      {"train.micro_batch_size", "always", always},
      {"train.batch_ramp_start", "only with train.batch_ramp_tokens > 0 (the ramp's length)",
       [](C c, S) { return c.train.batch_ramp_tokens > 0; }},
      {"train.batch_ramp_tokens", "only with train.batch_ramp_start > 0 (where the ramp starts)",
       [](C c, S) { return c.train.batch_ramp_start > 0; }},
      {"train.seed", "always", always},
      {"train.eval_every",
       "only with a validation split (data.val_fraction > 0, or data.dir or a mixture with val_*.bin) or train.eval_tasks",
       [](C c, S s) { return validation(c, s) || !c.train.eval_tasks.empty(); }},
      {"train.eval_batches", "only with validation passes (train.eval_every > 0 and a validation split)",
       [](C c, S s) { return c.train.eval_every > 0 && validation(c, s); }},
      {"train.eval_tasks", "only with evaluations (train.eval_every > 0)", [](C c, S) { return c.train.eval_every > 0; }},
      {"train.log_every", "always", always},
      {"train.peak_gflops", "always", always},
      {"train.precision", "always", always},
      {"train.threads", "always", always},
      {"train.device", "always", always},
      {"train.memory_check", "always", always},
      {"train.context_parallel", "always (refused where it cannot split the sequences)", always},

      {"optim.name", "always", always},
      {"optim.lr", "always", always},
      {"optim.min_lr_ratio", "only to a decaying schedule (optim.schedule = cosine or wsd)",
       [](C c, S) { return c.optim.schedule != "constant"; }},
      {"optim.schedule", "always", always},
      {"optim.warmup_steps", "always", always},
      {"optim.decay_frac", "only with optim.schedule = wsd", [](C c, S) { return c.optim.schedule == "wsd"; }},
      {"optim.beta1", "only to AdamW moments (optim.name = adamw or muon, not sgd)", adam_moments},
      {"optim.beta2", "only to AdamW moments (optim.name = adamw or muon, not sgd)", adam_moments},
      {"optim.eps", "only to AdamW moments (optim.name = adamw or muon, not sgd)", adam_moments},
      {"optim.weight_decay", "always", always},
      {"optim.grad_clip", "always", always},
      {"optim.muon_momentum", "only with optim.name = muon", muon},
      {"optim.ns_steps", "only with optim.name = muon", muon},
      {"optim.bias_balance_lr", "only to the zaya router (model.router or model.router_layers)", zaya_router},
      {"optim.zero1", "only with more than one worker per island (`atoll launch --workers-per-island M`, M > 1)",
       [](C, S s) { return s.islands && s.workers_per_island > 1; }},

      {"data.input", "always", always},
      {"data.dir", "always", always},
      {"data.vocab_size", "only to data atoll prepares (not to a data.mix or data.phases of prepared datasets)",
       one_dataset},
      {"data.val_fraction", "only to data atoll prepares (not to a data.mix or data.phases of prepared datasets)",
       one_dataset},
      {"data.mix", "always", always},
      {"data.phases", "always", always},

      {"diloco.inner_steps", kOuter, outer_steps},
      {"diloco.outer_lr", kOuter, outer_steps},
      {"diloco.outer_momentum", kOuter, outer_steps},
      {"diloco.codec", kOuter, outer_steps},
      {"diloco.fragments", kOuter, outer_steps},
      {"diloco.overlap_steps", kOuter, outer_steps},
      {"diloco.mixing", "only with diloco.overlap_steps > 0 (after an overlapped exchange), across islands",
       [](C c, S s) { return outer_steps(c, s) && c.diloco.overlap_steps > 0; }},
      {"diloco.error_feedback", kOuter, outer_steps},
      {"diloco.compress", kOuter, outer_steps},
      {"diloco.connections", kOuter, outer_steps},
      {"diloco.chunk_kb", kOuter, outer_steps},
      {"diloco.sync_seconds", kOuter, outer_steps},
      {"diloco.expert_merge", kOuter, outer_steps},
      {"diloco.expert_topk", "only with model.n_experts > 1, across islands",
       [](C c, S s) { return outer_steps(c, s) && c.model.n_experts > 1; }},
      {"diloco.outer_delay", kOuter, outer_steps},
      {"diloco.dp_warmup_steps", kIslands, islands},

      {"checkpoint.every", "always", always},
      {"checkpoint.keep", "always (also with checkpoint.every = 0: each run's final checkpoint counts)", always},
      {"checkpoint.grace_s", "always (SIGTERM to `atoll train` too)", always},

      {"dist.seal", "only across islands, with the run's token (`atoll launch` makes one; by hand: --token-file or ATOLL_RUN_TOKEN)", islands},
      {"fault.timeout_s", kIslands, islands},
      {"fault.max_restarts", kSupervised, supervised},
      {"fault.restart_backoff_s", kSupervised, supervised},
      {"fault.heartbeat_s", kIslands, islands},
      {"fault.heartbeat_ttl_s", kIslands, islands},
      {"fault.clip_factor", kOuter, outer_steps},
      {"fault.min_cosine", "only with 3 or more islands (a median direction to compare with)",
       [](C c, S s) { return outer_steps(c, s) && s.n_islands >= 3; }},
      {"fault.outer_deadline_s", "only with 2 or more islands (other islands to wait for)",
       [](C c, S s) { return outer_steps(c, s) && peers(c, s); }},
      {"fault.spike_factor", kIslands, islands},
      {"fault.spike_window", "only with fault.spike_factor > 0, across islands",
       [](C c, S s) { return s.islands && c.fault.spike_factor > 0; }},
      {"fault.step_timeout_s", kSupervised, supervised},
      {"fault.rejoin_timeout_s", "only to workers started without `atoll launch` (`atoll worker` by hand or by a scheduler; the launcher restarts its own)",
       [](C, S s) { return s.islands && !s.supervised; }},
  };
  return table;
}

std::vector<std::string> idle_key_lines(const Config& cfg, const std::vector<std::string>& given, const RunShape& shape) {
  const auto values = config_values(cfg), defaults = config_values(Config{});
  std::vector<std::string> lines;
  for (const KeyEffect& e : key_effects()) {
    bool set = false;
    for (const std::string& k : given) set = set || k == e.key;
    if (!set || values.at(e.key) == defaults.at(e.key) || e.has_effect(cfg, shape)) continue;
    lines.push_back(std::string(e.key) + " = " + values.at(e.key) + " has no effect in this run: it applies " + e.applies +
                    "; fix: remove it, or set what it depends on");
  }
  return lines;
}

void warn_idle_keys(const Config& cfg, const std::vector<std::string>& given, const RunShape& shape) {
  for (const std::string& line : idle_key_lines(cfg, given, shape)) log_warn(line);
}

}  // namespace atl
