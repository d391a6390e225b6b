#!/usr/bin/env python3
"""The Playbook's TP trade-off from measured runs: throughput per GPU against memory per GPU for
Llama-3.2-1B (T 4096, 4 sequences per GPU) on one and two H200s, from the JSONL logs of
bench/scale_gpu.sh (issue 9, run 1): one GPU, dp 2, dp 2 + ZeRO-3, tp 2 + sp.
    python3 bench/fig_tp_measured.py [LOGDIR] [OUT.svg]
    (defaults: bench/logs/scale_gpu, docs/fig_tp_measured.svg)
Tokens/s is the median of the steps after the first two; memory is the trainer's mem_bytes peak."""
import json, os, statistics, sys

logdir = sys.argv[1] if len(sys.argv) > 1 else "bench/logs/scale_gpu"
out = sys.argv[2] if len(sys.argv) > 2 else "docs/fig_tp_measured.svg"
runs = [("run1_ref_dp", "1 GPU", 1), ("run1_dp2", "dp 2", 2), ("run1_dp2_z3", "dp 2, ZeRO-3", 2), ("run1_tp2_sp", "tp 2 + sp", 2)]
pts = []
for name, label, gpus in runs:
    path = os.path.join(logdir, name + ".jsonl")
    try:
        rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    except OSError as e:
        sys.exit("fig_tp_measured.py: %s" % e)
    if len(rows) < 3:
        sys.exit("fig_tp_measured.py: %s has %d steps, need at least 3" % (path, len(rows)))
    tok = statistics.median(r["tok_s"] for r in rows[2:]) / gpus / 1000
    mem = max(r["mem_bytes"] for r in rows) / 2**30
    pts.append((label, mem, tok))

X0, X1, Y0, Y1 = 0, 50, 0, 70
def px(x): return 70 + (x - X0) / (X1 - X0) * 480
def py(y): return 330 - (y - Y0) / (Y1 - Y0) * 270
s = ['<svg xmlns="http://www.w3.org/2000/svg" width="720" height="380" font-family="sans-serif" font-size="12">',
     '<rect width="100%" height="100%" fill="white"/>',
     '<text x="310" y="30" font-size="14" text-anchor="middle">Llama-3.2-1B, T 4096, 4 sequences per GPU: measured on H200s</text>',
     '<text x="310" y="48" text-anchor="middle" font-size="10" fill="#555">bench/scale_gpu.sh run 1 (issue 9); tokens/s per GPU against peak memory per GPU</text>']
for y in range(Y0, Y1 + 1, 10):
    s.append('<line x1="70" x2="550" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="64" y="%.1f" text-anchor="end">%d</text>' % (py(y), py(y), py(y) + 4, y))
for x in range(X0, X1 + 1, 10):
    s.append('<text x="%.1f" y="348" text-anchor="middle">%d</text>' % (px(x), x))
s.append('<text x="310" y="370" text-anchor="middle">memory per GPU (GiB)</text>')
s.append('<text x="18" y="195" transform="rotate(-90 18 195)" text-anchor="middle">thousand tokens/s per GPU</text>')
colors = ["#1f77b4", "#2ca02c", "#9467bd", "#d62728"]
for (label, mem, tok), c in zip(pts, colors):
    s.append('<circle cx="%.1f" cy="%.1f" r="5" fill="%s"/>' % (px(mem), py(tok), c))
    s.append('<text x="%.1f" y="%.1f" font-size="11">%s: %.1f k, %.1f GiB</text>' % (px(mem) - 150, py(tok) - 8 + 18 * (label == "dp 2"), label, tok, mem))
s.append("</svg>")
open(out, "w").write("\n".join(s) + "\n")
for label, mem, tok in pts:
    print("%-14s %6.1f k tokens/s per GPU  %6.2f GiB per GPU" % (label, tok, mem))
print("wrote", out)
