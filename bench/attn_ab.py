"""Times ultrascale's attention (build/libus_attn.so, bench/attn_lib.cu) and PyTorch's SDPA
(cuDNN backend) in one process, rep by rep, causal bf16, at bench_cuda --attention's shapes.

Timed in separate processes, as bench_cuda --attention and bench/sdpa_bench.py do, the two meet
the GPU in different states (clock, temperature): SDPA's cuDNN backend measured up to 10 % faster
when it ran first in its process than after other kernels (bench/RESULTS.md, twelfth session).
Here each rep runs ours, then cuDNN, then the same again in the other order, so that both see
the same GPU. FLOPs as sdpa_bench.py: forward 4·B·NH·T²·HS/2 (causal), backward 2.5× that;
ours: the backward kernels alone; SDPA: median(forward + backward) − median(forward).

--kernels: after the timing, each shape's forward and backward once more under torch.profiler,
ours and cuDNN's, and the time of every kernel (CUPTI sees the library's kernels too): where a
backward's time goes, kernel by kernel.

--batch N: each timed sample runs the call N times back to back between its two events, so that
what the host spends before and between launches (Python, ctypes, the library's set-up: about
30 µs a forward and 65 a backward of ours, call 5) hides behind the GPU's work, as it does in a
training step whose queue runs ahead; a sample is then the GPU's time per call.

--lib-b PATH adds a second build of the library (another commit's, say) to the same reps, as
"us-B": a change to the kernels against the build before it, beside cuDNN, in one process.

Usage: python3 bench/attn_ab.py [--lib build/libus_attn.so] [--lib-b OTHER.so]
       [--att-heads NH:NKV:HS,...] [--att-seq T,...] [--reps 20] [--band N] [--kernels]
       [--mode M] [--mode-b M] [--batch N]
       (--band: us_cuda_attention_band, 0 the library's rule; --mode, --mode-b:
       us_cuda_attention_no_hopper of each build, 5 the fused backward)
"""
import argparse
import ctypes

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sdpa_bench import ints

P = ctypes.c_void_p
LL = ctypes.c_longlong
I = ctypes.c_int


def load(path):
    lib = ctypes.CDLL(path)
    lib.usa_init.argtypes, lib.usa_init.restype = [ctypes.c_char_p, I], I
    lib.usa_stream.restype = P
    lib.usa_fwd.argtypes = [P, P, P, LL, LL, I, I, I, I]
    lib.usa_bwd.argtypes = [P, P, P, P, P, LL, LL, I, I, I, I]
    lib.usa_band.argtypes = [I]
    lib.usa_mode.argtypes = [I]
    lib.usa_error.restype = ctypes.c_char_p
    err = ctypes.create_string_buffer(256)
    if lib.usa_init(err, 256):
        raise SystemExit(f"attn_ab: the library did not start: {err.value.decode()}")
    return lib


BATCH = 1  # --batch: calls per timed sample


def timed(stream, fn):
    """milliseconds of one call of fn's work on stream: BATCH calls between two events there"""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(stream)
    for _ in range(BATCH):
        fn()
    e1.record(stream)
    e1.synchronize()
    return e0.elapsed_time(e1) / BATCH


def median(v):
    v = sorted(v)
    return 0.5 * (v[(len(v) - 1) // 2] + v[len(v) // 2])


def kernel_times(fns, reps=5):
    """{kernel name: mean ms per call} of fns run reps times under torch.profiler"""
    from torch.profiler import ProfilerActivity, profile
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
    res = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = ev.cuda_time_total
        if t > 0:
            res[ev.key] = t / 1e3 / reps
    return res


def shape(libs, B, T, NH, NKV, HS, reps, kernels=False):
    """libs: [(name, library, its stream)]; each rep times every library and cuDNN, in an order
    that turns by one every rep"""
    bf = torch.bfloat16
    QKV = (NH + 2 * NKV) * HS
    qkv = torch.randn(B, T, QKV, device="cuda", dtype=bf)
    dout = torch.randn(B, T, NH * HS, device="cuda", dtype=bf)
    out = torch.empty(B, T, NH * HS, device="cuda", dtype=bf)
    dqkv = torch.empty_like(qkv)
    lse = torch.empty(B, NH, T, device="cuda", dtype=torch.float32)
    # SDPA gets its own contiguous [B, heads, T, HS] tensors, as sdpa_bench.py gives it
    q = torch.randn(B, NH, T, HS, device="cuda", dtype=bf, requires_grad=True)
    k = torch.randn(B, NKV, T, HS, device="cuda", dtype=bf, requires_grad=True)
    v = torch.randn(B, NKV, T, HS, device="cuda", dtype=bf, requires_grad=True)
    do = torch.randn(B, NH, T, HS, device="cuda", dtype=bf)
    torch.cuda.synchronize()

    def us_fwd(lib):
        lib.usa_fwd(out.data_ptr(), lse.data_ptr(), qkv.data_ptr(), B, T, NH, NKV, HS, 0)

    def us_bwd(lib):
        lib.usa_bwd(dqkv.data_ptr(), dout.data_ptr(), qkv.data_ptr(), out.data_ptr(),
                    lse.data_ptr(), B, T, NH, NKV, HS, 0)

    def sd_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=NKV < NH)

    def sd_fwdbwd():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=NKV < NH).backward(do)

    torch_stream = torch.cuda.current_stream()
    t = {name: ([], []) for name, _, _ in libs}
    t["cudnn"] = ([], [])
    sd_fb = []
    who_all = [name for name, _, _ in libs] + ["cudnn"]
    by_name = {name: (lib, st) for name, lib, st in libs}
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for r in range(reps + 3):
            turn = r % len(who_all)
            for who in who_all[turn:] + who_all[:turn]:
                if who != "cudnn":
                    lib, st = by_name[who]
                    f = timed(st, lambda: us_fwd(lib))
                    b = timed(st, lambda: us_bwd(lib))
                    if r >= 3:
                        t[who][0].append(f)
                        t[who][1].append(b)
                else:
                    f = timed(torch_stream, sd_fwd)
                    fb = timed(torch_stream, sd_fwdbwd)
                    if r >= 3:
                        t["cudnn"][0].append(f)
                        sd_fb.append(fb)
    if kernels:
        def show(name, fn):
            for kn, ms in sorted(kernel_times([fn]).items(), key=lambda x: -x[1]):
                print(f"  kernel {name:<7} {T:5d} {NH:3d} {NKV:3d} {HS:4d} | {ms:8.3f} ms | {kn[:90]}")
        for name, lib, _ in libs:
            show(name, lambda: (us_fwd(lib), us_bwd(lib)))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            show("cudnn", sd_fwdbwd)
    for name, lib, _ in libs:
        if lib.usa_error():
            raise SystemExit(f"attn_ab: {name} failed: {lib.usa_error().decode()}")
    fl = 4.0 * B * NH * T * T * HS / 2
    res = {}
    for name in who_all:
        mf = median(t[name][0])
        mb = median(t[name][1]) if name != "cudnn" else median(sd_fb) - mf
        res[name] = (fl / mf / 1e9, 2.5 * fl / mb / 1e9)
        print(f"{name:<8} {T:5d} {B:2d} {NH:3d} {NKV:3d} {HS:4d} | {mf:9.3f} {fl / mf / 1e9:8.1f} | "
              f"{mb:9.3f} {2.5 * fl / mb / 1e9:8.1f}", flush=True)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libus_attn.so")
    ap.add_argument("--lib-b", default="", help="a second build, timed as us-B")
    ap.add_argument("--att-heads", default="16:16:128,16:4:128,32:8:64", help="NH:NKV:HS,...")
    ap.add_argument("--att-seq", default="2048,4096,8192", help="T,...")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--band", type=int, default=0, help="us_cuda_attention_band (0: the rule)")
    ap.add_argument("--kernels", action="store_true", help="each kernel's time, by torch.profiler")
    ap.add_argument("--mode", type=int, default=0, help="us_cuda_attention_no_hopper of --lib")
    ap.add_argument("--mode-b", type=int, default=0, help="... of --lib-b")
    ap.add_argument("--batch", type=int, default=1, help="calls per timed sample")
    args = ap.parse_args()
    if args.reps < 1:
        raise SystemExit(f"attn_ab: --reps wants 1 or more, got {args.reps}")
    if args.batch < 1:
        raise SystemExit(f"attn_ab: --batch wants 1 or more, got {args.batch}")
    BATCH = args.batch
    shapes, seqs = ints(args.att_heads, 3), ints(args.att_seq, 1)
    libs = []
    for name, path, mode in (("us-hop", args.lib, args.mode), ("us-B", args.lib_b, args.mode_b)):
        if path:
            lib = load(path)
            lib.usa_band(args.band)
            lib.usa_mode(mode)
            libs.append((name, lib, torch.cuda.ExternalStream(lib.usa_stream())))
    print(torch.__version__, torch.cuda.get_device_name(), "| ours and SDPA cuDNN, rep by rep,",
          f"{BATCH} call(s) a sample")
    print(f"{'impl':<8} {'T':>5} {'B':>2} {'NH':>3} {'NKV':>3} {'HS':>4} | {'fwd ms':>9} {'fwd TF/s':>8} | "
          f"{'bwd ms':>9} {'bwd TF/s':>8}")
    table = []
    for NH, NKV, HS in shapes:
        for T in seqs:
            B = max(1, 16384 // T)
            table.append(((T, NH, NKV, HS), shape(libs, B, T, NH, NKV, HS, args.reps, args.kernels)))
    two = len(libs) > 1
    print(f"\nattention, causal bf16, B·T = 16384, one process, {BATCH} call(s) a sample: TFLOP/s fwd / bwd")
    print(f"{'T':>5} {'NH':>3} {'NKV':>3} {'HS':>4} | {'ultrascale':>15} | {'SDPA cuDNN':>15} | ours/cuDNN"
          + (f" | {'us-B':>15} | ours/us-B" if two else ""))
    for (T, NH, NKV, HS), r in table:
        u, c = r["us-hop"], r["cudnn"]
        line = (f"{T:5d} {NH:3d} {NKV:3d} {HS:4d} | {u[0]:6.1f} / {u[1]:6.1f} | {c[0]:6.1f} / {c[1]:6.1f} | "
                f"{u[0] / c[0]:.2f} / {u[1] / c[1]:.2f}")
        if two:
            o = r["us-B"]
            line += f" | {o[0]:6.1f} / {o[1]:6.1f} | {u[0] / o[0]:.3f} / {u[1] / o[1]:.3f}"
        print(line)
