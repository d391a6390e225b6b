/* test_nccl.cu — the NCCL backend of the comm seam on real GPUs, one process per GPU.
   Run without RANK in the environment, the program launches itself on 2 GPUs with
   us_launch_procs (--nproc N for more) twice: the collectives checked against host-computed
   references, then a fault run where rank 1 dies by SIGKILL in the middle and the others'
   wait() must fail within c.timeout_s = 10 s. Fewer than 2 GPUs: prints SKIP and exits 0.
   --world1 runs the checks in this process as a world of one rank (any GPU).
       nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DULTRASCALE_NCCL \
            -Xcompiler -Wall,-Wextra tests/test_nccl.cu -o build/test_nccl -lnccl */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#ifndef ULTRASCALE_NCCL
#define ULTRASCALE_NCCL
#endif
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include "us_test.h"

#include <cuda_runtime.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int R, N;       /* this rank, world size */
static cudaStream_t S; /* the compute stream */

#define CU(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            printf("rank %d: %s failed: %s (%s:%d)\n", R, #x, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                   \
            fflush(stdout);                                                                     \
            _exit(2);                                                                           \
        }                                                                                       \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The values each rank contributes: exact in f32 and bf16 (small multiples of 1/64 and small
   integers), so sums do not depend on NCCL's reduction order; f32 is still compared with a
   tolerance. */
static float vf(int r, int64_t i) {
    return (float)((int)(((uint64_t)i * 2654435761u + (uint64_t)r * 40503u) % 2001u) - 1000) /
           64.0f;
}

static float vb(int r, int64_t i) { return (float)((int)((i * 7 + r * 3) % 33) - 16); }

static int32_t vi(int r, int64_t i) { return (int32_t)((i * 31 + r * 17) % 1000) - 500; }

static void *dalloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void h2d(void *d, const void *h, size_t b) {
    CU(cudaMemcpyAsync(d, h, b, cudaMemcpyHostToDevice, S));
    CU(cudaStreamSynchronize(S));
}

static void d2h(void *h, const void *d, size_t b) {
    CU(cudaMemcpyAsync(h, d, b, cudaMemcpyDeviceToHost, S));
    CU(cudaStreamSynchronize(S));
}

static int close_f(float got, double want, double tol) {
    return fabs((double)got - want) <= tol * (1.0 + fabs(want));
}

/* ---- kernels for the overlap tests */
__global__ void k_slow_fill(float *a, int64_t n, int r, long long spin) {
    if (spin) {
        long long t0 = clock64();
        while (clock64() - t0 < spin) {
        }
    } /* compute still running */
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        a[i] = (float)((int)(((uint64_t)i * 2654435761u + (uint64_t)r * 40503u) % 2001u) - 1000) /
               64.0f;
}

__global__ void k_scale(float *a, int64_t n, float s) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        a[i] *= s;
}

static void test_all_reduce(us_comm *c) {
    const int64_t n = (1 << 20) + 3;
    float *h = (float *)malloc(n * 4), *d = (float *)dalloc(n * 4);
    int32_t *hi = (int32_t *)malloc(n * 4);
    uint16_t *hb = (uint16_t *)malloc(n * 2);
    double *hd = (double *)malloc(n * 8);
    int64_t i, bad, before;
    int r, k;
    static const us_reduce_op ops[3] = {US_REDUCE_SUM, US_REDUCE_AVG, US_REDUCE_MAX};
    static const char *names[3] = {"sum", "avg", "max"};
    for (k = 0; k < 3; k++) { /* f32: sum, avg, max */
        for (i = 0; i < n; i++) h[i] = vf(R, i);
        h2d(d, h, n * 4);
        before = c->bytes_sent;
        CHECK(c->all_reduce(c, &c->world, d, n, US_F32, ops[k], NULL) == US_OK,
              "rank %d: all_reduce f32 %s: %s", R, names[k], c->err);
        if (k == 0)
            CHECK(c->bytes_sent - before == (int64_t)(2.0 * (N - 1) / N * (double)(n * 4)),
                  "rank %d: all_reduce counts 2(N-1)/N bytes: %lld", R,
                  (long long)(c->bytes_sent - before));
        d2h(h, d, n * 4);
        for (i = 0, bad = 0; i < n; i++) {
            double want = k == 2 ? -1e30 : 0;
            for (r = 0; r < N; r++) want = k == 2 ? fmax(want, vf(r, i)) : want + vf(r, i);
            if (k == 1) want /= N;
            if (!close_f(h[i], want, 1e-5)) bad++;
        }
        CHECK(bad == 0, "rank %d: all_reduce f32 %s matches the host (%lld wrong)", R, names[k],
              (long long)bad);
    }
    for (k = 0; k < 3; k += 2) { /* i32: sum, max, exact */
        for (i = 0; i < n; i++) hi[i] = vi(R, i);
        h2d(d, hi, n * 4);
        CHECK(c->all_reduce(c, &c->world, d, n, US_I32, ops[k], NULL) == US_OK,
              "rank %d: all_reduce i32: %s", R, c->err);
        d2h(hi, d, n * 4);
        for (i = 0, bad = 0; i < n; i++) {
            int32_t want = k == 2 ? INT32_MIN : 0;
            for (r = 0; r < N; r++)
                want = k == 2 ? (vi(r, i) > want ? vi(r, i) : want) : want + vi(r, i);
            bad += hi[i] != want;
        }
        CHECK(bad == 0, "rank %d: all_reduce i32 %s is exact (%lld wrong)", R, names[k],
              (long long)bad);
    }
    for (k = 0; k < 2; k++) { /* bf16: sum, avg */
        for (i = 0; i < n; i++) hb[i] = us_f32_to_bf16(vb(R, i));
        h2d(d, hb, n * 2);
        CHECK(c->all_reduce(c, &c->world, d, n, US_BF16, ops[k], NULL) == US_OK,
              "rank %d: all_reduce bf16: %s", R, c->err);
        d2h(hb, d, n * 2);
        for (i = 0, bad = 0; i < n; i++) {
            double want = 0;
            for (r = 0; r < N; r++) want += vb(r, i);
            if (k == 1) want /= N;
            if (!close_f(us_bf16_to_f32(hb[i]), want, 1e-2)) bad++;
        }
        CHECK(bad == 0, "rank %d: all_reduce bf16 %s (%lld wrong)", R, names[k], (long long)bad);
    }
    { /* f64 sum (host-side scalars like loss sums) */
        double *dd = (double *)dalloc(1000 * 8);
        for (i = 0; i < 1000; i++) hd[i] = vf(R, i) * 1e-3;
        h2d(dd, hd, 1000 * 8);
        CHECK(c->all_reduce(c, &c->world, dd, 1000, US_F64, US_REDUCE_SUM, NULL) == US_OK,
              "rank %d: all_reduce f64: %s", R, c->err);
        d2h(hd, dd, 1000 * 8);
        for (i = 0, bad = 0; i < 1000; i++) {
            double want = 0;
            for (r = 0; r < N; r++) want += vf(r, i) * 1e-3;
            bad += fabs(hd[i] - want) > 1e-12;
        }
        CHECK(bad == 0, "rank %d: all_reduce f64 (%lld wrong)", R, (long long)bad);
        CU(cudaFree(dd));
    }
    CU(cudaFree(d));
    free(h);
    free(hi);
    free(hb);
    free(hd);
}

static void test_reduce_family(us_comm *c) {
    const int64_t n = 12345;
    float *h = (float *)malloc(N * n * 4), *src = (float *)dalloc(N * n * 4),
          *dst = (float *)dalloc(N * n * 4);
    int32_t *hi = (int32_t *)malloc(N * n * 4);
    int64_t i, bad;
    int r, root = N - 1;
    /* reduce to the last rank, out of place */
    for (i = 0; i < n; i++) h[i] = vf(R, i);
    h2d(src, h, n * 4);
    CHECK(c->reduce(c, &c->world, dst, src, n, US_F32, US_REDUCE_SUM, root, NULL) == US_OK,
          "rank %d: reduce: %s", R, c->err);
    if (R == root) {
        d2h(h, dst, n * 4);
        for (i = 0, bad = 0; i < n; i++) {
            double want = 0;
            for (r = 0; r < N; r++) want += vf(r, i);
            bad += !close_f(h[i], want, 1e-5);
        }
        CHECK(bad == 0, "rank %d: reduce to root %d (%lld wrong)", R, root, (long long)bad);
    }
    /* reduce_scatter: src holds N·n, out of place and in place */
    for (int inplace = 0; inplace < 2; inplace++) {
        float *out = inplace ? src + R * n : dst;
        for (i = 0; i < N * n; i++) h[i] = vf(R, i);
        h2d(src, h, N * n * 4);
        CHECK(c->reduce_scatter(c, &c->world, out, src, n, US_F32, US_REDUCE_SUM, NULL) == US_OK,
              "rank %d: reduce_scatter: %s", R, c->err);
        d2h(h, out, n * 4);
        for (i = 0, bad = 0; i < n; i++) {
            double want = 0;
            for (r = 0; r < N; r++) want += vf(r, R * n + i);
            bad += !close_f(h[i], want, 1e-5);
        }
        CHECK(bad == 0, "rank %d: reduce_scatter %s (%lld wrong)", R,
              inplace ? "in place" : "out of place", (long long)bad);
    }
    /* all_gather, f32 and i32, out of place and in place */
    for (int inplace = 0; inplace < 2; inplace++) {
        int32_t *d32 = (int32_t *)dst, *s32 = inplace ? d32 + R * n : (int32_t *)src;
        for (i = 0; i < n; i++) hi[i] = vi(R, i);
        h2d(s32, hi, n * 4);
        CHECK(c->all_gather(c, &c->world, d32, s32, n, US_I32, NULL) == US_OK,
              "rank %d: all_gather: %s", R, c->err);
        d2h(hi, d32, N * n * 4);
        for (i = 0, bad = 0; i < N * n; i++) bad += hi[i] != vi((int)(i / n), i % n);
        CHECK(bad == 0, "rank %d: all_gather i32 %s (%lld wrong)", R,
              inplace ? "in place" : "out of place", (long long)bad);
    }
    for (i = 0; i < n; i++) h[i] = vf(R, i);
    h2d(src, h, n * 4);
    CHECK(c->all_gather(c, &c->world, dst, src, n, US_F32, NULL) == US_OK,
          "rank %d: all_gather f32: %s", R, c->err);
    d2h(h, dst, N * n * 4);
    for (i = 0, bad = 0; i < N * n; i++) bad += h[i] != vf((int)(i / n), i % n);
    CHECK(bad == 0, "rank %d: all_gather f32 (%lld wrong)", R, (long long)bad);
    /* gather to 0, scatter from the last rank */
    for (i = 0; i < n; i++) h[i] = vf(R, i) + 1;
    h2d(src, h, n * 4);
    CHECK(c->gather(c, &c->world, dst, src, n, US_F32, 0, NULL) == US_OK, "rank %d: gather: %s", R,
          c->err);
    if (R == 0) {
        d2h(h, dst, N * n * 4);
        for (i = 0, bad = 0; i < N * n; i++) bad += h[i] != vf((int)(i / n), i % n) + 1;
        CHECK(bad == 0, "rank %d: gather to root 0 (%lld wrong)", R, (long long)bad);
    }
    for (i = 0; i < N * n; i++) hi[i] = vi(R, i) * 3;
    h2d(src, hi, N * n * 4);
    CHECK(c->scatter(c, &c->world, dst, src, n, US_I32, root, NULL) == US_OK,
          "rank %d: scatter: %s", R, c->err);
    d2h(hi, dst, n * 4);
    for (i = 0, bad = 0; i < n; i++) bad += hi[i] != vi(root, R * n + i) * 3;
    CHECK(bad == 0, "rank %d: scatter from root %d (%lld wrong)", R, root, (long long)bad);
    /* broadcast i32 from the last rank, bf16 from rank 0 */
    for (i = 0; i < n; i++) hi[i] = vi(R, i);
    h2d(src, hi, n * 4);
    CHECK(c->broadcast(c, &c->world, src, n, US_I32, root, NULL) == US_OK, "rank %d: broadcast: %s",
          R, c->err);
    d2h(hi, src, n * 4);
    for (i = 0, bad = 0; i < n; i++) bad += hi[i] != vi(root, i);
    CHECK(bad == 0, "rank %d: broadcast i32 from %d (%lld wrong)", R, root, (long long)bad);
    {
        uint16_t *hb = (uint16_t *)hi;
        for (i = 0; i < n; i++) hb[i] = us_f32_to_bf16(vb(R, i));
        h2d(src, hb, n * 2);
        CHECK(c->broadcast(c, &c->world, src, n, US_BF16, 0, NULL) == US_OK,
              "rank %d: broadcast bf16: %s", R, c->err);
        d2h(hb, src, n * 2);
        for (i = 0, bad = 0; i < n; i++) bad += us_bf16_to_f32(hb[i]) != vb(0, i);
        CHECK(bad == 0, "rank %d: broadcast bf16 from 0 (%lld wrong)", R, (long long)bad);
    }
    CU(cudaFree(src));
    CU(cudaFree(dst));
    free(h);
    free(hi);
}

static void test_p2p(us_comm *c) {
    /* a ring: rank r sends 1000+r elements to r+1. Rank 0 sends first, the others receive
       first: p2p calls share one comm stream, so this order is what avoids a deadlock. */
    int next = (R + 1) % N, prev = (R + N - 1) % N;
    int64_t ns = 1000 + R, nr = 1000 + prev, i, bad;
    int32_t *h = (int32_t *)malloc(2000 * 4), *ds = (int32_t *)dalloc(2000 * 4),
            *dr = (int32_t *)dalloc(2000 * 4);
    us_work *w1 = NULL, *w2 = NULL;
    if (N < 2) {
        free(h);
        CU(cudaFree(ds));
        CU(cudaFree(dr));
        return;
    }
    for (i = 0; i < ns; i++) h[i] = R * 100000 + (int32_t)i;
    h2d(ds, h, ns * 4);
    if (R == 0) {
        CHECK(c->send(c, &c->world, ds, ns, US_I32, next, &w1) == US_OK &&
                  c->recv(c, &c->world, dr, nr, US_I32, prev, &w2) == US_OK,
              "rank %d: async send then recv: %s", R, c->err);
    } else {
        CHECK(c->recv(c, &c->world, dr, nr, US_I32, prev, &w2) == US_OK &&
                  c->send(c, &c->world, ds, ns, US_I32, next, &w1) == US_OK,
              "rank %d: async recv then send: %s", R, c->err);
    }
    CHECK(c->wait(c, w2) == US_OK && c->wait(c, w1) == US_OK, "rank %d: wait p2p: %s", R, c->err);
    d2h(h, dr, nr * 4);
    for (i = 0, bad = 0; i < nr; i++) bad += h[i] != prev * 100000 + (int32_t)i;
    CHECK(bad == 0, "rank %d: received %lld elements from rank %d (%lld wrong)", R, (long long)nr,
          prev, (long long)bad);
    CU(cudaFree(ds));
    CU(cudaFree(dr));
    free(h);
}

/* Channels (dup): each rank sends 16 MB on its own channel and then receives on the other's,
   both in flight at once. On one stream both sends would come first and wait for each other;
   each channel's stream lets them pass. Then rank 0 sends on two channels that rank 1 receives
   in the other order: each receive gets its own channel's message. */
static void test_channels(us_comm *c) {
    const int64_t n = 4 << 20;
    us_group ch[2];
    us_work *w[2] = {NULL, NULL};
    int32_t *h = (int32_t *)malloc(n * 4), *ds = (int32_t *)dalloc(n * 4),
            *dr = (int32_t *)dalloc(n * 4);
    int64_t i, bad = 0;
    int peer = 1 - R;
    if (N != 2) {
        free(h);
        CU(cudaFree(ds));
        CU(cudaFree(dr));
        return;
    }
    CHECK(c->dup(c, &c->world, &ch[0]) == US_OK && c->dup(c, &c->world, &ch[1]) == US_OK &&
              ch[1].size == 2 && ch[1].rank == R,
          "rank %d: dup twice: %s", R, c->err);
    /* NCCL connects a pair on the host inside its first send or receive, the peer connecting at
       the same time: one element over each channel in one order (what us__pp_connect does) */
    CHECK(R == 0 ? c->send(c, &ch[0], ds, 1, US_I32, 1, NULL) == US_OK &&
                       c->recv(c, &ch[1], dr, 1, US_I32, 1, NULL) == US_OK
                 : c->recv(c, &ch[0], dr, 1, US_I32, 0, NULL) == US_OK &&
                       c->send(c, &ch[1], ds, 1, US_I32, 0, NULL) == US_OK,
          "rank %d: connect the channels: %s", R, c->err);
    for (i = 0; i < n; i++) h[i] = R * 1000 + (int32_t)(i % 997);
    h2d(ds, h, n * 4);
    CHECK(c->send(c, &ch[R], ds, n, US_I32, peer, &w[0]) == US_OK &&
              c->recv(c, &ch[peer], dr, n, US_I32, peer, &w[1]) == US_OK &&
              c->wait(c, w[1]) == US_OK && c->wait(c, w[0]) == US_OK,
          "rank %d: send on one channel, receive on the other, both in flight: %s", R, c->err);
    d2h(h, dr, n * 4);
    for (i = 0; i < n; i++) bad += h[i] != peer * 1000 + (int32_t)(i % 997);
    CHECK(bad == 0, "rank %d: 16 MB over a channel (%lld wrong)", R, (long long)bad);
    if (R == 0) {
        int32_t *ds2 = (int32_t *)dalloc(n * 4);
        for (i = 0; i < n; i++) h[i] = 7;
        h2d(ds2, h, n * 4);
        CHECK(c->send(c, &ch[0], ds, n, US_I32, 1, &w[0]) == US_OK &&
                  c->send(c, &ch[1], ds2, n, US_I32, 1, &w[1]) == US_OK &&
                  c->wait(c, w[1]) == US_OK && c->wait(c, w[0]) == US_OK,
              "rank 0: two sends on two channels: %s", c->err);
        CU(cudaFree(ds2));
    } else {
        int32_t got[2];
        CHECK(c->recv(c, &ch[1], dr, n, US_I32, 0, NULL) == US_OK,
              "rank 1: the second channel first: %s", c->err);
        d2h(&got[1], dr, 4);
        CHECK(c->recv(c, &ch[0], dr, n, US_I32, 0, NULL) == US_OK, "rank 1: then the first: %s",
              c->err);
        d2h(&got[0], dr, 4);
        CHECK(got[1] == 7 && got[0] == 0, "rank 1: each channel delivered its own message (%d, %d)",
              got[1], got[0]);
    }
    c->group_free(c, &ch[0]);
    c->group_free(c, &ch[1]);
    CU(cudaFree(ds));
    CU(cudaFree(dr));
    free(h);
}

static int64_t a2a_count(int s, int d) {
    return ((s * 3 + d * 5) % 4) * 50 + (s == d ? 7 : 0);
} /* some zero */

static void test_all_to_all(us_comm *c) {
    int64_t *sc = (int64_t *)calloc(N, 8), *sd = (int64_t *)calloc(N, 8),
            *rc = (int64_t *)calloc(N, 8), *rd = (int64_t *)calloc(N, 8);
    int64_t ts = 0, tr = 0, i, bad = 0, k;
    int p;
    int32_t *hs, *hr, *ds, *dr;
    for (p = 0; p < N; p++) { /* gaps between blocks: 3 on the send side, 2 on the receive side */
        sc[p] = a2a_count(R, p);
        sd[p] = ts;
        ts += sc[p] + 3;
        rc[p] = a2a_count(p, R);
        rd[p] = tr;
        tr += rc[p] + 2;
    }
    hs = (int32_t *)malloc(ts * 4);
    hr = (int32_t *)malloc(tr * 4);
    ds = (int32_t *)dalloc(ts * 4);
    dr = (int32_t *)dalloc(tr * 4);
    for (i = 0; i < ts; i++) hs[i] = -1;
    for (p = 0; p < N; p++)
        for (k = 0; k < sc[p]; k++) hs[sd[p] + k] = R * 1000000 + p * 1000 + (int32_t)k;
    for (i = 0; i < tr; i++) hr[i] = -7;
    h2d(ds, hs, ts * 4);
    h2d(dr, hr, tr * 4);
    CHECK(c->all_to_all(c, &c->world, dr, rc, rd, ds, sc, sd, US_I32, NULL) == US_OK,
          "rank %d: all_to_all: %s", R, c->err);
    d2h(hr, dr, tr * 4);
    for (p = 0; p < N; p++) {
        for (k = 0; k < rc[p]; k++) bad += hr[rd[p] + k] != p * 1000000 + R * 1000 + (int32_t)k;
        bad += hr[rd[p] + rc[p]] != -7 || hr[rd[p] + rc[p] + 1] != -7; /* the gaps stay untouched */
    }
    CHECK(bad == 0, "rank %d: all_to_all with uneven counts and displacements (%lld wrong)", R,
          (long long)bad);
    sc[R]++; /* sends itself more than it expects */
    CHECK(c->all_to_all(c, &c->world, dr, rc, rd, ds, sc, sd, US_I32, NULL) == US_ERR_INVALID &&
              strstr(c->err, "itself"),
          "rank %d: mismatched self count: %s", R, c->err);
    CU(cudaFree(ds));
    CU(cudaFree(dr));
    free(hs);
    free(hr);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
}

static void test_async(us_comm *c) {
    /* DP overlap: compute writes A (slowly), all_reduce(A) starts without waiting on the host,
       compute fills B meanwhile, wait() orders a later kernel on A after the reduction. */
    const int64_t n = 1 << 22;
    float *A = (float *)dalloc(n * 4), *B = (float *)dalloc(n * 4), *h = (float *)malloc(n * 4);
    us_work *w = NULL, *w2 = NULL;
    int64_t i, bad;
    int r, clk = 0;
    double t;
    CU(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0)); /* kHz */
    CU(cudaMemsetAsync(A, 0, n * 4, S));
    k_slow_fill<<<264, 256, 0, S>>>(
        A, n, R, (long long)clk * 100); /* ~100 ms of "backward": clk is in kHz, cycles per ms */
    CU(cudaGetLastError());
    t = now_s();
    CHECK(c->all_reduce(c, &c->world, A, n, US_F32, US_REDUCE_SUM, &w) == US_OK && w != NULL,
          "rank %d: async all_reduce returns a handle: %s", R, c->err);
    t = now_s() - t;
    CHECK(t < 0.05, "rank %d: the async call returned in %.1f ms while compute still ran", R,
          t * 1e3);
    k_slow_fill<<<264, 256, 0, S>>>(B, n, R + 1, 0); /* compute in between */
    CU(cudaGetLastError());
    CHECK(c->wait(c, w) == US_OK, "rank %d: wait: %s", R, c->err);
    k_scale<<<264, 256, 0, S>>>(A, n, 2.0f); /* reads the reduced A: ordered by wait() */
    CU(cudaGetLastError());
    d2h(h, A, n * 4);
    for (i = 0, bad = 0; i < n; i++) {
        double want = 0;
        for (r = 0; r < N; r++) want += vf(r, i);
        bad += !close_f(h[i], 2 * want, 1e-5);
    }
    CHECK(bad == 0,
          "rank %d: the reduction saw compute's writes and the next kernel saw the reduction (%lld "
          "wrong)",
          R, (long long)bad);
    d2h(h, B, n * 4);
    for (i = 0, bad = 0; i < n; i++) bad += h[i] != vf(R + 1, i);
    CHECK(bad == 0, "rank %d: compute in between ran (%lld wrong)", R, (long long)bad);
    /* two in flight, waited in reverse order */
    k_slow_fill<<<264, 256, 0, S>>>(A, n, R, 0);
    CU(cudaGetLastError());
    CHECK(c->all_reduce(c, &c->world, A, n / 2, US_F32, US_REDUCE_SUM, &w) == US_OK &&
              c->all_gather(c, &c->world, B, A + n / 2, n / (2 * N), US_F32, &w2) == US_OK,
          "rank %d: two async: %s", R, c->err);
    CHECK(c->wait(c, w2) == US_OK && c->wait(c, w) == US_OK && c->wait(c, NULL) == US_OK,
          "rank %d: waited in reverse order: %s", R, c->err);
    d2h(h, A, n / 2 * 4);
    for (i = 0, bad = 0; i < n / 2; i++) {
        double want = 0;
        for (r = 0; r < N; r++) want += vf(r, i);
        bad += !close_f(h[i], want, 1e-5);
    }
    d2h(h, B, n / 2 / N * N * 4);
    for (i = 0; i < n / (2 * N) * N; i++)
        bad += h[i] != vf((int)(i / (n / (2 * N))), n / 2 + i % (n / (2 * N)));
    CHECK(bad == 0, "rank %d: both results right (%lld wrong)", R, (long long)bad);
    CU(cudaFree(A));
    CU(cudaFree(B));
    free(h);
}

static void test_split(us_comm *c) {
    us_group par, rev, rest;
    int32_t *d = (int32_t *)dalloc(64 * 4), h[64];
    int r, want = 0, cnt = 0, bad = 0;
    /* parity groups, ordered by world rank */
    CHECK(c->split(c, &c->world, R % 2, R, &par) == US_OK, "rank %d: split by parity: %s", R,
          c->err);
    for (r = R % 2; r < N; r += 2) {
        want += r;
        cnt++;
    }
    CHECK(par.size == cnt && par.rank == R / 2, "rank %d: parity group size %d rank %d", R,
          par.size, par.rank);
    h[0] = R;
    h2d(d, h, 4);
    CHECK(c->all_reduce(c, &par, d, 1, US_I32, US_REDUCE_SUM, NULL) == US_OK,
          "rank %d: all_reduce on the parity group: %s", R, c->err);
    d2h(h, d, 4);
    CHECK(h[0] == want, "rank %d: parity group sum %d (want %d)", R, h[0], want);
    /* one group with reversed order (key = -rank) */
    CHECK(c->split(c, &c->world, 0, -R, &rev) == US_OK && rev.size == N && rev.rank == N - 1 - R,
          "rank %d: reversed group rank %d: %s", R, rev.rank, c->err);
    h[0] = R;
    h2d(d, h, 4);
    CHECK(c->all_gather(c, &rev, d + 8, d, 1, US_I32, NULL) == US_OK,
          "rank %d: all_gather on the reversed group: %s", R, c->err);
    d2h(h, d + 8, N * 4);
    for (r = 0; r < N; r++) bad += h[r] != N - 1 - r;
    CHECK(bad == 0, "rank %d: the reversed group gathers in its own rank order", R);
    /* rank 0 joins no group */
    CHECK(c->split(c, &c->world, R == 0 ? -1 : 1, 0, &rest) == US_OK,
          "rank %d: split with a negative color: %s", R, c->err);
    if (R == 0)
        CHECK(rest.size == 0 && rest.impl == NULL, "rank 0: a negative color gives an empty group");
    else {
        CHECK(rest.size == N - 1 && rest.rank == R - 1, "rank %d: the others form a group of %d", R,
              rest.size);
        CHECK(c->barrier(c, &rest) == US_OK, "rank %d: barrier on the sub-group: %s", R, c->err);
    }
    c->group_free(c, &rest);
    c->group_free(c, &rev);
    c->group_free(c, &par);
    CHECK(par.impl == NULL && par.size == 0, "rank %d: group_free clears the group", R);
    c->group_free(c, &c->world); /* the world is not freed by group_free */
    CHECK(c->world.impl != NULL && c->barrier(c, &c->world) == US_OK, "rank %d: world barrier: %s",
          R, c->err);
    CU(cudaFree(d));
}

static void test_errors_and_trace(us_comm *c) {
    float *d = (float *)dalloc(1 << 22);
    us_group none = {0, 0, NULL};
    us_work *w = (us_work *)c; /* poisoned: an error must leave NULL */
    us_trace t;
    double h0, h1;
    CHECK(c->reduce(c, &c->world, d, d, 4, US_F32, US_REDUCE_SUM, N, &w) == US_ERR_INVALID &&
              w == NULL && strstr(c->err, "root"),
          "rank %d: bad root: %s", R, c->err);
    CHECK(c->all_reduce(c, &c->world, d, -1, US_F32, US_REDUCE_SUM, NULL) == US_ERR_INVALID &&
              strstr(c->err, "negative"),
          "rank %d: negative count: %s", R, c->err);
    CHECK(c->all_reduce(c, &c->world, d, 4, US_E4M3, US_REDUCE_SUM, NULL) == US_ERR_INVALID &&
              strstr(c->err, "dtype"),
          "rank %d: fp8 dtype: %s", R, c->err);
    CHECK(c->send(c, &c->world, d, 4, US_F32, R, NULL) == US_ERR_INVALID &&
              strstr(c->err, "itself"),
          "rank %d: send to itself: %s", R, c->err);
    CHECK(c->broadcast(c, &none, d, 4, US_F32, 0, NULL) == US_ERR_INVALID &&
              strstr(c->err, "not part of"),
          "rank %d: a group this rank is not in: %s", R, c->err);
    CHECK(c->all_reduce(c, &c->world, d, 4, US_F32, US_REDUCE_SUM, NULL) == US_OK,
          "rank %d: usable after argument errors: %s", R, c->err);
    /* GPU-timed trace events on the comm row */
    us_trace_init(&t, R);
    c->trace = &t;
    h0 = us_trace_now_us();
    CHECK(c->all_reduce(c, &c->world, d, 1 << 20, US_F32, US_REDUCE_SUM, NULL) == US_OK,
          "rank %d: traced all_reduce: %s", R, c->err);
    h1 = us_trace_now_us();
    c->trace = NULL;
    CHECK(t.n[US_STREAM_COMM] == 1 &&
              !strncmp(t.ev[US_STREAM_COMM][0].name, "all_reduce 4.0 MB", 17),
          "rank %d: one comm event (%d, '%s')", R, t.n[US_STREAM_COMM],
          t.n[US_STREAM_COMM] ? t.ev[US_STREAM_COMM][0].name : "");
    if (t.n[US_STREAM_COMM] == 1) {
        us_trace_event *e = &t.ev[US_STREAM_COMM][0];
        CHECK(e->t0 <= e->t1 && e->t0 >= h0 - 500 && e->t1 <= h1 + 500,
              "rank %d: GPU times %.0f..%.0f us inside the host's %.0f..%.0f", R, e->t0 - h0,
              e->t1 - h0, 0.0, h1 - h0);
    }
    us_trace_free(&t);
    CU(cudaFree(d));
}

/* --fault: rank 1 dies in the middle; every other rank's wait must fail within 10 s */
static void test_fault(us_comm *c) {
    const int64_t n = 1 << 20;
    float *d = (float *)dalloc(n * 4);
    us_work *w = NULL;
    us_result r;
    double t;
    char first[256];
    int k;
    c->timeout_s = 10;
    CU(cudaMemsetAsync(d, 0, n * 4, S));
    for (k = 0; k < 3; k++) /* the same shape as below, so connections already exist */
        CHECK(c->all_reduce(c, &c->world, d, n, US_F32, US_REDUCE_SUM, NULL) == US_OK,
              "rank %d: warm-up all_reduce: %s", R, c->err);
    if (R == 1) {
        fflush(stdout);
        raise(SIGKILL);
    }
    t = now_s();
    r = c->all_reduce(c, &c->world, d, n, US_F32, US_REDUCE_SUM, &w);
    if (r == US_OK) r = c->wait(c, w);
    t = now_s() - t;
    CHECK(r == US_ERR_BACKEND, "rank %d: the collective with a dead peer fails (%d): %s", R, (int)r,
          c->err);
    CHECK(t < 10 + 15, "rank %d: within the timeout and the abort (%.1f s)", R, t);
    {
        char me[32];
        snprintf(me, sizeof me, "rank %d: ", R);
        CHECK(!strncmp(c->err, me, strlen(me)) && strstr(c->err, "all_reduce 4.0 MB") &&
                  strstr(c->err, "aborted"),
              "rank %d: the message names rank and op: %s", R, c->err);
    }
    snprintf(first, sizeof first, "%s", c->err);
    t = now_s();
    r = c->all_reduce(c, &c->world, d, n, US_F32, US_REDUCE_SUM, NULL);
    CHECK(r == US_ERR_BACKEND && !strcmp(c->err, first) && now_s() - t < 0.1,
          "rank %d: later calls fail fast with the first error", R);
    CHECK(c->barrier(c, &c->world) == US_ERR_BACKEND, "rank %d: barrier fails fast too", R);
    CU(cudaFree(d));
}

static int run_rank(int rank, int world, int device, int fault, const char *outdir) {
    us_comm c;
    char err[256];
    int ndev = 0;
    R = rank;
    N = world;
    CU(cudaGetDeviceCount(&ndev));
    CU(cudaSetDevice(device % ndev));
    CU(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
    if (us_nccl_init(&c, NULL, S, rank, world, NULL, 60, err, sizeof err) != US_OK) {
        CHECK(0, "rank %d: us_nccl_init: %s", rank, err);
    } else {
        CHECK(!strcmp(c.name, "nccl") && c.world.size == world && c.world.rank == rank &&
                  !strcmp(c.err, ""),
              "rank %d: init", rank);
        if (fault)
            test_fault(&c);
        else {
            test_all_reduce(&c);
            test_reduce_family(&c);
            test_p2p(&c);
            test_channels(&c);
            test_all_to_all(&c);
            test_async(&c);
            test_split(&c);
            test_errors_and_trace(&c);
        }
        us_nccl_free(&c);
    }
    CU(cudaStreamDestroy(S));
    printf("rank %d: %d passed, %d failed\n", rank, us_test_pass, us_test_fail);
    if (outdir) { /* the parent adds every rank's counts */
        char path[4096];
        FILE *f;
        snprintf(path, sizeof path, "%s/rank%d", outdir, rank);
        if ((f = fopen(path, "w"))) {
            fprintf(f, "%d %d\n", us_test_pass, us_test_fail);
            fclose(f);
        }
    }
    fflush(stdout);
    return us_test_fail ? 1 : 0;
}

/* The parent: adds the ranks' counts from dir/rank<r>; a missing file is a failure unless the
   rank was meant to die. */
static void collect(const char *dir, int nproc, int skip_rank) {
    for (int r = 0; r < nproc; r++) {
        char path[4096];
        int p = 0, f = 0;
        FILE *fp;
        snprintf(path, sizeof path, "%s/rank%d", dir, r);
        fp = fopen(path, "r");
        if (r == skip_rank) {
            CHECK(fp == NULL, "rank %d died before reporting", r);
            if (fp) fclose(fp);
            continue;
        }
        CHECK(fp && fscanf(fp, "%d %d", &p, &f) == 2, "rank %d reported its results", r);
        if (fp) fclose(fp);
        remove(path);
        us_test_pass += p;
        us_test_fail += f;
    }
}

int main(int argc, char **argv) {
    int i, nproc = 2, ndev = 0, fault = 0, world1 = 0, rc;
    char **cargv, dir[] = "/tmp/us_nccl_XXXXXX", err[256];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fault"))
            fault = 1;
        else if (!strcmp(argv[i], "--world1"))
            world1 = 1;
        else if (!strcmp(argv[i], "--nproc") && i + 1 < argc)
            nproc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-v"))
            us_test_verbose = 1;
    }
    if (getenv("RANK")) { /* a child of the launcher */
        us_dist_env e;
        if (us_dist_env_read(&e, err, sizeof err) != US_OK) {
            printf("test_nccl child: %s\n", err);
            return 2;
        }
        return run_rank(e.rank, e.world_size, e.local_rank, fault, getenv("US_TEST_NCCL_OUT"));
    }
    if (world1) {
        if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
            printf("SKIP test_nccl --world1: no GPU visible\n");
            return 0;
        }
        run_rank(0, 1, 0, 0, NULL);
        return us_test_done("test_nccl");
    }
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    if (ndev < 2) {
        printf("SKIP test_nccl: %d GPU%s visible, 2 needed\n", ndev, ndev == 1 ? "" : "s");
        return 0;
    }
    if (nproc < 2 || nproc > ndev) {
        printf("test_nccl: --nproc %d needs 2..%d\n", nproc, ndev);
        return 1;
    }
    if (!mkdtemp(dir)) {
        printf("test_nccl: mkdtemp failed\n");
        return 1;
    }
    setenv("US_TEST_NCCL_OUT", dir, 1);
    /* the children's argv: ours without --nproc N, plus --fault for the second run */
    cargv = (char **)calloc(argc + 2, sizeof *cargv);
    for (i = 0, rc = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc") && i + 1 < argc) {
            i++;
            continue;
        }
        if (strcmp(argv[i], "--fault")) cargv[rc++] = argv[i];
    }
    if (!fault) {
        rc = us_launch_procs(nproc, cargv, 60, err, sizeof err);
        CHECK(rc == 0, "%d ranks: every collective checked (launcher rc %d: %s)", nproc, rc, err);
        collect(dir, nproc, -1);
    }
    for (i = 0; cargv[i]; i++) {
    }
    cargv[i] = (char *)"--fault";
    printf("test_nccl: fault run: rank 1 dies; the others should fail within 10 s\n");
    fflush(stdout);
    rc = us_launch_procs(nproc, cargv, 60, err, sizeof err);
    CHECK(rc == 128 + 9 && strstr(err, "rank 1 was killed by signal 9"),
          "the launcher reports the kill: rc %d: %s", rc, err);
    collect(dir, nproc, 1);
    rmdir(dir);
    free(cargv);
    return us_test_done("test_nccl");
}
