"""gpu_table.py LOGDIR -- the side-by-side table that ends bench/run_gpu.sh, from the logs it wrote:
attention (ours, SDPA cuDNN, SDPA flash) per shape, then each training step against PyTorch eager
and torch.compile (tokens/s, ratio, MFU, peak memory). Reads us_kernels.txt, sdpa.txt,
us_<preset>.txt, us_tuned_<preset>.txt (--gemm-tune; its row left out when missing),
torch_eager_<preset>.txt, torch_compile_<preset>.txt; a missing log leaves its cells empty. Where
the step logs end with bench/power.py's line, a last table gives each run's board power, the share
of its busy samples at the software power cap, the SM clock and the energy a token."""
import os
import re
import sys


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def attention_rows(d):
    """{(impl, T, NH, NKV, HS): (fwd TF/s, bwd TF/s)} from bench_cuda --attention and sdpa_bench.py"""
    rows = {}
    pat = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s+([\d.]+)\s+([\d.]+)\s+\|\s+([\d.]+)\s+([\d.]+)")
    for name in ("us_kernels.txt", "sdpa.txt"):
        for line in read(os.path.join(d, name)).splitlines():
            m = pat.match(line)
            if m:
                impl, T, _, NH, NKV, HS = m.group(1), *map(int, m.group(2, 3, 4, 5, 6))
                rows[(impl, T, NH, NKV, HS)] = (float(m.group(8)), float(m.group(10)))
    return rows


def step(d, name):
    """(tok/s, MFU %, peak GiB) from one step log line"""
    txt = read(os.path.join(d, name))
    m = re.search(r"tok/s\s+([\d.]+)\s+\|\s+MFU\s+([\d.]+)%.*?peak\s+([\d.]+) GiB", txt)
    return tuple(map(float, m.groups())) if m else None


def power(d, name):
    """(board W median, % at the power cap, SM MHz median) from bench/power.py's line in a log"""
    txt = read(os.path.join(d, name))
    m = re.search(r"^power \|.*?board (\d+) W median.*?power cap (\d+) %.*?SM clock (\d+) MHz", txt,
                  re.M)
    return tuple(map(float, m.groups())) if m else None


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "bench_out"
    att = attention_rows(d)
    print("attention, causal bf16, B·T = 16384: TFLOP/s fwd / bwd (ratio to cuDNN)")
    print(f"{'T':>5} {'NH':>3} {'NKV':>3} {'HS':>3} | {'ultrascale':>15} | {'SDPA cuDNN':>13} | {'SDPA flash':>13} | {'ours/cuDNN':>11}")
    shapes = sorted({k[1:] for k in att if k[0] == "us-hop"}, key=lambda s: (s[3], s[1], s[2], s[0]))
    for s in shapes:
        us, cu, fl = att.get(("us-hop",) + s), att.get(("cudnn",) + s), att.get(("flash",) + s)
        cell = lambda v: f"{v[0]:6.1f} / {v[1]:5.1f}" if v else f"{'-':>13}"
        ratio = f"{us[0] / cu[0]:4.2f} / {us[1] / cu[1]:4.2f}" if us and cu else "-"
        print(f"{s[0]:5d} {s[1]:3d} {s[2]:3d} {s[3]:3d} | {cell(us):>15} | {cell(cu)} | {cell(fl)} | {ratio:>11}")
    print()
    print("training step, bf16: tokens/s (MFU, peak GiB)")
    print(f"{'preset':<11} | {'ultrascale':>24} | {'torch eager':>24} | {'torch.compile':>24} | {'vs eager':>8} | {'vs compile':>10}")
    cell = lambda v: f"{v[0]:8.0f} ({v[1]:4.1f}%, {v[2]:5.1f})" if v else f"{'-':>24}"
    r = lambda a, b: f"{a[0] / b[0]:5.3f}x" if a and b else "-"
    for p in ("1b", "200m"):
        ea, co = (step(d, f"{k}_{p}.txt") for k in ("torch_eager", "torch_compile"))
        for label, k in ((p, "us"), (p + " tuned", "us_tuned")):  # tuned: --gemm-tune
            us = step(d, f"{k}_{p}.txt")
            if k == "us_tuned" and not us:
                continue
            print(f"{label:<11} | {cell(us):>24} | {cell(ea):>24} | {cell(co):>24} | {r(us, ea):>8} | {r(us, co):>10}")
    kinds = ("us", "us_tuned", "torch_eager", "torch_compile")
    runs = [(p, k, power(d, f"{k}_{p}.txt"), step(d, f"{k}_{p}.txt"))
            for p in ("1b", "200m") for k in kinds]
    runs = [r for r in runs if r[2] and r[3]]
    if runs:
        print()
        print("power while training (bench/power.py; busy samples): board W, share at the software")
        print("power cap, SM clock, energy a token (board W / tokens/s)")
        for p, k, (w, cap, mhz), st in runs:
            print(f"{p:<5} {k:<14} | {w:4.0f} W | cap {cap:3.0f} % | {mhz:5.0f} MHz | "
                  f"{w / st[0] * 1e3:6.2f} mJ/token")


if __name__ == "__main__":
    main()
