// One transformer block, composed of parts chosen per layer by the config (the attention kind
// model.attention, the router kind model.router), as gemma.cpp picks a layer's attention type:
//   xmid   = merge(attention(attn_norm(x)), x)
//   x_next = merge(experts(moe_norm(xmid), router(moe_norm(xmid))), xmid)
// where merge(a, r) is the residual add a + r, or ZAYA1's residual scaling (ResidualMerge).
// Forward calls the parts in that order; backward calls them in reverse. Decoding runs the
// same parts on one token, and prefill on a block of them.
#pragma once

#include <memory>
#include <vector>

#include "atoll/model/norm_residual.h"
#include "atoll/model/part.h"

namespace atl {

// Appends block `layer`'s rows to the layout, part by part in the block's order.
void append_block_rows(ParamLayout& layout, const ModelConfig& m, int layer);

// The buffers the blocks pass between their parts, shared by all blocks: [N,C] each unless said.
template <typename T>
struct BlockBuffers {
  BlockBuffers(const ModelConfig& m, int max_tokens);
  std::vector<T> hn;       // a norm's output (recomputed in backward rather than kept)
  std::vector<T> tmp;      // a sub-layer's output before its residual add
  std::vector<T> dx, dh;   // d(residual stream), d(norm output)
  std::vector<T> dtopk_w;  // [N,K] d(combine weights), experts -> router
};

template <typename T>
class Block {
 public:
  Block(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch,
        BlockBuffers<T>& buf);
  // Shared work elements the parts need (PartContext::work).
  size_t work_elements() const;
  // The block's parameters are the flat range [first_param, end_param).
  size_t first_param() const { return first_; }
  size_t end_param() const { return end_; }

  // x_next[N,C] (=) from x[N,C]; returns the router's auxiliary losses.
  RouterLosses forward(T* x_next, const T* x, const PartContext<T>& c);
  // On entry buf.dx holds d(x_next); on exit d(x). x as in forward.
  void backward(const T* x, const PartContext<T>& c);

  // Links this block's router to the previous block's (ZAYA1's depth averaging reads the
  // previous router's state; RouterPart::link_previous). The model calls it once per block > 0.
  void link_previous(Block& prev) { router_->link_previous(*prev.router_); }
  // The experts the router chose in the last forward [N,K].
  const int32_t* router_choice() const { return router_->topk_idx(); }

  void start_decode(int max_len, int cache_rows) { attention_->start_decode(max_len, cache_rows); }
  // x[C] (in place) for the token at position pos.
  void decode(T* x, int pos, const PartContext<T>& c);
  // x[N,C] (in place) for the c.d.N tokens at positions [pos, pos + N) (AttentionPart::prefill).
  void prefill(T* x, int pos, const PartContext<T>& c);

 private:
  const T* mid_for_backward(const T* x, const PartContext<T>& c);
  void after_attention(T* x, const PartContext<T>& c);

  BlockBuffers<T>& buf_;
  size_t first_, end_;
  RmsNormPart<T> attn_norm_;
  std::unique_ptr<AttentionPart<T>> attention_;
  ResidualMerge<T> attn_merge_;
  MidResidual<T> mid_;
  RmsNormPart<T> moe_norm_;
  std::unique_ptr<RouterPart<T>> router_;
  std::unique_ptr<ExpertsPart<T>> experts_;
  ResidualMerge<T> moe_merge_;
};

// Links each block's router to the previous block's (Block::link_previous), once the blocks
// are built: the model and the decoder call it.
template <typename T>
void link_blocks(std::vector<Block<T>>& blocks) {
  for (size_t l = 1; l < blocks.size(); ++l) blocks[l].link_previous(blocks[l - 1]);
}

extern template class Block<float>;
extern template class Block<double>;

}  // namespace atl
