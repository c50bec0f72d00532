// The [model] section: the shape of the MoE transformer (DESIGN.md "The model"). It belongs to
// model/ because the model is what reads it; config/ declares its keys for TOML and --set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atl {

// Dimension legend (used throughout atoll): B batch, T sequence, C model width, L layers,
// NH query heads, NKV key/value heads, HD head dim, E experts, K experts per token,
// H expert hidden width, V vocabulary, N = B*T tokens.
struct ModelConfig {
  int vocab_size = 4096;       // V
  int dim = 128;               // C
  int n_layers = 4;            // L
  int n_heads = 2;             // NH
  int n_kv_heads = 2;          // NKV, divides NH (grouped-query attention)
  int head_dim = 64;           // HD
  int n_experts = 4;           // E (a dense model is E=1, K=1)
  int top_k = 2;               // K
  int expert_hidden = 256;     // H
  int seq_len = 256;           // T
  double rope_theta = 10000.0;
  // Per-layer RoPE base, as transformers' zaya config gives one per layer type: "global" layers
  // rotate with rope_theta, "local" ones with rope_theta_local; the list repeats over the layers
  // (empty: every layer global).
  std::vector<std::string> rope_layers;
  double rope_theta_local = 10000.0;
  // The fraction of each head that RoPE rotates (Hugging Face's partial_rotary_factor; 1 = all).
  double partial_rotary_factor = 1.0;
  // CCA's two causal convolutions over [q|k]: depthwise kernel cca_time0, grouped (one group
  // per head) kernel cca_time1 (model/attention_cca.h).
  int cca_time0 = 2, cca_time1 = 2;
  double norm_eps = 1e-6;
  double aux_loss_coef = 0.01;  // Switch load-balancing loss coefficient (per layer)
  double z_loss_coef = 0.0;     // router z-loss coefficient
  bool tie_embeddings = false;  // LM head shares the embedding table
  double init_std = 0.02;
  int64_t init_seed = 1234;
  // The block's part kinds (model/block.cc): "gqa" grouped-query causal attention with RoPE,
  // "cca" compressed convolutional attention (ZAYA1's); "topk" Mixtral's top-k softmax router
  // with renormalised weights.
  std::string attention = "gqa";
  std::string router = "topk";
  // Per-layer choices, repeated over the layers (["gqa", "cca"] would alternate two kinds, as
  // gemma.cpp repeats its attention pattern); empty: every layer takes `attention` / `router`.
  std::vector<std::string> attention_layers, router_layers;
  // RMSNorm of q and k in gqa attention, after their projections and before RoPE (gain per entry,
  // epsilon norm_eps): "none"; "head" normalises each head's HD entries with one gain [HD] for
  // every head (Qwen3-MoE's q_norm / k_norm); "proj" normalises the whole projection, q over QD
  // entries and k over KVD, before it is split into heads (OLMoE's).
  std::string qk_norm = "none";
  // The topk router's weights: the chosen experts' probabilities renormalised to sum to 1
  // (Mixtral; transformers' norm_topk_prob = true), or, false, the softmax probabilities as they
  // are (norm_topk_prob = false: OLMoE, Qwen2-MoE).
  bool router_renormalize = true;
  // Biases on gqa attention's q, k and v projections (Qwen2-MoE's q_proj/k_proj/v_proj; o_proj
  // has none), added before the q/k norm and RoPE.
  bool qkv_bias = false;
  // HS: the width of a shared SwiGLU expert beside the routed ones, which every token passes
  // through, scaled by a sigmoid gate of its own (Qwen2-MoE's shared_expert and
  // shared_expert_gate): out = routed + sigmoid(h·w_gate) * shared(h). 0: none.
  int shared_expert_hidden = 0;

  // RD: the rotated entries of each head, int(HD * partial_rotary_factor) as transformers has it.
  int rotary_dim() const { return int(double(head_dim) * partial_rotary_factor); }
  // ZAYA1's residual scaling (model/norm_residual.h ResidualMerge): a learned per-channel scale
  // and bias on the stream and on each sub-layer's output where they join, and on the
  // embedding's output. Off: the plain residual add.
  bool residual_scaling = false;
  // ZAYA1's router (router = "zaya", model/router_zaya.h): R, the width of its MLP, and the
  // initial balancing bias of its skip class (-1 as transformers initialises it; a bias of -1e4
  // never lets a token skip: no mixture of depths).
  int router_hidden_size = 256;
  double router_skip_bias = -1.0;

  const std::string& attention_at(int layer) const {
    return attention_layers.empty() ? attention : attention_layers[size_t(layer) % attention_layers.size()];
  }
  const std::string& router_at(int layer) const {
    return router_layers.empty() ? router : router_layers[size_t(layer) % router_layers.size()];
  }
  bool rope_local_at(int layer) const {
    return !rope_layers.empty() && rope_layers[size_t(layer) % rope_layers.size()] == "local";
  }
  double rope_theta_at(int layer) const { return rope_local_at(layer) ? rope_theta_local : rope_theta; }
  bool any_rope_local() const {
    for (int l = 0; l < n_layers; ++l)
      if (rope_local_at(l)) return true;
    return false;
  }
};

}  // namespace atl
