/* test_ops.c — every CPU op against an independent double-precision reference written here:
   forward values, backward against central finite differences of the double forward, bf16
   variants within one bf16 ulp of the rounded fp32 result, AdamW against PyTorch's update,
   sumsq, determinism across thread counts, and the learning-rate schedule. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ helpers */
static float rndu(float a) { return (float)((rnd01() * 2 - 1) * a); } /* uniform in [-a, a) */

static float *fvec(int64_t n, float a) {
    float *p = (float *)malloc((size_t)(n ? n : 1) * 4);
    int64_t i;
    for (i = 0; i < n; i++) p[i] = rndu(a);
    return p;
}

static double *dvec_from(const float *x, int64_t n) {
    double *p = (double *)malloc((size_t)(n ? n : 1) * 8);
    int64_t i;
    for (i = 0; i < n; i++) p[i] = x[i];
    return p;
}

static double *dzeros(int64_t n) { return (double *)calloc((size_t)(n ? n : 1), 8); }

static float *fdup(const float *x, int64_t n) {
    float *p = (float *)malloc((size_t)(n ? n : 1) * 4);
    memcpy(p, x, (size_t)n * 4);
    return p;
}

static void round_bf16(float *x, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) x[i] = us_bf16_to_f32(us_f32_to_bf16(x[i]));
}

static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *p = (uint16_t *)malloc((size_t)(n ? n : 1) * 2);
    int64_t i;
    for (i = 0; i < n; i++) p[i] = us_f32_to_bf16(x[i]);
    return p;
}

/* max that keeps a NaN (fmax would drop it and hide a NaN result) */
static double nmax(double a, double b) { return (b != b || b > a) ? b : a; }

/* max |a - ref| / (1 + |ref|) */
static double max_rel(const float *a, const double *ref, int64_t n) {
    double m = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (!(e <= m)) m = e;
    }
    return m;
}

/* the distance of two bf16 values in ulps (ordered integer line), large for NaN */
static int64_t bf16_ulps(uint16_t a, uint16_t b) {
    int64_t ia = (a & 0x8000) ? -(int64_t)(a & 0x7FFF) : (int64_t)a,
            ib = (b & 0x8000) ? -(int64_t)(b & 0x7FFF) : (int64_t)b;
    if (((a & 0x7F80) == 0x7F80 && (a & 0x7F)) || ((b & 0x7F80) == 0x7F80 && (b & 0x7F)))
        return 1 << 20;
    return ia > ib ? ia - ib : ib - ia;
}

/* bf16 output y16 vs fp32 output y32: within 1 ulp of the rounded value, and every value is finite */
static int64_t bf16_max_ulps(const uint16_t *y16, const float *y32, int64_t n) {
    int64_t m = 0, i;
    for (i = 0; i < n; i++) {
        int64_t d = bf16_ulps(y16[i], us_f32_to_bf16(y32[i]));
        if (!isfinite(us_bf16_to_f32(y16[i]))) d = 1 << 20;
        if (d > m) m = d;
    }
    return m;
}

/* Central differences of a double loss with respect to x[idx[i]] (all of x when idx is NULL),
   compared with the library gradient g. Returns the max error; *maxfd gets max |fd|. */
typedef double (*loss_fn)(void *ctx);
#define FD_H 1e-6

static double fd_check(loss_fn f, void *ctx, double *x, int64_t n, const double *g,
                       const int64_t *idx, int64_t nidx, double *maxfd) {
    int64_t k, cnt = idx ? nidx : n;
    double merr = 0, mfd = 0;
    for (k = 0; k < cnt; k++) {
        int64_t i = idx ? idx[k] : k;
        double x0 = x[i], lp, lm, fd, e;
        x[i] = x0 + FD_H;
        lp = f(ctx);
        x[i] = x0 - FD_H;
        lm = f(ctx);
        x[i] = x0;
        fd = (lp - lm) / (2 * FD_H);
        e = fabs(fd - g[i]);
        if (!(e <= merr)) merr = e;
        if (fabs(fd) > mfd) mfd = fabs(fd);
    }
    *maxfd = mfd;
    return merr;
}

#define FD_OK(err, mfd) ((err) <= 1e-4 * (1.0 + (mfd)))

static double dot_rd(const double *r, const double *y, int64_t n) {
    double s = 0;
    int64_t i;
    for (i = 0; i < n; i++) s += r[i] * y[i];
    return s;
}

static double *f2d_diff(const float *a, const float *b,
                        int64_t n) { /* (a - b) in double: accumulator minus its start */
    double *p = (double *)malloc((size_t)(n ? n : 1) * 8);
    int64_t i;
    for (i = 0; i < n; i++) p[i] = (double)a[i] - (double)b[i];
    return p;
}

static us_ops O0, O1, O2; /* all threads, 1 thread, 2 threads */
static double maxerr_report[32];
static const char *maxerr_name[32];
static int nreport;

static void report(const char *name, double e) {
    if (nreport < 32) {
        maxerr_name[nreport] = name;
        maxerr_report[nreport++] = e;
    }
}

/* ------------------------------------------------------------------ references (double) */
static void ref_embedding(double *out, const int32_t *tok, const double *wte, int64_t N,
                          int64_t C) {
    int64_t n, c;
    for (n = 0; n < N; n++)
        for (c = 0; c < C; c++) out[n * C + c] = wte[(int64_t)tok[n] * C + c];
}

static void ref_rmsnorm(double *y, double *rstd, const double *x, const double *w, int64_t N,
                        int64_t C, double eps) {
    int64_t n, c;
    for (n = 0; n < N; n++) {
        double ms = 0, r;
        for (c = 0; c < C; c++) ms += x[n * C + c] * x[n * C + c];
        r = 1.0 / sqrt(ms / (double)C + eps);
        if (rstd) rstd[n] = r;
        for (c = 0; c < C; c++) y[n * C + c] = x[n * C + c] * r * w[c];
    }
}

/* Hugging Face apply_rotary_pos_emb literally: freqs = t·inv_freq, emb = cat(freqs, freqs);
   out = x·cos(emb) + rotate_half(x)·sin(emb), rotate_half = cat(−x2, x1). inv_freq [HS/2] is
   1/theta^(arange(0,HS,2)/HS) for plain RoPE (ref_inv_freq). */
static void ref_rope(double *out, const double *in, int64_t B, int64_t T, int NH, int NKV, int HS,
                     const double *inv_freq) {
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, b, t;
    int h, d, half = HS / 2;
    memcpy(out, in, (size_t)(B * T * QKV) * 8);
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < NH + NKV; h++) {
                const double *x = in + (b * T + t) * QKV + (int64_t)h * HS;
                double *y = out + (b * T + t) * QKV + (int64_t)h * HS;
                for (d = 0; d < HS; d++) {
                    double emb = (double)t * inv_freq[d % half];
                    double rot = d < half ? -x[d + half] : x[d - half];
                    y[d] = x[d] * cos(emb) + rot * sin(emb);
                }
            }
}

static void ref_inv_freq(double *inv_freq, int HS, double theta) {
    int j;
    for (j = 0; j < HS / 2; j++) inv_freq[j] = 1.0 / pow(theta, (double)(2 * j) / (double)HS);
}

/* causal GQA attention, HF repeat_kv mapping: q head h reads kv head h / (NH/NKV) */
static void ref_attention(double *out, double *lse, const double *qkv, int64_t B, int64_t T, int NH,
                          int NKV, int HS) {
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, b, i, j;
    int h, d, rep = NH / NKV;
    double *s = (double *)malloc((size_t)T * 8);
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++)
            for (i = 0; i < T; i++) {
                const double *q = qkv + (b * T + i) * QKV + (int64_t)h * HS;
                double mx = -INFINITY, l = 0;
                for (j = 0; j <= i; j++) {
                    const double *k = qkv + (b * T + j) * QKV + (int64_t)(NH + h / rep) * HS;
                    double dd = 0;
                    for (d = 0; d < HS; d++) dd += q[d] * k[d];
                    s[j] = dd / sqrt((double)HS);
                    if (s[j] > mx) mx = s[j];
                }
                for (j = 0; j <= i; j++) {
                    s[j] = exp(s[j] - mx);
                    l += s[j];
                }
                if (lse) lse[(b * NH + h) * T + i] = mx + log(l);
                for (d = 0; d < HS; d++) {
                    double a = 0;
                    for (j = 0; j <= i; j++)
                        a += s[j] / l *
                             qkv[(b * T + j) * QKV + (int64_t)(NH + NKV + h / rep) * HS + d];
                    out[(b * T + i) * NH * HS + (int64_t)h * HS + d] = a;
                }
            }
    free(s);
}

static void ref_swiglu(double *hh, const double *gu, int64_t N, int64_t F) {
    int64_t n, f;
    for (n = 0; n < N; n++)
        for (f = 0; f < F; f++) {
            double g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
            hh[n * F + f] = g / (1.0 + exp(-g)) * u;
        }
}

static void ref_gemm(double *C, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha,
                     const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                     const double *C0, int64_t ldc) {
    int64_t i, j, k;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double s = 0;
            for (k = 0; k < K; k++)
                s +=
                    (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = alpha * s + (beta != 0 ? beta * C0[i * ldc + j] : 0);
        }
}

static double ref_xent_row(const double *z, int64_t V, int32_t t) {
    double mx = -INFINITY, s = 0;
    int64_t v;
    if (t < 0) return 0;
    for (v = 0; v < V; v++)
        if (z[v] > mx) mx = z[v];
    for (v = 0; v < V; v++) s += exp(z[v] - mx);
    return mx + log(s) - z[t];
}

/* ------------------------------------------------------------------ embedding */
typedef struct {
    const int32_t *tok;
    double *wte, *r, *out;
    int64_t N, C;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = (emb_ctx *)p;
    ref_embedding(c->out, c->tok, c->wte, c->N, c->C);
    return dot_rd(c->r, c->out, c->N * c->C);
}

static void test_embedding(void) {
    enum { V = 7, C = 70, N = 11 };

    int32_t tok[N] = {3, 0, 6, 3, 3, 1, 5, 0, 6, 2, 3};
    float *wte = fvec(V * C, 1), *out = fvec(N * C, 9), *r = fvec(N * C, 1), *dw = fvec(V * C, 1),
          *dw0 = fdup(dw, V * C);
    double *wd = dvec_from(wte, V * C), *ref = dzeros(N * C), *rd = dvec_from(r, N * C), *g, mfd,
           err;
    emb_ctx cx;
    O0.embedding_fwd(&O0, out, tok, wte, N, C, US_F32);
    ref_embedding(ref, tok, wd, N, C);
    CHECK(max_rel(out, ref, N * C) == 0, "embedding fwd equals the gathered rows");
    O0.embedding_bwd(&O0, dw, r, tok, N, C, US_F32); /* dwte += scatter */
    g = f2d_diff(dw, dw0, V * C);
    cx.tok = tok;
    cx.wte = wd;
    cx.r = rd;
    cx.out = ref;
    cx.N = N;
    cx.C = C;
    err = fd_check(emb_loss, &cx, wd, V * C, g, NULL, 0, &mfd);
    CHECK(FD_OK(err, mfd), "embedding bwd (+=) vs finite differences: max err %.3g (max |fd| %.3g)",
          err, mfd);
    report("embedding dwte", err);
    { /* bf16: the gather copies the bits */
        uint16_t *w16 = to_bf16(wte, V * C), *o16 = (uint16_t *)malloc(N * C * 2);
        int64_t i, bad = 0;
        O0.embedding_fwd(&O0, o16, tok, w16, N, C, US_BF16);
        for (i = 0; i < N * C; i++)
            if (o16[i] != w16[tok[i / C] * C + i % C]) bad++;
        CHECK(bad == 0, "embedding fwd bf16 copies the rows bitwise: %lld bad", (long long)bad);
        free(w16);
        free(o16);
    }
    free(wte);
    free(out);
    free(r);
    free(dw);
    free(dw0);
    free(wd);
    free(ref);
    free(rd);
    free(g);
}

/* ------------------------------------------------------------------ rmsnorm */
typedef struct {
    double *x, *w, *r, *y;
    int64_t N, C;
    double eps;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = (rms_ctx *)p;
    ref_rmsnorm(c->y, NULL, c->x, c->w, c->N, c->C, c->eps);
    return dot_rd(c->r, c->y, c->N * c->C);
}

static void test_rmsnorm(void) {
    enum { N = 6, C = 70 };

    const float eps = 1e-5f;
    float *x = fvec(N * C, 2), *w = fvec(C, 1.5f), *y = fvec(N * C, 1), *rstd = fvec(N, 1),
          *r = fvec(N * C, 1);
    float *dx = fvec(N * C, 1), *dx0, *dw = fvec(C, 1), *dw0 = fdup(dw, C);
    double *xd = dvec_from(x, N * C), *wd = dvec_from(w, C), *rd = dvec_from(r, N * C),
           *yref = dzeros(N * C), *rref = dzeros(N);
    double *gx, *gw, e1, e2, m1, m2;
    rms_ctx cx;
    int64_t i;
    for (i = 0; i < C; i++) x[1 * C + i] *= 1e-3f; /* a row where eps matters */
    for (i = 0; i < C; i++) xd[1 * C + i] = x[1 * C + i];
    dx0 = fdup(dx, N * C);
    O0.rmsnorm_fwd(&O0, y, rstd, x, w, N, C, eps, US_F32);
    ref_rmsnorm(yref, rref, xd, wd, N, C, eps);
    e1 = max_rel(y, yref, N * C);
    e2 = 0;
    for (i = 0; i < N; i++) {
        double e = fabs(rstd[i] - rref[i]) / rref[i];
        if (e > e2) e2 = e;
    }
    CHECK(e1 <= 1e-5, "rmsnorm fwd vs double reference: max rel err %.3g", e1);
    CHECK(e2 <= 1e-6, "rmsnorm rstd vs double reference: max rel err %.3g", e2);
    O0.rmsnorm_bwd(&O0, dx, dw, r, x, w, rstd, N, C, US_F32);
    gx = f2d_diff(dx, dx0, N * C);
    gw = f2d_diff(dw, dw0, C);
    cx.x = xd;
    cx.w = wd;
    cx.r = rd;
    cx.y = yref;
    cx.N = N;
    cx.C = C;
    cx.eps = eps;
    e1 = fd_check(rms_loss, &cx, xd, N * C, gx, NULL, 0, &m1);
    e2 = fd_check(rms_loss, &cx, wd, C, gw, NULL, 0, &m2);
    CHECK(FD_OK(e1, m1), "rmsnorm dx (+=) vs finite differences: max err %.3g (max |fd| %.3g)", e1,
          m1);
    CHECK(FD_OK(e2, m2), "rmsnorm dw (+=) vs finite differences: max err %.3g (max |fd| %.3g)", e2,
          m2);
    report("rmsnorm dx", e1);
    report("rmsnorm dw", e2);
    { /* bf16 forward on bf16-rounded inputs */
        uint16_t *x16, *w16, *y16 = (uint16_t *)malloc(N * C * 2);
        float *rs16 = fvec(N, 1);
        round_bf16(x, N * C);
        round_bf16(w, C);
        x16 = to_bf16(x, N * C);
        w16 = to_bf16(w, C);
        O0.rmsnorm_fwd(&O0, y, rstd, x, w, N, C, eps, US_F32);
        O0.rmsnorm_fwd(&O0, y16, rs16, x16, w16, N, C, eps, US_BF16);
        CHECK(bf16_max_ulps(y16, y, N * C) <= 1,
              "rmsnorm fwd bf16 within 1 ulp of rounded fp32 (max %lld ulps)",
              (long long)bf16_max_ulps(y16, y, N * C));
        CHECK(memcmp(rs16, rstd, N * 4) == 0,
              "rmsnorm rstd under bf16 equals fp32 rstd on the same inputs");
        free(x16);
        free(w16);
        free(y16);
        free(rs16);
    }
    free(x);
    free(w);
    free(y);
    free(rstd);
    free(r);
    free(dx);
    free(dx0);
    free(dw);
    free(dw0);
    free(xd);
    free(wd);
    free(rd);
    free(yref);
    free(rref);
    free(gx);
    free(gw);
}

/* ------------------------------------------------------------------ rope */
typedef struct {
    double *in, *out, *r;
    int64_t B, T;
    int NH, NKV, HS;
    const double *freq;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = (rope_ctx *)p;
    ref_rope(c->out, c->in, c->B, c->T, c->NH, c->NKV, c->HS, c->freq);
    return dot_rd(c->r, c->out, c->B * c->T * (c->NH + 2 * c->NKV) * c->HS);
}

/* The op with freq = plain RoPE's (ref_inv_freq) or Llama 3's (us_rope_freqs, checked by
   test_rope_freqs): forward against the reference, the inverse, finite differences, bf16. */
static void test_rope(int llama3) {
    enum { B = 2, T = 13, NH = 4, NKV = 2, HS = 8 };

    const int64_t n = (int64_t)B * T * (NH + 2 * NKV) * HS;
    float *x = fvec(n, 1), *y = fdup(x, n), *r = fvec(n, 1), *g = fdup(r, n), *back;
    double *xd = dvec_from(x, n), *yref = dzeros(n), *rd = dvec_from(r, n), *gd, e, mfd;
    double freq[HS / 2];
    const char *kind = llama3 ? "llama3" : "plain";
    rope_ctx cx;
    int64_t i;
    ref_inv_freq(freq, HS, 10000.0);
    if (llama3) { /* an original context of 16 so that the rule acts on T = 13 positions */
        us_model_config mc;
        memset(&mc, 0, sizeof mc);
        mc.dim = NH * HS;
        mc.n_heads = NH;
        mc.rope_theta = 500000.0f;
        mc.rope_scaling = US_ROPE_LLAMA3;
        mc.rope_factor = 32.0f;
        mc.rope_orig_ctx = 16;
        us_rope_freqs(&mc, freq);
    }
    O0.rope_fwd(&O0, y, B, T, NH, NKV, HS, freq, US_F32);
    ref_rope(yref, xd, B, T, NH, NKV, HS, freq);
    e = max_rel(y, yref, n);
    CHECK(e <= 1e-6, "rope fwd (%s) vs HF rotate-half reference: max err %.3g", kind, e);
    if (!llama3) { /* pair (j, j+HS/2) of q head 0 at position t=5 rotated by 5·theta^(−2j/HS) */
        int64_t t = 5, row = (0 * T + t) * (NH + 2 * NKV) * HS;
        double worst = 0;
        int j;
        for (j = 0; j < HS / 2; j++) {
            double ang = 5.0 * pow(10000.0, -2.0 * j / HS), a = x[row + j], b = x[row + j + HS / 2];
            double ya = a * cos(ang) - b * sin(ang), yb = a * sin(ang) + b * cos(ang);
            worst = nmax(worst, nmax(fabs(y[row + j] - ya), fabs(y[row + j + HS / 2] - yb)));
        }
        CHECK(worst <= 1e-6, "rope rotates pair (j, j+HS/2) by t·theta^(-2j/HS): max err %.3g",
              worst);
    }
    /* v heads untouched */
    {
        int64_t bad = 0, bt;
        int d;
        for (bt = 0; bt < B * T; bt++)
            for (d = (NH + NKV) * HS; d < (NH + 2 * NKV) * HS; d++)
                if (y[bt * (NH + 2 * NKV) * HS + d] != x[bt * (NH + 2 * NKV) * HS + d]) bad++;
        CHECK(bad == 0, "rope leaves the v heads untouched: %lld changed", (long long)bad);
    }
    back = fdup(y, n);
    O0.rope_bwd(&O0, back, B, T, NH, NKV, HS, freq, US_F32);
    e = 0;
    for (i = 0; i < n; i++) e = nmax(e, fabs(back[i] - x[i]));
    CHECK(e <= 1e-6, "rope_bwd(rope_fwd(x)) == x (%s): max err %.3g", kind, e);
    O0.rope_bwd(&O0, g, B, T, NH, NKV, HS, freq, US_F32);
    gd = dvec_from(g, n);
    cx.in = xd;
    cx.out = yref;
    cx.r = rd;
    cx.B = B;
    cx.T = T;
    cx.NH = NH;
    cx.NKV = NKV;
    cx.HS = HS;
    cx.freq = freq;
    e = fd_check(rope_loss, &cx, xd, n, gd, NULL, 0, &mfd);
    CHECK(FD_OK(e, mfd), "rope bwd (%s) vs finite differences: max err %.3g (max |fd| %.3g)", kind,
          e, mfd);
    report(llama3 ? "rope dqkv (llama3)" : "rope dqkv", e);
    { /* bf16 forward */
        uint16_t *x16;
        float *y32;
        round_bf16(x, n);
        x16 = to_bf16(x, n);
        y32 = fdup(x, n);
        O0.rope_fwd(&O0, y32, B, T, NH, NKV, HS, freq, US_F32);
        O0.rope_fwd(&O0, x16, B, T, NH, NKV, HS, freq, US_BF16);
        CHECK(bf16_max_ulps(x16, y32, n) <= 1,
              "rope fwd bf16 within 1 ulp of rounded fp32 (max %lld ulps)",
              (long long)bf16_max_ulps(x16, y32, n));
        free(x16);
        free(y32);
    }
    free(x);
    free(y);
    free(r);
    free(g);
    free(back);
    free(xd);
    free(yref);
    free(rd);
    free(gd);
}

/* us_rope_freqs at Llama 3.1 8B's shape (HS 128, θ 500000): plain RoPE is θ^(−2j/HS); Llama 3's
   rule (its defaults: factor 8, low 1, high 4, original context 8192) keeps the wavelengths
   under 8192/4, divides the frequencies of those over 8192 by 8 and blends the ones between,
   each blended one strictly between f/8 and f, and the result decreasing in j.
   (Agreement with transformers' own numbers: test_ckpt --hf.) */
static void test_rope_freqs(void) {
    enum { HS = 128 };

    double ref[HS / 2], f[HS / 2], g[HS / 2], e = 0, wl;
    int j, kept = 0, scaled = 0, blended = 0, bad = 0, mono = 1;
    us_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.dim = 32 * HS;
    mc.n_heads = 32;
    mc.rope_theta = 500000.0f;
    ref_inv_freq(ref, HS, 500000.0);
    us_rope_freqs(&mc, f);
    for (j = 0; j < HS / 2; j++) e = nmax(e, fabs(f[j] - ref[j]) / ref[j]);
    CHECK(e <= 1e-15, "us_rope_freqs without scaling is theta^(-2j/HS): max rel err %.3g", e);
    mc.rope_scaling = US_ROPE_LLAMA3;
    us_rope_freqs(&mc, g);
    for (j = 0; j < HS / 2; j++) {
        wl = 2 * 3.14159265358979323846 / ref[j];
        if (wl < 8192.0 / 4) {
            kept++;
            bad += g[j] != f[j];
        } else if (wl > 8192.0) {
            scaled++;
            bad += fabs(g[j] - ref[j] / 8) > 1e-15 * ref[j];
        } else {
            blended++;
            bad += !(g[j] > ref[j] / 8 && g[j] < ref[j]);
        }
        if (j && !(g[j] < g[j - 1])) mono = 0;
    }
    CHECK(kept && scaled && blended && !bad,
          "llama3: %d frequencies kept, %d divided by 8, %d blended between; %d wrong", kept,
          scaled, blended, bad);
    CHECK(mono, "llama3: the frequencies still decrease with j");
}

/* ------------------------------------------------------------------ attention */
typedef struct {
    double *qkv, *out, *r;
    int64_t B, T;
    int NH, NKV, HS;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = (att_ctx *)p;
    ref_attention(c->out, NULL, c->qkv, c->B, c->T, c->NH, c->NKV, c->HS);
    return dot_rd(c->r, c->out, c->B * c->T * c->NH * c->HS);
}

static void test_attention(int64_t T, int full_fd) {
    enum { B = 2, NH = 4, NKV = 2, HS = 8 };

    const int64_t QKV = (NH + 2 * NKV) * HS, n = B * T * QKV, no = B * T * NH * HS, nl = B * NH * T;
    float *qkv = fvec(n, 1.5f), *out = fvec(no, 9), *lse = fvec(nl, 9), *naive = fvec(no, 9),
          *r = fvec(no, 1), *dqkv = fvec(n, 123);
    double *qd = dvec_from(qkv, n), *oref = dzeros(no), *lref = dzeros(nl), *rd = dvec_from(r, no),
           *gd, e, e2, mfd;
    int64_t i, *idx = NULL, nidx = 0;
    att_ctx cx;
    O0.attention_fwd(&O0, out, lse, qkv, B, T, NH, NKV, HS, US_F32);
    ref_attention(oref, lref, qd, B, T, NH, NKV, HS);
    us_attention_naive_fwd(naive, qkv, B, T, NH, NKV, HS);
    e = max_rel(out, oref, no);
    CHECK(e <= 1e-5, "attention fwd T=%lld vs double reference: max err %.3g", (long long)T, e);
    e2 = max_rel(lse, lref, nl);
    CHECK(e2 <= 1e-5, "attention lse T=%lld vs double log-sum-exp: max err %.3g", (long long)T, e2);
    e = 0;
    for (i = 0; i < no; i++) e = nmax(e, fabs(out[i] - naive[i]));
    CHECK(e <= 1e-5, "attention blockwise fwd T=%lld equals us_attention_naive_fwd: max err %.3g",
          (long long)T, e);
    O0.attention_bwd(&O0, dqkv, r, qkv, out, lse, B, T, NH, NKV, HS,
                     US_F32); /* overwrites the 123s */
    gd = dvec_from(dqkv, n);
    cx.qkv = qd;
    cx.out = oref;
    cx.r = rd;
    cx.B = B;
    cx.T = T;
    cx.NH = NH;
    cx.NKV = NKV;
    cx.HS = HS;
    if (!full_fd) { /* a sample: every element of the rows around the key-block boundary, plus random ones */
        int64_t t, d, b;
        idx = (int64_t *)malloc((size_t)(4 * B * QKV + 300) * sizeof *idx);
        for (b = 0; b < B; b++) {
            int64_t rows[4] = {0, 63, 64, T - 1};
            for (t = 0; t < 4; t++)
                for (d = 0; d < QKV; d++) idx[nidx++] = (b * T + rows[t]) * QKV + d;
        }
        for (i = 0; i < 300; i++) idx[nidx++] = (int64_t)(rnd64() % (uint64_t)n);
    }
    e = fd_check(att_loss, &cx, qd, n, gd, idx, nidx, &mfd);
    CHECK(
        FD_OK(e, mfd),
        "attention bwd T=%lld vs finite differences (%lld elements): max err %.3g (max |fd| %.3g)",
        (long long)T, (long long)(idx ? nidx : n), e, mfd);
    report(T == 13 ? "attention dqkv T=13" : "attention dqkv T=70 (sampled)", e);
    { /* bf16 forward on bf16-rounded inputs */
        uint16_t *q16, *o16 = (uint16_t *)malloc((size_t)no * 2);
        float *l16 = fvec(nl, 1);
        round_bf16(qkv, n);
        q16 = to_bf16(qkv, n);
        O0.attention_fwd(&O0, out, lse, qkv, B, T, NH, NKV, HS, US_F32);
        O0.attention_fwd(&O0, o16, l16, q16, B, T, NH, NKV, HS, US_BF16);
        CHECK(bf16_max_ulps(o16, out, no) <= 1,
              "attention fwd bf16 T=%lld within 1 ulp of rounded fp32 (max %lld ulps)",
              (long long)T, (long long)bf16_max_ulps(o16, out, no));
        e = 0;
        for (i = 0; i < nl; i++) e = nmax(e, fabs(l16[i] - lse[i]));
        CHECK(e <= 1e-5, "attention lse bf16 T=%lld vs fp32 on the same inputs: max err %.3g",
              (long long)T, e);
        free(q16);
        free(o16);
        free(l16);
    }
    free(qkv);
    free(out);
    free(lse);
    free(naive);
    free(r);
    free(dqkv);
    free(qd);
    free(oref);
    free(lref);
    free(rd);
    free(gd);
    free(idx);
}

/* ------------------------------------------------------------------ swiglu */
typedef struct {
    double *gu, *h, *r;
    int64_t N, F;
} swi_ctx;

static double swi_loss(void *p) {
    swi_ctx *c = (swi_ctx *)p;
    ref_swiglu(c->h, c->gu, c->N, c->F);
    return dot_rd(c->r, c->h, c->N * c->F);
}

static void test_swiglu(void) {
    enum { N = 7, F = 12 };

    float *gu = fvec(N * 2 * F, 4), *h = fvec(N * F, 1), *r = fvec(N * F, 1),
          *dgu = fvec(N * 2 * F, 77);
    double *gud = dvec_from(gu, N * 2 * F), *href = dzeros(N * F), *rd = dvec_from(r, N * F), *gd,
           e, mfd;
    swi_ctx cx;
    O0.swiglu_fwd(&O0, h, gu, N, F, US_F32);
    ref_swiglu(href, gud, N, F);
    e = max_rel(h, href, N * F);
    CHECK(e <= 1e-6, "swiglu fwd vs double reference: max err %.3g", e);
    O0.swiglu_bwd(&O0, dgu, r, gu, N, F, US_F32); /* overwrites */
    gd = dvec_from(dgu, N * 2 * F);
    cx.gu = gud;
    cx.h = href;
    cx.r = rd;
    cx.N = N;
    cx.F = F;
    e = fd_check(swi_loss, &cx, gud, N * 2 * F, gd, NULL, 0, &mfd);
    CHECK(FD_OK(e, mfd), "swiglu bwd vs finite differences: max err %.3g (max |fd| %.3g)", e, mfd);
    report("swiglu dgu", e);
    {
        uint16_t *g16, *h16 = (uint16_t *)malloc(N * F * 2);
        round_bf16(gu, N * 2 * F);
        g16 = to_bf16(gu, N * 2 * F);
        O0.swiglu_fwd(&O0, h, gu, N, F, US_F32);
        O0.swiglu_fwd(&O0, h16, g16, N, F, US_BF16);
        CHECK(bf16_max_ulps(h16, h, N * F) <= 1,
              "swiglu fwd bf16 within 1 ulp of rounded fp32 (max %lld ulps)",
              (long long)bf16_max_ulps(h16, h, N * F));
        free(g16);
        free(h16);
    }
    free(gu);
    free(h);
    free(r);
    free(dgu);
    free(gud);
    free(href);
    free(rd);
    free(gd);
}

/* ------------------------------------------------------------------ gemm */
typedef struct {
    int ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    double alpha, beta, *A, *B, *C0, *C, *r;
} gemm_ctx;

static double gemm_loss(void *p) {
    gemm_ctx *c = (gemm_ctx *)p;
    int64_t i, j;
    double s = 0;
    ref_gemm(c->C, c->ta, c->tb, c->M, c->N, c->K, c->alpha, c->A, c->lda, c->B, c->ldb, c->beta,
             c->C0, c->ldc);
    for (i = 0; i < c->M; i++)
        for (j = 0; j < c->N; j++) s += c->r[i * c->N + j] * c->C[i * c->ldc + j];
    return s;
}

static void test_gemm(void) {
    const int64_t M = 5, N = 7, K = 9;
    int ta, tb, bi;
    double worst_fd = 0;
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++)
            for (bi = 0; bi < 3; bi++) {
                const float alpha = 0.7f, betas[3] = {0.0f, 1.0f, -0.5f}, beta = betas[bi];
                /* row-major with padded leading dimensions; the padding holds NaN and must never be read */
                int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                int64_t lda = ac + 3, ldb = bc + 2, ldc = N + 1, i, j;
                float *A = fvec(ar * lda, 1), *Bm = fvec(br * ldb, 1), *C = fvec(M * ldc, 1), *C0,
                      *R = fvec(M * N, 1);
                float *dA = fvec(ar * lda, 5), *dB = fvec(br * ldb, 5);
                double *Ad, *Bd, *C0d, *Cref = dzeros(M * ldc), *Rd = dvec_from(R, M * N), *gA, *gB,
                                       e, m1, m2, e1, e2;
                gemm_ctx cx;
                int64_t *ia = (int64_t *)malloc((size_t)(ar * ac) * sizeof *ia),
                        *ib = (int64_t *)malloc((size_t)(br * bc) * sizeof *ib), na = 0, nb = 0;
                for (i = 0; i < ar; i++)
                    for (j = ac; j < lda; j++) A[i * lda + j] = NAN;
                for (i = 0; i < br; i++)
                    for (j = bc; j < ldb; j++) Bm[i * ldb + j] = NAN;
                if (beta == 0)
                    for (i = 0; i < M * ldc; i++) C[i] = NAN;    /* beta 0 never reads C */
                for (i = 0; i < M; i++) C[i * ldc + N] = -99.0f; /* C padding must stay */
                C0 = fdup(C, M * ldc);
                Ad = dvec_from(A, ar * lda);
                Bd = dvec_from(Bm, br * ldb);
                C0d = dvec_from(C0, M * ldc);
                O0.gemm(&O0, ta, tb, M, N, K, alpha, A, US_F32, lda, Bm, US_F32, ldb, beta, C,
                        US_F32, ldc);
                ref_gemm(Cref, ta, tb, M, N, K, alpha, Ad, lda, Bd, ldb, beta, C0d, ldc);
                e = 0;
                for (i = 0; i < M; i++)
                    for (j = 0; j < N; j++)
                        e = nmax(e, fabs(C[i * ldc + j] - Cref[i * ldc + j]) /
                                        (1 + fabs(Cref[i * ldc + j])));
                if (e != e) e = INFINITY;
                CHECK(e <= 1e-6, "gemm ta=%d tb=%d beta=%g fwd vs double reference: max err %.3g",
                      ta, tb, beta, e);
                e = 0;
                for (i = 0; i < M; i++)
                    if (C[i * ldc + N] != -99.0f) e = 1;
                CHECK(e == 0, "gemm ta=%d tb=%d beta=%g leaves C's padding (ldc > N) alone", ta, tb,
                      beta);
                /* the backward GEMMs the model would issue: dop(A) = alpha·R·op(B)^T, dop(B) = alpha·op(A)^T·R,
                   written in the storage layout of A and B */
                if (!ta)
                    O0.gemm(&O0, 0, !tb, M, K, N, alpha, R, US_F32, N, Bm, US_F32, ldb, 0.0f, dA,
                            US_F32, lda);
                else
                    O0.gemm(&O0, tb, 1, K, M, N, alpha, Bm, US_F32, ldb, R, US_F32, N, 0.0f, dA,
                            US_F32, lda);
                if (!tb)
                    O0.gemm(&O0, !ta, 0, K, N, M, alpha, A, US_F32, lda, R, US_F32, N, 0.0f, dB,
                            US_F32, ldb);
                else
                    O0.gemm(&O0, 1, ta, N, K, M, alpha, R, US_F32, N, A, US_F32, lda, 0.0f, dB,
                            US_F32, ldb);
                gA = dvec_from(dA, ar * lda);
                gB = dvec_from(dB, br * ldb);
                for (i = 0; i < ar; i++)
                    for (j = 0; j < ac; j++) ia[na++] = i * lda + j;
                for (i = 0; i < br; i++)
                    for (j = 0; j < bc; j++) ib[nb++] = i * ldb + j;
                cx.ta = ta;
                cx.tb = tb;
                cx.M = M;
                cx.N = N;
                cx.K = K;
                cx.lda = lda;
                cx.ldb = ldb;
                cx.ldc = ldc;
                cx.alpha = alpha;
                cx.beta = beta;
                cx.A = Ad;
                cx.B = Bd;
                cx.C0 = C0d;
                cx.C = Cref;
                cx.r = Rd;
                e1 = fd_check(gemm_loss, &cx, Ad, ar * lda, gA, ia, na, &m1);
                e2 = fd_check(gemm_loss, &cx, Bd, br * ldb, gB, ib, nb, &m2);
                CHECK(FD_OK(e1, m1) && FD_OK(e2, m2),
                      "gemm ta=%d tb=%d beta=%g backward GEMMs vs finite differences: dA err %.3g, "
                      "dB err %.3g",
                      ta, tb, beta, e1, e2);
                worst_fd = nmax(worst_fd, nmax(e1, e2));
                if (bi == 1) { /* bf16 operands and output, beta 1 accumulating into a bf16 C */
                    uint16_t *A16, *B16, *C16;
                    float *Cf;
                    round_bf16(A, ar * lda);
                    round_bf16(Bm, br * ldb);
                    round_bf16(C0, M * ldc);
                    A16 = to_bf16(A, ar * lda);
                    B16 = to_bf16(Bm, br * ldb);
                    C16 = to_bf16(C0, M * ldc);
                    Cf = fdup(C0, M * ldc);
                    O0.gemm(&O0, ta, tb, M, N, K, alpha, A, US_F32, lda, Bm, US_F32, ldb, beta, Cf,
                            US_F32, ldc);
                    O0.gemm(&O0, ta, tb, M, N, K, alpha, A16, US_BF16, lda, B16, US_BF16, ldb, beta,
                            C16, US_BF16, ldc);
                    e = 0;
                    for (i = 0; i < M; i++)
                        for (j = 0; j < N; j++) {
                            double d = (double)bf16_ulps(C16[i * ldc + j],
                                                         us_f32_to_bf16(Cf[i * ldc + j]));
                            if (d > e) e = d;
                        }
                    CHECK(e <= 1,
                          "gemm ta=%d tb=%d bf16 within 1 ulp of rounded fp32 (max %g ulps)", ta,
                          tb, e);
                    free(A16);
                    free(B16);
                    free(C16);
                    free(Cf);
                }
                free(A);
                free(Bm);
                free(C);
                free(C0);
                free(R);
                free(dA);
                free(dB);
                free(Ad);
                free(Bd);
                free(C0d);
                free(Cref);
                free(Rd);
                free(gA);
                free(gB);
                free(ia);
                free(ib);
            }
    report("gemm dA/dB", worst_fd);
}

/* ------------------------------------------------------------------ cross-entropy */
typedef struct {
    double *z;
    const int32_t *tgt;
    int64_t N, V;
    double dscale;
} xent_ctx;

static double xent_loss(void *p) {
    xent_ctx *c = (xent_ctx *)p;
    double s = 0;
    int64_t n;
    for (n = 0; n < c->N; n++) s += ref_xent_row(c->z + n * c->V, c->V, c->tgt[n]);
    return c->dscale * s;
}

static void test_xent(void) {
    enum { N = 9, V = 11 };

    int32_t tgt[N] = {3, -1, 0, 10, 5, -1, 7, 7, 2}, am[N];
    const float dscale = 0.37f;
    float *z = fvec(N * V, 4), *zc = fdup(z, N * V), *loss = fvec(N, 9), *loss2 = fvec(N, 9);
    double *zd = dvec_from(z, N * V), *gd, e, mfd;
    int64_t n, v, bad = 0;
    xent_ctx cx;
    z[4 * V + 2] = 30.0f;
    zd[4 * V + 2] = 30.0f;
    zc[4 * V + 2] = 30.0f;                               /* a large logit: needs the max shift */
    O0.xent(&O0, loss, am, zc, tgt, N, V, 0.0f, US_F32); /* dscale 0: logits untouched */
    CHECK(memcmp(zc, z, N * V * 4) == 0, "xent with dscale 0 leaves the logits untouched");
    e = 0;
    for (n = 0; n < N; n++) {
        int64_t best = 0;
        e = nmax(e, fabs(loss[n] - ref_xent_row(zd + n * V, V, tgt[n])) /
                        (1 + ref_xent_row(zd + n * V, V, tgt[n])));
        for (v = 1; v < V; v++)
            if (zd[n * V + v] > zd[n * V + best]) best = v;
        if (am[n] != best) bad++;
        if (tgt[n] < 0 && loss[n] != 0) bad++;
    }
    CHECK(e <= 1e-6, "xent losses vs double reference: max err %.3g", e);
    CHECK(bad == 0, "xent argmax correct and ignored rows give loss 0: %lld bad", (long long)bad);
    O0.xent(&O0, loss2, NULL, zc, tgt, N, V, dscale,
            US_F32); /* argmax may be NULL; logits become dlogits */
    CHECK(memcmp(loss, loss2, N * 4) == 0,
          "xent losses are the same with and without the gradient");
    gd = dvec_from(zc, N * V);
    cx.z = zd;
    cx.tgt = tgt;
    cx.N = N;
    cx.V = V;
    cx.dscale = dscale;
    e = fd_check(xent_loss, &cx, zd, N * V, gd, NULL, 0, &mfd);
    CHECK(FD_OK(e, mfd),
          "xent dlogits vs finite differences of dscale·Σloss: max err %.3g (max |fd| %.3g)", e,
          mfd);
    report("xent dlogits", e);
    bad = 0;
    for (v = 0; v < V; v++)
        if (zc[1 * V + v] != 0 || zc[5 * V + v] != 0) bad++;
    CHECK(bad == 0, "xent rows with target -1 get exactly zero gradient");
    { /* bf16 logits */
        uint16_t *z16;
        float *l16 = fvec(N, 1), *z32;
        int32_t am16[N];
        round_bf16(z, N * V);
        z16 = to_bf16(z, N * V);
        z32 = fdup(z, N * V);
        O0.xent(&O0, loss, am, z32, tgt, N, V, dscale, US_F32);
        O0.xent(&O0, l16, am16, z16, tgt, N, V, dscale, US_BF16);
        e = 0;
        for (n = 0; n < N; n++) e = nmax(e, fabs(l16[n] - loss[n]));
        CHECK(e <= 1e-6 && memcmp(am, am16, sizeof am) == 0,
              "xent bf16 losses/argmax equal fp32 on the same logits (max err %.3g)", e);
        CHECK(bf16_max_ulps(z16, z32, N * V) <= 1,
              "xent bf16 dlogits within 1 ulp of rounded fp32 (max %lld ulps)",
              (long long)bf16_max_ulps(z16, z32, N * V));
        free(z16);
        free(l16);
        free(z32);
    }
    free(z);
    free(zc);
    free(loss);
    free(loss2);
    free(zd);
    free(gd);
}

/* ------------------------------------------------------------------ AdamW */
static void test_adamw(void) {
    enum { n = 37 };

    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gscale = 0.5f;
    float *p = fvec(n, 1), *m = (float *)calloc(n, 4), *v = (float *)calloc(n, 4), *g = fvec(n, 1);
    float *p2 = fdup(p, n), *m2 = (float *)calloc(n, 4), *v2 = (float *)calloc(n, 4);
    uint16_t low[n];
    double pd[n], pn[n], md[n], vd[n], ep = 0, em = 0, ev = 0, ep2 = 0, epn = 0;
    int step, i, badlow = 0;
    for (i = 0; i < n; i++) {
        pd[i] = pn[i] = p[i];
        md[i] = vd[i] = 0;
    }
    g[0] = 0; /* a zero gradient: update is decay only */
    for (step = 1; step <= 3; step++) {
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        if (step > 1)
            for (i = 0; i < n; i++) g[i] = rndu(2);
        O0.adamw(&O0, p, g, m, v, low, US_BF16, n, lr, b1, b2, eps, wd, gscale, step);
        O0.adamw(&O0, p2, g, m2, v2, NULL, US_BF16, n, lr, b1, b2, eps, 0.0f, gscale,
                 step); /* no decay, no low copy */
        for (i = 0; i < n; i++) {
            double gi = (double)g[i] * gscale;
            md[i] = b1 * md[i] + (1 - (double)b1) * gi;
            vd[i] = b2 * vd[i] + (1 - (double)b2) * gi * gi;
            pd[i] *= 1 - (double)lr * wd;
            pd[i] -= lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + eps);
            pn[i] -= lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + eps);
            epn = nmax(epn, fabs(p2[i] - pn[i]) / (1 + fabs(pn[i])));
            ep = nmax(ep, fabs(p[i] - pd[i]) / (1 + fabs(pd[i])));
            em = nmax(em, fabs(m[i] - md[i]) / (1e-3 + fabs(md[i])));
            ev = nmax(ev, fabs(v[i] - vd[i]) / (1e-6 + fabs(vd[i])));
            if (low[i] != us_f32_to_bf16(p[i])) badlow++;
        }
    }
    for (i = 0; i < n; i++) /* the moments do not depend on weight decay */
        if (memcmp(&m[i], &m2[i], 4) || memcmp(&v[i], &v2[i], 4)) ep2 = 1;
    CHECK(ep <= 1e-6, "adamw p after 3 steps vs double PyTorch AdamW: max rel err %.3g", ep);
    CHECK(em <= 1e-5 && ev <= 1e-5, "adamw moments vs double reference: m err %.3g, v err %.3g", em,
          ev);
    CHECK(badlow == 0, "adamw bf16 low-precision copy equals us_f32_to_bf16(p) bitwise: %d bad",
          badlow);
    CHECK(ep2 == 0, "adamw moments do not depend on weight decay");
    CHECK(epn <= 1e-6, "adamw with wd=0 and no low copy vs double reference: max rel err %.3g",
          epn);
    report("adamw p (rel)", ep);
    free(p);
    free(m);
    free(v);
    free(g);
    free(p2);
    free(m2);
    free(v2);
}

/* ------------------------------------------------------------------ sumsq */
static void test_sumsq(void) {
    const int64_t n = 10007;
    float *x = fvec(n, 3);
    double s = 0, got;
    int64_t i;
    for (i = 0; i < n; i++) s += (double)x[i] * x[i];
    got = O0.sumsq(&O0, x, n);
    CHECK(fabs(got - s) <= 1e-12 * s, "sumsq vs double sum: %.17g vs %.17g", got, s);
    CHECK(O0.sumsq(&O0, x, 0) == 0, "sumsq of 0 elements is 0");
    CHECK(O0.sumsq(&O0, x, 1) == (double)x[0] * x[0], "sumsq of 1 element");
    free(x);
}

/* ------------------------------------------------------------------ determinism 1 vs 2 threads */
static void test_determinism(void) {
    enum { B = 2, T = 70, NH = 4, NKV = 2, HS = 8, N = B * T, C = 130, V = 9, F = 40 };

    const int64_t QKV = (NH + 2 * NKV) * HS;
    us_ops *ops[2] = {&O1, &O2};
    double freq[HS / 2];
    float *res[2][12];
    uint16_t low[2][N];
    int k, bad[12] = {0}, i;
    float *x = fvec(N * C, 2), *w = fvec(C, 1), *dy = fvec(N * C, 1), *qkv = fvec(N * QKV, 1),
          *datt = fvec(N * NH * HS, 1);
    float *gu = fvec(N * 2 * F, 3), *dh = fvec(N * F, 1), *logits = fvec(N * V, 3),
          *pg = fvec(N, 1), *A = fvec(N * C, 1), *Bm = fvec(C * 33, 1);
    int32_t tok[N], tgt[N];
    const char *names[12] = {"embedding_bwd",
                             "rmsnorm_bwd dx",
                             "rmsnorm_bwd dw",
                             "rope_bwd",
                             "attention_fwd out",
                             "attention_fwd lse",
                             "attention_bwd",
                             "swiglu_bwd",
                             "xent",
                             "adamw",
                             "gemm",
                             "sumsq"};
    ref_inv_freq(freq, HS, 10000.0);
    for (i = 0; i < N; i++) {
        tok[i] = (int32_t)(rnd64() % 5);
        tgt[i] = (i % 7 == 0) ? -1 : (int32_t)(rnd64() % V);
    }
    for (k = 0; k < 2; k++) {
        us_ops *o = ops[k];
        float *rstd = fvec(N, 0), *y = fvec(N * C, 0), *att = fvec(N * NH * HS, 0),
              *lse = fvec(B * NH * T, 0);
        double s;
        for (i = 0; i < 12; i++) res[k][i] = NULL;
        res[k][0] = (float *)calloc(5 * C, 4);
        o->embedding_bwd(o, res[k][0], dy, tok, N, C, US_F32);
        o->rmsnorm_fwd(o, y, rstd, x, w, N, C, 1e-5f, US_F32);
        res[k][1] = (float *)calloc(N * C, 4);
        res[k][2] = (float *)calloc(C, 4);
        o->rmsnorm_bwd(o, res[k][1], res[k][2], dy, x, w, rstd, N, C, US_F32);
        res[k][3] = fdup(qkv, N * QKV);
        o->rope_bwd(o, res[k][3], B, T, NH, NKV, HS, freq, US_F32);
        o->attention_fwd(o, att, lse, qkv, B, T, NH, NKV, HS, US_F32);
        res[k][4] = fdup(att, N * NH * HS);
        res[k][5] = fdup(lse, B * NH * T);
        res[k][6] = (float *)calloc(N * QKV, 4);
        o->attention_bwd(o, res[k][6], datt, qkv, att, lse, B, T, NH, NKV, HS, US_F32);
        res[k][7] = (float *)calloc(N * 2 * F, 4);
        o->swiglu_bwd(o, res[k][7], dh, gu, N, F, US_F32);
        res[k][8] = (float *)calloc(N * V + N, 4);
        memcpy(res[k][8], logits, N * V * 4);
        o->xent(o, res[k][8] + N * V, NULL, res[k][8], tgt, N, V, 0.01f, US_F32);
        res[k][9] = (float *)calloc(3 * N, 4);
        memcpy(res[k][9], x, N * 4);
        o->adamw(o, res[k][9], pg, res[k][9] + N, res[k][9] + 2 * N, low[k], US_BF16, N, 1e-3f,
                 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 1);
        res[k][10] = (float *)calloc(N * 33, 4);
        o->gemm(o, 0, 0, N, 33, C, 1.0f, A, US_F32, C, Bm, US_F32, 33, 0.0f, res[k][10], US_F32,
                33);
        res[k][11] = (float *)calloc(2, 4);
        s = o->sumsq(o, x, N * C);
        memcpy(res[k][11], &s, 8);
        free(rstd);
        free(y);
        free(att);
        free(lse);
    }
    {
        int64_t sz[12] = {5 * C,   N * C,     C,         N * QKV, N * NH * HS, B * NH * T,
                          N * QKV, N * 2 * F, N * V + N, 3 * N,   N * 33,      2};
        for (i = 0; i < 12; i++) {
            bad[i] = memcmp(res[0][i], res[1][i], (size_t)sz[i] * 4) != 0;
            CHECK(!bad[i], "%s: 1 thread and 2 threads give bit-identical results", names[i]);
        }
        CHECK(memcmp(low[0], low[1], sizeof low[0]) == 0,
              "adamw bf16 copy: 1 and 2 threads bit-identical");
    }
    for (k = 0; k < 2; k++)
        for (i = 0; i < 12; i++) free(res[k][i]);
    free(x);
    free(w);
    free(dy);
    free(qkv);
    free(datt);
    free(gu);
    free(dh);
    free(logits);
    free(pg);
    free(A);
    free(Bm);
}

/* ------------------------------------------------------------------ learning-rate schedule */
static void test_lr(void) {
    us_train_config tc;
    float prev;
    int s, mono = 1;
    memset(&tc, 0, sizeof tc);
    tc.lr = 1e-3f;
    tc.warmup = 10;
    tc.steps = 110;
    tc.min_lr_frac = 0.1f;
    tc.schedule = US_LR_COSINE;
    CHECK(fabs(us_lr_at(&tc, 0) - 1e-4) <= 1e-10, "warmup step 0 gives lr/warmup: %g",
          us_lr_at(&tc, 0));
    CHECK(fabs(us_lr_at(&tc, 4) - 5e-4) <= 1e-10, "warmup step 4 gives 5·lr/warmup: %g",
          us_lr_at(&tc, 4));
    CHECK(fabs(us_lr_at(&tc, 9) - 1e-3) <= 1e-10, "warmup reaches lr at step warmup-1: %g",
          us_lr_at(&tc, 9));
    CHECK(fabs(us_lr_at(&tc, 10) - 1e-3) <= 1e-10, "cosine starts at lr right after warmup: %g",
          us_lr_at(&tc, 10));
    CHECK(fabs(us_lr_at(&tc, 60) - 5.5e-4) <= 1e-9, "cosine half-way is (lr + floor)/2: %g",
          us_lr_at(&tc, 60));
    CHECK(fabs(us_lr_at(&tc, 110) - 1e-4) <= 1e-10, "cosine at `steps` equals lr·min_lr_frac: %g",
          us_lr_at(&tc, 110));
    CHECK(fabs(us_lr_at(&tc, 500) - 1e-4) <= 1e-10, "cosine past `steps` stays at the floor: %g",
          us_lr_at(&tc, 500));
    for (s = 1, prev = us_lr_at(&tc, 0); s < 10; s++) {
        if (!(us_lr_at(&tc, s) > prev)) mono = 0;
        prev = us_lr_at(&tc, s);
    }
    for (s = 10; s < 110; s++) {
        if (us_lr_at(&tc, s + 1) > us_lr_at(&tc, s)) mono = 0;
    }
    CHECK(mono, "lr rises linearly through warmup and never rises during the cosine decay");
    {
        double worst = 0;
        for (s = 10; s <= 110; s++) {
            double want =
                1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + cos(3.14159265358979323846 * (s - 10) / 100.0));
            worst = nmax(worst, fabs(us_lr_at(&tc, s) - want));
        }
        CHECK(worst <= 1e-9,
              "cosine matches lr_min + (lr-lr_min)/2·(1+cos(pi·progress)): max err %.3g", worst);
    }
    tc.schedule = US_LR_CONSTANT;
    CHECK(fabs(us_lr_at(&tc, 0) - 1e-4) <= 1e-10, "constant schedule still warms up: %g",
          us_lr_at(&tc, 0));
    mono = 1;
    for (s = 9; s < 300; s++)
        if (us_lr_at(&tc, s) != 1e-3f) mono = 0;
    CHECK(mono, "constant schedule stays at lr after warmup");
    tc.schedule = US_LR_COSINE;
    tc.warmup = 0;
    CHECK(us_lr_at(&tc, 0) == 1e-3f, "no warmup: step 0 is lr (%g)", us_lr_at(&tc, 0));
}

int main(int argc, char **argv) {
    int i;
    us_test_verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    O0 = us_cpu_ops(0);
    O1 = us_cpu_ops(1);
    O2 = us_cpu_ops(2);
    test_embedding();
    test_rmsnorm();
    test_rope(0);
    test_rope(1);
    test_rope_freqs();
    test_attention(13, 1);
    test_attention(70, 0);
    test_swiglu();
    test_gemm();
    test_xent();
    test_adamw();
    test_sumsq();
    test_determinism();
    test_lr();
    printf("max errors observed (backward vs finite differences; adamw: relative):\n");
    for (i = 0; i < nreport; i++) printf("  %-28s %.3g\n", maxerr_name[i], maxerr_report[i]);
    return us_test_done("test_ops");
}
