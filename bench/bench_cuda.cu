/* bench_cuda.cu — GPU benchmarks of the library, printed in the same format as the PyTorch
   peers (bench/torch_llama.py, cuda_dev/sdpa_bench.py) so bench/run_gpu.sh can put them side by side.
     --preset 1b|200m   training step of the Llama-3.2-1B / ~200M shape (bf16, fp32 master)
     --profile          also time each op class with CUDA events (where a step's time goes)
     --gemm             in-library GEMM (ops->gemm, cached plan) vs a standalone cuBLASLt call
     --attention        attention forward / backward TFLOP/s, causal, HS 128
   Build: make build/bench_cuda (nvcc, -lcublasLt). */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale_cuda.cuh"

#include <algorithm>
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
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v.empty() ? 0 : v[v.size() / 2]; }
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

/* ---- a profiling wrapper around the ops table: CUDA events around every call, by op class */
enum { P_GEMM, P_ATT_F, P_ATT_B, P_NORM, P_ROPE, P_SWIGLU, P_XENT, P_EMB, P_ADAMW, P_COPY, P_OTHER, P_N };
static const char *pname[P_N] = {"gemm (cuBLASLt)", "attention fwd", "attention bwd", "rmsnorm", "rope", "swiglu", "cross-entropy", "embedding", "adamw + norm", "copies", "other"};
static us_ops inner;
static cudaEvent_t ev0[P_N], ev1[P_N];
static double pms[P_N];
static int prof_on;
static cudaStream_t st_of(void) { return ((us__cuda *)inner.backend)->stream; }
static void pbeg(int k) { if (prof_on) cudaEventRecord(ev0[k], st_of()); }
static void pend(int k) {
    float ms = 0;
    if (!prof_on) return;
    cudaEventRecord(ev1[k], st_of());
    cudaEventSynchronize(ev1[k]);
    cudaEventElapsedTime(&ms, ev0[k], ev1[k]);
    pms[k] += ms;
}
#define WRAP(k, call) do { pbeg(k); call; pend(k); } while (0)
static void w_gemm(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K, float al, const void *A, us_dtype ad, int64_t lda, const void *B, us_dtype bd, int64_t ldb, float be, void *C, us_dtype cd, int64_t ldc) {
    (void)o; WRAP(P_GEMM, inner.gemm(&inner, ta, tb, M, N, K, al, A, ad, lda, B, bd, ldb, be, C, cd, ldc));
}
static void w_attf(us_ops *o, void *out, float *lse, const void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS, us_dtype dt) { (void)o; WRAP(P_ATT_F, inner.attention_fwd(&inner, out, lse, qkv, B, T, NH, NKV, HS, dt)); }
static void w_attb(us_ops *o, void *dq, const void *dout, const void *qkv, const void *out, const float *lse, int64_t B, int64_t T, int NH, int NKV, int HS, us_dtype dt) { (void)o; WRAP(P_ATT_B, inner.attention_bwd(&inner, dq, dout, qkv, out, lse, B, T, NH, NKV, HS, dt)); }
static void w_nf(us_ops *o, void *out, float *r, const void *x, const void *w, int64_t N, int64_t C, float eps, us_dtype dt) { (void)o; WRAP(P_NORM, inner.rmsnorm_fwd(&inner, out, r, x, w, N, C, eps, dt)); }
static void w_nb(us_ops *o, void *dx, float *dw, const void *d, const void *x, const void *w, const float *r, int64_t N, int64_t C, us_dtype dt) { (void)o; WRAP(P_NORM, inner.rmsnorm_bwd(&inner, dx, dw, d, x, w, r, N, C, dt)); }
static void w_rf(us_ops *o, void *q, int64_t B, int64_t T, int NH, int NKV, int HS, float th, us_dtype dt) { (void)o; WRAP(P_ROPE, inner.rope_fwd(&inner, q, B, T, NH, NKV, HS, th, dt)); }
static void w_rb(us_ops *o, void *q, int64_t B, int64_t T, int NH, int NKV, int HS, float th, us_dtype dt) { (void)o; WRAP(P_ROPE, inner.rope_bwd(&inner, q, B, T, NH, NKV, HS, th, dt)); }
static void w_sf(us_ops *o, void *h, const void *gu, int64_t N, int64_t F, us_dtype dt) { (void)o; WRAP(P_SWIGLU, inner.swiglu_fwd(&inner, h, gu, N, F, dt)); }
static void w_sb(us_ops *o, void *d, const void *dh, const void *gu, int64_t N, int64_t F, us_dtype dt) { (void)o; WRAP(P_SWIGLU, inner.swiglu_bwd(&inner, d, dh, gu, N, F, dt)); }
static void w_x(us_ops *o, float *l, int32_t *am, void *lg, const int32_t *t, int64_t N, int64_t V, float ds, us_dtype dt) { (void)o; WRAP(P_XENT, inner.xent(&inner, l, am, lg, t, N, V, ds, dt)); }
static void w_ef(us_ops *o, void *out, const int32_t *t, const void *w, int64_t N, int64_t C, us_dtype dt) { (void)o; WRAP(P_EMB, inner.embedding_fwd(&inner, out, t, w, N, C, dt)); }
static void w_eb(us_ops *o, float *d, const void *dout, const int32_t *t, int64_t N, int64_t C, us_dtype dt) { (void)o; WRAP(P_EMB, inner.embedding_bwd(&inner, d, dout, t, N, C, dt)); }
static void w_ad(us_ops *o, float *p, const float *g, float *m, float *v, void *lp, us_dtype ld, int64_t n, float lr, float b1, float b2, float eps, float wd, float gs, int step) { (void)o; WRAP(P_ADAMW, inner.adamw(&inner, p, g, m, v, lp, ld, n, lr, b1, b2, eps, wd, gs, step)); }
static double w_ss(us_ops *o, const float *x, int64_t n) { double r; (void)o; pbeg(P_ADAMW); r = inner.sumsq(&inner, x, n); pend(P_ADAMW); return r; }
static void w_cp(us_ops *o, void *d, const void *s, size_t b, us_copy_kind k) { (void)o; WRAP(P_COPY, inner.copy(&inner, d, s, b, k)); }
static void w_z(us_ops *o, void *p, size_t b) { (void)o; WRAP(P_OTHER, inner.zero(&inner, p, b)); }
static void *w_alloc(us_ops *o, size_t b) { void *p = inner.alloc(&inner, b); o->bytes_in_use = inner.bytes_in_use; o->bytes_peak = inner.bytes_peak; return p; }
static void w_free(us_ops *o, void *p) { inner.free(&inner, p); o->bytes_in_use = inner.bytes_in_use; }
static void w_cast(us_ops *o, void *d, us_dtype dd, const void *s, us_dtype sd, int64_t n) { (void)o; WRAP(P_OTHER, inner.cast(&inner, d, dd, s, sd, n)); }
static void w_sync(us_ops *o) { (void)o; inner.sync(&inner); }
static const char *w_err(us_ops *o) { (void)o; return inner.error(&inner); }
static us_ops profiled(void) {
    us_ops o = inner;
    int k;
    for (k = 0; k < P_N; k++) { cudaEventCreate(&ev0[k]); cudaEventCreate(&ev1[k]); }
    o.gemm = w_gemm; o.attention_fwd = w_attf; o.attention_bwd = w_attb; o.rmsnorm_fwd = w_nf; o.rmsnorm_bwd = w_nb;
    o.rope_fwd = w_rf; o.rope_bwd = w_rb; o.swiglu_fwd = w_sf; o.swiglu_bwd = w_sb; o.xent = w_x; o.embedding_fwd = w_ef;
    o.embedding_bwd = w_eb; o.adamw = w_ad; o.sumsq = w_ss; o.copy = w_cp; o.zero = w_z; o.alloc = w_alloc; o.free = w_free;
    o.cast = w_cast; o.sync = w_sync; o.error = w_err;
    return o;
}

/* ---- training throughput */
static int bench_train(const char *preset, int steps, int warm, us_recompute rc, int profile, const char *json) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_ops o;
    std::vector<double> times;
    int64_t n, i;
    int s, k;
    memset(&mc, 0, sizeof mc); memset(&tc, 0, sizeof tc);
    if (!strcmp(preset, "1b")) { mc.dim = 2048; mc.n_layers = 16; mc.n_heads = 32; mc.n_kv_heads = 8; mc.ffn_dim = 8192; mc.vocab = 128256; mc.tie_embeddings = 1; tc.seq = 4096; tc.batch = 4; }
    else if (!strcmp(preset, "200m")) { mc.dim = 1024; mc.n_layers = 12; mc.n_heads = 16; mc.n_kv_heads = 4; mc.ffn_dim = 4096; mc.vocab = 32768; tc.seq = 2048; tc.batch = 16; }
    else { fprintf(stderr, "bench_cuda: unknown preset %s\n", preset); return 2; }
    tc.precision = US_PRECISION_BF16; tc.recompute = rc; tc.steps = 1000; tc.lr = 3e-4f; tc.warmup = 0;
    prof_on = 0;
    o = profiled();
    if (us_model_init(&m, &mc, &tc, &o) != US_OK) { printf("ultrascale   | %s | init failed: %s\n", preset, us_model_error(&m)); return 3; }
    n = (int64_t)tc.batch * tc.seq;
    {
        std::vector<int32_t> in(n), tgt(n);
        us_rng r;
        us_rng_seed(&r, 1);
        for (s = 0; s < warm + steps; s++) {
            double t0;
            for (i = 0; i < n; i++) { in[i] = (int32_t)(us_rng_u64(&r) % (uint64_t)mc.vocab); tgt[i] = (int32_t)(us_rng_u64(&r) % (uint64_t)mc.vocab); }
            if (profile && s == warm + steps - 1) { prof_on = 1; memset(pms, 0, sizeof pms); }
            m.ops.sync(&m.ops);
            t0 = now_s();
            if (us_train_step(&m, in.data(), tgt.data(), NULL) != US_OK) { printf("ultrascale   | %s | step failed: %s\n", preset, us_model_error(&m)); return 3; }
            m.ops.sync(&m.ops);
            if (s >= warm && !(profile && s == warm + steps - 1)) times.push_back(now_s() - t0);
            prof_on = 0;
        }
    }
    {
        double t = median(times), tok_s = (double)n / t, mfu = us_flops_per_token(&m.cfg, tc.seq) * tok_s / 989e12;
        double peak_gib = (double)m.ops.bytes_peak / 1073741824.0;
        printf("ultrascale   | %-4s | tok/s %8.0f | MFU %5.1f%% | step %7.1f ms | peak %6.1f GiB | params %.3fB | recompute %s\n", preset, tok_s,
               100 * mfu, 1e3 * t, peak_gib, (double)m.n_params / 1e9, us_recompute_name(rc));
        if (json) {
            FILE *f = fopen(json, "w");
            if (f) { fprintf(f, "{\"impl\": \"ultrascale\", \"preset\": \"%s\", \"tok_s\": %.1f, \"mfu\": %.4f, \"step_ms\": %.2f, \"peak_gib\": %.2f, \"params\": %lld}\n", preset, tok_s, mfu, 1e3 * t, peak_gib, (long long)m.n_params); fclose(f); }
        }
        if (profile) {
            double tot = 0;
            for (k = 0; k < P_N; k++) tot += pms[k];
            printf("  profile of one step (CUDA events around each op; includes launch gaps):\n");
            for (k = 0; k < P_N; k++) if (pms[k] > 0) printf("    %-16s %8.2f ms  %5.1f%%\n", pname[k], pms[k], 100 * pms[k] / tot);
            printf("    %-16s %8.2f ms\n", "total", tot);
        }
    }
    us_model_free(&m);
    return 0;
}

/* ---- GEMM: in the library vs a standalone cuBLASLt call (fresh handle, own heuristic) */
static void bench_gemm(void) {
    int64_t shapes[][3] = {{8192, 8192, 8192}, {16384, 3072, 2048}, {16384, 2048, 2048}, {16384, 16384, 2048}, {16384, 2048, 8192}, {16384, 128256, 2048}};
    us__cuda *c = (us__cuda *)inner.backend;
    cublasLtHandle_t lt;
    void *ws;
    size_t wsb = (size_t)32 << 20;
    cudaEvent_t a, b;
    int k, r;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    cublasLtCreate(&lt);
    CK(cudaMalloc(&ws, wsb));
    printf("\n| GEMM bf16 (M x N x K, y = x·Wᵀ) | in-library TFLOP/s | standalone cuBLASLt | ratio |\n|---|---|---|---|\n");
    for (k = 0; k < 6; k++) {
        int64_t M = shapes[k][0], N = shapes[k][1], K = shapes[k][2];
        size_t bytesA = (size_t)M * K * 2, bytesB = (size_t)N * K * 2, bytesC = (size_t)M * N * 2;
        void *A = inner.alloc(&inner, bytesA), *B = inner.alloc(&inner, bytesB), *C = inner.alloc(&inner, bytesC);
        float *tmp;
        std::vector<double> tl, ts;
        double fl = 2.0 * M * N * K;
        /* random data (not zeros): fp32 noise cast to bf16 on the device */
        CK(cudaMalloc(&tmp, std::max(bytesA, bytesB) * 2));
        {
            std::vector<float> h(std::max(M * K, N * K));
            us_rng rg;
            us_rng_seed(&rg, 7 + k);
            for (size_t i = 0; i < h.size(); i++) h[i] = us_rng_uniform(&rg) - 0.5f;
            CK(cudaMemcpy(tmp, h.data(), (size_t)M * K * 4, cudaMemcpyHostToDevice)); inner.cast(&inner, A, US_BF16, tmp, US_F32, M * K);
            CK(cudaMemcpy(tmp, h.data(), (size_t)N * K * 4, cudaMemcpyHostToDevice)); inner.cast(&inner, B, US_BF16, tmp, US_F32, N * K);
        }
        for (r = 0; r < 25; r++) {   /* alternate the two, 5 warm-ups */
            float ms;
            cudaEventRecord(a, c->stream);
            inner.gemm(&inner, 0, 1, M, N, K, 1.0f, A, US_BF16, K, B, US_BF16, K, 0.0f, C, US_BF16, N);
            cudaEventRecord(b, c->stream); cudaEventSynchronize(b); cudaEventElapsedTime(&ms, a, b);
            if (r >= 5) tl.push_back(ms * 1e-3);
            {
                cublasLtMatmulDesc_t d; cublasLtMatrixLayout_t la, lb, lc; cublasLtMatmulPreference_t pr;
                cublasLtMatmulHeuristicResult_t h; int found = 0; float al = 1, be = 0;
                cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
                cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA);
                cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB);
                cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K);
                cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K);
                cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N);
                cublasLtMatmulPreferenceCreate(&pr);
                cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
                cublasLtMatmulAlgoGetHeuristic(lt, d, la, lb, lc, lc, pr, 1, &h, &found);
                cudaEventRecord(a, c->stream);
                cublasLtMatmul(lt, d, &al, B, la, A, lb, &be, C, lc, C, lc, &h.algo, ws, wsb, c->stream);
                cudaEventRecord(b, c->stream); cudaEventSynchronize(b); cudaEventElapsedTime(&ms, a, b);
                if (r >= 5) ts.push_back(ms * 1e-3);
                cublasLtMatmulPreferenceDestroy(pr); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
                cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(d);
            }
        }
        printf("| %5lld x %6lld x %5lld | %7.1f | %7.1f | %5.3f |\n", (long long)M, (long long)N, (long long)K, fl / median(tl) * 1e-12,
               fl / median(ts) * 1e-12, median(ts) / median(tl));
        inner.free(&inner, A); inner.free(&inner, B); inner.free(&inner, C); cudaFree(tmp);
    }
    cudaFree(ws); cublasLtDestroy(lt);
}

/* ---- attention TFLOP/s (causal: half the square), same table as sdpa_bench.py */
static void bench_attention(void) {
    int Ts[3] = {2048, 4096, 8192}, k, r;
    us__cuda *c = (us__cuda *)inner.backend;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    printf("\n| attention (ultrascale) causal bf16 HS=128 | fwd TFLOP/s | bwd TFLOP/s |\n|---|---|---|\n");
    for (k = 0; k < 3; k++) {
        int T = Ts[k], B = 16384 / T, NH = 16, NKV = 16, HS = 128;
        int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, N = (int64_t)B * T;
        void *qkv = inner.alloc(&inner, (size_t)N * QKV * 2), *out = inner.alloc(&inner, (size_t)N * NH * HS * 2);
        void *dout = inner.alloc(&inner, (size_t)N * NH * HS * 2), *dqkv = inner.alloc(&inner, (size_t)N * QKV * 2);
        float *lse = (float *)inner.alloc(&inner, (size_t)B * NH * T * 4), *tmp;
        std::vector<double> tf, tb;
        double fl = 4.0 * B * NH * (double)T * T * HS / 2;
        std::vector<float> h((size_t)N * QKV);
        us_rng rg;
        us_rng_seed(&rg, 3);
        for (size_t i = 0; i < h.size(); i++) h[i] = us_rng_normal(&rg);
        CK(cudaMalloc(&tmp, h.size() * 4));
        CK(cudaMemcpy(tmp, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        inner.cast(&inner, qkv, US_BF16, tmp, US_F32, N * QKV);
        inner.cast(&inner, dout, US_BF16, tmp, US_F32, N * NH * HS);
        for (r = 0; r < 13; r++) {
            float ms;
            cudaEventRecord(a, c->stream);
            inner.attention_fwd(&inner, out, lse, qkv, B, T, NH, NKV, HS, US_BF16);
            cudaEventRecord(b, c->stream); cudaEventSynchronize(b); cudaEventElapsedTime(&ms, a, b);
            if (r >= 3) tf.push_back(ms * 1e-3);
            cudaEventRecord(a, c->stream);
            inner.attention_bwd(&inner, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, US_BF16);
            cudaEventRecord(b, c->stream); cudaEventSynchronize(b); cudaEventElapsedTime(&ms, a, b);
            if (r >= 3) tb.push_back(ms * 1e-3);
        }
        printf("| B=%d T=%d NH=%d | %7.1f | %7.1f |\n", B, T, NH, fl / median(tf) * 1e-12, 2.5 * fl / median(tb) * 1e-12);
        inner.free(&inner, qkv); inner.free(&inner, out); inner.free(&inner, dout); inner.free(&inner, dqkv); inner.free(&inner, lse); cudaFree(tmp);
    }
    if (inner.error(&inner)) printf("CUDA error: %s\n", inner.error(&inner));
}

int main(int argc, char **argv) {
    char err[256];
    const char *preset = NULL, *json = NULL;
    int steps = 10, warm = 3, profile = 0, do_gemm = 0, do_att = 0, i;
    us_recompute rc = US_RECOMPUTE_NONE;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warm = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--recompute") && i + 1 < argc) { i++; rc = !strcmp(argv[i], "full") ? US_RECOMPUTE_FULL : !strcmp(argv[i], "selective") ? US_RECOMPUTE_SELECTIVE : US_RECOMPUTE_NONE; }
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!strcmp(argv[i], "--gemm")) do_gemm = 1;
        else if (!strcmp(argv[i], "--attention")) do_att = 1;
        else { fprintf(stderr, "usage: bench_cuda [--preset 1b|200m [--steps N] [--warmup N] [--recompute M] [--profile] [--json F]] [--gemm] [--attention]\n"); return 2; }
    }
    if (us_cuda_ops(&inner, 0, err, sizeof err) != US_OK) { fprintf(stderr, "bench_cuda: %s\n", err); return 1; }
    if (preset && bench_train(preset, steps, warm, rc, profile, json)) return 1;
    if (do_gemm) bench_gemm();
    if (do_att) bench_attention();
    us_cuda_ops_free(&inner);
    return 0;
}
