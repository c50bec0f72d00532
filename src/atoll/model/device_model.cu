#include "atoll/model/device_model.h"

#include <algorithm>
#include <vector>

#include "atoll/backend/cuda/attention.h"
#include "atoll/backend/cuda/blas.h"
#include "atoll/backend/cuda/check.h"
#include "atoll/backend/cuda/cross_entropy.h"
#include "atoll/backend/cuda/elementwise.h"
#include "atoll/backend/cuda/linear.h"
#include "atoll/backend/cuda/rmsnorm.h"
#include "atoll/core/check.h"
#include "atoll/layers/rope.h"
#include "atoll/model/device_model_buffers.h"

namespace atl::gpu {
namespace {

// Logits of the LM head alive at once when the caller does not say (floats: 128 MiB).
constexpr size_t kHeadLogitsFloats = size_t(1) << 25;

int head_rows_for(const ModelConfig& m, int max_batch, int requested) {
  const int N = max_batch * m.seq_len;
  const int rows = requested > 0 ? requested : int(std::max<size_t>(1, kHeadLogitsFloats / size_t(m.vocab_size)));
  return std::min(rows, N);
}

size_t arena_bytes(const ModelConfig& m, size_t total, int max_batch, int head_rows, bool bf16) {
  DeviceBuffers d;
  Carver count(nullptr);
  carve(d, m, total, max_batch, head_rows, bf16, count);
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
  Impl(const ModelConfig& m, int max_batch_, const DeviceModelOptions& opts)
      : cfg(m),
        layout(ParamLayout::build(m)),
        max_batch(max_batch_),
        head_rows(head_rows_for(m, max_batch_, opts.head_rows)),
        precision(opts.precision),
        dt(opts.precision == Precision::kBf16 ? Dtype::kBF16 : Dtype::kF32),
        offsets(layer_offsets(m, layout)),
        arena(arena_bytes(m, layout.total(), max_batch_, head_rows, dt == Dtype::kBF16)),
        host_offsets(m.n_layers, std::vector<int32_t>(m.n_experts + 1)),
        host_ce(size_t(max_batch_) * m.seq_len),
        host_losses(2 * size_t(m.n_layers)) {
    Carver take(&arena);
    carve(d, m, layout.total(), max_batch, head_rows, dt == Dtype::kBF16, take);
    const RopeTable<float> rope = RopeTable<float>::build(m.seq_len, m.head_dim, m.rope_theta);
    ATOLL_CHECK_EQ(rope.cos.size(), size_t(m.seq_len) * (m.head_dim / 2));
    copy_to_device(d.rope_cos, rope.cos.data(), sizeof(float) * rope.cos.size());
    copy_to_device(d.rope_sin, rope.sin.data(), sizeof(float) * rope.sin.size());
    table = {d.rope_cos, d.rope_sin, m.seq_len, m.head_dim};
    ATOLL_CUDA_CHECK(cudaMemset(d.params, 0, sizeof(float) * layout.total()));  // padding between tensors too
    ATOLL_CUDA_CHECK(cudaMemset(d.grads, 0, sizeof(float) * layout.total()));
  }

  LossParts run(const int32_t* inputs, const int32_t* targets, int B, bool backward, double loss_scale);
  void forward_block(int l, int B);
  void backward_block(int l, int B, double loss_scale);
  void head_and_loss(int B, bool backward, double loss_scale);

  // A product's weight at flat offset `off`: the fp32 parameter, or its bf16 copy.
  const void* weight(size_t off) const {
    return dt == Dtype::kBF16 ? static_cast<const void*>(d.w16 + off) : static_cast<const void*>(d.params + off);
  }
  // A product's input x[n]: x itself in fp32, else its bf16 rounding into `x16` (in16 or dout16).
  const void* product_input(uint16_t* x16, const float* x, size_t n) const {
    if (dt == Dtype::kF32) return x;
    f32_to_bf16(x16, x, n);
    return x16;
  }

  ModelConfig cfg;
  ParamLayout layout;
  int max_batch, head_rows;
  Precision precision;
  Dtype dt;  // of the products' inputs
  std::vector<DeviceLayerOffsets> offsets;
  DeviceArena arena;
  DeviceBuffers d{};
  DeviceRopeTable table;
  Blas blas;  // on the default stream, like every kernel here
  std::vector<std::vector<int32_t>> host_offsets;  // [L][E+1] each layer's routing offsets
  std::vector<float> host_ce;                       // [N] per-position losses, read back once per step
  std::vector<double> host_losses;                  // [L,2]
};

LossParts DeviceModel::Impl::run(const int32_t* inputs, const int32_t* targets, int B, bool backward,
                                 double loss_scale) {
  ATOLL_CHECK(B >= 1 && B <= max_batch) << "batch of " << B << " sequences, model sized for " << max_batch;
  const int N = B * cfg.seq_len, C = cfg.dim, V = cfg.vocab_size, L = cfg.n_layers;
  check_ids_host(inputs, N, V, "input token");
  check_ids_host(targets, N, V, "target token");
  copy_to_device(d.tokens, inputs, sizeof(int32_t) * N);
  copy_to_device(d.targets, targets, sizeof(int32_t) * N);
  // The parameters may have changed since the last call (optimizer, upload, outer sync).
  if (dt == Dtype::kBF16) f32_to_bf16(d.w16, d.params, layout.total());
  const size_t embed = layout.at("embed").offset;
  embedding_forward(d.x[0], d.tokens, d.params + embed, N, C, V);
  for (int l = 0; l < L; ++l) forward_block(l, B);
  head_and_loss(B, backward, loss_scale);
  if (backward) {
    for (int l = L - 1; l >= 0; --l) backward_block(l, B, loss_scale);
    // Sorted scatter: repeated tokens add in position order, as the CPU (bit-identical).
    embedding_backward(d.grads + embed, d.dx, d.tokens, N, C, V, Scatter::kSorted, d.ids_scratch);
  }
  // One read-back per step: these copies wait for everything queued above.
  copy_to_host(host_ce.data(), d.ce_loss, sizeof(float) * N);
  copy_to_host(host_losses.data(), d.losses, sizeof(double) * 2 * L);
  LossParts loss;
  double ce_sum = 0.0;
  for (int i = 0; i < N; ++i) ce_sum += host_ce[i];
  loss.ce = ce_sum / N;
  for (int l = 0; l < L; ++l) loss.aux += host_losses[2 * l], loss.z += host_losses[2 * l + 1];
  return loss;
}

void DeviceModel::Impl::forward_block(int l, int B) {
  DeviceBuffers::Layer& S = d.layers[l];
  const DeviceLayerOffsets& o = offsets[l];
  const ModelConfig& m = cfg;
  const auto [T_, N, C, E, K, H, QD, KVD] = block_dims(m, B);
  const float* p = d.params;
  const float* x = d.x[l];
  // xmid = x + wo(attention(rope(h1 wq), rope(h1 wk), h1 wv)), h1 = rmsnorm(x)
  rmsnorm_forward(d.hn, S.rstd1, x, p + o.attn_norm, N, C, m.norm_eps);
  const void* h1 = product_input(d.in16, d.hn, size_t(N) * C);
  linear_forward(blas, S.q, h1, weight(o.wq), N, C, QD, dt);
  linear_forward(blas, S.k, h1, weight(o.wk), N, C, KVD, dt);
  linear_forward(blas, S.v, h1, weight(o.wv), N, C, KVD, dt);
  rope_forward(S.q, table, B, T_, m.n_heads, m.head_dim);
  rope_forward(S.k, table, B, T_, m.n_kv_heads, m.head_dim);
  attention_forward(S.att, S.lse, S.q, S.k, S.v, B, T_, m.n_heads, m.n_kv_heads, m.head_dim);
  linear_forward(blas, d.tmp, product_input(d.in16, S.att, size_t(N) * QD), weight(o.wo), N, QD, C, dt);
  add(S.xmid, x, d.tmp, size_t(N) * C);
  // x_next = xmid + combine(experts(dispatch(h2))), h2 = rmsnorm(xmid)
  rmsnorm_forward(d.hn, S.rstd2, S.xmid, p + o.moe_norm, N, C, m.norm_eps);
  linear_forward(blas, d.rlogits, d.hn, p + o.router, N, C, E);  // fp32 in both modes, as the CPU
  router_forward(S.probs, S.rlse, S.topk_idx, S.topk_w, d.rlogits, N, E, K);
  router_losses(d.losses + 2 * l, S.probs, S.rlse, S.topk_idx, N, E, K, m.aux_loss_coef, m.z_loss_coef,
                d.loss_scratch);
  build_routing(S.routing, S.topk_idx, N, E, K, d.ids_scratch);
  // The experts' products need each expert's row count on the host: one copy of offsets [E+1]
  // per layer, which waits for the layer so far (the one synchronisation inside a forward).
  // Backward reuses this copy.
  std::vector<int32_t>& off = host_offsets[l];
  copy_to_host(off.data(), S.routing.offsets, sizeof(int32_t) * (E + 1));
  ATOLL_CHECK(off[0] == 0 && off[E] == N * K) << "routing offsets of layer " << l;
  expert_mlp_forward(blas, d.tmp, S.a, S.b, d.experts, d.hn, S.routing, off.data(), S.topk_w, weight(o.w1),
                     weight(o.w3), weight(o.w2), N, E, C, H, K, dt);
  add(d.x[l + 1], S.xmid, d.tmp, size_t(N) * C);
}

// Final norm, LM head and cross-entropy, in chunks of head_rows rows so the [N,V] logits never
// exist whole: each chunk's logits become their gradient in place, which feeds the head's
// weight gradient and the chunk's d(final norm output) before the next chunk reuses the buffer.
void DeviceModel::Impl::head_and_loss(int B, bool backward, double loss_scale) {
  const int N = B * cfg.seq_len, C = cfg.dim, V = cfg.vocab_size, L = cfg.n_layers;
  const size_t head = layout.at(cfg.tie_embeddings ? "embed" : "head").offset;
  const size_t final_norm = layout.at("final_norm").offset;
  const void* w_head = weight(head);
  float* hf = d.tmp;  // final norm output [N,C]
  rmsnorm_forward(hf, d.rstdf, d.x[L], d.params + final_norm, N, C, cfg.norm_eps);
  const void* hin = product_input(d.in16, hf, size_t(N) * C);  // the head's input rows, all N
  const size_t row_bytes = (dt == Dtype::kBF16 ? sizeof(uint16_t) : sizeof(float)) * C;
  if (backward) ATOLL_CUDA_CHECK(cudaMemset(d.dh, 0, sizeof(float) * N * C));
  for (int r0 = 0; r0 < N; r0 += head_rows) {
    const int n = std::min(head_rows, N - r0);
    const void* h = static_cast<const char*>(hin) + size_t(r0) * row_bytes;
    linear_forward(blas, d.logits, h, w_head, n, C, V, dt);
    cross_entropy_forward(d.ce_loss + r0, d.ce_lse, d.logits, d.targets + r0, n, V);
    if (!backward) continue;
    cross_entropy_backward(d.logits, d.logits, d.ce_lse, d.targets + r0, n, V, float(loss_scale / N));
    const void* dlogits = product_input(d.logits16, d.logits, size_t(n) * V);
    linear_backward(blas, d.dh + size_t(r0) * C, d.grads + head, dlogits, h, w_head, n, C, V, dt);
  }
  if (!backward) return;
  ATOLL_CUDA_CHECK(cudaMemset(d.dx, 0, sizeof(float) * N * C));
  rmsnorm_backward(d.dx, d.grads + final_norm, d.dh, d.x[L], d.rstdf, d.params + final_norm, N, C);
}

// The forward of one block in reverse. On entry d.dx holds d(block output); on exit d(block input).
void DeviceModel::Impl::backward_block(int l, int B, double loss_scale) {
  DeviceBuffers::Layer& S = d.layers[l];
  const DeviceLayerOffsets& o = offsets[l];
  const ModelConfig& m = cfg;
  const auto [T_, N, C, E, K, H, QD, KVD] = block_dims(m, B);
  const float* p = d.params;
  float* g = d.grads;
  const size_t NC = size_t(N) * C;
  // x_next = xmid + combine(experts(dispatch(h2))); h2 = rmsnorm(xmid) is recomputed.
  rmsnorm_forward(d.hn, S.rstd2, S.xmid, p + o.moe_norm, N, C, m.norm_eps);
  ATOLL_CUDA_CHECK(cudaMemset(d.dh, 0, sizeof(float) * NC));
  expert_mlp_backward(blas, d.dh, g + o.w1, g + o.w3, g + o.w2, d.dtopk_w, d.experts, d.dx, d.hn, S.routing,
                      host_offsets[l].data(), S.topk_w, S.a, S.b, weight(o.w1), weight(o.w3), weight(o.w2), N, E, C,
                      H, K, dt);
  router_backward(d.drlogits, d.dtopk_w, S.probs, S.rlse, S.topk_idx, S.topk_w, N, E, K, m.aux_loss_coef,
                  m.z_loss_coef, loss_scale, d.router_counts);
  linear_backward(blas, d.dh, g + o.router, d.drlogits, d.hn, p + o.router, N, C, E);
  rmsnorm_backward(d.dx, g + o.moe_norm, d.dh, S.xmid, S.rstd2, p + o.moe_norm, N, C);
  // xmid = x + wo(attention(rope(h1 wq), rope(h1 wk), h1 wv)), h1 = rmsnorm(x)
  ATOLL_CUDA_CHECK(cudaMemset(d.datt, 0, sizeof(float) * N * QD));
  linear_backward(blas, d.datt, g + o.wo, product_input(d.dout16, d.dx, NC),
                  product_input(d.in16, S.att, size_t(N) * QD), weight(o.wo), N, QD, C, dt);
  attention_backward(d.dq, d.dk, d.dv, d.datt, S.att, S.lse, S.q, S.k, S.v, B, T_, m.n_heads, m.n_kv_heads,
                     m.head_dim, d.attn_scratch);
  rope_backward(d.dq, table, B, T_, m.n_heads, m.head_dim);
  rope_backward(d.dk, table, B, T_, m.n_kv_heads, m.head_dim);
  ATOLL_CUDA_CHECK(cudaMemset(d.dh, 0, sizeof(float) * NC));
  rmsnorm_forward(d.hn, S.rstd1, d.x[l], p + o.attn_norm, N, C, m.norm_eps);  // h1, recomputed
  const void* h1 = product_input(d.in16, d.hn, NC);
  // dout16 holds one projection's d(output) at a time: each product is queued before the next
  // rounding overwrites it (one stream).
  linear_backward(blas, d.dh, g + o.wq, product_input(d.dout16, d.dq, size_t(N) * QD), h1, weight(o.wq), N, C, QD, dt);
  linear_backward(blas, d.dh, g + o.wk, product_input(d.dout16, d.dk, size_t(N) * KVD), h1, weight(o.wk), N, C, KVD,
                  dt);
  linear_backward(blas, d.dh, g + o.wv, product_input(d.dout16, d.dv, size_t(N) * KVD), h1, weight(o.wv), N, C, KVD,
                  dt);
  rmsnorm_backward(d.dx, g + o.attn_norm, d.dh, d.x[l], S.rstd1, p + o.attn_norm, N, C);
}

DeviceModel::DeviceModel(const ModelConfig& cfg, int max_batch, const DeviceModelOptions& opts) {
  ATOLL_CHECK_GE(max_batch, 1);
  impl_ = std::make_unique<Impl>(cfg, max_batch, opts);
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
}

LossParts DeviceModel::forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale) {
  return impl_->run(inputs, targets, B, true, loss_scale);
}

LossParts DeviceModel::forward(const int32_t* inputs, const int32_t* targets, int B) {
  return impl_->run(inputs, targets, B, false, 0.0);
}

}  // namespace atl::gpu
