// Each block part's backward against central differences of its forward, in double, with the
// loss = sum(out * random_dout) trick; gradients are accumulated onto non-zero starting values
// (checking += rather than =). Then a whole block's decode steps against its training forward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/model/attention_cca.h"
#include "atoll/model/attention_gqa.h"
#include "atoll/model/block.h"
#include "atoll/model/experts_swiglu.h"
#include "atoll/model/norm_residual.h"
#include "atoll/model/router_topk.h"
#include "atoll/model/router_zaya.h"

namespace atl {
namespace {

ModelConfig micro_config() {
  ModelConfig m;
  m.vocab_size = 11;
  m.dim = 8;
  m.n_layers = 1;
  m.n_heads = 4;
  m.n_kv_heads = 2;  // grouped-query on purpose
  m.head_dim = 4;
  m.n_experts = 4;
  m.top_k = 2;
  m.expert_hidden = 6;
  m.seq_len = 5;
  m.aux_loss_coef = 0.05;
  m.z_loss_coef = 0.01;
  return m;
}

// micro_config with CCA attention: kernels 3 and 2 (padding 3 of a 5-token sequence) and
// partial rotary (2 of each head's 4 entries).
ModelConfig cca_config() {
  ModelConfig m = micro_config();
  m.attention = "cca";
  m.cca_time0 = 3;
  m.cca_time1 = 2;
  m.partial_rotary_factor = 0.5;
  return m;
}

std::vector<double> randn(size_t n, Rng& rng, double scale = 1.0) {
  std::vector<double> v(n);
  for (double& x : v) x = scale * rng.normal();
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// One part's world: the layout of micro_config, random parameters (norm gains near 1),
// gradients starting at random values, and a context for B sequences.
struct Harness {
  static constexpr int B = 2;
  explicit Harness(const ModelConfig& cfg = micro_config()) : m(cfg) { init(); }
  ModelConfig m;
  ParamLayout layout = ParamLayout::build(m);
  PartSizes sizes{.max_batch = B, .max_tokens = B * m.seq_len, .precision = Precision::kFp32};
  PartScratch scratch;
  std::vector<double> params, grads, work;
  Rng rng{17};

  void init() {
    params = randn(layout.total(), rng, 0.5);
    for (const ParamEntry& e : layout.entries())
      if (e.init == ParamInit::kOnes)
        for (size_t i = 0; i < e.numel; ++i) params[e.offset + i] = 1.0 + 0.3 * rng.normal();
    grads = randn(layout.total(), rng);
  }
  int N() const { return B * m.seq_len; }
  PartContext<double> ctx(size_t work_elements) {
    work.assign(std::max<size_t>(work_elements, 1), 0.0);
    return {.B = B, .d = block_dims(m, B), .mm = {.params = params.data()}, .grads = grads.data(),
            .work = work.data(), .loss_scale = 1.0, .times = nullptr};
  }
};

// Compares got[i] - start[i] (the accumulated gradient) with central differences of loss()
// over x[i] for up to 16 coordinates. Where two step sizes disagree the step crossed a kink
// (a top-k switch) and the coordinate is skipped; most must be checked.
void check(const char* what, const std::function<double()>& loss, double* x, size_t n, const double* got,
           const double* start = nullptr) {
  Rng pick(5);
  int checked = 0, kinks = 0;
  for (size_t s = 0; s < std::min<size_t>(n, 16); ++s) {
    const size_t i = n <= 16 ? s : pick.below(n);
    auto diff = [&](double h) {
      const double old = x[i];
      x[i] = old + h;
      const double lp = loss();
      x[i] = old - h;
      const double lm = loss();
      x[i] = old;
      return (lp - lm) / (2 * h);
    };
    const double n1 = diff(1e-5), n2 = diff(5e-6);
    if (std::abs(n1 - n2) > 1e-6 * (std::abs(n1) + 1e-3)) {
      ++kinks;
      continue;
    }
    const double g = got[i] - (start ? start[i] : 0.0);
    // Central differences at h=5e-6 in double: truncation ~h² and rounding ~1e-16/h ~ 2e-11.
    EXPECT_NEAR(g, n2, 1e-7 * (1 + std::abs(n2))) << what << "[" << i << "]";
    ++checked;
  }
  EXPECT_GT(checked, kinks) << what;
}

// The gradient of every row of `layer` whose name contains `part`.
void check_rows(Harness& t, const char* part, const std::vector<double>& start, const std::function<double()>& loss) {
  for (const ParamEntry& e : t.layout.entries())
    if (e.layer == 0 && e.name.find(part) != std::string::npos)
      check(e.name.c_str(), loss, t.params.data() + e.offset, e.numel, t.grads.data() + e.offset,
            start.data() + e.offset);
}

TEST(PartsGrad, RmsNorm) {
  Harness t;
  const int NC = t.N() * t.m.dim;
  RmsNormPart<double> norm(t.m, t.layout, "layers.0.attn_norm", t.sizes);
  std::vector<double> x = randn(NC, t.rng), dout = randn(NC, t.rng), out(NC), dx = randn(NC, t.rng);
  const auto dx0 = dx, g0 = t.grads;
  auto c = t.ctx(0);
  auto loss = [&] {
    norm.forward(out.data(), x.data(), c);
    return dot(out, dout);
  };
  loss();
  norm.backward(dx.data(), dout.data(), x.data(), c);
  check("dx", loss, x.data(), NC, dx.data(), dx0.data());
  check_rows(t, "attn_norm", g0, loss);
}

// An attention part's backward (dh and every "attn." row) and recompute_output.
void check_attention(Harness& t, AttentionPart<double>& attn) {
  const int NC = t.N() * t.m.dim;
  std::vector<double> h = randn(NC, t.rng), dout = randn(NC, t.rng), out(NC), dh = randn(NC, t.rng);
  const auto dh0 = dh, g0 = t.grads;
  auto c = t.ctx(attn.work_elements());
  auto loss = [&] {
    attn.forward(out.data(), h.data(), c);
    return dot(out, dout);
  };
  loss();
  std::vector<double> again(NC);
  attn.recompute_output(again.data(), c);
  EXPECT_EQ(again, out) << "recompute_output must give forward's output bit for bit";
  attn.backward(dh.data(), dout.data(), h.data(), c);
  check("dh", loss, h.data(), NC, dh.data(), dh0.data());
  check_rows(t, "attn.", g0, loss);
}

TEST(PartsGrad, AttentionGqa) {
  Harness t;
  AttentionGqa<double> attn(t.m, t.layout, 0, t.sizes, t.scratch);
  check_attention(t, attn);
}

// q/k RMSNorm before RoPE, per head (Qwen3-MoE) and over the whole projection (OLMoE): dh, wq..wo
// and both gains.
TEST(PartsGrad, AttentionGqaQkNorm) {
  for (const char* kind : {"head", "proj"}) {
    SCOPED_TRACE(kind);
    ModelConfig m = micro_config();
    m.qk_norm = kind;
    Harness t(m);
    const int64_t want = std::string(kind) == "head" ? m.head_dim : int64_t(m.n_kv_heads) * m.head_dim;
    EXPECT_EQ(t.layout.at("layers.0.attn.k_norm").numel, size_t(want));
    AttentionGqa<double> attn(t.m, t.layout, 0, t.sizes, t.scratch);
    check_attention(t, attn);
  }
}

// Biases on q, k and v (Qwen2-MoE's), alone and before a q/k norm: dh, the weights and the biases.
TEST(PartsGrad, AttentionGqaQkvBias) {
  for (const char* norm : {"none", "head"}) {
    SCOPED_TRACE(norm);
    ModelConfig m = micro_config();
    m.qkv_bias = true, m.qk_norm = norm;
    Harness t(m);
    EXPECT_EQ(t.layout.at("layers.0.attn.bq").numel, size_t(m.n_heads * m.head_dim));
    EXPECT_EQ(t.layout.at("layers.0.attn.bk").numel, size_t(m.n_kv_heads * m.head_dim));
    AttentionGqa<double> attn(t.m, t.layout, 0, t.sizes, t.scratch);
    check_attention(t, attn);
  }
}

TEST(PartsGrad, AttentionCca) {
  Harness t(cca_config());
  AttentionCca<double> attn(t.m, t.layout, 0, t.sizes, t.scratch);
  check_attention(t, attn);
}

// The part computes layers/cca.h's reference layer (same rows, same function).
TEST(PartsGrad, AttentionCcaMatchesReference) {
  Harness t(cca_config());
  const int NC = t.N() * t.m.dim;
  AttentionCca<double> attn(t.m, t.layout, 0, t.sizes, t.scratch);
  std::vector<double> h = randn(NC, t.rng), out(NC), ref(NC);
  auto c = t.ctx(attn.work_elements());
  attn.forward(out.data(), h.data(), c);
  const std::string q = "layers.0.attn.qkv_proj.";
  auto p = [&](const std::string& name) { return t.params.data() + t.layout.at(name).offset; };
  const CcaWeights<double> w{p(q + "q_proj.weight"), p(q + "k_proj.weight"), p(q + "v_proj_current.weight"),
                             p(q + "v_proj_delayed.weight"), p(q + "conv_qk_depthwise.weight"),
                             p(q + "conv_qk_depthwise.bias"), p(q + "conv_qk_grouped.weight"),
                             p(q + "conv_qk_grouped.bias"), p("layers.0.attn.qk_norm.temp"),
                             p("layers.0.attn.o_proj.weight")};
  cca_forward(ref.data(), h.data(), w, RopeTable<double>::build(t.m.seq_len, t.m.head_dim, t.m.rope_theta, 2),
              cca_dims(t.m, Harness::B, t.m.seq_len));
  for (int i = 0; i < NC; ++i) EXPECT_NEAR(out[i], ref[i], 1e-12) << i;
}

TEST(PartsGrad, RouterTopk) {
  Harness t;
  const int N = t.N(), NC = N * t.m.dim, NK = N * t.m.top_k;
  RouterTopk<double> router(t.m, t.layout, 0, t.sizes, t.scratch);
  std::vector<double> h = randn(NC, t.rng), dw = randn(NK, t.rng), dh = randn(NC, t.rng);
  const auto dh0 = dh, g0 = t.grads;
  auto c = t.ctx(router.work_elements());
  auto loss = [&] {  // sum(topk_w * dw) + aux + z
    const RouterLosses r = router.forward(h.data(), c);
    double s = r.aux + r.z;
    for (int i = 0; i < NK; ++i) s += router.topk_w()[i] * dw[i];
    return s;
  };
  loss();
  router.backward(dh.data(), dw.data(), h.data(), c);
  check("dh", loss, h.data(), NC, dh.data(), dh0.data());
  check_rows(t, "moe.router", g0, loss);
}

// The chosen probabilities as they are (transformers' norm_topk_prob = false): the weights are the
// softmax's, and their gradient flows to every logit.
TEST(PartsGrad, RouterTopkWithoutRenormalising) {
  ModelConfig m = micro_config();
  m.router_renormalize = false;
  Harness t(m);
  const int N = t.N(), NC = N * t.m.dim, NK = N * t.m.top_k;
  RouterTopk<double> router(t.m, t.layout, 0, t.sizes, t.scratch);
  std::vector<double> h = randn(NC, t.rng), dw = randn(NK, t.rng), dh = randn(NC, t.rng);
  const auto dh0 = dh, g0 = t.grads;
  auto c = t.ctx(router.work_elements());
  auto loss = [&] {
    const RouterLosses r = router.forward(h.data(), c);
    double s = r.aux + r.z;
    for (int i = 0; i < NK; ++i) s += router.topk_w()[i] * dw[i];
    return s;
  };
  loss();
  double sum = 0;
  for (int j = 0; j < t.m.top_k; ++j) sum += router.topk_w()[j];
  EXPECT_LT(sum, 1.0 - 1e-6) << "the weights of 2 of 4 experts are renormalised";
  router.backward(dh.data(), dw.data(), h.data(), c);
  check("dh", loss, h.data(), NC, dh.data(), dh0.data());
  check_rows(t, "moe.router", g0, loss);
}

// The experts part's backward: dh, d(combine weights) and the rows whose names hold any of `rows`.
// Each token's K distinct experts, and free combine weights (the router's choice is an input
// here). With a shared expert, the output with every combine weight zero is the gated shared MLP
// alone, which must not be zero.
void check_experts(Harness& t, const std::vector<const char*>& rows) {
  const int N = t.N(), NC = N * t.m.dim, K = t.m.top_k, NK = N * K;
  ExpertsSwiglu<double> experts(t.m, t.layout, 0, t.sizes, t.scratch);
  std::vector<int32_t> idx(NK);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < K; ++j) idx[n * K + j] = int32_t((n + 3 * j) % t.m.n_experts);
  std::vector<double> w = randn(NK, t.rng), h = randn(NC, t.rng), dout = randn(NC, t.rng), out(NC), dh = randn(NC, t.rng);
  std::vector<double> dw(NK, 0.0);
  const auto dh0 = dh, g0 = t.grads;
  auto c = t.ctx(experts.work_elements());
  if (t.m.shared_expert_hidden > 0) {
    std::vector<double> zero(NK, 0.0), alone(NC);
    experts.forward(alone.data(), h.data(), idx.data(), zero.data(), c);
    EXPECT_GT(dot(alone, alone), 1e-6) << "the shared expert adds nothing";
  }
  auto loss = [&] {
    experts.forward(out.data(), h.data(), idx.data(), w.data(), c);
    return dot(out, dout);
  };
  loss();
  experts.backward(dh.data(), dw.data(), dout.data(), h.data(), w.data(), c);
  check("dh", loss, h.data(), NC, dh.data(), dh0.data());
  check("dtopk_w", loss, w.data(), NK, dw.data());
  for (const char* r : rows) check_rows(t, r, g0, loss);
}

TEST(PartsGrad, ExpertsSwiglu) {
  Harness t;
  check_experts(t, {"moe.w"});
}

// A shared expert with its sigmoid gate beside the routed ones (Qwen2-MoE's): the routed experts'
// rows and the shared expert's (w1, w3, w2 and the gate). The shared width 7 differs from the
// experts' 6 and from C.
TEST(PartsGrad, ExpertsSwigluSharedExpert) {
  ModelConfig m = micro_config();
  m.shared_expert_hidden = 7;
  Harness t(m);
  ASSERT_EQ(t.layout.at("layers.0.moe.shared_w2").numel, size_t(m.dim * 7));
  ASSERT_EQ(t.layout.at("layers.0.moe.shared_gate").numel, size_t(m.dim));
  check_experts(t, {"moe.w", "moe.shared_"});
}

// ZAYA1's residual scaling: out = (a + a_bias) ⊙ a_scale + (r + r_bias) ⊙ r_scale, and after the
// embedding (no stream) out = (a + a_bias) ⊙ a_scale; scales and biases moved off the identity.
// At T = 75 the 150 tokens span three of backward's 64-row chunks, the last one partial.
TEST(PartsGrad, ResidualMerge) {
  for (int T : {micro_config().seq_len, 75})
  for (bool stream : {true, false}) {
    SCOPED_TRACE(std::string(stream ? "with a stream" : "after the embedding") + ", T " + std::to_string(T));
    ModelConfig cfg = micro_config();
    cfg.seq_len = T;
    Harness t(cfg);
    t.m.residual_scaling = true;
    t.layout = ParamLayout::build(t.m);
    t.params = randn(t.layout.total(), t.rng, 0.5), t.grads = randn(t.layout.total(), t.rng);
    const std::string name = stream ? "layers.0.attn_merge" : "input";
    const int NC = t.N() * t.m.dim;
    ResidualMerge<double> merge(t.m, t.layout, name, stream, t.sizes);
    ASSERT_TRUE(merge.scaled());
    std::vector<double> a = randn(NC, t.rng), r = randn(NC, t.rng), dout = randn(NC, t.rng), out(NC);
    std::vector<double> da(NC), dr(dout);
    const auto g0 = t.grads;
    auto c = t.ctx(0);
    auto loss = [&] {
      merge.forward(out.data(), a.data(), stream ? r.data() : nullptr, c);
      return dot(out, dout);
    };
    loss();
    const double* got = merge.backward(da.data(), dr.data(), stream ? r.data() : nullptr, c);
    EXPECT_EQ(got, da.data());
    check("da", loss, a.data(), NC, da.data());
    if (stream) check("dr", loss, r.data(), NC, dr.data());
    for (const ParamEntry& e : t.layout.entries())
      if (e.name.rfind(name, 0) == 0)
        check(e.name.c_str(), loss, t.params.data() + e.offset, e.numel, t.grads.data() + e.offset,
              g0.data() + e.offset);
  }
}

// Without residual scaling the merge is the residual add and its backward hands d(out) through.
TEST(PartsGrad, ResidualMergePlainIsTheAdd) {
  Harness t;
  const int NC = t.N() * t.m.dim;
  ResidualMerge<double> merge(t.m, t.layout, "layers.0.attn_merge", true, t.sizes);
  EXPECT_FALSE(merge.scaled());
  EXPECT_EQ(t.layout.find("layers.0.attn_merge.out_scale"), nullptr);
  std::vector<double> a = randn(NC, t.rng), r = randn(NC, t.rng), out(NC), dx = randn(NC, t.rng), da(NC);
  auto c = t.ctx(0);
  merge.forward(out.data(), a.data(), r.data(), c);
  for (int i = 0; i < NC; ++i) EXPECT_EQ(out[i], a[i] + r[i]);
  EXPECT_EQ(merge.backward(da.data(), dx.data(), r.data(), c), dx.data());
}

// Two zaya routers in a chain (layers 0 and 1; layer 1 averages over depth with layer 0's state):
// the loss sums both layers' gates against random weights, and the backward runs layer 1 then
// layer 0, as the blocks do. The gradient of layer 0's rows and input includes what flows back
// through layer 1's depth averaging. The argmax over the biased probabilities is a kink: the
// balancing biases are set so every token's best class leads the runner-up by a margin (checked)
// far above what the finite-difference steps move the probabilities, so no step crosses a switch
// (check() would skip a coordinate that did). The skip class gets a bias that lets some tokens
// skip, so the skipped slots' zero gradient is checked too.
TEST(PartsGrad, RouterZayaDepthChain) {
  Harness t;
  t.m.n_layers = 2, t.m.router = "zaya", t.m.router_hidden_size = 6, t.m.top_k = 1, t.m.router_skip_bias = 0.1;
  t.layout = ParamLayout::build(t.m);
  t.params = randn(t.layout.total(), t.rng, 0.5), t.grads = randn(t.layout.total(), t.rng);
  const int N = t.N(), NC = N * t.m.dim, E1 = t.m.n_experts + 1;
  ASSERT_EQ(t.layout.find("layers.0.moe.gate.depth_scale"), nullptr) << "layer 0 has no depth averaging";
  ASSERT_NE(t.layout.find("layers.1.moe.gate.depth_scale"), nullptr);
  for (int l = 0; l < 2; ++l) {
    const ParamEntry& b = t.layout.at(layer_prefix(l) + "moe.gate.balancing_biases");
    EXPECT_FALSE(b.trainable);
    EXPECT_TRUE(b.balanced);
    ASSERT_EQ(b.numel, size_t(E1));
    const double biases[] = {0.0, 0.3, -0.3, 0.15, 0.1};  // distinct: no ties between classes
    for (int e = 0; e < E1; ++e) t.params[b.offset + e] = biases[e];
  }
  RouterZaya<double> r0(t.m, t.layout, 0, t.sizes, t.scratch), r1(t.m, t.layout, 1, t.sizes, t.scratch);
  r1.link_previous(r0);
  std::vector<double> h0 = randn(NC, t.rng), h1 = randn(NC, t.rng), dw0 = randn(N, t.rng), dw1 = randn(N, t.rng);
  std::vector<double> dh0 = randn(NC, t.rng), dh1 = randn(NC, t.rng);
  const auto dh00 = dh0, dh10 = dh1, g0 = t.grads;
  auto c = t.ctx(0);
  auto loss = [&] {
    r0.forward(h0.data(), c);
    r1.forward(h1.data(), c);
    double s = 0;
    for (int n = 0; n < N; ++n) s += r0.topk_w()[n] * dw0[n] + r1.topk_w()[n] * dw1[n];
    return s;
  };
  loss();
  // Away from ties: the chosen class's biased probability leads every other by at least 1e-3,
  // while a step of 1e-5 moves a probability by far less.
  int skipped = 0;
  for (int l = 0; l < 2; ++l) {
    const RouterZaya<double>& r = l == 0 ? r0 : r1;
    const double* b = t.params.data() + t.layout.at(layer_prefix(l) + "moe.gate.balancing_biases").offset;
    for (int n = 0; n < N; ++n) {
      const int best = r.choice()[n];
      skipped += best == E1 - 1;
      for (int e = 0; e < E1; ++e) {
        if (e == best) continue;
        EXPECT_GT(r.probs()[n * E1 + best] + b[best] - r.probs()[n * E1 + e] - b[e], 1e-3);
      }
    }
  }
  EXPECT_GT(skipped, 0) << "no token took the skip class";
  EXPECT_LT(skipped, N) << "too few tokens reach the experts";
  const std::vector<double> g_loads = t.grads;
  r1.backward(dh1.data(), dw1.data(), h1.data(), c);
  r0.backward(dh0.data(), dw0.data(), h0.data(), c);
  check("dh0", loss, h0.data(), NC, dh0.data(), dh00.data());
  check("dh1", loss, h1.data(), NC, dh1.data(), dh10.data());
  for (const ParamEntry& e : t.layout.entries())
    if (e.name.find("moe.gate.") != std::string::npos && e.trainable)
      check(e.name.c_str(), loss, t.params.data() + e.offset, e.numel, t.grads.data() + e.offset,
            g0.data() + e.offset);
  // The loads in the biases' gradient slots: each layer's class shares, summing to 1.
  for (int l = 0; l < 2; ++l) {
    const ParamEntry& b = t.layout.at(layer_prefix(l) + "moe.gate.balancing_biases");
    double sum = 0;
    for (int e = 0; e < E1; ++e) sum += t.grads[b.offset + e] - g0[b.offset + e];
    EXPECT_NEAR(sum, 1.0, 1e-12) << "layer " << l;
  }
}

// Decoding a sequence token by token through a block's parts gives the block's training
// forward at every position (double: only the summation order differs). The sequence is
// decoded twice: position 0 starts afresh (CCA's convolution window and delayed value).
void check_block_decode(const ModelConfig& m) {
  Harness t(m);
  const int T_ = t.m.seq_len, C = t.m.dim;
  BlockBuffers<double> buf(t.m, t.sizes.max_tokens);
  Block<double> block(t.m, t.layout, 0, t.sizes, t.scratch, buf);
  std::vector<double> x = randn(size_t(t.N()) * C, t.rng), next(x.size());
  auto c = t.ctx(block.work_elements());
  c.B = 1, c.d = block_dims(t.m, 1);
  block.forward(next.data(), x.data(), c);  // the first sequence

  PartSizes one{.max_batch = 1, .max_tokens = 1, .precision = Precision::kFp32};
  PartScratch scratch;
  BlockBuffers<double> buf1(t.m, 1);
  Block<double> dec(t.m, t.layout, 0, one, scratch, buf1);
  dec.start_decode(T_, T_);
  std::vector<double> work(dec.work_elements());
  PartContext<double> c1 = c;
  c1.d.T = 1, c1.d.N = 1, c1.work = work.data();
  for (int round = 0; round < 2; ++round)
    for (int pos = 0; pos < T_; ++pos) {
      std::vector<double> tok(x.begin() + pos * C, x.begin() + (pos + 1) * C);
      dec.decode(tok.data(), pos, c1);
      for (int i = 0; i < C; ++i)
        EXPECT_NEAR(tok[i], next[pos * C + i], 1e-12) << "round " << round << " position " << pos << ", " << i;
    }
}

TEST(PartsDecode, BlockDecodeMatchesForward) { check_block_decode(micro_config()); }
TEST(PartsDecode, CcaBlockDecodeMatchesForward) { check_block_decode(cca_config()); }
TEST(PartsDecode, QkNormBlockDecodeMatchesForward) {
  for (const char* kind : {"head", "proj"}) {
    ModelConfig m = micro_config();
    m.qk_norm = kind, m.router_renormalize = false;
    check_block_decode(m);
  }
}
TEST(PartsDecode, Qwen2MoeBlockDecodeMatchesForward) {
  ModelConfig m = micro_config();
  m.qkv_bias = true, m.shared_expert_hidden = 5, m.router_renormalize = false;
  check_block_decode(m);
}
TEST(PartsDecode, CcaWithUnitKernelsDecodeMatchesForward) {
  ModelConfig m = cca_config();
  m.cca_time0 = m.cca_time1 = 1;
  m.n_kv_heads = 1;
  check_block_decode(m);
}

}  // namespace
}  // namespace atl
