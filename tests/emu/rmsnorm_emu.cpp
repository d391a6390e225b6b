/* rmsnorm_emu.cpp — RMSNorm's one-pass backward (us__k_rmsnorm_bwd_vec, // >>cuda-kernels) run on
   the CPU (us_cuda_emu.h) against the CPU ops' rmsnorm_bwd: dx (added into what dx held) and dw
   (the blocks' parts of 32 rows added in order, as us__k_rmsnorm_bwd_dw_sum adds them, into what
   dw held), to the tolerances test_cuda uses; fp32, bf16 and fp16; row counts that are and are not
   multiples of a block's 32 rows; widths whose vectors fill the block's threads and widths that
   leave some idle. part starts as NaN, so a part the kernel does not write shows. `make
   rmsnorm-emu` (needs the CUDA headers, not a GPU). */
#define ULTRASCALE_IMPLEMENTATION
#include "../../ultrascale.h"
#include "us_cuda_emu.h"

static emu_dim3 emu_bdim = {32, 1, 1}; /* each launch's threads (us__row_threads) */
#define blockDim emu_bdim

#include "rmsnorm_kernel_emu.h" /* made by extract_rmsnorm.py */
#include "../us_test.h"

static void *amalloc(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

/* ‖a − b‖ / ‖b‖ over n elements of T (both on the host) */
template <typename T>
static double relerr(const T *a, const T *b, int64_t n) {
    double num = 0, den = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double u = us__ld(a, i), v = us__ld(b, i);
        if (u != u || v != v) return INFINITY;
        num += (u - v) * (u - v);
        den += v * v;
    }
    return sqrt(num / (den > 0 ? den : 1));
}

template <typename T>
static int one_case(int64_t N, int64_t C, us_dtype dt) {
    const int W = us__vec<T>::W, nv = (int)(C / W);
    const int th = ((nv + US__ROW_RV - 1) / US__ROW_RV + 31) / 32 * 32; /* as us__row_threads */
    const int64_t nb = (N + US__RMS_FROWS - 1) / US__RMS_FROWS;
    const double tol = dt == US_F32 ? 2e-5 : 1e-2;
    T *x = (T *)amalloc((size_t)(N * C) * sizeof(T)),
      *dy = (T *)amalloc((size_t)(N * C) * sizeof(T));
    T *w = (T *)amalloc((size_t)C * sizeof(T)), *out = (T *)amalloc((size_t)(N * C) * sizeof(T));
    T *dxc = (T *)amalloc((size_t)(N * C) * sizeof(T)),
      *dxe = (T *)amalloc((size_t)(N * C) * sizeof(T));
    float *rstd = (float *)amalloc((size_t)N * 4), *dwc = (float *)amalloc((size_t)C * 4);
    float *dwe = (float *)amalloc((size_t)C * 4), *part = (float *)amalloc((size_t)(nb * C) * 4);
    us_ops cpu = us_cpu_ops(1);
    double ex, ew;
    int64_t i, b;
    for (i = 0; i < N * C; i++) {
        us__st(x, i, (float)(rnd01() * 2 - 1));
        us__st(dy, i, (float)(rnd01() * 2 - 1));
        us__st(dxc, i, (float)(rnd01() * 2 - 1)); /* what dx held: the kernel adds into it */
        us__st(dxe, i, us__ld(dxc, i));
    }
    for (i = 0; i < C; i++) {
        us__st(w, i, (float)(rnd01() * 2));
        dwc[i] = dwe[i] = (float)(rnd01() * 2 - 1);
    }
    for (i = 0; i < nb * C; i++) part[i] = NAN;
    cpu.rmsnorm_fwd(&cpu, out, rstd, x, w, N, C, 1e-5f, dt); /* rstd as the forward leaves it */
    cpu.rmsnorm_bwd(&cpu, dxc, dwc, dy, x, w, rstd, N, C, dt);
    emu_bdim.x = (unsigned)th;
    emu_launch(
        {(unsigned)nb, 1, 1}, 0, [&] { us__k_rmsnorm_bwd_vec<T>(dxe, part, dy, x, w, rstd, N, C); },
        th);
    for (b = 0; b < nb; b++) /* us__k_rmsnorm_bwd_dw_sum's job, in order */
        for (i = 0; i < C; i++) dwe[i] += part[b * C + i];
    ex = relerr(dxe, dxc, N * C);
    ew = relerr(dwe, dwc, C);
    CHECK(ex <= tol && ew <= 2e-5,
          "us__k_rmsnorm_bwd_vec %s N %lld C %lld (%d threads, %lld blocks): dx rel err %.2e, dw "
          "%.2e against the CPU",
          us_dtype_name(dt), (long long)N, (long long)C, th, (long long)nb, ex, ew);
    free(x);
    free(dy);
    free(w);
    free(out);
    free(dxc);
    free(dxe);
    free(rstd);
    free(dwc);
    free(dwe);
    free(part);
    return ex <= tol && ew <= 2e-5;
}

int main(int argc, char **argv) {
    /* rows: one block, a block and a tail, several; widths: the block's threads full (2048: 128
       of bf16's, 256 of fp32's) or partly idle (64, 200) */
    static const int64_t shapes[5][2] = {{1, 64}, {32, 200}, {74, 64}, {100, 200}, {33, 2048}};
    int s;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (s = 0; s < 5; s++) {
        one_case<float>(shapes[s][0], shapes[s][1], US_F32);
        one_case<__nv_bfloat16>(shapes[s][0], shapes[s][1], US_BF16);
        one_case<__half>(shapes[s][0], shapes[s][1], US_F16);
    }
    return us_test_done("rmsnorm_emu");
}
