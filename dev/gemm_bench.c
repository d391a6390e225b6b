/* gemm_bench.c - us__gemm (dev/gemm_impl.h) vs OpenBLAS cblas_sgemm.
   Needs: apt-get install -y libopenblas-dev
   Build: gcc -O3 -march=native -fopenmp dev/gemm_bench.c -I/usr/include/x86_64-linux-gnu -lopenblas -lm -o /tmp/gb
   Run:   OMP_NUM_THREADS=2 /tmp/gb [nthreads]      (both libraries use the same thread count) */
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include <stdio.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cblas.h>
#include "gemm_impl.h"

void openblas_set_num_threads(int); /* declared by OpenBLAS's cblas.h too; harmless if repeated */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Random-ish inputs in [-0.5, 0.5): fp32 copy for both libraries, bf16 copy for us. */
static void fill(float *f, uint16_t *h, int64_t n, int64_t mul, int64_t mod) {
    int64_t i;
    for (i = 0; i < n; i++) {
        f[i] = (float)((i * mul) % mod) / (float)mod - 0.5f;
        h[i] = us__f32_to_bf16(f[i]);
    }
}

/* One shape, all row-major with tight strides; op(A) is M x K, op(B) is K x N.
   The three contenders run interleaved (blas, us fp32, us bf16) so slow drift
   of a shared VM hits all equally; keep the best time of each. */
static void bench(int ta, int tb, int64_t M, int64_t N, int64_t K, int nthreads, int reps, double gf[3]) {
    float *A = (float *)malloc((size_t)(M * K) * 4), *B = (float *)malloc((size_t)(K * N) * 4);
    float *C = (float *)calloc((size_t)(M * N), 4);
    uint16_t *Ah = (uint16_t *)malloc((size_t)(M * K) * 2), *Bh = (uint16_t *)malloc((size_t)(K * N) * 2);
    uint16_t *Ch = (uint16_t *)calloc((size_t)(M * N), 2);
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    double best[3] = {1e30, 1e30, 1e30};
    int r, w;
    fill(A, Ah, M * K, 7919, 1000);
    fill(B, Bh, K * N, 104729, 997);
    for (r = 0; r < reps + 1; r++) { /* r == 0 is warm-up (thread pools, page faults) */
        for (w = 0; w < 3; w++) {
            double t0 = now(), t;
            if (w == 0)
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M,
                            (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, 0.0f, C, (int)N);
            else if (w == 1)
                us__gemm(ta, tb, M, N, K, 1.0f, A, 0, lda, B, 0, ldb, 0.0f, C, 0, N, nthreads);
            else
                us__gemm(ta, tb, M, N, K, 1.0f, Ah, 1, lda, Bh, 1, ldb, 0.0f, Ch, 1, N, nthreads);
            t = now() - t0;
            if (r && t < best[w]) best[w] = t;
        }
    }
    for (w = 0; w < 3; w++) gf[w] = 2.0 * (double)M * (double)N * (double)K / best[w] * 1e-9;
    free(A); free(B); free(C); free(Ah); free(Bh); free(Ch);
}

int main(int argc, char **argv) {
    const int nthreads = argc > 1 ? atoi(argv[1]) : 2;
    /* square sizes from the brief, then GPT-2-small-like linear layer shapes
       (B*T = 8192 rows, 768 -> 3072): forward x.W^T, weight grad dy^T.x */
    static const struct { int ta, tb; int64_t M, N, K; const char *what; } cs[] = {
        {0, 0, 1024, 1024, 1024, "square"}, {0, 1, 1024, 1024, 1024, "square"}, {1, 0, 1024, 1024, 1024, "square"},
        {0, 0, 2048, 2048, 2048, "square"}, {0, 1, 2048, 2048, 2048, "square"}, {1, 0, 2048, 2048, 2048, "square"},
        {0, 1, 8192, 3072, 768, "fwd x.W^T"}, {1, 0, 3072, 768, 8192, "dW = dy^T.x"}, {0, 0, 8192, 768, 3072, "dx = dy.W"},
    };
    size_t i;
    openblas_set_num_threads(nthreads);
#ifdef _OPENMP
    omp_set_num_threads(nthreads);
#endif
    printf("threads=%d, GFLOP/s (best of several interleaved runs)\n", nthreads);
    printf("%-16s %-5s %-12s | %8s %8s %6s | %8s\n", "M x N x K", "ta,tb", "case", "openblas", "us_fp32", "ratio",
           "us_bf16");
    for (i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        double gf[3];
        char shape[48];
        const double fl = 2.0 * (double)cs[i].M * (double)cs[i].N * (double)cs[i].K;
        bench(cs[i].ta, cs[i].tb, cs[i].M, cs[i].N, cs[i].K, nthreads, fl < 4e9 ? 12 : 4, gf);
        snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)cs[i].M, (long long)cs[i].N, (long long)cs[i].K);
        printf("%-16s %d,%-3d %-12s | %8.1f %8.1f %6.2f | %8.1f\n", shape, cs[i].ta, cs[i].tb, cs[i].what, gf[0], gf[1],
               gf[1] / gf[0], gf[2]);
        fflush(stdout);
    }
    return 0;
}
