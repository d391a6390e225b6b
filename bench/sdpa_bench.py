"""Times torch scaled_dot_product_attention (causal, bf16) at the shapes of `bench_cuda --attention`
and prints the same table. FLOPs counted as causal: fwd 4·B·NH·T²·HS/2, bwd 2.5× that; the
backward time is median(fwd+bwd) − median(fwd).
Usage: python3 bench/sdpa_bench.py [--att-heads NH:NKV:HS,...] [--att-seq T,...] [--backends
sdpa,flash,cudnn] (bench_cuda's flags; by default its default rows and all three)."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

REPS = 20
SHAPES = ((16, 16, 128), (16, 4, 128), (32, 8, 64))  # NH, NKV, HS: bench_cuda --attention's rows
SEQS = (2048, 4096, 8192)


def median_ms(fn):
    times = []
    for r in range(REPS + 3):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        if r >= 3:
            times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2]


def run(name, backends):
    for NH, NKV, HS in SHAPES:
        for T in SEQS:
            B = 16384 // T
            q = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            do = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
            gqa = NKV < NH

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

            def fwdbwd():
                q.grad = k.grad = v.grad = None
                fwd().backward(do)

            fl = 4.0 * B * NH * T * T * HS / 2
            try:
                with sdpa_kernel(backends):
                    with torch.no_grad():
                        mf = median_ms(fwd)
                    mfb = median_ms(fwdbwd)
                mb = mfb - mf
                print(f"{name:<6} {T:5d} {B:2d} {NH:3d} {NKV:3d} {HS:4d} | {mf:9.3f} {fl / mf / 1e9:8.1f} | "
                      f"{mb:9.3f} {2.5 * fl / mb / 1e9:8.1f}", flush=True)
            except Exception as e:  # a backend that refuses the shape (GQA, say)
                print(f"{name:<6} {T:5d} {B:2d} {NH:3d} {NKV:3d} {HS:4d} | unavailable: {str(e).splitlines()[0][:80]}", flush=True)


def ints(text, per):
    """'16:4:128,32:8:64' (per 3) or '2048,4096' (per 1): a tuple of tuples / of ints, refused
    with one sentence when it is not that"""
    try:
        rows = [tuple(int(v) for v in part.split(":")) for part in text.split(",")]
    except ValueError:
        rows = []
    if not rows or any(len(r) != per or min(r) <= 0 for r in rows):
        raise SystemExit(f"sdpa_bench: wanted {'NH:NKV:HS' if per == 3 else 'T'},... got {text!r}")
    return tuple(rows) if per > 1 else tuple(r[0] for r in rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--att-heads", help="NH:NKV:HS,... (bench_cuda's flag)")
    ap.add_argument("--att-seq", help="T,... (bench_cuda's flag)")
    ap.add_argument("--backends", default="sdpa,flash,cudnn", help="of sdpa,flash,cudnn")
    args = ap.parse_args()
    if args.att_heads:
        SHAPES = ints(args.att_heads, 3)
    if args.att_seq:
        SEQS = ints(args.att_seq, 1)
    wanted = args.backends.split(",")
    if any(w not in ("sdpa", "flash", "cudnn") for w in wanted):
        raise SystemExit(f"sdpa_bench: --backends takes sdpa, flash and cudnn, got {args.backends!r}")
    print(torch.__version__, torch.cuda.get_device_name())
    print(f"{'impl':<6} {'T':>5} {'B':>2} {'NH':>3} {'NKV':>3} {'HS':>4} | {'fwd ms':>9} {'fwd TF/s':>8} | {'bwd ms':>9} {'bwd TF/s':>8}")
    all_b = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    if "sdpa" in wanted:
        run("sdpa", all_b)  # torch's own pick, in its priority order
    if "flash" in wanted:
        run("flash", [SDPBackend.FLASH_ATTENTION])
    if "cudnn" in wanted:
        run("cudnn", [SDPBackend.CUDNN_ATTENTION])
