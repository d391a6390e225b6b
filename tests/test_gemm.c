/* test_gemm.c — the packed CPU GEMM (us__gemm, section >>gemm) against a double-precision
   reference: every transpose, odd shapes, strides, alpha/beta, beta = 0 never reading C, bf16
   in and out (RNE of the fp32 result), and bitwise determinism across thread counts.
   `make test` also builds it without AVX2 (the portable path) and under the sanitizers. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include <float.h>
#include <stdio.h>

static int n_pass = 0, n_fail = 0;

static void check(int ok, const char *what) {
    if (ok)
        n_pass++;
    else {
        n_fail++;
        if (n_fail <= 30) printf("FAIL: %s\n", what);
    }
}

/* xorshift64*: reproducible inputs without touching global libc state. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((double)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / (double)(1 << 23) - 1.0);
}

static int irand(int n) { return (int)((frand() * 0.5f + 0.5f) * (float)n) % n; }

static float f_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- bf16 conversion bit patterns ---- */
static void test_bf16(void) {
    char msg[128];

    struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 */
        {0x3F808000u, 0x3F80}, /* tie, even stays */
        {0x3F818000u, 0x3F82}, /* tie, odd rounds up to even */
        {0x3F808001u, 0x3F81}, /* just above tie */
        {0x3F807FFFu, 0x3F80}, /* just below tie */
        {0xBF818000u, 0xBF82}, /* negative tie */
        {0x7F800000u, 0x7F80}, /* +inf */
        {0xFF800000u, 0xFF80}, /* -inf */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds to inf */
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000},
        {0x00000001u, 0x0000}, /* tiny denormal -> +0 */
        {0x7FC00000u, 0x7FC0}, /* quiet NaN */
        {0xFFC00000u, 0xFFC0}, /* negative quiet NaN keeps sign */
        {0x7F800001u, 0x7FC0}, /* signalling NaN with low payload -> quiet, not inf */
        {0xFF810000u, 0xFFC1}, /* sNaN payload in high bits kept, quiet bit set */
    };

    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = us__f32_to_bf16(f_of_bits(cases[i].in));
        snprintf(msg, sizeof msg, "f32_to_bf16(0x%08X) = 0x%04X, want 0x%04X",
                 (unsigned)cases[i].in, got, cases[i].out);
        check(got == cases[i].out, msg);
    }
    check(us__f32_to_bf16(FLT_MAX) == 0x7F80, "FLT_MAX -> inf");
    check(us__f32_to_bf16(1.0f) == 0x3F80, "1.0f -> 0x3F80");
    check(us__bf16_to_f32(0x3F80) == 1.0f, "bf16_to_f32(0x3F80) == 1");
    check(us__bf16_to_f32(0xC040) == -3.0f, "bf16_to_f32(0xC040) == -3");
    check(isnan(us__bf16_to_f32(us__f32_to_bf16(f_of_bits(0x7F800001u)))),
          "NaN round trip stays NaN");
    { /* round trip is exact for every bf16 that is not NaN */
        uint32_t h, bad = 0;
        for (h = 0; h < 65536; h++) {
            float f = us__bf16_to_f32((uint16_t)h);
            if (!isnan(f) && us__f32_to_bf16(f) != h) bad++;
        }
        check(bad == 0, "bf16 -> f32 -> bf16 round trip exact");
    }
}

/* ---- GEMM vs double reference ---- */
static float ld(const void *p, int dt, int64_t i) {
    return dt ? us__bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void *make(int dt, int64_t n, int nan_fill) {
    void *p = malloc((size_t)(n > 0 ? n : 1) * (dt ? 2 : 4));
    int64_t i;
    for (i = 0; i < n; i++) {
        float v = nan_fill ? f_of_bits(0x7FC00000u) : frand();
        if (dt)
            ((uint16_t *)p)[i] = us__f32_to_bf16(v);
        else
            ((float *)p)[i] = v;
    }
    return p;
}

/* Runs one GEMM (with padded strides) and compares with a double reference.
   Tolerance: fp32 accumulation error bound ~K*eps*sum|a*b| (generous factor),
   plus half a bf16 ulp (2^-8 relative) when C is bf16. */
static void run_case(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                     int dtA, int dtB, int dtC, int nthreads) {
    const int64_t pad = 3;
    const int64_t arows = ta ? K : M, acols = ta ? M : K;
    const int64_t brows = tb ? N : K, bcols = tb ? K : N;
    const int64_t lda = acols + pad, ldb = bcols + pad, ldc = N + pad;
    void *A = make(dtA, arows * lda, 0), *B = make(dtB, brows * ldb, 0);
    const int nanC = (beta == 0.0f);
    void *C = make(dtC, M * ldc, nanC), *C0 = make(dtC, M * ldc, 0);
    int64_t i, j, k, bad = 0;
    double worst = 0;
    char msg[256];
    memcpy(C0, C, (size_t)(M * ldc) * (dtC ? 2 : 4));
    us__gemm(ta, tb, M, N, K, alpha, A, dtA, lda, B, dtB, ldb, beta, C, dtC, ldc, nthreads);
    for (i = 0; i < M; i++) {
        for (j = 0; j < N; j++) {
            double ref = 0, mag = 0, got = ld(C, dtC, i * ldc + j), tol;
            for (k = 0; k < K; k++) {
                double a = ld(A, dtA, ta ? k * lda + i : i * lda + k);
                double b = ld(B, dtB, tb ? j * ldb + k : k * ldb + j);
                ref += a * b;
                mag += fabs(a * b);
            }
            ref *= alpha;
            mag *= fabs(alpha);
            if (beta != 0.0f) {
                double c0 = ld(C0, dtC, i * ldc + j);
                ref += beta * c0;
                mag += fabs(beta * c0);
            }
            tol = 4.0 * (double)(K + 4) * FLT_EPSILON * mag + 1e-30;
            if (dtC) tol += fabs(ref) * (1.0 / 256.0) + 1e-38;
            if (!(fabs(got - ref) <= tol)) bad++;
            if (fabs(got - ref) > worst || got != got)
                worst = got != got ? INFINITY : fabs(got - ref);
        }
        /* padding columns must be untouched */
        for (j = N; j < ldc; j++) {
            int same = dtC ? ((uint16_t *)C)[i * ldc + j] == ((uint16_t *)C0)[i * ldc + j]
                           : memcmp((float *)C + i * ldc + j, (float *)C0 + i * ldc + j, 4) == 0;
            if (!same && !nanC) bad++;
        }
    }
    snprintf(msg, sizeof msg,
             "gemm ta=%d tb=%d M=%lld N=%lld K=%lld alpha=%g beta=%g dt=%d%d%d nt=%d: %lld bad, "
             "worst err %g",
             ta, tb, (long long)M, (long long)N, (long long)K, alpha, beta, dtA, dtB, dtC, nthreads,
             (long long)bad, worst);
    check(bad == 0, msg);
    free(A);
    free(B);
    free(C);
    free(C0);
}

/* Same inputs, nthreads 1 vs 2 vs 3 (and a repeat): outputs must match bitwise. */
static void run_det(int ta, int tb, int64_t M, int64_t N, int64_t K, int dtA, int dtB, int dtC) {
    const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
    void *A = make(dtA, arows * acols, 0), *B = make(dtB, brows * bcols, 0);
    void *Cinit = make(dtC, M * N, 0);
    size_t bytes = (size_t)(M * N) * (dtC ? 2 : 4);
    void *R[4];
    int nts[4] = {1, 2, 3, 2}, r, same = 1;
    char msg[160];
    for (r = 0; r < 4; r++) {
        R[r] = malloc(bytes);
        memcpy(R[r], Cinit, bytes);
        us__gemm(ta, tb, M, N, K, 0.75f, A, dtA, acols, B, dtB, bcols, 0.5f, R[r], dtC, N, nts[r]);
        if (r && memcmp(R[r], R[0], bytes) != 0) same = 0;
    }
    snprintf(msg, sizeof msg, "determinism ta=%d tb=%d M=%lld N=%lld K=%lld dt=%d%d%d", ta, tb,
             (long long)M, (long long)N, (long long)K, dtA, dtB, dtC);
    check(same, msg);
    for (r = 0; r < 4; r++) free(R[r]);
    free(A);
    free(B);
    free(Cinit);
}

/* bf16 C must be exactly RNE(fp32 C) for the same inputs when beta == 0 (same
   k order, same alpha scaling), in the vector and the scalar edge epilogues.
   Some huge inputs make +-inf and NaN (inf - inf) results to test those too. */
static void run_bf16_exact(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                           int specials) {
    const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
    float *A = (float *)make(0, arows * acols, 0), *B = (float *)make(0, brows * bcols, 0);
    float *Cf = (float *)make(0, M * N, 1);
    uint16_t *Ch = (uint16_t *)make(1, M * N, 1);
    int64_t i, bad = 0;
    char msg[160];
    if (specials)
        for (i = 0; i < arows * acols; i += 7) A[i] = (i % 3 ? 3e38f : (float)INFINITY);
    us__gemm(ta, tb, M, N, K, alpha, A, 0, acols, B, 0, bcols, 0.0f, Cf, 0, N, 0);
    us__gemm(ta, tb, M, N, K, alpha, A, 0, acols, B, 0, bcols, 0.0f, Ch, 1, N, 0);
    for (i = 0; i < M * N; i++)
        if (Ch[i] != us__f32_to_bf16(Cf[i])) bad++;
    snprintf(msg, sizeof msg,
             "bf16 C == RNE(fp32 C) ta=%d tb=%d M=%lld N=%lld K=%lld specials=%d: %lld bad", ta, tb,
             (long long)M, (long long)N, (long long)K, specials, (long long)bad);
    check(bad == 0, msg);
    free(A);
    free(B);
    free(Cf);
    free(Ch);
}

int main(void) {
    static const int sizes[] = {1,  2,  3,  5,  6,  7,   8,   13,  15,  16,  17,  31,
                                32, 33, 47, 64, 97, 127, 128, 131, 191, 256, 257, 300};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    int ta, tb, i;

    test_bf16();

    /* every transpose combo over small exhaustive-ish shapes (includes the tiny path) */
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++) {
            int m, n, k;
            for (m = 1; m <= 7; m += 3)
                for (n = 1; n <= 17; n += 8)
                    for (k = 1; k <= 9; k += 4) run_case(ta, tb, m, n, k, 1.0f, 0.0f, 0, 0, 0, 0);
        }

    /* random shapes from the list, random options */
    for (i = 0; i < 400; i++) {
        const int64_t M = sizes[irand(ns)], N = sizes[irand(ns)], K = sizes[irand(ns)];
        static const float alphas[] = {1.0f, -0.5f, 2.0f}, betas[] = {0.0f, 1.0f, -0.75f};
        const int dtC = irand(4) == 0, dtA = irand(3) == 0, dtB = irand(3) == 0;
        run_case(i & 1, (i >> 1) & 1, M, N, K, alphas[irand(3)], betas[irand(3)], dtA, dtB, dtC,
                 irand(3));
    }

    /* K == 0: C = beta*C (beta==0 must overwrite NaN) and alpha == 0 */
    for (i = 0; i < 4; i++) {
        run_case(i & 1, i >> 1, 37, 19, 0, 1.0f, 0.0f, 0, 0, i & 1, 0);
        run_case(i & 1, i >> 1, 37, 19, 0, 1.0f, 0.5f, 0, 0, i & 1, 0);
        run_case(i & 1, i >> 1, 37, 19, 5, 0.0f, 2.0f, 0, 0, i & 1, 0);
    }

    /* beyond cache blocks: K > KC (multi-pass accumulation, bf16 C rounded once),
       M > MC, N > NC, bf16 C with the workspace split into several N panels */
    for (i = 0; i < 4; i++) {
        run_case(i & 1, i >> 1, 301, 77, 777, 1.0f, 0.0f, 0, 0, 0, 2);
        run_case(i & 1, i >> 1, 301, 77, 777, -1.5f, 0.25f, 1, 1, 1, 2);
        run_case(i & 1, i >> 1, 150, 70, 520, 1.0f, 1.0f, 0, 1, 0, 0);
    }
    run_case(0, 0, 13, 4200, 300, 1.0f, 1.0f, 0, 0, 0, 2);
    run_case(0, 1, 9, 4111, 33, 1.0f, 0.0f, 1, 1, 1, 2);
    run_case(0, 0, 4200, 4000, 9, 1.0f, 0.5f, 0, 0, 1, 2);

    for (i = 0; i < 8; i++) {
        run_bf16_exact(i & 1, (i >> 1) & 1, 67, 45, i < 4 ? 100 : 600, -1.25f, 0);
        run_bf16_exact(i & 1, (i >> 1) & 1, 40, 33, 50, 1.0f, 1);
    }

    /* bitwise determinism across thread counts */
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++) {
            run_det(ta, tb, 257, 131, 600, 0, 0, 0);
            run_det(ta, tb, 5, 1000, 300, 1, 0, 1);
            run_det(ta, tb, 300, 300, 300, 1, 1, 1);
            run_det(ta, tb, 64, 4200, 70, 0, 0, 0);
        }

    printf("test_gemm: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
