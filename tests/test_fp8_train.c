/* test_fp8_train.c — FP8 training (// >>fp8-linear, the fp8 ops of // >>fp8): the fast E4M3
   rounding equals the reference us_f32_to_e4m3 on every bf16 pattern and on random fp32 bits;
   the CPU ops fp8_quantize / fp8_gemm equal the host functions us_fp8_quantize / us_fp8_gemm bit
   for bit on operands transposed by the test itself (every tiling, trans, pow2, partial tiles,
   bf16 and fp32 inputs, beta and bf16 output); an FP8 linear layer's Fprop, Dgrad and Wgrad
   against the exact (fp64) products of the same bf16 inputs, within stated bounds, and tile vs
   per-tensor scaling on activations with outlier channels; bf16, fp8 and fp8-tensor training of
   a small model on the sorting task (loss falls well below the start, fp8 within a stated gap of
   bf16); dy and the weights quantised both ways in one call (fp8_quantize_both, one rank and
   tp 2 + sp), the weight cache, the activations' 1×128 operands written by the RMSNorm and
   SwiGLU before them (rmsnorm_fwd_fp8, swiglu_fwd_fp8; recompute none and full) and dgu's two
   operands written by SwiGLU's backward (swiglu_bwd_fp8; also tp 2 + sp) train bit for bit like
   the plain path; the memory estimator
   counts the FP8 scratch and the cache; bad configurations. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include "us_test.h"
#include "us_test_ranks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double gauss(void) {
    double u = rnd01(), v = rnd01();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------------ the fast rounding */
static void test_fast_e4m3(void) {
    int64_t i, bad = 0;
    uint32_t u;
    float special[] = {0.0f,     -0.0f,    448.0f,   463.99997f,      464.0f,    464.00003f,
                       1e30f,    -1e30f,   INFINITY, -INFINITY,       NAN,       0x1p-6f,
                       0x1p-7f,  0x1p-9f,  0x1p-10f, 0x1.000002p-10f, 0x1.8p-9f, 0x1.fffffep-7f,
                       0x1.1p0f, 0x1.3p0f, 0x1.5p-3f};
    for (i = 0; i < 65536; i++) { /* every bf16 value: all exponents, the upper mantissa bits */
        float f = bitsf((uint32_t)i << 16);
        bad += us__e4m3_fast(f) != us_f32_to_e4m3(f);
    }
    CHECK(bad == 0, "fast E4M3 rounding = us_f32_to_e4m3 on all 65536 bf16 patterns (%lld differ)",
          (long long)bad);
    bad = 0;
    for (
        i = 0; i < 2000000;
        i++) { /* random fp32 bits, and random values in E4M3's range (ties included by luck of the low bits) */
        u = (uint32_t)rnd64();
        if (i & 1) u = fbits((float)((rnd01() - 0.5) * 1000.0 * pow(2.0, -(double)(rnd64() % 20))));
        bad += us__e4m3_fast(bitsf(u)) != us_f32_to_e4m3(bitsf(u));
    }
    CHECK(bad == 0,
          "fast E4M3 rounding = us_f32_to_e4m3 on 2,000,000 random fp32 values (%lld differ)",
          (long long)bad);
    bad = 0;
    for (i = 0; i < (int64_t)(sizeof special / sizeof special[0]); i++)
        bad += us__e4m3_fast(special[i]) != us_f32_to_e4m3(special[i]);
    CHECK(bad == 0,
          "fast E4M3 rounding = us_f32_to_e4m3 on ties, subnormal edges, 448/464, inf, NaN (%lld "
          "differ)",
          (long long)bad);
}

/* ------------------------------------------------------------------ ops vs host functions */
static void fill(void *x, us_dtype dt, int64_t n, double outlier) {
    int64_t i;
    for (i = 0; i < n; i++) {
        float v = (float)(gauss() * (i % 37 == 3 ? outlier : 1.0));
        if (dt == US_F32)
            ((float *)x)[i] = v;
        else
            ((uint16_t *)x)[i] = us_f32_to_bf16(v);
    }
}

static void test_ops_equal_host(void) {
    us_ops o = us_cpu_ops(2);
    int64_t shapes[][2] = {{256, 384}, {200, 300}, {48, 1136}, {130, 64}, {1, 129}};
    int si, t, trans, pow2, d;
    us_fp8_tiling tilings[3] = {US_FP8_ROW128, US_FP8_BLOCK128, US_FP8_TENSOR};
    for (si = 0; si < 5; si++)
        for (d = 0; d < 2; d++) {
            us_dtype dt = d ? US_BF16 : US_F32;
            int64_t M = shapes[si][0], K = shapes[si][1], es = (int64_t)us_dtype_size(dt);
            char *x = (char *)malloc((size_t)(M * K * es)),
                 *xt = (char *)malloc((size_t)(M * K * es));
            int64_t i, j;
            fill(x, dt, M * K, 20.0);
            for (i = 0; i < M; i++)
                for (j = 0; j < K; j++)
                    memcpy(xt + (j * M + i) * es, x + (i * K + j) * es, (size_t)es);
            for (t = 0; t < 3; t++)
                for (trans = 0; trans < 2; trans++)
                    for (pow2 = 0; pow2 < 2; pow2++) {
                        int64_t R = trans ? K : M, L = trans ? M : K, Lp = (L + 127) / 128 * 128,
                                ns = us_fp8_scales_size(tilings[t], R, L);
                        uint8_t *q = (uint8_t *)malloc((size_t)(R * Lp)),
                                *qr = (uint8_t *)malloc((size_t)(R * L));
                        float *s = (float *)malloc((size_t)ns * 4),
                              *sr = (float *)malloc((size_t)ns * 4);
                        int okq = 1, oks, okpad = 1;
                        memset(q, 0xAB, (size_t)(R * Lp));
                        o.fp8_quantize(&o, q, s, x, dt, M, K, tilings[t], trans, pow2);
                        us_fp8_quantize(qr, sr, trans ? xt : x, dt, R, L, tilings[t], pow2, NULL,
                                        0);
                        for (i = 0; i < R; i++) {
                            okq &= !memcmp(q + i * Lp, qr + i * L, (size_t)L);
                            for (j = L; j < Lp; j++) okpad &= q[i * Lp + j] == 0;
                        }
                        oks = !memcmp(s, sr, (size_t)ns * 4);
                        CHECK(okq && oks && okpad,
                              "fp8_quantize op %s %s %lldx%lld trans=%d pow2=%d = us_fp8_quantize "
                              "of the %s (bytes %d, scales %d, zero padding %d)",
                              us_dtype_name(dt),
                              tilings[t] == US_FP8_ROW128     ? "row128"
                              : tilings[t] == US_FP8_BLOCK128 ? "block128"
                                                              : "tensor",
                              (long long)M, (long long)K, trans, pow2,
                              trans ? "transpose" : "input", okq, oks, okpad);
                        if (trans &&
                            tilings[t] ==
                                US_FP8_ROW128) { /* the backward's second quantisation: COL128 of x */
                            float *sc = (float *)malloc(
                                (size_t)us_fp8_scales_size(US_FP8_COL128, M, K) * 4);
                            uint8_t *qc = (uint8_t *)malloc((size_t)(M * K));
                            us_fp8_quantize(qc, sc, x, dt, M, K, US_FP8_COL128, pow2, NULL, 0);
                            CHECK(!memcmp(qc, qr, (size_t)(M * K)) &&
                                      !memcmp(sc, s, (size_t)ns * 4),
                                  "row128 of the transpose = col128 (128x1 tiles) of x, bytes and "
                                  "scales (%lldx%lld %s)",
                                  (long long)M, (long long)K, us_dtype_name(dt));
                            free(sc);
                            free(qc);
                        }
                        free(q);
                        free(qr);
                        free(s);
                        free(sr);
                    }
            free(x);
            free(xt);
        }
    { /* fp8_gemm: beta 0 fp32 = us_fp8_gemm; beta 1 into bf16 and fp32 = alpha·c + beta·C rounded once */
        int64_t M = 144, N = 80, K = 200, Kp = 256, i, j;
        int pair;
        for (pair = 0; pair < 3; pair++) {
            us_fp8_tiling ta = pair == 2 ? US_FP8_TENSOR : US_FP8_ROW128,
                          tb = pair == 0   ? US_FP8_BLOCK128
                               : pair == 1 ? US_FP8_ROW128
                                           : US_FP8_TENSOR;
            float *a = (float *)malloc((size_t)(M * K) * 4),
                  *b = (float *)malloc((size_t)(N * K) * 4);
            float *sa = (float *)malloc((size_t)us_fp8_scales_size(ta, M, K) * 4),
                  *sb = (float *)malloc((size_t)us_fp8_scales_size(tb, N, K) * 4);
            uint8_t *qa = (uint8_t *)malloc((size_t)(M * Kp)),
                    *qb = (uint8_t *)malloc((size_t)(N * Kp));
            uint8_t *ra = (uint8_t *)malloc((size_t)(M * K)),
                    *rb = (uint8_t *)malloc((size_t)(N * K));
            float *c = (float *)malloc((size_t)(M * N) * 4),
                  *ref = (float *)malloc((size_t)(M * N) * 4),
                  *c0 = (float *)malloc((size_t)(M * N) * 4);
            uint16_t *cb = (uint16_t *)malloc((size_t)(M * N) * 2),
                     *cb0 = (uint16_t *)malloc((size_t)(M * N) * 2);
            int ok0, ok1 = 1, ok2 = 1;
            fill(a, US_F32, M * K, 30.0);
            fill(b, US_F32, N * K, 1.0);
            o.fp8_quantize(&o, qa, sa, a, US_F32, M, K, ta, 0, 0);
            o.fp8_quantize(&o, qb, sb, b, US_F32, N, K, tb, 0, 0);
            for (i = 0; i < M; i++) memcpy(ra + i * K, qa + i * Kp, (size_t)K);
            for (i = 0; i < N; i++) memcpy(rb + i * K, qb + i * Kp, (size_t)K);
            us_fp8_gemm(ref, ra, sa, ta, rb, sb, tb, M, N, K, NULL, 0);
            o.fp8_gemm(&o, M, N, K, 1.0f, qa, sa, ta, qb, sb, tb, 0.0f, c, US_F32, N);
            ok0 = !memcmp(c, ref, (size_t)(M * N) * 4);
            fill(c0, US_F32, M * N, 1.0);
            memcpy(c, c0, (size_t)(M * N) * 4);
            fill(cb0, US_BF16, M * N, 1.0);
            memcpy(cb, cb0, (size_t)(M * N) * 2);
            o.fp8_gemm(&o, M, N, K, 0.5f, qa, sa, ta, qb, sb, tb, 1.0f, c, US_F32, N);
            o.fp8_gemm(&o, M, N, K, 1.0f, qa, sa, ta, qb, sb, tb, 1.0f, cb, US_BF16, N);
            for (i = 0; i < M; i++)
                for (j = 0; j < N; j++) {
                    ok1 &= fbits(c[i * N + j]) == fbits(0.5f * ref[i * N + j] + c0[i * N + j]);
                    ok2 &= cb[i * N + j] ==
                           us_f32_to_bf16(ref[i * N + j] + us_bf16_to_f32(cb0[i * N + j]));
                }
            CHECK(ok0 && ok1 && ok2,
                  "fp8_gemm op (a %s, b %s, K=200 padded to 256) = us_fp8_gemm bit for bit (beta "
                  "0: %d; alpha 0.5, beta 1 fp32: %d; beta 1 into bf16: %d)",
                  ta == US_FP8_ROW128 ? "row128" : "tensor",
                  tb == US_FP8_BLOCK128 ? "block128"
                  : tb == US_FP8_ROW128 ? "row128"
                                        : "tensor",
                  ok0, ok1, ok2);
            free(a);
            free(b);
            free(sa);
            free(sb);
            free(qa);
            free(qb);
            free(ra);
            free(rb);
            free(c);
            free(ref);
            free(c0);
            free(cb);
            free(cb0);
        }
    }
}

/* ------------------------------------------------------------------ one linear layer */
/* a model holding only what the // >>fp8-linear functions read */
static void fake_model(us_model *m, us_ops *o, int fp8, int64_t N, int64_t In, int64_t Out) {
    size_t off[5], bytes;
    memset(m, 0, sizeof *m);
    m->ops = *o;
    m->fp8 = fp8;
    m->dt = US_BF16;
    m->tc.fp8_min_dim =
        16; /* FP8 at these small sizes too (the default rule would keep them bf16) */
    bytes = us__fp8_scratch(N, In, Out, In, Out > In ? Out : In, 0, 0, 16,
                            off); /* covers (In, Out) and (Out, In) */
    memcpy(m->fp8_off, off, sizeof off);
    m->a[US__A_FP8] = calloc(bytes, 1);
}

/* ‖got − ref‖ / ‖ref‖ */
static double rel_err_bf16(const uint16_t *got, const double *ref, int64_t n) {
    double e = 0, r = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double d = us_bf16_to_f32(got[i]) - ref[i];
        e += d * d;
        r += ref[i] * ref[i];
    }
    return sqrt(e / r);
}

static double rel_err_f32(const float *got, const double *ref, int64_t n) {
    double e = 0, r = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        e += d * d;
        r += ref[i] * ref[i];
    }
    return sqrt(e / r);
}

/* Fprop, Dgrad, Wgrad of y = x·Wᵀ (x [N][In], W [Out][In]) in policy fp8 (1 tile, 2 tensor) or
   bf16 (0); errors against the fp64 products of the same bf16 inputs in err[3] */
static void linear_errors(int fp8, int64_t N, int64_t In, int64_t Out, double outlier,
                          double err[4]) {
    us_ops o = us_cpu_ops(2);
    us_model m;
    uint16_t *x = (uint16_t *)malloc((size_t)(N * In) * 2),
             *w = (uint16_t *)malloc((size_t)(Out * In) * 2),
             *dy = (uint16_t *)malloc((size_t)(N * Out) * 2);
    uint16_t *y = (uint16_t *)calloc((size_t)(N * Out), 2),
             *dx = (uint16_t *)calloc((size_t)(N * In), 2);
    float *dw = (float *)calloc((size_t)(Out * In), 4);
    double *ry = (double *)calloc((size_t)(N * Out), 8),
           *rdx = (double *)calloc((size_t)(N * In), 8),
           *rdw = (double *)calloc((size_t)(Out * In), 8);
    int64_t n, i, j;
    for (n = 0; n < N; n++)
        for (i = 0; i < In; i++)
            x[n * In + i] = us_f32_to_bf16((float)(gauss() * (i % 61 == 5 ? outlier : 1.0)));
    fill(w, US_BF16, Out * In, 1.0);
    for (j = 0; j < Out * In; j++) w[j] = us_f32_to_bf16(0.05f * us_bf16_to_f32(w[j]));
    fill(dy, US_BF16, N * Out, 1.0);
    for (n = 0; n < N; n++)
        for (j = 0; j < Out; j++) {
            double s = 0;
            for (i = 0; i < In; i++)
                s += (double)us_bf16_to_f32(x[n * In + i]) * us_bf16_to_f32(w[j * In + i]);
            ry[n * Out + j] = s;
            for (i = 0; i < In; i++)
                rdx[n * In + i] +=
                    (double)us_bf16_to_f32(dy[n * Out + j]) * us_bf16_to_f32(w[j * In + i]);
            for (i = 0; i < In; i++)
                rdw[j * In + i] +=
                    (double)us_bf16_to_f32(dy[n * Out + j]) * us_bf16_to_f32(x[n * In + i]);
        }
    fake_model(&m, &o, fp8, N, In, Out);
    us__linear_fwd(&m, N, In, Out, x, w, 0.0f, y);
    us__linear_dgrad(&m, N, In, Out, dy, w, 0.0f, dx, 1);
    us__linear_wgrad(&m, N, In, Out, dy, x, NULL, dw);
    err[0] = rel_err_bf16(y, ry, N * Out);
    err[1] = rel_err_bf16(dx, rdx, N * In);
    err[2] = rel_err_f32(dw, rdw, Out * In);
    { /* Wgrad on the ordinary input features only (outliers sit at i % 61 == 5) */
        double e = 0, r = 0;
        for (j = 0; j < Out; j++)
            for (i = 0; i < In; i++)
                if (i % 61 != 5) {
                    double d = dw[j * In + i] - rdw[j * In + i];
                    e += d * d;
                    r += rdw[j * In + i] * rdw[j * In + i];
                }
        err[3] = sqrt(e / r);
    }
    free(m.a[US__A_FP8]);
    free(x);
    free(w);
    free(dy);
    free(y);
    free(dx);
    free(dw);
    free(ry);
    free(rdx);
    free(rdw);
}

static void test_linear(void) {
    double e16[4], e8[4], et[4], o8[4], ot[4];
    const char *g[3] = {"Fprop", "Dgrad", "Wgrad"};
    int k;
    /* 256 tokens, 192 → 320: partial tiles on both feature sizes (192 = 128 + 64, 320 = 2·128 + 64) */
    linear_errors(0, 256, 192, 320, 1.0, e16);
    linear_errors(1, 256, 192, 320, 1.0, e8);
    linear_errors(2, 256, 192, 320, 1.0, et);
    for (k = 0; k < 3; k++) {
        /* E4M3 rounds each operand to within 2^-4 relative (half an ulp of 3 mantissa bits); over a
           random-sign sum the output's relative error is about 2^-4·sqrt(2/3) ≈ 0.05 at most, and
           bf16's (2^-8 on the output) is about 16 times smaller */
        CHECK(e8[k] < 0.06 && e8[k] > e16[k],
              "%s fp8 (tiles) vs exact: rel err %.4f < 0.06 (bf16: %.4f)", g[k], e8[k], e16[k]);
        CHECK(et[k] < 0.06, "%s fp8-tensor vs exact, no outliers: rel err %.4f < 0.06", g[k],
              et[k]);
        CHECK(e16[k] < 0.006, "%s bf16 vs exact: rel err %.4f < 0.006", g[k], e16[k]);
    }
    /* activations with outlier channels (×10^5 on every 61st input feature, as LLM activations
       grow them): one scale for x pushes the ordinary channels (~1, now ~10^-3 after scaling)
       into E4M3's subnormals, where 2^-9 steps leave them one or two bits; Wgrad's 128×1 tiles
       of x (one feature, 128 tokens) keep an outlier feature to its own tiles. Measured on the
       ordinary features' weight gradients. (Fprop's 1×128 tiles run along the features, so every
       tile here holds an outlier: the tile recipe does not rescue Fprop from this pattern.) */
    linear_errors(1, 256, 192, 320, 1e5, o8);
    linear_errors(2, 256, 192, 320, 1e5, ot);
    printf("  outlier channels x1e5, rel err tile / tensor: Fprop %.4f / %.4f, Wgrad of the "
           "ordinary features %.4f / %.4f\n",
           o8[0], ot[0], o8[3], ot[3]);
    CHECK(o8[3] < 0.06 && ot[3] > 4 * o8[3],
          "Wgrad of ordinary features beside outlier channels: tiles %.4f < 0.06, per-tensor %.4f "
          "more than 4 times worse",
          o8[3], ot[3]);
}

/* ------------------------------------------------------------------ training */
/* the CPU ops, counting their quantisations (the dual path's check below) */
/* The models here are far below the size where FP8 pays (US_FP8_MIN_DIM): they ask for FP8 at
   every size, so that the FP8 paths are the ones under test */
static int every_size(us_precision p) {
    return p == US_PRECISION_FP8 || p == US_PRECISION_FP8_TENSOR ? 16 : 0;
}

static us_ops g_cpu;
static long g_nq, g_nboth;

static void count_q(us_ops *o, uint8_t *q, float *s, const void *x, us_dtype dt, int64_t M,
                    int64_t K, int t, int trans, int pow2) {
    __atomic_add_fetch(&g_nq, 1, __ATOMIC_RELAXED); /* (ranks may be threads) */
    g_cpu.fp8_quantize(o, q, s, x, dt, M, K, t, trans, pow2);
}

static void count_both(us_ops *o, uint8_t *q, float *s, uint8_t *qt, float *st, const void *x,
                       us_dtype dt, int64_t M, int64_t K, int t, int pow2) {
    __atomic_add_fetch(&g_nboth, 1, __ATOMIC_RELAXED);
    g_cpu.fp8_quantize_both(o, q, s, qt, st, x, dt, M, K, t, pow2);
}

/* steps of the sorting task; losses[] (if not NULL) gets every step's loss; ops NULL: the CPU's;
   min_dim: tc.fp8_min_dim, or -1 for every size under fp8 */
static float train_min(us_precision prec, int pow2, int steps, float *first, int *fp8_on,
                       int *fp8_all, const us_ops *ops, float *losses, int min_dim) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_task task;
    us_step_stats st;
    int32_t *in, *tgt;
    int s;
    float last = NAN;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.n_layers = 2;
    mc.dim = 48;
    mc.n_heads = 4; /* F = 128, QKV = 144 */
    tc.batch = 8;
    tc.seq = 32;
    tc.steps = steps;
    tc.lr = 1e-2f;
    tc.warmup = 10; /* N = 256 */
    tc.precision = prec;
    tc.fp8_pow2 = pow2;
    tc.threads = 1;
    tc.fp8_min_dim = min_dim < 0 ? every_size(prec) : min_dim;
    if (us_model_init(&m, &mc, &tc, ops) != US_OK) {
        printf("  init: %s\n", us_model_error(&m));
        return NAN;
    }
    *fp8_on = m.fp8_linear;
    *fp8_all = m.fp8_linear_all;
    us_task_init(&task, 1);
    in = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    tgt = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    for (s = 0; s < steps; s++) {
        us_task_batch(&task, tc.batch, tc.seq, in, tgt);
        if (us_train_step(&m, in, tgt, &st) != US_OK) {
            printf("  step: %s\n", us_model_error(&m));
            break;
        }
        if (s == 0) *first = st.loss;
        if (losses) losses[s] = st.loss;
        last = st.loss;
    }
    free(in);
    free(tgt);
    us_model_free(&m);
    return last;
}

static float train_ops(us_precision prec, int pow2, int steps, float *first, int *fp8_on,
                       int *fp8_all, const us_ops *ops, float *losses) {
    return train_min(prec, pow2, steps, first, fp8_on, fp8_all, ops, losses, -1);
}

static float train(us_precision prec, int pow2, int steps, float *first, int *fp8_on,
                   int *fp8_all) {
    return train_ops(prec, pow2, steps, first, fp8_on, fp8_all, NULL, NULL);
}

/* The weight cache: W and Wᵀ quantised once per optimizer step (at their first use), against
   quantising at every GEMM. Two micro-batches per step, so the second reuses the first's copies:
   the runs must agree bit for bit and the cached one must quantise 16 weight operands fewer per
   step (2 layers × 4 linears × W and Wᵀ). Then the rules for weights written from outside: an
   evaluation drops the cache (so it sees the new weights), and between micro-batches the
   caller says so with us_model_weights_changed; without that call the cached model keeps the
   copies of the old weights, which shows the copies are really reused. */
static us_result one_step(us_model *m, us_task *task, int accum) {
    int n = accum * m->tc.batch * m->tc.seq;
    int32_t *in = (int32_t *)malloc((size_t)n * 4), *tgt = (int32_t *)malloc((size_t)n * 4);
    us_step_stats st;
    us_result r;
    us_task_batch(task, accum * m->tc.batch, m->tc.seq, in, tgt);
    r = us_train_step(m, in, tgt, &st);
    free(in);
    free(tgt);
    return r;
}

static double fb_loss(us_model *m,
                      us_task *task) { /* one micro-batch's forward and backward, its summed loss */
    int n = m->tc.batch * m->tc.seq;
    int32_t *in = (int32_t *)malloc((size_t)n * 4), *tgt = (int32_t *)malloc((size_t)n * 4);
    double ls = NAN;
    us_task_batch(task, m->tc.batch, m->tc.seq, in, tgt);
    if (us_forward_backward(m, in, tgt, m->tc.batch, m->tc.seq, 1.0f, &ls) != US_OK) ls = NAN;
    free(in);
    free(tgt);
    return ls;
}

static void
halve_weights(us_model *m) { /* every bf16 weight times 0.5 (exact), behind the library's back */
    uint16_t *w = (uint16_t *)m->w;
    int64_t i;
    for (i = 0; i < m->n_params; i++) w[i] = us_f32_to_bf16(0.5f * us_bf16_to_f32(w[i]));
}

static void test_weight_cache(void) {
    enum { STEPS = 6 };

    us_model_config mc;
    us_train_config tc;
    us_model m[2];
    us_task task[2];
    long nq[2];
    int p, k, s, same = 1; /* nq: quantised operands (a fp8_quantize_both call makes two) */
    for (p = 0; p < 2; p++) {
        us_precision prec = p ? US_PRECISION_FP8_TENSOR : US_PRECISION_FP8;
        double ev[2], lb[2], la[2], lc[2];
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        mc.n_layers = 2;
        mc.dim = 48;
        mc.n_heads = 4;
        tc.batch = 8;
        tc.seq = 32;
        tc.grad_accum = 2;
        tc.steps = STEPS;
        tc.lr = 1e-2f;
        tc.warmup = 2;
        tc.precision = prec;
        tc.threads = 1;
        tc.fp8_min_dim = every_size(prec);
        g_cpu = us_cpu_ops(1);
        for (k = 0; k < 2; k++) { /* k = 0: the cache (default); 1: none */
            us_ops o = g_cpu;
            o.fp8_quantize = count_q;
            o.fp8_quantize_both = count_both;
            tc.fp8_no_wcache = k;
            CHECK(us_model_init(&m[k], &mc, &tc, &o) == US_OK && (m[k].fp8_wc != NULL) == !k,
                  "%s init, weight cache %s", us_precision_name(prec), k ? "off" : "on");
            us_task_init(&task[k], 3);
            g_nq = g_nboth = 0;
            for (s = 0; s < STEPS; s++)
                if (one_step(&m[k], &task[k], 2) != US_OK) break;
            nq[k] = g_nq + 2 * g_nboth;
        }
        for (s = 0; s < 2; s++) { /* the weights themselves, bit for bit */
            size_t b = (size_t)m[0].n_params * 2;
            same &= !memcmp(m[0].w, m[1].w, b) &&
                    !memcmp(m[0].master, m[1].master, (size_t)m[0].n_params * 4);
        }
        CHECK(same && nq[1] - nq[0] == 16 * STEPS,
              "%s: weights quantised once per step (2 micro-batches): %ld quantised operands "
              "against %ld, "
              "the same weights after %d steps, bit for bit",
              us_precision_name(prec), nq[0], nq[1], STEPS);
        /* written from outside, then evaluated: both models see the new weights */
        for (k = 0; k < 2; k++) {
            int32_t in[8 * 32], tgt[8 * 32];
            us_task t2;
            us_task_init(&t2, 9);
            halve_weights(&m[k]);
            us_task_batch(&t2, 8, 32, in, tgt);
            ev[k] = NAN;
            us_forward_eval(&m[k], in, tgt, 8, 32, &ev[k], NULL, NULL);
        }
        CHECK(ev[0] == ev[1] && isfinite(ev[0]),
              "%s: weights written from outside reach an evaluation with the cache (%.6f) as "
              "without (%.6f)",
              us_precision_name(prec), ev[0], ev[1]);
        /* between micro-batches: with us_model_weights_changed the two agree; without it the cache keeps the old copies */
        for (k = 0; k < 2; k++) {
            us_task t3;
            us_model_zero_grad(&m[k]);
            us_task_init(&t3, 5);
            lb[k] = fb_loss(&m[k], &t3);
            halve_weights(&m[k]);
            us_task_init(&t3, 5);
            la[k] =
                fb_loss(&m[k], &t3); /* k = 0 still computes with the copies of the old weights */
            halve_weights(&m[k]);
            us_model_weights_changed(&m[k]);
            us_task_init(&t3, 5);
            lc[k] = fb_loss(&m[k], &t3);
        }
        CHECK(lb[0] == lb[1] && lc[0] == lc[1] && la[0] != la[1],
              "%s: us_model_weights_changed between micro-batches: losses %.6f = %.6f after it; "
              "without it the linears keep the cached "
              "copies of the old weights (%.6f, against %.6f without a cache)",
              us_precision_name(prec), lc[0], lc[1], la[0], la[1]);
        us_model_free(&m[0]);
        us_model_free(&m[1]);
    }
    memset(&tc, 0, sizeof tc);
    tc.precision = US_PRECISION_BF16;
    tc.fp8_no_wcache = 1;
    {
        char err[256];
        memset(&mc, 0, sizeof mc);
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "fp8_no_wcache"),
              "fp8_no_wcache under bf16 is refused: %s", err);
        tc.precision = US_PRECISION_FP8;
        tc.fp8_no_wcache = 0;
        tc.zero = 3;
        tc.dp = 1;
        CHECK(us_model_init(&m[0], &mc, &tc, NULL) == US_OK && m[0].fp8_wc == NULL,
              "no weight cache under ZeRO-3 (the weights are not resident)");
        us_model_free(&m[0]);
    }
}

/* Dgrad quantises dy both ways in one call and leaves dyᵀ for the Wgrad of the same dy; the
   weight cache makes W and Wᵀ in one call. With the op taken away the model quantises twice:
   the two runs must agree bit for bit, step by step, and the dual path must really have been
   taken: per step 2 layers × 4 linears × (dy, and the weight once), so 16 calls and 32 fewer
   single quantisations. A Wgrad reading another dy's kept copy would show here. (SwiGLU's fused
   backward, which writes the gate|up dy's two operands itself, is taken away here, so that every
   dy goes through fp8_quantize_both; test_fused_quantisation has it.) */
/* the same under tp 2 + sp, whose backward gathers dy for the o and down projections (FP8 runs
   the gathered rows at once, so their Dgrad keeps dy too): one layer, 3 steps, rank 0's losses */
typedef struct tp_run {
    us_ops ops;
    float loss[3];
} tp_run;

static us_result tp_rank(us_comm *c, void *arg) {
    tp_run *R = (tp_run *)arg;
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_task task;
    us_step_stats st;
    int32_t in[4 * 32], tgt[4 * 32];
    int s;
    us_result r;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.n_layers = 1;
    mc.dim = 256;
    mc.n_heads = 4;
    mc.ffn_dim = 512;
    tc.batch = 4;
    tc.seq = 32;
    tc.tp = 2;
    tc.sp = 1;
    tc.precision = US_PRECISION_FP8;
    tc.threads = 1;
    tc.lr = 1e-2f;
    tc.fp8_min_dim = 16;
    if ((r = us_model_init_dist(&m, &mc, &tc, &R->ops, c)) != US_OK) {
        printf("  tp rank init: %s\n", us_model_error(&m));
        return r;
    }
    us_task_init(&task, 4);
    for (s = 0; s < 3 && r == US_OK; s++) {
        us_task_batch(&task, 4, 32, in, tgt);
        if ((r = us_train_step(&m, in, tgt, &st)) == US_OK && c->world.rank == 0)
            R->loss[s] = st.loss;
    }
    us_model_free(&m);
    return r;
}

static void test_dual_quantisation(void) {
    enum { STEPS = 12 };

    us_ops o = us_cpu_ops(1);
    float a[STEPS], b[STEPS], f;
    long nq[2], nboth[2];
    int on, all, k, p, same;
    for (p = 0; p < 2; p++) { /* fp8, fp8-tensor */
        us_precision prec = p ? US_PRECISION_FP8_TENSOR : US_PRECISION_FP8;
        g_cpu = us_cpu_ops(1);
        for (k = 0; k < 2; k++) {
            o = g_cpu;
            o.fp8_quantize = count_q;
            o.fp8_quantize_both = k ? NULL : count_both;
            o.swiglu_bwd_fp8 = NULL;
            g_nq = g_nboth = 0;
            train_ops(prec, 0, STEPS, &f, &on, &all, &o, k ? b : a);
            nq[k] = g_nq;
            nboth[k] = g_nboth;
        }
        for (same = 1, k = 0; k < STEPS; k++) same &= fbits(a[k]) == fbits(b[k]);
        CHECK(same && nboth[0] == 16 * STEPS && nboth[1] == 0 && nq[1] - nq[0] == 32 * STEPS,
              "%s: dy and the weights quantised both ways in one call (%ld calls, %ld fewer single "
              "ones) train bit for bit as two calls (losses %.6f .. %.6f)",
              us_precision_name(prec), nboth[0], nq[1] - nq[0], a[0], a[STEPS - 1]);
    }
    { /* tp 2 + sp: 2 ranks × 1 layer × (4 dy + 4 weights) per step */
        tp_run R[2];
        int ok = 1;
        g_cpu = us_cpu_ops(1);
        for (k = 0; k < 2; k++) {
            R[k].ops = g_cpu;
            R[k].ops.fp8_quantize = count_q;
            R[k].ops.fp8_quantize_both = k ? NULL : count_both;
            R[k].ops.swiglu_bwd_fp8 = NULL;
            g_nq = g_nboth = 0;
            ok &= us_test_launch(2, tp_rank, &R[k], NULL, 0) == US_OK;
            nq[k] = g_nq;
            nboth[k] = g_nboth;
        }
        for (same = 1, k = 0; k < 3; k++) same &= fbits(R[0].loss[k]) == fbits(R[1].loss[k]);
        CHECK(ok && same && nboth[0] == 16 * 3 && nq[1] - nq[0] == 32 * 3,
              "fp8 tp 2 + sp: dy of all four Dgrads (the gathered ones too) and the weights "
              "quantised both ways in one call "
              "(%ld calls, %ld fewer single ones), bit for bit as two calls (losses %.6f .. %.6f)",
              nboth[0], nq[1] - nq[0], R[0].loss[0], R[0].loss[2]);
    }
}

/* The fused ops: RMSNorm and SwiGLU write the 1×128 operand of their output for the Fprop that
   follows (ln1 → qkv, ln2 → gate|up, h → down), and SwiGLU's backward both operands of dgu for the
   gate|up Dgrad and Wgrad. With the ops taken away the model quantises in the Fprop and in the
   Dgrad: both runs must give the same losses and weights bit for bit, and the fused paths must
   really have been taken: per micro-batch 2 layers × 3 fused forward calls, and under full
   recompute the backward's recomputed norms 2 × 2 more (SwiGLU's h is not recomputed for a GEMM
   there), each one single quantisation fewer; SwiGLU's 2 calls keep hᵀ's 128×1 operand instead of
   h, which without recomputation spares the down linear's Wgrad its quantisation of h (2 fewer
   again; under full recompute the backward's recomputed h is quantised as before); and 2 layers ×
   1 fused backward call, each one fp8_quantize_both fewer. fp8-tensor (one scale per tensor) is
   never fused. */
static long g_nfuse, g_nfuse_b, g_nfuse_t;

static void count_norm(us_ops *o, void *out, float *rstd, uint8_t *q, float *s, const void *x,
                       const void *w, int64_t N, int64_t C, float eps, us_dtype dt, int pow2) {
    g_nfuse++;
    g_cpu.rmsnorm_fwd_fp8(o, out, rstd, q, s, x, w, N, C, eps, dt, pow2);
}

static void count_swiglu(us_ops *o, void *h, uint8_t *q, float *s, uint8_t *qt, float *st,
                         const void *gu, int64_t N, int64_t F, us_dtype dt, int pow2) {
    g_nfuse++;
    g_nfuse_t += qt != NULL && h == NULL;
    g_cpu.swiglu_fwd_fp8(o, h, q, s, qt, st, gu, N, F, dt, pow2);
}

static void count_swiglu_b(us_ops *o, void *dgu, uint8_t *q, float *s, uint8_t *qt, float *st,
                           const void *dh, const void *gu, int64_t N, int64_t F, us_dtype dt,
                           int pow2) {
    __atomic_add_fetch(&g_nfuse_b, 1, __ATOMIC_RELAXED); /* (ranks may be threads) */
    g_cpu.swiglu_bwd_fp8(o, dgu, q, s, qt, st, dh, gu, N, F, dt, pow2);
}

/* STEPS steps of the sorting task with ops o; losses[] gets each step's, w and master the
   weights at the end (copies the caller frees) */
static int fuse_run(const us_train_config *tc, const us_ops *o, float *losses, void **w,
                    float **master) {
    us_model_config mc;
    us_model m;
    us_task task;
    int s, ok;
    memset(&mc, 0, sizeof mc);
    mc.n_layers = 2;
    mc.dim = 48;
    mc.n_heads = 4;
    ok = us_model_init(&m, &mc, tc, o) == US_OK;
    us_task_init(&task, 7);
    for (s = 0; ok && s < tc->steps; s++) {
        int32_t in[8 * 32], tgt[8 * 32];
        us_step_stats st;
        us_task_batch(&task, 8, 32, in, tgt);
        ok = us_train_step(&m, in, tgt, &st) == US_OK;
        losses[s] = st.loss;
    }
    *w = malloc((size_t)m.n_params * 2);
    *master = (float *)malloc((size_t)m.n_params * 4);
    if (ok) {
        memcpy(*w, m.w, (size_t)m.n_params * 2);
        memcpy(*master, m.master, (size_t)m.n_params * 4);
    }
    ok = ok ? (int)m.n_params : 0;
    us_model_free(&m);
    return ok;
}

static void test_fused_quantisation(void) {
    enum { STEPS = 8 };

    int v;
    for (v = 0; v < 4; v++) { /* fp8, fp8 pow2 + full recompute, fp8-tensor, fp8 + full */
        us_train_config tc;
        float loss[2][STEPS];
        void *w[2];
        float *master[2];
        long nq[2], nf[2], nb[2], nt[2], nboth[2], want, want_b, want_t, want_q;
        int k, n[2], same = 1;
        memset(&tc, 0, sizeof tc);
        tc.batch = 8;
        tc.seq = 32;
        tc.steps = STEPS;
        tc.lr = 1e-2f;
        tc.warmup = 2;
        tc.threads = 1;
        tc.precision = v == 2 ? US_PRECISION_FP8_TENSOR : US_PRECISION_FP8;
        tc.fp8_pow2 = v == 1;
        tc.recompute = v & 1 ? US_RECOMPUTE_FULL : US_RECOMPUTE_NONE;
        tc.fp8_min_dim = 16;
        g_cpu = us_cpu_ops(1);
        for (k = 0; k < 2; k++) { /* k = 0: the fused ops (the CPU's default); 1: none */
            us_ops o = g_cpu;
            o.fp8_quantize = count_q;
            o.fp8_quantize_both = count_both;
            o.rmsnorm_fwd_fp8 = k ? NULL : count_norm;
            o.swiglu_fwd_fp8 = k ? NULL : count_swiglu;
            o.swiglu_bwd_fp8 = k ? NULL : count_swiglu_b;
            g_nq = g_nboth = g_nfuse = g_nfuse_b = g_nfuse_t = 0;
            n[k] = fuse_run(&tc, &o, loss[k], &w[k], &master[k]);
            nq[k] = g_nq;
            nf[k] = g_nfuse;
            nt[k] = g_nfuse_t;
            nb[k] = g_nfuse_b;
            nboth[k] = g_nboth;
        }
        for (k = 0; k < STEPS; k++) same &= fbits(loss[0][k]) == fbits(loss[1][k]);
        same &= n[0] && n[0] == n[1] && !memcmp(w[0], w[1], (size_t)n[0] * 2) &&
                !memcmp(master[0], master[1], (size_t)n[0] * 4);
        want = v == 2 ? 0 : (tc.recompute == US_RECOMPUTE_FULL ? 10 : 6) * STEPS;
        want_b = v == 2 ? 0 : 2 * STEPS;
        want_t = v == 2 ? 0 : 2 * STEPS;
        want_q = want + (tc.recompute == US_RECOMPUTE_FULL ? 0 : want_t);
        CHECK(same && nf[0] == want && nf[1] == 0 && nt[0] == want_t && nq[1] - nq[0] == want_q &&
                  nb[0] == want_b && nb[1] == 0 && nboth[1] - nboth[0] == want_b,
              "%s%s, recompute %s: RMSNorm and SwiGLU quantising their outputs (%ld fused calls, "
              "%ld keeping h as its 128x1 operand, %ld fewer quantisations; want %ld, %ld, %ld) "
              "and SwiGLU's backward its dgu both ways (%ld fused calls, %ld fewer "
              "fp8_quantize_both; want %ld) train bit for bit as the GEMMs' own quantisation "
              "(losses %.6f .. %.6f, the weights and master weights)",
              us_precision_name(tc.precision), tc.fp8_pow2 ? " pow2" : "",
              us_recompute_name(tc.recompute), nf[0], nt[0], nq[1] - nq[0], want, want_t, want_q,
              nb[0], nboth[1] - nboth[0], want_b, loss[0][0], loss[0][STEPS - 1]);
        for (k = 0; k < 2; k++) {
            free(w[k]);
            free(master[k]);
        }
    }
    { /* tp 2 + sp: the gate|up Dgrad is not gathered, so its dy comes fused too (2 ranks × 3) */
        tp_run R[2];
        int k, ok = 1, same = 1;
        long nb[2];
        g_cpu = us_cpu_ops(1);
        for (k = 0; k < 2; k++) {
            R[k].ops = g_cpu;
            R[k].ops.swiglu_bwd_fp8 = k ? NULL : count_swiglu_b;
            g_nfuse_b = 0;
            ok &= us_test_launch(2, tp_rank, &R[k], NULL, 0) == US_OK;
            nb[k] = g_nfuse_b;
        }
        for (k = 0; k < 3; k++) same &= fbits(R[0].loss[k]) == fbits(R[1].loss[k]);
        CHECK(ok && same && nb[0] == 2 * 3 && nb[1] == 0,
              "fp8 tp 2 + sp: SwiGLU's backward quantising dgu both ways (%ld fused calls) trains "
              "bit for bit as the Dgrad's own quantisation (losses %.6f .. %.6f)",
              nb[0], R[0].loss[0], R[0].loss[2]);
    }
}

static void test_training(void) {
    int steps = 60, on, all;
    float f16, f8, ft, fp, l16, l8, lt, lp;
    l16 = train(US_PRECISION_BF16, 0, steps, &f16, &on, &all);
    l8 = train(US_PRECISION_FP8, 0, steps, &f8, &on, &all);
    CHECK(on == all && all == 8,
          "fp8: all %d of %d dense linear layers run in FP8 (sizes multiples of 16)", on, all);
    lt = train(US_PRECISION_FP8_TENSOR, 0, steps, &ft, &on, &all);
    lp = train(US_PRECISION_FP8, 1, steps, &fp, &on, &all);
    printf("  sorting task, %d steps: loss bf16 %.4f -> %.4f | fp8 %.4f -> %.4f | fp8 pow2 %.4f -> "
           "%.4f | fp8-tensor %.4f -> %.4f\n",
           steps, f16, l16, f8, l8, fp, lp, ft, lt);
    CHECK(f8 > 4.0f && l8 < 0.4f * f8, "fp8 training: loss %.3f -> %.3f, below 40%% of the start",
          f8, l8);
    CHECK(fp > 4.0f && lp < 0.4f * fp,
          "fp8 training with power-of-two scales: loss %.3f -> %.3f, below 40%% of the start", fp,
          lp);
    CHECK(ft > 4.0f && lt < 0.4f * ft,
          "fp8-tensor training: loss %.3f -> %.3f, below 40%% of the start", ft, lt);
    /* the gap: within 10 % of bf16's final loss (measured: see the printed line) */
    CHECK(fabsf(l8 - l16) < 0.1f * l16 && fabsf(lp - l16) < 0.1f * l16 &&
              fabsf(lt - l16) < 0.1f * l16,
          "fp8 / fp8 pow2 / fp8-tensor final losses %.4f / %.4f / %.4f within 10%% of bf16's %.4f",
          l8, lp, lt, l16);
    CHECK(fabsf(f8 - f16) < 0.01f * f16,
          "the first step's loss (before any update) agrees with bf16 within 1%% (%.4f vs %.4f)",
          f8, f16);
}

/* ------------------------------------------------------------------ MoE experts in FP8 */
/* The experts' GEMMs (us__moe_run, // >>moe) under fp8 and bf16, against the fp64 products:
   four experts of 40, 0, 16 and 7 rows (rows between them no expert owns), gate|up C 64 → 2Fe 96
   and down Fe 48 → C 64. FP8 takes an expert's first n − n mod 16 rows in Fprop and Dgrad (32,
   16 and none of the four) and all its rows in Wgrad; the grouped bf16 GEMM the rest. So under
   fp8 the FP8 rows carry FP8's error and the others bf16's, and the expert with no rows keeps its
   gradient's bytes. err: [mode][0] the FP8 rows' (Wgrad: every gradient's), [mode][1] the bf16
   rows'; *moved: bytes changed that no expert owns. */
static void experts_errors(int fp8, int k, double err[3][2], int64_t *moved) {
    static const int64_t n[4] = {40, 0, 16, 7};
    const int64_t C = 64, Fe = 48, In = k ? Fe : C, Out = k ? C : 2 * Fe, gap = 3;
    us_ops o = us_cpu_ops(2);
    us_model m;
    int64_t off[4], R = 0, e, r, i, j;
    size_t fo[5];
    int mode;
    memset(&m, 0, sizeof m);
    m.ops = o;
    m.fp8 = fp8;
    m.dt = US_BF16;
    m.ep = 1;
    m.tc.fp8_min_dim = 16;
    m.tc.fp8_experts = 1; /* (by default the experts stay in the bf16 grouped GEMM) */
    m.cfg.dim = C;
    m.cfg.moe_ffn_dim = Fe;
    m.cfg.moe_experts = 4;
    m.moe_go = (int64_t *)calloc(16, 8);
    m.moe_wp = (void **)calloc(4, sizeof(void *));
    for (e = 0; e < 4; e++) {
        off[e] = m.moe_go[e] = R;
        m.moe_go[4 + e] = n[e];
        R += n[e] + gap;
    }
    m.a[US__A_FP8] = calloc(us__fp8_scratch(R, C, C, C, C, R, Fe, 16, fo), 1);
    memcpy(m.fp8_off, fo, sizeof fo);
    for (mode = 0; mode < 3; mode++) {
        /* X: the linear's input side (x, or dy for Dgrad); Y the other (y, dx, or dy for Wgrad) */
        int64_t xc = mode == US_GG_DGRAD ? Out : In, yc = mode == US_GG_DGRAD ? In : Out;
        uint16_t *X = (uint16_t *)malloc((size_t)(R * xc) * 2),
                 *Y = (uint16_t *)malloc((size_t)(R * yc) * 2),
                 *Y0 = (uint16_t *)malloc((size_t)(R * yc) * 2), *W[4];
        float *G[4], *G0[4];
        double num[2] = {0, 0}, den[2] = {0, 0};
        fill(X, US_BF16, R * xc, 1.0);
        fill(Y, US_BF16, R * yc, 1.0);
        memcpy(Y0, Y, (size_t)(R * yc) * 2);
        for (e = 0; e < 4; e++) {
            W[e] = (uint16_t *)malloc((size_t)(Out * In) * 2);
            fill(W[e], US_BF16, Out * In, 1.0);
            G[e] = (float *)calloc((size_t)(Out * In), 4);
            G0[e] = (float *)calloc((size_t)(Out * In), 4);
            m.moe_wp[e] = mode == US_GG_WGRAD ? (void *)G[e] : (void *)W[e];
        }
        us__moe_run(&m, mode, k, 0, 4, X, Y);
        for (e = 0; e < 4; e++) {
            int64_t n16 = n[e] - n[e] % 16;
            if (mode == US_GG_WGRAD) { /* dW [Out][In] = Σ_rows dy[r][o]·x[r][i] */
                for (j = 0; j < Out; j++)
                    for (i = 0; i < In; i++) {
                        double s = 0, d;
                        for (r = off[e]; r < off[e] + n[e]; r++)
                            s += (double)us_bf16_to_f32(Y[r * Out + j]) *
                                 us_bf16_to_f32(X[r * In + i]);
                        d = G[e][j * In + i] - s;
                        num[0] += d * d;
                        den[0] += s * s;
                    }
                if (!n[e]) *moved += memcmp(G[e], G0[e], (size_t)(Out * In) * 4) != 0;
                continue;
            }
            for (r = off[e]; r < off[e] + n[e]; r++)
                for (j = 0; j < yc; j++) { /* Fprop y = x·Wᵀ, Dgrad dx = dy·W */
                    double s = 0, d;
                    int h = fp8 && r - off[e] < n16 ? 0 : 1;
                    for (i = 0; i < xc; i++)
                        s += (double)us_bf16_to_f32(X[r * xc + i]) *
                             us_bf16_to_f32(mode == US_GG_FPROP ? W[e][j * In + i]
                                                                : W[e][i * In + j]);
                    d = us_bf16_to_f32(Y[r * yc + j]) - s;
                    num[h] += d * d;
                    den[h] += s * s;
                }
            for (r = off[e] + n[e]; r < off[e] + n[e] + gap; r++)
                *moved += memcmp(Y + r * yc, Y0 + r * yc, (size_t)yc * 2) != 0;
        }
        err[mode][0] = den[0] > 0 ? sqrt(num[0] / den[0]) : 0;
        err[mode][1] = den[1] > 0 ? sqrt(num[1] / den[1]) : 0;
        for (e = 0; e < 4; e++) {
            free(W[e]);
            free(G[e]);
            free(G0[e]);
        }
        free(X);
        free(Y);
        free(Y0);
    }
    free(m.a[US__A_FP8]);
    free(m.moe_go);
    free(m.moe_wp);
}

static long g_ngg_rows, g_nfp8g; /* rows the grouped GEMM was given; FP8 GEMMs */

static void count_gg(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n, int64_t N,
                     int64_t K, const void *X, int64_t ldx, void *const *W, void *Y, int64_t ldy,
                     us_dtype dt) {
    int g;
    for (g = 0; g < G; g++) g_ngg_rows += n[g];
    g_cpu.gemm_grouped(o, mode, G, off, n, N, K, X, ldx, W, Y, ldy, dt);
}

static void count_fg(us_ops *o, int64_t M, int64_t N, int64_t K, float al, const uint8_t *a,
                     const float *sa, int ta, const uint8_t *b, const float *sb, int tb, float be,
                     void *C, us_dtype cdt, int64_t ldc) {
    g_nfp8g++;
    g_cpu.fp8_gemm(o, M, N, K, al, a, sa, ta, b, sb, tb, be, C, cdt, ldc);
}

/* A MoE model (2 layers, E 4, top-2, dim 48, Fe 32) trained on the sorting task in bf16 and fp8,
   steps steps; balance: moe_force_balance (each expert 64 rows of a micro-batch: all FP8);
   experts: tc.fp8_experts (the experts' GEMMs in FP8 too; fp8 only). */
static float moe_train(us_precision prec, int balance, int experts, int steps, float *first) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_task task;
    us_step_stats st;
    us_ops o = us_cpu_ops(0);
    int32_t *in, *tgt;
    int s;
    float last = NAN;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.n_layers = 2;
    mc.dim = 48;
    mc.n_heads = 4;
    mc.moe_experts = 4;
    mc.moe_top_k = 2;
    mc.moe_ffn_dim = 32;
    tc.batch = 4;
    tc.seq = 32;
    tc.steps = steps;
    tc.lr = 1e-2f;
    tc.warmup = 10;
    tc.precision = prec;
    tc.threads = 1;
    tc.moe_force_balance = balance;
    tc.fp8_min_dim = every_size(prec);
    tc.fp8_experts = experts;
    g_cpu = o;
    o.gemm_grouped = count_gg;
    o.fp8_gemm = count_fg;
    if (us_model_init(&m, &mc, &tc, &o) != US_OK) {
        printf("  init: %s\n", us_model_error(&m));
        return NAN;
    }
    us_task_init(&task, 1);
    in = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    tgt = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    g_ngg_rows = g_nfp8g = 0;
    for (s = 0; s < steps; s++) {
        us_task_batch(&task, tc.batch, tc.seq, in, tgt);
        if (us_train_step(&m, in, tgt, &st) != US_OK) {
            printf("  step: %s\n", us_model_error(&m));
            break;
        }
        if (s == 0) *first = st.loss;
        last = st.loss;
    }
    free(in);
    free(tgt);
    us_model_free(&m);
    return last;
}

static void test_moe_experts(int quick) {
    static const char *mname[3] = {"Fprop", "Dgrad", "Wgrad"};
    double e8[3][2], e16[3][2];
    int64_t moved = 0;
    int k, mode;
    for (k = 0; k <= 2; k += 2) {
        experts_errors(1, k, e8, &moved);
        experts_errors(0, k, e16, &moved);
        for (mode = 0; mode < 3; mode++) {
            double b = e16[mode][mode == US_GG_WGRAD ? 0 : 1]; /* bf16 everywhere */
            CHECK(e8[mode][0] < 0.06 && e8[mode][0] > 3 * b && b < 0.006 &&
                      (mode == US_GG_WGRAD || e8[mode][1] < 0.006),
                  "MoE experts %s %s: FP8 rows rel err %.4f (bf16 %.4f), the rows left to the "
                  "grouped bf16 GEMM %.4f",
                  k ? "down" : "gate|up", mname[mode], e8[mode][0], b, e8[mode][1]);
        }
    }
    CHECK(moved == 0,
          "the experts' GEMMs leave rows no expert owns, and an empty expert's "
          "gradient, as they were (%lld changed)",
          (long long)moved);
    { /* the FP8 scratch holds the experts' operands (up to all N·K rows on one expert) */
        us_model_config mc;
        us_train_config tc;
        us_memory est;
        us_model m;
        char err[256];
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        mc.n_layers = 2;
        mc.dim = 48;
        mc.n_heads = 4;
        mc.moe_experts = 4;
        mc.moe_top_k = 2;
        mc.moe_ffn_dim = 256; /* the experts' operands outgrow the dense linears' */
        tc.batch = 4;
        tc.seq = 32;
        tc.threads = 1;
        tc.precision = US_PRECISION_FP8;
        tc.fp8_min_dim = 16;
        CHECK(us_memory_estimate(&mc, &tc, &est, err, sizeof err) == US_OK &&
                  us_model_init(&m, &mc, &tc, NULL) == US_OK && est.total == m.mem.total &&
                  est.activations == m.mem.activations,
              "fp8 MoE: estimated %zu = allocated %zu bytes (activations %zu vs %zu)", est.total,
              m.mem.total, est.activations, m.mem.activations);
        us_model_free(&m);
    }
    if (quick) return;
    { /* every expert of a balanced micro-batch has 128·2/4 = 64 rows: the grouped bf16 GEMM gets
         none; FP8 GEMMs per step: 2 layers × (qkv, o: 3 each + 4 experts × 2 linears × 3) */
        float f8, fb, l8, lb;
        long rows, calls;
        moe_train(US_PRECISION_FP8, 1, 1, 2, &f8);
        rows = g_ngg_rows;
        calls = g_nfp8g;
        CHECK(rows == 0 && calls == 2 * 2 * (2 * 3 + 4 * 2 * 3),
              "fp8 MoE with fp8_experts, balanced: the grouped bf16 GEMM got %ld rows, %ld FP8 "
              "GEMMs in 2 steps (want 0, %d)",
              rows, calls, 2 * 2 * (2 * 3 + 4 * 2 * 3));
        /* by default the experts stay in the grouped bf16 GEMM: every row of their 2 layers × 2
           linears × 3 products × 2 steps (256 rows each), and the FP8 GEMMs are the dense ones */
        moe_train(US_PRECISION_FP8, 1, 0, 2, &f8);
        CHECK(g_ngg_rows == 2L * 2 * 2 * 3 * 256 && g_nfp8g == 2 * 2 * (2 * 3),
              "fp8 MoE by default: the grouped bf16 GEMM got %ld rows (want %ld), %ld FP8 GEMMs "
              "(want %d)",
              g_ngg_rows, 2L * 2 * 2 * 3 * 256, g_nfp8g, 2 * 2 * (2 * 3));
        lb = moe_train(US_PRECISION_BF16, 0, 0, 60, &fb);
        l8 = moe_train(US_PRECISION_FP8, 0, 1, 60, &f8);
        printf("  MoE sorting task, 60 steps: loss bf16 %.4f -> %.4f | fp8 %.4f -> %.4f (%ld FP8 "
               "GEMMs; the grouped bf16 GEMM took %ld expert rows)\n",
               fb, lb, f8, l8, g_nfp8g, g_ngg_rows);
        CHECK(l8 < 0.5f * f8 && fabsf(l8 - lb) < 0.1f * lb && g_ngg_rows > 0 && g_nfp8g > 0,
              "fp8 MoE training (routed freely: each expert's last n mod 16 rows bf16): loss "
              "%.3f -> %.3f, within 10%% of bf16's %.3f",
              f8, l8, lb);
    }
}

/* ------------------------------------------------------------------ estimator, sizes, errors */
static void test_config(void) {
    us_model_config mc;
    us_train_config tc;
    us_memory est;
    us_model m;
    char err[256];
    int p;
    for (p = 0; p < 2; p++) {
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        mc.n_layers = 2;
        mc.dim = 64;
        mc.n_heads = 4;
        tc.batch = 4;
        tc.seq = 32;
        tc.threads = 1;
        tc.precision = p ? US_PRECISION_FP8_TENSOR : US_PRECISION_FP8;
        tc.recompute = p ? US_RECOMPUTE_FULL : US_RECOMPUTE_NONE;
        tc.fp8_min_dim = 16;
        CHECK(us_memory_estimate(&mc, &tc, &est, err, sizeof err) == US_OK, "estimate: %s", err);
        CHECK(us_model_init(&m, &mc, &tc, NULL) == US_OK, "%s init: %s",
              us_precision_name(tc.precision), us_model_error(&m));
        { /* the weight cache: W and Wᵀ in E4M3 for the 4 linears of each layer, plus scales */
            size_t wc = m.fp8_wlayer * (size_t)m.cfg.n_layers,
                   HS = (size_t)(m.cfg.dim / m.cfg.n_heads), C = (size_t)m.cfg.dim;
            size_t QKV = (size_t)(m.nh_l + 2 * m.nkv_l) * HS, AO = (size_t)m.nh_l * HS,
                   F = (size_t)m.ffn_l;
            size_t lin = (size_t)m.cfg.n_layers * (QKV * C + C * AO + 2 * F * C + C * F);
            /* E4M3 bytes: W [Out][In] and Wᵀ, each row padded to whole 128-element tiles */
            size_t io[4][2] = {{C, QKV}, {AO, C}, {C, 2 * F}, {F, C}}, qbytes = 0, k;
            size_t slack =
                0; /* the scales (at most one per 128 bytes of a row) and 256-byte alignment */
            for (k = 0; k < 4; k++) {
                qbytes += io[k][1] * ((io[k][0] + 127) / 128 * 128) +
                          io[k][0] * ((io[k][1] + 127) / 128 * 128);
                slack += 4 * (io[k][1] * ((io[k][0] + 127) / 128) +
                              io[k][0] * ((io[k][1] + 127) / 128)) +
                         4 * US__ALIGN;
            }
            qbytes *= (size_t)m.cfg.n_layers;
            slack *= (size_t)m.cfg.n_layers;
            CHECK(est.total == m.mem.total && est.activations == m.mem.activations &&
                      est.params == m.mem.params && m.dt == US_BF16 &&
                      m.mem.master == 2 * (m.mem.params - wc) && m.fp8_wc && wc >= qbytes &&
                      wc <= qbytes + slack,
                  "%s: estimated %zu = allocated %zu bytes (activations %zu vs %zu, FP8 scratch "
                  "included; weights %zu vs %zu with a %zu-byte "
                  "weight cache, %zu of them E4M3 bytes, for %zu linear weights); bf16 weights, "
                  "fp32 master",
                  us_precision_name(tc.precision), est.total, m.mem.total, est.activations,
                  m.mem.activations, est.params, m.mem.params, wc, qbytes, lin);
        }
        us_model_free(&m);
    }
    { /* the size rule: a linear runs in FP8 only when In and Out are both >= fp8_min_dim (default
           US_FP8_MIN_DIM); the 64-wide model's four linears have min(In, Out) = 64 */
        static const int mins[4] = {0, 64, 65, 16};
        static const int want[4] = {0, 4, 0, 4};
        int k;
        for (k = 0; k < 4; k++) {
            memset(&mc, 0, sizeof mc);
            memset(&tc, 0, sizeof tc);
            mc.n_layers = 2;
            mc.dim = 64;
            mc.n_heads = 4;
            tc.batch = 4;
            tc.seq = 32;
            tc.threads = 1;
            tc.precision = US_PRECISION_FP8;
            tc.fp8_min_dim = mins[k];
            CHECK(us_model_init(&m, &mc, &tc, NULL) == US_OK && m.fp8_linear == 2 * want[k] &&
                      m.fp8_linear_all == 8,
                  "fp8_min_dim %d (0 = %d): %d of %d linears in FP8, want %d", mins[k],
                  US_FP8_MIN_DIM, m.fp8_linear, m.fp8_linear_all, 2 * want[k]);
            /* linears under the rule take no FP8 scratch or cache room, and the estimator agrees */
            CHECK(
                us_memory_estimate(&mc, &tc, &est, err, sizeof err) == US_OK &&
                    est.total == m.mem.total && est.params == m.mem.params &&
                    (want[k] ? m.fp8_wc != NULL && m.fp8_wlayer > 0
                             : m.fp8_wc == NULL && m.fp8_wlayer == 0 && m.fp8_off[4] == 0),
                "fp8_min_dim %d: estimated %zu = allocated %zu bytes, weight cache %zu bytes/layer",
                mins[k], est.total, m.mem.total, m.fp8_wlayer);
            us_model_free(&m);
        }
        { /* under the default rule this model's fp8 training is bf16 training, bit for bit */
            float lb[3], l8[3], f;
            int on, all;
            train_ops(US_PRECISION_BF16, 0, 3, &f, &on, &all, NULL, lb);
            train_min(US_PRECISION_FP8, 0, 3, &f, &on, &all, NULL, l8, 0);
            CHECK(on == 0 && !memcmp(lb, l8, sizeof lb),
                  "fp8 below the size rule: no FP8 linear (%d) and bf16's losses to the bit "
                  "(%.6f %.6f %.6f vs %.6f %.6f %.6f)",
                  on, lb[0], lb[1], lb[2], l8[0], l8[1], l8[2]);
        }
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        tc.precision = US_PRECISION_FP8;
        tc.fp8_min_dim = -1;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "fp8_min_dim"),
              "fp8_min_dim -1 is refused: %s", err);
        tc.precision = US_PRECISION_BF16;
        tc.fp8_min_dim = 64;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "fp8_min_dim"),
              "fp8_min_dim under bf16 is refused: %s", err);
    }
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    tc.precision = US_PRECISION_BF16;
    tc.fp8_pow2 = 1;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "fp8_pow2"),
          "fp8_pow2 under bf16 is refused: %s", err);
    tc.precision = (us_precision)99;
    tc.fp8_pow2 = 0;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID,
          "an unknown precision is refused: %s", err);
    { /* a backend without FP8 ops */
        us_ops o = us_cpu_ops(1);
        o.fp8_gemm = NULL;
        memset(&tc, 0, sizeof tc);
        tc.precision = US_PRECISION_FP8;
        CHECK(us_model_init(&m, &mc, &tc, &o) == US_ERR_INVALID &&
                  strstr(us_model_error(&m), "FP8 ops"),
              "fp8 on a backend without FP8 ops: %s", us_model_error(&m));
    }
    CHECK(!strcmp(us_precision_name(US_PRECISION_FP8), "fp8") &&
              !strcmp(us_precision_name(US_PRECISION_FP8_TENSOR), "fp8-tensor"),
          "precision names");
}

int main(int argc, char **argv) {
    int i, quick = 0; /* --quick (the sanitizer build): no training runs */
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) us_test_verbose = 1;
        if (!strcmp(argv[i], "--quick")) quick = 1;
    }
    test_fast_e4m3();
    test_ops_equal_host();
    test_linear();
    test_config();
    test_moe_experts(quick);
    if (!quick) {
        test_training();
        test_dual_quantisation();
        test_weight_cache();
        test_fused_quantisation();
    }
    return us_test_done("test_fp8_train");
}
