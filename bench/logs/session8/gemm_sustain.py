# one bf16 GEMM shape (the 1B step's gate|up Fprop, 16384 x 16384 x 2048) back to back for 3 s:
# TFLOP/s by window of time, to see the clock settle under sustained load (power limit)
import torch, time
M, N, K = 16384, 16384, 2048
a = torch.rand(M, K, device="cuda", dtype=torch.bfloat16) - 0.5
b = torch.rand(N, K, device="cuda", dtype=torch.bfloat16) - 0.5
c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
time.sleep(1.0)  # idle first: the clock starts high
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2001)]
ev[0].record()
for i in range(2000):
    torch.matmul(a, b.t(), out=c)
    ev[i + 1].record()
torch.cuda.synchronize()
fl = 2.0 * M * N * K
t = 0.0
marks = [1, 10, 30, 100, 300, 1000, 2000]
prev = 0
for m in marks:
    ms = sum(ev[i].elapsed_time(ev[i + 1]) for i in range(prev, m))
    t += ms
    print(f"GEMMs {prev + 1:5d}-{m:5d} (to {t:7.1f} ms): {fl * (m - prev) / (ms * 1e-3) / 1e12:6.0f} TFLOP/s")
    prev = m
