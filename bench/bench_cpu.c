/* bench_cpu.c — CPU benchmarks, measured side by side in one run (not a test).
     1. fp32 GEMM GFLOP/s: the library's GEMM (through the ops table, as the model calls it)
        against OpenBLAS cblas_sgemm, same shapes, same thread count, best of several runs;
     2. training tokens/s of a ~10M-parameter model (fp32 and bf16).
   Build and run: make bench   (installs libopenblas-dev if missing)
   Flags: --threads N (default 2), --quick (fewer repetitions). */
#define _POSIX_C_SOURCE 199309L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void openblas_set_num_threads(int n); /* OpenBLAS extension, not in every cblas.h */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *x, int64_t n, uint64_t seed) {
    us_rng r;
    int64_t i;
    us_rng_seed(&r, seed);
    for (i = 0; i < n; i++) x[i] = us_rng_uniform(&r) - 0.5f;
}

/* best-of-reps GFLOP/s of C = A·op(B) for the library and for OpenBLAS */
static void bench_gemm(us_ops *o, int64_t M, int64_t N, int64_t K, int tb, int reps) {
    float *A = (float *)malloc((size_t)(M * K) * 4), *Bm = (float *)malloc((size_t)(K * N) * 4);
    float *C1 = (float *)malloc((size_t)(M * N) * 4), *C2 = (float *)malloc((size_t)(M * N) * 4);
    double best_us = 1e30, best_blas = 1e30, flops = 2.0 * M * N * K, maxd = 0;
    int64_t i;
    int r;
    fill(A, M * K, 1);
    fill(Bm, K * N, 2);
    for (r = 0; r < reps; r++) { /* alternate so both see the same machine state */
        double t0 = now_s(), t1;
        o->gemm(o, 0, tb, M, N, K, 1.0f, A, US_F32, K, Bm, US_F32, tb ? K : N, 0.0f, C1, US_F32, N);
        t1 = now_s();
        if (t1 - t0 < best_us) best_us = t1 - t0;
        t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                    (int)K, 1.0f, A, (int)K, Bm, tb ? (int)K : (int)N, 0.0f, C2, (int)N);
        t1 = now_s();
        if (t1 - t0 < best_blas) best_blas = t1 - t0;
    }
    for (i = 0; i < M * N; i++) {
        double d = C1[i] - C2[i];
        if (d < 0) d = -d;
        if (d > maxd) maxd = d;
    }
    printf("| gemm %-5s %4lldx%4lldx%4lld | %8.1f | %8.1f | %5.2fx | %.1e |\n", tb ? "A·Bᵀ" : "A·B",
           (long long)M, (long long)N, (long long)K, flops / best_us * 1e-9,
           flops / best_blas * 1e-9, best_blas / best_us, maxd);
    free(A);
    free(Bm);
    free(C1);
    free(C2);
}

static void bench_train(us_precision prec, int threads, int steps) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_rng r;
    int32_t *in, *tgt;
    int64_t n, i;
    double t = 0, fl;
    int s;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.vocab = 256;
    mc.dim = 384;
    mc.n_layers = 6;
    mc.n_heads = 6;
    mc.ffn_dim = 1024;
    tc.batch = 8;
    tc.seq = 256;
    tc.steps = steps + 1;
    tc.threads = threads;
    tc.precision = prec;
    if (us_model_init(&m, &mc, &tc, NULL) != US_OK) {
        printf("init failed: %s\n", us_model_error(&m));
        return;
    }
    n = (int64_t)tc.batch * tc.seq;
    in = (int32_t *)malloc((size_t)n * 4);
    tgt = (int32_t *)malloc((size_t)n * 4);
    us_rng_seed(&r, 3);
    for (s = 0; s <= steps; s++) {
        double t0;
        for (i = 0; i < n; i++) {
            in[i] = (int32_t)(us_rng_u64(&r) % 256);
            tgt[i] = (int32_t)(us_rng_u64(&r) % 256);
        }
        t0 = now_s();
        us_train_step(&m, in, tgt, NULL);
        if (s > 0) t += now_s() - t0; /* step 0 warms caches and pages */
    }
    fl = us_flops_per_token(&m.cfg, tc.seq);
    printf("| train %.1fM params %-4s B=%d T=%d | %8.0f tok/s | %6.1f GFLOP/s |\n",
           (double)m.n_params / 1e6, us_precision_name(prec), tc.batch, tc.seq,
           (double)n * steps / t, fl * (double)n * steps / t * 1e-9);
    free(in);
    free(tgt);
    us_model_free(&m);
}

int main(int argc, char **argv) {
    int threads = 2, quick = 0, i;
    us_ops o;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else {
            fprintf(stderr, "usage: bench_cpu [--threads N] [--quick]\n");
            return 2;
        }
    }
    if (threads < 1) threads = 1;
    openblas_set_num_threads(threads);
    o = us_cpu_ops(threads);
    printf("threads: %d\n\n", threads);
    printf("| fp32 GEMM (row-major)          | ultrascale GFLOP/s | OpenBLAS GFLOP/s | ratio | max "
           "|diff| |\n|---|---|---|---|---|\n");
    bench_gemm(&o, 1024, 1024, 1024, 0, quick ? 3 : 10);
    bench_gemm(&o, 2048, 2048, 2048, 0, quick ? 2 : 5);
    bench_gemm(&o, 1024, 1024, 1024, 1, quick ? 3 : 10);
    bench_gemm(&o, 2048, 2048, 2048, 1, quick ? 2 : 5);
    bench_gemm(&o, 2048, 1152, 384, 1,
               quick ? 3 : 10); /* a linear layer of the model below: N·T x 3C x C */
    printf("\n| training step (AdamW, fused xent) | tokens/s | model GFLOP/s (6N + attention) "
           "|\n|---|---|---|\n");
    bench_train(US_PRECISION_FP32, threads, quick ? 2 : 5);
    bench_train(US_PRECISION_BF16, threads, quick ? 2 : 5);
    return 0;
}
