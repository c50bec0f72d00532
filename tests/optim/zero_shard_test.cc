// ZeRO-1's shards (optim/zero_shard.h) and the sharded Optimizer: the shards are contiguous
// runs of whole tensors covering the buffer, balanced to within one tensor; an Optimizer given
// a shard holds moments of the shard's size only and steps exactly the shard's elements as the
// unsharded Optimizer does, bit for bit (the same arithmetic on the same values), for AdamW,
// Muon with AdamW, SGD and a zaya router's bias balancing, at M = 2, 3 and more shards than
// tensors allow to fill.
#include "atoll/optim/zero_shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/optim/optimizer.h"

namespace atl {
namespace {

ModelConfig model(const std::string& router) {
  ModelConfig m;
  m.vocab_size = 37, m.dim = 8, m.n_layers = 2, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 4;
  m.n_experts = 3, m.top_k = 1, m.expert_hidden = 12, m.router = router;
  return m;
}

std::vector<float> random_buffer(const ParamLayout& layout, uint64_t seed, bool loads) {
  Rng rng(seed);
  std::vector<float> b(layout.total(), 0.0f);
  for (const ParamEntry& e : layout.entries())
    for (size_t i = 0; i < e.numel; ++i)
      b[e.offset + i] = e.balanced && loads ? float(rng.uniform()) : float(rng.normal());  // loads are shares
  return b;
}

TEST(ZeroShards, ContiguousWholeTensorsCoveringTheBufferBalancedToATensor) {
  const ParamLayout layout = ParamLayout::build(model("zaya"));
  size_t largest = 0;
  for (const ParamEntry& e : layout.entries()) largest = std::max(largest, e.numel + ParamLayout::kAlign);
  for (int M : {1, 2, 3, 4, 7, 200}) {
    const std::vector<ZeroShard> s = zero_shards(layout, M);
    ASSERT_EQ(s.size(), size_t(M));
    EXPECT_EQ(s.front().lo, 0u);
    EXPECT_EQ(s.back().hi, layout.total());
    for (int r = 0; r < M; ++r) {
      EXPECT_LE(s[r].lo, s[r].hi);
      if (r > 0) {
        EXPECT_EQ(s[r].lo, s[r - 1].hi);
      }
      if (M <= 4) {
        EXPECT_LE(std::abs(double(s[r].size()) - double(layout.total()) / M), double(largest)) << M << " " << r;
      }
    }
    for (const ParamEntry& e : layout.entries()) {  // every tensor inside one shard
      int owners = 0;
      for (const ZeroShard& z : s)
        if (z.contains(e.offset)) {
          ++owners;
          EXPECT_LE(e.offset + e.numel, z.hi) << e.name;
        }
      EXPECT_EQ(owners, 1) << e.name;
    }
  }
}

TEST(ZeroShards, AShardedOptimizerStepsItsShardAsTheWholeDoes) {
  for (const char* router : {"topk", "zaya"})
    for (const char* name : {"adamw", "muon", "sgd"})
      for (int M : {2, 3, 40}) {
        const ParamLayout layout = ParamLayout::build(model(router));
        OptimConfig cfg;
        cfg.name = name;
        Optimizer whole(cfg, layout);
        const std::vector<float> p0 = random_buffer(layout, 1, false);
        std::vector<float> p_whole = p0;
        std::vector<std::vector<float>> p_shard(M, p_whole);
        std::vector<Optimizer> parts;
        const std::vector<ZeroShard> shards = zero_shards(layout, M);
        for (int r = 0; r < M; ++r) {
          parts.emplace_back(cfg, layout, shards[r]);
          EXPECT_EQ(parts.back().m().size(), shards[r].size());  // 1/M of the state, not the whole
          EXPECT_EQ(parts.back().v().size(), shards[r].size());
        }
        for (int t = 1; t <= 3; ++t) {
          const std::vector<float> g = random_buffer(layout, 10 + t, true);
          whole.step(p_whole.data(), g.data(), 1e-2 * t);
          for (int r = 0; r < M; ++r) parts[r].step(p_shard[r].data(), g.data(), 1e-2 * t);
        }
        for (int r = 0; r < M; ++r) {
          const ZeroShard& z = shards[r];
          const std::string what = std::string(router) + " " + name + " M=" + std::to_string(M) + " rank " + std::to_string(r);
          // An optimizer without a moment holds empty (null) buffers: memcmp may not see them.
          auto same = [&](const float* a, const float* b) {
            return z.size() == 0 || std::memcmp(a, b, z.size() * sizeof(float)) == 0;
          };
          EXPECT_TRUE(same(p_shard[r].data() + z.lo, p_whole.data() + z.lo)) << what;
          if (!whole.m().empty()) {
            EXPECT_TRUE(same(parts[r].m().data(), whole.m().data() + z.lo)) << what;
          }
          if (!whole.v().empty()) {
            EXPECT_TRUE(same(parts[r].v().data(), whole.v().data() + z.lo)) << what;
          }
          // Outside its shard a rank leaves the parameters alone (the all-gather brings them).
          for (size_t i = 0; i < layout.total(); ++i)
            if (!z.contains(i) && p_shard[r][i] != p0[i]) {
              ADD_FAILURE() << what << ": element " << i << " outside the shard changed";
              break;
            }
        }
      }
}

}  // namespace
}  // namespace atl
