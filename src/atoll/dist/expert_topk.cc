// Sparse expert exchange with error feedback (see expert_topk.h).
#include "atoll/dist/expert_topk.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>

#include "atoll/core/check.h"
#include "atoll/core/errors.h"
#include "atoll/dist/ring_message.h"

namespace atl {
namespace {

void put_u32(std::string& out, uint32_t v) {
  const uint8_t b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
  out.append(reinterpret_cast<const char*>(b), 4);
}

uint32_t get_u32(const std::string& in, size_t at) {
  const auto* b = reinterpret_cast<const uint8_t*>(in.data() + at);
  return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
}

}  // namespace

int experts_to_send(double fraction, int experts_per_layer) {
  if (fraction <= 0 || fraction >= 1) return experts_per_layer;
  return std::clamp(int(std::ceil(fraction * experts_per_layer - 1e-9)), 1, experts_per_layer);
}

std::vector<int> choose_experts(const std::vector<double>& squared_norms, const std::vector<bool>& eligible,
                                int experts_per_layer, int k) {
  const int E = experts_per_layer, slots = int(squared_norms.size());
  ATOLL_CHECK(E > 0 && slots % E == 0 && eligible.size() == squared_norms.size()) << slots << " slots, E " << E;
  std::vector<int> out;
  for (int first = 0; first < slots; first += E) {
    std::vector<int> layer;
    for (int s = first; s < first + E; ++s)
      if (eligible[size_t(s)] && squared_norms[size_t(s)] > 0) layer.push_back(s);
    // Largest first; equal norms by slot, so every island breaks a tie the same way.
    std::stable_sort(layer.begin(), layer.end(),
                     [&](int a, int b) { return squared_norms[size_t(a)] > squared_norms[size_t(b)]; });
    layer.resize(std::min(layer.size(), size_t(std::max(k, 0))));
    out.insert(out.end(), layer.begin(), layer.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

ExpertTopk::ExpertTopk(std::vector<ExpertSpan> spans, size_t n, size_t slots, const TopkOptions& opts)
    : spans_(std::move(spans)), n_(n), slots_(slots), opts_(opts), slot_spans_(slots) {
  size_t at = 0;
  for (size_t i = 0; i < spans_.size(); ++i) {
    const ExpertSpan& s = spans_[i];
    ATOLL_CHECK(s.begin >= at && s.end <= n && s.slot >= 0 && size_t(s.slot) < slots)
        << "expert span [" << s.begin << ", " << s.end << ") slot " << s.slot << " of " << n << " elements";
    slot_spans_[size_t(s.slot)].push_back(i);
    expert_n_ += s.end - s.begin;
    at = s.end;
  }
  slot_at_.assign(slots + 1, 0);
  for (size_t s = 0; s < slots; ++s) {
    size_t len = 0;
    for (size_t i : slot_spans_[s]) len += spans_[i].end - spans_[i].begin;
    slot_at_[s + 1] = slot_at_[s] + len;
  }
}

void ExpertTopk::values(const float* x, std::vector<float>& v) const {
  v.resize(expert_n_);
  for (size_t s = 0; s < slots_; ++s) {
    size_t k = slot_at_[s];
    for (size_t i : slot_spans_[s])
      for (size_t j = spans_[i].begin; j < spans_[i].end; ++j, ++k) v[k] = residual_.empty() ? x[j] : x[j] + residual_[k];
  }
}

std::vector<double> ExpertTopk::squared_norms(const float* x) const {
  std::vector<float> v;
  values(x, v);
  std::vector<double> ss(slots_, 0.0);
  for (size_t s = 0; s < slots_; ++s)
    for (size_t k = slot_at_[s]; k < slot_at_[s + 1]; ++k) ss[s] += double(v[k]) * double(v[k]);
  return ss;
}

TopkResult ExpertTopk::exchange(ProcessGroup& group, float* x, const std::vector<int>& chosen, bool contributes) {
  const Codec codec = opts_.codec;
  std::vector<float> v;
  values(x, v);
  // This member's frame, and the residual it leaves: v where nothing was sent, v − sent where it was.
  std::vector<int> mine = contributes ? chosen : std::vector<int>{};
  pending_ = contributes ? v : residual_;
  std::string frame;
  put_u32(frame, uint32_t(mine.size()));
  std::vector<uint8_t> payload;
  for (int s : mine) {
    ATOLL_CHECK(s >= 0 && size_t(s) < slots_) << "slot " << s;
    put_u32(frame, uint32_t(s));
    const size_t lo = slot_at_[size_t(s)], len = slot_at_[size_t(s) + 1] - lo, at = payload.size();
    payload.resize(at + encoded_bytes(codec, len));
    encode(codec, v.data() + lo, len, payload.data() + at);
    std::vector<float> sent(len);
    decode(codec, payload.data() + at, len, sent.data());
    for (size_t k = 0; k < len; ++k) pending_[lo + k] = v[lo + k] - sent[k];
  }
  if (opts_.compress) {
    std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    std::vector<uint8_t> msg(kRingHeaderBytes + std::max(payload.size(), ZSTD_compressBound(payload.size())));
    msg.resize(wrap_ring_message(cctx.get(), payload.data(), payload.size(), msg.data(), msg.size()));
    payload.swap(msg);
  }
  frame.append(reinterpret_cast<const char*>(payload.data()), payload.size());

  const std::vector<std::string> frames = group.allgather(frame);
  const int P = int(frames.size());
  // Every member's frame decoded in member order into the same sums: bit-identical everywhere.
  std::vector<float> sum(expert_n_, 0.0f);
  std::vector<bool> sent_by_any(slots_, false);
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  std::vector<uint8_t> plain;
  for (int m = 0; m < P; ++m) {
    const std::string& f = frames[size_t(m)];
    auto bad = [&](const std::string& why) {
      return PeerLost("sparse expert exchange: member " + std::to_string(m) + "'s frame " + why);
    };
    if (f.size() < 4) throw bad("is shorter than its header");
    const size_t count = get_u32(f, 0);
    if (count > slots_ || f.size() < 4 + 4 * count) throw bad("lists more slots than it holds");
    std::vector<size_t> slots(count);
    size_t want = 0;
    for (size_t i = 0; i < count; ++i) {
      slots[i] = get_u32(f, 4 + 4 * i);
      if (slots[i] >= slots_ || (i > 0 && slots[i] <= slots[i - 1])) throw bad("lists slots out of order or range");
      want += encoded_bytes(codec, slot_at_[slots[i] + 1] - slot_at_[slots[i]]);
    }
    const size_t head = 4 + 4 * count;
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(f.data()) + head;
    if (opts_.compress) {
      bytes = unwrap_ring_message(dctx.get(), bytes, f.size() - head, want, plain);
    } else if (f.size() - head != want) {
      throw bad("holds " + std::to_string(f.size() - head) + " payload bytes, not " + std::to_string(want));
    }
    for (size_t s : slots) {
      const size_t lo = slot_at_[s], len = slot_at_[s + 1] - lo;
      decode_add(codec, bytes, len, sum.data() + lo);
      bytes += encoded_bytes(codec, len);
      sent_by_any[s] = true;
    }
  }
  TopkResult res;
  res.bytes = (sizeof(uint64_t) + frame.size()) * uint64_t(P - 1);
  const float members = float(P);
  for (size_t s = 0; s < slots_; ++s) {
    if (!sent_by_any[s]) res.unsent.push_back(int(s));
    size_t k = slot_at_[s];
    for (size_t i : slot_spans_[s])
      for (size_t j = spans_[i].begin; j < spans_[i].end; ++j, ++k) x[j] = sent_by_any[s] ? sum[k] / members : 0.0f;
  }
  pending_ready_ = true;
  return res;
}

void ExpertTopk::commit() {
  ATOLL_CHECK(pending_ready_) << "sparse expert exchange: a commit without an exchange";
  before_.swap(residual_);
  residual_.swap(pending_);
  pending_ready_ = false;
  undo_ready_ = true;
}

void ExpertTopk::undo() {
  if (undo_ready_) residual_.swap(before_);
  undo_ready_ = false;
}

void ExpertTopk::gather_dense(const float* x, float* dense) const {
  size_t at = 0;
  for (const ExpertSpan& s : spans_) {
    dense = std::copy(x + at, x + s.begin, dense);
    at = s.end;
  }
  std::copy(x + at, x + n_, dense);
}

void ExpertTopk::scatter_dense(const float* dense, float* x) const {
  size_t at = 0;
  for (const ExpertSpan& s : spans_) {
    std::copy_n(dense, s.begin - at, x + at);
    dense += s.begin - at;
    at = s.end;
  }
  std::copy_n(dense, n_ - at, x + at);
}

void ExpertTopk::residual(float* x) const {
  for (size_t s = 0; s < slots_; ++s) {
    size_t k = slot_at_[s];
    for (size_t i : slot_spans_[s])
      for (size_t j = spans_[i].begin; j < spans_[i].end; ++j, ++k) x[j] = residual_.empty() ? 0.0f : residual_[k];
  }
}

void ExpertTopk::set_residual(const float* x) {
  std::vector<float> r(expert_n_);
  for (size_t s = 0; s < slots_; ++s) {
    size_t k = slot_at_[s];
    for (size_t i : slot_spans_[s])
      for (size_t j = spans_[i].begin; j < spans_[i].end; ++j, ++k) r[k] = x[j];
  }
  if (std::all_of(r.begin(), r.end(), [](float v) { return v == 0.0f; })) r.clear();
  residual_.swap(r);
  pending_ready_ = undo_ready_ = false;
}

}  // namespace atl
