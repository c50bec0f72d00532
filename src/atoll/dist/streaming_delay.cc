// StreamingDiloco's delayed outer step, diloco.outer_delay = 1 (outer_delay.h has the update
// written out). At fragment f's due step (every H inner steps with one fragment), on the main
// thread:
//   1. f's exchange in flight (its round before's Δ_f) is finished and its outer step applied to
//      θ_f and m_f only: θ_local is not touched, it trained on from the eager start. A failed
//      exchange is voted down and retried here, blocking, as an overlapped one is (streaming.h);
//   2. the round just ended gives Δ_f = s_f − θ_local_f over f's ranges, from where it began;
//   3. θ_local_f ← s_f ← the eager start from the new θ_f and m_f, and Δ_f's exchange starts
//      behind the next H inner steps.
// With P fragments, P exchanges are in flight, one per fragment; they run one after another in
// the order they started (streaming.h: Threads), and f's is the oldest at f's due step, so the
// main thread waits for it alone.
// The last step, and a commit that admits joiners, finish every exchange in flight, then
// exchange every fragment's new Δ_f blocking and set θ_local ← θ: the run ends on θ everywhere,
// and joiners receive a state with nothing in flight (the next rounds start from θ, as the
// first ones do).
#include <algorithm>
#include <limits>

#include "atoll/core/check.h"
#include "atoll/core/timer.h"
#include "atoll/dist/streaming.h"

namespace atl {

StreamStep StreamingDiloco::delayed_step(int64_t step, int64_t last_step, float* theta_local) {
  StreamStep out;
  const bool last = step >= last_step;
  const int f = last ? -1 : schedule_.due(step, last_step);
  if (!last && f < 0) return out;
  OuterDelay& delay = *opts_.delay;
  if (!last && delay.pending(f)) {
    ATOLL_CHECK(in_flight() && flights_.front()->f == f)
        << "fragment " << f << " due at step " << step << " while its exchange is not the oldest in flight";
    out.synced = finish_in_flight(/*theta_local=*/nullptr, /*admit=*/true, out);
  }
  if (last || admission_) {
    while (in_flight()) out.synced = finish_in_flight(nullptr, /*admit=*/false, out);
    out.synced = final_sync(theta_local, out);
    return out;
  }
  const double s0 = now_s();
  sync_.snapshot(f, theta_local, delay.round_start(f, sync_.theta()));
  delay.keep_delta(sync_, f);  // for a checkpoint
  std::vector<float>& s = delay.start();
  const float* d = delay.layout_delta(sync_);  // Δ_f in θ's layout, over f's ranges
  const DilocoOptions& o = sync_.options();
  for (const ElementRange& r : sync_.plan().ranges[size_t(f)]) {
    eager_start(s.data() + r.begin, sync_.theta().data() + r.begin, sync_.momentum().data() + r.begin, d + r.begin,
                r.size(), o.outer_lr, o.outer_momentum);
    std::copy(s.begin() + std::ptrdiff_t(r.begin), s.begin() + std::ptrdiff_t(r.end), theta_local + r.begin);
  }
  delay.set_pending(f, true);
  delay.inputs().take(sync_, f);  // the residuals before the exchange replaces them, for a checkpoint
  start_exchange(f, step, out);
  out.comm_s += now_s() - s0;  // the snapshot and the eager start: the main thread's outer-step work
  return out;
}

void StreamingDiloco::resume_in_flight(int64_t step) {
  OuterDelay* delay = opts_.delay;
  ATOLL_CHECK(delay && delay->pending() && !in_flight())
      << "resuming an exchange in flight without a pending delayed outer step";
  StreamStep unused;
  delay->restore_deltas(sync_);  // the checkpoint's Δs, in θ's layout
  // Each pending Δ_f's exchange started at f's latest due step, within the last H steps (each
  // fragment is due once in any H consecutive steps): in that order, as in the first run.
  size_t pending = 0;
  for (int64_t t = std::max<int64_t>(1, step - opts_.inner_steps + 1); t <= step; ++t) {
    const int f = schedule_.due(t, std::numeric_limits<int64_t>::max());
    if (f < 0 || !delay->pending(f)) continue;
    delay->inputs().take(sync_, f);  // the restored residuals: a checkpoint taken now saves them again
    start_exchange(f, t, unused);
    ++pending;
  }
  const std::vector<bool>& p = delay->pending_list();
  ATOLL_CHECK(pending == size_t(std::count(p.begin(), p.end(), true)))
      << "a pending Δ whose fragment was not due within the " << opts_.inner_steps << " steps up to " << step;
  last_after_ = step;
}

}  // namespace atl
