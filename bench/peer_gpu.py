"""The PyTorch peer (shared/peer/ref_moe.py) on a GPU, beside `atoll bench` in the GPU kit.

Usage: python3 peer_gpu.py --peer DIR --config small|medium [--precision bf16|fp32]
                           [--compile] [--warmup 2] [--steps 5]

The model, optimizer and training step are the peer's own (ref_moe.MoELM, make_optimizer,
train_step); this file only moves them to the GPU and adds the shapes the peer does not
list: `medium` is configs/medium.toml. bf16 is PyTorch's usual mixed precision: fp32 master
weights and AdamW, products under torch.autocast(bfloat16). `--compile` wraps the model in
torch.compile (default mode) and reports the compile time apart from the timed steps.

MFU is against a cuBLAS peak measured here in the same precision (an 8192^3 product through
torch.matmul, the median of 10 after 3 warm-ups), as `atoll bench` measures its own (4096^3
through cublasGemmEx): FLOPs per token are ref_moe.flops_per_token, the formula `atoll bench`
uses. Ends with one line `RESULT {json}`.
"""
import argparse
import contextlib
import json
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, help="folder holding ref_moe.py")
    ap.add_argument("--config", choices=["tiny", "small", "medium"], required=True)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, args.peer)
    import torch
    import ref_moe

    configs = dict(ref_moe.CONFIGS)
    configs["medium"] = ref_moe.MoEConfig(vocab_size=32768, d_model=1024, n_layers=12, n_heads=16, n_experts=8,
                                          top_k=2, d_hidden=2048, seq_len=2048, batch_size=4)
    cfg = configs[args.config]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = ref_moe.MoELM(cfg).to(dev)
    opt = ref_moe.make_optimizer(model)
    # Peak of the same precision: 8192^3 products, median of 10 after 3 warm-ups.
    dt = torch.bfloat16 if args.precision == "bf16" else torch.float32
    a = torch.randn(8192, 8192, device=dev, dtype=dt)
    b = torch.randn(8192, 8192, device=dev, dtype=dt)
    times = []
    for i in range(13):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    peak_gflops = 2 * 8192**3 / statistics.median(times) * 1e-9
    del a, b

    step_model = model
    compile_s = 0.0
    if args.compile:
        step_model = torch.compile(model)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())
    gen = torch.Generator().manual_seed(1)

    def step():
        batch = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1), generator=gen).to(dev)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss, _, _ = model_loss(step_model, batch)
        loss.backward()
        opt.step()
        return loss.item()

    # ref_moe.MoELM.loss, through `m` (the compiled module's .loss would call the plain one).
    def model_loss(m, batch):
        inp, tgt = batch[:, :-1], batch[:, 1:]
        logits, aux = m(inp)
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        return ce + aux, ce, aux

    torch.cuda.reset_peak_memory_stats()
    losses, step_times = [], []
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        dt_s = time.perf_counter() - t0
        if i == 0 and args.compile:
            compile_s = dt_s
        if i >= args.warmup:
            step_times.append(dt_s)
        print(f"step {i} {dt_s:.4f}s loss {losses[-1]:.4f}", flush=True)
    med = statistics.median(step_times)
    tokens = cfg.batch_size * cfg.seq_len
    gflops = ref_moe.flops_per_token(cfg) * tokens / med * 1e-9
    res = {
        "peer": "pytorch", "config": args.config, "precision": args.precision,
        "mode": "compile" if args.compile else "eager", "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0), "tokens_per_step": tokens, "step_s_median": med,
        "tokens_per_s": tokens / med, "gflops": gflops, "peak_gflops": peak_gflops, "mfu": gflops / peak_gflops,
        "peak_device_mib": torch.cuda.max_memory_allocated() / 2**20, "compile_s": compile_s,
        "params_total": ref_moe.param_counts(cfg)["total"], "first_loss": losses[0], "last_loss": losses[-1],
    }
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
