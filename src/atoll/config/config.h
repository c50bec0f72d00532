// The run configuration: every key of every section, declared once in config.cc
// (visit_config), from which TOML parsing, `--set key=value` overrides, validation, help text
// and the printed resolved config all come. Sections follow DESIGN.md:
// [model] [train] [optim] [data] [diloco] [checkpoint] [fault].
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "atoll/model/model_config.h"

namespace atl {

struct TrainConfig {
  int64_t steps = 300;
  int batch_size = 8;         // sequences per optimizer step per worker
  int micro_batch_size = 0;   // sequences per forward/backward; 0 = batch_size
  int batch_ramp_start = 0;   // sequences per step at the start of the ramp; 0 = no ramp
  int64_t batch_ramp_tokens = 0;  // tokens over which the batch grows to batch_size
  int64_t seed = 42;          // data order and sampling
  int64_t eval_every = 100;   // steps between validation passes; 0 = never
  int eval_batches = 8;       // validation batches per pass
  std::vector<std::string> eval_tasks{};  // multiple-choice task files scored at each evaluation (docs/tasks.md)
  int64_t log_every = 1;
  double peak_gflops = 0;     // MFU in metrics rows: > 0 this per-device peak, < 0 measured at start, 0 none
  std::string precision = "fp32";  // fp32 | bf16
  int threads = 0;            // 0 = all cores
  std::string device = "cpu";
  bool memory_check = true;   // refuse a model and batch that would not fit (engine/memory_estimate.h)
  int context_parallel = 1;   // P: ranks of an island that split each sequence (ring attention, docs/long_context.md)
};

struct OptimConfig {
  std::string name = "adamw";  // adamw | muon (Muon for hidden matrices, AdamW for the rest) | sgd
  double lr = 3e-3;
  double min_lr_ratio = 0.1;    // final lr = lr * min_lr_ratio
  std::string schedule = "cosine";  // cosine | wsd | constant
  int64_t warmup_steps = 20;
  double decay_frac = 0.2;      // wsd: fraction of steps spent decaying
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;       // global-norm clip; 0 = off
  double muon_momentum = 0.95;
  int ns_steps = 5;
  // Bias balancing of the zaya router (optim/bias_balance.h): AdamW's learning rate on the
  // balancing biases, whose gradient is each expert's load error p_e - 1/E. 1e-4: the biases add
  // to probabilities, and Adam moves them about lr a step whatever the error, so a larger rate
  // overshoots and herds the tokens onto one expert (docs/benchmarks.md, the balancing-rate sweep).
  double bias_balance_lr = 1e-4;
  // ZeRO-1 inside an island (optim/zero_shard.h): with more than one worker per island, each
  // holds and steps 1/M of the optimizer state. Off by default: see docs/islands.md.
  bool zero1 = false;
};

// One prepared dataset of a mixture and its share (weights are relative: 0.7 and 0.3, or 7 and 3).
struct MixSource {
  std::string dir;
  double weight = 1.0;
  bool operator==(const MixSource&) const = default;
};

// From `at_tokens` tokens trained on (every worker's), the run draws from `mix`, with the
// sequence length, RoPE base and batch size the phase sets (ZAYA1's context extension: 4k, then
// 32k with theta raised, in one run). 0 = the config's own model.seq_len, model.rope_theta,
// train.batch_size; a phase does not inherit an earlier phase's settings.
struct DataPhase {
  int64_t at_tokens = 0;
  std::vector<MixSource> mix;
  int seq_len = 0;          // model.seq_len
  double rope_theta = 0;    // model.rope_theta
  int batch_size = 0;       // train.batch_size
  bool operator==(const DataPhase&) const = default;
};

struct DataConfig {
  std::vector<std::string> input;  // text files, folders or JSONL; empty = built-in corpus
  std::string dir;                 // prepared shards; empty = a cache folder per input
  int vocab_size = 0;              // tokenizer vocabulary; 0 = model.vocab_size
  double val_fraction = 0.02;
  std::vector<MixSource> mix;      // several prepared datasets with weights (data/mixture_loader.h)
  std::vector<DataPhase> phases;   // mixtures that change at token counts; the first at 0
};

// The phases a run draws from: data.phases, else data.mix as one phase, else empty (one dataset,
// data.dir or the cache folder).
std::vector<DataPhase> data_phases(const DataConfig& d);

struct Config;
// The keys a data.phases entry may set, as they are named there and in errors.
inline constexpr const char* kPhaseKeysText = "model.seq_len, model.rope_theta and train.batch_size";
// `c` with the settings of `phase` in force (model.seq_len, model.rope_theta, train.batch_size).
Config config_in_phase(const Config& c, const DataPhase& phase);
// `c` with the settings of the phase in force once `tokens` were trained on (the last phase
// whose at_tokens is reached), as a checkpoint of that many tokens holds its model; `c` itself
// without data.phases.
Config config_at_tokens(const Config& c, int64_t tokens);

struct DilocoConfig {
  int64_t inner_steps = 100;  // H
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  std::string codec = "int8";  // fp32 | bf16 | int8 | int4
  int fragments = 1;
  int overlap_steps = 0;
  double mixing = 0.5;          // α: θ_local ← α·θ_local + (1−α)·θ after an overlapped exchange
  bool error_feedback = false;  // keep each island's quantization residual for the next round
  std::string compress = "zstd";  // zstd | none: lossless entropy coding of the codec bytes
  int connections = 2;          // TCP streams per peer for the outer all-reduce
  int chunk_kb = 1024;          // fp32 KiB per pipelined chunk of the outer all-reduce
  int64_t dp_warmup_steps = 0;  // first steps in plain data parallel across all islands, then DiLoCo
  double sync_seconds = 0.0;    // > 0: a round ends once this much wall time passed (H its cap); Δ weighted by tokens
  std::string expert_merge = "mean";  // mean | tokens: each expert's Δ weighted by the tokens each island routed to it
  double expert_topk = 0.0;  // fraction of each layer's experts an island sends per round (0 or 1: all)
  int outer_delay = 0;  // 1: round r's exchange overlaps round r+1, eager local step meanwhile (dist/outer_delay.h)
};

struct CheckpointConfig {
  int64_t every = 0;  // steps between checkpoints; 0 = only at the end
  int keep = 3;       // keep the newest N
  double grace_s = 60.0;  // SIGTERM to `atoll train`, `atoll launch` or a worker: seconds to write the final checkpoint
};

// Elastic islands (docs/islands.md "Faults, membership and rejoin").
struct FaultConfig {
  double timeout_s = 60.0;         // bound on any wait for a peer or the store
  int max_restarts = 3;            // restarts of one worker in a row without progress before the run fails
  double restart_backoff_s = 1.0;  // delay before the first restart; doubles with each, capped at 60 s
  double heartbeat_s = 1.0;        // interval of a worker's heartbeat in the store
  double heartbeat_ttl_s = 5.0;    // a heartbeat not refreshed for this long marks its worker lost
  double clip_factor = 2.0;        // an island's Δ is clipped to this x the round's median norm (0 = off)
  double min_cosine = 0.0;         // an island's Δ pointing against the round's (cosine below this) is dropped
  double outer_deadline_s = 0.0;   // an outer step waits at most this for an island (0 = for every live island)
  double spike_factor = 0.0;       // a loss above this x the running median rolls the island back (0 = off)
  int spike_window = 32;           // losses in that running median
  double step_timeout_s = 600.0;   // `atoll launch` kills and restarts a worker whose step hangs this long (0 = off)
  double rejoin_timeout_s = 600.0; // a worker without a launcher, dropped by the others, retries rejoining this long (0 = exit 75 at once)
};

// Traffic between islands (docs/islands.md "Sealed traffic").
struct DistConfig {
  bool seal = true;  // seal the outer group's frames and authenticate the store's records with the run token's keys
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  OptimConfig optim;
  DataConfig data;
  DilocoConfig diloco;
  CheckpointConfig checkpoint;
  FaultConfig fault;
  DistConfig dist;
};

// One declared key, for help text and listings.
struct ConfigKeyInfo {
  std::string key;            // "section.name"
  std::string type;           // int | float | bool | string | list
  std::string help;
  std::string default_value;  // as TOML: 0.9, "adamw", true, []
  std::string allowed;        // "[0, 1)", "> 0", ">= 1", "adamw | muon | sgd", "true | false"
};
std::vector<ConfigKeyInfo> config_keys();

// `atoll train --help-config`: one line per key with its type, default, allowed values and
// meaning, in declaration order.
std::string config_help_text();

// Loads `path` (empty = defaults only), applies `overrides` ("key=value", value in TOML syntax
// or a bare string), validates and returns the config. Throws ConfigError naming the file,
// the key and the fix (also for one key given twice with --set). `given`, when not null,
// receives every key the file or --set set (not those left at their defaults).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   std::vector<std::string>* given = nullptr);

// Same, from TOML text (`origin` names it in errors).
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {}, std::vector<std::string>* given = nullptr);

// Cross-field checks (head dims, top-k, batch divisibility...). Throws ConfigError.
void validate_config(const Config& cfg, const std::string& origin);

// The resolved config as TOML (every key, defaults included); parse_config(to_toml(c)) == c.
std::string config_to_toml(const Config& cfg);

// Every key's value as TOML ("model.dim" -> "128"), as config_to_toml writes them.
std::map<std::string, std::string> config_values(const Config& cfg);

// Only the [model] section, for comparing shapes across runs and checkpoints.
std::string model_config_to_toml(const ModelConfig& m);

}  // namespace atl
