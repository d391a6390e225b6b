/* attn_lib.cu — the CUDA backend's attention as a shared library (build/libus_attn.so), so that
   bench/attn_ab.py can time it and PyTorch's SDPA in one process, rep by rep. Timed in separate
   processes, the two met the GPU in different states: SDPA's cuDNN backend ran up to 10 % faster
   when it ran first than after other kernels (bench/RESULTS.md, twelfth session).
   Layouts as the ops table's (ultrascale.h): qkv[B,T,(NH+2·NKV)·HS], out[B,T,NH·HS],
   lse f32[B,NH,T]; bf16 (fp16 = 0) or fp16. The calls run on the library's stream (usa_stream). */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_cuda.cuh"

static us_ops usa_ops;
static int usa_ready;

/* 0 on success; otherwise 1 and one sentence in err */
extern "C" int usa_init(char *err, int errlen) {
    if (usa_ready) return 0;
    if (us_cuda_ops(&usa_ops, 0, err, (size_t)errlen) != US_OK) return 1;
    usa_ready = 1;
    return 0;
}

/* the cudaStream_t every call below runs on */
extern "C" void *usa_stream(void) { return usa_ready ? us_cuda_stream(&usa_ops) : NULL; }

extern "C" void usa_fwd(void *out, float *lse, const void *qkv, long long B, long long T, int NH,
                        int NKV, int HS, int fp16) {
    usa_ops.attention_fwd(&usa_ops, out, lse, qkv, B, T, NH, NKV, HS, fp16 ? US_F16 : US_BF16);
}

extern "C" void usa_bwd(void *dqkv, const void *dout, const void *qkv, const void *out,
                        const float *lse, long long B, long long T, int NH, int NKV, int HS,
                        int fp16) {
    usa_ops.attention_bwd(&usa_ops, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS,
                          fp16 ? US_F16 : US_BF16);
}

/* us_cuda_attention_band: 0 the library's rule, n pairs a band, -1 one band */
extern "C" void usa_band(int pairs) { us_cuda_attention_band(&usa_ops, pairs); }

/* us_cuda_attention_no_hopper: 0 the default, 5 the fused backward, ... (ultrascale_cuda.cuh) */
extern "C" void usa_mode(int mode) { us_cuda_attention_no_hopper(&usa_ops, mode); }

/* the first failure recorded, or NULL */
extern "C" const char *usa_error(void) { return usa_ops.error(&usa_ops); }
