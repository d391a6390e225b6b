/* flash_emu.cpp — the flash kernels of ultrascale_cuda.cuh run on the CPU (us_cuda_emu.h) against
   the CPU reference: the block kernels of context parallelism (chains of blocks with ring and
   zig-zag positions, any positions; bf16 and fp16; every head size they are compiled for) and,
   to show the emulator is faithful, the causal kernels that the H200 runs already pass.
   `make flash-emu` (needs the CUDA headers, not a GPU); `build/flash_emu N` runs case N only. */
#define ULTRASCALE_IMPLEMENTATION
#include "../../ultrascale.h"
#include "us_cuda_emu.h"
#include "flash_kernels_emu.h" /* made by extract_flash.py */
#include "../us_test.h"
#include <type_traits>
typedef __nv_bfloat16 bf;
static const float LOG2E = 1.4426950408889634f;

/* the launches of us__flash_block_fwd_hs, us__flash_block_bwd_hs (E: bf16 or fp16) */
template <typename E, int HS, int MW = us__fa_cfg<HS>::fwd_mw, int BC = us__fa_cfg<HS>::fwd_bc,
          int MINB = us__fa_cfg<HS>::fwd_minb>
static void emu_block_fwd(float *acc, float *m, float *l, const E *qkv, const E *kv,
                          const int32_t *qpos, const int32_t *kpos, int B, int Tq, int Tk, int NH,
                          int NKV, int init) {
    constexpr int BR = 64 * MW;
    const int nkt = (Tk + BC - 1) / BC;
    size_t smem = (size_t)(BR + 4 * BC) * us__fa_dims<HS>::lds * 2 + (size_t)(BR + 2 * BC) * 4 +
                  (size_t)((nkt + 31) / 32) * 4;
    emu_launch({(unsigned)NH, (unsigned)B, (unsigned)((Tq + BR - 1) / BR)}, smem, [&] {
        us__flash_block_fwd_kernel<E, HS, MW, BC, MINB>(acc, m, l, qkv, kv, qpos, kpos, Tq, Tk, NH,
                                                        NKV, init, LOG2E / sqrtf((float)HS));
    });
}

template <typename E, int HS, int PART>
static void emu_block_dkdv(float *dkv, const E *dout, const E *qkv, const float *L2, const float *D,
                           const E *kv, const int32_t *qpos, const int32_t *kpos, int B, int Tq,
                           int Tk, int NH, int NKV) {
    constexpr int KW = us__fa_cfg<HS>::kv_kw, BR = us__fa_cfg<HS>::kv_br,
                  MINB = us__fa_cfg<HS>::kv_minb;
    const float scale = 1.f / sqrtf((float)HS), sl2 = scale * LOG2E;
    const int nqt = (Tq + BR - 1) / BR;
    size_t smem = us__fa_dkdv_smem<HS, KW, BR>() + (size_t)(2 * BR + 64 * KW) * 4 +
                  (size_t)((nqt + 31) / 32) * 4;
    emu_launch({(unsigned)NKV, (unsigned)B, (unsigned)((Tk + 64 * KW - 1) / (64 * KW))}, smem, [&] {
        us__flash_block_dkdv_kernel<E, HS, KW, BR, MINB, PART>(dkv, dout, qkv, L2, D, kv, qpos,
                                                               kpos, Tq, Tk, NH, NKV, scale, sl2);
    });
}

template <typename E, int HS>
static void emu_block_bwd(float *dq, float *dkv, const E *dout, const E *qkv, const E *out,
                          const float *lse, const E *kv, const int32_t *qpos, const int32_t *kpos,
                          int B, int Tq, int Tk, int NH, int NKV) {
    std::vector<float> D((size_t)B * NH * Tq), L2((size_t)B * NH * Tq);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tq; t++) {
                float acc = 0;
                const E *a = dout + ((int64_t)(b * Tq + t) * NH + h) * HS,
                        *o = out + ((int64_t)(b * Tq + t) * NH + h) * HS;
                for (int d = 0; d < HS; d++) acc += (float)a[d] * (float)o[d];
                size_t i = ((size_t)b * NH + h) * Tq + t;
                D[i] = acc;
                float L = lse[i];
                L2[i] = L == -INFINITY ? INFINITY : L * LOG2E;
            }
    const float scale = 1.f / sqrtf((float)HS), sl2 = scale * LOG2E;
    if constexpr (us__fa_cfg<HS>::kv_split) { /* dV, then dK */
        emu_block_dkdv<E, HS, 1>(dkv, dout, qkv, L2.data(), D.data(), kv, qpos, kpos, B, Tq, Tk, NH,
                                 NKV);
        emu_block_dkdv<E, HS, 2>(dkv, dout, qkv, L2.data(), D.data(), kv, qpos, kpos, B, Tq, Tk, NH,
                                 NKV);
    } else {
        emu_block_dkdv<E, HS, 0>(dkv, dout, qkv, L2.data(), D.data(), kv, qpos, kpos, B, Tq, Tk, NH,
                                 NKV);
    }
    {
        constexpr int MW = us__fa_cfg<HS>::dq_mw, BC = us__fa_cfg<HS>::dq_bc,
                      MINB = us__fa_cfg<HS>::dq_minb, BR = 64 * MW;
        const int nkt = (Tk + BC - 1) / BC;
        size_t smem = (size_t)(2 * BR + 4 * BC) * us__fa_dims<HS>::lds * 2 +
                      (size_t)(3 * BR + 2 * BC) * 4 + (size_t)((nkt + 31) / 32) * 4;
        emu_launch({(unsigned)NH, (unsigned)B, (unsigned)((Tq + BR - 1) / BR)}, smem, [&] {
            us__flash_block_dq_kernel<E, HS, MW, BC, MINB>(dq, dout, qkv, L2.data(), D.data(), kv,
                                                           qpos, kpos, Tq, Tk, NH, NKV, scale, sl2);
        });
    }
}

static us_ops C;

static float *rnd(int64_t n, float a) {
    float *x = (float *)malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = (float)((rnd01() * 2 - 1) * a);
    return x;
}

/* the 16-bit copy (bf16, or fp16 where dt is US_F16) that both sides read */
static uint16_t *tobf(const float *x, int64_t n, us_dtype dt = US_BF16) {
    uint16_t *h = (uint16_t *)malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == US_F16 ? us_f32_to_f16(x[i]) : us_f32_to_bf16(x[i]);
    return h;
}

static double rel(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != a[i] || b[i] != b[i]) return INFINITY;
        if (isinf(a[i]) || isinf(b[i])) {
            if (a[i] != b[i]) return INFINITY;
            continue;
        }
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static double relbf(const uint16_t *a, const uint16_t *b, int64_t n, us_dtype dt = US_BF16) {
    std::vector<float> x(n), y(n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = dt == US_F16 ? us_f16_to_f32(a[i]) : us_bf16_to_f32(a[i]);
        y[i] = dt == US_F16 ? us_f16_to_f32(b[i]) : us_bf16_to_f32(b[i]);
    }
    return rel(x.data(), y.data(), n);
}

template <typename E, int HS>
static void chain(const char *name, int NH, int NKV, int B, int Tq, int Tk, int nb,
                  const int32_t *qpos, const int32_t *kpos) {
    const us_dtype dt = std::is_same<E, __half>::value ? US_F16 : US_BF16;
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KVW = (int64_t)2 * NKV * HS, AO = (int64_t)NH * HS,
            nq = (int64_t)B * Tq, rows = (int64_t)B * NH * Tq;
    float *q = rnd(nq * QKV, 1), *kvf = rnd((int64_t)nb * B * Tk * KVW, 1), *dy = rnd(nq * AO, 1);
    uint16_t *hq = tobf(q, nq * QKV, dt), *hkv = tobf(kvf, (int64_t)nb * B * Tk * KVW, dt),
             *hdy = tobf(dy, nq * AO, dt);
    float *st = rnd(rows * HS, 100);
    std::vector<float> cacc(st, st + rows * HS), gacc(cacc), cm(st, st + rows), gm(cm),
        cl(st + rows, st + 2 * rows), gl(cl);
    std::vector<uint16_t> co(nq * AO), go(nq * AO);
    std::vector<float> cls(rows), gls(rows);
    float *dq0 = rnd(nq * AO, 0.1f), *dkv0 = rnd((int64_t)nb * B * Tk * KVW, 0.1f);
    std::vector<float> cdq(dq0, dq0 + nq * AO), gdq(cdq),
        cdkv(dkv0, dkv0 + (int64_t)nb * B * Tk * KVW), gdkv(cdkv);
    int64_t kvn = (int64_t)B * Tk * KVW;
    for (int s = 0; s < nb; s++) {
        C.attn_block_fwd(&C, cacc.data(), cm.data(), cl.data(), hq, hkv + s * kvn, qpos,
                         kpos + s * Tk, B, Tq, Tk, NH, NKV, HS, s == 0, dt);
        emu_block_fwd<E, HS>(gacc.data(), gm.data(), gl.data(), (const E *)hq,
                             (const E *)(hkv + s * kvn), qpos, kpos + s * Tk, B, Tq, Tk, NH, NKV,
                             s == 0);
    }
    double e1 = rel(gm.data(), cm.data(), rows), e2 = rel(gl.data(), cl.data(), rows),
           e3 = rel(gacc.data(), cacc.data(), rows * HS);
    C.attn_block_finish(&C, co.data(), cls.data(), cacc.data(), cm.data(), cl.data(), B, Tq, NH, HS,
                        dt);
    C.attn_block_finish(&C, go.data(), gls.data(), gacc.data(), gm.data(), gl.data(), B, Tq, NH, HS,
                        dt); /* finish on the CPU from the emulated state */
    double e4 = relbf(go.data(), co.data(), nq * AO, dt), e5 = rel(gls.data(), cls.data(), rows);
    for (int s = 0; s < nb; s++) {
        C.attn_block_bwd(&C, cdq.data(), cdkv.data() + s * kvn, hdy, hq, co.data(), cls.data(),
                         hkv + s * kvn, qpos, kpos + s * Tk, B, Tq, Tk, NH, NKV, HS, dt);
        emu_block_bwd<E, HS>(gdq.data(), gdkv.data() + s * kvn, (const E *)hdy, (const E *)hq,
                             (const E *)co.data(), cls.data(), (const E *)(hkv + s * kvn), qpos,
                             kpos + s * Tk, B, Tq, Tk, NH, NKV);
    }
    double e6 = rel(gdq.data(), cdq.data(), nq * AO), e7 = rel(gdkv.data(), cdkv.data(), nb * kvn);
    /* bf16 rounding of P and dS gives ~2e-3; fp16's 3 more bits ~3e-4, so a bf16 rounding
       left in the fp16 path would show */
    const double tl = dt == US_F16 ? 2e-3 : 1e-2;
    CHECK(e1 < tl && e2 < tl && e3 < tl && e4 < tl && e5 < tl && e6 < tl && e7 < tl,
          "%-26s %s HS%d %d/%d B%d Tq%d Tk%d x%d: m %.1e l %.1e acc %.1e out %.1e lse %.1e dq %.1e "
          "dkv %.1e",
          name, us_dtype_name(dt), HS, NH, NKV, B, Tq, Tk, nb, e1, e2, e3, e4, e5, e6, e7);
    fflush(stdout);
    free(q);
    free(kvf);
    free(dy);
    free(hq);
    free(hkv);
    free(hdy);
    free(st);
    free(dq0);
    free(dkv0);
}

template <typename E, int HS>
static void ring_case(int NH, int NKV, int B, int cp, int c, int zigzag, int r) {
    int T = zigzag ? 2 * c : c;
    std::vector<int32_t> qp(T), kp((size_t)cp * T);
    for (int s = 0; s < cp; s++) {
        int src = (r - s + cp) % cp;
        for (int t = 0; t < T; t++) {
            int p = !zigzag ? src * c + t : t < c ? src * c + t : (2 * cp - 1 - src) * c + (t - c);
            kp[(size_t)s * T + t] = p;
            if (src == r) qp[t] = p;
        }
    }
    char name[64];
    snprintf(name, sizeof name, "%s cp%d r%d", zigzag ? "zig-zag" : "ring", cp, r);
    chain<E, HS>(name, NH, NKV, B, T, T, cp, qp.data(), kp.data());
}

template <typename E, int HS>
static void any_case(int Tq, int Tk) {
    int nb = 4;
    std::vector<int32_t> qp(Tq), kp((size_t)nb * Tk);
    for (int i = 0; i < Tq; i++) qp[i] = (int32_t)(rnd64() % 300);
    qp[7] = -5;
    for (int i = 0; i < Tk; i++) {
        kp[i] = 1000 + i;
        kp[Tk + i] = (int32_t)(rnd64() % 300);
        kp[2 * Tk + i] = (int32_t)(rnd64() % 300);
        kp[3 * Tk + i] = (int32_t)(rnd64() % 5) - 4;
    }
    chain<E, HS>("any positions", 4, 1, 2, Tq, Tk, nb, qp.data(), kp.data());
}

template <int HS>
static void causal_case(int B, int T, int NH, int NKV) {
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, AO = (int64_t)NH * HS, N = (int64_t)B * T;
    float *q = rnd(N * QKV, 1), *dy = rnd(N * AO, 1);
    uint16_t *hq = tobf(q, N * QKV), *hdy = tobf(dy, N * AO);
    std::vector<uint16_t> co(N * AO), go(N * AO), cd(N * QKV), gd(N * QKV);
    std::vector<float> cl((size_t)B * NH * T), gl(cl.size());
    C.attention_fwd(&C, co.data(), cl.data(), hq, B, T, NH, NKV, HS, US_BF16);
    {
        constexpr int MW = us__fa_cfg<HS>::fwd_mw, BC = us__fa_cfg<HS>::fwd_bc,
                      MINB = us__fa_cfg<HS>::fwd_minb;
        size_t smem = (size_t)(64 * MW + 4 * BC) * us__fa_dims<HS>::lds * 2;
        emu_launch(
            {(unsigned)NH, (unsigned)B, (unsigned)((T + 64 * MW - 1) / (64 * MW))}, smem, [&] {
                us__flash_fwd_kernel<HS, MW, BC, MINB>((const bf *)hq, (bf *)go.data(), gl.data(),
                                                       T, NH, NKV, LOG2E / sqrtf((float)HS));
            });
    }
    double e1 = relbf(go.data(), co.data(), N * AO), e2 = rel(gl.data(), cl.data(), B * NH * T);
    C.attention_bwd(&C, cd.data(), hdy, hq, co.data(), cl.data(), B, T, NH, NKV, HS, US_BF16);
    std::vector<float> D((size_t)B * NH * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                float acc = 0;
                for (int d = 0; d < HS; d++)
                    acc += us_bf16_to_f32(hdy[((int64_t)(b * T + t) * NH + h) * HS + d]) *
                           us_bf16_to_f32(co[((int64_t)(b * T + t) * NH + h) * HS + d]);
                D[((size_t)b * NH + h) * T + t] = acc;
            }
    const float scale = 1.f / sqrtf((float)HS), sl2 = scale * LOG2E;
    {
        constexpr int KW = us__fa_cfg<HS>::kv_kw, BR = us__fa_cfg<HS>::kv_br,
                      MINB = us__fa_cfg<HS>::kv_minb;
        emu_launch({(unsigned)NKV, (unsigned)B, (unsigned)((T + 64 * KW - 1) / (64 * KW))},
                   us__fa_dkdv_smem<HS, KW, BR>(), [&] {
                       us__flash_bwd_dkdv_kernel<HS, KW, BR, MINB>(
                           (const bf *)hdy, (const bf *)hq, cl.data(), D.data(), (bf *)gd.data(), T,
                           NH, NKV, scale, sl2);
                   });
    }
    {
        constexpr int MW = us__fa_cfg<HS>::dq_mw, BC = us__fa_cfg<HS>::dq_bc,
                      MINB = us__fa_cfg<HS>::dq_minb;
        emu_launch({(unsigned)NH, (unsigned)B, (unsigned)((T + 64 * MW - 1) / (64 * MW))},
                   (size_t)(2 * 64 * MW + 4 * BC) * us__fa_dims<HS>::lds * 2, [&] {
                       us__flash_bwd_dq_kernel<HS, MW, BC, MINB>(
                           (const bf *)hdy, (const bf *)hq, cl.data(), D.data(), (bf *)gd.data(), T,
                           NH, NKV, scale, sl2);
                   });
    }
    double e3 = relbf(gd.data(), cd.data(), N * QKV);
    CHECK(e1 < 1e-2 && e2 < 1e-2 && e3 < 1e-2,
          "causal flash (the GPU-tested kernels) HS%d B%d T%d %d/%d: out %.1e lse %.1e dqkv %.1e",
          HS, B, T, NH, NKV, e1, e2, e3);
    free(q);
    free(dy);
    free(hq);
    free(hdy);
}

int main(int argc, char **argv) {
    C = us_cpu_ops(1);
    us_test_verbose = 1;
    int which = argc > 1 ? atoi(argv[1]) : -1;
    /* (NH, NKV, B, cp, chunk, zig-zag, rank): ring cp 3 rank 1 sees its own block, all of rank
       0's and none of rank 2's; zig-zag chunks of 37 or 101 leave tile tails */
    if (which < 0 || which == 0) ring_case<bf, 64>(4, 2, 1, 3, 40, 0, 1);
    if (which < 0 || which == 1) ring_case<bf, 64>(4, 2, 1, 3, 30, 0, 0);
    if (which < 0 || which == 2) ring_case<bf, 64>(4, 2, 1, 2, 37, 1, 0);
    if (which < 0 || which == 3) ring_case<bf, 128>(4, 2, 1, 2, 37, 1, 1);
    if (which < 0 || which == 4) ring_case<bf, 128>(4, 2, 1, 3, 40, 0, 1);
    if (which < 0 || which == 5) any_case<bf, 64>(150, 77);
    if (which < 0 || which == 6) any_case<bf, 128>(150, 77);
    if (which < 0 || which == 7) ring_case<bf, 128>(2, 2, 1, 2, 101, 1, 0);
    if (which < 0 || which == 8) causal_case<64>(1, 100, 4, 2);
    if (which < 0 || which == 9) causal_case<128>(1, 150, 2, 1);
    /* fp16 at the first two head sizes, then every other head size in both orders and types */
    if (which < 0 || which == 10) ring_case<__half, 64>(4, 2, 1, 3, 40, 0, 1);
    if (which < 0 || which == 11) ring_case<__half, 128>(4, 1, 1, 2, 37, 1, 1);
    if (which < 0 || which == 12) ring_case<bf, 80>(4, 1, 1, 3, 40, 0, 1);
    if (which < 0 || which == 13) ring_case<__half, 80>(4, 2, 1, 2, 37, 1, 0);
    if (which < 0 || which == 14) ring_case<__half, 96>(2, 2, 1, 3, 40, 0, 1);
    if (which < 0 || which == 15) ring_case<bf, 96>(4, 1, 1, 2, 37, 1, 1);
    if (which < 0 || which == 16) ring_case<bf, 192>(4, 2, 1, 3, 40, 0, 1);
    if (which < 0 || which == 17) ring_case<__half, 192>(4, 1, 1, 2, 37, 1, 0);
    if (which < 0 || which == 18) ring_case<__half, 256>(4, 2, 1, 3, 40, 0, 1);
    if (which < 0 || which == 19) ring_case<bf, 256>(2, 1, 1, 2, 37, 1, 1);
    if (which < 0 || which == 20) any_case<__half, 80>(150, 77);
    if (which < 0 || which == 21) any_case<bf, 256>(150, 77);
    return us_test_done("emu");
}
