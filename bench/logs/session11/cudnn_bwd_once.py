"""One causal SDPA forward + backward on the cuDNN backend at NH 16, NKV 4, HS 128, T 8192, B 2
(bf16), for Nsight Compute to profile beside bench_cuda's backward at the same shape."""
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

B, NH, NKV, T, HS = 2, 16, 4, 8192, 128
q = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
do = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(2):
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(do)
torch.cuda.synchronize()
print("done")
