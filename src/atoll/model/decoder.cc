#include "atoll/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "atoll/core/check.h"
#include "atoll/layers/embedding.h"
#include "atoll/backend/cpu/linear.h"
#include "atoll/model/attention_core.h"
#include "atoll/model/block.h"
#include "atoll/model/part_kinds.h"

namespace atl {

namespace {
constexpr int kFirstCapacity = 64;  // cache positions before the first doubling

// The rows of a cache for `capacity` positions that this process keeps: all of them, or under
// tree attention its shard's (1/P).
int kept_rows(int capacity, const Collective* group) {
  return group ? CacheShard{group->size(), group->rank()}.rows(capacity) : capacity;
}
}  // namespace

// The blocks' parts built for max_block tokens of one sequence, and a KV cache of `capacity`
// positions in each attention (`rows` of them kept here).
struct Decoder::State {
  State(const ModelConfig& m, const ParamLayout& layout, int capacity, int rows, int max_block)
      : sizes{.max_batch = 1, .max_tokens = max_block, .precision = Precision::kFp32}, buf(m, max_block),
        input_merge(m, layout, "input", false, sizes), final_norm(m, layout, "final_norm", sizes),
        x(size_t(max_block) * m.dim), h(m.dim) {
    size_t work_elements = 0;
    blocks.reserve(m.n_layers);
    for (int l = 0; l < m.n_layers; ++l) {
      Block<float>& b = blocks.emplace_back(m, layout, l, sizes, scratch, buf);
      b.start_decode(capacity, rows);
      work_elements = std::max(work_elements, b.work_elements());
    }
    link_blocks(blocks);
    work.resize(work_elements);
  }
  PartSizes sizes;
  PartScratch scratch;
  BlockBuffers<float> buf;
  std::vector<Block<float>> blocks;
  ResidualMerge<float> input_merge;  // after the embedding (residual scaling)
  RmsNormPart<float> final_norm;
  std::vector<float> x, h, work;  // the tokens' residual stream [max_block,C], the last one's final norm [C]
};

Decoder::Decoder(const ModelConfig& m, const float* params, int max_len, Collective* group, int max_block)
    : m_(m), layout_(ParamLayout::build(m)), p_(params), group_(group), max_len_(max_len),
      max_block_(std::clamp(max_block, 1, std::max(max_len, 1))), capacity_(std::min(max_len, kFirstCapacity)),
      s_(std::make_unique<State>(m_, layout_, capacity_, kept_rows(capacity_, group), max_block_)), logits_(m.vocab_size) {
  ATOLL_CHECK_GT(max_len, 0);
}

Decoder::~Decoder() = default;

void Decoder::reserve(int len) {
  ATOLL_CHECK_LE(len, max_len_) << "decoder cache is full";
  if (len <= capacity_) return;
  while (capacity_ < len) capacity_ = int(std::min<int64_t>(int64_t(capacity_) * 2, max_len_));
  for (Block<float>& b : s_->blocks) b.start_decode(capacity_, kept_rows(capacity_, group_));
}

const std::vector<float>& Decoder::step(int32_t token) { return feed(&token, 1); }

const std::vector<float>& Decoder::prefill(const int32_t* ids, int n) {
  ATOLL_CHECK_GT(n, 0) << "prefill of no tokens";
  reserve(pos_ + n);
  for (int at = 0; at < n; at += max_block_) feed(ids + at, std::min(max_block_, n - at));
  return logits_;
}

const std::vector<float>& Decoder::feed(const int32_t* ids, int n) {
  reserve(pos_ + n);
  const int C = m_.dim;
  BlockDims d = block_dims(m_, 1);
  d.T = n, d.N = n;
  const PartContext<float> c{.B = 1, .d = d, .mm = {.params = p_}, .grads = nullptr, .work = s_->work.data(),
                             .loss_scale = 0.0, .times = nullptr, .cp = group_};
  float* x = s_->x.data();
  embedding_forward(x, ids, p_ + layout_.at("embed").offset, n, C, m_.vocab_size);
  s_->input_merge.forward(x, x, nullptr, c);
  for (Block<float>& b : s_->blocks) {
    if (n == 1)
      b.decode(x, pos_, c);
    else
      b.prefill(x, pos_, c);
  }
  PartContext<float> last = c;
  last.d.T = 1, last.d.N = 1;
  s_->final_norm.forward(s_->h.data(), x + size_t(n - 1) * C, last);
  cpu::linear_forward(logits_.data(), s_->h.data(), p_ + layout_.at(m_.tie_embeddings ? "embed" : "head").offset, 1, C,
                      m_.vocab_size);
  pos_ += n;
  return logits_;
}

KvCacheBytes kv_cache_bytes(const ModelConfig& m) {
  KvCacheBytes k;
  for (int l = 0; l < m.n_layers; ++l) {
    const KvCacheBytes a = attention_kind_at(m, l).decode_cache(m), r = router_kind_at(m, l).decode_cache(m);
    k.per_token += a.per_token + r.per_token, k.per_sequence += a.per_sequence + r.per_sequence;
  }
  return k;
}

double mha_kv_cache_bytes_per_token(const ModelConfig& m) { return double(m.n_layers) * 2 * m.dim * sizeof(float); }

int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opts, Rng& rng) {
  ATOLL_CHECK(std::isfinite(opts.temperature) && opts.temperature >= 0) << "temperature " << opts.temperature;
  ATOLL_CHECK(opts.top_p > 0 && opts.top_p <= 1) << "top_p " << opts.top_p;
  ATOLL_CHECK(opts.vocab >= 0 && size_t(opts.vocab) <= logits.size()) << "vocab " << opts.vocab;
  const int V = opts.vocab > 0 ? opts.vocab : int(logits.size());
  const auto end = logits.begin() + V;
  if (opts.temperature == 0) return int32_t(std::max_element(logits.begin(), end) - logits.begin());
  const float mx = *std::max_element(logits.begin(), end);
  std::vector<double> p(V);
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += (p[v] = std::exp((logits[v] - mx) / opts.temperature));
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  // Keep the most probable tokens until their mass reaches top_p, then draw among them.
  double kept = 0;
  int n = 0;
  while (n < V && (n == 0 || kept < opts.top_p * sum)) kept += p[order[n++]];
  double u = rng.uniform() * kept;
  for (int i = 0; i < n; ++i)
    if ((u -= p[order[i]]) <= 0) return order[i];
  return order[n - 1];
}

}  // namespace atl
