#include "atoll/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "atoll/config/context_parallel.h"
#include "atoll/config/data_mix.h"
#include "atoll/config/outer_delay_rules.h"
#include "atoll/config/toml_text.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/user_path.h"
#include "atoll/model/part_kinds.h"

namespace atl {
namespace {

// The block part kinds' choices, "gqa (grouped-query ...) or cca (...)", from the table of part
// kinds (model/part_kinds.h), which model.attention, model.router and their per-layer lists
// choose among.
template <class Kind>
std::string kind_choices(const std::vector<Kind>& kinds) {
  std::string out;
  for (size_t i = 0; i < kinds.size(); ++i)
    out += std::string(i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + std::string(kinds[i].name) + " (" +
           std::string(kinds[i].help) + ")";
  return out;
}

// The values a number key takes: [lo, hi], either end open where it says so; unbounded above
// when hi is infinite (or, for integers, the largest int64). A float must also be finite.
struct Bounds {
  double lo, hi;
  bool lo_open = false, hi_open = false;
  bool contains(double x) const {
    return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
};
constexpr int kMinTokenizerVocab = 260;  // 256 byte pieces + 3 specials + at least one more
constexpr double kNoLimit = std::numeric_limits<double>::infinity();
constexpr double kInt64Max = double(std::numeric_limits<int64_t>::max());
constexpr Bounds closed(double lo, double hi) { return {lo, hi}; }        // [lo, hi]
constexpr Bounds below(double lo, double hi) { return {lo, hi, false, true}; }  // [lo, hi)
constexpr Bounds above(double lo, double hi = kNoLimit) { return {lo, hi, true, false}; }  // (lo, hi]
constexpr Bounds at_least(double lo) { return {lo, kNoLimit}; }           // [lo, inf)

// Every key, declared once, with the values it can mean. `v.num(key, field, help, bounds)` for
// numbers, `v.str(key, field, help, {choices})`, `v.flag(...)` for booleans, `v.list(...)` for
// lists, `v.mix(...)` for a data mixture and `v.phases(...)` for a schedule of them.
template <class V>
void visit_config(Config& c, V&& v) {
  auto& m = c.model;
  v.num("model.vocab_size", m.vocab_size, "V: vocabulary size of the model", closed(2, 1 << 24));
  v.num("model.dim", m.dim, "C: model width", closed(1, 1 << 16));
  v.num("model.n_layers", m.n_layers, "L: transformer blocks", closed(1, 4096));
  v.num("model.n_heads", m.n_heads, "NH: query heads", closed(1, 4096));
  v.num("model.n_kv_heads", m.n_kv_heads, "NKV: key/value heads (grouped-query attention; divides n_heads)", closed(1, 4096));
  v.num("model.head_dim", m.head_dim, "HD: head dimension (even, for RoPE)", closed(2, 4096));
  v.num("model.n_experts", m.n_experts, "E: experts per MoE layer (1 = dense)", closed(1, 4096));
  v.num("model.top_k", m.top_k, "K: experts per token", closed(1, 4096));
  v.num("model.expert_hidden", m.expert_hidden, "H: SwiGLU hidden width of each expert", closed(1, 1 << 20));
  v.num("model.seq_len", m.seq_len, "T: tokens per training sequence", closed(1, 1 << 20));
  v.num("model.rope_theta", m.rope_theta, "RoPE base (of the global layers, model.rope_layers)", at_least(1.0));
  v.list("model.rope_layers", m.rope_layers,
         "per-layer RoPE base, repeated over the layers: global (model.rope_theta) or local "
         "(model.rope_theta_local); transformers' zaya layer types hybrid and hybrid_sliding (empty: all global)");
  v.num("model.rope_theta_local", m.rope_theta_local, "RoPE base of the local layers (model.rope_layers)",
        at_least(1.0));
  v.num("model.partial_rotary_factor", m.partial_rotary_factor,
        "fraction of each head that RoPE rotates (transformers' partial_rotary_factor): the first "
        "int(head_dim * factor) entries, which must be even", above(0.0, 1.0));
  v.num("model.cca_time0", m.cca_time0, "CCA attention: kernel of the depthwise causal convolution over [q|k]",
        closed(1, 64));
  v.num("model.cca_time1", m.cca_time1,
        "CCA attention: kernel of the grouped causal convolution over [q|k] (one group per head)", closed(1, 64));
  // RMSNorm divides by sqrt(mean(x^2) + eps): 0 divides by zero on an all-zero row.
  v.num("model.norm_eps", m.norm_eps, "RMSNorm epsilon", above(0.0, 1.0));
  v.num("model.aux_loss_coef", m.aux_loss_coef, "Switch load-balancing loss coefficient (per layer)", at_least(0.0));
  v.num("model.z_loss_coef", m.z_loss_coef, "router z-loss coefficient", at_least(0.0));
  v.flag("model.tie_embeddings", m.tie_embeddings, "LM head shares the embedding table");
  v.num("model.init_std", m.init_std, "standard deviation of the normal init of every matrix", at_least(0.0));
  v.num("model.init_seed", m.init_seed, "seed of the parameter initialisation", closed(0, kInt64Max));
  static const std::string attention_help = "attention of every block: " + kind_choices(attention_kinds());
  static const std::string router_help = "router of every MoE block: " + kind_choices(router_kinds());
  v.str("model.attention", m.attention, attention_help.c_str(), attention_kind_names());
  v.str("model.router", m.router, router_help.c_str(), router_kind_names());
  v.str("model.qk_norm", m.qk_norm,
        "gqa attention: RMSNorm of q and k before RoPE: none, head (each head's head_dim entries, one gain shared "
        "by the heads: Qwen3-MoE) or proj (the whole projection before the split into heads: OLMoE)",
        {"none", "head", "proj"});
  v.flag("model.router_renormalize", m.router_renormalize,
         "topk router: the chosen experts' weights renormalised to sum to 1 (transformers' norm_topk_prob; false: "
         "the softmax probabilities as they are)");
  v.flag("model.qkv_bias", m.qkv_bias,
         "gqa attention: biases on the q, k and v projections (Qwen2-MoE's; o_proj has none)");
  v.num("model.shared_expert_hidden", m.shared_expert_hidden,
        "HS: SwiGLU hidden width of a shared expert every token passes through beside the routed ones, scaled by a "
        "sigmoid gate of its own (Qwen2-MoE's shared_expert and shared_expert_gate); 0: none",
        closed(0, 1 << 20));
  v.list("model.attention_layers", m.attention_layers,
         "per-layer attention kinds, repeated over the layers (empty: model.attention everywhere)");
  v.list("model.router_layers", m.router_layers,
         "per-layer router kinds, repeated over the layers (empty: model.router everywhere)");
  v.flag("model.residual_scaling", m.residual_scaling,
         "ZAYA1's residual scaling: learned per-channel scale and bias on the stream and on each sub-layer's output "
         "(and after the embedding); identity at init");
  v.num("model.router_hidden_size", m.router_hidden_size, "R: width of the zaya router's MLP", closed(1, 1 << 16));
  v.num("model.router_skip_bias", m.router_skip_bias,
        "zaya router: initial balancing bias of the skip class (-1 as transformers; -1e4: never skip)",
        closed(-1e4, 1.0));

  auto& t = c.train;
  v.num("train.steps", t.steps, "optimizer steps (0: only the initial checkpoint)", closed(0, kInt64Max));
  v.num("train.batch_size", t.batch_size, "sequences per optimizer step per worker", closed(1, 1 << 20));
  v.num("train.micro_batch_size", t.micro_batch_size, "sequences per forward/backward (0 = batch_size); gradients accumulate", closed(0, 1 << 20));
  v.num("train.batch_ramp_start", t.batch_ramp_start, "sequences per step when the batch-size ramp starts (0 = no ramp)", closed(0, 1 << 20));
  v.num("train.batch_ramp_tokens", t.batch_ramp_tokens, "tokens over which the batch grows linearly to batch_size", closed(0, kInt64Max));
  v.num("train.seed", t.seed, "seed of the data order and sampling", closed(0, kInt64Max));
  v.num("train.eval_every", t.eval_every, "steps between validation passes (0 = never)", closed(0, kInt64Max));
  v.num("train.eval_batches", t.eval_batches, "batches per validation pass", closed(1, 1 << 20));
  v.list("train.eval_tasks", t.eval_tasks,
         "multiple-choice task files (JSONL, docs/tasks.md) scored at each evaluation (train.eval_every): "
         "task/<name>/acc and task/<name>/acc_norm in metrics.jsonl");
  v.num("train.log_every", t.log_every, "steps between metrics lines", closed(1, kInt64Max));
  v.num("train.peak_gflops", t.peak_gflops,
        "mfu in each metrics row against this peak GFLOP/s of one worker's device (a vendor's figure, or `atoll bench`'s "
        "peak_gflops); -1: measured at the start as `atoll bench` does (seconds of every core on a CPU); 0: no mfu",
        closed(-1.0, 1e12));
  v.str("train.precision", t.precision, "matrix-product precision", {"fp32", "bf16"});
  v.num("train.threads", t.threads, "worker threads (0 = all cores)", closed(0, 4096));
  v.str("train.device", t.device, "compute device", {"cpu", "cuda"});
  v.num("train.context_parallel", t.context_parallel,
        "P: workers of an island that split each sequence between them (ring attention over P ranks; "
        "docs/long_context.md); must divide --workers-per-island", closed(1, 4096));
  v.flag("train.memory_check", t.memory_check,
         "refuse at start a model and batch whose estimated memory exceeds what the machine has (false: skip, "
         "if the estimate is wrong)");

  auto& o = c.optim;
  v.str("optim.name", o.name, "optimizer: adamw, muon (hidden matrices) + adamw (the rest), or sgd (plain, no momentum)",
        {"adamw", "muon", "sgd"});
  v.num("optim.lr", o.lr, "peak learning rate", at_least(0.0));
  v.num("optim.min_lr_ratio", o.min_lr_ratio, "final learning rate as a fraction of the peak", closed(0.0, 1.0));
  v.str("optim.schedule", o.schedule, "learning-rate schedule after warmup", {"cosine", "wsd", "constant"});
  v.num("optim.warmup_steps", o.warmup_steps, "linear warmup steps", closed(0, kInt64Max));
  v.num("optim.decay_frac", o.decay_frac, "wsd: fraction of the steps spent decaying", closed(0.0, 1.0));
  // A moment's decay rate of 1 never forgets (and AdamW's bias correction divides by 1 - beta^t = 0).
  v.num("optim.beta1", o.beta1, "AdamW beta1", below(0.0, 1.0));
  v.num("optim.beta2", o.beta2, "AdamW beta2", below(0.0, 1.0));
  v.num("optim.eps", o.eps, "AdamW epsilon (added to sqrt(v); 0 divides by zero where v is 0)", above(0.0, 1.0));
  v.num("optim.weight_decay", o.weight_decay, "decoupled weight decay (matrices only; lr * weight_decay < 1)", at_least(0.0));
  v.num("optim.grad_clip", o.grad_clip, "global gradient-norm clip (0 = off)", at_least(0.0));
  v.num("optim.muon_momentum", o.muon_momentum, "Muon Nesterov momentum", below(0.0, 1.0));
  v.num("optim.ns_steps", o.ns_steps, "Muon Newton-Schulz iterations", closed(1, 100));
  v.num("optim.bias_balance_lr", o.bias_balance_lr,
        "zaya router: learning rate of the AdamW step on the balancing biases after each optimizer step",
        at_least(0.0));
  v.flag("optim.zero1", o.zero1,
         "ZeRO-1 inside an island: with --workers-per-island M > 1 each worker holds and steps 1/M of the optimizer state (CPU engine)");

  auto& d = c.data;
  v.list("data.input", d.input, "text files, folders or JSONL to train on (empty = built-in corpus)");
  v.str("data.dir", d.dir, "folder of prepared shards (empty = cache folder derived from the input)", {});
  v.num("data.vocab_size", d.vocab_size, "tokenizer vocabulary (0 = model.vocab_size; else at least 260)", closed(0, 1 << 24));
  v.num("data.val_fraction", d.val_fraction, "fraction of the corpus held out for validation", closed(0.0, 0.5));
  v.mix("data.mix", d.mix,
        "prepared datasets drawn from in proportion to their weights, e.g. [{dir = \"web\", weight = 0.7}, {dir = "
        "\"code\", weight = 0.3}]; instead of data.input and data.dir; one tokenizer for all");
  v.phases("data.phases", d.phases,
           "mixtures that change within the run: [{at_tokens = 0, mix = [...]}, {at_tokens = 2000000, mix = [...]}], "
           "at_tokens counting every worker's tokens, the first 0, increasing; instead of data.mix; a phase may also "
           "set model.seq_len, model.rope_theta and train.batch_size (context extension: {at_tokens = ..., mix = "
           "[...], model.seq_len = 32768, model.rope_theta = 1000000.0})");

  auto& g = c.diloco;
  v.num("diloco.inner_steps", g.inner_steps, "H: inner steps between outer synchronisations", closed(1, kInt64Max));
  // An outer learning rate of 0 throws every island's work away at each outer step.
  v.num("diloco.outer_lr", g.outer_lr, "outer Nesterov learning rate", above(0.0));
  v.num("diloco.outer_momentum", g.outer_momentum, "outer Nesterov momentum", below(0.0, 1.0));
  v.str("diloco.codec", g.codec, "pseudo-gradient codec", {"fp32", "bf16", "int8", "int4"});
  v.num("diloco.fragments", g.fragments, "streaming fragments (1 = sync everything at once)", closed(1, 4096));
  v.num("diloco.overlap_steps", g.overlap_steps, "inner steps each fragment exchange overlaps (0 = blocking)", closed(0, 1 << 20));
  v.num("diloco.mixing", g.mixing, "alpha: after an overlapped exchange local <- alpha*local + (1-alpha)*global (unused when overlap_steps = 0)", closed(0.0, 1.0));
  v.flag("diloco.error_feedback", g.error_feedback, "carry each island's quantization error into its next outer step");
  v.str("diloco.compress", g.compress, "lossless zstd over the codec's bytes on the wire (int8: ~5% fewer bytes)", {"zstd", "none"});
  v.num("diloco.connections", g.connections, "TCP streams per peer for the outer all-reduce", closed(1, 64));
  v.num("diloco.chunk_kb", g.chunk_kb, "fp32 KiB per pipelined chunk of the outer all-reduce", closed(4, 1 << 20));
  v.num("diloco.sync_seconds", g.sync_seconds, "islands sync on a time budget: a round ends after the inner step during which this many seconds passed (at most diloco.inner_steps steps), and the mean weights each island's pseudo-gradient by the tokens it trained (0 = every diloco.inner_steps steps)", closed(0.0, 1e6));
  v.str("diloco.expert_merge", g.expert_merge, "outer mean of the experts' pseudo-gradients: mean (every island alike, as the dense parameters) or tokens (each island weighted by the tokens it routed to that expert in the round; an expert no island used keeps its parameters)", {"mean", "tokens"});
  v.num("diloco.expert_topk", g.expert_topk, "sparse expert exchange: the fraction of each layer's experts an island sends per outer step, those whose pseudo-gradient plus error-feedback residual has the largest norm (ceil(fraction x model.n_experts), at least 1); the rest wait in the island's residual (0 or 1 = every expert, the dense exchange)", closed(0.0, 1.0));
  v.num("diloco.outer_delay", g.outer_delay, "1: each round's exchange runs behind the whole next round, which starts from the island's own eager outer step, corrected when the mean arrives (0 = the outer step waits for its exchange)", closed(0, 1));
  v.num("diloco.dp_warmup_steps", g.dp_warmup_steps, "first steps as data parallel across all islands (gradients all-reduced every step), DiLoCo after: a warm start", closed(0, kInt64Max));

  v.num("checkpoint.every", c.checkpoint.every, "steps between checkpoints (0 = only at the end)", closed(0, kInt64Max));
  v.num("checkpoint.keep", c.checkpoint.keep, "checkpoints kept (newest)", closed(1, 1 << 20));
  v.num("checkpoint.grace_s", c.checkpoint.grace_s, "seconds a run stopped by SIGTERM (to `atoll train`, `atoll launch` or a worker) has to write its final checkpoint and exit (0; a worker 79, retriable: docs/cluster.md)", closed(0.0, 86400.0));

  // Waits are counted in whole milliseconds (0 would mean "no bound" to some of them); a
  // million seconds is eleven days, far below the overflow of the count.
  v.num("fault.timeout_s", c.fault.timeout_s, "bound on any wait for a peer or the store, seconds", closed(0.001, 1e6));
  v.num("fault.max_restarts", c.fault.max_restarts, "restarts of one worker by `atoll launch` in a row without progress (a crash loop) before the run fails; a new step or committed outer step between losses starts the count again (0 = the first loss ends the run)", closed(0, 1 << 20));
  v.num("fault.restart_backoff_s", c.fault.restart_backoff_s, "seconds before a lost worker's first restart; doubles with each restart in a row without progress (a new step or committed outer step), capped at 60", closed(0.0, 3600.0));
  // Heartbeats are timed in whole milliseconds: at least 10 ms apart, living at least 20 ms.
  v.num("fault.heartbeat_s", c.fault.heartbeat_s, "seconds between a worker's heartbeats in the store", closed(0.01, 3600.0));
  v.num("fault.heartbeat_ttl_s", c.fault.heartbeat_ttl_s, "seconds a heartbeat lives: a worker silent this long is lost (above fault.heartbeat_s)", closed(0.02, 86400.0));
  // Honest islands' Δ norms differ by tens of percent; a factor of 2 leaves them alone and cuts a
  // broken or hostile one down to twice the typical step (docs/islands.md "Trust at the door").
  v.num("fault.clip_factor", c.fault.clip_factor, "before each outer step's all-reduce, an island's pseudo-gradient is clipped to this x the round's median norm (0 = no clipping; non-finite or stale ones are always dropped)", closed(0.0, 1e6));
  v.num("fault.min_cosine", c.fault.min_cosine, "with 3 or more islands, an island's pseudo-gradient whose direction has a cosine below this with the round's median direction is dropped (-1 = never)", closed(-1.0, 1.0));
  // Off by default: a deadline shorter than an island's ordinary jitter (an evaluation, a
  // checkpoint, a slower device) would throw that island out of every round and restart it.
  v.num("fault.outer_deadline_s", c.fault.outer_deadline_s, "an outer step waits at most this many seconds (from this island's arrival) for the other islands; a late island is left out of the round and rejoins with the committed state (0 = wait for every live island)", closed(0.0, 1e6));
  // Off by default: how far an honest loss strays from its median depends on the batch size and
  // the data's mix, and a factor set too low rolls back honest steps. A non-finite loss always rolls back.
  v.num("fault.spike_factor", c.fault.spike_factor, "an island whose step loss exceeds this x the running median of its last fault.spike_window losses rolls back to theta at its last outer step and skips the batch, as for a non-finite loss (0 = spikes are not checked)", closed(0.0, 1e6));
  v.num("fault.spike_window", c.fault.spike_window, "losses in the running median that fault.spike_factor compares with (the check starts once the window is full)", closed(3, 1 << 20));
  // Generous: above any legitimate pause inside a step (an outer step that loses a peer waits up
  // to 2 x fault.timeout_s: the exchange, then re-forming; an evaluation; a checkpoint's wait).
  v.num("fault.step_timeout_s", c.fault.step_timeout_s, "`atoll launch` kills and restarts a worker that has not begun a step for this many seconds since its previous one (its heartbeat may go on); keep it above 2 x fault.timeout_s and the longest evaluation (0 = no watchdog)", closed(0.0, 1e6));
  // Long by default: a worker started by hand or by a scheduler has nobody to restart it, and a
  // cut cable or a rebooted router is often back within minutes; it exits 75 when this runs out.
  v.num("fault.rejoin_timeout_s", c.fault.rejoin_timeout_s, "a worker started without `atoll launch` (by hand, srun, a Kubernetes pod) that the others dropped (its link cut past fault.heartbeat_ttl_s, a stop, a late round) rejoins by itself: it retries the store and the join for up to this many seconds, then exits 75 (0 = exit 75 at once, as under a launcher that restarts it)", closed(0.0, 1e6));

  // On by default: a run with a token (every launched run) seals; each island seals what it sends
  // and opens what it receives at ~1.5 GB/s per core, 0.04% of zaya1-tiny's outer step
  // (docs/benchmarks.md "Sealed traffic").
  v.flag("dist.seal", c.dist.seal, "seal the traffic between islands (pseudo-gradients, state transfers, the outer group's collectives: XChaCha20-Poly1305) and authenticate the store's membership records and checkpoint parts (a MAC), with keys derived from the run token, which never leaves the workers; a forged or altered frame or record is dropped and logged (event forged_frame / forged_record). Needs the run's token (every launched run has one; by hand: --token-file or ATOLL_RUN_TOKEN); without one nothing is sealed, with a warning");
}

std::pair<std::string, std::string> split_key(const std::string& key) {
  auto dot = key.find('.');
  return {key.substr(0, dot), key.substr(dot + 1)};
}

// A bound as help and errors write it: 0.001, 1e+06, 4096 (no trailing ".0").
std::string bound_text(double x, bool integral) {
  if (integral) return std::to_string(int64_t(x));
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, res.ptr);
}

// "[0, 1)", "(0, 1]", "> 0", ">= 1": the values a number key takes.
std::string bounds_text(const Bounds& b, bool integral) {
  const bool unbounded = std::isinf(b.hi) || (integral && b.hi >= kInt64Max);
  if (unbounded) return (b.lo_open ? "> " : ">= ") + bound_text(b.lo, integral);
  return (b.lo_open ? "(" : "[") + bound_text(b.lo, integral) + ", " + bound_text(b.hi, integral) +
         (b.hi_open ? ")" : "]");
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Collects the declared keys: type, default (the field's value in a default Config), the values
// each takes, and what it means.
struct KeyLister {
  std::vector<ConfigKeyInfo> keys;
  template <class N>
  void num(const char* k, N& f, const char* help, Bounds b) {
    constexpr bool integral = std::is_integral_v<N>;
    keys.push_back({k, integral ? "int" : "float", help, integral ? std::to_string(f) : fmt_double(f),
                    bounds_text(b, integral)});
  }
  void str(const char* k, std::string& f, const char* help, std::vector<std::string> choices) {
    std::string allowed;
    for (size_t i = 0; i < choices.size(); ++i) allowed += (i ? " | " : "") + choices[i];
    keys.push_back({k, "string", help, quote(f), choices.empty() ? "any text" : allowed});
  }
  void flag(const char* k, bool& f, const char* help) {
    keys.push_back({k, "bool", help, f ? "true" : "false", "true | false"});
  }
  void list(const char* k, std::vector<std::string>& f, const char* help) {
    keys.push_back({k, "list", help, f.empty() ? "[]" : "[...]", "strings"});
  }
  void mix(const char* k, std::vector<MixSource>& f, const char* help) {
    keys.push_back({k, "list", help, f.empty() ? "[]" : "[...]", "tables {dir = string, weight > 0}"});
  }
  void phases(const char* k, std::vector<DataPhase>& f, const char* help) {
    keys.push_back({k, "list", help, f.empty() ? "[]" : "[...]", "tables {at_tokens >= 0, mix = [...], model.seq_len, model.rope_theta, train.batch_size}"});
  }
};

// Reads declared keys out of a parsed TOML table, with type and range checks.
struct Reader {
  const toml::table& root;
  const std::string& origin;
  const std::map<std::string, std::string>& overridden;  // key -> the --set item that gave it

  const toml::node* find(const char* key) const {
    auto [sec, name] = split_key(key);
    auto* t = root[sec].as_table();
    return t ? t->get(name) : nullptr;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& problem, const std::string& fix) const {
    auto it = overridden.find(key.substr(0, key.find('[')));  // a value from --set is blamed on --set, not on the file
    throw ConfigError((it == overridden.end() ? origin : "--set " + it->second) + ": " + key + ": " + problem +
                      "; fix: " + fix);
  }

  template <class N>
  void num(const char* key, N& field, const char*, Bounds b) {
    const toml::node* n = find(key);
    if (!n) return;
    constexpr bool integral = std::is_integral_v<N>;
    const std::string allowed = bounds_text(b, integral);
    const std::string in = allowed[0] == '[' || allowed[0] == '(' ? "in " + allowed : allowed;
    if constexpr (integral) {
      auto* i = n->as_integer();
      // TOML reads 1e1 or 10.0 as a float: say so, since node_repr prints it as a whole number.
      const std::string got = n->as_floating_point() ? "the floating-point number " + node_repr(*n) : node_repr(*n);
      if (!i) fail(key, "expected an integer, got " + got, std::string("write a whole number (no decimal point or exponent), e.g. ") + key + " = " + std::to_string(field));
      if (!b.contains(double(i->get())))
        fail(key, "value " + std::to_string(i->get()) + " is out of range", "use a value " + in);
      field = static_cast<N>(i->get());
    } else {
      double value;
      if (auto* i = n->as_integer()) value = static_cast<double>(i->get());
      else if (auto* f = n->as_floating_point()) value = f->get();
      else fail(key, "expected a number, got " + node_repr(*n), std::string("write a number, e.g. ") + key + " = " + fmt_double(field));
      if (!std::isfinite(value)) fail(key, "value " + fmt_double(value) + " is not finite", "use a finite value " + in);
      if (!b.contains(value)) fail(key, "value " + fmt_double(value) + " is out of range", "use a value " + in);
      field = value;
    }
  }
  void str(const char* key, std::string& field, const char*, std::vector<std::string> choices) {
    const toml::node* n = find(key);
    if (!n) return;
    auto* s = n->as_string();
    if (!s) fail(key, "expected a string, got " + node_repr(*n), std::string("quote the value, e.g. ") + key + " = " + quote(field));
    if (!choices.empty() && std::find(choices.begin(), choices.end(), s->get()) == choices.end()) {
      std::string opts;
      for (size_t i = 0; i < choices.size(); ++i) opts += (i ? ", " : "") + choices[i];
      fail(key, "unknown value " + quote(s->get()), "use one of: " + opts);
    }
    field = s->get();
  }
  void flag(const char* key, bool& field, const char*) {
    const toml::node* n = find(key);
    if (!n) return;
    auto* b = n->as_boolean();
    if (!b) fail(key, "expected true or false, got " + node_repr(*n), "write true or false");
    field = b->get();
  }
  void list(const char* key, std::vector<std::string>& field, const char*) {
    const toml::node* n = find(key);
    if (!n) return;
    field.clear();
    if (auto* s = n->as_string()) {  // "a,b" from --set; in a file a list is written as one
      if (!overridden.count(key))
        fail(key, "expected a list of strings, got the string " + node_repr(*n), std::string("write a list, e.g. ") + key + " = [" + node_repr(*n) + "]");
      std::stringstream ss(s->get());
      std::string item;
      while (std::getline(ss, item, ',')) if (!item.empty()) field.push_back(item);
      return;
    }
    auto* a = n->as_array();
    if (!a) fail(key, "expected a list of strings, got " + node_repr(*n), std::string("write e.g. ") + key + " = [\"a.txt\", \"texts/\"]");
    for (auto& e : *a) {
      auto* s = e.as_string();
      if (!s) fail(key, "list item " + node_repr(e) + " is not a string", "quote every item");
      field.push_back(s->get());
    }
  }
  void mix(const char* key, std::vector<MixSource>& field, const char*) {
    if (const toml::node* n = find(key)) field = read_data_mix(*n, key, fail_fn());
  }
  void phases(const char* key, std::vector<DataPhase>& field, const char*) {
    if (const toml::node* n = find(key)) field = read_data_phases(*n, key, fail_fn());
  }
  ConfigFail fail_fn() const {
    return [this](const std::string& key, const std::string& problem, const std::string& fix) { fail(key, problem, fix); };
  }
};

// Writes every key as TOML, section by section in declaration order.
struct Writer {
  std::string section;
  std::ostringstream out;
  std::map<std::string, std::string> values;  // key -> its value as TOML
  void key(const char* k, const std::string& value) {
    values[k] = value;
    auto [sec, name] = split_key(k);
    if (sec != section) {
      out << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    out << name << " = " << value << "\n";
  }
  template <class N>
  void num(const char* k, N& f, const char*, Bounds) {
    if constexpr (std::is_integral_v<N>) key(k, std::to_string(f));
    else key(k, fmt_double(f));
  }
  void str(const char* k, std::string& f, const char*, std::vector<std::string>) { key(k, quote(f)); }
  void flag(const char* k, bool& f, const char*) { key(k, f ? "true" : "false"); }
  void list(const char* k, std::vector<std::string>& f, const char*) {
    std::string s = "[";
    for (size_t i = 0; i < f.size(); ++i) s += (i ? ", " : "") + quote(f[i]);
    key(k, s + "]");
  }
  void mix(const char* k, std::vector<MixSource>& f, const char*) { key(k, data_mix_toml(f)); }
  void phases(const char* k, std::vector<DataPhase>& f, const char*) { key(k, data_phases_toml(f)); }
};

std::set<std::string> known_keys() {
  std::set<std::string> keys;
  for (auto& k : config_keys()) keys.insert(k.key);
  return keys;
}

[[noreturn]] void unknown_key(const std::string& origin, const std::string& key) {
  std::string best;
  size_t best_d = 4;
  for (auto& k : known_keys()) {
    size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  throw ConfigError(origin + ": unknown key '" + key + "'" + (best.empty() ? "" : "; did you mean '" + best + "'?") +
                    " (fix: remove it or use a key listed by `atoll train --help-config`)");
}

void check_unknown_keys(const toml::table& root, const std::string& origin) {
  auto known = known_keys();
  std::set<std::string> sections;
  for (auto& k : known) sections.insert(split_key(k).first);
  for (auto& [sec, node] : root) {
    std::string s(sec.str());
    if (!sections.count(s)) {
      if (!node.is_table()) unknown_key(origin, s);
      throw ConfigError(origin + ": unknown section [" + s + "] (fix: use one of [model] [train] [optim] [data] [diloco] [checkpoint] [fault])");
    }
    auto* t = node.as_table();
    if (!t) throw ConfigError(origin + ": '" + s + "' must be a section ([" + s + "]), not a value");
    for (auto& [name, _] : *t) {
      std::string full = s + "." + std::string(name.str());
      if (!known.count(full)) unknown_key(origin, full);
    }
  }
}

// Well-formed UTF-8: shortest forms only, no surrogates, nothing above U+10FFFF.
bool is_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? b : b & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c >> 6) != 0x2) return false;
      cp = cp << 6 | (c & 0x3f);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

void apply_override(toml::table& root, const std::string& item) {
  const std::string origin = "--set " + item;
  auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(origin + ": expected key=value (fix: e.g. --set train.steps=100)");
  std::string key = item.substr(0, eq), value = item.substr(eq + 1);
  if (!known_keys().count(key)) unknown_key(origin, key);
  // The value is TOML when it parses as TOML (numbers, booleans, quoted strings, arrays),
  // otherwise a bare string, so `--set optim.name=muon` works without quotes.
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    // A TOML string is UTF-8 (else the printed config.toml would not read back).
    if (!is_utf8(value)) throw ConfigError(origin + ": the value is not valid UTF-8 text (fix: pass it as UTF-8)");
    parsed.insert_or_assign("v", value);
  }
  auto [sec, name] = split_key(key);
  if (!root.contains(sec)) root.insert(sec, toml::table{});
  auto* t = root[sec].as_table();
  if (!t) throw ConfigError(origin + ": '" + sec + "' is not a section in the config file");
  t->insert_or_assign(name, *parsed.get("v"));
}

}  // namespace

std::vector<ConfigKeyInfo> config_keys() {
  Config c;
  KeyLister l;
  visit_config(c, l);
  return l.keys;
}

std::string config_help_text() {
  const std::vector<ConfigKeyInfo> keys = config_keys();
  size_t w_key = 3, w_type = 4, w_default = 7, w_allowed = 7;
  for (const auto& k : keys) {
    w_key = std::max(w_key, k.key.size()), w_type = std::max(w_type, k.type.size());
    w_default = std::max(w_default, k.default_value.size()), w_allowed = std::max(w_allowed, k.allowed.size());
  }
  auto row = [&](const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                 const std::string& e) {
    auto pad = [](const std::string& x, size_t w) { return x + std::string(w - x.size() + 2, ' '); };
    return pad(a, w_key) + pad(b, w_type) + pad(c, w_default) + pad(d, w_allowed) + e + "\n";
  };
  std::string out = row("key", "type", "default", "allowed", "meaning");
  for (const auto& k : keys) out += row(k.key, k.type, k.default_value, k.allowed, k.help);
  return out;
}

Config parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides,
                    std::vector<std::string>* given) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw ConfigError(origin + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column) +
                      ": not valid TOML: " + std::string(e.description()) + " (fix: correct the syntax at that line)");
  }
  check_unknown_keys(root, origin);
  std::map<std::string, std::string> overridden;
  for (auto& item : overrides) {
    apply_override(root, item);
    // A later --set of one key overrides an earlier one (scripts add their defaults first and
    // the caller's values after them), but never silently: a changed value is named.
    const auto [it, fresh] = overridden.emplace(item.substr(0, item.find('=')), item);
    if (!fresh && it->second != item)
      log_warn("--set " + it->second + " and --set " + item + " set one key twice: the last stands (give " +
               it->first + " once to silence this)");
    it->second = item;
  }
  if (given) {  // every key the file or --set wrote (check_unknown_keys and apply_override let only declared keys in)
    given->clear();
    for (auto& [sec, node] : root)
      if (auto* t = node.as_table())
        for (auto& [name, _] : *t) given->push_back(std::string(sec.str()) + "." + std::string(name.str()));
  }
  Config c;
  Reader r{root, origin, overridden};
  visit_config(c, r);
  std::string where = origin;  // cross-field errors may come from the file or from --set
  for (auto& item : overrides) where += (&item == &overrides.front() ? " with --set " : ", --set ") + item;
  validate_config(c, where);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, std::vector<std::string>* given) {
  if (path.empty()) return parse_config("", "default config", overrides, given);
  // A folder would read as empty (silently the defaults), a pipe or /dev/zero never ends.
  check_input_file(path, "config file", "pass a .toml file to --config");
  std::ifstream f(path);
  if (!f) throw ConfigError(path + ": cannot open config file (fix: check the path given to --config)");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config(ss.str(), path, overrides, given);
}

namespace {

// A per-layer pattern: each entry a known kind, at most one per layer.
void check_layer_kinds(const std::string& origin, const std::string& key, const std::vector<std::string>& kinds,
                       const std::vector<std::string>& known, int n_layers) {
  if (int(kinds.size()) > n_layers)
    throw ConfigError(origin + ": " + key + " has " + std::to_string(kinds.size()) + " entries for model.n_layers = " +
                      std::to_string(n_layers) + "; fix: give at most one kind per layer (the list repeats)");
  for (size_t i = 0; i < kinds.size(); ++i)
    if (std::find(known.begin(), known.end(), kinds[i]) == known.end()) {
      std::string opts;
      for (size_t k = 0; k < known.size(); ++k) opts += (k ? ", " : "") + quote(known[k]);
      throw ConfigError(origin + ": " + key + "[" + std::to_string(i) + "] = " + quote(kinds[i]) +
                        " is not a known kind; fix: use one of " + opts);
    }
}

void validate_phase_settings(const Config& c, const std::string& origin);

}  // namespace

void validate_config(const Config& c, const std::string& origin) {
  auto fail = [&](const std::string& msg) { throw ConfigError(origin + ": " + msg); };
  const auto& m = c.model;
  if (m.n_heads % m.n_kv_heads != 0)
    fail("model.n_kv_heads (" + std::to_string(m.n_kv_heads) + ") must divide model.n_heads (" + std::to_string(m.n_heads) + "); fix: change one of them");
  check_layer_kinds(origin, "model.attention_layers", m.attention_layers, attention_kind_names(), m.n_layers);
  check_layer_kinds(origin, "model.router_layers", m.router_layers, router_kind_names(), m.n_layers);
  if (const std::string why = validate_part_kinds(m); !why.empty()) fail(why);
  check_layer_kinds(origin, "model.rope_layers", m.rope_layers, {"global", "local"}, m.n_layers);
  if (m.head_dim % 2 != 0) fail("model.head_dim must be even for RoPE; fix: use an even head_dim");
  if (m.rotary_dim() < 2 || m.rotary_dim() % 2 != 0)
    fail("model.head_dim * model.partial_rotary_factor = " + std::to_string(m.rotary_dim()) +
         " rotated entries per head (rounded down); RoPE needs an even number of at least 2; fix: change "
         "model.partial_rotary_factor (e.g. 0.5 or 1.0)");
  // CCA's convolutions (and value shift) read the tokens before each position: a sequence shorter
  // than their window leaves no position with the whole window inside it.
  if (const int window = boundary_tokens(m) + 1; window > 1 && m.seq_len < window)
    fail("model.seq_len = " + std::to_string(m.seq_len) + " is shorter than the attention's convolution window (" +
         std::to_string(window) + " tokens: model.cca_time0 + model.cca_time1 - 1); fix: raise model.seq_len to at least " +
         std::to_string(window));
  if (m.top_k > m.n_experts)
    fail("model.top_k (" + std::to_string(m.top_k) + ") exceeds model.n_experts (" + std::to_string(m.n_experts) + "); fix: lower top_k or add experts");
  const auto& t = c.train;
  int micro = t.micro_batch_size ? t.micro_batch_size : t.batch_size;
  if (t.batch_size % micro != 0)
    fail("train.micro_batch_size (" + std::to_string(micro) + ") must divide train.batch_size (" + std::to_string(t.batch_size) + "); fix: change one of them");
  if (const std::string why = context_parallel_problem(c); !why.empty()) fail(why);
  if (t.batch_ramp_start > t.batch_size)
    fail("train.batch_ramp_start exceeds train.batch_size; fix: start the ramp at or below the target batch");
  // A time budget ends each island's round on its own clock: fragments would each need their own
  // rounds, and an overlapped exchange would straddle two of them.
  if (c.diloco.sync_seconds > 0 && (c.diloco.fragments != 1 || c.diloco.overlap_steps != 0))
    fail("diloco.sync_seconds > 0 (islands syncing on a time budget) works with diloco.fragments = 1 and "
         "diloco.overlap_steps = 0 (here " + std::to_string(c.diloco.fragments) + " and " +
         std::to_string(c.diloco.overlap_steps) + "); fix: set diloco.fragments = 1 and diloco.overlap_steps = 0, "
         "or diloco.sync_seconds = 0");
  if (const std::string why = outer_delay_problem(c.diloco); !why.empty()) fail(why);
  // An island that reaches the cap H early waits at the outer step's barrier for up to a budget;
  // that wait is bounded by fault.timeout_s, past which the outer step fails.
  if (c.diloco.sync_seconds >= c.fault.timeout_s)
    fail("diloco.sync_seconds (" + fmt_double(c.diloco.sync_seconds) + ") must be below fault.timeout_s (" +
         fmt_double(c.fault.timeout_s) + "): an island that reaches diloco.inner_steps early waits up to a budget "
         "for the others; fix: raise fault.timeout_s well above diloco.sync_seconds, or lower diloco.sync_seconds");
  // The straggler deadline runs from an island's arrival: a fast island at the cap H early would
  // otherwise close the round on an island still within its budget.
  if (c.diloco.sync_seconds > 0 && c.fault.outer_deadline_s > 0 && c.fault.outer_deadline_s <= c.diloco.sync_seconds)
    fail("fault.outer_deadline_s (" + fmt_double(c.fault.outer_deadline_s) + ") must exceed diloco.sync_seconds (" +
         fmt_double(c.diloco.sync_seconds) + "), or an island that reaches diloco.inner_steps early leaves out one "
         "still within its budget; fix: raise fault.outer_deadline_s above diloco.sync_seconds (or 0: no deadline)");
  // The sparse expert exchange keeps an island's unsent progress in its residual: an overlapped
  // exchange's merge would keep part of it in θ_local too (counted twice), and a model without
  // experts has nothing to choose among.
  if (c.diloco.expert_topk > 0 && c.diloco.expert_topk < 1) {
    if (m.n_experts < 2)
      fail("diloco.expert_topk = " + fmt_double(c.diloco.expert_topk) + " chooses among each layer's experts, and "
           "model.n_experts = " + std::to_string(m.n_experts) + " (a dense model) has none to choose; fix: set "
           "diloco.expert_topk = 0");
    if (c.diloco.overlap_steps != 0)
      fail("diloco.expert_topk keeps what an island did not send in its residual, and an overlapped exchange "
           "(diloco.overlap_steps = " + std::to_string(c.diloco.overlap_steps) + ") keeps part of the same progress "
           "in the island's local parameters (diloco.mixing), so it would be counted twice; fix: set "
           "diloco.overlap_steps = 0, or diloco.expert_topk = 0");
  }
  const auto& f = c.fault;
  if (!(f.heartbeat_ttl_s > f.heartbeat_s))
    fail("fault.heartbeat_ttl_s (" + fmt_double(f.heartbeat_ttl_s) + ") must exceed fault.heartbeat_s (" +
         fmt_double(f.heartbeat_s) + "), or a live worker's heartbeat expires between two refreshes; fix: raise "
         "fault.heartbeat_ttl_s to a few heartbeats (e.g. 5 x fault.heartbeat_s)");
  // SentencePiece's byte fallback: 256 byte pieces and 3 specials before any piece of the corpus.
  if (c.data.vocab_size > 0 && c.data.vocab_size < kMinTokenizerVocab)
    fail("data.vocab_size (" + std::to_string(c.data.vocab_size) + ") leaves no room for the tokenizer's 256 byte pieces and 3 "
         "special tokens; fix: use 0 (= model.vocab_size) or at least " + std::to_string(kMinTokenizerVocab));
  // Decoupled decay multiplies every decayed weight by 1 - lr * weight_decay each step: at 1 or
  // above it zeroes or flips them.
  if (c.optim.lr * c.optim.weight_decay >= 1.0)
    fail("optim.lr * optim.weight_decay = " + fmt_double(c.optim.lr * c.optim.weight_decay) +
         " would zero or flip every decayed weight at each step (decay multiplies them by 1 - lr * weight_decay); "
         "fix: lower optim.weight_decay or optim.lr so that their product is below 1");
  if (c.data.vocab_size > m.vocab_size)
    fail("data.vocab_size (" + std::to_string(c.data.vocab_size) + ") exceeds model.vocab_size (" + std::to_string(m.vocab_size) + "); fix: lower data.vocab_size or raise model.vocab_size");
  // A mixture names its prepared datasets itself: data.input or data.dir beside it would be ignored.
  const char* mixing = !c.data.phases.empty() ? "data.phases" : !c.data.mix.empty() ? "data.mix" : nullptr;
  if (!c.data.phases.empty() && !c.data.mix.empty())
    fail("data.mix and data.phases are both set; fix: put the mixture in data.phases[0].mix and remove data.mix");
  if (mixing && (!c.data.input.empty() || !c.data.dir.empty()))
    fail(std::string(mixing) + " is set together with " + (c.data.dir.empty() ? "data.input" : "data.dir") +
         "; fix: prepare each dataset with `atoll data prepare` and list it in " + mixing +
         ", then remove data.input and data.dir");
  validate_phase_settings(c, origin);
}

namespace {

// The settings data.phases may change (context extension): each phase's config must be valid in
// itself (CCA's window, the batch against the micro-batch...), and the context only grows: the
// eval tasks are fitted to the first phase's length, and a checkpoint would claim a shorter
// context than the model was trained on.
void validate_phase_settings(const Config& c, const std::string& origin) {
  int longest = 0;
  std::string longest_at;
  for (size_t i = 0; i < c.data.phases.size(); ++i) {
    const DataPhase& p = c.data.phases[i];
    const std::string at = "data.phases[" + std::to_string(i) + "]";
    Config in = config_in_phase(c, p);
    if (in.model.seq_len < longest)
      throw ConfigError(origin + ": " + at + " trains at model.seq_len = " + std::to_string(in.model.seq_len) +
                        ", shorter than the " + std::to_string(longest) + " of " + longest_at +
                        ": phases extend the context, never shrink it (train.eval_tasks are fitted to the first "
                        "phase's length, and the run's checkpoints would claim a shorter context than the model "
                        "learned); fix: give " + at + ".model.seq_len at least " + std::to_string(longest) +
                        ", or shorten the earlier phase");
    if (in.model.seq_len > longest) longest = in.model.seq_len, longest_at = at;
    if (!p.seq_len && p.rope_theta == 0 && !p.batch_size) continue;
    in.data.phases.clear();
    validate_config(in, origin + " (with the settings of " + at + ")");
  }
}

}  // namespace

std::string config_to_toml(const Config& cfg) {
  Config c = cfg;
  Writer w;
  visit_config(c, w);
  return w.out.str();
}

std::map<std::string, std::string> config_values(const Config& cfg) {
  Config c = cfg;
  Writer w;
  visit_config(c, w);
  return w.values;
}

std::string model_config_to_toml(const ModelConfig& m) {
  Config c;
  c.model = m;
  std::string all = config_to_toml(c);
  return all.substr(0, all.find("\n[train]")) + "\n";
}

}  // namespace atl
