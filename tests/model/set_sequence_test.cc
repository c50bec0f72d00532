// Model::set_sequence (context extension): a model switched to a longer sequence, another RoPE
// base and another batch computes, bit for bit, what a model built with those settings computes
// from the same parameters (losses and gradients), for GQA and CCA; the parameters are kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/model/model.h"

namespace atl {
namespace {

ModelConfig config(const std::string& attention) {
  ModelConfig m;
  m.vocab_size = 50, m.dim = 16, m.n_layers = 2, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 8;
  m.n_experts = 3, m.top_k = 2, m.expert_hidden = 12, m.seq_len = 7, m.attention = attention;
  return m;
}

// Inputs and targets of B sequences of T tokens, drawn from one stream.
std::pair<std::vector<int32_t>, std::vector<int32_t>> batch(int B, int T, Rng& rng) {
  std::vector<int32_t> x(size_t(B) * T), y(x.size());
  std::generate(x.begin(), x.end(), [&] { return int32_t(rng.below(50)); });
  std::generate(y.begin(), y.end(), [&] { return int32_t(rng.below(50)); });
  return {x, y};
}

TEST(SetSequence, EqualsAModelBuiltAtTheNewLength) {
  for (const std::string attention : {"gqa", "cca"}) {
    ModelConfig longer = config(attention);
    longer.seq_len = 13, longer.rope_theta = 40000;  // odd lengths: no multiple of a vector width
    const int B = 3;
    Model<float> switched(config(attention), 2), built(longer, B);
    switched.init_params(5);
    built.params() = switched.params();
    // A step at the first length leaves nothing behind that the new length would read.
    Rng rng(11);
    const auto [x0, y0] = batch(2, 7, rng);
    switched.forward_backward(x0.data(), y0.data(), 2);
    switched.set_sequence(longer.seq_len, longer.rope_theta, B);
    EXPECT_EQ(switched.config().seq_len, 13);
    EXPECT_EQ(switched.config().rope_theta, 40000);
    EXPECT_EQ(switched.params(), built.params()) << "the parameters are kept";

    const auto [x, y] = batch(B, 13, rng);
    switched.zero_grads(), built.zero_grads();
    const LossParts a = switched.forward_backward(x.data(), y.data(), B), b = built.forward_backward(x.data(), y.data(), B);
    EXPECT_EQ(a.ce, b.ce) << attention;
    EXPECT_EQ(a.aux, b.aux) << attention;
    EXPECT_EQ(switched.grads(), built.grads()) << attention;
    // Another RoPE base alone changes the loss: the tables were rebuilt, not kept.
    switched.set_sequence(13, 10000, B);
    EXPECT_NE(switched.forward(x.data(), y.data(), B).ce, a.ce) << attention;
  }
}

}  // namespace
}  // namespace atl
