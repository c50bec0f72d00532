// Context parallelism on the GPU (gpu::DeviceModel::set_context_parallel, docs/long_context.md):
// P ranks, each holding its zigzag rows of every sequence, run attention round their ring and
// add their router sums over the group; their losses and gradients must add up to those of one
// device model over whole sequences. The ranks are threads of this process on one GPU over an
// in-process Collective (thread_group.h); tests/dist/context_parallel_test.cc runs the CPU model
// the same way over real processes.
#include <gtest/gtest.h>

#include <vector>

#include "atoll/model/ring_attention.h"
#include "device_model_check.h"
#include "thread_group.h"

namespace atl {
namespace {

using test::Batch;
using test::tiny_config;

template <typename X>
std::vector<X> rows_of(const std::vector<X>& whole, int B, const ZigzagLayout& z, int r) {
  std::vector<X> local(size_t(B) * z.local_len(r));
  zigzag_take(local.data(), whole.data(), B, 1, z, r);
  return local;
}

// The ranks' losses and gradients, added over the group (the gradients in double, then rounded).
struct GroupResult {
  LossParts train, eval;
  std::vector<float> grads;
};

GroupResult run_group(const ModelConfig& m, const std::vector<float>& params, const Batch& b, int B, int P) {
  const ZigzagLayout z{.T = m.seq_len, .P = P};
  std::vector<LossParts> train(static_cast<size_t>(P)), eval(train.size());
  std::vector<std::vector<float>> grads(train.size());
  test::ThreadGroup::run(P, [&](Collective& g) {
    const int r = g.rank();
    gpu::DeviceModel dev(m, B, {.head_rows = test::kHeadRows});
    dev.upload_params(params.data());
    dev.set_context_parallel(&g);
    EXPECT_EQ(dev.local_seq_len(), z.local_len(r));
    const std::vector<int32_t> in = rows_of(b.in, B, z, r), tg = rows_of(b.tg, B, z, r);
    dev.zero_grads();
    train[size_t(r)] = dev.forward_backward(in.data(), tg.data(), B, 0.5);
    grads[size_t(r)].resize(dev.layout().total());
    dev.download_grads(grads[size_t(r)].data());
    eval[size_t(r)] = dev.forward(in.data(), tg.data(), B);
  });
  GroupResult out;
  std::vector<double> sum(grads[0].size(), 0.0);
  for (int r = 0; r < P; ++r) {
    for (LossParts* l : {&out.train, &out.eval}) {
      const LossParts& mine = (l == &out.train ? train : eval)[size_t(r)];
      l->ce += mine.ce, l->aux += mine.aux, l->z += mine.z;
    }
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += grads[size_t(r)][i];
  }
  out.grads.assign(sum.begin(), sum.end());
  return out;
}

// Tolerances: device_model_check.h's (the same fp32 sums in other orders: the ring's blocks, the
// routers' sums added over ranks in double, the ranks' gradients added here). A block of keys
// attended twice or missed, RoPE at the wrong positions, router sums taken over one rank's
// tokens or a loss divided by T_r instead of T is O(1) off.
TEST(CudaContextParallel, RanksAddUpToOneModelOverWholeSequences) {
  ATOLL_SKIP_WITHOUT_GPU();
  const ModelConfig m = tiny_config(false);  // T = 133: not divisible by 2P for P = 2, 3, 4
  Model<float> host(m, 1);
  host.init_params(7);
  const int B = 2;
  Rng rng(19);
  const Batch b = test::make_batch(rng, B, m.seq_len, m.vocab_size);
  gpu::DeviceModel whole(m, B, {.head_rows = test::kHeadRows});
  whole.upload_params(host.params().data());
  whole.zero_grads();
  const LossParts want = whole.forward_backward(b.in.data(), b.tg.data(), B, 0.5);
  std::vector<float> want_grads(whole.layout().total());
  whole.download_grads(want_grads.data());
  const LossParts want_eval = whole.forward(b.in.data(), b.tg.data(), B);
  EXPECT_GT(want.aux, 0.0);
  for (int P : {1, 2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << "P=" << P);
    const GroupResult got = run_group(m, host.params(), b, B, P);
    test::expect_loss_near(got.train, want);
    test::expect_loss_near(got.eval, want_eval);
    test::expect_grads_near(got.grads, want_grads, whole.layout());
  }
}

// Leaving the ring (validation runs on whole sequences, Loop's WholeSequences) gives the
// whole-sequence model back; a lone rank's ring (two chunks, RoPE in two runs) is the same
// computation. Same kernels on the same shapes: 1e-6 relative leaves room only for a BLAS that
// picks another algorithm for another buffer address.
TEST(CudaContextParallel, LeavingTheGroupRestoresWholeSequences) {
  ATOLL_SKIP_WITHOUT_GPU();
  const ModelConfig m = tiny_config(false);
  Model<float> host(m, 1);
  host.init_params(3);
  Rng rng(4);
  const Batch b = test::make_batch(rng, 1, m.seq_len, m.vocab_size);
  gpu::DeviceModel dev(m, 1, {.head_rows = test::kHeadRows});
  dev.upload_params(host.params().data());
  const LossParts before = dev.forward(b.in.data(), b.tg.data(), 1);
  test::ThreadGroup::run(1, [&](Collective& g) {
    dev.set_context_parallel(&g);
    const LossParts lone = dev.forward(b.in.data(), b.tg.data(), 1);
    EXPECT_NEAR(lone.ce, before.ce, 1e-6 * before.ce);
    dev.set_context_parallel(nullptr);
  });
  EXPECT_EQ(dev.local_seq_len(), m.seq_len);
  const LossParts after = dev.forward(b.in.data(), b.tg.data(), 1);
  EXPECT_NEAR(after.ce, before.ce, 1e-6 * before.ce);
}

// The zaya router has no device path over a split sequence: refused, the model left as it was.
TEST(CudaContextParallel, ZayaRouterIsRefusedAndTheModelKept) {
  ATOLL_SKIP_WITHOUT_GPU();
  ModelConfig m = tiny_config(false);
  m.router = "zaya";
  Model<float> host(m, 1);
  host.init_params(3);
  gpu::DeviceModel dev(m, 1, {.head_rows = test::kHeadRows});
  dev.upload_params(host.params().data());
  test::ThreadGroup::run(2, [&](Collective& g) {
    if (g.rank() == 0) {
      EXPECT_THROW(dev.set_context_parallel(&g), ConfigError);
    }
  });
  EXPECT_EQ(dev.local_seq_len(), m.seq_len);
  std::vector<float> params(host.params().size());
  dev.download_params(params.data());
  test::expect_equal(params, host.params(), "parameters after the refusal");
}

}  // namespace
}  // namespace atl
