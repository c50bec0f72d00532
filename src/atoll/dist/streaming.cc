#include "atoll/dist/streaming.h"

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/timer.h"

namespace atl {

StreamingDiloco::StreamingDiloco(DilocoSync& sync, ProcessGroup& outer, const StreamingOptions& opts)
    : sync_(sync), outer_(outer), opts_(opts), schedule_(opts.inner_steps, sync.fragments()) {
  ATOLL_CHECK(opts.overlap_steps == 0 || int64_t(opts.overlap_steps) * sync.fragments() < opts.inner_steps)
      << "overlap " << opts.overlap_steps << ", fragments " << sync.fragments() << ", H " << opts.inner_steps;
}

StreamingDiloco::~StreamingDiloco() {
  if (thread_.joinable()) thread_.join();
}

SyncResult StreamingDiloco::finish_in_flight(float* theta_local, StreamStep& out) {
  const double t0 = now_s();
  thread_.join();
  out.comm_s += now_s() - t0;
  out.overlap_s += flight_s_;
  const int f = flight_f_;
  flight_f_ = -1;
  if (flight_error_) {
    const std::string where = "fragment " + std::to_string(f) + " of " + std::to_string(sync_.fragments()) +
                              " (exchange started after step " + std::to_string(flight_step_) + "): ";
    std::exception_ptr e = flight_error_;
    flight_error_ = nullptr;
    try {
      std::rethrow_exception(e);
    } catch (const Timeout& x) {
      throw Timeout(where + x.what());
    } catch (const PeerLost& x) {
      throw PeerLost(where + x.what());
    }
  }
  return sync_.apply(f, theta_local, opts_.mixing);
}

StreamStep StreamingDiloco::after_step(int64_t step, int64_t last_step, float* theta_local) {
  StreamStep out;
  const bool last = step >= last_step;
  if (in_flight() && (last || step >= flight_step_ + opts_.overlap_steps)) out.synced = finish_in_flight(theta_local, out);
  if (last) {
    const double b0 = now_s();
    outer_.barrier();
    const double b1 = now_s();
    out.idle_s += b1 - b0;
    out.synced = sync_.sync(theta_local);
    out.comm_s += now_s() - b1;
    return out;
  }
  const int f = schedule_.due(step, last_step);
  if (f < 0) return out;
  ATOLL_CHECK(!in_flight()) << "fragment " << f << " due at step " << step << " while fragment " << flight_f_
                            << " is in flight";
  if (opts_.overlap_steps == 0) {
    // Waiting for the slowest island is idle time; the exchange itself is communication.
    const double b0 = now_s();
    outer_.barrier();
    const double b1 = now_s();
    sync_.snapshot(f, theta_local);
    sync_.exchange(f);
    out.synced = sync_.apply(f, theta_local, -1.0);
    out.idle_s += b1 - b0;
    out.comm_s += now_s() - b1;
    return out;
  }
  const double s0 = now_s();
  sync_.snapshot(f, theta_local);
  flight_f_ = f;
  flight_step_ = step;
  flight_error_ = nullptr;
  flight_s_ = 0;
  thread_ = std::thread([this, f] {
    try {
      flight_s_ = sync_.exchange(f);
    } catch (...) {
      flight_error_ = std::current_exception();
    }
  });
  out.started = f;
  out.comm_s += now_s() - s0;  // the snapshot: the main thread is busy with communication work
  return out;
}

}  // namespace atl
