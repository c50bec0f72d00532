// The one training driver (DESIGN.md "train/"): the steps of every run, single-process or a
// worker of a multi-island run. A single-process `atoll train` is one island of one worker:
// the same steps, no store, no groups, no hooks.
//
// run_steps is a short loop of two parts: the step (step.h train_step: the batch's gradients,
// the hooks' means, the update, as llm.c's train_gpt2.c) and the cadence around it (cadence.h:
// which step validates, saves a checkpoint, writes its row, ends the run). Each turn:
// hooks.before_step (an elastic run's membership changes), the step, hooks.after_inner_step
// (DiLoCo's outer steps; a hook may move loop.step ahead: cadence.h), validation (and train.eval_tasks) where the
// cadence has it due (and opts.evaluates() says this process evaluates), hooks.finish_row, the
// checkpoint the cadence has due once hooks.can_checkpoint() allows it, the metrics row, the
// progress line, and the end of the run (its last step, a stop request once its checkpoint is
// written, opts.stop_after). A checkpoint blocks the step only for its plan
// (state_checkpoint.h); its copy of the saved tensors runs in the background while the next step
// computes its gradients, which only read them, and that step waits at its fence before anything
// writes them (step.h). The row of the step that started the save carries ckpt_stall_s and
// ckpt_write_s, the next row ckpt_fence_s, and the run waits for the save in flight before it
// returns.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"
#include "atoll/train/progress.h"
#include "atoll/train/state_checkpoint.h"

namespace atl {

// This process's seconds so far, by what it was doing (cumulative).
struct StepClocks {
  double compute_s = 0;  // gradients, clipping and the optimizer
  double comm_s = 0;     // collectives: gradient means and outer-step exchanges
  double idle_s = 0;     // waiting at a barrier for other islands
  double overlap_s = 0;  // wall time of exchanges overlapped with inner steps
};

// What a kind of run adds to the step; each default does nothing (a single-process run).
class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // Before a step's batch (loop.step: the steps done): membership changes between steps.
  virtual void before_step(Loop& loop) { (void)loop; }
  // After the batch's gradients, before the NaN check (loop.step: the steps done before this
  // one). Its time counts as communication.
  virtual void after_gradients(Loop& loop) { (void)loop; }
  // After after_gradients, with the batch's loss: false skips the batch (no optimizer step, the
  // step does not count; the hook has rolled back what it must: train/rollback.h).
  virtual bool keep_batch(Loop& loop, double loss) { return (void)loop, (void)loss, true; }
  // After the inner step (loop.step counts it): may fill the row's outer-step fields.
  virtual void after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) { (void)loop, (void)row, (void)clocks; }
  // The row's fields of this kind of run, at the end of the step.
  virtual void finish_row(StepRow& row, const StepClocks& clocks) { (void)row, (void)clocks; }
  // Whether a due checkpoint may be written now; false delays it (an exchange in flight).
  virtual bool can_checkpoint() { return true; }
  // Whether every island holds this step now: always, except for islands on a time budget
  // (diloco.sync_seconds), which agree only right after a committed outer step (where a slow one
  // may have jumped ahead). Checkpoints fall due only there.
  virtual bool steps_agreed() { return true; }
};

// Hooks in a row: each call goes to every hook in the order given (the step meets them in that
// order: the in-island mean before the warm start's mean across islands, say); a checkpoint may
// be written when every hook allows it. A kind of run is a list of the hooks it needs.
class HookList final : public StepHooks {
 public:
  explicit HookList(std::vector<StepHooks*> hooks) : hooks_(std::move(hooks)) {}
  void before_step(Loop& loop) override {
    for (StepHooks* h : hooks_) h->before_step(loop);
  }
  void after_gradients(Loop& loop) override {
    for (StepHooks* h : hooks_) h->after_gradients(loop);
  }
  bool keep_batch(Loop& loop, double loss) override {
    bool keep = true;
    for (StepHooks* h : hooks_) keep = h->keep_batch(loop, loss) && keep;
    return keep;
  }
  void after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) override {
    for (StepHooks* h : hooks_) h->after_inner_step(loop, row, clocks);
  }
  void finish_row(StepRow& row, const StepClocks& clocks) override {
    for (StepHooks* h : hooks_) h->finish_row(row, clocks);
  }
  bool can_checkpoint() override {
    for (StepHooks* h : hooks_)
      if (!h->can_checkpoint()) return false;
    return true;
  }
  bool steps_agreed() override {
    for (StepHooks* h : hooks_)
      if (!h->steps_agreed()) return false;
    return true;
  }

 private:
  std::vector<StepHooks*> hooks_;
};

struct DriverOptions {
  std::string who{};          // "island I rank R" in a multi-process run: prefixes errors
  int workers = 1;            // W: the workers whose batches make one global step
  // The devices computing it, MFU's denominator: 0 = workers; W·P when P ranks split each
  // worker's sequences (train.context_parallel).
  int devices = 0;
  double peak_gflops = 0;     // > 0: each row's mfu against W devices of this peak (bench.h mfu_peak)
  // Whether this process runs validation now (in a multi-process run, the lowest live island's rank 0).
  std::function<bool()> evaluates = [] { return true; };
  Progress* progress = nullptr;                          // the live progress line, if any
  std::function<void(const nlohmann::json&)> write_row{};  // one metrics row
  // Starts a checkpoint of loop.step (every worker takes part in a multi-process run), written
  // in the background; returns what it cost the step.
  std::function<SaveReport()> save{};
  // Waits for the save in flight; returns the newest checkpoint this process committed, else "".
  std::function<std::string()> finish_saves{};
  // Waits until the save in flight has copied what it saves (Checkpointer::fence): the seconds
  // waited, once per save, else nullopt.
  std::function<std::optional<double>()> fence{};
  int64_t stop_after = 0;         // > 0: return after this step, as if interrupted
  double t_start = 0;             // now_s() at the run's start (a launched worker's) or the process's: time_s counts from it
  // Asked after every step: true stops the run there, with a checkpoint of that step (written
  // as soon as hooks.can_checkpoint() allows). Ctrl-C in `atoll train` (stop_signals.h).
  std::function<bool()> stop_requested{};
};

struct DriverResult {
  std::string checkpoint;  // the newest this process wrote
  double first_loss = 0, final_loss = 0, final_val_loss = -1;
  bool stopped = false;    // stop_requested ended the run before its last step
};

// Steps from loop.step to cfg.train.steps (or opts.stop_after, or a stop request); saves a
// checkpoint at the end if none was written.
DriverResult run_steps(Loop& loop, StepHooks& hooks, const DriverOptions& opts);

}  // namespace atl
