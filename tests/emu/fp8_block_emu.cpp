/* fp8_block_emu.cpp — the BLOCK128 quantiser (us__k_fp8_block, // >>cuda-fp8) run on the CPU
   (us_cuda_emu.h) against the CPU ops' fp8_quantize / fp8_quantize_both: bytes (padding columns
   included) and scales (padding scales included), bit for bit. P = x, P = xᵀ, and the weight
   cache's both-ways form (q and qt from one read); fp32 and bf16; pow2 on and off; shapes that are
   and are not multiples of 128; x read 8 at a time and one at a time (K % 8 != 0, x unaligned),
   q and qt stored 8 bytes at a time and byte by byte (unaligned); zero blocks (scale 1), an inf
   and a NaN (scale NaN). `make fp8-block-emu` (needs the CUDA headers, not a GPU). */
#define ULTRASCALE_IMPLEMENTATION
#include "../../ultrascale.h"
#include "us_cuda_emu.h"
#include <cuda_fp8.h>

#include "fp8_block_kernel_emu.h" /* made by extract_fp8_block.py */
#include "../us_test.h"

static int al(const void *p, unsigned bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }

/* the kernel on every block, launched as us__cuda_fp8_launch launches it (grid and vec bits) */
template <typename T>
static void emu_block(uint8_t *q, float *s, const T *x, int64_t M, int64_t K, int trans, int pow2,
                      uint8_t *qt, float *st) {
    int64_t R = trans ? K : M, L = trans ? M : K, Lp = (L + 127) / 128 * 128;
    int vec = (al(q, 16) ? 2 : 0) | (K % 8 == 0 && al(x, 16)) | (al(qt, 8) ? 4 : 0);
    emu_launch(
        {(unsigned)(Lp / 128), (unsigned)((R + 127) / 128), 1}, 0,
        [&] { us__k_fp8_block<T>(q, s, x, R, L, Lp, trans, pow2, vec, qt, st); }, 256);
}

static void *amalloc(size_t n) { return aligned_alloc(64, (n + 64) / 64 * 64 + 64); }

/* mode 0: q = BLOCK128 of x; 1: of xᵀ; 2: both (q of x, qt of xᵀ). off: x one element, q eight
   and qt four bytes past 64-byte alignment (the one-at-a-time loads and stores). special: the
   first block all zeros but for an inf; a NaN in the last block. */
template <typename T>
static int one_case(int64_t M, int64_t K, int mode, int pow2, int off, int special, us_dtype dt) {
    static const char *mname[3] = {"x", "x^T", "both"};
    int64_t Mp = (M + 127) / 128 * 128, Kp = (K + 127) / 128 * 128, i;
    int tr = mode == 1;
    size_t nq = (size_t)(tr ? K * Mp : M * Kp), nqt = (size_t)(K * Mp);
    size_t ns = (size_t)us_fp8_scales_size(US_FP8_BLOCK128, tr ? K : M, tr ? M : K) * 4,
           nst = (size_t)us_fp8_scales_size(US_FP8_BLOCK128, K, M) * 4;
    char *xb = (char *)amalloc((size_t)(M * K) * sizeof(T) + 16);
    T *x = (T *)xb + (off ? 1 : 0);
    uint8_t *b[2][4];
    size_t bytes[4] = {nq + 8, ns, nqt + 4, nst};
    int k, j, ok = 1;
    for (i = 0; i < M * K; i++) {
        int64_t r = i / K, c = i % K;
        float v = (float)((rnd01() * 2 - 1) * (i % 61 ? 1.0 : 300.0));
        if (special && r < 128 && c < 128) v = r == 3 && c == 5 ? INFINITY : 0.0f;
        if (special && i == M * K - 1) v = NAN;
        us__set(x, dt, i, v);
    }
    for (k = 0; k < 2; k++)
        for (j = 0; j < 4; j++) {
            b[k][j] = (uint8_t *)amalloc(bytes[j]);
            memset(b[k][j], 0x5a, bytes[j]);
        }
    for (k = 0; k < 2; k++) {
        uint8_t *q = b[k][0] + (off ? 8 : 0), *qt = b[k][2] + (off ? 4 : 0);
        float *s = (float *)b[k][1], *st = (float *)b[k][3];
        us_ops C = us_cpu_ops(1);
        if (k == 0 && mode == 2)
            emu_block<T>(q, s, x, M, K, 0, pow2, qt, st);
        else if (k == 0)
            emu_block<T>(q, s, x, M, K, tr, pow2, NULL, NULL);
        else if (mode == 2)
            C.fp8_quantize_both(&C, q, s, qt, st, x, dt, M, K, US_FP8_BLOCK128, pow2);
        else
            C.fp8_quantize(&C, q, s, x, dt, M, K, US_FP8_BLOCK128, tr, pow2);
    }
    for (j = 0; j < 4; j++) ok &= !memcmp(b[0][j], b[1][j], bytes[j]);
    CHECK(ok,
          "us__k_fp8_block %s %lld x %lld, BLOCK128 of %s, pow2=%d%s%s: bytes and scales = the "
          "CPU's, bit for bit",
          us_dtype_name(dt), (long long)M, (long long)K, mname[mode], pow2,
          off ? ", unaligned x, q, qt" : "", special ? ", zero block, inf, NaN" : "");
    for (k = 0; k < 2; k++)
        for (j = 0; j < 4; j++) free(b[k][j]);
    free(xb);
    return ok;
}

int main(int argc, char **argv) {
    static const int64_t shapes[4][2] = {{200, 300}, {256, 384}, {129, 260}, {1, 8}};
    int sh, mode, pow2;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (sh = 0; sh < 4; sh++)
        for (mode = 0; mode < 3; mode++)
            for (pow2 = 0; pow2 < 2; pow2++) {
                one_case<float>(shapes[sh][0], shapes[sh][1], mode, pow2, 0, 0, US_F32);
                one_case<__nv_bfloat16>(shapes[sh][0], shapes[sh][1], mode, pow2, 0, 0, US_BF16);
            }
    for (mode = 0; mode < 3; mode++) {
        one_case<float>(200, 304, mode, 1, 1, 0, US_F32);
        one_case<__nv_bfloat16>(200, 304, mode, 0, 1, 0, US_BF16);
        one_case<float>(256, 384, mode, 0, 0, 1, US_F32);
        one_case<__nv_bfloat16>(256, 384, mode, 1, 0, 1, US_BF16);
    }
    return us_test_done("fp8_block_emu");
}
