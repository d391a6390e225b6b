/* ultrascale_cuda.cuh — the CUDA backend of ultrascale: the ops table on one GPU.

   Compile with nvcc, in the same translation unit as the library's implementation:
       #define ULTRASCALE_IMPLEMENTATION
       #include "ultrascale_cuda.cuh"          // includes ultrascale.h
       ...
       us_ops ops;
       if (us_cuda_ops(&ops, 0, err, sizeof err) != US_OK) { puts(err); return 1; }
       us_model_init(&m, &mc, &tc, &ops);      // parameters, grads, optimizer, arena on the GPU
       ...
       us_model_free(&m); us_cuda_ops_free(&ops);
   Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a file.cu -lcublasLt
   (other architectures compile too; the flash-attention kernels need sm_80 or newer and fall
   back to the portable kernel elsewhere).

   What is here (the Playbook's "going deeper into the GPU"):
     // >>cuda-core       device memory, one stream, error recording, memory accounting
     // >>cuda-gemm       cuBLASLt GEMMs (bf16 or fp32 operands, fp32 accumulate), plans cached per shape
     // >>cuda-kernels    embedding, RMSNorm, RoPE, SwiGLU, fused softmax-cross-entropy, casts
     // >>cuda-attention  portable attention (any dtype/head size) and flash attention (bf16, tensor cores)
     // >>cuda-optimizer  AdamW on flat buffers, Σx² for the global norm
   Every kernel computes in fp32 and rounds once on store, like the CPU reference, and is
   checked against it by tests/test_cuda.cu. CUDA and cuBLASLt errors never exit: the first one
   is recorded and surfaces as US_ERR_BACKEND from the next library call. */
#ifndef ULTRASCALE_CUDA_CUH
#define ULTRASCALE_CUDA_CUH

#include "ultrascale.h"
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Fills *ops with the CUDA implementation on `device`. On failure writes one sentence into err. */
US_API us_result us_cuda_ops(us_ops *ops, int device, char *err, size_t errlen);
US_API void      us_cuda_ops_free(us_ops *ops);
US_API int       us_cuda_device_count(void);
/* The device's name and memory, for logs. */
US_API void      us_cuda_describe(const us_ops *ops, char *buf, size_t buflen);
#ifdef __cplusplus
}
#endif
#endif /* ULTRASCALE_CUDA_CUH */

#ifdef ULTRASCALE_IMPLEMENTATION
#ifndef ULTRASCALE_CUDA_IMPLEMENTATION_DONE
#define ULTRASCALE_CUDA_IMPLEMENTATION_DONE

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
// >>cuda-core  device memory, one stream, error recording
/* ------------------------------------------------------------------------------------ */
#define US__CUDA_PLANS 256
typedef struct us__gemm_plan {
    int ta, tb, adt, bdt, cdt, beta0;
    int64_t M, N, K, lda, ldb, ldc;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} us__gemm_plan;

typedef struct us__cuda {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *ws;               /* cuBLASLt workspace */
    size_t ws_bytes;
    us__gemm_plan plans[US__CUDA_PLANS];
    int nplans;
    void *scratch;          /* grows on demand: reductions, attention backward */
    size_t scratch_bytes;
    double *host_red;       /* pinned host slot for reduction results */
    struct { void *p; size_t n; } allocs[64];   /* sizes of live allocations, for accounting */
    int failed;
    char err[256];
} us__cuda;

static us__cuda *us__cu(us_ops *o) { return (us__cuda *)o->backend; }

/* Records the first failure; every later op still runs but the model reports the error. */
static void us__cuda_fail(us_ops *o, const char *what, const char *msg, const char *file, int line) {
    us__cuda *c = us__cu(o);
    if (c->failed) return;
    c->failed = 1;
    snprintf(c->err, sizeof c->err, "%s failed: %s (%s:%d)", what, msg, file, line);
}
#define US__CU(o, call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) us__cuda_fail(o, #call, cudaGetErrorString(e_), __FILE__, __LINE__); } while (0)
#define US__LT(o, call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) us__cuda_fail(o, #call, cublasLtGetStatusString(s_), __FILE__, __LINE__); } while (0)
#define US__LAUNCHED(o) US__CU(o, cudaGetLastError())

static const char *us__cuda_error(us_ops *o) { return us__cu(o)->failed ? us__cu(o)->err : NULL; }

static void *us__cuda_alloc(us_ops *o, size_t bytes) {
    us__cuda *c = us__cu(o);
    void *p = NULL;
    int i;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) { cudaGetLastError(); return NULL; }   /* OOM is a result, not a sticky error */
    US__CU(o, cudaMemsetAsync(p, 0, bytes, c->stream));
    for (i = 0; i < 64; i++) if (!c->allocs[i].p) { c->allocs[i].p = p; c->allocs[i].n = bytes; break; }
    o->bytes_in_use += bytes;
    if (o->bytes_in_use > o->bytes_peak) o->bytes_peak = o->bytes_in_use;
    return p;
}
static void us__cuda_free(us_ops *o, void *p) {
    us__cuda *c = us__cu(o);
    int i;
    if (!p) return;
    for (i = 0; i < 64; i++) if (c->allocs[i].p == p) { o->bytes_in_use -= c->allocs[i].n; c->allocs[i].p = NULL; break; }
    US__CU(o, cudaFree(p));
}
static void us__cuda_zero(us_ops *o, void *p, size_t bytes) { US__CU(o, cudaMemsetAsync(p, 0, bytes, us__cu(o)->stream)); }
static void us__cuda_copy(us_ops *o, void *dst, const void *src, size_t bytes, us_copy_kind kind) {
    us__cuda *c = us__cu(o);
    cudaMemcpyKind k = kind == US_COPY_H2D ? cudaMemcpyHostToDevice : kind == US_COPY_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    if (!bytes) return;
    US__CU(o, cudaMemcpyAsync(dst, src, bytes, k, c->stream));
    if (kind != US_COPY_D2D) US__CU(o, cudaStreamSynchronize(c->stream));   /* host memory is usable on return */
}
static void us__cuda_sync(us_ops *o) { US__CU(o, cudaStreamSynchronize(us__cu(o)->stream)); }

/* Scratch grows (never shrinks) to the largest request; ops use it within one call. */
static void *us__cuda_scratch(us_ops *o, size_t bytes) {
    us__cuda *c = us__cu(o);
    if (bytes <= c->scratch_bytes) return c->scratch;
    if (c->scratch) { US__CU(o, cudaStreamSynchronize(c->stream)); us__cuda_free(o, c->scratch); }
    c->scratch = us__cuda_alloc(o, bytes);
    c->scratch_bytes = c->scratch ? bytes : 0;
    if (!c->scratch) us__cuda_fail(o, "scratch allocation", "out of device memory", __FILE__, __LINE__);
    return c->scratch;
}

/* fp32 in registers, the tensor's dtype in memory; __float2bfloat16_rn rounds to nearest even */
__device__ __forceinline__ float us__ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float us__ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void us__st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void us__st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/* Calls KERNEL<float> or KERNEL<__nv_bfloat16> by the runtime dtype. */
#define US__DISPATCH(o, dt, LAUNCH)                                                          \
    do {                                                                                     \
        if ((dt) == US_F32) { typedef float T_; LAUNCH; }                                    \
        else if ((dt) == US_BF16) { typedef __nv_bfloat16 T_; LAUNCH; }                      \
        else us__cuda_fail(o, "dtype", "only fp32 and bf16 tensors are supported here", __FILE__, __LINE__); \
        US__LAUNCHED(o);                                                                     \
    } while (0)

static unsigned us__blocks(int64_t n, int threads) { int64_t b = (n + threads - 1) / threads; return (unsigned)(b < 1 ? 1 : b > 1048576 ? 1048576 : b); }

/* block-wide sum (any blockDim multiple of 32, ≤ 1024), result valid in every thread */
template <typename A>
__device__ A us__block_sum(A v, A *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5, i;
    for (i = 16; i > 0; i >>= 1) v += __shfl_xor_sync(0xffffffffu, v, i);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = 0;
    for (i = 0; i < nw; i++) v += sh[i];   /* same order in every thread: deterministic */
    return v;
}
__device__ float us__block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5, i;
    for (i = 16; i > 0; i >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, i));
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = -INFINITY;
    for (i = 0; i < nw; i++) v = fmaxf(v, sh[i]);
    return v;
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-gemm  cuBLASLt, row-major on top of column-major
/* ------------------------------------------------------------------------------------ */
/* Row-major C[M,N] = op(A)·op(B) is column-major Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLASLt gets B as
   its first operand and A as its second, with the transposes swapped into place. A plan
   (descriptors + the heuristic's best algorithm) is built once per shape and reused. */
static cudaDataType_t us__cuda_type(us_dtype dt) { return dt == US_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static us__gemm_plan *us__gemm_plan_get(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K, us_dtype adt,
                                        int64_t lda, us_dtype bdt, int64_t ldb, us_dtype cdt, int64_t ldc, int beta0) {
    us__cuda *c = us__cu(o);
    us__gemm_plan *p;
    cublasOperation_t opx = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heur;
    int i, found = 0;
    for (i = 0; i < c->nplans; i++) {
        p = &c->plans[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda && p->ldb == ldb &&
            p->ldc == ldc && p->adt == (int)adt && p->bdt == (int)bdt && p->cdt == (int)cdt && p->beta0 == beta0)
            return p;
    }
    if (c->nplans == US__CUDA_PLANS) {   /* full: recycle the oldest slot */
        p = &c->plans[0];
        cublasLtMatmulDescDestroy(p->desc); cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb); cublasLtMatrixLayoutDestroy(p->lc);
        memmove(c->plans, c->plans + 1, sizeof(us__gemm_plan) * (US__CUDA_PLANS - 1));
        c->nplans--;
    }
    p = &c->plans[c->nplans];
    memset(p, 0, sizeof *p);
    p->ta = ta; p->tb = tb; p->M = M; p->N = N; p->K = K; p->lda = lda; p->ldb = ldb; p->ldc = ldc;
    p->adt = (int)adt; p->bdt = (int)bdt; p->cdt = (int)cdt; p->beta0 = beta0;
    US__LT(o, cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx));
    US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy));
    /* first operand: B as stored, column-major view [tb ? K x N : N x K] */
    US__LT(o, cublasLtMatrixLayoutCreate(&p->la, us__cuda_type(bdt), tb ? K : N, tb ? N : K, ldb));
    /* second operand: A as stored, column-major view [ta ? M x K : K x M] */
    US__LT(o, cublasLtMatrixLayoutCreate(&p->lb, us__cuda_type(adt), ta ? M : K, ta ? K : M, lda));
    US__LT(o, cublasLtMatrixLayoutCreate(&p->lc, us__cuda_type(cdt), N, M, ldc));
    US__LT(o, cublasLtMatmulPreferenceCreate(&pref));
    US__LT(o, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->ws_bytes, sizeof c->ws_bytes));
    if (!c->failed && cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &heur, &found) == CUBLAS_STATUS_SUCCESS && found)
        p->algo = heur.algo;
    else us__cuda_fail(o, "cublasLtMatmulAlgoGetHeuristic", "no algorithm for this GEMM shape and dtype", __FILE__, __LINE__);
    cublasLtMatmulPreferenceDestroy(pref);
    c->nplans++;
    return p;
}

static void us__cuda_gemm(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const void *A, us_dtype adt, int64_t lda, const void *B, us_dtype bdt, int64_t ldb,
                          float beta, void *C, us_dtype cdt, int64_t ldc) {
    us__cuda *c = us__cu(o);
    us__gemm_plan *p;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* C = beta·C: cuBLASLt wants K ≥ 1 */
        if (beta == 0) { int64_t i; for (i = 0; i < M; i++) US__CU(o, cudaMemsetAsync((char *)C + (size_t)(i * ldc) * us_dtype_size(cdt), 0, (size_t)N * us_dtype_size(cdt), c->stream)); }
        return;
    }
    p = us__gemm_plan_get(o, ta, tb, M, N, K, adt, lda, bdt, ldb, cdt, ldc, beta == 0);
    if (c->failed) return;
    US__LT(o, cublasLtMatmul(c->lt, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc, &p->algo, c->ws, c->ws_bytes, c->stream));
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-kernels  elementwise and row kernels
/* ------------------------------------------------------------------------------------ */
template <typename D, typename S>
__global__ void us__k_cast(D *dst, const S *src, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, st = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += st) us__st(dst, i, us__ld(src, i));
}
static void us__cuda_cast(us_ops *o, void *dst, us_dtype ddt, const void *src, us_dtype sdt, int64_t n) {
    cudaStream_t s = us__cu(o)->stream;
    unsigned g = us__blocks(n, 256);
    if (sdt == US_F32 && ddt == US_BF16) us__k_cast<<<g, 256, 0, s>>>((__nv_bfloat16 *)dst, (const float *)src, n);
    else if (sdt == US_BF16 && ddt == US_F32) us__k_cast<<<g, 256, 0, s>>>((float *)dst, (const __nv_bfloat16 *)src, n);
    else if (sdt == ddt) US__CU(o, cudaMemcpyAsync(dst, src, (size_t)n * us_dtype_size(sdt), cudaMemcpyDeviceToDevice, s));
    else us__cuda_fail(o, "cast", "only fp32 <-> bf16 casts are implemented on CUDA", __FILE__, __LINE__);
    US__LAUNCHED(o);
}

/* Embedding: one block per token row. The backward adds rows with fp32 atomics (fast; the
   order of additions, and so the last bits, can vary between runs). */
template <typename T>
__global__ void us__k_embedding_fwd(T *out, const int32_t *tok, const T *wte, int64_t C) {
    int64_t n = blockIdx.x, c;
    const T *row = wte + (int64_t)tok[n] * C;
    for (c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = row[c];
}
template <typename T>
__global__ void us__k_embedding_bwd(float *dwte, const T *dout, const int32_t *tok, int64_t C) {
    int64_t n = blockIdx.x, c;
    float *row = dwte + (int64_t)tok[n] * C;
    for (c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(row + c, us__ld(dout, n * C + c));
}
static void us__cuda_embedding_fwd(us_ops *o, void *out, const int32_t *tok, const void *wte, int64_t N, int64_t C, us_dtype dt) {
    US__DISPATCH(o, dt, (us__k_embedding_fwd<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>((T_ *)out, tok, (const T_ *)wte, C)));
}
static void us__cuda_embedding_bwd(us_ops *o, float *dwte, const void *dout, const int32_t *tok, int64_t N, int64_t C, us_dtype dt) {
    US__DISPATCH(o, dt, (us__k_embedding_bwd<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>(dwte, (const T_ *)dout, tok, C)));
}

/* RMSNorm: one block per row; sums in fp32 (the CPU reference sums in double: ≤ 1 ulp apart). */
template <typename T>
__global__ void us__k_rmsnorm_fwd(T *out, float *rstd, const T *x, const T *w, int64_t C, float eps) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x, c;
    float ss = 0, r;
    for (c = threadIdx.x; c < C; c += blockDim.x) { float v = us__ld(x, n * C + c); ss += v * v; }
    ss = us__block_sum(ss, sh);
    r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[n] = r;
    for (c = threadIdx.x; c < C; c += blockDim.x) us__st(out, n * C + c, us__ld(x, n * C + c) * r * us__ld(w, c));
}
/* dx += rstd·(dy·w − xhat·mean(dy·w·xhat)), one block per row */
template <typename T>
__global__ void us__k_rmsnorm_bwd_dx(T *dx, const T *dout, const T *x, const T *w, const float *rstd, int64_t C) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x, c;
    float r = rstd[n], dot = 0, mean;
    for (c = threadIdx.x; c < C; c += blockDim.x) dot += us__ld(dout, n * C + c) * us__ld(w, c) * us__ld(x, n * C + c) * r;
    mean = us__block_sum(dot, sh) / (float)C;
    for (c = threadIdx.x; c < C; c += blockDim.x) {
        int64_t i = n * C + c;
        us__st(dx, i, us__ld(dx, i) + r * (us__ld(dout, i) * us__ld(w, c) - us__ld(x, i) * r * mean));
    }
}
/* dw = Σ_n dy·xhat in two passes — partial sums over fixed row chunks, then the chunks in
   order — so the result does not depend on scheduling */
#define US__RMS_ROWS 256
template <typename T>
__global__ void us__k_rmsnorm_bwd_dw_part(float *part, const T *dout, const T *x, const float *rstd, int64_t N, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r0 = (int64_t)blockIdx.y * US__RMS_ROWS, r;
    float acc = 0;
    if (c >= C) return;
    for (r = r0; r < r0 + US__RMS_ROWS && r < N; r++) acc += us__ld(dout, r * C + c) * us__ld(x, r * C + c) * rstd[r];
    part[(int64_t)blockIdx.y * C + c] = acc;
}
__global__ void us__k_rmsnorm_bwd_dw_sum(float *dw, const float *part, int nchunks, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0;
    int k;
    if (c >= C) return;
    for (k = 0; k < nchunks; k++) acc += part[(int64_t)k * C + c];
    dw[c] += acc;
}
static void us__cuda_rmsnorm_fwd(us_ops *o, void *out, float *rstd, const void *x, const void *w, int64_t N, int64_t C, float eps, us_dtype dt) {
    US__DISPATCH(o, dt, (us__k_rmsnorm_fwd<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>((T_ *)out, rstd, (const T_ *)x, (const T_ *)w, C, eps)));
}
static void us__cuda_rmsnorm_bwd(us_ops *o, void *dx, float *dw, const void *dout, const void *x, const void *w, const float *rstd, int64_t N, int64_t C, us_dtype dt) {
    cudaStream_t s = us__cu(o)->stream;
    int nch = (int)((N + US__RMS_ROWS - 1) / US__RMS_ROWS);
    float *part = (float *)us__cuda_scratch(o, (size_t)nch * C * 4);
    dim3 g((unsigned)((C + 127) / 128), (unsigned)nch);
    if (!part) return;
    US__DISPATCH(o, dt, (us__k_rmsnorm_bwd_dx<T_><<<(unsigned)N, 256, 0, s>>>((T_ *)dx, (const T_ *)dout, (const T_ *)x, (const T_ *)w, rstd, C)));
    US__DISPATCH(o, dt, (us__k_rmsnorm_bwd_dw_part<T_><<<g, 128, 0, s>>>(part, (const T_ *)dout, (const T_ *)x, rstd, N, C)));
    us__k_rmsnorm_bwd_dw_sum<<<(unsigned)((C + 255) / 256), 256, 0, s>>>(dw, part, nch, C);
    US__LAUNCHED(o);
}

/* RoPE (rotate-half), in place on the q and k heads of qkv[N, QKV]; one thread per pair.
   The angle is formed in double, as in the CPU reference, so long sequences keep precision. */
template <typename T>
__global__ void us__k_rope(T *qkv, int64_t N, int64_t T_len, int NH, int NKV, int HS, float theta, float dir) {
    int half = HS / 2, nrot = NH + NKV;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, total = N * nrot * half;
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS;
    if (i >= total) return;
    {
        int j = (int)(i % half);
        int64_t h = (i / half) % nrot, n = i / ((int64_t)half * nrot), t = n % T_len;
        double ang = (double)t * pow((double)theta, -2.0 * j / HS);
        float cs = (float)cos(ang), sn = (float)sin(ang) * dir;
        T *v = qkv + n * QKV + h * HS;
        float a = us__ld(v, j), b = us__ld(v, j + half);
        us__st(v, j, a * cs - b * sn);
        us__st(v, j + half, b * cs + a * sn);
    }
}
static void us__cuda_rope(us_ops *o, void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS, float theta, us_dtype dt, float dir) {
    int64_t total = B * T * (NH + NKV) * (HS / 2);
    US__DISPATCH(o, dt, (us__k_rope<T_><<<us__blocks(total, 256), 256, 0, us__cu(o)->stream>>>((T_ *)qkv, B * T, T, NH, NKV, HS, theta, dir)));
}
static void us__cuda_rope_fwd(us_ops *o, void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS, float theta, us_dtype dt) {
    us__cuda_rope(o, qkv, B, T, NH, NKV, HS, theta, dt, 1.0f);
}
static void us__cuda_rope_bwd(us_ops *o, void *dqkv, int64_t B, int64_t T, int NH, int NKV, int HS, float theta, us_dtype dt) {
    us__cuda_rope(o, dqkv, B, T, NH, NKV, HS, theta, dt, -1.0f);
}

/* SwiGLU on gu[N, 2F] = gate | up */
template <typename T>
__global__ void us__k_swiglu_fwd(T *h, const T *gu, int64_t N, int64_t F) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * F) return;
    {
        int64_t n = i / F, f = i % F;
        float g = us__ld(gu, n * 2 * F + f), u = us__ld(gu, n * 2 * F + F + f);
        us__st(h, i, g / (1.0f + expf(-g)) * u);
    }
}
template <typename T>
__global__ void us__k_swiglu_bwd(T *dgu, const T *dh, const T *gu, int64_t N, int64_t F) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * F) return;
    {
        int64_t n = i / F, f = i % F;
        float g = us__ld(gu, n * 2 * F + f), u = us__ld(gu, n * 2 * F + F + f), d = us__ld(dh, i);
        float sg = 1.0f / (1.0f + expf(-g));
        us__st(dgu, n * 2 * F + f, d * u * sg * (1.0f + g * (1.0f - sg)));
        us__st(dgu, n * 2 * F + F + f, d * g * sg);
    }
}
static void us__cuda_swiglu_fwd(us_ops *o, void *h, const void *gu, int64_t N, int64_t F, us_dtype dt) {
    US__DISPATCH(o, dt, (us__k_swiglu_fwd<T_><<<us__blocks(N * F, 256), 256, 0, us__cu(o)->stream>>>((T_ *)h, (const T_ *)gu, N, F)));
}
static void us__cuda_swiglu_bwd(us_ops *o, void *dgu, const void *dh, const void *gu, int64_t N, int64_t F, us_dtype dt) {
    US__DISPATCH(o, dt, (us__k_swiglu_bwd<T_><<<us__blocks(N * F, 256), 256, 0, us__cu(o)->stream>>>((T_ *)dgu, (const T_ *)dh, (const T_ *)gu, N, F)));
}

/* Fused softmax-cross-entropy: one block per row reads the logits twice (max+sum, then the
   gradient written over them); probabilities never reach memory. */
template <typename T>
__global__ void us__k_xent(float *losses, int32_t *argmax, T *logits, const int32_t *tgt, int64_t V, float dscale) {
    __shared__ float sh[32];
    __shared__ int shi[32];
    int64_t n = blockIdx.x, v;
    T *row = logits + n * V;
    float mx = -INFINITY, sum = 0, lse;
    int am = 0, y = tgt[n];
    for (v = threadIdx.x; v < V; v += blockDim.x) { float x = us__ld(row, v); if (x > mx) { mx = x; am = (int)v; } }
    {   /* block argmax: the smallest index among the maxima, like the CPU's first-max scan */
        float bm = us__block_max(mx, sh);
        int cand = mx == bm ? am : 0x7fffffff, lane = threadIdx.x & 31, w = threadIdx.x >> 5, i;
        for (i = 16; i > 0; i >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, i));
        __syncthreads();
        if (lane == 0) shi[w] = cand;
        __syncthreads();
        am = 0x7fffffff;
        for (i = 0; i < (int)(blockDim.x >> 5); i++) am = min(am, shi[i]);
        mx = bm;
    }
    for (v = threadIdx.x; v < V; v += blockDim.x) sum += expf(us__ld(row, v) - mx);
    sum = us__block_sum(sum, sh);
    lse = logf(sum) + mx;
    if (threadIdx.x == 0) {
        losses[n] = y < 0 ? 0.0f : lse - us__ld(row, y);
        if (argmax) argmax[n] = am;
    }
    if (dscale != 0.0f) {
        __syncthreads();   /* row[y] was read above before it is overwritten below */
        for (v = threadIdx.x; v < V; v += blockDim.x)
            us__st(row, v, y < 0 ? 0.0f : dscale * (expf(us__ld(row, v) - lse) - (v == y ? 1.0f : 0.0f)));
    }
}
static void us__cuda_xent(us_ops *o, float *losses, int32_t *argmax, void *logits, const int32_t *tgt, int64_t N, int64_t V, float dscale, us_dtype dt) {
    US__DISPATCH(o, dt, (us__k_xent<T_><<<(unsigned)N, 1024, 0, us__cu(o)->stream>>>(losses, argmax, (T_ *)logits, tgt, V, dscale)));
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-attention  portable kernels (any dtype, HS ≤ 256); flash attention for bf16
/* ------------------------------------------------------------------------------------ */
/* Portable forward: one thread per query row, online softmax over the keys — the textbook
   algorithm, slow but exact in fp32; used for fp32 training and head sizes flash lacks. */
#define US__ATT_MAX_HS 256
template <typename T>
__global__ void us__k_att_fwd(T *out, float *lse, const T *qkv, int64_t B, int64_t T_len, int NH, int NKV, int HS) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, QKV = (int64_t)(NH + 2 * NKV) * HS, j;
    float q[US__ATT_MAX_HS], acc[US__ATT_MAX_HS], m = -INFINITY, l = 0, scale = rsqrtf((float)HS);
    int d;
    if (i >= B * NH * T_len) return;
    {
        int64_t t = i % T_len, h = (i / T_len) % NH, b = i / (T_len * NH), g = h / (NH / NKV);
        for (d = 0; d < HS; d++) { q[d] = us__ld(qkv, (b * T_len + t) * QKV + h * HS + d); acc[d] = 0; }
        for (j = 0; j <= t; j++) {
            const T *k = qkv + (b * T_len + j) * QKV + (NH + g) * HS, *v = qkv + (b * T_len + j) * QKV + (NH + NKV + g) * HS;
            float s = 0, mn, corr, p;
            for (d = 0; d < HS; d++) s += q[d] * us__ld(k, d);
            s *= scale;
            mn = fmaxf(m, s); corr = expf(m - mn); p = expf(s - mn);
            l = l * corr + p;
            for (d = 0; d < HS; d++) acc[d] = acc[d] * corr + p * us__ld(v, d);
            m = mn;
        }
        for (d = 0; d < HS; d++) us__st(out, (b * T_len + t) * NH * HS + h * HS + d, acc[d] / l);
        lse[(b * NH + h) * T_len + t] = m + logf(l);
    }
}
/* Portable backward, two kernels so each output has one writer: dq per query row; dk, dv per
   key row summing over the query heads of its group and the queries that see it. */
template <typename T>
__global__ void us__k_att_bwd_dq(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, int64_t B, int64_t T_len, int NH, int NKV, int HS) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, QKV = (int64_t)(NH + 2 * NKV) * HS, j;
    float q[US__ATT_MAX_HS], dq[US__ATT_MAX_HS], dO[US__ATT_MAX_HS], D = 0, scale = rsqrtf((float)HS);
    int d;
    if (i >= B * NH * T_len) return;
    {
        int64_t t = i % T_len, h = (i / T_len) % NH, b = i / (T_len * NH), g = h / (NH / NKV), orow = (b * T_len + t) * NH * HS + h * HS;
        float L = lse[(b * NH + h) * T_len + t];
        for (d = 0; d < HS; d++) {
            q[d] = us__ld(qkv, (b * T_len + t) * QKV + h * HS + d); dO[d] = us__ld(dout, orow + d);
            D += dO[d] * us__ld(out, orow + d); dq[d] = 0;
        }
        for (j = 0; j <= t; j++) {
            const T *k = qkv + (b * T_len + j) * QKV + (NH + g) * HS, *v = qkv + (b * T_len + j) * QKV + (NH + NKV + g) * HS;
            float s = 0, dp = 0, p, ds;
            for (d = 0; d < HS; d++) { s += q[d] * us__ld(k, d); dp += dO[d] * us__ld(v, d); }
            p = expf(s * scale - L);
            ds = p * (dp - D) * scale;
            for (d = 0; d < HS; d++) dq[d] += ds * us__ld(k, d);
        }
        for (d = 0; d < HS; d++) us__st(dqkv, (b * T_len + t) * QKV + h * HS + d, dq[d]);
    }
}
template <typename T>
__global__ void us__k_att_bwd_dkv(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse, int64_t B, int64_t T_len, int NH, int NKV, int HS) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, QKV = (int64_t)(NH + 2 * NKV) * HS, t;
    float k[US__ATT_MAX_HS], v[US__ATT_MAX_HS], dk[US__ATT_MAX_HS], dv[US__ATT_MAX_HS], scale = rsqrtf((float)HS);
    int d, h, grp = NH / NKV;
    if (i >= B * NKV * T_len) return;
    {
        int64_t j = i % T_len, g = (i / T_len) % NKV, b = i / (T_len * NKV);
        for (d = 0; d < HS; d++) {
            k[d] = us__ld(qkv, (b * T_len + j) * QKV + (NH + g) * HS + d);
            v[d] = us__ld(qkv, (b * T_len + j) * QKV + (NH + NKV + g) * HS + d);
            dk[d] = 0; dv[d] = 0;
        }
        for (h = (int)g * grp; h < ((int)g + 1) * grp; h++)
            for (t = j; t < T_len; t++) {
                const T *q = qkv + (b * T_len + t) * QKV + h * HS;
                int64_t orow = (b * T_len + t) * NH * HS + h * HS;
                float s = 0, dp = 0, D = 0, p, ds;
                for (d = 0; d < HS; d++) {
                    float o_ = us__ld(dout, orow + d);
                    s += us__ld(q, d) * k[d]; dp += o_ * v[d]; D += o_ * us__ld(out, orow + d);
                }
                p = expf(s * scale - lse[(b * NH + h) * T_len + t]);
                ds = p * (dp - D) * scale;
                for (d = 0; d < HS; d++) { dk[d] += ds * us__ld(q, d); dv[d] += p * us__ld(dout, orow + d); }
            }
        for (d = 0; d < HS; d++) {
            us__st(dqkv, (b * T_len + j) * QKV + (NH + g) * HS + d, dk[d]);
            us__st(dqkv, (b * T_len + j) * QKV + (NH + NKV + g) * HS + d, dv[d]);
        }
    }
}

#ifdef US__HAVE_FLASH
/* flash kernels: see the flash-attention section below (bf16, HS 64/128) */
static int us__flash_ok(us_dtype dt, int HS);
static void us__flash_fwd_any(us_ops *o, void *out, float *lse, const void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS);
static void us__flash_bwd_any(us_ops *o, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse, int64_t B, int64_t T, int NH, int NKV, int HS);
#endif

static void us__cuda_attention_fwd(us_ops *o, void *out, float *lse, const void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS, us_dtype dt) {
#ifdef US__HAVE_FLASH
    if (us__flash_ok(dt, HS)) { us__flash_fwd_any(o, out, lse, qkv, B, T, NH, NKV, HS); return; }
#endif
    if (HS > US__ATT_MAX_HS) { us__cuda_fail(o, "attention", "head size above 256", __FILE__, __LINE__); return; }
    US__DISPATCH(o, dt, (us__k_att_fwd<T_><<<us__blocks(B * NH * T, 128), 128, 0, us__cu(o)->stream>>>((T_ *)out, lse, (const T_ *)qkv, B, T, NH, NKV, HS)));
}
static void us__cuda_attention_bwd(us_ops *o, void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse, int64_t B, int64_t T, int NH, int NKV, int HS, us_dtype dt) {
    cudaStream_t s = us__cu(o)->stream;
#ifdef US__HAVE_FLASH
    if (us__flash_ok(dt, HS)) { us__flash_bwd_any(o, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS); return; }
#endif
    if (HS > US__ATT_MAX_HS) { us__cuda_fail(o, "attention", "head size above 256", __FILE__, __LINE__); return; }
    US__DISPATCH(o, dt, (us__k_att_bwd_dq<T_><<<us__blocks(B * NH * T, 128), 128, 0, s>>>((T_ *)dqkv, (const T_ *)dout, (const T_ *)qkv, (const T_ *)out, lse, B, T, NH, NKV, HS)));
    US__DISPATCH(o, dt, (us__k_att_bwd_dkv<T_><<<us__blocks(B * NKV * T, 128), 128, 0, s>>>((T_ *)dqkv, (const T_ *)dout, (const T_ *)qkv, (const T_ *)out, lse, B, T, NH, NKV, HS)));
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-optimizer  AdamW over flat fp32 buffers, Σx² for the global norm
/* ------------------------------------------------------------------------------------ */
template <typename L>
__global__ void us__k_adamw(float *p, const float *g, float *m, float *v, L *low, int64_t n, float lr, float b1, float b2,
                            float eps, float wd, float gscale, float bc1, float bc2) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, st = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += st) {
        float gi = g[i] * gscale, mi = b1 * m[i] + (1.0f - b1) * gi, vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        float pi = p[i] * (1.0f - lr * wd) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        m[i] = mi; v[i] = vi; p[i] = pi;
        if (low) us__st(low, i, pi);
    }
}
static void us__cuda_adamw(us_ops *o, float *p, const float *g, float *m, float *v, void *p_lowp, us_dtype lowdt, int64_t n,
                           float lr, float beta1, float beta2, float eps, float wd, float gscale, int step) {
    cudaStream_t s = us__cu(o)->stream;
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    unsigned gr = us__blocks(n, 256);
    if (!p_lowp || lowdt == US_F32) us__k_adamw<float><<<gr, 256, 0, s>>>(p, g, m, v, (float *)p_lowp, n, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
    else us__k_adamw<__nv_bfloat16><<<gr, 256, 0, s>>>(p, g, m, v, (__nv_bfloat16 *)p_lowp, n, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
    US__LAUNCHED(o);
}

/* Σx² with a fixed grid: each block sums a fixed stride pattern in double, then one block sums
   the partials in order — the same bits every run. */
#define US__RED_BLOCKS 512
__global__ void us__k_sumsq_part(double *part, const float *x, int64_t n) {
    __shared__ double sh[32];
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, st = (int64_t)gridDim.x * blockDim.x;
    double a = 0;
    for (; i < n; i += st) a += (double)x[i] * x[i];
    a = us__block_sum(a, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = a;
}
__global__ void us__k_sumsq_final(double *part, int nb) {
    __shared__ double sh[32];
    double a = 0;
    int i;
    for (i = threadIdx.x; i < nb; i += blockDim.x) a += part[i];
    a = us__block_sum(a, sh);
    if (threadIdx.x == 0) part[0] = a;
}
static double us__cuda_sumsq(us_ops *o, const float *x, int64_t n) {
    us__cuda *c = us__cu(o);
    double *part = (double *)us__cuda_scratch(o, US__RED_BLOCKS * sizeof(double));
    if (!part) return NAN;
    us__k_sumsq_part<<<US__RED_BLOCKS, 256, 0, c->stream>>>(part, x, n);
    us__k_sumsq_final<<<1, 256, 0, c->stream>>>(part, US__RED_BLOCKS);
    US__LAUNCHED(o);
    US__CU(o, cudaMemcpyAsync(c->host_red, part, sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    US__CU(o, cudaStreamSynchronize(c->stream));
    return c->failed ? NAN : *c->host_red;
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-core  the ops table
/* ------------------------------------------------------------------------------------ */
US_API int us_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}

US_API us_result us_cuda_ops(us_ops *o, int device, char *err, size_t errlen) {
    us__cuda *c;
    int n = us_cuda_device_count();
    cudaError_t e;
    memset(o, 0, sizeof *o);
    if (n == 0) { us__errf(err, errlen, "no CUDA device is available"); return US_ERR_BACKEND; }
    if (device < 0 || device >= n) { us__errf(err, errlen, "CUDA device %d does not exist (%d present)", device, n); return US_ERR_INVALID; }
    if ((e = cudaSetDevice(device)) != cudaSuccess) { us__errf(err, errlen, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e)); return US_ERR_BACKEND; }
    c = (us__cuda *)calloc(1, sizeof *c);
    if (!c) { us__errf(err, errlen, "out of host memory"); return US_ERR_OOM; }
    c->device = device;
    o->name = "cuda";
    o->backend = c;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMallocHost((void **)&c->host_red, sizeof(double))) != cudaSuccess) {
        us__errf(err, errlen, "CUDA set-up failed: %s", cudaGetErrorString(e));
        free(c); o->backend = NULL; return US_ERR_BACKEND;
    }
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) { us__errf(err, errlen, "cublasLtCreate failed"); us_cuda_ops_free(o); return US_ERR_BACKEND; }
    c->ws_bytes = (size_t)32 << 20;   /* 32 MiB: enough for Hopper's split-K and stream-K kernels */
    c->ws = us__cuda_alloc(o, c->ws_bytes);
    if (!c->ws) { us__errf(err, errlen, "cannot allocate the %zu-byte cuBLASLt workspace", c->ws_bytes); us_cuda_ops_free(o); return US_ERR_OOM; }
    o->alloc = us__cuda_alloc;          o->free = us__cuda_free;           o->zero = us__cuda_zero;
    o->copy = us__cuda_copy;            o->sync = us__cuda_sync;           o->cast = us__cuda_cast;
    o->gemm = us__cuda_gemm;
    o->embedding_fwd = us__cuda_embedding_fwd;  o->embedding_bwd = us__cuda_embedding_bwd;
    o->rmsnorm_fwd = us__cuda_rmsnorm_fwd;      o->rmsnorm_bwd = us__cuda_rmsnorm_bwd;
    o->rope_fwd = us__cuda_rope_fwd;            o->rope_bwd = us__cuda_rope_bwd;
    o->attention_fwd = us__cuda_attention_fwd;  o->attention_bwd = us__cuda_attention_bwd;
    o->swiglu_fwd = us__cuda_swiglu_fwd;        o->swiglu_bwd = us__cuda_swiglu_bwd;
    o->xent = us__cuda_xent;            o->adamw = us__cuda_adamw;         o->sumsq = us__cuda_sumsq;
    o->error = us__cuda_error;
    return US_OK;
}

US_API void us_cuda_ops_free(us_ops *o) {
    us__cuda *c = o->backend ? us__cu(o) : NULL;
    int i;
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    for (i = 0; i < c->nplans; i++) {
        cublasLtMatmulDescDestroy(c->plans[i].desc); cublasLtMatrixLayoutDestroy(c->plans[i].la);
        cublasLtMatrixLayoutDestroy(c->plans[i].lb); cublasLtMatrixLayoutDestroy(c->plans[i].lc);
    }
    if (c->ws) cudaFree(c->ws);
    if (c->scratch) cudaFree(c->scratch);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->host_red) cudaFreeHost(c->host_red);
    cudaStreamDestroy(c->stream);
    free(c);
    o->backend = NULL;
}

US_API void us_cuda_describe(const us_ops *o, char *buf, size_t buflen) {
    struct cudaDeviceProp p;
    int dev = o->backend ? ((const us__cuda *)o->backend)->device : 0;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) { cudaGetLastError(); snprintf(buf, buflen, "CUDA device %d", dev); return; }
    snprintf(buf, buflen, "%s (sm_%d%d, %d SMs, %.0f GiB)", p.name, p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / 1073741824.0);
}

#endif /* ULTRASCALE_CUDA_IMPLEMENTATION_DONE */
#endif /* ULTRASCALE_IMPLEMENTATION */
