// What a resumed run may change of the config it was started with (RUN_DIR/config.toml).
//
// `atoll train --resume` and `atoll launch --resume` continue a run with its own config.toml;
// `--set` (or a `--config` file) may change the keys of kResumeSafeKeys: how long the run goes,
// how often it evaluates (and on which task files), logs and checkpoints, how many checkpoints it keeps, its threads, its
// timeout, whether an island shards its optimizer state (optim.zero1: the same state, held in
// shards; a checkpoint's content does not depend on it) and how many of its workers split each
// sequence (train.context_parallel: the same computation; checkpoints hold whole tensors). These steer the run without changing
// what a step computes (train.steps does move the learning-rate schedule's end, which is what
// extending a run means; ZeRO-1 rounds differently with 3 or more workers per island). Every other key (the
// optimizer, the data, the batch, DiLoCo...) would make the resumed run another run than the one
// its checkpoint belongs to, so a change is refused with the key and both values named, unless
// the user asks for it (`--allow-config-change`). A [model] key cannot change at all: the
// checkpoint holds a model of that shape; except model.seq_len and model.rope_theta (context
// extension, kResumeContextKeys), which the weights' shapes do not depend on: a change is
// accepted and logged (the resume event's config_changes), as data.phases would change them.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/config/config.h"

namespace atl {

// The one list of keys a --resume may change without --allow-config-change (docs: docs/checkpoints.md).
inline constexpr std::array<std::string_view, 13> kResumeSafeKeys = {
    "train.steps",     "train.eval_every", "train.eval_batches", "train.eval_tasks", "train.log_every",   "train.threads",
    "train.peak_gflops",
    "checkpoint.every", "checkpoint.keep", "checkpoint.grace_s", "fault.timeout_s",  "optim.zero1",
    "train.context_parallel"};

// The [model] keys a --resume may change, logged: a longer (or other) context and its RoPE base.
inline constexpr std::array<std::string_view, 2> kResumeContextKeys = {"model.seq_len", "model.rope_theta"};

// One key whose value differs: "train.steps", "4" in the run, "6" now (TOML values).
struct ConfigChange {
  std::string key, was, now;
  bool safe() const;         // in kResumeSafeKeys or kResumeContextKeys
  bool model() const;        // a [model] key that fixes the checkpoint's shape (not kResumeContextKeys)
  std::string text() const;  // "train.steps: 4 -> 6"
};

// Every key whose value differs between the run's config and the new one, in declaration order.
std::vector<ConfigChange> config_changes(const Config& was, const Config& now);

// kResumeSafeKeys as "train.steps, train.eval_every, ..." (help text and error messages).
std::string resume_safe_keys_text();

}  // namespace atl
