// The DiLoCo outer loop across islands (DESIGN.md "DiLoCo"; Douillard et al. 2023,
// https://arxiv.org/abs/2311.08105). Every island keeps the global parameters θ and the outer
// momentum m, flat arrays laid out like the parameters. At an outer step, each island:
//
//   Δ  = θ − θ_local                         its pseudo-gradient
//   Δ̄  = mean over islands of Δ              RingAllreduce with the run's codec (bit-identical
//                                             on every island, optional error feedback)
//   m  = μ·m + Δ̄                              outer Nesterov momentum
//   θ  = θ − lr·(Δ̄ + μ·m)
//   θ_local ← θ
//
// Bit-identical θ on every island: Δ̄ is identical (the ring's promise), θ and m start identical,
// and the update is written with explicit std::fma calls, one IEEE rounding each, so neither the
// compiler's contraction choices nor the machine can make two islands round differently.
//
//   m_i = fma(μ, m_i, Δ̄_i);  u_i = fma(μ, m_i, Δ̄_i);  θ_i = fma(−lr, u_i, θ_i)
//
// With lr = 1 and μ = 0 this is θ − Δ̄ = mean of the islands' θ_local (to one rounding): plain
// parameter averaging, which for H = 1 and a linear inner optimizer (SGD) is data parallel.
//
// Fragments (streaming DiLoCo, fragments.h): θ is cut into fragments of whole tensors, and the
// outer step above also runs on one fragment at a time, in three parts so that the exchange can
// run on another thread (streaming.h): snapshot (Δ_f from the live θ_local), exchange (the ring
// on Δ_f; touches only fragment f's buffer, its ring and the outer group) and apply (the outer
// step on θ_f and m_f, then the merge into θ_local_f). θ and m stay the same flat arrays; each
// fragment counts its own outer steps. With one fragment (whole_plan) this is plain DiLoCo.
//
// Sharding across an island's ranks (M > 1 workers per island, `island` given): the ranks of an
// island hold the same θ_local, so each needs only part of the exchange. Rank s of M exchanges
// and updates only the s-th M-th of each fragment's Δ_f (flattened), over its own outer group
// (outer-r<s>), so the slow links carry each element once per island, not M times; then the
// island all-gathers the updated θ_f and m_f shards (the fast link) and every rank applies the
// merge to its whole θ_local_f. θ and m stay whole on every rank (checkpoints, hashes).
//
// After each sync the hashes of θ and of the momentum (xxh3 of their bytes, 16 hex digits; of a
// fragment, of its ranges in order) are returned; islands log them and compare.
//
// Bad updates (update_guard.h): before the ring, every exchange checks the round's Δs (one
// all-gather of norms and tags over the outer group): a non-finite or stale Δ is dropped (the
// mean is over the others), one far above the median norm is clipped. The tag of fragment f's Δ
// is the outer step being attempted (outer_step() + 1) and the hash of θ_f. What was dropped or
// clipped comes back in SyncResult::incidents when the step is applied.
//
// Time budget (diloco.sync_seconds, streaming.h): islands end their rounds after different
// numbers of inner steps. set_round() gives the exchange this island's round (its step and
// tokens); with GuardOptions::weight_by_tokens the mean weights each Δ by its tokens, and the
// applied step reports the round's furthest step and its tokens in all, which every island
// then adopts. Error feedback keeps its residual in the units the ring sent (the weighted Δ): what
// a round left out of its contribution to the mean is owed to the mean, whatever the next
// round's weight, so the sum of what an island sent stays the sum of what it meant to send.
//
// Experts (diloco.expert_merge = "tokens", expert_merge.h): the caller adds each inner step's
// per-expert token counts (add_expert_counts); each fragment's snapshot takes the counts since its
// last one (summed over the island's ranks when sharded), the guard's all-gather carries them,
// and each expert's Δ is weighted by them; an expert no kept island used keeps θ and m.
//
// Sparse expert exchange (diloco.expert_topk, expert_topk.h): after the guard, the experts' elements
// leave the ring; each island sends the top ones of each layer by the norm of Δ + residual, as
// frames of an all-gather, and keeps the rest in its residual (per fragment, this rank's shard;
// sharded, the island's ranks choose from norms summed over the island, so they choose alike). The
// ring carries the dense elements alone. An expert no island sent keeps θ and m.
//
// Elastic runs (elastic_group.h): an exchange leaves θ, m, θ_local and Δ_f as they were (the
// mean goes to its own buffer), so an outer step that is not committed is simply not applied:
// discard() takes back the residual the ring moved on, and the same Δ_f is exchanged again
// over the next epoch's group (rebind()). detach() lets go of the group first (its
// connections close, so peers still waiting in it fail at once) and keeps the residuals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "atoll/dist/expert_merge.h"
#include "atoll/dist/expert_topk.h"
#include "atoll/dist/fragments.h"
#include "atoll/dist/group.h"
#include "atoll/dist/ring_allreduce.h"
#include "atoll/dist/update_guard.h"

namespace atl {

struct DilocoOptions {
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  RingOptions ring{};
  GuardOptions guard{};
  // Per-expert token weighting (expert_merge.h): θ's expert spans (ascending) and the number of
  // slots; 0 slots: the flat mean.
  std::vector<ExpertSpan> experts{};
  size_t expert_slots = 0;
  // Sparse expert exchange (expert_topk.h): the fraction of each layer's E experts an island
  // sends per round (0 or 1: every expert, the dense ring) over θ's expert spans (`experts`).
  double expert_topk = 0;
  int experts_per_layer = 0;
};

struct SyncResult {
  int64_t outer_step = 0;  // fragment outer steps done in the run (all fragments), this one included
  int fragment = 0;        // the fragment synced; -1 for a sync of every fragment when there are several
  std::string theta_hash;     // hex xxh3 of that fragment's θ (of all of θ for fragment -1)
  std::string momentum_hash;  // the same of the outer momentum
  uint64_t bytes_sent = 0; // by this sync
  double seconds = 0;      // wall time of the exchange (and the whole call for sync())
  std::vector<UpdateIncident> incidents{};  // Δs of the round dropped or clipped (members by group rank)
  int64_t furthest_step = 0;  // the round's largest step (set_round), over its members
  int64_t round_tokens = 0;   // the round's tokens over its members (set_round)
  double weight = 1.0;        // the token weight this island's Δ got (update_guard.h)
};

class DilocoSync {
 public:
  // θ starts as theta0[n] (every island must pass the same values; the caller checks with
  // theta_hash() if it wants), the momentum at zero. `outer` is the group across islands.
  // `plan` cuts [0, n) into fragments; empty: one fragment (plain DiLoCo). `island`: the group
  // of this island's ranks, to shard the exchange over (null or size 1: no sharding).
  DilocoSync(ProcessGroup& outer, const float* theta0, size_t n, const DilocoOptions& opts, FragmentPlan plan = {},
             ProcessGroup* island = nullptr);
  ~DilocoSync();

  // One blocking outer step of every fragment in turn; theta_local[n] <- θ. On failure
  // (Timeout, PeerLost) the fragments not yet applied are unchanged, in θ, m and theta_local.
  SyncResult sync(float* theta_local);

  // The parts of one fragment's outer step. snapshot: Δ_f = θ_f − theta_local_f. exchange:
  // Δ̄_f = mean over islands (may run on another thread while the caller changes theta_local;
  // throws Timeout/PeerLost with θ, m and Δ_f unchanged; sharded: this rank's shard only). apply:
  // the outer step on θ_f and m_f (sharded: on this rank's shard, then the island's all-gather),
  // then theta_local_f <- mixing·theta_local_f + (1 − mixing)·θ_f (mixing < 0: a plain copy;
  // theta_local null: no merge, the delayed outer step's, outer_delay.h). snapshot with `base`:
  // Δ_f = base_f − theta_local_f (the delayed step's round start instead of θ).
  void snapshot(int f, const float* theta_local, const float* base = nullptr);
  // Returns its wall time. `as_step`: the outer step its Δ is tagged with (the guard's staleness
  // check), which is the outer step it becomes when applied; 0: the next one, outer_step() + 1.
  // With several exchanges in flight (the delayed step with fragments) the caller numbers them,
  // as outer_step() moves while they run.
  double exchange(int f, int64_t as_step = 0);
  SyncResult apply(int f, float* theta_local, double mixing);
  // Fragment f's exchange will not be applied: the ring's residual goes back to before it (a
  // no-op when the exchange failed, which changed nothing). Δ_f stays for another exchange.
  void discard(int f);
  // This island's round for the exchanges that follow (time budget; zeros otherwise).
  void set_round(const RoundWork& work) { round_ = work; }
  const GuardResult& guarded(int f) const { return guarded_[size_t(f)]; }  // fragment f's last exchange
  // Experts: this worker's tokens per expert slot in the inner step just taken, counts[slots],
  // added to every fragment's round; and each fragment's counts since its last snapshot (the
  // state registry saves them per worker, so a resumed round weighs as the uninterrupted one).
  bool merges_experts() const { return opts_.expert_slots > 0; }
  void add_expert_counts(const double* counts);
  const std::vector<std::vector<double>>& expert_counts() const { return counts_; }
  void set_expert_counts(const std::vector<std::vector<double>>& counts);
  // Each fragment's counts as its last snapshot took them (the island's): what its exchange
  // carries, so a checkpoint with that exchange in flight saves them (the delayed outer step).
  const std::vector<std::vector<double>>& snapshot_counts() const { return sending_; }
  void set_snapshot_counts(const std::vector<std::vector<double>>& counts);
  // Lets go of the outer group (the rings and their connections), keeping the residuals; and
  // takes a new group (rings over it, the residuals carried over). Between the two no
  // exchange may run.
  void detach();
  void rebind(ProcessGroup& outer);

  // Fragment f's Δ_f as the last snapshot took it (flattened; with one fragment θ's layout), kept
  // until the next snapshot: the delayed outer step's checkpoints save and restore it.
  std::vector<float>& delta(int f) { return delta_[size_t(f)]; }
  const DilocoOptions& options() const { return opts_; }

  int fragments() const { return plan_.count(); }
  const FragmentPlan& plan() const { return plan_; }
  std::string theta_hash() const;           // all of θ
  std::string fragment_hash(int f) const;   // fragment f's ranges of θ, in order
  std::string momentum_hash() const;        // all of m
  std::string fragment_momentum_hash(int f) const;
  std::vector<float>& theta() { return theta_; }
  std::vector<float>& momentum() { return momentum_; }
  int64_t outer_step() const;  // sum over fragments
  const std::vector<int64_t>& fragment_outer_steps() const { return outer_steps_; }
  void set_fragment_outer_steps(const std::vector<int64_t>& s);
  // Error-feedback residuals, one ring per fragment when diloco.error_feedback is on.
  const RingAllreduce& ring(int f) const;
  // Every fragment's residual in θ's layout, out[n] (zeros where a ring holds none yet), and
  // back (a fragment of zeros clears its ring's residual, which adds the same nothing), for
  // checkpoints. Error feedback only. Sharded: this rank's shard (zeros elsewhere; the sum over
  // the island is the island's residual), and set_residual takes this rank's shard of `in`.
  // `only` >= 0: that fragment's ranges alone are written.
  void residual(float* out, int only = -1) const;
  void set_residual(const float* in);
  // Sparse expert exchange: every fragment's expert residual in θ's layout (zeros at the dense
  // elements), and back; sharded as residual() above.
  bool sends_sparse() const { return !topk_.empty(); }
  void expert_residual(float* out, int only = -1) const;
  void set_expert_residual(const float* in);
  // Between θ's layout x and fragment f's flattened elements (delta(f)'s layout): flat[lo, hi) <-
  // the fragment-f elements of x at flat positions [lo, hi), and back (all of f).
  void pack(int f, const float* x, float* flat, size_t lo, size_t hi) const;
  void unpack(int f, const float* flat, float* x) const;

 private:
  RingAllreduce& ring_of(int f);
  void make_rings(ProcessGroup& outer);
  std::string ranges_hash(const std::vector<float>& x, int f) const;
  // This rank's shard [lo, hi) of fragment f's flattened elements (even_part).
  std::pair<size_t, size_t> shard(int f) const;
  bool in_fragment(int f, const ExpertSpan& s) const;  // s lies in fragment f (whole tensors: in or out)
  // The fault injection's bad Δ (core/fault_injection.h) on this rank's input flat[lo, hi).
  void corrupt_for_fault(int f, float* flat, size_t lo, size_t hi, UpdateTag& tag);
  // θ_f and m_f: every rank's updated shard to every rank of the island.
  void share_shards(int f);
  // The exchange of x = this rank's guarded shard of Δ_f with sparse experts (the ring for the
  // dense elements); returns the bytes the experts' frames took.
  uint64_t exchange_sparse(int f, RingAllreduce& ring, float* x);

  DilocoOptions opts_;
  FragmentPlan plan_;
  ProcessGroup* island_ = nullptr;  // set when sharding (size > 1)
  int shard_ = 0, shards_ = 1;
  // With error feedback each fragment needs its own residual, hence its own ring; without, the
  // fragments share one (a ring holds a few MiB of wire buffers per connection).
  std::vector<std::unique_ptr<RingAllreduce>> rings_;  // empty while detached
  ProcessGroup* outer_ = nullptr;                      // the rings' group; null while detached
  std::vector<std::vector<float>> parked_;            // the rings' residuals while detached
  std::vector<float> theta_, momentum_;
  std::vector<std::vector<float>> delta_;  // per fragment: Δ_f gathered contiguously, kept until applied
  // Per fragment: Δ̄_f. Not one shared buffer: with the delayed step and fragments one fragment's
  // mean is applied while the next fragment's exchange writes its own.
  std::vector<std::vector<float>> mean_;
  // Per fragment: exchanged, not yet applied or discarded. Not vector<bool>: its bits share words,
  // and exchanges of other fragments write theirs from another thread.
  std::vector<char> exchanged_;
  std::vector<uint64_t> sent_;             // per fragment: bytes of its last exchange
  std::vector<double> exchange_s_;         // per fragment: wall time of its last exchange
  std::vector<int64_t> outer_steps_;       // per fragment
  std::vector<GuardResult> guarded_;       // per fragment: the guard's verdict on its last exchange
  RoundWork round_{};                      // this island's round (set_round)
  // Experts: per fragment, the counts since its last snapshot, those its snapshot took (the
  // island's), and the expert spans of this rank's shard of its flattened Δ.
  std::vector<std::vector<double>> counts_, sending_;
  std::vector<std::vector<ExpertSpan>> shard_spans_;
  // Sparse expert exchange: per fragment, its exchange (this rank's shard) and the slots its last
  // exchange had no island send; the dense elements' scratch.
  std::vector<std::unique_ptr<ExpertTopk>> topk_;
  std::vector<std::vector<int>> unsent_;
  std::vector<float> dense_;
  // Fault injection only (a replayed Δ): per fragment, the input and tag of its last exchange.
  std::vector<std::pair<std::vector<float>, UpdateTag>> sent_before_;
};

// The outer Nesterov update on n elements (the formulas above), for tests and for apply().
void outer_nesterov_step(float* theta, float* momentum, const float* mean_delta, size_t n, double lr,
                         double momentum_coef);

// Hex xxh3 (16 digits) of n floats' bytes.
std::string hash_floats(const float* x, size_t n);

}  // namespace atl
