/* ---------------------------------------------------------------------------
   us__gemm: blocked, packed, deterministic CPU GEMM (fp32 / bf16 in & out).

   Structure (GotoBLAS / BLIS):
     for jc in N by NC            -- B panel (KC x NC) shared by all threads, L3
       for pc in K by KC          -- fixed K blocking => fixed summation order
         pack B(pc:pc+KC, jc:jc+NC) into NR-column slivers (threads split it)
         barrier
         for ic in my rows by MC  -- A block (MC x KC) private per thread, L2
           pack A(ic, pc) into MR-row slivers
           for jr in my NR slivers   -- B sliver (KC x NR) stays in L1
             for ir in MR slivers    -- A sliver streams from L2
               micro-kernel MR x NR (6 x 16, 12 ymm accumulators)
         barrier
   Determinism: every C element is produced by exactly one thread, with a
   K order (KC blocks ascending, k ascending inside) that depends only on the
   shape, never on nthreads. Threads only split M (and N when M is small).

   Assumes <stdint.h> <stddef.h> <string.h> <stdlib.h> <math.h> (and <omp.h>
   under _OPENMP) were included before this fragment.
   --------------------------------------------------------------------------- */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define US__GEMM_AVX2 1
#else
#define US__GEMM_AVX2 0
#endif

#ifndef US__BF16_HELPERS_DEFINED
#define US__BF16_HELPERS_DEFINED
/* bf16 = upper 16 bits of an IEEE binary32; widening is exact. */
static inline float us__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* Round-to-nearest-even. NaN -> quiet NaN with the same sign; inf -> inf;
   values that round past FLT_MAX become inf (plain RNE carry into exponent). */
static inline uint16_t us__f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
#endif

/* Register block (micro-tile) and cache blocks, tuned for Zen3 (32K L1d,
   512K L2 per core): B sliver KC*NR*4 = 16 KB in L1, A block MC*KC*4 = 144 KB
   in L2, B panel KC*NC*4 ~ 4 MB in L3. KC must not depend on nthreads. */
#define US__GEMM_MR 6
#define US__GEMM_NR 16
#ifndef US__GEMM_KC
#define US__GEMM_KC 256
#endif
#ifndef US__GEMM_MC
#define US__GEMM_MC 144  /* multiple of MR */
#endif
#ifndef US__GEMM_NC
#define US__GEMM_NC 4080 /* multiple of NR */
#endif

/* Load element idx of a float (dt 0) or bf16 (dt 1) array as fp32. */
static inline float us__gemm_ld(const void *p, int dt, int64_t idx) {
    return dt ? us__bf16_to_f32(((const uint16_t *)p)[idx]) : ((const float *)p)[idx];
}

/* C = a*x + y with a fused multiply-add where the hardware has one, so the
   scalar edge epilogue rounds like the vector one. */
static inline float us__gemm_fma(float a, float x, float y) {
#if defined(__FMA__)
    return fmaf(a, x, y);
#else
    return a * x + y;
#endif
}

/* Where a micro-tile's result goes. Always v = alpha*acc + beta*c (beta==0
   never reads c). If cb is NULL, v is stored to the fp32 tile c. Otherwise this
   is the last K pass of a bf16 C: v += betab*cb (betab==0 never reads cb) and
   v is rounded once to bf16 into cb; c is then only read, never written. */
typedef struct {
    float *c;
    int64_t ldc;
    float alpha, beta;
    uint16_t *cb;
    int64_t ldcb;
    float betab;
} us__gemm_out;

/* Scalar epilogue for edge tiles (and the portable build). */
static void us__gemm_store_tile(const float *acc /* [MR][NR] */, const us__gemm_out *o, int mr, int nr) {
    int i, j;
    for (i = 0; i < mr; i++) {
        const float *ai = acc + i * US__GEMM_NR;
        for (j = 0; j < nr; j++) {
            float v = o->alpha * ai[j];
            if (o->beta != 0.0f) v = us__gemm_fma(o->beta, o->c[i * o->ldc + j], v);
            if (!o->cb) {
                o->c[i * o->ldc + j] = v;
            } else {
                uint16_t *d = o->cb + i * o->ldcb + j;
                if (o->betab != 0.0f) v = us__gemm_fma(o->betab, us__bf16_to_f32(*d), v);
                *d = us__f32_to_bf16(v);
            }
        }
    }
}

#if US__GEMM_AVX2
/* Vector epilogue for one 8-wide row segment; same arithmetic as the scalar one. */
static inline void us__gemm_store8(__m256 acc, const us__gemm_out *o, int64_t off_c, int64_t off_cb) {
    __m256 v = _mm256_mul_ps(_mm256_set1_ps(o->alpha), acc);
    if (o->beta != 0.0f) v = _mm256_fmadd_ps(_mm256_set1_ps(o->beta), _mm256_loadu_ps(o->c + off_c), v);
    if (!o->cb) {
        _mm256_storeu_ps(o->c + off_c, v);
    } else {
        uint16_t *d = o->cb + off_cb;
        __m256i u, r, nan, h;
        __m128i lo;
        if (o->betab != 0.0f) {
            __m256i old = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)d));
            v = _mm256_fmadd_ps(_mm256_set1_ps(o->betab), _mm256_castsi256_ps(_mm256_slli_epi32(old, 16)), v);
        }
        /* RNE to bf16, as us__f32_to_bf16: u + 0x7fff + lsb, NaN -> quiet NaN. */
        u = _mm256_castps_si256(v);
        r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                 _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
        nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
        h = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16),
                               _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040)), nan);
        /* 8 x u32 (each <= 0xffff) -> 8 x u16: pack within lanes, then gather qwords 0 and 2. */
        h = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
        lo = _mm256_castsi256_si128(h);
        _mm_storeu_si128((__m128i *)d, lo);
    }
}
#endif

/* Micro-kernel: c[mr x nr] (= or +=) alpha * a_sliver[kc x MR]^T . b_sliver[kc x NR].
   a: packed MR-row sliver, a[k*MR + i]; b: packed NR-col sliver, b[k*NR + j].
   Both are zero-padded, so the full 6x16 product is always computed and only
   the store is trimmed for edge tiles. */
static void us__gemm_ukr(int64_t kc, const float *a, const float *b, const us__gemm_out *o, int mr, int nr) {
#if US__GEMM_AVX2
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    int64_t k;
    /* Warm the C tile while the K loop runs (it is touched only at the end). */
    {
        int i;
        if (o->beta != 0.0f)
            for (i = 0; i < mr; i++) {
                _mm_prefetch((const char *)(o->c + i * o->ldc), _MM_HINT_T0);
                _mm_prefetch((const char *)(o->c + i * o->ldc + 15), _MM_HINT_T0);
            }
        if (o->cb && o->betab != 0.0f)
            for (i = 0; i < mr; i++) _mm_prefetch((const char *)(o->cb + i * o->ldcb), _MM_HINT_T0);
    }
    for (k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), av;
        av = _mm256_broadcast_ss(a + 0); c00 = _mm256_fmadd_ps(av, b0, c00); c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(a + 1); c10 = _mm256_fmadd_ps(av, b0, c10); c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(a + 2); c20 = _mm256_fmadd_ps(av, b0, c20); c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(a + 3); c30 = _mm256_fmadd_ps(av, b0, c30); c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(a + 4); c40 = _mm256_fmadd_ps(av, b0, c40); c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(a + 5); c50 = _mm256_fmadd_ps(av, b0, c50); c51 = _mm256_fmadd_ps(av, b1, c51);
        a += US__GEMM_MR;
        b += US__GEMM_NR;
    }
    if (mr == US__GEMM_MR && nr == US__GEMM_NR) {
        /* Full tile: vector epilogue straight into C (or the fp32 workspace). */
#define US__GEMM_ST(row, lo, hi)                                                   \
    do {                                                                           \
        us__gemm_store8(lo, o, (row) * o->ldc, (row) * o->ldcb);                   \
        us__gemm_store8(hi, o, (row) * o->ldc + 8, (row) * o->ldcb + 8);           \
    } while (0)
        US__GEMM_ST(0, c00, c01); US__GEMM_ST(1, c10, c11); US__GEMM_ST(2, c20, c21);
        US__GEMM_ST(3, c30, c31); US__GEMM_ST(4, c40, c41); US__GEMM_ST(5, c50, c51);
#undef US__GEMM_ST
    } else {
        float acc[US__GEMM_MR * US__GEMM_NR];
        _mm256_storeu_ps(acc + 0 * 16, c00); _mm256_storeu_ps(acc + 0 * 16 + 8, c01);
        _mm256_storeu_ps(acc + 1 * 16, c10); _mm256_storeu_ps(acc + 1 * 16 + 8, c11);
        _mm256_storeu_ps(acc + 2 * 16, c20); _mm256_storeu_ps(acc + 2 * 16 + 8, c21);
        _mm256_storeu_ps(acc + 3 * 16, c30); _mm256_storeu_ps(acc + 3 * 16 + 8, c31);
        _mm256_storeu_ps(acc + 4 * 16, c40); _mm256_storeu_ps(acc + 4 * 16 + 8, c41);
        _mm256_storeu_ps(acc + 5 * 16, c50); _mm256_storeu_ps(acc + 5 * 16 + 8, c51);
        us__gemm_store_tile(acc, o, mr, nr);
    }
#else
    /* Portable path (correctness first, ~10-20 GFLOP/s): same tile shape and
       the same ascending-k order, two rows at a time; the j loops auto-vectorise. */
    float acc[US__GEMM_MR * US__GEMM_NR];
    int64_t k;
    int i, j;
    for (i = 0; i < US__GEMM_MR; i += 2) {
        float r0[US__GEMM_NR], r1[US__GEMM_NR];
        const float *ak = a + i, *bk = b;
        for (j = 0; j < US__GEMM_NR; j++) r0[j] = r1[j] = 0.0f;
        for (k = 0; k < kc; k++) {
            const float a0 = ak[0], a1 = ak[1];
            for (j = 0; j < US__GEMM_NR; j++) {
                r0[j] += a0 * bk[j];
                r1[j] += a1 * bk[j];
            }
            ak += US__GEMM_MR;
            bk += US__GEMM_NR;
        }
        for (j = 0; j < US__GEMM_NR; j++) {
            acc[i * US__GEMM_NR + j] = r0[j];
            acc[(i + 1) * US__GEMM_NR + j] = r1[j];
        }
    }
    us__gemm_store_tile(acc, o, mr, nr);
#endif
}

/* Pack op(A)[i0:i0+mc, p0:p0+kc] into MR-row slivers: dst[s][k][MR], rows past
   mc zero-padded so the micro-kernel never branches on edges. */
static void us__gemm_pack_a(int ta, const void *A, int dtA, int64_t lda, int64_t i0, int64_t mc,
                            int64_t p0, int64_t kc, float *dst) {
    const int64_t sl = kc * US__GEMM_MR; /* floats per sliver */
    int64_t is, k;
    if (!ta) {
        /* A is M x K row-major: per sliver, MR rows each contiguous along k. */
        for (is = 0; is < mc; is += US__GEMM_MR) {
            const int mr = (int)(mc - is < US__GEMM_MR ? mc - is : US__GEMM_MR);
            float *d = dst + (is / US__GEMM_MR) * sl;
            int i;
            if (dtA == 0) {
                const float *src = (const float *)A + (i0 + is) * lda + p0;
                for (i = 0; i < mr; i++)
                    for (k = 0; k < kc; k++) d[k * US__GEMM_MR + i] = src[i * lda + k];
            } else {
                const uint16_t *src = (const uint16_t *)A + (i0 + is) * lda + p0;
                for (i = 0; i < mr; i++)
                    for (k = 0; k < kc; k++) d[k * US__GEMM_MR + i] = us__bf16_to_f32(src[i * lda + k]);
            }
            for (i = mr; i < US__GEMM_MR; i++)
                for (k = 0; k < kc; k++) d[k * US__GEMM_MR + i] = 0.0f;
        }
    } else {
        /* A stored K x M: walk storage rows k in order (sequential reads of mc
           values) and scatter MR-wide pieces into the slivers. */
        const int64_t full = mc / US__GEMM_MR * US__GEMM_MR, rem = mc - full;
        for (k = 0; k < kc; k++) {
            float *d = dst + k * US__GEMM_MR;
            int64_t i;
#if US__GEMM_AVX2
            /* Rows are lda apart: the hardware prefetcher does not follow that
               well, so request the row 8 steps ahead explicitly. */
            if (k + 8 < kc) {
                const char *pf = (const char *)A + ((p0 + k + 8) * lda + i0) * (dtA ? 2 : 4);
                const int64_t bytes = mc * (dtA ? 2 : 4);
                int64_t o;
                for (o = 0; o < bytes + 63; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
            }
#endif
            if (dtA == 0) {
                const float *src = (const float *)A + (p0 + k) * lda + i0;
                for (is = 0; is < full; is += US__GEMM_MR, d += sl)
                    for (i = 0; i < US__GEMM_MR; i++) d[i] = src[is + i];
                for (i = 0; i < rem; i++) d[i] = src[full + i];
            } else {
                const uint16_t *src = (const uint16_t *)A + (p0 + k) * lda + i0;
                for (is = 0; is < full; is += US__GEMM_MR, d += sl)
                    for (i = 0; i < US__GEMM_MR; i++) d[i] = us__bf16_to_f32(src[is + i]);
                for (i = 0; i < rem; i++) d[i] = us__bf16_to_f32(src[full + i]);
            }
            if (rem)
                for (i = rem; i < US__GEMM_MR; i++) d[i] = 0.0f;
        }
    }
}

/* Pack one NR-column sliver of op(B)[p0:p0+kc, j0:j0+nr] into dst[k][NR]
   (zero-padded to NR) so the micro-kernel streams contiguous aligned memory. */
static void us__gemm_pack_b_sliver(int tb, const void *B, int dtB, int64_t ldb, int64_t p0, int64_t kc,
                                   int64_t j0, int nr, float *dst) {
    int64_t k;
    int j;
    if (!tb) {
        /* B is K x N row-major: each k contributes NR contiguous values. */
        for (k = 0; k < kc; k++) {
            const int64_t base = (p0 + k) * ldb + j0;
            float *d = dst + k * US__GEMM_NR;
            if (dtB == 0) {
                const float *src = (const float *)B + base;
#if US__GEMM_AVX2
                if (nr == US__GEMM_NR) {
                    _mm256_store_ps(d, _mm256_loadu_ps(src));
                    _mm256_store_ps(d + 8, _mm256_loadu_ps(src + 8));
                    continue;
                }
#endif
                for (j = 0; j < nr; j++) d[j] = src[j];
            } else {
                const uint16_t *src = (const uint16_t *)B + base;
#if US__GEMM_AVX2
                if (nr == US__GEMM_NR) {
                    /* bf16 -> f32: zero-extend to 32 bits, shift into the high half. */
                    __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
                    __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 8)));
                    _mm256_store_ps(d, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
                    _mm256_store_ps(d + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
                    continue;
                }
#endif
                for (j = 0; j < nr; j++) d[j] = us__bf16_to_f32(src[j]);
            }
            for (j = nr; j < US__GEMM_NR; j++) d[j] = 0.0f;
        }
    } else {
        /* B stored N x K (we want B^T): NR rows, each contiguous along k.
           Reading row by row keeps the source streams sequential; the 16 KB
           destination stays in L1 for the strided writes. */
        for (j = 0; j < nr; j++) {
            const int64_t base = (j0 + j) * ldb + p0;
            if (dtB == 0) {
                const float *src = (const float *)B + base;
                for (k = 0; k < kc; k++) dst[k * US__GEMM_NR + j] = src[k];
            } else {
                const uint16_t *src = (const uint16_t *)B + base;
                for (k = 0; k < kc; k++) dst[k * US__GEMM_NR + j] = us__bf16_to_f32(src[k]);
            }
        }
        for (j = nr; j < US__GEMM_NR; j++)
            for (k = 0; k < kc; k++) dst[k * US__GEMM_NR + j] = 0.0f;
    }
}

/* Everything a worker thread needs; read-only except the buffers it owns. */
typedef struct {
    int ta, tb, dtA, dtB, dtC;
    int64_t M, N, K, lda, ldb, ldc;
    const void *A, *B;
    void *C;
    float alpha, beta;
    int64_t nc_max;
    float *bpack;  /* KC x nc_max, shared */
    float *apack;  /* per thread: MC x KC */
    float *cws;    /* bf16 C only: fp32 accumulator, M x nc_max (ld = nc_max) */
    int tm, tn;    /* thread grid: tm row groups x tn column groups */
} us__gemm_ctx;

static void us__gemm_worker(const us__gemm_ctx *g, int tid, int nt) {
    const int64_t MR = US__GEMM_MR, NR = US__GEMM_NR;
    const int64_t KC = US__GEMM_KC, MC = US__GEMM_MC;
    /* If the runtime gave us fewer threads than planned, fall back to a 1-D split. */
    const int tm = (nt == g->tm * g->tn) ? g->tm : nt, tn = (nt == g->tm * g->tn) ? g->tn : 1;
    const int tmi = tid % tm, tni = tid / tm;
    const int64_t ms = (g->M + MR - 1) / MR;
    /* This thread's rows: a contiguous run of whole MR slivers (balanced). */
    const int64_t row_lo = (ms * tmi / tm) * MR;
    const int64_t row_hi = (ms * (tmi + 1) / tm) * MR < g->M ? (ms * (tmi + 1) / tm) * MR : g->M;
    float *apack = g->apack + (int64_t)tid * MC * KC;
    int64_t jc, pc;

    for (jc = 0; jc < g->N; jc += g->nc_max) {
        const int64_t nc = g->N - jc < g->nc_max ? g->N - jc : g->nc_max;
        const int64_t ns = (nc + NR - 1) / NR;
        const int64_t s_lo = ns * tni / tn, s_hi = ns * (tni + 1) / tn;
        /* fp32 C: accumulate in place across K passes. bf16 C: accumulate in
           the fp32 workspace (only exists when K > KC) and round once, in the
           last pass's epilogue, so K blocking never double-rounds. */
        float *cf = g->dtC ? g->cws : (float *)g->C + jc;
        const int64_t ldcf = g->dtC ? g->nc_max : g->ldc;

        for (pc = 0; pc < g->K; pc += KC) {
            const int64_t kc = g->K - pc < KC ? g->K - pc : KC;
            const int first = (pc == 0), last = (pc + kc >= g->K);
            us__gemm_out o;
            int64_t s, ic;
            o.alpha = g->alpha;
            o.beta = first ? (g->dtC ? 0.0f : g->beta) : 1.0f; /* later passes add to the partial sums */
            o.betab = g->beta;
            o.ldc = ldcf;
            o.ldcb = g->ldc;

            /* Pack the shared B panel: slivers split statically over all threads. */
            for (s = ns * tid / nt; s < ns * (tid + 1) / nt; s++) {
                const int64_t j0 = s * NR;
                const int nr = (int)(nc - j0 < NR ? nc - j0 : NR);
                us__gemm_pack_b_sliver(g->tb, g->B, g->dtB, g->ldb, pc, kc, jc + j0, nr, g->bpack + s * kc * NR);
            }
#ifdef _OPENMP
#pragma omp barrier
#endif
            for (ic = row_lo; ic < row_hi; ic += MC) {
                const int64_t mc = row_hi - ic < MC ? row_hi - ic : MC;
                us__gemm_pack_a(g->ta, g->A, g->dtA, g->lda, ic, mc, pc, kc, apack);
                for (s = s_lo; s < s_hi; s++) {
                    const int64_t j0 = s * NR;
                    const int nr = (int)(nc - j0 < NR ? nc - j0 : NR);
                    const float *bs = g->bpack + s * kc * NR;
                    int64_t ir;
                    for (ir = 0; ir < mc; ir += MR) {
                        const int mr = (int)(mc - ir < MR ? mc - ir : MR);
                        o.c = cf ? cf + (ic + ir) * ldcf + j0 : NULL;
                        o.cb = (g->dtC && last) ? (uint16_t *)g->C + (ic + ir) * g->ldc + jc + j0 : NULL;
                        us__gemm_ukr(kc, apack + ir * kc, bs, &o, mr, nr);
                    }
                }
            }
            /* Nobody may repack B (next pc / jc) while others still read it. */
#ifdef _OPENMP
#pragma omp barrier
#endif
        }
    }
}

/* Pointer rounded up to a 64-byte boundary (C99 has no portable aligned_alloc). */
static float *us__gemm_align64(void *p) {
    return (float *)(((uintptr_t)p + 63u) & ~(uintptr_t)63u);
}

/* C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C, all row-major.
   op(A) = A (M x K, stride lda) if ta==0, else A^T (A stored K x M, stride lda).
   op(B) = B (K x N, stride ldb) if tb==0, else B^T (B stored N x K, stride ldb).
   dtA/dtB/dtC: 0 = fp32, 1 = bf16 (uint16_t). fp32 accumulation; bf16 C is
   rounded once (RNE). beta==0 never reads C. K==0 (or alpha==0, as in BLAS)
   gives C = beta*C without touching A/B. nthreads: 0 = all OpenMP threads.
   Bitwise deterministic for any nthreads. */
static void us__gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const void *A, int dtA, int64_t lda,
                     const void *B, int dtB, int64_t ldb,
                     float beta, void *C, int dtC, int64_t ldc,
                     int nthreads) {
    int64_t i, j;
    if (M <= 0 || N <= 0) return;

    if (K <= 0 || alpha == 0.0f) {
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                const float v = beta == 0.0f ? 0.0f : beta * us__gemm_ld(C, dtC, i * ldc + j);
                if (dtC) ((uint16_t *)C)[i * ldc + j] = us__f32_to_bf16(v);
                else ((float *)C)[i * ldc + j] = v;
            }
        return;
    }

    /* Tiny problems: packing would cost more than it saves. Straight dot
       products with the same ascending-k fp32 accumulation. */
    if ((double)M * (double)N * (double)K < 32.0 * 32.0 * 32.0) {
        const int64_t sai = ta ? 1 : lda, sak = ta ? lda : 1; /* op(A)[i,k] = A[i*sai + k*sak] */
        const int64_t sbk = tb ? 1 : ldb, sbj = tb ? ldb : 1; /* op(B)[k,j] = B[k*sbk + j*sbj] */
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                float acc = 0.0f, v;
                int64_t k;
                for (k = 0; k < K; k++)
                    acc = us__gemm_fma(us__gemm_ld(A, dtA, i * sai + k * sak), us__gemm_ld(B, dtB, k * sbk + j * sbj), acc);
                v = alpha * acc;
                if (beta != 0.0f) v = us__gemm_fma(beta, us__gemm_ld(C, dtC, i * ldc + j), v);
                if (dtC) ((uint16_t *)C)[i * ldc + j] = us__f32_to_bf16(v);
                else ((float *)C)[i * ldc + j] = v;
            }
        return;
    }

    {
        const int64_t MR = US__GEMM_MR, NR = US__GEMM_NR, KC = US__GEMM_KC, MC = US__GEMM_MC;
        us__gemm_ctx g;
        int nt = 1, t, best_tm;
        double best_eff = -1.0;
        int64_t kc_max, ms, ns;
        void *raw;
        size_t nb, na, nw;

#ifdef _OPENMP
        nt = nthreads > 0 ? nthreads : omp_get_max_threads();
#else
        (void)nthreads;
#endif
        /* Small products do not amortise a thread team. */
        if ((double)M * (double)N * (double)K < 96.0 * 96.0 * 96.0) nt = 1;
        if (nt < 1) nt = 1;

        g.ta = ta; g.tb = tb; g.dtA = dtA; g.dtB = dtB; g.dtC = dtC;
        g.M = M; g.N = N; g.K = K; g.lda = lda; g.ldb = ldb; g.ldc = ldc;
        g.A = A; g.B = B; g.C = C; g.alpha = alpha; g.beta = beta;
        g.nc_max = US__GEMM_NC;
        if (dtC && K > KC) {
            /* bf16 C over several K passes needs an fp32 M x nc workspace; cap it at ~16M floats. */
            int64_t cap = ((int64_t)1 << 24) / M / NR * NR;
            if (cap < NR) cap = NR;
            if (cap < g.nc_max) g.nc_max = cap;
        }
        if (g.nc_max > (N + NR - 1) / NR * NR) g.nc_max = (N + NR - 1) / NR * NR;

        /* Thread grid tm x tn (tm*tn == nt): prefer splitting M (no duplicated
           A packing); split N when M has too few slivers to balance. */
        ms = (M + MR - 1) / MR;
        ns = (g.nc_max + NR - 1) / NR;
        best_tm = nt;
        for (t = nt; t >= 1; t--) {
            if (nt % t) continue;
            {
                const int64_t tn = nt / t;
                const double em = ((double)ms / t) / (double)((ms + t - 1) / t);
                const double en = ((double)ns / tn) / (double)((ns + tn - 1) / tn);
                /* small penalty per extra column group: each one repacks A */
                const double eff = em * en - 0.02 * (double)(tn - 1);
                if (eff > best_eff + 1e-9) { best_eff = eff; best_tm = t; }
            }
        }
        g.tm = best_tm;
        g.tn = nt / best_tm;

        kc_max = K < KC ? K : KC;
        nb = (size_t)(kc_max * g.nc_max);
        na = (size_t)(MC * KC) * (size_t)nt;
        nw = (dtC && K > KC) ? (size_t)(M * g.nc_max) : 0;
        /* One allocation, three 64-byte aligned regions (each a multiple of 16 floats). */
        nb = (nb + 15) & ~(size_t)15;
        raw = malloc((nb + na + nw) * sizeof(float) + 64);
        if (!raw) return; /* out of memory: leave C untouched */
        g.bpack = us__gemm_align64(raw);
        g.apack = g.bpack + nb;
        g.cws = nw ? g.apack + na : NULL;

#ifdef _OPENMP
        if (nt > 1) {
#pragma omp parallel num_threads(nt)
            us__gemm_worker(&g, omp_get_thread_num(), omp_get_num_threads());
        } else {
            us__gemm_worker(&g, 0, 1);
        }
#else
        us__gemm_worker(&g, 0, 1);
#endif
        free(raw);
    }
}
