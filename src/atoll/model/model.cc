#include "atoll/model/model.h"

#include <algorithm>
#include <cstring>

#include "atoll/core/check.h"
#include "atoll/core/rng.h"
#include "atoll/core/timer.h"
#include "atoll/layers/cross_entropy.h"
#include "atoll/layers/embedding.h"
#include "atoll/model/block.h"
#include "atoll/model/part_kinds.h"
#include "atoll/model/ring_attention.h"

namespace atl {

// Everything a step writes besides parameters and gradients, sized once for max_batch.
template <typename T>
struct Model<T>::State {
  static constexpr int kHeadChunk = 256;  // rows of logits alive at once

  // seq_tokens: the tokens of each sequence the model holds (model.seq_len, or a context-parallel
  // rank's share: its activations are sized for that, so they fall about as 1/P).
  State(const ModelConfig& m, const ParamLayout& layout, int max_batch, Precision p, int seq_tokens)
      : sizes{max_batch, max_batch * seq_tokens, p}, buf(m, sizes.max_tokens),
        input_merge(m, layout, "input", false, sizes), final_norm(m, layout, "final_norm", sizes) {
    const size_t N = sizes.max_tokens, C = m.dim;
    x.assign(m.n_layers + 1, std::vector<T>(N * C));
    blocks.reserve(m.n_layers);
    size_t work_elements = size_t(kHeadChunk) * m.vocab_size, block_params = 0;  // the head's logits
    for (int l = 0; l < m.n_layers; ++l) {
      const Block<T>& b = blocks.emplace_back(m, layout, l, sizes, scratch, buf);
      work_elements = std::max(work_elements, b.work_elements());
      block_params = std::max(block_params, b.end_param() - b.first_param());
    }
    link_blocks(blocks);
    tokens.resize(N), logits_lse.resize(kHeadChunk);
    work.resize(work_elements);
    head_offset = layout.at(m.tie_embeddings ? "embed" : "head").offset;
    if (p == Precision::kBf16) {
      w16.resize(block_params), head16.resize(size_t(m.vocab_size) * C);
      in16.resize(N * C), logits16.resize(size_t(kHeadChunk) * m.vocab_size);
    }
  }

  PartSizes sizes;
  PartScratch scratch;             // each part kind's scratch, shared by its layers
  BlockBuffers<T> buf;             // what the blocks pass between their parts
  std::vector<Block<T>> blocks;    // [L]
  ResidualMerge<T> input_merge;    // after the embedding (residual scaling; else nothing)
  RmsNormPart<T> final_norm;
  std::vector<std::vector<T>> x;   // [L+1][N,C] residual stream entering each block (x[L]: final norm input)
  std::vector<int32_t> tokens;     // [N] inputs, for the embedding backward
  std::vector<T> work;            // shared scratch of the parts and the head's logits chunk
  std::vector<T> logits_lse;       // [kHeadChunk]
  size_t head_offset = 0;
  // bf16 products: one block's weights at a time (w16 holds block w16_block, -1 when stale),
  // converted on entry to its forward and again to its backward unless still held, and the
  // LM head's for the whole step; the head's input [N,C] and d(logits) of one chunk in bf16.
  std::vector<bf16> w16, head16, in16, logits16;
  int w16_block = -1;
};

template <typename T>
Model<T>::Model(const ModelConfig& cfg, int max_batch, Precision precision)
    : cfg_(cfg), layout_(ParamLayout::build(cfg)), max_batch_(max_batch), precision_(precision) {
  ATOLL_CHECK_GE(max_batch, 1);
  ATOLL_CHECK(kHasBf16<T> || precision == Precision::kFp32) << "bf16 products need Model<float>";
  params_.assign(layout_.total(), T(0));
  grads_.assign(layout_.total(), T(0));
  choice_counts_.assign(size_t(cfg_.n_layers) * cfg_.n_experts, 0.0);
  // The activations come at the first pass (run), when the tokens held are known: a
  // context-parallel rank never allocates (nor touches) the whole sequences' buffers.
}

template <typename T>
Model<T>::~Model() = default;

template <typename T>
void Model<T>::init_params(uint64_t seed) {
  Rng rng(seed);
  std::fill(params_.begin(), params_.end(), T(0));
  for (const ParamEntry& e : layout_.entries()) {
    T* p = params_.data() + e.offset;
    switch (e.init) {  // only kNormal draws, so other rows leave the random stream as it was
      case ParamInit::kNormal:
        for (size_t i = 0; i < e.numel; ++i) p[i] = T(rng.normal() * cfg_.init_std);
        break;
      case ParamInit::kOnes: std::fill(p, p + e.numel, T(1)); break;
      case ParamInit::kZeros: std::fill(p, p + e.numel, T(0)); break;
      case ParamInit::kBalancingBiases:  // zeros but the skip class's (the last)
        std::fill(p, p + e.numel, T(0));
        p[e.numel - 1] = T(cfg_.router_skip_bias);
        break;
    }
  }
}

template <typename T>
void Model<T>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
  std::fill(choice_counts_.begin(), choice_counts_.end(), 0.0);
}

template <typename T>
LossParts Model<T>::forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) {
  return run(inputs, targets, B, true, loss_scale);
}

template <typename T>
LossParts Model<T>::forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses) {
  return run(inputs, targets, B, false, 0.0, position_losses);
}

template <typename T>
void Model<T>::set_sequence(int seq_len, double rope_theta, int max_batch) {
  ATOLL_CHECK(seq_len >= 1 && max_batch >= 1) << seq_len << " " << max_batch;
  cfg_.seq_len = seq_len, cfg_.rope_theta = rope_theta, max_batch_ = max_batch;
  ATOLL_CHECK_EQ(ParamLayout::build(cfg_).total(), layout_.total()) << "the parameters do not depend on the length";
  s_.reset();  // the old buffers go before the new ones are allocated: the peak is the larger, not both
  set_context_parallel(cp_);  // the buffers (and zigzag rows) of the new length
}

template <typename T>
void Model<T>::set_context_parallel(Collective* group) {
  cp_ = group;
  zigzag_.reset();
  if (group) {
    ATOLL_CHECK(precision_ == Precision::kFp32) << "context parallelism runs fp32 products";
    zigzag_ = std::make_unique<ZigzagLayout>(context_layout(cfg_.seq_len, group->size()));
  }
  // The activations are for the tokens held: freed when that changes, made again by the next pass.
  if (s_ && s_->sizes.max_tokens != max_batch_ * local_seq_len()) s_.reset();
}

template <typename T>
int Model<T>::local_seq_len() const {
  return cp_ ? zigzag_->local_len(cp_->rank()) : cfg_.seq_len;
}

template <typename T>
PartContext<T> Model<T>::context(int B, double loss_scale) {
  BlockDims d = block_dims(cfg_, B);
  d.T = local_seq_len(), d.N = B * d.T;
  return {.B = B,
          .d = d,
          .mm = {.precision = precision_, .params = params_.data()},
          .grads = grads_.data(),
          .work = s_->work.data(),
          .loss_scale = loss_scale,
          .times = &times_,
          .pos = cp_ ? zigzag_->positions(cp_->rank()) : TokenPositions{},
          .cp = cp_,
          .zigzag = zigzag_.get()};
}

// Under bf16 products, points c.mm at block l's weights in bf16, converting them unless held.
template <typename T>
void Model<T>::use_block_weights(PartContext<T>& c, int l) {
  if (!c.mm.is_bf16()) return;
  const Block<T>& b = s_->blocks[l];
  if (s_->w16_block != l) {
    ScopedTimer t(&times_.weights_bf16);
    round_to_bf16(s_->w16.data(), params_.data() + b.first_param(), b.end_param() - b.first_param());
    s_->w16_block = l;
  }
  c.mm.w16 = s_->w16.data(), c.mm.w16_begin = b.first_param();
}

template <typename T>
void Model<T>::count_choices(int l, int N) {
  const size_t E = cfg_.n_experts;
  const int32_t* idx = s_->blocks[l].router_choice();
  double* counts = choice_counts_.data() + size_t(l) * E;
  for (size_t i = 0; i < size_t(N) * cfg_.top_k; ++i)
    if (idx[i] >= 0) counts[idx[i]] += 1;  // a zaya router's skipped slots (kNoExpert) go to no expert
}

template <typename T>
LossParts Model<T>::run(const int32_t* inputs, const int32_t* targets, int B, bool backward, double loss_scale,
                        float* position_losses) {
  ATOLL_CHECK(B >= 1 && B <= max_batch_) << "batch of " << B << " sequences, model sized for " << max_batch_;
  if (!s_) s_ = std::make_unique<State>(cfg_, layout_, max_batch_, precision_, local_seq_len());
  State& S = *s_;
  const int N = B * local_seq_len(), C = cfg_.dim;
  std::memcpy(S.tokens.data(), inputs, sizeof(int32_t) * N);
  PartContext<T> c = context(B, loss_scale);
  if (c.mm.is_bf16()) {  // the parameters may have changed since the last call (optimizer, checkpoint, sync)
    ScopedTimer t(&times_.weights_bf16);
    round_to_bf16(S.head16.data(), params_.data() + S.head_offset, S.head16.size());
    S.w16_block = -1;
  }
  {
    ScopedTimer t(&times_.embed);
    embedding_forward(S.x[0].data(), inputs, param("embed"), N, C, cfg_.vocab_size);
    S.input_merge.forward(S.x[0].data(), S.x[0].data(), nullptr, c);
  }
  LossParts loss;
  for (int l = 0; l < cfg_.n_layers; ++l) {
    use_block_weights(c, l);
    const RouterLosses r = S.blocks[l].forward(S.x[l + 1].data(), S.x[l].data(), c);
    loss.aux += r.aux;
    loss.z += r.z;
    if (backward) count_choices(l, N);
  }
  loss.ce = head_and_loss(targets, B, backward, loss_scale, position_losses) / (double(B) * cfg_.seq_len);
  if (!backward) return loss;
  for (int l = cfg_.n_layers - 1; l >= 0; --l) {
    use_block_weights(c, l);
    S.blocks[l].backward(S.x[l].data(), c);
  }
  ScopedTimer t(&times_.embed);
  const T* dembed = S.input_merge.backward(S.buf.tmp.data(), S.buf.dx.data(), nullptr, c);
  embedding_backward(grads_.data() + layout_.at("embed").offset, dembed, S.tokens.data(), N, C);
  return loss;
}

// Final norm, LM head and cross-entropy, in chunks of rows so the [N,V] logits never exist
// whole: each chunk's logits become its gradient in place, which feeds the head's weight
// gradient and the chunk's d(final norm output) before the next chunk reuses the buffer.
template <typename T>
double Model<T>::head_and_loss(const int32_t* targets, int B, bool backward, double loss_scale,
                               float* position_losses) {
  ScopedTimer timer(&times_.head_loss);
  State& S = *s_;
  const int N = B * local_seq_len(), C = cfg_.dim, V = cfg_.vocab_size, L = cfg_.n_layers;
  const double whole = double(B) * cfg_.seq_len;  // the tokens of whole sequences, all ranks' under context parallelism
  const PartContext<T> c = context(B, loss_scale);
  const Operand<T> w_head = {params_.data() + S.head_offset, c.mm.is_bf16() ? S.head16.data() : nullptr};
  T* dw_head = grads_.data() + S.head_offset;
  T* logits = S.work.data();
  T* hf = S.buf.tmp.data();  // final norm output [N,C]
  S.final_norm.forward(hf, S.x[L].data(), c);
  const Operand<T> hin = c.mm.input(S.in16.data(), hf, size_t(N) * C);
  if (backward) std::fill(S.buf.dh.begin(), S.buf.dh.begin() + size_t(N) * C, T(0));
  double ce_sum = 0.0;
  for (int r0 = 0; r0 < N; r0 += State::kHeadChunk) {
    const int n = std::min(State::kHeadChunk, N - r0);
    const Operand<T> h = hin.at(size_t(r0) * C);
    c.mm.forward(logits, h, w_head, n, C, V);
    ce_sum += cross_entropy_forward(S.logits_lse.data(), logits, targets + r0, n, V);
    for (int i = 0; position_losses && i < n; ++i)  // each row's term of the sum: lse - logit of its target
      position_losses[r0 + i] = float(double(S.logits_lse[i]) - double(logits[size_t(i) * V + targets[r0 + i]]));
    if (!backward) continue;
    cross_entropy_backward(logits, logits, S.logits_lse.data(), targets + r0, n, V, T(loss_scale / whole));
    c.mm.backward(S.buf.dh.data() + size_t(r0) * C, dw_head, c.mm.input(S.logits16.data(), logits, size_t(n) * V), h,
                  w_head, n, C, V);
  }
  if (backward) {
    std::fill(S.buf.dx.begin(), S.buf.dx.begin() + size_t(N) * C, T(0));
    S.final_norm.backward(S.buf.dx.data(), S.buf.dh.data(), S.x[L].data(), c);
  }
  return ce_sum;
}

// 6 FLOPs per multiply-add of a parameter or an attention score (2 forward, 4 backward), over
// the multiply-adds each layer's part kinds count (model/part_kinds.h), the K experts a token
// visits, the shared expert and its gate (model.shared_expert_hidden), and the head.
double flops_per_token(const ModelConfig& m) {
  double macs = double(m.vocab_size) * m.dim;
  for (int l = 0; l < m.n_layers; ++l)
    macs += attention_kind_at(m, l).macs_per_token(m) + router_kind_at(m, l).macs_per_token(m) +
            m.top_k * 3.0 * m.dim * m.expert_hidden +
            (m.shared_expert_hidden > 0 ? 3.0 * m.dim * m.shared_expert_hidden + m.dim : 0.0);
  return 6.0 * macs;
}

template class Model<float>;
template class Model<double>;

}  // namespace atl
