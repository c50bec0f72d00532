#include "atoll/train/rollback.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"

namespace atl {
namespace {

// Rollbacks in a row before the run gives up: past this, θ itself (or the data) is broken and
// rolling back again would loop forever.
constexpr int kMaxRollbacksInARow = 8;

}  // namespace

void LossWindow::add(double loss) {
  if (losses_.size() < window_) losses_.push_back(loss);
  else losses_[next_] = loss;
  next_ = (next_ + 1) % window_;
}

double LossWindow::median() const {
  if (losses_.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> s = losses_;
  const size_t mid = (s.size() - 1) / 2;
  std::nth_element(s.begin(), s.begin() + std::ptrdiff_t(mid), s.end());
  return s[mid];
}

RollbackHook::RollbackHook(const Config& cfg, const RollbackPlace& place, ProcessGroup& inner, DilocoSync& diloco,
                           JsonlWriter* events)
    : spike_factor_(cfg.fault.spike_factor), place_(place), inner_(inner), diloco_(diloco), events_(events),
      window_(cfg.fault.spike_window) {}

bool RollbackHook::keep_batch(Loop& loop, double loss) {
  if (loop.step < place_.dp_warmup) return true;
  const int64_t step = loop.step + 1;  // the step this batch would be, as metrics.jsonl counts
  double island_loss = fault_loss(step, loss);
  if (place_.workers_per_island > 1) {  // the island's mean: a NaN anywhere is a NaN everywhere
    float x = float(island_loss);
    inner_.allreduce_sum(&x, 1);
    island_loss = double(x) / place_.workers_per_island;
  }
  const double median = window_.median();
  const bool finite = std::isfinite(island_loss);
  const bool spike = finite && spike_factor_ > 0 && window_.full() && island_loss > spike_factor_ * median;
  if (finite && !spike) {
    window_.add(island_loss);
    in_a_row_ = 0;
    return true;
  }
  if (++in_a_row_ > kMaxRollbacksInARow)
    throw Error("island " + std::to_string(place_.island) + ": loss " + std::to_string(island_loss) + " at step " +
                std::to_string(step) + " after " + std::to_string(kMaxRollbacksInARow) +
                " rollbacks in a row; fix: lower optim.lr or raise optim.warmup_steps, or resume from an earlier "
                "checkpoint");
  Engine& engine = *loop.engine;
  // Where the round began: θ, or the island's eager starts (each fragment's) with a delayed outer step.
  const std::vector<float>& theta = diloco_.theta();
  if (place_.delay) place_.delay->round_start(theta, engine.host().params);
  else std::copy(theta.begin(), theta.end(), engine.host().params);
  engine.to_device(kParams);
  if (events_ && place_.rank == 0) {
    nlohmann::json e = {{"island", place_.island}, {"rank", place_.rank}, {"step", step},
                        {"outer_step", diloco_.outer_step()}, {"reason", finite ? "spike" : "not finite"}};
    e["loss"] = finite ? nlohmann::json(island_loss) : nlohmann::json(std::to_string(island_loss));
    e["median"] = std::isfinite(median) ? nlohmann::json(median) : nlohmann::json(nullptr);
    events_->write(event_row("rollback", e));
  }
  return false;
}

}  // namespace atl
