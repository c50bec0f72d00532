// A dropped worker rejoins by itself (see self_rejoin.h).
#include "atoll/train/self_rejoin.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/dist/store.h"
#include "atoll/train/metrics.h"
#include "atoll/train/run_dir.h"

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

// Whether the store answers a PING within 1 s (a refused password throws ConfigError).
bool store_answers(const WorkerOptions& o, std::string* why) {
  const StoreAddress a = parse_store_url(o.store_url);
  return redis_ping(a.host, a.port, std::chrono::milliseconds(1000), why,
                    o.store_password.empty() ? a.password : o.store_password);
}

// Polls the store until it answers or `until` passes (a cut link restored).
bool wait_for_store(const WorkerOptions& o, Clock::time_point until, std::string* why) {
  for (;;) {
    if (store_answers(o, why)) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace

WorkerResult run_worker_rejoining(const Config& cfg, const WorkerOptions& first) {
  if (first.metrics_fd >= 0 || cfg.fault.rejoin_timeout_s <= 0) return run_worker(cfg, first);
  WorkerOptions opts = first;
  const std::string who = "island " + std::to_string(opts.island) + " rank " + std::to_string(opts.rank);
  const std::string run_dir = opts.run_dir.empty() ? default_run_dir() : opts.run_dir;
  const std::string bound = "fault.rejoin_timeout_s = " + seconds(cfg.fault.rejoin_timeout_s);
  Clock::time_point give_up{};
  bool dropped = false;
  int tries = 0;
  for (;;) {
    bool member = false;
    opts.became_member = &member;
    std::exception_ptr error;
    try {
      return run_worker(cfg, opts);
    } catch (const Error&) {
      error = std::current_exception();
    }
    // Not yet dropped from a run it trained in (a first start, or a --join given by hand, that
    // failed): its error is a start-up error, as without rejoining.
    if (!member && !dropped) std::rethrow_exception(error);
    std::string why;
    try {
      std::rethrow_exception(error);
    } catch (const LeftRun& e) {
      why = e.what();
    } catch (const StoreLost& e) {
      why = e.what();
    } catch (const Timeout& e) {
      why = e.what();
    } catch (const PeerLost& e) {
      why = e.what();
    }              // anything else (a config, the data, a refusal at the door) a retry would repeat: it propagates
    if (member) {  // dropped after it trained in the run: a new wait begins
      dropped = true;
      give_up = Clock::now() + std::chrono::milliseconds(int64_t(cfg.fault.rejoin_timeout_s * 1000));
      const auto wall = std::chrono::system_clock::now().time_since_epoch();  // as events' `time`
      opts.dropped_at = std::chrono::duration<double>(wall).count();
      opts.dropped_why = why;
      tries = 0;
      std::string ping;
      const bool store = store_answers(opts, &ping);
      log_warn(who + ": dropped from the run (" + why + "); it rejoins by itself once the store answers, for up to " +
               bound + (store ? "" : "; the store " + redact_store_url(opts.store_url) + " does not answer (" + ping +
                                         "): this side of the partition decides nothing and waits, the run goes on "
                                         "where the store is"));
      JsonlWriter(run_dir + "/events.jsonl")
          .write(event_row("dropped", {{"island", opts.island},
                                       {"rank", opts.rank},
                                       {"why", why},
                                       {"store_answers", store},
                                       {"rejoin_timeout_s", cfg.fault.rejoin_timeout_s}}));
    } else {
      ++tries;
      log_warn(who + ": rejoin try " + std::to_string(tries) + " failed (" + why + "); " +
               seconds(std::chrono::duration<double>(give_up - Clock::now()).count()) + " of " + bound + " left");
    }
    std::string ping;
    if (Clock::now() >= give_up || !wait_for_store(opts, give_up, &ping))
      throw LeftRun(who + ": not back in the run within " + bound + " after it was dropped (" + opts.dropped_why +
                    "); " +
                    (ping.empty() ? "last try: " + why
                                  : "the store " + redact_store_url(opts.store_url) + " does not answer: " + ping));
    opts.join = true;
    opts.rejoin_by = give_up;
  }
}

}  // namespace atl
