// Ring attention on the GPU (model/device_ring_attention.h) against causal attention over the
// whole sequence on the CPU (backend/cpu/attention.h, the blocked kernel the model uses): output,
// log-sum-exp, dQ, dK and dV of every rank's rows, P in {1, 2, 3, 4}. The P ranks are threads of
// this process on one GPU (tests/core/thread_group.h): the ring's transfers go through
// the same Collective calls as over Gloo, between host buffers. tests/dist/ring_attention_test.cc
// checks the CPU ring over real processes; this one checks the device steps and their staging.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/backend/cpu/attention.h"
#include "atoll/model/device_ring_attention.h"
#include "atoll/model/ring_attention.h"
#include "gpu_test_util.h"
#include "core/thread_group.h"

namespace atl {
namespace {

using test::DeviceVec;

struct Shape {
  int B, T, NH, NKV, HD;
};

std::vector<float> values(uint64_t seed, size_t n, double scale) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& e : x) e = float((rng.uniform() * 2 - 1) * scale);
  return x;
}

// Largest |a - b| over the largest |b|, of rank r's rows of the whole tensor b [B,T,W].
double rel_diff(const std::vector<float>& mine, const std::vector<float>& whole, int B, size_t W,
                const ZigzagLayout& z, int r) {
  std::vector<float> want(mine.size());
  zigzag_take(want.data(), whole.data(), B, W, z, r);
  double diff = 0, big = 0;
  for (size_t i = 0; i < mine.size(); ++i)
    diff = std::max(diff, std::fabs(double(mine[i]) - want[i])), big = std::max(big, std::fabs(double(want[i])));
  return big > 0 ? diff / big : diff;
}

template <typename X>
std::vector<X> take(const std::vector<X>& whole, int B, size_t W, const ZigzagLayout& z, int r) {
  std::vector<X> local(size_t(B) * z.local_len(r) * W);
  zigzag_take(local.data(), whole.data(), B, W, z, r);
  return local;
}

// fp32 on both sides, summing the same terms in other orders (tiles of 128 keys and an online
// softmax on the GPU, blocks on the CPU): about T·2^-24 of the largest value apart at worst,
// ~sqrt(T)·2^-24 typically, so 1e-5 of each tensor's largest entry holds for T up to ~170 at
// worst and far beyond typically (the CPU ring's own bound, tests/dist/ring_attention_test.cc).
// A wrong mask, a block attended twice or a gradient share lost is O(1) off.
constexpr double kTol = 1e-5;

void expect_ring_matches(const Shape& s, int P) {
  SCOPED_TRACE(testing::Message() << "P=" << P << " B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV
                                  << " HD=" << s.HD);
  const size_t QD = size_t(s.NH) * s.HD, KVD = size_t(s.NKV) * s.HD, N = size_t(s.B) * s.T;
  // Scores of order 1..10 so the softmax is far from uniform.
  const auto q = values(1, N * QD, 2.0), k = values(2, N * KVD, 2.0), v = values(3, N * KVD, 1.0);
  const auto dout = values(4, N * QD, 1.0);
  std::vector<float> out(N * QD), lse(size_t(s.B) * s.NH * s.T), dq(N * QD), dk(N * KVD), dv(N * KVD);
  attention_forward_blocked(out.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T, s.NH, s.NKV, s.HD);
  attention_backward_blocked(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                             v.data(), s.B, s.T, s.NH, s.NKV, s.HD);
  const ZigzagLayout z{.T = s.T, .P = P};
  const RingDims d{.B = s.B, .NH = s.NH, .NKV = s.NKV, .HD = s.HD};
  std::vector<std::vector<double>> errors(static_cast<size_t>(P));
  test::ThreadGroup::run(P, [&](Collective& g) {
    const int r = g.rank();
    const size_t rows = size_t(s.B) * z.local_len(r);
    DeviceVec<float> lq(take(q, s.B, QD, z, r)), lk(take(k, s.B, KVD, z, r)), lv(take(v, s.B, KVD, z, r)),
        ldout(take(dout, s.B, QD, z, r));
    DeviceVec<float> lout(rows * QD), llse(size_t(s.B) * s.NH * z.local_len(r)), ldq(rows * QD), ldk(rows * KVD),
        ldv(rows * KVD);
    for (auto* x : {&lout, &llse, &ldq, &ldk, &ldv}) x->fill_nan();  // every output is (=)
    RingDims room = d;  // buffers for one sequence more than the call: a micro-batch below the model's
    room.B += 1;
    gpu::DeviceRingBuffers buf(room, z);
    gpu::ring_attention_forward(lout.get(), llse.get(), lq.get(), lk.get(), lv.get(), s.B, buf, g);
    gpu::ring_attention_backward(ldq.get(), ldk.get(), ldv.get(), ldout.get(), lout.get(), llse.get(), lq.get(),
                                 lk.get(), lv.get(), s.B, buf, g);
    // lse is [B,NH,T]: rank r's columns of each (b, h) row, as [B·NH, T, 1].
    errors[size_t(r)] = {rel_diff(lout.host(), out, s.B, QD, z, r), rel_diff(llse.host(), lse, s.B * s.NH, 1, z, r),
                         rel_diff(ldq.host(), dq, s.B, QD, z, r), rel_diff(ldk.host(), dk, s.B, KVD, z, r),
                         rel_diff(ldv.host(), dv, s.B, KVD, z, r)};
  });
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (int r = 0; r < P; ++r)
    for (int t = 0; t < 5; ++t) EXPECT_LE(errors[size_t(r)][size_t(t)], kTol) << names[t] << " of rank " << r;
}

// T = 13 is not divisible by 2, 3 or 4; T = 5 leaves chunks (and at P = 4 a whole rank) empty;
// GQA 4:2 and 3:1; T = 300 gives blocks of 150 and 100 rows, over one 128-key tile, with an odd
// HD; HD = 160 is wider than the block of threads.
TEST(CudaRingAttention, MatchesOneProcessWithin1e5) {
  ATOLL_SKIP_WITHOUT_GPU();
  for (const Shape s : {Shape{2, 13, 4, 2, 8}, Shape{1, 5, 3, 1, 4}, Shape{2, 300, 4, 2, 17}, Shape{1, 41, 2, 2, 160}})
    for (int P = 1; P <= 4; ++P) expect_ring_matches(s, P);
}

// A lone rank is causal attention: three sequences, keys over two tiles, GQA 4:1.
TEST(CudaRingAttention, LoneRankIsCausalAttention) {
  ATOLL_SKIP_WITHOUT_GPU();
  expect_ring_matches(Shape{3, 133, 4, 1, 10}, 1);
}

}  // namespace
}  // namespace atl
