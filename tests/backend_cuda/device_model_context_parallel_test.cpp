// Context parallelism on the GPU (gpu::DeviceModel::set_context_parallel, docs/long_context.md):
// P ranks, each holding its zigzag rows of every sequence, run attention round their ring, CCA's
// boundary exchange between neighbouring chunks, and add their router sums over the group; their
// losses (each position's too) and gradients must add up to those of one device model over whole
// sequences. GQA with the top-k router, CCA, and zaya1-tiny's kinds (CCA, the zaya router,
// residual scaling, tied embeddings). The ranks are threads of this process on one GPU over an
// in-process Collective (core/thread_group.h); tests/dist/context_parallel_test.cc runs the CPU
// model the same way over real processes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "atoll/model/ring_attention.h"
#include "core/thread_group.h"
#include "device_model_check.h"

namespace atl {
namespace {

using test::Batch;
using test::tiny_config;

// tiny_config with CCA: a window of t0-1 + t1-1 = 3 tokens back, and T = 23, whose chunks at
// P = 3 (⌊23c/6⌋: 3, 4, 4, 4, 4, 4 tokens) are the window exactly at the first (the shortest
// legal chunk: a tail is a whole chunk), and not divisible by 2P for P = 2, 3.
ModelConfig cca_config() {
  ModelConfig m = tiny_config(false);
  m.attention = "cca", m.cca_time0 = 2, m.cca_time1 = 3, m.seq_len = 23;
  return m;
}

// zaya1-tiny's kinds (configs/zaya1-tiny.toml: CCA with one key/value head, the zaya router,
// residual scaling, tied embeddings) on device_model_check.h's zaya config (three layers, so the
// depth chain runs 2 -> 1 -> 0; a local RoPE layer), at cca_config's length and window.
ModelConfig zaya1_config() {
  ModelConfig m = test::zaya_config();
  m.attention = "cca", m.cca_time0 = 2, m.cca_time1 = 3, m.seq_len = 23;
  m.n_kv_heads = 1, m.tie_embeddings = true;
  return m;
}

template <typename X>
std::vector<X> rows_of(const std::vector<X>& whole, int B, const ZigzagLayout& z, int r) {
  std::vector<X> local(size_t(B) * z.local_len(r));
  zigzag_take(local.data(), whole.data(), B, 1, z, r);
  return local;
}

// One model's results: the training pass's losses and gradients, the evaluation's losses and
// each position's cross-entropy [B,T] in sequence order. For a group: the ranks' losses and
// gradients added (the gradients in double, then rounded), the positions put back in place.
struct Result {
  LossParts train, eval;
  std::vector<float> grads, positions;
};

Result run_whole(const ModelConfig& m, const std::vector<float>& params, const Batch& b, int B) {
  gpu::DeviceModel dev(m, test::kMaxBatch, {.head_rows = test::kHeadRows});
  dev.upload_params(params.data());
  dev.zero_grads();
  Result out;
  out.train = dev.forward_backward(b.in.data(), b.tg.data(), B, 0.5);
  out.grads.resize(dev.layout().total());
  dev.download_grads(out.grads.data());
  out.positions.resize(size_t(B) * m.seq_len);
  out.eval = dev.forward(b.in.data(), b.tg.data(), B, out.positions.data());
  return out;
}

// B sequences (fewer than the models' kMaxBatch: the buffers are sized for more than a call uses).
Result run_group(const ModelConfig& m, const std::vector<float>& params, const Batch& b, int B, int P) {
  const ZigzagLayout z{.T = m.seq_len, .P = P};
  std::vector<Result> rank(static_cast<size_t>(P));
  test::ThreadGroup::run(P, [&](Collective& g) {
    const int r = g.rank();
    Result& mine = rank[size_t(r)];
    gpu::DeviceModel dev(m, test::kMaxBatch, {.head_rows = test::kHeadRows});
    dev.upload_params(params.data());
    dev.set_context_parallel(&g);
    EXPECT_EQ(dev.local_seq_len(), z.local_len(r));
    const std::vector<int32_t> in = rows_of(b.in, B, z, r), tg = rows_of(b.tg, B, z, r);
    dev.zero_grads();
    mine.train = dev.forward_backward(in.data(), tg.data(), B, 0.5);
    mine.grads.resize(dev.layout().total());
    dev.download_grads(mine.grads.data());
    mine.positions.resize(in.size());
    mine.eval = dev.forward(in.data(), tg.data(), B, mine.positions.data());
  });
  Result out;
  out.positions.resize(size_t(B) * m.seq_len);
  std::vector<double> sum(rank[0].grads.size(), 0.0);
  for (int r = 0; r < P; ++r) {
    const Result& mine = rank[size_t(r)];
    for (auto [to, from] : {std::pair{&out.train, &mine.train}, std::pair{&out.eval, &mine.eval}})
      to->ce += from->ce, to->aux += from->aux, to->z += from->z;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += mine.grads[i];
    zigzag_put(out.positions.data(), mine.positions.data(), B, 1, z, r);
  }
  out.grads.assign(sum.begin(), sum.end());
  return out;
}

// The losses and each position's cross-entropy within `rel` of the whole model's (relative to
// each value: the same fp32 sums in other orders, the ring's blocks against the whole-sequence
// kernel, and the ranks' shares added here).
void expect_losses_near(const Result& got, const Result& want, double rel) {
  for (auto [g, w] : {std::pair{&got.train, &want.train}, std::pair{&got.eval, &want.eval}}) {
    EXPECT_NEAR(g->ce, w->ce, rel * std::fabs(w->ce));
    EXPECT_NEAR(g->aux, w->aux, rel * std::fabs(w->aux));
    EXPECT_NEAR(g->z, w->z, rel * std::fabs(w->z));
  }
  ASSERT_EQ(got.positions.size(), want.positions.size());
  for (size_t i = 0; i < want.positions.size(); ++i)
    ASSERT_NEAR(got.positions[i], want.positions[i], rel * std::fabs(want.positions[i])) << "position " << i;
}

// Every element of each tensor (or only the rows `which` picks) within `rel` of the tensor's
// largest |gradient|.
void expect_grads_within(const std::vector<float>& got, const std::vector<float>& want, const ParamLayout& layout,
                         double rel, const std::function<bool(const ParamEntry&)>& which = {}) {
  for (const ParamEntry& e : layout.entries()) {
    if (which && !which(e)) continue;
    double scale = 0, worst = 0;
    for (size_t i = e.offset; i < e.offset + e.numel; ++i)
      scale = std::max(scale, std::fabs(double(want[i]))), worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    EXPECT_GT(scale, 0.0) << e.name << ": a gradient of zero tests nothing";
    EXPECT_LE(worst, rel * scale) << e.name;
  }
}

// The whole-sequence model's results, and each P's group against them.
void check_group(const ModelConfig& m, const std::vector<int>& Ps, const std::function<void(Model<float>&)>& prepare,
                 const std::function<void(const Result& got, const Result& want, const ParamLayout&)>& compare) {
  Model<float> host(m, 1);
  host.init_params(7);
  if (prepare) prepare(host);
  const int B = 2;
  Rng rng(19);
  const Batch b = test::make_batch(rng, B, m.seq_len, m.vocab_size);
  const Result want = run_whole(m, host.params(), b, B);
  for (int P : Ps) {
    SCOPED_TRACE(testing::Message() << "P=" << P);
    compare(run_group(m, host.params(), b, B, P), want, host.layout());
  }
}

// GQA with the top-k router's auxiliary and z losses, T = 133 (not divisible by 2P for P = 2, 3,
// 4; over one attention tile). Tolerances: device_model_check.h's (the same fp32 sums in other
// orders: the ring's blocks, the routers' sums added over ranks in double, the ranks' gradients
// added here). A block of keys attended twice or missed, RoPE at the wrong positions, router sums
// taken over one rank's tokens or a loss divided by T_r instead of T is O(1) off.
TEST(CudaContextParallel, RanksAddUpToOneModelOverWholeSequences) {
  ATOLL_SKIP_WITHOUT_GPU();
  check_group(tiny_config(false), {1, 2, 3, 4}, {}, [](const Result& got, const Result& want, const ParamLayout& l) {
    EXPECT_GT(want.train.aux, 0.0);
    test::expect_loss_near(got.train, want.train);
    test::expect_loss_near(got.eval, want.eval);
    test::expect_grads_near(got.grads, want.grads, l);
  });
}

// CCA with the top-k router, P 1-3: every chunk's convolutions read the chunk before's last 3
// [q|k] rows and its value shift the token before's delayed half, handed over by the neighbours;
// backward hands their gradients back. The bound, 1e-5 relative, on the losses, each
// position's loss and every tensor's gradient (the CPU's own test holds CCA to it in fp32): a
// boundary row missing, shifted by one, taken from the wrong sequence or its gradient not
// returned is O(1) off at the chunks' first tokens.
TEST(CudaContextParallel, CcaRanksAddUpToOneModel) {
  ATOLL_SKIP_WITHOUT_GPU();
  check_group(cca_config(), {1, 2, 3}, {}, [](const Result& got, const Result& want, const ParamLayout& l) {
    EXPECT_GT(want.train.aux, 0.0);
    expect_losses_near(got, want, 1e-5);
    expect_grads_within(got.grads, want.grads, l, 1e-5);
  });
}

// zaya1-tiny's kinds, P 1-3, with the skip class chosen (perturb_zaya_rows). The losses and each
// position's loss within 1e-5 relative. The zaya routers' balancing loads are shares of the whole
// sequences' tokens, so the ranks' add up to the whole model's: counts over exact shares, within
// 1e-5 of the largest (a rank dividing by its own tokens is P times off). The other gradients
// within device_model_check.h's bounds, not 1e-5: the zaya router's gate (GELU MLP, depth
// average, top-k of biased scores) turns the rounding of attention's summation order into
// gradient differences of ~1e-4 of a tensor's largest entry on the CPU even at P = 1
// (tests/dist/context_parallel_test.cc compares it in fp64 for that reason; the device has no
// fp64 path), well inside those bounds and far below a wrong row's O(1).
TEST(CudaContextParallel, Zaya1KindsRanksAddUpToOneModel) {
  ATOLL_SKIP_WITHOUT_GPU();
  check_group(zaya1_config(), {1, 2, 3}, test::perturb_zaya_rows,
              [](const Result& got, const Result& want, const ParamLayout& l) {
                expect_losses_near(got, want, 1e-5);
                expect_grads_within(got.grads, want.grads, l, 1e-5, [](const ParamEntry& e) { return e.balanced; });
                test::expect_grads_near(got.grads, want.grads, l);
              });
}

// One sequence on a device model of m (parameters init_params(3)), and its loss before any change.
struct LoneModel {
  explicit LoneModel(const ModelConfig& m) : host(m, 1), dev(m, 1, {.head_rows = test::kHeadRows}) {
    host.init_params(3);
    Rng rng(4);
    b = test::make_batch(rng, 1, m.seq_len, m.vocab_size);
    dev.upload_params(host.params().data());
    before = ce();
  }
  double ce() { return dev.forward(b.in.data(), b.tg.data(), 1).ce; }
  Model<float> host;
  gpu::DeviceModel dev;
  Batch b;
  double before = 0;
};

// Leaving the ring (validation runs on whole sequences, Loop's WholeSequences) gives the
// whole-sequence model back; a lone rank's ring (two chunks, RoPE in two runs, CCA's chunk 1
// reading chunk 0's tail from itself) is the same computation. Same kernels on the same shapes:
// 1e-6 relative leaves room only for a BLAS that picks another algorithm for another buffer
// address.
TEST(CudaContextParallel, LeavingTheGroupRestoresWholeSequences) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const ModelConfig& m : {tiny_config(false), cca_config()}) {
    SCOPED_TRACE(m.attention);
    LoneModel one(m);
    test::ThreadGroup::run(1, [&](Collective& g) {
      one.dev.set_context_parallel(&g);
      EXPECT_NEAR(one.ce(), one.before, 1e-6 * one.before);
      one.dev.set_context_parallel(nullptr);
    });
    EXPECT_EQ(one.dev.local_seq_len(), m.seq_len);
    EXPECT_NEAR(one.ce(), one.before, 1e-6 * one.before);
  }
}

// A CCA chunk shorter than its window (T = 23 over P = 4: a first chunk of 2 tokens, the window 3)
// would need rows of two chunks before it: refused before any exchange (ConfigError naming the
// key and the fix), the model left as it was.
TEST(CudaContextParallel, CcaChunkShorterThanItsWindowIsRefusedAndTheModelKept) {
  ATOLL_SKIP_WITHOUT_GPU();
  const ModelConfig m = cca_config();
  LoneModel one(m);
  test::ThreadGroup::run(4, [&](Collective& g) {
    if (g.rank() != 0) return;
    try {
      one.dev.set_context_parallel(&g);
      ADD_FAILURE() << "chunks of 2 tokens accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      for (const char* word : {"train.context_parallel = 4", "chunks of 2", "3 tokens", "fix:"})
        EXPECT_NE(what.find(word), std::string::npos) << "'" << word << "' not in: " << what;
    }
  });
  EXPECT_EQ(one.dev.local_seq_len(), m.seq_len);
  std::vector<float> params(one.host.params().size());
  one.dev.download_params(params.data());
  test::expect_equal(params, one.host.params(), "parameters after the refusal");
  EXPECT_NEAR(one.ce(), one.before, 1e-6 * one.before);
}

}  // namespace
}  // namespace atl
