#!/usr/bin/env python3
"""Checks that an `atoll export --format hf` model computes atoll's loss under Mixtral's
semantics. An independent Mixtral forward (following transformers' modeling_mixtral.py:
MixtralRMSNorm, rotate-half RoPE, eager attention with repeat_kv, MixtralSparseMoeBlock)
reads only config.json and model.safetensors by their Hugging Face names, evaluates the
first WINDOWS windows of an llm.c shard the way `atoll eval` does (window i: inputs tokens
[i*T, i*T+T), targets the next token), and prints the mean cross-entropy.

    scripts/check_hf_export.py EXPORT_DIR SHARD.bin T WINDOWS
Compare with: atoll eval --checkpoint RUN --data SHARD.bin --tokens $((T*WINDOWS))
Needs python3-torch and python3-numpy (Debian). transformers itself is not packaged for
Debian 12, hence the re-implementation.
"""
import json, struct, sys
import numpy as np, torch
import torch.nn.functional as F

d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
assert hdr.pop("__metadata__") == {"format": "pt"}
W = {k: torch.from_numpy(np.frombuffer(raw[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]], dtype=np.float32).copy()).reshape(v["shape"]).double() for k, v in hdr.items()}

C, L, NH, NKV, HD = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
E, K, eps = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["rms_norm_eps"]
used = set()
def w(name): used.add(name); return W[name]
def rms(x, g): return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
def rotate_half(x): return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

shard = open(sys.argv[2], "rb").read()
hdr_ints = struct.unpack("<256i", shard[:1024])
assert hdr_ints[0] == 20240520 and hdr_ints[1] in (1, 2), "not an llm.c shard"
stream = np.frombuffer(shard[1024:], dtype=np.uint16 if hdr_ints[1] == 1 else np.uint32).astype(np.int64)
T, B = int(sys.argv[3]), int(sys.argv[4])
ids = torch.stack([torch.from_numpy(stream[i * T: i * T + T]) for i in range(B)])
tgt = torch.stack([torch.from_numpy(stream[i * T + 1: i * T + T + 1]) for i in range(B)])
inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
fr = torch.outer(torch.arange(T, dtype=torch.float64), inv); emb = torch.cat((fr, fr), -1); cos, sin = emb.cos(), emb.sin()

x = w("model.embed_tokens.weight")[ids]
for l in range(L):
    p = f"model.layers.{l}."
    h = rms(x, w(p + "input_layernorm.weight"))
    q = (h @ w(p + "self_attn.q_proj.weight").T).view(B, T, NH, HD).transpose(1, 2)
    k = (h @ w(p + "self_attn.k_proj.weight").T).view(B, T, NKV, HD).transpose(1, 2)
    v = (h @ w(p + "self_attn.v_proj.weight").T).view(B, T, NKV, HD).transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
    s = q @ k.transpose(2, 3) / HD ** 0.5
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    a = (F.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, NH * HD)
    x = x + a @ w(p + "self_attn.o_proj.weight").T
    h = rms(x, w(p + "post_attention_layernorm.weight")).reshape(B * T, C)
    probs = F.softmax(h @ w(p + "block_sparse_moe.gate.weight").T, dim=1)
    rw, sel = torch.topk(probs, K, dim=-1); rw = rw / rw.sum(-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        ep = p + f"block_sparse_moe.experts.{e}."
        y = (F.silu(h @ w(ep + "w1.weight").T) * (h @ w(ep + "w3.weight").T)) @ w(ep + "w2.weight").T
        out += y * (rw * (sel == e)).sum(-1, keepdim=True)
    x = x + out.view(B, T, C)
x = rms(x, w("model.norm.weight"))
head = w("model.embed_tokens.weight") if cfg["tie_word_embeddings"] else w("lm_head.weight")
loss = F.cross_entropy((x @ head.T).reshape(B * T, -1), tgt.reshape(-1))
assert used == set(W), set(W) - used
print(f"{loss.item():.9f}")
