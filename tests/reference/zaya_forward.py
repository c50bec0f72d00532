#!/usr/bin/env python3
"""An independent numpy forward of Hugging Face transformers' `zaya` model (ZayaForCausalLM).

Transcribed from transformers' src/transformers/models/zaya/modular_zaya.py (merged layout, commit
060988b644b98c9e87b381c6000f29c4ab8477ba) and the modules it inherits (LagunaRotaryEmbedding,
Qwen3MoeRMSNorm, Qwen3MoeExperts, qwen3_5_moe's apply_rotary_pos_emb and eager attention), not from
atoll's code, so a test can check `atoll eval` on an exported model against it. Each function names
the upstream module it transcribes. It computes in float64 (upstream in the checkpoint's dtype).

    zaya_forward.py EXPORT_DIR SHARD SEQ_LEN [MAX_WINDOWS]

reads EXPORT_DIR/config.json and EXPORT_DIR/model.safetensors (F32 or BF16), cuts the llm.c
token shard into windows as `atoll eval` does (window i: tokens [i*T, i*T + T] as inputs and
next-token targets) and prints one JSON object: the mean loss, the token count, the (token, layer)
pairs routed to the skip class and each window's per-position losses.
"""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """name -> float64 array; the header parsed by hand (8-byte length, JSON, raw data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {t['dtype']}; this reference reads F32 and BF16")
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


def linear(x, w, b=None):  # nn.Linear: x @ w.T + b
    y = x @ w.T
    return y if b is None else y + b


def rms_norm(x, w, eps):  # Qwen3MoeRMSNorm
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):  # nn.GELU(): exact, with erf
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def rope_cos_sin(cfg, layer_type, T):
    """LagunaRotaryEmbedding (Gemma3's per-layer-type form): inv_freq = 1 / theta^(arange(0, rd, 2) / rd)
    with rd = int(head_dim * partial_rotary_factor); emb = cat(freqs, freqs)."""
    p = cfg["rope_parameters"][layer_type]
    assert p.get("rope_type", "default") == "default", "this reference implements rope_type default only"
    rd = int(cfg["head_dim"] * p.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (p["rope_theta"] ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rotary(x, cos, sin):  # qwen3_5_moe apply_rotary_pos_emb: the first rd entries rotate, the rest pass
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    return np.concatenate([rot * cos + rotate_half(rot) * sin, rest], axis=-1)


def conv1d(x, w, b, groups):
    """nn.Conv1d, no padding, stride 1: x [C_in, T_in], w [C_out, C_in / groups, k] -> [C_out, T_in - k + 1]."""
    c_out, c_per, k = w.shape
    t_out = x.shape[1] - k + 1
    out_per = c_out // groups
    y = np.zeros((c_out, t_out))
    for g in range(groups):
        xin = x[g * c_per:(g + 1) * c_per]
        for o in range(g * out_per, (g + 1) * out_per):
            for j in range(k):
                y[o] += w[o, :, j] @ xin[:, j:j + t_out]
    return y + b[:, None]


def cca_projection(cfg, W, p, x):
    """ZayaCCAProjection.forward without a cache (one sequence x [T, D]): q, k, v as [T, heads, d]."""
    H, K, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    groups = H // K
    t0, t1 = cfg.get("cca_time0", 2), cfg.get("cca_time1", 2)
    T = x.shape[0]
    pq = linear(x, W[p + "q_proj.weight"])
    pk = linear(x, W[p + "k_proj.weight"])
    qk = np.concatenate([pq, pk], axis=-1)
    query_residual = pq.reshape(T, H, d)
    key_residual = np.repeat(pk.reshape(T, K, d), groups, axis=1)  # repeat_kv: kv head j serves heads j*g..
    query_residual = (query_residual + key_residual) * 0.5
    key_residual = query_residual.reshape(T, K, groups, d).mean(axis=-2)
    qk = qk.T  # [C, T]
    pad = (t0 - 1) + (t1 - 1)
    qk = np.concatenate([np.zeros((qk.shape[0], pad)), qk], axis=1)  # F.pad(qk, (pad, 0))
    qk = conv1d(qk, W[p + "conv_qk_depthwise.weight"], W[p + "conv_qk_depthwise.bias"], qk.shape[0])
    qk = conv1d(qk, W[p + "conv_qk_grouped.weight"], W[p + "conv_qk_grouped.bias"], K + H).T  # [T, C]
    query = qk[:, :H * d].reshape(T, H, d) + query_residual
    key = qk[:, H * d:].reshape(T, K, d) + key_residual
    value_current = linear(x, W[p + "v_proj_current.weight"])
    delayed = linear(x, W[p + "v_proj_delayed.weight"])
    recurrent = linear(np.zeros((1, x.shape[1])), W[p + "v_proj_delayed.weight"])  # no bias: zeros
    value_delayed = np.concatenate([recurrent, delayed[:-1]], axis=0)
    value = np.concatenate([value_current, value_delayed], axis=-1).reshape(T, K, d)
    return query, key, value


def qk_norm(cfg, temp, q, k):  # ZayaQKNorm
    eps = float(np.finfo(np.float32).eps)
    s = cfg["head_dim"] ** 0.5
    q = q * (s / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), eps))
    k = k * (s / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), eps))
    return q, k * temp[None, :, None]


def attention(cfg, W, p, x, cos, sin, window):
    """ZayaAttention.forward: CCA projection, qk norm, rotary, causal eager attention (scaling
    head_dim^-0.5, Phi3Attention's), o_proj. `window`: a hybrid_sliding layer's sliding_window
    (masking_utils' sliding window: key kv is seen from query q when q - window < kv <= q), or None."""
    H, K, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    T = x.shape[0]
    q, k, v = cca_projection(cfg, W, p + "qkv_proj.", x)
    q, k = qk_norm(cfg, W[p + "qk_norm.temp"], q, k)
    q = apply_rotary(q.transpose(1, 0, 2), cos, sin)  # [H, T, d]
    k = apply_rotary(k.transpose(1, 0, 2), cos, sin)
    v = v.transpose(1, 0, 2)
    k = np.repeat(k, H // K, axis=0)
    v = np.repeat(v, H // K, axis=0)
    scores = q @ k.transpose(0, 2, 1) * d ** -0.5
    q_idx, kv_idx = np.arange(T)[:, None], np.arange(T)[None, :]
    seen = kv_idx <= q_idx
    if window is not None:
        seen &= kv_idx > q_idx - window
    scores = np.where(seen, scores, -np.inf)
    out = softmax(scores) @ v  # [H, T, d]
    return linear(out.transpose(1, 0, 2).reshape(T, H * d), W[p + "o_proj.weight"])


def residual_scaling(W, p, h, r):  # ZayaResidualScaling
    h = (h + W[p + "hidden_states_bias"]) * W[p + "hidden_states_scale"]
    r = (r + W[p + "residual_bias"]) * W[p + "residual_scale"]
    return h + r


def router(cfg, W, p, x, router_states):
    """ZayaRouter.forward: (probs of the chosen class, zeroed for the skip class; index, the skip class
    masked to 0; the router state handed to the next layer; which tokens chose the skip class)."""
    E = cfg["num_experts"]
    h = linear(x, W[p + "down_proj.weight"], W[p + "down_proj.bias"])
    if router_states is not None and (p + "router_states_scale") in W:  # use_eda: layer_idx != 0
        h = h + router_states * W[p + "router_states_scale"]
    state_next = h.copy()
    m = p + "router_mlp."
    z = rms_norm(h, W[m + "norm.weight"], cfg["rms_norm_eps"])
    z = gelu(linear(z, W[m + "fc1.weight"], W[m + "fc1.bias"]))
    z = gelu(linear(z, W[m + "fc2.weight"], W[m + "fc2.bias"]))
    probs = softmax(linear(z, W[m + "out_proj.weight"]))
    idx = np.argmax(probs + W[p + "balancing_biases"], axis=-1)  # top-1 of the biased probabilities
    gate = probs[np.arange(len(idx)), idx]
    skip = idx == E
    gate = np.where(skip, 0.0, gate)
    idx = np.where(skip, 0, idx)
    return gate, idx, state_next, skip


def experts(W, p, x, idx, gate):  # Qwen3MoeExperts with top-1: silu(gate) * up, down, times the weight
    gu, down = W[p + "gate_up_proj"], W[p + "down_proj"]
    I = gu.shape[1] // 2
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        y = linear(x[t], gu[idx[t]])
        out[t] = linear(silu(y[:I]) * y[I:], down[idx[t]]) * gate[t]
    return out


def forward(cfg, W, tokens, skipped=None):
    """ZayaForCausalLM.forward on one sequence: logits [T, V]. `skipped`, a list, receives the
    number of tokens each layer's router sent to the skip class."""
    T = len(tokens)
    eps = cfg["rms_norm_eps"]
    layer_types = cfg.get("layer_types") or ["hybrid"] * cfg["num_hidden_layers"]
    rope = {t: rope_cos_sin(cfg, t, T) for t in set(layer_types)}
    x = W["model.embed_tokens.weight"][tokens]
    x = (x + W["model.input_hidden_states_bias"]) * W["model.input_hidden_states_scale"]
    state = None
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        residual = x
        h = rms_norm(residual, W[p + "input_layernorm.weight"], eps)
        window = cfg["sliding_window"] if layer_types[i] == "hybrid_sliding" else None
        h = attention(cfg, W, p + "self_attn.", h, *rope[layer_types[i]], window)
        residual = residual_scaling(W, p + "post_attention_residual_scale.", h, residual)
        h = rms_norm(residual, W[p + "post_attention_layernorm.weight"], eps)
        gate, idx, state, skip = router(cfg, W, p + "mlp.gate.", h, state)
        if skipped is not None:
            skipped.append(int(skip.sum()))
        h = experts(W, p + "mlp.experts.", h, idx, gate)
        x = residual_scaling(W, p + "post_mlp_residual_scale.", h, residual)
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", True) else W["lm_head.weight"]
    return linear(x, head)


def token_losses(logits, targets):
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -logp[np.arange(len(targets)), targets]


def read_llmc_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        return np.frombuffer(f.read(), dtype="<u2")[:header[2]].astype(np.int64)


def main(argv):
    if len(argv) not in (4, 5):
        raise SystemExit(__doc__)
    d, shard, T = argv[1], argv[2], int(argv[3])
    cfg = json.load(open(os.path.join(d, "config.json")))
    if cfg.get("model_type") != "zaya":
        raise SystemExit(f"{d}/config.json: model_type is {cfg.get('model_type')!r}, not 'zaya'")
    W = read_safetensors(os.path.join(d, "model.safetensors"))
    tokens = read_llmc_shard(shard)
    windows = (len(tokens) - 1) // T
    if len(argv) == 5:
        windows = min(windows, int(argv[4]))
    per_window, skipped = [], []
    for w in range(windows):
        seq = tokens[w * T:w * T + T + 1]
        per_window.append(token_losses(forward(cfg, W, seq[:-1], skipped), seq[1:]).tolist())
    flat = [l for w in per_window for l in w]
    print(json.dumps({"loss": float(np.mean(flat)), "tokens": len(flat), "skipped": sum(skipped),
                      "losses": per_window}))


if __name__ == "__main__":
    main(sys.argv)
