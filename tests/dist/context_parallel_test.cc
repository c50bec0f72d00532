// A whole model under context parallelism (Model::set_context_parallel): P real processes, each
// holding its zigzag rows of the same sequences, give the loss and every parameter's gradient
// of one process over whole sequences: the ranks' losses and gradients summed over the group
// against the single model's, within 1e-5 relative (to the largest entry of each tensor; the
// two sum the same terms in other orders), P in {1, 2, 3}, T not divisible by P, GQA, dense,
// MoE with the Switch balancing loss and the z-loss (the group adds its routing sums before the
// product of means, layers/router.h RouterSums), and the zaya router (its balancing loads are
// shares of the whole sequences' tokens, so the group's add up; compared in fp64 to 1e-10, see
// the test).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "atoll/dist/group.h"
#include "atoll/model/model.h"
#include "atoll/model/ring_attention.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::run_processes;

class ContextParallel : public testing::RedisSuite {};

// "dense", "moe" (softmax top-k with both auxiliary losses, strong enough to matter) or "zaya".
ModelConfig small_model(const std::string& kind) {
  ModelConfig m;
  const bool moe = kind != "dense";
  m.vocab_size = 41, m.dim = 16, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 4;
  m.n_experts = moe ? 4 : 1, m.top_k = moe ? 2 : 1, m.expert_hidden = 12, m.seq_len = 13, m.init_std = 0.3;
  m.aux_loss_coef = kind == "moe" ? 0.5 : 0.0;
  m.z_loss_coef = kind == "moe" ? 0.1 : 0.0;
  if (kind == "zaya") m.router = "zaya";
  return m;
}

// Tokens and targets of B whole sequences, the same on every rank.
std::vector<int32_t> tokens(int B, int T, int V, int salt) {
  std::vector<int32_t> t(size_t(B) * T);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 7 + size_t(salt) * 13 + i * i) % size_t(V));
  return t;
}

// x[n] <- the sum over the group's ranks, in rank order (an all-gather: float or double alike).
template <typename T>
void sum_over(ProcessGroup& g, T* x, size_t n) {
  const std::vector<std::string> all = g.allgather(std::string(reinterpret_cast<const char*>(x), n * sizeof(T)));
  std::vector<T> part(n);
  std::fill(x, x + n, T(0));
  for (const std::string& blob : all) {
    std::memcpy(part.data(), blob.data(), n * sizeof(T));
    for (size_t i = 0; i < n; ++i) x[i] += part[i];
  }
}

// "loss_diff grad_diff where": this group's summed loss and gradients against one model's, in T.
template <typename T>
std::string compare(ProcessGroup& g, const ModelConfig& m) {
  const int B = 2, seq = m.seq_len;
  const auto in = tokens(B, seq, m.vocab_size, 1), tgt = tokens(B, seq, m.vocab_size, 2);
  Model<T> whole(m, B);
  whole.init_params(m.init_seed);
  whole.zero_grads();
  const double want = whole.forward_backward(in.data(), tgt.data(), B).total();

  Model<T> part(m, B);
  part.init_params(m.init_seed);
  part.zero_grads();
  part.set_context_parallel(&g);
  const ZigzagLayout z{.T = seq, .P = g.size()};
  const int Tr = part.local_seq_len();
  if (Tr != z.local_len(g.rank())) return "local_seq_len " + std::to_string(Tr);
  std::vector<int32_t> lin(size_t(B) * Tr), ltgt(size_t(B) * Tr);
  zigzag_take(lin.data(), in.data(), B, 1, z, g.rank());
  zigzag_take(ltgt.data(), tgt.data(), B, 1, z, g.rank());
  double loss = part.forward_backward(lin.data(), ltgt.data(), B).total();
  sum_over(g, &loss, 1);
  std::vector<T>& grads = part.grads();
  sum_over(g, grads.data(), grads.size());
  double worst = 0;
  std::string where;
  for (const ParamEntry& e : part.layout().entries()) {
    double diff = 0, big = 0;
    for (size_t i = e.offset; i < e.offset + e.numel; ++i)
      diff = std::max(diff, std::fabs(double(grads[i]) - double(whole.grads()[i]))),
      big = std::max(big, std::fabs(double(whole.grads()[i])));
    const double rel = big > 0 ? diff / big : diff;
    if (rel > worst) worst = rel, where = e.name;
  }
  std::ostringstream o;
  o << std::fabs(loss - want) / want << " " << worst << " " << (where.empty() ? "-" : where);
  return o.str();
}

TEST_F(ContextParallel, GroupSumsToOneModelOverWholeSequences) {
  for (const char* k : {"dense", "moe", "zaya"})
    for (int P = 1; P <= 3; ++P) {
      const std::string kind = k;
      const std::string run = "cpm-" + kind + std::to_string(P);
      const ModelConfig m = small_model(kind);
      // The zaya router's gate (GELU MLP, depth average, top-k over its biased scores) turns
      // fp32 rounding of the attention's summation order into gradient differences of ~1e-4 of
      // its largest entry even at P = 1 (the ring against the local kernel): it is compared in
      // fp64, where the only difference is that order's rounding, to 1e-10.
      const bool fp64 = kind == "zaya";
      const double bound = fp64 ? 1e-10 : 1e-5;
      const auto out = run_processes(P, [&](int rank) -> std::string {
        // One thread per process: P processes share the cores, and OpenMP threads spinning at
        // the end of a parallel region would starve the peer each collective waits for.
        omp_set_num_threads(1);
        Store store(store_options(run));
        ProcessGroup g(store, GroupOptions{.name = "cp", .rank = rank, .size = P});
        return fp64 ? compare<double>(g, m) : compare<float>(g, m);
      });
      for (int r = 0; r < P; ++r) {
        std::istringstream in(out[r]);
        double loss_diff = 1, grad_diff = 1;
        std::string where;
        ASSERT_TRUE(in >> loss_diff >> grad_diff >> where) << "P=" << P << " rank " << r << ": " << out[r];
        EXPECT_LE(loss_diff, bound) << "loss, P=" << P << " rank " << r << " " << kind;
        EXPECT_LE(grad_diff, bound) << where << ", P=" << P << " rank " << r << " " << kind;
      }
    }
}

}  // namespace
}  // namespace atl
