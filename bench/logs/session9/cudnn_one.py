# one causal GQA shape through SDPA's cuDNN backend, fwd + bwd, a few reps (for ncu kernel names/durations)
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
NH, NKV, HS, T = map(int, sys.argv[1:5]); B = 16384 // T
q = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, NKV, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
do = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for r in range(4):
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(do)
torch.cuda.synchronize()
