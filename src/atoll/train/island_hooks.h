// What a worker of a multi-island run adds to the driver's step (driver.h StepHooks), in the
// order the step meets them:
//   after_gradients   the island's gradient mean every step (NCCL in device memory when the
//                     engine has it, else Gloo over the island group on the host copy), and
//                     during the data-parallel warm start (diloco.dp_warmup_steps) the mean
//                     across islands too, so every worker takes the same step;
//   after_inner_step  DiLoCo: at the end of the warm start θ ← the warm parameters; then the
//                     outer steps that streaming DiLoCo has due (dist/streaming.h), on the host
//                     copy of the parameters;
//   finish_row        island, rank and this process's communication figures;
//   can_checkpoint    not while an exchange is in flight.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atoll/config/config.h"
#include "atoll/dist/diloco.h"
#include "atoll/dist/group.h"
#include "atoll/dist/streaming.h"
#include "atoll/train/driver.h"

namespace atl {

struct IslandPlace {
  int island = 0, rank = 0;  // this worker
  int islands = 1, workers_per_island = 1;
  std::string who{};  // "island I rank R", for errors
};

class IslandHooks final : public StepHooks {
 public:
  // events: worker 0's events.jsonl ("diloco_start"), null elsewhere.
  IslandHooks(const Config& cfg, const IslandPlace& place, ProcessGroup& inner, ProcessGroup& outer,
              DilocoSync& diloco, StreamingDiloco& streaming, JsonlWriter* events);

  void after_gradients(Loop& loop) override;
  void after_inner_step(Loop& loop, StepRow& row, StepClocks& clocks) override;
  void finish_row(StepRow& row, const StepClocks& clocks) override;
  bool can_checkpoint() override { return !streaming_.in_flight(); }

  const std::string& theta_hash() const { return theta_hash_; }  // after the newest outer step

 private:
  const Config& cfg_;
  IslandPlace place_;
  ProcessGroup &inner_, &outer_;
  DilocoSync& diloco_;
  StreamingDiloco& streaming_;
  JsonlWriter* events_;
  int64_t dp_warmup_, diloco_steps_;  // steps of the warm start, and of DiLoCo after it
  std::vector<size_t> shards_;        // the warm start's gradient shards over the island
  std::string theta_hash_;
};

}  // namespace atl
