/* ------------------------------------------------------------------------------------ */
// >>cuda-flash  causal grouped-query flash attention on tensor cores (bf16 in, fp32 math)
/* ------------------------------------------------------------------------------------
   FlashAttention-2 (Dao, 2023) with mma.sync m16n8k16 (bf16 × bf16 → fp32), ldmatrix
   fragments and cp.async double-buffered tiles. Matches us__cpu_attention_fwd/bwd.

   Legend: B batch, T seq, NH query heads, NKV kv heads, HS head size (64 or 128),
   QKV = (NH + 2·NKV)·HS.
     qkv  bf16 [B, T, QKV]     q head h at h·HS, k head g at (NH+g)·HS, v head g at (NH+NKV+g)·HS
     out  bf16 [B, T, NH·HS]
     lse  f32  [B, NH, T]      natural log of Σ_j exp(q·k_j / sqrt(HS)) over keys j ≤ t
     dqkv bf16 [B, T, QKV]     fully overwritten by the backward
   Query head h reads kv head g = h / (NH/NKV). Causal: query t sees keys 0..t.

   Kernels (every CTA is 4 warps, 128 threads; tiles are 64 queries × 64 keys):
     us__flash_fwd_kernel       one CTA per (64-query block, head, batch); each warp owns 16
                                query rows, keeps Q in registers and streams K/V tiles through
                                shared memory with an online softmax (running max m, sum l).
     us__flash_bwd_dot_kernel   D = rowsum(dO ∘ O), one warp per row (the FA2 preprocess).
     us__flash_bwd_dkdv_kernel  one CTA per (64-key block, kv head, batch); each warp owns 16
                                keys and loops over every query head of the group and every
                                query block at or after the diagonal, recomputing P from q, k
                                and lse: dV += Pᵀ·dO, dK += dSᵀ·Q. The group's sum happens in
                                registers, so no atomics.
     us__flash_bwd_dq_kernel    one CTA per (64-query block, head, batch), warps own query rows
                                like the forward: recomputes S, P, dP, dS and sums dQ += dS·K.
   Determinism: the dQ kernel is separate instead of fp32 atomics from the dK/dV kernel (FA2's
   choice), so every sum runs in a fixed order and two runs give identical bits. It costs
   recomputing Q·Kᵀ and dO·Vᵀ once more (7 instead of 5 matrix products per tile pair).

   Scores are kept in the log2 domain (s·scale·log2 e) so the softmax uses exp2f; lse is
   stored in natural-log units like the CPU reference. Tiles past T are zero-filled by cp.async
   (src-size 0) and masked, so any T ≥ 1 works. */

static constexpr int us__fa_br = 64;      /* queries per tile */
static constexpr int us__fa_bc = 64;      /* keys per tile */
static constexpr int us__fa_threads = 128; /* 4 warps × 16 rows */
static constexpr int us__fa_br_dkdv = 32;  /* queries per tile in the dK/dV kernel: its warps hold dK
                                              and dV (128 fp32 at HS 128), so Sᵀ and dPᵀ must be small */

/* shared-memory rows are padded by 8 bf16 (16 bytes): the 8 rows one ldmatrix reads then
   start in 8 different 16-byte bank groups, so no bank conflicts without a swizzle */
template <int HS> struct us__fa_dims {
    static constexpr int lds = HS + 8;                         /* smem row stride (elements) */
    static constexpr int tile = 64 * lds;                      /* one 64-row tile (elements) */
    static constexpr size_t fwd_smem = (size_t)5 * tile * 2;   /* Q + 2×K + 2×V */
    static constexpr size_t dkdv_smem = (size_t)2 * tile * 2 + (size_t)4 * us__fa_br_dkdv * lds * 2 +
                                        4 * us__fa_br_dkdv * 4;   /* K, V, 2×Q, 2×dO, 2×lse, 2×D */
    static constexpr size_t dq_smem = (size_t)6 * tile * 2;    /* Q, dO, 2×K, 2×V */
};

/* ---- PTX helpers ------------------------------------------------------------------- */
static __device__ __forceinline__ uint32_t us__smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16-byte global→shared copy that bypasses L1; bytes = 0 writes zeros (tile tails) */
static __device__ __forceinline__ void us__cp_async16(void *s, const void *g, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(us__smem_u32(s)), "l"(g), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void us__cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
static __device__ __forceinline__ void us__cp_async_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* four 8×8 bf16 matrices; lane l gives the address of row l%8 of matrix l/8 */
static __device__ __forceinline__ void us__ldsm_x4(uint32_t r[4], const void *s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(us__smem_u32(s)));
}
static __device__ __forceinline__ void us__ldsm_x4_t(uint32_t r[4], const void *s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(us__smem_u32(s)));
}
/* c[16×8] += a[16×16] · b[16×8]. Fragments (g = lane/4, c = 2·(lane%4)):
   a: {(g, c..c+1), (g+8, c..), (g, c+8..), (g+8, c+8..)}; b: {(k c..c+1, n g), (k c+8.., n g)};
   c: {(g, c), (g, c+1), (g+8, c), (g+8, c+1)} */
static __device__ __forceinline__ void us__mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t us__pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The fp32 accumulator of two adjacent n-tiles (16×16) is exactly the A fragment of the next
   product: this is how P and dS stay in registers (FA2) */
static __device__ __forceinline__ void us__acc_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = us__pack_bf16(c0[0], c0[1]);
    a[1] = us__pack_bf16(c0[2], c0[3]);
    a[2] = us__pack_bf16(c1[0], c1[1]);
    a[3] = us__pack_bf16(c1[2], c1[3]);
}

/* ldmatrix addresses inside a [rows][lds] tile:
   A fragment of rows r0..r0+15, columns k0..k0+15 */
template <int LDS> static __device__ __forceinline__ const __nv_bfloat16 *us__fa_a_addr(const __nv_bfloat16 *s, int r0, int k0, int lane) {
    return s + (r0 + (lane & 15)) * LDS + k0 + (lane >> 4) * 8;
}
/* B fragments of two n-tiles (rows n0..n0+15 of a row-major [n][k] tile, i.e. Xᵀ), k0..k0+15:
   regs {0,1} = n-tile n0, {2,3} = n-tile n0+8 */
template <int LDS> static __device__ __forceinline__ const __nv_bfloat16 *us__fa_bt_addr(const __nv_bfloat16 *s, int n0, int k0, int lane) {
    return s + (n0 + (lane & 7) + (lane >> 4) * 8) * LDS + k0 + ((lane >> 3) & 1) * 8;
}
/* B fragments (with .trans) of a row-major [k][n] tile: k0..k0+15, two n-tiles n0, n0+8 */
template <int LDS> static __device__ __forceinline__ const __nv_bfloat16 *us__fa_b_addr(const __nv_bfloat16 *s, int k0, int n0, int lane) {
    return s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + n0 + (lane >> 4) * 8;
}

/* rows×HS tile from global (row stride ld elements) to shared [rows][HS+8]; rows ≥ nvalid become
   zeros (g must point at a valid row 0) */
template <int HS, int ROWS>
static __device__ __forceinline__ void us__fa_load_tile(__nv_bfloat16 *s, const __nv_bfloat16 *g, int64_t ld, int nvalid) {
    constexpr int CPR = HS / 8; /* 16-byte chunks per row */
    static_assert(ROWS * CPR % us__fa_threads == 0, "tile must split evenly over the CTA");
#pragma unroll
    for (int i = 0; i < ROWS * CPR / us__fa_threads; i++) {
        int c = threadIdx.x + i * us__fa_threads;
        int r = c / CPR, k = (c % CPR) * 8, ok = r < nvalid;
        us__cp_async16(s + r * us__fa_dims<HS>::lds + k, ok ? g + r * ld + k : g, ok ? 16 : 0);
    }
}

/* ---- forward ------------------------------------------------------------------------ */
template <int HS>
__global__ void __launch_bounds__(128, 2)
us__flash_fwd_kernel(const __nv_bfloat16 *__restrict__ qkv, __nv_bfloat16 *__restrict__ out, float *__restrict__ lse,
                     int T, int NH, int NKV, float sl2 /* scale·log2 e */) {
    constexpr int BR = us__fa_br, BC = us__fa_bc, LDS = us__fa_dims<HS>::lds, TILE = us__fa_dims<HS>::tile;
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)us__fa_smem; /* [BR][LDS] */
    __nv_bfloat16 *sK = sQ + TILE;                     /* [2][BC][LDS] */
    __nv_bfloat16 *sV = sK + 2 * TILE;                 /* [2][BC][LDS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qb = gridDim.x - 1 - blockIdx.x; /* the longest (last) query blocks start first */
    const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS;
    const __nv_bfloat16 *base = qkv + (int64_t)b * T * QKV;
    const __nv_bfloat16 *gk = base + (int64_t)(NH + g) * HS, *gv = base + (int64_t)(NH + NKV + g) * HS;
    const int q0 = qb * BR, qend = min(q0 + BR, T);
    const int nkb = (qend - 1) / BC + 1; /* causal block skipping: key blocks past the last query are never read */

    us__fa_load_tile<HS, BR>(sQ, base + (int64_t)q0 * QKV + h * HS, QKV, qend - q0);
    us__fa_load_tile<HS, BC>(sK, gk, QKV, min(BC, T));
    us__fa_load_tile<HS, BC>(sV, gv, QKV, min(BC, T));
    us__cp_async_commit();
    us__cp_async_wait_all();
    __syncthreads();

    uint32_t qf[HS / 16][4]; /* this warp's 16 query rows stay in registers for the whole loop */
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) us__ldsm_x4(qf[kk], us__fa_a_addr<LDS>(sQ, warp * 16, kk * 16, lane));

    float o[HS / 8][4];                 /* unnormalised output, rows r and r+8 */
    float m[2] = {-INFINITY, -INFINITY}; /* running max (log2 domain) */
    float l[2] = {0.f, 0.f};             /* running sum, per thread (quad-reduced at the end) */
#pragma unroll
    for (int i = 0; i < HS / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    const int row0 = q0 + warp * 16 + (lane >> 2); /* this thread's rows: row0, row0 + 8 */

    for (int kb = 0; kb < nkb; kb++) {
        const __nv_bfloat16 *sKb = sK + (kb & 1) * TILE, *sVb = sV + (kb & 1) * TILE;
        us__cp_async_wait_all(); /* tile kb has landed ... */
        __syncthreads();         /* ... for every thread, and everyone is done with tile kb-1 */
        if (kb + 1 < nkb) {      /* prefetch tile kb+1 into the other buffer while computing kb */
            int k1 = (kb + 1) * BC;
            us__fa_load_tile<HS, BC>(sK + ((kb + 1) & 1) * TILE, gk + (int64_t)k1 * QKV, QKV, min(BC, T - k1));
            us__fa_load_tile<HS, BC>(sV + ((kb + 1) & 1) * TILE, gv + (int64_t)k1 * QKV, QKV, min(BC, T - k1));
        }
        us__cp_async_commit();

        /* S = Q·Kᵀ  [16 × BC] per warp */
        float s[BC / 8][4];
#pragma unroll
        for (int j = 0; j < BC / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
            for (int np = 0; np < BC / 16; np++) {
                uint32_t kf[4];
                us__ldsm_x4(kf, us__fa_bt_addr<LDS>(sKb, np * 16, kk * 16, lane));
                us__mma_bf16(s[2 * np], qf[kk], kf[0], kf[1]);
                us__mma_bf16(s[2 * np + 1], qf[kk], kf[2], kf[3]);
            }

        /* causal mask only on tiles that cross this warp's diagonal */
        const bool diag = kb * BC + BC - 1 > q0 + warp * 16;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < BC / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[j][e] * sl2;
                if (diag && kb * BC + j * 8 + 2 * (lane & 3) + (e & 1) > row0 + (e >> 1) * 8) v = -INFINITY;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        /* online softmax: new max over the quad that shares a row, rescale what was summed */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mref = mx[r] == -INFINITY ? 0.f : mx[r]; /* a fully masked row stays 0, not NaN */
            float corr = exp2f(m[r] - mref);
            m[r] = mx[r];
            l[r] *= corr;
#pragma unroll
            for (int i = 0; i < HS / 8; i++) o[i][2 * r] *= corr, o[i][2 * r + 1] *= corr;
#pragma unroll
            for (int j = 0; j < BC / 8; j++) {
                s[j][2 * r] = exp2f(s[j][2 * r] - mref);
                s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - mref);
                l[r] += s[j][2 * r] + s[j][2 * r + 1];
            }
        }

        /* O += P·V: P goes from accumulator to A fragment in registers, V via ldmatrix.trans */
#pragma unroll
        for (int t = 0; t < BC / 16; t++) {
            uint32_t pa[4];
            us__acc_to_a(pa, s[2 * t], s[2 * t + 1]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t vf[4];
                us__ldsm_x4_t(vf, us__fa_b_addr<LDS>(sVb, t * 16, dp * 16, lane));
                us__mma_bf16(o[2 * dp], pa, vf[0], vf[1]);
                us__mma_bf16(o[2 * dp + 1], pa, vf[2], vf[3]);
            }
        }
    }

    /* O / l and lse = m + log l (natural log) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        int row = row0 + r * 8;
        if (row < T) {
            float inv = 1.f / l[r];
            __nv_bfloat16 *orow = out + ((int64_t)b * T + row) * NH * HS + (int64_t)h * HS + 2 * (lane & 3);
#pragma unroll
            for (int i = 0; i < HS / 8; i++)
                *reinterpret_cast<__nv_bfloat162 *>(orow + i * 8) = __floats2bfloat162_rn(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
            if ((lane & 3) == 0) lse[((int64_t)b * NH + h) * T + row] = (m[r] + log2f(l[r])) * 0.69314718055994531f;
        }
    }
}

/* ---- backward ----------------------------------------------------------------------- */
/* D[b, h, t] = Σ_d dO·O  (fp32), one warp per row of [B·T·NH] */
template <int HS>
__global__ void __launch_bounds__(256)
us__flash_bwd_dot_kernel(const __nv_bfloat16 *__restrict__ dout, const __nv_bfloat16 *__restrict__ out, float *__restrict__ D,
                         int64_t rows, int T, int NH) {
    int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5); /* row = (b·T + t)·NH + h */
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const __nv_bfloat162 *a = reinterpret_cast<const __nv_bfloat162 *>(dout + row * HS);
    const __nv_bfloat162 *o = reinterpret_cast<const __nv_bfloat162 *>(out + row * HS);
    float acc = 0.f;
#pragma unroll
    for (int i = lane; i < HS / 2; i += 32) {
        float2 x = __bfloat1622float2(a[i]), y = __bfloat1622float2(o[i]);
        acc += x.x * y.x + x.y * y.y;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        int64_t bt = row / NH, bb = bt / T;
        int h = (int)(row % NH), t = (int)(bt % T);
        D[(bb * NH + h) * T + t] = acc;
    }
}

/* dK, dV of 64 keys of one kv head. Per warp (16 keys k, 32 queries q of the current tile):
     Sᵀ = K·Qᵀ, Pᵀ = exp2(Sᵀ·sl2 − lse2[q]), dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D[q]),
     dV += Pᵀ·dO, dK += dSᵀ·Q   (dK scaled by 1/sqrt(HS) once at the end) */
template <int HS>
__global__ void __launch_bounds__(128, 2)
us__flash_bwd_dkdv_kernel(const __nv_bfloat16 *__restrict__ dout, const __nv_bfloat16 *__restrict__ qkv,
                          const float *__restrict__ lse, const float *__restrict__ Dg, __nv_bfloat16 *__restrict__ dqkv,
                          int T, int NH, int NKV, float scale, float sl2) {
    constexpr int BR = us__fa_br_dkdv, BC = us__fa_bc, LDS = us__fa_dims<HS>::lds, TILE = us__fa_dims<HS>::tile;
    constexpr int QT = BR * LDS; /* one query tile */
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    __nv_bfloat16 *sK = (__nv_bfloat16 *)us__fa_smem; /* [BC][LDS] */
    __nv_bfloat16 *sV = sK + TILE;                     /* [BC][LDS] */
    __nv_bfloat16 *sQ = sV + TILE;                     /* [2][BR][LDS] */
    __nv_bfloat16 *sdO = sQ + 2 * QT;                  /* [2][BR][LDS] */
    float *sL = (float *)(sdO + 2 * QT);               /* [2][BR] lse·log2 e */
    float *sD = sL + 2 * BR;                           /* [2][BR] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kb = blockIdx.x, g = blockIdx.y, b = blockIdx.z; /* low kb = most query blocks: start first */
    const int grp = NH / NKV, k0 = kb * BC;
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, OC = (int64_t)NH * HS;
    const __nv_bfloat16 *base = qkv + (int64_t)b * T * QKV, *dbase = dout + (int64_t)b * T * OC;
    const int qb0 = k0 / BR;                   /* first query block that sees these keys */
    const int per = (T + BR - 1) / BR - qb0;   /* query blocks per head */
    const int nit = grp * per;                 /* iterations: every (query head of group, query block) */

    /* stage the tile of iteration it (query head g·grp + it/per, block qb0 + it%per) into buffer buf */
    auto issue = [&](int it, int buf) {
        int h = g * grp + it / per, q0 = (qb0 + it % per) * BR, nv = min(BR, T - q0);
        us__fa_load_tile<HS, BR>(sQ + buf * QT, base + (int64_t)q0 * QKV + h * HS, QKV, nv);
        us__fa_load_tile<HS, BR>(sdO + buf * QT, dbase + (int64_t)q0 * OC + h * HS, OC, nv);
        if (threadIdx.x < BR) { /* queries past T get lse = +inf, so P = 0 there */
            int q = q0 + threadIdx.x;
            int64_t i = ((int64_t)b * NH + h) * T + q;
            sL[buf * BR + threadIdx.x] = q < T ? lse[i] * 1.4426950408889634f : INFINITY;
            sD[buf * BR + threadIdx.x] = q < T ? Dg[i] : 0.f;
        }
    };
    us__fa_load_tile<HS, BC>(sK, base + (int64_t)k0 * QKV + (int64_t)(NH + g) * HS, QKV, min(BC, T - k0));
    us__fa_load_tile<HS, BC>(sV, base + (int64_t)k0 * QKV + (int64_t)(NH + NKV + g) * HS, QKV, min(BC, T - k0));
    issue(0, 0);
    us__cp_async_commit();

    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;
    const int key0 = k0 + warp * 16 + (lane >> 2); /* this thread's keys: key0, key0 + 8 */

    for (int it = 0; it < nit; it++) {
        const int buf = it & 1, q0 = (qb0 + it % per) * BR;
        us__cp_async_wait_all();
        __syncthreads();
        if (it + 1 < nit) issue(it + 1, buf ^ 1); /* overlaps the next Q/dO tile with this one's math */
        us__cp_async_commit();
        const __nv_bfloat16 *sQb = sQ + buf * QT, *sdOb = sdO + buf * QT;
        const float *sLb = sL + buf * BR, *sDb = sD + buf * BR;

        /* Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, [16 keys × BR queries] per warp */
        float st[BR / 8][4], dpt[BR / 8][4];
#pragma unroll
        for (int j = 0; j < BR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[j][e] = dpt[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t ka[4], va[4];
            us__ldsm_x4(ka, us__fa_a_addr<LDS>(sK, warp * 16, kk * 16, lane));
            us__ldsm_x4(va, us__fa_a_addr<LDS>(sV, warp * 16, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < BR / 16; np++) {
                uint32_t qf[4], df[4];
                us__ldsm_x4(qf, us__fa_bt_addr<LDS>(sQb, np * 16, kk * 16, lane));
                us__ldsm_x4(df, us__fa_bt_addr<LDS>(sdOb, np * 16, kk * 16, lane));
                us__mma_bf16(st[2 * np], ka, qf[0], qf[1]);
                us__mma_bf16(st[2 * np + 1], ka, qf[2], qf[3]);
                us__mma_bf16(dpt[2 * np], va, df[0], df[1]);
                us__mma_bf16(dpt[2 * np + 1], va, df[2], df[3]);
            }
        }
        /* recompute Pᵀ from the saved lse (no T×T matrix is ever stored), then dSᵀ */
        const bool diag = k0 + warp * 16 + 15 > q0; /* some key of this warp is after some query */
#pragma unroll
        for (int j = 0; j < BR / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ql = j * 8 + 2 * (lane & 3) + (e & 1);
                float p = exp2f(st[j][e] * sl2 - sLb[ql]);
                if (diag && key0 + (e >> 1) * 8 > q0 + ql) p = 0.f;
                st[j][e] = p;
                dpt[j][e] = p * (dpt[j][e] - sDb[ql]);
            }
        /* dV += Pᵀ·dO and dK += dSᵀ·Q; Pᵀ and dSᵀ are A fragments straight from registers */
#pragma unroll
        for (int t = 0; t < BR / 16; t++) {
            uint32_t pa[4], da[4];
            us__acc_to_a(pa, st[2 * t], st[2 * t + 1]);
            us__acc_to_a(da, dpt[2 * t], dpt[2 * t + 1]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t of[4], qf[4];
                us__ldsm_x4_t(of, us__fa_b_addr<LDS>(sdOb, t * 16, dp * 16, lane));
                us__ldsm_x4_t(qf, us__fa_b_addr<LDS>(sQb, t * 16, dp * 16, lane));
                us__mma_bf16(dv[2 * dp], pa, of[0], of[1]);
                us__mma_bf16(dv[2 * dp + 1], pa, of[2], of[3]);
                us__mma_bf16(dk[2 * dp], da, qf[0], qf[1]);
                us__mma_bf16(dk[2 * dp + 1], da, qf[2], qf[3]);
            }
        }
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = key0 + r * 8;
        if (key >= T) continue;
        __nv_bfloat16 *row = dqkv + ((int64_t)b * T + key) * QKV + 2 * (lane & 3);
        __nv_bfloat16 *dkr = row + (int64_t)(NH + g) * HS, *dvr = row + (int64_t)(NH + NKV + g) * HS;
#pragma unroll
        for (int i = 0; i < HS / 8; i++) {
            *reinterpret_cast<__nv_bfloat162 *>(dkr + i * 8) = __floats2bfloat162_rn(dk[i][2 * r] * scale, dk[i][2 * r + 1] * scale);
            *reinterpret_cast<__nv_bfloat162 *>(dvr + i * 8) = __floats2bfloat162_rn(dv[i][2 * r], dv[i][2 * r + 1]);
        }
    }
}

/* dQ of 64 queries of one head, keys 0..end in order (deterministic). Per warp (16 queries):
     S = Q·Kᵀ, P = exp2(S·sl2 − lse2), dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ += dS·K */
template <int HS>
__global__ void __launch_bounds__(128, 2)
us__flash_bwd_dq_kernel(const __nv_bfloat16 *__restrict__ dout, const __nv_bfloat16 *__restrict__ qkv,
                        const float *__restrict__ lse, const float *__restrict__ Dg, __nv_bfloat16 *__restrict__ dqkv,
                        int T, int NH, int NKV, float scale, float sl2) {
    constexpr int BR = us__fa_br, BC = us__fa_bc, LDS = us__fa_dims<HS>::lds, TILE = us__fa_dims<HS>::tile;
    extern __shared__ __align__(16) unsigned char us__fa_smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)us__fa_smem; /* [BR][LDS] */
    __nv_bfloat16 *sdO = sQ + TILE;                    /* [BR][LDS] */
    __nv_bfloat16 *sK = sdO + TILE;                    /* [2][BC][LDS] */
    __nv_bfloat16 *sV = sK + 2 * TILE;                 /* [2][BC][LDS] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
    const int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, OC = (int64_t)NH * HS;
    const __nv_bfloat16 *base = qkv + (int64_t)b * T * QKV;
    const __nv_bfloat16 *gk = base + (int64_t)(NH + g) * HS, *gv = base + (int64_t)(NH + NKV + g) * HS;
    const int q0 = qb * BR, qend = min(q0 + BR, T), nkb = (qend - 1) / BC + 1;

    us__fa_load_tile<HS, BR>(sQ, base + (int64_t)q0 * QKV + h * HS, QKV, qend - q0);
    us__fa_load_tile<HS, BR>(sdO, dout + ((int64_t)b * T + q0) * OC + h * HS, OC, qend - q0);
    us__fa_load_tile<HS, BC>(sK, gk, QKV, min(BC, T));
    us__fa_load_tile<HS, BC>(sV, gv, QKV, min(BC, T));
    us__cp_async_commit();

    const int row0 = q0 + warp * 16 + (lane >> 2);
    float L2[2], Dr[2]; /* lse·log2 e and D of rows row0, row0+8 (rows past T: never stored) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + r * 8;
        int64_t i = ((int64_t)b * NH + h) * T + row;
        L2[r] = row < T ? lse[i] * 1.4426950408889634f : 0.f;
        Dr[r] = row < T ? Dg[i] : 0.f;
    }
    float dq[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

    for (int kb = 0; kb < nkb; kb++) {
        const __nv_bfloat16 *sKb = sK + (kb & 1) * TILE, *sVb = sV + (kb & 1) * TILE;
        us__cp_async_wait_all();
        __syncthreads();
        if (kb + 1 < nkb) {
            int k1 = (kb + 1) * BC;
            us__fa_load_tile<HS, BC>(sK + ((kb + 1) & 1) * TILE, gk + (int64_t)k1 * QKV, QKV, min(BC, T - k1));
            us__fa_load_tile<HS, BC>(sV + ((kb + 1) & 1) * TILE, gv + (int64_t)k1 * QKV, QKV, min(BC, T - k1));
        }
        us__cp_async_commit();

        /* S = Q·Kᵀ, dP = dO·Vᵀ  [16 × BC] per warp; Q and dO A fragments are re-read from shared
           memory (holding them in registers would cost 64 more and spill) */
        float s[BC / 8][4], dp[BC / 8][4];
#pragma unroll
        for (int j = 0; j < BC / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t qa[4], da[4];
            us__ldsm_x4(qa, us__fa_a_addr<LDS>(sQ, warp * 16, kk * 16, lane));
            us__ldsm_x4(da, us__fa_a_addr<LDS>(sdO, warp * 16, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < BC / 16; np++) {
                uint32_t kf[4], vf[4];
                us__ldsm_x4(kf, us__fa_bt_addr<LDS>(sKb, np * 16, kk * 16, lane));
                us__ldsm_x4(vf, us__fa_bt_addr<LDS>(sVb, np * 16, kk * 16, lane));
                us__mma_bf16(s[2 * np], qa, kf[0], kf[1]);
                us__mma_bf16(s[2 * np + 1], qa, kf[2], kf[3]);
                us__mma_bf16(dp[2 * np], da, vf[0], vf[1]);
                us__mma_bf16(dp[2 * np + 1], da, vf[2], vf[3]);
            }
        }
        const bool diag = kb * BC + BC - 1 > q0 + warp * 16;
#pragma unroll
        for (int j = 0; j < BC / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[j][e] * sl2 - L2[e >> 1]);
                if (diag && kb * BC + j * 8 + 2 * (lane & 3) + (e & 1) > row0 + (e >> 1) * 8) p = 0.f;
                dp[j][e] = p * (dp[j][e] - Dr[e >> 1]);
            }
        /* dQ += dS·K, K through ldmatrix.trans */
#pragma unroll
        for (int t = 0; t < BC / 16; t++) {
            uint32_t da[4];
            us__acc_to_a(da, dp[2 * t], dp[2 * t + 1]);
#pragma unroll
            for (int d2 = 0; d2 < HS / 16; d2++) {
                uint32_t kf[4];
                us__ldsm_x4_t(kf, us__fa_b_addr<LDS>(sKb, t * 16, d2 * 16, lane));
                us__mma_bf16(dq[2 * d2], da, kf[0], kf[1]);
                us__mma_bf16(dq[2 * d2 + 1], da, kf[2], kf[3]);
            }
        }
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + r * 8;
        if (row >= T) continue;
        __nv_bfloat16 *dqr = dqkv + ((int64_t)b * T + row) * QKV + (int64_t)h * HS + 2 * (lane & 3);
#pragma unroll
        for (int i = 0; i < HS / 8; i++)
            *reinterpret_cast<__nv_bfloat162 *>(dqr + i * 8) = __floats2bfloat162_rn(dq[i][2 * r] * scale, dq[i][2 * r + 1] * scale);
    }
}

/* ---- host entry points --------------------------------------------------------------- */
/* Shapes this file has no kernel for (HS not 64/128, NH % NKV ≠ 0) launch an empty grid, so the
   caller's cudaGetLastError reports cudaErrorInvalidConfiguration instead of silence. */
static void us__flash_reject(cudaStream_t stream) {
    us__flash_bwd_dot_kernel<64><<<0, 256, 0, stream>>>(NULL, NULL, NULL, 0, 1, 1);
}

template <int HS>
static void us__flash_fwd_hs(const __nv_bfloat16 *qkv, __nv_bfloat16 *out, float *lse, int B, int T, int NH, int NKV, cudaStream_t stream) {
    size_t smem = us__fa_dims<HS>::fwd_smem;
    cudaFuncSetAttribute(us__flash_fwd_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    dim3 grid((T + us__fa_br - 1) / us__fa_br, NH, B);
    us__flash_fwd_kernel<HS><<<grid, us__fa_threads, smem, stream>>>(qkv, out, lse, T, NH, NKV, 1.4426950408889634f / sqrtf((float)HS));
}

/* out[B,T,NH·HS] and lse[B,NH,T] from qkv[B,T,QKV]; errors via cudaGetLastError */
static void us__flash_fwd(const __nv_bfloat16 *qkv, __nv_bfloat16 *out, float *lse,
                          int B, int T, int NH, int NKV, int HS, cudaStream_t stream) {
    if (NKV <= 0 || NH % NKV != 0) { us__flash_reject(stream); return; }
    if (B <= 0 || T <= 0 || NH <= 0) return;
    if (HS == 64) us__flash_fwd_hs<64>(qkv, out, lse, B, T, NH, NKV, stream);
    else if (HS == 128) us__flash_fwd_hs<128>(qkv, out, lse, B, T, NH, NKV, stream);
    else us__flash_reject(stream);
}

/* scratch of the backward: D f32 [B, NH, T] */
static size_t us__flash_bwd_scratch_bytes(int B, int T, int NH, int NKV, int HS) {
    (void)NKV;
    (void)HS;
    return (size_t)B * NH * T * sizeof(float);
}

template <int HS>
static void us__flash_bwd_hs(const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv, const __nv_bfloat16 *out, const float *lse,
                             __nv_bfloat16 *dqkv, float *D, int B, int T, int NH, int NKV, cudaStream_t stream) {
    float scale = 1.f / sqrtf((float)HS), sl2 = scale * 1.4426950408889634f;
    int64_t rows = (int64_t)B * T * NH;
    us__flash_bwd_dot_kernel<HS><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(dout, out, D, rows, T, NH);
    size_t s1 = us__fa_dims<HS>::dkdv_smem, s2 = us__fa_dims<HS>::dq_smem;
    cudaFuncSetAttribute(us__flash_bwd_dkdv_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
    cudaFuncSetAttribute(us__flash_bwd_dq_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2);
    dim3 g1((T + us__fa_bc - 1) / us__fa_bc, NKV, B), g2((T + us__fa_br - 1) / us__fa_br, NH, B);
    us__flash_bwd_dkdv_kernel<HS><<<g1, us__fa_threads, s1, stream>>>(dout, qkv, lse, D, dqkv, T, NH, NKV, scale, sl2);
    us__flash_bwd_dq_kernel<HS><<<g2, us__fa_threads, s2, stream>>>(dout, qkv, lse, D, dqkv, T, NH, NKV, scale, sl2);
}

/* dqkv[B,T,QKV] (every element written) from dout[B,T,NH·HS], qkv, out and lse of the forward;
   scratch holds us__flash_bwd_scratch_bytes(...) bytes of device memory */
static void us__flash_bwd(const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv, const __nv_bfloat16 *out,
                          const float *lse, __nv_bfloat16 *dqkv, void *scratch,
                          int B, int T, int NH, int NKV, int HS, cudaStream_t stream) {
    if (NKV <= 0 || NH % NKV != 0) { us__flash_reject(stream); return; }
    if (B <= 0 || T <= 0 || NH <= 0) return;
    if (HS == 64) us__flash_bwd_hs<64>(dout, qkv, out, lse, dqkv, (float *)scratch, B, T, NH, NKV, stream);
    else if (HS == 128) us__flash_bwd_hs<128>(dout, qkv, out, lse, dqkv, (float *)scratch, B, T, NH, NKV, stream);
    else us__flash_reject(stream);
}
