/* calibrate.cu — this machine's rates for the planner (// >>plan), written as a rates file:
       build/calibrate [--out FILE]        (default bench/rates_h200.txt)
   GEMM: the library's ops->gemm (cuBLASLt) at the Llama-3.2-1B step's shapes, total FLOPs over
   total time, with 16384 rows (gemm_tflops) and with 2048 (which gives gemm_m_half); attention:
   the library's flash kernels, causal bf16, the 1B shape (HS 64, GQA 32/8, T 4096), FLOPs
   2·T²·C forward and 2.5× that backward; HBM: a device-to-device copy (read + write bytes, an
   upper bound of what the elementwise kernels reach); with 2 or more GPUs, NCCL in this one
   process (ncclCommInitAll over 2 GPUs, 1 GiB): all-reduce bus bandwidth → intra_gbps, and
   all-gather, reduce-scatter, all-to-all, send/recv as comments. The file is
   "ultrascale-rates 1" then key = value lines (us_plan_rates_read). */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale_cuda.cuh"
#include <nccl.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e_ = (x);                                                   \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "calibrate: %s: %s\n", #x, cudaGetErrorString(e_)); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define NK(x)                                                                   \
    do {                                                                        \
        ncclResult_t e_ = (x);                                                  \
        if (e_ != ncclSuccess) {                                                \
            fprintf(stderr, "calibrate: %s: %s\n", #x, ncclGetErrorString(e_)); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
static us_ops o;

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static cudaStream_t stream_of(void) { return ((us__cuda *)o.backend)->stream; }

static void *rand_bf16(int64_t n, uint64_t seed) {
    std::vector<float> h((size_t)n);
    us_rng r;
    us_rng_seed(&r, seed);
    for (auto &x : h) x = us_rng_uniform(&r) - 0.5f;
    float *tmp;
    CK(cudaMalloc(&tmp, (size_t)n * 4));
    CK(cudaMemcpy(tmp, h.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
    void *d = o.alloc(&o, (size_t)n * 2);
    o.cast(&o, d, US_BF16, tmp, US_F32, n);
    CK(cudaDeviceSynchronize());
    cudaFree(tmp);
    return d;
}

static double gemm_tflops(int64_t M) { /* the 1B step's GEMMs with M rows */
    static const int64_t sh[][3] = {{16384, 3072, 2048},
                                    {16384, 2048, 2048},
                                    {16384, 16384, 2048},
                                    {16384, 2048, 8192},
                                    {16384, 128256, 2048}};
    double fl = 0, t = 0;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (auto &s : sh) {
        int64_t N = s[1], K = s[2];
        (void)s[0];
        void *A = rand_bf16(M * K, 1), *B = rand_bf16(N * K, 2),
             *C = o.alloc(&o, (size_t)M * N * 2);
        std::vector<double> ts;
        for (int r = 0; r < 15; r++) {
            float ms;
            cudaEventRecord(a, stream_of());
            o.gemm(&o, 0, 1, M, N, K, 1.0f, A, US_BF16, K, B, US_BF16, K, 0.0f, C, US_BF16, N);
            cudaEventRecord(b, stream_of());
            cudaEventSynchronize(b);
            cudaEventElapsedTime(&ms, a, b);
            if (r >= 5) ts.push_back(ms * 1e-3);
        }
        printf("# gemm %lld x %lld x %lld: %.1f TFLOP/s\n", (long long)M, (long long)N,
               (long long)K, 2.0 * M * N * K / median(ts) * 1e-12);
        fl += 2.0 * M * N * K;
        t += median(ts);
        o.free(&o, A);
        o.free(&o, B);
        o.free(&o, C);
    }
    return fl / t * 1e-12;
}

static void attention(double *f, double *bw) {
    int B = 4, T = 4096, NH = 32, NKV = 8, HS = 64;
    int64_t N = (int64_t)B * T, QKV = (int64_t)(NH + 2 * NKV) * HS;
    void *qkv = rand_bf16(N * QKV, 3), *dout = rand_bf16(N * NH * HS, 4);
    void *out = o.alloc(&o, (size_t)N * NH * HS * 2), *dqkv = o.alloc(&o, (size_t)N * QKV * 2);
    float *lse = (float *)o.alloc(&o, (size_t)B * NH * T * 4);
    double fl = 2.0 * B * (double)T * T * NH * HS; /* causal: 4·T²·C / 2 per sequence */
    std::vector<double> tf, tb;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int r = 0; r < 13; r++) {
        float ms;
        cudaEventRecord(a, stream_of());
        o.attention_fwd(&o, out, lse, qkv, B, T, NH, NKV, HS, US_BF16);
        cudaEventRecord(b, stream_of());
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms, a, b);
        if (r >= 3) tf.push_back(ms * 1e-3);
        cudaEventRecord(a, stream_of());
        o.attention_bwd(&o, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, US_BF16);
        cudaEventRecord(b, stream_of());
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms, a, b);
        if (r >= 3) tb.push_back(ms * 1e-3);
    }
    *f = fl / median(tf) * 1e-12;
    *bw = 2.5 * fl / median(tb) * 1e-12;
    o.free(&o, qkv);
    o.free(&o, dout);
    o.free(&o, out);
    o.free(&o, dqkv);
    o.free(&o, lse);
}

static double hbm_gbps(void) {
    size_t n = (size_t)1 << 30;
    void *x, *y;
    std::vector<double> ts;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaMalloc(&x, n));
    CK(cudaMalloc(&y, n));
    CK(cudaMemset(x, 1, n));
    for (int r = 0; r < 10; r++) {
        float ms;
        cudaEventRecord(a, 0);
        CK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice, 0));
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ms, a, b);
        if (r >= 2) ts.push_back(ms * 1e-3);
    }
    cudaFree(x);
    cudaFree(y);
    return 2.0 * n / median(ts) * 1e-9;
}

/* NCCL on 2 GPUs of this process: bus bandwidth (NCCL's convention) of each collective, 1 GiB */
static double nccl_rates(FILE *f) {
    int dev[2] = {0, 1};
    ncclComm_t c[2];
    cudaStream_t s[2];
    void *x[2], *y[2];
    size_t n = (size_t)1 << 30;
    double ar = 0;
    const char *names[] = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send/recv"};
    NK(ncclCommInitAll(c, 2, dev));
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(i));
        CK(cudaStreamCreate(&s[i]));
        CK(cudaMalloc(&x[i], n));
        CK(cudaMalloc(&y[i], n));
        CK(cudaMemset(x[i], 0, n));
    }
    for (int k = 0; k < 5; k++) {
        std::vector<double> ts;
        for (int r = 0; r < 8; r++) {
            double t0, t1;
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                CK(cudaStreamSynchronize(s[i]));
            }
            t0 = us_trace_now_us();
            NK(ncclGroupStart());
            for (int i = 0; i < 2; i++) {
                size_t e = n / 2; /* bf16 elements */
                if (k == 0) NK(ncclAllReduce(x[i], y[i], e, ncclBfloat16, ncclSum, c[i], s[i]));
                if (k == 1) NK(ncclAllGather(x[i], y[i], e / 2, ncclBfloat16, c[i], s[i]));
                if (k == 2)
                    NK(ncclReduceScatter(x[i], y[i], e / 2, ncclBfloat16, ncclSum, c[i], s[i]));
                if (k == 3)
                    for (int p = 0; p < 2; p++) { /* all-to-all: a half to each rank */
                        NK(ncclSend((char *)x[i] + p * (n / 2), e / 2, ncclBfloat16, p, c[i],
                                    s[i]));
                        NK(ncclRecv((char *)y[i] + p * (n / 2), e / 2, ncclBfloat16, p, c[i],
                                    s[i]));
                    }
                if (k == 4) {
                    NK(ncclSend(x[i], e, ncclBfloat16, 1 - i, c[i], s[i]));
                    NK(ncclRecv(y[i], e, ncclBfloat16, 1 - i, c[i], s[i]));
                }
            }
            NK(ncclGroupEnd());
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                CK(cudaStreamSynchronize(s[i]));
            }
            t1 = us_trace_now_us();
            if (r >= 2) ts.push_back((t1 - t0) * 1e-6);
        }
        { /* busbw: all-reduce 2(n−1)/n · S / t; all-gather, reduce-scatter, all-to-all (n−1)/n · S / t; send/recv S / t */
            double t = median(ts), S = (double)n,
                   bus = (k == 0   ? 1.0
                          : k == 4 ? 1.0
                                   : 0.5) *
                         S / t * 1e-9;
            if (k == 0) ar = bus;
            fprintf(f, "# nccl %s, 2 GPUs, 1 GiB: %.1f GB/s bus bandwidth\n", names[k], bus);
            printf("# nccl %s, 2 GPUs, 1 GiB: %.1f GB/s bus bandwidth\n", names[k], bus);
        }
    }
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(i));
        cudaFree(x[i]);
        cudaFree(y[i]);
        ncclCommDestroy(c[i]);
    }
    CK(cudaSetDevice(0));
    return ar;
}

int main(int argc, char **argv) {
    const char *out = "bench/rates_h200.txt";
    char err[256];
    int ng = 0;
    double g, af, ab, h, mh;
    FILE *f;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: calibrate [--out FILE]   (unknown argument %s)\n", argv[i]);
            return 2;
        }
    }
    CK(cudaGetDeviceCount(&ng));
    if (us_cuda_ops(&o, 0, err, sizeof err) != US_OK) {
        fprintf(stderr, "calibrate: %s\n", err);
        return 1;
    }
    if (!(f = fopen(out, "w"))) {
        fprintf(stderr, "calibrate: cannot write %s\n", out);
        return 1;
    }
    g = gemm_tflops(16384);
    { /* the rows at which a GEMM runs at half speed, from the rate at 2048 rows: r = f(2048)/f(16384), f(M) = M/(M+h) */
        double r = gemm_tflops(2048) / g;
        mh = r < 1 && 16384 * r > 2048 ? 2048.0 * 16384 * (1 - r) / (16384 * r - 2048) : 1;
    }
    attention(&af, &ab);
    h = hbm_gbps();
    fprintf(f, "ultrascale-rates 1\n# bench/calibrate on %d GPU(s)\n", ng);
    fprintf(
        f,
        "gemm_tflops = %.1f\ngemm_m_half = %.0f\nattn_fwd_tflops = %.1f\nattn_bwd_tflops = %.1f\n",
        g, mh, af, ab);
    fprintf(f,
            "# device-to-device copy: an upper bound of the elementwise kernels' rate\nhbm_gbps = "
            "%.0f\n",
            h);
    printf("gemm %.1f TFLOP/s, attention %.1f / %.1f TFLOP/s, copy %.0f GB/s\n", g, af, ab, h);
    if (ng >= 2)
        fprintf(f, "intra_gbps = %.1f\n", nccl_rates(f));
    else
        fprintf(f, "# one GPU: no collective measured (intra_gbps keeps its default)\n");
    fclose(f);
    us_cuda_ops_free(&o);
    printf("wrote %s\n", out);
    return 0;
}
