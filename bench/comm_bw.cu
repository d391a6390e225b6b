/* comm_bw.cu — the comm seam's NCCL backend against raw NCCL, side by side (issue 9).

   Bus bandwidth of all_reduce, reduce_scatter, all_gather, all_to_all and sendrecv from 1 MB
   to 1 GB, measured in one run on the same GPUs: each size is timed through the library's
   us_comm (handles, events, the watchdog's host wait) and through a raw NCCL communicator of
   the same ranks on a stream of its own, alternately, three rounds each; the median round
   counts. Bus bandwidth follows nccl-tests (S = the op's payload in bytes, N ranks):
       all_reduce 2(N-1)/N·S/t     reduce_scatter, all_gather, all_to_all (N-1)/N·S/t
       sendrecv S/t (every rank sends S to the next and receives S from the previous)
   Run without RANK in the environment, it launches itself on every visible GPU (--nproc N),
   one process per GPU, as the trainer does. Rank 0 prints the table.
       make build/comm_bw && NCCL_NVLS_ENABLE=0 ./build/comm_bw [--nproc 2] [--max-mb 1024] */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#ifndef ULTRASCALE_NCCL
#define ULTRASCALE_NCCL
#endif
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CU(x)                                                                 \
    do {                                                                      \
        cudaError_t e_ = (x);                                                 \
        if (e_ != cudaSuccess) {                                              \
            fprintf(stderr, "comm_bw: %s: %s\n", #x, cudaGetErrorString(e_)); \
            exit(2);                                                          \
        }                                                                     \
    } while (0)
#define NC(x)                                                                 \
    do {                                                                      \
        ncclResult_t e_ = (x);                                                \
        if (e_ != ncclSuccess) {                                              \
            fprintf(stderr, "comm_bw: %s: %s\n", #x, ncclGetErrorString(e_)); \
            exit(2);                                                          \
        }                                                                     \
    } while (0)
#define US(x)                                                \
    do {                                                     \
        if ((x) != US_OK) {                                  \
            fprintf(stderr, "comm_bw: %s: %s\n", #x, c.err); \
            exit(2);                                         \
        }                                                    \
    } while (0)

enum { OP_AR, OP_RS, OP_AG, OP_A2A, OP_SR, N_OPS };

static const char *op_name[N_OPS] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                     "sendrecv"};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static us_comm c;
static ncclComm_t raw;
static cudaStream_t S, RS; /* the library's compute stream; the raw communicator's stream */
static int R, W;
static float *src, *dst;   /* [n] each, n = the largest size's elements */
static int64_t *cnt, *dis; /* all_to_all counts and displacements [W] */

/* One op of n payload elements through the library; handles collected, waited after. */
static void ours(int op, int64_t n, us_work **w) {
    int64_t k = n / W;
    switch (op) {
    case OP_AR:
        US(c.all_reduce(&c, &c.world, dst, n, US_F32, US_REDUCE_SUM, w));
        break;
    case OP_RS:
        US(c.reduce_scatter(&c, &c.world, dst, src, k, US_F32, US_REDUCE_SUM, w));
        break;
    case OP_AG:
        US(c.all_gather(&c, &c.world, dst, src, k, US_F32, w));
        break;
    case OP_A2A: {
        int p;
        for (p = 0; p < W; p++) {
            cnt[p] = k;
            dis[p] = p * k;
        }
        US(c.all_to_all(&c, &c.world, dst, cnt, dis, src, cnt, dis, US_F32, w));
        break;
    }
    case OP_SR:
        US(c.sendrecv(&c, &c.world, src, n, (R + 1) % W, dst, n, (R + W - 1) % W, US_F32, w));
        break;
    }
}

/* The same op through raw NCCL on its own stream: what nccl-tests would issue. */
static void rawop(int op, int64_t n) {
    size_t k = (size_t)(n / W);
    int p;
    switch (op) {
    case OP_AR:
        NC(ncclAllReduce(dst, dst, (size_t)n, ncclFloat, ncclSum, raw, RS));
        break;
    case OP_RS:
        NC(ncclReduceScatter(src, dst, k, ncclFloat, ncclSum, raw, RS));
        break;
    case OP_AG:
        NC(ncclAllGather(src, dst, k, ncclFloat, raw, RS));
        break;
    case OP_A2A:
        NC(ncclGroupStart());
        for (p = 0; p < W; p++) {
            NC(ncclSend(src + p * k, k, ncclFloat, p, raw, RS));
            NC(ncclRecv(dst + p * k, k, ncclFloat, p, raw, RS));
        }
        NC(ncclGroupEnd());
        break;
    case OP_SR:
        NC(ncclGroupStart());
        NC(ncclSend(src, (size_t)n, ncclFloat, (R + 1) % W, raw, RS));
        NC(ncclRecv(dst, (size_t)n, ncclFloat, (R + W - 1) % W, raw, RS));
        NC(ncclGroupEnd());
        break;
    }
}

/* Seconds per op, the slowest rank's (all ranks start together after a barrier). */
static double timed(int lib, int op, int64_t n, int iters) {
    static us_work *w[64];
    double t0, t;
    float tf, *td;
    int i;
    US(c.barrier(&c, &c.world));
    CU(cudaStreamSynchronize(S));
    t0 = now_s();
    for (i = 0; i < iters; i++) {
        if (lib)
            ours(op, n, &w[i]);
        else
            rawop(op, n);
    }
    if (lib) {
        for (i = 0; i < iters; i++) US(c.wait(&c, w[i]));
        CU(cudaStreamSynchronize(S));
    } else
        CU(cudaStreamSynchronize(RS));
    t = (now_s() - t0) / iters;
    /* the slowest rank's time, through the library (outside the timed region) */
    tf = (float)t;
    CU(cudaMalloc(&td, 4));
    CU(cudaMemcpy(td, &tf, 4, cudaMemcpyHostToDevice));
    US(c.all_reduce(&c, &c.world, td, 1, US_F32, US_REDUCE_MAX, NULL));
    CU(cudaStreamSynchronize(S));
    CU(cudaMemcpy(&tf, td, 4, cudaMemcpyDeviceToHost));
    CU(cudaFree(td));
    return tf;
}

static double median3(double a, double b, double x) {
    return a > b ? (b > x ? b : (a > x ? x : a)) : (a > x ? a : (b > x ? x : b));
}

static int run_rank(int rank, int world, int device, int max_mb) {
    char err[256];
    ncclUniqueId id;
    int ndev = 0, op, round;
    int64_t nmax = (int64_t)max_mb << 18, n; /* elements of 4 bytes */
    int32_t *idd;
    R = rank;
    W = world;
    CU(cudaGetDeviceCount(&ndev));
    CU(cudaSetDevice(device % ndev));
    CU(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&RS, cudaStreamNonBlocking));
    if (us_nccl_init(&c, NULL, S, rank, world, NULL, 120, err, sizeof err) != US_OK) {
        fprintf(stderr, "comm_bw: rank %d: %s\n", rank, err);
        return 2;
    }
    /* the raw communicator's id travels through the library's broadcast */
    if (rank == 0) NC(ncclGetUniqueId(&id));
    CU(cudaMalloc(&idd, sizeof id));
    CU(cudaMemcpy(idd, &id, sizeof id, cudaMemcpyHostToDevice));
    US(c.broadcast(&c, &c.world, idd, (int64_t)(sizeof id / 4), US_I32, 0, NULL));
    CU(cudaStreamSynchronize(S));
    CU(cudaMemcpy(&id, idd, sizeof id, cudaMemcpyDeviceToHost));
    CU(cudaFree(idd));
    NC(ncclCommInitRank(&raw, world, id, rank));
    CU(cudaMalloc(&src, (size_t)nmax * 4));
    CU(cudaMalloc(&dst, (size_t)nmax * 4));
    CU(cudaMemset(src, 0, (size_t)nmax * 4));
    CU(cudaMemset(dst, 0, (size_t)nmax * 4));
    cnt = (int64_t *)calloc((size_t)world, 8);
    dis = (int64_t *)calloc((size_t)world, 8);
    if (rank == 0) {
        printf("comm_bw: %d ranks, fp32, bus bandwidth GB/s (nccl-tests definitions), median of 3 "
               "rounds\n",
               world);
        printf("%-15s %9s %12s %12s %8s\n", "op", "size", "ultrascale", "raw NCCL", "ratio");
    }
    for (op = 0; op < N_OPS; op++)
        for (n = 1 << 18; n <= nmax; n *= 4) {
            double bytes = (double)n * 4, f = op == OP_AR   ? 2.0 * (W - 1) / W
                                              : op == OP_SR ? 1.0
                                                            : (double)(W - 1) / W;
            int iters = n <= (1 << 22) ? 40 : n <= (1 << 24) ? 20 : n <= (1 << 26) ? 10 : 5;
            double tl[3], tr[3], tlm, trm;
            timed(1, op, n, 2);
            timed(0, op, n, 2); /* warm-up: connections, buffers */
            for (round = 0; round < 3; round++) {
                tl[round] = timed(1, op, n, iters);
                tr[round] = timed(0, op, n, iters);
            }
            tlm = median3(tl[0], tl[1], tl[2]);
            trm = median3(tr[0], tr[1], tr[2]);
            if (rank == 0) {
                printf("%-15s %6.0f MB %12.1f %12.1f %7.1f%%\n", op_name[op], bytes / (1 << 20),
                       f * bytes / tlm / 1e9, f * bytes / trm / 1e9, 100.0 * trm / tlm);
                fflush(stdout);
            }
        }
    NC(ncclCommDestroy(raw));
    us_nccl_free(&c);
    CU(cudaFree(src));
    CU(cudaFree(dst));
    free(cnt);
    free(dis);
    return 0;
}

int main(int argc, char **argv) {
    int i, nproc = 0, ndev = 0, max_mb = 1024, rc;
    char err[256];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc") && i + 1 < argc)
            nproc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-mb") && i + 1 < argc)
            max_mb = atoi(argv[++i]);
        else {
            fprintf(stderr, "comm_bw: unknown flag %s (flags: --nproc N, --max-mb M)\n", argv[i]);
            return 1;
        }
    }
    if (max_mb < 1 || max_mb > 8192) {
        fprintf(stderr, "comm_bw: --max-mb must be 1..8192, got %d\n", max_mb);
        return 1;
    }
    if (getenv("RANK")) { /* a child of the launcher */
        us_dist_env e;
        if (us_dist_env_read(&e, err, sizeof err) != US_OK) {
            fprintf(stderr, "comm_bw: %s\n", err);
            return 2;
        }
        return run_rank(e.rank, e.world_size, e.local_rank, max_mb);
    }
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    if (!nproc) nproc = ndev;
    if (ndev < 2 || nproc < 2 || nproc > ndev) {
        fprintf(stderr, "comm_bw: needs 2..%d GPUs, %d visible\n", ndev, ndev);
        return 1;
    }
    rc = us_launch_procs(nproc, argv, 30, err, sizeof err);
    if (rc) fprintf(stderr, "comm_bw: %s\n", err);
    return rc;
}
