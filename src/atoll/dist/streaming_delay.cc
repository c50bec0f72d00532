// StreamingDiloco's delayed outer step, diloco.outer_delay = 1 (outer_delay.h has the update
// written out). Every H inner steps, on the main thread:
//   1. the exchange in flight (the round before's Δ) is finished and its outer step applied to
//      θ and m only: θ_local is not touched, it trained on from the eager start. A failed
//      exchange is voted down and retried here, blocking, as an overlapped one is (streaming.h);
//   2. the round just ended gives Δ = s − θ_local, from where the round began;
//   3. θ_local ← s ← the eager start from the new θ and m, and Δ's exchange starts behind the
//      next round.
// The last step, and a commit that admits joiners, exchange the new Δ blocking instead and set
// θ_local ← θ: the run ends on θ everywhere, and joiners receive a state with nothing in flight
// (the next round starts from θ, as the first one does).
#include <algorithm>

#include "atoll/core/check.h"
#include "atoll/core/timer.h"
#include "atoll/dist/streaming.h"

namespace atl {

StreamStep StreamingDiloco::delayed_step(int64_t step, int64_t last_step, float* theta_local) {
  StreamStep out;
  const bool last = step >= last_step;
  if (!last && schedule_.due(step, last_step) < 0) return out;
  OuterDelay& delay = *opts_.delay;
  if (in_flight()) out.synced = finish_in_flight(/*theta_local=*/nullptr, /*admit=*/!last, out);
  const double s0 = now_s();
  sync_.snapshot(0, theta_local, delay.round_start(sync_.theta()));
  if (last || admission_) {
    delay.set_pending(false);
    out.synced = blocking_step(0, theta_local, /*admit=*/false, out);
    return out;
  }
  std::vector<float>& s = delay.start();
  ATOLL_CHECK_EQ(sync_.delta(0).size(), s.size());  // one fragment: Δ in θ's layout
  const DilocoOptions& o = sync_.options();
  eager_start(s.data(), sync_.theta().data(), sync_.momentum().data(), sync_.delta(0).data(), s.size(), o.outer_lr,
              o.outer_momentum);
  std::copy(s.begin(), s.end(), theta_local);
  delay.set_pending(true);
  delay.inputs().take(sync_);  // the residuals before the exchange replaces them, for a checkpoint
  start_exchange(0, step, out);
  out.comm_s += now_s() - s0;  // the snapshot and the eager start: the main thread's outer-step work
  return out;
}

void StreamingDiloco::resume_in_flight(int64_t step) {
  ATOLL_CHECK(opts_.delay && opts_.delay->pending() && !in_flight())
      << "resuming an exchange in flight without a pending delayed outer step";
  StreamStep unused;
  opts_.delay->inputs().take(sync_);  // the restored residuals: a checkpoint taken now saves them again
  start_exchange(0, step, unused);
  last_after_ = step;
}

}  // namespace atl
