/* calibrate_cpu.c — the CPU fallback of bench/calibrate.cu: the same rates file, measured with
   the CPU ops and the threads comm backend, so the file format is produced and read in CI.
       build/calibrate_cpu [--out FILE] [--quick]       (default bench/rates_cpu.txt)
   gemm_tflops: ops->gemm (fp32) at M = 1024 (512 quick) and 128 rows, which give gemm_m_half,
   the rate at 16384 rows and the large-M limit (peak_tflops, so MFU stays below 1); attention: ops->attention_fwd/bwd, causal, T 256, HS 32 (2·T²·C forward FLOPs,
   2.5× backward); hbm_gbps: memcpy of 64 MiB (read + write); intra_gbps: the threads backend's
   all-reduce of 16 MiB over 2 ranks, NCCL's bus bandwidth convention. --quick: smaller sizes
   and fewer repeats (a second or two). */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int quick;

static double best_of(double *t, int n) {
    double b = t[0];
    int i;
    for (i = 1; i < n; i++)
        if (t[i] < b) b = t[i];
    return b;
}

static double gemm_tflops(us_ops *o, int64_t M) {
    int64_t N = quick ? 256 : 1024, K = quick ? 256 : 1024;
    float *a = (float *)o->alloc(o, (size_t)M * K * 4),
          *b = (float *)o->alloc(o, (size_t)N * K * 4),
          *c = (float *)o->alloc(o, (size_t)M * N * 4);
    double t[5];
    int r;
    for (r = 0; r < 5; r++) {
        double t0 = us_trace_now_us();
        o->gemm(o, 0, 1, M, N, K, 1.0f, a, US_F32, K, b, US_F32, K, 0.0f, c, US_F32, N);
        t[r] = (us_trace_now_us() - t0) * 1e-6;
    }
    o->free(o, a);
    o->free(o, b);
    o->free(o, c);
    return 2.0 * M * N * K / best_of(t, 5) * 1e-12;
}

static void attention(us_ops *o, double *f, double *bw) {
    int B = 1, T = quick ? 128 : 256, NH = 4, NKV = 4, HS = 32, r;
    int64_t N = (int64_t)B * T, QKV = (int64_t)(NH + 2 * NKV) * HS;
    void *qkv = o->alloc(o, (size_t)N * QKV * 4), *dout = o->alloc(o, (size_t)N * NH * HS * 4);
    void *out = o->alloc(o, (size_t)N * NH * HS * 4), *dqkv = o->alloc(o, (size_t)N * QKV * 4);
    float *lse = (float *)o->alloc(o, (size_t)B * NH * T * 4);
    double fl = 2.0 * B * (double)T * T * NH * HS, tf[3], tb[3];
    for (r = 0; r < 3; r++) {
        double t0 = us_trace_now_us();
        o->attention_fwd(o, out, lse, qkv, B, T, NH, NKV, HS, US_F32);
        tf[r] = (us_trace_now_us() - t0) * 1e-6;
        t0 = us_trace_now_us();
        o->attention_bwd(o, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, US_F32);
        tb[r] = (us_trace_now_us() - t0) * 1e-6;
    }
    *f = fl / best_of(tf, 3) * 1e-12;
    *bw = 2.5 * fl / best_of(tb, 3) * 1e-12;
    o->free(o, qkv);
    o->free(o, dout);
    o->free(o, out);
    o->free(o, dqkv);
    o->free(o, lse);
}

static double hbm_gbps(void) {
    size_t n = (size_t)(quick ? 16 : 64) << 20;
    char *x = (char *)malloc(n), *y = (char *)malloc(n);
    double t[3];
    int r;
    if (!x || !y) {
        free(x);
        free(y);
        return 0;
    }
    memset(x, 1, n);
    memset(y, 0, n);
    for (r = 0; r < 3; r++) {
        double t0 = us_trace_now_us();
        memcpy(y, x, n);
        t[r] = (us_trace_now_us() - t0) * 1e-6;
    }
    r = y[n - 1];
    free(x);
    free(y);
    return r == 1 ? 2.0 * n / best_of(t, 3) * 1e-9 : 0;
}

/* two thread ranks: the all-reduce's best time, written by rank 0 */
typedef struct ar_arg {
    double t;
    int64_t n;
} ar_arg;

static us_result ar_rank(us_comm *c, void *p) {
    ar_arg *a = (ar_arg *)p;
    float *x = (float *)calloc((size_t)a->n, 4);
    double t[3];
    int r;
    us_result res = US_OK;
    if (!x) return US_ERR_OOM;
    for (r = 0; r < 3 && res == US_OK; r++) {
        double t0 = us_trace_now_us();
        res = c->all_reduce(c, &c->world, x, a->n, US_F32, US_REDUCE_SUM, NULL);
        t[r] = (us_trace_now_us() - t0) * 1e-6;
    }
    if (c->world.rank == 0 && res == US_OK) a->t = best_of(t, 3);
    free(x);
    return res;
}

int main(int argc, char **argv) {
    const char *path = "bench/rates_cpu.txt";
    us_ops o = us_cpu_ops(0);
    ar_arg ar;
    double g, g_small, af, ab, h, mh, peak, intra = 0;
    char err[256];
    FILE *f;
    int i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else {
            fprintf(stderr,
                    "calibrate_cpu: unknown argument %s (usage: calibrate_cpu [--out FILE] "
                    "[--quick])\n",
                    argv[i]);
            return 2;
        }
    }
    g = gemm_tflops(&o, quick ? 512 : 1024);
    g_small = gemm_tflops(&o, 128);
    { /* r = f(128)/f(M), f(M) = M/(M+h) */
        double M = quick ? 512 : 1024, r = g_small / g;
        mh = r < 1 && M * r > 128 ? 128.0 * M * (1 - r) / (M * r - 128) : 1;
    }
    { /* the rates file's gemm_tflops is the rate at 16384 rows; the peak (the MFU denominator) its large-M limit */
        double M = quick ? 512 : 1024, g_inf = g * (M + mh) / M;
        g = g_inf * 16384 / (16384 + mh);
        peak = g_inf;
    }
    attention(&o, &af, &ab);
    h = hbm_gbps();
    ar.n = (int64_t)(quick ? 1 : 4) << 20;
    ar.t = 0;
    {
        us_launch_config lc;
        memset(&lc, 0, sizeof lc);
        lc.timeout_s = 30;
        if (us_launch_ex(2, ar_rank, &ar, &lc, NULL, err, sizeof err) == US_OK && ar.t > 0)
            intra = 4.0 * ar.n / ar.t * 1e-9; /* 2(n−1)/n = 1 at n = 2 */
    }
    if (!(f = fopen(path, "w"))) {
        fprintf(stderr, "calibrate_cpu: cannot write %s\n", path);
        return 1;
    }
    fprintf(f, "ultrascale-rates 1\n# bench/calibrate_cpu%s: CPU ops and the threads backend\n",
            quick ? " --quick" : "");
    fprintf(
        f,
        "gemm_tflops = %.6g\ngemm_m_half = %.6g\nattn_fwd_tflops = %.6g\nattn_bwd_tflops = %.6g\n",
        g, mh, af, ab);
    if (h > 0) fprintf(f, "hbm_gbps = %.6g\n", h);
    if (intra > 0)
        fprintf(f, "intra_gbps = %.6g\n", intra);
    else
        fprintf(f, "# the threads all-reduce failed: %s\n", err);
    fprintf(f, "peak_tflops = %.6g\n", peak); /* MFU against this CPU's own GEMM rate */
    fclose(f);
    printf("gemm %.4g TFLOP/s (half speed at %.0f rows), attention %.4g / %.4g TFLOP/s, memcpy "
           "%.1f GB/s, threads all-reduce %.2f GB/s\nwrote %s\n",
           g, mh, af, ab, h, intra, path);
    return 0;
}
