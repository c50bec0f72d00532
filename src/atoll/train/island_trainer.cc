#include "atoll/train/island_trainer.h"

#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "atoll/config/context_parallel.h"
#include "atoll/config/outer_delay_rules.h"
#include "atoll/core/worker_phase.h"
#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/core/log.h"
#include "atoll/core/timer.h"
#include "atoll/core/fault_injection.h"
#include "atoll/dist/diloco.h"
#include "atoll/dist/elastic_group.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/membership.h"
#include "atoll/dist/seal.h"
#include "atoll/dist/streaming.h"
#include "atoll/dist/group.h"
#include "atoll/dist/store.h"
#include "atoll/engine/memory_estimate.h"
#include "atoll/optim/clip.h"
#include "atoll/optim/schedule.h"
#include "atoll/train/bench.h"
#include "atoll/train/dataset.h"
#include "atoll/train/driver.h"
#include "atoll/train/metrics_log.h"
#include "atoll/train/island_hooks.h"
#include "atoll/train/loop.h"
#include "atoll/train/metrics.h"
#include "atoll/train/run_dir.h"
#include "atoll/train/state_checkpoint.h"
#include "atoll/train/state_transfer.h"
#include "atoll/train/stop_signals.h"
#include "atoll/train/trainer.h"
#include "atoll/train/init_weights.h"

namespace atl {
namespace {

// A whole line to the launcher's pipe. One writer at a time: rows come from the main thread,
// phase lines (core/worker_phase.h) from any, and a line longer than the pipe's atomic write
// could otherwise be split by another's.
void write_pipe_line(int fd, const std::string& line) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  for (size_t done = 0; done < line.size();) {
    const ssize_t w = ::write(fd, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw IoError("metrics pipe to the launcher: " + std::string(std::strerror(errno)));
    done += size_t(w);
  }
}

// Where rows go: the launcher's pipe (whole lines), or the run's metrics.jsonl and its
// TensorBoard file (train/metrics_log.h).
class RowSink {
 public:
  RowSink(int fd, const std::string& run_dir) : fd_(fd) {
    if (fd_ < 0) file_ = MetricsLog(run_dir);
  }
  void write(const nlohmann::json& row) {
    if (fd_ < 0) return file_.write(row);
    write_pipe_line(fd_, row.dump() + "\n");
  }

 private:
  int fd_;
  MetricsLog file_;
};

// "island 1 rank 0": a worker as messages name it.
std::string worker_name(int island, int rank) {
  return "island " + std::to_string(island) + " rank " + std::to_string(rank);
}

// Runs a start-up comparison in `group`, turning a mismatch into an error that says who and how
// to fix it.
void expect_same(ProcessGroup& group, const std::string& who, const std::string& what, const std::string& value) {
  try {
    group.expect_same(what, value);
  } catch (const ConfigError& e) {
    std::string what = e.what();  // TOML excerpts: one line, so the error stays one line
    for (size_t at; (at = what.find('\n')) != std::string::npos;) what.replace(at, 1, " / ");
    throw ConfigError(who + ": " + what +
                      "; fix: start every worker with the same --config and --set (only train.threads, "
                      "train.device and data.dir may differ, train.device only between islands)");
  }
}

// What the workers of one island must agree on: shared_config_toml plus train.device, since
// their gradient mean runs over NCCL on the GPU and over Gloo on the CPU. For CPU islands this
// is the same text as shared_config_toml (train.device = "cpu" is the default).
std::string island_config_toml(const Config& cfg) {
  Config c = cfg;
  const Config defaults;
  c.train.threads = defaults.train.threads;
  c.data.dir = defaults.data.dir;
  return config_to_toml(c);
}

// The fragment plan of the model's layout (dist/fragments.h).
FragmentPlan model_fragments(const ParamLayout& layout, int fragments) {
  std::vector<TensorSpan> spans;
  for (const ParamEntry& e : layout.entries()) spans.push_back({e.name, e.offset, e.numel, e.layer});
  return plan_fragments(spans, layout.total(), fragments);
}

// After start-up (a fresh start or a resume): the island's ranks must hold the same state where
// the registry says it is replicated in the island or run-wide, and the islands the same
// run-wide state (θ, the outer momentum, the counters), compared by hash. A difference is a bug
// or workers resumed from different checkpoints.
void expect_same_state(ProcessGroup& inner, ProcessGroup& outer, const std::string& who,
                       const std::vector<StateEntry>& entries, const ParamLayout& layout) {
  using D = Division;
  try {
    inner.expect_same("training state (xxh3)",
                      state_hash(entries, layout, {D::kRun, D::kReplicatedInIsland, D::kPerIsland}));
    outer.expect_same("run-wide training state (xxh3)", state_hash(entries, layout, {D::kRun}));
  } catch (const ConfigError& e) {
    throw Error(who + ": " + e.what() + " after start-up; fix: start every worker from the same checkpoint "
                "(--resume-from) and the same config");
  }
}

}  // namespace

void check_time_budget_placement(const DilocoConfig& d, int workers_per_island) {
  if (d.sync_seconds > 0 && workers_per_island > 1)
    throw ConfigError("diloco.sync_seconds > 0 (islands syncing on a time budget) works with one worker per island "
                      "(here --workers-per-island " + std::to_string(workers_per_island) + "); fix: "
                      "--workers-per-island 1, or diloco.sync_seconds = 0");
}

std::string shared_config_toml(const Config& cfg) {
  Config c = cfg;
  c.train.device = Config().train.device;
  return island_config_toml(c);
}

namespace {

// diloco.expert_merge = "tokens": where each expert of each layer lies in θ (an expert tensor
// [E, out, in] holds expert e's matrix at its e-th E-th), slot layer·E + e (dist/expert_merge.h).
std::vector<ExpertSpan> expert_spans(const ParamLayout& layout, const ModelConfig& m) {
  std::vector<ExpertSpan> spans;
  for (const ParamEntry& e : layout.entries()) {
    if (e.group != ParamGroup::kExpert || e.layer < 0 || e.shape.size() != 3 || e.shape[0] != m.n_experts) continue;
    const size_t per = e.numel / size_t(m.n_experts);
    for (int x = 0; x < m.n_experts; ++x)
      spans.push_back({.begin = e.offset + size_t(x) * per, .end = e.offset + size_t(x + 1) * per,
                       .slot = e.layer * m.n_experts + x});
  }
  std::sort(spans.begin(), spans.end(), [](const ExpertSpan& a, const ExpertSpan& b) { return a.begin < b.begin; });
  return spans;
}

DilocoOptions diloco_options(const Config& cfg, const ParamLayout& layout, std::chrono::milliseconds timeout) {
  const bool experts = cfg.diloco.expert_merge == "tokens";
  const bool sparse = cfg.diloco.expert_topk > 0 && cfg.diloco.expert_topk < 1;
  return {.outer_lr = cfg.diloco.outer_lr,
          .outer_momentum = cfg.diloco.outer_momentum,
          .ring = {.codec = parse_codec(cfg.diloco.codec),
                   .chunk_bytes = size_t(cfg.diloco.chunk_kb) * 1024,
                   .timeout = timeout,
                   .error_feedback = cfg.diloco.error_feedback,
                   .compress = cfg.diloco.compress == "zstd"},
          .guard = {.clip_factor = cfg.fault.clip_factor,
                    .min_cosine = cfg.fault.min_cosine,
                    .weight_by_tokens = cfg.diloco.sync_seconds > 0},
          .experts = experts || sparse ? expert_spans(layout, cfg.model) : std::vector<ExpertSpan>{},
          .expert_slots = experts ? size_t(cfg.model.n_layers) * size_t(cfg.model.n_experts) : 0,
          .expert_topk = sparse ? cfg.diloco.expert_topk : 0.0,
          .experts_per_layer = cfg.model.n_experts};
}

// One worker of the run: what it holds of the run, in the order it builds it (and tears it down
// in reverse: the rings before the outer group, the groups before the membership, all before the
// store), and the ways it starts: a first start (or a resume) with every other worker, or a
// restart that rejoins the running run.
struct Worker {
  const Config& cfg;
  const WorkerOptions& opts;
  const std::string who;
  const std::chrono::milliseconds timeout;
  Loop& loop;
  JsonlWriter& events;
  nlohmann::json manifest{};  // of opts.resume_from
  TrainingState state{.loop = loop};
  std::shared_ptr<Sealer> sealer{};  // before the store and the groups that use it
  std::unique_ptr<Store> store{};
  std::unique_ptr<Membership> membership{};
  std::unique_ptr<ProcessGroup> inner{};
  std::unique_ptr<ProcessGroup> context{};  // train.context_parallel > 1: this rank's context-parallel group
  std::unique_ptr<ElasticGroup> outer{};
  std::unique_ptr<DilocoSync> diloco{};
  std::unique_ptr<OuterDelay> delay{};  // diloco.outer_delay = 1
  uint64_t checkpoint_bytes = 0;  // sent by checkpoint saves (not training traffic: comm_bytes leaves it out)
  std::unique_ptr<StorePartExchange> parts{};
  std::unique_ptr<Checkpointer> checkpointer{};  // after `parts`: its writer thread stops first
  bool stop_posted = false;
  int64_t stop_at = -1;  // the step the run stops at (posted in the store), -1: none

  // An incident of this worker in events.jsonl.
  void stamp(const std::string& kind, nlohmann::json fields) {
    if (!fields.contains("island")) fields["island"] = opts.island;  // a straggler names the late island
    fields["rank"] = opts.rank;
    events.write(event_row(kind, fields));
  }

  ElasticGroupOptions outer_options() {
    return {.name = "outer-r" + std::to_string(opts.rank),
            .connections = cfg.diloco.connections,
            .hostname = opts.listen_address,
            .timeout = timeout,
            .island_name = [R = opts.rank](int i) { return worker_name(i, R); },
            .on_change = [this](ProcessGroup* g) {
              if (diloco) g ? diloco->rebind(*g) : diloco->detach();
            },
            .on_incident = [this](const nlohmann::json& e) { stamp(e.at("event"), e); },
            .round_deadline = std::chrono::milliseconds(int64_t(cfg.fault.outer_deadline_s * 1000)),
            .sealer = sealer};
  }

  // The run's keys (dist/seal.h) when dist.seal and the run has a token; a frame or record that
  // fails authentication is an incident of this worker (forged_frame names the peer).
  void make_sealer() {
    if (!cfg.dist.seal) return;
    if (opts.run_token.empty()) {
      if (opts.islands > 1)
        log_warn(who + ": dist.seal, but this run has no token: traffic between islands goes unsealed; fix: give the "
                 "run's token (--token-file FILE or ATOLL_RUN_TOKEN; `atoll launch` makes one), or set dist.seal = false");
      return;
    }
    sealer = std::make_shared<Sealer>(opts.run_token);
    sealer->set_on_forgery([this](const std::string& kind, const std::string& from, const std::string& what) {
      stamp(kind == "record" ? "forged_record" : "forged_frame",
            {{kind == "record" ? "key" : "peer", from}, {"why", what}});
    });
  }

  // The group of this island's workers; a restarted island forms it at the epoch it rejoins in.
  void form_island(uint64_t epoch) {
    // Members named as the run knows them, in errors (a stalled peer, a size mismatch).
    inner = std::make_unique<ProcessGroup>(
        *store, GroupOptions{.name = "island" + std::to_string(opts.island), .rank = opts.rank,
                             .size = opts.workers_per_island, .epoch = epoch, .hostname = opts.listen_address,
                             .timeout = timeout,
                             .member_name = [I = opts.island](int r) { return worker_name(I, r); }});
    // Context parallelism: ranks g·P .. g·P+P-1 of the island are data-parallel group g, each
    // holding its zigzag rows of the group's sequences (docs/long_context.md).
    const int P = cfg.train.context_parallel;
    if (P == 1) return;
    const int g = opts.rank / P;
    context = std::make_unique<ProcessGroup>(
        *store, GroupOptions{.name = "island" + std::to_string(opts.island) + "-cp" + std::to_string(g),
                             .rank = opts.rank % P, .size = P, .epoch = epoch, .hostname = opts.listen_address,
                             .timeout = timeout,
                             .member_name = [I = opts.island, g, P](int r) { return worker_name(I, g * P + r); }});
    loop.set_context_parallel(context.get());
  }

  // The island's NCCL communicator, on the GPU with M > 1 (check_island_device on every rank
  // before anyone waits on another).
  void join_engine_to_island() {
    check_island_device(cfg.train, inner->size());
    loop.engine->join_island({.rank = inner->rank(), .size = inner->size(), .timeout = inner->timeout(),
                              .allgather = [this](const std::string& s) { return inner->allgather(s); }});
    loop.engine->join_zero({.sum = [this](double x) { return sum_over_island(x); },
                            .allgatherv = [this](float* d, const std::vector<size_t>& c) { inner->allgatherv(d, c); }});
  }

  // ZeRO-1's gradient norm: the island's sum of one double (each shard's squares), added in
  // rank order on every rank, so every rank clips by the same norm.
  double sum_over_island(double x) {
    double total = 0;
    for (const std::string& v : inner->allgather(std::string(reinterpret_cast<const char*>(&x), sizeof x))) {
      double part = 0;
      std::memcpy(&part, v.data(), sizeof part);
      total += part;
    }
    return total;
  }

  void make_diloco() {
    Engine& engine = *loop.engine;
    diloco = std::make_unique<DilocoSync>(outer->group(), engine.host().params, engine.layout().total(),
                                          diloco_options(cfg, engine.layout(), timeout),
                                          model_fragments(engine.layout(), cfg.diloco.fragments), inner.get());
    state.diloco = diloco.get();
    if (cfg.diloco.outer_delay > 0) delay = std::make_unique<OuterDelay>(diloco->plan());
    state.delay = delay.get();
  }

  // The store, this worker's membership and heartbeat; a first start also meets every peer in
  // the groups of epoch 0. Bounded by fault.timeout_s.
  void connect() {
    const int W = opts.islands * opts.workers_per_island;
    try {
      make_sealer();
      store = std::make_unique<Store>(StoreOptions{.url = opts.store_url, .password = opts.store_password,
                                                   .run_id = opts.run_id, .timeout = timeout, .records = sealer});
      membership = std::make_unique<Membership>(
          *store, MembershipOptions{.island = opts.island, .rank = opts.rank, .islands = opts.islands,
                                    .workers_per_island = opts.workers_per_island,
                                    .heartbeat = std::chrono::milliseconds(int64_t(cfg.fault.heartbeat_s * 1000)),
                                    .ttl = std::chrono::milliseconds(int64_t(cfg.fault.heartbeat_ttl_s * 1000)),
                                    .timeout = timeout, .run_token = opts.run_token});
      if (opts.join) membership->expect_run();  // nothing to rejoin: refused at once
      membership->check_run_token();  // a wrong or missing token: refused before anything is written
      membership->start_heartbeat();  // a live worker in this place: refused, the live one untouched
      if (opts.join) return;
      membership->announce();
      form_island(0);
      outer = ElasticGroup::start(*store, *membership, outer_options());
    } catch (const GroupSizeMismatch& e) {
      // Gloo would fail on address blocks of another length ("136 vs 68"); say which flag differs.
      const bool islands = inner != nullptr;  // the in-island group formed: the outer one differs
      const std::string flag = islands ? "--islands" : "--workers-per-island";
      auto started = [&](int member, int size, const char* joint) {
        return (islands ? "island " + std::to_string(member) : worker_name(opts.island, member)) + joint + flag + " " +
               std::to_string(size);
      };
      const bool peer_first = e.peer > e.rank;
      throw ConfigError(who + ": " +
                        (peer_first ? started(e.peer, e.peer_size, " was started with ") + ", " +
                                          started(e.rank, e.size, " with ")
                                    : started(e.rank, e.size, " was started with ") + ", " +
                                          started(e.peer, e.peer_size, " with ")) +
                        "; fix: start every worker of the run with the same --islands and --workers-per-island "
                        "(and the same --run-id; a new run id for a new run)");
    } catch (const Timeout& e) {
      char bound[64];
      std::snprintf(bound, sizeof bound, " (the bound is fault.timeout_s = %g)", cfg.fault.timeout_s);
      std::string msg = who + ": " + e.what() + bound;
      if (msg.find("fix") == std::string::npos)
        msg += "; fix: start all " + std::to_string(W) + " workers with the same --store, --run-id (a launched run's "
               "is in RUN_DIR/run.id, which --run-dir reads), --islands and --workers-per-island, or raise "
               "fault.timeout_s";
      throw Timeout(msg);
    }
  }

  // A first start (or a resume): every worker agrees on the config and on the state it starts from.
  void start() {
    const bool resume = !opts.resume_from.empty();
    ProcessGroup& outer_group = outer->group();
    for (ProcessGroup* g : {inner.get(), &outer_group}) {
      expect_same(*g, who, "model config", model_config_to_toml(cfg.model));
      expect_same(*g, who, "config", g == inner.get() ? island_config_toml(cfg) : shared_config_toml(cfg));
      expect_same(*g, who, "step resumed from", resume ? manifest.at("step").dump() : "none (a fresh start)");
    }
    membership->put_config(shared_config_toml(cfg));
    join_engine_to_island();
    make_diloco();
    const StatePlace place{.island = opts.island, .rank = opts.rank, .islands = opts.islands,
                           .workers_per_island = opts.workers_per_island, .inner = inner.get(), .outer = &outer_group};
    if (resume) restore_training_state(opts.resume_from, manifest, cfg, state, place);
    expect_same_state(*inner, outer_group, who, state_registry(cfg, true, &state), loop.engine->layout());
  }

  // A restarted worker: the run's config, admission at an outer-step boundary, the run's state
  // from a live island and its own data cursor from its record. False when the run finished first.
  bool rejoin() {
    if (const auto run_config = membership->config(); run_config && *run_config != shared_config_toml(cfg))
      throw ConfigError(who + ": --join with a config that differs from the run's; fix: start it with the run's "
                        "RUN_DIR/config.toml (only train.threads, train.device and data.dir may differ)");
    enter_phase(WorkerPhase::kJoining);
    membership->request_join();
    if (!opts.quiet) log_info(who + ": waiting to rejoin the run at its next outer step");
    const auto asked = std::chrono::steady_clock::now();
    const std::optional<View> admitted = membership->wait_admission(opts.rejoin_by);
    const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
    if (!admitted) {
      if (!opts.quiet) log_info(who + ": the run finished before this island could rejoin");
      return false;
    }
    try {
      form_island(admitted->epoch);
      join_engine_to_island();
      outer = std::make_unique<ElasticGroup>(*store, *membership, *admitted, outer_options());
      while (!outer->formed()) {  // a member of the admitting view was lost meanwhile: a failed attempt
        outer->decide(kAdmitAttempt, false, false);
        outer->reform(kAdmitAttempt, outer->formation_error());
      }
      make_diloco();
      if (const std::optional<std::string> record = membership->record(opts.island, opts.rank))
        restore_worker_record(cfg, state, *record);
      const TransferReport got = admit(*outer, cfg, state);
      inner->expect_same("training state received (xxh3)",
                         state_hash(state_registry(cfg, true, &state), loop.engine->layout(),
                                    {Division::kRun, Division::kReplicatedInIsland, Division::kPerIsland}));
      if (opts.rank == 0)
        stamp("join", {{"epoch", outer->view().epoch}, {"islands", outer->view().islands}, {"step", loop.step},
                       {"outer_step", diloco->outer_step()}, {"source", got.source}, {"rounds", got.rounds},
                       {"refused", got.refused}, {"theta_hash", diloco->theta_hash()}, {"admission_wait_s", waited_s},
                       {"transfer_bytes", got.bytes}, {"transfer_s", got.seconds}});
      if (!opts.quiet)
        log_info(who + ": rejoined at step " + std::to_string(loop.step) + " from island " + std::to_string(got.source) +
                 " (" + outer->view().describe() + ")");
      if (opts.dropped_at > 0) {  // by itself, without a launcher (train/self_rejoin.h)
        const auto now = std::chrono::system_clock::now().time_since_epoch();
        const double after_s = std::chrono::duration<double>(now).count() - opts.dropped_at;
        stamp("rejoined", {{"epoch", outer->view().epoch}, {"step", loop.step}, {"outer_step", diloco->outer_step()},
                           {"dropped_s", after_s}, {"why_dropped", opts.dropped_why}});
        char after[32];
        std::snprintf(after, sizeof after, "%.1f", after_s);
        if (!opts.quiet) log_info(who + ": back in the run by itself, " + after + " s after it was dropped");
      }
    } catch (const PeerLost& e) {
      throw LeftRun(who + ": lost the run while rejoining: " + e.what());
    } catch (const Timeout& e) {
      throw LeftRun(who + ": lost the run while rejoining: " + e.what());
    }
    return true;
  }

  // A checkpoint of the current view: every worker writes its part in the background; rank 0
  // of the lowest island commits it. Its one collective (an island's residual sum) is not
  // retried: one that loses a peer skips the save (the group is then broken, and the next outer
  // step votes it down and re-forms).
  SaveReport save() {
    if (!outer->formed()) return {};
    const StatePlace place{
        .island = opts.island, .rank = opts.rank, .islands = opts.islands,
        .workers_per_island = opts.workers_per_island, .inner = inner.get(), .outer = &outer->group(),
        .members = outer->view().islands,
        .absent_value = [this](int i, int r, const std::string& entry) -> std::optional<nlohmann::json> {
          const std::optional<std::string> record = membership->record(i, r);
          return record ? record_value(*record, entry) : std::nullopt;
        }};
    const uint64_t sent_before = inner->stats().bytes_sent + outer->stats().bytes_sent;
    struct Count {  // whatever the save sent, also when it failed
      Worker& w;
      uint64_t before;
      ~Count() { w.checkpoint_bytes += w.inner->stats().bytes_sent + w.outer->stats().bytes_sent - before; }
    } count{*this, sent_before};
    try {
      return checkpointer->save(place);
    } catch (const PeerLost& e) {
      log_warn(who + ": checkpoint of step " + std::to_string(loop.step) + " skipped: " + e.what());
    } catch (const Timeout& e) {
      log_warn(who + ": checkpoint of step " + std::to_string(loop.step) + " skipped: " + e.what());
    }
    return {};
  }

  // Whether the run stops after this step (WorkerOptions::stop_on_signal): a signal to this
  // worker posts the stop step, if none is posted yet; every worker reads it.
  bool stop_requested(const StopSignals* signals) {
    const std::string key = store->run_prefix() + "/stop_at";
    if (signals && signals->signal() != 0 && !stop_posted) {
      const int64_t ahead = cfg.diloco.inner_steps + cfg.diloco.overlap_steps + 2;
      store->set_if_absent(key, std::to_string(loop.step + ahead));
      stop_posted = true;
    }
    if (stop_at < 0)
      if (const std::optional<std::string> v = store->get(key)) stop_at = std::stoll(*v);
    return stop_at >= 0 && loop.step >= stop_at;
  }

  // The background checkpoint writer, once the store is known: the workers' parts meet at the
  // committer through the store; the temporary directory is named after the run id, which every
  // worker of this launch shares.
  void make_checkpointer(const std::string& run_dir) {
    parts = std::make_unique<StorePartExchange>(store->options());
    uint64_t token = 1469598103934665603ull;  // FNV-1a of the run id
    for (unsigned char c : opts.run_id) token = (token ^ c) * 1099511628211ull;
    checkpointer = std::make_unique<Checkpointer>(
        cfg, run_dir, state,
        CheckpointerOptions{.exchange = parts.get(), .token = token % 1000000000000ull,
                            .on_commit = [this](const std::string& dir, int64_t step) {
                              events.write(event_row("checkpoint", {{"step", step}, {"dir", dir}}));
                            },
                            .who = who});
  }
};

}  // namespace

void check_island_placement(const Config& cfg, int workers_per_island) {
  const int M = workers_per_island;
  validate_streaming(cfg.diloco, cfg.model.n_layers);
  check_time_budget_placement(cfg.diloco, M);
  check_outer_delay_placement(cfg.diloco, M);
  check_context_parallel(cfg, M);  // P must divide the island's workers
  check_island_device(cfg.train, M);  // cuda with M > 1 needs NCCL: refused before any rendezvous
}

void check_worker_config(const Config& cfg, int workers_per_island, int rank) {
  check_island_placement(cfg, workers_per_island);
  check_memory_fits(cfg, {.workers_per_island = workers_per_island, .device_index = rank});  // before the data or anything is allocated
}

WorkerResult run_worker(const Config& cfg, const WorkerOptions& opts) {
  const int N = opts.islands, M = opts.workers_per_island;
  check_worker_config(cfg, M, opts.rank);
  // The data-parallel workers: each context-parallel group of P ranks reads one data slice.
  const int P = cfg.train.context_parallel, D = M / P, data_workers = N * D;
  // Before any thread starts, so that every thread leaves the signals to it (stop_signals.h).
  std::unique_ptr<StopSignals> signals;
  if (opts.stop_on_signal) signals = std::make_unique<StopSignals>();
  ATOLL_CHECK(N >= 1 && M >= 1 && opts.island >= 0 && opts.island < N && opts.rank >= 0 && opts.rank < M)
      << "island " << opts.island << " of " << N << ", rank " << opts.rank << " of " << M;
  // ATOLL_FAULT is read (and a bad value refused) by every worker, armed in a first start only
  // (a fault happens once per run), but for join=start, a crash loop of restarts.
  arm_fault_injection(opts.island, opts.rank, opts.join);
  // The phases this worker goes through, for the launcher's live view (never reset: a thread of
  // the run may report one until the process ends). A pipe the launcher closed is its to report.
  if (opts.metrics_fd >= 0)
    set_phase_sink([fd = opts.metrics_fd](const char* name) {
      try {
        write_pipe_line(fd, std::string("{\"phase\":\"") + name + "\"}\n");
      } catch (const IoError&) {
      }
    });
  fault_join_start();
  const int w = opts.island * M + opts.rank;
  const bool resume = !opts.resume_from.empty();
  const std::string who = worker_name(opts.island, opts.rank);
  const double t_start = now_s() - seconds_since_run_start();  // time_s counts from the run's start
  const std::string run_dir = opts.run_dir.empty() ? default_run_dir() : opts.run_dir;
  // Without a launcher, worker 0 owns the run folder: checked and locked before any peer can
  // write to it (a launcher holds the lock for the workers it starts). The workers' configs are
  // compared with one another at start-up (expect_same below), which is what a by-hand run
  // needs, so a change against the run's config.toml is logged rather than refused.
  RunDir rd;
  rd.path = run_dir;
  if (w == 0 && opts.metrics_fd < 0 && !opts.join)
    rd = open_run_dir(run_dir, cfg, {.resume = resume, .allow_config_change = true, .verify_checkpoint = false});
  configure_threads(cfg.train.threads);
  const DatasetInfo data = resolve_dataset(cfg);

  // train.device = cuda: the step runs on GPU `rank` (modulo the devices); the engine's host
  // copies serve initialisation, DiLoCo's outer step and checkpoints.
  const int data_slice = opts.island * D + opts.rank / P;
  Loop loop(cfg, data.dir,
            {.worker = data_slice, .n_workers = data_workers, .device_index = opts.rank, .island_rank = opts.rank,
             .island_size = M});
  Engine& engine = *loop.engine;
  engine.init_params(uint64_t(cfg.model.init_seed));
  nlohmann::json init_event;  // every worker of a fresh start reads the same weights: the same θ
  if (!opts.init_from.empty() && !resume && !opts.join) init_event = init_from_hf(opts.init_from, cfg, data, engine.host().params);
  std::filesystem::create_directories(run_dir);
  // Every worker may write incidents; the run-wide events come from the leader (ElasticGroup::leads).
  // Workers started without a launcher may share worker 0's folder (a shared file system under a
  // scheduler, docs/cluster.md): the others write nothing there until the start-up rendezvous,
  // which worker 0 reaches only after checking and locking the folder (open_run_dir above).
  const bool waits_for_worker0 = w != 0 && opts.metrics_fd < 0 && !opts.join;
  JsonlWriter events;
  if (!waits_for_worker0) events = JsonlWriter(run_dir + "/events.jsonl");
  // Every worker enters the same phases at the same step; worker 0 reports them.
  if (w == 0) loop.on_data_phase = [&events](const nlohmann::json& f) { events.write(event_row("data_phase", f)); };
  Worker wk{.cfg = cfg, .opts = opts, .who = who, .timeout = std::chrono::milliseconds(int64_t(cfg.fault.timeout_s * 1000)),
            .loop = loop, .events = events};
  if (resume) {  // before any peer waits on us: a refused checkpoint ends this worker at once
    wk.manifest = read_training_manifest(opts.resume_from);
    check_resume(wk.manifest, opts.resume_from, cfg, N, M, /*diloco=*/true);
  }
  wk.connect();
  wk.make_checkpointer(run_dir);
  if (!opts.join) {
    wk.start();
    if (waits_for_worker0) events = JsonlWriter(run_dir + "/events.jsonl");
  } else if (!wk.rejoin()) {
    WorkerResult nothing;
    nothing.finished_before_admission = true;
    return nothing;
  }
  if (opts.became_member) *opts.became_member = true;
  ProcessGroup& inner = *wk.inner;
  ElasticGroup& outer = *wk.outer;
  DilocoSync& diloco = *wk.diloco;
  wk.membership->put_record(worker_record(cfg, wk.state));
  StreamingDiloco streaming(diloco, outer,
                            {.inner_steps = cfg.diloco.inner_steps,
                             .overlap_steps = cfg.diloco.overlap_steps,
                             .mixing = cfg.diloco.mixing,
                             .sync_seconds = cfg.diloco.sync_seconds,
                             .delay = wk.delay.get()});
  // A checkpoint taken with a delayed outer step's exchange in flight: every island starts it again.
  if (wk.delay && wk.delay->pending()) streaming.resume_in_flight(loop.step - dp_warmup_steps(cfg));
  engine.to_device(kAllState);  // the initial, restored or received parameters and moments (a no-op on the CPU)
  if (w == 0 && opts.metrics_fd < 0 && !opts.join) {
    begin_run(rd, cfg);
    if (resume) truncate_jsonl_after_step(run_dir + "/metrics.jsonl", loop.step);
    else  // the run's mark (run_dir.h)
      events.write(event_row("start", {{"islands", N}, {"workers_per_island", M}, {"params", engine.layout().n_params()}}));
    if (!init_event.is_null()) events.write(event_row("init_from", init_event));
  }
  RowSink rows(opts.metrics_fd, run_dir);
  if (w == 0 && resume && opts.metrics_fd < 0)
    events.write(event_row("resume", {{"step", loop.step}, {"checkpoint", opts.resume_from}}));
  if (!opts.quiet)
    log_info(who + ": " + std::to_string(engine.layout().n_params()) + " parameters, data slice " +
             std::to_string(data_slice) + " of " + std::to_string(data_workers) +
             (P > 1 ? ", context-parallel rank " + std::to_string(opts.rank % P) + " of " + std::to_string(P) : "") +
             ", " + std::to_string(diloco.fragments()) +
             " fragment(s)" + (resume ? ", resumed at step " + std::to_string(loop.step) : ""));

  IslandHooks hooks(cfg,
                    {.island = opts.island, .rank = opts.rank, .islands = N, .workers_per_island = M, .who = who,
                     .checkpoint_bytes = &wk.checkpoint_bytes,
                     .progress_file = opts.metrics_fd >= 0 ? progress_path(run_dir, opts.island, opts.rank) : ""},
                    inner, outer, diloco, streaming, wk.state, w == 0 ? &events : nullptr, &events);
  // MFU in the rows against train.peak_gflops, or this worker's measured peak (bench.h).
  const PeakRate peak = mfu_peak(cfg.train.peak_gflops, "train.peak_gflops", cfg.train.peak_gflops < 0, engine,
                                 parse_precision(cfg.train.precision));
  DriverResult r;
  try {
    r = run_steps(loop, hooks,
                  {.who = who,
                   .workers = data_workers,
                   .devices = N * M,
                   .peak_gflops = peak.gflops,
                   .evaluates = [&] { return outer.leads(); },
                   .write_row = [&](const nlohmann::json& row) { rows.write(row); },
                   .save = [&] { return wk.save(); },
                   .finish_saves = [&] { return wk.checkpointer->finish(); },
                   .fence = [&] { return wk.checkpointer->fence(); },
                   .t_start = t_start,
                   // On a time budget the islands stop only where their steps agree (train/cadence.h).
                   .stop_requested = [&] { return wk.stop_requested(signals.get()); }});
  } catch (const PeerLost& e) {  // outside the outer steps (the island's gradient mean): the island is lost
    throw LeftRun(who + ": " + e.what() + "; the island is lost as a whole: this worker leaves the run to rejoin");
  } catch (const Timeout& e) {
    throw LeftRun(who + ": " + e.what() + "; the island is lost as a whole: this worker leaves the run to rejoin");
  }
  wk.membership->mark_done();
  if (outer.leads())
    events.write(r.stopped ? event_row("preempted", {{"step", loop.step}, {"checkpoint", r.checkpoint}})
                           : event_row("end", {{"step", loop.step}}));
  WorkerResult result;
  result.steps = loop.step;
  result.outer_steps = diloco.outer_step();
  result.first_loss = r.first_loss;
  result.final_loss = r.final_loss;
  result.stopped = r.stopped;
  result.theta_hash = hooks.theta_hash().empty() ? diloco.theta_hash() : hooks.theta_hash();
  return result;
}

}  // namespace atl
