// What a worker of a multi-island run adds to the driver's step (driver.h StepHooks): three
// hooks, each one concern, in the order the step meets them (IslandHooks lists them):
//   IslandMeanHook  after_gradients: the island's gradient mean every step (NCCL in device
//                   memory when the engine has it, else Gloo over the island group on the host
//                   copy; with ZeRO-1 reduce-scattered onto the ranks' shards, the engine's
//                   step then all-gathers the parameters: engine.h zero1); finish_row: island,
//                   rank and this process's communication figures.
//   WarmStartHook   after_gradients: during the data-parallel warm start (diloco.dp_warmup_steps)
//                   the mean across islands too, so every worker takes the same step;
//                   after_inner_step: at its end θ ← the warm parameters (checked by hash).
//   DilocoHook      after_inner_step: the outer steps that streaming DiLoCo has due
//                   (dist/streaming.h), on the host copy of the parameters, and their dropped or
//                   clipped Δs (dist/update_guard.h) as events; can_checkpoint: not while an
//                   exchange is in flight (diloco.outer_delay = 1: but right after it started,
//                   from the state the checkpoint saves, dist/outer_delay.h). Time budget (diloco.sync_seconds): each step's tokens
//                   to the round; at a commit the island adopts the round's furthest step (the
//                   step counter and the optimizer's, so the schedule, checkpoints and the run's
//                   end agree) and its tokens in all; steps_agreed only right after a commit.
//                   diloco.expert_merge = "tokens": each step's tokens per expert to the round.
//   ElasticHook     before_step: the joiners a committed outer step admitted receive the run's
//                   state before anyone takes the next step (state_transfer.h);
//                   after_inner_step: after a committed outer step, this worker's membership
//                   record (its data cursor), which a restarted worker continues from.
//   ProgressHook    before_step: the watchdog's progress mark (train/progress_mark.h).
//   RollbackHook    keep_batch: a non-finite or spiking loss rolls the island back to θ and
//                   skips the batch (train/rollback.h).
// The outer group is elastic (dist/elastic_group.h): hooks ask it for the current group.
// Stragglers need no hook (dist/elastic_group.h await_round); a router's bias balancing needs none
// (its loads ride on the gradient mean: optim/bias_balance.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/diloco.h"
#include "atoll/dist/elastic_group.h"
#include "atoll/dist/group.h"
#include "atoll/dist/streaming.h"
#include "atoll/train/driver.h"
#include "atoll/train/progress_mark.h"
#include "atoll/train/rollback.h"
#include "atoll/train/state_registry.h"

namespace atl {

struct IslandPlace {
  int island = 0, rank = 0;  // this worker
  int islands = 1, workers_per_island = 1;
  std::string who{};  // "island I rank R", for errors
  // Bytes this worker sent for checkpoint saves (the island's residual sum), left out of
  // comm_bytes (the training traffic that DiLoCo and data parallel are compared by); null: none.
  const uint64_t* checkpoint_bytes = nullptr;
  std::string progress_file{};  // touched as each step begins, for the launcher's watchdog ("" = none)
};

// Steps 1..dp_warmup are data parallel across every worker (diloco.dp_warmup_steps, at most
// train.steps); DiLoCo then starts from θ = the warm parameters and counts its steps from there.
int64_t dp_warmup_steps(const Config& cfg);

class IslandMeanHook final : public StepHooks {
 public:
  IslandMeanHook(const Config& cfg, const IslandPlace& place, ProcessGroup& inner, ElasticGroup& outer)
      : cfg_(cfg), place_(place), inner_(inner), outer_(outer) {}
  void after_gradients(Loop& loop) override;
  void finish_row(StepRow& row, const StepClocks& clocks) override;

 private:
  const Config& cfg_;
  IslandPlace place_;
  ProcessGroup& inner_;
  ElasticGroup& outer_;
};

class WarmStartHook final : public StepHooks {
 public:
  // events: worker 0's events.jsonl ("diloco_start"), null elsewhere.
  WarmStartHook(const Config& cfg, const IslandPlace& place, ProcessGroup& inner, ElasticGroup& outer,
                DilocoSync& diloco, JsonlWriter* events)
      : place_(place), inner_(inner), outer_(outer), diloco_(diloco), events_(events),
        dp_warmup_(dp_warmup_steps(cfg)) {}
  void after_gradients(Loop& loop) override;
  void after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) override;
  const std::string& theta_hash() const { return theta_hash_; }  // θ's at the end of the warm start

 private:
  IslandPlace place_;
  ProcessGroup& inner_;
  ElasticGroup& outer_;
  DilocoSync& diloco_;
  JsonlWriter* events_;
  int64_t dp_warmup_;
  std::vector<size_t> shards_;  // the gradient shards over the island
  std::string theta_hash_;
};

class DilocoHook final : public StepHooks {
 public:
  DilocoHook(const Config& cfg, const IslandPlace& place, ElasticGroup& outer, DilocoSync& diloco,
             StreamingDiloco& streaming, JsonlWriter* incidents)
      : place_(place), outer_(outer), diloco_(diloco), streaming_(streaming), incidents_(incidents),
        dp_warmup_(dp_warmup_steps(cfg)), diloco_steps_(cfg.train.steps - dp_warmup_),
        budget_(cfg.diloco.sync_seconds > 0), delayed_(cfg.diloco.outer_delay > 0) {}
  void after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) override;
  bool can_checkpoint() override { return streaming_.checkpoint_safe() && agreed_; }
  bool steps_agreed() override { return agreed_; }
  const std::string& theta_hash() const { return theta_hash_; }  // after the newest outer step

 private:
  // The outer steps' dropped and clipped Δs in events.jsonl, from the view's lowest island (each
  // rank for its shard of Δ, which its outer group guarded).
  void log_incidents(const StreamStep& st, const Loop& loop);
  // Time budget: a committed round's furthest step and tokens, adopted (see above).
  void adopt_round(Loop& loop, StepRow& row, const StreamStep& st);

  IslandPlace place_;
  ElasticGroup& outer_;
  DilocoSync& diloco_;
  StreamingDiloco& streaming_;
  JsonlWriter* incidents_;
  int64_t dp_warmup_, diloco_steps_;  // steps of the warm start, and of DiLoCo after it
  bool budget_;                       // diloco.sync_seconds > 0
  bool delayed_;                      // diloco.outer_delay = 1: the exchange in flight finishes only at a due step
  bool agreed_ = true;                // every island holds this step (steps_agreed)
  int64_t round_counted_ = 0;         // tokens the driver counted in this round (every worker's batch as this one's)
  std::string theta_hash_;
};

class ElasticHook final : public StepHooks {
 public:
  ElasticHook(const Config& cfg, ElasticGroup& outer, StreamingDiloco& streaming, TrainingState& state)
      : cfg_(cfg), outer_(outer), streaming_(streaming), state_(state) {}
  void before_step(Loop& loop) override;
  void after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) override;

 private:
  const Config& cfg_;
  ElasticGroup& outer_;
  StreamingDiloco& streaming_;
  TrainingState& state_;
};

// The hooks of an island worker, in order.
class IslandHooks final : public StepHooks {
 public:
  IslandHooks(const Config& cfg, const IslandPlace& place, ProcessGroup& inner, ElasticGroup& outer,
              DilocoSync& diloco, StreamingDiloco& streaming, TrainingState& state, JsonlWriter* events,
              JsonlWriter* incidents)
      : mean_(cfg, place, inner, outer),
        warm_(cfg, place, inner, outer, diloco, events),
        diloco_(cfg, place, outer, diloco, streaming, incidents),
        elastic_(cfg, outer, streaming, state),
        rollback_(cfg,
                  {.island = place.island, .rank = place.rank, .workers_per_island = place.workers_per_island,
                   .dp_warmup = dp_warmup_steps(cfg), .delay = state.delay},
                  inner, diloco, incidents),
        progress_(place.progress_file),
        list_({&progress_, &mean_, &warm_, &diloco_, &elastic_, &rollback_}) {}
  void before_step(Loop& loop) override { list_.before_step(loop); }
  void after_gradients(Loop& loop) override { list_.after_gradients(loop); }
  bool keep_batch(Loop& loop, double loss) override { return list_.keep_batch(loop, loss); }
  void after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) override {
    list_.after_inner_step(loop, row, clocks);
  }
  void finish_row(StepRow& row, const StepClocks& clocks) override { list_.finish_row(row, clocks); }
  bool can_checkpoint() override { return list_.can_checkpoint(); }
  bool steps_agreed() override { return list_.steps_agreed(); }

  // θ's hash after the newest outer step, or at the end of the warm start; "" before either.
  const std::string& theta_hash() const {
    return diloco_.theta_hash().empty() ? warm_.theta_hash() : diloco_.theta_hash();
  }

 private:
  IslandMeanHook mean_;
  WarmStartHook warm_;
  DilocoHook diloco_;
  ElasticHook elastic_;
  RollbackHook rollback_;
  ProgressHook progress_;
  HookList list_;
};

}  // namespace atl
