/* us_cuda_emu.h — just enough CUDA to run the flash and grouped-GEMM kernels on the CPU, for a
   machine without a GPU: the threads of a CTA (128, or up to 512) are cooperative contexts
   (ucontext) of one OS thread, switched at every barrier and warp collective; __syncthreads,
   __shfl_xor_sync and __ballot_sync keep their meaning; cp.async is a plain copy (its waits do
   nothing), ldmatrix (.trans) and mma.sync m16n8k16 bf16 / fp16 → fp32 follow the PTX fragment
   layouts; CTAs run one after another and shared memory starts as garbage.
   What it cannot show: timing, races between real threads, and cp.async used before its wait
   (the copy has already happened). Slow (~1 ms per warp-tile): small shapes only. */
#pragma once
#include <ucontext.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <functional>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>
#include <vector_functions.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __grid_constant__
#define EMU_WARPS 16 /* the most warps a CTA may have */

struct emu_dim3 {
    unsigned x, y, z;
};

struct EmuT {
    ucontext_t ctx;
    emu_dim3 tix;
    int done;
    std::vector<char> stack;
};

static EmuT *emu_threads;
static int emu_nt;
static EmuT *emu_cur;
static ucontext_t emu_sched;
static emu_dim3 emu_bix, emu_gdim;
static unsigned char *emu_smem;
#define threadIdx (emu_cur->tix)
#define blockIdx emu_bix
#define gridDim emu_gdim

static inline void emu_yield() {
    EmuT *me = emu_cur;
    swapcontext(&me->ctx, &emu_sched);
}

static inline int min(int a, int b) { return a < b ? a : b; }

static inline int max(int a, int b) { return a > b ? a : b; }

static inline long long min(long long a, long long b) { return a < b ? a : b; }

#define __ffs(x) __builtin_ffs(x)

/* block barrier: generation counting */
static int emu_bar_count, emu_bar_gen;

static inline void __syncthreads() {
    int gen = emu_bar_gen;
    if (++emu_bar_count == emu_nt) {
        emu_bar_count = 0;
        emu_bar_gen++;
        return;
    }
    while (emu_bar_gen == gen) emu_yield();
}

/* warp exchange: every lane posts 64 bytes, waits for its warp, reads, waits again */
struct EmuSlot {
    uint32_t w[16];
};

static EmuSlot emu_slot[EMU_WARPS][32];
static int emu_wcount[EMU_WARPS], emu_wgen[EMU_WARPS];

static inline void emu_warp_bar(int w) {
    int gen = emu_wgen[w];
    if (++emu_wcount[w] == 32) {
        emu_wcount[w] = 0;
        emu_wgen[w]++;
        return;
    }
    while (emu_wgen[w] == gen) emu_yield();
}

static inline int emu_lane() { return threadIdx.x & 31; }

static inline int emu_warp() { return threadIdx.x >> 5; }

/* every lane of the warp posts v, then reads lane src's (the shuffles below) */
template <typename T>
static inline T emu_shfl(T v, int src) {
    int w = emu_warp(), l = emu_lane();
    T r;
    memcpy(emu_slot[w][l].w, &v, sizeof v);
    emu_warp_bar(w);
    memcpy(&r, emu_slot[w][src].w, sizeof r);
    emu_warp_bar(w);
    return r;
}

template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int o) {
    return emu_shfl(v, emu_lane() ^ o);
}

template <typename T>
static inline T __shfl_sync(unsigned, T v, int src) {
    return emu_shfl(v, src & 31);
}

static inline unsigned __ballot_sync(unsigned, int p) {
    int w = emu_warp(), l = emu_lane();
    unsigned r = 0;
    emu_slot[w][l].w[0] = p != 0;
    emu_warp_bar(w);
    for (int i = 0; i < 32; i++) r |= (emu_slot[w][i].w[0] ? 1u : 0u) << i;
    emu_warp_bar(w);
    return r;
}

/* integer and bit intrinsics of the FP8 kernels (fp8_emu, fp8_block_emu) */
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

static inline unsigned __vmaxu2(unsigned a, unsigned b) {
    unsigned lo = max(a & 0xffffu, b & 0xffffu), hi = max(a >> 16, b >> 16);
    return hi << 16 | lo;
}

/* result byte n = byte (s >> 4n) & 7 of the 8 bytes y:x (x the low four), as CUDA documents */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)(v >> 8 * (s >> 4 * n & 7) & 0xff) << 8 * n;
    return r;
}

static inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    unsigned r = v;
    for (int o = 16; o >= 1; o >>= 1) r = max(r, __shfl_xor_sync(0xffffffffu, r, o));
    return r;
}

/* PTX helpers, emulated */
static inline uint32_t us__smem_u32(const void *p) { return (uint32_t)(uintptr_t)p; }

static inline void us__cp_async16(void *s, const void *g, int bytes) {
    if (bytes)
        memcpy(s, g, 16);
    else
        memset(s, 0, 16);
}

static inline void us__cp_async4(void *s, const void *g) { memcpy(s, g, 4); }

static inline void us__cp_async_commit(void) {}

static inline void us__cp_async_wait_all(void) {}

template <int N>
static inline void us__cp_async_wait(void) {}

template <typename V>
static inline void us__cp_async_v(void *s, const void *g, int bytes) {
    if (bytes)
        memcpy(s, g, sizeof(V));
    else
        memset(s, 0, sizeof(V));
}

static inline void us__cp_async_wait_n(int) {}

static inline void emu_ldsm(uint32_t r[4], const void *s, int trans) {
    int w = emu_warp(), l = emu_lane();
    const void *p = s;
    memcpy(emu_slot[w][l].w, &p, sizeof p);
    emu_warp_bar(w);
    for (int i = 0; i < 4; i++) {
        const uint16_t *row; /* b16: bf16 or fp16, moved as bits */
        uint16_t e[2];
        if (!trans) {
            memcpy(&row, emu_slot[w][i * 8 + l / 4].w, sizeof row);
            e[0] = row[2 * (l % 4)];
            e[1] = row[2 * (l % 4) + 1];
        } else {
            const uint16_t *r0, *r1;
            memcpy(&r0, emu_slot[w][i * 8 + 2 * (l % 4)].w, sizeof r0);
            memcpy(&r1, emu_slot[w][i * 8 + 2 * (l % 4) + 1].w, sizeof r1);
            e[0] = r0[l / 4];
            e[1] = r1[l / 4];
        }
        memcpy(&r[i], e, 4);
    }
    emu_warp_bar(w);
}

static inline void us__ldsm_x4(uint32_t r[4], const void *s) { emu_ldsm(r, s, 0); }

static inline void us__ldsm_x4_t(uint32_t r[4], const void *s) { emu_ldsm(r, s, 1); }

static inline float emu_bf(uint32_t reg, int hi) {
    __nv_bfloat16 e[2];
    memcpy(e, &reg, 4);
    return __bfloat162float(e[hi]);
}

static inline float emu_h(uint32_t reg, int hi) {
    __half e[2];
    memcpy(e, &reg, 4);
    return __half2float(e[hi]);
}

/* mma.sync m16n8k16 with 16-bit inputs read by cv (emu_bf or emu_h), fp32 accumulation */
static inline void emu_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1,
                           float (*cv)(uint32_t, int)) {
    int w = emu_warp(), l = emu_lane();
    EmuSlot &me = emu_slot[w][l];
    me.w[0] = a[0];
    me.w[1] = a[1];
    me.w[2] = a[2];
    me.w[3] = a[3];
    me.w[4] = b0;
    me.w[5] = b1;
    emu_warp_bar(w);
    float A[16][16], Bm[16][8];
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) {
            int g = r % 8, kk = k % 8;
            A[r][k] = cv(emu_slot[w][4 * g + kk / 2].w[r / 8 + 2 * (k / 8)], kk % 2);
        }
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++)
            Bm[k][n] = cv(emu_slot[w][4 * n + (k % 8) / 2].w[4 + k / 8], k % 2);
    emu_warp_bar(w);
    int g = l / 4, cc = 2 * (l % 4);
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e / 2), n = cc + e % 2;
        float s = 0;
        for (int k = 0; k < 16; k++) s += A[r][k] * Bm[k][n];
        c[e] += s;
    }
}

static inline void us__mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    emu_mma(c, a, b0, b1, emu_bf);
}

static inline void us__mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    emu_mma(c, a, b0, b1, emu_h);
}

/* run fn in every thread of every block of grid (nt threads each, a multiple of 32 up to
   32·EMU_WARPS), with smem bytes of dynamic shared memory */
static std::function<void()> emu_fn;

static void emu_entry() {
    emu_fn();
    emu_cur->done = 1;
    swapcontext(&emu_cur->ctx, &emu_sched);
}

static void emu_launch(emu_dim3 grid, size_t smem, std::function<void()> fn, int nt = 128) {
    static std::vector<EmuT> th(32 * EMU_WARPS);
    std::vector<unsigned char> sm(smem);
    if (nt % 32 || nt > 32 * EMU_WARPS) abort();
    emu_threads = th.data();
    emu_nt = nt;
    emu_gdim = grid;
    emu_fn = fn;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                emu_bix = {x, y, z};
                memset(sm.data(), 0xA5, sm.size()); /* garbage, like real shared memory */
                emu_smem = sm.data();
                if ((uintptr_t)emu_smem & 15) abort();
                emu_bar_count = 0;
                for (int w = 0; w < EMU_WARPS; w++) emu_wcount[w] = 0;
                for (int t = 0; t < nt; t++) {
                    EmuT &e = th[t];
                    e.stack.resize(256 * 1024);
                    e.done = 0;
                    e.tix = {(unsigned)t, 0, 0};
                    getcontext(&e.ctx);
                    e.ctx.uc_stack.ss_sp = e.stack.data();
                    e.ctx.uc_stack.ss_size = e.stack.size();
                    e.ctx.uc_link = &emu_sched;
                    makecontext(&e.ctx, emu_entry, 0);
                }
                int left = nt;
                while (left) {
                    left = 0;
                    for (int t = 0; t < nt; t++) {
                        if (th[t].done) continue;
                        emu_cur = &th[t];
                        swapcontext(&emu_sched, &th[t].ctx);
                        if (!th[t].done) left++;
                    }
                }
                /* threads that returned early while others wait at a barrier would hang: detect */
            }
}
