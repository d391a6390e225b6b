/* bench_cuda.cu — GPU benchmarks of the library, printed in the same format as the PyTorch
   peers (bench/torch_llama.py, cuda_dev/sdpa_bench.py) so bench/run_gpu.sh can put them side by side.
     --preset 1b|8b8|200m|moe  training step of the Llama-3.2-1B shape / Llama-3-8B's width with 8
                        layers / a ~200M shape / a DeepSeek-MoE-style model (dim 2048, 4 MoE layers
                        of 64 experts, top-6, Fe 1536, a shared expert; B 4 × T 4096; forced balance:
                        1536 rows per expert) (bf16, fp32 master)
     --precision P      the training step's precision: bf16 (default), fp8, fp8-tensor
     --accum K          K micro-batches of the preset's batch per optimizer step (default 1)
     --fp8-no-weight-cache  (fp8) quantise the weights at every GEMM instead of once per step
     --fp8-experts      (fp8) the MoE experts' GEMMs in FP8 too, expert by expert (default bf16)
     --fp8-no-fuse      (fp8) RMSNorm and SwiGLU write their output alone and the Fprop quantises
                        it, SwiGLU's backward writes dgu alone and the gate|up Dgrad quantises it
                        (us_ops.rmsnorm_fwd_fp8, swiglu_fwd_fp8 and swiglu_bwd_fp8 taken away): the
                        unfused path
     --att-mode M       (--preset) attention's paths as us_cuda_attention_no_hopper(M) sets them,
                        e.g. 7: the backward with dS through memory at every HS up to 128
                        (default 0: the library's choice)
     --fp8-free-quant   (fp8 only) skip every FP8 quantisation in the timed steps: the GEMMs read
                        the operands the warm-up steps left behind. Wrong numbers, fast: it measures
                        the step FP8 would give if quantising cost nothing (the recipe's ceiling).
                        SwiGLU's forward still runs fused where the layer keeps hᵀ's operand
                        instead of h (there is no h to write without it)
     --fp8-stale-quant  (fp8 only) as --fp8-free-quant, but every quantiser still runs, writing into
                        a buffer that no GEMM reads: the GEMMs read what --fp8-free-quant's read,
                        the quantisers cost what they cost. Against both, it splits the free mode's
                        gain into the quantisers' own time and the stale operands' effect on the
                        GEMMs (at the power cap their data changes their power, and so their clock)
     --fp8-gemm         FP8 GEMMs (block-scaled, per-tensor) vs bf16 at LLM shapes, and the quantiser
                        (ends with --swiglu-bwd-fp8's lines)
     --swiglu-bwd-fp8   SwiGLU's backward with dgu's two FP8 operands (us_ops.swiglu_bwd_fp8, dgu
                        NULL as the FP8 step calls it), GB/s at N 16384 F 8192 and N 8192 F 14336
     --grouped          the experts' grouped GEMM (ops->gemm_grouped, // >>cuda-grouped: the wgmma
                        and the mma.sync kernels) against one dense cuBLASLt GEMM of the same total
                        size (M = Σ rows) and against a loop of per-expert cuBLASLt GEMMs, at three
                        MoE layer shapes, balanced and routed, and two with few rows per expert
     --grouped-kernel   (--preset) the experts on the one-launch mma.sync kernel instead of the
                        default path inside gemm_grouped (us_cuda_grouped_kernel)
     --grouped-wgmma    (--preset) on the one-launch Hopper kernel (wgmma, TMA)
     --grouped-loop     (--preset) on one cuBLASLt GEMM per expert
     --gemm-tune        (--preset) the warm-up steps time cuBLASLt's candidate algorithms in
                        place and each GEMM plan keeps its fastest (us_cuda_gemm_tune); needs
                        --warmup 2 or more
     --profile          also time each op class with CUDA events (where a step's time goes),
                        then each distinct GEMM call of that step alone on noise operands
     --gemm             in-library GEMM (ops->gemm, cached plan) vs a standalone cuBLASLt call
     --gemm-algos       cuBLASLt's first heuristic algorithm against the best of 16, timed, bf16 and
                        FP8, at the 1B step's linear GEMMs
     --gemm-sustained   the 1B step's linear GEMMs in the step's own layouts, dtypes and beta, every
                        heuristic candidate timed back to back at the power-capped clock
     --attention        attention forward / backward TFLOP/s, causal: HS 128 (NKV 16 and 4) and
                        the 1B shape (NH 32, NKV 8, HS 64) at T 2k, 4k, 8k, B·T = 16384 tokens
     --att-seq T,...    those T instead (B = 16384 / T, at least 1)
     --att-heads NH:NKV:HS,...  those head shapes instead
     --att-band N       one more row, us-hopN: the Hopper kernels' tiles in bands of N (batch, kv
                        head) pairs (us_cuda_attention_band), beside the default's and one band's
     --cp               one layer's ring attention at cp 2 and 4 (flash blocks, zig-zag and ring, and
                        the portable block kernels) against causal flash on the whole sequence;
                        bf16 and fp16, HS 64, 80, 96, 128, 192, 256
     --cp-flash-only    the same without the portable kernels (they take seconds); on Hopper the
                        block kernels run twice, wgmma ("hopper") and mma.sync ("flash")
     --cp-seq T,...     --cp-flash-only's table at these T only (B = 16384 / T, at least 1),
                        bf16, NH 16 NKV 8 HS 128 and NH 32 NKV 8 HS 64; given with --cp or
                        --cp-flash-only, it comes after their tables and does not replace them
     --cp-heads NH:NKV:HS,...  --cp-seq's head shapes instead (HS one the block kernels take)
   Build: make build/bench_cuda (nvcc, -lcublasLt). */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale_cuda.cuh"

#include <algorithm>
#include <functional>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

#define CK(x)                                                        \
    do {                                                             \
        cudaError_t e_ = (x);                                        \
        if (e_ != cudaSuccess) {                                     \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
            exit(1);                                                 \
        }                                                            \
    } while (0)

/* ---- a profiling wrapper around the ops table: CUDA events around every call, by op class */
enum {
    P_GEMM,
    P_GGEMM,
    P_FP8G,
    P_FP8Q_ROW,
    P_FP8Q_COL,
    P_FP8Q_BOTH,
    P_FP8Q_W,
    P_ATT_F,
    P_ATT_B,
    P_NORM,
    P_NORM_Q,
    P_ROPE,
    P_SWIGLU,
    P_SWIGLU_Q,
    P_SWIGLU_QB,
    P_XENT,
    P_EMB,
    P_ADAMW,
    P_COPY,
    P_OTHER,
    P_N
};

static const char *pname[P_N] = {"gemm (cuBLASLt)",
                                 "grouped gemm",
                                 "fp8 gemm",
                                 "fp8 quantise 1x128",
                                 "fp8 quantise 128x1",
                                 "fp8 quantise both",
                                 "fp8 quantise W",
                                 "attention fwd",
                                 "attention bwd",
                                 "rmsnorm",
                                 "rmsnorm + 1x128",
                                 "rope",
                                 "swiglu",
                                 "swiglu + 1x128 (+128x1)",
                                 "swiglu bwd+both",
                                 "cross-entropy",
                                 "embedding",
                                 "adamw + norm",
                                 "copies",
                                 "other"};
static us_ops inner;
static cudaEvent_t ev0[P_N], ev1[P_N];
static double pms[P_N];
static int prof_on;

enum { Q_FREE = 1, Q_STALE = 2 }; /* free_q: --fp8-free-quant, --fp8-stale-quant (0: neither) */

static int free_q, skip_q; /* skip_q: set in the timed steps */
/* --fp8-stale-quant: where the timed steps' quantisers write instead (no GEMM reads it): two
   operand halves and two scale halves */
#define STALE_Q ((size_t)1 << 29)
#define STALE_S ((size_t)1 << 23) /* floats */
static uint8_t *stale_q;
static float *stale_s;

/* under --fp8-stale-quant, the operand (q, sc; and qt, st where asked for) of an M × K quantisation
   moved to the stale buffers; one that does not fit them stops the bench (a measurement mode, not a
   fallback) */
static void stale(uint8_t **q, float **sc, uint8_t **qt, float **st, int64_t M, int64_t K) {
    int64_t Mp = (M + 127) / 128 * 128, Kp = (K + 127) / 128 * 128; /* padded to whole tiles */
    if ((size_t)(Mp * Kp) > STALE_Q || (size_t)(Mp * Kp / 128) > STALE_S) {
        fprintf(stderr,
                "bench_cuda: --fp8-stale-quant: a %lld x %lld operand is larger than its buffer\n",
                (long long)M, (long long)K);
        exit(2);
    }
    *q = stale_q;
    *sc = stale_s;
    if (qt && *qt) *qt = stale_q + STALE_Q; /* (an operand the caller did not ask for stays NULL) */
    if (st && *st) *st = stale_s + STALE_S;
}

static int no_fuse;   /* --fp8-no-fuse */
static int att_mode;  /* --att-mode: us_cuda_attention_no_hopper's for the training step */
static int gg_kernel; /* gemm_grouped's path (us_cuda_grouped_kernel): --grouped-kernel,
                         --grouped-wgmma, --grouped-loop; 0 the default */

static cudaStream_t st_of(void) { return ((us__cuda *)inner.backend)->stream; }

static void pbeg(int k) {
    if (prof_on) cudaEventRecord(ev0[k], st_of());
}

static float pend(int k) {
    float ms = 0;
    if (!prof_on) return 0;
    cudaEventRecord(ev1[k], st_of());
    cudaEventSynchronize(ev1[k]);
    cudaEventElapsedTime(&ms, ev0[k], ev1[k]);
    pms[k] += ms;
    return ms;
}

/* The profile's GEMMs by call shape: layouts, sizes, leading dimensions, dtypes, beta, and which
   op made the call (0 gemm, 1 gemm_res, 2 fp8_gemm; for fp8 ta/tb are the scale tilings). After
   the step each shape runs again alone on fresh operands (gshape_alone): a shape slower in the
   step than alone loses to its neighbours (clock, caches); one slow alone loses by its shape. */
struct gshape {
    int op, ta, tb, adt, bdt, cdt, beta, calls;
    int64_t M, N, K, lda, ldb, ldc;
    double ms;
};

static std::vector<gshape> gshapes;

static void gshape_add(gshape g, float ms) {
    size_t i;
    if (!prof_on) return;
    for (i = 0; i < gshapes.size(); i++) {
        gshape &h = gshapes[i];
        if (h.op == g.op && h.ta == g.ta && h.tb == g.tb && h.M == g.M && h.N == g.N &&
            h.K == g.K && h.lda == g.lda && h.ldb == g.ldb && h.ldc == g.ldc && h.adt == g.adt &&
            h.bdt == g.bdt && h.cdt == g.cdt && h.beta == g.beta) {
            h.calls++;
            h.ms += ms;
            return;
        }
    }
    g.calls = 1;
    g.ms = ms;
    gshapes.push_back(g);
}

#define WRAP(k, call) \
    do {              \
        pbeg(k);      \
        call;         \
        pend(k);      \
    } while (0)

static void w_gemm(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K, float al,
                   const void *A, us_dtype ad, int64_t lda, const void *B, us_dtype bd, int64_t ldb,
                   float be, void *C, us_dtype cd, int64_t ldc) {
    gshape g = {0, ta, tb, (int)ad, (int)bd, (int)cd, be != 0, 0, M, N, K, lda, ldb, ldc, 0};
    (void)o;
    pbeg(P_GEMM);
    inner.gemm(&inner, ta, tb, M, N, K, al, A, ad, lda, B, bd, ldb, be, C, cd, ldc);
    gshape_add(g, pend(P_GEMM));
}

static void w_gg(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n, int64_t N,
                 int64_t K, const void *X, int64_t ldx, void *const *W, void *Y, int64_t ldy,
                 us_dtype dt) {
    (void)o;
    WRAP(P_GGEMM, inner.gemm_grouped(&inner, mode, G, off, n, N, K, X, ldx, W, Y, ldy, dt));
}

static void w_fq(us_ops *o, uint8_t *q, float *sc, const void *x, us_dtype dt, int64_t M, int64_t K,
                 int t, int trans, int pow2) {
    (void)o;
    if (skip_q && free_q == Q_FREE) return;
    if (skip_q) stale(&q, &sc, NULL, NULL, M, K);
    WRAP(t == US_FP8_BLOCK128 ? P_FP8Q_W
         : trans              ? P_FP8Q_COL
                              : P_FP8Q_ROW,
         inner.fp8_quantize(&inner, q, sc, x, dt, M, K, t, trans, pow2));
}

static void w_fqb(us_ops *o, uint8_t *q, float *sc, uint8_t *qt, float *st, const void *x,
                  us_dtype dt, int64_t M, int64_t K, int t, int pow2) {
    (void)o;
    if (skip_q && free_q == Q_FREE) return;
    if (skip_q) stale(&q, &sc, &qt, &st, M, K);
    WRAP(P_FP8Q_BOTH, inner.fp8_quantize_both(&inner, q, sc, qt, st, x, dt, M, K, t, pow2));
}

static void w_fg(us_ops *o, int64_t M, int64_t N, int64_t K, float al, const uint8_t *a,
                 const float *sa, int ta, const uint8_t *b, const float *sb, int tb, float be,
                 void *C, us_dtype cd, int64_t ldc) {
    gshape g = {2, ta, tb, 0, 0, (int)cd, be != 0, 0, M, N, K, K, K, ldc, 0};
    (void)o;
    pbeg(P_FP8G);
    inner.fp8_gemm(&inner, M, N, K, al, a, sa, ta, b, sb, tb, be, C, cd, ldc);
    gshape_add(g, pend(P_FP8G));
}

static void w_attf(us_ops *o, void *out, float *lse, const void *qkv, int64_t B, int64_t T, int NH,
                   int NKV, int HS, us_dtype dt) {
    (void)o;
    WRAP(P_ATT_F, inner.attention_fwd(&inner, out, lse, qkv, B, T, NH, NKV, HS, dt));
}

static void w_attb(us_ops *o, void *dq, const void *dout, const void *qkv, const void *out,
                   const float *lse, int64_t B, int64_t T, int NH, int NKV, int HS, us_dtype dt) {
    (void)o;
    WRAP(P_ATT_B, inner.attention_bwd(&inner, dq, dout, qkv, out, lse, B, T, NH, NKV, HS, dt));
}

static void w_gres(us_ops *o, int64_t N, int64_t Out, int64_t In, const void *x, const void *W,
                   const void *res, void *y, us_dtype dt) {
    gshape g = {1, 0, 1, (int)dt, (int)dt, (int)dt, 1, 0, N, Out, In, In, In, Out, 0};
    (void)o;
    pbeg(P_GEMM);
    inner.gemm_res(&inner, N, Out, In, x, W, res, y, dt);
    gshape_add(g, pend(P_GEMM));
}

static void w_nf(us_ops *o, void *out, float *r, const void *x, const void *w, int64_t N, int64_t C,
                 float eps, us_dtype dt) {
    (void)o;
    WRAP(P_NORM, inner.rmsnorm_fwd(&inner, out, r, x, w, N, C, eps, dt));
}

static void w_nb(us_ops *o, void *dx, float *dw, const void *d, const void *x, const void *w,
                 const float *r, int64_t N, int64_t C, us_dtype dt) {
    (void)o;
    WRAP(P_NORM, inner.rmsnorm_bwd(&inner, dx, dw, d, x, w, r, N, C, dt));
}

/* the fused ops; under --fp8-free-quant the norm or SwiGLU alone, under --fp8-stale-quant the
   fused op with its operands moved to the stale buffers */
static void w_nfq(us_ops *o, void *out, float *r, uint8_t *q, float *sc, const void *x,
                  const void *w, int64_t N, int64_t C, float eps, us_dtype dt, int pow2) {
    (void)o;
    if (skip_q && free_q == Q_STALE) stale(&q, &sc, NULL, NULL, N, C);
    if (skip_q && free_q == Q_FREE)
        WRAP(P_NORM, inner.rmsnorm_fwd(&inner, out, r, x, w, N, C, eps, dt));
    else
        WRAP(P_NORM_Q, inner.rmsnorm_fwd_fp8(&inner, out, r, q, sc, x, w, N, C, eps, dt, pow2));
}

static void w_sfq(us_ops *o, void *h, uint8_t *q, float *sc, uint8_t *qt, float *st, const void *gu,
                  int64_t N, int64_t F, us_dtype dt, int pow2) {
    (void)o;
    /* h NULL (the layer keeps hᵀ's operand): nothing to skip to */
    if (skip_q && h && free_q == Q_STALE) stale(&q, &sc, &qt, &st, N, F);
    if (skip_q && h && free_q == Q_FREE)
        WRAP(P_SWIGLU, inner.swiglu_fwd(&inner, h, gu, N, F, dt));
    else
        WRAP(P_SWIGLU_Q, inner.swiglu_fwd_fp8(&inner, h, q, sc, qt, st, gu, N, F, dt, pow2));
}

static void w_sbq(us_ops *o, void *d, uint8_t *q, float *sc, uint8_t *qt, float *st, const void *dh,
                  const void *gu, int64_t N, int64_t F, us_dtype dt, int pow2) {
    (void)o;
    if (skip_q && free_q == Q_STALE) stale(&q, &sc, &qt, &st, N, 2 * F);
    if (skip_q && free_q == Q_FREE)
        WRAP(P_SWIGLU, inner.swiglu_bwd(&inner, d ? d : (void *)gu, dh, gu, N, F, dt));
    else
        WRAP(P_SWIGLU_QB, inner.swiglu_bwd_fp8(&inner, d, q, sc, qt, st, dh, gu, N, F, dt, pow2));
}

static void w_rf(us_ops *o, void *q, int64_t B, int64_t T, int NH, int NKV, int HS,
                 const double *freq, us_dtype dt) {
    (void)o;
    WRAP(P_ROPE, inner.rope_fwd(&inner, q, B, T, NH, NKV, HS, freq, dt));
}

static void w_rb(us_ops *o, void *q, int64_t B, int64_t T, int NH, int NKV, int HS,
                 const double *freq, us_dtype dt) {
    (void)o;
    WRAP(P_ROPE, inner.rope_bwd(&inner, q, B, T, NH, NKV, HS, freq, dt));
}

static void w_sf(us_ops *o, void *h, const void *gu, int64_t N, int64_t F, us_dtype dt) {
    (void)o;
    WRAP(P_SWIGLU, inner.swiglu_fwd(&inner, h, gu, N, F, dt));
}

static void w_sb(us_ops *o, void *d, const void *dh, const void *gu, int64_t N, int64_t F,
                 us_dtype dt) {
    (void)o;
    WRAP(P_SWIGLU, inner.swiglu_bwd(&inner, d, dh, gu, N, F, dt));
}

static void w_x(us_ops *o, float *l, int32_t *am, void *lg, const int32_t *t, int64_t N, int64_t V,
                float ds, us_dtype dt) {
    (void)o;
    WRAP(P_XENT, inner.xent(&inner, l, am, lg, t, N, V, ds, dt));
}

static void w_ef(us_ops *o, void *out, const int32_t *t, const void *w, int64_t N, int64_t C,
                 us_dtype dt) {
    (void)o;
    WRAP(P_EMB, inner.embedding_fwd(&inner, out, t, w, N, C, dt));
}

static void w_eb(us_ops *o, float *d, const void *dout, const int32_t *t, int64_t N, int64_t C,
                 us_dtype dt) {
    (void)o;
    WRAP(P_EMB, inner.embedding_bwd(&inner, d, dout, t, N, C, dt));
}

static void w_ad(us_ops *o, float *p, const float *g, float *m, float *v, void *lp, us_dtype ld,
                 int64_t n, float lr, float b1, float b2, float eps, float wd, float gs, int step) {
    (void)o;
    WRAP(P_ADAMW, inner.adamw(&inner, p, g, m, v, lp, ld, n, lr, b1, b2, eps, wd, gs, step));
}

static double w_ss(us_ops *o, const float *x, int64_t n) {
    double r;
    (void)o;
    pbeg(P_ADAMW);
    r = inner.sumsq(&inner, x, n);
    pend(P_ADAMW);
    return r;
}

static void w_cp(us_ops *o, void *d, const void *s, size_t b, us_copy_kind k) {
    (void)o;
    WRAP(P_COPY, inner.copy(&inner, d, s, b, k));
}

static void w_z(us_ops *o, void *p, size_t b) {
    (void)o;
    WRAP(P_OTHER, inner.zero(&inner, p, b));
}

static void *w_alloc(us_ops *o, size_t b) {
    void *p = inner.alloc(&inner, b);
    o->bytes_in_use = inner.bytes_in_use;
    o->bytes_peak = inner.bytes_peak;
    return p;
}

static void w_free(us_ops *o, void *p) {
    inner.free(&inner, p);
    o->bytes_in_use = inner.bytes_in_use;
}

static void w_cast(us_ops *o, void *d, us_dtype dd, const void *s, us_dtype sd, int64_t n) {
    (void)o;
    WRAP(P_OTHER, inner.cast(&inner, d, dd, s, sd, n));
}

static void w_sync(us_ops *o) {
    (void)o;
    inner.sync(&inner);
}

static const char *w_err(us_ops *o) {
    (void)o;
    return inner.error(&inner);
}

static us_ops profiled(void) {
    us_ops o = inner;
    int k;
    for (k = 0; k < P_N; k++) {
        cudaEventCreate(&ev0[k]);
        cudaEventCreate(&ev1[k]);
    }
    o.gemm = w_gemm;
    o.gemm_grouped = w_gg;
    o.gemm_res = inner.gemm_res ? w_gres : NULL;
    o.attention_fwd = w_attf;
    o.attention_bwd = w_attb;
    o.rmsnorm_fwd = w_nf;
    o.rmsnorm_bwd = w_nb;
    o.rope_fwd = w_rf;
    o.rope_bwd = w_rb;
    o.swiglu_fwd = w_sf;
    o.swiglu_bwd = w_sb;
    o.xent = w_x;
    o.embedding_fwd = w_ef;
    o.embedding_bwd = w_eb;
    o.adamw = w_ad;
    o.sumsq = w_ss;
    o.copy = w_cp;
    o.zero = w_z;
    o.alloc = w_alloc;
    o.free = w_free;
    o.cast = w_cast;
    o.sync = w_sync;
    o.error = w_err;
    o.fp8_quantize = w_fq;
    o.fp8_gemm = w_fg;
    o.fp8_quantize_both = inner.fp8_quantize_both ? w_fqb : NULL;
    o.rmsnorm_fwd_fp8 = inner.rmsnorm_fwd_fp8 && !no_fuse ? w_nfq : NULL;
    o.swiglu_fwd_fp8 = inner.swiglu_fwd_fp8 && !no_fuse ? w_sfq : NULL;
    o.swiglu_bwd_fp8 = inner.swiglu_bwd_fp8 && !no_fuse ? w_sbq : NULL;
    return o;
}

static us_precision bench_prec =
    US_PRECISION_BF16;                  /* --precision: bf16 (default), fp8, fp8-tensor */
static int bench_accum = 1, bench_nowc; /* --accum, --fp8-no-weight-cache */
static int bench_tune;                  /* --gemm-tune */
static int bench_fp8_experts;           /* --fp8-experts: the MoE experts in FP8 too */
static int bench_loss_chunk; /* --loss-chunk: us_train_config.loss_chunk (0 the default) */

/* fill n elements of dtype dt at p with uniform noise in [-0.5, 0.5), 2^22 values repeated (a
   GEMM's power, and so its clock, depends on the data: no zeros) */
static void fill_noise(void *p, us_dtype dt, int64_t n, uint64_t seed) {
    int64_t m = n < ((int64_t)1 << 22) ? n : (int64_t)1 << 22, at;
    std::vector<float> h((size_t)m);
    size_t es = us_dtype_size(dt);
    us_rng rg;
    float *tmp;
    us_rng_seed(&rg, seed);
    for (size_t i = 0; i < h.size(); i++) h[i] = us_rng_uniform(&rg) - 0.5f;
    CK(cudaMalloc(&tmp, h.size() * 4));
    CK(cudaMemcpy(tmp, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    inner.cast(&inner, p, dt, tmp, US_F32, m);
    for (at = m; at < n; at += m) /* the first 2^22 elements, repeated */
        CK(cudaMemcpyAsync((char *)p + at * es, p, (size_t)std::min(m, n - at) * es,
                           cudaMemcpyDeviceToDevice, st_of()));
    inner.sync(&inner);
    cudaFree(tmp);
}

/* x [rows][K] bf16 as an FP8 operand in tiling t: q (rows × K rounded up to 128 bytes) and its
   scales (room for either tiling), on inner's allocator */
static void fp8_operand(uint8_t **q, float **s, const void *x, int64_t rows, int64_t K, int t) {
    int64_t Kp = (K + 127) / 128 * 128;
    *q = (uint8_t *)inner.alloc(&inner, (size_t)(rows * Kp));
    *s = (float *)inner.alloc(&inner, (size_t)(4 * (us_fp8_scales_size(US_FP8_BLOCK128, rows, K) +
                                                    us_fp8_scales_size(US_FP8_ROW128, rows, K))));
    inner.fp8_quantize(&inner, *q, *s, x, US_BF16, rows, K, t, 0, 0);
}

/* Each profiled GEMM shape alone: fresh operands of the call's layout and dtypes (noise; FP8
   operands quantised from noise in the call's tilings), 3 runs to warm up, the median of 10;
   printed beside its time in the step, slowest total first. */
static void gshape_alone(void) {
    size_t i;
    cudaEvent_t e0, e1;
    std::vector<size_t> ord(gshapes.size());
    if (gshapes.empty()) return;
    for (i = 0; i < ord.size(); i++) ord[i] = i;
    std::sort(ord.begin(), ord.end(),
              [](size_t a, size_t b) { return gshapes[a].ms > gshapes[b].ms; });
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("  GEMMs by call shape (op: gemm, res = gemm_res, fp8 = fp8_gemm with its two tilings; "
           "A·B → C dtypes; beta; in the step, then alone on noise, median of 10):\n");
    printf("    %-4s %-5s %-22s %-9s %4s %5s %9s %9s %9s\n", "op", "t", "M x N x K", "A,B->C",
           "beta", "calls", "step ms", "step TF/s", "alone TF/s");
    for (i = 0; i < ord.size(); i++) {
        gshape &g = gshapes[ord[i]];
        double fl = 2.0 * g.M * g.N * g.K, alone = 0;
        int64_t ar = g.ta && g.op == 0 ? g.K : g.M, br = g.tb || g.op ? g.N : g.K;
        std::vector<double> ts;
        void *A, *B, *C, *R = NULL;
        float *sa = NULL, *sb = NULL;
        uint8_t *qa = NULL, *qb = NULL;
        int r;
        if (g.op == 2) { /* FP8: quantise noise of [M][K] and [N][K] in the call's tilings */
            int64_t Kp = (g.K + 127) / 128 * 128;
            A = inner.alloc(&inner, (size_t)(g.M * Kp * 2));
            B = inner.alloc(&inner, (size_t)(g.N * Kp * 2));
            fill_noise(A, US_BF16, g.M * g.K, 11 + i);
            fill_noise(B, US_BF16, g.N * g.K, 12 + i);
            fp8_operand(&qa, &sa, A, g.M, g.K, g.ta);
            fp8_operand(&qb, &sb, B, g.N, g.K, g.tb);
        } else {
            A = inner.alloc(&inner, (size_t)(ar * g.lda) * us_dtype_size((us_dtype)g.adt));
            B = inner.alloc(&inner, (size_t)(br * g.ldb) * us_dtype_size((us_dtype)g.bdt));
            fill_noise(A, (us_dtype)g.adt, ar * g.lda, 11 + i);
            fill_noise(B, (us_dtype)g.bdt, br * g.ldb, 12 + i);
        }
        C = inner.alloc(&inner, (size_t)(g.M * g.ldc) * us_dtype_size((us_dtype)g.cdt));
        fill_noise(C, (us_dtype)g.cdt, g.M * g.ldc, 13 + i);
        if (g.op == 1) {
            R = inner.alloc(&inner, (size_t)(g.M * g.ldc) * us_dtype_size((us_dtype)g.cdt));
            fill_noise(R, (us_dtype)g.cdt, g.M * g.ldc, 14 + i);
        }
        for (r = 0; r < 13 && !inner.error(&inner); r++) {
            float ms = 0;
            cudaEventRecord(e0, st_of());
            if (g.op == 0)
                inner.gemm(&inner, g.ta, g.tb, g.M, g.N, g.K, 1.0f, A, (us_dtype)g.adt, g.lda, B,
                           (us_dtype)g.bdt, g.ldb, g.beta ? 1.0f : 0.0f, C, (us_dtype)g.cdt, g.ldc);
            else if (g.op == 1)
                inner.gemm_res(&inner, g.M, g.N, g.K, A, B, R, C, (us_dtype)g.cdt);
            else
                inner.fp8_gemm(&inner, g.M, g.N, g.K, 1.0f, qa, sa, g.ta, qb, sb, g.tb,
                               g.beta ? 1.0f : 0.0f, C, (us_dtype)g.cdt, g.ldc);
            cudaEventRecord(e1, st_of());
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
            if (r >= 3) ts.push_back(ms * 1e-3);
        }
        if (!ts.empty()) alone = fl / median(ts) * 1e-12;
        printf("    %-4s %d,%d   %6lld x %6lld x %6lld %-9s %4d %5d %9.3f %9.0f %9.0f\n",
               g.op == 0   ? "gemm"
               : g.op == 1 ? "res"
                           : "fp8",
               g.ta, g.tb, (long long)g.M, (long long)g.N, (long long)g.K,
               g.op == 2         ? (g.cdt == US_F32 ? "e4,e4->f" : "e4,e4->b")
               : g.cdt == US_F32 ? "b,b->f"
                                 : "b,b->b",
               g.beta, g.calls, g.ms, fl * g.calls / (g.ms * 1e-3) * 1e-12, alone);
        inner.free(&inner, A);
        inner.free(&inner, B);
        inner.free(&inner, C);
        inner.free(&inner, R); /* (NULL: nothing) */
        inner.free(&inner, qa);
        inner.free(&inner, qb);
        inner.free(&inner, sa);
        inner.free(&inner, sb);
    }
    if (inner.error(&inner)) printf("  (replay stopped: %s)\n", inner.error(&inner));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

/* ---- training throughput */
static int bench_train(const char *preset, int steps, int warm, us_recompute rc, int profile,
                       const char *json) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_ops o;
    std::vector<double> times;
    int64_t n, i;
    int s, k;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    if (!strcmp(preset, "1b")) {
        mc.dim = 2048;
        mc.n_layers = 16;
        mc.n_heads = 32;
        mc.n_kv_heads = 8;
        mc.ffn_dim = 8192;
        mc.vocab = 128256;
        mc.tie_embeddings = 1;
        tc.seq = 4096;
        tc.batch = 4;
    }
    /* Llama-3-8B's width (dim 4096, 32/8 heads, FFN 14336, untied 128256 vocabulary) with 8 of its 32
       layers, to fit one GPU with AdamW state: the linear layers' share of the step is near the whole
       model's (FP8's gain grows with it) */
    else if (!strcmp(preset, "8b8")) {
        mc.dim = 4096;
        mc.n_layers = 8;
        mc.n_heads = 32;
        mc.n_kv_heads = 8;
        mc.ffn_dim = 14336;
        mc.vocab = 128256;
        tc.seq = 4096;
        tc.batch = 2;
    } else if (!strcmp(preset, "200m")) {
        mc.dim = 1024;
        mc.n_layers = 12;
        mc.n_heads = 16;
        mc.n_kv_heads = 4;
        mc.ffn_dim = 4096;
        mc.vocab = 32768;
        tc.seq = 2048;
        tc.batch = 16;
    }
    /* DeepSeek-MoE's shape (dim 2048, 64 routed experts of 1408 and shared ones, top-6) with
       Fe 1536, so that FP8 takes both expert linears under the default size rule, one shared
       expert, 4 layers, every layer MoE (2.6 B parameters, 0.45 B active; 56 GiB with AdamW's
       state and the activations, us_memory_estimate). Forced balance (Megatron's benchmark
       setting): every expert gets 16384·6/64 = 1536 rows, the same each step */
    else if (!strcmp(preset, "moe")) {
        mc.dim = 2048;
        mc.n_layers = 4;
        mc.n_heads = 16;
        mc.n_kv_heads = 4;
        mc.vocab = 32768;
        mc.moe_experts = 64;
        mc.moe_top_k = 6;
        mc.moe_ffn_dim = 1536;
        mc.moe_shared = 1;
        tc.moe_force_balance = 1;
        tc.seq = 4096;
        tc.batch = 4;
    } else {
        fprintf(stderr, "bench_cuda: unknown preset %s\n", preset);
        return 2;
    }
    tc.precision = bench_prec;
    tc.recompute = rc;
    tc.steps = 1000;
    tc.lr = 3e-4f;
    tc.warmup = 0;
    tc.grad_accum = bench_accum;
    tc.fp8_no_wcache = bench_nowc;
    tc.fp8_experts = bench_fp8_experts;
    tc.loss_chunk = bench_loss_chunk;
    prof_on = 0;
    o = profiled();
    if (us_model_init(&m, &mc, &tc, &o) != US_OK) {
        printf("ultrascale   | %s | init failed: %s\n", preset, us_model_error(&m));
        return 3;
    }
    n = (int64_t)tc.grad_accum * tc.batch * tc.seq;
    /* the stale buffers, allocated before any step (not inside a timed one) */
    if (free_q == Q_STALE) {
        stale_q = (uint8_t *)inner.alloc(&inner, 2 * STALE_Q);
        stale_s = (float *)inner.alloc(&inner, 2 * STALE_S * sizeof(float));
        if (!stale_q || !stale_s) {
            printf("ultrascale   | %s | --fp8-stale-quant: no memory for its buffers\n", preset);
            return 3;
        }
    }
    {
        std::vector<int32_t> in(n), tgt(n);
        us_rng r;
        us_rng_seed(&r, 1);
        if (bench_tune) us_cuda_gemm_tune(&inner, 1);
        for (s = 0; s < warm + steps; s++) {
            double t0;
            if (bench_tune && s == warm)
                printf("  gemm-tune: %d GEMM plans took another algorithm after %d steps\n",
                       us_cuda_gemm_tune(&inner, 0), warm);
            for (i = 0; i < n; i++) {
                in[i] = (int32_t)(us_rng_u64(&r) % (uint64_t)mc.vocab);
                tgt[i] = (int32_t)(us_rng_u64(&r) % (uint64_t)mc.vocab);
            }
            if (profile && s == warm + steps - 1) {
                prof_on = 1;
                memset(pms, 0, sizeof pms);
                gshapes.clear();
            }
            skip_q = free_q && s >= warm;
            m.ops.sync(&m.ops);
            t0 = now_s();
            if (us_train_step(&m, in.data(), tgt.data(), NULL) != US_OK) {
                printf("ultrascale   | %s | step failed: %s\n", preset, us_model_error(&m));
                return 3;
            }
            m.ops.sync(&m.ops);
            if (s >= warm && !(profile && s == warm + steps - 1)) times.push_back(now_s() - t0);
            prof_on = 0;
        }
    }
    {
        double t = median(times), tok_s = (double)n / t,
               mfu = us_flops_per_token(&m.cfg, tc.seq) * tok_s / 989e12;
        /* the CUDA ops' own count: the wrapper's copies it at each alloc, so it would miss scratch
           that a kernel grows later (the attention backward's dS) */
        double peak_gib = (double)inner.bytes_peak / 1073741824.0;
        printf("ultrascale   | %-4s | tok/s %8.0f | MFU %5.1f%% | step %7.1f ms | peak %6.1f GiB | "
               "params %.3fB | recompute %s | %s%s%s | accum %d\n",
               preset, tok_s, 100 * mfu, 1e3 * t, peak_gib, (double)m.n_params / 1e9,
               us_recompute_name(rc), us_precision_name(bench_prec),
               m.fp8 && !m.fp8_wc ? " (no weight cache)" : "",
               m.fp8 == 1 && !o.rmsnorm_fwd_fp8 ? " (unfused)" : "", tc.grad_accum);
        if (free_q)
            printf("  (--fp8-%s-quant: %s in the timed steps; the losses are meaningless)\n",
                   free_q == Q_FREE ? "free" : "stale",
                   free_q == Q_FREE ? "no quantisation" : "the quantisers' output read by no GEMM");
        if (json) {
            FILE *f = fopen(json, "w");
            if (f) {
                fprintf(f,
                        "{\"impl\": \"ultrascale\", \"preset\": \"%s\", \"precision\": \"%s%s\", "
                        "\"tok_s\": %.1f, \"mfu\": %.4f, \"step_ms\": %.2f, \"peak_gib\": %.2f, "
                        "\"params\": %lld, \"accum\": %d, \"wcache\": %d}\n",
                        preset, us_precision_name(bench_prec),
                        free_q == Q_FREE    ? " free-quant"
                        : free_q == Q_STALE ? " stale-quant"
                                            : "",
                        tok_s, mfu, 1e3 * t, peak_gib, (long long)m.n_params, tc.grad_accum,
                        m.fp8_wc != NULL);
                fclose(f);
            }
        }
        if (profile) {
            double tot = 0;
            for (k = 0; k < P_N; k++) tot += pms[k];
            printf("  profile of one step (CUDA events around each op; includes launch gaps):\n");
            for (k = 0; k < P_N; k++)
                if (pms[k] > 0)
                    printf("    %-16s %8.2f ms  %5.1f%%\n", pname[k], pms[k], 100 * pms[k] / tot);
            printf("    %-16s %8.2f ms\n", "total", tot);
            if (m.n_moe && pms[P_GGEMM] > 0) { /* the routed experts' rows: N·K per layer */
                double rows = (double)tc.batch * tc.seq * mc.moe_top_k * tc.grad_accum,
                       fl = (rc == US_RECOMPUTE_FULL ? 24.0 : 18.0) * rows * (double)mc.dim *
                            (double)m.cfg.moe_ffn_dim * m.n_moe;
                printf("  experts in the grouped GEMM: %.2f ms for %.1f TFLOP (6·rows·C·Fe a "
                       "layer's forward, 3x with the backward): %.0f TFLOP/s (bf16; under fp8 "
                       "the rows FP8 takes are fp8 gemm)\n",
                       pms[P_GGEMM], fl * 1e-12, fl / (pms[P_GGEMM] * 1e-3) * 1e-12);
            }
        }
    }
    us_model_free(&m);
    if (profile) gshape_alone();
    return 0;
}

/* X [nx] and W [nw] bf16 from one stream of uniform noise in [-0.5, 0.5), or of standard normal
   noise with normal (not zeros: a GEMM's power, and so its clock, depends on the data), cast on
   the device; both start at the stream's first value */
static void rand_bf16_pair(void *X, int64_t nx, void *W, int64_t nw, uint64_t seed,
                           int normal = 0) {
    std::vector<float> h((size_t)std::max(nx, nw));
    us_rng rg;
    float *tmp;
    us_rng_seed(&rg, seed);
    for (size_t i = 0; i < h.size(); i++)
        h[i] = normal ? us_rng_normal(&rg) : us_rng_uniform(&rg) - 0.5f;
    CK(cudaMalloc(&tmp, h.size() * 4));
    CK(cudaMemcpy(tmp, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    inner.cast(&inner, X, US_BF16, tmp, US_F32, nx);
    inner.cast(&inner, W, US_BF16, tmp, US_F32, nw);
    inner.sync(&inner);
    cudaFree(tmp);
}

/* ---- FP8 GEMMs (// >>cuda-fp8) against bf16 at the 1B shape's linear layers: y = x·Wᵀ with
   x [M][K], W [N][K]; block-scaled (1×128 x 128×128: Fprop/Dgrad; 1×128 x 1×128: Wgrad) and
   per-tensor, plus the fused quantisation kernels' bandwidth */
static void bench_fp8_gemm(void) {
    int64_t shapes[][3] = {{8192, 8192, 8192},   {16384, 3072, 2048}, {16384, 2048, 2048},
                           {16384, 16384, 2048}, {16384, 2048, 8192}, {2048, 8192, 16384}};
    us__cuda *c = (us__cuda *)inner.backend;
    cudaEvent_t a, b;
    int k, r, v;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    printf("\n| GEMM (M x N x K) | bf16 TFLOP/s | fp8 1x128·128x128 | fp8 1x128·1x128 | fp8 "
           "per-tensor | speed-up (block) | quantise x 1x128 / x^T 128x1 / W 128x128 / x both "
           "/ W both (GB/s) |\n|---|---|---|---|---|---|---|\n");
    for (k = 0; k < 6; k++) {
        int64_t M = shapes[k][0], N = shapes[k][1], K = shapes[k][2];
        void *X = inner.alloc(&inner, (size_t)M * K * 2),
             *W = inner.alloc(&inner, (size_t)N * K * 2),
             *Y = inner.alloc(&inner, (size_t)M * N * 2);
        uint8_t *qx = (uint8_t *)inner.alloc(&inner, (size_t)M * K),
                *qw = (uint8_t *)inner.alloc(&inner, (size_t)N * K),
                *qt = (uint8_t *)inner.alloc(&inner, (size_t)M * K),
                *qwt = (uint8_t *)inner.alloc(&inner, (size_t)K * ((N + 127) / 128 * 128));
        float *sx =
            (float *)inner.alloc(&inner, (size_t)us_fp8_scales_size(US_FP8_ROW128, M, K) * 4);
        float *sw =
            (float *)inner.alloc(&inner, (size_t)std::max(us_fp8_scales_size(US_FP8_BLOCK128, N, K),
                                                          us_fp8_scales_size(US_FP8_ROW128, N, K)) *
                                             4);
        float *st =
            (float *)inner.alloc(&inner, (size_t)us_fp8_scales_size(US_FP8_ROW128, K, M) * 4);
        float *swt =
            (float *)inner.alloc(&inner, (size_t)us_fp8_scales_size(US_FP8_BLOCK128, K, N) * 4);
        double fl = 2.0 * M * N * K, res[9];
        rand_bf16_pair(X, M * K, W, N * K, 11 + k);
        /* bf16, fp8 block, fp8 row x row, fp8 tensor; quantise x, x^T, W, x both ways, W both ways
           (the weight cache's W and Wᵀ) */
        for (v = 0; v < 9; v++) {
            std::vector<double> ts;
            int ta = v == 3 ? US_FP8_TENSOR : US_FP8_ROW128, tb = v == 1   ? US_FP8_BLOCK128
                                                                  : v == 2 ? US_FP8_ROW128
                                                                           : US_FP8_TENSOR;
            if (v >= 1 && v <= 3) {
                inner.fp8_quantize(&inner, qx, sx, X, US_BF16, M, K, ta, 0, 0);
                inner.fp8_quantize(&inner, qw, sw, W, US_BF16, N, K, tb, 0, 0);
            }
            for (r = 0; r < 15; r++) {
                float ms;
                cudaEventRecord(a, c->stream);
                if (v == 0)
                    inner.gemm(&inner, 0, 1, M, N, K, 1.0f, X, US_BF16, K, W, US_BF16, K, 0.0f, Y,
                               US_BF16, N);
                else if (v < 4)
                    inner.fp8_gemm(&inner, M, N, K, 1.0f, qx, sx, ta, qw, sw, tb, 0.0f, Y, US_BF16,
                                   N);
                else if (v == 4)
                    inner.fp8_quantize(&inner, qx, sx, X, US_BF16, M, K, US_FP8_ROW128, 0, 0);
                else if (v == 5)
                    inner.fp8_quantize(&inner, qx, sx, X, US_BF16, M, K, US_FP8_ROW128, 1,
                                       0); /* Wgrad's 128x1 tiles */
                else if (v == 6)
                    inner.fp8_quantize(&inner, qw, sw, W, US_BF16, N, K, US_FP8_BLOCK128, 0, 0);
                else if (v == 7)
                    inner.fp8_quantize_both(&inner, qx, sx, qt, st, X, US_BF16, M, K, US_FP8_ROW128,
                                            0); /* Dgrad's and Wgrad's dy */
                else
                    inner.fp8_quantize_both(&inner, qw, sw, qwt, swt, W, US_BF16, N, K,
                                            US_FP8_BLOCK128, 0);
                cudaEventRecord(b, c->stream);
                cudaEventSynchronize(b);
                cudaEventElapsedTime(&ms, a, b);
                if (r >= 5) ts.push_back(ms * 1e-3);
            }
            res[v] = v < 4 ? fl / median(ts) / 1e12
                           : (double)(v >= 6 && v != 7 ? N : M) * K * (v >= 7 ? 4 : 3) /
                                 median(ts) / 1e9; /* bytes: 2 read + 1 (both: 2) written */
        }
        if (inner.error(&inner)) {
            printf("| %lld x %lld x %lld | error: %s |\n", (long long)M, (long long)N, (long long)K,
                   inner.error(&inner));
            break;
        }
        printf("| %lld x %lld x %lld | %.0f | %.0f | %.0f | %.0f | %.2fx | %.0f / %.0f / %.0f / "
               "%.0f / %.0f |\n",
               (long long)M, (long long)N, (long long)K, res[0], res[1], res[2], res[3],
               res[1] / res[0], res[4], res[5], res[6], res[7], res[8]);
        inner.free(&inner, X);
        inner.free(&inner, W);
        inner.free(&inner, Y);
        inner.free(&inner, qx);
        inner.free(&inner, qw);
        inner.free(&inner, sx);
        inner.free(&inner, sw);
        inner.free(&inner, qt);
        inner.free(&inner, st);
        inner.free(&inner, qwt);
        inner.free(&inner, swt);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

/* ---- SwiGLU's backward with dgu's two FP8 operands (us_ops.swiglu_bwd_fp8), dgu NULL as the FP8
   layer calls it: bytes = gu [N][2F] and dh [N][F] read (bf16), q [N][2F] and qt [2F][Np] written
   (1 byte an element) with their fp32 scales; GB/s over the median of 10 timed calls */
static void bench_swiglu_bwd_fp8(void) {
    const int64_t shapes[2][2] = {{16384, 8192}, {8192, 14336}}; /* N, F */
    us__cuda *c = (us__cuda *)inner.backend;
    cudaEvent_t a, b;
    int k, r;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (k = 0; k < 2; k++) {
        int64_t N = shapes[k][0], F = shapes[k][1], C2 = 2 * F, Np = (N + 127) / 128 * 128;
        int64_t ns = us_fp8_scales_size(US_FP8_ROW128, N, C2),
                nst = us_fp8_scales_size(US_FP8_ROW128, C2, N);
        void *gu = inner.alloc(&inner, (size_t)(N * C2) * 2),
             *dh = inner.alloc(&inner, (size_t)(N * F) * 2);
        uint8_t *q = (uint8_t *)inner.alloc(&inner, (size_t)(N * C2)),
                *qt = (uint8_t *)inner.alloc(&inner, (size_t)(C2 * Np));
        float *s = (float *)inner.alloc(&inner, (size_t)ns * 4),
              *st = (float *)inner.alloc(&inner, (size_t)nst * 4);
        double bytes = 2.0 * N * C2 + 2.0 * N * F + (double)N * C2 + (double)C2 * Np +
                       4.0 * (double)(ns + nst);
        std::vector<double> ts;
        rand_bf16_pair(gu, N * C2, dh, N * F, 31 + k);
        for (r = 0; r < 13; r++) {
            float ms;
            cudaEventRecord(a, c->stream);
            inner.swiglu_bwd_fp8(&inner, NULL, q, s, qt, st, dh, gu, N, F, US_BF16, 0);
            cudaEventRecord(b, c->stream);
            cudaEventSynchronize(b);
            cudaEventElapsedTime(&ms, a, b);
            if (r >= 3) ts.push_back(ms * 1e-3);
        }
        if (inner.error(&inner))
            printf("swiglu_bwd_fp8 N %lld F %lld: error: %s\n", (long long)N, (long long)F,
                   inner.error(&inner));
        else
            printf("swiglu_bwd_fp8 bf16 N %lld F %lld: %.3f ms, %.0f GB/s (bytes: gu 2·N·2F + dh "
                   "2·N·F read, q N·2F + qt 2F·Np + scales 4·(%lld + %lld) written = %.3f GB)\n",
                   (long long)N, (long long)F, median(ts) * 1e3, bytes / median(ts) / 1e9,
                   (long long)ns, (long long)nst, bytes / 1e9);
        inner.free(&inner, gu);
        inner.free(&inner, dh);
        inner.free(&inner, q);
        inner.free(&inner, qt);
        inner.free(&inner, s);
        inner.free(&inner, st);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

/* ---- cuBLASLt's heuristic: its first algorithm (what the library runs) against the best of its
   first 16, timed, for the 1B step's twelve linear GEMMs (Fprop, Dgrad, Wgrad of the four
   linears at 16384 tokens), bf16 and FP8 block-scaled alike (TN, as the FP8 path runs them).
   Says whether timing the candidates when a plan is made would pay. */
static double time_lt(cublasLtHandle_t lt, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t la,
                      cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                      const cublasLtMatmulAlgo_t *al, const void *B, const void *A, void *C,
                      void *ws, size_t wsb, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1) {
    std::vector<double> ts;
    float one = 1, zero = 0, ms;
    int r;
    for (r = 0; r < 13; r++) {
        cudaEventRecord(e0, st);
        if (cublasLtMatmul(lt, d, &one, B, la, A, lb, &zero, C, lc, C, lc, al, ws, wsb, st) !=
            CUBLAS_STATUS_SUCCESS)
            return 0;
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 3) ts.push_back(ms * 1e-3);
    }
    return median(ts);
}

static void bench_gemm_algos(void) {
    const int64_t T = 16384, io[4][2] = {{2048, 3072},
                                         {2048, 2048},
                                         {2048, 16384},
                                         {8192, 2048}}; /* (In, Out) of qkv, o, gate|up, down */
    const char *gname[3] = {"Fprop", "Dgrad", "Wgrad"}, *lname[4] = {"qkv", "o", "gate|up", "down"};
    us__cuda *c = (us__cuda *)inner.backend;
    cublasLtHandle_t lt;
    void *ws;
    size_t wsb = c->ws_bytes;
    cudaEvent_t e0, e1;
    double tot[2][2] = {{0, 0}, {0, 0}}; /* [bf16, fp8][first, best] seconds */
    int li, g, p;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cublasLtCreate(&lt);
    CK(cudaMalloc(&ws, wsb));
    printf("\n| GEMM | M x N x K | bf16 first / best of n (TFLOP/s) | fp8 first / best of n "
           "|\n|---|---|---|---|\n");
    for (li = 0; li < 4; li++)
        for (g = 0; g < 3; g++) {
            int64_t In = io[li][0], Out = io[li][1];
            int64_t M = g == 2 ? Out : T, N = g == 0 ? Out : In, K = g == 0 ? In : g == 1 ? Out : T;
            double fl = 2.0 * M * N * K, res[2][2];
            int nres[2];
            void *X = inner.alloc(&inner, (size_t)(M * K * 2)),
                 *W = inner.alloc(&inner, (size_t)(N * K * 2)),
                 *Y = inner.alloc(&inner, (size_t)(M * N * 2));
            uint8_t *qx = (uint8_t *)inner.alloc(&inner, (size_t)(M * K)),
                    *qw = (uint8_t *)inner.alloc(&inner, (size_t)(N * K));
            float *sx =
                (float *)inner.alloc(&inner, (size_t)us_fp8_scales_size(US_FP8_ROW128, M, K) * 4);
            float *sw = (float *)inner.alloc(
                &inner, (size_t)std::max(us_fp8_scales_size(US_FP8_BLOCK128, N, K),
                                         us_fp8_scales_size(US_FP8_ROW128, N, K)) *
                            4);
            int tb = g == 2 ? US_FP8_ROW128 : US_FP8_BLOCK128;
            rand_bf16_pair(X, M * K, W, N * K, 5 + li * 3 + g);
            inner.fp8_quantize(&inner, qx, sx, X, US_BF16, M, K, US_FP8_ROW128, 0, 0);
            inner.fp8_quantize(&inner, qw, sw, W, US_BF16, N, K, tb, 0, 0);
            inner.sync(&inner);
            for (p = 0; p < 2; p++) {
                cublasLtMatmulDesc_t d;
                cublasLtMatrixLayout_t la, lb, lc;
                cublasLtMatmulPreference_t pr;
                cublasLtMatmulHeuristicResult_t h[16];
                cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
                int found = 0, i;
                cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA);
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB);
                if (p) {
                    cublasLtMatmulMatrixScale_t ma = us__fp8_mode(tb),
                                                mb = us__fp8_mode(US_FP8_ROW128);
                    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma,
                                                   sizeof ma);
                    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb,
                                                   sizeof mb);
                    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw,
                                                   sizeof sw);
                    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx,
                                                   sizeof sx);
                }
                cublasLtMatrixLayoutCreate(&la, p ? CUDA_R_8F_E4M3 : CUDA_R_16BF, K, N, K);
                cublasLtMatrixLayoutCreate(&lb, p ? CUDA_R_8F_E4M3 : CUDA_R_16BF, K, M, K);
                cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N);
                cublasLtMatmulPreferenceCreate(&pr);
                cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &wsb, sizeof wsb);
                cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pr, 16, h, &found);
                res[p][0] = res[p][1] = 0;
                nres[p] = found;
                for (i = 0; i < found; i++) {
                    double t = time_lt(lt, d, la, lb, lc, &h[i].algo, p ? (const void *)qw : W,
                                       p ? (const void *)qx : X, Y, ws, wsb, c->stream, e0, e1);
                    if (t <= 0) continue;
                    if (i == 0) res[p][0] = t;
                    if (res[p][1] == 0 || t < res[p][1]) res[p][1] = t;
                }
                if (res[p][0] > 0) {
                    tot[p][0] += res[p][0];
                    tot[p][1] += res[p][1];
                }
                cublasLtMatmulPreferenceDestroy(pr);
                cublasLtMatrixLayoutDestroy(la);
                cublasLtMatrixLayoutDestroy(lb);
                cublasLtMatrixLayoutDestroy(lc);
                cublasLtMatmulDescDestroy(d);
            }
            printf("| %s %s | %lld x %lld x %lld | %.0f / %.0f of %d | %.0f / %.0f of %d |\n",
                   gname[g], lname[li], (long long)M, (long long)N, (long long)K,
                   res[0][0] > 0 ? fl / res[0][0] * 1e-12 : 0.0,
                   res[0][1] > 0 ? fl / res[0][1] * 1e-12 : 0.0, nres[0],
                   res[1][0] > 0 ? fl / res[1][0] * 1e-12 : 0.0,
                   res[1][1] > 0 ? fl / res[1][1] * 1e-12 : 0.0, nres[1]);
            inner.free(&inner, X);
            inner.free(&inner, W);
            inner.free(&inner, Y);
            inner.free(&inner, qx);
            inner.free(&inner, qw);
            inner.free(&inner, sx);
            inner.free(&inner, sw);
        }
    printf("| all twelve, one layer | | %.3f ms first / %.3f ms best | %.3f ms first / %.3f ms "
           "best |\n",
           1e3 * tot[0][0], 1e3 * tot[0][1], 1e3 * tot[1][0], 1e3 * tot[1][1]);
    cudaFree(ws);
    cublasLtDestroy(lt);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

/* ---- The 1B step's linear GEMMs as the library calls them (bf16: its layouts, the residual
   linears' Fprop with beta 1, the Wgrad into the fp32 gradient with beta 1; FP8: TN, the tilings
   and beta of the step), each with every candidate of cuBLASLt's heuristic (up to 16) timed under
   sustained load: a shape's candidates take turns, 30 rounds after 5, back to back, so all run at
   the power-capped clock a training step runs at (a GEMM alone for a few ms runs up to 18 %
   faster than in the step: --profile). The best candidate here beat the first by up to 18 %,
   but a library that chose its plans' algorithms this way (timed at their first call) ran the
   1B step no faster (bench/RESULTS.md, 2026-12-02, eighth session): a ranking, not a promise. */
struct sus_case {
    const char *name;
    int fp8, ta, tb; /* fp8: ta, tb are the tilings of a and b */
    int64_t M, N, K;
    us_dtype cdt;
    float beta;
};

static void bench_gemm_sustained(void) {
    const int64_t T = 16384, io[4][2] = {{2048, 3072}, {2048, 2048}, {2048, 16384}, {8192, 2048}};
    const char *lname[4] = {"qkv", "o", "gate|up", "down"};
    static char names[24][32];
    std::vector<sus_case> cs;
    us__cuda *c = (us__cuda *)inner.backend;
    size_t wsb = c->ws_bytes;
    void *ws;
    double tot[2][2] = {{0, 0}, {0, 0}}; /* [bf16, fp8][first, best] seconds */
    int li, g, p, k = 0;
    for (p = 0; p < 2; p++)
        for (li = 0; li < 4; li++)
            for (g = 0; g < 3; g++) {
                int64_t In = io[li][0], Out = io[li][1];
                sus_case x;
                snprintf(names[k], sizeof names[k], "%s %s %s", p ? "fp8" : "bf16",
                         g == 0   ? "Fprop"
                         : g == 1 ? "Dgrad"
                                  : "Wgrad",
                         lname[li]);
                x.name = names[k++];
                x.fp8 = p;
                x.M = g == 2 ? Out : T;
                x.N = g == 0 ? Out : In;
                x.K = g == 0 ? In : g == 1 ? Out : T;
                x.cdt = g == 2 ? US_F32 : US_BF16;
                x.beta = g == 2 || (g == 0 && (li == 1 || li == 3)) ? 1.0f : 0.0f;
                if (p) {
                    x.ta = US_FP8_ROW128;
                    x.tb = g == 2 ? US_FP8_ROW128 : US_FP8_BLOCK128;
                } else {
                    x.ta = g == 2;
                    x.tb = g == 0;
                }
                cs.push_back(x);
            }
    CK(cudaMalloc(&ws, wsb));
    printf("\n| GEMM (as the step calls it) | M x N x K | first candidate | best of n, "
           "sustained (TFLOP/s) |\n|---|---|---|---|\n");
    for (size_t ci = 0; ci < cs.size(); ci++) {
        sus_case &x = cs[ci];
        int64_t Kp = (x.K + 127) / 128 * 128;
        int64_t ar = x.fp8 || !x.ta ? x.M : x.K, ac = x.fp8 || !x.ta ? x.K : x.M;
        int64_t br = x.fp8 || x.tb ? x.N : x.K, bc = x.fp8 || x.tb ? x.K : x.N;
        void *A = inner.alloc(&inner, (size_t)(ar * ac * 2)),
             *B = inner.alloc(&inner, (size_t)(br * bc * 2));
        void *C = inner.alloc(&inner, (size_t)(x.M * x.N) * us_dtype_size(x.cdt));
        uint8_t *qa = NULL, *qb = NULL;
        float *sa = NULL, *sb = NULL;
        cublasLtMatmulDesc_t d;
        cublasLtMatrixLayout_t la, lb, lc;
        cublasLtMatmulPreference_t pr;
        cublasLtMatmulHeuristicResult_t h[16];
        cudaEvent_t ev[17];
        std::vector<double> ts[16];
        int found = 0, i, r;
        double fl = 2.0 * x.M * x.N * x.K, first = 0, best = 0;
        int bi = 0;
        fill_noise(A, US_BF16, ar * ac, 21 + ci);
        fill_noise(B, US_BF16, br * bc, 22 + ci);
        fill_noise(C, x.cdt, x.M * x.N, 23 + ci);
        if (x.fp8) {
            fp8_operand(&qa, &sa, A, x.M, x.K, x.ta);
            fp8_operand(&qb, &sb, B, x.N, x.K, x.tb);
            inner.sync(&inner);
        }
        cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        if (x.fp8) { /* as us__cuda_fp8_gemm: b is cuBLASLt's A, transposed */
            cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
            cublasLtMatmulMatrixScale_t ma = us__fp8_mode(x.tb), mb = us__fp8_mode(x.ta);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa);
            cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, Kp, x.N, Kp);
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, Kp, x.M, Kp);
        } else { /* as us__gemm_plan_get: row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ */
            cublasOperation_t opx = x.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                              opy = x.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy);
            cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, bc, br, bc);
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, ac, ar, ac);
        }
        cublasLtMatrixLayoutCreate(&lc, us__cuda_type(x.cdt), x.N, x.M, x.N);
        cublasLtMatmulPreferenceCreate(&pr);
        cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                             sizeof wsb);
        cublasLtMatmulAlgoGetHeuristic(c->lt, d, la, lb, lc, lc, pr, 16, h, &found);
        for (i = 0; i <= found; i++) CK(cudaEventCreate(&ev[i]));
        for (r = 0; r < 35; r++) { /* every candidate once a round, back to back */
            cudaEventRecord(ev[0], c->stream);
            for (i = 0; i < found; i++) {
                float one = 1;
                if (x.fp8)
                    cublasLtMatmul(c->lt, d, &one, qb, la, qa, lb, &x.beta, C, lc, C, lc,
                                   &h[i].algo, ws, wsb, c->stream);
                else
                    cublasLtMatmul(c->lt, d, &one, B, la, A, lb, &x.beta, C, lc, C, lc, &h[i].algo,
                                   ws, wsb, c->stream);
                cudaEventRecord(ev[i + 1], c->stream);
            }
            CK(cudaEventSynchronize(ev[found]));
            for (i = 0; i < found && r >= 5; i++) {
                float ms = 0;
                cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
                ts[i].push_back(ms * 1e-3);
            }
        }
        for (i = 0; i < found; i++) {
            double t = median(ts[i]);
            if (i == 0) first = t;
            if (best == 0 || t < best) {
                best = t;
                bi = i;
            }
        }
        if (found > 0) {
            tot[x.fp8][0] += first;
            tot[x.fp8][1] += best;
        }
        printf("| %s | %lld x %lld x %lld | %.0f | %.0f (candidate %d of %d) |\n", x.name,
               (long long)x.M, (long long)x.N, (long long)x.K, found ? fl / first * 1e-12 : 0.0,
               found ? fl / best * 1e-12 : 0.0, bi, found);
        for (i = 0; i <= found; i++) cudaEventDestroy(ev[i]);
        cublasLtMatmulPreferenceDestroy(pr);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(d);
        inner.free(&inner, A);
        inner.free(&inner, B);
        inner.free(&inner, C);
        inner.free(&inner, qa); /* (NULL for bf16: nothing) */
        inner.free(&inner, qb);
        inner.free(&inner, sa);
        inner.free(&inner, sb);
    }
    printf("| one layer's twelve | | bf16 %.3f ms, fp8 %.3f ms | bf16 %.3f ms, fp8 %.3f ms |\n",
           1e3 * tot[0][0], 1e3 * tot[1][0], 1e3 * tot[0][1], 1e3 * tot[1][1]);
    cudaFree(ws);
}

/* ---- GEMM: in the library vs a standalone cuBLASLt call (fresh handle, own heuristic) */
static void bench_gemm(void) {
    int64_t shapes[][3] = {{8192, 8192, 8192},   {16384, 3072, 2048}, {16384, 2048, 2048},
                           {16384, 16384, 2048}, {16384, 2048, 8192}, {16384, 128256, 2048}};
    us__cuda *c = (us__cuda *)inner.backend;
    cublasLtHandle_t lt;
    void *ws;
    size_t wsb = (size_t)32 << 20;
    cudaEvent_t a, b;
    int k, r;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    cublasLtCreate(&lt);
    CK(cudaMalloc(&ws, wsb));
    printf("\n| GEMM bf16 (M x N x K, y = x·Wᵀ) | in-library TFLOP/s | standalone cuBLASLt | ratio "
           "|\n|---|---|---|---|\n");
    for (k = 0; k < 6; k++) {
        int64_t M = shapes[k][0], N = shapes[k][1], K = shapes[k][2];
        size_t bytesA = (size_t)M * K * 2, bytesB = (size_t)N * K * 2, bytesC = (size_t)M * N * 2;
        void *A = inner.alloc(&inner, bytesA), *B = inner.alloc(&inner, bytesB),
             *C = inner.alloc(&inner, bytesC);
        std::vector<double> tl, ts;
        double fl = 2.0 * M * N * K;
        rand_bf16_pair(A, M * K, B, N * K, 7 + k);
        for (r = 0; r < 25; r++) { /* alternate the two, 5 warm-ups */
            float ms;
            cudaEventRecord(a, c->stream);
            inner.gemm(&inner, 0, 1, M, N, K, 1.0f, A, US_BF16, K, B, US_BF16, K, 0.0f, C, US_BF16,
                       N);
            cudaEventRecord(b, c->stream);
            cudaEventSynchronize(b);
            cudaEventElapsedTime(&ms, a, b);
            if (r >= 5) tl.push_back(ms * 1e-3);
            {
                cublasLtMatmulDesc_t d;
                cublasLtMatrixLayout_t la, lb, lc;
                cublasLtMatmulPreference_t pr;
                cublasLtMatmulHeuristicResult_t h;
                int found = 0;
                float al = 1, be = 0;
                cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
                cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA);
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB);
                cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K);
                cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K);
                cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N);
                cublasLtMatmulPreferenceCreate(&pr);
                cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &wsb, sizeof wsb);
                cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pr, 1, &h, &found);
                cudaEventRecord(a, c->stream);
                cublasLtMatmul(lt, d, &al, B, la, A, lb, &be, C, lc, C, lc, &h.algo, ws, wsb,
                               c->stream);
                cudaEventRecord(b, c->stream);
                cudaEventSynchronize(b);
                cudaEventElapsedTime(&ms, a, b);
                if (r >= 5) ts.push_back(ms * 1e-3);
                cublasLtMatmulPreferenceDestroy(pr);
                cublasLtMatrixLayoutDestroy(la);
                cublasLtMatrixLayoutDestroy(lb);
                cublasLtMatrixLayoutDestroy(lc);
                cublasLtMatmulDescDestroy(d);
            }
        }
        printf("| %5lld x %6lld x %5lld | %7.1f | %7.1f | %5.3f |\n", (long long)M, (long long)N,
               (long long)K, fl / median(tl) * 1e-12, fl / median(ts) * 1e-12,
               median(ts) / median(tl));
        inner.free(&inner, A);
        inner.free(&inner, B);
        inner.free(&inner, C);
    }
    cudaFree(ws);
    cublasLtDestroy(lt);
}

/* ---- the experts' grouped GEMM (// >>cuda-grouped): ops->gemm_grouped over E experts against
   one dense cuBLASLt GEMM of the same total size (M = Σ rows: the ceiling, one big GEMM) and a
   loop of per-expert cuBLASLt GEMMs (what the library ran before), for a layer's six expert
   GEMMs: gate|up (N 2Fe, K C) and down (N C, K Fe), each Fprop, Dgrad and Wgrad (fp32 gradient
   +=). Rows per expert: balanced (tokens·K/E each) or routed (a skewed draw of the same total:
   expert e's share ∝ 1 + 3u³, u uniform, so a few experts take several times the mean). */
static double time_ms(cudaEvent_t a, cudaEvent_t b, const std::function<void()> &f) {
    std::vector<double> t;
    cudaStream_t s = st_of();
    for (int r = 0; r < 13; r++) {
        float ms;
        cudaEventRecord(a, s);
        f();
        cudaEventRecord(b, s);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms, a, b);
        if (r >= 3) t.push_back(ms);
    }
    return median(t);
}

static void bench_grouped_shape(const char *name, int E, int64_t tokens, int K, int64_t C,
                                int64_t Fe, int routed, cudaEvent_t a, cudaEvent_t b) {
    static const char *mname[3] = {"Fprop", "Dgrad", "Wgrad"};
    std::vector<int64_t> off(E), n(E);
    std::vector<void *> wp(E), gp(E);
    int64_t R = tokens * K, e, left = R;
    us_rng rg;
    us_rng_seed(&rg, 11);
    {
        std::vector<double> share(E);
        double tot = 0;
        for (e = 0; e < E; e++) {
            double u = us_rng_uniform(&rg);
            share[e] = routed ? 1 + 3 * u * u * u : 1;
            tot += share[e];
        }
        for (e = 0; e < E; e++) {
            n[e] = e == E - 1 ? left : (int64_t)(R * share[e] / tot);
            off[e] = R - left;
            left -= n[e];
        }
    }
    /* X [R, max(C, 2Fe)], Y likewise; weights of every expert bf16, their gradients fp32 */
    int64_t wide = C > 2 * Fe ? C : 2 * Fe, wn = 2 * Fe * C;
    void *X = inner.alloc(&inner, (size_t)(R * wide) * 2),
         *Y = inner.alloc(&inner, (size_t)(R * wide) * 2),
         *W = inner.alloc(&inner, (size_t)(E * wn) * 2);
    float *Gr = (float *)inner.alloc(&inner, (size_t)(E * wn) * 4);
    if (!X || !Y || !W || !Gr) {
        printf("| %s | out of device memory |\n", name);
        return;
    }
    rand_bf16_pair(X, R * wide, W, E * wn, 5);
    rand_bf16_pair(Y, R * wide, W, E * wn, 6);
    for (e = 0; e < E; e++) {
        wp[e] = (char *)W + (size_t)(e * wn) * 2;
        gp[e] = Gr + e * wn;
    }
    for (int lin = 0; lin < 2; lin++) {
        int64_t Out = lin ? C : 2 * Fe, In = lin ? Fe : C;
        for (int mode = 0; mode < 3; mode++) {
            /* the grouped op's N, K and operands (us_ops.gemm_grouped) */
            int64_t N = mode == US_GG_DGRAD ? In : Out, Kd = mode == US_GG_DGRAD ? Out : In;
            void *const *w = mode == US_GG_WGRAD ? gp.data() : wp.data();
            double fl = 2.0 * R * N * Kd, tg, tm, td, tl;
            const auto grouped = [&] {
                inner.gemm_grouped(&inner, mode, E, off.data(), n.data(), N, Kd, X, Kd, w, Y, N,
                                   US_BF16);
            };
            us_cuda_grouped_kernel(&inner, US_CUDA_GG_WGMMA); /* the one-launch kernels */
            tg = time_ms(a, b, grouped);
            us_cuda_grouped_kernel(&inner, US_CUDA_GG_MMA_SYNC);
            tm = time_ms(a, b, grouped);
            us_cuda_grouped_kernel(&inner, gg_kernel);
            td = time_ms(a, b, [&] {
                if (mode == US_GG_FPROP)
                    inner.gemm(&inner, 0, 1, R, N, Kd, 1.0f, X, US_BF16, Kd, W, US_BF16, Kd, 0.0f,
                               Y, US_BF16, N);
                else if (mode == US_GG_DGRAD)
                    inner.gemm(&inner, 0, 0, R, N, Kd, 1.0f, X, US_BF16, Kd, W, US_BF16, N, 0.0f, Y,
                               US_BF16, N);
                else
                    inner.gemm(&inner, 1, 0, N, Kd, R, 1.0f, Y, US_BF16, N, X, US_BF16, Kd, 1.0f,
                               Gr, US_F32, Kd);
            });
            tl = time_ms(a, b, [&] {
                us__gemm_grouped_each(&inner, mode, E, off.data(), n.data(), N, Kd, X, Kd, w, Y, N,
                                      US_BF16);
            });
            printf("| %s | %s %s | %lld x %lld | %7.1f | %7.1f | %7.1f | %7.1f | %5.2f | %5.2f "
                   "|\n",
                   name, lin ? "down" : "gate|up", mname[mode], (long long)N, (long long)Kd,
                   fl / tg * 1e-9, fl / tm * 1e-9, fl / td * 1e-9, fl / tl * 1e-9, td / tg,
                   tl / tg);
        }
    }
    if (inner.error(&inner)) printf("  error: %s\n", inner.error(&inner));
    inner.free(&inner, X);
    inner.free(&inner, Y);
    inner.free(&inner, W);
    inner.free(&inner, Gr);
}

static void bench_grouped(void) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    printf("\n| layer (E, tokens·K rows, C, Fe) | GEMM | N x K | wgmma kernel TFLOP/s | mma.sync "
           "kernel | one dense GEMM of Σ rows | per-expert loop | dense / wgmma time | loop / "
           "wgmma time |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    /* --preset moe's layer (DeepSeek-MoE-like), a Mixtral-like one, a fine-grained one */
    bench_grouped_shape("E64 16384x6 C2048 Fe1536 balanced", 64, 16384, 6, 2048, 1536, 0, a, b);
    bench_grouped_shape("E64 16384x6 C2048 Fe1536 routed", 64, 16384, 6, 2048, 1536, 1, a, b);
    bench_grouped_shape("E8 8192x2 C4096 Fe14336 balanced", 8, 8192, 2, 4096, 14336, 0, a, b);
    bench_grouped_shape("E128 16384x8 C2048 Fe768 routed", 128, 16384, 8, 2048, 768, 1, a, b);
    /* few rows per expert (a small batch): 192 each, and 24 */
    bench_grouped_shape("E64 2048x6 C2048 Fe1536 balanced", 64, 2048, 6, 2048, 1536, 0, a, b);
    bench_grouped_shape("E64 256x6 C2048 Fe1536 routed", 64, 256, 6, 2048, 1536, 1, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

/* ---- attention TFLOP/s (causal: half the square), the same rows as sdpa_bench.py: HS 128 with
   NH 16 and NKV 16 or 4, and the 1B shape's HS 64, NH 32, NKV 8; B·T = 16384 tokens. Each row
   times the Hopper kernels (// >>cuda-hopper; the backward fused, then as two kernels) and the
   mma.sync ones (// >>cuda-flash) in turn,
   on the same buffers; FLOPs counted as causal, fwd 4·B·NH·T²·HS/2, bwd 2.5× that. */
static int att_shapes[8][3] = {{16, 16, 128}, {16, 4, 128}, {32, 8, 64}}; /* NH, NKV, HS */
static int att_ns = 3, att_T[8] = {2048, 4096, 8192}, att_nT = 3;
static int att_band; /* --att-band: the us-hopN row's band (0: no such row) */

/* --att-seq 4096,8192 / --att-heads 16:4:128,32:8:64: the rows to time (at most 8 of each) */
static int parse_att_list(const char *s, int per, int *dst, int *n) {
    *n = 0;
    while (*s && *n < 8) {
        for (int j = 0; j < per; j++) {
            char *e;
            long v = strtol(s, &e, 10);
            if (e == s || v <= 0) return 0;
            dst[*n * per + j] = (int)v;
            s = e;
            if (j + 1 < per && *s++ != ':') return 0;
        }
        ++*n;
        if (*s == ',')
            s++;
        else if (*s)
            return 0;
    }
    return *n > 0 && !*s;
}

static void bench_attention(void) {
    int k, sh, r, path;
    us__cuda *c = (us__cuda *)inner.backend;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    printf("\n%-8s %5s %2s %3s %3s %4s | %9s %8s | %9s %8s\n", "impl", "T", "B", "NH", "NKV", "HS",
           "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
    for (sh = 0; sh < att_ns; sh++)
        for (k = 0; k < att_nT; k++) {
            int T = att_T[k], B = T < 16384 ? 16384 / T : 1, NH = att_shapes[sh][0],
                NKV = att_shapes[sh][1], HS = att_shapes[sh][2];
            int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, N = (int64_t)B * T;
            void *qkv = inner.alloc(&inner, (size_t)N * QKV * 2),
                 *out = inner.alloc(&inner, (size_t)N * NH * HS * 2);
            void *dout = inner.alloc(&inner, (size_t)N * NH * HS * 2),
                 *dqkv = inner.alloc(&inner, (size_t)N * QKV * 2);
            float *lse = (float *)inner.alloc(&inner, (size_t)B * NH * T * 4);
            double fl = 4.0 * B * NH * (double)T * T * HS / 2;
            rand_bf16_pair(qkv, N * QKV, dout, N * NH * HS, 3, 1);
            /* the default (the backward through memory at HS 96 and 128, else two kernels),
               fused always, two kernels always, mma.sync (bf16 HS 64 and 128 only: others are
               portable), the Hopper kernels with one CTA per query tile instead of a persistent
               grid (the forward, dK/dV and dQ), the Hopper kernels' tiles in one band of (batch,
               kv head) pairs instead of bands that fit L2 (us_cuda_attention_band), and the
               backward with dS through memory always (HS ≤ 128). The paths take turns rep by
               rep, so that the GPU's clock drift (it boosts after the idle host-side set-up of
               each shape) reaches every path alike. */
            static const int off[8] = {0, 5, 4, 1, 0, 0, 0, 7};
            static const char *name[8] = {"us-hop",   "us-hopF",  "us-hop2k", "us-mma",
                                          "us-hop1t", "us-hop1b", "us-hopN",  "us-hopS"};
            const int band[8] = {0, 0, 0, 0, 0, -1, att_band, 0};
            std::vector<double> tf[8], tb[8];
            for (r = 0; r < 23; r++)
                for (path = 0; path < 8; path++) {
                    float ms;
                    if (path == 3 && HS != 64 && HS != 128) continue;
                    if (path == 6 && !att_band) continue;
                    if (path == 7 && HS > 128) continue;
                    us_cuda_attention_no_hopper(&inner, off[path]);
                    us_cuda_attention_grid(&inner, path == 4 ? INT_MAX : 0);
                    us_cuda_attention_band(&inner, band[path]);
                    cudaEventRecord(a, c->stream);
                    inner.attention_fwd(&inner, out, lse, qkv, B, T, NH, NKV, HS, US_BF16);
                    cudaEventRecord(b, c->stream);
                    cudaEventSynchronize(b);
                    cudaEventElapsedTime(&ms, a, b);
                    if (r >= 3) tf[path].push_back(ms * 1e-3);
                    cudaEventRecord(a, c->stream);
                    inner.attention_bwd(&inner, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS,
                                        US_BF16);
                    cudaEventRecord(b, c->stream);
                    cudaEventSynchronize(b);
                    cudaEventElapsedTime(&ms, a, b);
                    us_cuda_attention_grid(&inner, 0);
                    us_cuda_attention_band(&inner, 0);
                    if (r >= 3) tb[path].push_back(ms * 1e-3);
                }
            for (path = 0; path < 8; path++) {
                if (tf[path].empty()) continue;
                printf("%-8s %5d %2d %3d %3d %4d | %9.3f %8.1f", name[path], T, B, NH, NKV, HS,
                       median(tf[path]) * 1e3, fl / median(tf[path]) * 1e-12);
                if (tb[path].empty())
                    printf(" | %9s %8s\n", "-", "-");
                else
                    printf(" | %9.3f %8.1f\n", median(tb[path]) * 1e3,
                           2.5 * fl / median(tb[path]) * 1e-12);
                fflush(stdout);
            }
            us_cuda_attention_no_hopper(&inner, 0);
            inner.free(&inner, qkv);
            inner.free(&inner, out);
            inner.free(&inner, dout);
            inner.free(&inner, dqkv);
            inner.free(&inner, lse);
        }
    if (inner.error(&inner)) printf("CUDA error: %s\n", inner.error(&inner));
}

/* ---- context parallelism: one layer's attention as ring attention does it, on one GPU.
   Every rank's work of one layer (its queries against the K/V blocks of all cp ranks, in ring
   order: cp attn_block_fwd + finish, then cp attn_block_bwd) runs here one rank after the
   other, so "all ranks" is the total work and "slowest rank" the layer's critical path on cp
   GPUs (communication left out: ring attention overlaps it with the blocks). The reference is
   causal flash attention on the whole sequence (cp = 1); every rank's rows of out, dQ and
   dK|dV (summed over the ranks' blocks) must match it: the last column is their relative
   error against it (both sides rounded to the 16-bit type, so ~1e-3 is agreement in bf16, ~1e-4
   in fp16).
   The portable block kernels (one thread per row, the state in global memory) are timed on a
   4× shorter sequence only: at T 4096 one layer would take them minutes. */
static void gather_rows(void *dst, int64_t dld, const void *src, int64_t sld, const int32_t *pos,
                        int B, int T, int Tl, int64_t cols, us_dtype dt) {
    /* dst[b, t, :cols] = src[b, pos[t], :cols] (bf16 or fp16), one copy per run of consecutive
       positions */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl;) {
            int n = 1;
            while (t + n < Tl && pos[t + n] == pos[t] + n) n++;
            inner.copy2d(&inner, (char *)dst + ((int64_t)b * Tl + t) * dld * 2, dld,
                         (const char *)src + ((int64_t)b * T + pos[t]) * sld * 2, sld, n, cols, dt);
            t += n;
        }
}

/* The whole sequence as one block (positions 0..T−1, init, then finish; the backward of that
   block): the block kernels against the causal ones on the same work, so that what the block
   kernels cost beyond them (the fp32 state, the masks by position) shows apart from cp */
static void bench_one_block(us_dtype dt, int B, int T, int NH, int NKV, int HS, const void *qkv,
                            const void *dout, double flop, int hop) {
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KVW = (int64_t)2 * NKV * HS,
                  AO = (int64_t)NH * HS, N = (int64_t)B * T;
    us__cuda *c = (us__cuda *)inner.backend;
    std::vector<int32_t> pos((size_t)T);
    for (int t = 0; t < T; t++) pos[(size_t)t] = t;
    int32_t *dpos = (int32_t *)inner.alloc(&inner, (size_t)T * 4);
    void *kv = inner.alloc(&inner, (size_t)N * KVW * 2),
         *o = inner.alloc(&inner, (size_t)N * AO * 2);
    float *acc = (float *)inner.alloc(&inner, (size_t)N * AO * 4),
          *m = (float *)inner.alloc(&inner, (size_t)N * NH * 4),
          *l = (float *)inner.alloc(&inner, (size_t)N * NH * 4),
          *ls = (float *)inner.alloc(&inner, (size_t)N * NH * 4),
          *dq = (float *)inner.alloc(&inner, (size_t)N * AO * 4),
          *dkv = (float *)inner.alloc(&inner, (size_t)N * KVW * 4);
    inner.copy(&inner, dpos, pos.data(), pos.size() * 4, US_COPY_H2D);
    inner.copy2d(&inner, kv, KVW, (const char *)qkv + AO * 2, QKV, N, KVW, dt);
    cudaEvent_t e[3];
    for (int k = 0; k < 3; k++) CK(cudaEventCreate(&e[k]));
    for (int path = hop ? 0 : 1; path < 2; path++) {
        std::vector<double> f, b;
        us_cuda_attention_no_hopper(&inner, path ? 6 : 0);
        for (int r = 0; r <= 5; r++) {
            float x, y;
            cudaEventRecord(e[0], c->stream);
            inner.attn_block_fwd(&inner, acc, m, l, qkv, kv, dpos, dpos, B, T, T, NH, NKV, HS, 1,
                                 dt);
            inner.attn_block_finish(&inner, o, ls, acc, m, l, B, T, NH, HS, dt);
            cudaEventRecord(e[1], c->stream);
            inner.attn_block_bwd(&inner, dq, dkv, dout, qkv, o, ls, kv, dpos, dpos, B, T, T, NH,
                                 NKV, HS, dt);
            cudaEventRecord(e[2], c->stream);
            cudaEventSynchronize(e[2]);
            cudaEventElapsedTime(&x, e[0], e[1]);
            cudaEventElapsedTime(&y, e[1], e[2]);
            if (r) {
                f.push_back(x);
                b.push_back(y);
            }
        }
        const double tf = median(f), tb = median(b);
        printf("| one block, positions 0..T-1 (= causal), %s blocks | %.3f | %.3f | %.3f | %.0f | "
               "%.3f | - |\n",
               path ? "flash (mma.sync)" : "hopper", tf, tb, tf + tb,
               flop / ((tf + tb) * 1e-3) * 1e-12, tf + tb);
    }
    us_cuda_attention_no_hopper(&inner, 0);
    for (int k = 0; k < 3; k++) cudaEventDestroy(e[k]);
    inner.free(&inner, dpos);
    inner.free(&inner, kv);
    inner.free(&inner, o);
    inner.free(&inner, acc);
    inner.free(&inner, m);
    inner.free(&inner, l);
    inner.free(&inner, ls);
    inner.free(&inner, dq);
    inner.free(&inner, dkv);
}

static void bench_cp_shape(us_dtype dt, int B, int T, int NH, int NKV, int HS, int ring,
                           int naive) {
    const int reps = 5;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KVW = (int64_t)2 * NKV * HS,
                  AO = (int64_t)NH * HS, N = (int64_t)B * T;
    const double flop = 4.0 * B * NH * (double)T * T * HS / 2 *
                        (1 + 2.5); /* causal fwd + bwd (bwd = 2.5 fwd), the useful work */
    us__cuda *c = (us__cuda *)inner.backend;
    auto to_f32 = [&](uint16_t h) { return dt == US_F16 ? us_f16_to_f32(h) : us_bf16_to_f32(h); };
    cudaEvent_t e0, e1;
    void *qkv = inner.alloc(&inner, (size_t)N * QKV * 2),
         *out = inner.alloc(&inner, (size_t)N * AO * 2);
    void *dout = inner.alloc(&inner, (size_t)N * AO * 2),
         *dqkv = inner.alloc(&inner, (size_t)N * QKV * 2);
    float *lse = (float *)inner.alloc(&inner, (size_t)B * NH * T * 4);
    std::vector<uint16_t> h_out((size_t)N * AO), h_dqkv((size_t)N * QKV);
    double tf, tb;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    { /* random q, k, v and dO */
        std::vector<float> h((size_t)N * QKV);
        float *tmp;
        us_rng rg;
        us_rng_seed(&rg, 11);
        for (size_t i = 0; i < h.size(); i++) h[i] = us_rng_normal(&rg);
        CK(cudaMalloc(&tmp, h.size() * 4));
        CK(cudaMemcpy(tmp, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        inner.cast(&inner, qkv, dt, tmp, US_F32, N * QKV);
        inner.cast(&inner, dout, dt, tmp + 7, US_F32, N * AO);
        inner.sync(&inner);
        cudaFree(tmp);
    }
    auto timed = [&](auto fn) {
        float ms;
        cudaEventRecord(e0, c->stream);
        fn();
        cudaEventRecord(e1, c->stream);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        return (double)ms;
    };
    { /* cp = 1: causal flash on the whole sequence */
        std::vector<double> f, b;
        for (int r = 0; r <= reps; r++) {
            double x =
                timed([&] { inner.attention_fwd(&inner, out, lse, qkv, B, T, NH, NKV, HS, dt); });
            double y = timed([&] {
                inner.attention_bwd(&inner, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, dt);
            });
            if (r) {
                f.push_back(x);
                b.push_back(y);
            }
        }
        tf = median(f);
        tb = median(b);
        inner.copy(&inner, h_out.data(), out, h_out.size() * 2, US_COPY_D2H);
        inner.copy(&inner, h_dqkv.data(), dqkv, h_dqkv.size() * 2, US_COPY_D2H);
    }
    printf("\n| one layer's attention, B=%d T=%d NH=%d NKV=%d HS=%d %s | fwd ms | bwd ms | "
           "fwd+bwd ms | TFLOP/s | slowest rank fwd+bwd ms | rel err out / dQ / dK|dV |\n"
           "|---|---|---|---|---|---|---|\n",
           B, T, NH, NKV, HS, us_dtype_name(dt));
    printf(
        "| causal flash, whole sequence (cp=1) | %.3f | %.3f | %.3f | %.0f | %.3f | reference |\n",
        tf, tb, tf + tb, flop / ((tf + tb) * 1e-3) * 1e-12, tf + tb);
    fflush(stdout);
    const int hop = !strcmp(us_cuda_attention_path(&inner, dt, HS, 1), "hopper");
    bench_one_block(dt, B, T, NH, NKV, HS, qkv, dout, flop, hop);
    for (int cp = 2; cp <= 4; cp += 2)
        for (int variant = 0; variant < 5; variant++) {
            /* zig-zag and ring, each on the Hopper block kernels and on the mma.sync ones
               (us_cuda_attention_no_hopper 6), in the same process; zig-zag portable blocks */
            const int zig = variant < 2 || variant == 4, flash = variant != 4,
                      on_hop = variant == 0 || variant == 2, Tl = T / cp, half = Tl / 2,
                      R = flash ? reps + 1 : 1;
            const char *kind = on_hop ? "hopper" : flash ? "flash (mma.sync)" : "portable";
            if ((variant >= 2 && variant <= 3 && !ring) || (variant == 4 && !naive) ||
                (on_hop && !hop))
                continue;
            us_cuda_attention_no_hopper(&inner, on_hop ? 0 : 6);
            const int64_t nl = (int64_t)B * Tl;
            std::vector<int32_t> pos((size_t)cp * Tl);
            std::vector<void *> q(cp), kv(cp), o(cp), dO(cp);
            std::vector<float *> ls(cp), dq(cp), dkv(cp);
            std::vector<std::vector<double>> f(cp), b(cp);
            double err[3] = {0, 0, 0}, all_f = 0, all_b = 0, worst = 0;
            for (int r = 0; r < cp;
                 r++) /* // >>cp's positions: ring, chunk r; zig-zag, chunks r and 2·cp−1−r */
                for (int t = 0; t < Tl; t++)
                    pos[(size_t)r * Tl + t] = !zig       ? r * Tl + t
                                              : t < half ? r * half + t
                                                         : (2 * cp - 1 - r) * half + (t - half);
            int32_t *dpos = (int32_t *)inner.alloc(&inner, pos.size() * 4);
            float *acc = (float *)inner.alloc(&inner, (size_t)nl * AO * 4),
                  *m = (float *)inner.alloc(&inner, (size_t)nl * NH * 4);
            float *l = (float *)inner.alloc(&inner, (size_t)nl * NH * 4);
            inner.copy(&inner, dpos, pos.data(), pos.size() * 4, US_COPY_H2D);
            for (int r = 0; r < cp;
                 r++) { /* rank r's rows of qkv and dO, its K/V block, its outputs */
                q[r] = inner.alloc(&inner, (size_t)nl * QKV * 2);
                kv[r] = inner.alloc(&inner, (size_t)nl * KVW * 2);
                o[r] = inner.alloc(&inner, (size_t)nl * AO * 2);
                dO[r] = inner.alloc(&inner, (size_t)nl * AO * 2);
                ls[r] = (float *)inner.alloc(&inner, (size_t)nl * NH * 4);
                dq[r] = (float *)inner.alloc(&inner, (size_t)nl * AO * 4);
                dkv[r] = (float *)inner.alloc(&inner, (size_t)nl * KVW * 4);
                gather_rows(q[r], QKV, qkv, QKV, &pos[(size_t)r * Tl], B, T, Tl, QKV, dt);
                gather_rows(dO[r], AO, dout, AO, &pos[(size_t)r * Tl], B, T, Tl, AO, dt);
                inner.copy2d(&inner, kv[r], KVW, (char *)q[r] + AO * 2, QKV, nl, KVW, dt);
            }
            for (int rep = 0; rep < R;
                 rep++) { /* flash: the first run warms up (and is the one checked) */
                for (int r = 0; r < cp; r++) {
                    inner.zero(&inner, dq[r], (size_t)nl * AO * 4);
                    inner.zero(&inner, dkv[r], (size_t)nl * KVW * 4);
                }
                for (int r = 0; r < cp; r++) {
                    const int32_t *qp = dpos + (size_t)r * Tl;
                    double x = timed([&] {
                        for (int s = 0; s < cp; s++) {
                            const int src = (r - s + cp) % cp;
                            if (flash)
                                inner.attn_block_fwd(&inner, acc, m, l, q[r], kv[src], qp,
                                                     dpos + (size_t)src * Tl, B, Tl, Tl, NH, NKV,
                                                     HS, s == 0, dt);
                            else
                                us__attn_block_fwd_naive(&inner, acc, m, l, q[r], kv[src], qp,
                                                         dpos + (size_t)src * Tl, B, Tl, Tl, NH,
                                                         NKV, HS, s == 0, dt);
                        }
                        inner.attn_block_finish(&inner, o[r], ls[r], acc, m, l, B, Tl, NH, HS, dt);
                    });
                    double y = timed([&] {
                        for (int s = 0; s < cp; s++) {
                            const int src = (r - s + cp) % cp;
                            if (flash)
                                inner.attn_block_bwd(&inner, dq[r], dkv[src], dO[r], q[r], o[r],
                                                     ls[r], kv[src], qp, dpos + (size_t)src * Tl, B,
                                                     Tl, Tl, NH, NKV, HS, dt);
                            else
                                us__attn_block_bwd_naive(
                                    &inner, dq[r], dkv[src], dO[r], q[r], o[r], ls[r], kv[src], qp,
                                    dpos + (size_t)src * Tl, B, Tl, Tl, NH, NKV, HS, dt);
                        }
                    });
                    if (rep > 0 || !flash) {
                        f[r].push_back(x);
                        b[r].push_back(y);
                    }
                }
                if (rep == 0) { /* every rank's rows against the whole-sequence reference */
                    std::vector<uint16_t> ho((size_t)nl * AO);
                    std::vector<float> hq((size_t)nl * AO), hk((size_t)nl * KVW);
                    double nd[3][2] = {{0, 0}, {0, 0}, {0, 0}};
                    for (int r = 0; r < cp; r++) {
                        inner.copy(&inner, ho.data(), o[r], ho.size() * 2, US_COPY_D2H);
                        inner.copy(&inner, hq.data(), dq[r], hq.size() * 4, US_COPY_D2H);
                        inner.copy(&inner, hk.data(), dkv[r], hk.size() * 4, US_COPY_D2H);
                        for (int bb = 0; bb < B; bb++)
                            for (int t = 0; t < Tl; t++) {
                                const int64_t lr = (int64_t)bb * Tl + t,
                                              gr = (int64_t)bb * T + pos[(size_t)r * Tl + t];
                                for (int64_t j = 0; j < AO; j++) {
                                    double ref = to_f32(h_out[gr * AO + j]),
                                           got = to_f32(ho[lr * AO + j]);
                                    nd[0][0] += (got - ref) * (got - ref);
                                    nd[0][1] += ref * ref;
                                    ref = to_f32(h_dqkv[gr * QKV + j]);
                                    got = hq[lr * AO + j];
                                    nd[1][0] += (got - ref) * (got - ref);
                                    nd[1][1] += ref * ref;
                                }
                                for (int64_t j = 0; j < KVW; j++) {
                                    double ref = to_f32(h_dqkv[gr * QKV + AO + j]),
                                           got = hk[lr * KVW + j];
                                    nd[2][0] += (got - ref) * (got - ref);
                                    nd[2][1] += ref * ref;
                                }
                            }
                    }
                    for (int k = 0; k < 3; k++)
                        err[k] = sqrt(nd[k][0] / (nd[k][1] > 0 ? nd[k][1] : 1));
                }
            }
            for (int r = 0; r < cp; r++) {
                double x = median(f[r]), y = median(b[r]);
                all_f += x;
                all_b += y;
                worst = std::max(worst, x + y);
            }
            printf("| cp=%d %s, %s blocks, all ranks | %.3f | %.3f | %.3f | %.0f | %.3f | %.1e / "
                   "%.1e / %.1e |\n",
                   cp, zig ? "zig-zag" : "ring", kind, all_f, all_b, all_f + all_b,
                   flop / ((all_f + all_b) * 1e-3) * 1e-12, worst, err[0], err[1], err[2]);
            fflush(stdout);
            for (int r = 0; r < cp; r++) {
                inner.free(&inner, q[r]);
                inner.free(&inner, kv[r]);
                inner.free(&inner, o[r]);
                inner.free(&inner, dO[r]);
                inner.free(&inner, ls[r]);
                inner.free(&inner, dq[r]);
                inner.free(&inner, dkv[r]);
            }
            us_cuda_attention_no_hopper(&inner, 0);
            inner.free(&inner, dpos);
            inner.free(&inner, acc);
            inner.free(&inner, m);
            inner.free(&inner, l);
        }
    if (inner.error(&inner)) printf("CUDA error: %s\n", inner.error(&inner));
    inner.free(&inner, qkv);
    inner.free(&inner, out);
    inner.free(&inner, dout);
    inner.free(&inner, dqkv);
    inner.free(&inner, lse);
}

/* --cp-seq: the long sequences context parallelism is for, B·T = max(T, 16384) tokens: HS 128
   (NH 16, NKV 8) and the 1B heads (NH 32, NKV 8, HS 64), bf16 */
static int cp_T[8], cp_nT = 0;
static int cp_shapes[8][3] = {{16, 8, 128}, {32, 8, 64}}, cp_ns = 2; /* NH, NKV, HS */

/* every --cp-heads shape one the block kernels take: NKV divides NH, HS of us__fa_block_heads */
static int cp_heads_ok(void) {
    for (int sh = 0; sh < cp_ns; sh++) {
        const int NH = cp_shapes[sh][0], NKV = cp_shapes[sh][1], HS = cp_shapes[sh][2];
        if (NH % NKV || !us__fa_block_heads(HS, [](auto) {})) return 0;
    }
    return 1;
}

static void bench_cp_seq(void) {
    for (int k = 0; k < cp_nT; k++) {
        const int T = cp_T[k], B = T >= 16384 ? 1 : 16384 / T;
        for (int sh = 0; sh < cp_ns; sh++)
            bench_cp_shape(US_BF16, B, T, cp_shapes[sh][0], cp_shapes[sh][1], cp_shapes[sh][2], 1,
                           0);
    }
}

static void bench_cp(int naive) {
    printf("\nRing attention's work for one layer on one GPU. all ranks: every rank's blocks one "
           "rank after the other (the total\n"
           "work; TFLOP/s counts the causal FLOPs, 3.5 x 4·B·NH·T²·HS/2); slowest rank: the "
           "layer's critical path on cp GPUs.\n");
    bench_cp_shape(US_BF16, 4, 4096, 16, 8, 128, 1, 0);  /* HS 128, GQA 2 */
    bench_cp_shape(US_BF16, 4, 4096, 16, 16, 128, 0, 0); /* no GQA */
    bench_cp_shape(US_BF16, 4, 4096, 32, 8, 64, 1, 0);   /* HS 64, GQA 4 (the Llama-3.2-1B heads) */
    /* fp16, and the other head sizes: HS 80 (Phi-2's), 96 (Phi-3-mini's), 192, and 256
       (Gemma-7B's; its dK/dV kernel runs twice, dV then dK) */
    bench_cp_shape(US_F16, 4, 4096, 16, 8, 128, 0, 0);
    bench_cp_shape(US_F16, 4, 4096, 32, 8, 80, 1, 0);
    bench_cp_shape(US_BF16, 4, 4096, 32, 32, 96, 0, 0);
    bench_cp_shape(US_BF16, 4, 4096, 16, 8, 192, 0, 0);
    bench_cp_shape(US_BF16, 4, 4096, 16, 16, 256, 0, 0);
    if (naive) {
        bench_cp_shape(US_BF16, 4, 1024, 16, 8, 128, 0, 1);
        bench_cp_shape(US_F16, 4, 1024, 32, 8, 80, 0, 1);
    }
}

int main(int argc, char **argv) {
    char err[256];
    const char *preset = NULL, *json = NULL;
    int steps = 10, warm = 3, profile = 0, do_gemm = 0, do_att = 0, do_cp = 0, do_fp8 = 0,
        do_swb = 0, do_algos = 0, do_gg = 0, do_sus = 0, i;
    us_recompute rc = US_RECOMPUTE_NONE;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warm = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--recompute") && i + 1 < argc) {
            i++;
            rc = !strcmp(argv[i], "full")        ? US_RECOMPUTE_FULL
                 : !strcmp(argv[i], "selective") ? US_RECOMPUTE_SELECTIVE
                                                 : US_RECOMPUTE_NONE;
        } else if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else if (!strcmp(argv[i], "--gemm"))
            do_gemm = 1;
        else if (!strcmp(argv[i], "--fp8-gemm"))
            do_fp8 = 1;
        else if (!strcmp(argv[i], "--swiglu-bwd-fp8"))
            do_swb = 1;
        else if (!strcmp(argv[i], "--grouped"))
            do_gg = 1;
        else if (!strcmp(argv[i], "--grouped-kernel"))
            gg_kernel = US_CUDA_GG_MMA_SYNC;
        else if (!strcmp(argv[i], "--grouped-wgmma"))
            gg_kernel = US_CUDA_GG_WGMMA;
        else if (!strcmp(argv[i], "--grouped-loop"))
            gg_kernel = US_CUDA_GG_LOOP;
        else if (!strcmp(argv[i], "--fp8-free-quant"))
            free_q = Q_FREE;
        else if (!strcmp(argv[i], "--fp8-stale-quant"))
            free_q = Q_STALE;
        else if (!strcmp(argv[i], "--fp8-no-weight-cache"))
            bench_nowc = 1;
        else if (!strcmp(argv[i], "--fp8-experts"))
            bench_fp8_experts = 1;
        else if (!strcmp(argv[i], "--fp8-no-fuse"))
            no_fuse = 1;
        else if (!strcmp(argv[i], "--att-mode") && i + 1 < argc) {
            att_mode = atoi(argv[++i]);
            if (att_mode < 0 || att_mode > 7) {
                fprintf(stderr, "bench_cuda: --att-mode must be 0 to 7\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--accum") && i + 1 < argc) {
            bench_accum = atoi(argv[++i]);
            if (bench_accum < 1) {
                fprintf(stderr, "bench_cuda: --accum must be at least 1\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--loss-chunk") && i + 1 < argc)
            bench_loss_chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gemm-algos"))
            do_algos = 1;
        else if (!strcmp(argv[i], "--gemm-sustained"))
            do_sus = 1;
        else if (!strcmp(argv[i], "--gemm-tune"))
            bench_tune = 1;
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            i++;
            if (!strcmp(argv[i], "bf16"))
                bench_prec = US_PRECISION_BF16;
            else if (!strcmp(argv[i], "fp8"))
                bench_prec = US_PRECISION_FP8;
            else if (!strcmp(argv[i], "fp8-tensor"))
                bench_prec = US_PRECISION_FP8_TENSOR;
            else {
                fprintf(stderr, "bench_cuda: --precision must be bf16, fp8 or fp8-tensor, got %s\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--attention"))
            do_att = 1;
        else if (!strcmp(argv[i], "--att-seq") && i + 1 < argc) {
            if (!parse_att_list(argv[++i], 1, att_T, &att_nT)) {
                fprintf(stderr, "bench_cuda: --att-seq wants T,T,... (at most 8), got %s\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--att-band") && i + 1 < argc) {
            char *e;
            long v = strtol(argv[++i], &e, 10);
            if (e == argv[i] || *e || v <= 0 || v > 1 << 20) {
                fprintf(stderr,
                        "bench_cuda: --att-band wants a number of pairs, 1 or more, got %s\n",
                        argv[i]);
                return 2;
            }
            att_band = (int)v;
        } else if (!strcmp(argv[i], "--att-heads") && i + 1 < argc) {
            if (!parse_att_list(argv[++i], 3, &att_shapes[0][0], &att_ns)) {
                fprintf(stderr, "bench_cuda: --att-heads wants NH:NKV:HS,... (at most 8), got %s\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--cp"))
            do_cp = 2;
        else if (!strcmp(argv[i], "--cp-flash-only"))
            do_cp = 1;
        else if (!strcmp(argv[i], "--cp-seq") && i + 1 < argc) {
            if (!parse_att_list(argv[++i], 1, cp_T, &cp_nT)) {
                fprintf(stderr, "bench_cuda: --cp-seq wants T,T,... (at most 8), got %s\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--cp-heads") && i + 1 < argc) {
            if (!parse_att_list(argv[++i], 3, &cp_shapes[0][0], &cp_ns) || !cp_heads_ok()) {
                fprintf(
                    stderr,
                    "bench_cuda: --cp-heads wants NH:NKV:HS,... (at most 8; NKV dividing NH; HS "
                    "64, 80, 96, 128, 192 or 256), got %s\n",
                    argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr,
                    "usage: bench_cuda [--preset 1b|8b8|200m|moe [--steps N] [--warmup N] "
                    "[--recompute M] [--accum K] [--loss-chunk ROWS|-1] [--precision "
                    "bf16|fp8|fp8-tensor [--fp8-free-quant] [--fp8-no-weight-cache] "
                    "[--fp8-experts] [--fp8-no-fuse]] [--att-mode M] [--profile] [--gemm-tune] "
                    "[--grouped-kernel|--grouped-wgmma|--grouped-loop] [--json F]] [--gemm] "
                    "[--fp8-gemm] [--swiglu-bwd-fp8] [--grouped] [--gemm-algos] [--gemm-sustained] "
                    "[--attention [--att-seq T,..] [--att-heads NH:NKV:HS,..] [--att-band N]] "
                    "[--cp | --cp-flash-only] [--cp-seq T,.. [--cp-heads NH:NKV:HS,..]]\n");
            return 2;
        }
    }
    if (free_q && bench_prec != US_PRECISION_FP8 && bench_prec != US_PRECISION_FP8_TENSOR) {
        fprintf(stderr,
                "bench_cuda: --fp8-free-quant and --fp8-stale-quant need --precision fp8 or "
                "fp8-tensor\n");
        return 2;
    }
    if (bench_tune && warm < 2) {
        fprintf(stderr, "bench_cuda: --gemm-tune times the GEMMs in the warm-up steps: it needs "
                        "--warmup 2 or more\n");
        return 2;
    }
    if (free_q && warm < 1) {
        fprintf(stderr, "bench_cuda: --fp8-free-quant and --fp8-stale-quant need at least one "
                        "warm-up step (it leaves the operands the timed steps read)\n");
        return 2;
    }
    if (us_cuda_ops(&inner, 0, err, sizeof err) != US_OK) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        return 1;
    }
    us_cuda_grouped_kernel(&inner, gg_kernel);
    us_cuda_attention_no_hopper(&inner, att_mode);
    if (preset && bench_train(preset, steps, warm, rc, profile, json)) return 1;
    if (do_gemm) bench_gemm();
    if (do_fp8) bench_fp8_gemm();
    if (do_fp8 || do_swb) bench_swiglu_bwd_fp8();
    if (do_gg) bench_grouped();
    if (do_algos) bench_gemm_algos();
    if (do_sus) bench_gemm_sustained();
    if (do_att) bench_attention();
    if (do_cp) bench_cp(do_cp == 2);
    if (cp_nT) bench_cp_seq();
    us_cuda_ops_free(&inner);
    return 0;
}
