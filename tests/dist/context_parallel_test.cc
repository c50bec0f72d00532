// A whole model under context parallelism (Model::set_context_parallel): P real processes, each
// holding its zigzag rows of the same sequences, give the loss and every parameter's gradient
// of one process over whole sequences: the ranks' losses and gradients summed over the group
// against the single model's, within 1e-5 relative (to the largest entry of each tensor; the
// two sum the same terms in other orders), P in {1, 2, 3}, T not divisible by P, GQA, dense,
// MoE with the Switch balancing loss and the z-loss (the group adds its routing sums before the
// product of means, layers/router.h RouterSums), and the zaya router (its balancing loads are
// shares of the whole sequences' tokens, so the group's add up; compared in fp64 to 1e-10, see
// the test). CCA (its convolutions and value shift read the chunk before's last rows, handed over
// by model/chunk_boundary.h) alone in fp32 (and with kernels of 1, where only the value shift
// reads back, at T = 13), and as zaya1-tiny has it (CCA, the zaya router,
// residual scaling, tied embeddings) in fp64; P up to 4 at T = 29, whose shortest chunk (3
// tokens at P = 4) is CCA's window exactly. The boundary exchange alone is checked on exact data.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "atoll/dist/group.h"
#include "atoll/model/chunk_boundary.h"
#include "atoll/model/model.h"
#include "atoll/model/ring_attention.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::run_processes;

class ContextParallel : public testing::RedisSuite {};

// "dense", "moe" (softmax top-k with both auxiliary losses, strong enough to matter), "zaya",
// "cca" (dense CCA), "cca1" (its kernels of 1: no convolution rows cross a chunk, only the value
// shift's) or "zaya1" (zaya1-tiny's kinds: CCA, the zaya router, residual scaling, tied
// embeddings).
ModelConfig small_model(const std::string& kind) {
  ModelConfig m;
  const bool moe = kind != "dense" && kind != "cca" && kind != "cca1";
  m.vocab_size = 41, m.dim = 16, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 4;
  m.n_experts = moe ? 4 : 1, m.top_k = moe ? 2 : 1, m.expert_hidden = 12, m.seq_len = 13, m.init_std = 0.3;
  m.aux_loss_coef = kind == "moe" ? 0.5 : 0.0;
  m.z_loss_coef = kind == "moe" ? 0.1 : 0.0;
  if (kind == "zaya" || kind == "zaya1") m.router = "zaya";
  if (kind == "cca" || kind == "zaya1") {
    // A window of t0-1 + t1-1 = 3 tokens back: T = 29 over P = 4 gives chunks of 3 and 4.
    m.attention = "cca", m.cca_time0 = 2, m.cca_time1 = 3, m.seq_len = 29;
    m.n_kv_heads = kind == "cca" ? 2 : 1;  // zaya1-tiny's one key/value head
  }
  if (kind == "cca1") m.attention = "cca", m.cca_time0 = 1, m.cca_time1 = 1;
  if (kind == "zaya1") m.residual_scaling = true, m.tie_embeddings = true, m.top_k = 1, m.router_hidden_size = 4;
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
  for (const char* k : {"dense", "moe", "zaya", "cca", "cca1", "zaya1"})
    for (int P = 1; P <= (std::string(k) == "cca" || std::string(k) == "zaya1" ? 4 : 3); ++P) {
      const std::string kind = k;
      const std::string run = "cpm-" + kind + std::to_string(P);
      const ModelConfig m = small_model(kind);
      // The zaya router's gate (GELU MLP, depth average, top-k over its biased scores) turns
      // fp32 rounding of the attention's summation order into gradient differences of ~1e-4 of
      // its largest entry even at P = 1 (the ring against the local kernel): it is compared in
      // fp64, where the only difference is that order's rounding, to 1e-10.
      const bool fp64 = kind == "zaya" || kind == "zaya1";
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

// The boundary exchange alone (model/chunk_boundary.h), on exact data: every rank's chunks get
// the last K rows of the chunk before them in the whole sequences, and backward hands each
// head's gradient back to the tail it came from (0 for the sequence's last chunk), P 1-4, T = 29.
// Each value names its sequence, position and column, so a row from the wrong chunk, rank or
// order shows (as zeros sent instead do: checked by hand once).
TEST_F(ContextParallel, TheBoundaryExchangeHandsEachChunkThePreviousChunksTail) {
  const int B = 2, T = 29, K = 3, W = 5;
  auto value = [](int b, int t, int w) { return double(10000 * b + 10 * t + w); };
  for (int P = 1; P <= 4; ++P) {
    const auto out = run_processes(P, [&](int rank) -> std::string {
      Store store(store_options("cpb" + std::to_string(P)));
      ProcessGroup g(store, GroupOptions{.name = "cpb", .rank = rank, .size = P});
      const ZigzagLayout z{.T = T, .P = P};
      const int chunks[2] = {z.first_chunk(rank), z.second_chunk(rank)};
      const size_t n = size_t(B) * K * W;
      // [chunk i][b][k][w]: the tails of this rank's chunks; the heads, and backward's gradients
      // of the heads (the value + 0.5, a different number from any row's).
      std::vector<double> tails(2 * n), heads(2 * n, -1), dheads(2 * n), dtails(2 * n, -1);
      auto at = [&](std::vector<double>& v, int i, int b, int k, int w) -> double& {
        return v[((size_t(i) * B + b) * K + k) * W + w];
      };
      for (int i = 0; i < 2; ++i)
        for (int b = 0; b < B; ++b)
          for (int k = 0; k < K; ++k)
            for (int w = 0; w < W; ++w) {
              at(tails, i, b, k, w) = value(b, z.chunk_begin(chunks[i] + 1) - K + k, w);
              at(dheads, i, b, k, w) = value(b, z.chunk_begin(chunks[i]) - K + k, w) + 0.5;
            }
      chunk_tails_forward(heads.data(), heads.data() + n, tails.data(), tails.data() + n, n, g);
      chunk_heads_backward(dtails.data(), dtails.data() + n, dheads.data(), dheads.data() + n, n, g);
      std::ostringstream bad;
      for (int i = 0; i < 2; ++i)
        for (int b = 0; b < B; ++b)
          for (int k = 0; k < K; ++k)
            for (int w = 0; w < W; ++w) {
              const int c = chunks[i];
              const double head = c == 0 ? -1 : value(b, z.chunk_begin(c) - K + k, w);
              const double dtail = c == 2 * P - 1 ? 0 : value(b, z.chunk_begin(c + 1) - K + k, w) + 0.5;
              if (at(heads, i, b, k, w) != head)
                bad << "head of chunk " << c << " [" << b << "," << k << "," << w << "] " << at(heads, i, b, k, w)
                    << " != " << head << "; ";
              if (at(dtails, i, b, k, w) != dtail)
                bad << "dtail of chunk " << c << " [" << b << "," << k << "," << w << "] " << at(dtails, i, b, k, w)
                    << " != " << dtail << "; ";
            }
      return bad.str().substr(0, 400);
    });
    for (int r = 0; r < P; ++r) EXPECT_EQ(out[r], "") << "P=" << P << " rank " << r;
  }
}

}  // namespace
}  // namespace atl
