/* grouped_emu.cpp — the grouped GEMM kernel of ultrascale_cuda.cuh (// >>cuda-grouped) run on the
   CPU (us_cuda_emu.h) against the CPU ops' grouped GEMM (one GEMM per group): Fprop, Dgrad and
   Wgrad in bf16 and fp16; groups that are empty, shorter than a tile and several tiles long, with
   rows between them that no group owns (which must keep their bytes), row strides wider than the
   rows, and more groups than one launch's table holds. `make grouped-emu` (needs the CUDA
   headers, not a GPU); `build/grouped_emu N` runs case N only. */
#define ULTRASCALE_IMPLEMENTATION
#include "../../ultrascale.h"
#include "us_cuda_emu.h"
#include "flash_kernels_emu.h"  /* the fragment helpers the kernel shares (extract_flash.py) */
#include "grouped_kernel_emu.h" /* made by extract_grouped.py */
#include "../us_test.h"

static us_ops C;

static uint16_t to16(float x, us_dtype dt) {
    return dt == US_F16 ? us_f32_to_f16(x) : us_f32_to_bf16(x);
}

static float from16(uint16_t v, us_dtype dt) {
    return dt == US_F16 ? us_f16_to_f32(v) : us_bf16_to_f32(v);
}

/* the kernel on every tile of every launch the CUDA backend would make */
template <typename T, int MODE>
static void emu_grouped(int G, const int64_t *off, const int64_t *n, int64_t N, int64_t K,
                        const void *X, int64_t ldx, void *const *W, void *Y, int64_t ldy) {
    size_t smem = us__gg_smem_bytes(MODE != US_GG_WGRAD, MODE == US_GG_FPROP);
    for (int g0 = 0; g0 < G; g0 += US__GG_CAP) {
        us__gg_table t;
        int64_t tiles = us__gg_fill(&t, MODE, G - g0, off + g0, n + g0, N, K, W + g0);
        if (tiles <= 0) continue;
        emu_launch(
            {(unsigned)tiles, 1, 1}, smem,
            [&] { us__k_gemm_grouped<T, MODE>(t, (const T *)X, ldx, (T *)Y, ldy, N, K); }, 256);
    }
}

template <typename T>
static void emu_mode(int mode, int G, const int64_t *off, const int64_t *n, int64_t N, int64_t K,
                     const void *X, int64_t ldx, void *const *W, void *Y, int64_t ldy) {
    if (mode == US_GG_FPROP)
        emu_grouped<T, US_GG_FPROP>(G, off, n, N, K, X, ldx, W, Y, ldy);
    else if (mode == US_GG_DGRAD)
        emu_grouped<T, US_GG_DGRAD>(G, off, n, N, K, X, ldx, W, Y, ldy);
    else
        emu_grouped<T, US_GG_WGRAD>(G, off, n, N, K, X, ldx, W, Y, ldy);
}

/* One case: G groups of n[g] rows, gap rows between neighbours; X [R][K] (row stride K + 8),
   Y [R][N] (row stride N + 16). Fprop / Dgrad compare all of Y (the rows and columns no group
   writes must keep their bytes); Wgrad compares every W[g]. */
static void gg_case(const char *name, int mode, us_dtype dt, int G, const int64_t *n, int gap,
                    int64_t N, int64_t K) {
    static const char *mname[3] = {"Fprop", "Dgrad", "Wgrad"};
    int64_t ldx = K + 8, ldy = N + 16, R = 0, g, i;
    std::vector<int64_t> off(G);
    std::vector<char> owned; /* rows some group writes */
    for (g = 0; g < G; g++) {
        off[g] = R;
        R += n[g] + gap;
        owned.insert(owned.end(), (size_t)n[g], 1);
        owned.insert(owned.end(), (size_t)gap, 0);
    }
    std::vector<uint16_t> X(R * ldx), Yc(R * ldy), Yg;
    std::vector<std::vector<uint16_t>> W16(G);
    std::vector<std::vector<float>> Wc(G), Wg;
    std::vector<void *> wc(G), wg(G);
    for (i = 0; i < R * ldx; i++) X[i] = to16((float)(2 * rnd01() - 1), dt);
    for (i = 0; i < R * ldy; i++) Yc[i] = to16((float)(2 * rnd01() - 1), dt);
    for (g = 0; g < G; g++) {
        if (mode == US_GG_WGRAD) {
            Wc[g].resize(N * K);
            for (i = 0; i < N * K; i++) Wc[g][i] = (float)(2 * rnd01() - 1);
        } else {
            W16[g].resize(N * K);
            for (i = 0; i < N * K; i++) W16[g][i] = to16((float)(2 * rnd01() - 1), dt);
        }
    }
    Yg = Yc;
    Wg = Wc;
    for (g = 0; g < G; g++) {
        wc[g] = mode == US_GG_WGRAD ? (void *)Wc[g].data() : (void *)W16[g].data();
        wg[g] = mode == US_GG_WGRAD ? (void *)Wg[g].data() : (void *)W16[g].data();
    }
    us__gemm_grouped_each(&C, mode, G, off.data(), n, N, K, X.data(), ldx, wc.data(), Yc.data(),
                          ldy, dt);
    if (dt == US_BF16)
        emu_mode<__nv_bfloat16>(mode, G, off.data(), n, N, K, X.data(), ldx, wg.data(), Yg.data(),
                                ldy);
    else
        emu_mode<__half>(mode, G, off.data(), n, N, K, X.data(), ldx, wg.data(), Yg.data(), ldy);
    double num = 0, den = 0;
    int64_t moved = 0; /* bytes outside the groups' outputs that changed */
    if (mode == US_GG_WGRAD)
        for (g = 0; g < G; g++)
            for (i = 0; i < N * K; i++) {
                double a = Wg[g][i], b = Wc[g][i];
                num += (a - b) * (a - b);
                den += b * b;
                moved += a != a;
            }
    else
        for (i = 0; i < R * ldy; i++) {
            double a = from16(Yg[i], dt), b = from16(Yc[i], dt);
            num += (a - b) * (a - b);
            den += b * b;
            moved += (i % ldy >= N || !owned[i / ldy]) && Yg[i] != Yc[i];
        }
    double e = sqrt(num / (den > 0 ? den : 1));
    CHECK(e < (mode == US_GG_WGRAD ? 1e-5 : 1e-2) && moved == 0,
          "%-22s %s %s G=%d N=%lld K=%lld: rel err %.2e, %lld bytes outside the groups changed",
          name, mname[mode], dt == US_F16 ? "fp16" : "bf16", G, (long long)N, (long long)K, e,
          (long long)moved);
    fflush(stdout);
}

int main(int argc, char **argv) {
    static const int64_t mixed[5] = {37, 0, 128, 200, 3}, one[1] = {300};
    std::vector<int64_t> many(300);
    int which = argc > 1 ? atoi(argv[1]) : -1, k = 0, mode;
    C = us_cpu_ops(1);
    us_test_verbose = 1;
    for (int i = 0; i < 300; i++) many[i] = (int64_t)(rnd64() % 10);
    for (mode = 0; mode < 3; mode++)
        for (int f = 0; f < 2; f++, k++)
            if (which < 0 || which == k)
                gg_case("empty, short, long", mode, f ? US_F16 : US_BF16, 5, mixed, 2, 136, 72);
    if (which < 0 || which == k++) /* two launches of the table */
        gg_case("300 groups", US_GG_FPROP, US_BF16, 300, many.data(), 0, 8, 16);
    if (which < 0 || which == k++)
        gg_case("300 groups", US_GG_WGRAD, US_BF16, 300, many.data(), 1, 16, 8);
    if (which < 0 || which == k++) /* a reduction over 10 stages, a partial last one */
        gg_case("one group of 300 rows", US_GG_WGRAD, US_F16, 1, one, 0, 64, 40);
    if (which < 0 || which == k++)
        gg_case("one group of 300 rows", US_GG_DGRAD, US_BF16, 1, one, 0, 264, 40);
    return us_test_done("grouped_emu");
}
