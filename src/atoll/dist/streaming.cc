#include "atoll/dist/streaming.h"

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/fault_injection.h"
#include "atoll/core/timer.h"

namespace atl {

StreamingDiloco::StreamingDiloco(DilocoSync& sync, ProcessGroup& outer, const StreamingOptions& opts)
    : sync_(sync), outer_(&outer), opts_(opts), schedule_(opts.inner_steps, sync.fragments()) {
  ATOLL_CHECK(!opts.delay || (opts.overlap_steps == 0 && opts.sync_seconds <= 0))
      << "a delayed outer step with overlap " << opts.overlap_steps << ", sync_seconds " << opts.sync_seconds;
  ATOLL_CHECK(!opts.delay || opts.delay->plan().count() == sync.fragments())
      << "a delayed outer step of " << opts.delay->plan().count() << " fragments over " << sync.fragments();
  ATOLL_CHECK(opts.overlap_steps == 0 || int64_t(opts.overlap_steps) * sync.fragments() < opts.inner_steps)
      << "overlap " << opts.overlap_steps << ", fragments " << sync.fragments() << ", H " << opts.inner_steps;
  ATOLL_CHECK(opts.sync_seconds <= 0 || (opts.overlap_steps == 0 && sync.fragments() == 1))
      << "a time budget with overlap " << opts.overlap_steps << ", fragments " << sync.fragments();
  begin_round();
}

StreamingDiloco::StreamingDiloco(DilocoSync& sync, ElasticGroup& elastic, const StreamingOptions& opts)
    : StreamingDiloco(sync, elastic.group(), opts) {
  outer_ = nullptr;
  elastic_ = &elastic;
}

StreamingDiloco::~StreamingDiloco() {
  for (auto& fl : flights_)
    if (fl->thread.joinable()) fl->thread.join();
}

ProcessGroup& StreamingDiloco::outer() { return elastic_ ? elastic_->group() : *outer_; }

std::optional<View> StreamingDiloco::take_admission() {
  std::optional<View> v = std::move(admission_);
  admission_.reset();
  return v;
}

void StreamingDiloco::begin_round() {
  round_start_ = now_s();
  round_steps_ = round_tokens_ = 0;
}

void StreamingDiloco::count_step(int64_t tokens) {
  ++round_steps_;
  round_tokens_ += tokens;
}

int StreamingDiloco::due(int64_t step, int64_t last_step) {
  if (!budget()) return schedule_.due(step, last_step);
  if (step != decided_step_) {
    decided_step_ = step;
    const bool over = round_steps_ >= opts_.inner_steps || now_s() - round_start_ >= opts_.sync_seconds;
    decided_ = step < last_step && round_steps_ >= 1 && over ? 0 : -1;
  }
  return decided_;
}

bool StreamingDiloco::may_admit(int f, bool admit) const {
  return admit && (!budget() || sync_.guarded(f).furthest_step < last_step_);
}

std::string StreamingDiloco::try_exchange(int f, StreamStep& out) {
  fault_outer_step(sync_.outer_step() + 1);
  if (!elastic_->formed()) return "the outer group did not form: " + elastic_->formation_error();
  const double b0 = now_s();
  if (std::string late = await_round(sync_.outer_step() + 1); !late.empty()) return late;
  if (const std::string lost = elastic_->lost_members(); !lost.empty())
    return lost + " lost (no heartbeat for fault.heartbeat_ttl_s)";
  try {
    outer().barrier();
    const double b1 = now_s();
    out.idle_s += b1 - b0;
    sync_.exchange(f);
    out.comm_s += now_s() - b1;
  } catch (const PeerLost& e) {
    return e.what();
  } catch (const Timeout& e) {
    return e.what();
  }
  return "";
}

std::string StreamingDiloco::await_round(int64_t as_step) {
  fault_before_exchange(as_step);
  return elastic_->await_round(outer_attempt(as_step), as_step);
}

SyncResult StreamingDiloco::settle(int f, std::string failure, float* theta_local, double mixing, bool admit,
                                   StreamStep& out) {
  const std::string attempt = outer_attempt(sync_.outer_step() + 1);  // a retry keeps the step's number
  for (;;) {
    if (!failure.empty()) drain(out);  // a vote down drops the group: none of ours may still use it
    const double d0 = now_s();
    const Decision d = elastic_->decide(attempt, failure.empty(), may_admit(f, admit));
    out.comm_s += now_s() - d0;
    if (d.commit) {
      // The others committed without this worker's vote: they counted it lost (its heartbeat
      // lapsed: stopped or starved after its part of the ring), and its own exchange then failed,
      // so it lacks the mean they applied. It leaves to rejoin with the committed state.
      if (!failure.empty())
        throw LeftRun("outer step " + std::to_string(sync_.outer_step() + 1) + " was committed without this worker (" +
                      "counted lost) while its exchange failed (" + failure + "); it leaves the run to rejoin");
      if (d.next) admission_ = d.next;
      rerun_discarded();
      return note_incidents(sync_.apply(f, theta_local, mixing), out);
    }
    sync_.discard(f);  // nothing of this attempt is kept
    // Nor of the exchanges behind it, which used the group about to go: each runs again over the
    // new group once this attempt commits (every island aborted it, so every island reruns them).
    drain(out);
    for (auto& fl : flights_) sync_.discard(fl->f), fl->rerun = true;
    elastic_->reform(attempt, failure.empty() ? d.why : failure);
    failure = try_exchange(f, out);  // the same Δ_f, blocking, over the new group
  }
}

SyncResult StreamingDiloco::blocking_step(int f, float* theta_local, bool admit, StreamStep& out) {
  if (elastic_) return settle(f, try_exchange(f, out), theta_local, -1.0, admit, out);
  // Waiting for the slowest island is idle time; the exchange itself is communication.
  const double b0 = now_s();
  outer().barrier();
  const double b1 = now_s();
  fault_outer_step(sync_.outer_step() + 1);
  sync_.exchange(f);
  out.idle_s += b1 - b0;
  out.comm_s += now_s() - b1;
  return note_incidents(sync_.apply(f, theta_local, -1.0), out);
}

SyncResult StreamingDiloco::note_incidents(SyncResult r, StreamStep& out) {
  for (UpdateIncident i : r.incidents) {
    i.island = elastic_ ? elastic_->view().islands.at(size_t(i.member)) : i.member;
    out.incidents.push_back(i);
  }
  return r;
}

SyncResult StreamingDiloco::final_sync(float* theta_local, StreamStep& out) {
  if (!elastic_ && !opts_.delay) {
    const double b0 = now_s();
    outer().barrier();
    const double b1 = now_s();
    out.idle_s += b1 - b0;
    SyncResult r = sync_.sync(theta_local);
    out.comm_s += now_s() - b1;
    return note_incidents(r, out);
  }
  // Fragment by fragment, each its own attempt: a failure retries only the fragment it hit. The
  // delayed step's Δ_f is from where its round began (nothing is pending after it).
  SyncResult res;
  uint64_t sent = 0;
  for (int f = 0; f < sync_.fragments(); ++f) {
    sync_.snapshot(f, theta_local, opts_.delay ? opts_.delay->round_start(f, sync_.theta()) : nullptr);
    if (opts_.delay) opts_.delay->set_pending(f, false);
    res = blocking_step(f, theta_local, /*admit=*/false, out);
    sent += res.bytes_sent;
  }
  if (sync_.fragments() > 1) {
    res.fragment = -1;
    res.theta_hash = sync_.theta_hash();
    res.momentum_hash = sync_.momentum_hash();
  }
  res.bytes_sent = sent;
  return res;
}

SyncResult StreamingDiloco::finish_in_flight(float* theta_local, bool admit, StreamStep& out) {
  const std::unique_ptr<Flight> fl = std::move(flights_.front());
  flights_.pop_front();
  const double t0 = now_s();
  if (fl->thread.joinable()) fl->thread.join();  // not started when elastic knew it would fail
  out.comm_s += now_s() - t0;
  out.overlap_s += fl->seconds;
  const int f = fl->f;
  if (elastic_) {
    std::string failure = fl->failure;
    if (fl->error) {
      try {
        std::rethrow_exception(fl->error);  // anything but a lost or silent peer is a bug: it propagates
      } catch (const Timeout& x) {
        failure = x.what();
      } catch (const PeerLost& x) {
        failure = x.what();
      }
    }
    return settle(f, failure, theta_local, opts_.mixing, admit, out);
  }
  if (fl->error) {
    const std::string where = "fragment " + std::to_string(f) + " of " + std::to_string(sync_.fragments()) +
                              " (exchange started after step " + std::to_string(fl->step) + "): ";
    try {
      std::rethrow_exception(fl->error);
    } catch (const Timeout& x) {
      throw Timeout(where + x.what());
    } catch (const PeerLost& x) {
      throw PeerLost(where + x.what());
    }
  }
  return note_incidents(sync_.apply(f, theta_local, opts_.mixing), out);
}

void StreamingDiloco::drain(StreamStep& out) {
  const double t0 = now_s();
  for (auto& fl : flights_)
    if (fl->thread.joinable()) fl->thread.join();
  out.comm_s += now_s() - t0;
}

StreamStep StreamingDiloco::after_step(int64_t step, int64_t last_step, float* theta_local) {
  StreamStep out = step_once(step, last_step, theta_local);
  if (budget() && out.synced) {
    out.round_steps = round_steps_;
    out.round_tokens = round_tokens_;
    begin_round();
  }
  return out;
}

StreamStep StreamingDiloco::step_once(int64_t step, int64_t last_step, float* theta_local) {
  last_step_ = last_step;
  last_after_ = step;
  if (opts_.delay) return delayed_step(step, last_step, theta_local);
  StreamStep out;
  const bool last = step >= last_step;
  const int due = last ? -1 : this->due(step, last_step);
  if (budget()) sync_.set_round({.step = step, .tokens = round_tokens_});
  if (in_flight() && (last || step >= flights_.front()->step + opts_.overlap_steps))
    out.synced = finish_in_flight(theta_local, /*admit=*/!last && due < 0, out);
  if (last) {
    out.synced = final_sync(theta_local, out);
    return out;
  }
  const int f = due;
  if (f < 0) return out;
  ATOLL_CHECK(!in_flight()) << "fragment " << f << " due at step " << step << " while fragment "
                            << flights_.front()->f << " is in flight";
  if (opts_.overlap_steps == 0) {
    sync_.snapshot(f, theta_local);
    out.synced = blocking_step(f, theta_local, /*admit=*/true, out);
    return out;
  }
  const double s0 = now_s();
  sync_.snapshot(f, theta_local);
  start_exchange(f, step, out);
  out.comm_s += now_s() - s0;  // the snapshot: the main thread is busy with communication work
  return out;
}

void StreamingDiloco::start_exchange(int f, int64_t step, StreamStep& out) {
  auto fl = std::make_unique<Flight>();
  fl->f = f;
  fl->step = step;
  fl->as_step = sync_.outer_step() + int64_t(flights_.size()) + 1;  // those in flight are applied first
  out.started = f;
  if (elastic_) {  // an exchange that cannot succeed is not started; its wait point votes it down
    if (!elastic_->formed()) fl->failure = "the outer group did not form: " + elastic_->formation_error();
    else if (std::string late = await_round(fl->as_step); !late.empty()) fl->failure = late;
    else if (const std::string lost = elastic_->lost_members(); !lost.empty())
      fl->failure = lost + " lost (no heartbeat for fault.heartbeat_ttl_s)";
    if (!fl->failure.empty()) {
      // Voted down at once (the vote stands for the wait point too): the group is dropped now,
      // so the islands whose exchange started fail at once instead of at their timeout. The
      // exchanges before it end first: they use that group.
      drain(out);
      elastic_->decide(outer_attempt(fl->as_step), false, false);
      std::promise<void> none;
      none.set_value();
      fl->done = none.get_future().share();
      flights_.push_back(std::move(fl));
      return;
    }
  }
  flights_.push_back(std::move(fl));
  run(flights_.size() - 1);
}

void StreamingDiloco::run(size_t k) {
  Flight* x = flights_[k].get();
  // After the exchange before it: one user of the outer group at a time.
  std::shared_future<void> before = k > 0 ? flights_[k - 1]->done : std::shared_future<void>{};
  std::promise<void> ended;
  x->done = ended.get_future().share();
  x->error = nullptr;
  x->failure.clear();
  x->thread = std::thread([this, x, before, ended = std::move(ended)]() mutable {
    if (before.valid()) before.wait();
    fault_outer_step(x->as_step);  // its ring messages count from here (core/fault_injection.h)
    try {
      x->seconds = sync_.exchange(x->f, x->as_step);
    } catch (...) {
      x->error = std::current_exception();
    }
    ended.set_value();
  });
}

void StreamingDiloco::rerun_discarded() {
  for (size_t k = 0; k < flights_.size(); ++k)
    if (flights_[k]->rerun) flights_[k]->rerun = false, run(k);
}

}  // namespace atl
