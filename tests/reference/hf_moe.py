#!/usr/bin/env python3
"""Hugging Face Mixtral / Qwen3-MoE / Qwen2-MoE / OLMoE / Llama folders for the import tests
(tests/cli/init_from_test.cc), and an independent numpy forward of them, transcribed from
transformers' modeling_mixtral.py, modeling_qwen3_moe.py, modeling_qwen2_moe.py, modeling_olmoe.py
and modeling_llama.py (RMSNorm, rotate-half RoPE, eager attention with repeat_kv; Qwen3MoeAttention's
q_norm / k_norm over each head's head_dim entries after the view into heads, OlmoeAttention's over
the whole q_proj / k_proj output before it, both before RoPE; Qwen2MoeAttention's biases on q_proj,
k_proj and v_proj (qkv_bias, true when absent); the sparse MoE block: softmax over the experts,
top-k, renormalised when norm_topk_prob (always in Mixtral), and Qwen2-MoE's shared expert
sigmoid(shared_expert_gate(h)) * shared_expert(h) added to it; LlamaMLP), not from atoll's code. It
reads the folder by its Hugging Face names: Mixtral's per-expert experts
(block_sparse_moe.experts.N.w1), Qwen3-MoE's / OLMoE's (mlp.experts.N.gate_proj), transformers
v5's fused ones (mlp.experts.gate_up_proj [E, 2H, C] = w1 then w3, mlp.experts.down_proj
[E, C, H], mlp.gate.weight), or Llama's mlp.{gate,up,down}_proj; F32, BF16 or F16; one file or
shards.

    hf_moe.py make OUT ARCH LAYOUT SHARDS DTYPE TIE SEED TOKENIZER
        ARCH mixtral|qwen3_moe|qwen2_moe|olmoe|llama, LAYOUT per-expert|fused
    hf_moe.py big OUT C H L E NH NKV V SHARDS TOKENIZER
                                               -> a Mixtral of that shape in BF16 shards, written one tensor
                                                  at a time (bench/import_hf.sh: a model larger than memory
                                                  would hold twice)
    hf_moe.py forward DIR SHARD SEQ_LEN        -> {"loss": mean cross-entropy over the shard's windows}
    hf_moe.py same DIR EXPORT                  -> exit 0 when EXPORT (atoll's export) holds DIR's
                                                  tensors, value for value, under its architecture's names
"""
import glob
import json
import os
import shutil
import struct
import sys

import numpy as np

V, C, L, NH, NKV, HD, E, K, H = 384, 32, 2, 2, 1, 16, 4, 2, 48
HS = 40  # Qwen2-MoE's shared expert width


def to_dtype(x, dtype):
    x = x.astype(np.float32)
    if dtype == "F32":
        return x
    if dtype == "F16":
        return x.astype(np.float16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # BF16: truncated, as the test wants exact values


def read_dir(d):
    """name -> float64 array over every safetensors file of the folder."""
    out = {}
    for fn in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        raw = open(fn, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        for k, m in hdr.items():
            if k == "__metadata__":
                continue
            a, b = m["data_offsets"]
            buf = raw[8 + n + a:8 + n + b]
            if m["dtype"] == "F32":
                x = np.frombuffer(buf, "<f4")
            elif m["dtype"] == "F16":
                x = np.frombuffer(buf, "<f2").astype(np.float32)
            else:
                x = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
            out[k] = x.reshape(m["shape"]).astype(np.float64)
    return out


def write_file(path, tensors, dtype):
    header, off, blobs = {}, 0, []
    for k, x in tensors.items():
        b = to_dtype(x, dtype).tobytes()
        header[k] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


ARCHS = {"mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM",
         "llama": "LlamaForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


def make(out, arch, layout, shards, dtype, tie, seed, tokenizer):
    rng = np.random.RandomState(seed)
    os.makedirs(out, exist_ok=True)
    moe = arch != "llama"
    cfg = dict(architectures=[ARCHS[arch]], model_type=arch,
               vocab_size=V, hidden_size=C, intermediate_size=H, num_hidden_layers=L, num_attention_heads=NH,
               num_key_value_heads=NKV, head_dim=HD, max_position_embeddings=64, rope_theta=500.0,
               rms_norm_eps=1e-5, tie_word_embeddings=tie, hidden_act="silu", torch_dtype="bfloat16",
               attention_dropout=0.0, bos_token_id=1, eos_token_id=2)
    if arch == "mixtral":
        cfg.update(num_local_experts=E, num_experts_per_tok=K, sliding_window=None, router_aux_loss_coef=0.02)
    elif arch == "qwen3_moe":  # a window shorter than the context, unused without use_sliding_window
        cfg.update(intermediate_size=3 * H, moe_intermediate_size=H, num_experts=E, num_experts_per_tok=K,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                   sliding_window=4, max_window_layers=L, rms_norm_eps=1e-6, router_aux_loss_coef=0.001)
    elif arch == "qwen2_moe":  # Qwen1.5-MoE-A2.7B's fields: no qkv_bias (true), no head_dim
        cfg.update(intermediate_size=3 * H, moe_intermediate_size=H, shared_expert_intermediate_size=HS,
                   num_experts=E, num_experts_per_tok=K, norm_topk_prob=False, decoder_sparse_step=1,
                   mlp_only_layers=[], use_sliding_window=False, sliding_window=4, max_window_layers=L,
                   rms_norm_eps=1e-6, router_aux_loss_coef=0.001)
        del cfg["head_dim"]
    elif arch == "olmoe":  # OLMoE-1B-7B's settings: no renormalising, no clipping
        cfg.update(num_experts=E, num_experts_per_tok=K, norm_topk_prob=False, clip_qkv=None)
        del cfg["head_dim"]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    shutil.copy(tokenizer, os.path.join(out, "tokenizer.model"))
    t = {"model.embed_tokens.weight": rng.randn(V, C), "model.norm.weight": 1 + 0.1 * rng.randn(C)}
    if not tie:
        t["lm_head.weight"] = 0.3 * rng.randn(V, C)
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * rng.randn(C)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.randn(C)
        for n, s in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
            t[p + f"self_attn.{n}_proj.weight"] = 0.3 * rng.randn(s, C)
        t[p + "self_attn.o_proj.weight"] = 0.3 * rng.randn(C, NH * HD)
        if arch == "qwen2_moe":
            for n, s in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
                t[p + f"self_attn.{n}_proj.bias"] = 0.5 * rng.randn(s)
            t[p + "mlp.shared_expert.gate_proj.weight"] = 0.3 * rng.randn(HS, C)
            t[p + "mlp.shared_expert.up_proj.weight"] = 0.3 * rng.randn(HS, C)
            t[p + "mlp.shared_expert.down_proj.weight"] = 0.3 * rng.randn(C, HS)
            t[p + "mlp.shared_expert_gate.weight"] = 0.5 * rng.randn(1, C)
        if arch == "qwen3_moe":
            t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"] = 1 + 0.1 * rng.randn(2, HD)
        elif arch == "olmoe":
            t[p + "self_attn.q_norm.weight"] = 1 + 0.1 * rng.randn(NH * HD)
            t[p + "self_attn.k_norm.weight"] = 1 + 0.1 * rng.randn(NKV * HD)
        w1, w2, w3 = 0.3 * rng.randn(E, H, C), 0.3 * rng.randn(E, C, H), 0.3 * rng.randn(E, H, C)
        if not moe:
            t[p + "mlp.gate_proj.weight"], t[p + "mlp.down_proj.weight"], t[p + "mlp.up_proj.weight"] = w1[0], w2[0], w3[0]
        elif layout == "fused":
            t[p + "mlp.gate.weight"] = rng.randn(E, C)
            t[p + "mlp.experts.gate_up_proj"] = np.concatenate([w1, w3], axis=1)
            t[p + "mlp.experts.down_proj"] = w2
        elif arch != "mixtral":
            t[p + "mlp.gate.weight"] = rng.randn(E, C)
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                t[q + "gate_proj.weight"], t[q + "down_proj.weight"], t[q + "up_proj.weight"] = w1[e], w2[e], w3[e]
        else:
            t[p + "block_sparse_moe.gate.weight"] = rng.randn(E, C)
            for e in range(E):
                q = p + f"block_sparse_moe.experts.{e}."
                t[q + "w1.weight"], t[q + "w2.weight"], t[q + "w3.weight"] = w1[e], w2[e], w3[e]
    names = sorted(t)
    if shards == 1:
        write_file(os.path.join(out, "model.safetensors"), {k: t[k] for k in names}, dtype)
        return
    index = {"metadata": {}, "weight_map": {}}
    for i in range(shards):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        write_file(os.path.join(out, fn), {k: t[k] for k in part}, dtype)
        index["weight_map"].update({k: fn for k in part})
    json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)


def big(out, c, h, layers, e, nh, nkv, v, shards, tokenizer):
    """A Mixtral-shaped model in BF16 shards, each tensor drawn, converted and written alone."""
    hd = c // nh
    os.makedirs(out, exist_ok=True)
    cfg = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=v, hidden_size=c,
               intermediate_size=h, num_hidden_layers=layers, num_attention_heads=nh, num_key_value_heads=nkv,
               head_dim=hd, num_local_experts=e, num_experts_per_tok=2, max_position_embeddings=4096,
               rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
               torch_dtype="bfloat16", sliding_window=None, attention_dropout=0.0, bos_token_id=1, eos_token_id=2)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    shutil.copy(tokenizer, os.path.join(out, "tokenizer.model"))
    shapes = {"model.embed_tokens.weight": (v, c), "model.norm.weight": (c,), "lm_head.weight": (v, c)}
    for l in range(layers):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (c,), p + "post_attention_layernorm.weight": (c,),
                       p + "self_attn.q_proj.weight": (nh * hd, c), p + "self_attn.k_proj.weight": (nkv * hd, c),
                       p + "self_attn.v_proj.weight": (nkv * hd, c), p + "self_attn.o_proj.weight": (c, nh * hd),
                       p + "block_sparse_moe.gate.weight": (e, c)})
        for x in range(e):
            q = p + f"block_sparse_moe.experts.{x}."
            shapes.update({q + "w1.weight": (h, c), q + "w2.weight": (c, h), q + "w3.weight": (h, c)})
    names = list(shapes)
    total = sum(2 * int(np.prod(shapes[k])) for k in names)
    rng = np.random.default_rng(1)
    index = {"metadata": {"total_size": total}, "weight_map": {}}
    per = (len(names) + shards - 1) // shards
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header, off = {}, 0
        for k in part:
            n = 2 * int(np.prod(shapes[k]))
            header[k] = {"dtype": "BF16", "shape": list(shapes[k]), "data_offsets": [off, off + n]}
            off += n
            index["weight_map"][k] = fn
        hb = json.dumps(header).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(os.path.join(out, fn), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for k in part:
                x = rng.standard_normal(shapes[k], dtype=np.float32) * 0.02
                f.write((x.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
    print(sum(int(np.prod(x)) for x in shapes.values()))


def per_expert(W, cfg):
    """The folder's tensors under Mixtral's per-expert names (Llama as one expert), whatever layout
    the folder has; other names (the q/k norms) as they are."""
    out = {}
    for k, x in W.items():
        p, _, rest = k.partition("mlp.")
        pe, _, name = rest.partition("experts.")
        if rest.startswith("shared_expert"):  # Qwen2-MoE's shared expert and its gate, as they are
            out[k] = x
        elif rest and not pe and name.split(".")[0].isdigit():  # Qwen3-MoE's / OLMoE's mlp.experts.N.gate_proj
            e, w = name.split(".")[0], name.split(".")[1]
            out[p + f"block_sparse_moe.experts.{e}." + {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[w] +
                ".weight"] = x
        elif not rest:
            out[k] = x
        elif rest == "gate.weight":
            out[p + "block_sparse_moe.gate.weight"] = x
        elif rest in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
            w = {"gate_proj.weight": "w1", "up_proj.weight": "w3", "down_proj.weight": "w2"}[rest]
            out[p + f"block_sparse_moe.experts.0.{w}.weight"] = x
            out[p + "block_sparse_moe.gate.weight"] = np.zeros((1, x.shape[-1] if w != "w2" else x.shape[0]))
        elif rest == "experts.gate_up_proj":
            h = x.shape[1] // 2
            for e in range(x.shape[0]):
                out[p + f"block_sparse_moe.experts.{e}.w1.weight"] = x[e, :h]
                out[p + f"block_sparse_moe.experts.{e}.w3.weight"] = x[e, h:]
        elif rest == "experts.down_proj":
            for e in range(x.shape[0]):
                out[p + f"block_sparse_moe.experts.{e}.w2.weight"] = x[e]
    if cfg.get("tie_word_embeddings"):
        out.pop("lm_head.weight", None)
    return out


def rms(x, g, eps):
    return g * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def rotate_half(x):
    return np.concatenate((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), -1)


def load(d):
    """(config.json, per-expert float64 tensors) of a Hugging Face folder."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    return cfg, per_expert(read_dir(d), cfg)


def log_probs(cfg, W, ids):
    """[B*T, V] log-softmax of the next-token logits for ids [B, T] (float64)."""
    B, T = ids.shape
    c, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd_, eps = cfg.get("head_dim") or c // nh, cfg["rms_norm_eps"]
    k_ = cfg.get("num_experts_per_tok", 1)
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, hd_, 2) / hd_))
    fr = np.outer(np.arange(T), inv)
    emb = np.concatenate((fr, fr), -1)
    cos, sin = np.cos(emb), np.sin(emb)
    x = W["model.embed_tokens.weight"][ids]
    def proj(h, p, n):  # Qwen2-MoE's q/k/v projections have biases
        y = h @ W[p + f"self_attn.{n}_proj.weight"].T
        return y + W[p + f"self_attn.{n}_proj.bias"] if p + f"self_attn.{n}_proj.bias" in W else y

    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        q = proj(h, p, "q").reshape(B, T, nh, hd_).transpose(0, 2, 1, 3)
        k = proj(h, p, "k").reshape(B, T, nkv, hd_).transpose(0, 2, 1, 3)
        if cfg["model_type"] == "qwen3_moe":  # per head, after the view into heads
            q = rms(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, W[p + "self_attn.k_norm.weight"], eps)
        elif cfg["model_type"] == "olmoe":  # over the whole projection, before it
            q = rms(h @ W[p + "self_attn.q_proj.weight"].T, W[p + "self_attn.q_norm.weight"], eps)
            k = rms(h @ W[p + "self_attn.k_proj.weight"].T, W[p + "self_attn.k_norm.weight"], eps)
            q = q.reshape(B, T, nh, hd_).transpose(0, 2, 1, 3)
            k = k.reshape(B, T, nkv, hd_).transpose(0, 2, 1, 3)
        v = proj(h, p, "v").reshape(B, T, nkv, hd_).transpose(0, 2, 1, 3)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, nh // nkv, 1), np.repeat(v, nh // nkv, 1)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd_)
        s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(B, T, nh * hd_)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps).reshape(B * T, c)
        logits = h @ W[p + "block_sparse_moe.gate.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        sel = np.argsort(-probs, -1, kind="stable")[:, :k_]
        rw = np.take_along_axis(probs, sel, -1)
        if cfg.get("norm_topk_prob", cfg["model_type"] == "mixtral"):
            rw /= rw.sum(-1, keepdims=True)
        out = np.zeros_like(h)
        for e in range(probs.shape[1]):
            q_ = p + f"block_sparse_moe.experts.{e}."
            g = h @ W[q_ + "w1.weight"].T
            y = (g / (1 + np.exp(-g)) * (h @ W[q_ + "w3.weight"].T)) @ W[q_ + "w2.weight"].T
            out += y * (rw * (sel == e)).sum(-1, keepdims=True)
        if p + "mlp.shared_expert_gate.weight" in W:  # Qwen2MoeSparseMoeBlock's shared expert
            s_ = p + "mlp.shared_expert."
            g = h @ W[s_ + "gate_proj.weight"].T
            y = (g / (1 + np.exp(-g)) * (h @ W[s_ + "up_proj.weight"].T)) @ W[s_ + "down_proj.weight"].T
            out += y / (1 + np.exp(-(h @ W[p + "mlp.shared_expert_gate.weight"].T)))
        x = x + out.reshape(B, T, c)
    x = rms(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    z = (x @ head.T).reshape(B * T, -1)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def forward(d, shard, T):
    cfg, W = load(d)
    raw = open(shard, "rb").read()
    hd = struct.unpack("<256i", raw[:1024])
    stream = np.frombuffer(raw[1024:], np.uint16 if hd[1] == 1 else np.uint32).astype(np.int64)
    B = (len(stream) - 1) // T
    ids = np.stack([stream[i * T:i * T + T] for i in range(B)])
    tgt = np.stack([stream[i * T + 1:i * T + T + 1] for i in range(B)])
    lp = log_probs(cfg, W, ids)
    print(json.dumps({"loss": float(-lp[np.arange(B * T), tgt.reshape(-1)].mean()), "tokens": B * T}))


def same(d, export):
    want = per_expert(read_dir(d), json.load(open(os.path.join(d, "config.json"))))
    got = per_expert(read_dir(export), json.load(open(os.path.join(export, "config.json"))))
    bad = [k for k in want if k not in got or got[k].shape != want[k].shape or not np.array_equal(got[k], want[k])]
    extra = sorted(set(got) - set(want))
    if bad or extra:
        print(f"changed: {bad[:3]}, extra: {extra[:3]}")
        sys.exit(1)


if __name__ == "__main__":
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(a[0], a[1], a[2], int(a[3]), a[4], a[5] == "tie", int(a[6]), a[7])
    elif cmd == "big":
        big(a[0], *[int(x) for x in a[1:9]], a[9])
    elif cmd == "forward":
        forward(a[0], a[1], int(a[2]))
    else:
        same(a[0], a[1])
