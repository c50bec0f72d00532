// Prefill latency of one attention layer's forward on the CPU (fp32 products), the training
// forward of the parts in model/: CCA (model/attention_cca.h) against atoll's own grouped-query
// and multi-head attention at equal width. ZAYA1-8B's attention shape: C = 2048, heads of 128;
// MHA has C/128 = 16 query and 16 KV heads, GQA 16 query heads over 2 KV heads, CCA 8 query heads
// over 2 KV heads (ZAYA1's), so GQA and CCA cache the same keys and values per token, 8x below
// MHA. Correctness is the tests' (tests/model/parts_grad_test.cc); here only time.
//   build/bench/attention_prefill_bench --benchmark_filter=Prefill   (bench/cca_prefill.sh)
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/model/attention_cca.h"
#include "atoll/model/attention_gqa.h"

namespace atl {
namespace {

enum Kind { kMha, kGqa, kCca };

ModelConfig shape(Kind kind, int T) {
  ModelConfig m;
  m.vocab_size = 256, m.n_layers = 1, m.n_experts = 1, m.top_k = 1, m.expert_hidden = 8;
  m.dim = 2048, m.head_dim = 128, m.seq_len = T;
  m.n_heads = kind == kCca ? 8 : 16;
  m.n_kv_heads = kind == kMha ? 16 : 2;
  m.attention = kind == kCca ? "cca" : "gqa";
  return m;
}

std::unique_ptr<AttentionPart<float>> make_part(Kind kind, const ModelConfig& m, const ParamLayout& layout,
                                                const PartSizes& sizes, PartScratch& scratch) {
  if (kind == kCca) return std::make_unique<AttentionCca<float>>(m, layout, 0, sizes, scratch);
  return std::make_unique<AttentionGqa<float>>(m, layout, 0, sizes, scratch);
}

void BM_Prefill(benchmark::State& st) {
  const Kind kind = Kind(st.range(0));
  const int T = int(st.range(1));
  const ModelConfig m = shape(kind, T);
  const ParamLayout layout = ParamLayout::build(m);
  std::vector<float> params(layout.total());
  Rng rng(1);
  for (float& p : params) p = float(0.02 * rng.normal());
  const PartSizes sizes{.max_batch = 1, .max_tokens = T, .precision = Precision::kFp32};
  PartScratch scratch;
  const std::unique_ptr<AttentionPart<float>> part = make_part(kind, m, layout, sizes, scratch);
  std::vector<float> work(part->work_elements()), h(size_t(T) * m.dim), out(h.size());
  for (float& x : h) x = float(rng.normal());
  const PartContext<float> c{.B = 1, .d = block_dims(m, 1), .mm = {.params = params.data()}, .grads = nullptr,
                             .work = work.data(), .loss_scale = 0.0, .times = nullptr};
  for (auto _ : st) {
    part->forward(out.data(), h.data(), c);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetLabel(std::string(kind == kMha ? "mha" : kind == kGqa ? "gqa" : "cca") + " T=" + std::to_string(T));
}
BENCHMARK(BM_Prefill)
    ->ArgsProduct({{kMha, kGqa, kCca}, {512, 2048}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A training step of one attention layer (forward, then backward into the gradients) at
// zaya1-small's shape: C = 512, 4 query heads and 1 KV head of 64, T = 512, batch 8, GQA against
// CCA (kernels 2 and 2) with the same heads. The ablation's arms differ by this.
void BM_TrainStep(benchmark::State& st) {
  const Kind kind = Kind(st.range(0));
  ModelConfig m;
  m.vocab_size = 256, m.n_layers = 1, m.n_experts = 1, m.top_k = 1, m.expert_hidden = 8;
  m.dim = 512, m.head_dim = 64, m.seq_len = 512, m.n_heads = 4, m.n_kv_heads = 1;
  m.attention = kind == kCca ? "cca" : "gqa";
  const int B = 8, N = B * m.seq_len;
  const ParamLayout layout = ParamLayout::build(m);
  std::vector<float> params(layout.total()), grads(layout.total());
  Rng rng(1);
  for (float& p : params) p = float(0.02 * rng.normal());
  const PartSizes sizes{.max_batch = B, .max_tokens = N, .precision = Precision::kFp32};
  PartScratch scratch;
  const std::unique_ptr<AttentionPart<float>> part = make_part(kind, m, layout, sizes, scratch);
  std::vector<float> work(part->work_elements()), h(size_t(N) * m.dim), out(h.size()), dout(h.size()), dh(h.size());
  for (float& x : h) x = float(rng.normal());
  for (float& x : dout) x = float(rng.normal());
  const PartContext<float> c{.B = B, .d = block_dims(m, B), .mm = {.params = params.data()}, .grads = grads.data(),
                             .work = work.data(), .loss_scale = 1.0, .times = nullptr};
  for (auto _ : st) {
    part->forward(out.data(), h.data(), c);
    part->backward(dh.data(), dout.data(), h.data(), c);
    benchmark::DoNotOptimize(dh.data());
  }
  st.SetLabel(std::string(kind == kGqa ? "gqa" : "cca") + " train step B=8 T=512 C=512");
}
BENCHMARK(BM_TrainStep)->Arg(kGqa)->Arg(kCca)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace atl

BENCHMARK_MAIN();
