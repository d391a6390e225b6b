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
   (other architectures compile too: the Hopper attention kernels need an sm_90a pass, the
   mma.sync ones sm_80 or newer; elsewhere attention falls back to the portable kernel, and
   us_cuda_attention_path says which one a shape gets).

   What is here (the Playbook's "going deeper into the GPU"):
     // >>cuda-core       device memory, one stream, error recording, memory accounting
     // >>cuda-gemm       cuBLASLt GEMMs (bf16, fp16 or fp32 operands, fp32 accumulate), plans cached per shape
     // >>cuda-kernels    embedding, RMSNorm, RoPE, SwiGLU, fused softmax-cross-entropy, casts
     // >>cuda-attention  portable attention (any dtype/head size)
     // >>cuda-flash      flash attention: bf16, HS 64/128, mma.sync tensor cores, deterministic backward
     // >>cuda-hopper     FlashAttention-3 on Hopper: wgmma, TMA, warp specialisation; bf16/fp16, HS 64-256
     // >>cuda-cp-flash   the same by key blocks with positions (ring attention's blocks): bf16/fp16, HS 64-256, state in fp32;
                         wgmma on Hopper, mma.sync elsewhere
     // >>cuda-moe        mixture of experts: router (+ backward), counting-sort permute, row gather / scatter-add, gate gradient
     // >>cuda-grouped    grouped GEMM: a MoE layer's experts in one launch (wgmma; mma.sync)
     // >>cuda-optimizer  AdamW on flat buffers, Σx² for the global norm
     // >>cuda-fp8        FP8 training: fused tile quantisation (amax, scale, E4M3 cast in one pass), block-scaled cuBLASLt FP8 GEMMs
     // >>cuda-ops        the ops table: us_cuda_ops, the attention path queries
   Every kernel computes in fp32 and rounds once on store, like the CPU reference, and is
   checked against it by tests/test_cuda.cu. CUDA and cuBLASLt errors never exit: the first one
   is recorded and surfaces as US_ERR_BACKEND from the next library call. */
#ifndef ULTRASCALE_CUDA_CUH
#define ULTRASCALE_CUDA_CUH

#include "ultrascale.h"
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublasLt.h>
#include <cuda_fp8.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Fills *ops with the CUDA implementation on `device`. On failure writes one sentence into err. */
US_API us_result us_cuda_ops(us_ops *ops, int device, char *err, size_t errlen);
US_API void us_cuda_ops_free(us_ops *ops);
US_API int us_cuda_device_count(void);
/* The device's name and memory, for logs. */
US_API void us_cuda_describe(const us_ops *ops, char *buf, size_t buflen);
/* Which kernels attention runs for activations of type dt and head size head_size (by key blocks
   with positions when by_blocks, as context parallelism runs it): "hopper" (wgmma, sm_90a),
   "flash" (mma.sync, sm_80+) or "portable" (one thread per query row: correct, and about a
   hundred times slower). Trainers say so at start when it is "portable". */
US_API const char *us_cuda_attention_path(us_ops *ops, us_dtype dt, int head_size, int by_blocks);
/* Keeps attention off the Hopper kernels, so that tests and benchmarks can compare the paths:
   0 every path (the default), 1 none of the Hopper kernels, 2 not the Hopper forward, 3 not
   the Hopper backward, 4 the Hopper backward always as two kernels (dK/dV, then dQ), 5 always
   fused (dQ inside the dK/dV kernel) where it is compiled (HS 64 and 128), which measured
   slower (us__hop_fused); 6 every Hopper kernel but context parallelism's block kernels
   (attn_block_fwd/bwd then take the mma.sync ones of // >>cuda-cp-flash); 7 the backward with
   dS through memory (the dK/dV kernel stores dS, a second kernel forms dQ from it) at every HS up
   to 128. By default the backward runs that way at HS 96 and 128, in chunks whose dS takes at
   most 1/32 of the GPU's memory, and as two kernels elsewhere (us__hop_ds_pairs); so does
   context parallelism's block backward (us__hop_block_ds_pairs). */
US_API void us_cuda_attention_no_hopper(us_ops *ops, int which);
/* Runs the persistent Hopper kernels (the forward, the backward's dK/dV and dQ) on at most ctas
   CTAs (0, the default: one per SM), so that tests can send many query tiles and key blocks
   through each CTA's rings on any GPU, and benchmarks can compare with one CTA per tile or key
   block (a large ctas). */
US_API void us_cuda_attention_grid(us_ops *ops, int ctas);
/* How many (batch, kv head) pairs the Hopper kernels (the forward, dK/dV, dQ) take at a time, in
   bands, so that the CTAs at work share the key/value or query rows they read in L2: 0, the
   default, one band while each pair has four CTAs at work, else about a sixth as many pairs as
   CTAs (us__hop_band); n > 0 that many; −1 all pairs in one band (the order before bands, for
   benchmarks to compare). The same bits either way. */
US_API void us_cuda_attention_band(us_ops *ops, int pairs);
/* How many (batch, kv head) pairs a chunk of the backward with dS through memory takes (0, the
   default: as many as 1/32 of the GPU's memory holds), so that tests can run it in chunks. The
   same bits either way. */
US_API void us_cuda_attention_ds_pairs(us_ops *ops, int pairs);

/* gemm_grouped's path on the GPU (// >>cuda-grouped), for tests and benchmarks to compare:
   US_CUDA_GG_AUTO (the default) the Hopper kernel where the size rule says it is faster, else
   the loop; US_CUDA_GG_MMA_SYNC the one-launch mma.sync kernel (sm_80+); US_CUDA_GG_LOOP one
   cuBLASLt GEMM per group; US_CUDA_GG_WGMMA the one-launch wgmma kernel (sm_90a). A kernel that
   cannot take the operands (fp32, strides or sizes not multiples of 8, another GPU) gives way to
   the loop. */
typedef enum us_cuda_gg_path {
    US_CUDA_GG_AUTO = 0,
    US_CUDA_GG_MMA_SYNC = 1,
    US_CUDA_GG_LOOP = 2,
    US_CUDA_GG_WGMMA = 3
} us_cuda_gg_path;

US_API void us_cuda_grouped_kernel(us_ops *ops, int path);
/* Choosing cuBLASLt's algorithm by timing it where it runs (// >>cuda-gemm, us__lt_matmul). With
   on = 1, each GEMM plan (bf16/fp16/fp32 and FP8) asks cuBLASLt's heuristic for up to 8
   candidates and its calls take them in turn, each call timed by a pair of CUDA events on the
   stream: run the steps you want timed in their real setting (two or more training steps: every
   plan is called once a layer). With on = 0, the stream is synchronized and each plan keeps the
   candidate of lowest median time, if it beats the heuristic's first by more than 1 %; the
   plans chosen stay for the run. Off by default: which candidate wins can differ from run to run,
   and with it the last bits of the results (each candidate is a correct GEMM). Returns, on 0,
   how many plans changed their algorithm; on 1, how many plans have timed two or more of their
   candidates so far (0 when tuning starts). */
US_API int us_cuda_gemm_tune(us_ops *ops, int on);
/* The algorithm of every GEMM plan (tuned or the heuristic's) saved to a text file, and read back
   in other runs, which then take the same algorithms, and whose GEMMs give the same bits as one
   another's (the run that tuned took the candidates in turn while tuning; the embedding
   backward's fp32 atomics still vary a GPU training run's last bits): after us_cuda_gemm_tune_load,
   each plan whose shape the file names takes the file's algorithm when it is made (and is never
   timed again); other plans take the heuristic's as always. The file names the cuBLASLt version,
   the GPU and the workspace it was written for, and load refuses a file of another (the
   algorithms are cuBLASLt's own structures), a line it does not understand, or an algorithm
   cuBLASLt refuses for its shape, each with one sentence in err. save writes PATH.tmp and renames
   it, so a failed save leaves PATH as it was. US_OK, US_ERR_IO or US_ERR_FORMAT. */
US_API us_result us_cuda_gemm_tune_save(us_ops *ops, const char *path, char *err, size_t errlen);
US_API us_result us_cuda_gemm_tune_load(us_ops *ops, const char *path, char *err, size_t errlen);
/* Device memory in use on the ops' GPU (total − free, cudaMemGetInfo), in bytes: the real
   footprint beside the allocator's count (us_ops.bytes_peak) — the CUDA context, cuBLASLt's
   workspace, NCCL's buffers and the scratch included — and anything other processes hold there.
   A reading of now, not a peak: take it after a step. 0 on failure. */
US_API size_t us_cuda_device_used(const us_ops *ops);
/* The compute stream every op of these ops runs on (a cudaStream_t), for the NCCL backend to
   order its communication stream against. */
US_API void *us_cuda_stream(const us_ops *ops);
#ifdef __cplusplus
}
#endif
#endif /* ULTRASCALE_CUDA_CUH */

#ifdef ULTRASCALE_IMPLEMENTATION
#ifndef ULTRASCALE_CUDA_IMPLEMENTATION_DONE
#define ULTRASCALE_CUDA_IMPLEMENTATION_DONE

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>

/* US__CUDA_FLASH_ONLY (defined by tests/flash_test.cu) compiles // >>cuda-flash alone: that test
   calls the mma.sync kernels with their internal tilings, and every other chapter's kernels
   compiled for it too would be most of its build time (make test builds it wherever nvcc is). */
#ifndef US__CUDA_FLASH_ONLY
/* ------------------------------------------------------------------------------------ */
// >>cuda-core  device memory, one stream, error recording
/* ------------------------------------------------------------------------------------ */
#define US__CUDA_PLANS 256
#define US__FP8_PLANS 64 /* FP8 GEMM plans cached (// >>cuda-fp8) */

#define US__TUNE_CANDS 8    /* cuBLASLt candidates a tuned plan tries (us_cuda_gemm_tune) */
#define US__TUNE_SAMPLES 64 /* timed calls a plan keeps while tuning */

typedef struct us__gemm_plan {
    int ta, tb, adt, bdt, cdt, beta0, sms; /* sms: the SM count the heuristic targeted (0: all) */
    int64_t M, N, K, lda, ldb, ldc;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    /* us_cuda_gemm_tune: the candidates (ncand > 1 while tuning), each call's candidate (who)
       and its two events; tuned once its choice is made */
    int ncand, ns, tuned;
    cublasLtMatmulAlgo_t cand[US__TUNE_CANDS];
    unsigned char who[US__TUNE_SAMPLES];
    cudaEvent_t ev[US__TUNE_SAMPLES][2];
} us__gemm_plan;

#define US__CUDA_MARKS 8192 /* trace marks per step: two per traced region */

typedef struct us__cuda {
    int device, cc_major, n_sm;
    size_t mem_total; /* the GPU's memory, bytes */
    int hop_off;      /* attention skips // >>cuda-hopper: 1 both ways, 2 forward, 3 backward; 4 the
                    two-kernel backward always, 5 the fused one always, 6 not the block kernels
                    of context parallelism, 7 the backward with dS through memory (tests,
                    benchmarks) */
    int hop_grid; /* CTAs of the persistent Hopper kernels: 0 one per SM (tests ask for fewer) */
    int hop_band; /* (batch, kv head) pairs a band of the Hopper kernels' tile order: 0 by the
                     CTAs at work (us__hop_band), -1 all in one band */
    int hop_ds_pairs; /* (batch, kv head) pairs a chunk of the backward with dS through memory: 0
                         by the GPU's memory (us__hop_ds_pairs) */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *ws; /* cuBLASLt workspace */
    size_t ws_bytes;
    us__gemm_plan plans[US__CUDA_PLANS];
    int nplans;
    us__gemm_plan
        fp8_plans[US__FP8_PLANS]; /* FP8 GEMM plans (// >>cuda-fp8); adt/bdt hold the two tilings */
    int nfp8;
    unsigned *fp8_amax; /* per-tensor amax slot (// >>cuda-fp8) */
    unsigned gg_smem;   /* grouped GEMM kernels given their shared memory (// >>cuda-grouped) */
    int gg_kernel;      /* gemm_grouped's path, as us_cuda_grouped_kernel sets it */
    int tuning;         /* plans time their candidates (us_cuda_gemm_tune) */
    struct us__tune_rec
        *tune_recs; /* plans' algorithms read from a file (us_cuda_gemm_tune_load) */
    int ntune_recs;
    void *ggh_tab;   /* host us__ggh_table the Hopper grouped kernel's launches are filled in */
    void *scratch;   /* grows on demand: reductions, attention backward */
    float *rope_tab; /* RoPE cos|sin [T, HS/2] for (rope_T, rope_HS, rope_freq), then the
                           frequencies f64[HS/2] it was made from */
    size_t rope_bytes;
    int64_t rope_T;
    int rope_HS;
    double *rope_freq; /* host f64[rope_HS/2]: the frequencies of the table now */
    size_t scratch_bytes;
    double *host_red; /* pinned host slot for reduction results */

    struct {
        void *p;
        size_t n;
    } allocs[256]; /* sizes of live allocations, for accounting (beyond 256 live ones, frees are
                      not subtracted) */

    cudaEvent_t
        marks[US__CUDA_MARKS]; /* trace marks on the stream (us_ops.mark), created on first use */
    int nmarks;                /* marks in use since the last mark_reset */
    cudaEvent_t mark_ref;      /* a mark whose host time is known: the others are timed from it */
    double mark_ref_us;
    int failed;
    char err[256];
} us__cuda;

static us__cuda *us__cu(us_ops *o) { return (us__cuda *)o->backend; }

/* Records the first failure; every later op still runs but the model reports the error. */
static void us__cuda_fail(us_ops *o, const char *what, const char *msg, const char *file,
                          int line) {
    us__cuda *c = us__cu(o);
    if (c->failed) return;
    c->failed = 1;
    snprintf(c->err, sizeof c->err, "%s failed: %s (%s:%d)", what, msg, file, line);
}

#define US__CU(o, call)                                                          \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess)                                                   \
            us__cuda_fail(o, #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define US__LT(o, call)                                                               \
    do {                                                                              \
        cublasStatus_t s_ = (call);                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                              \
            us__cuda_fail(o, #call, cublasLtGetStatusString(s_), __FILE__, __LINE__); \
    } while (0)
#define US__LAUNCHED(o) US__CU(o, cudaGetLastError())

static const char *us__cuda_error(us_ops *o) { return us__cu(o)->failed ? us__cu(o)->err : NULL; }

static void *us__cuda_alloc(us_ops *o, size_t bytes) {
    us__cuda *c = us__cu(o);
    void *p = NULL;
    int i;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    } /* OOM is a result, not a sticky error */
    US__CU(o, cudaMemsetAsync(p, 0, bytes, c->stream));
    for (i = 0; i < 256; i++)
        if (!c->allocs[i].p) {
            c->allocs[i].p = p;
            c->allocs[i].n = bytes;
            break;
        }
    o->bytes_in_use += bytes;
    if (o->bytes_in_use > o->bytes_peak) o->bytes_peak = o->bytes_in_use;
    return p;
}

static void us__cuda_free(us_ops *o, void *p) {
    us__cuda *c = us__cu(o);
    int i;
    if (!p) return;
    for (i = 0; i < 256; i++)
        if (c->allocs[i].p == p) {
            o->bytes_in_use -= c->allocs[i].n;
            c->allocs[i].p = NULL;
            break;
        }
    US__CU(o, cudaFree(p));
}

static void us__cuda_zero(us_ops *o, void *p, size_t bytes) {
    US__CU(o, cudaMemsetAsync(p, 0, bytes, us__cu(o)->stream));
}

static void us__cuda_copy(us_ops *o, void *dst, const void *src, size_t bytes, us_copy_kind kind) {
    us__cuda *c = us__cu(o);
    cudaMemcpyKind k = kind == US_COPY_H2D   ? cudaMemcpyHostToDevice
                       : kind == US_COPY_D2H ? cudaMemcpyDeviceToHost
                                             : cudaMemcpyDeviceToDevice;
    if (!bytes) return;
    US__CU(o, cudaMemcpyAsync(dst, src, bytes, k, c->stream));
    if (kind != US_COPY_D2D)
        US__CU(o, cudaStreamSynchronize(c->stream)); /* host memory is usable on return */
}

static void us__cuda_sync(us_ops *o) { US__CU(o, cudaStreamSynchronize(us__cu(o)->stream)); }

/* Trace marks (// >>trace): an event recorded on the stream per mark. The first mark ever also
   pins the GPU clock to the host's: one event recorded, waited for, and the host time read at
   once (a few microseconds late at most); every later mark is timed from it. */
static int us__cuda_mark(us_ops *o) {
    us__cuda *c = us__cu(o);
    if (!c->mark_ref) {
        if (cudaEventCreate(&c->mark_ref) != cudaSuccess) {
            cudaGetLastError();
            c->mark_ref = NULL;
            return -1;
        }
        US__CU(o, cudaEventRecord(c->mark_ref, c->stream));
        US__CU(o, cudaEventSynchronize(c->mark_ref));
        c->mark_ref_us = us_trace_now_us();
    }
    if (c->nmarks == US__CUDA_MARKS) return -1;
    if (!c->marks[c->nmarks] && cudaEventCreate(&c->marks[c->nmarks]) != cudaSuccess) {
        cudaGetLastError();
        c->marks[c->nmarks] = NULL;
        return -1;
    }
    US__CU(o, cudaEventRecord(c->marks[c->nmarks], c->stream));
    return c->nmarks++;
}

static double us__cuda_mark_us(us_ops *o, int id) {
    us__cuda *c = us__cu(o);
    float ms = 0;
    if (id < 0 || id >= c->nmarks ||
        cudaEventElapsedTime(&ms, c->mark_ref, c->marks[id]) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return c->mark_ref_us + 1e3 * (double)ms;
}

static void us__cuda_mark_reset(us_ops *o) { us__cu(o)->nmarks = 0; }

/* Scratch grows (never shrinks) to the largest request; ops use it within one call. NULL where
   the memory is not there, which us__cuda_scratch_try leaves to its caller (one with a path that
   needs less) */
static void *us__cuda_scratch_try(us_ops *o, size_t bytes) {
    us__cuda *c = us__cu(o);
    if (bytes <= c->scratch_bytes) return c->scratch;
    if (c->scratch) {
        US__CU(o, cudaStreamSynchronize(c->stream));
        us__cuda_free(o, c->scratch);
    }
    c->scratch = us__cuda_alloc(o, bytes);
    c->scratch_bytes = c->scratch ? bytes : 0;
    return c->scratch;
}

/* ... and us__cuda_scratch records it as the op's failure */
static void *us__cuda_scratch(us_ops *o, size_t bytes) {
    void *p = us__cuda_scratch_try(o, bytes);
    if (!p) us__cuda_fail(o, "scratch allocation", "out of device memory", __FILE__, __LINE__);
    return p;
}

/* fp32 in registers, the tensor's dtype in memory; __float2bfloat16_rn and __float2half_rn round
   to nearest even (fp16: overflow to ±inf, subnormals kept, as us_f32_to_f16) */
__device__ __forceinline__ float us__ld(const float *p, int64_t i) { return p[i]; }

__device__ __forceinline__ float us__ld(const __nv_bfloat16 *p, int64_t i) {
    return __bfloat162float(p[i]);
}

__device__ __forceinline__ float us__ld(const __half *p, int64_t i) { return __half2float(p[i]); }

__device__ __forceinline__ void us__st(float *p, int64_t i, float v) { p[i] = v; }

__device__ __forceinline__ void us__st(__nv_bfloat16 *p, int64_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ void us__st(__half *p, int64_t i, float v) { p[i] = __float2half_rn(v); }

/* Calls KERNEL<float>, KERNEL<__nv_bfloat16> or KERNEL<__half> by the runtime dtype. */
#define US__DISPATCH(o, dt, LAUNCH)                                                          \
    do {                                                                                     \
        if ((dt) == US_F32) {                                                                \
            typedef float T_;                                                                \
            LAUNCH;                                                                          \
        } else if ((dt) == US_BF16) {                                                        \
            typedef __nv_bfloat16 T_;                                                        \
            LAUNCH;                                                                          \
        } else if ((dt) == US_F16) {                                                         \
            typedef __half T_;                                                               \
            LAUNCH;                                                                          \
        } else                                                                               \
            us__cuda_fail(o, "dtype", "only fp32, bf16 and fp16 tensors are supported here", \
                          __FILE__, __LINE__);                                               \
        US__LAUNCHED(o);                                                                     \
    } while (0)

static unsigned us__blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 1048576 ? 1048576 : b);
}

/* block-wide sum (any blockDim multiple of 32, ≤ 1024), result valid in every thread */
template <typename A>
__device__ A us__block_sum(A v, A *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5, i;
    for (i = 16; i > 0; i >>= 1) v += __shfl_xor_sync(0xffffffffu, v, i);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = 0;
    for (i = 0; i < nw; i++) v += sh[i]; /* same order in every thread: deterministic */
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
   (descriptors + the heuristic's best algorithm) is built once per shape and reused. With
   o->sm_margin set, the plan targets that many SMs fewer (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET),
   leaving them to a collective running beside the GEMM: NCCL's thread blocks otherwise share SMs
   with the GEMM's and both slow down (issue 9 measured a reduce-scatter 6x slower under one). */
static cudaDataType_t us__cuda_type(us_dtype dt) {
    return dt == US_BF16 ? CUDA_R_16BF : dt == US_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* ---- Choosing the algorithm by timing it in place (us_cuda_gemm_tune). A long run of GEMMs
   holds an H200 at its power limit (700 W: the SM clock near 1.6 GHz instead of 1.98), and
   there the heuristic's first algorithm, ranked for the full clock, is not always the fastest:
   timed back to back, the best of its candidates ran the 1B step's bf16 linear GEMMs up to 18 %
   faster (bench/RESULTS.md, eighth session). Timing the candidates alone, before the run, ranks
   them at the clock of an idle GPU; so while tuning, a plan's calls inside the real steps take
   its candidates in turn, each between two events, and the choice is made from those times. */
static void us__lt_tune_drop(us__gemm_plan *p);

/* a plan's cuBLASLt objects and its tuning events, destroyed (the plan cache recycling a slot,
   us_cuda_ops_free) */
static void us__lt_plan_free(us__gemm_plan *p) {
    us__lt_tune_drop(p);
    cublasLtMatmulDescDestroy(p->desc);
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
}

/* up to n of cuBLASLt's algorithms for plan p within our workspace, best first, into h; how
   many (0 when the query fails or the ops have failed already) */
static int us__lt_heuristic(us_ops *o, const us__gemm_plan *p, cublasLtMatmulHeuristicResult_t *h,
                            int n) {
    us__cuda *c = us__cu(o);
    cublasLtMatmulPreference_t pref;
    int found = 0;
    US__LT(o, cublasLtMatmulPreferenceCreate(&pref));
    US__LT(o, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &c->ws_bytes, sizeof c->ws_bytes));
    if (c->failed || cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc, p->lc,
                                                    pref, n, h, &found) != CUBLAS_STATUS_SUCCESS)
        found = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    return found;
}

static void us__lt_tune_drop(us__gemm_plan *p) {
    int i;
    for (i = 0; i < US__TUNE_SAMPLES; i++) {
        if (p->ev[i][0]) cudaEventDestroy(p->ev[i][0]);
        if (p->ev[i][1]) cudaEventDestroy(p->ev[i][1]);
        p->ev[i][0] = p->ev[i][1] = NULL;
    }
    p->ncand = p->ns = 0;
}

/* up to US__TUNE_CANDS candidates of a plan from the heuristic (the first is the plan's own
   algorithm); fewer than two: nothing to choose. A plan is tuned at most once. */
static void us__lt_tune_cands(us_ops *o, us__gemm_plan *p) {
    cublasLtMatmulHeuristicResult_t h[US__TUNE_CANDS];
    int found, i;
    p->tuned = 1;
    found = us__lt_heuristic(o, p, h, US__TUNE_CANDS);
    for (i = 0; i < found; i++) p->cand[i] = h[i].algo;
    p->ncand = found > 1 ? found : 0;
}

/* D = alpha·x·y + beta·Cin through plan p, x and y cuBLASLt's A and B as the plan's la and lb
   describe them. While tuning, the call takes the plan's next candidate, timed; a candidate
   that refuses is out of the race (who 255) and the plan's own algorithm makes the call. */
static void us__lt_matmul(us_ops *o, us__gemm_plan *p, float alpha, const void *x, const void *y,
                          float beta, const void *Cin, void *D) {
    us__cuda *c = us__cu(o);
    int k = -1;
    if (c->tuning && !p->tuned) us__lt_tune_cands(o, p);
    if (c->tuning && p->ncand > 1 && p->ns < US__TUNE_SAMPLES) {
        k = p->ns;
        if ((!p->ev[k][0] && cudaEventCreate(&p->ev[k][0]) != cudaSuccess) ||
            (!p->ev[k][1] && cudaEventCreate(&p->ev[k][1]) != cudaSuccess)) {
            cudaGetLastError(); /* no events: this call untimed */
            k = -1;
        }
    }
    if (k >= 0) {
        p->who[k] = (unsigned char)(k % p->ncand);
        p->ns++;
        cudaEventRecord(p->ev[k][0], c->stream);
        if (cublasLtMatmul(c->lt, p->desc, &alpha, x, p->la, y, p->lb, &beta, Cin, p->lc, D, p->lc,
                           &p->cand[p->who[k]], c->ws, c->ws_bytes,
                           c->stream) == CUBLAS_STATUS_SUCCESS) {
            cudaEventRecord(p->ev[k][1], c->stream);
            return;
        }
        cudaGetLastError();
        p->who[k] = 255;
    }
    US__LT(o, cublasLtMatmul(c->lt, p->desc, &alpha, x, p->la, y, p->lb, &beta, Cin, p->lc, D,
                             p->lc, &p->algo, c->ws, c->ws_bytes, c->stream));
}

/* the end of a plan's tuning: each candidate's median time, the fastest kept if it beats the
   first's by more than 1 %; 1 if the plan changed its algorithm */
static int us__lt_tune_pick(us__gemm_plan *p) {
    float t[US__TUNE_SAMPLES];
    double med[US__TUNE_CANDS];
    int i, j, k, n, best = 0, changed;
    for (k = 0; k < p->ncand; k++) {
        for (i = n = 0; i < p->ns; i++) {
            float ms = 0;
            if (p->who[i] != k ||
                cudaEventElapsedTime(&ms, p->ev[i][0], p->ev[i][1]) != cudaSuccess)
                continue;
            for (j = n++; j > 0 && t[j - 1] > ms; j--) /* insertion: t[0..n) sorted */
                t[j] = t[j - 1];
            t[j] = ms;
        }
        med[k] = n ? 0.5 * (t[(n - 1) / 2] + t[n / 2]) : -1;
        if (med[k] > 0 && (med[best] <= 0 || med[k] < med[best])) best = k;
    }
    cudaGetLastError();
    changed = p->ncand > 1 && best > 0 && med[0] > 0 && med[best] < 0.99 * med[0];
    if (changed) p->algo = p->cand[best];
    us__lt_tune_drop(p);
    return changed;
}

US_API int us_cuda_gemm_tune(us_ops *o, int on) {
    us__cuda *c = us__cu(o);
    int i, changed = 0;
    if (!c) return 0;
    if (on) {
        c->tuning = 1;
        for (i = 0; i < c->nplans; i++) changed += c->plans[i].ncand > 1 && c->plans[i].ns > 1;
        for (i = 0; i < c->nfp8; i++)
            changed += c->fp8_plans[i].ncand > 1 && c->fp8_plans[i].ns > 1;
        return changed; /* here: the plans timing two or more candidates */
    }
    if (!c->tuning) return 0;
    c->tuning = 0;
    cudaStreamSynchronize(c->stream);
    for (i = 0; i < c->nplans; i++) changed += us__lt_tune_pick(&c->plans[i]);
    for (i = 0; i < c->nfp8; i++) changed += us__lt_tune_pick(&c->fp8_plans[i]);
    return changed;
}

/* ---- The choices in a file (us_cuda_gemm_tune_save / _load). One line a plan: its kind (gemm,
   fp8), the fields that key it (transposes, dtypes or FP8 tilings, beta 0, SM target, sizes,
   leading dimensions) and cuBLASLt's algorithm, an opaque 64-byte structure, as 8 hex words.
   Such a structure means something only to the cuBLASLt version and GPU that made it, so the
   file's first lines name them and a file of another is refused, not guessed at. */
#define US__TUNE_MAGIC "ultrascale gemm-tune 1"

typedef struct us__tune_rec {
    int kind; /* 0 gemm (c->plans), 1 fp8 (c->fp8_plans) */
    int ta, tb, adt, bdt, cdt, beta0, sms;
    int64_t M, N, K, lda, ldb, ldc;
    cublasLtMatmulAlgo_t algo;
} us__tune_rec;

static int us__tune_same(const us__tune_rec *r, const us__gemm_plan *p, int kind) {
    return r->kind == kind && r->ta == p->ta && r->tb == p->tb && r->adt == p->adt &&
           r->bdt == p->bdt && r->cdt == p->cdt && r->beta0 == p->beta0 && r->sms == p->sms &&
           r->M == p->M && r->N == p->N && r->K == p->K && r->lda == p->lda && r->ldb == p->ldb &&
           r->ldc == p->ldc;
}

/* the GPU as the file names it: its name with '_' for blanks, then its SM count */
static void us__tune_device(const us__cuda *c, char *buf, size_t n) {
    struct cudaDeviceProp prop;
    char *ch;
    if (cudaGetDeviceProperties(&prop, c->device) != cudaSuccess) {
        cudaGetLastError();
        snprintf(prop.name, sizeof prop.name, "unknown");
    }
    for (ch = prop.name; *ch; ch++)
        if (*ch == ' ') *ch = '_';
    snprintf(buf, n, "%s %d", prop.name, c->n_sm);
}

/* plan p (of kind) takes the loaded file's algorithm for its shape, if the file names one: 0 when
   none does, 1 when it took it, -1 when cuBLASLt refuses it for the plan (the caller says so) */
static int us__lt_tune_apply(us_ops *o, us__gemm_plan *p, int kind) {
    us__cuda *c = us__cu(o);
    cublasLtMatmulHeuristicResult_t check;
    int i;
    for (i = 0; i < c->ntune_recs; i++)
        if (us__tune_same(&c->tune_recs[i], p, kind)) break;
    if (i == c->ntune_recs) return 0;
    memset(&check, 0, sizeof check);
    if (cublasLtMatmulAlgoCheck(c->lt, p->desc, p->la, p->lb, p->lc, p->lc, &c->tune_recs[i].algo,
                                &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > c->ws_bytes)
        return -1;
    us__lt_tune_drop(p); /* a plan loaded while tuning stops timing its candidates */
    p->algo = c->tune_recs[i].algo;
    p->tuned = 1; /* chosen: never timed again */
    return 1;
}

/* at a plan's making: the file's algorithm, or a recorded failure */
static void us__lt_tune_take(us_ops *o, us__gemm_plan *p, int kind) {
    if (us__lt_tune_apply(o, p, kind) < 0)
        us__cuda_fail(o, "us_cuda_gemm_tune_load",
                      "cuBLASLt refuses the loaded algorithm for a GEMM shape", __FILE__, __LINE__);
}

static void us__tune_line(FILE *f, const us__gemm_plan *p, int kind) {
    uint64_t w[8];
    int i;
    memcpy(w, &p->algo, sizeof w);
    fprintf(f, "%s %d %d %d %d %d %d %d %lld %lld %lld %lld %lld %lld", kind ? "fp8" : "gemm",
            p->ta, p->tb, p->adt, p->bdt, p->cdt, p->beta0, p->sms, (long long)p->M,
            (long long)p->N, (long long)p->K, (long long)p->lda, (long long)p->ldb,
            (long long)p->ldc);
    for (i = 0; i < 8; i++) fprintf(f, " %016llx", (unsigned long long)w[i]);
    fputc('\n', f);
}

US_API us_result us_cuda_gemm_tune_save(us_ops *o, const char *path, char *err, size_t errlen) {
    us__cuda *c = us__cu(o);
    char tmp[4096], dev[300];
    FILE *f;
    int i, bad;
    if (!c || !path) {
        us__errf(err, errlen, "gemm-tune save: no CUDA ops or no path");
        return US_ERR_INVALID;
    }
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        us__errf(err, errlen, "gemm-tune save: the path is too long");
        return US_ERR_INVALID;
    }
    if (!(f = fopen(tmp, "w"))) {
        us__errf(err, errlen, "gemm-tune save: cannot write %s", tmp);
        return US_ERR_IO;
    }
    us__tune_device(c, dev, sizeof dev);
    fprintf(f, "%s\ncublaslt %zu\ndevice %s\nworkspace %zu\nplans %d\n", US__TUNE_MAGIC,
            cublasLtGetVersion(), dev, c->ws_bytes, c->nplans + c->nfp8);
    for (i = 0; i < c->nplans; i++) us__tune_line(f, &c->plans[i], 0);
    for (i = 0; i < c->nfp8; i++) us__tune_line(f, &c->fp8_plans[i], 1);
    bad = ferror(f);
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        us__errf(err, errlen, "gemm-tune save: writing %s failed", path);
        return US_ERR_IO;
    }
    return US_OK;
}

/* one plan line into r; 0 unless every field is there, in range, and nothing follows */
static int us__tune_parse(const char *line, us__tune_rec *r) {
    char kind[8];
    long long M, N, K, lda, ldb, ldc;
    unsigned long long w[8];
    int n = -1, i;
    memset(r, 0, sizeof *r);
    if (sscanf(line,
               "%7s %d %d %d %d %d %d %d %lld %lld %lld %lld %lld %lld %llx %llx %llx %llx "
               "%llx %llx %llx %llx%n",
               kind, &r->ta, &r->tb, &r->adt, &r->bdt, &r->cdt, &r->beta0, &r->sms, &M, &N, &K,
               &lda, &ldb, &ldc, &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7],
               &n) != 22 ||
        line[n] != '\0')
        return 0;
    r->kind = !strcmp(kind, "fp8") ? 1 : !strcmp(kind, "gemm") ? 0 : -1;
    r->M = M, r->N = N, r->K = K, r->lda = lda, r->ldb = ldb, r->ldc = ldc;
    for (i = 0; i < 8; i++) ((uint64_t *)&r->algo)[i] = (uint64_t)w[i];
    return r->kind >= 0 && (r->ta == 0 || r->ta == 1) && (r->tb == 0 || r->tb == 1) &&
           (r->beta0 == 0 || r->beta0 == 1) && r->sms >= 0 && r->adt >= 0 && r->bdt >= 0 &&
           r->cdt >= 0 && M > 0 && N > 0 && K > 0 && lda >= 0 && ldb >= 0 && ldc > 0;
}

US_API us_result us_cuda_gemm_tune_load(us_ops *o, const char *path, char *err, size_t errlen) {
    us__cuda *c = us__cu(o);
    char line[512], want[300];
    us__tune_rec *recs = NULL;
    FILE *f;
    size_t ver = 0, ws = 0;
    int nrec = -1, n = 0, ln = 0, bad = 0, i, k;
    us_result res = US_ERR_FORMAT;
    if (!c || !path) {
        us__errf(err, errlen, "gemm-tune load: no CUDA ops or no path");
        return US_ERR_INVALID;
    }
    if (!(f = fopen(path, "r"))) {
        us__errf(err, errlen, "gemm-tune load: cannot open %s", path);
        return US_ERR_IO;
    }
    us__tune_device(c, want, sizeof want);
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        ln++;
        if (len == 0 || line[len - 1] != '\n') {
            us__errf(err, errlen, "%s:%d: a line too long or not ended", path, ln);
            goto out;
        }
        line[len - 1] = '\0';
        if (ln == 1 && strcmp(line, US__TUNE_MAGIC)) {
            us__errf(err, errlen, "%s is not an ultrascale gemm-tune file of version 1", path);
            goto out;
        }
        if (ln == 2 && (sscanf(line, "cublaslt %zu%n", &ver, &k) != 1 || line[k])) {
            bad = 1;
            break;
        }
        if (ln == 2 && ver != cublasLtGetVersion()) {
            us__errf(err, errlen, "%s was written with cuBLASLt %zu, this is %zu: tune again", path,
                     ver, cublasLtGetVersion());
            goto out;
        }
        if (ln == 3 && (strncmp(line, "device ", 7) || strcmp(line + 7, want))) {
            us__errf(err, errlen, "%s was written for the GPU %s, this is %s: tune again", path,
                     strncmp(line, "device ", 7) ? line : line + 7, want);
            goto out;
        }
        if (ln == 4 && (sscanf(line, "workspace %zu%n", &ws, &k) != 1 || line[k])) {
            bad = 1;
            break;
        }
        if (ln == 4 && ws != c->ws_bytes) {
            us__errf(err, errlen,
                     "%s was written for a cuBLASLt workspace of %zu bytes, this is %zu", path, ws,
                     c->ws_bytes);
            goto out;
        }
        if (ln == 5) {
            if (sscanf(line, "plans %d%n", &nrec, &k) != 1 || line[k] || nrec < 0 ||
                nrec > US__CUDA_PLANS + US__FP8_PLANS) {
                bad = 1;
                break;
            }
            if (nrec && !(recs = (us__tune_rec *)calloc((size_t)nrec, sizeof *recs))) {
                us__errf(err, errlen, "gemm-tune load: out of host memory");
                res = US_ERR_OOM;
                goto out;
            }
        }
        if (ln > 5 && (n == nrec || !us__tune_parse(line, &recs[n++]))) {
            bad = 1;
            break;
        }
    }
    if (bad || ln < 5 || n != nrec) {
        us__errf(err, errlen, "%s:%d: not understood (%s)", path, ln,
                 ln <= 5           ? "the header"
                 : n > nrec || bad ? "a plan line"
                                   : "fewer plans than it says");
        goto out;
    }
    free(c->tune_recs);
    c->tune_recs = recs;
    c->ntune_recs = nrec;
    recs = NULL;
    /* plans made before the load take the file's choice now */
    for (i = 0; i < c->nplans + c->nfp8; i++) {
        int fp8 = i >= c->nplans;
        us__gemm_plan *p = fp8 ? &c->fp8_plans[i - c->nplans] : &c->plans[i];
        if (us__lt_tune_apply(o, p, fp8) < 0) {
            us__errf(err, errlen,
                     "%s: cuBLASLt refuses its algorithm for the %lld x %lld x %lld "
                     "GEMM",
                     path, (long long)p->M, (long long)p->N, (long long)p->K);
            goto out;
        }
    }
    res = US_OK;
out:
    free(recs);
    fclose(f);
    return res;
}

static us__gemm_plan *us__gemm_plan_get(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                        us_dtype adt, int64_t lda, us_dtype bdt, int64_t ldb,
                                        us_dtype cdt, int64_t ldc, int beta0) {
    us__cuda *c = us__cu(o);
    us__gemm_plan *p;
    cublasOperation_t opx = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulHeuristicResult_t heur;
    int i, sms = o->sm_margin > 0 && o->sm_margin < c->n_sm ? c->n_sm - o->sm_margin : 0;
    for (i = 0; i < c->nplans; i++) {
        p = &c->plans[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda &&
            p->ldb == ldb && p->ldc == ldc && p->adt == (int)adt && p->bdt == (int)bdt &&
            p->cdt == (int)cdt && p->beta0 == beta0 && p->sms == sms)
            return p;
    }
    if (c->nplans == US__CUDA_PLANS) { /* full: recycle the oldest slot */
        us__lt_plan_free(&c->plans[0]);
        memmove(c->plans, c->plans + 1, sizeof(us__gemm_plan) * (US__CUDA_PLANS - 1));
        c->nplans--;
    }
    p = &c->plans[c->nplans];
    memset(p, 0, sizeof *p);
    p->ta = ta;
    p->tb = tb;
    p->M = M;
    p->N = N;
    p->K = K;
    p->lda = lda;
    p->ldb = ldb;
    p->ldc = ldc;
    p->adt = (int)adt;
    p->bdt = (int)bdt;
    p->cdt = (int)cdt;
    p->beta0 = beta0;
    p->sms = sms;
    US__LT(o, cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    US__LT(o,
           cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx));
    US__LT(o,
           cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy));
    if (sms)
        US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                 &sms, sizeof sms));
    /* first operand: B as stored, column-major view [tb ? K x N : N x K] */
    US__LT(o, cublasLtMatrixLayoutCreate(&p->la, us__cuda_type(bdt), tb ? K : N, tb ? N : K, ldb));
    /* second operand: A as stored, column-major view [ta ? M x K : K x M] */
    US__LT(o, cublasLtMatrixLayoutCreate(&p->lb, us__cuda_type(adt), ta ? M : K, ta ? K : M, lda));
    US__LT(o, cublasLtMatrixLayoutCreate(&p->lc, us__cuda_type(cdt), N, M, ldc));
    if (us__lt_heuristic(o, p, &heur, 1))
        p->algo = heur.algo;
    else
        us__cuda_fail(o, "cublasLtMatmulAlgoGetHeuristic",
                      "no algorithm for this GEMM shape and dtype", __FILE__, __LINE__);
    us__lt_tune_take(o, p, 0);
    c->nplans++;
    return p;
}

/* D = alpha·op(A)·op(B) + beta·Cin through the shape's plan (K ≥ 1); Cin may be D itself or
   another matrix of D's layout (cuBLASLt reads C and writes D separately) */
static void us__cuda_gemm_into(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K,
                               float alpha, const void *A, us_dtype adt, int64_t lda, const void *B,
                               us_dtype bdt, int64_t ldb, float beta, const void *Cin, void *D,
                               us_dtype cdt, int64_t ldc) {
    us__cuda *c = us__cu(o);
    us__gemm_plan *p =
        us__gemm_plan_get(o, ta, tb, M, N, K, adt, lda, bdt, ldb, cdt, ldc, beta == 0);
    if (c->failed) return;
    us__lt_matmul(o, p, alpha, B, A, beta, Cin, D);
}

static void us__cuda_gemm(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const void *A, us_dtype adt, int64_t lda, const void *B, us_dtype bdt,
                          int64_t ldb, float beta, void *C, us_dtype cdt, int64_t ldc) {
    us__cuda *c = us__cu(o);
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* C = beta·C: cuBLASLt wants K ≥ 1 */
        if (beta == 0) {
            int64_t i;
            for (i = 0; i < M; i++)
                US__CU(o, cudaMemsetAsync((char *)C + (size_t)(i * ldc) * us_dtype_size(cdt), 0,
                                          (size_t)N * us_dtype_size(cdt), c->stream));
        }
        return;
    }
    us__cuda_gemm_into(o, ta, tb, M, N, K, alpha, A, adt, lda, B, bdt, ldb, beta, C, C, cdt, ldc);
}

/* y = res + x·Wᵀ (the linear's forward with the residual add in the epilogue): gemm(0, 1, ...)
   with beta 1, reading C from res and writing D = y */
static void us__cuda_gemm_res(us_ops *o, int64_t N, int64_t Out, int64_t In, const void *x,
                              const void *W, const void *res, void *y, us_dtype dt) {
    if (N <= 0 || Out <= 0) return;
    us__cuda_gemm_into(o, 0, 1, N, Out, In, 1.0f, x, dt, In, W, dt, In, 1.0f, res, y, dt, Out);
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-kernels  elementwise and row kernels
/* ------------------------------------------------------------------------------------ */
/* 16-byte vector access: 8 bf16 or 4 fp32 per load/store, converted to/from fp32 registers.
   The caller guarantees 16-byte alignment (checked on the host; scalar kernels otherwise). */
template <typename T>
struct us__vec {
    enum { W = 16 / (int)sizeof(T) };
};

static __device__ __forceinline__ void us__ldv(const float *p, float *f) {
    float4 u = *reinterpret_cast<const float4 *>(p);
    f[0] = u.x;
    f[1] = u.y;
    f[2] = u.z;
    f[3] = u.w;
}

static __device__ __forceinline__ void us__ldv(const __nv_bfloat16 *p, float *f) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
}

static __device__ __forceinline__ void us__ldv(const __half *p, float *f) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __half22float2(h[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
}

static __device__ __forceinline__ void us__stv(float *p, const float *f) {
    *reinterpret_cast<float4 *>(p) = make_float4(f[0], f[1], f[2], f[3]);
}

static __device__ __forceinline__ void us__stv(__nv_bfloat16 *p, const float *f) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++)
        h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]); /* each rounds to nearest even */
    *reinterpret_cast<uint4 *>(p) = u;
}

static __device__ __forceinline__ void us__stv(__half *p, const float *f) {
    uint4 u;
    __half2 *h = reinterpret_cast<__half2 *>(&u);
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
}

/* 4 values into a low-precision copy: one float4 (fp32) or one 8-byte store (bf16, fp16) */
static __device__ __forceinline__ void us__st4(float *p, const float *f) { us__stv(p, f); }

static __device__ __forceinline__ void us__st4(__nv_bfloat16 *p, const float *f) {
    uint2 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
    h[0] = __floats2bfloat162_rn(f[0], f[1]);
    h[1] = __floats2bfloat162_rn(f[2], f[3]);
    *reinterpret_cast<uint2 *>(p) = u;
}

static __device__ __forceinline__ void us__st4(__half *p, const float *f) {
    uint2 u;
    __half2 *h = reinterpret_cast<__half2 *>(&u);
    h[0] = __floats2half2_rn(f[0], f[1]);
    h[1] = __floats2half2_rn(f[2], f[3]);
    *reinterpret_cast<uint2 *>(p) = u;
}

static int us__al(const void *p, unsigned bytes) {
    return ((uintptr_t)p & (uintptr_t)(bytes - 1)) == 0;
}

static int us__al16(const void *p) { return us__al(p, 16); }

/* dst [n] = src [n] in another dtype (rounded to nearest even) */
template <typename D, typename S>
__global__ void us__k_cast(D *dst, const S *src, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            st = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += st) us__st(dst, i, us__ld(src, i));
}

static void us__cuda_cast(us_ops *o, void *dst, us_dtype ddt, const void *src, us_dtype sdt,
                          int64_t n) {
    cudaStream_t s = us__cu(o)->stream;
    unsigned g = us__blocks(n, 256);
    if (sdt == ddt)
        US__CU(o, cudaMemcpyAsync(dst, src, (size_t)n * us_dtype_size(sdt),
                                  cudaMemcpyDeviceToDevice, s));
    else if (sdt == US_F32 && ddt == US_BF16)
        us__k_cast<<<g, 256, 0, s>>>((__nv_bfloat16 *)dst, (const float *)src, n);
    else if (sdt == US_BF16 && ddt == US_F32)
        us__k_cast<<<g, 256, 0, s>>>((float *)dst, (const __nv_bfloat16 *)src, n);
    else if (sdt == US_F32 && ddt == US_F16)
        us__k_cast<<<g, 256, 0, s>>>((__half *)dst, (const float *)src, n);
    else if (sdt == US_F16 && ddt == US_F32)
        us__k_cast<<<g, 256, 0, s>>>((float *)dst, (const __half *)src, n);
    else
        us__cuda_fail(o, "cast",
                      "only fp32 <-> bf16 and fp32 <-> fp16 casts are implemented on CUDA",
                      __FILE__, __LINE__);
    US__LAUNCHED(o);
}

/* Embedding: one block per token row. The backward adds each vocabulary row's tokens in token
   order, as the CPU does, so two runs (and the CPU) give the same bits: the tokens are sorted by
   id, stably (CUB's radix sort: the same id keeps its order), and the first position of each
   id's run adds that run's rows into its row of dwte. fp32 atomics, one add per token, let the
   order, and so the last bits of a whole training run, vary from run to run.
   tok i32 [N]; wte [V, C]; out, dout [N, C]; dwte f32 [V, C] += */
template <typename T>
__global__ void us__k_embedding_fwd(T *out, const int32_t *tok, const T *wte, int64_t C) {
    int64_t n = blockIdx.x, c;
    const T *row = wte + (int64_t)(tok[n] < 0 ? 0 : tok[n]) * C;
    if (tok[n] < 0) {
        for (c = threadIdx.x; c < C; c += blockDim.x) us__st(out, n * C + c, 0.0f);
        return;
    } /* another rank's token */
    for (c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = row[c];
}

/* idx[n] = n: the values CUB's sort carries beside the token ids */
__global__ void us__k_iota(int32_t *idx, int64_t N) {
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) idx[n] = (int32_t)n;
}

/* one block per (sorted position i, 256 columns); the first position of each id's run
   (key[i] ≠ key[i−1]) adds the run's dout rows, in token order (idx ascending within a run), into
   the id's row of dwte: one column per thread, so a frequent id's long run is as many loads per
   thread as it has tokens, issued eight ahead (the adds stay in order). key: the ids sorted; idx:
   their token positions. A negative id is another rank's token: skipped. */
template <typename T>
__global__ void us__k_embedding_bwd(float *dwte, const T *dout, const int32_t *key,
                                    const int32_t *idx, int64_t N, int64_t C) {
    const int64_t i = blockIdx.x;
    const int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    const int32_t v = key[i];
    int64_t j, e;
    if (v < 0 || (i > 0 && key[i - 1] == v) || c >= C) return;
    for (e = i + 1; e < N && key[e] == v; e++) {
    } /* the run is key[i .. e) */
    float s = dwte[(int64_t)v * C + c];
#pragma unroll 8
    for (j = i; j < e; j++) s += us__ld(dout, (int64_t)idx[j] * C + c);
    dwte[(int64_t)v * C + c] = s;
}

static void us__cuda_embedding_fwd(us_ops *o, void *out, const int32_t *tok, const void *wte,
                                   int64_t N, int64_t C, us_dtype dt) {
    US__DISPATCH(o, dt,
                 (us__k_embedding_fwd<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>(
                     (T_ *)out, tok, (const T_ *)wte, C)));
}

static void us__cuda_embedding_bwd(us_ops *o, float *dwte, const void *dout, const int32_t *tok,
                                   int64_t N, int64_t C, us_dtype dt) {
    cudaStream_t st = us__cu(o)->stream;
    size_t tmp = 0, ints = ((size_t)N * 4 + 255) / 256 * 256;
    char *sc;
    int32_t *key, *idx0, *idx;
    if (N <= 0 || C <= 0) return;
    if (N > INT_MAX) {
        us__cuda_fail(o, "embedding_bwd", "more than 2^31 tokens", __FILE__, __LINE__);
        return;
    }
    US__CU(o, cub::DeviceRadixSort::SortPairs(NULL, tmp, tok, (int32_t *)NULL, (int32_t *)NULL,
                                              (int32_t *)NULL, (int)N, 0, 32, st));
    if (!(sc = (char *)us__cuda_scratch(o, 3 * ints + tmp))) return; /* the failure is recorded */
    key = (int32_t *)sc;                                             /* [N] ids, sorted */
    idx0 = (int32_t *)(sc + ints);                                   /* [N] 0..N−1 */
    idx = (int32_t *)(sc + 2 * ints);                                /* [N] positions, sorted */
    us__k_iota<<<us__blocks(N, 256), 256, 0, st>>>(idx0, N);
    US__CU(o, cub::DeviceRadixSort::SortPairs(sc + 3 * ints, tmp, tok, key, idx0, idx, (int)N, 0,
                                              32, st));
    US__DISPATCH(
        o, dt,
        (us__k_embedding_bwd<T_><<<dim3((unsigned)N, (unsigned)((C + 255) / 256)), 256, 0, st>>>(
            dwte, (const T_ *)dout, key, idx, N, C)));
}

/* RMSNorm: one block per row; sums in fp32 (the CPU reference sums in double: ≤ 1 ulp apart).
   Rows up to 256·US__ROW_VEC wide are read once into registers; wider rows are read twice. */
#define US__ROW_VEC 16

template <typename T>
__global__ void us__k_rmsnorm_fwd(T *out, float *rstd, const T *x, const T *w, int64_t C,
                                  float eps) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x, c;
    float v[US__ROW_VEC], ss = 0, r;
    int k, cached = C <= (int64_t)blockDim.x * US__ROW_VEC;
    if (cached) {
#pragma unroll
        for (k = 0; k < US__ROW_VEC; k++) {
            c = threadIdx.x + (int64_t)k * blockDim.x;
            v[k] = c < C ? us__ld(x, n * C + c) : 0.0f;
            ss += v[k] * v[k];
        }
    } else
        for (c = threadIdx.x; c < C; c += blockDim.x) {
            float a = us__ld(x, n * C + c);
            ss += a * a;
        }
    ss = us__block_sum(ss, sh);
    r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[n] = r;
    if (cached) {
#pragma unroll
        for (k = 0; k < US__ROW_VEC; k++) {
            c = threadIdx.x + (int64_t)k * blockDim.x;
            if (c < C) us__st(out, n * C + c, v[k] * r * us__ld(w, c));
        }
    } else
        for (c = threadIdx.x; c < C; c += blockDim.x)
            us__st(out, n * C + c, us__ld(x, n * C + c) * r * us__ld(w, c));
}

/* dx += rstd·(dy·w − xhat·mean(dy·w·xhat)), one block per row, the row in registers.
   dx, dout, x [N, C]; w [C]; rstd f32 [N] (the forward's: x, out [N, C], rstd [N]) */
template <typename T>
__global__ void us__k_rmsnorm_bwd_dx(T *dx, const T *dout, const T *x, const T *w,
                                     const float *rstd, int64_t C) {
    __shared__ float sh[32];
    int64_t n = blockIdx.x, c;
    float r = rstd[n], dot = 0, mean, xv[US__ROW_VEC], gv[US__ROW_VEC];
    int k, cached = C <= (int64_t)blockDim.x * US__ROW_VEC;
    if (cached) {
#pragma unroll
        for (k = 0; k < US__ROW_VEC; k++) {
            c = threadIdx.x + (int64_t)k * blockDim.x;
            xv[k] = c < C ? us__ld(x, n * C + c) : 0.0f;
            gv[k] = c < C ? us__ld(dout, n * C + c) * us__ld(w, c) : 0.0f;
            dot += gv[k] * xv[k] * r;
        }
    } else
        for (c = threadIdx.x; c < C; c += blockDim.x)
            dot += us__ld(dout, n * C + c) * us__ld(w, c) * us__ld(x, n * C + c) * r;
    mean = us__block_sum(dot, sh) / (float)C;
    if (cached) {
#pragma unroll
        for (k = 0; k < US__ROW_VEC; k++) {
            int64_t i = n * C + threadIdx.x + (int64_t)k * blockDim.x;
            if (threadIdx.x + (int64_t)k * blockDim.x < C)
                us__st(dx, i, us__ld(dx, i) + r * (gv[k] - xv[k] * r * mean));
        }
    } else
        for (c = threadIdx.x; c < C; c += blockDim.x) {
            int64_t i = n * C + c;
            us__st(dx, i,
                   us__ld(dx, i) + r * (us__ld(dout, i) * us__ld(w, c) - us__ld(x, i) * r * mean));
        }
}

/* Vector path: 16-byte loads, each thread holds US__ROW_RV vectors of the row in registers; the
   host picks blockDim = the row's vectors / US__ROW_RV rounded up to a warp (C = 2048 bf16: 128
   threads), so rows up to 1024·US__ROW_RV vectors (16384 bf16, 8192 fp32) take this path. */
#define US__ROW_RV 2

/* What a vector kernel of RMSNorm or SwiGLU does with the W outputs o it has just computed for
   row n, columns c..c+W−1 (stored when active): nothing here; // >>cuda-fp8 passes one that writes
   their 1×128 FP8 tiles (us__fp8_epi). Every lane of a warp calls it, active or not. */
struct us__no_epi {
    __device__ __forceinline__ void operator()(const float *, int64_t, int64_t, bool) const {}
};

template <typename T, typename Epi = us__no_epi>
__global__ void us__k_rmsnorm_fwd_vec(T *out, float *rstd, const T *x, const T *w, int64_t C,
                                      float eps, Epi epi = Epi()) {
    enum { W = us__vec<T>::W };

    __shared__ float sh[32];
    int64_t n = blockIdx.x;
    int nv = (int)(C / W), k, i;
    float v[US__ROW_RV][W], wv[US__ROW_RV][W], ss = 0, r;
#pragma unroll
    for (k = 0; k < US__ROW_RV; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < nv) {
            us__ldv(x + n * C + (int64_t)j * W, v[k]);
            us__ldv(w + (int64_t)j * W, wv[k]);
        } else {
#pragma unroll
            for (i = 0; i < W; i++) v[k][i] = wv[k][i] = 0.0f;
        }
#pragma unroll
        for (i = 0; i < W; i++) ss += v[k][i] * v[k][i];
    }
    ss = us__block_sum(ss, sh);
    r = rsqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[n] = r;
#pragma unroll
    for (k = 0; k < US__ROW_RV; k++) { /* every lane: the epilogue may shuffle between lanes */
        int j = threadIdx.x + k * blockDim.x;
        float o[W];
#pragma unroll
        for (i = 0; i < W; i++) o[i] = v[k][i] * r * wv[k][i];
        if (j < nv) us__stv(out + n * C + (int64_t)j * W, o);
        epi(o, n, (int64_t)j * W, j < nv);
    }
}

/* dx and dw's partial sums in one pass (the vector path): block b takes rows 32b .. 32b + 31
   one at a time (as us__k_rmsnorm_bwd_dx does a row, with 16-byte loads held in registers), and
   each thread adds dy·x·rstd of its columns over those rows in registers; part[b][C] then goes to us__k_rmsnorm_bwd_dw_sum,
   which adds the blocks' parts in order (deterministic). x and dy are read once, where the
   two kernels (dx, then dw's partial sums) read them twice: a third of the traffic less.
   dx, dout, x [N][C]; w [C]; rstd [N]; part [⌈N/32⌉][C] fp32; blockDim as us__row_threads. */
#define US__RMS_FROWS 32

template <typename T>
__global__ void us__k_rmsnorm_bwd_vec(T *dx, float *part, const T *dout, const T *x, const T *w,
                                      const float *rstd, int64_t N, int64_t C) {
    enum { W = us__vec<T>::W };

    __shared__ float sh[32];
    int64_t r0 = (int64_t)blockIdx.x * US__RMS_FROWS, n;
    int64_t r1 = r0 + US__RMS_FROWS < N ? r0 + US__RMS_FROWS : N;
    int nv = (int)(C / W), k, i;
    float wv[US__ROW_RV][W], acc[US__ROW_RV][W]; /* w of the thread's columns; their Σ dy·x·r */
#pragma unroll
    for (k = 0; k < US__ROW_RV; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < nv) us__ldv(w + (int64_t)j * W, wv[k]);
#pragma unroll
        for (i = 0; i < W; i++) {
            if (j >= nv) wv[k][i] = 0.0f;
            acc[k][i] = 0.0f;
        }
    }
    for (n = r0; n < r1; n++) {
        float r = rstd[n], dot = 0, mean, xv[US__ROW_RV][W], gv[US__ROW_RV][W], av[US__ROW_RV][W];
#pragma unroll
        for (k = 0; k < US__ROW_RV; k++) {
            int j = threadIdx.x + k * blockDim.x;
            if (j < nv) {
                float dv[W];
                int64_t e = n * C + (int64_t)j * W;
                us__ldv(x + e, xv[k]);
                us__ldv(dout + e, dv);
                us__ldv(dx + e, av[k]); /* read early: its latency hides behind the reduction */
#pragma unroll
                for (i = 0; i < W; i++) {
                    gv[k][i] = dv[i] * wv[k][i];
                    dot += gv[k][i] * xv[k][i] * r;
                    acc[k][i] += dv[i] * xv[k][i] * r;
                }
            } else {
#pragma unroll
                for (i = 0; i < W; i++) xv[k][i] = gv[k][i] = av[k][i] = 0.0f;
            }
        }
        mean = us__block_sum(dot, sh) / (float)C;
#pragma unroll
        for (k = 0; k < US__ROW_RV; k++) {
            int j = threadIdx.x + k * blockDim.x;
            if (j < nv) {
#pragma unroll
                for (i = 0; i < W; i++) av[k][i] = av[k][i] + r * (gv[k][i] - xv[k][i] * r * mean);
                us__stv(dx + n * C + (int64_t)j * W, av[k]);
            }
        }
    }
#pragma unroll
    for (k = 0; k < US__ROW_RV; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < nv) /* W floats: W / 4 float4 stores */
#pragma unroll
            for (i = 0; i < W; i += 4)
                us__stv(part + (int64_t)blockIdx.x * C + (int64_t)j * W + i, &acc[k][i]);
    }
}

/* dw = Σ_n dy·xhat in two passes — partial sums over fixed row chunks, then the chunks in
   order — so the result does not depend on scheduling */
#define US__RMS_ROWS 256

template <typename T>
__global__ void us__k_rmsnorm_bwd_dw_part(float *part, const T *dout, const T *x, const float *rstd,
                                          int64_t N, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            r0 = (int64_t)blockIdx.y * US__RMS_ROWS, r;
    float acc = 0;
    if (c >= C) return;
    for (r = r0; r < r0 + US__RMS_ROWS && r < N; r++)
        acc += us__ld(dout, r * C + c) * us__ld(x, r * C + c) * rstd[r];
    part[(int64_t)blockIdx.y * C + c] = acc;
}

/* the same partial sums with 16-byte loads: block (32, US__DW_TY); lane x owns one vector of W
   columns, warp y the rows r0+y, r0+y+US__DW_TY, … of the chunk (in order); the warps' sums are
   then added in order y = 0, 1, …: a fixed order, so the bits never depend on scheduling */
#define US__DW_TY 8

template <typename T>
__global__ void __launch_bounds__(32 * US__DW_TY)
    us__k_rmsnorm_bwd_dw_part_vec(float *part, const T *dout, const T *x, const float *rstd,
                                  int64_t N, int64_t C) {
    enum { W = us__vec<T>::W };

    __shared__ float sh[US__DW_TY][W * 32];
    int64_t j = (int64_t)blockIdx.x * 32 + threadIdx.x, r0 = (int64_t)blockIdx.y * US__RMS_ROWS,
            r1 = r0 + US__RMS_ROWS < N ? r0 + US__RMS_ROWS : N, r;
    int nv = (int)(C / W), i, t = threadIdx.y * 32 + threadIdx.x;
    float acc[W];
#pragma unroll
    for (i = 0; i < W; i++) acc[i] = 0.0f;
    if (j < nv) {
#pragma unroll 4
        for (r = r0 + threadIdx.y; r < r1; r += US__DW_TY) {
            float d[W], xv[W], rs = rstd[r];
            us__ldv(dout + r * C + j * W, d);
            us__ldv(x + r * C + j * W, xv);
#pragma unroll
            for (i = 0; i < W; i++) acc[i] += d[i] * xv[i] * rs;
        }
    }
#pragma unroll
    for (i = 0; i < W; i++) sh[threadIdx.y][i * 32 + threadIdx.x] = acc[i];
    __syncthreads();
    if (t < 32 * W) { /* thread t writes column blockIdx.x·32·W + t: coalesced */
        int64_t c = (int64_t)blockIdx.x * 32 * W + t;
        int lane = t / W, e = t % W, y;
        float s = 0;
        for (y = 0; y < US__DW_TY; y++) s += sh[y][e * 32 + lane];
        if (c < C) part[(int64_t)blockIdx.y * C + c] = s;
    }
}

/* dw += Σ_k part[k]: block (32, US__DW_TY), warp y sums chunks y, y+US__DW_TY, … in order, then the
   warps' sums are added in order y = 0, 1, … (fixed, deterministic) */
__global__ void __launch_bounds__(32 * US__DW_TY)
    us__k_rmsnorm_bwd_dw_sum(float *dw, const float *part, int nchunks, int64_t C) {
    __shared__ float sh[US__DW_TY][32];
    int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    float acc = 0;
    int k;
    if (c < C) {
#pragma unroll 4
        for (k = threadIdx.y; k < nchunks; k += US__DW_TY) acc += part[(int64_t)k * C + c];
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0;
        for (k = 0; k < US__DW_TY; k++) s += sh[k][threadIdx.x];
        dw[c] += s;
    }
}

/* threads for the vector row kernels, or 0 when the row does not fit / is not vectorizable */
static int us__row_threads(int64_t C, int W) {
    int64_t nv = C / W, th;
    if (C % W) return 0;
    th = ((nv + US__ROW_RV - 1) / US__ROW_RV + 31) / 32 * 32;
    return th <= 1024 ? (int)th : 0;
}

static void us__cuda_rmsnorm_fwd(us_ops *o, void *out, float *rstd, const void *x, const void *w,
                                 int64_t N, int64_t C, float eps, us_dtype dt) {
    int th = us__row_threads(C, 16 / (int)us_dtype_size(dt));
    if (th && us__al16(out) && us__al16(x) && us__al16(w))
        US__DISPATCH(o, dt,
                     (us__k_rmsnorm_fwd_vec<T_><<<(unsigned)N, th, 0, us__cu(o)->stream>>>(
                         (T_ *)out, rstd, (const T_ *)x, (const T_ *)w, C, eps)));
    else
        US__DISPATCH(o, dt,
                     (us__k_rmsnorm_fwd<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>(
                         (T_ *)out, rstd, (const T_ *)x, (const T_ *)w, C, eps)));
}

static void us__cuda_rmsnorm_bwd(us_ops *o, void *dx, float *dw, const void *dout, const void *x,
                                 const void *w, const float *rstd, int64_t N, int64_t C,
                                 us_dtype dt) {
    cudaStream_t s = us__cu(o)->stream;
    int W = 16 / (int)us_dtype_size(dt), th = us__row_threads(C, W);
    int vin =
        C % W == 0 && us__al16(dout) && us__al16(x);    /* dout and x rows can be read as vectors */
    int one = th && vin && us__al16(dx) && us__al16(w); /* one pass: dx and dw's partial sums */
    int rows = one ? US__RMS_FROWS : US__RMS_ROWS, nch = (int)((N + rows - 1) / rows);
    float *part = (float *)us__cuda_scratch(o, (size_t)nch * C * 4); /* [nch][C] */
    if (!part) return;
    if (one)
        US__DISPATCH(o, dt,
                     (us__k_rmsnorm_bwd_vec<T_>
                      <<<(unsigned)nch, th, 0, s>>>((T_ *)dx, part, (const T_ *)dout, (const T_ *)x,
                                                    (const T_ *)w, rstd, N, C)));
    else {
        US__DISPATCH(o, dt,
                     (us__k_rmsnorm_bwd_dx<T_><<<(unsigned)N, 256, 0, s>>>(
                         (T_ *)dx, (const T_ *)dout, (const T_ *)x, (const T_ *)w, rstd, C)));
        if (vin) {
            dim3 g((unsigned)((C / W + 31) / 32), (unsigned)nch);
            US__DISPATCH(o, dt,
                         (us__k_rmsnorm_bwd_dw_part_vec<T_><<<g, dim3(32, US__DW_TY), 0, s>>>(
                             part, (const T_ *)dout, (const T_ *)x, rstd, N, C)));
        } else {
            dim3 g((unsigned)((C + 127) / 128), (unsigned)nch);
            US__DISPATCH(o, dt,
                         (us__k_rmsnorm_bwd_dw_part<T_>
                          <<<g, 128, 0, s>>>(part, (const T_ *)dout, (const T_ *)x, rstd, N, C)));
        }
    }
    us__k_rmsnorm_bwd_dw_sum<<<(unsigned)((C + 31) / 32), dim3(32, US__DW_TY), 0, s>>>(dw, part,
                                                                                       nch, C);
    US__LAUNCHED(o);
}

/* RoPE (rotate-half), in place on the q and k heads of qkv[N, QKV]. The angles t·freq[j]
   (freq: the model's us_rope_freqs, θ^(−2j/HS) or Llama 3's rescaling of it) are formed once
   per (T, HS, freq) in double, like the CPU reference, into a table cos|sin [T, HS/2]; the
   per-token kernels are then a pure stream over q and k. Position t is n mod T, or pos[n mod T]
   when pos is given (context parallelism: the table then spans T_total).
   tab f32 [2][T_len][HS/2]; freq f64 [HS/2] (device) */
__global__ void us__k_rope_table(float *tab, int64_t T_len, int HS, const double *freq) {
    int half = HS / 2;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T_len * half) return;
    {
        double ang = (double)(i / half) * freq[i % half];
        tab[i] = (float)cos(ang);
        tab[T_len * half + i] = (float)sin(ang);
    }
}

/* one thread per (row n, head h, pair j) — grid: y over rows (grid-stride), x over the pairs.
   qkv [N, QKV], QKV = (NH + 2·NKV)·HS: the NH q heads and NKV k heads rotate, v stays;
   tab f32 [2][T_tab][HS/2] (cos, sin); pos i32 [T_len] or NULL */
template <typename T>
__global__ void us__k_rope(T *qkv, const float *tab, const int32_t *pos, int64_t N, int64_t T_len,
                           int64_t T_tab, int NH, int NKV, int HS, float dir) {
    int half = HS / 2, pairs = (NH + NKV) * half;
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, n;
    if (p >= pairs) return;
    for (n = blockIdx.y; n < N; n += gridDim.y) {
        int h = p / half, j = p % half;
        int64_t t = pos ? pos[n % T_len] : n % T_len;
        float cs = tab[t * half + j], sn = tab[T_tab * half + t * half + j] * dir;
        T *v = qkv + n * QKV + (int64_t)h * HS;
        float a = us__ld(v, j), b = us__ld(v, j + half);
        us__st(v, j, a * cs - b * sn);
        us__st(v, j + half, b * cs + a * sn);
    }
}

/* The same with 16-byte accesses: one thread per (row n, head h, W consecutive pairs), the
   flat index split as n · (NH+NKV)·HS/(2W) + the pair vector; needs HS/2 a multiple of W and
   16-byte aligned rows. 2-byte accesses left the scalar kernel at a third of the bandwidth. */
template <typename T>
__global__ void __launch_bounds__(256)
    us__k_rope_vec(T *qkv, const float *tab, const int32_t *pos, int64_t N, int64_t T_len,
                   int64_t T_tab, int NH, int NKV, int HS, float dir) {
    enum { W = us__vec<T>::W };

    const int half = HS / 2, hv = half / W, pv = (NH + NKV) * hv; /* vectors per head, per row */
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * pv) return;
    const int64_t n = idx / pv, QKV = (int64_t)(NH + 2 * NKV) * HS;
    const int p = (int)(idx - n * pv), h = p / hv, j = (p - h * hv) * W;
    const int64_t t = pos ? pos[n % T_len] : n % T_len;
    const float *cs = tab + t * half + j, *sn = tab + T_tab * half + t * half + j;
    T *v = qkv + n * QKV + (int64_t)h * HS + j;
    float a[W], b[W], c[W], s[W], x[W], y[W];
    us__ldv(v, a);
    us__ldv(v + half, b);
#pragma unroll
    for (int i = 0; i < W; i += 4) {
        us__ldv(cs + i, c + i);
        us__ldv(sn + i, s + i);
    }
#pragma unroll
    for (int i = 0; i < W; i++) {
        const float sd = s[i] * dir; /* the scalar kernel's expressions, so the same bits */
        x[i] = a[i] * c[i] - b[i] * sd;
        y[i] = b[i] * c[i] + a[i] * sd;
    }
    us__stv(v, x);
    us__stv(v + half, y);
}

/* the cos|sin table for positions [0, T_tab), rebuilt only when (T_tab, HS, freq) change. The
   host copy of freq is the source of the upload, so it outlives the asynchronous copy. */
static int us__cuda_rope_table(us_ops *o, int64_t T_tab, int HS, const double *freq) {
    us__cuda *c = us__cu(o);
    const size_t fb = sizeof(double) * (size_t)(HS / 2);
    if (c->rope_T == T_tab && c->rope_HS == HS && !memcmp(c->rope_freq, freq, fb)) return 1;
    /* cos and sin, T_tab·HS/2 each, then the frequencies at an 8-byte aligned offset */
    const size_t tb = ((size_t)T_tab * HS * sizeof(float) + 7) / 8 * 8, need = tb + fb;
    if (need > c->rope_bytes) {
        if (c->rope_tab) us__cuda_free(o, c->rope_tab);
        c->rope_tab = (float *)us__cuda_alloc(o, need);
        c->rope_bytes = c->rope_tab ? need : 0;
    }
    if (c->rope_HS != HS || !c->rope_freq) {
        free(c->rope_freq);
        c->rope_freq = (double *)malloc(fb);
        c->rope_HS = 0;
    }
    if (!c->rope_tab || !c->rope_freq) {
        c->rope_T = -1; /* no table: the next call tries again */
        us__cuda_fail(o, "rope table", "out of memory", __FILE__, __LINE__);
        return 0;
    }
    memcpy(c->rope_freq, freq, fb);
    double *dfreq = (double *)((char *)c->rope_tab + tb);
    US__CU(o, cudaMemcpyAsync(dfreq, c->rope_freq, fb, cudaMemcpyHostToDevice, c->stream));
    us__k_rope_table<<<us__blocks(T_tab * (HS / 2), 256), 256, 0, c->stream>>>(c->rope_tab, T_tab,
                                                                               HS, dfreq);
    US__LAUNCHED(o);
    c->rope_T = T_tab;
    c->rope_HS = HS;
    return 1;
}

/* rotate qkv[B·T] by angle dir·t·θ_j, t = n mod T or pos[n mod T] (pos: T_tab positions) */
static void us__cuda_rope(us_ops *o, void *qkv, const int32_t *pos, int64_t B, int64_t T,
                          int64_t T_tab, int NH, int NKV, int HS, const double *freq, us_dtype dt,
                          float dir) {
    us__cuda *c = us__cu(o);
    int W = 16 / (int)us_dtype_size(dt), pairs = (NH + NKV) * (HS / 2);
    if (B * T <= 0) return;
    if (!us__cuda_rope_table(o, T_tab, HS, freq)) return;
    if ((HS / 2) % W == 0 && us__al16(qkv)) {
        int64_t n = B * T * (pairs / W);
        US__DISPATCH(o, dt,
                     (us__k_rope_vec<T_><<<us__blocks(n, 256), 256, 0, c->stream>>>(
                         (T_ *)qkv, c->rope_tab, pos, B * T, T, T_tab, NH, NKV, HS, dir)));
    } else {
        dim3 g((unsigned)((pairs + 127) / 128), (unsigned)(B * T < 65535 ? B * T : 65535));
        US__DISPATCH(o, dt,
                     (us__k_rope<T_><<<g, 128, 0, c->stream>>>((T_ *)qkv, c->rope_tab, pos, B * T,
                                                               T, T_tab, NH, NKV, HS, dir)));
    }
}

/* RoPE at given positions (context parallelism): the table for T_total positions, indexed by pos */
static void us__cuda_rope_at(us_ops *o, void *qkv, const int32_t *pos, int64_t B, int64_t T,
                             int64_t T_total, int NH, int NKV, int HS, const double *freq,
                             float dir, us_dtype dt) {
    us__cuda_rope(o, qkv, pos, B, T, T_total, NH, NKV, HS, freq, dt, dir);
}

static void us__cuda_copy2d(us_ops *o, void *dst, int64_t dld, const void *src, int64_t sld,
                            int64_t rows, int64_t cols, us_dtype dt) {
    size_t a = us_dtype_size(dt);
    if (rows <= 0 || cols <= 0) return;
    US__CU(o, cudaMemcpy2DAsync(dst, (size_t)dld * a, src, (size_t)sld * a, (size_t)cols * a,
                                (size_t)rows, cudaMemcpyDeviceToDevice, us__cu(o)->stream));
}

static void us__cuda_rope_fwd(us_ops *o, void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS,
                              const double *freq, us_dtype dt) {
    us__cuda_rope(o, qkv, NULL, B, T, T, NH, NKV, HS, freq, dt, 1.0f);
}

static void us__cuda_rope_bwd(us_ops *o, void *dqkv, int64_t B, int64_t T, int NH, int NKV, int HS,
                              const double *freq, us_dtype dt) {
    us__cuda_rope(o, dqkv, NULL, B, T, T, NH, NKV, HS, freq, dt, -1.0f);
}

/* silu(g)·u = g / (1 + e^−g) · u: the one expression every forward kernel uses, the fused one of
   // >>cuda-fp8 too, so that all of them form the same bits. The division is the fast one
   (__fdividef, within 2 ulp; 0 once 1 + e^−g passes 2^126, where the true value is below
   2^−119 in magnitude), as in the backward's us__swiglu_grad below: IEEE division's range checks
   and slow path took issue slots from the two-dimensional FP8 kernel (bench/RESULTS.md,
   "Measurements behind the code's choices"). */
__device__ __forceinline__ float us__swiglu_h(float g, float u) {
    return __fdividef(g, 1.0f + __expf(-g)) * u;
}

/* SwiGLU on gu[N, 2F] = gate | up: h [N, F] = silu(gate)·up; backward dh [N, F] → dgu [N, 2F]
   (may be gu itself). Grid y walks the rows, x the columns, so no element pays a 64-bit
   division to find its row. */
template <typename T>
__global__ void us__k_swiglu_fwd(T *h, const T *gu, int64_t N, int64_t F) {
    int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n;
    if (f >= F) return;
    for (n = blockIdx.y; n < N; n += gridDim.y) {
        float g = us__ld(gu, n * 2 * F + f), u = us__ld(gu, n * 2 * F + F + f);
        us__st(h, n * F + f, us__swiglu_h(g, u));
    }
}

/* d·∂(silu(g)·u)/∂g and d·∂(silu(g)·u)/∂u: the one expression every backward kernel uses, the
   fused one of // >>cuda-fp8 too, so that all of them form the same bits. The sigmoid's
   reciprocal is the fast one (__fdividef: within 2 ulp, as __expf is; 0 once 1 + e^−g passes
   2^126, where the true value is below 2^−126), not IEEE division, which measured slower in the
   fused FP8 kernel (bench/RESULTS.md, "Measurements behind the code's choices") */
__device__ __forceinline__ void us__swiglu_grad(float g, float u, float d, float &dg, float &du) {
    float sg = __fdividef(1.0f, 1.0f + __expf(-g));
    dg = d * u * sg * (1.0f + g * (1.0f - sg));
    du = d * g * sg;
}

template <typename T>
__global__ void us__k_swiglu_bwd(T *dgu, const T *dh, const T *gu, int64_t N, int64_t F) {
    int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n;
    if (f >= F) return;
    for (n = blockIdx.y; n < N; n += gridDim.y) {
        float g = us__ld(gu, n * 2 * F + f), u = us__ld(gu, n * 2 * F + F + f),
              d = us__ld(dh, n * F + f), dg, du;
        us__swiglu_grad(g, u, d, dg, du);
        us__st(dgu, n * 2 * F + f, dg);
        us__st(dgu, n * 2 * F + F + f, du);
    }
}

/* Vector path (F a multiple of the vector width, 16-byte aligned buffers): each thread owns W
   adjacent columns, so every access is one 16-byte load or store. */
template <typename T, typename Epi = us__no_epi>
__global__ void us__k_swiglu_fwd_vec(T *h, const T *gu, int64_t N, int64_t F, Epi epi = Epi()) {
    enum { W = us__vec<T>::W };

    int64_t f = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W, n;
    int i;
    if (f >= F) return;
    for (n = blockIdx.y; n < N; n += gridDim.y) {
        float g[W], u[W], o[W];
        us__ldv(gu + n * 2 * F + f, g);
        us__ldv(gu + n * 2 * F + F + f, u);
#pragma unroll
        for (i = 0; i < W; i++) o[i] = us__swiglu_h(g[i], u[i]);
        us__stv(h + n * F + f, o);
        epi(o, n, f, true);
    }
}

template <typename T>
__global__ void us__k_swiglu_bwd_vec(T *dgu, const T *dh, const T *gu, int64_t N, int64_t F) {
    enum { W = us__vec<T>::W };

    int64_t f = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W, n;
    int i;
    if (f >= F) return;
    for (n = blockIdx.y; n < N; n += gridDim.y) {
        float g[W], u[W], d[W], dg[W], du[W];
        us__ldv(gu + n * 2 * F + f, g);
        us__ldv(gu + n * 2 * F + F + f, u);
        us__ldv(dh + n * F + f, d);
#pragma unroll
        for (i = 0; i < W; i++) us__swiglu_grad(g[i], u[i], d[i], dg[i], du[i]);
        us__stv(dgu + n * 2 * F + f, dg);
        us__stv(dgu + n * 2 * F + F + f, du);
    }
}

static dim3 us__rows_grid(int64_t N, int64_t F, int threads) {
    return dim3((unsigned)((F + threads - 1) / threads), (unsigned)(N < 65535 ? N : 65535));
}

static void us__cuda_swiglu_fwd(us_ops *o, void *h, const void *gu, int64_t N, int64_t F,
                                us_dtype dt) {
    if (N <= 0 || F <= 0)
        return; /* an expert, or a whole rank under // >>ep, may get no rows: a 0-sized grid is an error */
    int64_t W = 16 / (int64_t)us_dtype_size(dt);
    if (F % W == 0 && us__al16(h) && us__al16(gu))
        US__DISPATCH(
            o, dt,
            (us__k_swiglu_fwd_vec<T_><<<us__rows_grid(N, F / W, 256), 256, 0, us__cu(o)->stream>>>(
                (T_ *)h, (const T_ *)gu, N, F)));
    else
        US__DISPATCH(o, dt,
                     (us__k_swiglu_fwd<T_><<<us__rows_grid(N, F, 256), 256, 0, us__cu(o)->stream>>>(
                         (T_ *)h, (const T_ *)gu, N, F)));
}

static void us__cuda_swiglu_bwd(us_ops *o, void *dgu, const void *dh, const void *gu, int64_t N,
                                int64_t F, us_dtype dt) {
    if (N <= 0 || F <= 0)
        return; /* an expert, or a whole rank under // >>ep, may get no rows: a 0-sized grid is an error */
    int64_t W = 16 / (int64_t)us_dtype_size(dt);
    if (F % W == 0 && us__al16(dgu) && us__al16(dh) && us__al16(gu))
        US__DISPATCH(
            o, dt,
            (us__k_swiglu_bwd_vec<T_><<<us__rows_grid(N, F / W, 256), 256, 0, us__cu(o)->stream>>>(
                (T_ *)dgu, (const T_ *)dh, (const T_ *)gu, N, F)));
    else
        US__DISPATCH(o, dt,
                     (us__k_swiglu_bwd<T_><<<us__rows_grid(N, F, 256), 256, 0, us__cu(o)->stream>>>(
                         (T_ *)dgu, (const T_ *)dh, (const T_ *)gu, N, F)));
}

/* The end of pass 1 of both cross-entropy kernels: combine the threads' running (max, rescaled
   sum, first argmax) into the row's log-sum-exp, write the loss and the argmax (the smallest
   index among the maxima, like the CPU's first-max scan); returns lse to every thread. */
template <typename T>
__device__ float us__xent_combine(float mx, float sum, int am, const T *row, int y, float *loss,
                                  int32_t *argmax, float *sh, int *shi) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, i, cand;
    float bm = us__block_max(mx, sh), lse;
    sum = us__block_sum(mx == -INFINITY ? 0.0f : sum * __expf(mx - bm), sh);
    cand = mx == bm ? am : 0x7fffffff;
    for (i = 16; i > 0; i >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, i));
    __syncthreads();
    if (lane == 0) shi[w] = cand;
    __syncthreads();
    am = 0x7fffffff;
    for (i = 0; i < (int)(blockDim.x >> 5); i++) am = min(am, shi[i]);
    lse = logf(sum) + bm;
    if (threadIdx.x == 0) {
        *loss = y < 0 ? 0.0f : lse - us__ld(row, y);
        if (argmax) *argmax = am;
    }
    return lse;
}

/* Fused softmax-cross-entropy: one block per row. Pass 1 keeps a running max and a rescaled
   sum (online softmax) and the first argmax; pass 2 writes the gradient over the logits.
   Probabilities never reach memory and the row is read twice, written once.
   logits [N, V] (dlogits in place); tgt i32 [N] (< 0: ignored); losses f32 [N]; argmax i32 [N] */
template <typename T>
__global__ void us__k_xent(float *losses, int32_t *argmax, T *logits, const int32_t *tgt, int64_t V,
                           float dscale) {
    __shared__ float sh[32];
    __shared__ int shi[32];
    int64_t n = blockIdx.x, v;
    T *row = logits + n * V;
    float mx = -INFINITY, sum = 0, lse;
    int am = 0x7fffffff, y = tgt[n];
    for (v = threadIdx.x; v < V; v += blockDim.x) {
        float x = us__ld(row, v);
        if (x > mx) {
            sum = sum * __expf(mx - x) + 1.0f;
            mx = x;
            am = (int)v;
        } else
            sum += __expf(x - mx);
    }
    lse = us__xent_combine(mx, sum, am, row, y, losses + n, argmax ? argmax + n : NULL, sh, shi);
    if (dscale != 0.0f) {
        __syncthreads(); /* row[y] was read above before it is overwritten below */
        for (v = threadIdx.x; v < V; v += blockDim.x)
            us__st(row, v,
                   y < 0 ? 0.0f : dscale * (__expf(us__ld(row, v) - lse) - (v == y ? 1.0f : 0.0f)));
    }
}

/* Vector path (V a multiple of the vector width, aligned logits): each thread reads W logits per
   16-byte load, two loads in flight per iteration. Per vector: its first maximum, one rescale of
   the running sum when that beats the running max, then W exponentials. A thread's vectors come in
   increasing index order and only a strictly larger value moves the argmax, so each thread keeps
   its first maximum and the block takes the smallest index among the maxima, as before. */
#define US__XENT_THREADS 512

template <typename T>
static __device__ __forceinline__ void us__xent_acc(const float *x, int base, float &mx, float &sum,
                                                    int &am) {
    enum { W = us__vec<T>::W };

    float m = x[0];
    int a = 0, k;
#pragma unroll
    for (k = 1; k < W; k++)
        if (x[k] > m) {
            m = x[k];
            a = k;
        }
    if (m > mx) {
        sum *= __expf(mx - m);
        mx = m;
        am = base + a;
    }
    if (mx != -INFINITY) {
#pragma unroll
        for (k = 0; k < W; k++) sum += __expf(x[k] - mx);
    }
}

template <typename T>
__global__ void __launch_bounds__(US__XENT_THREADS)
    us__k_xent_vec(float *losses, int32_t *argmax, T *logits, const int32_t *tgt, int64_t V,
                   float dscale) {
    enum { W = us__vec<T>::W };

    __shared__ float sh[32];
    __shared__ int shi[32];
    int64_t n = blockIdx.x;
    T *row = logits + n * V;
    float mx = -INFINITY, sum = 0, lse;
    int am = 0x7fffffff, y = tgt[n], j, k, nv = (int)(V / W), bd = blockDim.x;
    for (j = threadIdx.x; j < nv; j += 2 * bd) {
        float x0[W], x1[W];
        us__ldv(row + (int64_t)j * W, x0);
        if (j + bd < nv) us__ldv(row + (int64_t)(j + bd) * W, x1);
        us__xent_acc<T>(x0, j * W, mx, sum, am);
        if (j + bd < nv) us__xent_acc<T>(x1, (j + bd) * W, mx, sum, am);
    }
    lse = us__xent_combine(mx, sum, am, row, y, losses + n, argmax ? argmax + n : NULL, sh, shi);
    if (dscale != 0.0f) {
        __syncthreads(); /* row[y] was read above before it is overwritten below */
        if (y < 0) {
            float z[W];
#pragma unroll
            for (k = 0; k < W; k++) z[k] = 0.0f;
            for (j = threadIdx.x; j < nv; j += bd) us__stv(row + (int64_t)j * W, z);
        } else
            for (j = threadIdx.x; j < nv; j += 2 * bd) {
                float x0[W], x1[W];
                int j1 = j + bd;
                us__ldv(row + (int64_t)j * W, x0);
                if (j1 < nv) us__ldv(row + (int64_t)j1 * W, x1);
#pragma unroll
                for (k = 0; k < W; k++)
                    x0[k] = dscale * (__expf(x0[k] - lse) - (j * W + k == y ? 1.0f : 0.0f));
                us__stv(row + (int64_t)j * W, x0);
                if (j1 < nv) {
#pragma unroll
                    for (k = 0; k < W; k++)
                        x1[k] = dscale * (__expf(x1[k] - lse) - (j1 * W + k == y ? 1.0f : 0.0f));
                    us__stv(row + (int64_t)j1 * W, x1);
                }
            }
    }
}

/* Attention by key blocks with positions (context parallelism), the portable kernels: one thread
   per query row (forward, dQ) or per key row (dK, dV), so every sum has one order and no atomics.
   Correct and simple, and slow; bf16 and fp16 at HS 64, 80, 96, 128, 192, 256 on sm_80+ run the
   flash kernels of // >>cuda-cp-flash.
   Shapes as there: qkv [B, Tq, QKV]; kv [B, Tk, 2·NKV·HS]; acc f32 [B, NH, Tq, HS]; m, l f32
   [B, NH, Tq]; dq f32 [B, Tq, NH·HS] +=; dkv f32 [B, Tk, 2·NKV·HS] += */
template <typename T>
__global__ void us__k_attn_block_fwd(float *acc, float *m, float *l, const T *qkv, const T *kv,
                                     const int32_t *qpos, const int32_t *kpos, int64_t B,
                                     int64_t Tq, int64_t Tk, int NH, int NKV, int HS, int init,
                                     float scale) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, j;
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KV = (int64_t)2 * NKV * HS;
    if (r >= B * NH * Tq) return;
    int64_t b = r / (NH * Tq), i = r % Tq;
    int h = (int)(r / Tq % NH), g = h / (NH / NKV), d;
    float *ar = acc + r * HS, mr = init ? -INFINITY : m[r], lr = init ? 0.0f : l[r];
    const T *q = qkv + (b * Tq + i) * QKV + (int64_t)h * HS;
    if (init)
        for (d = 0; d < HS; d++) ar[d] = 0;
    for (j = 0; j < Tk; j++) {
        const T *k = kv + (b * Tk + j) * KV + (int64_t)g * HS,
                *v = kv + (b * Tk + j) * KV + (int64_t)(NKV + g) * HS;
        float sc = 0, p;
        if (kpos[j] > qpos[i]) continue;
        for (d = 0; d < HS; d++) sc += us__ld(q, d) * us__ld(k, d);
        sc *= scale;
        if (sc > mr) { /* a new maximum: rescale what was summed */
            float corr = expf(mr - sc);
            lr *= corr;
            for (d = 0; d < HS; d++) ar[d] *= corr;
            mr = sc;
        }
        p = expf(sc - mr);
        lr += p;
        for (d = 0; d < HS; d++) ar[d] += p * us__ld(v, d);
    }
    m[r] = mr;
    l[r] = lr;
}

/* out = acc / l and lse = m + log l: one warp per row of acc [B,NH,Tq,HS], its lanes along HS,
   so both the fp32 reads and the out[B,Tq,NH·HS] writes are coalesced (the op moves ~6 bytes
   per element and does nothing else; any dtype and head size). V4 (HS a multiple of 4, acc and
   out aligned to 4 elements): 4 elements a lane, one 16-byte load and one 4-element store (one
   element a lane left the DRAM mostly idle: bench/RESULTS.md, "Measurements behind the code's
   choices"). The same values either way. */
template <typename T, bool V4>
__global__ void us__k_attn_block_finish(T *out, float *lse, const float *acc, const float *m,
                                        const float *l, int64_t B, int64_t Tq, int NH, int HS) {
    const int lane = threadIdx.x & 31;
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < B * NH * Tq;
         r += (int64_t)gridDim.x * (blockDim.x >> 5)) {
        int64_t b = r / (NH * Tq), h = r / Tq % NH, i = r % Tq;
        float lr = l[r], inv = lr > 0 ? 1.0f / lr : 0.0f;
        T *orow = out + (b * Tq + i) * NH * HS + h * HS;
        if constexpr (V4)
            for (int d = 4 * lane; d < HS; d += 128) {
                const float4 a = *reinterpret_cast<const float4 *>(acc + r * HS + d);
                const float f[4] = {a.x * inv, a.y * inv, a.z * inv, a.w * inv};
                us__st4(orow + d, f);
            }
        else
            for (int d = lane; d < HS; d += 32) us__st(orow, d, acc[r * HS + d] * inv);
        if (lane == 0) lse[r] = lr > 0 ? m[r] + logf(lr) : -INFINITY;
    }
}

template <typename T>
__global__ void us__k_attn_block_dq(float *dq, const T *dout, const T *qkv, const T *out,
                                    const float *lse, const T *kv, const int32_t *qpos,
                                    const int32_t *kpos, int64_t B, int64_t Tq, int64_t Tk, int NH,
                                    int NKV, int HS, float scale) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, j;
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KV = (int64_t)2 * NKV * HS;
    if (r >= B * NH * Tq) return;
    int64_t b = r / (NH * Tq), i = r % Tq;
    int h = (int)(r / Tq % NH), g = h / (NH / NKV), d;
    int64_t orow = (b * Tq + i) * NH * HS + (int64_t)h * HS;
    const T *q = qkv + (b * Tq + i) * QKV + (int64_t)h * HS;
    float L = lse[r], D = 0;
    if (L == -INFINITY) return;
    for (d = 0; d < HS; d++) D += us__ld(dout, orow + d) * us__ld(out, orow + d);
    for (j = 0; j < Tk; j++) {
        const T *k = kv + (b * Tk + j) * KV + (int64_t)g * HS,
                *v = kv + (b * Tk + j) * KV + (int64_t)(NKV + g) * HS;
        float sc = 0, dp = 0, p, ds;
        if (kpos[j] > qpos[i]) continue;
        for (d = 0; d < HS; d++) {
            sc += us__ld(q, d) * us__ld(k, d);
            dp += us__ld(dout, orow + d) * us__ld(v, d);
        }
        p = expf(sc * scale - L);
        ds = p * (dp - D) * scale;
        for (d = 0; d < HS; d++) dq[orow + d] += ds * us__ld(k, d);
    }
}

template <typename T>
__global__ void us__k_attn_block_dkv(float *dkv, const T *dout, const T *qkv, const T *out,
                                     const float *lse, const T *kv, const int32_t *qpos,
                                     const int32_t *kpos, int64_t B, int64_t Tq, int64_t Tk, int NH,
                                     int NKV, int HS, float scale) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i; /* r = (b, g, j) */
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KV = (int64_t)2 * NKV * HS;
    if (r >= B * NKV * Tk) return;
    int64_t b = r / (NKV * Tk), j = r % Tk;
    int g = (int)(r / Tk % NKV), grp = NH / NKV, h, d;
    const T *k = kv + (b * Tk + j) * KV + (int64_t)g * HS,
            *v = kv + (b * Tk + j) * KV + (int64_t)(NKV + g) * HS;
    float *dk = dkv + (b * Tk + j) * KV + (int64_t)g * HS,
          *dv = dkv + (b * Tk + j) * KV + (int64_t)(NKV + g) * HS;
    for (h = g * grp; h < (g + 1) * grp; h++)
        for (i = 0; i < Tq; i++) {
            int64_t orow = (b * Tq + i) * NH * HS + (int64_t)h * HS;
            const T *q = qkv + (b * Tq + i) * QKV + (int64_t)h * HS;
            float L = lse[(b * NH + h) * Tq + i], D = 0, sc = 0, dp = 0, p, ds;
            if (kpos[j] > qpos[i] || L == -INFINITY) continue;
            for (d = 0; d < HS; d++) {
                D += us__ld(dout, orow + d) * us__ld(out, orow + d);
                sc += us__ld(q, d) * us__ld(k, d);
                dp += us__ld(dout, orow + d) * us__ld(v, d);
            }
            p = expf(sc * scale - L);
            ds = p * (dp - D) * scale;
            for (d = 0; d < HS; d++) {
                dk[d] += ds * us__ld(q, d);
                dv[d] += p * us__ld(dout, orow + d);
            }
        }
}

/* Every attention kernel's softmax scale, 1/sqrt(HS), and the factor sl2 = scale·log2 e of the
   kernels that take exp(x) as exp2(x·log2 e), one MUFU instruction (ex2): one expression each,
   so that a backward recomputes the forward's probabilities from the same bits */
#define US__LOG2E 1.4426950408889634f

static __host__ __device__ inline float us__attn_scale(int HS) { return 1.f / sqrtf((float)HS); }

static __host__ __device__ inline float us__attn_sl2(int HS) {
    return us__attn_scale(HS) * US__LOG2E;
}

/* The portable path of the ops (fp32, other head sizes, GPUs before sm_80); bf16 and fp16 at the
   head sizes real models use take the flash kernels of // >>cuda-cp-flash, which fall back to
   these. */
static void us__attn_block_fwd_naive(us_ops *o, float *acc, float *m, float *l, const void *qkv,
                                     const void *kv, const int32_t *qpos, const int32_t *kpos,
                                     int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV, int HS,
                                     int init, us_dtype dt) {
    int64_t n = B * NH * Tq;
    if (n <= 0) return;
    US__DISPATCH(o, dt,
                 (us__k_attn_block_fwd<T_><<<us__blocks(n, 128), 128, 0, us__cu(o)->stream>>>(
                     acc, m, l, (const T_ *)qkv, (const T_ *)kv, qpos, kpos, B, Tq, Tk, NH, NKV, HS,
                     init, us__attn_scale(HS))));
}

template <typename T>
static void us__attn_block_finish_launch(bool v4, cudaStream_t st, T *out, float *lse,
                                         const float *acc, const float *m, const float *l,
                                         int64_t B, int64_t Tq, int NH, int HS) {
    const unsigned grid = us__blocks(B * NH * Tq, 8);
    if (v4)
        us__k_attn_block_finish<T, true><<<grid, 256, 0, st>>>(out, lse, acc, m, l, B, Tq, NH, HS);
    else
        us__k_attn_block_finish<T, false><<<grid, 256, 0, st>>>(out, lse, acc, m, l, B, Tq, NH, HS);
}

static void us__cuda_attn_block_finish(us_ops *o, void *out, float *lse, const float *acc,
                                       const float *m, const float *l, int64_t B, int64_t Tq,
                                       int NH, int HS, us_dtype dt) {
    int64_t n = B * NH * Tq;
    if (n <= 0) return;
    const bool v4 = HS % 4 == 0 && us__al16(acc) && us__al(out, 4 * us_dtype_size(dt));
    US__DISPATCH(o, dt,
                 (us__attn_block_finish_launch<T_>(v4, us__cu(o)->stream, (T_ *)out, lse, acc, m, l,
                                                   B, Tq, NH, HS)));
}

static void us__attn_block_bwd_naive(us_ops *o, float *dq, float *dkv, const void *dout,
                                     const void *qkv, const void *out, const float *lse,
                                     const void *kv, const int32_t *qpos, const int32_t *kpos,
                                     int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV, int HS,
                                     us_dtype dt) {
    float scale = us__attn_scale(HS);
    if (B * NH * Tq > 0)
        US__DISPATCH(
            o, dt,
            (us__k_attn_block_dq<T_><<<us__blocks(B * NH * Tq, 128), 128, 0, us__cu(o)->stream>>>(
                dq, (const T_ *)dout, (const T_ *)qkv, (const T_ *)out, lse, (const T_ *)kv, qpos,
                kpos, B, Tq, Tk, NH, NKV, HS, scale)));
    if (B * NKV * Tk > 0)
        US__DISPATCH(
            o, dt,
            (us__k_attn_block_dkv<T_><<<us__blocks(B * NKV * Tk, 128), 128, 0, us__cu(o)->stream>>>(
                dkv, (const T_ *)dout, (const T_ *)qkv, (const T_ *)out, lse, (const T_ *)kv, qpos,
                kpos, B, Tq, Tk, NH, NKV, HS, scale)));
}

/* Vocabulary-parallel cross-entropy (TP): one block per row, plain block reductions.
   logits [N, V/tp] this rank's columns; mx, tlogit f32 [N]; sumexp f64 [N]; amax i32 [N] */
template <typename T>
__global__ void us__k_xent_stats(float *mx, int32_t *amax, double *sumexp, float *tlogit,
                                 const T *logits, const int32_t *tgt, int64_t V) {
    __shared__ float sm[256];
    __shared__ int si[256];
    __shared__ double sd[256];
    int64_t n = blockIdx.x, v;
    const T *row = logits + n * V;
    int t = threadIdx.x, k;
    if (!sumexp) {
        float m = -INFINITY;
        int am = 0;
        for (v = t; v < V; v += blockDim.x) {
            float x = us__ld(row, v);
            if (x > m) {
                m = x;
                am = (int)v;
            }
        }
        sm[t] = m;
        si[t] = am;
        __syncthreads();
        for (k = blockDim.x / 2; k > 0; k >>= 1) {
            if (t < k && (sm[t + k] > sm[t] || (sm[t + k] == sm[t] && si[t + k] < si[t]))) {
                sm[t] = sm[t + k];
                si[t] = si[t + k];
            }
            __syncthreads();
        }
        if (t == 0) {
            mx[n] = sm[0];
            if (amax) amax[n] = si[0];
        }
    } else {
        double a = 0;
        float m = mx[n];
        for (v = t; v < V; v += blockDim.x) a += exp((double)(us__ld(row, v) - m));
        sd[t] = a;
        __syncthreads();
        for (k = blockDim.x / 2; k > 0; k >>= 1) {
            if (t < k) sd[t] += sd[t + k];
            __syncthreads();
        }
        if (t == 0) {
            sumexp[n] = sd[0];
            tlogit[n] = tgt[n] >= 0 ? us__ld(row, tgt[n]) : 0.0f;
        }
    }
}

template <typename T>
__global__ void us__k_xent_finish(float *losses, T *logits, const int32_t *tgt, const float *mx,
                                  const double *sumexp, const float *tlogit, int64_t V,
                                  float dscale) {
    int64_t n = blockIdx.x, v;
    int g = tgt[n];
    float inv = (float)(1.0 / sumexp[n]), m = mx[n];
    if (threadIdx.x == 0) losses[n] = g == -2 ? 0.0f : (float)(log(sumexp[n]) + m - tlogit[n]);
    if (dscale != 0)
        for (v = threadIdx.x; v < V; v += blockDim.x)
            us__st(logits, n * V + v,
                   g == -2
                       ? 0.0f
                       : dscale * (expf(us__ld(logits, n * V + v) - m) * inv - (float)(v == g)));
}

static void us__cuda_xent_stats(us_ops *o, float *mx, int32_t *amax, double *sumexp, float *tlogit,
                                const void *logits, const int32_t *tgt, int64_t N, int64_t V,
                                us_dtype dt) {
    if (N <= 0) return;
    US__DISPATCH(o, dt,
                 (us__k_xent_stats<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>(
                     mx, amax, sumexp, tlogit, (const T_ *)logits, tgt, V)));
}

static void us__cuda_xent_finish(us_ops *o, float *losses, void *logits, const int32_t *tgt,
                                 const float *mx, const double *sumexp, const float *tlogit,
                                 int64_t N, int64_t V, float dscale, us_dtype dt) {
    if (N <= 0) return;
    US__DISPATCH(o, dt,
                 (us__k_xent_finish<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>(
                     losses, (T_ *)logits, tgt, mx, sumexp, tlogit, V, dscale)));
}

static void us__cuda_xent(us_ops *o, float *losses, int32_t *argmax, void *logits,
                          const int32_t *tgt, int64_t N, int64_t V, float dscale, us_dtype dt) {
    int64_t W = 16 / (int64_t)us_dtype_size(dt);
    if (V % W == 0 && V < 0x7fffffff && us__al16(logits))
        US__DISPATCH(o, dt,
                     (us__k_xent_vec<T_><<<(unsigned)N, US__XENT_THREADS, 0, us__cu(o)->stream>>>(
                         losses, argmax, (T_ *)logits, tgt, V, dscale)));
    else
        US__DISPATCH(o, dt,
                     (us__k_xent<T_><<<(unsigned)N, 1024, 0, us__cu(o)->stream>>>(
                         losses, argmax, (T_ *)logits, tgt, V, dscale)));
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-attention  portable kernels (any dtype, HS ≤ 256); flash attention for bf16
/* ------------------------------------------------------------------------------------ */
/* Portable forward: one thread per query row, online softmax over the keys — the textbook
   algorithm, slow but exact in fp32; used for fp32 training and head sizes flash lacks. */
#define US__ATT_MAX_HS 256

template <typename T>
__global__ void us__k_att_fwd(T *out, float *lse, const T *qkv, int64_t B, int64_t T_len, int NH,
                              int NKV, int HS) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, QKV = (int64_t)(NH + 2 * NKV) * HS,
            j;
    float q[US__ATT_MAX_HS], acc[US__ATT_MAX_HS], m = -INFINITY, l = 0, scale = rsqrtf((float)HS);
    int d;
    if (i >= B * NH * T_len) return;
    {
        int64_t t = i % T_len, h = (i / T_len) % NH, b = i / (T_len * NH), g = h / (NH / NKV);
        for (d = 0; d < HS; d++) {
            q[d] = us__ld(qkv, (b * T_len + t) * QKV + h * HS + d);
            acc[d] = 0;
        }
        for (j = 0; j <= t; j++) {
            const T *k = qkv + (b * T_len + j) * QKV + (NH + g) * HS,
                    *v = qkv + (b * T_len + j) * QKV + (NH + NKV + g) * HS;
            float s = 0, mn, corr, p;
            for (d = 0; d < HS; d++) s += q[d] * us__ld(k, d);
            s *= scale;
            mn = fmaxf(m, s);
            corr = expf(m - mn);
            p = expf(s - mn);
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
__global__ void us__k_att_bwd_dq(T *dqkv, const T *dout, const T *qkv, const T *out,
                                 const float *lse, int64_t B, int64_t T_len, int NH, int NKV,
                                 int HS) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, QKV = (int64_t)(NH + 2 * NKV) * HS,
            j;
    float q[US__ATT_MAX_HS], dq[US__ATT_MAX_HS], dO[US__ATT_MAX_HS], D = 0,
                                                                     scale = rsqrtf((float)HS);
    int d;
    if (i >= B * NH * T_len) return;
    {
        int64_t t = i % T_len, h = (i / T_len) % NH, b = i / (T_len * NH), g = h / (NH / NKV),
                orow = (b * T_len + t) * NH * HS + h * HS;
        float L = lse[(b * NH + h) * T_len + t];
        for (d = 0; d < HS; d++) {
            q[d] = us__ld(qkv, (b * T_len + t) * QKV + h * HS + d);
            dO[d] = us__ld(dout, orow + d);
            D += dO[d] * us__ld(out, orow + d);
            dq[d] = 0;
        }
        for (j = 0; j <= t; j++) {
            const T *k = qkv + (b * T_len + j) * QKV + (NH + g) * HS,
                    *v = qkv + (b * T_len + j) * QKV + (NH + NKV + g) * HS;
            float s = 0, dp = 0, p, ds;
            for (d = 0; d < HS; d++) {
                s += q[d] * us__ld(k, d);
                dp += dO[d] * us__ld(v, d);
            }
            p = expf(s * scale - L);
            ds = p * (dp - D) * scale;
            for (d = 0; d < HS; d++) dq[d] += ds * us__ld(k, d);
        }
        for (d = 0; d < HS; d++) us__st(dqkv, (b * T_len + t) * QKV + h * HS + d, dq[d]);
    }
}

template <typename T>
__global__ void us__k_att_bwd_dkv(T *dqkv, const T *dout, const T *qkv, const T *out,
                                  const float *lse, int64_t B, int64_t T_len, int NH, int NKV,
                                  int HS) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, QKV = (int64_t)(NH + 2 * NKV) * HS,
            t;
    float k[US__ATT_MAX_HS], v[US__ATT_MAX_HS], dk[US__ATT_MAX_HS], dv[US__ATT_MAX_HS],
        scale = rsqrtf((float)HS);
    int d, h, grp = NH / NKV;
    if (i >= B * NKV * T_len) return;
    {
        int64_t j = i % T_len, g = (i / T_len) % NKV, b = i / (T_len * NKV);
        for (d = 0; d < HS; d++) {
            k[d] = us__ld(qkv, (b * T_len + j) * QKV + (NH + g) * HS + d);
            v[d] = us__ld(qkv, (b * T_len + j) * QKV + (NH + NKV + g) * HS + d);
            dk[d] = 0;
            dv[d] = 0;
        }
        for (h = (int)g * grp; h < ((int)g + 1) * grp; h++)
            for (t = j; t < T_len; t++) {
                const T *q = qkv + (b * T_len + t) * QKV + h * HS;
                int64_t orow = (b * T_len + t) * NH * HS + h * HS;
                float s = 0, dp = 0, D = 0, p, ds;
                for (d = 0; d < HS; d++) {
                    float o_ = us__ld(dout, orow + d);
                    s += us__ld(q, d) * k[d];
                    dp += o_ * v[d];
                    D += o_ * us__ld(out, orow + d);
                }
                p = expf(s * scale - lse[(b * NH + h) * T_len + t]);
                ds = p * (dp - D) * scale;
                for (d = 0; d < HS; d++) {
                    dk[d] += ds * us__ld(q, d);
                    dv[d] += p * us__ld(dout, orow + d);
                }
            }
        for (d = 0; d < HS; d++) {
            us__st(dqkv, (b * T_len + j) * QKV + (NH + g) * HS + d, dk[d]);
            us__st(dqkv, (b * T_len + j) * QKV + (NH + NKV + g) * HS + d, dv[d]);
        }
    }
}

#endif /* US__CUDA_FLASH_ONLY */
/* ------------------------------------------------------------------------------------ */
// >>cuda-flash  causal grouped-query flash attention on tensor cores (bf16 in, fp32 math)
/* ------------------------------------------------------------------------------------
   FlashAttention-2 (Dao, 2023) with mma.sync m16n8k16 (bf16 × bf16 → fp32), ldmatrix
   fragments and cp.async double-buffered tiles. Matches us__cpu_attention_fwd/bwd.

   Legend: B batch, T seq, NH query heads, NKV kv heads, HS head size (64 or 128),
   QKV = (NH + 2·NKV)·HS.
     qkv  bf16 [B, T, QKV]     q head h at h·HS, k head g at (NH+g)·HS, v head g at (NH+NKV+g)·HS
     out  bf16 [B, T, NH·HS]
     lse  f32  [B, NH, T]      natural log of Σ_j exp(q·k_j / sqrt(HS)) over keys j ≤ t
     dqkv bf16 [B, T, QKV]     fully overwritten by the backward
   Query head h reads kv head g = h / (NH/NKV). Causal: query t sees keys 0..t.

   Kernels (every CTA is 4 warps, 128 threads):
     us__flash_fwd_kernel       one CTA per (128-query block, head, batch); each warp owns 32
                                query rows (two 16-row mma atoms) and streams 32-key (HS 128) or
                                64-key (HS 64) K/V tiles through shared memory with an online
                                softmax (running max m, sum l); the T×T scores never exist.
     us__flash_bwd_dot_kernel   D = rowsum(dO ∘ O), one warp per row (the FA2 preprocess).
     us__flash_bwd_dkdv_kernel  one CTA per (64-key block at HS 128, 128 at HS 64, kv head,
                                batch); each warp owns 16 (32) keys and loops over every query
                                head of the group and every 32-query block at or after the
                                diagonal, recomputing P from q, k and lse: dV += Pᵀ·dO,
                                dK += dSᵀ·Q. The group's sum happens in registers, no atomics.
     us__flash_bwd_dq_kernel    one CTA per (128-query block, head, batch), warps own 32 query
                                rows like the forward and stream 32-key tiles: recomputes S,
                                P, dP, dS and sums dQ += dS·K.
   Tile sizes per head size: us__fa_cfg. Every grid puts the block index that sets the work
   (query or key block) in z, so all heads' heaviest causal blocks start first.
   Determinism: the dQ kernel is separate instead of fp32 atomics from the dK/dV kernel (FA2's
   choice), so every sum runs in a fixed order and two runs give identical bits. It costs
   recomputing Q·Kᵀ and dO·Vᵀ once more (7 instead of 5 matrix products per tile pair).

   Scores are kept in the log2 domain (s·scale·log2 e) so the softmax uses exp2f; lse is
   stored in natural-log units like the CPU reference. Tiles past T are zero-filled by cp.async
   (src-size 0) and masked, so any T ≥ 1 works. */

static constexpr int us__fa_threads = 128; /* 4 warps */

/* Tile sizes per head size (the template defaults of the launchers below):
     fwd_mw, fwd_bc   forward: 16-row m-atoms per warp (BR = 64·MW queries per CTA), keys per tile
     kv_kw, kv_br     dK/dV: 16-key m-atoms per warp (64·KW keys per CTA), queries per tile
     dq_mw, dq_bc     dQ: m-atoms per warp (64·MW queries per CTA), keys per tile
     *_minb           CTAs per SM that __launch_bounds__ asks for (caps registers per thread)
   HS 128: 128×32 forward measured 4-5 % faster than 64×64 and 128×64 at T 2k-8k on an H200;
   the dK/dV warps hold dK and dV (128 fp32 at HS 128), so one key atom and 32-query tiles.
   HS 64: half the accumulator registers, so each warp takes twice the work per shared-memory
   fragment (every ldmatrix feeds two mma instead of one). Picked by flash_test --bench64 (the
   Llama-3.2-1B shape, H200): forward 128×64 264 TF/s vs 128×32 235, 64×64 219-240;
   dK/dV 128 keys × 32 queries 1.81 ms vs 64×32 2.5, 64×64 2.2, 128×16 2.4, 64×32 at 3 CTAs/SM
   2.1; dQ 128×32 1.27 ms vs 128×64 1.29 (spills), 64×64 1.44-1.5, 128×16 at 3 CTAs/SM 1.39.
   Asking for 3 CTAs per SM (MINB 3, ≤ 168 registers) never paid for the smaller tiles it needs.
   The block kernels of // >>cuda-cp-flash take the same tiles and also run HS 80, 96 (HS 128's
   tiles, fewer registers), 192 and 256. Those two hold a warp's 16 rows only (MW 1, HS/2 fp32 of
   O or dQ per thread) and take 16- or 32-row tiles, so that two CTAs still fit in an SM's shared
   memory; at HS 256, dK and dV would need 256 fp32 per thread together, so kv_split runs the
   dK/dV kernel twice, once for dV and once for dK (as // >>cuda-hopper does). Not yet timed. */
template <int HS>
struct us__fa_cfg {
    static constexpr int fwd_mw = 2, fwd_bc = 32, kv_kw = 1, kv_br = 32, dq_mw = 2, dq_bc = 32;
    static constexpr int fwd_minb = 2, kv_minb = 2, dq_minb = 2, kv_split = 0;
};

template <>
struct us__fa_cfg<64> {
    static constexpr int fwd_mw = 2, fwd_bc = 64, kv_kw = 2, kv_br = 32, dq_mw = 2, dq_bc = 32;
    static constexpr int fwd_minb = 2, kv_minb = 2, dq_minb = 2,
                         kv_split = 0; /* 231, 254, 234 registers, no spills */
};

template <>
struct us__fa_cfg<192> {
    static constexpr int fwd_mw = 1, fwd_bc = 32, kv_kw = 1, kv_br = 16, dq_mw = 1, dq_bc = 32;
    static constexpr int fwd_minb = 2, kv_minb = 2, dq_minb = 2, kv_split = 0;
};

template <>
struct us__fa_cfg<256> {
    static constexpr int fwd_mw = 1, fwd_bc = 32, kv_kw = 1, kv_br = 16, dq_mw = 1, dq_bc = 16;
    static constexpr int fwd_minb = 2, kv_minb = 2, dq_minb = 2, kv_split = 1;
};

/* shared-memory rows are padded by 8 bf16 (16 bytes): the 8 rows one ldmatrix reads then
   start in 8 different 16-byte bank groups, so no bank conflicts without a swizzle (for any HS
   that is a multiple of 16, a padded row is an odd number of 16-byte chunks) */
template <int HS>
struct us__fa_dims {
    static constexpr int lds = HS + 8; /* smem row stride (elements) */
};

/* dK/dV kernel: K, V (64·KW rows each), 2×Q, 2×dO (BR rows), 2×lse, 2×D */
template <int HS, int KW, int BR>
static constexpr size_t us__fa_dkdv_smem(void) {
    return (size_t)2 * 64 * KW * us__fa_dims<HS>::lds * 2 +
           (size_t)4 * BR * us__fa_dims<HS>::lds * 2 + 4 * BR * 4;
}

/* ---- PTX helpers ------------------------------------------------------------------- */
static __device__ __forceinline__ uint32_t us__smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte global→shared copy that bypasses L1; bytes = 0 writes zeros (tile tails) */
static __device__ __forceinline__ void us__cp_async16(void *s, const void *g, int bytes) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(us__smem_u32(s)), "l"(g),
                 "r"(bytes)
                 : "memory");
#else
    (void)s;
    (void)g;
    (void)bytes;
    __trap(); /* flash needs sm_80+: never launched on older GPUs */
#endif
}

/* 4-byte global→shared copy (positions, lse, D of a tile) */
static __device__ __forceinline__ void us__cp_async4(void *s, const void *g) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(us__smem_u32(s)), "l"(g)
                 : "memory");
#else
    (void)s;
    (void)g;
    __trap();
#endif
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
static __device__ __forceinline__ void us__cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

static __device__ __forceinline__ void us__cp_async_wait_all(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
#else
static __device__ __forceinline__ void us__cp_async_commit(void) {}

static __device__ __forceinline__ void us__cp_async_wait_all(void) {}
#endif

/* four 8×8 bf16 matrices; lane l gives the address of row l%8 of matrix l/8 */
static __device__ __forceinline__ void us__ldsm_x4(uint32_t r[4], const void *s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(us__smem_u32(s)));
}

static __device__ __forceinline__ void us__ldsm_x4_t(uint32_t r[4], const void *s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(us__smem_u32(s)));
}

/* c[16×8] += a[16×16] · b[16×8]. Fragments (g = lane/4, c = 2·(lane%4)):
   a: {(g, c..c+1), (g+8, c..), (g, c+8..), (g+8, c+8..)}; b: {(k c..c+1, n g), (k c+8.., n g)};
   c: {(g, c), (g, c+1), (g+8, c), (g+8, c+1)} */
static __device__ __forceinline__ void us__mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                                    uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c;
    (void)a;
    (void)b0;
    (void)b1;
    __trap();
#endif
}

/* the same with fp16 operands (.f16): identical fragments */
static __device__ __forceinline__ void us__mma_f16(float c[4], const uint32_t a[4], uint32_t b0,
                                                   uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c;
    (void)a;
    (void)b0;
    (void)b1;
    __trap();
#endif
}

static __device__ __forceinline__ uint32_t us__pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The element type E of the tiles: bf16, or fp16 (the block kernels of // >>cuda-cp-flash).
   mma.sync m16n8k16 has a .bf16 and an .f16 form with the same fragments, so only the product
   and the conversions differ. two: a pair of E in one 32-bit register. */
template <typename E>
struct us__fa_elt;

template <>
struct us__fa_elt<__nv_bfloat16> {
    typedef __nv_bfloat162 two;

    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
        us__mma_bf16(c, a, b0, b1);
    }

    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        return us__pack_bf16(lo, hi);
    }

    static __device__ __forceinline__ float2 unpack(two v) { return __bfloat1622float2(v); }
};

template <>
struct us__fa_elt<__half> {
    typedef __half2 two;

    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
        us__mma_f16(c, a, b0, b1);
    }

    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }

    static __device__ __forceinline__ float2 unpack(two v) { return __half22float2(v); }
};

/* The fp32 accumulator of two adjacent n-tiles (16×16) is exactly the A fragment of the next
   product: this is how P and dS stay in registers (FA2) */
template <typename E>
static __device__ __forceinline__ void us__acc_to_a(uint32_t a[4], const float c0[4],
                                                    const float c1[4]) {
    a[0] = us__fa_elt<E>::pack(c0[0], c0[1]);
    a[1] = us__fa_elt<E>::pack(c0[2], c0[3]);
    a[2] = us__fa_elt<E>::pack(c1[0], c1[1]);
    a[3] = us__fa_elt<E>::pack(c1[2], c1[3]);
}

/* ldmatrix addresses inside a [rows][lds] tile:
   A fragment of rows r0..r0+15, columns k0..k0+15 */
template <int LDS, typename E>
static __device__ __forceinline__ const E *us__fa_a_addr(const E *s, int r0, int k0, int lane) {
    return s + (r0 + (lane & 15)) * LDS + k0 + (lane >> 4) * 8;
}

/* B fragments of two n-tiles (rows n0..n0+15 of a row-major [n][k] tile, i.e. Xᵀ), k0..k0+15:
   regs {0,1} = n-tile n0, {2,3} = n-tile n0+8 */
template <int LDS, typename E>
static __device__ __forceinline__ const E *us__fa_bt_addr(const E *s, int n0, int k0, int lane) {
    return s + (n0 + (lane & 7) + (lane >> 4) * 8) * LDS + k0 + ((lane >> 3) & 1) * 8;
}

/* B fragments (with .trans) of a row-major [k][n] tile: k0..k0+15, two n-tiles n0, n0+8 */
template <int LDS, typename E>
static __device__ __forceinline__ const E *us__fa_b_addr(const E *s, int k0, int n0, int lane) {
    return s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + n0 + (lane >> 4) * 8;
}

/* acc[MW m-atoms][16×HS] += P[MW][16×BC] · V[BC×HS], the second product of both the forward
   (O += P·V) and the dQ kernel (dQ += dS·K): P leaves its fp32 accumulators as E (bf16 or fp16)
   A fragments without touching shared memory (FA2), V comes from shared memory through
   ldmatrix.trans. */
template <int MW, int BC, int HS, int LDS, typename E>
static __device__ __forceinline__ void
us__fa_acc_pv(float (&acc)[MW][HS / 8][4], float (&p)[MW][BC / 8][4], const E *sV, int lane) {
#pragma unroll
    for (int t = 0; t < BC / 16; t++) {
        uint32_t pa[MW][4];
#pragma unroll
        for (int a = 0; a < MW; a++) us__acc_to_a<E>(pa[a], p[a][2 * t], p[a][2 * t + 1]);
#pragma unroll
        for (int d = 0; d < HS / 16; d++) {
            uint32_t vf[4];
            us__ldsm_x4_t(vf, us__fa_b_addr<LDS>(sV, t * 16, d * 16, lane));
#pragma unroll
            for (int a = 0; a < MW; a++) {
                us__fa_elt<E>::mma(acc[a][2 * d], pa[a], vf[0], vf[1]);
                us__fa_elt<E>::mma(acc[a][2 * d + 1], pa[a], vf[2], vf[3]);
            }
        }
    }
}

/* rows×HS tile from global (row stride ld elements) to shared [rows][HS+8]; rows ≥ nvalid become
   zeros (g must point at a valid row 0). A tile that does not split evenly over the CTA's
   threads (HS 80: 32 rows of 10 chunks) leaves some threads idle in the last round. */
template <int HS, int ROWS, typename E>
static __device__ __forceinline__ void us__fa_load_tile(E *s, const E *g, int64_t ld, int nvalid) {
    constexpr int CPR = HS / 8, N = ROWS * CPR; /* 16-byte chunks per row, per tile */
#pragma unroll
    for (int i = 0; i < (N + us__fa_threads - 1) / us__fa_threads; i++) {
        int c = threadIdx.x + i * us__fa_threads;
        int r = c / CPR, k = (c % CPR) * 8, ok = r < nvalid;
        if (N % us__fa_threads == 0 || c < N)
            us__cp_async16(s + r * us__fa_dims<HS>::lds + k, ok ? g + r * ld + k : g, ok ? 16 : 0);
    }
}

/* ---- the per-tile math, shared by the causal kernels and the block kernels (// >>cuda-cp-flash)
   Each helper is one warp's part of one tile; masked(a, j, e) says whether element e of n-tile j
   of m-atom a (row (lane/4) + 8·(e/2), column 8·j + 2·(lane%4) + e%2 of the atom) is hidden,
   and is only asked where need is set (tiles that cross the mask's edge). PASS picks how: false
   folds the test into the pass over the scores (the causal kernels' index arithmetic, free
   there), true gives it a pass of its own behind one branch, so that a mask reading positions
   from shared memory loads each of them once (the block kernels). */

/* x = v where masked (the PASS = true form) */
template <int MW, int N, typename Mask>
static __device__ __forceinline__ void us__fa_mask(float (&x)[MW][N][4], float v, Mask masked) {
#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (masked(a, j, e)) x[a][j][e] = v;
}

/* S[MW][16×BC] = Q·Kᵀ for the warp's 16·MW query rows (wr0.. of sQ, or the qf registers when
   QREG, which needs MW = 1) against a [BC][LDS] key tile */
template <int MW, int BC, int HS, int LDS, bool QREG = MW == 1, typename E>
static __device__ __forceinline__ void us__fa_qk(float (&s)[MW][BC / 8][4],
                                                 const uint32_t (&qf)[QREG ? HS / 16 : 1][4],
                                                 const E *sQ, int wr0, const E *sK, int lane) {
    static_assert(!QREG || MW == 1, "Q stays in registers for one m-atom only");
#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int j = 0; j < BC / 8; j++) s[a][j][0] = s[a][j][1] = s[a][j][2] = s[a][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t qa[MW][4];
        if constexpr (QREG) {
#pragma unroll
            for (int e = 0; e < 4; e++) qa[0][e] = qf[kk][e];
        } else {
#pragma unroll
            for (int a = 0; a < MW; a++)
                us__ldsm_x4(qa[a], us__fa_a_addr<LDS>(sQ, wr0 + 16 * a, kk * 16, lane));
        }
#pragma unroll
        for (int np = 0; np < BC / 16; np++) {
            uint32_t kf[4];
            us__ldsm_x4(kf, us__fa_bt_addr<LDS>(sK, np * 16, kk * 16, lane));
#pragma unroll
            for (int a = 0; a < MW; a++) {
                us__fa_elt<E>::mma(s[a][2 * np], qa[a], kf[0], kf[1]);
                us__fa_elt<E>::mma(s[a][2 * np + 1], qa[a], kf[2], kf[3]);
            }
        }
    }
}

/* One tile of the online softmax: hide masked scores, take the new row max over the quad that
   shares a row, rescale O and l by exp2(m_old − m_new), and turn S into P = exp2(S·sl2 − m) in
   place. m is in the log2 domain; l is this thread's part of the row sum (quad-reduced by the
   caller). The max is taken over raw scores and scaled once per row, so each score costs one
   FFMA (s·sl2 − m) before exp2 instead of a multiply and a subtract (at HS 64 the softmax's FP32
   work per mma is twice that of HS 128, so it shows). A row with nothing visible yet keeps
   m = −inf, l = 0, O = 0 (never NaN). */
template <int MW, int BC, int HS, bool PASS, typename Mask>
static __device__ __forceinline__ void
us__fa_softmax(float (&s)[MW][BC / 8][4], float (&o)[MW][HS / 8][4], float (&m)[MW][2],
               float (&l)[MW][2], float sl2, bool need, Mask masked) {
    if constexpr (PASS) {
        if (need) us__fa_mask<MW, BC / 8>(s, -INFINITY, masked);
    }
#pragma unroll
    for (int a = 0; a < MW; a++) {
        float mx[2] = {-INFINITY, -INFINITY}; /* raw (unscaled) max of this tile */
#pragma unroll
        for (int j = 0; j < BC / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (!PASS && need && masked(a, j, e)) s[a][j][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[a][j][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mnew = fmaxf(m[a][r], mx[r] * sl2);    /* log2 domain (sl2 > 0) */
            float mref = mnew == -INFINITY ? 0.f : mnew; /* a fully masked row stays 0, not NaN */
            float corr = exp2f(m[a][r] - mref);
            m[a][r] = mnew;
            l[a][r] *= corr;
#pragma unroll
            for (int i = 0; i < HS / 8; i++) o[a][i][2 * r] *= corr, o[a][i][2 * r + 1] *= corr;
#pragma unroll
            for (int j = 0; j < BC / 8; j++) {
                s[a][j][2 * r] = exp2f(fmaf(s[a][j][2 * r], sl2, -mref));
                s[a][j][2 * r + 1] = exp2f(fmaf(s[a][j][2 * r + 1], sl2, -mref));
                l[a][r] += s[a][j][2 * r] + s[a][j][2 * r + 1];
            }
        }
    }
}

/* The two products every backward tile starts from, X·Yᵀ and Z·Wᵀ over the head dimension, for
   W 16-row atoms of X and Z (rows r0 + 16a of shared tiles) against N rows of Y and W: S = Q·Kᵀ
   with dP = dO·Vᵀ (the dQ side), or Sᵀ = K·Qᵀ with dPᵀ = V·dOᵀ (the dK/dV side). Each fragment of
   Y and W read from shared memory feeds all W atoms. ONE: only X·Yᵀ (zw is left alone), for
   the dV-only pass of // >>cuda-cp-flash's split dK/dV kernel. */
template <int W, int N, int HS, int LDS, bool ONE = false, typename E>
static __device__ __forceinline__ void
us__fa_two_mm(float (&xy)[W][N / 8][4], float (&zw)[W][N / 8][4], const E *sX, const E *sZ, int r0,
              const E *sY, const E *sW, int lane) {
#pragma unroll
    for (int a = 0; a < W; a++)
#pragma unroll
        for (int j = 0; j < N / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                xy[a][j][e] = 0.f;
                if constexpr (!ONE) zw[a][j][e] = 0.f;
            }
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t xa[W][4], za[W][4];
#pragma unroll
        for (int a = 0; a < W; a++) {
            us__ldsm_x4(xa[a], us__fa_a_addr<LDS>(sX, r0 + 16 * a, kk * 16, lane));
            if constexpr (!ONE)
                us__ldsm_x4(za[a], us__fa_a_addr<LDS>(sZ, r0 + 16 * a, kk * 16, lane));
        }
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t yf[4], wf[4];
            us__ldsm_x4(yf, us__fa_bt_addr<LDS>(sY, np * 16, kk * 16, lane));
            if constexpr (!ONE) us__ldsm_x4(wf, us__fa_bt_addr<LDS>(sW, np * 16, kk * 16, lane));
#pragma unroll
            for (int a = 0; a < W; a++) {
                us__fa_elt<E>::mma(xy[a][2 * np], xa[a], yf[0], yf[1]);
                us__fa_elt<E>::mma(xy[a][2 * np + 1], xa[a], yf[2], yf[3]);
                if constexpr (!ONE) {
                    us__fa_elt<E>::mma(zw[a][2 * np], za[a], wf[0], wf[1]);
                    us__fa_elt<E>::mma(zw[a][2 * np + 1], za[a], wf[2], wf[3]);
                }
            }
        }
    }
}

/* One key tile of the dQ kernels, per warp (16·MW queries from wr0 of sQ and sdO):
     S = Q·Kᵀ, dP = dO·Vᵀ, P = exp2(S·sl2 − lse2) (0 where masked), dS = P ∘ (dP − D), dQ += dS·K
   Q and dO A fragments are re-read from shared memory (in registers they would leave no room
   for dQ); dQ is scaled by 1/sqrt(HS) once, by the caller. L2(a, r) and Dr(a, r) give lse2 and D
   of half r of atom a's rows. */
template <int MW, int BC, int HS, int LDS, bool PASS, typename E, typename Rows, typename Rows2,
          typename Mask>
static __device__ __forceinline__ void
us__fa_dq_tile(float (&dq)[MW][HS / 8][4], const E *sQ, const E *sdO, int wr0, const E *sK,
               const E *sV, Rows L2, Rows2 Dr, float sl2, bool need, Mask masked, int lane) {
    float s[MW][BC / 8][4], dp[MW][BC / 8][4];
    us__fa_two_mm<MW, BC, HS, LDS>(s, dp, sQ, sdO, wr0, sK, sV, lane); /* S = Q·Kᵀ, dP = dO·Vᵀ */
    if constexpr (PASS) {
#pragma unroll
        for (int a = 0; a < MW; a++)
#pragma unroll
            for (int j = 0; j < BC / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[a][j][e] = exp2f(s[a][j][e] * sl2 - L2(a, e >> 1));
        if (need) us__fa_mask<MW, BC / 8>(s, 0.f, masked);
#pragma unroll
        for (int a = 0; a < MW; a++)
#pragma unroll
            for (int j = 0; j < BC / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dp[a][j][e] = s[a][j][e] * (dp[a][j][e] - Dr(a, e >> 1));
    } else {
#pragma unroll
        for (int a = 0; a < MW; a++)
#pragma unroll
            for (int j = 0; j < BC / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(s[a][j][e] * sl2 - L2(a, e >> 1));
                    if (need && masked(a, j, e)) p = 0.f;
                    dp[a][j][e] = p * (dp[a][j][e] - Dr(a, e >> 1));
                }
    }
    us__fa_acc_pv<MW, BC, HS, LDS>(dq, dp, sK, lane); /* dQ += dS·K */
}

/* One query tile of the dK/dV kernels, per warp (16·KW keys from row wk of sK and sV, BR
   queries of sQ, sdO with lse2 sL and D sD):
     Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·sl2 − lse2[q]) (0 where masked), dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D[q]),
     dV += Pᵀ·dO, dK += dSᵀ·Q   (dK scaled by 1/sqrt(HS) once, by the caller)
   Here the atoms are keys and the n-tiles queries: masked(a, j, e) asks about key row
   (lane/4) + 16a + 8·(e/2) of the warp and query 8j + 2·(lane%4) + e%2 of the tile. Each
   Q/dO fragment read from shared memory feeds KW key atoms. PART 0 sums both; 1 only dV (no
   dPᵀ: sV, sD and dk are not read), 2 only dK (dv is not touched) — the two passes of a head
   size whose dK and dV do not fit in registers together (// >>cuda-cp-flash). */
template <int KW, int BR, int HS, int LDS, bool PASS, int PART = 0, typename E, typename Mask>
static __device__ __forceinline__ void
us__fa_dkdv_tile(float (&dk)[KW][HS / 8][4], float (&dv)[KW][HS / 8][4], const E *sK, const E *sV,
                 int wk, const E *sQ, const E *sdO, const float *sL, const float *sD, float sl2,
                 bool need, Mask masked, int lane) {
    /* Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, [16·KW keys × BR queries] per warp */
    float st[KW][BR / 8][4], dpt[KW][BR / 8][4];
    us__fa_two_mm<KW, BR, HS, LDS, PART == 1>(st, dpt, sK, sV, wk, sQ, sdO, lane);
    /* recompute Pᵀ from the saved lse (no T×T matrix is ever stored), then dSᵀ */
    if constexpr (PASS) {
#pragma unroll
        for (int a = 0; a < KW; a++)
#pragma unroll
            for (int j = 0; j < BR / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    st[a][j][e] = exp2f(st[a][j][e] * sl2 - sL[j * 8 + 2 * (lane & 3) + (e & 1)]);
        if (need) us__fa_mask<KW, BR / 8>(st, 0.f, masked);
        if constexpr (PART != 1) {
#pragma unroll
            for (int a = 0; a < KW; a++)
#pragma unroll
                for (int j = 0; j < BR / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        dpt[a][j][e] =
                            st[a][j][e] * (dpt[a][j][e] - sD[j * 8 + 2 * (lane & 3) + (e & 1)]);
        }
    } else {
        static_assert(PART == 0, "the causal kernels sum dK and dV together");
#pragma unroll
        for (int a = 0; a < KW; a++)
#pragma unroll
            for (int j = 0; j < BR / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int ql = j * 8 + 2 * (lane & 3) + (e & 1);
                    float p = exp2f(st[a][j][e] * sl2 - sL[ql]);
                    if (need && masked(a, j, e)) p = 0.f;
                    st[a][j][e] = p;
                    dpt[a][j][e] = p * (dpt[a][j][e] - sD[ql]);
                }
    }
    /* dV += Pᵀ·dO and dK += dSᵀ·Q; Pᵀ and dSᵀ are A fragments straight from registers */
#pragma unroll
    for (int t = 0; t < BR / 16; t++) {
        uint32_t pa[KW][4], da[KW][4];
#pragma unroll
        for (int a = 0; a < KW; a++) {
            if constexpr (PART != 2) us__acc_to_a<E>(pa[a], st[a][2 * t], st[a][2 * t + 1]);
            if constexpr (PART != 1) us__acc_to_a<E>(da[a], dpt[a][2 * t], dpt[a][2 * t + 1]);
        }
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            uint32_t of[4], qf[4];
            if constexpr (PART != 2)
                us__ldsm_x4_t(of, us__fa_b_addr<LDS>(sdO, t * 16, dp * 16, lane));
            if constexpr (PART != 1)
                us__ldsm_x4_t(qf, us__fa_b_addr<LDS>(sQ, t * 16, dp * 16, lane));
#pragma unroll
            for (int a = 0; a < KW; a++) {
                if constexpr (PART != 2) {
                    us__fa_elt<E>::mma(dv[a][2 * dp], pa[a], of[0], of[1]);
                    us__fa_elt<E>::mma(dv[a][2 * dp + 1], pa[a], of[2], of[3]);
                }
                if constexpr (PART != 1) {
                    us__fa_elt<E>::mma(dk[a][2 * dp], da[a], qf[0], qf[1]);
                    us__fa_elt<E>::mma(dk[a][2 * dp + 1], da[a], qf[2], qf[3]);
                }
            }
        }
    }
}

/* ---- forward ------------------------------------------------------------------------ */
/* MW = 16-row m-atoms per warp, so BR = 64·MW queries per CTA. With MW = 2 every K and V
   fragment read from shared memory feeds two mma instead of one (FA2's 128×64 tile for
   HS 128): shared-memory bandwidth, not the tensor cores, bounds the MW = 1 kernel. Q then
   comes from shared memory each tile, since 32 rows of Q would not fit beside O in registers. */
template <int HS, int MW, int BC, int MINB>
__global__ void __launch_bounds__(128, MINB) /* MINB CTAs per SM: registers ≤ 65536 / (128·MINB) */
    us__flash_fwd_kernel(const __nv_bfloat16 *__restrict__ qkv, __nv_bfloat16 *__restrict__ out,
                         float *__restrict__ lse, int T, int NH, int NKV,
                         float sl2 /* scale·log2 e */) {
    constexpr int BR = 64 * MW, LDS = us__fa_dims<HS>::lds, TILE = BC * LDS;
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)us__fa_smem; /* [BR][LDS] */
    __nv_bfloat16 *sK = sQ + BR * LDS;                /* [2][BC][LDS] */
    __nv_bfloat16 *sV = sK + 2 * TILE;                /* [2][BC][LDS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* grid (NH, B, query blocks): CTAs start in x, y, z order, so every head's longest (last)
       query block starts before any shorter one and the short ones fill the tail */
    const int qb = gridDim.z - 1 - blockIdx.z;
    const int h = blockIdx.x, b = blockIdx.y, g = h / (NH / NKV);
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS;
    const __nv_bfloat16 *base = qkv + (int64_t)b * T * QKV;
    const __nv_bfloat16 *gk = base + (int64_t)(NH + g) * HS,
                        *gv = base + (int64_t)(NH + NKV + g) * HS;
    const int q0 = qb * BR, qend = min(q0 + BR, T);
    const int nkb = (qend - 1) / BC +
                    1; /* causal block skipping: key blocks past the last query are never read */
    const int wr0 = warp * 16 * MW; /* this warp's first row inside the tile */

    us__fa_load_tile<HS, BR>(sQ, base + (int64_t)q0 * QKV + h * HS, QKV, qend - q0);
    us__fa_load_tile<HS, BC>(sK, gk, QKV, min(BC, T));
    us__fa_load_tile<HS, BC>(sV, gv, QKV, min(BC, T));
    us__cp_async_commit();
    us__cp_async_wait_all();
    __syncthreads();

    /* MW = 1: the warp's 16 query rows stay in registers for the whole loop */
    uint32_t qf[MW == 1 ? HS / 16 : 1][4];
    if constexpr (MW == 1) {
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
            us__ldsm_x4(qf[kk], us__fa_a_addr<LDS>(sQ, wr0, kk * 16, lane));
    }

    float o[MW][HS / 8][4]; /* unnormalised output; atom a holds rows r and r+8 */
    float m[MW][2],
        l[MW][2]; /* running max (log2 domain); running sum per thread, quad-reduced at the end */
#pragma unroll
    for (int a = 0; a < MW; a++) {
        m[a][0] = m[a][1] = -INFINITY;
        l[a][0] = l[a][1] = 0.f;
#pragma unroll
        for (int i = 0; i < HS / 8; i++) o[a][i][0] = o[a][i][1] = o[a][i][2] = o[a][i][3] = 0.f;
    }
    const int row0 = q0 + wr0 + (lane >> 2); /* atom a, half r: row0 + 16a + 8r */

    for (int kb = 0; kb < nkb; kb++) {
        const __nv_bfloat16 *sKb = sK + (kb & 1) * TILE, *sVb = sV + (kb & 1) * TILE;
        us__cp_async_wait_all(); /* tile kb has landed ... */
        __syncthreads();         /* ... for every thread, and everyone is done with tile kb-1 */
        if (kb + 1 < nkb) {      /* prefetch tile kb+1 into the other buffer while computing kb */
            int k1 = (kb + 1) * BC;
            us__fa_load_tile<HS, BC>(sK + ((kb + 1) & 1) * TILE, gk + (int64_t)k1 * QKV, QKV,
                                     min(BC, T - k1));
            us__fa_load_tile<HS, BC>(sV + ((kb + 1) & 1) * TILE, gv + (int64_t)k1 * QKV, QKV,
                                     min(BC, T - k1));
        }
        us__cp_async_commit();

        /* S = Q·Kᵀ [16·MW × BC] per warp; the causal mask only on tiles that cross this warp's
           diagonal; online softmax; O += P·V */
        float s[MW][BC / 8][4];
        us__fa_qk<MW, BC, HS, LDS>(s, qf, sQ, wr0, sKb, lane);
        const bool diag = kb * BC + BC - 1 > q0 + wr0;
        us__fa_softmax<MW, BC, HS, false>(s, o, m, l, sl2, diag, [&](int a, int j, int e) {
            return kb * BC + j * 8 + 2 * (lane & 3) + (e & 1) > row0 + 16 * a + (e >> 1) * 8;
        });
        us__fa_acc_pv<MW, BC, HS, LDS>(o, s, sVb, lane);
    }

    /* O / l and lse = m + log l (natural log) */
#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[a][r] += __shfl_xor_sync(0xffffffffu, l[a][r], 1);
            l[a][r] += __shfl_xor_sync(0xffffffffu, l[a][r], 2);
            int row = row0 + 16 * a + r * 8;
            if (row < T) {
                float inv = 1.f / l[a][r];
                __nv_bfloat16 *orow =
                    out + ((int64_t)b * T + row) * NH * HS + (int64_t)h * HS + 2 * (lane & 3);
#pragma unroll
                for (int i = 0; i < HS / 8; i++)
                    *reinterpret_cast<__nv_bfloat162 *>(orow + i * 8) =
                        __floats2bfloat162_rn(o[a][i][2 * r] * inv, o[a][i][2 * r + 1] * inv);
                if ((lane & 3) == 0)
                    lse[((int64_t)b * NH + h) * T + row] =
                        (m[a][r] + log2f(l[a][r])) * 0.69314718055994531f;
            }
        }
}

/* ---- backward ----------------------------------------------------------------------- */
/* D[b, h, t] = Σ_d dO·O  (fp32), one warp per row of [B·T·NH]. With L2, also lse·log2 e there
   (+inf for a row that saw no key, so that its P = exp2(s − L2) is 0): the block kernels
   (// >>cuda-cp-flash) then copy both straight into shared memory. E: bf16 or fp16 (the block
   kernels take both). */
template <int HS, typename E = __nv_bfloat16>
__global__ void __launch_bounds__(256)
    us__flash_bwd_dot_kernel(const E *__restrict__ dout, const E *__restrict__ out,
                             float *__restrict__ D, int64_t rows, int T, int NH,
                             const float *__restrict__ lse = nullptr,
                             float *__restrict__ L2 = nullptr) {
    typedef typename us__fa_elt<E>::two E2;
    int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5); /* row = (b·T + t)·NH + h */
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const E2 *a = reinterpret_cast<const E2 *>(dout + row * HS);
    const E2 *o = reinterpret_cast<const E2 *>(out + row * HS);
    float acc = 0.f;
#pragma unroll
    for (int i = lane; i < HS / 2; i += 32) {
        float2 x = us__fa_elt<E>::unpack(a[i]), y = us__fa_elt<E>::unpack(o[i]);
        acc += x.x * y.x + x.y * y.y;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        int64_t bt = row / NH, bb = bt / T;
        int h = (int)(row % NH), t = (int)(bt % T);
        D[(bb * NH + h) * T + t] = acc;
        if (L2) {
            float L = lse[(bb * NH + h) * T + t];
            L2[(bb * NH + h) * T + t] = L == -INFINITY ? INFINITY : L * US__LOG2E;
        }
    }
}

/* dK, dV of 64·KW keys of one kv head. Per warp (16·KW keys k, BR queries q of the current tile):
     Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·sl2 − lse2[q]), dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D[q]),
     dV += Pᵀ·dO, dK += dSᵀ·Q   (dK scaled by 1/sqrt(HS) once at the end)
   Each Q/dO fragment read from shared memory feeds KW key atoms: KW = 2 halves the
   shared-memory traffic per mma, affordable at HS 64 where dK and dV take 64 fp32 per atom. */
template <int HS, int KW, int BR, int MINB>
__global__ void __launch_bounds__(128, MINB)
    us__flash_bwd_dkdv_kernel(const __nv_bfloat16 *__restrict__ dout,
                              const __nv_bfloat16 *__restrict__ qkv, const float *__restrict__ lse,
                              const float *__restrict__ Dg, __nv_bfloat16 *__restrict__ dqkv, int T,
                              int NH, int NKV, float scale, float sl2) {
    constexpr int BC = 64 * KW, LDS = us__fa_dims<HS>::lds, TILE = BC * LDS;
    constexpr int QT = BR * LDS; /* one query tile */
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    __nv_bfloat16 *sK = (__nv_bfloat16 *)us__fa_smem; /* [BC][LDS] */
    __nv_bfloat16 *sV = sK + TILE;                    /* [BC][LDS] */
    __nv_bfloat16 *sQ = sV + TILE;                    /* [2][BR][LDS] */
    __nv_bfloat16 *sdO = sQ + 2 * QT;                 /* [2][BR][LDS] */
    float *sL = (float *)(sdO + 2 * QT);              /* [2][BR] lse·log2 e */
    float *sD = sL + 2 * BR;                          /* [2][BR] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* grid (NKV, B, key blocks): low kb = most query blocks, and every kv head's kb starts
       before any higher one (heaviest first, the light ones fill the tail) */
    const int g = blockIdx.x, b = blockIdx.y, kb = blockIdx.z;
    const int grp = NH / NKV, k0 = kb * BC;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, OC = (int64_t)NH * HS;
    const __nv_bfloat16 *base = qkv + (int64_t)b * T * QKV, *dbase = dout + (int64_t)b * T * OC;
    const int qb0 = k0 / BR;                 /* first query block that sees these keys */
    const int per = (T + BR - 1) / BR - qb0; /* query blocks per head */
    const int nit = grp * per;           /* iterations: every (query head of group, query block) */
    const int wk0 = k0 + warp * 16 * KW; /* this warp's first key */

    /* stage the tile of iteration it (query head g·grp + it/per, block qb0 + it%per) into buffer buf */
    auto issue = [&](int it, int buf) {
        int h = g * grp + it / per, q0 = (qb0 + it % per) * BR, nv = min(BR, T - q0);
        us__fa_load_tile<HS, BR>(sQ + buf * QT, base + (int64_t)q0 * QKV + h * HS, QKV, nv);
        us__fa_load_tile<HS, BR>(sdO + buf * QT, dbase + (int64_t)q0 * OC + h * HS, OC, nv);
        if (threadIdx.x < BR) { /* queries past T get lse = +inf, so P = 0 there */
            int q = q0 + threadIdx.x;
            int64_t i = ((int64_t)b * NH + h) * T + q;
            sL[buf * BR + threadIdx.x] = q < T ? lse[i] * US__LOG2E : INFINITY;
            sD[buf * BR + threadIdx.x] = q < T ? Dg[i] : 0.f;
        }
    };
    us__fa_load_tile<HS, BC>(sK, base + (int64_t)k0 * QKV + (int64_t)(NH + g) * HS, QKV,
                             min(BC, T - k0));
    us__fa_load_tile<HS, BC>(sV, base + (int64_t)k0 * QKV + (int64_t)(NH + NKV + g) * HS, QKV,
                             min(BC, T - k0));
    issue(0, 0);
    us__cp_async_commit();

    float dk[KW][HS / 8][4], dv[KW][HS / 8][4];
#pragma unroll
    for (int a = 0; a < KW; a++)
#pragma unroll
        for (int i = 0; i < HS / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[a][i][e] = dv[a][i][e] = 0.f;
    const int key0 = wk0 + (lane >> 2); /* this thread's keys: key0 + 16a + 8r */

    for (int it = 0; it < nit; it++) {
        const int buf = it & 1, q0 = (qb0 + it % per) * BR;
        us__cp_async_wait_all();
        __syncthreads();
        if (it + 1 < nit)
            issue(it + 1, buf ^ 1); /* overlaps the next Q/dO tile with this one's math */
        us__cp_async_commit();
        /* every key of this warp comes after every query of the tile: P = 0, nothing to add
           (warp-uniform, and no barrier below, so the warp can just move on) */
        if (wk0 > q0 + BR - 1) continue;
        const bool diag = wk0 + 16 * KW - 1 > q0; /* some key of this warp is after some query */
        us__fa_dkdv_tile<KW, BR, HS, LDS, false>(
            dk, dv, sK, sV, warp * 16 * KW, sQ + buf * QT, sdO + buf * QT, sL + buf * BR,
            sD + buf * BR, sl2, diag,
            [&](int a, int j, int e) {
                return key0 + 16 * a + (e >> 1) * 8 > q0 + j * 8 + 2 * (lane & 3) + (e & 1);
            },
            lane);
    }

#pragma unroll
    for (int a = 0; a < KW; a++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int key = key0 + 16 * a + r * 8;
            if (key >= T) continue;
            __nv_bfloat16 *row = dqkv + ((int64_t)b * T + key) * QKV + 2 * (lane & 3);
            __nv_bfloat16 *dkr = row + (int64_t)(NH + g) * HS,
                          *dvr = row + (int64_t)(NH + NKV + g) * HS;
#pragma unroll
            for (int i = 0; i < HS / 8; i++) {
                *reinterpret_cast<__nv_bfloat162 *>(dkr + i * 8) =
                    __floats2bfloat162_rn(dk[a][i][2 * r] * scale, dk[a][i][2 * r + 1] * scale);
                *reinterpret_cast<__nv_bfloat162 *>(dvr + i * 8) =
                    __floats2bfloat162_rn(dv[a][i][2 * r], dv[a][i][2 * r + 1]);
            }
        }
}

/* dQ of 64·MW queries of one head, keys 0..end in order (deterministic). Per warp (16·MW queries):
     S = Q·Kᵀ, P = exp2(S·sl2 − lse2), dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ += dS·K
   MW = 2 with BC = 32 lets each K/V fragment feed two mma (see the forward) while S and dP stay
   small enough for dQ (128 fp32 at HS 128) to fit in registers. */
template <int HS, int MW, int BC, int MINB>
__global__ void __launch_bounds__(128, MINB)
    us__flash_bwd_dq_kernel(const __nv_bfloat16 *__restrict__ dout,
                            const __nv_bfloat16 *__restrict__ qkv, const float *__restrict__ lse,
                            const float *__restrict__ Dg, __nv_bfloat16 *__restrict__ dqkv, int T,
                            int NH, int NKV, float scale, float sl2) {
    constexpr int BR = 64 * MW, LDS = us__fa_dims<HS>::lds, TILE = BC * LDS;
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)us__fa_smem; /* [BR][LDS] */
    __nv_bfloat16 *sdO = sQ + BR * LDS;               /* [BR][LDS] */
    __nv_bfloat16 *sK = sdO + BR * LDS;               /* [2][BC][LDS] */
    __nv_bfloat16 *sV = sK + 2 * TILE;                /* [2][BC][LDS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* grid (NH, B, query blocks), heaviest blocks first as in the forward */
    const int qb = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, g = h / (NH / NKV);
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, OC = (int64_t)NH * HS;
    const __nv_bfloat16 *base = qkv + (int64_t)b * T * QKV;
    const __nv_bfloat16 *gk = base + (int64_t)(NH + g) * HS,
                        *gv = base + (int64_t)(NH + NKV + g) * HS;
    const int q0 = qb * BR, qend = min(q0 + BR, T), nkb = (qend - 1) / BC + 1;
    const int wr0 = warp * 16 * MW;

    us__fa_load_tile<HS, BR>(sQ, base + (int64_t)q0 * QKV + h * HS, QKV, qend - q0);
    us__fa_load_tile<HS, BR>(sdO, dout + ((int64_t)b * T + q0) * OC + h * HS, OC, qend - q0);
    us__fa_load_tile<HS, BC>(sK, gk, QKV, min(BC, T));
    us__fa_load_tile<HS, BC>(sV, gv, QKV, min(BC, T));
    us__cp_async_commit();

    const int row0 = q0 + wr0 + (lane >> 2); /* atom a, half r: row0 + 16a + 8r */
    float L2[MW][2],
        Dr[MW][2]; /* lse·log2 e and D of this thread's rows (rows past T: never stored) */
    float dq[MW][HS / 8][4];
#pragma unroll
    for (int a = 0; a < MW; a++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + 16 * a + r * 8;
            int64_t i = ((int64_t)b * NH + h) * T + row;
            L2[a][r] = row < T ? lse[i] * US__LOG2E : 0.f;
            Dr[a][r] = row < T ? Dg[i] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < HS / 8; i++)
            dq[a][i][0] = dq[a][i][1] = dq[a][i][2] = dq[a][i][3] = 0.f;
    }

    for (int kb = 0; kb < nkb; kb++) {
        const __nv_bfloat16 *sKb = sK + (kb & 1) * TILE, *sVb = sV + (kb & 1) * TILE;
        us__cp_async_wait_all();
        __syncthreads();
        if (kb + 1 < nkb) {
            int k1 = (kb + 1) * BC;
            us__fa_load_tile<HS, BC>(sK + ((kb + 1) & 1) * TILE, gk + (int64_t)k1 * QKV, QKV,
                                     min(BC, T - k1));
            us__fa_load_tile<HS, BC>(sV + ((kb + 1) & 1) * TILE, gv + (int64_t)k1 * QKV, QKV,
                                     min(BC, T - k1));
        }
        us__cp_async_commit();

        const bool diag = kb * BC + BC - 1 > q0 + wr0;
        us__fa_dq_tile<MW, BC, HS, LDS, false>(
            dq, sQ, sdO, wr0, sKb, sVb, [&](int a, int r) { return L2[a][r]; },
            [&](int a, int r) { return Dr[a][r]; }, sl2, diag,
            [&](int a, int j, int e) {
                return kb * BC + j * 8 + 2 * (lane & 3) + (e & 1) > row0 + 16 * a + (e >> 1) * 8;
            },
            lane);
    }

#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + 16 * a + r * 8;
            if (row >= T) continue;
            __nv_bfloat16 *dqr =
                dqkv + ((int64_t)b * T + row) * QKV + (int64_t)h * HS + 2 * (lane & 3);
#pragma unroll
            for (int i = 0; i < HS / 8; i++)
                *reinterpret_cast<__nv_bfloat162 *>(dqr + i * 8) =
                    __floats2bfloat162_rn(dq[a][i][2 * r] * scale, dq[a][i][2 * r + 1] * scale);
        }
}

/* ---- host entry points --------------------------------------------------------------- */
/* Shapes this file has no kernel for (HS not 64/128, NH % NKV ≠ 0) launch an empty grid, so the
   caller's cudaGetLastError reports cudaErrorInvalidConfiguration instead of silence. */
static void us__flash_reject(cudaStream_t stream) {
    us__flash_bwd_dot_kernel<64, __nv_bfloat16><<<0, 256, 0, stream>>>(NULL, NULL, NULL, 0, 1, 1);
}

template <int HS, int MW = us__fa_cfg<HS>::fwd_mw, int BC = us__fa_cfg<HS>::fwd_bc,
          int MINB = us__fa_cfg<HS>::fwd_minb>
static void us__flash_fwd_hs(const __nv_bfloat16 *qkv, __nv_bfloat16 *out, float *lse, int B, int T,
                             int NH, int NKV, cudaStream_t stream) {
    size_t smem =
        (size_t)(64 * MW + 4 * BC) * us__fa_dims<HS>::lds * 2; /* Q (64·MW rows), 2×K, 2×V */
    cudaFuncSetAttribute(us__flash_fwd_kernel<HS, MW, BC, MINB>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 grid(NH, B, (T + 64 * MW - 1) / (64 * MW));
    us__flash_fwd_kernel<HS, MW, BC, MINB>
        <<<grid, us__fa_threads, smem, stream>>>(qkv, out, lse, T, NH, NKV, us__attn_sl2(HS));
}

/* out[B,T,NH·HS] and lse[B,NH,T] from qkv[B,T,QKV]; errors via cudaGetLastError */
static void us__flash_fwd(const __nv_bfloat16 *qkv, __nv_bfloat16 *out, float *lse, int B, int T,
                          int NH, int NKV, int HS, cudaStream_t stream) {
    if (NKV <= 0 || NH % NKV != 0) {
        us__flash_reject(stream);
        return;
    }
    if (B <= 0 || T <= 0 || NH <= 0) return;
    if (HS == 64)
        us__flash_fwd_hs<64>(qkv, out, lse, B, T, NH, NKV, stream);
    else if (HS == 128)
        us__flash_fwd_hs<128>(qkv, out, lse, B, T, NH, NKV, stream);
    else
        us__flash_reject(stream);
}

/* scratch of the backward: D f32 [B, NH, T] */
static size_t us__flash_bwd_scratch_bytes(int B, int T, int NH, int NKV, int HS) {
    (void)NKV;
    (void)HS;
    return (size_t)B * NH * T * sizeof(float);
}

/* the three launches of the backward, apart so that flash_test can time and vary them */
template <int HS, typename E = __nv_bfloat16>
static void us__flash_bwd_dot(const E *dout, const E *out, float *D, int B, int T, int NH,
                              cudaStream_t stream, const float *lse = nullptr,
                              float *L2 = nullptr) {
    int64_t rows = (int64_t)B * T * NH;
    us__flash_bwd_dot_kernel<HS, E>
        <<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(dout, out, D, rows, T, NH, lse, L2);
}

template <int HS, int KW = us__fa_cfg<HS>::kv_kw, int BR = us__fa_cfg<HS>::kv_br,
          int MINB = us__fa_cfg<HS>::kv_minb>
static void us__flash_bwd_dkdv(const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                               const float *lse, const float *D, __nv_bfloat16 *dqkv, int B, int T,
                               int NH, int NKV, cudaStream_t stream) {
    float scale = us__attn_scale(HS), sl2 = us__attn_sl2(HS);
    size_t smem = us__fa_dkdv_smem<HS, KW, BR>();
    cudaFuncSetAttribute(us__flash_bwd_dkdv_kernel<HS, KW, BR, MINB>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 grid(NKV, B, (T + 64 * KW - 1) / (64 * KW));
    us__flash_bwd_dkdv_kernel<HS, KW, BR, MINB>
        <<<grid, us__fa_threads, smem, stream>>>(dout, qkv, lse, D, dqkv, T, NH, NKV, scale, sl2);
}

template <int HS, int MW = us__fa_cfg<HS>::dq_mw, int BC = us__fa_cfg<HS>::dq_bc,
          int MINB = us__fa_cfg<HS>::dq_minb>
static void us__flash_bwd_dq(const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv, const float *lse,
                             const float *D, __nv_bfloat16 *dqkv, int B, int T, int NH, int NKV,
                             cudaStream_t stream) {
    float scale = us__attn_scale(HS), sl2 = us__attn_sl2(HS);
    size_t smem = (size_t)(2 * 64 * MW + 4 * BC) * us__fa_dims<HS>::lds *
                  2; /* Q, dO (64·MW rows), 2×K, 2×V */
    cudaFuncSetAttribute(us__flash_bwd_dq_kernel<HS, MW, BC, MINB>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 grid(NH, B, (T + 64 * MW - 1) / (64 * MW));
    us__flash_bwd_dq_kernel<HS, MW, BC, MINB>
        <<<grid, us__fa_threads, smem, stream>>>(dout, qkv, lse, D, dqkv, T, NH, NKV, scale, sl2);
}

template <int HS, int KW = us__fa_cfg<HS>::kv_kw, int KBR = us__fa_cfg<HS>::kv_br,
          int MW = us__fa_cfg<HS>::dq_mw, int BC = us__fa_cfg<HS>::dq_bc>
static void us__flash_bwd_hs(const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                             const __nv_bfloat16 *out, const float *lse, __nv_bfloat16 *dqkv,
                             float *D, int B, int T, int NH, int NKV, cudaStream_t stream) {
    us__flash_bwd_dot<HS>(dout, out, D, B, T, NH, stream);
    us__flash_bwd_dkdv<HS, KW, KBR, us__fa_cfg<HS>::kv_minb>(dout, qkv, lse, D, dqkv, B, T, NH, NKV,
                                                             stream);
    us__flash_bwd_dq<HS, MW, BC, us__fa_cfg<HS>::dq_minb>(dout, qkv, lse, D, dqkv, B, T, NH, NKV,
                                                          stream);
}

/* dqkv[B,T,QKV] (every element written) from dout[B,T,NH·HS], qkv, out and lse of the forward;
   scratch holds us__flash_bwd_scratch_bytes(...) bytes of device memory */
static void us__flash_bwd(const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                          const __nv_bfloat16 *out, const float *lse, __nv_bfloat16 *dqkv,
                          void *scratch, int B, int T, int NH, int NKV, int HS,
                          cudaStream_t stream) {
    if (NKV <= 0 || NH % NKV != 0) {
        us__flash_reject(stream);
        return;
    }
    if (B <= 0 || T <= 0 || NH <= 0) return;
    if (HS == 64)
        us__flash_bwd_hs<64>(dout, qkv, out, lse, dqkv, (float *)scratch, B, T, NH, NKV, stream);
    else if (HS == 128)
        us__flash_bwd_hs<128>(dout, qkv, out, lse, dqkv, (float *)scratch, B, T, NH, NKV, stream);
    else
        us__flash_reject(stream);
}

#ifndef US__CUDA_FLASH_ONLY
/* ------------------------------------------------------------------------------------ */
// >>cuda-hopper  FlashAttention-3 on Hopper (sm_90a): wgmma, TMA, warp specialisation
/* ------------------------------------------------------------------------------------
   The same algorithm as // >>cuda-flash (tiles of Q against tiles of K and V, an online softmax,
   the T×T scores never in memory, a backward that recomputes P from lse), rebuilt for what
   Hopper adds (Shah et al., FlashAttention-3, 2024). On an H200 the mma.sync kernels above
   reach about half of the tensor cores' rate; the three changes below are what closes the gap.

   1. wgmma: a warpgroup (4 consecutive warps, 128 threads) multiplies a 64×N tile by an N×16
      one in a single asynchronous instruction. B is read straight from shared memory through a
      64-bit descriptor (no ldmatrix, no register copy of the operand); A comes from shared
      memory too, or from registers. A 64-row warpgroup tile has the same per-warp fragment as
      mma.sync's m16n8 (warp w owns rows 16w..16w+15), so the softmax helpers of // >>cuda-flash
      run unchanged on its accumulators, and P goes from the fp32 accumulators of S = Q·Kᵀ into
      the A registers of O += P·V without touching shared memory (the "RS" form).
   2. TMA: one thread asks the copy engine for a whole tile (cp.async.bulk.tensor) and goes on;
      the engine writes it into shared memory already swizzled the way wgmma reads it, zero-fills
      rows past T, and signals an mbarrier with the bytes it delivered. Nobody computes an
      address per element.
   3. Warp specialisation: a producer warpgroup only issues copies, two consumer warpgroups only
      compute. They meet at two barriers per stage of a ring of shared-memory buffers: "full"
      (the copy landed; the consumers wait on it) and "empty" (both consumers are done with the
      stage; the producer waits on it before refilling). setmaxnreg moves registers from the
      producer (40 each) to the consumers (232 each), who hold S, P and O. With two consumers
      per SM, one warpgroup's softmax (exp2, max, sum: the slow FP32 and MUFU units) runs while
      the other's GEMMs keep the tensor cores busy.
   Two things decide whether that pays, both measured on an H200 (bench/RESULTS.md). At HS 64 a
   tile of scores costs the consumer as many issue slots as the tensor cores spend cycles on its
   GEMMs, so every instruction per score counts, more than the MUFU unit's rate (moving some
   exp2 to a polynomial on the FMA pipe made the backward slower): exp2 is ex2.approx alone
   (us__hop_exp2), not exp2f's range check; the causal mask lives in a copy of the tile math of
   its own, so that wholly visible tiles run no check per score (us__hop_by_mode: the forward
   9-13 % faster), or, in the dK/dV kernel, whose registers hold no second copy, in a pass over
   a diagonal tile's scores before the math (the backward 0.5-2 % faster); under bf16, dS leaves
   its 1/sqrt(HS) to the store (us__hop_ds_scale). And a
   causal query tile is short (a few dozen key tiles), so starting and ending one costs a real
   share: the forward, dK/dV and dQ run a persistent grid, one CTA per SM walking the tiles (or
   key blocks) longest first, its rings carried from tile to tile, so that the next tile's
   queries (or keys) are loading while this one's output is written. Which tiles run at the same
   time decides what L2 holds: CTAs working on the same (batch, kv head) read the same K and V
   (or queries and dO) at once and share them there, one CTA alone on its pair reads them from
   memory again for every tile, so the pairs are taken in bands small enough that each has
   several CTAs at work (us__hop_band).
   Shared-memory tiles are rows × 64-element column blocks, each block 128 bytes per row with the
   128-byte swizzle (the 16-byte chunk c of row r sits at chunk c ⊕ (r mod 8)), so 8 consecutive
   rows of one column hit all 32 banks. A head of HS elements takes ⌈HS/64⌉ blocks; HS 80 and 96
   leave part of the last block unused, which the GEMMs never read.
   Kernels (B batch, T seq, NH query heads, NKV kv heads; layouts exactly as // >>cuda-flash):
     us__hop_fwd_kernel    a persistent grid, one CTA per SM, walking the tiles of (64·NWF
                           queries, head, batch) longest first; consumer c owns queries 64c..
                           64c+63 of a tile; the producer streams K and V tiles of BC keys through
                           a 2-stage ring, stopping at the diagonal (causal tiles past it are never
                           loaded), and loads the next tile's queries while this one finishes.
                           S = Q·Kᵀ (both operands in shared memory), online softmax, O += P·V (P
                           in registers, V read transposed by the descriptor).
     us__hop_dot_kernel    D = rowsum(dO ∘ O) and lse·log2 e per query row (the preprocess).
     us__hop_dkdv_kernel   a persistent grid as the forward's over the blocks of (64·NWG keys,
                           kv head, batch), heaviest first, in bands of (batch, kv head) pairs as
                           the query tiles (us__hop_kblock_of); per block, every query head of the
                           group × every query tile at or after the diagonal streams by;
                           Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ, dSᵀ, then dV += Pᵀ·dO, dK += dSᵀ·Q. Each key
                           has one owner, so dK and dV are summed in registers, no atomics; so is
                           as much of its K (and V) as the registers hold, read once a block.
     us__hop_dq_kernel     persistent as the forward, over tiles of (64·NWG queries, head,
                           batch): key tiles up to the diagonal; S, dP, dS again, dQ += dS·K.
                           A kernel of its own instead of fp32 atomics from the dK/dV kernel:
                           every sum runs in a fixed order, so two runs give the same bits. It
                           costs recomputing Q·Kᵀ and dO·Vᵀ. At HS 64 a tile's dQ GEMM waits
                           for the next tile's S and dP, one batch a tile (us__hop_dq_consume).
     us__hop_dqs_kernel    dQ = dS·K from the dS that the dK/dV kernel stored, in place of the
                           dQ kernel at HS 96 and 128 (us__hop_ds_pairs): five GEMMs a tile, as
                           FlashAttention-3's backward, for T² bytes a head written and read
                           again, and every sum still in a fixed order.
     us__hop_bwd_fused_kernel  FlashAttention-3's own backward, five GEMMs a tile instead of
                           seven: the dK/dV kernel forms dQ too and the copy engine adds it into
                           an fp32 dQ in a fixed order of key blocks (bit-identical reruns). It
                           runs when asked for (us_cuda_attention_no_hopper 5): the two kernels
                           measured as fast or faster at every shape (us__hop_fused).
   HS ≤ 128 use two consumer warpgroups (NWG 2); HS 192 and 256 one in the backward (the
   accumulators dK + dV of a 64-key tile would not fit in registers twice over), and there the
   dK/dV kernel runs twice, once for dV and once for dK, each holding one accumulator.
   Any HS that is a multiple of 16 up to 256 fits the scheme; the ones real models use (64, 80,
   96, 128, 192, 256) are compiled, in bf16 and fp16. */

#include <cuda.h>
#include <cudaTypedefs.h>

/* the kernels below are real only in an sm_90a pass of nvcc; elsewhere they trap, and the host
   side never launches them (us__hop_ok probes the device code once) */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define US__HOP_DEV 1
#else
#define US__HOP_DEV 0
#endif

template <typename E>
struct us__is_half {
    static constexpr bool value = false;
};

template <>
struct us__is_half<__half> {
    static constexpr bool value = true;
};

/* two fp32 → one 32-bit register of two 16-bit values of type E (low half first) */
template <typename E>
static __device__ __forceinline__ uint32_t us__hop_pack(float lo, float hi) {
    if constexpr (us__is_half<E>::value) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    } else {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
}

/* ---- wgmma, one instruction per shape ---------------------------------------------------
   d[N/2] fp32 accumulators per thread: d[4j + e] is row 16w + lane/4 + 8·(e/2), column
   8j + 2·(lane%4) + e%2 of the 64×N tile (w the warp in the warpgroup): mma.sync's layout.
   acc = 0 makes the instruction overwrite d instead of adding. ss: A and B from shared memory
   (descriptors); rs: A from registers (the m16n8k16 A fragment of the warp's 16 rows). TB = 1
   reads B transposed (MN-major: its N index is the contiguous one, as V's head dimension). */
#if US__HOP_DEV
/* The operand lists, composed from runs of eight: US__WG_RN is the PTX list of the N/2
   accumulator registers "{%0, ..., %(N/2-1)}", US__WG_DN(d) the matching asm operands d[0..]. */
#define US__WG_R8_0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define US__WG_R8_1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define US__WG_R8_2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define US__WG_R8_3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define US__WG_R8_4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define US__WG_R8_5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define US__WG_R8_6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define US__WG_R8_7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define US__WG_R8_8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define US__WG_R8_9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define US__WG_R8_10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define US__WG_R8_11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define US__WG_R8_12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define US__WG_R8_13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define US__WG_R8_14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define US__WG_R8_15 "%120, %121, %122, %123, %124, %125, %126, %127"
#define US__WG_R32(a, b, c, d) \
    US__WG_R8_##a ", " US__WG_R8_##b ", " US__WG_R8_##c ", " US__WG_R8_##d
#define US__WG_R64 "{" US__WG_R32(0, 1, 2, 3) "}"
#define US__WG_R80 "{" US__WG_R32(0, 1, 2, 3) ", " US__WG_R8_4 "}"
#define US__WG_R96 "{" US__WG_R32(0, 1, 2, 3) ", " US__WG_R8_4 ", " US__WG_R8_5 "}"
#define US__WG_R128 "{" US__WG_R32(0, 1, 2, 3) ", " US__WG_R32(4, 5, 6, 7) "}"
#define US__WG_R192 \
    "{" US__WG_R32(0, 1, 2, 3) ", " US__WG_R32(4, 5, 6, 7) ", " US__WG_R32(8, 9, 10, 11) "}"
#define US__WG_R256                                                         \
    "{" US__WG_R32(0, 1, 2, 3) ", " US__WG_R32(4, 5, 6, 7) ", " US__WG_R32( \
        8, 9, 10, 11) ", " US__WG_R32(12, 13, 14, 15) "}"
#define US__WG_D8(d, i)                                                                         \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define US__WG_D32(d, i) \
    US__WG_D8(d, i), US__WG_D8(d, i + 8), US__WG_D8(d, i + 16), US__WG_D8(d, i + 24)
#define US__WG_D64(d) US__WG_D32(d, 0)
#define US__WG_D80(d) US__WG_D32(d, 0), US__WG_D8(d, 32)
#define US__WG_D96(d) US__WG_D32(d, 0), US__WG_D8(d, 32), US__WG_D8(d, 40)
#define US__WG_D128(d) US__WG_D32(d, 0), US__WG_D32(d, 32)
#define US__WG_D192(d) US__WG_D32(d, 0), US__WG_D32(d, 32), US__WG_D32(d, 64)
#define US__WG_D256(d) US__WG_D32(d, 0), US__WG_D32(d, 32), US__WG_D32(d, 64), US__WG_D32(d, 96)
/* One function per shape, from two macros: PTX needs the operand numbers written out (%N), so
   each instantiation names them. SS: d, A's and B's descriptors, the scale-d flag, TB. RS: d,
   A's four registers, B's descriptor, the flag, TB. TY is A's and B's type, bf16 or f16. */
#define US__WG_SS_ASM(N, TY, DA, DB, P, T)                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " US__WG_R##N \
                 ", %" #DA ", %" #DB ", p, 1, 1, 0, %" #T ";\n}\n"                           \
                 : US__WG_D##N(d)                                                            \
                 : "l"(a), "l"(b), "r"(acc), "n"(TB))
#define US__WG_SS(N, DA, DB, P, T)                                                        \
    template <typename E, int TB>                                                         \
    static __device__ __forceinline__ void us__wg_ss##N(float *d, uint64_t a, uint64_t b, \
                                                        int acc) {                        \
        if constexpr (us__is_half<E>::value)                                              \
            US__WG_SS_ASM(N, "f16", DA, DB, P, T);                                        \
        else                                                                              \
            US__WG_SS_ASM(N, "bf16", DA, DB, P, T);                                       \
    }
#define US__WG_RS_ASM(N, TY, A0, A1, A2, A3, DB, P, T)                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                               \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " US__WG_R##N    \
                 ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, %" #T ";\n}\n" \
                 : US__WG_D##N(d)                                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB))
#define US__WG_RS(N, A0, A1, A2, A3, DB, P, T)                                           \
    template <typename E, int TB>                                                        \
    static __device__ __forceinline__ void us__wg_rs##N(float *d, const uint32_t(&a)[4], \
                                                        uint64_t b, int acc) {           \
        if constexpr (us__is_half<E>::value)                                             \
            US__WG_RS_ASM(N, "f16", A0, A1, A2, A3, DB, P, T);                           \
        else                                                                             \
            US__WG_RS_ASM(N, "bf16", A0, A1, A2, A3, DB, P, T);                          \
    }
US__WG_SS(64, 32, 33, 34, 35)
US__WG_SS(128, 64, 65, 66, 67)
US__WG_RS(64, 32, 33, 34, 35, 36, 37, 38)
US__WG_RS(80, 40, 41, 42, 43, 44, 45, 46)
US__WG_RS(96, 48, 49, 50, 51, 52, 53, 54)
US__WG_RS(128, 64, 65, 66, 67, 68, 69, 70)
US__WG_RS(192, 96, 97, 98, 99, 100, 101, 102)
US__WG_RS(256, 128, 129, 130, 131, 132, 133, 134)
#endif
template <int N, typename E, int TB>
static __device__ __forceinline__ void us__wg_ss(float *d, uint64_t a, uint64_t b, int acc) {
#if US__HOP_DEV
    static_assert(N == 64 || N == 128, "no wgmma wrapper of this N");
    if constexpr (N == 64)
        us__wg_ss64<E, TB>(d, a, b, acc);
    else
        us__wg_ss128<E, TB>(d, a, b, acc);
#else
    (void)d, (void)a, (void)b, (void)acc;
#endif
}

template <int N, typename E, int TB>
static __device__ __forceinline__ void us__wg_rs(float *d, const uint32_t (&a)[4], uint64_t b,
                                                 int acc) {
#if US__HOP_DEV
    if constexpr (N == 64)
        us__wg_rs64<E, TB>(d, a, b, acc);
    else if constexpr (N == 80)
        us__wg_rs80<E, TB>(d, a, b, acc);
    else if constexpr (N == 96)
        us__wg_rs96<E, TB>(d, a, b, acc);
    else if constexpr (N == 128)
        us__wg_rs128<E, TB>(d, a, b, acc);
    else if constexpr (N == 192)
        us__wg_rs192<E, TB>(d, a, b, acc);
    else {
        static_assert(N == 256, "no wgmma wrapper of this N");
        us__wg_rs256<E, TB>(d, a, b, acc);
    }
#else
    (void)d, (void)a, (void)b, (void)acc;
#endif
}

/* wgmma ordering: fence before a batch (registers written by ordinary code are ready), commit
   the batch as a group, wait until no group is pending. The empty asm that names each
   accumulator keeps the compiler from moving reads of d above the wait. */
static __device__ __forceinline__ void us__wg_fence(void) {
#if US__HOP_DEV
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void us__wg_commit(void) {
#if US__HOP_DEV
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int NREG>
static __device__ __forceinline__ void us__wg_wait(float *d) {
#if US__HOP_DEV
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
#pragma unroll
    for (int i = 0; i < NREG; i++) asm volatile("" : "+f"(d[i])::"memory");
}

template <int PENDING, int NREG>
static __device__ __forceinline__ void us__wg_wait_n(float *d) {
#if US__HOP_DEV
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
#endif
#pragma unroll
    for (int i = 0; i < NREG; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* Named barriers 1 and 2 between the two consumer warpgroups (256 threads: one side syncs, the
   other arrives): the ping-pong of who issues GEMMs next. Barrier 0 is __syncthreads'. */
static __device__ __forceinline__ void us__hop_bar_sync(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}

static __device__ __forceinline__ void us__hop_bar_arrive(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

/* The byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile of 128-byte rows:
   the chunk sits at c ⊕ (r mod 8), as the copy engine writes and wgmma reads it */
static __device__ __forceinline__ int us__sw128(int r, int c) {
    return r * 128 + ((c ^ (r & 7)) << 4);
}

/* Shared-memory matrix descriptor of a 128-byte-swizzled tile (PTX "matrix descriptor"):
   start address, leading and stride byte offsets (all in 16-byte units), swizzle mode 1.
   K-major (rows hold the reduction index, as Q and K for S = Q·Kᵀ): sbo 1024 steps 8 rows;
   a step of 16 along k inside a 64-column block adds 32 bytes to the start.
   MN-major (rows are the reduction index, as V for O = P·V): sbo 1024 steps 8 rows of k,
   lbo steps one 64-column block of n. */
static __device__ __forceinline__ uint64_t us__wg_desc(const void *s, uint32_t lbo, uint32_t sbo) {
    uint32_t a = us__smem_u32(s);
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 |
           (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

/* K-major operand: k-step kk (16 elements) of a tile of ROWS rows, from row r0 */
template <int ROWS>
static __device__ __forceinline__ uint64_t us__wg_kmaj(const unsigned char *tile, int r0, int kk) {
    return us__wg_desc(tile + (kk >> 2) * ROWS * 128 + r0 * 128 + (kk & 3) * 32, 16, 1024);
}

/* MN-major operand: k-step t (rows 16t..16t+15) of a tile of ROWS rows, every column block */
template <int ROWS>
static __device__ __forceinline__ uint64_t us__wg_mnmaj(const unsigned char *tile, int t) {
    return us__wg_desc(tile + t * 16 * 128, ROWS * 128, 1024);
}

/* ---- mbarriers and the copy engine --------------------------------------------------- */
static __device__ __forceinline__ void us__mb_init(uint64_t *bar, int count) {
#if US__HOP_DEV
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(us__smem_u32(bar)), "r"(count));
#endif
}

/* one arrival that also announces bytes the copy engine will deliver to this phase */
static __device__ __forceinline__ void us__mb_expect(uint64_t *bar, uint32_t bytes) {
#if US__HOP_DEV
    asm volatile(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(us__smem_u32(bar)),
        "r"(bytes)
        : "memory");
#endif
}

static __device__ __forceinline__ void us__mb_arrive(uint64_t *bar) {
#if US__HOP_DEV
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(us__smem_u32(bar)) : "memory");
#endif
}

/* spin until the phase of the given parity has completed */
static __device__ __forceinline__ void us__mb_wait(uint64_t *bar, int parity) {
#if US__HOP_DEV
    asm volatile("{\n.reg .pred p;\nUS_MB_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra US_MB_WAIT_%=;\n}\n" ::"r"(us__smem_u32(bar)),
                 "r"(parity)
                 : "memory");
#endif
}

/* box {64 columns, rows, 1} at (column c0, row c1, batch c2) of a 3-D tensor map into dst */
static __device__ __forceinline__ void us__tma_load(void *dst, const CUtensorMap *map, int c0,
                                                    int c1, int c2, uint64_t *bar) {
#if US__HOP_DEV
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(us__smem_u32(dst)),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(us__smem_u32(bar))
                 : "memory");
#endif
}

/* rows × HS of head columns col.. (every 64-column block) into a swizzled tile */
template <int HS, int ROWS>
static __device__ __forceinline__ void us__tma_tile(unsigned char *tile, const CUtensorMap *map,
                                                    int col, int row, int b, uint64_t *bar) {
#pragma unroll
    for (int cb = 0; cb < (HS + 63) / 64; cb++)
        us__tma_load(tile + cb * ROWS * 128, map, col + cb * 64, row, b, bar);
}

template <int NREG>
static __device__ __forceinline__ void us__hop_regs_dec(void) {
#if US__HOP_DEV
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(NREG));
#endif
}

template <int NREG>
static __device__ __forceinline__ void us__hop_regs_inc(void) {
#if US__HOP_DEV
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(NREG));
#endif
}

/* the fp32 accumulators of k-step t (columns 16t..16t+15) of a warpgroup tile, as an A fragment */
template <typename E, int N>
static __device__ __forceinline__ void us__hop_to_a(uint32_t (&a)[4], const float (&x)[N / 8][4],
                                                    int t) {
    a[0] = us__hop_pack<E>(x[2 * t][0], x[2 * t][1]);
    a[1] = us__hop_pack<E>(x[2 * t][2], x[2 * t][3]);
    a[2] = us__hop_pack<E>(x[2 * t + 1][0], x[2 * t + 1][1]);
    a[3] = us__hop_pack<E>(x[2 * t + 1][2], x[2 * t + 1][3]);
}

/* 2^x by the MUFU unit alone, subnormal results flushed to 0 (ex2.approx.ftz). exp2f without
   fast math adds a range check and two multiplies around the same MUFU.EX2 to keep subnormal
   results: four more instructions per score in the forward's softmax and the backward, both
   bound by issue slots at HS 64, for probabilities below 2^-126 that bf16 P and dS cannot hold
   usefully anyway. */
static __device__ __forceinline__ float us__hop_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* the warpgroup of this thread, through a shuffle so that the compiler knows it is the same in
   every lane: wgmma behind a branch it thinks divergent gets serialised (ptxas warning C7520) */
static __device__ __forceinline__ int us__hop_wg(void) {
    return __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
}

/* queries per tile of the dK/dV kernel (us__hop_cfg::BQ, below), for the host's sizes too */
static __host__ __device__ constexpr int us__hop_bq(int HS) { return HS <= 64 ? 128 : 64; }

/* Tile sizes and shared memory of one head size. HSP: HS rounded up to whole column blocks.
   BC keys per forward tile (128 up to HS 128: S is then 64 fp32 per thread; 64 above, where
   O takes 96-128). NWG consumer warpgroups of the backward. */
template <int HS>
struct us__hop_cfg {
    static constexpr int HSP = (HS + 63) / 64 * 64;
    static constexpr int BC = HS <= 128 ? 128 : 64;
    static constexpr int NWG = HS <= 128 ? 2 : 1;
    /* consumer warpgroups of the forward: 3 at HS 64, where the softmax costs as much as the GEMMs
       and a third warpgroup gives the tensor cores more work to switch to (FA3's 192 × 128) */
    static constexpr int NWF = HS <= 64 ? 3 : 2;
    /* the dQ kernel's tile GEMM deferred to the next tile's turn (us__hop_dq_consume): at HS
       64, where a tile's exp2 and dS take about as long as its GEMMs and the registers hold a
       tile's dS beside the next tile's S and dP (at HS 80 and 96 the stage it needs more does
       not fit in shared memory) */
    static constexpr bool DQD = HS == 64;
    /* stages of each kernel's ring (forward, dK/dV, dQ): 3 and 4 measured no faster on an H200
       (bench/RESULTS.md); the deferred dQ keeps a tile's K a turn longer, so a stage more. FSB,
       the context-parallel block forward's: a third at HS 64, whose copy thread waited for
       stages to be freed while the consumers waited for them to be filled (bench/RESULTS.md,
       "Measurements behind the code's choices") */
    static constexpr int FS = 2, BS = 2, QS = DQD ? 3 : 2, FSB = HS == 64 ? 3 : 2;
    /* queries per tile of the dK/dV kernel, keys per tile of dQ: 128 where the registers allow,
       since a 64-wide wgmma reading both operands from shared memory is bound by its bandwidth,
       and at HS 64 even with one operand in registers (bench/RESULTS.md, "Measurements behind
       the code's choices") */
    static constexpr int BQ = us__hop_bq(HS);
    /* the first KRK k-steps (16 columns each) of a dK/dV consumer's K and the first KRV of its
       V as wgmma A fragments in registers, loaded once a key block: those steps of Sᵀ = K·Qᵀ and
       dPᵀ = V·dOᵀ then read only Qᵀ and dOᵀ from shared memory, half of what a 64-wide GEMM
       with both operands there reads. As many as the consumers' 240 registers hold beside dK,
       dV, Sᵀ and dPᵀ without a spill (one more step at HS 128 spilled, and ran 30 % slower);
       none at HS 64, whose 128-query tiles make those GEMMs 128 wide, not bound by the reads */
    static constexpr int KRK = HS == 80 || HS == 96 ? HS / 16 : HS == 128 ? 3 : 0;
    static constexpr int KRV = HS == 80 ? HS / 16 : 0;
    static constexpr int BKQ = HS <= 128 ? 128 : 64;
    /* forward: Q [QN][64·NWF][HSP], K and V [FS][BC][HSP] (the block forward's [FSB]); the
       barriers after them. Two Q buffers where they fit (all but HS 256), so that the persistent
       forward loads the next tile's queries while the consumers still read this tile's */
    static constexpr int fwd_q_bytes = 64 * NWF * HSP * 2, fwd_kv_stage = 2 * BC * HSP * 2;
    static constexpr int QN =
        2 * fwd_q_bytes + FSB * fwd_kv_stage + 1024 + 32 * 8 <= 232448 ? 2 : 1;
    static constexpr int fwd_bytes = QN * fwd_q_bytes + FS * fwd_kv_stage;
    static constexpr int fwd_block_bytes = QN * fwd_q_bytes + FSB * fwd_kv_stage;
    /* dK/dV: K, V [64·NWG][HSP]; per stage Q, dO [BQ][HSP] and lse·log2 e, D [BQ] fp32. The
       persistent causal kernel keeps KVN K/V buffers: two where they fit (HS ≤ 128), so that the
       next key block's K and V load while the consumers finish this block */
    static constexpr int dkdv_kv_bytes = 2 * 64 * NWG * HSP * 2;
    static constexpr int dkdv_bytes = dkdv_kv_bytes + BS * (2 * BQ * HSP * 2 + 2 * BQ * 4);
    static constexpr int KVN = dkdv_bytes + dkdv_kv_bytes + 1024 + 32 * 8 <= 232448 ? 2 : 1;
    static constexpr int dkdv_pers_bytes = dkdv_bytes + (KVN - 1) * dkdv_kv_bytes;
    /* dQ: Q, dO [QNQ][64·NWG][HSP] (two buffers of each where they fit: HS 64), per stage K, V
       [BKQ][HSP] */
    static constexpr int dq_q_bytes = 2 * 64 * NWG * HSP * 2, dq_kv_bytes = QS * 2 * BKQ * HSP * 2;
    static constexpr int QNQ = 2 * dq_q_bytes + dq_kv_bytes + 1024 + 32 * 8 <= 232448 ? 2 : 1;
    static constexpr int dq_bytes = QNQ * dq_q_bytes + dq_kv_bytes;
    /* the fused backward, compiled at HS 64 and 128 (the scheme takes any HS with NWG 2, but at
       80 and 96 it measured slower than the two kernels at every T): the dK/dV kernel's tiles,
       dSᵀ twice [2][BQ][128] (one tile being read by the dQ GEMMs while the next is written) and
       each consumer's dQ part [2][64][64] fp32 for the copy engine */
    static constexpr bool FUSED = HS == 128 || HS == 64;
    static constexpr int fused_bytes = dkdv_bytes + 2 * BQ * 128 * 2 + 2 * 64 * 64 * 4;
    /* dQ from the stored dS (us__hop_dqs_kernel, NWG 2): per stage K [128][HSP] and dS of 128
       queries × 128 keys; as many stages as fit, at most 4 */
    static constexpr int dqs_stage = 128 * HSP * 2 + 128 * 128 * 2;
    static constexpr int DQS =
        (232448 - 1024 - 32 * 8) / dqs_stage < 4 ? (232448 - 1024 - 32 * 8) / dqs_stage : 4;
    static constexpr int dqs_bytes = DQS * dqs_stage;
};

/* dynamic shared memory: 1 KB of slack to align the tiles to the swizzle's 1024 bytes, the
   tiles, then room for 32 barriers */
static constexpr size_t us__hop_smem(int bytes) { return (size_t)bytes + 1024 + 32 * 8; }

/* every kernel's tiles fit in the 227 KB a block may have (the dQ kernel from stored dS with
   two stages at least) */
template <int H>
static constexpr bool us__hop_fits(void) {
    using C = us__hop_cfg<H>;
    return us__hop_smem(C::fwd_block_bytes) <= 232448 &&
           us__hop_smem(C::dkdv_pers_bytes) <= 232448 && us__hop_smem(C::dq_bytes) <= 232448 &&
           (!C::FUSED || us__hop_smem(C::fused_bytes) <= 232448) &&
           (C::NWG != 2 || (C::DQS >= 2 && us__hop_smem(C::dqs_bytes) <= 232448));
}

static __device__ __forceinline__ unsigned char *us__hop_smem_base(unsigned char *raw) {
    return (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
}

/* The barriers of a kernel whose Q buffers and K/V stages are rings: for each of the qn Q
   buffers and the n stages a "full" barrier (one arrival, the copy thread's) and an "empty" one
   (every consumer thread). Thread 0 initialises, then the block syncs. */
static __device__ __forceinline__ void us__hop_ring_bars_init(uint64_t *fullQ, uint64_t *emptyQ,
                                                              int qn, uint64_t *full,
                                                              uint64_t *empty, int n,
                                                              int consumer_threads) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < qn; i++) {
            us__mb_init(fullQ + i, 1);
            us__mb_init(emptyQ + i, consumer_threads);
        }
        for (int i = 0; i < n; i++) {
            us__mb_init(full + i, 1);
            us__mb_init(empty + i, consumer_threads);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

/* A key tile as a mask mode needs it (// >>cuda-hopper's mask modes, below): its index t and, by
   position, {min, max, run} of its key positions (us__hop_runs) */
struct us__hop_kt {
    int t;
    int4 r;
};

/* Each ring stage's key tile, posted by the forward's and the dQ kernel's copy thread before the
   stage's "full" arrival and read by the consumers once it completes (us__hop_bypos::post):
   by position, the walk's next tile and its ranges come from memory (bitmask, ranges), and each
   consumer fetching them itself had those loads in its critical path (bench/RESULTS.md,
   "Measurements behind the code's choices"). They sit 16 slots of 8 bytes after the first
   barrier: a ring's barriers take at most 16 of the 32 us__hop_smem leaves. */
template <int STAGES, int BARRIERS>
static __device__ __forceinline__ us__hop_kt *us__hop_kts(uint64_t *bars) {
    static_assert(BARRIERS <= 16 && 16 + STAGES * (int)sizeof(us__hop_kt) / 8 <= 32,
                  "the posted key tiles fit after the barriers");
    return reinterpret_cast<us__hop_kt *>(bars + 16);
}

/* The kernels' shared memory cut into named tiles, in the order of us__hop_cfg's byte counts,
   the barriers right after the tiles (the block kernels of // >>cuda-cp-flash keep their bitmask
   of visible tiles 32 barriers on). The forward: Q [QN][64·NWF][HSP], K and V [FS][BC][HSP];
   barriers [barQ QN][emptyQ QN][fullK FS][fullV FS][emptyK FS][emptyV FS]. */
template <int HS, int FS = us__hop_cfg<HS>::FS>
struct us__hop_fwd_smem {
    using C = us__hop_cfg<HS>;
    static constexpr int QB = C::fwd_q_bytes, KVB = C::BC * C::HSP * 2;
    unsigned char *sQ, *sK, *sV;
    uint64_t *barQ, *emptyQ, *fullK, *fullV, *emptyK, *emptyV;
    us__hop_kt *kts; /* [FS] each stage's key tile (us__hop_kts) */

    __device__ explicit us__hop_fwd_smem(unsigned char *base)
        : sQ(base), sK(sQ + C::QN * QB), sV(sK + FS * KVB), barQ((uint64_t *)(sV + FS * KVB)),
          emptyQ(barQ + C::QN), fullK(emptyQ + C::QN), fullV(fullK + FS), emptyK(fullV + FS),
          emptyV(emptyK + FS), kts(us__hop_kts<FS, 2 * C::QN + 4 * FS>(barQ)) {}

    /* the barriers (fullK, fullV and emptyK, emptyV are each one run of 2·FS) */
    __device__ void init(int consumer_threads) const {
        us__hop_ring_bars_init(barQ, emptyQ, C::QN, fullK, emptyK, 2 * FS, consumer_threads);
    }
};

/* Where one query tile stands in the forward's rings, for a CTA that runs several in turn (the
   persistent causal forward): j, the CTA's count of tiles before it, picks the Q buffer (j mod
   QN) and its phase; base, the key tiles the K/V ring carried before it, shifts the stage and
   phase of each key tile; last says that no tile follows (the consumers' turns stop there). A
   CTA that runs one tile (the CP block kernels) keeps the defaults. */
struct us__hop_ring {
    int j = 0, base = 0;
    bool last = true;
};

/* dK/dV: K, V [KVN][64·NWG][HSP] (buffer i's K at sK + i·KVSTEP, its V KB after); per stage
   Q, dO [BS][BQ][HSP], L2 and D [BS][BQ] fp32 and (POS, the block kernel) the queries' positions
   [BS][BQ]; barriers [barKV KVN][full BS][empty BS][emptyKV KVN] (emptyKV: the persistent
   kernel's consumers are done with a K/V buffer) */
template <int HS, bool POS, int KVN = 1>
struct us__hop_dkdv_smem {
    using C = us__hop_cfg<HS>;
    static constexpr int BQ = C::BQ, S = C::BS;
    static constexpr int KB = 64 * C::NWG * C::HSP * 2, QB = BQ * C::HSP * 2, KVSTEP = 2 * KB;
    unsigned char *sK, *sV, *sQ, *sdO;
    float *sL, *sD;
    int *sQp;
    uint64_t *barKV, *full, *empty, *emptyKV;

    __device__ explicit us__hop_dkdv_smem(unsigned char *base)
        : sK(base), sV(sK + KB), sQ(sK + KVN * KVSTEP), sdO(sQ + S * QB),
          sL((float *)(sdO + S * QB)), sD(sL + S * BQ), sQp((int *)(sD + S * BQ)),
          barKV((uint64_t *)(sQp + (POS ? S * BQ : 0))), full(barKV + KVN), empty(full + S),
          emptyKV(empty + S) {}
};

/* dQ: per Q buffer [QNQ] Q then dO [64·NWG][HSP] (buffer i at sQ + i·QSTEP); per stage K, V
   [QS][BKQ][HSP]; barriers [barQ QNQ][emptyQ QNQ][full QS][empty QS] */
template <int HS>
struct us__hop_dq_smem {
    using C = us__hop_cfg<HS>;
    static constexpr int QB = 64 * C::NWG * C::HSP * 2, QSTEP = 2 * QB, KB = C::BKQ * C::HSP * 2;
    unsigned char *sQ, *sdO, *sK, *sV;
    uint64_t *barQ, *emptyQ, *full, *empty;
    us__hop_kt *kts; /* [QS] each stage's key tile (us__hop_kts) */

    __device__ explicit us__hop_dq_smem(unsigned char *base)
        : sQ(base), sdO(sQ + QB), sK(sQ + C::QNQ * QSTEP), sV(sK + C::QS * KB),
          barQ((uint64_t *)(sV + C::QS * KB)), emptyQ(barQ + C::QNQ), full(emptyQ + C::QNQ),
          empty(full + C::QS), kts(us__hop_kts<C::QS, 2 * C::QNQ + 2 * C::QS>(barQ)) {}

    __device__ void init(int consumer_threads) const {
        us__hop_ring_bars_init(barQ, emptyQ, C::QNQ, full, empty, C::QS, consumer_threads);
    }
};

/* an accumulator of the wgmma layout ([N][4] per thread) set to 0 */
template <int N>
static __device__ __forceinline__ void us__hop_zero(float (&x)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
}

/* ---- mask modes: the key tiles a consumer visits, and how one is masked -----------------
   The causal kernels below and the context-parallel block kernels (// >>cuda-cp-flash) run the
   same producers and consumers; a Keys type says what differs for the kernels that walk key
   tiles (forward, dQ). us__hop_causal: tiles 0, 1, ... up to the diagonal, masked by index
   (key > query hidden) in a tile that crosses it. us__hop_bypos (// >>cuda-cp-flash): the tiles
   of a bitmask, masked by position. Each has
     n, nc               the tiles the CTA visits; the first nc of them this consumer computes
     first(), next(t)    the walk over tile indices; at(t): tile t as the mask needs it
     post(kts, s, kt)    the copy thread: tile kt (at(t)) is in stage s (by position: kts[s] = kt)
     posted(kts, s, t)   a consumer: the walk's tile t, in stage s (causal: at(t), t counted
                         by the consumer; by position kts[s], us__hop_kts, t unused)
     POSTED              whether posted reads kts (then it waits for the stage first)
     part(kt), skip(kt)  whether some key of tile kt, or every key, is hidden from this consumer
     masked(kt, off, e)  whether key kt.t·BC + off is hidden from the thread's row e/2 */
template <int BC>
struct us__hop_causal {
    int n, nc;
    int r0, row0; /* this warpgroup's first query; the thread's rows row0, row0 + 8 */

    __device__ __forceinline__ int first(void) const { return 0; }

    __device__ __forceinline__ int next(int t) const { return t + 1; }

    __device__ __forceinline__ us__hop_kt at(int t) const { return {t, make_int4(0, 0, 0, 0)}; }

    static constexpr bool POSTED = false;

    __device__ __forceinline__ void post(us__hop_kt *, int, const us__hop_kt &) const {}

    __device__ __forceinline__ us__hop_kt posted(const us__hop_kt *, int, int t) const {
        return at(t);
    }

    __device__ __forceinline__ bool part(const us__hop_kt &kt) const {
        return kt.t * BC + BC - 1 > r0;
    }

    __device__ __forceinline__ bool skip(const us__hop_kt &kt) const { return kt.t >= nc; }

    __device__ __forceinline__ bool masked(const us__hop_kt &kt, int off, int e) const {
        return kt.t * BC + off > row0 + (e >> 1) * 8;
    }
};

/* tile(need) for a tile that a mask may touch (part): one branch per tile, uniform over the
   warpgroup, into a copy of the tile's math with the mask and one with no mask code at all. One
   copy with the flag checked per score would cost every score on wholly visible tiles too: by
   index, ptxas kept the check as predicated arithmetic (an FSEL, an ISETP and an add per score:
   the forward ran 9-13 % slower at HS 64 and 128); by position, where it may load from kpos, it
   branched around every score (BSSY, a taken BRA and BSYNC: 192 instructions a tile at HS 128).
   The causal dK/dV kernel has no registers for a second copy (ptxas spilled 16 in the unmasked
   one at HS 64: its 240 hold dK, dV, Sᵀ and dPᵀ), so it masks a diagonal tile in a pass of its
   own instead (us__hop_dkdv_tile). */
template <typename F>
static __device__ __forceinline__ void us__hop_by_mode(bool part, const F &tile) {
    if (part)
        tile(true);
    else
        tile(false);
}

/* ---- forward --------------------------------------------------------------------------- */
/* One tile of the online softmax on a warpgroup's S (the thread's two rows): hide masked scores,
   new row max over the quad that shares a row, corr = exp2(m_old − m_new) for the caller to
   rescale O with once its P·V has landed, l rescaled and grown, S turned into P in place.
   As us__fa_softmax: log2 domain, one FFMA per score, a row with nothing visible stays 0. */
template <int BC, typename Mask>
static __device__ __forceinline__ void us__hop_softmax(float (&s)[BC / 8][4], float (&m)[2],
                                                       float (&l)[2], float (&corr)[2], float sl2,
                                                       bool need, Mask masked) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BC / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (need && masked(j, e)) s[j][e] = -INFINITY;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
        }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mnew = fmaxf(m[r], mx[r] * sl2);
        const float mref = mnew == -INFINITY ? 0.f : mnew;
        corr[r] = us__hop_exp2(m[r] - mref);
        m[r] = mnew;
        l[r] *= corr[r];
#pragma unroll
        for (int j = 0; j < BC / 8; j++) {
            s[j][2 * r] = us__hop_exp2(fmaf(s[j][2 * r], sl2, -mref));
            s[j][2 * r + 1] = us__hop_exp2(fmaf(s[j][2 * r + 1], sl2, -mref));
            l[r] += s[j][2 * r] + s[j][2 * r + 1];
        }
    }
}

/* O's rows times their correction; the empty asm after it keeps the multiplies before the next
   wgmma.fence, so that no register of the coming P·V is written inside its batch */
template <int HS>
static __device__ __forceinline__ void us__hop_scale_o(float (&o)[HS / 8][4],
                                                       const float (&corr)[2]) {
#pragma unroll
    for (int i = 0; i < HS / 8; i++) {
        o[i][0] *= corr[0];
        o[i][1] *= corr[0];
        o[i][2] *= corr[1];
        o[i][3] *= corr[1];
    }
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(o[i][e])::"memory");
}

/* A kernel's barriers, laid out [one ones][full n][empty n]: `one` for the tiles loaded once
   (one arrival; ones buffers of them, each with an "empty" barrier in one_empty [ones] where the
   kernel refills them), "full" for the ring's stages (full_count arrivals: the copy thread, and
   whoever else fills a stage), "empty" (empty_count: every consumer thread). Thread 0
   initialises, then the block syncs. */
static __device__ __forceinline__ void us__hop_bars_init(uint64_t *one, int n, int full_count,
                                                         int empty_count, int ones = 1,
                                                         uint64_t *one_empty = nullptr) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < ones; i++) {
            us__mb_init(one + i, 1);
            if (one_empty) us__mb_init(one_empty + i, empty_count);
        }
        for (int i = 0; i < n; i++) {
            us__mb_init(one + ones + i, full_count);
            us__mb_init(one + ones + n + i, empty_count);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

/* setmaxnreg with NC consumer warpgroups: the producer gives registers up (24 each beside three
   consumers, 40 beside two), the consumers take them (160, 232); one consumer keeps the split.
   The fused backward's two consumers (FUSED_BWD) take 240 and leave the producer 24,
   FlashAttention-3's split: at HS 64 a consumer holds Sᵀ and dPᵀ of 128 queries (128 registers)
   beside dK and dV (64), and 232 spilled. The two-kernel backward measured slower with it. */
template <int NC, bool FUSED_BWD = false>
static __device__ __forceinline__ void us__hop_regs_producer(void) {
    if constexpr (NC == 3)
        us__hop_regs_dec<24>();
    else if constexpr (NC == 2)
        us__hop_regs_dec<FUSED_BWD ? 24 : 40>();
}

template <int NC, bool FUSED_BWD = false>
static __device__ __forceinline__ void us__hop_regs_consumer(void) {
    if constexpr (NC == 3)
        us__hop_regs_inc<160>();
    else if constexpr (NC == 2)
        us__hop_regs_inc<FUSED_BWD ? 240 : 232>();
}

/* S = Q·Kᵀ for a warpgroup's 64 queries (rows of the Q tile of BR rows, from q) against a tile
   of BC keys, as one committed batch of wgmma */
template <typename E, int HS, int BR, int BC>
static __device__ __forceinline__ void us__hop_qk(float (&sc)[BC / 8][4], const unsigned char *q,
                                                  const unsigned char *k) {
    us__wg_fence();
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++)
        us__wg_ss<BC, E, 0>(&sc[0][0], us__wg_kmaj<BR>(q, 0, kk), us__wg_kmaj<BC>(k, 0, kk),
                            kk > 0);
    us__wg_commit();
}

/* A copy thread's walk over the key tiles of ks (Keys): tile kt, and k, its us__hop_kt as
   posted to the consumers. By position (Keys::POSTED) the walk runs a tile ahead of the copies:
   ahead(), before the stage's waits, fetches the next tile's index, and step(), after its copies,
   that tile's ranges, so that their dependent loads (the bitmask word, then the ranges) are in
   flight while the thread waits on the ring, not between its copies (bench/RESULTS.md,
   "Measurements behind the code's choices"). The causal walk is arithmetic and steps in order. */
template <typename Keys>
struct us__hop_kcursor {
    const Keys &ks;
    int kt, kn = 0;
    us__hop_kt k;

    __device__ explicit us__hop_kcursor(const Keys &w) : ks(w), kt(w.first()), k(w.at(kt)) {}

    __device__ __forceinline__ void ahead(void) {
        if (Keys::POSTED) kn = ks.next(kt);
    }

    /* more: a tile follows */
    __device__ __forceinline__ void step(bool more) {
        kt = Keys::POSTED ? kn : ks.next(kt);
        if (Keys::POSTED && more) k = ks.at(kt);
    }
};

/* The forward's producer (one thread) for one query tile: its Q (columns qcol) into buffer
   rg.j mod QN once the consumers are done with the tile that buffer held, then K and V (columns
   kcol, vcol) of the tiles of the walk ks (Keys, by position a tile ahead: us__hop_kcursor)
   through the FS stages of the ring, each refilled once every consumer has arrived on its
   "empty" barrier. */
template <int HS, int FS, typename Keys>
static __device__ __forceinline__ void
us__hop_fwd_produce(const us__hop_fwd_smem<HS, FS> &sm, const CUtensorMap *mq,
                    const CUtensorMap *mkv, const Keys &ks, int qcol, int kcol, int vcol, int b,
                    int q0, const us__hop_ring &rg = us__hop_ring()) {
    using C = us__hop_cfg<HS>;
    constexpr int BR = 64 * C::NWF, BC = C::BC, S = FS, QN = C::QN;
    constexpr int QB = us__hop_fwd_smem<HS, FS>::QB, KVB = us__hop_fwd_smem<HS, FS>::KVB;
    const int qi = rg.j % QN;
    if (rg.j >= QN) us__mb_wait(sm.emptyQ + qi, ((rg.j / QN) - 1) & 1);
    us__mb_expect(sm.barQ + qi, QB);
    us__tma_tile<HS, BR>(sm.sQ + qi * QB, mq, qcol, q0, b, sm.barQ + qi);
    us__hop_kcursor<Keys> w(ks);
    for (int it = 0; it < ks.n; it++) {
        const int r = rg.base + it, s = r % S;
        w.ahead();
        if (r >= S) us__mb_wait(sm.emptyK + s, ((r / S) - 1) & 1); /* every consumer is done */
        ks.post(sm.kts, s, w.k);
        us__mb_expect(sm.fullK + s, KVB);
        us__tma_tile<HS, BC>(sm.sK + s * KVB, mkv, kcol, w.kt * BC, b, sm.fullK + s);
        if (r >= S) us__mb_wait(sm.emptyV + s, ((r / S) - 1) & 1);
        us__mb_expect(sm.fullV + s, KVB);
        us__tma_tile<HS, BC>(sm.sV + s * KVB, mkv, vcol, w.kt * BC, b, sm.fullV + s);
        w.step(it + 1 < ks.n);
    }
}

/* O / l into out [B][T][NH·HS] and lse = m + log l (natural log) for the thread's two rows
   row0 and row0 + 8 (l summed first over the quad of threads that share a row) */
template <typename E, int HS>
static __device__ __forceinline__ void
us__hop_fwd_store(const float (&o)[HS / 8][4], const float (&m)[2], float (&l)[2], E *out,
                  float *lse, int row0, int b, int h, int T, int NH, int lane) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = row0 + r * 8;
        if (row < T) {
            const float inv = 1.f / l[r];
            E *orow = out + ((int64_t)b * T + row) * NH * HS + (int64_t)h * HS + 2 * (lane & 3);
#pragma unroll
            for (int i = 0; i < HS / 8; i++)
                *reinterpret_cast<uint32_t *>(orow + i * 8) =
                    us__hop_pack<E>(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
            if ((lane & 3) == 0)
                lse[((int64_t)b * NH + h) * T + row] = (m[r] + log2f(l[r])) * 0.69314718055994531f;
        }
    }
}

/* A forward consumer over the CTA's key tiles (Keys: the mask mode; ks.n ≥ 1). Its tile it:
   issue S = Q·K_itᵀ and, behind it, O += P·V of tile it−1 (intra-warpgroup overlap: the softmax
   of tile it runs while that second GEMM does). O lags one tile: it is rescaled by tile it−1's
   correction before the batch that adds P·V of tile it−1. The consumers take turns issuing
   (ping-pong, round robin over NWF), so one's softmax meets the others' GEMMs. The first tile
   and the last P·V are peeled off, so that every wait in the loop is unconditional (ptxas
   serialises wgmma it cannot prove waited for on every path). The consumer computes the first
   ks.nc tiles (a tile among them that it cannot see is masked whole: P·V runs one tile behind),
   then only takes the turns and stages of the rest, and frees its Q buffer. Tile it sits in
   stage (rg.base + it) mod FS of the ring (us__hop_ring). */
template <typename E, int HS, int FS, typename Keys>
static __device__ __forceinline__ void
us__hop_fwd_consume(float (&o)[HS / 8][4], float (&m)[2], float (&l)[2],
                    const us__hop_fwd_smem<HS, FS> &sm, const Keys &ks, int c, int lane, float sl2,
                    const us__hop_ring &rg = us__hop_ring()) {
    using C = us__hop_cfg<HS>;
    constexpr int NW = C::NWF, BR = 64 * NW, BC = C::BC, S = FS, QN = C::QN;
    constexpr int KVB = us__hop_fwd_smem<HS, FS>::KVB;
    const int qi = rg.j % QN;
    /* this warpgroup's 64 queries */
    const unsigned char *sQc = sm.sQ + qi * us__hop_fwd_smem<HS, FS>::QB + 64 * c * 128;
    uint32_t pa[BC / 16][4]; /* P of the tile before, as A fragments */
    float corr[2] = {1.f, 1.f};
    /* the ring's stage of key tile it, and the parity of its round */
    const auto stage = [&](int it) { return (rg.base + it) % S; };
    const auto phase = [&](int it) { return ((rg.base + it) / S) & 1; };
    /* O += P·V of the tile in stage s (O was rescaled before the batch's first fence). The fence
       after the wait is the one ptxas would put there itself (info C7519, "warpgroup.arrive is
       injected"): an RS batch behind another batch gets one; written out, the code says what
       runs (the same instructions either way) */
    const auto pv = [&](int s, int ph) {
        us__mb_wait(sm.fullV + s, ph);
        us__wg_fence();
#pragma unroll
        for (int t = 0; t < BC / 16; t++)
            us__wg_rs<HS, E, 1>(&o[0][0], pa[t], us__wg_mnmaj<BC>(sm.sV + s * KVB, t), 1);
        us__wg_commit();
    };
    /* the online softmax of tile kt, masked only where part of it is hidden */
    const auto softmax = [&](float(&sc)[BC / 8][4], const us__hop_kt &kt) {
        const auto masked = [&](int j, int e) {
            return ks.masked(kt, j * 8 + 2 * (lane & 3) + (e & 1), e);
        };
        us__hop_by_mode(ks.part(kt),
                        [&](bool need) { us__hop_softmax<BC>(sc, m, l, corr, sl2, need, masked); });
    };
    /* P into the A registers, only once the P·V that reads the old ones has finished */
    const auto to_a = [&](float(&sc)[BC / 8][4]) {
#pragma unroll
        for (int t = 0; t < BC / 16; t++) us__hop_to_a<E, BC>(pa[t], sc, t);
    };
    /* the next consumer's turn (none after the CTA's last key tile) */
    const auto turn_done = [&](int it) {
        if (c != NW - 1 || it + 1 < ks.n || !rg.last) us__hop_bar_arrive(1 + (c + 1) % NW);
    };
    /* consumer 0 takes the tensor cores first */
    if (c == NW - 1 && rg.j == 0) us__hop_bar_arrive(1);
    us__mb_wait(sm.barQ + qi, (rg.j / QN) & 1);
    int it = 0;
    if (ks.nc > 0) {
        float sc[BC / 8][4];
        us__mb_wait(sm.fullK + stage(0), phase(0));
        us__hop_kt kt = ks.posted(sm.kts, stage(0), 0);
        us__hop_bar_sync(1 + c);
        us__hop_qk<E, HS, BR, BC>(sc, sQc, sm.sK + stage(0) * KVB);
        turn_done(0);
        us__wg_wait<BC / 2>(&sc[0][0]);
        us__mb_arrive(sm.emptyK + stage(0));
        softmax(sc, kt);
        to_a(sc);
        for (it = 1; it < ks.nc; it++) {
            const int s = stage(it), sp = stage(it - 1);
            us__mb_wait(sm.fullK + s, phase(it));
            kt = ks.posted(sm.kts, s, it);
            us__hop_bar_sync(1 + c); /* this consumer's turn at the tensor cores */
            us__hop_scale_o<HS>(o, corr);
            us__hop_qk<E, HS, BR, BC>(sc, sQc, sm.sK + s * KVB);
            pv(sp, phase(it - 1));
            turn_done(it);
            us__wg_wait_n<1, BC / 2>(&sc[0][0]); /* S has landed, P·V may still run */
            us__mb_arrive(sm.emptyK + s);        /* K of tile it is read */
            softmax(sc, kt);
            us__wg_wait<HS / 2>(&o[0][0]);
            us__mb_arrive(sm.emptyV + sp); /* V of tile it−1 is read */
            to_a(sc);
        }
        us__hop_scale_o<HS>(o, corr);
        pv(stage(it - 1), phase(it - 1)); /* O += P·V of the last tile */
        us__wg_wait<HS / 2>(&o[0][0]);
        us__mb_arrive(sm.emptyV + stage(it - 1));
    }
    us__mb_arrive(sm.emptyQ + qi); /* every S of this tile has landed: Q is read */
    /* tiles wholly after this warpgroup's queries: only their turns and stages */
    for (; it < ks.n; it++) {
        const int s = stage(it);
        us__mb_wait(sm.fullK + s, phase(it));
        us__hop_bar_sync(1 + c);
        turn_done(it);
        us__mb_arrive(sm.emptyK + s);
        us__mb_arrive(sm.emptyV + s);
    }
}

/* Tile j of CTA i in a persistent grid of G CTAs over tiles sorted longest first: tile j·G + i
   in even rounds j, j·G + G−1−i in odd ones (there and back), so that no CTA takes the longest
   tile of every round; a value past the last tile ends the CTA's walk */
static __device__ __forceinline__ int us__hop_snake(int i, int j, int G) {
    return j * G + ((j & 1) ? G - 1 - i : i);
}

/* Item u of an order in bands (us__hop_qtile_of, us__hop_kblock_of): the (batch, kv head) pairs
   in bands of P (the last band may have fewer), and within a band, depth 0 of every pair's units
   (units: heads of a group, or 1), then depth 1, ...; a pair's units consecutive. Returns the
   depth, the pair and the unit. */
struct us__hop_banded {
    int r, pair, unit;
};

static __device__ __forceinline__ us__hop_banded us__hop_band_at(int u, int pairs, int P, int units,
                                                                 int depth) {
    const int per = P * units * depth;            /* the items of a full band */
    const int band = u / per, w = u - band * per; /* item w of this band */
    const int pc = min(P, pairs - band * P);      /* the band's pairs */
    const int r = w / (pc * units), x = w - r * (pc * units);
    return {r, band * P + x / units, x % units};
}

/* Query tile u (of BR rows) of the causal forward and dQ kernels. The (batch, kv head) pairs go
   in bands of P (us__hop_band), and each band's tiles longest first: the last query block of
   every head of the band's pairs, then the one before, ...; a group's heads fastest, so that
   they meet in L2. In one band, multi-head attention at B·T = 16k, T 2k, HS 128 has 128 pairs for
   132 CTAs: each pair's K and V (1 MB; 128 MB in all, against 50 MB of L2) is read by one CTA at
   a time, and from memory again by each of its query tiles. In bands of a few dozen pairs,
   several CTAs read a pair's K and V at once and share them there (us__hop_band). */
struct us__hop_qtile {
    int q0, h, b, g;
};

static __device__ __forceinline__ us__hop_qtile us__hop_qtile_of(int u, int nqb, int BR, int NH,
                                                                 int B, int NKV, int P) {
    const int grp = NH / NKV;
    const us__hop_banded a = us__hop_band_at(u, B * NKV, P, grp, nqb); /* depth: from the last */
    const int g = a.pair % NKV;
    return {(nqb - 1 - a.r) * BR, g * grp + a.unit, a.pair / NKV, g};
}

/* Key block u of the dK/dV kernel (of U = nkb key blocks × np pairs, walked as the query tiles
   by us__hop_snake): the (batch, kv head) pairs p0 .. p0 + np − 1 (pair b·NKV + g; all B·NKV of
   them but where the backward runs in chunks of pairs) in bands of P as in us__hop_qtile_of,
   each band's key blocks heaviest first (the first key block sees every query). Its CTAs stream
   the queries and dO of their pair's heads, which a band's blocks then share in L2. */
struct us__hop_kblock {
    int g, b, kb;
};

static __device__ __forceinline__ us__hop_kblock us__hop_kblock_of(int u, int NKV, int p0, int np,
                                                                   int nkb, int P) {
    const us__hop_banded a = us__hop_band_at(u, np, P, 1, nkb);
    return {(p0 + a.pair) % NKV, (p0 + a.pair) / NKV, a.r};
}

/* Where one key block stands in a dK/dV CTA's walk: qb0, its first query tile (of BQ) at or after
   its keys, and per, the query tiles from there; j, the CTA's count of key blocks before it
   (its K/V buffer is j mod KVN); base, the ring stages those blocks used; last, whether none
   follows */
struct us__hop_kstep {
    int qb0, per, j, base;
    bool last;
};

/* This CTA's walk over the dK/dV kernel's key blocks of BK keys of pairs p0 .. p0 + np − 1
   (us__hop_snake over us__hop_kblock_of, heaviest first), as its copy thread, its rows warp and
   its consumers all take it: block(kb, w) for each */
template <int BK, int BQ, typename F>
static __device__ __forceinline__ void us__hop_kwalk(int T, int NKV, int p0, int np, int grp, int P,
                                                     const F &block) {
    const int nkb = (T + BK - 1) / BK, U = nkb * np, G = gridDim.x, nqt = (T + BQ - 1) / BQ;
    us__hop_kstep w = {0, 0, 0, 0, false};
    for (int u = us__hop_snake(blockIdx.x, 0, G); u < U; w.j++) {
        const int un = us__hop_snake(blockIdx.x, w.j + 1, G);
        const us__hop_kblock kb = us__hop_kblock_of(u, NKV, p0, np, nkb, P);
        w.qb0 = kb.kb * BK / BQ;
        w.per = nqt - w.qb0;
        w.last = un >= U;
        block(kb, w);
        w.base += grp * w.per;
        u = un;
    }
}

/* This CTA's walk over the U causal query tiles of BR rows (nqb of them per head and batch; G
   CTAs; the kernel computes these once, before its roles split), as its producer and its
   consumers all take it (us__hop_snake, us__hop_qtile_of): tile(q, ks, rg) for each, with ks.n
   the key tiles of BK up to the diagonal and rg the tile's place in the rings (us__hop_ring) */
template <int BR, int BK, typename F>
static __device__ __forceinline__ void us__hop_walk(int nqb, int U, int G, int B, int T, int NH,
                                                    int NKV, int P, const F &tile) {
    us__hop_ring rg;
    for (int u = us__hop_snake(blockIdx.x, 0, G); u < U; rg.j++) {
        const int un = us__hop_snake(blockIdx.x, rg.j + 1, G);
        const us__hop_qtile q = us__hop_qtile_of(u, nqb, BR, NH, B, NKV, P);
        us__hop_causal<BK> ks;
        ks.n = (min(q.q0 + BR, T) - 1) / BK + 1; /* causal: no tile past the diagonal */
        rg.last = un >= U;
        tile(q, ks, rg);
        rg.base += ks.n;
        u = un;
    }
}

/* The forward, a persistent grid (one CTA per SM) over the tiles of 64·NWF queries of every
   (head, batch), in us__hop_snake's order: consumer c owns queries 64c.. of each, key tiles up
   to the diagonal (us__hop_fwd_consume, causal). A CTA's rings run on from one query tile to the
   next, so the producer loads the next tile's Q and first K/V while the consumers finish this
   one and write it out: a grid of one CTA per tile paid that start and end on every tile. */
template <typename E, int HS>
__global__ void __launch_bounds__(128 * (1 + us__hop_cfg<HS>::NWF), 1)
    us__hop_fwd_kernel(const __grid_constant__ CUtensorMap mq,
                       const __grid_constant__ CUtensorMap mkv, E *__restrict__ out,
                       float *__restrict__ lse, int B, int T, int NH, int NKV, int P,
                       float sl2 /* scale·log2 e */) {
#if US__HOP_DEV
    using C = us__hop_cfg<HS>;
    constexpr int NW = C::NWF, BR = 64 * NW, BC = C::BC;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const us__hop_fwd_smem<HS> sm(us__hop_smem_base(us__hop_raw));
    const int nqb = (T + BR - 1) / BR, U = nqb * NH * B, G = gridDim.x;
    const int wg = us__hop_wg(), tid = threadIdx.x & 127;
    sm.init(128 * NW);

    if (wg == 0) { /* producer: one thread issues every copy */
        us__hop_regs_producer<NW>();
        if (tid != 0) return;
        us__hop_walk<BR, BC>(
            nqb, U, G, B, T, NH, NKV, P,
            [&](const us__hop_qtile &q, us__hop_causal<BC> &ks, const us__hop_ring &rg) {
                us__hop_fwd_produce<HS>(sm, &mq, &mkv, ks, q.h * HS, (NH + q.g) * HS,
                                        (NH + NKV + q.g) * HS, q.b, q.q0, rg);
            });
        return;
    }
    us__hop_regs_consumer<NW>();
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    us__hop_walk<BR, BC>(
        nqb, U, G, B, T, NH, NKV, P,
        [&](const us__hop_qtile &q, us__hop_causal<BC> &ks, const us__hop_ring &rg) {
            ks.r0 = q.q0 + 64 * c;
            ks.nc = ks.r0 < T ? (min(ks.r0 + 64, T) - 1) / BC + 1 : 0; /* the tiles it needs */
            ks.row0 = ks.r0 + 16 * warp + (lane >> 2);
            float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
            us__hop_zero(o);
            us__hop_fwd_consume<E, HS>(o, m, l, sm, ks, c, lane, sl2, rg);
            us__hop_fwd_store<E, HS>(o, m, l, out, lse, ks.row0, q.b, q.h, T, NH, lane);
        });
#else
    (void)mq, (void)mkv, (void)out, (void)lse, (void)B, (void)T, (void)NH, (void)NKV, (void)sl2;
    __trap();
#endif
}

/* ---- backward ------------------------------------------------------------------------ */
/* D[b,h,t] = Σ_d dO·O and L2[b,h,t] = lse·log2 e (+inf for a row that saw no key, so that its
   P = exp2(s − L2) is 0), for the rows i = (b·NH + h)·T + t of [B][NH][T] in order (so that lse,
   D and L2 are read and written in whole lines); LPR lanes per row (a power of two ≥ HS/8), each
   with one 16-byte piece of dO and of O (HS a multiple of 8, rows 16-byte aligned). One warp per
   row with 2-byte loads, scattered writes, ran 2.4× slower than cuDNN's at HS 64. */
template <typename E, int LPR>
__global__ void __launch_bounds__(256)
    us__hop_dot_kernel(const E *__restrict__ dout, const E *__restrict__ out,
                       const float *__restrict__ lse, float *__restrict__ D, float *__restrict__ L2,
                       int64_t rows, int T, int NH, int HS) {
    const int64_t i = (int64_t)blockIdx.x * (256 / LPR) + threadIdx.x / LPR;
    const int l = threadIdx.x % LPR;
    float acc = 0.f;
    if (i < rows && 8 * l < HS) {
        const int64_t t = i % T, bh = i / T, b = bh / NH, h = bh % NH;
        const int64_t off = ((b * T + t) * NH + h) * HS + 8 * l; /* row (b·T + t)·NH + h */
        const uint4 x = *reinterpret_cast<const uint4 *>(dout + off);
        const uint4 y = *reinterpret_cast<const uint4 *>(out + off);
        const E *xe = reinterpret_cast<const E *>(&x), *ye = reinterpret_cast<const E *>(&y);
#pragma unroll
        for (int e = 0; e < 8; e++) acc += (float)xe[e] * (float)ye[e];
    }
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (i < rows && l == 0) {
        D[i] = acc;
        L2[i] = lse[i] == -INFINITY ? INFINITY : lse[i] * US__LOG2E;
    }
}

/* the launch for HS (a multiple of 8, up to 256) */
template <typename E>
static void us__hop_dot(const void *dout, const void *out, const float *lse, float *D, float *L2,
                        int64_t rows, int T, int NH, int HS, cudaStream_t st) {
    const E *x = (const E *)dout, *y = (const E *)out;
    if (HS <= 64)
        us__hop_dot_kernel<E, 8>
            <<<(unsigned)((rows + 31) / 32), 256, 0, st>>>(x, y, lse, D, L2, rows, T, NH, HS);
    else if (HS <= 128)
        us__hop_dot_kernel<E, 16>
            <<<(unsigned)((rows + 15) / 16), 256, 0, st>>>(x, y, lse, D, L2, rows, T, NH, HS);
    else
        us__hop_dot_kernel<E, 32>
            <<<(unsigned)((rows + 7) / 8), 256, 0, st>>>(x, y, lse, D, L2, rows, T, NH, HS);
}

/* Ping-pong of the backward's two consumers (NWG 2): each takes its turn before issuing a GEMM
   batch (named barrier 1 + c) and hands the tensor cores over after (2 − c); consumer 1 starts
   by handing them to consumer 0, and consumer 1 hands nothing on after its last batch */
template <int NWG>
static __device__ __forceinline__ void us__hop_turn(int c) {
    if constexpr (NWG == 2) us__hop_bar_sync(1 + c);
}

template <int NWG>
static __device__ __forceinline__ void us__hop_turn_done(int c, bool last) {
    if constexpr (NWG == 2) {
        if (c == 0 || !last) us__hop_bar_arrive(2 - c);
    }
}

/* The tiles a dK/dV CTA of kv head g visits (query tiles qb0.. of BQ at or after the diagonal,
   grp query heads), as a cursor (query head h, query tile qb) stepped by us__hop_bwd_next:
   counters, not divisions, which the producer's 24 registers would spill. Head by head, tiles in
   order (the two-kernel backward); or, in the fused one (LAST_FIRST), the last tile first with the
   group's heads inside, so that every CTA of a kv head visits the dQ tiles in the same order,
   the one the deterministic dQ sums need (us__hop_dq_writer) */
template <bool LAST_FIRST>
static __device__ __forceinline__ void us__hop_bwd_first(int g, int grp, int qb0, int per, int &h,
                                                         int &qb) {
    h = g * grp;
    qb = LAST_FIRST ? qb0 + per - 1 : qb0;
}

template <bool LAST_FIRST>
static __device__ __forceinline__ void us__hop_bwd_next(int g, int grp, int qb0, int per, int &h,
                                                        int &qb) {
    if (LAST_FIRST) {
        if (++h == g * grp + grp) {
            h = g * grp;
            qb--;
        }
    } else if (++qb == qb0 + per) {
        qb = qb0;
        h++;
    }
}

/* The dK/dV kernel's copy thread for one key block: K and V of its keys into sK, sV (once the
   consumers are done with what that buffer held: emptyKV's phase kvph, none when −1), then Q and
   dO of every (head of the group, query tile at or after the diagonal) through the ring, whose
   stages the CTA's earlier key blocks ran through base times (the persistent kernel) */
template <int HS, bool LAST_FIRST>
static __device__ __forceinline__ void
us__hop_dkdv_produce(unsigned char *sK, unsigned char *sV, unsigned char *sQ, unsigned char *sdO,
                     uint64_t *barKV, uint64_t *full, uint64_t *empty, const CUtensorMap *mq,
                     const CUtensorMap *mdo, const CUtensorMap *mkv, int g, int b, int k0, int qb0,
                     int grp, int per, int NH, int NKV, int base = 0, uint64_t *emptyKV = nullptr,
                     int kvph = -1) {
    using C = us__hop_cfg<HS>;
    constexpr int BK = 64 * C::NWG, BQ = C::BQ, S = C::BS;
    constexpr int KB = BK * C::HSP * 2, QB = BQ * C::HSP * 2;
    if (kvph >= 0) us__mb_wait(emptyKV, kvph);
    us__mb_expect(barKV, 2 * KB);
    us__tma_tile<HS, BK>(sK, mkv, (NH + g) * HS, k0, b, barKV);
    us__tma_tile<HS, BK>(sV, mkv, (NH + NKV + g) * HS, k0, b, barKV);
    int h, qb;
    us__hop_bwd_first<LAST_FIRST>(g, grp, qb0, per, h, qb);
    for (int it = 0; it < grp * per; it++, us__hop_bwd_next<LAST_FIRST>(g, grp, qb0, per, h, qb)) {
        const int r = base + it, s = r % S, q0 = qb * BQ;
        if (r >= S) us__mb_wait(empty + s, ((r / S) - 1) & 1);
        us__mb_expect(full + s, 2 * QB);
        us__tma_tile<HS, BQ>(sQ + s * QB, mq, h * HS, q0, b, full + s);
        us__tma_tile<HS, BQ>(sdO + s * QB, mdo, h * HS, q0, b, full + s);
    }
}

/* The dK/dV kernel's warp 1: L2 = lse·log2 e and D of each stage's queries into shared memory
   (queries past T: L2 = +inf makes P 0), then an arrival on the stage's "full" barrier; base as
   us__hop_dkdv_produce's */
template <int HS, bool LAST_FIRST>
static __device__ __forceinline__ void
us__hop_dkdv_rows(float *sL, float *sD, uint64_t *full, uint64_t *empty,
                  const float *__restrict__ L2g, const float *__restrict__ Dg, int g, int b,
                  int qb0, int grp, int per, int T, int NH, int lane, int base = 0) {
    constexpr int BQ = us__hop_cfg<HS>::BQ, S = us__hop_cfg<HS>::BS;
    int h, qb;
    us__hop_bwd_first<LAST_FIRST>(g, grp, qb0, per, h, qb);
    for (int it = 0; it < grp * per; it++, us__hop_bwd_next<LAST_FIRST>(g, grp, qb0, per, h, qb)) {
        const int r = base + it, s = r % S, q0 = qb * BQ;
        if (r >= S) us__mb_wait(empty + s, ((r / S) - 1) & 1);
#pragma unroll 1 /* one load pair in flight: the producer has 24 registers */
        for (int i = lane; i < BQ; i += 32) {
            const int q = q0 + i;
            const int64_t x = ((int64_t)b * NH + h) * T + q;
            sL[s * BQ + i] = q < T ? L2g[x] : INFINITY;
            sD[s * BQ + i] = q < T ? Dg[x] : 0.f;
        }
        us__mb_arrive(full + s); /* release: the stores above are visible to the waiters */
    }
}

/* Where 1/sqrt(HS) goes in the backward. Under bf16, dS is rounded to 16 bits unscaled and dK and
   dQ take the scale once, at their store: one FMUL a score fewer (HS 128: the backward 3-4 %
   faster), nothing new can overflow (bf16 has fp32's range), and at HS 64 (2^-3) the bits are
   the same. Under fp16, dS is scaled before it is rounded: unscaled, it could pass 65504 where
   the fp32 reference does not (a loss scale of 2^16 and a large dP). Context parallelism's block
   dK/dV kernel scales dS under bf16 too (its dK added as it is): unscaled, ptxas spilled 80
   instructions' worth at HS 64 instead of 24 (not timed). Each kernel passes the factor its dS
   takes (dsc) to the shared tile math. */
template <typename E>
static __device__ __forceinline__ float us__hop_ds_scale(float scale) {
    return us__is_half<E>::value ? scale : 1.f;
}

/* ... and the factor dK and dQ take at their store */
template <typename E>
static __device__ __forceinline__ float us__hop_dkq_scale(float scale) {
    return us__is_half<E>::value ? 1.f : scale;
}

/* dK (times us__hop_dkq_scale) and dV of the thread's keys key0 and key0 + 8 into dqkv
   [B][T][QKV] (kv head g) */
template <typename E, int HS, bool DK, bool DV>
static __device__ __forceinline__ void
us__hop_dkv_store(const float (&dk)[DK ? HS / 8 : 1][4], const float (&dv)[DV ? HS / 8 : 1][4],
                  E *dqkv, int key0, int b, int g, int T, int NH, int NKV, float scale, int lane) {
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS;
    const float ks = us__hop_dkq_scale<E>(scale);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + r * 8;
        if (key >= T) continue;
        E *row = dqkv + ((int64_t)b * T + key) * QKV + 2 * (lane & 3);
        E *dkr = row + (int64_t)(NH + g) * HS, *dvr = row + (int64_t)(NH + NKV + g) * HS;
#pragma unroll
        for (int i = 0; i < HS / 8; i++) {
            if constexpr (DK)
                *reinterpret_cast<uint32_t *>(dkr + i * 8) =
                    us__hop_pack<E>(dk[i][2 * r] * ks, dk[i][2 * r + 1] * ks);
            if constexpr (DV)
                *reinterpret_cast<uint32_t *>(dvr + i * 8) =
                    us__hop_pack<E>(dv[i][2 * r], dv[i][2 * r + 1]);
        }
    }
}

/* The dQ kernel's copy thread for one query tile: its Q and dO (columns qcol) into buffer
   rg.j mod QNQ once the consumers are done with the tile that buffer held, then K and V (columns
   kcol, vcol) of the key tiles of the walk ks (Keys, by position a tile ahead: us__hop_kcursor)
   through the ring (us__hop_ring) */
template <int HS, typename Keys>
static __device__ __forceinline__ void
us__hop_dq_produce(const us__hop_dq_smem<HS> &sm, const CUtensorMap *mq, const CUtensorMap *mdo,
                   const CUtensorMap *mkv, const Keys &ks, int qcol, int kcol, int vcol, int b,
                   int q0, const us__hop_ring &rg = us__hop_ring()) {
    using C = us__hop_cfg<HS>;
    constexpr int BR = 64 * C::NWG, BK = C::BKQ, S = C::QS, QN = C::QNQ;
    constexpr int QB = us__hop_dq_smem<HS>::QB, KB = us__hop_dq_smem<HS>::KB;
    const int qi = rg.j % QN;
    unsigned char *q = sm.sQ + qi * us__hop_dq_smem<HS>::QSTEP;
    if (rg.j >= QN) us__mb_wait(sm.emptyQ + qi, ((rg.j / QN) - 1) & 1);
    us__mb_expect(sm.barQ + qi, 2 * QB);
    us__tma_tile<HS, BR>(q, mq, qcol, q0, b, sm.barQ + qi);
    us__tma_tile<HS, BR>(q + QB, mdo, qcol, q0, b, sm.barQ + qi);
    us__hop_kcursor<Keys> w(ks);
    for (int it = 0; it < ks.n; it++) {
        const int r = rg.base + it, s = r % S;
        w.ahead();
        if (r >= S) us__mb_wait(sm.empty + s, ((r / S) - 1) & 1);
        ks.post(sm.kts, s, w.k);
        us__mb_expect(sm.full + s, 2 * KB);
        us__tma_tile<HS, BK>(sm.sK + s * KB, mkv, kcol, w.kt * BK, b, sm.full + s);
        us__tma_tile<HS, BK>(sm.sV + s * KB, mkv, vcol, w.kt * BK, b, sm.full + s);
        w.step(it + 1 < ks.n);
    }
}

/* A fragments (us__wg_rs) of k-step kk of rows r0 + 16w .. r0 + 16w + 15 of a K-major tile of
   ROWS rows (w: the thread's warp in its warpgroup), what us__wg_kmaj describes in shared memory.
   ldmatrix's lane l names row l%8 + 8·((l/8)%2), 16-byte chunk 2·(kk%4) + l/16 of column block
   kk/4, placed by the 128-byte swizzle; its four 8×8 matrices land as the m16n8k16 A fragment */
template <int ROWS>
static __device__ __forceinline__ void us__hop_lda(uint32_t (&a)[4], const unsigned char *tile,
                                                   int r0, int kk, int warp, int lane) {
    const int r = r0 + 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int ch = 2 * (kk & 3) + (lane >> 4);
    us__ldsm_x4(a, tile + (kk >> 2) * ROWS * 128 + us__sw128(r, ch));
}

/* Sᵀ = K·Qᵀ and (DK) dPᵀ = V·dOᵀ of consumer c's 64 keys (rows 64c.. of sK [BK][HSP] and
   sV) against a stage's BQ queries (tQ, tdO [BQ][HSP]), one committed batch. The first KRK
   k-steps of K come from registers (kf [KRK][4], us__hop_lda), the first KRV of V too (vf); the
   rest from shared memory */
template <typename E, int HS, int BK, int BQ, bool DK, int KRK = 0, int KRV = 0>
static __device__ __forceinline__ void
us__hop_sdp(float (&st)[BQ / 8][4], float (&dpt)[DK ? BQ / 8 : 1][4], const unsigned char *sK,
            const unsigned char *sV, const unsigned char *tQ, const unsigned char *tdO, int c,
            const uint32_t (*kf)[4] = nullptr, const uint32_t (*vf)[4] = nullptr) {
    us__wg_fence();
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        const uint64_t q = us__wg_kmaj<BQ>(tQ, 0, kk);
        if (kk < KRK)
            us__wg_rs<BQ, E, 0>(&st[0][0], kf[kk], q, kk > 0);
        else
            us__wg_ss<BQ, E, 0>(&st[0][0], us__wg_kmaj<BK>(sK, 64 * c, kk), q, kk > 0);
        if constexpr (DK) {
            const uint64_t o = us__wg_kmaj<BQ>(tdO, 0, kk);
            if (kk < KRV)
                us__wg_rs<BQ, E, 0>(&dpt[0][0], vf[kk], o, kk > 0);
            else
                us__wg_ss<BQ, E, 0>(&dpt[0][0], us__wg_kmaj<BK>(sV, 64 * c, kk), o, kk > 0);
        }
    }
    us__wg_commit();
}

/* two adjacent floats of shared memory (8-byte aligned): LDS.64, where the pointer the compiler
   cannot place in shared memory gave a generic load */
static __device__ __forceinline__ float2 us__hop_lds2(const float *p) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(us__smem_u32(p)));
    return v;
}

/* Pᵀ = exp2(Sᵀ·sl2 − L2[q]) (0 where masked(j, e), checked only when diag), dSᵀ = Pᵀ ∘ (dPᵀ −
   D[q]) · dsc (1/sqrt(HS) or 1: us__hop_ds_scale), both rounded into the A fragments of dV += Pᵀ·dO
   (pa) and dK += dSᵀ·Q (da). tL, tD [BQ]: the stage's L2 and D. masked(j, e): whether the
   thread's key 8·(e/2) (of its two) is hidden from query j·8 + 2·(lane%4) + e%2 of the tile
   (causal: key > query; the block kernels: by position). One k-step (16 queries) at a time,
   packed at once, so that S and dP die as they are used. */
template <typename E, int BQ, bool DK, bool DV, typename Mask>
static __device__ __forceinline__ void
us__hop_pds(uint32_t (&pa)[DV ? BQ / 16 : 1][4], uint32_t (&da)[DK ? BQ / 16 : 1][4],
            float (&st)[BQ / 8][4], float (&dpt)[DK ? BQ / 8 : 1][4], const float *tL,
            const float *tD, bool diag, Mask masked, int lane, float dsc, float sl2) {
#pragma unroll
    for (int t = 0; t < BQ / 16; t++) {
#pragma unroll
        for (int j = 2 * t; j < 2 * t + 2; j++) {
            const int qp = j * 8 + 2 * (lane & 3); /* the thread's query pair qp, qp + 1 */
            const float2 L = us__hop_lds2(tL + qp);
            const float2 Dq = DK ? us__hop_lds2(tD + qp) : make_float2(0.f, 0.f);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = us__hop_exp2(st[j][e] * sl2 - ((e & 1) ? L.y : L.x));
                if (diag && masked(j, e)) p = 0.f;
                st[j][e] = p;
                if constexpr (DK) dpt[j][e] = p * (dpt[j][e] - ((e & 1) ? Dq.y : Dq.x)) * dsc;
            }
        }
        if constexpr (DV) us__hop_to_a<E, BQ>(pa[t], st, t);
        if constexpr (DK) us__hop_to_a<E, BQ>(da[t], dpt, t);
    }
}

/* dV += Pᵀ·dO and dK += dSᵀ·Q (A from registers, B = the stage's dO and Q read transposed), one
   committed batch */
template <typename E, int HS, int BQ, bool DK, bool DV>
static __device__ __forceinline__ void
us__hop_dkv_mma(float (&dk)[DK ? HS / 8 : 1][4], float (&dv)[DV ? HS / 8 : 1][4],
                const uint32_t (&pa)[DV ? BQ / 16 : 1][4],
                const uint32_t (&da)[DK ? BQ / 16 : 1][4], const unsigned char *tQ,
                const unsigned char *tdO) {
    us__wg_fence();
#pragma unroll
    for (int t = 0; t < BQ / 16; t++) {
        if constexpr (DV) us__wg_rs<HS, E, 1>(&dv[0][0], pa[t], us__wg_mnmaj<BQ>(tdO, t), 1);
        if constexpr (DK) us__wg_rs<HS, E, 1>(&dk[0][0], da[t], us__wg_mnmaj<BQ>(tQ, t), 1);
    }
    us__wg_commit();
}

/* a tile whose keys all come after its queries: P = 0, nothing to compute, but the consumer
   still takes its two turns at the tensor cores (us__hop_turn) */
template <int NWG>
static __device__ __forceinline__ void us__hop_turns_skip(int c, bool last) {
    us__hop_turn<NWG>(c);
    us__hop_turn_done<NWG>(c, false);
    us__hop_turn<NWG>(c);
    us__hop_turn_done<NWG>(c, last);
}

/* The backward with dS through memory (us_cuda_attention_no_hopper 7): the dK/dV kernel stores
   every tile's dSᵀ, already rounded for dK += dSᵀ·Q, and a second kernel forms dQ = dS·K from
   it (us__hop_dqs_kernel) instead of recomputing Sᵀ and dPᵀ: five GEMMs a tile, as the fused
   backward, with no fp32 adds, each dQ still summed in one fixed order.
   The store is the tile's A fragments as they sit in registers: per (batch, head, key block of
   128, query tile of BQ) a blob of BQ·256 bytes, [2 consumers][4 warps][BQ/16 k-steps][32
   lanes] of 16 bytes (one coalesced 512-byte store per warp and k-step, no shared memory).
   Key block kb sees query tiles r·kb.. nqt − 1 (r = 128 / BQ), and its blobs follow those of
   the blocks before it: the block starts at us__hop_ds_off(kb) = Σ_{k<kb} (nqt − r·k). The half
   of a blob whose 64 keys all follow the tile's queries is not written; the dQ kernel takes it
   as zero. */
static __host__ __device__ __forceinline__ int64_t us__hop_ds_off(int kb, int nqt, int r) {
    return (int64_t)kb * nqt - (int64_t)r * kb * (kb - 1) / 2;
}

/* where in a blob, in 16-byte units, k-step t (16 queries) of dK/dV consumer c's warp w (16
   keys) starts: 32 units, lane l's at l */
template <int BQ>
static __host__ __device__ __forceinline__ int us__hop_ds_part(int c, int w, int t) {
    return ((4 * c + w) * (BQ / 16) + t) * 32;
}

/* this thread's dSᵀ fragments (da: the A fragments of dK += dSᵀ·Q) into its place of a blob:
   k-step t of queries us__hop_ds_part(0, 0, t) on from dso */
template <int BQ>
static __device__ __forceinline__ void us__hop_ds_out(uint4 *dso,
                                                      const uint32_t (&da)[BQ / 16][4]) {
#pragma unroll
    for (int t = 0; t < BQ / 16; t++) /* streaming: not to evict the Q and dO that L2 holds */
        __stcs(dso + us__hop_ds_part<BQ>(0, 0, t),
               make_uint4(da[t][0], da[t][1], da[t][2], da[t][3]));
}

/* One query tile (stage s; last: no turn follows in this CTA) of a dK/dV consumer whose keys
   some query of it sees: Sᵀ, dPᵀ, then Pᵀ and dSᵀ (us__hop_pds, dS times dsc, hidden(j, e)
   masked where part of the tile is), then dV and dK; each of its two GEMM batches in this
   consumer's turn. BY_POS (context parallelism's block kernel, whose mask reads positions): a
   copy of the math with the mask and one without (us__hop_by_mode); by index (causal): one copy
   with no mask code, a diagonal tile's hidden scores set to −inf in a pass before it. SM: the
   kernel's us__hop_dkdv_smem (its K/V buffer; the block kernel's adds the queries' positions).
   kf, vf: the first KRK k-steps of the consumer's K and KRV of its V in registers (us__hop_sdp);
   dso: where this thread's dSᵀ goes (us__hop_ds_out), none when null */
template <typename E, int HS, bool DK, bool DV, bool BY_POS, int KRK, int KRV, typename SM,
          typename Mask>
static __device__ __forceinline__ void
us__hop_dkdv_tile(float (&dk)[DK ? HS / 8 : 1][4], float (&dv)[DV ? HS / 8 : 1][4], const SM &sm,
                  int s, bool part, Mask hidden, bool last, int c, int lane, float dsc, float sl2,
                  const uint32_t (*kf)[4] = nullptr, const uint32_t (*vf)[4] = nullptr,
                  uint4 *dso = nullptr) {
    using C = us__hop_cfg<HS>;
    constexpr int NWG = C::NWG, BK = 64 * NWG, BQ = C::BQ, QB = SM::QB;
    const unsigned char *tQ = sm.sQ + s * QB, *tdO = sm.sdO + s * QB;
    float st[BQ / 8][4], dpt[DK ? BQ / 8 : 1][4];
    uint32_t pa[DV ? BQ / 16 : 1][4], da[DK ? BQ / 16 : 1][4];
    us__hop_turn<NWG>(c);
    us__hop_sdp<E, HS, BK, BQ, DK, KRK, KRV>(st, dpt, sm.sK, sm.sV, tQ, tdO, c, kf, vf);
    us__hop_turn_done<NWG>(c, false);
    us__wg_wait<BQ / 2>(&st[0][0]);
    if constexpr (DK) us__wg_wait<BQ / 2>(&dpt[0][0]);
    if constexpr (BY_POS) {
        us__hop_by_mode(part, [&](bool need) {
            us__hop_pds<E, BQ, DK, DV>(pa, da, st, dpt, sm.sL + s * BQ, sm.sD + s * BQ, need,
                                       hidden, lane, dsc, sl2);
        });
    } else {
        /* by index: hidden scores set to -inf (exp2 gives P = 0, so dS = 0) in a pass of their
           own on a diagonal tile only, then one copy of the math with no mask code */
        if (part) {
#pragma unroll
            for (int j = 0; j < BQ / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (hidden(j, e)) st[j][e] = -INFINITY;
        }
        us__hop_pds<E, BQ, DK, DV>(pa, da, st, dpt, sm.sL + s * BQ, sm.sD + s * BQ, false, hidden,
                                   lane, dsc, sl2);
    }
    us__hop_turn<NWG>(c);
    us__hop_dkv_mma<E, HS, BQ, DK, DV>(dk, dv, pa, da, tQ, tdO);
    us__hop_turn_done<NWG>(c, last);
    if constexpr (DK)
        if (dso) us__hop_ds_out<BQ>(dso, da); /* while the GEMMs run */
    if constexpr (DV) us__wg_wait<HS / 2>(&dv[0][0]);
    if constexpr (DK) us__wg_wait<HS / 2>(&dk[0][0]);
}

/* dK, dV of the key blocks of 64·NWG keys, a persistent grid (one CTA per SM) walking them as
   the forward walks its query tiles (us__hop_snake, us__hop_kblock_of: heaviest first). PART 0
   computes both, 1 only dV, 2 only dK (HS > 128: two launches, one accumulator each). Consumer c
   owns keys k0 + 64c .. of a block; per query tile:
     Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·sl2 − L2[q]) (0 where key > query), dPᵀ = V·dOᵀ,
     dSᵀ = Pᵀ ∘ (dPᵀ − D[q]) / sqrt(HS), dV += Pᵀ·dO, dK += dSᵀ·Q
   (the scale under bf16 on dK at the store, under fp16 on dS before it is rounded:
   us__hop_ds_scale). The producer's warp 0 issues the copies, its warp 1 stages L2 and D of the
   tile's queries. The Q/dO ring runs on from one key block to the next, and K and V have KVN
   buffers: while the consumers write one block's dK and dV, the next block's K, V and first
   queries are already loading. A grid of one CTA per key block paid that start and end on every
   block: at multi-head attention, where a block sees a single head's queries, a real share.
   The key blocks of (batch, kv head) pairs p0 .. p0 + np − 1. DS: every tile's dSᵀ also into
   dsw, the chunk's pairs from its start (the backward with dS through memory, above). */
template <typename E, int HS, int PART, bool DS = false>
__global__ void __launch_bounds__(128 * (1 + us__hop_cfg<HS>::NWG), 1)
    us__hop_dkdv_kernel(const __grid_constant__ CUtensorMap mq,
                        const __grid_constant__ CUtensorMap mdo,
                        const __grid_constant__ CUtensorMap mkv, const float *__restrict__ L2g,
                        const float *__restrict__ Dg, E *__restrict__ dqkv, uint4 *__restrict__ dsw,
                        int p0, int np, int T, int NH, int NKV, int P, float scale, float sl2) {
#if US__HOP_DEV
    using C = us__hop_cfg<HS>;
    constexpr int NWG = C::NWG, BK = 64 * NWG, BQ = C::BQ, S = C::BS, KVN = C::KVN;
    constexpr int KRK = C::KRK, KRV = C::KRV;
    constexpr bool DV = PART != 2, DK = PART != 1;
    using SM = us__hop_dkdv_smem<HS, false, KVN>;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const SM sm(us__hop_smem_base(us__hop_raw));
    const int grp = NH / NKV, wg = us__hop_wg(), tid = threadIdx.x & 127;
    /* full: the copy thread and warp 1's lanes; K and V: KVN buffers, each with its emptyKV */
    us__hop_bars_init(sm.barKV, S, 1 + 32, 128 * NWG, KVN, sm.emptyKV);

    if (wg == 0) {
        us__hop_regs_producer<NWG>();
        const int warp = tid >> 5, lane = tid & 31;
        if (warp > 1 || (warp == 0 && lane != 0)) return;
        us__hop_kwalk<BK, BQ>(
            T, NKV, p0, np, grp, P, [&](const us__hop_kblock &kb, const us__hop_kstep &w) {
                const int kv = w.j % KVN;
                if (warp == 0)
                    us__hop_dkdv_produce<HS, false>(
                        sm.sK + kv * SM::KVSTEP, sm.sV + kv * SM::KVSTEP, sm.sQ, sm.sdO,
                        sm.barKV + kv, sm.full, sm.empty, &mq, &mdo, &mkv, kb.g, kb.b, kb.kb * BK,
                        w.qb0, grp, w.per, NH, NKV, w.base, sm.emptyKV + kv,
                        w.j >= KVN ? ((w.j / KVN) - 1) & 1 : -1);
                else
                    us__hop_dkdv_rows<HS, false>(sm.sL, sm.sD, sm.full, sm.empty, L2g, Dg, kb.g,
                                                 kb.b, w.qb0, grp, w.per, T, NH, lane, w.base);
            });
        return;
    }
    us__hop_regs_consumer<NWG>();
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    /* ping-pong (NWG 2): the consumers take turns issuing each of their two GEMM batches, so that
       one's exp2 and products meet the other's GEMMs; a skipped tile still takes its turns, and
       the turns run on over the CTA's key blocks */
    if (NWG == 2 && c == 1) us__hop_bar_arrive(1);
    us__hop_kwalk<BK, BQ>(
        T, NKV, p0, np, grp, P, [&](const us__hop_kblock &kb, const us__hop_kstep &w) {
            const int k0 = kb.kb * BK, nit = grp * w.per, kv = w.j % KVN;
            const int kc = k0 + 64 * c;                    /* this warpgroup's first key */
            const int key0 = kc + 16 * warp + (lane >> 2); /* the thread's keys: key0 + 8r */
            /* DS: this thread's place in the block's first blob (in 16-byte units), blobs a head */
            uint4 *dsk = nullptr;
            int64_t dsh = 0;
            if constexpr (DS) {
                const int nqt = (T + BQ - 1) / BQ;
                dsh = us__hop_ds_off((T + BK - 1) / BK, nqt, BK / BQ);
                const int64_t slot = ((int64_t)kb.b * NKV + kb.g - p0) * grp * dsh +
                                     us__hop_ds_off(kb.kb, nqt, BK / BQ);
                dsk = dsw + slot * BQ * 16 + us__hop_ds_part<BQ>(c, warp, 0) + lane;
            }
            SM smj = sm; /* this block's K/V buffer */
            smj.sK += kv * SM::KVSTEP;
            smj.sV += kv * SM::KVSTEP;
            float dk[DK ? HS / 8 : 1][4], dv[DV ? HS / 8 : 1][4];
            us__hop_zero(dk);
            us__hop_zero(dv);
            us__mb_wait(sm.barKV + kv, (w.j / KVN) & 1);
            uint32_t kf[KRK ? KRK : 1][4], vf[KRV ? KRV : 1][4]; /* K, V as A fragments */
#pragma unroll
            for (int kk = 0; kk < KRK; kk++)
                us__hop_lda<BK>(kf[kk], smj.sK, 64 * c, kk, warp, lane);
#pragma unroll
            for (int kk = 0; kk < KRV; kk++)
                us__hop_lda<BK>(vf[kk], smj.sV, 64 * c, kk, warp, lane);
            for (int it = 0; it < nit; it++) {
                const int r = w.base + it, s = r % S, q0 = (w.qb0 + it % w.per) * BQ;
                const bool last = it + 1 == nit && w.last;
                us__mb_wait(sm.full + s, (r / S) & 1);
                /* every key here after every query: P = 0 */
                if (!(kc <= q0 + BQ - 1 && kc < T)) {
                    us__hop_turns_skip<NWG>(c, last);
                } else {
                    /* masked (part) where some key of the warpgroup comes after some query */
                    const auto causal = [&](int j, int e) {
                        return key0 + (e >> 1) * 8 > q0 + j * 8 + 2 * (lane & 3) + (e & 1);
                    };
                    uint4 *dso = nullptr; /* DS: the blob of head it / per, tile it % per */
                    if constexpr (DS) dso = dsk + ((it / w.per) * dsh + it % w.per) * BQ * 16;
                    us__hop_dkdv_tile<E, HS, DK, DV, false, KRK, KRV>(
                        dk, dv, smj, s, kc + 63 > q0, causal, last, c, lane,
                        us__hop_ds_scale<E>(scale), sl2, kf, vf, dso);
                }
                us__mb_arrive(sm.empty + s);
            }
            us__mb_arrive(sm.emptyKV + kv); /* K and V of this block are read */
            us__hop_dkv_store<E, HS, DK, DV>(dk, dv, dqkv, key0, kb.b, kb.g, T, NH, NKV, scale,
                                             lane);
        });
#else
    (void)mq, (void)mdo, (void)mkv, (void)L2g, (void)Dg, (void)dqkv, (void)dsw, (void)p0, (void)np,
        (void)T, (void)NH, (void)NKV, (void)P, (void)scale, (void)sl2;
    __trap();
#endif
}

/* The pieces of one key tile (stage s) of a dQ consumer, against the queries and dO in buffer q
   (Q, then dO). us__hop_dq_sdp issues S = Q·Kᵀ and dP = dO·Vᵀ (not committed); us__hop_dq_ds
   forms dS = P ∘ (dP − D) with P = exp2(S·sl2 − L2) (0 where ks.masked, where part of the tile
   is; · scale under fp16, before rounding; under bf16 dQ takes it at the store:
   us__hop_ds_scale) as wgmma A fragments; us__hop_dq_gemm issues dQ += dS·K */
template <typename E, int HS>
static __device__ __forceinline__ void
us__hop_dq_sdp(float (&sc)[us__hop_cfg<HS>::BKQ / 8][4], float (&dp)[us__hop_cfg<HS>::BKQ / 8][4],
               const us__hop_dq_smem<HS> &sm, const unsigned char *q, int s, int c) {
    using C = us__hop_cfg<HS>;
    constexpr int BR = 64 * C::NWG, BK = C::BKQ, KB = us__hop_dq_smem<HS>::KB;
    const unsigned char *tK = sm.sK + s * KB, *tV = sm.sV + s * KB;
    const unsigned char *tQ = q, *tdO = q + us__hop_dq_smem<HS>::QB;
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        us__wg_ss<BK, E, 0>(&sc[0][0], us__wg_kmaj<BR>(tQ, 64 * c, kk), us__wg_kmaj<BK>(tK, 0, kk),
                            kk > 0);
        us__wg_ss<BK, E, 0>(&dp[0][0], us__wg_kmaj<BR>(tdO, 64 * c, kk), us__wg_kmaj<BK>(tV, 0, kk),
                            kk > 0);
    }
}

template <typename E, int HS, typename Keys, int BK = us__hop_cfg<HS>::BKQ>
static __device__ __forceinline__ void
us__hop_dq_ds(uint32_t (&da)[BK / 16][4], const float (&sc)[BK / 8][4], float (&dp)[BK / 8][4],
              const Keys &ks, const us__hop_kt &kt, const float (&L2)[2], const float (&Dr)[2],
              int lane, float scale, float sl2) {
    us__hop_by_mode(ks.part(kt), [&](bool need) {
#pragma unroll
        for (int j = 0; j < BK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = us__hop_exp2(sc[j][e] * sl2 - L2[e >> 1]);
                if (need && ks.masked(kt, j * 8 + 2 * (lane & 3) + (e & 1), e)) p = 0.f;
                dp[j][e] = p * (dp[j][e] - Dr[e >> 1]) * us__hop_ds_scale<E>(scale);
            }
    });
#pragma unroll
    for (int t = 0; t < BK / 16; t++) us__hop_to_a<E, BK>(da[t], dp, t);
}

template <typename E, int HS, int BK = us__hop_cfg<HS>::BKQ>
static __device__ __forceinline__ void us__hop_dq_gemm(float (&dq)[HS / 8][4],
                                                       const uint32_t (&da)[BK / 16][4],
                                                       const us__hop_dq_smem<HS> &sm, int s) {
    const unsigned char *tK = sm.sK + s * us__hop_dq_smem<HS>::KB;
#pragma unroll
    for (int t = 0; t < BK / 16; t++)
        us__wg_rs<HS, E, 1>(&dq[0][0], da[t], us__wg_mnmaj<BK>(tK, t), 1);
}

/* One turn of a dQ consumer at the tensor cores: the dQ GEMM of the tile in stage ps (DQG) and
   S and dP of the tile in stage s (SDP) in one batch, then their waits. Each combination is its
   own code: a wgmma issued on one side of a branch and not on the other made ptxas serialize
   them all (register moves inside the batch) */
template <typename E, int HS, bool DQG, bool SDP, int BK = us__hop_cfg<HS>::BKQ>
static __device__ __forceinline__ void
us__hop_dq_batch(float (&dq)[HS / 8][4], const uint32_t (&da)[BK / 16][4], int ps,
                 float (&sc)[BK / 8][4], float (&dp)[BK / 8][4], const us__hop_dq_smem<HS> &sm,
                 const unsigned char *q, int s, int c, bool last) {
    constexpr int NWG = us__hop_cfg<HS>::NWG;
    us__hop_turn<NWG>(c);
    if constexpr (DQG || SDP) {
        us__wg_fence();
        if constexpr (DQG) us__hop_dq_gemm<E, HS>(dq, da, sm, ps);
        if constexpr (SDP) us__hop_dq_sdp<E, HS>(sc, dp, sm, q, s, c);
        us__wg_commit();
    }
    us__hop_turn_done<NWG>(c, last);
    if constexpr (DQG) us__wg_wait<HS / 2>(&dq[0][0]);
    if constexpr (SDP) {
        us__wg_wait<BK / 2>(&sc[0][0]);
        us__wg_wait<BK / 2>(&dp[0][0]);
    }
}

/* One key tile kt (stage s) of a dQ consumer (Keys: the mask mode): S and dP, then dS, then
   dQ += dS·K, each of the two GEMM batches in this consumer's turn (last: no turn follows in
   this CTA) */
template <typename E, int HS, typename Keys>
static __device__ __forceinline__ void
us__hop_dq_tile(float (&dq)[HS / 8][4], const us__hop_dq_smem<HS> &sm, const unsigned char *q,
                int s, const Keys &ks, const us__hop_kt &kt, const float (&L2)[2],
                const float (&Dr)[2], bool last, int c, int lane, float scale, float sl2) {
    constexpr int BK = us__hop_cfg<HS>::BKQ;
    float sc[BK / 8][4], dp[BK / 8][4];
    uint32_t da[BK / 16][4];
    us__hop_dq_batch<E, HS, false, true>(dq, da, s, sc, dp, sm, q, s, c, false);
    us__hop_dq_ds<E, HS>(da, sc, dp, ks, kt, L2, Dr, lane, scale, sl2);
    us__hop_dq_batch<E, HS, true, false>(dq, da, s, sc, dp, sm, q, s, c, last);
}

/* L2 and D of the thread's rows row0, row0 + 8 of head h (past T: +inf and 0, so P = 0) */
static __device__ __forceinline__ void us__hop_dq_rows(float (&L2)[2], float (&Dr)[2],
                                                       const float *__restrict__ L2g,
                                                       const float *__restrict__ Dg, int row0,
                                                       int b, int h, int T, int NH) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        const int64_t i = ((int64_t)b * NH + h) * T + row;
        L2[r] = row < T ? L2g[i] : INFINITY;
        Dr[r] = row < T ? Dg[i] : 0.f;
    }
}

/* dQ (times us__hop_dkq_scale) of the thread's rows row0, row0 + 8 of head h into dqkv
   [B][T][QKV] */
template <typename E, int HS>
static __device__ __forceinline__ void us__hop_dq_store(const float (&dq)[HS / 8][4], E *dqkv,
                                                        int row0, int b, int h, int T, int64_t QKV,
                                                        float scale, int lane) {
    const float qs = us__hop_dkq_scale<E>(scale);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        if (row >= T) continue;
        E *dqr = dqkv + ((int64_t)b * T + row) * QKV + (int64_t)h * HS + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < HS / 8; i++)
            *reinterpret_cast<uint32_t *>(dqr + i * 8) =
                us__hop_pack<E>(dq[i][2 * r] * qs, dq[i][2 * r + 1] * qs);
    }
}

/* A dQ consumer over one query tile's key tiles in order (deterministic; Keys: the mask mode), a
   tile whose keys all follow its rows skipped; the ping-pong of the two consumers' GEMM batches,
   as in the dK/dV kernel, carried on over the CTA's query tiles (us__hop_ring).
   Where us__hop_cfg::DQD (HS 64), a tile's dQ GEMM waits for the next tile's turn and goes in one
   batch with that tile's S and dP: a consumer then takes one turn a tile, not two, and its
   exp2 and dS run while the other consumer's whole batch keeps the tensor cores busy. The K of
   the deferred tile stays in its stage until then (the ring has a stage more), and a last turn
   after the tile's keys issues the final one. The sums are the same, in the same order. */
template <typename E, int HS, typename Keys>
static __device__ __forceinline__ void
us__hop_dq_consume(float (&dq)[HS / 8][4], const us__hop_dq_smem<HS> &sm, const Keys &ks,
                   const float (&L2)[2], const float (&Dr)[2], int c, int lane, float scale,
                   float sl2, const us__hop_ring &rg = us__hop_ring()) {
    using C = us__hop_cfg<HS>;
    constexpr int NWG = C::NWG, S = C::QS, QN = C::QNQ, BK = C::BKQ;
    const int qi = rg.j % QN;
    const unsigned char *q = sm.sQ + qi * us__hop_dq_smem<HS>::QSTEP;
    us__mb_wait(sm.barQ + qi, (rg.j / QN) & 1);
    if (NWG == 2 && c == 1 && rg.j == 0) us__hop_bar_arrive(1);
    if constexpr (!C::DQD) {
        for (int it = 0; it < ks.n; it++) {
            const int r = rg.base + it, s = r % S;
            const bool last = it + 1 == ks.n && rg.last;
            us__mb_wait(sm.full + s, (r / S) & 1);
            const us__hop_kt kt = ks.posted(sm.kts, s, it);
            if (ks.skip(kt)) /* keys wholly after this warpgroup's queries */
                us__hop_turns_skip<NWG>(c, last);
            else
                us__hop_dq_tile<E, HS>(dq, sm, q, s, ks, kt, L2, Dr, last, c, lane, scale, sl2);
            us__mb_arrive(sm.empty + s);
        }
    } else {
        uint32_t da[BK / 16][4]; /* dS of the deferred tile, in stage ps (−1: none) */
        int ps = -1, t = Keys::POSTED ? 0 : ks.first();
        for (int it = 0; it <= ks.n; it++) {
            const int r = rg.base + it, s = r % S;
            const bool keys = it < ks.n, last = !keys && rg.last;
            /* a posted tile is read once its stage is full; the causal one is known before, and
               its test and wait stay in the order of the kernel measured (the same PTX) */
            if (keys && Keys::POSTED) us__mb_wait(sm.full + s, (r / S) & 1);
            const us__hop_kt kt = keys ? ks.posted(sm.kts, s, t) : us__hop_kt{};
            const bool run = keys && !ks.skip(kt);
            if (keys && !Keys::POSTED) us__mb_wait(sm.full + s, (r / S) & 1);
            float sc[BK / 8][4], dp[BK / 8][4];
            if (ps >= 0 && run)
                us__hop_dq_batch<E, HS, true, true>(dq, da, ps, sc, dp, sm, q, s, c, last);
            else if (ps >= 0)
                us__hop_dq_batch<E, HS, true, false>(dq, da, ps, sc, dp, sm, q, s, c, last);
            else if (run)
                us__hop_dq_batch<E, HS, false, true>(dq, da, ps, sc, dp, sm, q, s, c, last);
            else
                us__hop_dq_batch<E, HS, false, false>(dq, da, ps, sc, dp, sm, q, s, c, last);
            if (ps >= 0) us__mb_arrive(sm.empty + ps);
            ps = -1;
            if (run) {
                us__hop_dq_ds<E, HS>(da, sc, dp, ks, kt, L2, Dr, lane, scale, sl2);
                ps = s;
            } else if (keys) {
                us__mb_arrive(sm.empty + s);
            }
            if (!Keys::POSTED && keys) t = ks.next(t);
        }
    }
    us__mb_arrive(sm.emptyQ + qi); /* Q and dO of this tile are read */
}

/* dQ, a persistent grid over the tiles of 64·NWG queries of every (head, batch), in the
   forward's order (us__hop_snake, us__hop_qtile_of), its rings carried on from one tile to the
   next. For each tile, key tiles 0.. up to the diagonal in order (deterministic); consumer c owns
   queries q0 + 64c ..; per key tile of BKQ keys:
     S = Q·Kᵀ, dP = dO·Vᵀ, P = exp2(S·sl2 − L2) (0 where key > query),
     dS = P ∘ (dP − D) / sqrt(HS), dQ += dS·K (us__hop_dq_consume, causal) */
template <typename E, int HS>
__global__ void __launch_bounds__(128 * (1 + us__hop_cfg<HS>::NWG), 1)
    us__hop_dq_kernel(const __grid_constant__ CUtensorMap mq,
                      const __grid_constant__ CUtensorMap mdo,
                      const __grid_constant__ CUtensorMap mkv, const float *__restrict__ L2g,
                      const float *__restrict__ Dg, E *__restrict__ dqkv, int B, int T, int NH,
                      int NKV, int P, float scale, float sl2) {
#if US__HOP_DEV
    using C = us__hop_cfg<HS>;
    constexpr int NWG = C::NWG, BR = 64 * NWG, BK = C::BKQ;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const us__hop_dq_smem<HS> sm(us__hop_smem_base(us__hop_raw));
    const int nqb = (T + BR - 1) / BR, U = nqb * NH * B, G = gridDim.x;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS;
    const int wg = us__hop_wg(), tid = threadIdx.x & 127;
    sm.init(128 * NWG);

    if (wg == 0) {
        us__hop_regs_producer<NWG>();
        if (tid != 0) return;
        us__hop_walk<BR, BK>(
            nqb, U, G, B, T, NH, NKV, P,
            [&](const us__hop_qtile &q, us__hop_causal<BK> &ks, const us__hop_ring &rg) {
                us__hop_dq_produce<HS>(sm, &mq, &mdo, &mkv, ks, q.h * HS, (NH + q.g) * HS,
                                       (NH + NKV + q.g) * HS, q.b, q.q0, rg);
            });
        return;
    }
    us__hop_regs_consumer<NWG>();
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    us__hop_walk<BR, BK>(
        nqb, U, G, B, T, NH, NKV, P,
        [&](const us__hop_qtile &q, us__hop_causal<BK> &ks, const us__hop_ring &rg) {
            ks.r0 = q.q0 + 64 * c;
            ks.nc = ks.r0 < T ? (min(ks.r0 + 64, T) - 1) / BK + 1 : 0;
            ks.row0 = ks.r0 + 16 * warp + (lane >> 2); /* the thread's rows: row0 + 8r */
            float L2[2], Dr[2], dq[HS / 8][4];
            us__hop_dq_rows(L2, Dr, L2g, Dg, ks.row0, q.b, q.h, T, NH);
            us__hop_zero(dq);
            us__hop_dq_consume<E, HS>(dq, sm, ks, L2, Dr, c, lane, scale, sl2, rg);
            us__hop_dq_store<E, HS>(dq, dqkv, ks.row0, q.b, q.h, T, QKV, scale, lane);
        });
#else
    (void)mq, (void)mdo, (void)mkv, (void)L2g, (void)Dg, (void)dqkv, (void)B, (void)T, (void)NH,
        (void)NKV, (void)scale, (void)sl2;
    __trap();
#endif
}

/* bytes (a multiple of 16) from global memory into shared memory by the copy engine, counted on
   bar as the tensor copies are; read once, so first out of L2 */
static __device__ __forceinline__ void us__bulk_load(void *dst, const void *src, uint32_t bytes,
                                                     uint64_t *bar) {
#if US__HOP_DEV
    asm volatile("{\n.reg .b64 pol;\n"
                 "createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], pol;\n}\n" ::"r"(us__smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(us__smem_u32(bar))
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}

/* an 8×8 matrix of 16-bit elements held as a fragment (lane l: row l/4, columns 2(l%4) and
   2(l%4)+1), transposed across the warp into the same layout */
static __device__ __forceinline__ uint32_t us__movt(uint32_t x) {
#if US__HOP_DEV
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
#else
    return x;
#endif
}

/* The dQ-from-dS kernels' shared memory (us__hop_dqs_kernel, us__hop_block_dqs_kernel): per
   stage [DQS] K [128][HSP], then the blobs of 128 queries × 128 keys (DB bytes); barriers
   [full DQS][empty DQS] (the copy thread's arrival; the consumers' 256) */
template <int HS>
struct us__hop_dqs_smem {
    static constexpr int S = us__hop_cfg<HS>::DQS, KB = 128 * us__hop_cfg<HS>::HSP * 2;
    static constexpr int DB = 128 * 128 * 2;
    unsigned char *sK, *sD;
    uint64_t *full, *empty;

    __device__ explicit us__hop_dqs_smem(unsigned char *base)
        : sK(base), sD(sK + S * KB), full((uint64_t *)(sD + S * DB)), empty(full + S) {}

    __device__ void init() const { us__hop_bars_init(full, S, 1, 256, 0); }

    /* the copy thread's load of the n-th key block into its stage: K of keys k0.. (columns
       kcol of the tensor map mk, batch b), then nb blobs of BQ·256 bytes from slot0 on */
    template <int BQ>
    __device__ void load(int n, const CUtensorMap *mk, int kcol, int k0, int b, const uint4 *ds,
                         int64_t slot0, int nb) const {
        const int s = n % S;
        if (n >= S) us__mb_wait(empty + s, ((n / S) - 1) & 1);
        us__mb_expect(full + s, KB + nb * BQ * 256);
        us__tma_tile<HS, 128>(sK + s * KB, mk, kcol, k0, b, full + s);
        for (int u = 0; u < nb; u++)
            us__bulk_load(sD + s * DB + u * BQ * 256, ds + (slot0 + u) * BQ * 16, BQ * 256,
                          full + s);
    }
};

/* where in a stage's blobs consumer c's thread finds its 16 bytes of key k-step 0: its query
   tile's blob (the second of two at BQ 64), k-step of queries (64c mod BQ)/16 + warp */
template <int BQ>
static __device__ __forceinline__ int us__hop_dqs_mine(int c, int warp, int lane) {
    constexpr int R = 128 / BQ;
    return (R == 2 ? c * BQ * 256 : 0) +
           16 * (us__hop_ds_part<BQ>(0, 0, (R == 2 ? 0 : 4 * c) + warp) + lane);
}

/* dQ += dS·K over one key block of 128 (a stage: K [128][HSP], the blobs) for a consumer's 64
   rows, whose 16 bytes of key k-step 0 are at d (key k-step kk: the dK/dV kernel's consumer
   kk/4, warp kk%4), each 8×8 part transposed by movmatrix (the stored fragments have keys as
   rows: parts 1 and 2 change places). Keys 0..63 count where lo, 64.. where hi, else they are
   taken as 0: a half the dK/dV kernel did not store, with no branch around a wgmma, which
   would make ptxas fence each one */
template <typename E, int HS, int BQ>
static __device__ __forceinline__ void us__hop_dqs_step(float (&dq)[HS / 8][4],
                                                        const unsigned char *d,
                                                        const unsigned char *sK, bool lo, bool hi) {
    uint32_t a[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const uint32_t keep = (kk < 4 ? lo : hi) ? 0xffffffffu : 0u;
        const uint4 v =
            *reinterpret_cast<const uint4 *>(d + 16 * us__hop_ds_part<BQ>(kk >> 2, kk & 3, 0));
        a[kk][0] = us__movt(v.x) & keep;
        a[kk][1] = us__movt(v.z) & keep;
        a[kk][2] = us__movt(v.y) & keep;
        a[kk][3] = us__movt(v.w) & keep;
    }
    us__wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        us__wg_rs<HS, E, 1>(&dq[0][0], a[kk], us__wg_mnmaj<128>(sK, kk), 1);
    us__wg_commit();
    us__wg_wait<HS / 2>(&dq[0][0]);
}

/* dQ = dS·K from the dS that the dK/dV kernel stored (DS, above) for the heads of (batch, kv
   head) pairs p0.. (blockIdx.y: the chunk's head, grp a pair): one CTA per (128 queries, head),
   the longest first; consumer c owns queries 64c.. and takes key blocks 0.. up to
   the diagonal in order (deterministic). Per block the copy thread loads K [128][HSP] (tensor
   map) and the blobs of the CTA's query tiles (one at BQ 128, two at BQ 64) by plain bulk
   copies into a ring of DQS stages; the consumers take each block by us__hop_dqs_step. One
   GEMM a tile where the dQ kernel runs three, reading 256 bytes of dS per query and key block:
   bound by memory. */
template <typename E, int HS>
__global__ void __launch_bounds__(384, 1)
    us__hop_dqs_kernel(const __grid_constant__ CUtensorMap mk, const uint4 *__restrict__ ds,
                       E *__restrict__ dqkv, int T, int NH, int NKV, int p0, float scale) {
#if US__HOP_DEV
    using SM = us__hop_dqs_smem<HS>;
    constexpr int BQ = us__hop_cfg<HS>::BQ, R = 128 / BQ, S = SM::S;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const SM sm(us__hop_smem_base(us__hop_raw));
    const int nkb = (T + 127) / 128, nqt = (T + BQ - 1) / BQ;
    const int grp = NH / NKV, pair = p0 + blockIdx.y / grp, b = pair / NKV, g = pair % NKV;
    const int i = nkb - 1 - blockIdx.x, h = g * grp + blockIdx.y % grp;
    const int64_t head = (int64_t)blockIdx.y * us__hop_ds_off(nkb, nqt, R); /* its blob 0 */
    const int wg = us__hop_wg(), tid = threadIdx.x & 127;
    sm.init();

    if (wg == 0) {
        if (tid != 0) return;
        const int nb = R == 2 && R * i + 1 < nqt ? 2 : 1; /* the CTA's query tiles */
        for (int kb = 0; kb <= i; kb++)
            sm.template load<BQ>(kb, &mk, (NH + g) * HS, kb * 128, b, ds,
                                 head + us__hop_ds_off(kb, nqt, R) + R * (i - kb), nb);
        return;
    }
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    const int r0 = 128 * i + 64 * c;      /* the warpgroup's first query */
    const int last = min(r0 + 63, T - 1); /* keys after it: dS 0, or not stored */
    const int mine = us__hop_dqs_mine<BQ>(c, warp, lane);
    float dq[HS / 8][4];
    us__hop_zero(dq);
    for (int kb = 0; kb <= i; kb++) {
        const int s = kb % S;
        us__mb_wait(sm.full + s, (kb / S) & 1);
        /* keys 64.. of the block: stored and seen by some query here, or taken as 0 */
        if (r0 < T)
            us__hop_dqs_step<E, HS, BQ>(dq, sm.sD + s * SM::DB + mine, sm.sK + s * SM::KB, true,
                                        kb * 128 + 64 <= last);
        us__mb_arrive(sm.empty + s);
    }
    if (r0 < T)
        us__hop_dq_store<E, HS>(dq, dqkv, r0 + 16 * warp + (lane >> 2), b, h, T,
                                (int64_t)(NH + 2 * NKV) * HS, scale, lane);
#else
    (void)mk, (void)ds, (void)dqkv, (void)T, (void)NH, (void)NKV, (void)p0, (void)scale;
    __trap();
#endif
}

/* ---- the fused backward: dQ inside the dK/dV kernel, summed in a fixed order ------------
   The two-kernel backward recomputes Sᵀ and dPᵀ for dQ: 7 GEMMs a tile where 5 do. Here the
   dK/dV kernel (HS ≤ 128, two consumers of 64 keys each) also forms dQ = dS·K of its 128 keys:
     1. each consumer writes its dSᵀ (64 keys × BQ queries, already rounded for dK) transposed
        into shared memory by stmatrix: dS [BQ][128 keys], keys contiguous, as TMA's swizzle;
     2. once both halves are there (named barrier 3), each consumer computes 64 × 64 of the
        tile's dQ (BQ 128, HS 64: rows 64c..; BQ 64: columns 64c..) reading dS and K from
        shared memory, and stages it as fp32 in wgmma's register order (16 KB);
     3. a writer warp of the producer (warp 2 + c) hands the 16 KB to the copy engine, which
        adds it into dQacc [B·NH][query tiles][2][4096] in global memory (cp.reduce.async.bulk).
   Many CTAs (key blocks) add into one dQ tile, and fp32 addition is not associative, so the
   order must be fixed for two runs to give the same bits: a counter per (tile, half) says how
   many key blocks have added; the writer of key block n waits for n (key block 0 stores instead
   of adding, so dQacc needs no zeroing). Waiting costs little because every CTA of a kv head
   visits the tiles in the same order, the last first (us__hop_bwd_next), and a lower key block
   starts earlier: it is ahead. CTAs take their block index from a ticket (an atomic counter), so
   a CTA only ever waits for CTAs that are already running — no deadlock whatever order the
   hardware starts blocks in. A last kernel rounds dQacc into dqkv's Q columns. */

/* bar.sync / bar.arrive on named barrier id for n threads (a multiple of 32) */
static __device__ __forceinline__ void us__hop_bar_sync_n(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

static __device__ __forceinline__ void us__hop_bar_arrive_n(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* generic-proxy writes to shared memory become visible to the async proxy (wgmma, the copy
   engine) */
static __device__ __forceinline__ void us__hop_fence_async(void) {
#if US__HOP_DEV
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* dSᵀ of consumer c's 64 keys (da: the A fragments of dK += dSᵀ·Q) into its column block of
   dS [BQ][128 keys] (blk: that block, [BQ][64 keys]). stmatrix .trans stores each 8×8 block of
   the fragments transposed: lane L gives the row address of query 16t + 8·(L/16) + L%8 in
   matrix L/8, whose 8 keys 16·warp + 8·(L/8 % 2) are one 16-byte chunk of the 128-byte row,
   placed by the 128-byte swizzle (chunk XOR row % 8) that the wgmma descriptors read. */
template <int BQ>
static __device__ __forceinline__ void
us__hop_ds_store(unsigned char *blk, const uint32_t (&da)[BQ / 16][4], int warp, int lane) {
#if US__HOP_DEV
    const int i = lane >> 3, j = lane & 7, chunk = 2 * warp + (i & 1);
#pragma unroll
    for (int t = 0; t < BQ / 16; t++) {
        const int q = 16 * t + 8 * (i >> 1) + j;
        const uint32_t a = us__smem_u32(blk + us__sw128(q, chunk));
        asm volatile(
            "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a),
            "r"(da[t][0]), "r"(da[t][1]), "r"(da[t][2]), "r"(da[t][3])
            : "memory");
    }
#else
    (void)blk, (void)da, (void)warp, (void)lane;
#endif
}

/* Consumer c's 64 × 64 of the tile's dQ = dS·K, from shared memory: dS [BQ][128 keys]
   (K-major) and K [128 keys][HSP] (read transposed: its head dimension is the N index).
   BQ 128 (HS 64): rows 64c.., every column; BQ 64: every row, columns 64c.. */
template <typename E, int BQ>
static __device__ __forceinline__ void us__hop_dq_mma(float (&dq)[8][4], const unsigned char *ds,
                                                      const unsigned char *sK, int c) {
    const unsigned char *kb = BQ == 128 ? sK : sK + c * 128 * 128;
    const int r0 = BQ == 128 ? 64 * c : 0;
    us__wg_fence();
#pragma unroll
    for (int t = 0; t < 128 / 16; t++)
        us__wg_ss<64, E, 1>(&dq[0][0], us__wg_kmaj<BQ>(ds, r0, t), us__wg_mnmaj<128>(kb, t), t > 0);
    us__wg_commit();
}

/* bulk copy (add = 0) or fp32 add (add = 1) of bytes from shared memory to global memory by the
   copy engine, then wait until it has landed */
static __device__ __forceinline__ void us__hop_bulk_out(float *dst, const float *src, int bytes,
                                                        int add) {
#if US__HOP_DEV
    if (add)
        asm volatile(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                dst),
            "r"(us__smem_u32(src)), "r"(bytes)
            : "memory");
    else
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
                     "r"(us__smem_u32(src)), "r"(bytes)
                     : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)add;
#endif
}

/* The writer warp of consumer c: per tile, once the consumer has staged its dQ part (barrier
   4 + c), wait until key blocks 0..n−1 have added theirs (counter == n), add (or, n = 0,
   store) it into dQacc, count it, and give the staging buffer back (barrier 6 + c) */
template <int HS>
static __device__ __forceinline__ void
us__hop_dq_writer(const float *sdq, float *dqacc, int *cnt, int c, int n, int g, int b, int qb0,
                  int grp, int per, int M, int NH, int lane) {
#if US__HOP_DEV
    int h, qb;
    us__hop_bwd_first<true>(g, grp, qb0, per, h, qb);
    for (int it = 0; it < grp * per; it++, us__hop_bwd_next<true>(g, grp, qb0, per, h, qb)) {
        const int64_t slot = (((int64_t)b * NH + h) * M + qb) * 2 + c; /* (tile, half) */
        us__hop_bar_sync_n(4 + c, 160);
        if (lane == 0) {
            int seen = -1;
            while (seen != n)
                asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n"
                             : "=r"(seen)
                             : "l"(cnt + slot)
                             : "memory");
            asm volatile("fence.proxy.async;\n" ::: "memory");
            us__hop_bulk_out(dqacc + slot * 4096, sdq, 4096 * 4, n > 0);
            asm volatile("fence.proxy.async;\n" ::: "memory");
            asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(cnt + slot) : "memory");
        }
        __syncwarp();
        if (it + 1 < grp * per) us__hop_bar_arrive_n(6 + c, 160);
    }
#else
    (void)sdq, (void)dqacc, (void)cnt, (void)c, (void)n, (void)g, (void)b, (void)qb0, (void)grp,
        (void)per, (void)M, (void)NH, (void)lane;
#endif
}

/* consumer c's dQ part [8][4] per thread, times qs (us__hop_dkq_scale), into its staging buffer
   [8][128 threads] of float4: thread-major, so the 128 threads' stores are one contiguous 2 KB
   row each */
static __device__ __forceinline__ void us__hop_dq_stage(float *sdq, const float (&dq)[8][4],
                                                        float qs, int tid) {
#pragma unroll
    for (int j = 0; j < 8; j++)
        reinterpret_cast<float4 *>(sdq)[j * 128 + tid] =
            make_float4(dq[j][0] * qs, dq[j][1] * qs, dq[j][2] * qs, dq[j][3] * qs);
}

/* One tile of a fused-backward consumer: Sᵀ, dPᵀ (skipped, but its turns taken, when all its
   keys follow all the tile's queries), Pᵀ, dSᵀ into shared memory, dV and dK, then — once both
   consumers' dSᵀ are there — its part of the tile's dQ, staged for the writer warp */
template <typename E, int HS>
static __device__ __forceinline__ void
us__hop_fused_tile(float (&dk)[HS / 8][4], float (&dv)[HS / 8][4], const unsigned char *sK,
                   const unsigned char *sV, const unsigned char *tQ, const unsigned char *tdO,
                   const float *tL, const float *tD, unsigned char *sdS, float *sdq, bool live,
                   bool last, bool first, int c, int kc, int q0, int key0, int tid, float scale,
                   float sl2) {
    constexpr int BQ = us__hop_cfg<HS>::BQ;
    const int warp = tid >> 5, lane = tid & 31;
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
    float dq[8][4];
    if (live) {
        float st[BQ / 8][4], dpt[BQ / 8][4];
        us__hop_turn<2>(c);
        us__hop_sdp<E, HS, 128, BQ, true>(st, dpt, sK, sV, tQ, tdO, c);
        us__hop_turn_done<2>(c, false);
        us__wg_wait<BQ / 2>(&st[0][0]);
        us__wg_wait<BQ / 2>(&dpt[0][0]);
        const auto causal = [&](int j, int e) {
            return key0 + (e >> 1) * 8 > q0 + j * 8 + 2 * (lane & 3) + (e & 1);
        };
        us__hop_pds<E, BQ, true, true>(pa, da, st, dpt, tL, tD, kc + 63 > q0, causal, lane,
                                       us__hop_ds_scale<E>(scale), sl2);
    } else {
#pragma unroll
        for (int t = 0; t < BQ / 16; t++) da[t][0] = da[t][1] = da[t][2] = da[t][3] = 0u;
        us__hop_turn<2>(c);
        us__hop_turn_done<2>(c, false);
    }
    us__hop_ds_store<BQ>(sdS + c * BQ * 128, da, warp, lane);
    us__hop_fence_async();
    us__hop_turn<2>(c);
    if (live) us__hop_dkv_mma<E, HS, BQ, true, true>(dk, dv, pa, da, tQ, tdO);
    us__hop_turn_done<2>(c, last);
    us__hop_bar_sync(3); /* both halves of dSᵀ are in shared memory */
    us__hop_dq_mma<E, BQ>(dq, sdS, sK, c);
    us__wg_wait<HS / 2>(&dv[0][0]);
    us__wg_wait<HS / 2>(&dk[0][0]);
    us__wg_wait<32>(&dq[0][0]);
    if (!first) us__hop_bar_sync_n(6 + c, 160); /* the writer has sent the last part */
    us__hop_dq_stage(sdq, dq, us__hop_dkq_scale<E>(scale), tid);
    us__hop_fence_async();
    us__hop_bar_arrive_n(4 + c, 160);
}

/* The fused backward: dK, dV of 128 keys of kv head g, and their share of dQ (above). The block
   index comes from a ticket (cnt[0]); the counters follow it. */
template <typename E, int HS>
__global__ void __launch_bounds__(384, 1)
    us__hop_bwd_fused_kernel(const __grid_constant__ CUtensorMap mq,
                             const __grid_constant__ CUtensorMap mdo,
                             const __grid_constant__ CUtensorMap mkv, const float *__restrict__ L2g,
                             const float *__restrict__ Dg, E *__restrict__ dqkv,
                             float *__restrict__ dqacc, int *cnt, int T, int B, int NH, int NKV,
                             float scale, float sl2) {
#if US__HOP_DEV
    using C = us__hop_cfg<HS>;
    constexpr int BK = 128, BQ = C::BQ, S = C::BS;
    constexpr int KB = BK * C::HSP * 2, QB = BQ * C::HSP * 2;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    unsigned char *sK = us__hop_smem_base(us__hop_raw); /* [BK][HSP] */
    unsigned char *sV = sK + KB;                        /* [BK][HSP] */
    unsigned char *sQ = sV + KB;                        /* [S][BQ][HSP] */
    unsigned char *sdO = sQ + S * QB;                   /* [S][BQ][HSP] */
    unsigned char *sdS = sdO + S * QB;                  /* [2][BQ][128] */
    float *sdq = (float *)(sdS + 2 * BQ * 128 * 2);     /* [2 consumers][4096] */
    float *sL = sdq + 2 * 4096;                         /* [S][BQ] */
    float *sD = sL + S * BQ;                            /* [S][BQ] */
    uint64_t *barKV = (uint64_t *)(sD + S * BQ), *full = barKV + 1, *empty = full + S;
    int *ticket = (int *)(barKV + 31);
    if (threadIdx.x == 0) *ticket = atomicAdd(cnt, 1);
    us__hop_bars_init(barKV, S, 1 + 32, 256); /* full: the copy thread and warp 1's lanes */
    const int grp = NH / NKV, M = (T + BQ - 1) / BQ;
    const int wg = us__hop_wg(), tid = threadIdx.x & 127;
    int *counters = cnt + 1;
    /* the block's kv head g, batch b and key block n, read from the ticket by each role after its
       setmaxnreg: held across the producer's cut to 24 registers, they would spill */
    const auto where = [&](int &g, int &b, int &n) {
        const int blk = *(volatile int *)ticket;
        g = blk % NKV;
        b = blk / NKV % B;
        n = blk / (NKV * B);
    };

    if (wg == 0) {
        us__hop_regs_producer<2, true>();
        const int warp = tid >> 5, lane = tid & 31;
        int g, b, n;
        where(g, b, n);
        const int qb0 = n * BK / BQ, per = M - qb0;
        if (warp == 0 && lane == 0)
            us__hop_dkdv_produce<HS, true>(sK, sV, sQ, sdO, barKV, full, empty, &mq, &mdo, &mkv, g,
                                           b, n * BK, qb0, grp, per, NH, NKV);
        else if (warp == 1)
            us__hop_dkdv_rows<HS, true>(sL, sD, full, empty, L2g, Dg, g, b, qb0, grp, per, T, NH,
                                        lane);
        else if (warp >= 2)
            us__hop_dq_writer<HS>(sdq + (warp - 2) * 4096, dqacc, counters, warp - 2, n, g, b, qb0,
                                  grp, per, M, NH, lane);
        return;
    }
    us__hop_regs_consumer<2, true>();
    int g, b, n;
    where(g, b, n);
    const int k0 = n * BK, qb0 = k0 / BQ, per = M - qb0, nit = grp * per;
    const int c = wg - 1, lane = tid & 31;
    const int kc = k0 + 64 * c;                          /* this warpgroup's first key */
    const int key0 = kc + 16 * (tid >> 5) + (lane >> 2); /* the thread's keys: key0 + 8r */
    float dk[HS / 8][4], dv[HS / 8][4];
    us__hop_zero(dk);
    us__hop_zero(dv);
    us__mb_wait(barKV, 0);
    if (c == 1) us__hop_bar_arrive(1); /* consumer 0 takes the tensor cores first */
    int h, qb;
    us__hop_bwd_first<true>(g, grp, qb0, per, h, qb);
    for (int it = 0; it < nit; it++, us__hop_bwd_next<true>(g, grp, qb0, per, h, qb)) {
        const int s = it % S, ph = (it / S) & 1, q0 = qb * BQ;
        us__mb_wait(full + s, ph);
        us__hop_fused_tile<E, HS>(dk, dv, sK, sV, sQ + s * QB, sdO + s * QB, sL + s * BQ,
                                  sD + s * BQ, sdS + (it & 1) * BQ * 128 * 2, sdq + c * 4096,
                                  kc <= q0 + BQ - 1 && kc < T, it + 1 == nit, it == 0, c, kc, q0,
                                  key0, tid, scale, sl2);
        us__mb_arrive(empty + s);
    }
    us__hop_dkv_store<E, HS, true, true>(dk, dv, dqkv, key0, b, g, T, NH, NKV, scale, lane);
#else
    (void)mq, (void)mdo, (void)mkv, (void)L2g, (void)Dg, (void)dqkv, (void)dqacc, (void)cnt,
        (void)T, (void)B, (void)NH, (void)NKV, (void)scale, (void)sl2;
    __trap();
#endif
}

/* dQacc [B·NH][M tiles][2 halves][8][128 threads][4] (the fused backward's fp32 dQ, in wgmma's
   register order) rounded into dqkv's Q columns [B][T][QKV]; one thread per float4: rows r and
   r + 8, two adjacent columns each. BQ 128: the halves are rows 64c..; BQ 64: columns 64c.. */
template <typename E>
__global__ void __launch_bounds__(256)
    us__hop_dq_convert(E *__restrict__ dqkv, const float4 *__restrict__ acc, int64_t n4, int T,
                       int NH, int HS, int64_t QKV, int BQ, int M) {
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n4) return;
    const int tid = (int)(i & 127), j = (int)(i >> 7) & 7, c = (int)(i >> 10) & 1;
    const int64_t tile = i >> 11, bh = tile / M;
    const int m = (int)(tile % M), h = (int)(bh % NH);
    const int64_t b = bh / NH;
    const int lane = tid & 31, rl = 16 * (tid >> 5) + (lane >> 2), cl = 8 * j + 2 * (lane & 3);
    const int row = m * BQ + (BQ == 128 ? 64 * c : 0) + rl, col = (BQ == 128 ? 0 : 64 * c) + cl;
    const float4 v = acc[i];
    if (col >= HS) return;
    if (row < T)
        *reinterpret_cast<uint32_t *>(dqkv + ((b * T + row) * QKV + (int64_t)h * HS + col)) =
            us__hop_pack<E>(v.x, v.y);
    if (row + 8 < T)
        *reinterpret_cast<uint32_t *>(dqkv + ((b * T + row + 8) * QKV + (int64_t)h * HS + col)) =
            us__hop_pack<E>(v.z, v.w);
}

/* ---- host side ----------------------------------------------------------------------- */
/* cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda) */
static PFN_cuTensorMapEncodeTiled_v12000 us__hop_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    static int tried = 0;
    if (!tried) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        tried = 1;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

/* a [B][T][W] tensor of 16-bit elements read in boxes of {64 columns, rows}: rows past T come
   back as zeros, columns past W too */
static int us__hop_map(CUtensorMap *map, const void *base, us_dtype dt, int64_t W, int64_t T,
                       int64_t B, int rows) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = us__hop_encoder();
    cuuint64_t dims[3] = {(cuuint64_t)W, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[2] = {(cuuint64_t)W * 2, (cuuint64_t)(W * T) * 2};
    cuuint32_t box[3] = {64, (cuuint32_t)rows, 1}, step[3] = {1, 1, 1};
    if (!enc) return 0;
    return enc(map,
               dt == US_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
               (void *)base, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Whether this binary holds the sm_90a kernels (an nvcc pass with compute_90a): the probe writes
   1 only there. Asked once per process, on the current device. */
__global__ void us__hop_probe_kernel(int *flag) {
#if US__HOP_DEV
    *flag = 1;
#else
    *flag = 0;
#endif
}

static int us__hop_compiled(void) {
    static int known = -1;
    if (known < 0) {
        int *d = NULL, h = 0;
        known = 0;
        if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
            us__hop_probe_kernel<<<1, 1>>>(d);
            if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess)
                known = h == 1;
            cudaFree(d);
        }
        /* a binary without any code for this GPU: the probe fails, no Hopper path */
        cudaGetLastError();
    }
    return known;
}

/* a persistent grid over the query tiles of BR rows: ctas CTAs, fewer when there are fewer tiles */
static int us__hop_grid(int T, int BR, int NH, int B, int ctas) {
    const int64_t tiles = (int64_t)((T + BR - 1) / BR) * NH * B;
    return tiles < ctas ? (int)tiles : ctas;
}

/* the persistent forward on ctas CTAs (us__hop_grid) */
template <typename E, int HS>
static void us__hop_fwd_hs(const CUtensorMap &mq, const CUtensorMap &mkv, void *out, float *lse,
                           int B, int T, int NH, int NKV, int P, int ctas, cudaStream_t st) {
    const size_t smem = us__hop_smem(us__hop_cfg<HS>::fwd_bytes);
    cudaFuncSetAttribute(us__hop_fwd_kernel<E, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)smem);
    const int grid = us__hop_grid(T, 64 * us__hop_cfg<HS>::NWF, NH, B, ctas);
    us__hop_fwd_kernel<E, HS><<<grid, 128 * (1 + us__hop_cfg<HS>::NWF), smem, st>>>(
        mq, mkv, (E *)out, lse, B, T, NH, NKV, P, us__attn_sl2(HS));
}

/* the fused backward: the counters zeroed, the kernel, then dQacc rounded into dqkv.
   cnt: [1 + B·NH·M·2] ints (the ticket, then one counter per dQ tile half); dqacc: [B·NH·M·2·4096]
   fp32 */
template <typename E, int HS>
static void us__hop_bwd_fused(const CUtensorMap *maps, const float *L2, const float *D, void *dqkv,
                              float *dqacc, int *cnt, int B, int T, int NH, int NKV,
                              cudaStream_t st) {
    using C = us__hop_cfg<HS>;
    if constexpr (C::FUSED) {
        const float scale = us__attn_scale(HS), sl2 = us__attn_sl2(HS);
        const size_t smem = us__hop_smem(C::fused_bytes);
        const int M = (T + C::BQ - 1) / C::BQ;
        const int64_t n4 = (int64_t)B * NH * M * 2 * 8 * 128;
        cudaMemsetAsync(cnt, 0, (1 + (size_t)B * NH * M * 2) * sizeof(int), st);
        cudaFuncSetAttribute(us__hop_bwd_fused_kernel<E, HS>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        us__hop_bwd_fused_kernel<E, HS><<<dim3(NKV, B, (T + 127) / 128), 384, smem, st>>>(
            maps[0], maps[1], maps[2], L2, D, (E *)dqkv, dqacc, cnt, T, B, NH, NKV, scale, sl2);
        us__hop_dq_convert<E><<<(unsigned)((n4 + 255) / 256), 256, 0, st>>>(
            (E *)dqkv, (const float4 *)dqacc, n4, T, NH, HS, (int64_t)(NH + 2 * NKV) * HS, C::BQ,
            M);
    } else {
        (void)maps, (void)L2, (void)D, (void)dqkv, (void)dqacc, (void)cnt, (void)B, (void)T,
            (void)NH, (void)NKV, (void)st;
    }
}

/* the backward with dS through memory (NWG 2): in chunks of np (batch, kv head) pairs, whose dS
   fits the buffer ds (us__hop_ds_bytes of np pairs), the dK/dV kernel storing the chunk's dS,
   then dQ from it (us__hop_dqs_kernel); P: the pairs a band within a chunk */
template <typename E, int HS>
static void us__hop_bwd_ds(const CUtensorMap *maps, const float *L2, const float *D, void *dqkv,
                           uint4 *ds, int np, int B, int T, int NH, int NKV, int P, int ctas,
                           cudaStream_t st) {
    using C = us__hop_cfg<HS>;
    if constexpr (C::NWG == 2) {
        const float scale = us__attn_scale(HS), sl2 = us__attn_sl2(HS);
        const size_t s1 = us__hop_smem(C::dkdv_pers_bytes), s3 = us__hop_smem(C::dqs_bytes);
        const int nkb = (T + 127) / 128, grp = NH / NKV;
        cudaFuncSetAttribute(us__hop_dkdv_kernel<E, HS, 0, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
        cudaFuncSetAttribute(us__hop_dqs_kernel<E, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)s3);
        for (int p0 = 0; p0 < B * NKV; p0 += np) {
            const int n = np < B * NKV - p0 ? np : B * NKV - p0;
            const int g1 = (int64_t)nkb * n < ctas ? nkb * n : ctas;
            us__hop_dkdv_kernel<E, HS, 0, true><<<g1, 384, s1, st>>>(
                maps[0], maps[1], maps[2], L2, D, (E *)dqkv, ds, p0, n, T, NH, NKV, P, scale, sl2);
            us__hop_dqs_kernel<E, HS><<<dim3(nkb, n * grp), 384, s3, st>>>(maps[5], ds, (E *)dqkv,
                                                                           T, NH, NKV, p0, scale);
        }
    } else {
        (void)maps, (void)L2, (void)D, (void)dqkv, (void)ds, (void)np, (void)B, (void)T, (void)NH,
            (void)NKV, (void)P, (void)ctas, (void)st;
    }
}

/* the two-kernel backward: the persistent dK/dV kernel, then the persistent dQ kernel, each on
   ctas CTAs (fewer where there are fewer key blocks or query tiles); P: the pairs a band
   (us__hop_band) */
template <typename E, int HS>
static void us__hop_bwd_hs(const CUtensorMap *maps, const float *L2, const float *D, void *dqkv,
                           int B, int T, int NH, int NKV, int P, int ctas, cudaStream_t st) {
    using C = us__hop_cfg<HS>;
    const float scale = us__attn_scale(HS), sl2 = us__attn_sl2(HS);
    const size_t s1 = us__hop_smem(C::dkdv_pers_bytes), s2 = us__hop_smem(C::dq_bytes);
    const int nthr = 128 * (1 + C::NWG), np = B * NKV;
    const int g2 = us__hop_grid(T, 64 * C::NWG, NH, B, ctas);
    /* the dK/dV kernel's persistent grid: ctas CTAs, fewer when there are fewer key blocks */
    const int64_t kblocks = (int64_t)((T + 64 * C::NWG - 1) / (64 * C::NWG)) * NKV * B;
    const int g1 = kblocks < ctas ? (int)kblocks : ctas;
    /* maps: 0 Q by BQ rows, 1 dO by BQ rows, 2 K/V by 64·NWG rows, 3 Q by 64·NWG, 4 dO by 64·NWG,
       5 K/V by BKQ */
    if constexpr (C::NWG == 2) {
        cudaFuncSetAttribute(us__hop_dkdv_kernel<E, HS, 0>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
        us__hop_dkdv_kernel<E, HS, 0><<<g1, nthr, s1, st>>>(
            maps[0], maps[1], maps[2], L2, D, (E *)dqkv, nullptr, 0, np, T, NH, NKV, P, scale, sl2);
    } else {
        cudaFuncSetAttribute(us__hop_dkdv_kernel<E, HS, 1>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
        cudaFuncSetAttribute(us__hop_dkdv_kernel<E, HS, 2>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
        us__hop_dkdv_kernel<E, HS, 1><<<g1, nthr, s1, st>>>(
            maps[0], maps[1], maps[2], L2, D, (E *)dqkv, nullptr, 0, np, T, NH, NKV, P, scale, sl2);
        us__hop_dkdv_kernel<E, HS, 2><<<g1, nthr, s1, st>>>(
            maps[0], maps[1], maps[2], L2, D, (E *)dqkv, nullptr, 0, np, T, NH, NKV, P, scale, sl2);
    }
    cudaFuncSetAttribute(us__hop_dq_kernel<E, HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)s2);
    us__hop_dq_kernel<E, HS><<<g2, nthr, s2, st>>>(maps[3], maps[4], maps[5], L2, D, (E *)dqkv, B,
                                                   T, NH, NKV, P, scale, sl2);
}

/* the head sizes compiled, each for bf16 and fp16 */
#define US__HOP_HEADS(X) X(64) X(80) X(96) X(128) X(192) X(256)
#define US__HOP_FITS(H) \
    static_assert(us__hop_fits<H>(), "tiles of HS " #H " exceed 227 KB of shared memory");
US__HOP_HEADS(US__HOP_FITS)
#undef US__HOP_FITS

/* Hopper attention for this call? bf16 or fp16, a compiled head size, an sm_90a binary on a
   compute-capability-9 GPU, and layouts the copy engine can address (16-byte aligned rows) */
static int us__hop_ok(us_ops *o, us_dtype dt, int HS, int bwd) {
    us__cuda *c = us__cu(o);
    int hs_ok = 0;
#define US__HOP_IS(H) hs_ok |= HS == H;
    US__HOP_HEADS(US__HOP_IS)
#undef US__HOP_IS
    const int off = c->hop_off == 1 || c->hop_off == (bwd ? 3 : 2);
    return (dt == US_BF16 || dt == US_F16) && hs_ok && !off && c->cc_major == 9 &&
           us__hop_encoder() && us__hop_compiled();
}

static int us__hop_aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* CTAs of the persistent kernels (forward, dK/dV, dQ): one per SM unless a test asked for
   fewer */
static int us__hop_ctas(us_ops *o) {
    const us__cuda *c = us__cu(o);
    return c->hop_grid > 0 ? c->hop_grid : c->n_sm > 0 ? c->n_sm : 1;
}

/* The (batch, kv head) pairs a band of the Hopper kernels' tile order (us__hop_qtile_of,
   us__hop_kblock_of) holds, of B·NKV. While there are no more pairs than a quarter of the CTAs at
   work, every pair has four or more CTAs reading its rows at once, and all go in one band. Past
   that, bands of about a sixth as many pairs as CTAs (of equal size). Measured on an H200 against
   one band (bench/RESULTS.md, twelfth session): multi-head attention at HS 128 ran the forward
   28 %, 21 % and 5 % faster at T 1k, 2k and 4k (256, 128 and 64 pairs) and the backward 8 %, 6 %
   and 2 %; at HS 64, forward and backward together 2-10 % faster. Bands of pairs that already
   had four CTAs each made every shape slower (by 3-15 % at GQA, T 2k-8k), so those stay whole.
   asked: us_cuda_attention_band's n (0 this rule, −1 one band); 1 where there are no pairs. */
static int64_t us__hop_band_of(int64_t pairs, int64_t ctas, int asked) {
    if (pairs < 1) return 1;
    if (asked < 0) return pairs;
    int64_t fit = asked > 0 ? asked : pairs <= ctas / 4 ? pairs : ctas / 6;
    fit = fit < 1 ? 1 : fit > pairs ? pairs : fit;
    const int64_t bands = (pairs + fit - 1) / fit;
    return (pairs + bands - 1) / bands;
}

/* ... of the B·NKV pairs of a call, on the ops' CTAs */
static int us__hop_band(us_ops *o, int64_t B, int NKV) {
    return (int)us__hop_band_of(B * NKV, us__hop_ctas(o), us__cu(o)->hop_band);
}

/* whether the persistent walk's int counters hold every query tile (of 64 rows at least), and a
   round past them (a grid of no more CTAs than tiles) */
static int us__hop_walk_fits(int64_t B, int64_t T, int NH) {
    return (T / 64 + 1) * NH * B <= INT_MAX / 4;
}

/* out[B,T,NH·HS], lse[B,NH,T] from qkv[B,T,QKV]; 0 when this path cannot take the call */
static int us__hop_attention_fwd(us_ops *o, void *out, float *lse, const void *qkv, int64_t B,
                                 int64_t T, int NH, int NKV, int HS, us_dtype dt) {
    CUtensorMap mq, mkv;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS;
    cudaStream_t st = us__cu(o)->stream;
    const int ctas = us__hop_ctas(o);
    if (!us__hop_ok(o, dt, HS, 0) || !us__hop_aligned(qkv) || NKV <= 0 || NH % NKV || B >= 65536 ||
        T > INT_MAX / 2 || !us__hop_walk_fits(B, T, NH))
        return 0;
    if (B <= 0 || T <= 0 || NH <= 0) return 1;
    const int P = us__hop_band(o, B, NKV);
#define US__HOP_FWD(H)                                                                            \
    if (HS == H) {                                                                                \
        if (!us__hop_map(&mq, qkv, dt, QKV, T, B, 64 * us__hop_cfg<H>::NWF) ||                    \
            !us__hop_map(&mkv, qkv, dt, QKV, T, B, us__hop_cfg<H>::BC))                           \
            return 0;                                                                             \
        if (dt == US_F16)                                                                         \
            us__hop_fwd_hs<__half, H>(mq, mkv, out, lse, (int)B, (int)T, NH, NKV, P, ctas, st);   \
        else                                                                                      \
            us__hop_fwd_hs<__nv_bfloat16, H>(mq, mkv, out, lse, (int)B, (int)T, NH, NKV, P, ctas, \
                                             st);                                                 \
    }
    US__HOP_HEADS(US__HOP_FWD)
#undef US__HOP_FWD
    US__LAUNCHED(o);
    return 1;
}

/* The backward runs fused only when asked for (mode 5). Against the two kernels on one H200
   (bench/RESULTS.md): HS 64 2-8 % slower at T 2048 and 4096 and even at T 8192; HS 128 slower
   at every T from 2k to 32k; HS 80 and 96 18-24 % slower. Against the persistent dK/dV kernel
   (thirteenth session) the two kernels are 1.12-1.52× faster at T 4k and 8k. Timing probes
   placed the loss: without the wait for earlier key blocks the fused kernel was 0-13 % faster;
   the dQ adds themselves (one staging buffer, each add waited for) cost 8-27 % more; and with
   no dQ written at all it only matched the two kernels (0.96-1.01× at HS 128 and the 1B shape,
   7-20 % behind at multi-head HS 64): its five GEMMs a tile cost what their seven do. Two
   reworks measured no better (dQ's GEMM deferred a tile so the consumers keep their ping-pong,
   dS and the staging double-buffered: 0.97-1.01×; then one consumer taking a tile's whole dQ
   with N = 128: 1.00-1.04×; bench/logs/session13/fused-v3.patch): the copy engine's fp32 adds,
   32 KB per tile of 128 keys × 64 queries, are the cost to remove. */

/* whether the backward of head size HS at sequence length T runs fused (dQ inside the dK/dV
   kernel), and the bytes of scratch it needs beside D and L2: the counters, then dQacc
   (16-byte aligned) */
static int us__hop_fused(us_ops *o, int HS, int64_t T) {
    int f = 0;
    const int mode = us__cu(o)->hop_off;
#define US__HOP_FUSED(H) f |= HS == H && us__hop_cfg<H>::FUSED;
    US__HOP_HEADS(US__HOP_FUSED)
#undef US__HOP_FUSED
    if (!f || mode == 4) return 0;
    (void)T;
    return mode == 5;
}

/* the fused backward's query tiles of a sequence (BQ: 128 at HS 64, else 64) */
static int64_t us__hop_fused_tiles(int64_t T, int HS) {
    return (T + us__hop_bq(HS) - 1) / us__hop_bq(HS);
}

/* the bytes of dS that the backward through memory stores: per (batch, head)
   us__hop_ds_off(key blocks) blobs of BQ·256 (T² bytes a head, about) */
static size_t us__hop_ds_bytes(int64_t B, int64_t T, int NH, int HS) {
    const int BQ = us__hop_bq(HS);
    const int64_t nqt = (T + BQ - 1) / BQ, nkb = (T + 127) / 128;
    return (size_t)B * NH * us__hop_ds_off((int)nkb, (int)nqt, 128 / BQ) * BQ * 256;
}

/* The backward with dS through memory (us__hop_bwd_ds): the (batch, kv head) pairs a chunk of
   it takes, 0 where the two kernels run. By default at HS 96 and 128, where it ran faster than
   the two kernels on an H200 (the backward 1.18-1.30× at HS 128, 1.08-1.15× at HS 96, T 2k-8k;
   1.28-1.31× at T 32k), in chunks whose dS takes at most 1/32 of the GPU's memory, since it
   grows with T² (4.4 GB of an H200: one chunk for 16 heads of 128 up to T 16k, four at T 32k),
   and not where one pair's dS is more than that. At HS 64 it ran 0.87-1.01× (a tile's dS is as
   large, its GEMMs half as long: the stores slow the dK/dV kernel more than the dQ kernel
   gains), at HS 80 0.95-1.05×: the two kernels stay there. bench/RESULTS.md, sixteenth
   session. Mode 7 asks for it at every HS ≤ 128 (where a pair's dS fits a chunk); asked > 0
   (us_cuda_attention_ds_pairs) sets the chunk's pairs (tests); mem: the GPU's bytes; pairs,
   grp: the call's pairs and the heads of one; pair_bytes: one pair's dS. Context parallelism's
   block backward takes the same rule (us__hop_block_ds_pairs). */
static int us__hop_ds_chunk(int HS, int mode, int asked, size_t mem, int64_t pairs, int64_t grp,
                            size_t pair_bytes) {
    if (HS > 128 || mode == 4 || mode == 5) return 0;
    if (mode != 7 && HS != 96 && HS != 128) return 0;
    int64_t np = asked > 0 ? asked : (int64_t)(mem / 32 / pair_bytes);
    np = np > pairs ? pairs : np;
    np = np > 65535 / grp ? 65535 / grp : np; /* the dQ kernel's grid: a chunk's heads */
    return (int)np;
}

/* ... for the ops' GPU and settings (mode: us_cuda_attention_no_hopper's, asked:
   us_cuda_attention_ds_pairs') */
static int us__hop_ds_pairs(us_ops *o, int HS, int64_t B, int64_t T, int NH, int NKV) {
    const us__cuda *c = us__cu(o);
    return us__hop_ds_chunk(HS, c->hop_off, c->hop_ds_pairs, c->mem_total, B * NKV, NH / NKV,
                            us__hop_ds_bytes(1, T, NH / NKV, HS));
}

/* A backward's scratch: base bytes, and ds_bytes more for dS through memory where *np > 0. By
   default dS goes through memory only where those bytes are free: a failed request falls back to
   base alone and *np = 0 (the two kernels); asked for (mode 7), the bytes are required. NULL (the
   failure recorded) when even that is not there. */
static void *us__hop_scratch_ds(us_ops *o, size_t base, size_t ds_bytes, int *np) {
    void *p = NULL;
    if (*np && us__cu(o)->hop_off != 7) {
        p = us__cuda_scratch_try(o, base + ds_bytes);
        if (!p) *np = 0;
    }
    return p ? p : us__cuda_scratch(o, base + (*np ? ds_bytes : 0));
}

static size_t us__hop_fused_cnt_bytes(int64_t B, int64_t T, int NH, int HS) {
    return ((size_t)(1 + B * NH * us__hop_fused_tiles(T, HS) * 2) * sizeof(int) + 15) / 16 * 16;
}

/* dqkv[B,T,QKV] (every element written); 0 when this path cannot take the call */
static int us__hop_attention_bwd(us_ops *o, void *dqkv, const void *dout, const void *qkv,
                                 const void *out, const float *lse, int64_t B, int64_t T, int NH,
                                 int NKV, int HS, us_dtype dt) {
    CUtensorMap maps[6];
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, OC = (int64_t)NH * HS, rows = B * T * NH;
    cudaStream_t st = us__cu(o)->stream;
    const int ctas = us__hop_ctas(o);
    float *D, *L2;
    if (!us__hop_ok(o, dt, HS, 1) || !us__hop_aligned(qkv) || !us__hop_aligned(dout) ||
        !us__hop_aligned(out) || NKV <= 0 || NH % NKV || B >= 65536 || T > INT_MAX / 2 ||
        !us__hop_walk_fits(B, T, NH))
        return 0;
    if (B <= 0 || T <= 0 || NH <= 0) return 1;
    const int fused = us__hop_fused(o, HS, T);
    int np = fused ? 0 : us__hop_ds_pairs(o, HS, B, T, NH, NKV); /* dS through memory */
    const int P = us__hop_band(o, B, NKV), Pds = us__hop_band(o, np, 1);
    const size_t dl_bytes = ((size_t)2 * rows * sizeof(float) + 15) / 16 * 16;
    const size_t cnt_bytes = fused ? us__hop_fused_cnt_bytes(B, T, NH, HS) : 0;
    const size_t acc_bytes = fused ? (size_t)B * NH * us__hop_fused_tiles(T, HS) * 2 * 4096 * 4 : 0;
    const size_t ds_bytes = np ? us__hop_ds_bytes(np, T, NH / NKV, HS) : 0; /* a chunk's */
    D = (float *)us__hop_scratch_ds(o, dl_bytes + cnt_bytes + acc_bytes, ds_bytes, &np);
    if (!D) return 1; /* the failure is recorded */
    L2 = D + rows;
    int *cnt = (int *)((char *)D + dl_bytes);          /* [1 + B·NH·M·2] */
    float *dqacc = (float *)((char *)cnt + cnt_bytes); /* [B·NH·M·2·4096] */
    uint4 *ds = (uint4 *)((char *)D + dl_bytes);       /* np: dS of a chunk */
    if (dt == US_F16)
        us__hop_dot<__half>(dout, out, lse, D, L2, rows, (int)T, NH, HS, st);
    else
        us__hop_dot<__nv_bfloat16>(dout, out, lse, D, L2, rows, (int)T, NH, HS, st);
#define US__HOP_BWD(H)                                                                             \
    if (HS == H) {                                                                                 \
        const int bq = us__hop_cfg<H>::BQ, bk = 64 * us__hop_cfg<H>::NWG,                          \
                  bkq = us__hop_cfg<H>::BKQ;                                                       \
        if (!us__hop_map(maps + 0, qkv, dt, QKV, T, B, bq) ||                                      \
            !us__hop_map(maps + 1, dout, dt, OC, T, B, bq) ||                                      \
            !us__hop_map(maps + 2, qkv, dt, QKV, T, B, bk) ||                                      \
            !us__hop_map(maps + 3, qkv, dt, QKV, T, B, bk) ||                                      \
            !us__hop_map(maps + 4, dout, dt, OC, T, B, bk) ||                                      \
            !us__hop_map(maps + 5, qkv, dt, QKV, T, B, bkq))                                       \
            return 0;                                                                              \
        if (fused && dt == US_F16)                                                                 \
            us__hop_bwd_fused<__half, H>(maps, L2, D, dqkv, dqacc, cnt, (int)B, (int)T, NH, NKV,   \
                                         st);                                                      \
        else if (fused)                                                                            \
            us__hop_bwd_fused<__nv_bfloat16, H>(maps, L2, D, dqkv, dqacc, cnt, (int)B, (int)T, NH, \
                                                NKV, st);                                          \
        else if (np && dt == US_F16)                                                               \
            us__hop_bwd_ds<__half, H>(maps, L2, D, dqkv, ds, np, (int)B, (int)T, NH, NKV, Pds,     \
                                      ctas, st);                                                   \
        else if (np)                                                                               \
            us__hop_bwd_ds<__nv_bfloat16, H>(maps, L2, D, dqkv, ds, np, (int)B, (int)T, NH, NKV,   \
                                             Pds, ctas, st);                                       \
        else if (dt == US_F16)                                                                     \
            us__hop_bwd_hs<__half, H>(maps, L2, D, dqkv, (int)B, (int)T, NH, NKV, P, ctas, st);    \
        else                                                                                       \
            us__hop_bwd_hs<__nv_bfloat16, H>(maps, L2, D, dqkv, (int)B, (int)T, NH, NKV, P, ctas,  \
                                             st);                                                  \
    }
    US__HOP_HEADS(US__HOP_BWD)
#undef US__HOP_BWD
    US__LAUNCHED(o);
    return 1;
}

/* ---- the ops table's attention: Hopper kernels, else flash (mma.sync), else portable ------ */
/* The ops-table side of flash attention: bf16 with HS 64 or 128 on sm_80+; everything else
   takes the portable kernels above. */
static int us__flash_ok(us_ops *o, us_dtype dt, int HS) {
    us__cuda *c = us__cu(o);
    return dt == US_BF16 && (HS == 64 || HS == 128) && c->cc_major >= 8;
}

static void us__flash_fwd_any(us_ops *o, void *out, float *lse, const void *qkv, int64_t B,
                              int64_t T, int NH, int NKV, int HS) {
    us__flash_fwd((const __nv_bfloat16 *)qkv, (__nv_bfloat16 *)out, lse, (int)B, (int)T, NH, NKV,
                  HS, us__cu(o)->stream);
    US__LAUNCHED(o);
}

static void us__flash_bwd_any(us_ops *o, void *dqkv, const void *dout, const void *qkv,
                              const void *out, const float *lse, int64_t B, int64_t T, int NH,
                              int NKV, int HS) {
    void *scratch = us__cuda_scratch(o, us__flash_bwd_scratch_bytes((int)B, (int)T, NH, NKV, HS));
    if (!scratch) return;
    us__flash_bwd((const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)qkv,
                  (const __nv_bfloat16 *)out, lse, (__nv_bfloat16 *)dqkv, scratch, (int)B, (int)T,
                  NH, NKV, HS, us__cu(o)->stream);
    US__LAUNCHED(o);
}

static void us__cuda_attention_fwd(us_ops *o, void *out, float *lse, const void *qkv, int64_t B,
                                   int64_t T, int NH, int NKV, int HS, us_dtype dt) {
    if (us__hop_attention_fwd(o, out, lse, qkv, B, T, NH, NKV, HS, dt)) return;
    if (us__flash_ok(o, dt, HS)) {
        us__flash_fwd_any(o, out, lse, qkv, B, T, NH, NKV, HS);
        return;
    }
    if (HS > US__ATT_MAX_HS) {
        us__cuda_fail(o, "attention", "head size above 256", __FILE__, __LINE__);
        return;
    }
    US__DISPATCH(o, dt,
                 (us__k_att_fwd<T_><<<us__blocks(B * NH * T, 128), 128, 0, us__cu(o)->stream>>>(
                     (T_ *)out, lse, (const T_ *)qkv, B, T, NH, NKV, HS)));
}

static void us__cuda_attention_bwd(us_ops *o, void *dqkv, const void *dout, const void *qkv,
                                   const void *out, const float *lse, int64_t B, int64_t T, int NH,
                                   int NKV, int HS, us_dtype dt) {
    cudaStream_t s = us__cu(o)->stream;
    if (us__hop_attention_bwd(o, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, dt)) return;
    if (us__flash_ok(o, dt, HS)) {
        us__flash_bwd_any(o, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS);
        return;
    }
    if (HS > US__ATT_MAX_HS) {
        us__cuda_fail(o, "attention", "head size above 256", __FILE__, __LINE__);
        return;
    }
    US__DISPATCH(o, dt,
                 (us__k_att_bwd_dq<T_><<<us__blocks(B * NH * T, 128), 128, 0, s>>>(
                     (T_ *)dqkv, (const T_ *)dout, (const T_ *)qkv, (const T_ *)out, lse, B, T, NH,
                     NKV, HS)));
    US__DISPATCH(o, dt,
                 (us__k_att_bwd_dkv<T_><<<us__blocks(B * NKV * T, 128), 128, 0, s>>>(
                     (T_ *)dqkv, (const T_ *)dout, (const T_ *)qkv, (const T_ *)out, lse, B, T, NH,
                     NKV, HS)));
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-cp-flash  attention by key blocks with positions, on tensor cores (context parallelism)
/* ------------------------------------------------------------------------------------
   Ring attention (// >>cp in ultrascale.h) calls attn_block_fwd once for each K/V block that
   passes through the rank, carrying the online-softmax state (acc, m, l) from block to block,
   and attn_block_bwd once per block with the final out and lse. These kernels are the flash
   kernels above (same tiles, fragments and per-tile helpers) with four changes:
     - keys and values come from the block's own buffer kv, not from qkv, and Tq ≠ Tk;
     - the mask is by global position (query i sees key j when kpos[j] ≤ qpos[i]), not by
       index. Causal block skipping becomes a bitmask, built by each CTA, of the tiles that hold
       a key (or query) it can see: tiles without one are never loaded, and a CTA that sees
       nothing of the block exits at once (ring attention without zig-zag hands half the
       blocks to ranks that cannot see any of them). Inside a loaded tile, a warp skips the math
       when no pair of its rows is visible and masks only when some pair is hidden. Nothing
       assumes the positions are sorted;
     - the forward starts from the state in memory (or fresh when init) and writes it back,
       unnormalised, in fp32; the backward adds (+=) fp32 dQ and dK|dV into the caller's sums;
     - every head size real models use (64, 80, 96, 128, 192, 256), in bf16 or fp16 (E, the
       element type: mma.sync's .bf16 or .f16 form), so that context parallelism never falls
       onto the portable block kernels, hundreds of times slower (bench/RESULTS.md: 114 ms for
       one forward at HS 128).
   Legend: B batch, Tq queries, Tk keys of the block, NH query heads, NKV kv heads, HS head size,
   E bf16 or fp16.
     qkv  E    [B, Tq, QKV]          only the q heads are read
     kv   E    [B, Tk, 2·NKV·HS]     k head g at g·HS, v head g at (NKV+g)·HS
     qpos i32 [Tq], kpos i32 [Tk]    global positions
     acc  f32  [B, NH, Tq, HS]; m, l f32 [B, NH, Tq]   m in natural-log units (the CPU reference's)
     out, dout E [B, Tq, NH·HS]; lse f32 [B, NH, Tq] (−inf: the row saw no key at all)
     dq   f32  [B, Tq, NH·HS] +=;  dkv f32 [B, Tk, 2·NKV·HS] +=
   Kernels (4 warps; tile sizes from us__fa_cfg, as the causal kernels):
     us__flash_block_fwd_kernel   one CTA per (query tile, head, batch); visible key tiles in order
     us__flash_block_dkdv_kernel  one CTA per (key tile, kv head, batch); every query head of the
                                  group × visible query tile, dK and dV summed in registers (at
                                  HS 256 two launches, dV then dK: both would not fit)
     us__flash_block_dq_kernel    one CTA per (query tile, head, batch); visible key tiles in order
   D = rowsum(dO ∘ O) comes from us__flash_bwd_dot_kernel. Every output element belongs to one
   thread of one CTA and is summed in a fixed order, then added once: deterministic, no atomics.
   A tile's positions (and in the backward lse·log2 e and D, which the dot kernel writes next to
   D) travel by 4-byte cp.async with the tile, so no plain load stalls the loop.

   On Hopper the ops take the same three kernels rebuilt on // >>cuda-hopper (wgmma, TMA, a
   producer warpgroup, ping-ponging consumers; its tiles, shared-memory layouts and per-tile
   helpers), at the end of this section: us__hop_block_fwd_kernel, us__hop_block_dkdv_kernel,
   us__hop_block_dq_kernel. What changes against the causal Hopper kernels is only which tiles
   a CTA visits and how a tile is masked: a small kernel first writes the smallest and largest
   position of every run of 64 queries and keys (us__hop_pos_ranges); they give every query tile
   (of the forward and dQ kernels, us__hop_block_tiles) or key block (of the dK/dV kernel's CTAs)
   the bitmask of the tiles it can see (the producer loads only those), and each consumer
   warpgroup decides per tile, from the same ranges, whether its 64 rows see none of it (skip),
   all of it (no mask) or part of it (mask by position). A rank's positions in ring attention
   are one or two contiguous runs, so almost every tile is all or nothing, as in causal
   attention. Where the causal backward takes dS through memory (us__hop_block_ds_pairs: by
   default HS 96 and 128), so does the block backward: the dK/dV kernel also stores each tile's
   dSᵀ, and us__hop_block_dqs_kernel forms dQ from it with one GEMM a tile instead of the dQ
   kernel's three. The mma.sync kernels here stay the portable path (sm_80+, and on Hopper with
   us_cuda_attention_no_hopper 1 or 6, which the tests and bench_cuda --cp use to compare). */

/* min / max over a warp: one redux.sync on sm_80+, shuffles elsewhere (where it must compile) */
static __device__ __forceinline__ int us__warp_min(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_min_sync(0xffffffffu, v);
#else
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
#endif
}

static __device__ __forceinline__ int us__warp_max(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, v);
#else
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
#endif
}

/* Bit t of vis (word t/32) says that tile t (positions pos[t·TILE ..], n in all) has something
   the CTA can see: KEYS, a key position ≤ bound (the CTA's largest query position); otherwise
   a query position ≥ bound (the CTA's smallest key position). One thread per tile; the
   positions stay in L1/L2, every CTA of the grid reads the same ones. Ends with a barrier. */
template <int TILE, bool KEYS>
static __device__ void us__fa_tile_mask(unsigned *vis, const int32_t *__restrict__ pos, int n,
                                        int bound) {
    const int nt = (n + TILE - 1) / TILE, nw = (nt + 31) / 32;
    for (int t0 = 0; t0 < nt; t0 += us__fa_threads) {
        const int t = t0 + (int)threadIdx.x;
        bool hit = false;
        if (t < nt) {
            const int32_t *p = pos + (int64_t)t * TILE;
            const int cnt = min(TILE, n - t * TILE);
#pragma unroll 8
            for (int j = 0; j < cnt; j++) hit |= KEYS ? p[j] <= bound : p[j] >= bound;
        }
        const unsigned bits = __ballot_sync(0xffffffffu, hit);
        const int w = (t0 >> 5) + (int)(threadIdx.x >> 5);
        if ((threadIdx.x & 31) == 0 && w < nw) vis[w] = bits;
    }
    __syncthreads();
}

/* the first tile after t with its bit set (t = −1: the first of all); nt when there is none */
static __device__ __forceinline__ int us__fa_next_tile(const unsigned *vis, int t, int nt) {
    for (int w = (t + 1) >> 5; w * 32 < nt; w++) {
        unsigned bits = vis[w];
        if (w == (t + 1) >> 5) bits &= ~0u << ((t + 1) & 31);
        if (bits) return w * 32 + __ffs((int)bits) - 1;
    }
    return nt;
}

/* dst[c], dst[c+1] += x[i][2r], x[i][2r+1] · scale for the thread's columns c = 8i + 2·(lane%4):
   half r of an m-atom's accumulator added into one fp32 row (8-byte aligned) */
template <int HS>
static __device__ __forceinline__ void us__fa_add_row(float *dst, const float (&x)[HS / 8][4],
                                                      int r, float scale, int lane) {
    dst += 2 * (lane & 3);
#pragma unroll
    for (int i = 0; i < HS / 8; i++) {
        float2 *p = reinterpret_cast<float2 *>(dst + i * 8), v = *p;
        v.x += x[i][2 * r] * scale;
        v.y += x[i][2 * r + 1] * scale;
        *p = v;
    }
}

/* dst[c] = src[i0 + c] for the N entries of a tile (cp.async; 4-byte values: positions, lse, D),
   past n the value pad (written directly: it is what makes a tail key or query invisible) */
template <int N, typename V>
static __device__ __forceinline__ void us__fa_load_pos(V *dst, const V *__restrict__ src, int i0,
                                                       int n, V pad) {
    static_assert(N <= us__fa_threads && sizeof(V) == 4, "one 4-byte value per thread");
    const int c = threadIdx.x;
    if (c < N) {
        if (i0 + c < n)
            us__cp_async4(dst + c, src + i0 + c);
        else
            dst[c] = pad;
    }
}

/* The prologue of the two kernels with a CTA per query tile: the tile's query positions into
   sQp (INT_MIN past Tq), this warp's smallest and largest (wqmin, wqmax), and the bitmask of the
   key tiles that hold a key some query of the CTA sees. */
template <int MW, int BC>
static __device__ __forceinline__ void us__fa_query_side(int *sQp, unsigned *sVis, int *sRed,
                                                         const int32_t *__restrict__ qpos,
                                                         const int32_t *__restrict__ kpos, int q0,
                                                         int Tq, int Tk, int &wqmin, int &wqmax) {
    constexpr int BR = 64 * MW;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nq = min(BR, Tq - q0);
    for (int r = threadIdx.x; r < BR; r += us__fa_threads) sQp[r] = r < nq ? qpos[q0 + r] : INT_MIN;
    __syncthreads();
    wqmin = INT_MAX;
    wqmax = INT_MIN;
    for (int r = lane; r < 16 * MW; r += 32) {
        int p = sQp[warp * 16 * MW + r];
        wqmin = min(wqmin, p);
        wqmax = max(wqmax, p);
    }
    wqmin = us__warp_min(wqmin);
    wqmax = us__warp_max(wqmax);
    if (lane == 0) sRed[warp] = wqmax;
    __syncthreads();
    us__fa_tile_mask<BC, true>(sVis, kpos, Tk, max(max(sRed[0], sRed[1]), max(sRed[2], sRed[3])));
}

/* The loop step of the kernels that walk key tiles (forward, dQ): wait until tile kt (in buffer
   buf) has landed for every thread and everyone is done with the one before, then start loading
   the next visible tile — K, V and their positions — into the other buffer. Returns that tile
   (nkt: none left). */
template <int HS, int BC, int LDS, typename E>
static __device__ __forceinline__ int
us__fa_kv_advance(E *sK, E *sV, int *sKp, int buf, const unsigned *sVis, int kt, int nkt,
                  const E *gk, const E *gv, int64_t KVW, const int32_t *kpos, int Tk) {
    constexpr int TILE = BC * LDS;
    us__cp_async_wait_all();
    __syncthreads();
    const int nx = us__fa_next_tile(sVis, kt, nkt);
    if (nx < nkt) {
        const int k1 = nx * BC;
        us__fa_load_tile<HS, BC>(sK + (buf ^ 1) * TILE, gk + (int64_t)k1 * KVW, KVW,
                                 min(BC, Tk - k1));
        us__fa_load_tile<HS, BC>(sV + (buf ^ 1) * TILE, gv + (int64_t)k1 * KVW, KVW,
                                 min(BC, Tk - k1));
        us__fa_load_pos<BC>(sKp + (buf ^ 1) * BC, kpos, k1, Tk, INT_MAX);
    }
    us__cp_async_commit();
    return nx;
}

/* the smallest and largest key position of a tile, the same in every lane of the warp */
template <int BC>
static __device__ __forceinline__ void us__fa_tile_range(const int *kp, int lane, int &kmin,
                                                         int &kmax) {
    kmin = INT_MAX;
    kmax = INT_MIN;
    for (int c = lane; c < BC; c += 32) {
        kmin = min(kmin, kp[c]);
        kmax = max(kmax, kp[c]);
    }
    kmin = us__warp_min(kmin);
    kmax = us__warp_max(kmax);
}

/* ---- forward: one CTA per (64·MW queries, head, batch) ------------------------------ */
template <typename E, int HS, int MW, int BC, int MINB>
__global__ void __launch_bounds__(128, MINB)
    us__flash_block_fwd_kernel(float *__restrict__ acc, float *__restrict__ mst,
                               float *__restrict__ lst, const E *__restrict__ qkv,
                               const E *__restrict__ kv, const int32_t *__restrict__ qpos,
                               const int32_t *__restrict__ kpos, int Tq, int Tk, int NH, int NKV,
                               int init, float sl2 /* scale·log2 e */) {
    constexpr int BR = 64 * MW, LDS = us__fa_dims<HS>::lds, TILE = BC * LDS;
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    E *sQ = (E *)us__fa_smem;                    /* [BR][LDS] */
    E *sK = sQ + BR * LDS;                       /* [2][BC][LDS] */
    E *sV = sK + 2 * TILE;                       /* [2][BC][LDS] */
    int *sQp = (int *)(sV + 2 * TILE);           /* [BR] query positions */
    int *sKp = sQp + BR;                         /* [2][BC] key positions (INT_MAX past Tk) */
    unsigned *sVis = (unsigned *)(sKp + 2 * BC); /* [⌈key tiles / 32⌉] */
    __shared__ int sRed[4];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* grid (NH, B, query tiles), last tiles first: with sorted positions they see the most keys */
    const int qb = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, g = h / (NH / NKV);
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KVW = (int64_t)2 * NKV * HS;
    const int q0 = qb * BR, nkt = (Tk + BC - 1) / BC;
    const int wr0 = warp * 16 * MW,
              row0 = q0 + wr0 + (lane >> 2); /* atom a, half r: row0 + 16a + 8r */
    const E *gk = kv + (int64_t)b * Tk * KVW + (int64_t)g * HS, *gv = gk + (int64_t)NKV * HS;

    int wqmin, wqmax;
    us__fa_query_side<MW, BC>(sQp, sVis, sRed, qpos, kpos, q0, Tq, Tk, wqmin, wqmax);
    int kt = us__fa_next_tile(sVis, -1, nkt);
    if (kt >= nkt && !init) return; /* nothing of this block is visible here: the state stays */
    if (kt < nkt) {
        us__fa_load_tile<HS, BR>(sQ, qkv + ((int64_t)b * Tq + q0) * QKV + (int64_t)h * HS, QKV,
                                 min(BR, Tq - q0));
        us__fa_load_tile<HS, BC>(sK, gk + (int64_t)kt * BC * KVW, KVW, min(BC, Tk - kt * BC));
        us__fa_load_tile<HS, BC>(sV, gv + (int64_t)kt * BC * KVW, KVW, min(BC, Tk - kt * BC));
        us__fa_load_pos<BC>(sKp, kpos, kt * BC, Tk, INT_MAX);
        us__cp_async_commit();
        us__cp_async_wait_all();
        __syncthreads();
    }
    /* MW = 1: the warp's 16 query rows stay in registers, but for HS 256, where their 64 beside
       O's 128 would spill (104 bytes); there each tile reads them from shared memory (FA2's
       choice at every head size) */
    constexpr bool QREG = MW == 1 && HS < 256;
    uint32_t qf[QREG ? HS / 16 : 1][4];
    if constexpr (QREG) {
        if (kt < nkt) {
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++)
                us__ldsm_x4(qf[kk], us__fa_a_addr<LDS>(sQ, wr0, kk * 16, lane));
        }
    }

    /* the state of the earlier blocks (log2 domain for m; l goes to one lane of the quad, the
       quad's sum is the row's), or a fresh one */
    float o[MW][HS / 8][4], m[MW][2], l[MW][2];
#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row0 + 16 * a + 8 * r;
            const int64_t i = ((int64_t)b * NH + h) * Tq + row;
            const bool fresh = init || row >= Tq;
            m[a][r] = fresh ? -INFINITY : mst[i] * US__LOG2E;
            l[a][r] = fresh || (lane & 3) ? 0.f : lst[i];
            const float *ar = acc + i * HS + 2 * (lane & 3);
#pragma unroll
            for (int ii = 0; ii < HS / 8; ii++) {
                float2 v =
                    fresh ? make_float2(0.f, 0.f) : *reinterpret_cast<const float2 *>(ar + ii * 8);
                o[a][ii][2 * r] = v.x;
                o[a][ii][2 * r + 1] = v.y;
            }
        }

    for (int it = 0; kt < nkt; it++) {
        const int buf = it & 1;
        const E *sKb = sK + buf * TILE, *sVb = sV + buf * TILE;
        const int *kp = sKp + buf * BC;
        const int nx =
            us__fa_kv_advance<HS, BC, LDS>(sK, sV, sKp, buf, sVis, kt, nkt, gk, gv, KVW, kpos, Tk);
        /* this tile against the warp's rows: nothing visible (skip), everything (no mask), or a mix */
        int kmin, kmax;
        us__fa_tile_range<BC>(kp, lane, kmin, kmax);
        if (kmin <= wqmax) {
            float s[MW][BC / 8][4];
            us__fa_qk<MW, BC, HS, LDS, QREG>(s, qf, sQ, wr0, sKb, lane);
            us__fa_softmax<MW, BC, HS, true>(
                s, o, m, l, sl2, kmax > wqmin, [&](int a, int j, int e) {
                    return kp[j * 8 + 2 * (lane & 3) + (e & 1)] >
                           sQp[wr0 + 16 * a + (lane >> 2) + (e >> 1) * 8];
                });
            us__fa_acc_pv<MW, BC, HS, LDS>(o, s, sVb, lane);
        }
        kt = nx;
    }

    /* the state back: acc unnormalised, m in natural-log units, l summed over the quad */
#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[a][r] += __shfl_xor_sync(0xffffffffu, l[a][r], 1);
            l[a][r] += __shfl_xor_sync(0xffffffffu, l[a][r], 2);
            const int row = row0 + 16 * a + 8 * r;
            if (row >= Tq) continue;
            const int64_t i = ((int64_t)b * NH + h) * Tq + row;
            if ((lane & 3) == 0) {
                mst[i] = m[a][r] * 0.69314718055994531f;
                lst[i] = l[a][r];
            }
            float *ar = acc + i * HS + 2 * (lane & 3);
#pragma unroll
            for (int ii = 0; ii < HS / 8; ii++)
                *reinterpret_cast<float2 *>(ar + ii * 8) =
                    make_float2(o[a][ii][2 * r], o[a][ii][2 * r + 1]);
        }
}

/* ---- backward ----------------------------------------------------------------------- */
/* dK (times scale) and dV of the thread's keys key0 + 16a + 8r added into dkv [B][Tk][2·NKV·HS]
   fp32 (kv head g); PART 1 adds dV only, 2 dK only */
template <int HS, int KW, int PART>
static __device__ __forceinline__ void
us__fa_dkv_add(float *dkv, const float (&dk)[KW][HS / 8][4], const float (&dv)[KW][HS / 8][4],
               int key0, int b, int g, int Tk, int NKV, float scale, int lane) {
    const int64_t KVW = (int64_t)2 * NKV * HS;
#pragma unroll
    for (int a = 0; a < KW; a++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int key = key0 + 16 * a + 8 * r;
            if (key >= Tk) continue;
            float *row = dkv + ((int64_t)b * Tk + key) * KVW;
            if (PART != 1) us__fa_add_row<HS>(row + (int64_t)g * HS, dk[a], r, scale, lane);
            if (PART != 2) us__fa_add_row<HS>(row + (int64_t)(NKV + g) * HS, dv[a], r, 1.f, lane);
        }
}

/* dK, dV of 64·KW keys of one kv head for this block: every query head of the group, every
   query tile with a query that sees one of the keys, in order (us__fa_dkdv_tile has the math) */
template <typename E, int HS, int KW, int BR, int MINB, int PART>
__global__ void __launch_bounds__(128, MINB)
    us__flash_block_dkdv_kernel(float *__restrict__ dkv, const E *__restrict__ dout,
                                const E *__restrict__ qkv, const float *__restrict__ L2g,
                                const float *__restrict__ Dg, const E *__restrict__ kv,
                                const int32_t *__restrict__ qpos, const int32_t *__restrict__ kpos,
                                int Tq, int Tk, int NH, int NKV, float scale, float sl2) {
    constexpr int BC = 64 * KW, LDS = us__fa_dims<HS>::lds, TILE = BC * LDS, QT = BR * LDS;
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    E *sK = (E *)us__fa_smem;                /* [BC][LDS] */
    E *sV = sK + TILE;                       /* [BC][LDS] (PART 1: unused) */
    E *sQ = sV + TILE;                       /* [2][BR][LDS] */
    E *sdO = sQ + 2 * QT;                    /* [2][BR][LDS] */
    float *sL = (float *)(sdO + 2 * QT);     /* [2][BR] lse·log2 e (+inf: P = 0) */
    float *sD = sL + 2 * BR;                 /* [2][BR] */
    int *sQp = (int *)(sD + 2 * BR);         /* [2][BR] query positions (INT_MIN past Tq) */
    int *sKp = sQp + 2 * BR;                 /* [BC] key positions (INT_MAX past Tk) */
    unsigned *sVis = (unsigned *)(sKp + BC); /* [⌈query tiles / 32⌉] */
    __shared__ int sRed[4];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = blockIdx.x, b = blockIdx.y, grp = NH / NKV, k0 = blockIdx.z * BC,
              nqt = (Tq + BR - 1) / BR;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, OC = (int64_t)NH * HS,
                  KVW = (int64_t)2 * NKV * HS;
    const int wk0 = warp * 16 * KW, key0 = k0 + wk0 + (lane >> 2); /* keys key0 + 16a + 8r */

    /* the key positions (INT_MAX past Tk: seen by nobody), this warp's range, the CTA's
       smallest, and the query tiles that can see any of them */
    for (int c = tid; c < BC; c += us__fa_threads) sKp[c] = k0 + c < Tk ? kpos[k0 + c] : INT_MAX;
    __syncthreads();
    int wkmin = INT_MAX, wkmax = INT_MIN;
    for (int c = lane; c < 16 * KW; c += 32) {
        wkmin = min(wkmin, sKp[wk0 + c]);
        wkmax = max(wkmax, sKp[wk0 + c]);
    }
    wkmin = us__warp_min(wkmin);
    wkmax = us__warp_max(wkmax);
    if (lane == 0) sRed[warp] = wkmin;
    __syncthreads();
    us__fa_tile_mask<BR, false>(sVis, qpos, Tq, min(min(sRed[0], sRed[1]), min(sRed[2], sRed[3])));
    const int first = us__fa_next_tile(sVis, -1, nqt);
    if (first >= nqt) return; /* no query sees these keys: nothing to add */

    /* Q and dO of query head g·grp + hi, tile qt, into buffer buf; then their positions,
       lse·log2 e and D (past Tq: P = 0) */
    auto issue = [&](int hi, int qt, int buf) {
        const int h = g * grp + hi, q0 = qt * BR, nv = min(BR, Tq - q0);
        const E *gq = qkv + ((int64_t)b * Tq + q0) * QKV + (int64_t)h * HS;
        us__fa_load_tile<HS, BR>(sQ + buf * QT, gq, QKV, nv);
        us__fa_load_tile<HS, BR>(sdO + buf * QT,
                                 dout + ((int64_t)b * Tq + q0) * OC + (int64_t)h * HS, OC, nv);
    };
    auto issue_pos = [&](int hi, int qt, int buf) {
        const int q0 = qt * BR;
        const int64_t i0 = ((int64_t)b * NH + g * grp + hi) * Tq;
        us__fa_load_pos<BR>(sQp + buf * BR, qpos, q0, Tq, INT_MIN);
        us__fa_load_pos<BR>(sL + buf * BR, L2g + i0, q0, Tq, INFINITY);
        us__fa_load_pos<BR>(sD + buf * BR, Dg + i0, q0, Tq, 0.f);
    };
    {
        const E *gk = kv + ((int64_t)b * Tk + k0) * KVW + (int64_t)g * HS;
        us__fa_load_tile<HS, BC>(sK, gk, KVW, min(BC, Tk - k0));
        if (PART != 1) us__fa_load_tile<HS, BC>(sV, gk + (int64_t)NKV * HS, KVW, min(BC, Tk - k0));
    }
    issue(0, first, 0);
    issue_pos(0, first, 0);
    us__cp_async_commit();

    float dk[KW][HS / 8][4], dv[KW][HS / 8][4];
#pragma unroll
    for (int a = 0; a < KW; a++)
#pragma unroll
        for (int i = 0; i < HS / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dk[a][i][e] = dv[a][i][e] = 0.f;

    for (int it = 0, hi = 0, qt = first;; it++) {
        const int buf = it & 1;
        us__cp_async_wait_all();
        __syncthreads();
        int nh = hi, nq = us__fa_next_tile(sVis, qt, nqt); /* the next (head, visible tile) */
        if (nq >= nqt) {
            nh++;
            nq = first;
        }
        const bool more = nh < grp;
        if (more) {
            issue(nh, nq, buf ^ 1);
            issue_pos(nh, nq, buf ^ 1);
        }
        us__cp_async_commit();

        const int *qp = sQp + buf * BR;
        int qmin = INT_MAX, qmax = INT_MIN;
        for (int c = lane; c < BR; c += 32) {
            qmin = min(qmin, qp[c]);
            qmax = max(qmax, qp[c]);
        }
        qmin = us__warp_min(qmin);
        qmax = us__warp_max(qmax);
        /* some query of the tile sees some key of the warp; mask if some does not */
        if (qmax >= wkmin)
            us__fa_dkdv_tile<KW, BR, HS, LDS, true, PART>(
                dk, dv, sK, sV, wk0, sQ + buf * QT, sdO + buf * QT, sL + buf * BR, sD + buf * BR,
                sl2, wkmax > qmin,
                [&](int a, int j, int e) {
                    return sKp[wk0 + (lane >> 2) + 16 * a + 8 * (e >> 1)] >
                           qp[j * 8 + 2 * (lane & 3) + (e & 1)];
                },
                lane);
        if (!more) break;
        hi = nh;
        qt = nq;
    }
    us__fa_dkv_add<HS, KW, PART>(dkv, dk, dv, key0, b, g, Tk, NKV, scale, lane);
}

/* dQ of 64·MW queries of one head for this block: the visible key tiles in order (us__fa_dq_tile) */
template <typename E, int HS, int MW, int BC, int MINB>
__global__ void __launch_bounds__(128, MINB)
    us__flash_block_dq_kernel(float *__restrict__ dq, const E *__restrict__ dout,
                              const E *__restrict__ qkv, const float *__restrict__ L2g,
                              const float *__restrict__ Dg, const E *__restrict__ kv,
                              const int32_t *__restrict__ qpos, const int32_t *__restrict__ kpos,
                              int Tq, int Tk, int NH, int NKV, float scale, float sl2) {
    constexpr int BR = 64 * MW, LDS = us__fa_dims<HS>::lds, TILE = BC * LDS;
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    E *sQ = (E *)us__fa_smem;          /* [BR][LDS] */
    E *sdO = sQ + BR * LDS;            /* [BR][LDS] */
    E *sK = sdO + BR * LDS;            /* [2][BC][LDS] */
    E *sV = sK + 2 * TILE;             /* [2][BC][LDS] */
    int *sQp = (int *)(sV + 2 * TILE); /* [BR] */
    int *sKp = sQp + BR;               /* [2][BC] */
    float *sL =
        (float *)(sKp + 2 * BC); /* [BR] lse·log2 e (+inf: no key ever seen, or past Tq: P = 0) */
    float *sD = sL + BR;         /* [BR] */
    unsigned *sVis = (unsigned *)(sD + BR); /* [⌈key tiles / 32⌉] */
    __shared__ int sRed[4];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int qb = gridDim.z - 1 - blockIdx.z, h = blockIdx.x, b = blockIdx.y, g = h / (NH / NKV);
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, OC = (int64_t)NH * HS,
                  KVW = (int64_t)2 * NKV * HS;
    const int q0 = qb * BR, nkt = (Tk + BC - 1) / BC;
    const int wr0 = warp * 16 * MW, row0 = q0 + wr0 + (lane >> 2);
    const E *gk = kv + (int64_t)b * Tk * KVW + (int64_t)g * HS, *gv = gk + (int64_t)NKV * HS;

    int wqmin, wqmax;
    us__fa_query_side<MW, BC>(sQp, sVis, sRed, qpos, kpos, q0, Tq, Tk, wqmin, wqmax);
    int kt = us__fa_next_tile(sVis, -1, nkt);
    if (kt >= nkt) return; /* no key of this block is seen here: nothing to add */
    us__fa_load_tile<HS, BR>(sQ, qkv + ((int64_t)b * Tq + q0) * QKV + (int64_t)h * HS, QKV,
                             min(BR, Tq - q0));
    us__fa_load_tile<HS, BR>(sdO, dout + ((int64_t)b * Tq + q0) * OC + (int64_t)h * HS, OC,
                             min(BR, Tq - q0));
    us__fa_load_tile<HS, BC>(sK, gk + (int64_t)kt * BC * KVW, KVW, min(BC, Tk - kt * BC));
    us__fa_load_tile<HS, BC>(sV, gv + (int64_t)kt * BC * KVW, KVW, min(BC, Tk - kt * BC));
    us__fa_load_pos<BC>(sKp, kpos, kt * BC, Tk, INT_MAX);
    us__fa_load_pos<BR>(sL, L2g + ((int64_t)b * NH + h) * Tq, q0, Tq,
                        INFINITY); /* in shared memory, not registers: */
    us__fa_load_pos<BR>(sD, Dg + ((int64_t)b * NH + h) * Tq, q0, Tq,
                        0.f); /* dQ takes 128 of them at HS 128 */
    us__cp_async_commit();

    float dqa[MW][HS / 8][4];
#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int i = 0; i < HS / 8; i++)
            dqa[a][i][0] = dqa[a][i][1] = dqa[a][i][2] = dqa[a][i][3] = 0.f;
    const int *myp = sQp + wr0 + (lane >> 2); /* this thread's rows: + 16a + 8r */
    const float *myl = sL + wr0 + (lane >> 2), *myd = sD + wr0 + (lane >> 2);

    for (int it = 0; kt < nkt; it++) {
        const int buf = it & 1;
        const E *sKb = sK + buf * TILE, *sVb = sV + buf * TILE;
        const int *kp = sKp + buf * BC;
        const int nx =
            us__fa_kv_advance<HS, BC, LDS>(sK, sV, sKp, buf, sVis, kt, nkt, gk, gv, KVW, kpos, Tk);
        int kmin, kmax;
        us__fa_tile_range<BC>(kp, lane, kmin, kmax);
        if (kmin <= wqmax)
            us__fa_dq_tile<MW, BC, HS, LDS, true>(
                dqa, sQ, sdO, wr0, sKb, sVb, [&](int a, int r) { return myl[16 * a + 8 * r]; },
                [&](int a, int r) { return myd[16 * a + 8 * r]; }, sl2, kmax > wqmin,
                [&](int a, int j, int e) {
                    return kp[j * 8 + 2 * (lane & 3) + (e & 1)] > myp[16 * a + (e >> 1) * 8];
                },
                lane);
        kt = nx;
    }

#pragma unroll
    for (int a = 0; a < MW; a++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row0 + 16 * a + 8 * r;
            if (row < Tq)
                us__fa_add_row<HS>(dq + ((int64_t)b * Tq + row) * OC + (int64_t)h * HS, dqa[a], r,
                                   scale, lane);
        }
}

/* ---- host side ------------------------------------------------------------------------ */
template <typename E, int HS, int MW = us__fa_cfg<HS>::fwd_mw, int BC = us__fa_cfg<HS>::fwd_bc,
          int MINB = us__fa_cfg<HS>::fwd_minb>
static void us__flash_block_fwd_hs(float *acc, float *m, float *l, const E *qkv, const E *kv,
                                   const int32_t *qpos, const int32_t *kpos, int B, int Tq, int Tk,
                                   int NH, int NKV, int init, cudaStream_t stream) {
    constexpr int BR = 64 * MW;
    const int nkt = (Tk + BC - 1) / BC;
    size_t smem = (size_t)(BR + 4 * BC) * us__fa_dims<HS>::lds * 2 + (size_t)(BR + 2 * BC) * 4 +
                  (size_t)((nkt + 31) / 32) * 4;
    cudaFuncSetAttribute(us__flash_block_fwd_kernel<E, HS, MW, BC, MINB>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 grid(NH, B, (Tq + BR - 1) / BR);
    us__flash_block_fwd_kernel<E, HS, MW, BC, MINB><<<grid, us__fa_threads, smem, stream>>>(
        acc, m, l, qkv, kv, qpos, kpos, Tq, Tk, NH, NKV, init, us__attn_sl2(HS));
}

/* PART: 0 dK and dV in one launch, 1 dV only, 2 dK only (us__fa_cfg's kv_split) */
template <typename E, int HS, int PART = 0, int KW = us__fa_cfg<HS>::kv_kw,
          int BR = us__fa_cfg<HS>::kv_br, int MINB = us__fa_cfg<HS>::kv_minb>
static void us__flash_block_dkdv(float *dkv, const E *dout, const E *qkv, const float *L2,
                                 const float *D, const E *kv, const int32_t *qpos,
                                 const int32_t *kpos, int B, int Tq, int Tk, int NH, int NKV,
                                 cudaStream_t stream) {
    const float scale = us__attn_scale(HS);
    const int nqt = (Tq + BR - 1) / BR;
    size_t smem = us__fa_dkdv_smem<HS, KW, BR>() + (size_t)(2 * BR + 64 * KW) * 4 +
                  (size_t)((nqt + 31) / 32) * 4; /* + positions, bitmask */
    cudaFuncSetAttribute(us__flash_block_dkdv_kernel<E, HS, KW, BR, MINB, PART>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 grid(NKV, B, (Tk + 64 * KW - 1) / (64 * KW));
    us__flash_block_dkdv_kernel<E, HS, KW, BR, MINB, PART><<<grid, us__fa_threads, smem, stream>>>(
        dkv, dout, qkv, L2, D, kv, qpos, kpos, Tq, Tk, NH, NKV, scale, us__attn_sl2(HS));
}

template <typename E, int HS, int MW = us__fa_cfg<HS>::dq_mw, int BC = us__fa_cfg<HS>::dq_bc,
          int MINB = us__fa_cfg<HS>::dq_minb>
static void us__flash_block_dq(float *dq, const E *dout, const E *qkv, const float *L2,
                               const float *D, const E *kv, const int32_t *qpos,
                               const int32_t *kpos, int B, int Tq, int Tk, int NH, int NKV,
                               cudaStream_t stream) {
    constexpr int BR = 64 * MW;
    const float scale = us__attn_scale(HS);
    const int nkt = (Tk + BC - 1) / BC;
    size_t smem = (size_t)(2 * BR + 4 * BC) * us__fa_dims<HS>::lds * 2 +
                  (size_t)(3 * BR + 2 * BC) * 4 + (size_t)((nkt + 31) / 32) * 4;
    cudaFuncSetAttribute(us__flash_block_dq_kernel<E, HS, MW, BC, MINB>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 grid(NH, B, (Tq + BR - 1) / BR);
    us__flash_block_dq_kernel<E, HS, MW, BC, MINB><<<grid, us__fa_threads, smem, stream>>>(
        dq, dout, qkv, L2, D, kv, qpos, kpos, Tq, Tk, NH, NKV, scale, us__attn_sl2(HS));
}

/* the backward of one block: D = rowsum(dO ∘ O) and lse·log2 e into scratch f32 [2][B, NH, Tq],
   then dK|dV (one launch, or dV then dK), then dQ */
template <typename E, int HS>
static void us__flash_block_bwd_hs(float *dq, float *dkv, const E *dout, const E *qkv, const E *out,
                                   const float *lse, const E *kv, const int32_t *qpos,
                                   const int32_t *kpos, float *D, int B, int Tq, int Tk, int NH,
                                   int NKV, cudaStream_t stream) {
    float *L2 = D + (size_t)B * NH * Tq;
    us__flash_bwd_dot<HS, E>(dout, out, D, B, Tq, NH, stream, lse, L2);
    if constexpr (us__fa_cfg<HS>::kv_split) {
        us__flash_block_dkdv<E, HS, 1>(dkv, dout, qkv, L2, D, kv, qpos, kpos, B, Tq, Tk, NH, NKV,
                                       stream);
        us__flash_block_dkdv<E, HS, 2>(dkv, dout, qkv, L2, D, kv, qpos, kpos, B, Tq, Tk, NH, NKV,
                                       stream);
    } else {
        us__flash_block_dkdv<E, HS>(dkv, dout, qkv, L2, D, kv, qpos, kpos, B, Tq, Tk, NH, NKV,
                                    stream);
    }
    us__flash_block_dq<E, HS>(dq, dout, qkv, L2, D, kv, qpos, kpos, B, Tq, Tk, NH, NKV, stream);
}

/* The head sizes the block kernels are compiled for (the ones real models use); f(hs) is called
   with hs a us__fa_hs<HS> when HS is one of them. Returns whether it was. */
template <int HS>
struct us__fa_hs {
    static constexpr int value = HS;
};

template <typename F>
static int us__fa_block_heads(int HS, F f) {
    switch (HS) {
    case 64:
        f(us__fa_hs<64>());
        return 1;
    case 80:
        f(us__fa_hs<80>());
        return 1;
    case 96:
        f(us__fa_hs<96>());
        return 1;
    case 128:
        f(us__fa_hs<128>());
        return 1;
    case 192:
        f(us__fa_hs<192>());
        return 1;
    case 256:
        f(us__fa_hs<256>());
        return 1;
    }
    return 0;
}

/* The ops: bf16 or fp16 at HS 64, 80, 96, 128, 192, 256 on sm_80+, with 16-byte aligned 16-bit
   tensors (cp.async) and 8-byte aligned fp32 ones (float2), takes the flash kernels; anything else
   (fp32, other head sizes, older GPUs) the portable ones. */
static int us__aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

static int us__flash_block_path_ok(us_ops *o, us_dtype dt, int HS) {
    return (dt == US_BF16 || dt == US_F16) && us__fa_block_heads(HS, [](auto) {}) &&
           us__cu(o)->cc_major >= 8;
}

static int us__flash_block_ok(us_ops *o, us_dtype dt, int HS, int NH, int NKV, int64_t B,
                              int64_t Tq, int64_t Tk) {
    return us__flash_block_path_ok(o, dt, HS) && NKV > 0 && NH % NKV == 0 && B < 65536 &&
           Tq <= INT_MAX / 2 && Tk <= INT_MAX / 2;
}

template <typename E>
static void us__flash_block_fwd_e(float *acc, float *m, float *l, const void *qkv, const void *kv,
                                  const int32_t *qpos, const int32_t *kpos, int B, int Tq, int Tk,
                                  int NH, int NKV, int HS, int init, cudaStream_t st) {
    us__fa_block_heads(HS, [&](auto hs) {
        us__flash_block_fwd_hs<E, decltype(hs)::value>(acc, m, l, (const E *)qkv, (const E *)kv,
                                                       qpos, kpos, B, Tq, Tk, NH, NKV, init, st);
    });
}

/* ---- Hopper (sm_90a): the block kernels on // >>cuda-hopper's machinery ----------------
   The three kernels above, rebuilt from the pieces of // >>cuda-hopper (TMA copies, wgmma,
   a producer warpgroup and ping-ponging consumers) with the positions of ring attention. The
   forward's and the dQ kernel's producers and consumers are the causal kernels' own
   (us__hop_fwd_produce, us__hop_fwd_consume, us__hop_dq_produce, us__hop_dq_consume) in the
   mask mode us__hop_bypos below; the dK/dV kernel shares its tile (us__hop_dkdv_tile). So:
     - the tiles visited come from a bitmask (us__hop_vis), from the smallest and largest
       position of every run of 64 (us__hop_pos_ranges, one small kernel per call): the
       producer loads only visible tiles. The forward and dQ kernels are persistent grids that
       walk the query tiles as the causal ones do (us__hop_block_walk), each tile's bitmask
       written beforehand by a small kernel (us__hop_block_tiles), a tile that sees nothing
       skipped; the dK/dV kernel runs a CTA per key block, which builds its own before its
       roles split and exits when it sees nothing. The forward's and the dQ kernel's copy
       thread walks the bitmask and posts each stage's tile with its ranges in shared memory
       (us__hop_kts), so the consumers' GEMMs never wait on those loads;
     - a consumer classifies each tile against its own 64 rows by the same ranges: hidden
       (skipped: its turns at the tensor cores are still taken), wholly visible (no mask), or
       partly visible (masked by position, key j hidden from query i when kpos[j] > qpos[i]).
       In plain and zig-zag ring attention a rank's positions are one or two contiguous runs,
       so only the tiles on a run's edge or on the diagonal are masked, and there the keys are
       one ascending run (the ranges say so), so the mask is arithmetic, as the causal one;
       other positions are read from kpos. The forward carries P·V one tile behind, so its
       consumers compute every CTA tile up to their own last visible one (a hidden one in
       between is masked whole) and only take turns after it, as the causal forward does;
     - each kernel branches once per tile on its class into a copy with or without mask code
       (us__hop_by_mode): the mask, a function that may read kpos, would otherwise make the
       compiler branch around every score of every tile, wholly visible ones too;
     - keys past Tk have position +inf and queries past Tq −inf, so a tail tile is always
       masked, and TMA zero-fills its rows;
     - K and V come from the block buffer kv [B][Tk][2·NKV·HS] through their own tensor map;
       the forward's consumers start from the fp32 state (or fresh when init) and write it back
       unnormalised; the backward adds fp32 dQ and dK|dV, each element owned by one thread and
       summed in a fixed order (no atomics), as the mma.sync kernels promise. */

/* rng[c] = {min, max, run, 0} of pos[64c .. 64c + 63], pad past n (+inf for keys, −inf for
   queries: a tail makes its tile partly visible, never wholly); run = 1 when the 64 are
   min, min + 1, ..., in order (then a mask needs no position from memory). A warp per 64. */
__global__ void __launch_bounds__(256)
    us__hop_pos_ranges(int4 *__restrict__ rng, const int32_t *__restrict__ pos, int n, int pad) {
    const int c = (int)blockIdx.x * 8 + (int)(threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (c >= (n + 63) / 64) return;
    const int i = c * 64 + lane;
    const int a = i < n ? pos[i] : pad;
    const int z = i + 32 < n ? pos[i + 32] : pad;
    const unsigned base = (unsigned)__shfl_sync(0xffffffffu, a, 0);
    const int run = __all_sync(0xffffffffu, i + 32 < n && (unsigned)a == base + lane &&
                                                (unsigned)z == base + 32 + lane);
    const int lo = us__warp_min(min(a, z));
    const int hi = us__warp_max(max(a, z));
    if (lane == 0) rng[c] = make_int4(lo, hi, run, 0);
}

/* {min, max, run} over runs c0 .. c0 + nr − 1 of 64 positions (those below n64; run: all of
   them one ascending run); {+inf, −inf} when none is: a warpgroup past the end sees nothing */
static __device__ __forceinline__ int4 us__hop_runs(const int4 *__restrict__ rng, int c0, int nr,
                                                    int n64) {
    int4 r = make_int4(INT_MAX, INT_MIN, 1, 0);
    for (int k = 0; k < nr; k++) {
        if (c0 + k >= n64) {
            r.z = 0;
            break;
        }
        const int4 x = rng[c0 + k];
        r.z = r.z && x.z && (k == 0 || (unsigned)x.x == (unsigned)r.y + 1u);
        r.x = min(r.x, x.x);
        r.y = max(r.y, x.y);
    }
    return r;
}

/* Bit t of vis: tile t (TILE positions of n) holds something the CTA sees. KEYS: a key ≤ bound
   (the CTA's largest query position); else a query ≥ bound (its smallest key position). Every
   thread of the CTA; ends with a barrier; returns the number of visible tiles. */
template <int TILE, bool KEYS>
static __device__ int us__hop_vis(unsigned *vis, const int4 *__restrict__ rng, int n, int bound) {
    const int n64 = (n + 63) / 64, nt = (n + TILE - 1) / TILE, nw = (nt + 31) / 32;
    for (int t0 = 0; t0 < nw * 32; t0 += (int)blockDim.x) {
        const int t = t0 + (int)threadIdx.x;
        bool hit = false;
        if (t < nt) {
            const int4 r = us__hop_runs(rng, t * (TILE / 64), TILE / 64, n64);
            hit = KEYS ? r.x <= bound : r.y >= bound;
        }
        const unsigned bits = __ballot_sync(0xffffffffu, hit);
        if ((threadIdx.x & 31) == 0 && t < nw * 32) vis[t >> 5] = bits;
    }
    __syncthreads();
    int cnt = 0;
    for (int w = 0; w < nw; w++) cnt += __popc(vis[w]);
    return cnt;
}

/* the 32-bit words of a query tile's row in the walk table (us__hop_block_tiles): a bit per key
   tile of BC of the block's Tk keys */
static __host__ __device__ __forceinline__ int us__hop_vis_words(int64_t Tk, int BC) {
    return (int)(((Tk + BC - 1) / BC + 31) / 32);
}

/* The block kernels' mask mode (us__hop_causal's counterpart, the same members): the visible
   key tiles of the bitmask vis, in order. A tile is partly visible to a consumer when some key
   comes after its rows' smallest position (qmin), hidden when every key comes after their
   largest (qmax); key j is hidden from query i when kpos[j] > qpos[i], by arithmetic when the
   tile's keys are one ascending run (kt.r.z), else read from kpos (past Tk: +inf). */
template <int BC>
struct us__hop_bypos {
    const unsigned *vis;
    const int4 *krng;
    const int32_t *kpos;
    int n, nc, nkt, nk64, Tk;
    /* this warpgroup's smallest and largest query position; the thread's two (scalars, not an
       array: an array indexed by e/2 kept the whole struct in memory until the loops unrolled,
       and the dQ consumer then tested ks.n again and zeroed its accumulators on two paths) */
    int qmin, qmax, qp0, qp1;

    /* the block's keys: Tk of them, their ranges krng and the bitmask vis */
    __device__ __forceinline__ void keys(const unsigned *v, const int4 *kr, const int32_t *kp,
                                         int tk) {
        vis = v;
        krng = kr;
        kpos = kp;
        nkt = (tk + BC - 1) / BC;
        nk64 = (tk + 63) / 64;
        Tk = tk;
    }

    /* ... as query tile qt's row of the walk table gvis sees them, cnt of its tiles visible */
    __device__ __forceinline__ void tile(const unsigned *gvis, int qt, int cnt, const int4 *kr,
                                         const int32_t *kp, int tk) {
        keys(gvis + (int64_t)qt * us__hop_vis_words(tk, BC), kr, kp, tk);
        n = cnt;
    }

    /* this consumer's rows: run c0 of qrng, the thread's rows row0, row0 + 8 (−inf past Tq) */
    __device__ __forceinline__ void rows(const int4 *qrng, int c0, int nq64, const int32_t *qpos,
                                         int row0, int Tq) {
        const int4 qr = us__hop_runs(qrng, c0, 1, nq64);
        qmin = qr.x;
        qmax = qr.y;
        qp0 = row0 < Tq ? qpos[row0] : INT_MIN;
        qp1 = row0 + 8 < Tq ? qpos[row0 + 8] : INT_MIN;
    }

    __device__ __forceinline__ int first(void) const { return us__fa_next_tile(vis, -1, nkt); }

    __device__ __forceinline__ int next(int t) const { return us__fa_next_tile(vis, t, nkt); }

    __device__ __forceinline__ us__hop_kt at(int t) const {
        return {t, us__hop_runs(krng, t * (BC / 64), BC / 64, nk64)};
    }

    static constexpr bool POSTED = true;

    __device__ __forceinline__ void post(us__hop_kt *kts, int s, const us__hop_kt &kt) const {
        kts[s] = kt;
    }

    __device__ __forceinline__ us__hop_kt posted(const us__hop_kt *kts, int s, int) const {
        return kts[s];
    }

    __device__ __forceinline__ bool part(const us__hop_kt &kt) const { return kt.r.y > qmin; }

    __device__ __forceinline__ bool skip(const us__hop_kt &kt) const { return kt.r.x > qmax; }

    __device__ __forceinline__ bool masked(const us__hop_kt &kt, int off, int e) const {
        const int key = kt.t * BC + off;
        const int kp = kt.r.z ? kt.r.x + off : key < Tk ? kpos[key] : INT_MAX;
        return kp > (e >> 1 ? qp1 : qp0);
    }
};

/* ---- forward ------------------------------------------------------------------------ */
/* The state of the thread's rows row0, row0 + 8 (m into the log2 domain; l into lane 0 of the
   quad, whose sum is the row's), or a fresh one when init or past Tq */
template <int HS>
static __device__ __forceinline__ void
us__hop_state_load(float (&o)[HS / 8][4], float (&m)[2], float (&l)[2], const float *acc,
                   const float *mst, const float *lst, int row0, int b, int h, int Tq, int NH,
                   int init, int lane) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        const int64_t i = ((int64_t)b * NH + h) * Tq + row;
        const bool fresh = init || row >= Tq;
        m[r] = fresh ? -INFINITY : mst[i] * US__LOG2E;
        l[r] = fresh || (lane & 3) ? 0.f : lst[i];
        const float *ar = acc + i * HS + 2 * (lane & 3);
#pragma unroll
        for (int ii = 0; ii < HS / 8; ii++) {
            const float2 v =
                fresh ? make_float2(0.f, 0.f) : *reinterpret_cast<const float2 *>(ar + ii * 8);
            o[ii][2 * r] = v.x;
            o[ii][2 * r + 1] = v.y;
        }
    }
}

/* the state back: acc unnormalised, m in natural-log units, l summed over the quad */
template <int HS>
static __device__ __forceinline__ void
us__hop_state_store(const float (&o)[HS / 8][4], const float (&m)[2], float (&l)[2], float *acc,
                    float *mst, float *lst, int row0, int b, int h, int Tq, int NH, int lane) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = row0 + 8 * r;
        if (row >= Tq) continue;
        const int64_t i = ((int64_t)b * NH + h) * Tq + row;
        if ((lane & 3) == 0) {
            mst[i] = m[r] * 0.69314718055994531f;
            lst[i] = l[r];
        }
        float *ar = acc + i * HS + 2 * (lane & 3);
#pragma unroll
        for (int ii = 0; ii < HS / 8; ii++)
            *reinterpret_cast<float2 *>(ar + ii * 8) = make_float2(o[ii][2 * r], o[ii][2 * r + 1]);
    }
}

/* sLast[c]: the last tile of the bitmask that consumer c's 64 rows (runs c0 + c of qrng) can
   see, −1 for none (sLast starts at −1). Every thread, before a barrier (us__hop_bars_init). */
template <int BC, int NW>
static __device__ void us__hop_last_seen(int *sLast, const unsigned *vis, const int4 *krng, int nkt,
                                         int nk64, const int4 *qrng, int c0, int nq64) {
    int qmax[NW];
#pragma unroll
    for (int c = 0; c < NW; c++) qmax[c] = us__hop_runs(qrng, c0 + c, 1, nq64).y;
    for (int t = threadIdx.x; t < nkt; t += blockDim.x) {
        if (!((vis[t >> 5] >> (t & 31)) & 1u)) continue;
        const int lo = us__hop_runs(krng, t * (BC / 64), BC / 64, nk64).x;
#pragma unroll
        for (int c = 0; c < NW; c++)
            if (lo <= qmax[c]) atomicMax(sLast + c, t);
    }
}

/* how many tiles of the bitmask come up to tile last (inclusive; last −1: none) */
static __device__ __forceinline__ int us__hop_vis_upto(const unsigned *vis, int last) {
    int n = 0;
    for (int w = 0; last >= 0 && w <= last >> 5; w++) {
        unsigned bits = vis[w];
        if (w == last >> 5 && (last & 31) != 31) bits &= (2u << (last & 31)) - 1u;
        n += __popc(bits);
    }
    return n;
}

/* The key tiles (of BC) each query tile (of BR = 64·NW rows) of a block sees, one CTA of 128
   threads per query tile: vis [nqt][nw] (bit t: key tile t holds a key at or before the tile's
   largest query position; nw words a tile), then cnt [nqt][1 + NW]: how many, and for each
   consumer's 64 rows how many come up to the last one those rows can see (us__hop_last_seen).
   Ring attention gives every (batch, head) the same positions, so the persistent block kernels
   read each tile's walk from here, where a CTA per tile had built its own before its roles split,
   an idle SM while it did. */
template <int BR, int BC>
__global__ void __launch_bounds__(128)
    us__hop_block_tiles(unsigned *__restrict__ gvis, int *__restrict__ gcnt,
                        const int4 *__restrict__ qrng, const int4 *__restrict__ krng, int Tq,
                        int Tk) {
    constexpr int NW = BR / 64;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    unsigned *vis = (unsigned *)us__hop_raw; /* [nw] */
    __shared__ int sLast[NW];
    const int qt = blockIdx.x, nq64 = (Tq + 63) / 64, nk64 = (Tk + 63) / 64;
    const int nkt = (Tk + BC - 1) / BC, nw = us__hop_vis_words(Tk, BC);
    if (threadIdx.x < NW) sLast[threadIdx.x] = -1;
    const int n = us__hop_vis<BC, true>(vis, krng, Tk, us__hop_runs(qrng, qt * NW, NW, nq64).y);
    us__hop_last_seen<BC, NW>(sLast, vis, krng, nkt, nk64, qrng, qt * NW, nq64);
    __syncthreads();
    for (int w = threadIdx.x; w < nw; w += blockDim.x) gvis[(int64_t)qt * nw + w] = vis[w];
    int *cnt = gcnt + (int64_t)qt * (1 + NW);
    if (threadIdx.x == 0) cnt[0] = n;
    if (threadIdx.x < NW) cnt[1 + threadIdx.x] = us__hop_vis_upto(vis, sLast[threadIdx.x]);
}

/* This CTA's walk over the query tiles of BR rows of a block kernel (nqb per head and batch,
   U in all, G CTAs), in the causal kernels' order (us__hop_snake over us__hop_qtile_of: the last
   query tiles first, which see the most keys in ring attention's blocks): tile(q, n, rg) for a
   tile that sees n > 0 of the block's key tiles (n from cnt [nqt][CS]), empty(q) for one that
   sees none. Only the first kind goes through the rings (us__hop_ring); rg.last looks past the
   empty ones. */
template <int BR, int CS, typename F, typename Fe>
static __device__ __forceinline__ void us__hop_block_walk(const int *__restrict__ cnt, int nqb,
                                                          int U, int G, int B, int NH, int NKV,
                                                          int P, const F &tile, const Fe &empty) {
    const auto at = [&](int u) { return us__hop_qtile_of(u, nqb, BR, NH, B, NKV, P); };
    const auto seen = [&](const us__hop_qtile &q) { return cnt[q.q0 / BR * CS]; };
    us__hop_ring rg;
    int k = 0;
    for (int u = us__hop_snake(blockIdx.x, 0, G); u < U;) {
        const us__hop_qtile q = at(u);
        const int n = seen(q);
        u = us__hop_snake(blockIdx.x, ++k, G);
        if (n == 0) {
            empty(q);
            continue;
        }
        int v = u, kv = k; /* the next tile with work, if any */
        while (v < U && seen(at(v)) == 0) v = us__hop_snake(blockIdx.x, ++kv, G);
        rg.last = v >= U;
        tile(q, n, rg);
        rg.base += n;
        rg.j++;
    }
}

/* The block forward, a persistent grid (one CTA per SM) over the tiles of 64·NWF queries of
   every (head, batch) as the causal forward walks them: the state of a tile's rows carried
   through its visible key tiles of kv (us__hop_fwd_consume, by position; the walk from
   us__hop_block_tiles), the rings running on from one tile to the next. A tile that sees no key
   of the block keeps its state, or starts it (init). */
template <typename E, int HS>
__global__ void __launch_bounds__(128 * (1 + us__hop_cfg<HS>::NWF), 1)
    us__hop_block_fwd_kernel(const __grid_constant__ CUtensorMap mq,
                             const __grid_constant__ CUtensorMap mkv, float *__restrict__ acc,
                             float *__restrict__ mst, float *__restrict__ lst,
                             const int32_t *__restrict__ qpos, const int32_t *__restrict__ kpos,
                             const int4 *__restrict__ qrng, const int4 *__restrict__ krng,
                             const unsigned *__restrict__ gvis, const int *__restrict__ gcnt, int B,
                             int Tq, int Tk, int NH, int NKV, int P, int init, float sl2) {
#if US__HOP_DEV
    using C = us__hop_cfg<HS>;
    constexpr int NW = C::NWF, BR = 64 * NW, BC = C::BC;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const us__hop_fwd_smem<HS, C::FSB> sm(us__hop_smem_base(us__hop_raw));
    const int nqb = (Tq + BR - 1) / BR, U = nqb * NH * B, G = gridDim.x, nq64 = (Tq + 63) / 64;
    const int wg = us__hop_wg(), tid = threadIdx.x & 127;
    sm.init(128 * NW);

    if (wg == 0) { /* producer: one thread issues every copy */
        us__hop_regs_producer<NW>();
        if (tid != 0) return;
        us__hop_block_walk<BR, 1 + NW>(
            gcnt, nqb, U, G, B, NH, NKV, P,
            [&](const us__hop_qtile &q, int n, const us__hop_ring &rg) {
                us__hop_bypos<BC> ks;
                ks.tile(gvis, q.q0 / BR, n, krng, kpos, Tk);
                us__hop_fwd_produce<HS>(sm, &mq, &mkv, ks, q.h * HS, q.g * HS, (NKV + q.g) * HS,
                                        q.b, q.q0, rg);
            },
            [](const us__hop_qtile &) {});
        return;
    }
    us__hop_regs_consumer<NW>();
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    us__hop_block_walk<BR, 1 + NW>(
        gcnt, nqb, U, G, B, NH, NKV, P,
        [&](const us__hop_qtile &q, int n, const us__hop_ring &rg) {
            const int row0 = q.q0 + 64 * c + 16 * warp + (lane >> 2); /* rows row0 + 8r */
            us__hop_bypos<BC> ks;
            ks.tile(gvis, q.q0 / BR, n, krng, kpos, Tk);
            ks.rows(qrng, q.q0 / 64 + c, nq64, qpos, row0, Tq);
            ks.nc = gcnt[q.q0 / BR * (1 + NW) + 1 + c];
            float o[HS / 8][4], m[2], l[2];
            us__hop_state_load<HS>(o, m, l, acc, mst, lst, row0, q.b, q.h, Tq, NH, init, lane);
            us__hop_fwd_consume<E, HS>(o, m, l, sm, ks, c, lane, sl2, rg);
            us__hop_state_store<HS>(o, m, l, acc, mst, lst, row0, q.b, q.h, Tq, NH, lane);
        },
        [&](const us__hop_qtile &q) {
            if (!init) return; /* the state stays */
            const int row0 = q.q0 + 64 * c + 16 * warp + (lane >> 2);
            float o[HS / 8][4], m[2], l[2]; /* a fresh state (init), stored as no key changed it */
            us__hop_state_load<HS>(o, m, l, acc, mst, lst, row0, q.b, q.h, Tq, NH, init, lane);
            us__hop_state_store<HS>(o, m, l, acc, mst, lst, row0, q.b, q.h, Tq, NH, lane);
        });
#else
    (void)mq, (void)mkv, (void)acc, (void)mst, (void)lst, (void)qpos, (void)kpos, (void)qrng,
        (void)krng, (void)gvis, (void)gcnt, (void)B, (void)Tq, (void)Tk, (void)NH, (void)NKV,
        (void)P, (void)init, (void)sl2;
    __trap();
#endif
}

/* ---- backward ----------------------------------------------------------------------- */
/* The (query head, visible query tile) after (hi, qt) of a dK/dV CTA: head by head, the visible
   tiles in order; hi reaches grp after the last */
static __device__ __forceinline__ void us__hop_block_next(const unsigned *vis, int nqt, int first,
                                                          int &hi, int &qt) {
    qt = us__fa_next_tile(vis, qt, nqt);
    if (qt >= nqt) {
        qt = first;
        hi++;
    }
}

/* The dK/dV kernel's copy thread: K and V of the CTA's keys (rows k0.. of kv) once, then Q and
   dO of every (head of the group, visible query tile) through the ring */
template <int HS>
static __device__ __forceinline__ void
us__hop_block_dkdv_produce(unsigned char *sK, unsigned char *sV, unsigned char *sQ,
                           unsigned char *sdO, uint64_t *barKV, uint64_t *full, uint64_t *empty,
                           const CUtensorMap *mq, const CUtensorMap *mdo, const CUtensorMap *mkv,
                           const unsigned *vis, int nqt, int g, int b, int k0, int grp, int NKV) {
    using C = us__hop_cfg<HS>;
    constexpr int BK = 64 * C::NWG, BQ = C::BQ, S = C::BS;
    constexpr int KB = BK * C::HSP * 2, QB = BQ * C::HSP * 2;
    us__mb_expect(barKV, 2 * KB);
    us__tma_tile<HS, BK>(sK, mkv, g * HS, k0, b, barKV);
    us__tma_tile<HS, BK>(sV, mkv, (NKV + g) * HS, k0, b, barKV);
    const int first = us__fa_next_tile(vis, -1, nqt);
    int it = 0;
    for (int hi = 0, qt = first; hi < grp; it++, us__hop_block_next(vis, nqt, first, hi, qt)) {
        const int s = it % S, h = g * grp + hi;
        if (it >= S) us__mb_wait(empty + s, ((it / S) - 1) & 1);
        us__mb_expect(full + s, 2 * QB);
        us__tma_tile<HS, BQ>(sQ + s * QB, mq, h * HS, qt * BQ, b, full + s);
        us__tma_tile<HS, BQ>(sdO + s * QB, mdo, h * HS, qt * BQ, b, full + s);
    }
}

/* The dK/dV kernel's warp 1: L2, D and the positions of each stage's queries into shared
   memory (past Tq: L2 = +inf, position −inf), then an arrival on the stage's "full" barrier */
template <int HS>
static __device__ __forceinline__ void
us__hop_block_rows(float *sL, float *sD, int *sQp, uint64_t *full, uint64_t *empty,
                   const float *__restrict__ L2g, const float *__restrict__ Dg,
                   const int32_t *__restrict__ qpos, const unsigned *vis, int nqt, int g, int b,
                   int grp, int Tq, int NH, int lane) {
    constexpr int BQ = us__hop_cfg<HS>::BQ, S = us__hop_cfg<HS>::BS;
    const int first = us__fa_next_tile(vis, -1, nqt);
    int it = 0;
    for (int hi = 0, qt = first; hi < grp; it++, us__hop_block_next(vis, nqt, first, hi, qt)) {
        const int s = it % S;
        if (it >= S) us__mb_wait(empty + s, ((it / S) - 1) & 1);
#pragma unroll 1
        for (int i = lane; i < BQ; i += 32) {
            const int q = qt * BQ + i;
            const int64_t x = ((int64_t)b * NH + g * grp + hi) * Tq + q;
            sL[s * BQ + i] = q < Tq ? L2g[x] : INFINITY;
            sD[s * BQ + i] = q < Tq ? Dg[x] : 0.f;
            sQp[s * BQ + i] = q < Tq ? qpos[q] : INT_MIN;
        }
        us__mb_arrive(full + s);
    }
}

/* dK and dV of the thread's keys key0, key0 + 8 added into dkv [B][Tk][2·NKV·HS] fp32 (dK is
   already scaled: dS was) */
template <int HS, bool DK, bool DV>
static __device__ __forceinline__ void
us__hop_block_dkv_add(float *dkv, const float (&dk)[DK ? HS / 8 : 1][4],
                      const float (&dv)[DV ? HS / 8 : 1][4], int key0, int b, int g, int Tk,
                      int NKV, int lane) {
    const int64_t KVW = (int64_t)2 * NKV * HS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= Tk) continue;
        float *row = dkv + ((int64_t)b * Tk + key) * KVW;
        if constexpr (DK) us__fa_add_row<HS>(row + (int64_t)g * HS, dk, r, 1.f, lane);
        if constexpr (DV) us__fa_add_row<HS>(row + (int64_t)(NKV + g) * HS, dv, r, 1.f, lane);
    }
}

/* The block backward's dS through memory (us__hop_block_dkdv_kernel's DS): a blob of BQ·256
   bytes for each (head of the chunk, key block of 128 of nkb, query tile of BQ of nqt), every
   pair of tiles in its place, seen or not (us__hop_block_ds_bytes); the index of one */
static __host__ __device__ __forceinline__ int64_t us__hop_block_blob(int64_t head, int kb, int nkb,
                                                                      int qt, int nqt) {
    return (head * nkb + kb) * nqt + qt;
}

/* dK, dV of 64·NWG keys of kv head g for this block (PART as us__hop_dkdv_kernel's): every
   query head of the group × visible query tile, us__hop_dkdv_kernel's per-tile math
   (us__hop_dkdv_tile, by position), a tile hidden from a consumer's keys skipped. One CTA per
   (kv head, batch, key block). DS: per (pair p0 + blockIdx.x = b·NKV + g, key block), every
   tile's dSᵀ (scaled) also into dsw, a blob per (the chunk's head, key block, query tile of
   BQ), for us__hop_block_dqs_kernel; the half of a tile that a consumer skips is not written. */
template <typename E, int HS, int PART, bool DS = false>
__global__ void __launch_bounds__(128 * (1 + us__hop_cfg<HS>::NWG), 1)
    us__hop_block_dkdv_kernel(const __grid_constant__ CUtensorMap mq,
                              const __grid_constant__ CUtensorMap mdo,
                              const __grid_constant__ CUtensorMap mkv,
                              const float *__restrict__ L2g, const float *__restrict__ Dg,
                              float *__restrict__ dkv, const int32_t *__restrict__ qpos,
                              const int32_t *__restrict__ kpos, const int4 *__restrict__ qrng,
                              const int4 *__restrict__ krng, int Tq, int Tk, int NH, int NKV,
                              float scale, float sl2, uint4 *__restrict__ dsw, int p0) {
#if US__HOP_DEV
    using C = us__hop_cfg<HS>;
    constexpr int NWG = C::NWG, BK = 64 * NWG, BQ = C::BQ, S = C::BS;
    /* the first k-steps of K in registers as the causal kernel's (us__hop_cfg::KRK) where they
       pay here: fewer at HS 128 (the positions and ranges held here leave room for two), none at
       HS 80, whose K and V whole ran this kernel slower (bench/RESULTS.md); V never */
    constexpr int KRK = PART != 0 || HS == 80 ? 0 : HS == 128 ? 2 : C::KRK;
    constexpr bool DV = PART != 2, DK = PART != 1;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const us__hop_dkdv_smem<HS, true> sm(us__hop_smem_base(us__hop_raw));
    unsigned *vis = (unsigned *)(sm.barKV + 32); /* [⌈query tiles / 32⌉] */
    int g = blockIdx.x, b = blockIdx.y;          /* the grid: NKV × B × key blocks */
    if constexpr (DS) {                          /* a chunk's pairs by blockIdx.x */
        g = (p0 + (int)blockIdx.x) % NKV;
        b = (p0 + (int)blockIdx.x) / NKV;
    }
    const int k0 = blockIdx.z * BK, grp = NH / NKV;
    const int nqt = (Tq + BQ - 1) / BQ, nq64 = (Tq + 63) / 64, nk64 = (Tk + 63) / 64;
    const int nvis =
        us__hop_vis<BQ, false>(vis, qrng, Tq, us__hop_runs(krng, k0 / 64, NWG, nk64).x);
    if (nvis == 0) return; /* no query sees these keys: nothing to add */
    const int wg = us__hop_wg(), tid = threadIdx.x & 127, nit = grp * nvis;
    /* full: the copy thread and warp 1's lanes */
    us__hop_bars_init(sm.barKV, S, 1 + 32, 128 * NWG);

    if (wg == 0) {
        us__hop_regs_producer<NWG>();
        const int warp = tid >> 5, lane = tid & 31;
        if (warp == 0 && lane == 0)
            us__hop_block_dkdv_produce<HS>(sm.sK, sm.sV, sm.sQ, sm.sdO, sm.barKV, sm.full, sm.empty,
                                           &mq, &mdo, &mkv, vis, nqt, g, b, k0, grp, NKV);
        else if (warp == 1)
            us__hop_block_rows<HS>(sm.sL, sm.sD, sm.sQp, sm.full, sm.empty, L2g, Dg, qpos, vis, nqt,
                                   g, b, grp, Tq, NH, lane);
        return;
    }
    us__hop_regs_consumer<NWG>();
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    const int key0 = k0 + 64 * c + 16 * warp + (lane >> 2); /* the thread's keys: key0 + 8r */
    const int4 kr = us__hop_runs(krng, k0 / 64 + c, 1, nk64);
    const int kp[2] = {key0 < Tk ? kpos[key0] : INT_MAX, key0 + 8 < Tk ? kpos[key0 + 8] : INT_MAX};
    float dk[DK ? HS / 8 : 1][4], dv[DV ? HS / 8 : 1][4];
    us__hop_zero(dk);
    us__hop_zero(dv);
    us__mb_wait(sm.barKV, 0);
    uint32_t kf[KRK ? KRK : 1][4]; /* K as A fragments */
#pragma unroll
    for (int kk = 0; kk < KRK; kk++) us__hop_lda<BK>(kf[kk], sm.sK, 64 * c, kk, warp, lane);

    if (NWG == 2 && c == 1) us__hop_bar_arrive(1);
    const int first = us__fa_next_tile(vis, -1, nqt);
    for (int it = 0, hi = 0, qt = first; it < nit;
         it++, us__hop_block_next(vis, nqt, first, hi, qt)) {
        const int s = it % S;
        const int4 qr = us__hop_runs(qrng, qt * (BQ / 64), BQ / 64, nq64);
        us__mb_wait(sm.full + s, (it / S) & 1);
        if (qr.y < kr.x) { /* no query of the tile sees a key of this warpgroup */
            us__hop_turns_skip<NWG>(c, it + 1 == nit);
        } else {
            /* masked (part) where some key comes after the tile's smallest query */
            const int *tp = sm.sQp + s * BQ;
            const auto hidden = [&](int j, int e) {
                return kp[e >> 1] > tp[j * 8 + 2 * (lane & 3) + (e & 1)];
            };
            /* dS scaled under bf16 too, dK added as it is (us__hop_ds_scale) */
            uint4 *dso = nullptr; /* DS: this thread's place in the tile's blob */
            if constexpr (DS) {
                const int64_t blob = us__hop_block_blob((int64_t)blockIdx.x * grp + hi, blockIdx.z,
                                                        gridDim.z, qt, nqt);
                dso = dsw + blob * BQ * 16 + us__hop_ds_part<BQ>(c, warp, 0) + lane;
            }
            us__hop_dkdv_tile<E, HS, DK, DV, true, KRK, 0>(dk, dv, sm, s, kr.y > qr.x, hidden,
                                                           it + 1 == nit, c, lane, scale, sl2, kf,
                                                           nullptr, dso);
        }
        us__mb_arrive(sm.empty + s);
    }
    us__hop_block_dkv_add<HS, DK, DV>(dkv, dk, dv, key0, b, g, Tk, NKV, lane);
#else
    (void)mq, (void)mdo, (void)mkv, (void)L2g, (void)Dg, (void)dkv, (void)dsw, (void)qpos,
        (void)kpos, (void)qrng, (void)krng, (void)Tq, (void)Tk, (void)NH, (void)NKV, (void)p0,
        (void)scale, (void)sl2;
    __trap();
#endif
}

/* dQ of this block, added into dq [B][Tq][NH·HS] fp32: a persistent grid over the tiles of
   64·NWG queries of every (head, batch) as the causal dQ kernel walks them, each tile's visible
   key tiles in order (us__hop_dq_consume, by position; the walk from us__hop_block_tiles); a
   tile that sees no key of the block adds nothing */
template <typename E, int HS>
__global__ void __launch_bounds__(128 * (1 + us__hop_cfg<HS>::NWG), 1)
    us__hop_block_dq_kernel(const __grid_constant__ CUtensorMap mq,
                            const __grid_constant__ CUtensorMap mdo,
                            const __grid_constant__ CUtensorMap mkv, const float *__restrict__ L2g,
                            const float *__restrict__ Dg, float *__restrict__ dq,
                            const int32_t *__restrict__ qpos, const int32_t *__restrict__ kpos,
                            const int4 *__restrict__ qrng, const int4 *__restrict__ krng,
                            const unsigned *__restrict__ gvis, const int *__restrict__ gcnt, int B,
                            int Tq, int Tk, int NH, int NKV, int P, float scale, float sl2) {
#if US__HOP_DEV
    using C = us__hop_cfg<HS>;
    constexpr int NWG = C::NWG, BR = 64 * NWG, BK = C::BKQ;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const us__hop_dq_smem<HS> sm(us__hop_smem_base(us__hop_raw));
    const int nqb = (Tq + BR - 1) / BR, U = nqb * NH * B, G = gridDim.x, nq64 = (Tq + 63) / 64;
    const int wg = us__hop_wg(), tid = threadIdx.x & 127;
    sm.init(128 * NWG);

    if (wg == 0) {
        us__hop_regs_producer<NWG>();
        if (tid != 0) return;
        us__hop_block_walk<BR, 1 + NWG>(
            gcnt, nqb, U, G, B, NH, NKV, P,
            [&](const us__hop_qtile &q, int n, const us__hop_ring &rg) {
                us__hop_bypos<BK> ks;
                ks.tile(gvis, q.q0 / BR, n, krng, kpos, Tk);
                us__hop_dq_produce<HS>(sm, &mq, &mdo, &mkv, ks, q.h * HS, q.g * HS,
                                       (NKV + q.g) * HS, q.b, q.q0, rg);
            },
            [](const us__hop_qtile &) {});
        return;
    }
    us__hop_regs_consumer<NWG>();
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    us__hop_block_walk<BR, 1 + NWG>(
        gcnt, nqb, U, G, B, NH, NKV, P,
        [&](const us__hop_qtile &q, int n, const us__hop_ring &rg) {
            const int row0 = q.q0 + 64 * c + 16 * warp + (lane >> 2); /* rows row0 + 8r */
            us__hop_bypos<BK> ks;
            ks.tile(gvis, q.q0 / BR, n, krng, kpos, Tk);
            ks.rows(qrng, q.q0 / 64 + c, nq64, qpos, row0, Tq);
            float L2[2], Dr[2], dqa[HS / 8][4];
            us__hop_dq_rows(L2, Dr, L2g, Dg, row0, q.b, q.h, Tq, NH);
            us__hop_zero(dqa);
            us__hop_dq_consume<E, HS>(dqa, sm, ks, L2, Dr, c, lane, scale, sl2, rg);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = row0 + 8 * r;
                if (row < Tq)
                    us__fa_add_row<HS>(dq + ((int64_t)q.b * Tq + row) * NH * HS + (int64_t)q.h * HS,
                                       dqa, r, us__hop_dkq_scale<E>(scale), lane);
            }
        },
        [](const us__hop_qtile &) {});
#else
    (void)mq, (void)mdo, (void)mkv, (void)L2g, (void)Dg, (void)dq, (void)qpos, (void)kpos,
        (void)qrng, (void)krng, (void)gvis, (void)gcnt, (void)B, (void)Tq, (void)Tk, (void)NH,
        (void)NKV, (void)P, (void)scale, (void)sl2;
    __trap();
#endif
}

/* dQ = dS·K of this block from the dS that us__hop_block_dkdv_kernel stored (DS), added into dq
   [B][Tq][NH·HS] fp32, for the heads of pairs p0.. (hc: the chunk's head): one CTA per
   (128 queries, head), consumer c owning rows 64c.., as us__hop_dqs_kernel does for the causal
   backward. The grid: the chunk's heads × query tiles, heads fastest and the last query tiles
   first (ascending positions make them the heaviest, and a grid that ended on them waited for a
   few long CTAs). Its key blocks of 128 are the set bits of the query tile's row of the walk
   table (gvis: us__hop_block_tiles' for 128 × 128), in order (deterministic). A key half that
   the dK/dV kernel skipped for the consumer's query tile of BQ (its largest query position
   before the half's smallest key: that kernel's own test) was not stored and counts as 0. dS
   came scaled: dQ is added as it is. */
template <typename E, int HS>
__global__ void __launch_bounds__(384, 1)
    us__hop_block_dqs_kernel(const __grid_constant__ CUtensorMap mk, const uint4 *__restrict__ ds,
                             float *__restrict__ dq, const int4 *__restrict__ qrng,
                             const int4 *__restrict__ krng, const unsigned *__restrict__ gvis,
                             int Tq, int Tk, int NH, int NKV, int p0) {
#if US__HOP_DEV
    using SM = us__hop_dqs_smem<HS>;
    constexpr int BQ = us__hop_cfg<HS>::BQ, R = 128 / BQ, S = SM::S;
    extern __shared__ __align__(1024) unsigned char us__hop_raw[];
    const SM sm(us__hop_smem_base(us__hop_raw));
    const int nkb = (Tk + 127) / 128, nqt = (Tq + BQ - 1) / BQ;
    const int nq64 = (Tq + 63) / 64, nk64 = (Tk + 63) / 64;
    const int hc = blockIdx.x, i = gridDim.y - 1 - blockIdx.y; /* the chunk's head, query tile */
    const int grp = NH / NKV, pair = p0 + hc / grp, b = pair / NKV, g = pair % NKV;
    const int h = g * grp + hc % grp;
    const unsigned *vis = gvis + (int64_t)i * us__hop_vis_words(Tk, 128);
    const int wg = us__hop_wg(), tid = threadIdx.x & 127;
    sm.init();

    if (wg == 0) {
        if (tid != 0) return;
        const int nb = R == 2 && R * i + 1 < nqt ? 2 : 1; /* the CTA's query tiles */
        for (int n = 0, kb = us__fa_next_tile(vis, -1, nkb); kb < nkb;
             n++, kb = us__fa_next_tile(vis, kb, nkb))
            sm.template load<BQ>(n, &mk, g * HS, kb * 128, b, ds,
                                 us__hop_block_blob(hc, kb, nkb, R * i, nqt), nb);
        return;
    }
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31;
    const int r0 = 128 * i + 64 * c; /* the warpgroup's first query */
    const int qt = R * i + (R == 2 ? c : 0);
    const int qmax = us__hop_runs(qrng, qt * (BQ / 64), BQ / 64, nq64).y; /* the tile's */
    const int mine = us__hop_dqs_mine<BQ>(c, warp, lane);
    float dqa[HS / 8][4];
    us__hop_zero(dqa);
    for (int n = 0, kb = us__fa_next_tile(vis, -1, nkb); kb < nkb;
         n++, kb = us__fa_next_tile(vis, kb, nkb)) {
        const int s = n % S;
        us__mb_wait(sm.full + s, (n / S) & 1);
        if (r0 < Tq)
            us__hop_dqs_step<E, HS, BQ>(dqa, sm.sD + s * SM::DB + mine, sm.sK + s * SM::KB,
                                        qmax >= us__hop_runs(krng, 2 * kb, 1, nk64).x,
                                        qmax >= us__hop_runs(krng, 2 * kb + 1, 1, nk64).x);
        us__mb_arrive(sm.empty + s);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = r0 + 16 * warp + (lane >> 2) + 8 * r;
        if (row < Tq)
            us__fa_add_row<HS>(dq + ((int64_t)b * Tq + row) * NH * HS + (int64_t)h * HS, dqa, r,
                               1.f, lane);
    }
#else
    (void)mk, (void)ds, (void)dq, (void)qrng, (void)krng, (void)gvis, (void)Tq, (void)Tk, (void)NH,
        (void)NKV, (void)p0;
    __trap();
#endif
}

/* ---- host side ---------------------------------------------------------------------- */
/* The bytes of the bitmask of n positions in tiles of TILE (beside a kernel's tiles) */
static size_t us__hop_vis_bytes(int64_t n, int tile) {
    return (size_t)((n + tile - 1) / tile + 31) / 32 * 4;
}

/* The Hopper block kernels for this call? us__hop_ok's conditions, not turned off
   (us_cuda_attention_no_hopper 6), up to 2^20 queries and keys (the dK/dV kernel's bitmask of
   query tiles then fits beside its tiles) and as many query tiles as the persistent walk counts
   (us__hop_walk_fits) */
static int us__hop_block_ok(us_ops *o, us_dtype dt, int HS, int bwd, int NH, int NKV, int64_t B,
                            int64_t Tq, int64_t Tk) {
    return us__hop_ok(o, dt, HS, bwd) && us__cu(o)->hop_off != 6 && NKV > 0 && NH % NKV == 0 &&
           B < 65536 && Tq <= (1 << 20) && Tk <= (1 << 20) && us__hop_walk_fits(B, Tq, NH);
}

/* The bytes of the walk table of query tiles of BR rows against key tiles of BC
   (us__hop_block_tiles: vis [nqt][nw], then cnt [nqt][1 + BR/64]), a multiple of 16. Tiles of
   64 against 64 give an upper bound for every kernel's. */
static size_t us__hop_tiles_bytes(int64_t Tq, int64_t Tk, int BR, int BC) {
    const int64_t nqt = (Tq + BR - 1) / BR, nw = us__hop_vis_words(Tk, BC);
    return (size_t)((nqt * nw + nqt * (1 + BR / 64)) * 4 + 15) / 16 * 16;
}

/* the walk table of query tiles of BR rows against key tiles of BC into tab
   (us__hop_tiles_bytes); returns its cnt */
template <int BR, int BC>
static const int *us__hop_tiles(void *tab, const int4 *qrng, const int4 *krng, int Tq, int Tk,
                                cudaStream_t st) {
    const int nqt = (Tq + BR - 1) / BR, nw = us__hop_vis_words(Tk, BC);
    unsigned *vis = (unsigned *)tab;
    int *cnt = (int *)(vis + (int64_t)nqt * nw);
    us__hop_block_tiles<BR, BC><<<nqt, 128, (size_t)nw * 4, st>>>(vis, cnt, qrng, krng, Tq, Tk);
    return cnt;
}

/* the ranges of runs of 64 positions: qrng [⌈Tq/64⌉], then krng [⌈Tk/64⌉] */
static void us__hop_block_ranges(int4 *rng, const int32_t *qpos, const int32_t *kpos, int64_t Tq,
                                 int64_t Tk, cudaStream_t st) {
    const int64_t nq = (Tq + 63) / 64, nk = (Tk + 63) / 64;
    us__hop_pos_ranges<<<(unsigned)((nq + 7) / 8), 256, 0, st>>>(rng, qpos, (int)Tq, INT_MIN);
    us__hop_pos_ranges<<<(unsigned)((nk + 7) / 8), 256, 0, st>>>(rng + nq, kpos, (int)Tk, INT_MAX);
}

template <typename E, int HS>
static void us__hop_block_fwd_hs(const CUtensorMap &mq, const CUtensorMap &mkv, float *acc,
                                 float *m, float *l, const int32_t *qpos, const int32_t *kpos,
                                 const int4 *rng, void *tab, int B, int Tq, int Tk, int NH, int NKV,
                                 int P, int ctas, int init, cudaStream_t st) {
    using C = us__hop_cfg<HS>;
    constexpr int BR = 64 * C::NWF;
    const int4 *qrng = rng, *krng = rng + (Tq + 63) / 64;
    const int *cnt = us__hop_tiles<BR, C::BC>(tab, qrng, krng, Tq, Tk, st);
    const size_t smem = us__hop_smem(C::fwd_block_bytes);
    cudaFuncSetAttribute(us__hop_block_fwd_kernel<E, HS>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    const int grid = us__hop_grid(Tq, BR, NH, B, ctas);
    us__hop_block_fwd_kernel<E, HS><<<grid, 128 * (1 + C::NWF), smem, st>>>(
        mq, mkv, acc, m, l, qpos, kpos, qrng, krng, (const unsigned *)tab, cnt, B, Tq, Tk, NH, NKV,
        P, init, us__attn_sl2(HS));
}

/* the state of attention by key blocks on Hopper; 0 when this path cannot take the call */
static int us__hop_block_fwd(us_ops *o, float *acc, float *m, float *l, const void *qkv,
                             const void *kv, const int32_t *qpos, const int32_t *kpos, int64_t B,
                             int64_t Tq, int64_t Tk, int NH, int NKV, int HS, int init,
                             us_dtype dt) {
    CUtensorMap mq, mkv;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KVW = (int64_t)2 * NKV * HS;
    cudaStream_t st = us__cu(o)->stream;
    if (!us__hop_block_ok(o, dt, HS, 0, NH, NKV, B, Tq, Tk) || !us__hop_aligned(qkv) ||
        !us__hop_aligned(kv) || !us__aligned(acc, 8) || Tk <= 0)
        return 0;
    const size_t rb = (size_t)((Tq + 63) / 64 + (Tk + 63) / 64) * 16;
    int4 *rng = (int4 *)us__cuda_scratch(o, rb + us__hop_tiles_bytes(Tq, Tk, 64, 64));
    if (!rng) return 1; /* the failure is recorded */
    void *tab = (char *)rng + rb;
    const int ctas = us__hop_ctas(o), P = us__hop_band(o, B, NKV);
#define US__HOP_BLOCK_FWD(H)                                                                   \
    if (HS == H) {                                                                             \
        if (!us__hop_map(&mq, qkv, dt, QKV, Tq, B, 64 * us__hop_cfg<H>::NWF) ||                \
            !us__hop_map(&mkv, kv, dt, KVW, Tk, B, us__hop_cfg<H>::BC))                        \
            return 0;                                                                          \
        us__hop_block_ranges(rng, qpos, kpos, Tq, Tk, st);                                     \
        if (dt == US_F16)                                                                      \
            us__hop_block_fwd_hs<__half, H>(mq, mkv, acc, m, l, qpos, kpos, rng, tab, (int)B,  \
                                            (int)Tq, (int)Tk, NH, NKV, P, ctas, init, st);     \
        else                                                                                   \
            us__hop_block_fwd_hs<__nv_bfloat16, H>(mq, mkv, acc, m, l, qpos, kpos, rng, tab,   \
                                                   (int)B, (int)Tq, (int)Tk, NH, NKV, P, ctas, \
                                                   init, st);                                  \
    }
    US__HOP_HEADS(US__HOP_BLOCK_FWD)
#undef US__HOP_BLOCK_FWD
    US__LAUNCHED(o);
    return 1;
}

/* What the backward's kernels read: maps 0 Q by BQ rows, 1 dO by BQ, 2 K/V of kv by 64·NWG,
   3 Q by 64·NWG, 4 dO by 64·NWG, 5 K/V of kv by BKQ; L2, D [B,NH,Tq]; the ranges; room for
   the dQ kernel's walk table (tab); its persistent grid's CTAs and band (ctas, P: us__hop_ctas,
   us__hop_band) */
struct us__hop_block_in {
    CUtensorMap maps[6];
    const float *L2, *D;
    const int32_t *qpos, *kpos;
    const int4 *qrng, *krng;
    void *tab;
    int ctas, P;
};

/* the block dK/dV kernel over the n pairs p0.. (DS: their dS into ds; else every pair) */
template <typename E, int HS, int PART, bool DS = false>
static void us__hop_block_dkdv_launch(const us__hop_block_in &in, float *dkv, uint4 *ds, int p0,
                                      int n, int Tq, int Tk, int NH, int NKV, cudaStream_t st) {
    using C = us__hop_cfg<HS>;
    const float scale = us__attn_scale(HS), sl2 = us__attn_sl2(HS);
    const size_t smem =
        us__hop_smem(C::dkdv_bytes + C::BS * C::BQ * 4) + us__hop_vis_bytes(Tq, C::BQ);
    cudaFuncSetAttribute(us__hop_block_dkdv_kernel<E, HS, PART, DS>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    const int nkb = (Tk + 64 * C::NWG - 1) / (64 * C::NWG);
    const dim3 grid = DS ? dim3(n, 1, nkb) : dim3(NKV, n / NKV, nkb);
    us__hop_block_dkdv_kernel<E, HS, PART, DS><<<grid, 128 * (1 + C::NWG), smem, st>>>(
        in.maps[0], in.maps[1], in.maps[2], in.L2, in.D, dkv, in.qpos, in.kpos, in.qrng, in.krng,
        Tq, Tk, NH, NKV, scale, sl2, ds, p0);
}

/* The block backward with dS through memory (us__hop_block_ds_pairs' chunks of np pairs): the
   dK/dV kernel stores each tile's dSᵀ, us__hop_block_dqs_kernel forms dQ from it (the causal
   backward's us__hop_bwd_ds, by position) */
template <typename E, int HS>
static void us__hop_block_bwd_ds(const us__hop_block_in &in, float *dq, float *dkv, uint4 *ds,
                                 int np, int B, int Tq, int Tk, int NH, int NKV, cudaStream_t st) {
    using C = us__hop_cfg<HS>;
    if constexpr (C::NWG == 2) {
        const size_t s3 = us__hop_smem(C::dqs_bytes);
        us__hop_tiles<128, 128>(in.tab, in.qrng, in.krng, Tq, Tk, st); /* the dQ walk */
        cudaFuncSetAttribute(us__hop_block_dqs_kernel<E, HS>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s3);
        for (int p0 = 0; p0 < B * NKV; p0 += np) {
            const int n = np < B * NKV - p0 ? np : B * NKV - p0;
            us__hop_block_dkdv_launch<E, HS, 0, true>(in, dkv, ds, p0, n, Tq, Tk, NH, NKV, st);
            us__hop_block_dqs_kernel<E, HS>
                <<<dim3(n * (NH / NKV), (Tq + 127) / 128), 384, s3, st>>>(
                    in.maps[5], ds, dq, in.qrng, in.krng, (const unsigned *)in.tab, Tq, Tk, NH, NKV,
                    p0);
        }
    } else {
        (void)in, (void)dq, (void)dkv, (void)ds, (void)np, (void)B, (void)Tq, (void)Tk, (void)NH,
            (void)NKV, (void)st;
    }
}

/* dK|dV (one launch, or dV then dK above HS 128), then dQ */
template <typename E, int HS>
static void us__hop_block_bwd_hs(const us__hop_block_in &in, float *dq, float *dkv, int B, int Tq,
                                 int Tk, int NH, int NKV, cudaStream_t st) {
    using C = us__hop_cfg<HS>;
    const float scale = us__attn_scale(HS), sl2 = us__attn_sl2(HS);
    const int np = B * NKV;
    if constexpr (C::NWG == 2) {
        us__hop_block_dkdv_launch<E, HS, 0>(in, dkv, nullptr, 0, np, Tq, Tk, NH, NKV, st);
    } else {
        us__hop_block_dkdv_launch<E, HS, 1>(in, dkv, nullptr, 0, np, Tq, Tk, NH, NKV, st);
        us__hop_block_dkdv_launch<E, HS, 2>(in, dkv, nullptr, 0, np, Tq, Tk, NH, NKV, st);
    }
    constexpr int BR = 64 * C::NWG;
    const int *cnt = us__hop_tiles<BR, C::BKQ>(in.tab, in.qrng, in.krng, Tq, Tk, st);
    const size_t smem = us__hop_smem(C::dq_bytes);
    cudaFuncSetAttribute(us__hop_block_dq_kernel<E, HS>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    const int grid = us__hop_grid(Tq, BR, NH, B, in.ctas);
    us__hop_block_dq_kernel<E, HS><<<grid, 128 * (1 + C::NWG), smem, st>>>(
        in.maps[3], in.maps[4], in.maps[5], in.L2, in.D, dq, in.qpos, in.kpos, in.qrng, in.krng,
        (const unsigned *)in.tab, cnt, B, Tq, Tk, NH, NKV, in.P, scale, sl2);
}

/* the six tensor maps of the backward of head size H (us__hop_block_in) */
template <int H>
static int us__hop_block_maps(CUtensorMap *maps, const void *qkv, const void *dout, const void *kv,
                              us_dtype dt, int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV) {
    using C = us__hop_cfg<H>;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * H, OC = (int64_t)NH * H,
                  KVW = (int64_t)2 * NKV * H;
    return us__hop_map(maps + 0, qkv, dt, QKV, Tq, B, C::BQ) &&
           us__hop_map(maps + 1, dout, dt, OC, Tq, B, C::BQ) &&
           us__hop_map(maps + 2, kv, dt, KVW, Tk, B, 64 * C::NWG) &&
           us__hop_map(maps + 3, qkv, dt, QKV, Tq, B, 64 * C::NWG) &&
           us__hop_map(maps + 4, dout, dt, OC, Tq, B, 64 * C::NWG) &&
           us__hop_map(maps + 5, kv, dt, KVW, Tk, B, C::BKQ);
}

/* D and L2 of the block's queries (into D [2][rows], in's D and L2), then its backward: through
   memory in chunks of np pairs (np > 0), else the two kernels */
template <typename E, int HS>
static void us__hop_block_bwd_dt(const us__hop_block_in &in, float *D, float *dq, float *dkv,
                                 uint4 *ds, int np, const void *dout, const void *out,
                                 const float *lse, int64_t B, int64_t Tq, int64_t Tk, int NH,
                                 int NKV, cudaStream_t st) {
    const int64_t rows = B * Tq * NH;
    us__hop_dot<E>(dout, out, lse, D, D + rows, rows, (int)Tq, NH, HS, st);
    if (np)
        us__hop_block_bwd_ds<E, HS>(in, dq, dkv, ds, np, (int)B, (int)Tq, (int)Tk, NH, NKV, st);
    else
        us__hop_block_bwd_hs<E, HS>(in, dq, dkv, (int)B, (int)Tq, (int)Tk, NH, NKV, st);
}

/* the bytes of a block backward's dS through memory (us__hop_block_dkdv_kernel's DS): per
   (batch, head) a blob of BQ·256 bytes for every key block of 128 and query tile of BQ (Tq·Tk
   bytes a head, about: every pair of tiles has its place, seen or not) */
static size_t us__hop_block_ds_bytes(int64_t B, int64_t Tq, int64_t Tk, int NH, int HS) {
    const int BQ = us__hop_bq(HS);
    return (size_t)B * NH * ((Tk + 127) / 128) * ((Tq + BQ - 1) / BQ) * BQ * 256;
}

/* ... the pairs of a chunk of it, as the causal backward's rule (us__hop_ds_chunk) */
static int us__hop_block_ds_pairs(us_ops *o, int HS, int64_t B, int64_t Tq, int64_t Tk, int NH,
                                  int NKV) {
    const us__cuda *c = us__cu(o);
    return us__hop_ds_chunk(HS, c->hop_off, c->hop_ds_pairs, c->mem_total, B * NKV, NH / NKV,
                            us__hop_block_ds_bytes(1, Tq, Tk, NH / NKV, HS));
}

/* dq, dkv += this block's gradients on Hopper; 0 when this path cannot take the call */
static int us__hop_block_bwd(us_ops *o, float *dq, float *dkv, const void *dout, const void *qkv,
                             const void *out, const float *lse, const void *kv, const int32_t *qpos,
                             const int32_t *kpos, int64_t B, int64_t Tq, int64_t Tk, int NH,
                             int NKV, int HS, us_dtype dt) {
    us__hop_block_in in;
    const int64_t rows = B * Tq * NH;
    cudaStream_t st = us__cu(o)->stream;
    if (!us__hop_block_ok(o, dt, HS, 1, NH, NKV, B, Tq, Tk) || !us__hop_aligned(qkv) ||
        !us__hop_aligned(dout) || !us__hop_aligned(out) || !us__hop_aligned(kv) ||
        !us__aligned(dq, 8) || !us__aligned(dkv, 8))
        return 0;
    const size_t dl_bytes = ((size_t)2 * rows * sizeof(float) + 15) / 16 * 16;
    const size_t rb = (size_t)((Tq + 63) / 64 + (Tk + 63) / 64) * 16;
    const size_t tb = us__hop_tiles_bytes(Tq, Tk, 64, 64);
    int np = us__hop_block_ds_pairs(o, HS, B, Tq, Tk, NH, NKV); /* dS through memory */
    const size_t ds_bytes = np ? us__hop_block_ds_bytes(np, Tq, Tk, NH / NKV, HS) : 0;
    float *D = (float *)us__hop_scratch_ds(o, dl_bytes + rb + tb, ds_bytes, &np);
    if (!D) return 1; /* the failure is recorded */
    int4 *rng = (int4 *)((char *)D + dl_bytes);
    in.tab = (char *)rng + rb;
    uint4 *ds = (uint4 *)((char *)in.tab + tb); /* np: dS of a chunk */
    in.ctas = us__hop_ctas(o);
    in.P = us__hop_band(o, B, NKV);
    in.D = D;
    in.L2 = D + rows;
    in.qpos = qpos;
    in.kpos = kpos;
    in.qrng = rng;
    in.krng = rng + (Tq + 63) / 64;
#define US__HOP_BLOCK_BWD(H)                                                                       \
    if (HS == H) {                                                                                 \
        if (!us__hop_block_maps<H>(in.maps, qkv, dout, kv, dt, B, Tq, Tk, NH, NKV)) return 0;      \
        us__hop_block_ranges(rng, qpos, kpos, Tq, Tk, st);                                         \
        if (dt == US_F16)                                                                          \
            us__hop_block_bwd_dt<__half, H>(in, D, dq, dkv, ds, np, dout, out, lse, B, Tq, Tk, NH, \
                                            NKV, st);                                              \
        else                                                                                       \
            us__hop_block_bwd_dt<__nv_bfloat16, H>(in, D, dq, dkv, ds, np, dout, out, lse, B, Tq,  \
                                                   Tk, NH, NKV, st);                               \
    }
    US__HOP_HEADS(US__HOP_BLOCK_BWD)
#undef US__HOP_BLOCK_BWD
    US__LAUNCHED(o);
    return 1;
}

static void us__cuda_attn_block_fwd(us_ops *o, float *acc, float *m, float *l, const void *qkv,
                                    const void *kv, const int32_t *qpos, const int32_t *kpos,
                                    int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV, int HS,
                                    int init, us_dtype dt) {
    cudaStream_t st = us__cu(o)->stream;
    if (B * NH * Tq <= 0) return;
    if (us__hop_block_fwd(o, acc, m, l, qkv, kv, qpos, kpos, B, Tq, Tk, NH, NKV, HS, init, dt))
        return;
    if (us__flash_block_ok(o, dt, HS, NH, NKV, B, Tq, Tk) && us__aligned(qkv, 16) &&
        us__aligned(kv, 16) && us__aligned(acc, 8)) {
        if (dt == US_F16)
            us__flash_block_fwd_e<__half>(acc, m, l, qkv, kv, qpos, kpos, (int)B, (int)Tq, (int)Tk,
                                          NH, NKV, HS, init, st);
        else
            us__flash_block_fwd_e<__nv_bfloat16>(acc, m, l, qkv, kv, qpos, kpos, (int)B, (int)Tq,
                                                 (int)Tk, NH, NKV, HS, init, st);
        US__LAUNCHED(o);
        return;
    }
    us__attn_block_fwd_naive(o, acc, m, l, qkv, kv, qpos, kpos, B, Tq, Tk, NH, NKV, HS, init, dt);
}

template <typename E>
static void us__flash_block_bwd_e(float *dq, float *dkv, const void *dout, const void *qkv,
                                  const void *out, const float *lse, const void *kv,
                                  const int32_t *qpos, const int32_t *kpos, float *D, int B, int Tq,
                                  int Tk, int NH, int NKV, int HS, cudaStream_t st) {
    us__fa_block_heads(HS, [&](auto hs) {
        us__flash_block_bwd_hs<E, decltype(hs)::value>(dq, dkv, (const E *)dout, (const E *)qkv,
                                                       (const E *)out, lse, (const E *)kv, qpos,
                                                       kpos, D, B, Tq, Tk, NH, NKV, st);
    });
}

static void us__cuda_attn_block_bwd(us_ops *o, float *dq, float *dkv, const void *dout,
                                    const void *qkv, const void *out, const float *lse,
                                    const void *kv, const int32_t *qpos, const int32_t *kpos,
                                    int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV, int HS,
                                    us_dtype dt) {
    cudaStream_t st = us__cu(o)->stream;
    if (B * NH * Tq <= 0 || Tk <= 0) return;
    if (us__hop_block_bwd(o, dq, dkv, dout, qkv, out, lse, kv, qpos, kpos, B, Tq, Tk, NH, NKV, HS,
                          dt))
        return;
    if (us__flash_block_ok(o, dt, HS, NH, NKV, B, Tq, Tk) && us__aligned(dout, 16) &&
        us__aligned(qkv, 16) && us__aligned(out, 16) && us__aligned(kv, 16) && us__aligned(dq, 8) &&
        us__aligned(dkv, 8)) {
        float *D = (float *)us__cuda_scratch(o, (size_t)2 * B * NH * Tq * sizeof(float));
        if (!D) {
            us__cuda_fail(o, "attn_block_bwd", "out of device memory for its scratch", __FILE__,
                          __LINE__);
            return;
        }
        if (dt == US_F16)
            us__flash_block_bwd_e<__half>(dq, dkv, dout, qkv, out, lse, kv, qpos, kpos, D, (int)B,
                                          (int)Tq, (int)Tk, NH, NKV, HS, st);
        else
            us__flash_block_bwd_e<__nv_bfloat16>(dq, dkv, dout, qkv, out, lse, kv, qpos, kpos, D,
                                                 (int)B, (int)Tq, (int)Tk, NH, NKV, HS, st);
        US__LAUNCHED(o);
        return;
    }
    us__attn_block_bwd_naive(o, dq, dkv, dout, qkv, out, lse, kv, qpos, kpos, B, Tq, Tk, NH, NKV,
                             HS, dt);
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-moe  mixture-of-experts routing and row movement (simple kernels, the CPU's rules)
/* ------------------------------------------------------------------------------------ */
/* Router: one thread per token, running the CPU reference's own us__moe_route_row (scores, the
   M best groups as a bit mask, top-k by repeated argmax, lower index on ties); rowsum (may be
   NULL) receives Σ_e probs for the aux loss's psum. */
__global__ void us__k_moe_route(int32_t *topk, float *gates, float *probs, float *rowsum,
                                const float *logits, const float *bias, int64_t N, int E, int K,
                                int gate, int G, int M) {
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int e;
    if (n >= N) return;
    us__moe_route_row(topk + n * K, gates + n * K, probs + n * E, logits + n * E, bias, E, K, gate,
                      G, M);
    if (rowsum) {
        double t = 0;
        for (e = 0; e < E; e++) t += probs[n * E + e];
        rowsum[n] = (float)t;
    }
}

/* psum[e] = Σ_n probs[n,e] / rowsum[n]: one block per expert, a fixed order (deterministic) */
__global__ void us__k_moe_psum(float *psum, const float *probs, const float *rowsum, int64_t N,
                               int E) {
    __shared__ double sh[32];
    int e = blockIdx.x;
    int64_t n;
    double acc = 0;
    for (n = threadIdx.x; n < N; n += blockDim.x) acc += (double)probs[n * E + e] / rowsum[n];
    acc = us__block_sum(acc, sh);
    if (threadIdx.x == 0) psum[e] = (float)acc;
}

static void us__cuda_moe_route(us_ops *o, int32_t *topk, float *gates, float *probs, float *psum,
                               const float *logits, const float *bias, int64_t N, int E, int K,
                               int gate, int n_groups, int top_groups) {
    cudaStream_t s = us__cu(o)->stream;
    float *rowsum = psum ? (float *)us__cuda_scratch(o, (size_t)N * sizeof(float)) : NULL;
    us__k_moe_route<<<us__blocks(N, 128), 128, 0, s>>>(topk, gates, probs, rowsum, logits, bias, N,
                                                       E, K, gate, n_groups, top_groups);
    US__LAUNCHED(o);
    if (psum) {
        us__k_moe_psum<<<(unsigned)E, 256, 0, s>>>(psum, probs, rowsum, N, E);
        US__LAUNCHED(o);
    }
}

/* The router's backward, one thread per token, without a per-token array: ∂p_e is rebuilt on
   the fly from the K choices and the aux vector (see the CPU reference for the formulas). */
__device__ double us__moe_dp(int e, const float *p, const int32_t *tk, const float *dg,
                             const float *aux, int K, int gate, double S, double dot, double T,
                             double adot) {
    double d = 0;
    int k;
    for (k = 0; k < K; k++)
        if (tk[k] == e) d += gate == US_MOE_SIGMOID ? ((double)dg[k] - dot) / S : (double)dg[k];
    if (aux) d += ((double)aux[e] - adot) / T;
    return d;
}

__global__ void us__k_moe_route_bwd(float *dlogits, const float *dgates, const float *probs,
                                    const int32_t *topk, const float *aux, int64_t N, int E, int K,
                                    int gate) {
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float *p, *dg;
    const int32_t *tk;
    double S = 1, dot = 0, T = 1, adot = 0, pd = 0;
    int e, k;
    if (n >= N) return;
    p = probs + n * E;
    dg = dgates + n * K;
    tk = topk + n * K;
    if (gate == US_MOE_SIGMOID) {
        float Sf = 0;
        for (k = 0; k < K; k++) Sf += p[tk[k]];
        S = (double)(Sf + 1e-20f);
        for (k = 0; k < K; k++) dot += (double)dg[k] * p[tk[k]] / S;
    }
    if (aux) {
        T = 0;
        for (e = 0; e < E; e++) T += p[e];
        for (e = 0; e < E; e++) adot += (double)aux[e] * p[e] / T;
    }
    if (gate == US_MOE_SIGMOID) {
        for (e = 0; e < E; e++)
            dlogits[n * E + e] = (float)(us__moe_dp(e, p, tk, dg, aux, K, gate, S, dot, T, adot) *
                                         p[e] * (1.0 - p[e]));
        return;
    }
    for (e = 0; e < E; e++) pd += us__moe_dp(e, p, tk, dg, aux, K, gate, S, dot, T, adot) * p[e];
    for (e = 0; e < E; e++)
        dlogits[n * E + e] =
            (float)(p[e] * (us__moe_dp(e, p, tk, dg, aux, K, gate, S, dot, T, adot) - pd));
}

static void us__cuda_moe_route_bwd(us_ops *o, float *dlogits, const float *dgates,
                                   const float *probs, const int32_t *topk, const float *aux,
                                   int64_t N, int E, int K, int gate) {
    us__k_moe_route_bwd<<<us__blocks(N, 128), 128, 0, us__cu(o)->stream>>>(
        dlogits, dgates, probs, topk, aux, N, E, K, gate);
    US__LAUNCHED(o);
}

/* Counting sort in one block: thread e scans every choice in token order for its own expert
   (E ≤ 1024 threads), then thread 0 lays out the expert groups. Simple, serial in N·K. */
__global__ void us__k_moe_permute(int32_t *slot_row, int32_t *row_slot, int32_t *routed,
                                  int32_t *kept, const int32_t *topk, int64_t NK, int E,
                                  int64_t cap, int64_t R) {
    __shared__ int64_t off[1025];
    int e = threadIdx.x;
    int64_t i, cnt = 0, fill = 0, r;
    if (e < E) {
        for (i = 0; i < NK; i++) cnt += topk[i] == e;
        routed[e] = (int32_t)cnt;
        kept[e] = (int32_t)(cap > 0 && cnt > cap ? cap : cnt);
    }
    __syncthreads();
    if (e == 0) {
        off[0] = 0;
        for (r = 0; r < E; r++) off[r + 1] = off[r] + kept[r];
    }
    __syncthreads();
    if (e < E)
        for (i = 0; i < NK; i++) {
            if (topk[i] != e) continue;
            if (fill < kept[e]) {
                slot_row[i] = (int32_t)(off[e] + fill);
                row_slot[off[e] + fill] = (int32_t)i;
                fill++;
            } else
                slot_row[i] = -1;
        }
    for (r = off[E] + threadIdx.x; r < R; r += blockDim.x) row_slot[r] = -1;
}

static void us__cuda_moe_permute(us_ops *o, int32_t *slot_row, int32_t *row_slot, int32_t *routed,
                                 int32_t *kept, const int32_t *topk, int64_t N, int E, int K,
                                 int64_t cap, int64_t R) {
    int threads = E < 32 ? 32 : (E + 31) / 32 * 32;
    us__k_moe_permute<<<1, threads, 0, us__cu(o)->stream>>>(slot_row, row_slot, routed, kept, topk,
                                                            N * K, E, cap, R);
    US__LAUNCHED(o);
}

/* Row movement: a block per destination row. */
template <typename T>
__global__ void us__k_moe_gather(T *dst, const T *src, const int32_t *row_slot, const float *scale,
                                 int K, int64_t C) {
    int64_t r = blockIdx.x, s = row_slot[r], c;
    float sc = s >= 0 && scale ? scale[s] : 1.0f;
    for (c = threadIdx.x; c < C; c += blockDim.x)
        us__st(dst, r * C + c, s < 0 ? 0.0f : sc * us__ld(src, s / K * C + c));
}

template <typename T>
__global__ void us__k_moe_scatter(T *dst, const T *src, const int32_t *slot_row, const float *scale,
                                  int K, int64_t C) {
    int64_t n = blockIdx.x, c;
    int k;
    for (c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = us__ld(dst, n * C + c);
        for (k = 0; k < K; k++) {
            int64_t r = slot_row[n * K + k];
            if (r >= 0) acc += (scale ? scale[n * K + k] : 1.0f) * us__ld(src, r * C + c);
        }
        us__st(dst, n * C + c, acc);
    }
}

template <typename T>
__global__ void us__k_moe_gate_grad(float *dgates, const T *dout, const T *src,
                                    const int32_t *slot_row, int K, int64_t C) {
    __shared__ double sh[32];
    int64_t i = blockIdx.x, r = slot_row[i], c;
    double d = 0;
    if (r >= 0)
        for (c = threadIdx.x; c < C; c += blockDim.x)
            d += (double)us__ld(dout, i / K * C + c) * us__ld(src, r * C + c);
    d = us__block_sum(d, sh);
    if (threadIdx.x == 0) dgates[i] = (float)d;
}

static void us__cuda_moe_gather(us_ops *o, void *dst, const void *src, const int32_t *row_slot,
                                const float *scale, int64_t R, int K, int64_t C, us_dtype dt) {
    if (R <= 0) return;
    US__DISPATCH(o, dt,
                 (us__k_moe_gather<T_><<<(unsigned)R, 256, 0, us__cu(o)->stream>>>(
                     (T_ *)dst, (const T_ *)src, row_slot, scale, K, C)));
}

static void us__cuda_moe_scatter(us_ops *o, void *dst, const void *src, const int32_t *slot_row,
                                 const float *scale, int64_t N, int K, int64_t C, us_dtype dt) {
    if (N <= 0) return;
    US__DISPATCH(o, dt,
                 (us__k_moe_scatter<T_><<<(unsigned)N, 256, 0, us__cu(o)->stream>>>(
                     (T_ *)dst, (const T_ *)src, slot_row, scale, K, C)));
}

static void us__cuda_moe_gate_grad(us_ops *o, float *dgates, const void *dout, const void *src,
                                   const int32_t *slot_row, int64_t N, int K, int64_t C,
                                   us_dtype dt) {
    if (N <= 0) return;
    US__DISPATCH(o, dt,
                 (us__k_moe_gate_grad<T_><<<(unsigned)(N * K), 128, 0, us__cu(o)->stream>>>(
                     dgates, (const T_ *)dout, (const T_ *)src, slot_row, K, C)));
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-grouped  grouped GEMM: a MoE layer's experts in one launch, on tensor cores
/* ------------------------------------------------------------------------------------
   us_ops.gemm_grouped: G products, each on its own rows with its own matrix, as one kernel over
   the list of every group's output tiles (the grouped GEMM of Megatron-LM and DeepSeek-V3;
   cuBLASLt 13 has none). Two kernels: the portable one first (mma.sync, sm_80+), then the
   Hopper one (wgmma, TMA, warp specialisation; sm_90a), and the choice between them and one
   cuBLASLt GEMM per group (us__cuda_gemm_grouped, us_cuda_grouped_kernel). The mma.sync kernel
   runs at about a third of cuBLASLt's wgmma GEMMs, slower than the per-group loop on an H200; it
   stays as the one-launch path of GPUs before Hopper and as the reference the emulator runs
   (tests/emu/grouped_emu.cpp). Its CTA takes one 128×128 tile of one group's output: it finds
   its group by a binary search over the groups' first tiles, then runs a plain tiled GEMM with fp32
   accumulation on mma.sync m16n8k16 (bf16 or fp16), ldmatrix fragments and a 3-stage cp.async
   pipeline (the helpers of // >>cuda-flash); rows past the group's end load as zeros and are
   never stored. One view serves the three products, C[M][N'] (+)= A[M][Kr] · B[Kr][N'], with
   the operands as they are stored:
       mode    M     N'   Kr    A stored as              B stored as          C
       Fprop   n_g   N    K     X_g      [m][k]          W[g] [n][k]          Y_g (dt)
       Dgrad   n_g   N    K     X_g      [m][k]          W[g] [k][n]          Y_g (dt)
       Wgrad   N     K    n_g   Y_g      [k][m]          X_g  [k][n]          W[g] (f32, +=)
   A k-major tile sits in shared memory as [128][32+8], an m- or n-major one as [32][128+8] (+8:
   the 8 rows one ldmatrix reads start in 8 different bank groups) and is read with
   ldmatrix.trans. 8 warps as 2 × 4, each a 64 × 32 part of the tile: 4 m-atoms × 4 n-tiles,
   64 fp32 accumulators per thread. The group table travels as a kernel parameter
   (__grid_constant__, US__GG_CAP groups per launch; more groups take more launches).
   The kernel reads 16-byte chunks: X, Y and every W[g] 16-byte aligned, ldx, ldy, N and K
   multiples of 8. Other shapes, and fp32, take one cuBLASLt GEMM per group
   (us__gemm_grouped_each). tests/emu/grouped_emu.cpp runs this kernel on the CPU. */
#define US__GG_CAP 256 /* groups per launch */
#define US__GG_BM 128  /* output tile rows */
#define US__GG_BN 128  /* output tile columns */
#define US__GG_BK 32   /* reduction per stage */
#define US__GG_ST 3    /* cp.async stages */

typedef struct us__gg_table {
    const void *w[US__GG_CAP];              /* group g's matrix (Wgrad: its fp32 gradient) */
    int64_t off[US__GG_CAP], n[US__GG_CAP]; /* its rows of X and Y */
    int tile0[US__GG_CAP + 1];              /* its first tile; tile0[G] = the grid */
    int G;
} us__gg_table;

/* a tile's 16-bit elements in shared memory, stored [rows][cols + 8] */
template <int ROWS, int COLS>
struct us__gg_tile {
    static constexpr int lds = COLS + 8, elems = ROWS * lds;
};

/* bytes of dynamic shared memory: US__GG_ST stages of an A and a B tile (k-major: [BM][BK]) */
static constexpr size_t us__gg_smem_bytes(int a_kmaj, int b_kmaj) {
    return (size_t)US__GG_ST * 2 *
           ((a_kmaj ? us__gg_tile<US__GG_BM, US__GG_BK>::elems
                    : us__gg_tile<US__GG_BK, US__GG_BM>::elems) +
            (b_kmaj ? us__gg_tile<US__GG_BN, US__GG_BK>::elems
                    : us__gg_tile<US__GG_BK, US__GG_BN>::elems));
}

/* ---- PTX helpers beside // >>cuda-flash's (tests/emu/us_cuda_emu.h emulates them; the fp16
   product us__mma_f16 is // >>cuda-flash's) */
/* waits until at most N of this thread's committed cp.async groups are in flight */
template <int N>
static __device__ __forceinline__ void us__cp_async_wait(void) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* one us__raw4 vector V by cp.async: 16 bytes as us__cp_async16, 8 through L1 (cp.async.cg
   takes 16 bytes only); bytes = 0 writes zeros */
template <typename V>
static __device__ __forceinline__ void us__cp_async_v(void *s, const void *g, int bytes) {
    if constexpr (sizeof(V) == 16)
        us__cp_async16(s, g, bytes);
    else {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(us__smem_u32(s)),
                     "l"(g), "r"(bytes)
                     : "memory");
#else
        (void)s;
        (void)g;
        (void)bytes;
        __trap();
#endif
    }
}

/* us__cp_async_wait<n> (n ≤ 3) where n is known once the caller's loop is unrolled */
static __device__ __forceinline__ void us__cp_async_wait_n(int n) {
    if (n >= 3)
        us__cp_async_wait<3>();
    else if (n == 2)
        us__cp_async_wait<2>();
    else if (n == 1)
        us__cp_async_wait<1>();
    else
        us__cp_async_wait<0>();
}

/* ---- the kernel (tests/emu/extract_grouped.py cuts from here to the host side) */
template <typename T>
__device__ __forceinline__ uint32_t us__gg_pack(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t us__gg_pack<__nv_bfloat16>(float lo, float hi) {
    return us__pack_bf16(lo, hi);
}

template <>
__device__ __forceinline__ uint32_t us__gg_pack<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <typename T>
__device__ __forceinline__ void us__gg_mma(float c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1);

template <>
__device__ __forceinline__ void us__gg_mma<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                          uint32_t b0, uint32_t b1) {
    us__mma_bf16(c, a, b0, b1);
}

template <>
__device__ __forceinline__ void us__gg_mma<__half>(float c[4], const uint32_t a[4], uint32_t b0,
                                                   uint32_t b1) {
    us__mma_f16(c, a, b0, b1);
}

/* ROWS × COLS of 16-bit elements at g (row stride ld) into the shared tile s, 16 bytes per
   cp.async; rows ≥ nr and columns ≥ nc (a multiple of 8) become zeros */
template <int ROWS, int COLS>
static __device__ __forceinline__ void us__gg_load(__nv_bfloat16 *s, const void *g, int64_t ld,
                                                   int64_t nr, int64_t nc) {
    constexpr int CPR = COLS / 8; /* chunks per row */
    static_assert(ROWS * CPR % 256 == 0, "the tile splits evenly over the CTA's 256 threads");
#pragma unroll
    for (int i = 0; i < ROWS * CPR / 256; i++) {
        int c = threadIdx.x + i * 256, r = c / CPR, k = (c % CPR) * 8, ok = r < nr && k < nc;
        const uint16_t *src = (const uint16_t *)g + (ok ? r * ld + k : 0);
        us__cp_async16(s + r * us__gg_tile<ROWS, COLS>::lds + k, src, ok ? 16 : 0);
    }
}

/* Where the operands of one CTA's tile live, and their sizes (the table above). */
struct us__gg_cta {
    const void *a, *b; /* A and B at the tile's origin, reduction index 0 */
    int64_t lda, ldb;  /* their row strides as stored */
    int64_t M, N, Kr;  /* the product's sizes */
    int64_t m0, n0;    /* the tile's first row and column */
};

/* stage s's A and B tiles for reduction rows [k0, k0 + BK) */
template <int MODE>
static __device__ __forceinline__ void us__gg_stage(__nv_bfloat16 *sA, __nv_bfloat16 *sB,
                                                    const us__gg_cta &p, int64_t k0) {
    const uint16_t *a = (const uint16_t *)p.a, *b = (const uint16_t *)p.b;
    int64_t kr = p.Kr - k0, mr = p.M - p.m0, nr = p.N - p.n0;
    if (MODE != US_GG_WGRAD) /* A [m][k] */
        us__gg_load<US__GG_BM, US__GG_BK>(sA, a + k0, p.lda, mr, kr);
    else /* A as [k][m] */
        us__gg_load<US__GG_BK, US__GG_BM>(sA, a + k0 * p.lda, p.lda, kr, mr);
    if (MODE == US_GG_FPROP) /* B as [n][k] */
        us__gg_load<US__GG_BN, US__GG_BK>(sB, b + k0, p.ldb, nr, kr);
    else /* B [k][n] */
        us__gg_load<US__GG_BK, US__GG_BN>(sB, b + k0 * p.ldb, p.ldb, kr, nr);
}

/* one stage's products: each warp's 64 × 32 part += A[64][32] · B[32][32] */
template <typename T, int MODE>
static __device__ __forceinline__ void us__gg_math(float (&acc)[4][4][4], const __nv_bfloat16 *sA,
                                                   const __nv_bfloat16 *sB, int lane, int wm,
                                                   int wn) {
    constexpr int LA = MODE != US_GG_WGRAD ? US__GG_BK + 8 : US__GG_BM + 8,
                  LB = MODE == US_GG_FPROP ? US__GG_BK + 8 : US__GG_BN + 8;
#pragma unroll
    for (int kk = 0; kk < US__GG_BK; kk += 16) {
        uint32_t a[4][4], b[2][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r0 = wm * 64 + 16 * i;
            if (MODE != US_GG_WGRAD)
                us__ldsm_x4(a[i], us__fa_a_addr<LA>(sA, r0, kk, lane));
            else /* matrices (m, k): (0,0) (8,0) (0,8) (8,8), each as its 8 rows of k */
                us__ldsm_x4_t(a[i], sA + (kk + (lane & 7) + (lane >> 4) * 8) * LA + r0 +
                                        ((lane >> 3) & 1) * 8);
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int c0 = wn * 32 + 16 * j;
            if (MODE == US_GG_FPROP)
                us__ldsm_x4(b[j], us__fa_bt_addr<LB>(sB, c0, kk, lane));
            else
                us__ldsm_x4_t(b[j], us__fa_b_addr<LB>(sB, kk, c0, lane));
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                us__gg_mma<T>(acc[i][j], a[i], b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]);
    }
}

/* the tile's results: Y rows (dt, overwritten) or, Wgrad, the fp32 gradient W[g] += */
template <typename T, int MODE>
static __device__ __forceinline__ void us__gg_store(const float (&acc)[4][4][4],
                                                    const us__gg_cta &p, void *out, int64_t ldo,
                                                    int lane, int wm, int wn) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int64_t r = p.m0 + wm * 64 + 16 * i + (lane >> 2) + 8 * h,
                        c = p.n0 + wn * 32 + 8 * j + 2 * (lane & 3);
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (r >= p.M || c >= p.N) continue;
                if (MODE == US_GG_WGRAD) {
                    float2 *q = reinterpret_cast<float2 *>((float *)out + r * ldo + c), u = *q;
                    u.x += v0;
                    u.y += v1;
                    *q = u;
                } else
                    *reinterpret_cast<uint32_t *>((T *)out + r * ldo + c) = us__gg_pack<T>(v0, v1);
            }
}

template <typename T, int MODE>
__global__ void __launch_bounds__(256, 2)
    us__k_gemm_grouped(const __grid_constant__ us__gg_table t, const T *X, int64_t ldx, T *Y,
                       int64_t ldy, int64_t N, int64_t K) {
    extern __shared__ __align__(16) unsigned char us__gg_smem[];
    constexpr int SA = MODE != US_GG_WGRAD ? us__gg_tile<US__GG_BM, US__GG_BK>::elems
                                           : us__gg_tile<US__GG_BK, US__GG_BM>::elems,
                  SB = MODE == US_GG_FPROP ? us__gg_tile<US__GG_BN, US__GG_BK>::elems
                                           : us__gg_tile<US__GG_BK, US__GG_BN>::elems;
    __nv_bfloat16 *sA = reinterpret_cast<__nv_bfloat16 *>(us__gg_smem), *sB = sA + US__GG_ST * SA;
    int tile = (int)blockIdx.x, lo = 0, hi = t.G - 1, lane = threadIdx.x & 31,
        wm = (threadIdx.x >> 5) >> 2, wn = (threadIdx.x >> 5) & 3, s, kt, nk;
    float acc[4][4][4] = {};
    us__gg_cta p;
    int64_t tn, local;
    while (lo <
           hi) { /* the last group starting at or before this tile (empty ones start with it) */
        int mid = (lo + hi + 1) / 2;
        if (t.tile0[mid] <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    p.M = MODE == US_GG_WGRAD ? N : t.n[lo];
    p.N = MODE == US_GG_WGRAD ? K : N;
    p.Kr = MODE == US_GG_WGRAD ? t.n[lo] : K;
    tn = (p.N + US__GG_BN - 1) / US__GG_BN;
    local = tile - t.tile0[lo];
    p.m0 = local / tn * US__GG_BM;
    p.n0 = local % tn * US__GG_BN;
    if (MODE == US_GG_WGRAD) { /* A = Y_gᵀ, B = X_g: both walk the group's rows */
        p.a = Y + t.off[lo] * ldy + p.m0;
        p.lda = ldy;
        p.b = X + t.off[lo] * ldx + p.n0;
        p.ldb = ldx;
    } else { /* A = X_g; B = W[g], [N][K] (Fprop) or [K][N] (Dgrad) */
        p.a = X + (t.off[lo] + p.m0) * ldx;
        p.lda = ldx;
        p.b = (const T *)t.w[lo] + (MODE == US_GG_FPROP ? p.n0 * K : p.n0);
        p.ldb = MODE == US_GG_FPROP ? K : N;
    }
    nk = (int)((p.Kr + US__GG_BK - 1) / US__GG_BK);
    for (s = 0; s < US__GG_ST - 1; s++) { /* the pipeline's first stages */
        if (s < nk) us__gg_stage<MODE>(sA + s * SA, sB + s * SB, p, (int64_t)s * US__GG_BK);
        us__cp_async_commit();
    }
    for (kt = 0; kt < nk; kt++) {
        int nx = kt + US__GG_ST - 1, cur = kt % US__GG_ST;
        us__cp_async_wait<US__GG_ST - 2>(); /* stage kt has landed (this thread's copies) */
        __syncthreads(); /* everyone's copies; and stage kt − 1, refilled next, is read */
        if (nx < nk)
            us__gg_stage<MODE>(sA + (nx % US__GG_ST) * SA, sB + (nx % US__GG_ST) * SB, p,
                               (int64_t)nx * US__GG_BK);
        us__cp_async_commit();
        us__gg_math<T, MODE>(acc, sA + cur * SA, sB + cur * SB, lane, wm, wn);
    }
    if (MODE == US_GG_WGRAD)
        us__gg_store<T, MODE>(acc, p, const_cast<void *>(t.w[lo]), K, lane, wm, wn);
    else
        us__gg_store<T, MODE>(acc, p, Y + t.off[lo] * ldy, ldy, lane, wm, wn);
}

/* The table of groups [0, min(G, US__GG_CAP)) of a launch of mode (its W, off, n of them, as
   us_ops.gemm_grouped's) and each one's first tile; returns the tiles, the launch's grid (−1
   past 2^31 − 1, more than one launch can count). */
static int64_t us__gg_fill(us__gg_table *t, int mode, int G, const int64_t *off, const int64_t *n,
                           int64_t N, int64_t K, void *const *W) {
    int64_t tiles = 0, M, Nc;
    int i;
    t->G = G < US__GG_CAP ? G : US__GG_CAP;
    for (i = 0; i < t->G; i++) {
        M = mode == US_GG_WGRAD ? N : n[i];
        Nc = mode == US_GG_WGRAD ? K : N;
        t->w[i] = W[i];
        t->off[i] = off[i];
        t->n[i] = n[i];
        t->tile0[i] = (int)tiles;
        if (n[i] > 0) tiles += (M + US__GG_BM - 1) / US__GG_BM * ((Nc + US__GG_BN - 1) / US__GG_BN);
        if (tiles > INT_MAX) return -1;
    }
    t->tile0[t->G] = (int)tiles;
    return tiles;
}

/* ---- host side */
/* whether the kernel takes these operands (else one cuBLASLt GEMM per group) */
static int us__gg_fits(us_ops *o, int G, const int64_t *n, int64_t N, int64_t K, const void *X,
                       int64_t ldx, void *const *W, const void *Y, int64_t ldy, us_dtype dt) {
    int g;
    if ((dt != US_BF16 && dt != US_F16) || us__cu(o)->cc_major < 8) return 0;
    if (N % 8 || K % 8 || ldx % 8 || ldy % 8 || !us__al16(X) || !us__al16(Y)) return 0;
    for (g = 0; g < G; g++)
        if (n[g] > 0 && !us__al16(W[g])) return 0;
    return 1;
}

static constexpr int us__gg_f16(const __nv_bfloat16 *) { return 0; }

static constexpr int us__gg_f16(const __half *) { return 1; }

/* A grouped-GEMM kernel (bit: which one, in us__cuda.gg_smem) given `smem` bytes of dynamic shared
   memory, over the 48 KiB default: asked for once per kernel */
static void us__gg_smem_once(us_ops *o, const void *kernel, size_t smem, unsigned bit) {
    us__cuda *c = us__cu(o);
    if (c->gg_smem & bit) return;
    US__CU(o, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    c->gg_smem |= bit;
}

/* Launches for groups [0, G) in tables of US__GG_CAP. */
template <typename T, int MODE>
static void us__gg_launch(us_ops *o, int G, const int64_t *off, const int64_t *n, int64_t N,
                          int64_t K, const void *X, int64_t ldx, void *const *W, void *Y,
                          int64_t ldy) {
    us__cuda *c = us__cu(o);
    const size_t smem = us__gg_smem_bytes(MODE != US_GG_WGRAD, MODE == US_GG_FPROP);
    const unsigned bit = 1u << (MODE + 3 * us__gg_f16((const T *)NULL)); /* this instance's */
    us__gg_table t;
    int g0;
    us__gg_smem_once(o, (const void *)us__k_gemm_grouped<T, MODE>, smem, bit);
    for (g0 = 0; g0 < G; g0 += US__GG_CAP) {
        int64_t tiles = us__gg_fill(&t, MODE, G - g0, off + g0, n + g0, N, K, W + g0);
        if (tiles < 0) {
            us__cuda_fail(o, "gemm_grouped", "more than 2^31 - 1 output tiles in one launch",
                          __FILE__, __LINE__);
            return;
        }
        if (!tiles) continue;
        us__k_gemm_grouped<T, MODE>
            <<<(unsigned)tiles, 256, smem, c->stream>>>(t, (const T *)X, ldx, (T *)Y, ldy, N, K);
        US__LAUNCHED(o);
    }
}

/* the three products of one element type */
template <typename T>
static void us__gg_modes(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n,
                         int64_t N, int64_t K, const void *X, int64_t ldx, void *const *W, void *Y,
                         int64_t ldy) {
    if (mode == US_GG_FPROP)
        us__gg_launch<T, US_GG_FPROP>(o, G, off, n, N, K, X, ldx, W, Y, ldy);
    else if (mode == US_GG_DGRAD)
        us__gg_launch<T, US_GG_DGRAD>(o, G, off, n, N, K, X, ldx, W, Y, ldy);
    else
        us__gg_launch<T, US_GG_WGRAD>(o, G, off, n, N, K, X, ldx, W, Y, ldy);
}

/* ---- the Hopper kernel: wgmma, TMA, an mbarrier ring, warp specialisation (sm_90a) ---------
   The same list of every group's output tiles as above, on the recipe of CUTLASS's SM90 grouped
   GEMM and of DeepGEMM, built from the helpers of // >>cuda-hopper. What each piece does, why:
   1. A persistent grid. One CTA per SM walks tiles b, b + grid, b + 2·grid, ... of the list (a
      tile's group by a binary search over the groups' first tiles, as above). A layer costs one
      launch whatever its experts, a small expert costs no launch of its own, and the copies of
      the next tile's operands start while the consumers still store the last one.
   2. TMA. One thread asks the copy engine for whole 64-column boxes (cp.async.bulk.tensor); they
      land in shared memory in the 128-byte swizzle wgmma reads, and the engine reports the bytes
      on an mbarrier. Rows or columns past a tensor's end arrive as zeros (partial K, a last
      expert), so no thread computes an address or a bound per element.
   3. An mbarrier ring of US__GGH_ST stages: "full" (the copies landed; consumers wait on it) and
      "empty" (every consumer warp is done with the stage; the producer waits before refilling).
      Both sides count stages with one running index over all their tiles, so the ring's phase
      carries from one tile to the next without draining.
   4. wgmma. Each of two consumer warpgroups owns 64 rows × 256 columns of the 128 × 256 tile,
      one m64n256k16 per 16 of the reduction, both operands read from shared memory through
      descriptors. Batches are issued one k-block ahead of the wait (wait_group 1), so the tensor
      cores never idle on the consumer's own bookkeeping. The instruction's transpose bits read
      each operand as it is stored, so the three products copy nothing:
          mode    A (64 × k per warpgroup)              B (k × 256)
          Fprop   X_g rows [m][k]: K-major               W[g] [N][K]: K-major
          Dgrad   X_g rows [m][k]: K-major               W[g] [K][N]: N-major (transposed)
          Wgrad   Y_gᵀ from Y_g [r][N]: M-major          X_g [r][K]: N-major
   5. Warp specialisation with setmaxnreg: warpgroup 0 only issues copies and gives its
      registers up (40 each), the consumers take them (232 each: 128 fp32 accumulators, the
      descriptors and the epilogue's addresses).
   Edges. Fprop and Dgrad rows past a group's end are the next group's rows: they are multiplied
   and never stored (masked stores). Wgrad reduces over the group's rows, so the last k-block's
   rows past its end must add nothing: the consumers zero them in shared memory (whole 128-byte
   rows, which the swizzle leaves in place) before that block's wgmma. Each group's W[g] needs a
   tensor map of its own (the experts' tensors need not be evenly spaced); they travel in the
   kernel's parameters (32 KB on Hopper), US__GGH_CAP groups per launch.
   6. Wgrad adds its results into the fp32 W[g] through the copy engine. A thread that reads,
      adds and writes each of its 128 sums itself (as the mma.sync kernel does) waits for the
      read: under ncu three quarters of the consumers' stalls were those loads, and the product
      ran at half the loop's rate. Instead each consumer stages 64 rows × 32 columns at a time in
      shared memory and hands them to cp.reduce.async.bulk.tensor .add, which does the
      read-add-write in L2 while the consumer goes on to its next box and its next tile. */
#define US__GGH_CAP 160 /* groups per launch: their tensor maps fill most of the 32 KB */
#define US__GGH_BM 128  /* output tile rows: two consumer warpgroups of 64 */
#define US__GGH_BN 256  /* output tile columns: one m64n256k16 */
#define US__GGH_BK 64   /* reduction per stage: one 128-byte swizzled row of 16-bit elements */
#define US__GGH_ST 4    /* stages of the ring */
#define US__GGH_SA (US__GGH_BM * US__GGH_BK * 2) /* a stage's A bytes */
#define US__GGH_SB (US__GGH_BN * US__GGH_BK * 2) /* a stage's B bytes */

typedef struct us__ggh_table {
    CUtensorMap wmap[US__GGH_CAP]; /* W[g]: the producer's boxes, or (Wgrad) the fp32 boxes added */
    int64_t off[US__GGH_CAP], n[US__GGH_CAP]; /* its rows of X and Y */
    int tile0[US__GGH_CAP + 1];               /* its first tile; tile0[G] = the tiles */
    int G;
} us__ggh_table;

#define US__GGH_BOX (64 * 32 * 4) /* Wgrad: one staged box, 64 rows × 32 fp32 columns */

/* the tiles in shared memory: the ring's stages, then (Wgrad) two staged boxes per consumer;
   us__hop_smem adds the swizzle's alignment and the barriers */
static constexpr __host__ __device__ int us__ggh_bytes(int mode) {
    return US__GGH_ST * (US__GGH_SA + US__GGH_SB) + (mode == US_GG_WGRAD ? 4 * US__GGH_BOX : 0);
}

static_assert(us__hop_smem(us__ggh_bytes(US_GG_WGRAD)) <= 232448, "227 KB a block at most");

/* one tile: its group, its first output row and column, its k-blocks and reduction length */
struct us__ggh_pos {
    int g, nk;
    int64_t m0, n0, kr;
};

template <int MODE>
static __device__ __forceinline__ us__ggh_pos us__ggh_find(const us__ggh_table &t, int tile,
                                                           int64_t N, int64_t K) {
    int lo = 0, hi = t.G - 1;
    us__ggh_pos p;
    /* the last group starting at or before this tile (empty ones start with the next) */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (t.tile0[mid] <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int64_t rows = MODE == US_GG_WGRAD ? N : t.n[lo], cols = MODE == US_GG_WGRAD ? K : N;
    const int64_t tm = (rows + US__GGH_BM - 1) / US__GGH_BM;
    const int64_t tn = (cols + US__GGH_BN - 1) / US__GGH_BN, local = tile - t.tile0[lo];
    /* The shorter side runs fastest: the grid's ~132 tiles in flight then share the few panels
       of that side (kept in L2) and each panel of the longer side is read once. The other order
       re-read all of a Mixtral-sized W[g] (235 MB) once per 128 rows: 0.78 of the loop. */
    p.g = lo;
    p.m0 = (tm <= tn ? local % tm : local / tn) * US__GGH_BM;
    p.n0 = (tm <= tn ? local / tm : local % tn) * US__GGH_BN;
    p.kr = MODE == US_GG_WGRAD ? t.n[lo] : K;
    p.nk = (int)((p.kr + US__GGH_BK - 1) / US__GGH_BK);
    return p;
}

/* box {64 columns, rows} at (column c0, row c1) of a 2-D tensor map into dst */
static __device__ __forceinline__ void us__tma_load2(void *dst, const CUtensorMap *map, int c0,
                                                     int c1, uint64_t *bar) {
#if US__HOP_DEV
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(us__smem_u32(dst)),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(us__smem_u32(bar))
                 : "memory");
#else
    (void)dst, (void)map, (void)c0, (void)c1, (void)bar;
#endif
}

/* The producer (one thread): every k-block of every tile of this CTA into the ring. A stage is
   A then B; A is [128 rows][64 k] (Wgrad: [2 blocks of 64 m][64 r][64]), B [256 n][64 k]
   (Fprop) or [4 blocks of 64 n][64 k][64] (Dgrad, Wgrad). ma: X (Wgrad Y), mb: Wgrad's X. */
template <int MODE>
static __device__ __forceinline__ void
us__ggh_produce(const us__ggh_table &t, const CUtensorMap *ma, const CUtensorMap *mb,
                unsigned char *ring, uint64_t *full, uint64_t *empty, int tiles, int64_t N,
                int64_t K) {
    int it = 0; /* the running stage index, as the consumers count it */
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const us__ggh_pos p = us__ggh_find<MODE>(t, tile, N, K);
        const int row = (int)t.off[p.g], m0 = (int)p.m0, n0 = (int)p.n0;
        const CUtensorMap *mw = &t.wmap[p.g];
        for (int kb = 0; kb < p.nk; kb++, it++) {
            const int s = it % US__GGH_ST, k0 = kb * US__GGH_BK;
            unsigned char *sa = ring + s * (US__GGH_SA + US__GGH_SB), *sb = sa + US__GGH_SA;
            if (it >= US__GGH_ST) us__mb_wait(empty + s, ((it / US__GGH_ST) - 1) & 1);
            us__mb_expect(full + s, US__GGH_SA + US__GGH_SB);
            if (MODE == US_GG_WGRAD) {
#pragma unroll
                for (int c = 0; c < 2; c++)
                    us__tma_load2(sa + c * 8192, ma, m0 + 64 * c, row + k0, full + s);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    us__tma_load2(sb + j * 8192, mb, n0 + 64 * j, row + k0, full + s);
            } else {
                us__tma_load2(sa, ma, k0, row + m0, full + s);
                if (MODE == US_GG_FPROP)
                    us__tma_load2(sb, mw, k0, n0, full + s);
                else
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        us__tma_load2(sb + j * 8192, mw, n0 + 64 * j, k0, full + s);
            }
        }
    }
}

/* m64n256k16 with both operands from shared memory; TA, TB read A or B transposed (MN-major) */
#if US__HOP_DEV
#define US__GGH_ASM(TY)                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                            \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " US__WG_R256 \
                 ", %128, %129, p, 1, 1, %131, %132;\n}\n"                                \
                 : US__WG_D256(d)                                                         \
                 : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB))
#endif
template <typename T, int TA, int TB>
static __device__ __forceinline__ void us__ggh_wgmma(float *d, uint64_t a, uint64_t b, int acc) {
#if US__HOP_DEV
    if constexpr (us__is_half<T>::value)
        US__GGH_ASM("f16");
    else
        US__GGH_ASM("bf16");
#else
    (void)d, (void)a, (void)b, (void)acc;
#endif
}

/* One stage's products for consumer c: d (+)= A[64c.., 0..63] · B[0..63, 0..255], four k-steps
   of 16 (acc 0 on the tile's first step overwrites d: no zeroing pass) */
template <typename T, int MODE>
static __device__ __forceinline__ void us__ggh_math(float *d, const unsigned char *sa,
                                                    const unsigned char *sb, int c, int first) {
    constexpr int TA = MODE == US_GG_WGRAD, TB = MODE != US_GG_FPROP;
    us__wg_fence();
#pragma unroll
    for (int kk = 0; kk < US__GGH_BK / 16; kk++) {
        const uint64_t a =
            TA ? us__wg_mnmaj<64>(sa + c * 8192, kk) : us__wg_kmaj<US__GGH_BM>(sa, 64 * c, kk);
        const uint64_t b = TB ? us__wg_mnmaj<64>(sb, kk) : us__wg_kmaj<US__GGH_BN>(sb, 0, kk);
        us__ggh_wgmma<T, TA, TB>(d, a, b, !(first && kk == 0));
    }
    us__wg_commit();
}

/* Wgrad's last k-block of a group: rows [rem, 64) of the stage are past the group's end. Consumer
   c zeroes them in its A block and in B blocks 2c and 2c + 1; wgmma reads shared memory through
   the async proxy, hence the proxy fence before the barrier the two consumers meet at. */
static __device__ __forceinline__ void us__ggh_zero_tail(unsigned char *sa, unsigned char *sb,
                                                         int rem, int c, int tid) {
    const int chunks = (64 - rem) * 8; /* 16-byte chunks past the end in one 64-row block */
    for (int i = tid; i < 3 * chunks; i += 128) {
        const int blk = i / chunks, j = i % chunks;
        unsigned char *base = blk == 0 ? sa + c * 8192 : sb + (2 * c + blk - 1) * 8192;
        *reinterpret_cast<uint4 *>(base + rem * 128 + j * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    us__hop_bar_sync(1);
}

/* Fprop, Dgrad: the tile's rows of Y_g from consumer c's accumulators (d[4j + e]: row 16w +
   lane/4 + 8·(e/2), column 8j + 2·(lane%4) + e%2 of its 64 × 256), rounded to T */
template <typename T>
static __device__ __forceinline__ void us__ggh_store(const float *d, const us__ggh_table &t,
                                                     const us__ggh_pos &p, T *Y, int64_t ldy,
                                                     int64_t N, int c, int tid) {
    const int64_t r0 = p.m0 + 64 * c + 16 * (tid >> 5) + ((tid & 31) >> 2);
    const int64_t c0 = p.n0 + 2 * (tid & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t r = r0 + 8 * h;
        if (r >= t.n[p.g]) continue;
        T *y = Y + (t.off[p.g] + r) * ldy;
#pragma unroll
        for (int j = 0; j < US__GGH_BN / 8; j++)
            if (c0 + 8 * j < N)
                *reinterpret_cast<uint32_t *>(y + c0 + 8 * j) =
                    us__hop_pack<T>(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
    }
}

/* Wgrad: consumer c's 64 × 256 added into the fp32 W[g] (map: its boxes of 64 rows × 32
   columns) by the copy engine, box by box. A box is staged in shared memory in the 128-byte
   swizzle (16-byte chunk u of row r at u ⊕ r%8: the quad's float2s of 8 rows hit distinct
   banks); fence, the warpgroup's barrier, then thread 0 hands it over and goes on. Two staging
   boxes alternate: before the barrier that releases box q, thread 0 waits until the engine has
   read box q − 1, so the box written next (q + 1, in q − 1's place) is free. The rows and
   columns past W[g]'s end are dropped by the engine. One tile owns each element (the whole
   reduction in one CTA), so each gets exactly one add: the same sums run to run. */
static __device__ __forceinline__ void us__ggh_reduce(const float *d, const CUtensorMap *map,
                                                      const us__ggh_pos &p, unsigned char *stage,
                                                      int c, int tid) {
#if US__HOP_DEV
    const int lane = tid & 31, row = 16 * (tid >> 5) + (lane >> 2);
#pragma unroll
    for (int q = 0; q < US__GGH_BN / 32; q++) {
        unsigned char *box = stage + (q & 1) * US__GGH_BOX; /* [64 rows][32 fp32], swizzled */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row + 8 * h;
#pragma unroll
            for (int j = 0; j < 4; j++) { /* accumulator columns 8(4q + j) + 2·(lane%4) + {0, 1} */
                const int u = 2 * j + ((lane & 3) >> 1), k = 4 * (4 * q + j) + 2 * h;
                *reinterpret_cast<float2 *>(box + us__sw128(r, u) + (lane & 1) * 8) =
                    make_float2(d[k], d[k + 1]);
            }
        }
        us__hop_fence_async();
        if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        us__hop_bar_sync_n(2 + c, 128);
        if (tid == 0) {
            asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"
                         " [%0, {%1, %2}], [%3];\n" ::"l"((uint64_t)map),
                         "r"((int)p.n0 + 32 * q), "r"((int)p.m0 + 64 * c), "r"(us__smem_u32(box))
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
    }
#else
    (void)d, (void)map, (void)p, (void)stage, (void)c, (void)tid;
#endif
}

/* A consumer warpgroup: its 64 rows of every tile of this CTA */
template <typename T, int MODE>
static __device__ __forceinline__ void us__ggh_consume(const us__ggh_table &t, unsigned char *ring,
                                                       uint64_t *full, uint64_t *empty, int tiles,
                                                       T *Y, int64_t ldy, int64_t N, int64_t K) {
    const int c = us__hop_wg() - 1, tid = threadIdx.x & 127, lane = tid & 31;
    unsigned char *stage = ring + US__GGH_ST * (US__GGH_SA + US__GGH_SB) + 2 * c * US__GGH_BOX;
    float d[US__GGH_BN / 2];
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const us__ggh_pos p = us__ggh_find<MODE>(t, tile, N, K);
        for (int kb = 0; kb < p.nk; kb++, it++) {
            const int s = it % US__GGH_ST;
            unsigned char *sa = ring + s * (US__GGH_SA + US__GGH_SB), *sb = sa + US__GGH_SA;
            us__mb_wait(full + s, (it / US__GGH_ST) & 1);
            if (MODE == US_GG_WGRAD && p.kr - (int64_t)kb * US__GGH_BK < US__GGH_BK)
                us__ggh_zero_tail(sa, sb, (int)(p.kr - (int64_t)kb * US__GGH_BK), c, tid);
            us__ggh_math<T, MODE>(d, sa, sb, c, kb == 0);
            us__wg_wait_n<1, US__GGH_BN / 2>(d); /* the block before this one has been read */
            if (kb > 0 && lane == 0) us__mb_arrive(empty + (it - 1) % US__GGH_ST);
        }
        us__wg_wait<US__GGH_BN / 2>(d);
        if (lane == 0) us__mb_arrive(empty + (it - 1) % US__GGH_ST);
        if (MODE == US_GG_WGRAD)
            us__ggh_reduce(d, &t.wmap[p.g], p, stage, c, tid);
        else
            us__ggh_store<T>(d, t, p, Y, ldy, N, c, tid);
    }
#if US__HOP_DEV
    /* the staged boxes must be read before the CTA's shared memory goes */
    if (MODE == US_GG_WGRAD && tid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

/* 384 threads: the producer warpgroup, then two consumers. ma, mb: the tensor maps of X (ma;
   Wgrad: Y in ma, X in mb); each group's W[g] has its own in the table. */
template <typename T, int MODE>
__global__ void __launch_bounds__(384, 1)
    us__ggh_kernel(const __grid_constant__ us__ggh_table t, const __grid_constant__ CUtensorMap ma,
                   const __grid_constant__ CUtensorMap mb, T *Y, int64_t ldy, int64_t N, int64_t K,
                   int tiles) {
#if US__HOP_DEV
    extern __shared__ __align__(1024) unsigned char us__ggh_raw[];
    unsigned char *ring = us__hop_smem_base(us__ggh_raw); /* [ST][A | B], Wgrad: [4][box] */
    uint64_t *bars = (uint64_t *)(ring + us__ggh_bytes(MODE));
    uint64_t *full = bars + 1, *empty = full + US__GGH_ST;
    us__hop_bars_init(bars, US__GGH_ST, 1, 8); /* full: the copy thread; empty: 8 consumer warps */
    if (us__hop_wg() == 0) {
        us__hop_regs_producer<2>();
        if (threadIdx.x == 0) us__ggh_produce<MODE>(t, &ma, &mb, ring, full, empty, tiles, N, K);
        return;
    }
    us__hop_regs_consumer<2>();
    us__ggh_consume<T, MODE>(t, ring, full, empty, tiles, Y, ldy, N, K);
#else
    (void)t, (void)ma, (void)mb, (void)Y, (void)ldy, (void)N, (void)K, (void)tiles;
#endif
}

/* ---- its host side */
/* [rows][cols] elements of dt (bf16, fp16, or fp32), row stride ld, in boxes of one 128-byte
   swizzled row of columns (64 16-bit ones, 32 fp32) × box rows; what lies past rows or cols reads
   as zeros, and a write or add there is dropped */
static int us__ggh_map(CUtensorMap *map, const void *base, us_dtype dt, int64_t cols, int64_t rows,
                       int64_t ld, int box) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = us__hop_encoder();
    const int es = dt == US_F32 ? 4 : 2;
    const CUtensorMapDataType ty = dt == US_F32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : dt == US_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)(ld * es)};
    cuuint32_t boxd[2] = {(cuuint32_t)(128 / es), (cuuint32_t)box}, step[2] = {1, 1};
    if (!enc) return 0;
    return enc(map, ty, 2, (void *)base, dims, strides, boxd, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* whether the Hopper kernel takes these operands: the mma.sync kernel's conditions, an sm_90a
   binary on a compute-capability-9 GPU, rows the copy engine's 32-bit coordinates reach */
static int us__ggh_fits(us_ops *o, int G, const int64_t *off, const int64_t *n, int64_t N,
                        int64_t K, const void *X, int64_t ldx, void *const *W, const void *Y,
                        int64_t ldy, us_dtype dt) {
    int g;
    if (!us__gg_fits(o, G, n, N, K, X, ldx, W, Y, ldy, dt) || K <= 0) return 0;
    if (us__cu(o)->cc_major != 9 || !us__hop_encoder() || !us__hop_compiled()) return 0;
    for (g = 0; g < G; g++)
        if (n[g] > 0 && (off[g] < 0 || off[g] + n[g] > INT_MAX - 2 * US__GGH_BM)) return 0;
    return N < INT_MAX / 2 && K < INT_MAX / 2;
}

/* The table of groups [0, min(G, US__GGH_CAP)) and each one's W map; returns the launch's tiles,
   −1 past 2^31 − 1 or where a map could not be made */
static int64_t us__ggh_fill(us__ggh_table *t, int mode, int G, const int64_t *off, const int64_t *n,
                            int64_t N, int64_t K, void *const *W, us_dtype dt) {
    int64_t tiles = 0;
    int i;
    t->G = G < US__GGH_CAP ? G : US__GGH_CAP;
    for (i = 0; i < t->G; i++) {
        const int64_t M = mode == US_GG_WGRAD ? N : n[i], cols = mode == US_GG_WGRAD ? K : N;
        t->off[i] = off[i];
        t->n[i] = n[i];
        t->tile0[i] = (int)tiles;
        if (n[i] <= 0) continue;
        tiles += (M + US__GGH_BM - 1) / US__GGH_BM * ((cols + US__GGH_BN - 1) / US__GGH_BN);
        if (tiles > INT_MAX) return -1;
        if (mode == US_GG_WGRAD && !us__ggh_map(&t->wmap[i], W[i], US_F32, K, N, K, 64))
            return -1; /* the fp32 gradient W[g] [N][K]: boxes of 64 rows of n, 32 columns */
        if (mode == US_GG_FPROP && !us__ggh_map(&t->wmap[i], W[i], dt, K, N, K, US__GGH_BN))
            return -1; /* W[g] [N][K]: boxes of 256 rows of n */
        if (mode == US_GG_DGRAD && !us__ggh_map(&t->wmap[i], W[i], dt, N, K, N, US__GGH_BK))
            return -1; /* W[g] [K][N]: boxes of 64 rows of k */
    }
    t->tile0[t->G] = (int)tiles;
    return tiles;
}

/* Launches for groups [0, G) in tables of US__GGH_CAP: a persistent grid of at most one CTA per
   SM (fewer by o->sm_margin, the SMs left to communication running beside it) */
template <typename T, int MODE>
static void us__ggh_launch(us_ops *o, int G, const int64_t *off, const int64_t *n, int64_t N,
                           int64_t K, const void *X, int64_t ldx, void *const *W, void *Y,
                           int64_t ldy, us_dtype dt) {
    us__cuda *c = us__cu(o);
    const unsigned bit = 1u << (8 + MODE + 3 * us__gg_f16((const T *)NULL));
    const size_t smem = us__hop_smem(us__ggh_bytes(MODE));
    const int sms = o->sm_margin > 0 && o->sm_margin < c->n_sm ? c->n_sm - o->sm_margin : c->n_sm;
    us__ggh_table *t = (us__ggh_table *)c->ggh_tab; /* 24 KB: kept off the thread's stack */
    CUtensorMap ma, mb;
    int64_t rows = 1;
    int g, g0, ok;
    for (g = 0; g < G; g++)
        if (n[g] > 0 && off[g] + n[g] > rows) rows = off[g] + n[g];
    if (MODE == US_GG_WGRAD) /* A = Y_gᵀ and B = X_g, both by 64 rows of the reduction */
        ok = us__ggh_map(&ma, Y, dt, N, rows, ldy, US__GGH_BK) &&
             us__ggh_map(&mb, X, dt, K, rows, ldx, US__GGH_BK);
    else { /* A = X_g by 128 rows; mb unused (a copy, not encoded again) */
        ok = us__ggh_map(&ma, X, dt, K, rows, ldx, US__GGH_BM);
        mb = ma;
    }
    if (!t) t = (us__ggh_table *)(c->ggh_tab = malloc(sizeof(us__ggh_table)));
    if (!ok || !t) {
        us__cuda_fail(o, "gemm_grouped", "cuTensorMapEncodeTiled refused X or Y", __FILE__,
                      __LINE__);
        return;
    }
    us__gg_smem_once(o, (const void *)us__ggh_kernel<T, MODE>, smem, bit);
    for (g0 = 0; g0 < G; g0 += US__GGH_CAP) {
        const int64_t tiles = us__ggh_fill(t, MODE, G - g0, off + g0, n + g0, N, K, W + g0, dt);
        if (tiles < 0) {
            us__cuda_fail(o, "gemm_grouped", "too many tiles, or a W[g] the copy engine refused",
                          __FILE__, __LINE__);
            return;
        }
        if (!tiles) continue;
        us__ggh_kernel<T, MODE><<<(unsigned)(tiles < sms ? tiles : sms), 384, smem, c->stream>>>(
            *t, ma, mb, (T *)Y, ldy, N, K, (int)tiles);
        US__LAUNCHED(o);
    }
}

/* the three products of one element type on the Hopper kernel */
template <typename T>
static void us__ggh_modes(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n,
                          int64_t N, int64_t K, const void *X, int64_t ldx, void *const *W, void *Y,
                          int64_t ldy, us_dtype dt) {
    if (mode == US_GG_FPROP)
        us__ggh_launch<T, US_GG_FPROP>(o, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
    else if (mode == US_GG_DGRAD)
        us__ggh_launch<T, US_GG_DGRAD>(o, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
    else
        us__ggh_launch<T, US_GG_WGRAD>(o, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
}

/* Which path the default takes (us_cuda_grouped_kernel 0). The size rule, from bench_cuda
   --grouped on an H200 (bench/RESULTS.md, 2026-12-02): every product on the Hopper kernel wherever
   it takes the operands — Fprop and Dgrad at 0.97-1.11 of the per-group loop with 1536+ rows per
   expert and 1.2-4.0 with fewer rows or more experts, Wgrad (adding through the copy engine) at
   1.12-1.75 — except a Wgrad whose one expert's gradient passes 2^26 elements (256 MB of fp32):
   Mixtral's 28672 × 4096 gate|up ran at 0.81-0.86 of the loop there, its 4096 × 14336 down at
   1.12-1.14.
   The mma.sync kernel measured slower than the loop at every MoE shape, so it is never the
   default. */
static int us__gg_auto(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n, int64_t N,
                       int64_t K, const void *X, int64_t ldx, void *const *W, const void *Y,
                       int64_t ldy, us_dtype dt) {
    if (mode == US_GG_WGRAD && N * K > ((int64_t)1 << 26)) return US_CUDA_GG_LOOP;
    return us__ggh_fits(o, G, off, n, N, K, X, ldx, W, Y, ldy, dt) ? US_CUDA_GG_WGMMA
                                                                   : US_CUDA_GG_LOOP;
}

/* The product over every group, on the path us_cuda_grouped_kernel asked for (a kernel that
   cannot take the operands gives way to the loop) */
static void us__cuda_gemm_grouped(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n,
                                  int64_t N, int64_t K, const void *X, int64_t ldx, void *const *W,
                                  void *Y, int64_t ldy, us_dtype dt) {
    int path = us__cu(o)->gg_kernel;
    if (G <= 0 || N <= 0) return;
    if (path == US_CUDA_GG_AUTO)
        path = us__gg_auto(o, mode, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
    if (path == US_CUDA_GG_WGMMA && !us__ggh_fits(o, G, off, n, N, K, X, ldx, W, Y, ldy, dt))
        path = US_CUDA_GG_LOOP;
    if (path == US_CUDA_GG_MMA_SYNC && !us__gg_fits(o, G, n, N, K, X, ldx, W, Y, ldy, dt))
        path = US_CUDA_GG_LOOP;
    if (path == US_CUDA_GG_WGMMA && dt == US_BF16)
        us__ggh_modes<__nv_bfloat16>(o, mode, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
    else if (path == US_CUDA_GG_WGMMA)
        us__ggh_modes<__half>(o, mode, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
    else if (path == US_CUDA_GG_MMA_SYNC && dt == US_BF16)
        us__gg_modes<__nv_bfloat16>(o, mode, G, off, n, N, K, X, ldx, W, Y, ldy);
    else if (path == US_CUDA_GG_MMA_SYNC)
        us__gg_modes<__half>(o, mode, G, off, n, N, K, X, ldx, W, Y, ldy);
    else
        us__gemm_grouped_each(o, mode, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-optimizer  AdamW over flat fp32 buffers, Σx² for the global norm
/* ------------------------------------------------------------------------------------ */
template <typename L>
__global__ void us__k_adamw(float *p, const float *g, float *m, float *v, L *low, int64_t n,
                            float lr, float b1, float b2, float eps, float wd, float gscale,
                            float bc1, float bc2) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            st = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += st) {
        float gi = g[i] * gscale, mi = b1 * m[i] + (1.0f - b1) * gi,
              vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        float pi = p[i] * (1.0f - lr * wd) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (low) us__st(low, i, pi);
    }
}

/* Vector path: float4 over the body [head, head + 4·nvec), where head (0–3 elements) brings p to a
   16-byte boundary; the head and the tail (0–3 elements) are done by the first threads, one
   element each. Same formula, element by element, as the scalar kernel. */
static __device__ __forceinline__ void us__adamw1(float &p, float g, float &m, float &v, float lr,
                                                  float b1, float b2, float eps, float wd,
                                                  float gscale, float bc1, float bc2) {
    float gi = g * gscale, mi = b1 * m + (1.0f - b1) * gi, vi = b2 * v + (1.0f - b2) * gi * gi;
    float pi = p * (1.0f - lr * wd) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    m = mi;
    v = vi;
    p = pi;
}

template <typename L>
__global__ void us__k_adamw_vec(float *p, const float *g, float *m, float *v, L *low, int64_t n,
                                int64_t head, int64_t nvec, float lr, float b1, float b2, float eps,
                                float wd, float gscale, float bc1, float bc2) {
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            st = (int64_t)gridDim.x * blockDim.x, i;
    int64_t rest = n - head - 4 * nvec; /* tail elements */
    if (t < head + rest) {
        int64_t e = t < head ? t : head + 4 * nvec + (t - head);
        float pe = p[e], me = m[e], ve = v[e];
        us__adamw1(pe, g[e], me, ve, lr, b1, b2, eps, wd, gscale, bc1, bc2);
        m[e] = me;
        v[e] = ve;
        p[e] = pe;
        if (low) us__st(low, e, pe);
    }
    for (i = t; i < nvec; i += st) {
        int64_t e = head + 4 * i;
        float pv[4], gv[4], mv[4], vv[4];
        int k;
        us__ldv(p + e, pv);
        us__ldv(g + e, gv);
        us__ldv(m + e, mv);
        us__ldv(v + e, vv);
#pragma unroll
        for (k = 0; k < 4; k++)
            us__adamw1(pv[k], gv[k], mv[k], vv[k], lr, b1, b2, eps, wd, gscale, bc1, bc2);
        us__stv(m + e, mv);
        us__stv(v + e, vv);
        us__stv(p + e, pv);
        if (low) us__st4(low + e, pv);
    }
}

__global__ void us__k_axpy(float *y, const float *x, float a, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) y[i] += a * x[i];
}

static void us__cuda_axpy(us_ops *o, float *y, const float *x, float a, int64_t n) {
    if (n <= 0) return;
    us__k_axpy<<<us__blocks(n < (int64_t)1 << 24 ? n : (int64_t)1 << 24, 256), 256, 0,
                 us__cu(o)->stream>>>(y, x, a, n);
    US__CU(o, cudaGetLastError());
}

static void us__cuda_adamw(us_ops *o, float *p, const float *g, float *m, float *v, void *p_lowp,
                           us_dtype lowdt, int64_t n, float lr, float beta1, float beta2, float eps,
                           float wd, float gscale, int step) {
    cudaStream_t s = us__cu(o)->stream;
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    int lowbf =
        p_lowp && lowdt != US_F32; /* which copy the kernels write: bf16 / fp16, fp32 or none */
    int64_t head = (int64_t)(((16 - ((uintptr_t)p & 15)) & 15) / 4),
            nvec = n > head ? (n - head) / 4 : 0;
    int vec = us__al(p, 4) && nvec > 0 && us__al16(g + head) && us__al16(m + head) &&
              us__al16(v + head) &&
              (!p_lowp || (lowbf ? us__al((const __nv_bfloat16 *)p_lowp + head, 8)
                                 : us__al16((const float *)p_lowp + head)));
    if (vec) {
        int64_t rest = n - head - 4 * nvec;
        unsigned gr = us__blocks(nvec > head + rest ? nvec : head + rest, 256);
        if (!lowbf)
            us__k_adamw_vec<float><<<gr, 256, 0, s>>>(p, g, m, v, (float *)p_lowp, n, head, nvec,
                                                      lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
        else if (lowdt == US_F16)
            us__k_adamw_vec<__half><<<gr, 256, 0, s>>>(p, g, m, v, (__half *)p_lowp, n, head, nvec,
                                                       lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
        else
            us__k_adamw_vec<__nv_bfloat16><<<gr, 256, 0, s>>>(p, g, m, v, (__nv_bfloat16 *)p_lowp,
                                                              n, head, nvec, lr, beta1, beta2, eps,
                                                              wd, gscale, bc1, bc2);
    } else {
        unsigned gr = us__blocks(n, 256);
        if (!lowbf)
            us__k_adamw<float><<<gr, 256, 0, s>>>(p, g, m, v, (float *)p_lowp, n, lr, beta1, beta2,
                                                  eps, wd, gscale, bc1, bc2);
        else if (lowdt == US_F16)
            us__k_adamw<__half><<<gr, 256, 0, s>>>(p, g, m, v, (__half *)p_lowp, n, lr, beta1,
                                                   beta2, eps, wd, gscale, bc1, bc2);
        else
            us__k_adamw<__nv_bfloat16><<<gr, 256, 0, s>>>(p, g, m, v, (__nv_bfloat16 *)p_lowp, n,
                                                          lr, beta1, beta2, eps, wd, gscale, bc1,
                                                          bc2);
    }
    US__LAUNCHED(o);
}

/* Σx² with a fixed grid: each block sums a fixed stride pattern in double, then one block sums
   the partials in order — the same bits every run. */
#define US__RED_BLOCKS 512

__global__ void us__k_sumsq_part(double *part, const float *x, int64_t n) {
    __shared__ double sh[32];
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
            st = (int64_t)gridDim.x * blockDim.x;
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
    US__CU(o,
           cudaMemcpyAsync(c->host_red, part, sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    US__CU(o, cudaStreamSynchronize(c->stream));
    return c->failed ? NAN : *c->host_red;
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-fp8  FP8 training: fused tile quantisation, block-scaled cuBLASLt FP8 GEMMs
/* ------------------------------------------------------------------------------------ */
/* The operand layout and the scale rule are the CPU's (us_ops.fp8_quantize, // >>fp8), bit for
   bit: amax of a tile, s = us__fp8_scale(amax) (the same function), q = RNE-satfinite E4M3 of
   x · (1/s) (one IEEE division per tile: nvcc's default -prec-div=true), zero padding to whole
   128-element tiles along the reduction. One read of x: a tile's elements stay in registers (or
   shared memory, for the transposed tiles) from the amax to the cast; the scales land in the
   layout cuBLASLt's VEC128_32F / BLK128x128_32F modes read (DESIGN.md "Performance"). */
static __device__ __forceinline__ uint8_t us__e4m3(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

static __device__ __forceinline__ uint32_t us__e4m3x2(float a, float b) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

/* |v| as bits: for non-negative floats the unsigned order is the numeric order and NaN patterns
   sort above inf, so an integer max is the NaN-sticky amax in two instructions */
static __device__ __forceinline__ unsigned us__abits(float v) {
    return __float_as_uint(v) & 0x7fffffffu;
}

/* 4 consecutive elements in one load (16-byte fp32, 8-byte bf16/fp16); the caller guarantees
   the alignment (vec bit 1, checked on the host) */
static __device__ __forceinline__ void us__ld4(const float *p, float *f) {
    float4 u = *reinterpret_cast<const float4 *>(p);
    f[0] = u.x;
    f[1] = u.y;
    f[2] = u.z;
    f[3] = u.w;
}

static __device__ __forceinline__ void us__ld4(const __nv_bfloat16 *p, float *f) {
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x)),
           y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    f[0] = x.x;
    f[1] = x.y;
    f[2] = y.x;
    f[3] = y.y;
}

static __device__ __forceinline__ void us__ld4(const __half *p, float *f) {
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    float2 x = __half22float2(*reinterpret_cast<const __half2 *>(&u.x)),
           y = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    f[0] = x.x;
    f[1] = x.y;
    f[2] = y.x;
    f[3] = y.y;
}

/* four E4M3 bytes of v·r, little-endian: P's elements l..l+3 as one 4-byte store */
static __device__ __forceinline__ uint32_t us__e4m3x4(const float *v, float r) { /* r = 1/s */
    return us__e4m3x2(v[0] * r, v[1] * r) | us__e4m3x2(v[2] * r, v[3] * r) << 16;
}

static __device__ __forceinline__ void us__st_q4(uint8_t *q, uint32_t w, int vec) {
    if (vec & 2)
        *reinterpret_cast<uint32_t *>(q) = w;
    else {
        q[0] = (uint8_t)w;
        q[1] = (uint8_t)(w >> 8);
        q[2] = (uint8_t)(w >> 16);
        q[3] = (uint8_t)(w >> 24);
    }
}

static __device__ __forceinline__ unsigned
us__oct_umax(unsigned a) { /* over the 8 lanes of a tile */
    a = max(a, __shfl_xor_sync(0xffffffffu, a, 4));
    a = max(a, __shfl_xor_sync(0xffffffffu, a, 2));
    return max(a, __shfl_xor_sync(0xffffffffu, a, 1));
}

/* vec bits: 1 = x may be read 16 (row), 8 (block) or 4 (transposed row) elements at a time, 2 =
   q is 16-byte aligned (4- to 16-byte stores). gamax non-NULL: one scale from the whole tensor's
   amax (TENSOR). These kernels are instruction-bound before they are memory-bound (a tile's
   scale costs two divisions), so each thread quantises as many elements per scale as it can. */

/* ROW128 of P = x [R][L]: 8 lanes per 1×128 tile, lane j of them holding elements 16j..16j+15
   (two 16-byte loads of bf16, one 16-byte store); a warp takes 4 tiles per round and 2 rounds,
   all loads issued before the first reduction. Four blocks per SM (64 registers, no spills):
   at 65 registers it ran three, latency-bound, 10-18 % slower (bench_cuda --fp8-gemm, H200). */
#define US__ROW_ROUNDS 2

template <typename T>
__global__ void __launch_bounds__(256, 4)
    us__k_fp8_row(uint8_t *q, float *s, const T *x, int64_t R, int64_t L, int64_t Lp, int pow2,
                  int vec, const unsigned *gamax) {
    /* tile numbers fit 32 bits (2^32 tiles would be 512 GB of q), and 32-bit division is far cheaper */
    uint32_t LB = (uint32_t)(Lp / 128), nt = (uint32_t)(R * LB),
             t0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * (4 * US__ROW_ROUNDS),
             rr[US__ROW_ROUNDS];
    int lane = threadIdx.x & 7, sub = (threadIdx.x >> 3) & 3, u, j;
    int64_t ll[US__ROW_ROUNDS];
    float v[US__ROW_ROUNDS][16], g = gamax ? __uint_as_float(*gamax) : 0.0f;
#pragma unroll
    for (u = 0; u < US__ROW_ROUNDS; u++) {
        uint32_t tile = t0 + 4 * u + sub;
        int64_t r = rr[u] = tile / LB, l = ll[u] = (int64_t)(tile % LB) * 128 + 16 * lane;
        if (tile < nt && (vec & 1) && l < L) { /* vec: L % 16 == 0 */
#pragma unroll
            for (j = 0; j < 16; j += 4) us__ld4(x + r * L + l + j, v[u] + j);
        } else
            for (j = 0; j < 16; j++)
                v[u][j] = tile < nt && l + j < L ? us__ld(x, r * L + l + j) : 0.0f;
    }
#pragma unroll
    for (u = 0; u < US__ROW_ROUNDS; u++) {
        uint32_t tile = t0 + 4 * u + sub;
        int64_t r = rr[u], l0 = ll[u] - 16 * lane;
        unsigned a = 0;
        float sc, rc;
        uint8_t *p = q + r * Lp + l0 + 16 * lane;
        for (j = 0; j < 16; j++) a = max(a, us__abits(v[u][j]));
        sc = us__fp8_scale(gamax ? g : __uint_as_float(us__oct_umax(a)), pow2);
        rc = 1.0f / sc;
        if (tile >= nt) continue;
        if (vec & 2)
            *reinterpret_cast<uint4 *>(p) =
                make_uint4(us__e4m3x4(v[u], rc), us__e4m3x4(v[u] + 4, rc), us__e4m3x4(v[u] + 8, rc),
                           us__e4m3x4(v[u] + 12, rc));
        else
            for (j = 0; j < 16; j += 4) us__st_q4(p + j, us__e4m3x4(v[u] + j, rc), 0);
        if (lane == 0 && (!gamax || tile == 0)) s[gamax ? 0 : l0 / 128 * R + r] = sc;
    }
}

/* ROW128 of P = xᵀ (x [L][R] as stored): the 128×1 tiles of x that Wgrad reduces over, and with
   q2 (fp8_quantize_both) x's own 1×128 tiles along R, from the same read of x. A block takes a
   128 (l) × 128 (r) patch of x and holds it in registers as x's raw bits: warp w of NW the RW
   neighbouring rows l1 = l0 + RW·w .. l1 + RW − 1, lane j the columns r0 + 4j .. + 3 of each (one
   8-byte load of bf16 a row, all RW in flight). Every amax and every byte is then made where the
   elements already are:
   - a row is one warp's: a lane's 4 |x| patterns (16-bit ones two at a time, one packed max),
     then a warp-wide max (one redux), lane i keeping row i's amax; lane i computes that row's
     scale (the divisions once per tile, not once per lane) and shuffles 1/s to the others;
   - a column runs down every warp: each lane keeps its 4 columns' maxima over its RW rows, the
     warps meet in shared memory (red [NW][128]) and thread c < 128 computes column c's scale;
   - a lane's column c over its RW rows is RW neighbouring bytes of P's row r0 + 4j + c: the E4M3
     pairs of rows i, i + 1 pack into words. Stored from there, each lane's few bytes would be a
     partial sector of their own (L2-bound), so they meet in shared memory (qs: 128 P rows of 128
     bytes, a lane's chunk placed by an XOR with its row so that a store's lanes meet different
     banks) and 8 lanes write each 128-byte row of P, 16 bytes a lane.
   The patch itself is never re-read from shared memory. RW is 16 (8 warps, 256 threads) where a
   thread holds one patch's 16 rows, 8 (16 warps, 512 threads) where it holds NP = 2 patches
   side by side (SwiGLU's backward: the gate's and the up's columns), one set of barriers for
   both. FULL: the patch is whole (l0 + 128 ≤ L, r0 + 128 ≤ R) and q 16-byte aligned (vec bit
   2), the common case, compiled without the per-row bounds branches
   (us__fp8_row_t_full picks it). Rows past L must hold zeros: P's bytes there are its padding. */
/* a 16-bit |x| pattern (sign cleared) as the bits of the same |x| in fp32, which orders alike */
template <typename T>
__device__ __forceinline__ unsigned us__abits16(unsigned b);

template <>
__device__ __forceinline__ unsigned us__abits16<__nv_bfloat16>(unsigned b) {
    return b << 16;
}

template <>
__device__ __forceinline__ unsigned us__abits16<__half>(unsigned b) {
    return us__abits(__half2float(__ushort_as_half((unsigned short)b)));
}

/* two 16-bit elements of one 4-byte word as floats (little-endian: the lower address is lo) */
static __device__ __forceinline__ void us__unpack2(const __nv_bfloat16 *, uint32_t u, float &lo,
                                                   float &hi) {
    lo = __uint_as_float(u << 16);
    hi = __uint_as_float(u & 0xffff0000u);
}

static __device__ __forceinline__ void us__unpack2(const __half *, uint32_t u, float &lo,
                                                   float &hi) {
    float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&u));
    lo = f.x;
    hi = f.y;
}
template <typename T>
struct us__raw4; /* 4 elements of T as one load */

template <>
struct us__raw4<float> {
    typedef float4 t;
};

template <>
struct us__raw4<__nv_bfloat16> {
    typedef uint2 t;
};

template <>
struct us__raw4<__half> {
    typedef uint2 t;
};

/* the 4 elements of one raw load as floats */
template <typename T>
static __device__ __forceinline__ void us__unpack4(const typename us__raw4<T>::t &v, float *f) {
    if constexpr (sizeof(T) == 4) {
        f[0] = v.x;
        f[1] = v.y;
        f[2] = v.z;
        f[3] = v.w;
    } else {
        us__unpack2((const T *)0, v.x, f[0], f[1]);
        us__unpack2((const T *)0, v.y, f[2], f[3]);
    }
}

/* a staged patch [128][132] of T in shared memory (SwiGLU's kernels): +4 keeps rows 8- and
   16-byte aligned */
template <typename T>
__device__ __forceinline__ T (*us__rowt_sm(unsigned char *smem))[132] {
    return reinterpret_cast<T(*)[132]>(smem);
}

/* a column amax part as the tile code keeps it in shared memory: the 16-bit |x| pattern for
   16-bit T (converted once, by the thread that computes the scale), the fp32 bits for fp32 */
template <typename T>
struct us__apart {
    typedef unsigned short t;
};

template <>
struct us__apart<float> {
    typedef unsigned t;
};

/* The tile code's shared memory for NP patches of NW warps: red [NP][NW][128] the column amax
   parts, then rcs [NP][128] each column's 1/s; and, apart, qs [NP][128][32] P's rows */
#define US__ROWT_SCRATCH(T, NP, NW) ((NP) * ((NW)*128 * sizeof(typename us__apart<T>::t) + 512))
#define US__ROWT_QS(NP) ((NP)*128 * 128)

/* us__fp8_row_t_regs' last part: P's rows from qs to q, 16 bytes a lane (words 4m .. 4m + 3 of
   a row, m = j mod 8): 8 lanes a 128-byte row */
template <int RW, int NP, bool FULL>
__device__ __forceinline__ void us__fp8_row_t_out(const uint32_t *qs, uint8_t *q, int64_t R,
                                                  int64_t Lp, int64_t r0, int64_t rstep, int64_t l0,
                                                  int vec) {
    enum { NW = 128 / RW, K = RW / 4 };

    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, m = lane & 7, i;
#pragma unroll
    for (i = 4 * w + (lane >> 3); i < 128 * NP; i += 4 * NW) {
        int key = (i >> 2) & (NW - 1), rr = i & 127;
        const uint32_t *row = qs + i * 32;
        int64_t r = r0 + (i >> 7) * rstep + rr;
        uint4 b;
        if constexpr (K == 4)
            b = *reinterpret_cast<const uint4 *>(row + 4 * (m ^ key));
        else {
            uint2 lo = *reinterpret_cast<const uint2 *>(row + 2 * ((2 * m) ^ key)),
                  hi = *reinterpret_cast<const uint2 *>(row + 2 * ((2 * m + 1) ^ key));
            b = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
        uint8_t *d = q + r * Lp + l0 + 16 * m;
        if (FULL)
            *reinterpret_cast<uint4 *>(d) = b;
        else if (r < R) {
            us__st_q4(d, b.x, vec);
            us__st_q4(d + 4, b.y, vec);
            us__st_q4(d + 8, b.z, vec);
            us__st_q4(d + 12, b.w, vec);
        }
    }
}

/* NP patches of x [L][R] at rows l0.., columns r0 + p·rstep.. (p < NP) held in v [p] as above
   (P = xᵀ's rows there, tiles along l0..; with q2 x's 1×128 tiles along R too). scr, qs: their
   shared memory (qs 16-byte aligned, first written after the second barrier, so a kernel may
   lend it bytes it staged its inputs in). Every thread of the block (128 / RW warps) calls it:
   its barriers are the block's. */
template <typename T, int RW, int NP, bool FULL>
__device__ __forceinline__ void
us__fp8_row_t_regs(const typename us__raw4<T>::t (&v)[NP][RW], unsigned char *scr, uint32_t *qs,
                   uint8_t *q, float *s, int64_t R, int64_t L, int64_t Lp, int64_t r0,
                   int64_t rstep, int64_t l0, int pow2, int vec, const unsigned *gamax, uint8_t *q2,
                   float *s2) {
    typedef typename us__apart<T>::t A;

    enum { NW = 128 / RW, K = RW / 4 }; /* K: words of a lane's column bytes */

    A(*red)[NW][128] = reinterpret_cast<A(*)[NW][128]>(scr);
    float(*rcs)[128] = reinterpret_cast<float(*)[128]>(scr + NP * NW * 128 * sizeof(A));
    int t = threadIdx.x, lane = t & 31, w = t >> 5, i, c, p;
    int64_t l1 = l0 + RW * w, Rp = (R + 127) / 128 * 128;
    bool first = !gamax || (blockIdx.x == 0 && blockIdx.y == 0 && t == 0); /* writes TENSOR's s */
    float rc[NP];
#pragma unroll
    for (p = 0; p < NP; p++) { /* the amaxes: the lane's 4 columns over RW rows, and each row */
        unsigned ca[4] = {0, 0, 0, 0}, mine = 0;
#pragma unroll
        for (i = 0; i < RW; i++) {
            unsigned b; /* the row's amax part; for 16-bit T the columns packed in pairs: */
            if constexpr (sizeof(T) == 2) { /* 4j and 4j + 1 in ca[0], 4j + 2 and + 3 in ca[1] */
                uint32_t a0 = v[p][i].x & 0x7fff7fffu, a1 = v[p][i].y & 0x7fff7fffu,
                         m2 = __vmaxu2(a0, a1);
                ca[0] = __vmaxu2(ca[0], a0);
                ca[1] = __vmaxu2(ca[1], a1);
                b = max(m2 & 0xffffu, m2 >> 16);
            } else {
                unsigned a[4] = {us__abits(v[p][i].x), us__abits(v[p][i].y), us__abits(v[p][i].z),
                                 us__abits(v[p][i].w)};
                for (c = 0; c < 4; c++) ca[c] = max(ca[c], a[c]);
                b = max(max(a[0], a[1]), max(a[2], a[3]));
            }
            if (q2) {
                b = __reduce_max_sync(0xffffffffu, b);
                mine = lane == i ? b : mine;
            }
        }
        if constexpr (sizeof(T) == 2) {
            *reinterpret_cast<uint2 *>(&red[p][w][4 * lane]) = make_uint2(ca[0], ca[1]);
            mine = us__abits16<T>(mine);
        } else
            *reinterpret_cast<uint4 *>(&red[p][w][4 * lane]) =
                make_uint4(ca[0], ca[1], ca[2], ca[3]);
        if (q2) { /* lane i < RW: row l1 + i's scale; every lane's 1/s, shuffled out below */
            float sc = us__fp8_scale(__uint_as_float(gamax ? *gamax : mine), pow2);
            rc[p] = 1.0f / sc;
            if (lane < RW && (FULL || l1 + lane < L) && first)
                s2[gamax ? 0 : (r0 + p * rstep) / 128 * L + l1 + lane] = sc;
        }
    }
    __syncthreads();
    if (t < 128 * NP) { /* column t of patch t / 128: its scale, once */
        int64_t rr = r0 + (t >> 7) * rstep + (t & 127);
        unsigned a = red[t >> 7][0][t & 127];
        for (i = 1; i < NW; i++) a = max(a, (unsigned)red[t >> 7][i][t & 127]);
        if constexpr (sizeof(T) == 2) a = us__abits16<T>(a);
        float sc = us__fp8_scale(__uint_as_float(gamax ? *gamax : a), pow2);
        rcs[t >> 7][t & 127] = 1.0f / sc;
        if ((FULL || rr < R) && first) s[gamax ? 0 : l0 / 128 * R + rr] = sc;
    }
    __syncthreads();
#pragma unroll
    for (p = 0; p < NP; p++) { /* the bytes */
        float rk[4];
        uint32_t cw[4][K]; /* the lane's column c, rows 4k .. 4k + 3 as E4M3 bytes in word k */
        us__ld4(&rcs[p][4 * lane], rk);
#pragma unroll
        for (i = 0; i < RW; i += 2) { /* rows i and i + 1 */
            float a[4], b[4];
            us__unpack4<T>(v[p][i], a);
            us__unpack4<T>(v[p][i + 1], b);
            if (q2) { /* x's 1×128 tiles: 4 bytes a lane, a warp's 128-byte row */
                uint8_t *p2 = q2 + (l1 + i) * Rp + r0 + p * rstep + 4 * lane;
                float ra = __shfl_sync(0xffffffffu, rc[p], i),
                      rb = __shfl_sync(0xffffffffu, rc[p], i + 1);
                if (FULL || l1 + i < L) us__st_q4(p2, us__e4m3x4(a, ra), 2);
                if (FULL || l1 + i + 1 < L) us__st_q4(p2 + Rp, us__e4m3x4(b, rb), 2);
            }
#pragma unroll
            for (c = 0; c < 4; c++) {
                uint32_t hw = us__e4m3x2(a[c] * rk[c], b[c] * rk[c]);
                cw[c][i / 4] = i % 4 ? cw[c][i / 4] | hw << 16 : hw;
            }
        }
        /* P's row 4j + c: its bytes l1 - l0 .. + RW − 1 are chunk w (K words) of qs [p][4j + c],
           placed at chunk w ^ (j mod NW) so that a store's 8 (RW 16) or 16 (RW 8) lanes write
           different banks */
#pragma unroll
        for (c = 0; c < 4; c++) {
            uint32_t *d = qs + (p * 128 + 4 * lane + c) * 32 + (w ^ (lane & (NW - 1))) * K;
            if constexpr (K == 4)
                *reinterpret_cast<uint4 *>(d) = make_uint4(cw[c][0], cw[c][1], cw[c][2], cw[c][3]);
            else
                *reinterpret_cast<uint2 *>(d) = make_uint2(cw[c][0], cw[c][1]);
        }
    }
    __syncthreads();
    us__fp8_row_t_out<RW, NP, FULL>(qs, q, R, Lp, r0, rstep, l0, vec);
}

/* whether the patch at l0, r0 takes us__fp8_row_t_regs' FULL path */
static __device__ __forceinline__ bool us__fp8_row_t_full(int64_t R, int64_t L, int64_t r0,
                                                          int64_t l0, int vec) {
    return l0 + 128 <= L && r0 + 128 <= R && (vec & 2);
}

/* us__fp8_row_t_regs on its FULL path where full says so, else on the bounds-checked one */
template <typename T, int RW, int NP>
__device__ __forceinline__ void
us__fp8_row_t_patch(bool full, const typename us__raw4<T>::t (&v)[NP][RW], unsigned char *scr,
                    uint32_t *qs, uint8_t *q, float *s, int64_t R, int64_t L, int64_t Lp,
                    int64_t r0, int64_t rstep, int64_t l0, int pow2, int vec, const unsigned *gamax,
                    uint8_t *q2, float *s2) {
    if (full)
        us__fp8_row_t_regs<T, RW, NP, true>(v, scr, qs, q, s, R, L, Lp, r0, rstep, l0, pow2, vec,
                                            gamax, q2, s2);
    else
        us__fp8_row_t_regs<T, RW, NP, false>(v, scr, qs, q, s, R, L, Lp, r0, rstep, l0, pow2, vec,
                                             gamax, q2, s2);
}

template <typename T>
__global__ void __launch_bounds__(256, sizeof(T) == 2 ? 4 : 1)
    us__k_fp8_row_t(uint8_t *q, float *s, const T *x, int64_t R, int64_t L, int64_t Lp, int pow2,
                    int vec, const unsigned *gamax, uint8_t *q2, float *s2) {
    typedef typename us__raw4<T>::t V;
    extern __shared__ __align__(16) unsigned char us__rowt_smem[];
    int64_t r0 = (int64_t)blockIdx.x * 128, l0 = (int64_t)blockIdx.y * 128,
            r = r0 + 4 * (threadIdx.x & 31), l1 = l0 + 16 * (threadIdx.x >> 5);
    int i, j;
    V v[1][16];
    if (vec & 1) { /* R % 4 == 0 and x 4-element aligned: a lane's 4 are in or out together */
#pragma unroll
        for (i = 0; i < 16; i++)
            v[0][i] =
                l1 + i < L && r < R ? *reinterpret_cast<const V *>(x + (l1 + i) * R + r) : V();
    } else {
#pragma unroll
        for (i = 0; i < 16; i++) {
            float f[4];
            for (j = 0; j < 4; j++)
                f[j] = l1 + i < L && r + j < R ? us__ld(x, (l1 + i) * R + r + j) : 0.0f;
            us__st4(reinterpret_cast<T *>(&v[0][i]), f);
        }
    }
    us__fp8_row_t_patch<T, 16, 1>(us__fp8_row_t_full(R, L, r0, l0, vec), v,
                                  us__rowt_smem + US__ROWT_QS(1),
                                  reinterpret_cast<uint32_t *>(us__rowt_smem), q, s, R, L, Lp, r0,
                                  0, l0, pow2, vec, gamax, q2, s2);
}

/* its shared memory: the tile code's, 8 warps */
template <typename T>
static size_t us__fp8_row_t_smem(void) {
    return US__ROWT_QS(1) + US__ROWT_SCRATCH(T, 1, 8);
}

/* raise kernel fn's dynamic shared memory limit to bytes, once per device (asked: the devices
   it was raised on, one bit each) */
static void us__smem_raise(const void *fn, size_t bytes, unsigned long long *asked) {
    int d = 0;
    cudaGetDevice(&d);
    if (d >= 64 || !(*asked >> d & 1)) {
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (d < 64) *asked |= 1ull << d;
    }
}

template <typename T>
static void us__fp8_row_t_launch(dim3 grid, cudaStream_t st, uint8_t *q, float *s, const T *x,
                                 int64_t R, int64_t L, int64_t Lp, int pow2, int vec,
                                 const unsigned *gamax, uint8_t *q2 = NULL, float *s2 = NULL) {
    us__k_fp8_row_t<T>
        <<<grid, 256, us__fp8_row_t_smem<T>(), st>>>(q, s, x, R, L, Lp, pow2, vec, gamax, q2, s2);
}

/* ---- BLOCK128: the weight cache's W and Wᵀ (128×128 blocks, one scale each). This kernel moves
   2 bytes in and 1 or 2 out per element and computes next to nothing, so its speed is the bytes
   it keeps in flight per SM and how little each block waits. A thread holds an 8×8 patch of x
   as raw bits ("oct": 8 neighbouring elements of one row, 16 bytes of bf16): 8 loads of 16
   bytes, all in flight, in 32 registers, so that four blocks of 256 threads share an SM (64
   registers, no spills; fp32: 106, two blocks) and one block's barrier and stores overlap the
   others' loads: 128 KB of loads in flight per SM. The patch's rows are 8-byte pieces of P's
   rows; a byte transpose in registers makes its columns 8-byte pieces of Pᵀ's rows, so neither
   orientation goes through shared memory (bench/RESULTS.md, eighth session, measures it against
   the staged form it replaced). */
template <typename T>
struct us__oct {
    uint32_t w[2 * sizeof(T)]; /* 8 elements of T as their bits, element 0 lowest */
};

/* 8 elements at p in 16-byte loads (p 16-byte aligned, the caller checks) */
template <typename T>
static __device__ __forceinline__ void us__oct_ld(us__oct<T> &o, const T *p) {
#pragma unroll
    for (int i = 0; i < (int)sizeof(T) / 2; i++) {
        uint4 u = reinterpret_cast<const uint4 *>(p)[i];
        o.w[4 * i] = u.x;
        o.w[4 * i + 1] = u.y;
        o.w[4 * i + 2] = u.z;
        o.w[4 * i + 3] = u.w;
    }
}

/* the first n (any int64) of x[i..i+7] one at a time, the rest zero: edges and unaligned x */
template <typename T>
static __device__ __forceinline__ void us__oct_ld1(us__oct<T> &o, const T *x, int64_t i,
                                                   int64_t n) {
    const int per = 4 / (int)sizeof(T); /* elements per word */
#pragma unroll
    for (int j = 0; j < 2 * (int)sizeof(T); j++) o.w[j] = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) { /* constant indices: o stays in registers */
        uint32_t b = 0;
        if (j < n) memcpy(&b, x + i + j, sizeof(T));
        o.w[j / per] |= b << 8 * (int)sizeof(T) * (j % per);
    }
}

/* a's running maximum of |element| bits: fp32 one per element (us__abits's order); 16-bit types
   two per word, packed (their |x| patterns order as their values do), unpacked by us__oct_abits */
static __device__ __forceinline__ unsigned us__oct_amax(const us__oct<float> &o, unsigned a) {
#pragma unroll
    for (int j = 0; j < 8; j++) a = max(a, o.w[j] & 0x7fffffffu);
    return a;
}

template <typename T>
static __device__ __forceinline__ unsigned us__oct_amax(const us__oct<T> &o, unsigned a) {
#pragma unroll
    for (int j = 0; j < 4; j++) a = __vmaxu2(a, o.w[j] & 0x7fff7fffu);
    return a;
}

static __device__ __forceinline__ unsigned us__oct_abits(const float *, unsigned a) { return a; }

template <typename T> /* the larger of the two packed maxima, as the fp32 bits of that |x| */
static __device__ __forceinline__ unsigned us__oct_abits(const T *, unsigned a) {
    return max(us__abits16<T>(a & 0xffffu), us__abits16<T>(a >> 16));
}

/* the 8 E4M3 bytes of the oct's elements times r = 1/s (x: lowest byte first) */
static __device__ __forceinline__ uint2 us__oct_e4m3(const us__oct<float> &o, float r) {
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = __uint_as_float(o.w[j]);
    return make_uint2(us__e4m3x4(f, r), us__e4m3x4(f + 4, r));
}

template <typename T>
static __device__ __forceinline__ uint2 us__oct_e4m3(const us__oct<T> &o, float r) {
    float f[8];
#pragma unroll
    for (int j = 0; j < 4; j++) us__unpack2((const T *)NULL, o.w[j], f[2 * j], f[2 * j + 1]);
    return make_uint2(us__e4m3x4(f, r), us__e4m3x4(f + 4, r));
}

/* 4×4 bytes transposed in place: a, b, c, d rows of 4 bytes in, columns out */
static __device__ __forceinline__ void us__t4x4(uint32_t &a, uint32_t &b, uint32_t &c,
                                                uint32_t &d) {
    uint32_t ab0 = __byte_perm(a, b, 0x5140); /* bytes a0 b0 a1 b1 */
    uint32_t ab1 = __byte_perm(a, b, 0x7362); /* a2 b2 a3 b3 */
    uint32_t cd0 = __byte_perm(c, d, 0x5140); /* c0 d0 c1 d1 */
    uint32_t cd1 = __byte_perm(c, d, 0x7362); /* c2 d2 c3 d3 */
    a = __byte_perm(ab0, cd0, 0x5410);
    b = __byte_perm(ab0, cd0, 0x7632);
    c = __byte_perm(ab1, cd1, 0x5410);
    d = __byte_perm(ab1, cd1, 0x7632);
}

/* 8×8 bytes transposed in place: b[i] row i's bytes 0-3 (.x) and 4-7 (.y) in, columns out */
static __device__ __forceinline__ void us__t8x8(uint2 *b) {
    uint32_t t;
    us__t4x4(b[0].x, b[1].x, b[2].x, b[3].x); /* rows 0-3, columns 0-3 */
    us__t4x4(b[0].y, b[1].y, b[2].y, b[3].y);
    us__t4x4(b[4].x, b[5].x, b[6].x, b[7].x);
    us__t4x4(b[4].y, b[5].y, b[6].y, b[7].y);
#pragma unroll
    for (int i = 0; i < 4; i++) { /* column i's rows 4-7 are in b[4+i].x, 4+i's 0-3 in b[i].y */
        t = b[i].y;
        b[i].y = b[4 + i].x;
        b[4 + i].x = t;
    }
}

/* 8 bytes to p: one store where p is 8-byte aligned (al), else one byte at a time */
static __device__ __forceinline__ void us__st_q8(uint8_t *p, uint2 b, int al) {
    if (al)
        *reinterpret_cast<uint2 *>(p) = b;
    else {
        us__st_q4(p, b.x, 0);
        us__st_q4(p + 4, b.y, 0);
    }
}

/* BLOCK128 of P = x (trans 0) or xᵀ (trans 1), x [XR][XC] as stored: one block of 256 threads
   per 128×128 block of x. Warp w takes rows 32·(w/2).. and columns 64·(w mod 2).. of it, lane
   the 8×8 patch at rows +8·(lane/8), columns +8·(lane mod 8): a load instruction reads 4 rows
   of 128 bytes, a store writes 32-byte sectors. The warps' amaxes meet in shared memory (the one
   barrier); the scale and its 1/s are the CPU's. Scales [RB][LBp], the padding columns 1.
   qt non-NULL (trans 0 only; fp8_quantize_both): also BLOCK128 of xᵀ into qt, st (q [L][Rp],
   s [LB][RBp]) from the same registers: the weight cache's W and Wᵀ in one read.
   vec bits: 1 = x may be read 8 elements at a time (XC % 8 == 0, x 16-byte aligned), 2 = q is
   16-byte aligned, 4 = qt is 8-byte aligned. */
template <typename T>
__global__ void __launch_bounds__(256, sizeof(T) == 4 ? 2 : 4)
    us__k_fp8_block(uint8_t *q, float *s, const T *x, int64_t R, int64_t L, int64_t Lp, int trans,
                    int pow2, int vec, uint8_t *qt = NULL, float *st = NULL) {
    __shared__ unsigned red[8];
    int64_t rb = blockIdx.y, lb = blockIdx.x, LB = Lp / 128, LBp = (LB + 3) / 4 * 4;
    int64_t XR = trans ? L : R, XC = trans ? R : L, XRp = (XR + 127) / 128 * 128;
    int t = threadIdx.x, lane = t & 31, w = t >> 5, i;
    int64_t xr = (trans ? lb : rb) * 128 + 32 * (w >> 1) + 8 * (lane >> 3), /* the patch */
        xc = (trans ? rb : lb) * 128 + 64 * (w & 1) + 8 * (lane & 7);
    us__oct<T> v[8]; /* x's rows xr..xr+7, columns xc..xc+7 */
    uint2 b[8];      /* their E4M3 bytes */
    unsigned a = 0;
    float sc, rc;
#pragma unroll
    for (i = 0; i < 8; i++) {
        if ((vec & 1) && xr + i < XR && xc < XC)
            us__oct_ld(v[i], x + (xr + i) * XC + xc);
        else
            us__oct_ld1(v[i], x, (xr + i) * XC + xc, xr + i < XR ? XC - xc : 0);
    }
#pragma unroll
    for (i = 0; i < 8; i++) a = us__oct_amax(v[i], a);
    a = __reduce_max_sync(0xffffffffu, us__oct_abits(x, a));
    if (lane == 0) red[w] = a;
    __syncthreads();
    for (i = 0; i < 8; i++) a = max(a, red[i]);
    sc = us__fp8_scale(__uint_as_float(a), pow2);
    rc = 1.0f / sc;
#pragma unroll
    for (i = 0; i < 8; i++) b[i] = us__oct_e4m3(v[i], rc);
    if (!trans) /* P = x: the patch's rows, q [R][Lp] */
#pragma unroll
        for (i = 0; i < 8; i++)
            if (xr + i < XR) us__st_q8(q + (xr + i) * Lp + xc, b[i], vec & 2);
    if (trans || qt) { /* Pᵀ's rows are the patch's columns: q [R][Lp] (trans) or qt [L][Rp] */
        uint8_t *dst = trans ? q : qt;
        us__t8x8(b);
#pragma unroll
        for (i = 0; i < 8; i++)
            if (xc + i < XC) us__st_q8(dst + (xc + i) * XRp + xr, b[i], vec & (trans ? 2 : 4));
    }
    if (t == 0) {
        s[rb * LBp + lb] = sc;
        if (lb == LB - 1)
            for (i = (int)LB; i < (int)LBp; i++) s[rb * LBp + i] = 1.0f;
        if (qt) { /* xᵀ's block (lb, rb), the same scale */
            int64_t RB = (R + 127) / 128, RBp = (RB + 3) / 4 * 4;
            st[lb * RBp + rb] = sc;
            if (rb == RB - 1)
                for (i = (int)RB; i < (int)RBp; i++) st[lb * RBp + i] = 1.0f;
        }
    }
}

/* TENSOR: the amax of |x| as the maximum of its bit patterns (for non-negative floats the
   integer order is the numeric order, and NaN patterns sort above inf: a NaN wins); the row
   kernels then cast with that one scale */
template <typename T>
__global__ void us__k_fp8_amax(unsigned *amax, const T *x, int64_t n, int vec) {
    __shared__ unsigned red[32];
    int64_t i, st = (int64_t)gridDim.x * blockDim.x;
    unsigned a = 0;
    if (vec & 1) { /* n % 4 == 0 */
        for (i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += st) {
            float v[4];
            us__ld4(x + 4 * i, v);
            a = max(max(a, us__abits(v[0])),
                    max(max(us__abits(v[1]), us__abits(v[2])), us__abits(v[3])));
        }
    } else
        for (i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += st)
            a = max(a, us__abits(us__ld(x, i)));
    a = __reduce_max_sync(0xffffffffu, a);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        int k;
        for (k = 1; k < (int)(blockDim.x >> 5); k++) a = max(a, red[k]);
        atomicMax(amax, a);
    }
}

/* TENSOR's one amax, of all n elements of x, into the backend's slot; NULL (and the error set) if
   the slot cannot be had */
static unsigned *us__fp8_gamax(us_ops *o, const void *x, us_dtype dt, int64_t n) {
    us__cuda *c = us__cu(o);
    unsigned es = (unsigned)us_dtype_size(dt);
    if (!c->fp8_amax && !(c->fp8_amax = (unsigned *)us__cuda_alloc(o, 64))) {
        us__cuda_fail(o, "fp8 amax slot", "out of device memory", __FILE__, __LINE__);
        return NULL;
    }
    US__CU(o, cudaMemsetAsync(c->fp8_amax, 0, 4, c->stream));
    US__DISPATCH(o, dt,
                 (us__k_fp8_amax<T_>
                  <<<us__blocks(n / 4 + 1, 256) < 2048 ? us__blocks(n / 4 + 1, 256) : 2048, 256, 0,
                     c->stream>>>(c->fp8_amax, (const T_ *)x, n, n % 4 == 0 && us__al(x, 4 * es))));
    return c->fp8_amax;
}

/* One quantisation launch. q2, s2 (fp8_quantize_both; 4-byte aligned, the caller checks) are the
   other orientation from the same read: for BLOCK128 with trans 0, Wᵀ's operand (the block kernel
   writes both); for ROW128 and TENSOR with trans 1, x's own ROW128 operand (the transposed
   kernel's patch rows). NULL: the one operand. */
static void us__cuda_fp8_launch(us_ops *o, uint8_t *q, float *s, const void *x, us_dtype dt,
                                int64_t M, int64_t K, int t, int trans, int pow2, uint8_t *q2,
                                float *s2) {
    us__cuda *c = us__cu(o);
    int64_t R = trans ? K : M, L = trans ? M : K, Lp = (L + 127) / 128 * 128;
    unsigned es = (unsigned)us_dtype_size(dt), *gamax = NULL;
    int qv = us__al(q, 16) ? 2 : 0;
    if (R <= 0 || L <= 0) return;
    if (t == US_FP8_TENSOR && !(gamax = us__fp8_gamax(o, x, dt, M * K))) return;
    if (t == US_FP8_BLOCK128) {
        dim3 grid((unsigned)(Lp / 128), (unsigned)((R + 127) / 128));
        int vec = qv | (K % 8 == 0 && us__al(x, 16)) /* x [M][K] is read along K either way */
                  | (us__al(q2, 8) ? 4 : 0);
        US__DISPATCH(o, dt,
                     (us__k_fp8_block<T_><<<grid, 256, 0, c->stream>>>(
                         q, s, (const T_ *)x, R, L, Lp, trans, pow2, vec, q2, s2)));
    } else if (trans) {
        dim3 grid((unsigned)((R + 127) / 128), (unsigned)(Lp / 128));
        int vec = qv | (R % 4 == 0 && us__al(x, 4 * es));
        US__DISPATCH(o, dt,
                     (us__fp8_row_t_launch<T_>(grid, c->stream, q, s, (const T_ *)x, R, L, Lp, pow2,
                                               vec, gamax, q2, s2)));
    } else {
        int64_t tiles = R * (Lp / 128),
                per = 8 * 4 * US__ROW_ROUNDS; /* 8 warps of 4·rounds tiles */
        if (tiles >= ((int64_t)1 << 32)) {
            us__cuda_fail(o, "fp8_quantize",
                          "more than 2^32 tiles of 128 (the kernel counts them in 32 bits)",
                          __FILE__, __LINE__);
            return;
        }
        int vec = qv | (L % 16 == 0 && us__al(x, 16 * es));
        US__DISPATCH(o, dt,
                     (us__k_fp8_row<T_><<<(unsigned)((tiles + per - 1) / per), 256, 0, c->stream>>>(
                         q, s, (const T_ *)x, R, L, Lp, pow2, vec, gamax)));
    }
}

static void us__cuda_fp8_quantize(us_ops *o, uint8_t *q, float *s, const void *x, us_dtype dt,
                                  int64_t M, int64_t K, int t, int trans, int pow2) {
    us__cuda_fp8_launch(o, q, s, x, dt, M, K, t, trans, pow2, NULL, NULL);
}

/* Both operands of x [M][K] from one read (us_ops.fp8_quantize_both); a q or qt not 4-byte
   aligned takes the two quantisations one after the other. */
static void us__cuda_fp8_quantize_both(us_ops *o, uint8_t *q, float *s, uint8_t *qt, float *st,
                                       const void *x, us_dtype dt, int64_t M, int64_t K, int t,
                                       int pow2) {
    if (t == US_FP8_BLOCK128 && us__al(qt, 4))
        us__cuda_fp8_launch(o, q, s, x, dt, M, K, t, 0, pow2, qt,
                            st); /* the weight cache's W and Wᵀ */
    else if (t != US_FP8_BLOCK128 && us__al(q, 4))
        us__cuda_fp8_launch(o, qt, st, x, dt, M, K, t, 1, pow2, q, s); /* dy's two tilings */
    else {
        us__cuda_fp8_launch(o, q, s, x, dt, M, K, t, 0, pow2, NULL, NULL);
        us__cuda_fp8_launch(o, qt, st, x, dt, M, K, t, 1, pow2, NULL, NULL);
    }
}

/* ---- the activation quantisation fused into the kernel that writes the activation
   (us_ops.rmsnorm_fwd_fp8, swiglu_fwd_fp8): RMSNorm's and SwiGLU's vector kernels with, after each
   thread's W elements are rounded to T and stored, the 1×128 tiles of that very output: a tile is
   LT = 128 / W neighbouring threads' vectors (16 lanes for bf16), so its amax is a shuffle over
   them, and each lane writes its W bytes and the tile's first lane the scale. The elements, the
   amax, the scale and the bytes are those of the unfused kernels (the same expressions and
   helpers, the quantiser's us__k_fp8_row on the rounded output), so the bytes match bit for bit
   (tests/test_cuda.cu); the quantiser's read of the output (2 bytes an element) and its launch
   are what is saved. Needs C (F) a multiple of 128, so that no tile is partial; otherwise the ops
   run the two kernels. */

/* f rounded to T and back: the value the stored output holds */
template <typename T>
__device__ __forceinline__ float us__rt(float f) {
    T t;
    us__st(&t, 0, f);
    return us__ld(&t, 0);
}

/* the W values o (already rounded) of row n's elements c..c+W−1 (c = W·lane) into their 1×128
   tile of q [N][C] and s [C/128][N]; mask: the LT lanes of the tile */
template <int W>
__device__ __forceinline__ void us__fp8_tile_store(uint8_t *q, float *s, const float *o, int64_t n,
                                                   int64_t N, int64_t C, int64_t c, int pow2,
                                                   unsigned mask, int store) {
    enum { LT = 128 / W };

    unsigned a = 0;
    float sc, rc;
    int i;
#pragma unroll
    for (i = 0; i < W; i++) a = max(a, us__abits(o[i]));
#pragma unroll
    for (i = LT / 2; i >= 1; i >>= 1) a = max(a, __shfl_xor_sync(mask, a, i));
    sc = us__fp8_scale(__uint_as_float(a), pow2);
    rc = 1.0f / sc;
    if (!store) return;
    if (W == 8)
        *reinterpret_cast<uint2 *>(q + n * C + c) =
            make_uint2(us__e4m3x4(o, rc), us__e4m3x4(o + 4, rc));
    else
        *reinterpret_cast<uint32_t *>(q + n * C + c) = us__e4m3x4(o, rc);
    if (c % 128 == 0) s[c / 128 * N + n] = sc;
}

/* The vector kernels' epilogue (us__no_epi's place) that writes the 1×128 tiles of the W outputs
   a lane has just computed, rounded to T as stored: q [N][C], s [C/128][N] (C: RMSNorm's width,
   SwiGLU's F). A tile is the LT lanes of one group of the warp; RMSNorm runs every lane through it
   and SwiGLU has C a multiple of 128, so each group's lanes all call it. */
template <typename T>
struct us__fp8_epi {
    uint8_t *q;
    float *s;
    int64_t N, C;
    int pow2;

    __device__ __forceinline__ void operator()(const float *o, int64_t n, int64_t c,
                                               bool active) const {
        enum { W = us__vec<T>::W, LT = 128 / W };

        int i, lane = threadIdx.x & 31;
        unsigned mask = LT == 32 ? 0xffffffffu : ((1u << (LT & 31)) - 1) << (lane & (32 - LT));
        float r[W];
#pragma unroll
        for (i = 0; i < W; i++) r[i] = us__rt<T>(o[i]);
        us__fp8_tile_store<W>(q, s, r, n, N, C, c, pow2, mask, active);
    }
};

static void us__cuda_rmsnorm_fwd_fp8(us_ops *o, void *out, float *rstd, uint8_t *q, float *s,
                                     const void *x, const void *w, int64_t N, int64_t C, float eps,
                                     us_dtype dt, int pow2) {
    int W = 16 / (int)us_dtype_size(dt), th = us__row_threads(C, W);
    if (N <= 0 || C <= 0) return;
    if (th && C % 128 == 0 && us__al16(out) && us__al16(x) && us__al16(w) && us__al(q, W)) {
        US__DISPATCH(
            o, dt,
            (us__k_rmsnorm_fwd_vec<T_, us__fp8_epi<T_>><<<(unsigned)N, th, 0, us__cu(o)->stream>>>(
                (T_ *)out, rstd, (const T_ *)x, (const T_ *)w, C, eps,
                us__fp8_epi<T_>{q, s, N, C, pow2})));
        return;
    }
    us__cuda_rmsnorm_fwd(o, out, rstd, x, w, N, C, eps, dt);
    us__cuda_fp8_quantize(o, q, s, out, dt, N, C, US_FP8_ROW128, 0, pow2);
}

/* ---- SwiGLU with both operands of h (us_ops.swiglu_fwd_fp8 with qt): the down linear's Fprop
   reads h [N][F] in 1×128 tiles and its Wgrad, in the backward, hᵀ in 128×1 tiles. Formed here,
   from the values that form h, the second can be kept instead of h (the layer keeps it in h's own
   bytes, us__swiglu_fwd): h's store and, in the backward, the quantiser's read of h are saved.
   The amax of a 128×1 tile runs over 128 tokens, so the kernel is tiled in two dimensions, as
   us__k_fp8_row_t is: a block takes tokens l0..l0+127, columns f0..f0+127, warp w the 16 tokens
   l0 + 16w .., lane j 4 columns. The gate and up patches are copied into shared memory
   (cp.async: every copy in flight without holding registers, four commit groups, each thread
   copying only what it reads), h is formed as each group lands (swiglu_fwd's expression, rounded
   to T as it stores h) into the registers us__k_fp8_row_t's tile code takes: the bytes and the
   scales are those of swiglu_fwd then fp8_quantize_both, bit for bit (tests/test_cuda.cu). h
   non-NULL is stored too. Needs F a multiple of 128 and 16-byte aligned tensors; otherwise the
   op runs the two kernels (h in the backend's scratch when h is NULL). */
template <typename T>
__global__ void __launch_bounds__(256, sizeof(T) == 2 ? 3 : 1)
    us__k_swiglu_fwd_fp8t(T *h, uint8_t *q, float *s, uint8_t *q2, float *s2, const T *gu,
                          int64_t N, int64_t F, int64_t Lp, int pow2, int vec) {
    typedef typename us__raw4<T>::t V;
    extern __shared__ __align__(16) unsigned char us__rowt_smem[];
    T(*pg)[132] = us__rowt_sm<T>(us__rowt_smem); /* [128][132] gate */
    T(*pu)[132] = pg + 128;                      /* [128][132] up */
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, i, k;
    int64_t f0 = (int64_t)blockIdx.x * 128, l0 = (int64_t)blockIdx.y * 128, f = f0 + 4 * lane,
            l1 = l0 + 16 * w;
    bool full = us__fp8_row_t_full(F, N, f0, l0, vec); /* every token l0..l0+127 exists */
    const T *g0 = gu + l1 * 2 * F + f;                 /* token l1 */
    V v[1][16];                                        /* h at tokens l1 + i */
    /* the warp's 16 tokens, 4 columns a lane, in four commit groups of 4; past N: zeros */
#pragma unroll
    for (i = 0; i < 16; i++) {
        int b = full || l1 + i < N ? (int)sizeof(V) : 0;
        us__cp_async_v<V>(&pg[16 * w + i][4 * lane], b ? g0 + i * 2 * F : gu, b);
        us__cp_async_v<V>(&pu[16 * w + i][4 * lane], b ? g0 + i * 2 * F + F : gu, b);
        if (i % 4 == 3) us__cp_async_commit();
    }
#pragma unroll
    for (i = 0; i < 16; i++) {
        float gf[4], uf[4], o[4];
        if (i % 4 == 0) us__cp_async_wait_n(3 - i / 4);
        us__ld4(&pg[16 * w + i][4 * lane], gf);
        us__ld4(&pu[16 * w + i][4 * lane], uf);
#pragma unroll
        for (k = 0; k < 4; k++) o[k] = us__swiglu_h(gf[k], uf[k]);
        us__st4(reinterpret_cast<T *>(&v[0][i]), o); /* zeros where the token is past N */
        if (h && (full || l1 + i < N)) *reinterpret_cast<V *>(h + (l1 + i) * F + f) = v[0][i];
    }
    us__fp8_row_t_patch<T, 16, 1>(full, v, us__rowt_smem + 2 * sizeof(T) * 128 * 132,
                                  reinterpret_cast<uint32_t *>(us__rowt_smem), q, s, F, N, Lp, f0,
                                  0, l0, pow2, vec, NULL, q2, s2);
}

/* its shared memory: the gate and up patches (P's rows, qs, in the gate's once it is read),
   then the tile code's */
template <typename T>
static size_t us__swiglu_fwd_fp8_smem(void) {
    return 2 * sizeof(T) * 128 * 132 + US__ROWT_SCRATCH(T, 1, 8);
}

template <typename T>
static void us__swiglu_fwd_fp8_launch(dim3 grid, cudaStream_t st, T *h, uint8_t *q, float *s,
                                      uint8_t *q2, float *s2, const T *gu, int64_t N, int64_t F,
                                      int64_t Lp, int pow2, int vec) {
    static unsigned long long asked; /* per element type */
    size_t sm = us__swiglu_fwd_fp8_smem<T>();
    us__smem_raise((const void *)us__k_swiglu_fwd_fp8t<T>, sm, &asked);
    us__k_swiglu_fwd_fp8t<T><<<grid, 256, sm, st>>>(h, q, s, q2, s2, gu, N, F, Lp, pow2, vec);
}

/* (q, s): h's 1×128 operand (q [N][F], s [F/128][N]); (qt, st), where asked for: hᵀ's 128×1 one
   (qt [F][Lp], st [Lp/128][F]): the two-dimensional kernel's q2 and q, as in fp8_quantize_both */
static void us__cuda_swiglu_fwd_fp8(us_ops *o, void *h, uint8_t *q, float *s, uint8_t *qt,
                                    float *st, const void *gu, int64_t N, int64_t F, us_dtype dt,
                                    int pow2) {
    int64_t W = 16 / (int64_t)us_dtype_size(dt), Lp = (N + 127) / 128 * 128;
    if (N <= 0 || F <= 0) return;
    if (qt && F % 128 == 0 && Lp / 128 < 65536 && us__al16(gu) && (!h || us__al16(h)) &&
        us__al(q, 4)) {
        dim3 grid((unsigned)(F / 128), (unsigned)(Lp / 128));
        int vec = 1 | (us__al(qt, 16) ? 2 : 0);
        US__DISPATCH(o, dt,
                     (us__swiglu_fwd_fp8_launch<T_>(grid, us__cu(o)->stream, (T_ *)h, qt, st, q, s,
                                                    (const T_ *)gu, N, F, Lp, pow2, vec)));
        return;
    }
    if (qt) { /* the two kernels, h (where not kept) in the scratch */
        void *hw = h ? h : us__cuda_scratch(o, (size_t)(N * F) * us_dtype_size(dt));
        if (!hw) return; /* the failure is recorded */
        us__cuda_swiglu_fwd(o, hw, gu, N, F, dt);
        us__cuda_fp8_quantize_both(o, q, s, qt, st, hw, dt, N, F, US_FP8_ROW128, pow2);
        return;
    }
    if (F % 128 == 0 && us__al16(h) && us__al16(gu) && us__al(q, (unsigned)W)) {
        US__DISPATCH(o, dt,
                     (us__k_swiglu_fwd_vec<T_, us__fp8_epi<T_>>
                      <<<us__rows_grid(N, F / W, 256), 256, 0, us__cu(o)->stream>>>(
                          (T_ *)h, (const T_ *)gu, N, F, us__fp8_epi<T_>{q, s, N, F, pow2})));
        return;
    }
    us__cuda_swiglu_fwd(o, h, gu, N, F, dt);
    us__cuda_fp8_quantize(o, q, s, h, dt, N, F, US_FP8_ROW128, 0, pow2);
}

/* ---- SwiGLU's backward with dgu's two operands (us_ops.swiglu_bwd_fp8): the gate|up linear's
   Dgrad reads dgu [N][2F] in 1×128 tiles and its Wgrad in 128×1 tiles, so the amax of a tile runs
   over 128 tokens and the kernel is tiled in two dimensions, as fp8_quantize_both's transposed
   kernel (us__k_fp8_row_t) is. A block forms, from one read of gu and dh, dgu's gate columns
   f0..f0+127 and its up columns F+f0.. over tokens l0..l0+127 (us__swiglu_grad, rounded to T as
   swiglu_bwd stores them) and runs that kernel's tile code on the two patches side by side (NP
   2, one set of barriers): the bytes and the scales are those of swiglu_bwd then fp8_quantize_both, bit for bit
   (tests/test_cuda.cu). dgu non-NULL is stored too (the layer passes NULL: nothing else reads it,
   which saves its 4 bytes an element of store and load). A thread holds both patches' values at
   its positions, so the block has 16 warps of 8 tokens (the tile code's RW = 8): warp w tokens
   l0 + 8w .., lane j 4 columns. Its gate, up and dh elements are copied into shared memory with
   every copy in flight at once (cp.async, 24 a thread: the kernel is bound by memory latency as
   much as by bandwidth) and the grads formed as each quarter lands, each thread reading only
   what it copied. Needs F a multiple of 128 (a patch is all gate or all up, every 1×128 tile
   whole) and 16-byte aligned tensors; otherwise the op runs the two kernels. */
template <typename T>
__global__ void __launch_bounds__(512, sizeof(T) == 2 ? 2 : 1)
    us__k_swiglu_bwd_fp8(T *dgu, uint8_t *q, float *s, uint8_t *q2, float *s2, const T *dh,
                         const T *gu, int64_t N, int64_t F, int64_t Lp, int pow2, int vec) {
    typedef typename us__raw4<T>::t V;
    extern __shared__ __align__(16) unsigned char us__rowt_smem[];
    T(*pg)[132] = us__rowt_sm<T>(us__rowt_smem); /* [128][132] gate */
    T(*pu)[132] = pg + 128;                      /* [128][132] up */
    T(*pd)[132] = pg + 256;                      /* [128][132] dh */
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, i, k;
    int64_t f0 = (int64_t)blockIdx.x * 128, l0 = (int64_t)blockIdx.y * 128, f = f0 + 4 * lane,
            l1 = l0 + 8 * w;
    bool full = us__fp8_row_t_full(2 * F, N, f0, l0, vec);    /* every token l0..l0+127 exists */
    const T *g0 = gu + l1 * 2 * F + f, *d0 = dh + l1 * F + f; /* token l1 */
    V v[2][8]; /* the gate's and the up's grads at tokens l1 + i */
    /* the warp's 8 tokens, 4 columns a lane, in four commit groups of 2; past N: zeros */
#pragma unroll
    for (i = 0; i < 8; i++) {
        int b = full || l1 + i < N ? (int)sizeof(V) : 0;
        us__cp_async_v<V>(&pg[8 * w + i][4 * lane], b ? g0 + i * 2 * F : gu, b);
        us__cp_async_v<V>(&pu[8 * w + i][4 * lane], b ? g0 + i * 2 * F + F : gu, b);
        us__cp_async_v<V>(&pd[8 * w + i][4 * lane], b ? d0 + i * F : dh, b);
        if (i % 2 == 1) us__cp_async_commit();
    }
#pragma unroll
    for (i = 0; i < 8; i++) {
        int r = 8 * w + i;
        float gf[4], uf[4], df[4], dg[4], du[4];
        if (i % 2 == 0) us__cp_async_wait_n(3 - i / 2);
        us__ld4(&pg[r][4 * lane], gf);
        us__ld4(&pu[r][4 * lane], uf);
        us__ld4(&pd[r][4 * lane], df);
#pragma unroll
        for (k = 0; k < 4; k++) us__swiglu_grad(gf[k], uf[k], df[k], dg[k], du[k]);
        us__st4(reinterpret_cast<T *>(&v[0][i]), dg); /* zeros where the token is past N */
        us__st4(reinterpret_cast<T *>(&v[1][i]), du);
        if (dgu && (full || l1 + i < N)) { /* after this token's loads: aliasing gu is safe */
            T *o = dgu + (l1 + i) * 2 * F + f;
            *reinterpret_cast<V *>(o) = v[0][i];
            *reinterpret_cast<V *>(o + F) = v[1][i];
        }
    }
    /* both patches at once (columns f0.. and F + f0..); P's rows in the gate's bytes once they
       are read */
    us__fp8_row_t_patch<T, 8, 2>(full, v, us__rowt_smem + 3 * sizeof(T) * 128 * 132,
                                 reinterpret_cast<uint32_t *>(us__rowt_smem), q, s, 2 * F, N, Lp,
                                 f0, F, l0, pow2, vec, NULL, q2, s2);
}

/* its shared memory: the three patches, then the tile code's (two patches of 16 warps) */
template <typename T>
static size_t us__swiglu_bwd_fp8_smem(void) {
    return 3 * sizeof(T) * 128 * 132 + US__ROWT_SCRATCH(T, 2, 16);
}

template <typename T>
static void us__swiglu_bwd_fp8_launch(dim3 grid, cudaStream_t st, T *dgu, uint8_t *q, float *s,
                                      uint8_t *q2, float *s2, const T *dh, const T *gu, int64_t N,
                                      int64_t F, int64_t Lp, int pow2, int vec) {
    static unsigned long long asked; /* per element type */
    size_t sm = us__swiglu_bwd_fp8_smem<T>();
    us__smem_raise((const void *)us__k_swiglu_bwd_fp8<T>, sm, &asked);
    us__k_swiglu_bwd_fp8<T><<<grid, 512, sm, st>>>(dgu, q, s, q2, s2, dh, gu, N, F, Lp, pow2, vec);
}

/* (q, s): dgu's 1×128 operand (q [N][2F], s [2F/128][N]); (qt, st): its 128×1 one, of dguᵀ
   (qt [2F][Lp], st [Lp/128][2F]): the kernel's q2 and q, as in fp8_quantize_both */
static void us__cuda_swiglu_bwd_fp8(us_ops *o, void *dgu, uint8_t *q, float *s, uint8_t *qt,
                                    float *st, const void *dh, const void *gu, int64_t N, int64_t F,
                                    us_dtype dt, int pow2) {
    int64_t Lp = (N + 127) / 128 * 128;
    void *d = dgu ? dgu : (void *)gu;
    if (N <= 0 || F <= 0) return;
    if (F % 128 == 0 && Lp / 128 < 65536 && us__al16(gu) && us__al16(dh) &&
        (!dgu || us__al16(dgu)) && us__al(q, 4)) {
        dim3 grid((unsigned)(F / 128), (unsigned)(Lp / 128));
        int vec = 1 | (us__al(qt, 16) ? 2 : 0);
        US__DISPATCH(
            o, dt,
            (us__swiglu_bwd_fp8_launch<T_>(grid, us__cu(o)->stream, (T_ *)dgu, qt, st, q, s,
                                           (const T_ *)dh, (const T_ *)gu, N, F, Lp, pow2, vec)));
        return;
    }
    us__cuda_swiglu_bwd(o, d, dh, gu, N, F, dt);
    us__cuda_fp8_quantize_both(o, q, s, qt, st, d, dt, N, 2 * F, US_FP8_ROW128, pow2);
}

/* The FP8 GEMM on cuBLASLt, TN: row-major C[M,N] = a·bᵀ is column-major Cᵀ[N,M] = b·aᵀ, so b (the
   weight side) is cuBLASLt's A, transposed, and a (the activation side) its B. Scale modes:
   BLOCK128 → BLK128x128_32F, ROW128 → VEC128_32F, TENSOR → SCALAR_32F (per-tensor FP8). */
static cublasLtMatmulMatrixScale_t us__fp8_mode(int t) {
    return t == US_FP8_BLOCK128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
           : t == US_FP8_TENSOR ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
                                : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
}

static void us__cuda_fp8_gemm(us_ops *o, int64_t M, int64_t N, int64_t K, float alpha,
                              const uint8_t *a, const float *sa, int ta, const uint8_t *b,
                              const float *sb, int tb, float beta, void *C, us_dtype cdt,
                              int64_t ldc) {
    us__cuda *c = us__cu(o);
    us__gemm_plan *p = NULL;
    int64_t Kp = (K + 127) / 128 * 128;
    int i, beta0 = beta == 0;
    if (M <= 0 || N <= 0 || K <= 0) return;
    for (i = 0; i < c->nfp8; i++) {
        us__gemm_plan *x = &c->fp8_plans[i];
        if (x->M == M && x->N == N && x->K == Kp && x->adt == ta && x->bdt == tb &&
            x->cdt == (int)cdt && x->ldc == ldc && x->beta0 == beta0) {
            p = x;
            break;
        }
    }
    if (!p) {
        cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        cublasLtMatmulMatrixScale_t ma = us__fp8_mode(tb), mb = us__fp8_mode(ta);
        cublasLtMatmulHeuristicResult_t heur;
        if (c->nfp8 == US__FP8_PLANS) { /* full: recycle the oldest */
            us__lt_plan_free(&c->fp8_plans[0]);
            memmove(c->fp8_plans, c->fp8_plans + 1, sizeof(us__gemm_plan) * (US__FP8_PLANS - 1));
            c->nfp8--;
        }
        p = &c->fp8_plans[c->nfp8];
        memset(p, 0, sizeof *p);
        p->M = M;
        p->N = N;
        p->K = Kp;
        p->adt = ta;
        p->bdt = tb;
        p->cdt = (int)cdt;
        p->ldc = ldc;
        p->beta0 = beta0;
        US__LT(o, cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT,
                                                 sizeof opT));
        US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN,
                                                 sizeof opN));
        US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma,
                                                 sizeof ma));
        US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb,
                                                 sizeof mb));
        US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb,
                                                 sizeof sb));
        US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa,
                                                 sizeof sa));
        US__LT(o, cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, Kp, N,
                                             Kp)); /* b [N][Kp] row-major = Kp×N column-major */
        US__LT(o, cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, Kp, M, Kp)); /* a [M][Kp] */
        US__LT(o, cublasLtMatrixLayoutCreate(&p->lc, us__cuda_type(cdt), N, M, ldc));
        if (us__lt_heuristic(o, p, &heur, 1))
            p->algo = heur.algo;
        else
            us__cuda_fail(o, "cublasLtMatmulAlgoGetHeuristic",
                          "no FP8 algorithm for this GEMM shape, scaling and output type", __FILE__,
                          __LINE__);
        us__lt_tune_take(o, p, 1);
        c->nfp8++;
    }
    if (c->failed) return;
    /* this call's scale tensors */
    US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb,
                                             sizeof sb));
    US__LT(o, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa,
                                             sizeof sa));
    us__lt_matmul(o, p, alpha, b, a, beta, C, C);
}

/* ------------------------------------------------------------------------------------ */
// >>cuda-ops  the ops table: us_cuda_ops fills it with the kernels above
/* ------------------------------------------------------------------------------------ */
US_API int us_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

US_API us_result us_cuda_ops(us_ops *o, int device, char *err, size_t errlen) {
    us__cuda *c;
    int n = us_cuda_device_count();
    cudaError_t e;
    memset(o, 0, sizeof *o);
    if (n == 0) {
        us__errf(err, errlen, "no CUDA device is available");
        return US_ERR_BACKEND;
    }
    if (device < 0 || device >= n) {
        us__errf(err, errlen, "CUDA device %d does not exist (%d present)", device, n);
        return US_ERR_INVALID;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        us__errf(err, errlen, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
        return US_ERR_BACKEND;
    }
    c = (us__cuda *)calloc(1, sizeof *c);
    if (!c) {
        us__errf(err, errlen, "out of host memory");
        return US_ERR_OOM;
    }
    c->device = device;
    {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
            c->cc_major = prop.major;
            c->n_sm = prop.multiProcessorCount;
            c->mem_total = prop.totalGlobalMem;
        }
    }
    o->name = "cuda";
    o->backend = c;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMallocHost((void **)&c->host_red, sizeof(double))) != cudaSuccess) {
        us__errf(err, errlen, "CUDA set-up failed: %s", cudaGetErrorString(e));
        free(c);
        o->backend = NULL;
        return US_ERR_BACKEND;
    }
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        us__errf(err, errlen, "cublasLtCreate failed");
        us_cuda_ops_free(o);
        return US_ERR_BACKEND;
    }
    c->ws_bytes = (size_t)32 << 20; /* 32 MiB: enough for Hopper's split-K and stream-K kernels */
    c->ws = us__cuda_alloc(o, c->ws_bytes);
    if (!c->ws) {
        us__errf(err, errlen, "cannot allocate the %zu-byte cuBLASLt workspace", c->ws_bytes);
        us_cuda_ops_free(o);
        return US_ERR_OOM;
    }
    o->alloc = us__cuda_alloc;
    o->free = us__cuda_free;
    o->zero = us__cuda_zero;
    o->copy = us__cuda_copy;
    o->sync = us__cuda_sync;
    o->cast = us__cuda_cast;
    o->gemm = us__cuda_gemm;
    o->gemm_grouped = us__cuda_gemm_grouped;
    o->embedding_fwd = us__cuda_embedding_fwd;
    o->embedding_bwd = us__cuda_embedding_bwd;
    o->rmsnorm_fwd = us__cuda_rmsnorm_fwd;
    o->rmsnorm_bwd = us__cuda_rmsnorm_bwd;
    o->gemm_res = us__cuda_gemm_res;
    o->rope_fwd = us__cuda_rope_fwd;
    o->rope_bwd = us__cuda_rope_bwd;
    o->attention_fwd = us__cuda_attention_fwd;
    o->attention_bwd = us__cuda_attention_bwd;
    o->swiglu_fwd = us__cuda_swiglu_fwd;
    o->swiglu_bwd = us__cuda_swiglu_bwd;
    o->xent = us__cuda_xent;
    o->adamw = us__cuda_adamw;
    o->sumsq = us__cuda_sumsq;
    o->axpy = us__cuda_axpy;
    o->error = us__cuda_error;
    o->mark = us__cuda_mark;
    o->mark_us = us__cuda_mark_us;
    o->mark_reset = us__cuda_mark_reset;
    o->xent_stats = us__cuda_xent_stats;
    o->xent_finish = us__cuda_xent_finish;
    o->copy2d = us__cuda_copy2d;
    o->rope_at = us__cuda_rope_at;
    o->attn_block_fwd = us__cuda_attn_block_fwd;
    o->attn_block_finish = us__cuda_attn_block_finish;
    o->attn_block_bwd = us__cuda_attn_block_bwd;
    o->moe_route = us__cuda_moe_route;
    o->moe_route_bwd = us__cuda_moe_route_bwd;
    o->moe_permute = us__cuda_moe_permute;
    o->moe_gather = us__cuda_moe_gather;
    o->moe_scatter = us__cuda_moe_scatter;
    o->moe_gate_grad = us__cuda_moe_gate_grad;
    o->fp8_quantize = us__cuda_fp8_quantize;
    o->fp8_gemm = us__cuda_fp8_gemm;
    o->rmsnorm_fwd_fp8 = us__cuda_rmsnorm_fwd_fp8;
    o->swiglu_fwd_fp8 = us__cuda_swiglu_fwd_fp8;
    o->swiglu_bwd_fp8 = us__cuda_swiglu_bwd_fp8;
    o->fp8_quantize_both = us__cuda_fp8_quantize_both;
    return US_OK;
}

US_API void us_cuda_ops_free(us_ops *o) {
    us__cuda *c = o->backend ? us__cu(o) : NULL;
    int i;
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    for (i = 0; i < c->nplans; i++) us__lt_plan_free(&c->plans[i]);
    for (i = 0; i < c->nfp8; i++) us__lt_plan_free(&c->fp8_plans[i]);
    free(c->tune_recs);
    if (c->fp8_amax) cudaFree(c->fp8_amax);
    if (c->ws) cudaFree(c->ws);
    if (c->scratch) cudaFree(c->scratch);
    if (c->rope_tab) cudaFree(c->rope_tab);
    free(c->rope_freq);
    free(c->ggh_tab);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->host_red) cudaFreeHost(c->host_red);
    for (i = 0; i < US__CUDA_MARKS && c->marks[i]; i++) cudaEventDestroy(c->marks[i]);
    if (c->mark_ref) cudaEventDestroy(c->mark_ref);
    cudaStreamDestroy(c->stream);
    free(c);
    o->backend = NULL;
}

US_API void *us_cuda_stream(const us_ops *o) {
    return o->backend ? (void *)((const us__cuda *)o->backend)->stream : NULL;
}

US_API const char *us_cuda_attention_path(us_ops *o, us_dtype dt, int HS, int by_blocks) {
    if (!o->backend) return "portable";
    if (by_blocks)
        return us__hop_ok(o, dt, HS, 0) && us__cu(o)->hop_off != 6 ? "hopper"
               : us__flash_block_path_ok(o, dt, HS)                ? "flash"
                                                                   : "portable";
    return us__hop_ok(o, dt, HS, 0) ? "hopper" : us__flash_ok(o, dt, HS) ? "flash" : "portable";
}

US_API size_t us_cuda_device_used(const us_ops *o) {
    size_t free_b = 0, total_b = 0;
    if (!o || !o->backend) return 0;
    /* cudaMemGetInfo reads the calling thread's current device: make it the ops' one */
    if (cudaSetDevice(((const us__cuda *)o->backend)->device) != cudaSuccess ||
        cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return total_b - free_b;
}

US_API void us_cuda_grouped_kernel(us_ops *o, int path) {
    if (o->backend) us__cu(o)->gg_kernel = path >= 0 && path <= 3 ? path : 0;
}

US_API void us_cuda_attention_no_hopper(us_ops *o, int which) {
    if (o->backend) us__cu(o)->hop_off = which >= 0 && which <= 7 ? which : 0;
}

US_API void us_cuda_attention_grid(us_ops *o, int ctas) {
    if (o->backend) us__cu(o)->hop_grid = ctas > 0 ? ctas : 0;
}

US_API void us_cuda_attention_band(us_ops *o, int pairs) {
    if (o->backend) us__cu(o)->hop_band = pairs < 0 ? -1 : pairs;
}

US_API void us_cuda_attention_ds_pairs(us_ops *o, int pairs) {
    if (o->backend) us__cu(o)->hop_ds_pairs = pairs > 0 ? pairs : 0;
}

US_API void us_cuda_describe(const us_ops *o, char *buf, size_t buflen) {
    struct cudaDeviceProp p;
    int dev = o->backend ? ((const us__cuda *)o->backend)->device : 0;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, buflen, "CUDA device %d", dev);
        return;
    }
    snprintf(buf, buflen, "%s (sm_%d%d, %d SMs, %.0f GiB)", p.name, p.major, p.minor,
             p.multiProcessorCount, (double)p.totalGlobalMem / 1073741824.0);
}

#endif /* US__CUDA_FLASH_ONLY */
#endif /* ULTRASCALE_CUDA_IMPLEMENTATION_DONE */
#endif /* ULTRASCALE_IMPLEMENTATION */
