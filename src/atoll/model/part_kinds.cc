#include "atoll/model/part_kinds.h"

#include <algorithm>

#include "atoll/core/errors.h"
#include "atoll/model/attention_cca.h"
#include "atoll/model/attention_gqa.h"
#include "atoll/model/router_topk.h"
#include "atoll/model/router_zaya.h"

namespace atl {
namespace {

constexpr double kF32 = 4, kBf16 = 2, kI32 = 4;

template <template <typename> class Part, template <typename> class Impl, typename T>
std::unique_ptr<Part<T>> make(const ModelConfig& m, const ParamLayout& layout, int layer, const PartSizes& s,
                              PartScratch& scratch) {
  return std::make_unique<Impl<T>>(m, layout, layer, s, scratch);
}

std::string no_objection(const ModelConfig&, int) { return {}; }
double none(const ModelConfig&, CostShape) { return 0; }
KvCacheBytes no_cache(const ModelConfig&) { return {}; }
int no_boundary(const ModelConfig&) { return 0; }

double qd(const ModelConfig& m) { return double(m.n_heads) * m.head_dim; }
double kvd(const ModelConfig& m) { return double(m.n_kv_heads) * m.head_dim; }

// Grouped-query attention (model/attention_gqa.h). Multiply-adds per token: the four
// projections, and the scores and weighted values over the sequence (T·QD each, counted over
// the whole T as the usual 6·N + 12·L·T·d formula does).
double gqa_macs(const ModelConfig& m) {
  return 2 * double(m.dim) * qd(m) + 2 * double(m.dim) * kvd(m) + 2 * double(m.seq_len) * qd(m);
}
// Kept: each row's log-sum-exp per head (fp32), q, k, v and the output (bf16 under bf16 products).
double gqa_kept(const ModelConfig& m, CostShape s) {
  const double N = s.B * s.T;
  return kF32 * N * m.n_heads + (s.bf16 ? kBf16 : kF32) * N * (2 * qd(m) + 2 * kvd(m));
}
double gqa_work(const ModelConfig& m, CostShape s) { return kF32 * s.B * s.T * (2 * qd(m) + 2 * kvd(m)); }
// With model.qk_norm: q and k before their norm and one 1/rms per normed row kept, and dk before
// it in work.
double gqa_part_kept(const ModelConfig& m, CostShape s) {
  if (m.qk_norm == "none") return gqa_kept(m, s);
  const double N = s.B * s.T, rows = m.qk_norm == "head" ? m.n_heads + m.n_kv_heads : 2;
  return gqa_kept(m, s) + kF32 * N * (qd(m) + kvd(m) + rows);
}
double gqa_part_work(const ModelConfig& m, CostShape s) {
  return gqa_work(m, s) + (m.qk_norm == "none" ? 0 : kF32 * s.B * s.T * kvd(m));
}
KvCacheBytes gqa_cache(const ModelConfig& m) { return {2 * kvd(m) * kF32, 0}; }

// CCA (model/attention_cca.h): GQA's projections and attention plus its two convolutions over
// [q|k] (CC = QD + KVD columns, kernels t0 depthwise and HD·t1 grouped).
double cca_macs(const ModelConfig& m) {
  return gqa_macs(m) + (qd(m) + kvd(m)) * (m.cca_time0 + double(m.head_dim) * m.cca_time1);
}
// The convolutions' rows per sequence (model/attention_cca.h): its T tokens and, for up to two
// chunks of context parallelism, the chunk before's lag = t0-1 + t1-1 rows each; y holds t1-1
// more per chunk.
double cca_x_rows(const ModelConfig& m, CostShape s) { return s.B * (s.T + 2.0 * (m.cca_time0 - 1 + m.cca_time1 - 1)); }
double cca_y_rows(const ModelConfig& m, CostShape s) { return cca_x_rows(m, s) + s.B * 2.0 * (m.cca_time1 - 1); }
// Kept beyond GQA's: [q|k] before and after the depthwise convolution (x and y rows), q and k
// before their norm, and the norms' inverses.
double cca_kept(const ModelConfig& m, CostShape s) {
  const double N = s.B * s.T, CC = qd(m) + kvd(m);
  return gqa_kept(m, s) + kF32 * ((cca_x_rows(m, s) + cca_y_rows(m, s)) * CC + N * CC + N * (m.n_heads + m.n_kv_heads));
}
double cca_work(const ModelConfig& m, CostShape s) {
  const double N = s.B * s.T, CC = qd(m) + kvd(m);
  return kF32 * (N * (3 * qd(m) + 4 * kvd(m)) + (2 * cca_x_rows(m, s) + cca_y_rows(m, s)) * CC);
}
// Beyond GQA's keys and values: the last t0-1 + t1-1 pre-convolution [q|k] rows and the
// previous token's delayed value half.
KvCacheBytes cca_cache(const ModelConfig& m) {
  const double CC = qd(m) + kvd(m);
  return {2 * kvd(m) * kF32, ((m.cca_time0 - 1 + m.cca_time1 - 1) * CC + kvd(m) / 2) * kF32};
}
// The convolutions reach t0-1 + t1-1 tokens back, the value shift one.
int cca_boundary(const ModelConfig& m) { return std::max(m.cca_time0 - 1 + m.cca_time1 - 1, 1); }

// The softmax top-k router (model/router_topk.h): one [E,C] product; keeps probabilities [N,E],
// log-sum-exps [N], the choice's weights and ids [N,K].
double topk_macs(const ModelConfig& m) { return double(m.dim) * m.n_experts; }
double topk_kept(const ModelConfig& m, CostShape s) {
  const double N = s.B * s.T, R = N * m.top_k;
  return kF32 * (N * m.n_experts + N + R) + kI32 * R;
}

// ZAYA1's router (model/router_zaya.h): its down projection to R and MLP over E + 1 classes.
// Keeps what the top-k router keeps and its state, normed state and two MLP pre-activations
// [N,R] and probabilities; the zaya routers share five [N,R] buffers and the logits and their
// gradient [N,E+1].
double zaya_macs(const ModelConfig& m) {
  const double R = m.router_hidden_size;
  return double(m.dim) * R + 2 * R * R + R * (m.n_experts + 1.0);
}
double zaya_kept(const ModelConfig& m, CostShape s) {
  const double N = s.B * s.T;
  return topk_kept(m, s) + kF32 * (4 * N * m.router_hidden_size + N) + kI32 * N * m.top_k;
}
double zaya_shared(const ModelConfig& m, CostShape s) {
  const double N = s.B * s.T;
  return kF32 * (5 * N * m.router_hidden_size + 2 * N * (m.n_experts + 1.0));
}

template <class Kind>
const Kind& find_kind(const std::vector<Kind>& kinds, const std::string& name, int layer, const char* what,
                      const char* keys) {
  for (const Kind& k : kinds)
    if (k.name == name) return k;
  std::string opts;
  for (const Kind& k : kinds) opts += std::string(opts.empty() ? "" : " or ") + "\"" + std::string(k.name) + "\"";
  throw ConfigError("layer " + std::to_string(layer) + "'s " + what + " \"" + name + "\" is not a known " + what +
                    " (" + keys + "); fix: use " + opts);
}

template <class Kind>
std::vector<std::string> names(const std::vector<Kind>& kinds) {
  std::vector<std::string> out;
  for (const Kind& k : kinds) out.emplace_back(k.name);
  return out;
}

}  // namespace

const std::vector<AttentionKind>& attention_kinds() {
  static const std::vector<AttentionKind> kinds = {
      {.name = "gqa",
       .help = "grouped-query causal attention with RoPE",
       .rows = attention_gqa_rows,
       .make_f32 = make<AttentionPart, AttentionGqa, float>,
       .make_f64 = make<AttentionPart, AttentionGqa, double>,
       .gpu = true,
       .validate = no_objection,
       .keys = {"model.qk_norm", "model.qkv_bias"},
       .macs_per_token = gqa_macs,
       .kept_bytes = gqa_part_kept,
       .work_bytes = gqa_part_work,
       .shared_bytes = none,
       .decode_cache = gqa_cache,
       .boundary_tokens = no_boundary},
      {.name = "cca",
       .help = "ZAYA1's compressed convolutional attention",
       .rows = attention_cca_rows,
       .make_f32 = make<AttentionPart, AttentionCca, float>,
       .make_f64 = make<AttentionPart, AttentionCca, double>,
       .gpu = true,
       .validate = no_objection,
       .keys = {"model.cca_time0", "model.cca_time1"},
       .macs_per_token = cca_macs,
       .kept_bytes = cca_kept,
       .work_bytes = cca_work,
       .shared_bytes = none,
       .decode_cache = cca_cache,
       .boundary_tokens = cca_boundary},
  };
  return kinds;
}

const std::vector<RouterKind>& router_kinds() {
  static const std::vector<RouterKind> kinds = {
      {.name = "topk",
       .help = "softmax, renormalised weights",
       .rows = router_topk_rows,
       .make_f32 = make<RouterPart, RouterTopk, float>,
       .make_f64 = make<RouterPart, RouterTopk, double>,
       .gpu = true,
       .validate = no_objection,
       .keys = {},
       .macs_per_token = topk_macs,
       .kept_bytes = topk_kept,
       .work_bytes = none,
       .shared_bytes = none,
       .decode_cache = no_cache,
       .boundary_tokens = no_boundary},
      {.name = "zaya",
       .help = "ZAYA1: MLP router over E+1 classes, the last one skips the experts; balancing biases instead of an auxiliary loss",
       .rows = router_zaya_rows,
       .make_f32 = make<RouterPart, RouterZaya, float>,
       .make_f64 = make<RouterPart, RouterZaya, double>,
       .gpu = true,
       .validate = no_objection,
       .keys = {"model.router_hidden_size", "model.router_skip_bias"},
       .macs_per_token = zaya_macs,
       .kept_bytes = zaya_kept,
       .work_bytes = none,
       .shared_bytes = zaya_shared,
       .decode_cache = no_cache,
       .boundary_tokens = no_boundary},
  };
  return kinds;
}

const AttentionKind& attention_kind_at(const ModelConfig& m, int layer) {
  return find_kind(attention_kinds(), m.attention_at(layer), layer, "attention",
                   "model.attention, model.attention_layers");
}

const RouterKind& router_kind_at(const ModelConfig& m, int layer) {
  return find_kind(router_kinds(), m.router_at(layer), layer, "router", "model.router, model.router_layers");
}

std::vector<std::string> attention_kind_names() { return names(attention_kinds()); }
std::vector<std::string> router_kind_names() { return names(router_kinds()); }

std::string validate_part_kinds(const ModelConfig& m) {
  for (int l = 0; l < m.n_layers; ++l) {
    const AttentionKind& a = attention_kind_at(m, l);
    if (std::string why = a.validate(m, l); !why.empty())
      return "layer " + std::to_string(l) + "'s attention " + std::string(a.name) + ": " + why;
    const RouterKind& r = router_kind_at(m, l);
    if (std::string why = r.validate(m, l); !why.empty())
      return "layer " + std::to_string(l) + "'s router " + std::string(r.name) + ": " + why;
  }
  return {};
}

// A name not in the table reads nothing (the config's validation names it).
bool part_kind_reads(const ModelConfig& m, std::string_view key) {
  auto reads = [&](const auto& kinds, const std::string& name) {
    for (const auto& k : kinds)
      if (k.name == name && std::find(k.keys.begin(), k.keys.end(), key) != k.keys.end()) return true;
    return false;
  };
  for (int l = 0; l < m.n_layers; ++l)
    if (reads(attention_kinds(), m.attention_at(l)) || reads(router_kinds(), m.router_at(l))) return true;
  return false;
}

int boundary_tokens(const ModelConfig& m) {
  int most = 0;
  for (int l = 0; l < m.n_layers; ++l)
    most = std::max({most, attention_kind_at(m, l).boundary_tokens(m), router_kind_at(m, l).boundary_tokens(m)});
  return most;
}

}  // namespace atl
