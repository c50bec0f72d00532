#include "atoll/model/device_model.h"

#include <algorithm>
#include <vector>

#include "atoll/backend/cuda/blas.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/cross_entropy.h"
#include "atoll/backend/cuda/embedding.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/rmsnorm.h"
#include "atoll/backend/cuda/router.h"
#include "atoll/core/check.h"
#include "atoll/model/device_model_buffers.h"

namespace atl::gpu {
namespace {

// Logits of the LM head alive at once when the caller does not say (floats: 128 MiB).
constexpr size_t kHeadLogitsFloats = size_t(1) << 25;

int head_rows_for(const ModelConfig& m, int max_tokens, int requested) {
  const int rows = requested > 0 ? requested : int(std::max<size_t>(1, kHeadLogitsFloats / size_t(m.vocab_size)));
  return std::max(1, std::min(rows, max_tokens));
}

size_t arena_bytes(const ModelConfig& m, const ParamLayout& layout, const DevicePartSizes& sizes, int head_rows) {
  DeviceBuffers d{};
  Carver count(nullptr);
  carve(d, m, layout, sizes, head_rows, count);
  return count.bytes();
}

// Ids come from the data loader; kernels cannot throw, so they are checked here, on the host,
// before the upload (N ints: cheaper than a device check with its synchronisation).
void check_ids_host(const int32_t* ids, int n, int V, const char* what) {
  for (int i = 0; i < n; ++i)
    ATOLL_CHECK(ids[i] >= 0 && ids[i] < V) << what << " id " << ids[i] << " at position " << i << " outside [0, " << V
                                           << ")";
}

}  // namespace

struct DeviceModel::Impl {
  // cp: the context-parallel group (null: whole sequences), which fixes the tokens held.
  Impl(const ModelConfig& m, int max_batch_, const DeviceModelOptions& opts, Collective* cp_)
      : cfg(m),
        layout(ParamLayout::build(m)),
        max_batch(max_batch_),
        cp(cp_),
        zigzag(context_layout(m.seq_len, cp_ ? cp_->size() : 1)),
        seq_tokens(cp_ ? zigzag.local_len(cp_->rank()) : m.seq_len),
        sizes{.max_batch = max_batch_, .max_tokens = std::max(1, max_batch_ * seq_tokens),
              .bf16 = opts.precision == Precision::kBf16, .zigzag = cp_ ? &zigzag : nullptr},
        head_rows(head_rows_for(m, sizes.max_tokens, opts.head_rows)),
        options(opts),
        precision(opts.precision),
        dt(opts.precision == Precision::kBf16 ? Dtype::kBF16 : Dtype::kF32),
        arena(arena_bytes(m, layout, sizes, head_rows)),
        host_ce(size_t(sizes.max_tokens)),
        host_losses(2 * size_t(m.n_layers)) {
    Carver take(&arena);
    carve(d, m, layout, sizes, head_rows, take);
    ATOLL_CUDA_CHECK(cudaMemset(d.params, 0, sizeof(float) * layout.total()));  // padding between tensors too
    ATOLL_CUDA_CHECK(cudaMemset(d.grads, 0, sizeof(float) * layout.total()));
    zero_choice_counts();
  }
  void zero_choice_counts() {
    ATOLL_CUDA_CHECK(cudaMemset(d.choice_counts, 0, sizeof(double) * cfg.n_layers * cfg.n_experts));
  }

  LossParts run(const int32_t* inputs, const int32_t* targets, int B, bool backward, double loss_scale);
  void head_and_loss(const DeviceContext& c, bool backward);
  // What one call of the parts sees, for B sequences.
  DeviceContext context(int B, double loss_scale) {
    const DeviceProducts mm{.blas = &blas, .dt = dt, .params = d.params, .w16 = d.w16, .in16 = d.in16,
                            .dout16 = d.dout16};
    BlockDims dims = block_dims(cfg, B);
    dims.T = seq_tokens, dims.N = B * seq_tokens;
    return {.B = B, .d = dims, .mm = mm, .grads = d.grads, .loss_scale = loss_scale, .ids = d.ids_scratch,
            .pos = cp ? zigzag.positions(cp->rank()) : TokenPositions{}, .cp = cp, .zigzag = cp ? &zigzag : nullptr};
  }

  ModelConfig cfg;
  ParamLayout layout;
  int max_batch;
  Collective* cp;       // context parallelism's group, or null
  ZigzagLayout zigzag;  // its split of each sequence (P = 1 without a group)
  int seq_tokens;       // tokens of each sequence held: seq_len, or this rank's T_r
  DevicePartSizes sizes;  // what the parts carve for (points at zigzag: Impl never moves)
  int head_rows;
  DeviceModelOptions options;  // as given (set_sequence builds again with them)
  Precision precision;
  Dtype dt;  // of the products' inputs
  DeviceArena arena;
  DeviceBuffers d{};  // the blocks point into it: never moved
  Blas blas;  // on the default stream, like every kernel here
  std::vector<float> host_ce;       // [N] per-position losses, read back once per step
  std::vector<double> host_losses;  // [L,2]
};

// The model: embedding, the blocks, the final norm, head and loss; backward is the same list
// reversed. Each block's parts are model/device_block.cu's.
LossParts DeviceModel::Impl::run(const int32_t* inputs, const int32_t* targets, int B, bool backward,
                                 double loss_scale) {
  ATOLL_CHECK(B >= 1 && B <= max_batch) << "batch of " << B << " sequences, model sized for " << max_batch;
  const int N = B * seq_tokens, C = cfg.dim, V = cfg.vocab_size, L = cfg.n_layers;
  check_ids_host(inputs, N, V, "input token");
  check_ids_host(targets, N, V, "target token");
  copy_to_device(d.tokens, inputs, sizeof(int32_t) * N);
  copy_to_device(d.targets, targets, sizeof(int32_t) * N);
  // The parameters may have changed since the last call (optimizer, upload, outer sync).
  if (dt == Dtype::kBF16) f32_to_bf16(d.w16, d.params, layout.total());
  const DeviceContext c = context(B, loss_scale);
  const size_t embed = layout.at("embed").offset;
  embedding_forward(d.x[0], d.tokens, d.params + embed, N, C, V);
  d.input_merge->forward(d.x[0], d.x[0], nullptr, c);
  for (int l = 0; l < L; ++l) {
    d.blocks[l]->forward(d.x[l + 1], d.x[l], d.losses + 2 * l, c);
    if (backward)  // as Model::count_choices (the kernel counts no skipped slot: kNoExpert is no expert)
      router_choice_counts(d.choice_counts + size_t(l) * cfg.n_experts, d.blocks[l]->router_choice(), N,
                           cfg.n_experts, cfg.top_k);
  }
  head_and_loss(c, backward);
  if (backward) {
    for (int l = L - 1; l >= 0; --l) d.blocks[l]->backward(d.x[l], c);
    const float* dembed = d.input_merge->backward(d.blk.tmp, d.blk.dx, nullptr, c);
    // Sorted scatter: repeated tokens add in position order, as the CPU (bit-identical).
    embedding_backward(d.grads + embed, dembed, d.tokens, N, C, V, Scatter::kSorted, d.ids_scratch);
  }
  // One read-back per step: these copies wait for everything queued above.
  copy_to_host(host_ce.data(), d.ce_loss, sizeof(float) * N);
  copy_to_host(host_losses.data(), d.losses, sizeof(double) * 2 * L);
  LossParts loss;
  double ce_sum = 0.0;
  for (int i = 0; i < N; ++i) ce_sum += host_ce[i];
  loss.ce = ce_sum / (double(B) * cfg.seq_len);  // under context parallelism, this rank's share
  for (int l = 0; l < L; ++l) loss.aux += host_losses[2 * l], loss.z += host_losses[2 * l + 1];
  return loss;
}

// Final norm, LM head and cross-entropy, in chunks of head_rows rows so the [N,V] logits never
// exist whole: each chunk's logits become their gradient in place, which feeds the head's
// weight gradient and the chunk's d(final norm output) before the next chunk reuses the buffer.
// Backward leaves d(last block's output) in blk.dx.
void DeviceModel::Impl::head_and_loss(const DeviceContext& c, bool backward) {
  const int N = c.d.N, C = cfg.dim, V = cfg.vocab_size, L = cfg.n_layers;
  const DeviceProducts& mm = c.mm;
  const size_t head = layout.at(cfg.tie_embeddings ? "embed" : "head").offset;
  const size_t final_norm = layout.at("final_norm").offset;
  const void* w_head = mm.weight(head);
  float *hf = d.blk.tmp, *dh = d.blk.dh, *dx = d.blk.dx;  // final norm output, its gradient [N,C]; d(x[L])
  rmsnorm_forward(hf, d.rstdf, d.x[L], d.params + final_norm, N, C, cfg.norm_eps);
  const void* hin = mm.input(d.in16, hf, size_t(N) * C);  // the head's input rows, all N
  const size_t row_bytes = (dt == Dtype::kBF16 ? sizeof(uint16_t) : sizeof(float)) * C;
  if (backward) ATOLL_CUDA_CHECK(cudaMemset(dh, 0, sizeof(float) * N * C));
  for (int r0 = 0; r0 < N; r0 += head_rows) {
    const int n = std::min(head_rows, N - r0);
    const void* h = static_cast<const char*>(hin) + size_t(r0) * row_bytes;
    linear_forward(blas, d.logits, h, w_head, n, C, V, dt);
    cross_entropy_forward(d.ce_loss + r0, d.ce_lse, d.logits, d.targets + r0, n, V);
    if (!backward) continue;
    // Divided by the whole sequences' tokens: under context parallelism the ranks' shares add up.
    cross_entropy_backward(d.logits, d.logits, d.ce_lse, d.targets + r0, n, V,
                           float(c.loss_scale / (double(c.B) * cfg.seq_len)));
    const void* dlogits = mm.input(d.logits16, d.logits, size_t(n) * V);
    linear_backward(blas, dh + size_t(r0) * C, d.grads + head, dlogits, h, w_head, n, C, V, dt);
  }
  if (!backward) return;
  ATOLL_CUDA_CHECK(cudaMemset(dx, 0, sizeof(float) * N * C));
  rmsnorm_backward(dx, d.grads + final_norm, dh, d.x[L], d.rstdf, d.params + final_norm, N, C);
}

DeviceModel::DeviceModel(const ModelConfig& cfg, int max_batch, const DeviceModelOptions& opts) {
  ATOLL_CHECK_GE(max_batch, 1);
  impl_ = std::make_unique<Impl>(cfg, max_batch, opts, nullptr);
}

DeviceModel::~DeviceModel() = default;

const ModelConfig& DeviceModel::config() const { return impl_->cfg; }
const ParamLayout& DeviceModel::layout() const { return impl_->layout; }
int DeviceModel::max_batch() const { return impl_->max_batch; }
Precision DeviceModel::precision() const { return impl_->precision; }
size_t DeviceModel::device_bytes() const { return impl_->arena.capacity(); }
float* DeviceModel::params() { return impl_->d.params; }
float* DeviceModel::grads() { return impl_->d.grads; }

void DeviceModel::upload_params(const float* host) {
  copy_to_device(impl_->d.params, host, sizeof(float) * impl_->layout.total());
}

void DeviceModel::download_params(float* host) const {
  copy_to_host(host, impl_->d.params, sizeof(float) * impl_->layout.total());
}

void DeviceModel::download_grads(float* host) const {
  copy_to_host(host, impl_->d.grads, sizeof(float) * impl_->layout.total());
}

void DeviceModel::upload_grads(const float* host) {
  copy_to_device(impl_->d.grads, host, sizeof(float) * impl_->layout.total());
}

void DeviceModel::zero_grads() {
  ATOLL_CUDA_CHECK(cudaMemset(impl_->d.grads, 0, sizeof(float) * impl_->layout.total()));
  impl_->zero_choice_counts();
}

std::vector<double> DeviceModel::topk_choice_counts() const {
  std::vector<double> counts(size_t(impl_->cfg.n_layers) * impl_->cfg.n_experts);
  copy_to_host(counts.data(), impl_->d.choice_counts, sizeof(double) * counts.size());
  return counts;
}

LossParts DeviceModel::forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) {
  return impl_->run(inputs, targets, B, true, loss_scale);
}

LossParts DeviceModel::forward(const int32_t* inputs, const int32_t* targets, int B, float* position_losses) {
  const LossParts loss = impl_->run(inputs, targets, B, false, 0.0);
  if (position_losses)  // run() read them back already
    std::copy(impl_->host_ce.begin(), impl_->host_ce.begin() + size_t(B) * impl_->seq_tokens, position_losses);
  return loss;
}

void DeviceModel::set_sequence(int seq_len, double rope_theta, int max_batch) {
  ATOLL_CHECK(seq_len >= 1 && max_batch >= 1) << seq_len << " " << max_batch;
  ModelConfig now = impl_->cfg;
  now.seq_len = seq_len, now.rope_theta = rope_theta;
  ATOLL_CHECK_EQ(ParamLayout::build(now).total(), impl_->layout.total()) << "the parameters do not depend on the length";
  rebuild(now, max_batch, impl_->cp);
}

void DeviceModel::set_context_parallel(Collective* group) {
  if (group == impl_->cp) return;
  ATOLL_CHECK(!group || impl_->precision == Precision::kFp32) << "context parallelism runs fp32 products";
  rebuild(impl_->cfg, impl_->max_batch, group);
}

int DeviceModel::local_seq_len() const { return impl_->seq_tokens; }

// The state that outlives the arena (parameters, gradients, choice counts) waits in host memory
// while the old arena is freed and the new one taken; if the new one cannot be made, the old
// one is made again with the state and the error goes on.
void DeviceModel::rebuild(const ModelConfig& m, int max_batch, Collective* cp) {
  const ModelConfig was = impl_->cfg;
  const int was_batch = impl_->max_batch;
  Collective* was_cp = impl_->cp;
  const DeviceModelOptions opts = impl_->options;
  std::vector<float> params(impl_->layout.total()), grads(params.size());
  download_params(params.data());
  download_grads(grads.data());
  std::vector<double> counts = topk_choice_counts();
  auto build = [&](const ModelConfig& cfg, int batch, Collective* group) {
    impl_.reset();  // the old arena goes first
    impl_ = std::make_unique<Impl>(cfg, batch, opts, group);
    upload_params(params.data());
    upload_grads(grads.data());
    copy_to_device(impl_->d.choice_counts, counts.data(), sizeof(double) * counts.size());
  };
  try {
    build(m, max_batch, cp);
  } catch (const Error&) {
    build(was, was_batch, was_cp);  // the state as it was; the old arena fitted before
    throw;
  }
}

}  // namespace atl::gpu
