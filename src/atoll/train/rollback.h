// Rollback on a broken batch (fault.spike_factor, fault.spike_window): an island worker whose
// step's loss is not finite, or above spike_factor x the running median of the island's last
// spike_window losses, rolls its parameters back to θ (DiLoCo's parameters at the last
// committed outer step; before the first one, the parameters DiLoCo started from) and skips the
// batch: the driver takes no optimizer step for it and the step does not count, so the island
// reaches its next outer step at the same step as the others. The inner optimizer's moments are
// kept: the check comes before the optimizer step, so the bad batch never reached them.
//
// With M > 1 the decision is on the island's mean loss (one all-reduce of a float over the
// island), so every worker of the island rolls back alike. During the data-parallel warm start
// (diloco.dp_warmup_steps) it is off: the islands share every gradient there and one island
// cannot roll back alone; a non-finite loss ends the run as before.
#pragma once

#include <cstdint>
#include <vector>

#include "atoll/dist/diloco.h"
#include "atoll/dist/group.h"
#include "atoll/dist/outer_delay.h"
#include "atoll/train/driver.h"
#include "atoll/train/metrics.h"

namespace atl {

struct RollbackPlace {
  int island = 0, rank = 0, workers_per_island = 1;
  int64_t dp_warmup = 0;  // steps of the data-parallel warm start (off there)
  const OuterDelay* delay = nullptr;  // diloco.outer_delay = 1: the island rolls back to its round's start
};

// The running median of the last `window` accepted losses.
class LossWindow {
 public:
  explicit LossWindow(int window) : window_(size_t(window)) {}
  void add(double loss);
  bool full() const { return losses_.size() == window_; }
  double median() const;  // the lower median; NaN while empty

 private:
  size_t window_, next_ = 0;
  std::vector<double> losses_;
};

class RollbackHook final : public StepHooks {
 public:
  // events: where `rollback` goes (written by rank 0 of the island).
  RollbackHook(const Config& cfg, const RollbackPlace& place, ProcessGroup& inner, DilocoSync& diloco,
               JsonlWriter* events);
  bool keep_batch(Loop& loop, double loss) override;

 private:
  double spike_factor_;
  RollbackPlace place_;
  ProcessGroup& inner_;
  DilocoSync& diloco_;
  JsonlWriter* events_;
  LossWindow window_;
  int in_a_row_ = 0;  // rollbacks since the last accepted batch
};

}  // namespace atl
