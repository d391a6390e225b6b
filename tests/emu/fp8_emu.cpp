/* fp8_emu.cpp — SwiGLU's backward with dgu's two FP8 operands (us__k_swiglu_bwd_fp8, // >>cuda-fp8)
   run on the CPU (us_cuda_emu.h) against the unfused pair the CUDA backend runs otherwise,
   us__k_swiglu_bwd_vec then us__k_fp8_row_t with both operands (fp8_quantize_both's ROW128
   path), emulated the same way, and against the CPU ops' fp8_quantize_both of that dgu: dgu, the
   1×128 and the 128×1 operands, bytes and scales, bit for bit; and the same of SwiGLU's forward
   with h's two operands (us__k_swiglu_fwd_fp8t against us__k_swiglu_fwd_vec then the
   quantiser); fp32 and bf16, pow2 on and off, token counts that are and are not multiples of 128
   (the kernels' FULL and bounds-checked tile paths), several tiles both ways; fp16 on two
   shapes; and us__k_fp8_row_t alone against the CPU's fp8_quantize (trans 1) and
   fp8_quantize_both, odd and partial shapes. The emulator's __expf is expf and its __fdividef a
   division, the same in both paths, so the comparison is of the kernels' tiling, staging and
   layouts (the GPU's own test is test_cuda --fp8). `make fp8-emu` (needs the CUDA headers, not a
   GPU). */
#define ULTRASCALE_IMPLEMENTATION
#include "../../ultrascale.h"
#include "us_cuda_emu.h"
#include <cuda_fp8.h>

#define __expf expf /* (glibc declares an __expf of its own, not exported) */
#define __fdividef(a, b) ((a) / (b))
static const emu_dim3 emu_bdim = {256, 1, 1}; /* the kernels read it where they run 256 threads */
#define blockDim emu_bdim

struct us__no_epi {
    void operator()(const float *, int64_t, int64_t, bool) const {}
};

#include "fp8_kernels_emu.h" /* made by extract_fp8.py */
#include "../us_test.h"

static void *amalloc(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

template <typename T>
static int one_case(int fwd, int64_t N, int64_t F, int pow2, int keep, us_dtype dt) {
    int64_t C2 = fwd ? F : 2 * F, Np = (N + 127) / 128 * 128, i;
    int64_t ns = us_fp8_scales_size(US_FP8_ROW128, N, C2),
            nst = us_fp8_scales_size(US_FP8_ROW128, C2, N);
    size_t bytes[4] = {(size_t)(N * C2), (size_t)ns * 4, (size_t)(C2 * Np), (size_t)nst * 4};
    T *gu = (T *)amalloc((size_t)(2 * N * F) * sizeof(T)),
      *dh = (T *)amalloc((size_t)(N * F) * sizeof(T));
    T *ref = (T *)amalloc((size_t)(N * C2) * sizeof(T)),
      *out = (T *)amalloc((size_t)(N * C2) * sizeof(T)); /* dgu [N][2F], or h [N][F] */
    char *b[3][4];
    int k, j, ok = 1;
    for (i = 0; i < 2 * N * F; i++)
        us__st(gu, i, (float)((rnd01() * 2 - 1) * (fwd && i % 67 == 0 ? 60.0 : 4.0)));
    for (i = 0; i < N * F; i++) us__st(dh, i, (float)((rnd01() * 2 - 1) * (i % 61 ? 1.0 : 300.0)));
    memset(out, 0x5a, (size_t)(N * C2) * sizeof(T));
    for (k = 0; k < 3; k++)
        for (j = 0; j < 4; j++) {
            b[k][j] = (char *)amalloc(bytes[j]);
            memset(b[k][j], 0x5a, bytes[j]);
        }
    /* the unfused pair, as us__cuda_swiglu_bwd (fwd) and us__cuda_fp8_quantize_both launch them */
    emu_launch(
        {(unsigned)((F / us__vec<T>::W + 255) / 256), (unsigned)N, 1}, 0,
        [&] {
            if (fwd)
                us__k_swiglu_fwd_vec<T>(ref, gu, N, F);
            else
                us__k_swiglu_bwd_vec<T>(ref, dh, gu, N, F);
        },
        256);
    emu_launch(
        {(unsigned)((C2 + 127) / 128), (unsigned)(Np / 128), 1}, us__fp8_row_t_smem<T>(),
        [&] {
            us__k_fp8_row_t<T>((uint8_t *)b[0][2], (float *)b[0][3], ref, C2, N, Np, pow2, 3, NULL,
                               (uint8_t *)b[0][0], (float *)b[0][1]);
        },
        256);
    /* the fused kernel, as us__cuda_swiglu_bwd_fp8 (fwd) launches it */
    if (fwd)
        emu_launch(
            {(unsigned)(F / 128), (unsigned)(Np / 128), 1}, us__swiglu_fwd_fp8_smem<T>(),
            [&] {
                us__k_swiglu_fwd_fp8t<T>(keep ? out : NULL, (uint8_t *)b[1][2], (float *)b[1][3],
                                         (uint8_t *)b[1][0], (float *)b[1][1], gu, N, F, Np, pow2,
                                         3);
            },
            256);
    else
        emu_launch(
            {(unsigned)(F / 128), (unsigned)(Np / 128), 1}, us__swiglu_bwd_fp8_smem<T>(),
            [&] {
                us__k_swiglu_bwd_fp8<T>(keep ? out : NULL, (uint8_t *)b[1][2], (float *)b[1][3],
                                        (uint8_t *)b[1][0], (float *)b[1][1], dh, gu, N, F, Np,
                                        pow2, 3);
            },
            512);
    /* the CPU's quantisation of the emulated dgu */
    us_ops C = us_cpu_ops(1);
    C.fp8_quantize_both(&C, (uint8_t *)b[2][0], (float *)b[2][1], (uint8_t *)b[2][2],
                        (float *)b[2][3], ref, dt, N, C2, US_FP8_ROW128, pow2);
    /* fp16: fused against unfused only; the CPU's quantiser takes fp32 and bf16 x only (as
       us_fp8_quantize says: FP8 training runs in bf16), so it writes nothing to compare */
    for (j = 0; j < 4; j++)
        ok &= !memcmp(b[0][j], b[1][j], bytes[j]) &&
              (dt == US_F16 || !memcmp(b[0][j], b[2][j], bytes[j]));
    if (keep) ok &= !memcmp(ref, out, (size_t)(N * C2) * sizeof(T));
    CHECK(ok,
          "us__k_swiglu_%s %s N %lld F %lld pow2=%d %s %s: %sthe 1x128 and 128x1 operands = "
          "swiglu_%s then fp8_quantize_both's kernel (and the CPU's but fp16), bit for bit",
          fwd ? "fwd_fp8t" : "bwd_fp8", us_dtype_name(dt), (long long)N, (long long)F, pow2,
          fwd ? "h" : "dgu", keep ? "stored" : "NULL", keep ? "the output and " : "",
          fwd ? "fwd" : "bwd");
    for (k = 0; k < 3; k++)
        for (j = 0; j < 4; j++) free(b[k][j]);
    free(gu);
    free(dh);
    free(ref);
    free(out);
    return ok;
}

/* us__k_fp8_row_t alone, as us__cuda_fp8_launch runs it for ROW128 with trans (x [L][R]): the
   128×1 operand and, with both, x's own 1×128 one, against the CPU's fp8_quantize (trans 1) or
   fp8_quantize_both, bit for bit. vec 0 (R odd) takes the scalar loads and the byte stores; L and
   R not multiples of 128 the bounds-checked tile path. */
template <typename T>
static int rowt_case(int64_t L, int64_t R, int both, int pow2, int vec, us_dtype dt) {
    int64_t Lp = (L + 127) / 128 * 128, Rp = (R + 127) / 128 * 128, i;
    size_t bytes[4] = {(size_t)(R * Lp), (size_t)us_fp8_scales_size(US_FP8_ROW128, R, L) * 4,
                       (size_t)(L * Rp), (size_t)us_fp8_scales_size(US_FP8_ROW128, L, R) * 4};
    T *x = (T *)amalloc((size_t)(L * R) * sizeof(T));
    char *b[2][4];
    int k, j, ok = 1;
    us_ops C = us_cpu_ops(1);
    for (i = 0; i < L * R; i++) us__st(x, i, (float)((rnd01() * 2 - 1) * (i % 37 ? 4.0 : 900.0)));
    for (k = 0; k < 2; k++)
        for (j = 0; j < 4; j++) {
            b[k][j] = (char *)amalloc(bytes[j]);
            memset(b[k][j], 0x5a, bytes[j]);
        }
    emu_launch(
        {(unsigned)(Rp / 128), (unsigned)(Lp / 128), 1}, us__fp8_row_t_smem<T>(),
        [&] {
            us__k_fp8_row_t<T>((uint8_t *)b[0][0], (float *)b[0][1], x, R, L, Lp, pow2, vec, NULL,
                               both ? (uint8_t *)b[0][2] : NULL, both ? (float *)b[0][3] : NULL);
        },
        256);
    if (both)
        C.fp8_quantize_both(&C, (uint8_t *)b[1][2], (float *)b[1][3], (uint8_t *)b[1][0],
                            (float *)b[1][1], x, dt, L, R, US_FP8_ROW128, pow2);
    else
        C.fp8_quantize(&C, (uint8_t *)b[1][0], (float *)b[1][1], x, dt, L, R, US_FP8_ROW128, 1,
                       pow2);
    for (j = 0; j < (both ? 4 : 2); j++) ok &= !memcmp(b[0][j], b[1][j], bytes[j]);
    CHECK(ok,
          "us__k_fp8_row_t %s L %lld R %lld vec %d pow2=%d: the 128x1 operand%s = the CPU's, bit "
          "for bit",
          us_dtype_name(dt), (long long)L, (long long)R, vec, pow2, both ? " and x's 1x128" : "");
    for (k = 0; k < 2; k++)
        for (j = 0; j < 4; j++) free(b[k][j]);
    free(x);
    return ok;
}

int main(int argc, char **argv) {
    static const int64_t shapes[4][2] = {{37, 128}, {300, 256}, {256, 384}, {129, 128}};
    int s, c, fwd;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (fwd = 0; fwd < 2; fwd++) {
        for (s = 0; s < 4; s++)
            for (c = 0; c < 4; c++) { /* pow2, keep */
                one_case<float>(fwd, shapes[s][0], shapes[s][1], c / 2, c % 2, US_F32);
                one_case<__nv_bfloat16>(fwd, shapes[s][0], shapes[s][1], c / 2, c % 2, US_BF16);
            }
        /* fp16 (the 1×128 amax over packed 16-bit patterns, as bf16's), whole and partial
           patches */
        for (s = 1; s < 3; s++) one_case<__half>(fwd, shapes[s][0], shapes[s][1], 0, 0, US_F16);
    }
    /* the transposed quantiser alone: odd sizes (scalar path), partial patches both ways */
    static const int64_t rt[4][3] = {{131, 203, 0}, {300, 256, 3}, {37, 132, 3}, {256, 384, 3}};
    for (s = 0; s < 4; s++)
        for (c = 0; c < 4; c++) { /* both, pow2 */
            rowt_case<float>(rt[s][0], rt[s][1], c % 2, c / 2, (int)rt[s][2], US_F32);
            rowt_case<__nv_bfloat16>(rt[s][0], rt[s][1], c % 2, c / 2, (int)rt[s][2], US_BF16);
        }
    return us_test_done("fp8_emu");
}
