"""How exactly does Hopper accumulate FP8 products? PyTorch's torch._scaled_mm (cuBLASLt, per-tensor
scales) against a float64 reference of the same E4M3 operands, as |error| / sum_k |a_k b_k| per
element: the peer's number for the bound test_cuda uses on our fp8_gemm (issue 10).
    python3 bench/fp8_accum.py          (GPU machine; prints one line per shape and accumulation mode)"""
import torch

torch.manual_seed(0)
for M, N, K in ((256, 384, 512), (128, 160, 256), (4096, 4096, 4096)):
    a = torch.randn(M, K, device="cuda") * 2
    a.view(-1)[::53] *= 300                               # outliers, as in test_cuda
    b = torch.randn(N, K, device="cuda") * 0.1
    sa = (a.abs().max() / 448).float()
    sb = (b.abs().max() / 448).float()
    qa = (a / sa).to(torch.float8_e4m3fn)
    qb = (b / sb).to(torch.float8_e4m3fn)
    da, db = qa.double() * sa.double(), qb.double() * sb.double()
    ref = da @ db.T
    S = da.abs() @ db.abs().T
    for fast in (False, True):
        out = torch._scaled_mm(qa, qb.T, scale_a=sa, scale_b=sb, out_dtype=torch.float32, use_fast_accum=fast)
        e = ((out.double() - ref).abs() / S).max().item()
        e32 = ((((qa.float() * sa) @ (qb.float() * sb).T).double() - ref).abs() / S).max().item()
        print("torch._scaled_mm %dx%dx%d per-tensor fast_accum=%d: max |err|/sum|a.b| = %.2e   (fp32 torch.matmul of the same values: %.2e)" % (M, N, K, fast, e, e32))
