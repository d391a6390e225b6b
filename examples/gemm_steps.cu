/* gemm_steps.cu — the Ultra-Scale Playbook's "going deeper into the GPU" lesson, runnable.

   Four fp32 matmul kernels, C[M,N] = A[M,K]·B[K,N] (row-major), each one idea better than the last:
       1 naive        one thread per output, threadIdx.x walking rows: uncoalesced
       2 coalesced    threadIdx.x walks columns: a warp touches contiguous memory
       3 smem tiled   32×32 tiles of A and B staged in shared memory, reused 32 times each
       4 reg-blocked  thread coarsening: each thread keeps an 8×8 block of C in registers
   each timed (cudaEvents, warm-up + median) and checked against cuBLASLt computed in the same run;
   cuBLASLt fp32 (and TF32 tensor cores, for reference) is timed too.
       nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a examples/gemm_steps.cu \
            -o build/gemm_steps -lcublasLt
       build/gemm_steps                    # M = N = K = 4096
       build/gemm_steps --n 1000           # sizes that are not multiples of the tiles
       build/gemm_steps --m 777 --n 1029 --k 515 --reps 20
   The check is max|C − C_cuBLAS| / max|C_cuBLAS| ≤ 1e-3 (fp32 with a different summation order
   lands near 1e-6; an indexing bug lands near 1). The cuBLASLt reference is itself checked on 64
   sampled entries against a double-precision dot product on the CPU. Exit status 1 on any FAIL. */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CHECK_CUDA(call)                                                       \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) {                                               \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorString(e_), cudaGetErrorName(e_));             \
            exit(1);                                                           \
        }                                                                      \
    } while (0)
#define CHECK_CUBLAS(call)                                                     \
    do {                                                                       \
        cublasStatus_t s_ = (call);                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                     \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, \
                    cublasLtGetStatusString(s_), cublasLtGetStatusName(s_));   \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ------------------------------------------------------------------------------------ */
/* 1. naive. One thread per C element, as in the Playbook's first kernel: threadIdx.x (the fast
   index inside a warp) walks rows. At each k the 32 threads of a warp read A[row..row+31][k],
   32 addresses K floats apart (32 separate memory transactions for 128 useful bytes), and write
   C a column at a time. The arithmetic is right; the memory system serves it badly. */
__global__ void gemm_naive(int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                           float *C) {
    int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t col = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc += A[row * K + k] * B[k * N + col];
    C[row * N + col] = acc;
}

/* 2. coalesced. The same arithmetic with the two thread indices swapped: threadIdx.x walks
   columns, so a warp reads B[k][col..col+31] (one 128-byte transaction), reads one A element
   (a broadcast) and writes 32 contiguous floats of C. Memory coalescing, nothing else. */
__global__ void gemm_coalesced(int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                               float *C) {
    int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t row = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) acc += A[row * K + k] * B[k * N + col];
    C[row * N + col] = acc;
}

/* 3. shared-memory tiling. Kernel 2 still loads every A and B element from global memory once per
   output that uses it (K·2 loads per output). Here a 32×32 block first copies a 32×32 tile of A
   and one of B into shared memory (each thread one element, coalesced), then every thread reads
   its 32 products from there: each global load now serves 32 outputs. Out-of-range elements are
   loaded as 0, so any M, N, K works. */
#define TILE 32

__global__ void gemm_smem(int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                          float *C) {
    __shared__ float As[TILE][TILE], Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t row = (int64_t)blockIdx.y * TILE + ty, col = (int64_t)blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = row < M && k0 + tx < K ? A[row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = k0 + ty < K && col < N ? B[(k0 + ty) * N + col] : 0.0f;
        __syncthreads(); /* the tile is complete before anyone reads it */
#pragma unroll
        for (int k = 0; k < TILE; k++)
            acc += As[ty][k] * Bs[k][tx]; /* As: broadcast, Bs: stride 1 */
        __syncthreads();                  /* everyone is done before it is overwritten */
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

/* 4. thread coarsening (register blocking). In kernel 3 every multiply-add costs two shared-memory
   loads. Here a 256-thread block owns a 128×128 tile of C and each thread 8×8 of it, held in
   registers: per k it loads 8 values of A and 8 of B into registers and does 64 FMAs with them
   (an outer product), 4 FMAs per load instead of 0.5. Thread (tx, ty) owns rows ty + 16·i and
   columns tx + 16·j, so the 16 tx of a half-warp read 16 consecutive Bs words (no bank
   conflicts) and write 16 consecutive C floats. A is stored transposed in shared memory
   (As[k][m], padded by 4 so the transposing stores do not collide on a bank). */
#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8
#define THREADS4 ((BM / TM) * (BN / TN)) /* 256 */

__global__ void __launch_bounds__(THREADS4)
    gemm_regblock(int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C) {
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BN];
    const int tid = threadIdx.x, tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
    float acc[TM][TN] = {};
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < BM * BK / THREADS4;
             i++) { /* A tile [BM,BK]: 8 threads per 32-byte row piece */
            int idx = tid + i * THREADS4, r = idx / BK, c = idx % BK;
            int64_t gr = m0 + r, gc = k0 + c;
            As[c][r] = gr < M && gc < K ? A[gr * K + gc] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < BK * BN / THREADS4;
             i++) { /* B tile [BK,BN]: a warp reads 128 contiguous bytes */
            int idx = tid + i * THREADS4, r = idx / BN, c = idx % BN;
            int64_t gr = k0 + r, gc = n0 + c;
            Bs[r][c] = gr < K && gc < N ? B[gr * N + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; k++) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) a[i] = As[k][ty + i * (BM / TM)];
#pragma unroll
            for (int j = 0; j < TN; j++) b[j] = Bs[k][tx + j * (BN / TN)];
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; i++) {
        int64_t r = m0 + ty + i * (BM / TM);
#pragma unroll
        for (int j = 0; j < TN; j++) {
            int64_t c = n0 + tx + j * (BN / TN);
            if (r < M && c < N) C[r * N + c] = acc[i][j];
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* cuBLASLt. It is column-major; a row-major buffer read column-major is the transpose. Row-major
   C[M,N] = A·B is column-major C^T[N,M] = B^T[N,K]·A^T[K,M], and the row-major buffers of B, A
   and C are exactly column-major B^T (ld N), A^T (ld K) and C^T (ld N): pass B first, then A. */
struct lt_gemm {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lb, la, lc; /* B^T [N,K], A^T [K,M], C^T [N,M] */
    cublasLtMatmulAlgo_t algo;
    void *ws;
    size_t ws_bytes;
};

static void lt_init(lt_gemm *g, cublasLtHandle_t h, cublasComputeType_t compute, int64_t M,
                    int64_t N, int64_t K, void *ws, size_t ws_bytes) {
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    g->h = h;
    g->ws = ws;
    g->ws_bytes = ws_bytes;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&g->desc, compute, CUDA_R_32F));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_32F, (uint64_t)N, (uint64_t)K, N));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_32F, (uint64_t)K, (uint64_t)M, K));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32F, (uint64_t)N, (uint64_t)M, N));
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(h, g->desc, g->lb, g->la, g->lc, g->lc, pref, 1,
                                                &heur, &found));
    if (found < 1) {
        fprintf(stderr, "%s:%d: cuBLASLt found no algorithm for this matmul\n", __FILE__, __LINE__);
        exit(1);
    }
    g->algo = heur.algo;
    CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
}

static void lt_run(const lt_gemm *g, const float *A, const float *B, float *C) {
    const float alpha = 1.0f, beta = 0.0f; /* beta 0: C is not read */
    CHECK_CUBLAS(cublasLtMatmul(g->h, g->desc, &alpha, B, g->lb, A, g->la, &beta, C, g->lc, C,
                                g->lc, &g->algo, g->ws, g->ws_bytes, 0));
}

static void lt_free(lt_gemm *g) {
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(g->lb));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(g->la));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(g->lc));
    CHECK_CUBLAS(cublasLtMatmulDescDestroy(g->desc));
}

/* ------------------------------------------------------------------------------------ */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* max |c − ref| / max |ref|; NaN or inf anywhere (an unwritten, poisoned element) gives inf */
static double rel_err(const std::vector<float> &c, const std::vector<float> &ref, double refmax) {
    double worst = 0.0;
    for (size_t i = 0; i < c.size(); i++) {
        double d = std::fabs((double)c[i] - (double)ref[i]);
        if (!std::isfinite(d)) return INFINITY;
        worst = std::max(worst, d);
    }
    return worst / refmax;
}

struct result {
    std::string name;
    double ms, tflops, err, tol;
};

static void usage(FILE *f) {
    fprintf(f, "usage: gemm_steps [--n N] [--m M] [--k K] [--reps R] [--warmup W]\n"
               "  C[M,N] = A[M,K]·B[K,N] fp32, row-major; M and K default to N (default 4096)\n"
               "  each kernel: W untimed runs (default 2), then the median of R timed runs "
               "(default 10)\n");
}

int main(int argc, char **argv) {
    int64_t M = 0, N = 4096, K = 0;
    int reps = 10, warmup = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "gemm_steps: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        long long v = atoll(argv[++i]);
        if (!strcmp(a, "--n"))
            N = v;
        else if (!strcmp(a, "--m"))
            M = v;
        else if (!strcmp(a, "--k"))
            K = v;
        else if (!strcmp(a, "--reps"))
            reps = (int)v;
        else if (!strcmp(a, "--warmup"))
            warmup = (int)v;
        else {
            fprintf(stderr, "gemm_steps: unknown flag %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!M) M = N;
    if (!K) K = N;
    if (M < 1 || N < 1 || K < 1 || reps < 1 || warmup < 0 || cdiv(N, 32) > 65535 ||
        cdiv(M, 32) > 65535) {
        fprintf(stderr, "gemm_steps: need 1 <= M, N, K <= 2097120, reps >= 1, warmup >= 0\n");
        return 2;
    }

    cudaDeviceProp prop;
    int dev;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
    printf("gemm_steps: C[%lld,%lld] = A[%lld,%lld]·B[%lld,%lld] fp32 on %s (sm_%d%d), median of "
           "%d after %d warm-up\n",
           (long long)M, (long long)N, (long long)M, (long long)K, (long long)K, (long long)N,
           prop.name, prop.major, prop.minor, reps, warmup);

    /* random inputs in [-1, 1) */
    std::vector<float> hA((size_t)(M * K)), hB((size_t)(K * N)), hC((size_t)(M * N)),
        hRef((size_t)(M * N));
    uint64_t seed = 1337;
    for (float &x : hA) x = (float)(splitmix(&seed) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    for (float &x : hB) x = (float)(splitmix(&seed) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    float *dA, *dB, *dC;
    void *ws;
    const size_t ws_bytes = (size_t)32 << 20;
    CHECK_CUDA(cudaMalloc(&dA, hA.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dB, hB.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dC, hC.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    CHECK_CUDA(cudaMemcpy(dA, hA.data(), hA.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dB, hB.data(), hB.size() * sizeof(float), cudaMemcpyHostToDevice));

    cublasLtHandle_t lt;
    lt_gemm g32, gtf32;
    CHECK_CUBLAS(cublasLtCreate(&lt));
    lt_init(&g32, lt, CUBLAS_COMPUTE_32F, M, N, K, ws, ws_bytes);
    lt_init(&gtf32, lt, CUBLAS_COMPUTE_32F_FAST_TF32, M, N, K, ws, ws_bytes);

    cudaEvent_t ev0, ev1;
    CHECK_CUDA(cudaEventCreate(&ev0));
    CHECK_CUDA(cudaEventCreate(&ev1));
    const double flop = 2.0 * (double)M * (double)N * (double)K;

    /* Poison C before every run: NaN (0xFF bytes) for our kernels, so an element a kernel forgets
       fails the check; a huge finite value (0x7F bytes) for cuBLASLt, which with beta 0 must not
       read C (and 0·finite stays harmless if it did), while an unwritten element still fails. */
    auto time_it = [&](const std::function<void()> &launch, int poison) {
        std::vector<float> ms;
        for (int r = 0; r < warmup + reps; r++) {
            CHECK_CUDA(cudaMemset(dC, poison, hC.size() * sizeof(float)));
            CHECK_CUDA(cudaEventRecord(ev0));
            launch();
            CHECK_CUDA(cudaGetLastError());
            CHECK_CUDA(cudaEventRecord(ev1));
            CHECK_CUDA(cudaEventSynchronize(ev1));
            float t;
            CHECK_CUDA(cudaEventElapsedTime(&t, ev0, ev1));
            if (r >= warmup) ms.push_back(t);
        }
        std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
        return (double)ms[ms.size() / 2];
    };

    /* the reference: cuBLASLt fp32, itself checked on sampled entries against double on the CPU */
    std::vector<result> res;
    double ms = time_it([&] { lt_run(&g32, dA, dB, dC); }, 0x7F);
    CHECK_CUDA(cudaMemcpy(hRef.data(), dC, hRef.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double refmax = 0.0;
    for (float x : hRef) refmax = std::max(refmax, (double)std::fabs(x));
    double ref_err = std::isfinite(refmax) && refmax > 0 ? 0.0 : INFINITY;
    for (int s = 0; s < 64 && std::isfinite(ref_err); s++) {
        int64_t i = (int64_t)(splitmix(&seed) % (uint64_t)M),
                j = (int64_t)(splitmix(&seed) % (uint64_t)N);
        double dot = 0.0;
        for (int64_t k = 0; k < K; k++) dot += (double)hA[i * K + k] * (double)hB[k * N + j];
        double d = std::fabs(dot - (double)hRef[i * N + j]) / refmax;
        ref_err = std::isfinite(d) ? std::max(ref_err, d) : INFINITY;
    }
    res.push_back(
        {"cuBLASLt fp32 (vs CPU double, 64 samples)", ms, flop / ms * 1e-9, ref_err, 1e-3});
    printf("  %-44s %10.3f ms %8.2f TFLOP/s\n", res.back().name.c_str(), ms, res.back().tflops);

    struct step {
        const char *name;
        std::function<void()> launch;
        double tol;
    };

    const step steps[] = {
        {"1 naive (uncoalesced)",
         [&] {
             gemm_naive<<<dim3((unsigned)cdiv(M, 32), (unsigned)cdiv(N, 32)), dim3(32, 32)>>>(
                 M, N, K, dA, dB, dC);
         },
         1e-3},
        {"2 coalesced",
         [&] {
             gemm_coalesced<<<dim3((unsigned)cdiv(N, 32), (unsigned)cdiv(M, 32)), dim3(32, 32)>>>(
                 M, N, K, dA, dB, dC);
         },
         1e-3},
        {"3 shared-memory tiles 32x32",
         [&] {
             gemm_smem<<<dim3((unsigned)cdiv(N, TILE), (unsigned)cdiv(M, TILE)),
                         dim3(TILE, TILE)>>>(M, N, K, dA, dB, dC);
         },
         1e-3},
        {"4 register-blocked 8x8 per thread",
         [&] {
             gemm_regblock<<<dim3((unsigned)cdiv(N, BN), (unsigned)cdiv(M, BM)), THREADS4>>>(
                 M, N, K, dA, dB, dC);
         },
         1e-3},
        /* TF32 keeps 10 mantissa bits of each input: about 1e-4..1e-3 of the magnitude, hence 1e-2 */
        {"cuBLASLt TF32 tensor cores (reference)", [&] { lt_run(&gtf32, dA, dB, dC); }, 1e-2},
    };
    for (const step &s : steps) {
        bool ours = strncmp(s.name, "cuBLAS", 6) != 0;
        ms = time_it(s.launch, ours ? 0xFF : 0x7F);
        CHECK_CUDA(cudaMemcpy(hC.data(), dC, hC.size() * sizeof(float), cudaMemcpyDeviceToHost));
        res.push_back({s.name, ms, flop / ms * 1e-9, rel_err(hC, hRef, refmax), s.tol});
        printf("  %-44s %10.3f ms %8.2f TFLOP/s\n", s.name, ms, res.back().tflops);
    }

    const double base = res[0].tflops;
    int fails = 0;
    printf("\n| %-44s | %10s | %8s | %9s | %11s | %-5s |\n", "kernel", "ms", "TFLOP/s", "% cuBLAS",
           "max rel err", "check");
    printf("|----------------------------------------------|------------|----------|-----------|---"
           "----------|-------|\n");
    for (const result &r : res) {
        bool pass = r.err <= r.tol;
        fails += !pass;
        printf("| %-44s | %10.3f | %8.2f | %8.1f%% | %11.2e | %-5s |\n", r.name.c_str(), r.ms,
               r.tflops, 100.0 * r.tflops / base, r.err, pass ? "PASS" : "FAIL");
    }
    printf("max rel err = max|C - C_ref| / max|C_ref|, C_ref = cuBLASLt fp32 (max|C_ref| = %.3g); "
           "%% cuBLAS is against cuBLASLt fp32\n",
           refmax);

    CHECK_CUDA(cudaEventDestroy(ev0));
    CHECK_CUDA(cudaEventDestroy(ev1));
    lt_free(&g32);
    lt_free(&gtf32);
    CHECK_CUBLAS(cublasLtDestroy(lt));
    CHECK_CUDA(cudaFree(dA));
    CHECK_CUDA(cudaFree(dB));
    CHECK_CUDA(cudaFree(dC));
    CHECK_CUDA(cudaFree(ws));
    if (fails) printf("%d FAILED\n", fails);
    return fails ? 1 : 0;
}
