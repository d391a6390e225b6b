#!/usr/bin/env python3
"""torch_llama.py — the PyTorch peer for ultrascale's training-throughput benchmarks.

The same Llama decoder ultrascale trains (Hugging Face names, rotate-half RoPE, GQA, SwiGLU,
RMSNorm eps 1e-5, init std 0.02 with o_proj/down_proj at 0.02/sqrt(2L)), trained the way
PyTorch users do it: fp32 parameters under bf16 autocast, fused AdamW, clip 1.0.
    python3 bench/torch_llama.py --preset 1b --json torch_eager_1b.json
    python3 bench/torch_llama.py --preset 1b --compile --json torch_compile_1b.json
    python3 bench/torch_llama.py --preset 200m --steps 20 --warmup-steps 5
Flags after --preset override its fields. MFU uses the Playbook count 6·N + 12·L·C·T FLOPs per
token against 989 TFLOP/s (H100/H200 dense bf16). Exit status 3 means out of GPU memory."""
import argparse, json, math, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "1b":   dict(dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256, tied=True, seq=4096, batch=4),
    "200m": dict(dim=1024, layers=12, heads=16, kv_heads=4, ffn=4096, vocab=32768, tied=False, seq=2048, batch=16),
}
PEAK_FLOPS = 989e12               # H100/H200 SXM dense bf16, the Playbook's MFU denominator
LLAMA_3_2_1B_PARAMS = 1_235_814_400

def rotate_half(x):               # Hugging Face RoPE: pairs (j, j + HS/2), not interleaved
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)

class Attention(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.nh, s.nkv, s.hs = c.heads, c.kv_heads, c.dim // c.heads
        s.q_proj = nn.Linear(c.dim, s.nh * s.hs, bias=False)
        s.k_proj = nn.Linear(c.dim, s.nkv * s.hs, bias=False)
        s.v_proj = nn.Linear(c.dim, s.nkv * s.hs, bias=False)
        s.o_proj = nn.Linear(s.nh * s.hs, c.dim, bias=False)

    def forward(s, x, cos, sin):                                      # x [B,T,C]
        B, T, _ = x.shape
        q = s.q_proj(x).view(B, T, s.nh, s.hs).transpose(1, 2)        # [B,NH,T,HS]
        k = s.k_proj(x).view(B, T, s.nkv, s.hs).transpose(1, 2)       # [B,NKV,T,HS]
        v = s.v_proj(x).view(B, T, s.nkv, s.hs).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)                   # [T,HS]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return s.o_proj(y.transpose(1, 2).reshape(B, T, s.nh * s.hs))

class MLP(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.gate_proj = nn.Linear(c.dim, c.ffn, bias=False)
        s.up_proj = nn.Linear(c.dim, c.ffn, bias=False)
        s.down_proj = nn.Linear(c.ffn, c.dim, bias=False)

    def forward(s, x):
        return s.down_proj(F.silu(s.gate_proj(x)) * s.up_proj(x))

class Layer(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.input_layernorm = nn.RMSNorm(c.dim, eps=1e-5)
        s.self_attn = Attention(c)
        s.post_attention_layernorm = nn.RMSNorm(c.dim, eps=1e-5)
        s.mlp = MLP(c)

    def forward(s, x, cos, sin):
        x = x + s.self_attn(s.input_layernorm(x), cos, sin)
        return x + s.mlp(s.post_attention_layernorm(x))

class Llama(nn.Module):
    def __init__(s, c, theta=10000.0):
        super().__init__()
        s.model = nn.Module()                     # so parameter names match Hugging Face's
        s.model.embed_tokens = nn.Embedding(c.vocab, c.dim)
        s.model.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        s.model.norm = nn.RMSNorm(c.dim, eps=1e-5)
        s.lm_head = nn.Linear(c.dim, c.vocab, bias=False)
        if c.tied:
            s.lm_head.weight = s.model.embed_tokens.weight
        hs = c.dim // c.heads                     # angle t·theta^(-2j/HS), as ultrascale's rope
        inv = theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        ang = torch.outer(torch.arange(c.seq, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)       # [T,HS]
        s.register_buffer("cos", ang.cos().float(), persistent=False)
        s.register_buffer("sin", ang.sin().float(), persistent=False)
        for name, p in s.named_parameters():      # a tied weight is visited once
            if p.ndim == 1:
                nn.init.ones_(p)
            else:
                proj = name.endswith(("o_proj.weight", "down_proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.layers) if proj else 0.02)

    def forward(s, idx, tgt):                     # idx, tgt [B,T] -> mean cross-entropy
        T = idx.shape[1]
        x = s.model.embed_tokens(idx)
        cos, sin = s.cos[:T], s.sin[:T]
        for layer in s.model.layers:
            x = layer(x, cos, sin)
        logits = s.lm_head(s.model.norm(x))       # [B,T,V] bf16 under autocast
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.reshape(-1))

def param_count(c):               # the formula of us_param_count (ultrascale.h)
    hs = c.dim // c.heads
    layer = 2 * c.dim + (c.heads + 2 * c.kv_heads) * hs * c.dim + c.heads * hs * c.dim + 3 * c.dim * c.ffn
    return c.vocab * c.dim * (1 if c.tied else 2) + c.layers * layer + c.dim

def run(c, args):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Llama(c)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == param_count(c), (n_params, param_count(c))
    if all(getattr(c, k) == v for k, v in PRESETS["1b"].items() if k not in ("seq", "batch")):
        assert n_params == LLAMA_3_2_1B_PARAMS, n_params
    decay = [p for p in model.parameters() if p.ndim >= 2]          # as ultrascale: 2-D weights only
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), fused=True)
    fwd = torch.compile(model) if args.compile else model
    gen = torch.Generator(device="cuda").manual_seed(1337)

    def step():
        tok = torch.randint(0, c.vocab, (c.batch, c.seq + 1), device="cuda", generator=gen)
        x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, loss.item()

    torch.cuda.reset_peak_memory_stats()
    first_s, _ = step()           # with --compile: tracing + Inductor compile + the first step
    for _ in range(args.warmup_steps):
        step()
    times, loss = [], float("nan")
    for _ in range(args.steps):
        dt, loss = step()
        times.append(dt)
    med = statistics.median(times)
    tok_s = c.batch * c.seq / med
    flops_tok = 6 * n_params + 12 * c.layers * c.dim * c.seq
    return dict(tok_s=tok_s, mfu=tok_s * flops_tok / PEAK_FLOPS, step_ms=med * 1e3,
                step_ms_min=min(times) * 1e3, step_ms_max=max(times) * 1e3,
                peak_gib=torch.cuda.max_memory_allocated() / 2**30, params=n_params,
                flops_per_token=flops_tok, first_step_s=first_s,
                compile_s=first_s if args.compile else None, final_loss=loss)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="model and batch shape; other flags override it")
    for k in ("dim", "layers", "heads", "kv-heads", "ffn", "vocab", "seq", "batch"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--tied", action=argparse.BooleanOptionalAction, default=None, help="tie lm_head to the embedding")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup-steps", type=int, default=3, help="untimed steps after the first (default 3)")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model), default mode")
    ap.add_argument("--json", metavar="OUT.json")
    args = ap.parse_args()
    base = dict(PRESETS[args.preset or "200m"])
    overrides = {k: v for k, v in vars(args).items() if k in base and v is not None}
    c = argparse.Namespace(**{**base, **overrides})
    if min(c.dim, c.layers, c.heads, c.kv_heads, c.ffn, c.vocab, c.seq, c.batch, args.steps) < 1 \
            or c.dim % c.heads or c.heads % c.kv_heads or (c.dim // c.heads) % 2:
        sys.exit(f"bad shape {vars(c)}, steps {args.steps}: need all >= 1, heads | dim, kv_heads | heads, dim/heads even")
    preset = (args.preset or "custom") + ("+custom" if args.preset and overrides else "")
    impl = "torch compile" if args.compile else "torch eager"
    if not torch.cuda.is_available():
        sys.exit("torch_llama.py: no CUDA device")
    info = dict(impl=impl, preset=preset, config=vars(c), steps=args.steps, warmup_steps=args.warmup_steps,
                torch=torch.__version__, device=torch.cuda.get_device_name(), peak_flops=PEAK_FLOPS)
    try:
        r = run(c, args)
    except RuntimeError as e:     # torch.cuda.OutOfMemoryError, or one wrapped by a compiled graph
        if not isinstance(e, torch.cuda.OutOfMemoryError) and "out of memory" not in str(e).lower():
            raise
        r = dict(oom=True, error=(str(e).splitlines() or ["out of memory"])[0])
    info.update(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2)
    if r.get("oom"):
        print(f"{impl:<12} | {preset} | OOM: out of GPU memory at B={c.batch} T={c.seq} ({r['error'][:120]})", flush=True)
        sys.exit(3)
    extra = f" | compile {r['compile_s']:.1f} s" if args.compile else ""
    print(f"{impl:<12} | {preset} | tok/s {r['tok_s']:.0f} | MFU {100 * r['mfu']:.1f}% | step {r['step_ms']:.1f} ms"
          f" | peak {r['peak_gib']:.1f} GiB | params {r['params'] / 1e9:.3f}B{extra} | loss {r['final_loss']:.3f}")

if __name__ == "__main__":
    main()
