// Compressed convolutional attention (CCA, ZAYA1's; layers/cca.h has the algorithm and the
// reference): q and k projected into a compressed space of NH and NKV heads of HD, two causal
// convolutions over [q|k] (depthwise kernel cca_time0, grouped per head kernel cca_time1), the
// qk-mean skip, the value shift (half of the value from the current token, half from the
// previous one), q and k L2-normalised to √HD with a learned per-KV-head temperature on k,
// partial RoPE, causal GQA, and o_proj.
//
// Rows, named as transformers' `zaya` names them after "model.layers.{l}.self_attn." (the export
// is a rename of "layers.{l}.attn."), in upstream's shapes:
//   attn.qkv_proj.q_proj.weight [QD,C]           attn.qkv_proj.k_proj.weight [KVD,C]
//   attn.qkv_proj.v_proj_current.weight [KVD/2,C] attn.qkv_proj.v_proj_delayed.weight [KVD/2,C]
//   attn.qkv_proj.conv_qk_depthwise.weight [CC,1,t0]  .bias [CC]    (CC = QD + KVD)
//   attn.qkv_proj.conv_qk_grouped.weight [CC,HD,t1]   .bias [CC]
//   attn.qk_norm.temp [NKV]                      attn.o_proj.weight [C,QD]
// The projections, o_proj and the grouped kernel (one [HD, HD·t1] matrix per head) are hidden
// matrices (Muon); the depthwise kernel and the biases are kConv (AdamW, no decay).
//
// Initialisation: matrices and kernels ~ N(0, init_std²), biases 0, and temp = 1. Upstream
// initialises temp to 0, which makes every score 0 (uniform attention, and the gradient into q
// vanishes, so nothing but temp itself can start learning); exported checkpoints always carry
// their trained value. At 1, with q and k normalised to √HD and scores scaled by 1/√HD, a score
// is √HD·cos(q, k): what standard attention gives for q and k of unit-variance entries, the
// regime the rest of the model is initialised for.
//
// Context parallelism (PartContext::cp, docs/long_context.md): a rank holds two chunks of each
// sequence (TokenPositions' runs). The convolutions read the t0-1 + t1-1 pre-convolution rows
// before a chunk and the value shift the delayed value half of the token before it: the holder
// of the chunk before sends them (model/chunk_boundary.h; the rows' layout and the messages are
// model/cca_boundary.h's, shared with the CUDA mirror), the convolutions run on [boundary |
// chunk] and their first outputs (those the boundary rows alone feed) are dropped; backward
// returns the boundary rows' gradients to their holder, who adds them. Attention runs round the
// ring (attention_any), RoPE at the chunks' positions in the whole sequence.
//
// Decoding keeps, per layer: the keys (after norm, temperature and RoPE) and values of every
// position [len, KVD] each, the last t0-1 + t1-1 pre-convolution [q|k] rows, and the previous
// token's delayed value half [KVD/2] (what transformers' ZAYA cache keeps as conv_states and
// recurrent_states). Prefill runs a block as the training forward runs a chunk with a
// predecessor: the convolutions over [the window's last t0-1 + t1-1 rows | the block], the value
// shift from the kept delayed half; it leaves the window and that half as decode steps would.
#pragma once

#include <memory>
#include <vector>

#include "atoll/layers/cca.h"
#include "atoll/model/attention_core.h"
#include "atoll/model/cca_boundary.h"
#include "atoll/model/part.h"

namespace atl {

void attention_cca_rows(ParamLayout& layout, const ModelConfig& m, int layer);

// The dims of layers/cca.h for a batch of B sequences of T tokens.
CcaDims cca_dims(const ModelConfig& m, int B, int T);

template <typename T>
class AttentionCca final : public AttentionPart<T> {
 public:
  AttentionCca(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s, PartScratch& scratch);
  size_t work_elements() const override;
  void forward(T* out, const T* h, const PartContext<T>& c) override;
  void recompute_output(T* out, const PartContext<T>& c) override;
  void backward(T* dh, const T* dout, const T* h, const PartContext<T>& c) override;
  void start_decode(int max_len, int cache_rows) override;
  void decode(T* out, const T* h, int pos, const PartContext<T>& c) override;
  void prefill(T* out, const T* h, int pos, const PartContext<T>& c) override;

 private:
  int lag() const { return m_.cca_time0 - 1 + m_.cca_time1 - 1; }  // pre-convolution rows read back
  size_t x_rows_max() const;
  size_t y_rows_max() const;
  CcaBoundary boundary(const PartContext<T>& c) const;  // the messages of a context-parallel call
  void boundary_forward(const T* vd, const PartContext<T>& c);
  void boundary_backward(T* dx, T* dvd, const T* dv, const PartContext<T>& c);

  struct Rows {
    size_t wq, wk, wvc, wvd, w0, b0, w1, b1, temp, wo;
  };
  ModelConfig m_;
  int layer_, max_batch_, max_tokens_;
  Rows w_;
  std::shared_ptr<AttentionScratch<T>> sh_;  // shared by the attention layers
  // The pre-convolution [q|k] rows and the depthwise output, per run of TokenPositions:
  // x_ [B, lag + len, CC] (lag = t0-1 + t1-1 boundary rows first when the run has a
  // predecessor), y_ [B, its x rows + t1-1, CC]; whole sequences: [B,T,CC] and [B,T+t1-1,CC].
  std::vector<T> x_, y_;
  std::vector<T> q_, k_, rq_, rk_;  // before the norm [N,QD], [N,KVD]; 1/‖·‖ [N,NH], [N,NKV]
  Kept<T> qn_, kn_, v_, att_;       // after norm and RoPE [N,QD], [N,KVD]; values [N,KVD]; [N,QD]
  std::vector<T> lse_;              // [B,NH,T]
  // Context parallelism: the boundary messages of the two runs [2][B, lag·CC + KVD/2], each
  // sequence's lag pre-convolution rows and one delayed value half: tails_ what this rank's
  // runs end with, heads_ what its runs' predecessors end with (and backward's gradients of
  // them, the other way).
  std::vector<T> tails_, heads_;
  // Decoding: keys and values [max_len, KVD]; the last P = t0-1 + t1-1 pre-convolution rows and
  // the token's own [P+1, CC]; the previous token's delayed value half [KVD/2]; one token's
  // buffers.
  std::vector<T> k_cache_, v_cache_, window_, prev_vd_;
  std::vector<T> dec_y_, dec_z_, dec_q_, dec_k_, dec_qn_, dec_rq_, dec_rk_, dec_att_;
  int max_len_ = 0;  // decoding: positions the cache holds
  std::vector<T> dec_kv_;  // [2 KVD] a position another rank caches (tree attention)
};

}  // namespace atl
