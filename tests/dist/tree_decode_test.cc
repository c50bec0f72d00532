// Tree-attention decoding (model/decoder.h with a group; model/cached_attention.h
// attend_token) over P real processes against one process's decoder: the same greedy
// tokens, and logits within 1e-6 of the largest |logit| (both sum the same terms of the softmax
// in other orders), P in {1, 2, 3}, GQA and CCA; every rank returns the same logits. The same
// with the prompt prefilled (model/cached_attention.h) against one process token by token.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "atoll/dist/group.h"
#include "atoll/model/decoder.h"
#include "atoll/model/model.h"
#include "model/logit_compare.h"
#include "dist_test_util.h"

namespace atl {
namespace {

using testing::greedy;
using testing::logit_error;
using testing::run_processes;

ModelConfig small_model(bool cca) {
  ModelConfig m;
  m.vocab_size = 37, m.dim = 16, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 2, m.head_dim = 4;
  m.n_experts = 4, m.top_k = 2, m.expert_hidden = 12, m.seq_len = 32, m.init_std = 0.3;
  if (cca) m.attention = "cca", m.cca_time0 = 2, m.cca_time1 = 3;
  return m;
}

// "<same tokens 0/1> <worst logit difference> <hash of the last logits>" on this rank.
std::string decode_both(Collective& g, const ModelConfig& m) {
  Model<float> model(m, 1);
  model.init_params(m.init_seed);
  const int kLen = 24;
  Decoder one(m, model.params().data(), kLen), tree(m, model.params().data(), kLen, &g);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2};
  int32_t a = 0, b = 0;
  bool same = true;
  double worst = 0;
  std::vector<float> last;
  for (int pos = 0; pos < kLen; ++pos) {
    const int32_t in_a = pos < int(prompt.size()) ? prompt[pos] : a;
    const int32_t in_b = pos < int(prompt.size()) ? prompt[pos] : b;
    const std::vector<float>& la = one.step(in_a);
    const std::vector<float>& lb = tree.step(in_b);
    worst = std::max(worst, logit_error(la, lb));
    a = greedy(la), b = greedy(lb);
    same = same && a == b;
    last = lb;
  }
  std::ostringstream o;
  o << same << " " << worst << " " << testing::hash_floats(last.data(), last.size());
  return o.str();
}

// Tree attention with a prefill: each rank prefills the prompt (13 tokens, blocks of 5: the
// whole block on every rank, its cache rows on their holders, the attention merged by the
// all-reduces) and decodes 8 greedy tokens; against one process stepping token by token.
// "<same tokens 0/1> <worst logit difference> <hash of the last logits>" on this rank.
std::string prefill_against_steps(Collective& g, const ModelConfig& m) {
  Model<float> model(m, 1);
  model.init_params(m.init_seed);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9};
  const int kGen = 8, kLen = int(prompt.size()) + kGen;
  Decoder one(m, model.params().data(), kLen), tree(m, model.params().data(), kLen, &g, 5);
  std::vector<float> a, b;
  for (int32_t t : prompt) a = one.step(t);
  b = tree.prefill(prompt.data(), int(prompt.size()));
  bool same = true;
  double worst = 0;
  for (int i = 0;; ++i) {
    worst = std::max(worst, logit_error(a, b));
    const int32_t ta = greedy(a), tb = greedy(b);
    same = same && ta == tb;
    if (i == kGen) break;
    a = one.step(ta), b = tree.step(tb);
  }
  std::ostringstream o;
  o << same << " " << worst << " " << testing::hash_floats(b.data(), b.size());
  return o.str();
}

class TreeDecode : public testing::RedisSuite {
 protected:
  // Runs `body` on P processes for GQA and CCA, P in {1, 2, 3}, and checks every rank's line:
  // the same greedy tokens, logits within `tolerance`, every rank the same last logits.
  static void check_over_ranks(const std::string& name, double tolerance,
                               std::string (*body)(Collective&, const ModelConfig&)) {
    for (bool cca : {false, true})
      for (int P = 1; P <= 3; ++P) {
        const std::string run = name + (cca ? "-cca" : "-gqa") + std::to_string(P);
        const ModelConfig m = small_model(cca);
        const auto out = run_processes(P, [&](int rank) -> std::string {
          // One thread per process: P processes share the cores, and OpenMP threads spinning at
          // the end of a parallel region would starve the peer each collective waits for.
          omp_set_num_threads(1);
          Store store(store_options(run));
          ProcessGroup g(store, GroupOptions{.name = "tree", .rank = rank, .size = P});
          return body(g, m);
        });
        std::string hash0;
        for (int r = 0; r < P; ++r) {
          std::istringstream in(out[r]);
          int same = 0;
          double worst = 1;
          std::string hash;
          ASSERT_TRUE(in >> same >> worst >> hash) << "P=" << P << " rank " << r << ": " << out[r];
          EXPECT_EQ(same, 1) << "greedy tokens differ, P=" << P << " rank " << r << (cca ? " cca" : " gqa");
          EXPECT_LE(worst, tolerance) << "logits, P=" << P << " rank " << r << (cca ? " cca" : " gqa");
          if (r == 0) {
            std::printf("%s P=%d %s: worst logit difference %.3g\n", name.c_str(), P, cca ? "cca" : "gqa", worst);
            hash0 = hash;
          }
          EXPECT_EQ(hash, hash0) << "rank " << r << "'s logits differ from rank 0's, P=" << P;
        }
      }
  }
};

TEST_F(TreeDecode, SameTokensAndLogitsAsOneProcess) { check_over_ranks("tree", 1e-6, decode_both); }

// The prefill's block attention sums in another order than the steps' (fp32): 1e-5.
TEST_F(TreeDecode, PrefillThenDecodeMatchesOneProcessTokenByToken) {
  check_over_ranks("tree-prefill", 1e-5, prefill_against_steps);
}

}  // namespace
}  // namespace atl
