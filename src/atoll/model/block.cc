#include "atoll/model/block.h"

#include <algorithm>

#include "atoll/model/experts_swiglu.h"
#include "atoll/model/part_kinds.h"

namespace atl {

void append_block_rows(ParamLayout& layout, const ModelConfig& m, int layer) {
  const std::string pre = layer_prefix(layer);
  rmsnorm_rows(layout, m, pre + "attn_norm", layer);
  attention_kind_at(m, layer).rows(layout, m, layer);
  residual_merge_rows(layout, m, pre + "attn_merge", true, layer);
  rmsnorm_rows(layout, m, pre + "moe_norm", layer);
  router_kind_at(m, layer).rows(layout, m, layer);
  experts_swiglu_rows(layout, m, layer);
  residual_merge_rows(layout, m, pre + "moe_merge", true, layer);
}

template <typename T>
BlockBuffers<T>::BlockBuffers(const ModelConfig& m, int max_tokens)
    : hn(size_t(max_tokens) * m.dim), tmp(size_t(max_tokens) * m.dim), dx(size_t(max_tokens) * m.dim),
      dh(size_t(max_tokens) * m.dim), dtopk_w(size_t(max_tokens) * m.top_k) {}

template <typename T>
Block<T>::Block(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch,
                BlockBuffers<T>& buf)
    : buf_(buf),
      attn_norm_(m, layout, layer_prefix(layer) + "attn_norm", s),
      attention_(attention_kind_at(m, layer).make<T>()(m, layout, layer, s, scratch)),
      attn_merge_(m, layout, layer_prefix(layer) + "attn_merge", true, s),
      mid_(size_t(s.max_tokens) * m.dim, s, scratch),
      moe_norm_(m, layout, layer_prefix(layer) + "moe_norm", s),
      router_(router_kind_at(m, layer).make<T>()(m, layout, layer, s, scratch)),
      experts_(std::make_unique<ExpertsSwiglu<T>>(m, layout, layer, s, scratch)),
      moe_merge_(m, layout, layer_prefix(layer) + "moe_merge", true, s) {
  first_ = layout.total(), end_ = 0;
  for (const ParamEntry& e : layout.entries())
    if (e.layer == layer) first_ = std::min(first_, e.offset), end_ = std::max(end_, e.offset + e.numel);
}

template <typename T>
size_t Block<T>::work_elements() const {
  return std::max({attention_->work_elements(), router_->work_elements(), experts_->work_elements()});
}

template <typename T>
RouterLosses Block<T>::forward(T* x_next, const T* x, const PartContext<T>& c) {
  T* mid = mid_.data();
  attn_norm_.forward(buf_.hn.data(), x, c);
  attention_->forward(buf_.tmp.data(), buf_.hn.data(), c);
  attn_merge_.forward(mid, buf_.tmp.data(), x, c);
  moe_norm_.forward(buf_.hn.data(), mid, c);
  const RouterLosses losses = router_->forward(buf_.hn.data(), c);
  experts_->forward(buf_.tmp.data(), buf_.hn.data(), router_->topk_idx(), router_->topk_w(), c);
  moe_merge_.forward(x_next, buf_.tmp.data(), mid, c);
  return losses;
}

// xmid for backward: kept, or recomputed from x and the attention output exactly as forward did.
template <typename T>
const T* Block<T>::mid_for_backward(const T* x, const PartContext<T>& c) {
  if (mid_.kept()) return mid_.data();
  attention_->recompute_output(buf_.tmp.data(), c);
  attn_merge_.forward(mid_.data(), buf_.tmp.data(), x, c);
  return mid_.data();
}

// The forward in reverse. The norms' outputs are recomputed (rstd as kept, the same values).
// A merge's backward leaves d(stream) in dx and hands back d(sub-layer output): dx itself for
// the plain add, else buf_.tmp (free once xmid is at hand).
template <typename T>
void Block<T>::backward(const T* x, const PartContext<T>& c) {
  const size_t NC = size_t(c.d.N) * c.d.C;
  T *hn = buf_.hn.data(), *dx = buf_.dx.data(), *dh = buf_.dh.data();
  const T* mid = mid_for_backward(x, c);
  moe_norm_.forward(hn, mid, c);
  const T* dmoe = moe_merge_.backward(buf_.tmp.data(), dx, mid, c);
  std::fill(dh, dh + NC, T(0));
  experts_->backward(dh, buf_.dtopk_w.data(), dmoe, hn, router_->topk_w(), c);
  router_->backward(dh, buf_.dtopk_w.data(), hn, c);
  moe_norm_.backward(dx, dh, mid, c);
  attn_norm_.forward(hn, x, c);
  const T* dattn = attn_merge_.backward(buf_.tmp.data(), dx, x, c);
  std::fill(dh, dh + NC, T(0));
  attention_->backward(dh, dattn, hn, c);
  attn_norm_.backward(dx, dh, x, c);
}

// The position-wise parts (norms, router, experts) decode by their forward on one token.
template <typename T>
void Block<T>::decode(T* x, int pos, const PartContext<T>& c) {
  attn_norm_.forward(buf_.hn.data(), x, c);
  attention_->decode(buf_.tmp.data(), buf_.hn.data(), pos, c);
  after_attention(x, c);
}

template <typename T>
void Block<T>::prefill(T* x, int pos, const PartContext<T>& c) {
  attn_norm_.forward(buf_.hn.data(), x, c);
  attention_->prefill(buf_.tmp.data(), buf_.hn.data(), pos, c);
  after_attention(x, c);
}

// Decoding and prefill, once the attention output is in buf_.tmp: its merge, then the MoE half,
// x in place.
template <typename T>
void Block<T>::after_attention(T* x, const PartContext<T>& c) {
  attn_merge_.forward(x, buf_.tmp.data(), x, c);
  moe_norm_.forward(buf_.hn.data(), x, c);
  // Without the group: under tree attention c.cp is the group the cache is sharded over, and the
  // router would add its balancing sums over it (a collective a layer and token, as under context
  // parallelism) for losses nobody reads here; its choices are position-wise.
  PartContext<T> alone = c;
  alone.cp = nullptr;
  router_->forward(buf_.hn.data(), alone);
  experts_->forward(buf_.tmp.data(), buf_.hn.data(), router_->topk_idx(), router_->topk_w(), c);
  moe_merge_.forward(x, buf_.tmp.data(), x, c);
}

template struct BlockBuffers<float>;
template struct BlockBuffers<double>;
template class Block<float>;
template class Block<double>;

}  // namespace atl
