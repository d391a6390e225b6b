/* test_fp8.c — FP8 E4M3 tile quantisation (// >>fp8): hand-checked bit patterns and scales, the
   scale rule (zero tiles, power-of-two scales, NaN), quantise→dequantise within E4M3's half ulp
   element by element for every tiling and partial tiles, each tile's largest element at ±448,
   COL128 = ROW128 of the transpose byte for byte, BLOCK128 of Wᵀ = BLOCK128 of W transposed,
   bf16 input, bad arguments; the emulated FP8 GEMM against a double triple loop over the
   dequantised operands and against a scalar recomputation of its documented order (bit for bit,
   any thread count); and tile vs per-tensor scaling on inputs with outlier channels and outlier
   tokens, with the errors printed. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static double gauss(void) {
    double u = rnd01(), v = rnd01();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static float *falloc(int64_t n) { return (float *)calloc((size_t)(n > 0 ? n : 1), 4); }

static uint8_t *balloc(int64_t n) { return (uint8_t *)calloc((size_t)(n > 0 ? n : 1), 1); }

static const char *tname(us_fp8_tiling t) {
    return t == US_FP8_ROW128     ? "row128"
           : t == US_FP8_COL128   ? "col128"
           : t == US_FP8_BLOCK128 ? "block128"
                                  : "tensor";
}

/* index into s of element (m, k) of X[M][K] (the tile's id), and of q */
static int64_t sidx(us_fp8_tiling t, int64_t M, int64_t K, int64_t m, int64_t k) {
    int64_t KBp = ((K + 127) / 128 + 3) / 4 * 4;
    switch (t) {
    case US_FP8_COL128:
        return m / 128 * K + k;
    case US_FP8_BLOCK128:
        return m / 128 * KBp + k / 128;
    case US_FP8_TENSOR:
        return 0;
    default:
        return k / 128 * M + m;
    }
}

static int64_t qidx(us_fp8_tiling t, int64_t M, int64_t K, int64_t m, int64_t k) {
    return t == US_FP8_COL128 ? k * M + m : m * K + k;
}

/* half the spacing of E4M3 values around |v| (v already divided by the scale) */
static double e4m3_half_ulp(double v) {
    int e;
    v = fabs(v);
    if (v < 0.015625) return ldexp(1.0, -10); /* subnormals: spacing 2^-9 */
    (void)frexp(v, &e);                       /* v in [2^(e-1), 2^e): spacing 2^(e-1-3) */
    return ldexp(1.0, e - 5);
}

/* ------------------------------------------------------------------ scale rule and bit patterns */
static void test_scale_and_patterns(void) {
    float x[8], s[8], y[8];
    uint8_t q[8];
    CHECK(us_fp8_scale(0.0f, 0) == 1.0f && us_fp8_scale(0.0f, 1) == 1.0f, "amax 0 -> scale 1");
    CHECK(us_fp8_scale(1e-45f, 0) == 1.0f, "amax whose /448 underflows -> scale 1 (got %g)",
          us_fp8_scale(1e-45f, 0));
    CHECK(us_fp8_scale(448.0f, 0) == 1.0f && us_fp8_scale(448.0f, 1) == 1.0f, "amax 448 -> 1");
    CHECK(us_fp8_scale(3.5f, 0) == 0x1p-7f, "amax 3.5 -> 2^-7 (got %a)", us_fp8_scale(3.5f, 0));
    CHECK(us_fp8_scale(1.0f, 0) == 1.0f / 448.0f, "amax 1 -> 1/448");
    CHECK(us_fp8_scale(1e-37f, 0) == FLT_MIN && isfinite(1.0f / us_fp8_scale(1e-37f, 0)),
          "amax 1e-37 (/448 is subnormal) -> the smallest normal, 1/s finite (got %a)",
          us_fp8_scale(1e-37f, 0));
    CHECK(us_fp8_scale(1.0f, 1) == 0x1p-8f, "amax 1, pow2 -> 2^-8 (1/448 rounded up; got %a)",
          us_fp8_scale(1.0f, 1));
    CHECK(us_fp8_scale(56.0f, 1) == 0.125f, "amax 56 = 448/8, pow2 -> exactly 1/8 (got %a)",
          us_fp8_scale(56.0f, 1));
    CHECK(us_fp8_scale(1e30f, 1) == 0x1p91f,
          "amax 1e30 (1e30/448 = 2^90.85), pow2 -> 2^91 (got %a)", us_fp8_scale(1e30f, 1));
    CHECK(us_fp8_scale(NAN, 0) != us_fp8_scale(NAN, 0) &&
              us_fp8_scale(INFINITY, 1) != us_fp8_scale(INFINITY, 1),
          "NaN or inf amax -> NaN scale");

    /* one 1×4 row: amax 3.5, s = 2^-7, x/s = 128, -256, 64, 448 */
    x[0] = 1.0f;
    x[1] = -2.0f;
    x[2] = 0.5f;
    x[3] = 3.5f;
    CHECK(us_fp8_quantize(q, s, x, US_F32, 1, 4, US_FP8_ROW128, 0, NULL, 0) == US_OK,
          "quantize 1x4");
    CHECK(s[0] == 0x1p-7f, "1x4: scale %a, want 0x1p-7", s[0]);
    CHECK(q[0] == 0x70 && q[1] == 0xF8 && q[2] == 0x68 && q[3] == 0x7E,
          "1x4: q = %02x %02x %02x %02x, want 70 f8 68 7e", q[0], q[1], q[2], q[3]);
    /* {1, 0.3}: s = 1/448, 0.3·448 = 134.4 -> 128 (0x70); pow2: s = 2^-8, 1 -> 256 (0x78), 0.3 -> 76.8 -> 80 (0x6A) */
    x[0] = 1.0f;
    x[1] = 0.3f;
    us_fp8_quantize(q, s, x, US_F32, 1, 2, US_FP8_ROW128, 0, NULL, 0);
    CHECK(q[0] == 0x7E && q[1] == 0x70, "{1, 0.3}: q = %02x %02x, want 7e 70", q[0], q[1]);
    us_fp8_quantize(q, s, x, US_F32, 1, 2, US_FP8_ROW128, 1, NULL, 0);
    CHECK(s[0] == 0x1p-8f && q[0] == 0x78 && q[1] == 0x6A,
          "{1, 0.3} pow2: s %a q = %02x %02x, want 0x1p-8 78 6a", s[0], q[0], q[1]);
    /* s = 1: subnormals 2^-9 -> 0x01, 1.5·2^-9 -> tie, even -> 0x02, 2^-11 -> 0, -448 -> 0xFE */
    x[0] = 448.0f;
    x[1] = 0x1p-9f;
    x[2] = 0x1.8p-9f;
    x[3] = 0x1p-11f;
    x[4] = -448.0f;
    us_fp8_quantize(q, s, x, US_F32, 1, 5, US_FP8_TENSOR, 0, NULL, 0);
    CHECK(s[0] == 1.0f && q[0] == 0x7E && q[1] == 0x01 && q[2] == 0x02 && q[3] == 0x00 &&
              q[4] == 0xFE,
          "subnormals: s %g q = %02x %02x %02x %02x %02x, want 1 7e 01 02 00 fe", s[0], q[0], q[1],
          q[2], q[3], q[4]);
    us_fp8_dequantize(y, q, s, 1, 5, US_FP8_TENSOR, NULL, 0);
    CHECK(y[0] == 448.0f && y[1] == 0x1p-9f && y[2] == 0x1p-8f && y[3] == 0.0f && y[4] == -448.0f,
          "dequantise of the subnormals row");
    /* a zero tile: s = 1, q = 0; a tile with a NaN: s NaN and every q a NaN code */
    memset(x, 0, sizeof x);
    us_fp8_quantize(q, s, x, US_F32, 1, 3, US_FP8_ROW128, 1, NULL, 0);
    CHECK(s[0] == 1.0f && q[0] == 0 && q[1] == 0 && q[2] == 0, "zero tile: s %g, q %02x %02x %02x",
          s[0], q[0], q[1], q[2]);
    x[0] = 1.0f;
    x[1] = NAN;
    x[2] = 2.0f;
    us_fp8_quantize(q, s, x, US_F32, 1, 3, US_FP8_ROW128, 0, NULL, 0);
    CHECK(s[0] != s[0] && (q[0] & 0x7F) == 0x7F && (q[1] & 0x7F) == 0x7F && (q[2] & 0x7F) == 0x7F,
          "NaN tile: s %g, q %02x %02x %02x", s[0], q[0], q[1], q[2]);
    x[1] = INFINITY;
    us_fp8_quantize(q, s, x, US_F32, 1, 3, US_FP8_ROW128, 0, NULL, 0);
    us_fp8_dequantize(y, q, s, 1, 3, US_FP8_ROW128, NULL, 0);
    CHECK(y[0] != y[0] && y[1] != y[1], "inf tile dequantises to NaN (E4M3 has no inf)");
}

/* ------------------------------------------------------------------ round trip, tiles, layouts */
static void fill_wide(float *x, int64_t M, int64_t K) {
    int64_t m, k;
    for (m = 0; m < M; m++) /* magnitudes vary by row and column over ~2^±6, zero patches */
        for (k = 0; k < K; k++) {
            double g = gauss() * ldexp(1.0, (int)(m % 7) - 3) * ldexp(1.0, (int)(k % 5) - 2);
            if (m < 128 && k >= 128 && k < 256) g = 0; /* zero tiles of every tiling */
            if (k == 1 && m < 200) g = 0;              /* a zero column (COL128 tiles) */
            x[m * K + k] = (float)g;
        }
}

static void check_roundtrip(int64_t M, int64_t K, us_fp8_tiling t, int pow2) {
    int64_t ns = us_fp8_scales_size(t, M, K), m, k, i, j, bad_err = 0, bad_max = 0, bad_s = 0,
            bad_zero = 0, tiles = 0;
    float *x = falloc(M * K), *s = falloc(ns), *y = falloc(M * K), *amax = falloc(ns),
          *qmax = falloc(ns);
    uint8_t *q = balloc(M * K);
    double worst = 0;
    char err[128] = "";
    fill_wide(x, M, K);
    for (i = 0; i < ns; i++) s[i] = -7.0f; /* every entry must be written */
    CHECK(us_fp8_quantize(q, s, x, US_F32, M, K, t, pow2, err, sizeof err) == US_OK,
          "quantize %lldx%lld %s: %s", (long long)M, (long long)K, tname(t), err);
    CHECK(us_fp8_dequantize(y, q, s, M, K, t, err, sizeof err) == US_OK, "dequantize: %s", err);
    for (m = 0; m < M; m++)
        for (k = 0; k < K; k++) {
            int64_t si = sidx(t, M, K, m, k);
            float sc = s[si], v = us_e4m3_to_f32(q[qidx(t, M, K, m, k)]);
            double xv = x[m * K + k],
                   bound = sc * e4m3_half_ulp(xv / sc) + ldexp(fabs(xv), -21) + sc * 0x1p-30;
            double e = fabs((double)y[m * K + k] - xv);
            if (!(e <= bound)) {
                if (!bad_err)
                    printf("    (%lld,%lld) x %g y %g s %g err %g bound %g\n", (long long)m,
                           (long long)k, xv, y[m * K + k], sc, e, bound);
                bad_err++;
            }
            if (e / bound > worst) worst = e / bound;
            if (fabsf(x[m * K + k]) > amax[si]) amax[si] = fabsf(x[m * K + k]);
            if (fabsf(v) > qmax[si]) qmax[si] = fabsf(v);
            if (x[m * K + k] == 0 && q[qidx(t, M, K, m, k)] != 0) bad_zero++;
        }
    /* per tile: s from the rule, the largest element at 448 (pow2: in [224, 448]) */
    for (i = 0; i < ns; i++) {
        int used = 0;
        if (t == US_FP8_BLOCK128) {
            j = i % (((K + 127) / 128 + 3) / 4 * 4);
            used = j < (K + 127) / 128;
            if (!used) {
                if (s[i] != 1.0f) bad_s++;
                continue;
            }
        }
        tiles++;
        if (amax[i] == 0) {
            if (s[i] != 1.0f || qmax[i] != 0) bad_zero++;
            continue;
        }
        if (!pow2 && fbits(s[i]) != fbits(amax[i] / 448.0f)) bad_s++;
        if (pow2) {
            int e;
            float fr = frexpf(s[i], &e);
            if (fr != 0.5f || !(s[i] / 2 < amax[i] / 448.0f && amax[i] / 448.0f <= s[i])) bad_s++;
        }
        if (pow2 ? !(qmax[i] >= 224.0f && qmax[i] <= 448.0f) : qmax[i] != 448.0f) bad_max++;
    }
    CHECK(bad_err == 0,
          "%s%s %lldx%lld: |deq - x| <= s·halfulp_e4m3(x/s) element-wise: %lld bad, worst "
          "err/bound %.3f",
          tname(t), pow2 ? "+pow2" : "", (long long)M, (long long)K, (long long)bad_err, worst);
    CHECK(bad_s == 0 && bad_max == 0 && bad_zero == 0,
          "%s%s %lldx%lld, %lld tiles: scales off the rule %lld, tile max not at 448%s %lld, zero "
          "tiles/values wrong %lld",
          tname(t), pow2 ? "+pow2" : "", (long long)M, (long long)K, (long long)tiles,
          (long long)bad_s, pow2 ? " (pow2: [224,448])" : "", (long long)bad_max,
          (long long)bad_zero);
    free(x);
    free(s);
    free(y);
    free(amax);
    free(qmax);
    free(q);
}

static void test_roundtrip(void) {
    static const int64_t dims[][2] = {{256, 384}, {200, 300}, {129, 257},
                                      {130, 5},   {1, 1},     {3, 1000}};
    static const us_fp8_tiling ts[] = {US_FP8_ROW128, US_FP8_COL128, US_FP8_BLOCK128,
                                       US_FP8_TENSOR};
    int d, i, p;
    for (d = 0; d < 6; d++)
        for (i = 0; i < 4; i++)
            for (p = 0; p < 2; p++) check_roundtrip(dims[d][0], dims[d][1], ts[i], p);
}

static void test_layouts(void) {
    const int64_t M = 200, K = 300;
    float *x = falloc(M * K), *xt = falloc(M * K), *s1 = falloc(600), *s2 = falloc(600),
          *y = falloc(M * K);
    uint8_t *q1 = balloc(M * K), *q2 = balloc(M * K);
    uint16_t *xb = (uint16_t *)malloc((size_t)(M * K) * 2);
    char err[160] = "";
    int64_t m, k, i;
    int same;
    CHECK(us_fp8_scales_size(US_FP8_ROW128, 200, 300) == 600 &&
              us_fp8_scales_size(US_FP8_TILING_DEFAULT, 200, 300) == 600 &&
              us_fp8_scales_size(US_FP8_COL128, 200, 300) == 600 &&
              us_fp8_scales_size(US_FP8_BLOCK128, 200, 300) == 8 &&
              us_fp8_scales_size(US_FP8_BLOCK128, 256, 1280) == 24 &&
              us_fp8_scales_size(US_FP8_TENSOR, 5, 5) == 1 &&
              us_fp8_scales_size(US_FP8_ROW128, -1, 5) == -1,
          "us_fp8_scales_size: ROW [KB][M], COL [MB][K], BLOCK [MB][KB padded to 4], TENSOR 1");
    fill_wide(x, M, K);
    for (m = 0; m < M; m++)
        for (k = 0; k < K; k++) xt[k * M + m] = x[m * K + k];
    /* COL128 of X is ROW128 of Xᵀ, byte for byte */
    us_fp8_quantize(q1, s1, x, US_F32, M, K, US_FP8_COL128, 0, NULL, 0);
    us_fp8_quantize(q2, s2, xt, US_F32, K, M, US_FP8_ROW128, 0, NULL, 0);
    CHECK(memcmp(q1, q2, (size_t)(M * K)) == 0 && memcmp(s1, s2, 600 * 4) == 0,
          "COL128 of X[200][300] = ROW128 of its transpose (q and s bit for bit)");
    /* the default tiling is ROW128 */
    us_fp8_quantize(q1, s1, x, US_F32, M, K, US_FP8_ROW128, 1, NULL, 0);
    us_fp8_quantize(q2, s2, x, US_F32, M, K, US_FP8_TILING_DEFAULT, 1, NULL, 0);
    CHECK(memcmp(q1, q2, (size_t)(M * K)) == 0 && memcmp(s1, s2, 600 * 4) == 0,
          "tiling 0 = ROW128");
    /* bf16 input = fp32 input of the same (bf16-rounded) values */
    for (i = 0; i < M * K; i++) {
        xb[i] = us_f32_to_bf16(x[i]);
        x[i] = us_bf16_to_f32(xb[i]);
    }
    for (i = 0; i < 4; i++) {
        us_fp8_tiling t = (us_fp8_tiling)(US_FP8_ROW128 + i);
        int64_t ns = us_fp8_scales_size(t, M, K);
        us_fp8_quantize(q1, s1, x, US_F32, M, K, t, 0, NULL, 0);
        us_fp8_quantize(q2, s2, xb, US_BF16, M, K, t, 0, NULL, 0);
        same = memcmp(q1, q2, (size_t)(M * K)) == 0 && memcmp(s1, s2, (size_t)ns * 4) == 0;
        CHECK(same, "%s: bf16 input quantises like the same values in fp32", tname(t));
    }
    { /* Dgrad needs Wᵀ in 128×128 blocks: a block's amax does not change under transposition, so
           the blocks of Wᵀ are W's blocks transposed, q and s alike (for 1×128 tiles this is false,
           hence COL128) */
        int64_t KBp = ((K + 127) / 128 + 3) / 4 * 4, MBp = ((M + 127) / 128 + 3) / 4 * 4, bad = 0,
                mb, kb;
        float *sw = falloc(us_fp8_scales_size(US_FP8_BLOCK128, M, K)),
              *swt = falloc(us_fp8_scales_size(US_FP8_BLOCK128, K, M));
        for (i = 0; i < M * K; i++) x[i] = us_bf16_to_f32(xb[i]);
        for (m = 0; m < M; m++)
            for (k = 0; k < K; k++) xt[k * M + m] = x[m * K + k];
        us_fp8_quantize(q1, sw, x, US_F32, M, K, US_FP8_BLOCK128, 0, NULL, 0);
        us_fp8_quantize(q2, swt, xt, US_F32, K, M, US_FP8_BLOCK128, 0, NULL, 0);
        for (m = 0; m < M; m++)
            for (k = 0; k < K; k++) bad += q1[m * K + k] != q2[k * M + m];
        for (mb = 0; mb * 128 < M; mb++)
            for (kb = 0; kb * 128 < K; kb++)
                bad += fbits(sw[mb * KBp + kb]) != fbits(swt[kb * MBp + mb]);
        CHECK(bad == 0, "BLOCK128 of Wᵀ = BLOCK128 of W transposed (q and s): %lld differ",
              (long long)bad);
        free(sw);
        free(swt);
    }
    /* bad arguments: a result and a sentence, nothing written past the checks */
    CHECK(us_fp8_quantize(q1, s1, x, US_I32, M, K, US_FP8_ROW128, 0, err, sizeof err) ==
                  US_ERR_INVALID &&
              strstr(err, "fp32 or bf16"),
          "i32 input refused: %s", err);
    CHECK(us_fp8_quantize(q1, s1, x, US_F32, -2, K, US_FP8_ROW128, 0, err, sizeof err) ==
                  US_ERR_INVALID &&
              strstr(err, ">= 0"),
          "negative M refused: %s", err);
    CHECK(us_fp8_quantize(q1, s1, x, US_F32, M, K, (us_fp8_tiling)9, 0, err, sizeof err) ==
                  US_ERR_INVALID &&
              strstr(err, "tiling 9"),
          "tiling 9 refused: %s", err);
    CHECK(us_fp8_quantize(q1, NULL, x, US_F32, M, K, US_FP8_ROW128, 0, err, sizeof err) ==
              US_ERR_INVALID,
          "NULL s refused: %s", err);
    CHECK(us_fp8_dequantize(y, q1, s1, M, K, (us_fp8_tiling)-1, err, sizeof err) == US_ERR_INVALID,
          "dequantize: tiling -1 refused: %s", err);
    CHECK(us_fp8_gemm(y, q1, s1, US_FP8_ROW128, q2, s2, US_FP8_BLOCK128, 2, -3, 4, err,
                      sizeof err) == US_ERR_INVALID &&
              strstr(err, "(b)"),
          "gemm: negative N refused: %s", err);
    CHECK(us_fp8_gemm(y, NULL, s1, US_FP8_ROW128, q2, s2, US_FP8_BLOCK128, 2, 3, 4, err,
                      sizeof err) == US_ERR_INVALID,
          "gemm: NULL a refused: %s", err);
    CHECK(us_fp8_quantize(NULL, s1, NULL, US_F32, 0, 7, US_FP8_TENSOR, 0, NULL, 0) == US_OK &&
              s1[0] == 1.0f,
          "empty tensor: OK, scale 1");
    free(x);
    free(xt);
    free(s1);
    free(s2);
    free(y);
    free(q1);
    free(q2);
    free(xb);
}

/* ------------------------------------------------------------------ the emulated GEMM */
static double rel_fro(const float *y, const double *ref, int64_t n, const unsigned char *mask) {
    double e = 0, r = 0;
    int64_t i;
    for (i = 0; i < n; i++)
        if (!mask || mask[i]) {
            e += (y[i] - ref[i]) * (y[i] - ref[i]);
            r += ref[i] * ref[i];
        }
    return sqrt(e / r);
}

/* c[M][N] = a[M][K]·b[N][K]ᵀ in double */
static void gemm_ref(double *c, const float *a, const float *b, int64_t M, int64_t N, int64_t K) {
    int64_t m, n, k;
    for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) {
            double d = 0;
            for (k = 0; k < K; k++) d += (double)a[m * K + k] * b[n * K + k];
            c[m * N + n] = d;
        }
}

static void check_gemm(int64_t M, int64_t N, int64_t K, us_fp8_tiling ta, us_fp8_tiling tb,
                       int pow2) {
    float *a = falloc(M * K), *b = falloc(N * K), *da = falloc(M * K), *db = falloc(N * K),
          *c = falloc(M * N), *c1 = falloc(M * N);
    float *sa = falloc(us_fp8_scales_size(ta, M, K)), *sb = falloc(us_fp8_scales_size(tb, N, K));
    uint8_t *qa = balloc(M * K), *qb = balloc(N * K);
    double *ref = (double *)malloc((size_t)(M * N) * 8),
           *refx = (double *)malloc((size_t)(M * N) * 8);
    int64_t i, m, n, k, kb, bad_tol = 0, bad_order = 0;
    double worst = 0;
    char err[128] = "";
    for (i = 0; i < M * K; i++) a[i] = (float)(gauss() * (1 + (i % K) % 17));
    for (i = 0; i < N * K; i++) b[i] = (float)(gauss() * 0.02 * (1 + (i / K) % 5));
    us_fp8_quantize(qa, sa, a, US_F32, M, K, ta, pow2, NULL, 0);
    us_fp8_quantize(qb, sb, b, US_F32, N, K, tb, pow2, NULL, 0);
    us_fp8_dequantize(da, qa, sa, M, K, ta, NULL, 0);
    us_fp8_dequantize(db, qb, sb, N, K, tb, NULL, 0);
    CHECK(us_fp8_gemm(c, qa, sa, ta, qb, sb, tb, M, N, K, err, sizeof err) == US_OK, "gemm: %s",
          err);
    gemm_ref(ref, da, db, M, N, K);
    gemm_ref(refx, a, b, M, N, K);
    for (m = 0; m < M; m++)
        for (n = 0; n < N; n++) {
            /* tolerance: fp32 summation of K exact products, two scale roundings, one rounding of each dequantised value */
            double sabs = 0, tol, e = fabs(c[m * N + n] - ref[m * N + n]);
            float acc = 0.0f;
            for (k = 0; k < K; k++) sabs += fabs((double)da[m * K + k] * db[n * K + k]);
            tol = (double)(K + 8) * 0x1p-24 * sabs;
            if (!(e <= tol)) bad_tol++;
            if (sabs > 0 && e / tol > worst) worst = e / tol;
            /* the documented order, recomputed here from the bytes */
            for (kb = 0; kb * 128 < K; kb++) {
                float p = 0.0f, s;
                for (k = kb * 128; k < K && k < kb * 128 + 128; k++)
                    p += us_e4m3_to_f32(qa[m * K + k]) * us_e4m3_to_f32(qb[n * K + k]);
                s = (ta == US_FP8_TENSOR     ? sa[0]
                     : ta == US_FP8_BLOCK128 ? sa[m / 128 * (((K + 127) / 128 + 3) / 4 * 4) + kb]
                                             : sa[kb * M + m]) *
                    (tb == US_FP8_TENSOR     ? sb[0]
                     : tb == US_FP8_BLOCK128 ? sb[n / 128 * (((K + 127) / 128 + 3) / 4 * 4) + kb]
                                             : sb[kb * N + n]);
                acc = fmaf(p, s, acc);
            }
            if (fbits(acc) != fbits(c[m * N + n])) bad_order++;
        }
    CHECK(bad_tol == 0,
          "gemm %lldx%lldx%lld %s x %s%s vs double over the dequantised operands, |err| <= "
          "(K+8)·2^-24·Σ|a·b|: %lld bad, worst err/tol %.3f",
          (long long)M, (long long)N, (long long)K, tname(ta), tname(tb), pow2 ? " pow2" : "",
          (long long)bad_tol, worst);
    CHECK(bad_order == 0,
          "gemm %lldx%lldx%lld %s x %s: bit for bit the documented order recomputed: %lld differ",
          (long long)M, (long long)N, (long long)K, tname(ta), tname(tb), (long long)bad_order);
#ifdef _OPENMP
    {
        int nt = omp_get_max_threads();
        omp_set_num_threads(nt > 1 ? 1 : 2);
        us_fp8_gemm(c1, qa, sa, ta, qb, sb, tb, M, N, K, NULL, 0);
        omp_set_num_threads(nt);
        CHECK(memcmp(c, c1, (size_t)(M * N) * 4) == 0,
              "gemm %s x %s: the same bits with another thread count", tname(ta), tname(tb));
    }
#endif
    printf("  gemm %4lldx%4lldx%4lld a %-8s b %-8s%s: rel. Frobenius error vs fp32 GEMM %.4f\n",
           (long long)M, (long long)N, (long long)K, tname(ta), tname(tb), pow2 ? " pow2" : "     ",
           rel_fro(c, refx, M * N, NULL));
    CHECK(rel_fro(c, refx, M * N, NULL) < 0.06, "gemm vs fp32 within 6%% on these inputs");
    free(a);
    free(b);
    free(da);
    free(db);
    free(c);
    free(c1);
    free(sa);
    free(sb);
    free(qa);
    free(qb);
    free(ref);
    free(refx);
}

static void test_gemm(void) {
    check_gemm(96, 80, 640, US_FP8_ROW128, US_FP8_BLOCK128,
               0); /* Fprop / Dgrad: activations × weights */
    check_gemm(70, 150, 300, US_FP8_ROW128, US_FP8_BLOCK128, 1); /* partial tiles in M, N and K */
    check_gemm(64, 48, 512, US_FP8_ROW128, US_FP8_ROW128, 0); /* Wgrad: both 1×128 along tokens */
    check_gemm(33, 20, 200, US_FP8_BLOCK128, US_FP8_ROW128, 0);
    check_gemm(64, 64, 384, US_FP8_TENSOR, US_FP8_TENSOR, 0);
    check_gemm(5, 7, 1, US_FP8_ROW128, US_FP8_BLOCK128, 0);
    { /* K = 0: c = 0 */
        float c[6] = {1, 1, 1, 1, 1, 1}, s[4] = {1, 1, 1, 1};
        uint8_t q[1] = {0};
        CHECK(us_fp8_gemm(c, q, s, US_FP8_ROW128, q, s, US_FP8_BLOCK128, 2, 3, 0, NULL, 0) ==
                      US_OK &&
                  c[0] == 0 && c[5] == 0,
              "gemm with K = 0 writes zeros");
    }
    { /* Wgrad from COL128: dW[O][I] = dYᵀ·X reduces over the N tokens; both quantised along tokens from the
           high-precision tensors, the outputs are the TN operands as they stand */
        const int64_t Nt = 300, O = 40, I = 72;
        float *dy = falloc(Nt * O), *x = falloc(Nt * I), *dyt = falloc(Nt * O),
              *xt = falloc(Nt * I), *c = falloc(O * I);
        float *s1 = falloc(us_fp8_scales_size(US_FP8_COL128, Nt, O)),
              *s2 = falloc(us_fp8_scales_size(US_FP8_COL128, Nt, I));
        uint8_t *q1 = balloc(Nt * O), *q2 = balloc(Nt * I);
        double *ref = (double *)malloc((size_t)(O * I) * 8);
        int64_t i, j;
        for (i = 0; i < Nt * O; i++) dy[i] = (float)(gauss() * 1e-3);
        for (i = 0; i < Nt * I; i++) x[i] = (float)gauss();
        for (i = 0; i < Nt; i++) {
            for (j = 0; j < O; j++) dyt[j * Nt + i] = dy[i * O + j];
            for (j = 0; j < I; j++) xt[j * Nt + i] = x[i * I + j];
        }
        us_fp8_quantize(q1, s1, dy, US_F32, Nt, O, US_FP8_COL128, 0, NULL, 0);
        us_fp8_quantize(q2, s2, x, US_F32, Nt, I, US_FP8_COL128, 0, NULL, 0);
        CHECK(us_fp8_gemm(c, q1, s1, US_FP8_COL128, q2, s2, US_FP8_COL128, O, I, Nt, NULL, 0) ==
                  US_OK,
              "Wgrad gemm from COL128 operands");
        gemm_ref(ref, dyt, xt, O, I, Nt);
        printf("  Wgrad dW[%lld][%lld] = dYᵀ·X over %lld tokens from COL128 operands: rel. "
               "Frobenius error vs fp32 %.4f\n",
               (long long)O, (long long)I, (long long)Nt, rel_fro(c, ref, O * I, NULL));
        CHECK(rel_fro(c, ref, O * I, NULL) < 0.06, "Wgrad from COL128 within 6%% of fp32");
        free(dy);
        free(x);
        free(dyt);
        free(xt);
        free(c);
        free(s1);
        free(s2);
        free(q1);
        free(q2);
        free(ref);
    }
}

/* ------------------------------------------------------------------ tile vs per-tensor with outliers */
/* X[M][K] ~ N(0,1) with a few channels (columns) f times larger: the Llama-style massive
   activation channels. Each column of K in `out` marks an outlier channel. */
static void outlier_x(float *x, unsigned char *ordinary, int64_t M, int64_t K, double f) {
    static const int64_t ch[] = {5, 300, 301, 777}; /* in 3 of the 8 row tiles of K = 1024 */
    int64_t m, k, c;
    for (m = 0; m < M; m++)
        for (k = 0; k < K; k++) {
            int o = 0;
            for (c = 0; c < 4; c++) o |= k == ch[c];
            x[m * K + k] = (float)(gauss() * (o ? f : 1.0));
            ordinary[m * K + k] = (unsigned char)!o;
        }
}

static void test_outliers(void) {
    const int64_t M = 256, K = 1024, N = 128;
    static const double fs[] = {100, 1000, 1e4, 1e5};
    float *x = falloc(M * K), *y = falloc(M * K), *w = falloc(N * K), *c = falloc(M * N);
    float *s = falloc(us_fp8_scales_size(US_FP8_ROW128, M, K)),
          *sw = falloc(us_fp8_scales_size(US_FP8_BLOCK128, N, K));
    uint8_t *q = balloc(M * K), *qw = balloc(N * K);
    unsigned char *ord = (unsigned char *)malloc((size_t)(M * K)),
                  *rows = (unsigned char *)malloc((size_t)(M * N));
    double *xd = (double *)malloc((size_t)(M * K) * 8),
           *ref = (double *)malloc((size_t)(M * N) * 8);
    int fi, t, i;
    printf("  outlier channels (4 of K=%lld, f x N(0,1)), X[%lld][%lld] quantised, rel. Frobenius "
           "error:\n",
           (long long)K, (long long)M, (long long)K);
    printf("  %8s | %-22s | %-22s | %-22s\n", "f", "whole X  tile / tensor", "ordinary channels",
           "tile w/o outlier tiles");
    for (fi = 0; fi < 4; fi++) {
        double e[2][3];
        outlier_x(x, ord, M, K, fs[fi]);
        for (i = 0; i < M * K; i++) xd[i] = x[i];
        for (t = 0; t < 2; t++) {
            unsigned char *clean = (unsigned char *)malloc((size_t)(M * K));
            int64_t m, k;
            us_fp8_quantize(q, s, x, US_F32, M, K, t ? US_FP8_TENSOR : US_FP8_ROW128, 0, NULL, 0);
            us_fp8_dequantize(y, q, s, M, K, t ? US_FP8_TENSOR : US_FP8_ROW128, NULL, 0);
            for (m = 0; m < M; m++)
                for (k = 0; k < K; k++) {
                    int kb = (int)(k / 128);
                    clean[m * K + k] = (unsigned char)(kb != 0 && kb != 2 && kb != 6);
                }
            e[t][0] = rel_fro(y, xd, M * K, NULL);
            e[t][1] = rel_fro(y, xd, M * K, ord);
            e[t][2] = rel_fro(y, xd, M * K, clean);
            free(clean);
        }
        printf("  %8.0f | %.4f / %.4f        | %.4f / %.4f        | %.4f / %.4f\n", fs[fi], e[0][0],
               e[1][0], e[0][1], e[1][1], e[0][2], e[1][2]);
        /* whole X: its norm is the outliers'; a 1×128 tile holding one outlier maps it to ±448 exactly,
           a per-tensor scale does that for one element of the tensor only */
        CHECK(e[0][0] * 2 < e[1][0], "f=%g: tiles markedly better on the whole X (%.4f vs %.4f)",
              fs[fi], e[0][0], e[1][0]);
        /* the ordinary channels: E4M3 spans 2^-9..448, so up to ~1000x the per-tensor scale only moves
           N(0,1) values within the normal range (same 3-bit precision); beyond, they fall into the
           subnormals and to zero, except in tiles free of outliers */
        CHECK(e[0][1] <= e[1][1] * 1.02 && e[0][2] <= e[1][2] * 1.02,
              "f=%g: tile error <= per-tensor error on the ordinary channels", fs[fi]);
        if (fs[fi] >= 1e4)
            CHECK(e[0][1] * 1.5 < e[1][1] && e[0][2] * 1.5 < e[1][2],
                  "f=%g: tiles better on the ordinary channels (%.4f vs %.4f; outlier-free tiles "
                  "%.4f vs %.4f)",
                  fs[fi], e[0][1], e[1][1], e[0][2], e[1][2]);
        if (fs[fi] >= 1e5)
            CHECK(e[0][1] * 4 < e[1][1] && e[0][2] * 10 < e[1][2],
                  "f=%g: tiles markedly better on the ordinary channels (%.4f vs %.4f; "
                  "outlier-free tiles %.4f vs %.4f)",
                  fs[fi], e[0][1], e[1][1], e[0][2], e[1][2]);
    }
    /* outlier tokens (rows f times larger: the massive activations of a few tokens) through the
       FP8 GEMM Y = X·Wᵀ: the ordinary tokens' outputs, where per-tensor scaling loses them */
    printf("  outlier tokens (4 of M=%lld rows f x N(0,1)) through Y[%lld][%lld] = X·Wᵀ (W 128x128 "
           "blocks), rel. Frobenius error of the ordinary tokens' Y vs fp32:\n",
           (long long)M, (long long)M, (long long)N);
    for (i = 0; i < N * K; i++) w[i] = (float)(gauss() * 0.03);
    us_fp8_quantize(qw, sw, w, US_F32, N, K, US_FP8_BLOCK128, 0, NULL, 0);
    for (fi = 0; fi < 4; fi++) {
        double e[2];
        int64_t m, n;
        for (m = 0; m < M; m++) {
            int o = m == 3 || m == 100 || m == 101 || m == 200;
            for (i = 0; i < K; i++) x[m * K + i] = (float)(gauss() * (o ? fs[fi] : 1.0));
            for (n = 0; n < N; n++) rows[m * N + n] = (unsigned char)!o;
        }
        gemm_ref(ref, x, w, M, N, K);
        for (t = 0; t < 2; t++) {
            us_fp8_tiling tt = t ? US_FP8_TENSOR : US_FP8_ROW128;
            us_fp8_quantize(q, s, x, US_F32, M, K, tt, 0, NULL, 0);
            if (t)
                us_fp8_quantize(qw, sw, w, US_F32, N, K, US_FP8_TENSOR, 0, NULL, 0);
            else
                us_fp8_quantize(qw, sw, w, US_F32, N, K, US_FP8_BLOCK128, 0, NULL, 0);
            us_fp8_gemm(c, q, s, tt, qw, sw, t ? US_FP8_TENSOR : US_FP8_BLOCK128, M, N, K, NULL, 0);
            e[t] = rel_fro(c, ref, M * N, rows);
        }
        printf("  %8.0f | tile (1x128 x 128x128) %.4f | per-tensor %.4f\n", fs[fi], e[0], e[1]);
        CHECK(e[0] <= e[1] * 1.02, "f=%g: FP8 GEMM with tiles no worse than per-tensor", fs[fi]);
        if (fs[fi] >= 1e4)
            CHECK(e[0] * 1.25 < e[1],
                  "f=%g: FP8 GEMM with tiles better for the ordinary tokens (%.4f vs %.4f)", fs[fi],
                  e[0], e[1]);
        if (fs[fi] >= 1e5)
            CHECK(
                e[0] * 5 < e[1],
                "f=%g: FP8 GEMM with tiles markedly better for the ordinary tokens (%.4f vs %.4f)",
                fs[fi], e[0], e[1]);
    }
    free(x);
    free(y);
    free(w);
    free(c);
    free(s);
    free(sw);
    free(q);
    free(qw);
    free(ord);
    free(rows);
    free(xd);
    free(ref);
}

int main(int argc, char **argv) {
    us_test_rs = 0x5eed0f8ull;
    us_test_verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    test_scale_and_patterns();
    test_roundtrip();
    test_layouts();
    test_gemm();
    test_outliers();
    return us_test_done("test_fp8");
}
