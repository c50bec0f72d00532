// Sparse expert exchange with error feedback (diloco.expert_topk, docs/islands.md "Experts in the
// outer step"; the top-k and error feedback of SparseLoCo, arXiv 2508.15706, taken per expert).
// In a mixture of experts most of θ is experts, and in a round an island may have changed some
// experts of a layer a lot and others hardly at all. Each island sends only the k experts of each
// layer whose pseudo-gradient carries the most, and keeps the rest for later rounds:
//
//   v_e  = Δ_e + r_e                   Δ after the update guard (and its weights), r the residual
//   send the k slots of each layer with the largest ‖v_e‖ (ties to the lower slot; 0 norms never)
//   r_e ← v_e − sent_e                 sent_e: what the codec's bytes decode to (0 when not sent),
//                                       so quantization error is fed back too
//   Δ̄_e = Σ over the members of sent_e / P      0 for a member that did not send e
//
// The mean divides by every member (SparseLoCo's choice), not by the members that sent e: with
// error feedback what an island did not send now it sends later, so over the rounds the sum of
// its contributions is the sum of its Δs, and the mean over P of them is DiLoCo's mean. A mean
// over the senders would count an island's Δ again when its residual is sent later. An expert no
// member sent has no mean: the outer step leaves its θ and outer momentum as they are (the
// islands' local copies return to θ; their progress waits in their residuals).
//
// Transport: an all-gather (each member sends its frame to every other) of frames
//   [uint32 count][count x uint32 slot, ascending][payload]
// payload = each sent slot's elements (its spans in x, ascending) encoded with the run's codec,
// one slot after another, each starting a codec block; with `compress`, the payload travels as a
// ring message (ring_message.h: zstd when smaller). Every member decodes every frame in member
// order into the same sums (decode_add), so the mean is bit-identical everywhere. Its bytes per
// member, (P−1)·frame, beat the dense ring's 2(P−1)/P·n when the frame is under 2/P of the
// experts: for 2 islands any k below E, for 8 islands k below E/4. The dense elements between
// the experts still take the ring (the caller's job: gather_dense / scatter_dense).
//
// Elastic runs: exchange() changes nothing it keeps until commit(); undo() takes the last commit
// back (an outer step not committed), so a retried exchange sends the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "atoll/dist/codec.h"
#include "atoll/dist/expert_merge.h"
#include "atoll/dist/group.h"

namespace atl {

// Experts sent per layer for diloco.expert_topk = fraction of E: ceil(fraction·E), at least 1 and
// at most E (fraction 0 or 1: E, the dense exchange).
int experts_to_send(double fraction, int experts_per_layer);

// The slots to send, ascending: in each layer (slots [l·E, (l+1)·E)) the k eligible ones with the
// largest squared norms, ties to the lower slot; a slot whose norm is 0 is never sent.
std::vector<int> choose_experts(const std::vector<double>& squared_norms, const std::vector<bool>& eligible,
                                int experts_per_layer, int k);

struct TopkOptions {
  int experts_per_layer = 0;  // E
  Codec codec = Codec::kFp32;
  bool compress = false;  // zstd over the payload (RingOptions::compress)
};

struct TopkResult {
  std::vector<int> unsent;  // slots no member sent, ascending: their θ and momentum stay
  uint64_t bytes = 0;       // this member sent (the all-gather's count, as ProcessGroup records it)
};

class ExpertTopk {
 public:
  // `spans`: the experts' elements in this member's x[n] (ascending, disjoint: fragment_expert_spans),
  // slots numbered layer·E + e below `slots`.
  ExpertTopk(std::vector<ExpertSpan> spans, size_t n, size_t slots, const TopkOptions& opts);

  // Per slot, Σ v² over this member's elements of it (v = x + r, in float as sent), in doubles.
  std::vector<double> squared_norms(const float* x) const;
  // Sends `chosen` (choose_experts) and writes Δ̄ into x's expert elements (the dense ones are
  // left alone). `contributes` false (a member the guard dropped): it sends nothing and its
  // residual stays as it was. Every member calls it; throws the group's Timeout/PeerLost, or
  // PeerLost for a malformed frame, before anything but x changed. The new residual waits for
  // commit().
  TopkResult exchange(ProcessGroup& group, float* x, const std::vector<int>& chosen, bool contributes);
  void commit();  // the exchange's residual becomes the residual
  void undo();    // the residual before the last commit (no-op without one)

  // The elements outside the experts, gathered into dense[dense_size()] and back.
  size_t dense_size() const { return n_ - expert_n_; }
  void gather_dense(const float* x, float* dense) const;
  void scatter_dense(const float* dense, float* x) const;
  // The residual at x's expert elements (others untouched), and back (for checkpoints).
  void residual(float* x) const;
  void set_residual(const float* x);
  // The residual r in slot order (each slot's spans in turn): empty = zeros.
  const std::vector<float>& residual_by_slot() const { return residual_; }

 private:
  void values(const float* x, std::vector<float>& v) const;  // v = x + r in slot order
  std::vector<ExpertSpan> spans_;
  size_t n_ = 0, slots_ = 0, expert_n_ = 0;
  TopkOptions opts_;
  std::vector<std::vector<size_t>> slot_spans_;  // per slot: its span indices, ascending
  std::vector<size_t> slot_at_;                  // per slot: its first element in slot order; [slots] = expert_n_
  std::vector<float> residual_, pending_, before_;
  bool pending_ready_ = false, undo_ready_ = false;
};

}  // namespace atl
