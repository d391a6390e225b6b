/* test_cp_ops.c — attention by key blocks with global positions, the building block of context
   parallelism (issue 6): the sequence is split over cp ranks (contiguous chunks, or zig-zag:
   chunks r and 2·cp−1−r), each rank's queries visit every rank's key block in ring order with
   the online-softmax state carried across blocks, and the result must equal whole-sequence
   attention: outputs, log-sum-exps, and (backward) dQ, dK, dV, with each key block's gradients
   summed over the ranks that read it. fp32, relative error ≤ 1e-5. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define B 2
#define T 24
#define NH 4
#define NKV 2
#define HS 8
#define QKV ((NH + 2 * NKV) * HS)
#define KVW (2 * NKV * HS)

static double relerr(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        num += (double)(a[i] - b[i]) * (a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* positions of rank r's Tl tokens: contiguous, or zig-zag halves r and 2cp-1-r */
static void positions(int cp, int zigzag, int r, int32_t *pos) {
    int Tl = T / cp, half = Tl / 2, i;
    for (i = 0; i < Tl; i++)
        pos[i] = !zigzag    ? r * Tl + i
                 : i < half ? r * half + i
                            : (2 * cp - 1 - r) * half + (i - half);
}

int main(int argc, char **argv) {
    us_ops o = us_cpu_ops(1);
    float *qkv = (float *)malloc(sizeof(float) * B * T * QKV),
          *out = (float *)malloc(sizeof(float) * B * T * NH * HS);
    float *dout = (float *)malloc(sizeof(float) * B * T * NH * HS),
          *dqkv = (float *)malloc(sizeof(float) * B * T * QKV);
    float lse[B * NH * T];
    int cp, zz, i;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (i = 0; i < B * T * QKV; i++) qkv[i] = (float)(rnd01() * 2 - 1);
    for (i = 0; i < B * T * NH * HS; i++) dout[i] = (float)(rnd01() * 2 - 1);
    o.attention_fwd(&o, out, lse, qkv, B, T, NH, NKV, HS, US_F32); /* the whole sequence */
    o.attention_bwd(&o, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HS, US_F32);
    for (cp = 2; cp <= 4; cp *= 2)
        for (zz = 0; zz <= 1; zz++) {
            int Tl = T / cp, r, s, b, t;
            double e_out = 0, e_lse = 0, e_dq = 0, e_dkv = 0;
            float *dkv_sum = (float *)calloc((size_t)cp * B * Tl * KVW, sizeof(float));
            for (r = 0; r < cp; r++) {
                int32_t qpos[T], kpos[T];
                float *q = (float *)malloc(sizeof(float) * B * Tl * QKV),
                      *o_r = (float *)malloc(sizeof(float) * B * Tl * NH * HS);
                float *do_r = (float *)malloc(sizeof(float) * B * Tl * NH * HS),
                      *dq = (float *)calloc((size_t)B * Tl * NH * HS, sizeof(float));
                float *acc = (float *)malloc(sizeof(float) * B * NH * Tl * HS),
                      *m = (float *)malloc(sizeof(float) * B * NH * Tl);
                float *l = (float *)malloc(sizeof(float) * B * NH * Tl),
                      *lse_r = (float *)malloc(sizeof(float) * B * NH * Tl);
                float *kv = (float *)malloc(sizeof(float) * B * Tl * KVW),
                      *ref = (float *)malloc(sizeof(float) * B * Tl * NH * HS);
                positions(cp, zz, r, qpos);
                for (b = 0; b < B; b++)
                    for (t = 0; t < Tl; t++) {
                        memcpy(q + (b * Tl + t) * QKV, qkv + (b * T + qpos[t]) * QKV,
                               sizeof(float) * QKV);
                        memcpy(do_r + (b * Tl + t) * NH * HS, dout + (b * T + qpos[t]) * NH * HS,
                               sizeof(float) * NH * HS);
                    }
                for (s = 0; s < cp; s++) { /* ring order: own block first, then r-1, r-2, ... */
                    int src = (r - s + cp) % cp;
                    positions(cp, zz, src, kpos);
                    for (b = 0; b < B; b++)
                        for (t = 0; t < Tl; t++)
                            memcpy(kv + (b * Tl + t) * KVW, qkv + (b * T + kpos[t]) * QKV + NH * HS,
                                   sizeof(float) * KVW);
                    o.attn_block_fwd(&o, acc, m, l, q, kv, qpos, kpos, B, Tl, Tl, NH, NKV, HS,
                                     s == 0, US_F32);
                }
                o.attn_block_finish(&o, o_r, lse_r, acc, m, l, B, Tl, NH, HS, US_F32);
                for (b = 0; b < B; b++)
                    for (t = 0; t < Tl; t++) {
                        int h;
                        memcpy(ref + (b * Tl + t) * NH * HS, out + (b * T + qpos[t]) * NH * HS,
                               sizeof(float) * NH * HS);
                        for (h = 0; h < NH; h++) {
                            double d = fabs(lse_r[(b * NH + h) * Tl + t] -
                                            lse[(b * NH + h) * T + qpos[t]]);
                            if (d > e_lse) e_lse = d;
                        }
                    }
                if (relerr(o_r, ref, B * Tl * NH * HS) > e_out)
                    e_out = relerr(o_r, ref, B * Tl * NH * HS);
                for (s = 0; s < cp;
                     s++) { /* backward: the same blocks; dK/dV summed per key block */
                    int src = (r - s + cp) % cp;
                    positions(cp, zz, src, kpos);
                    for (b = 0; b < B; b++)
                        for (t = 0; t < Tl; t++)
                            memcpy(kv + (b * Tl + t) * KVW, qkv + (b * T + kpos[t]) * QKV + NH * HS,
                                   sizeof(float) * KVW);
                    o.attn_block_bwd(&o, dq, dkv_sum + (size_t)src * B * Tl * KVW, do_r, q, o_r,
                                     lse_r, kv, qpos, kpos, B, Tl, Tl, NH, NKV, HS, US_F32);
                }
                for (b = 0; b < B; b++)
                    for (t = 0; t < Tl; t++)
                        memcpy(ref + (b * Tl + t) * NH * HS, dqkv + (b * T + qpos[t]) * QKV,
                               sizeof(float) * NH * HS);
                if (relerr(dq, ref, B * Tl * NH * HS) > e_dq)
                    e_dq = relerr(dq, ref, B * Tl * NH * HS);
                free(q);
                free(o_r);
                free(do_r);
                free(dq);
                free(acc);
                free(m);
                free(l);
                free(lse_r);
                free(kv);
                free(ref);
            }
            for (s = 0; s < cp;
                 s++) { /* each key block's gradient, summed over every rank's queries */
                int32_t kpos[T];
                float *ref = (float *)malloc(sizeof(float) * B * Tl * KVW);
                positions(cp, zz, s, kpos);
                for (b = 0; b < B; b++)
                    for (t = 0; t < Tl; t++)
                        memcpy(ref + (b * Tl + t) * KVW, dqkv + (b * T + kpos[t]) * QKV + NH * HS,
                               sizeof(float) * KVW);
                if (relerr(dkv_sum + (size_t)s * B * Tl * KVW, ref, B * Tl * KVW) > e_dkv)
                    e_dkv = relerr(dkv_sum + (size_t)s * B * Tl * KVW, ref, B * Tl * KVW);
                free(ref);
            }
            CHECK(e_out < 1e-5 && e_lse < 1e-5,
                  "cp %d %s: ring of key blocks = whole-sequence attention (out rel %.1e, lse abs "
                  "%.1e)",
                  cp, zz ? "zig-zag" : "contiguous", e_out, e_lse);
            CHECK(e_dq < 1e-5 && e_dkv < 1e-5,
                  "cp %d %s: backward by blocks = whole-sequence backward (dQ rel %.1e, dK|dV rel "
                  "%.1e)",
                  cp, zz ? "zig-zag" : "contiguous", e_dq, e_dkv);
            free(dkv_sum);
        }
    { /* the zig-zag point: causal work per rank (visible query-key pairs) is even */
        int r, j;
        for (cp = 2; cp <= 4; cp *= 2) {
            long work[2][4] = {{0}}, mx[2] = {0, 0}, mn[2] = {1L << 40, 1L << 40};
            for (zz = 0; zz <= 1; zz++)
                for (r = 0; r < cp; r++) {
                    int32_t qp[T];
                    positions(cp, zz, r, qp);
                    for (i = 0; i < T / cp; i++)
                        for (j = 0; j < T; j++) work[zz][r] += j <= qp[i];
                    if (work[zz][r] > mx[zz]) mx[zz] = work[zz][r];
                    if (work[zz][r] < mn[zz]) mn[zz] = work[zz][r];
                }
            CHECK(mx[1] == mn[1] && mx[0] > mn[0],
                  "cp %d: zig-zag gives every rank %ld causal pairs; contiguous ranges %ld..%ld",
                  cp, mx[1], mn[0], mx[0]);
        }
    }
    free(qkv);
    free(out);
    free(dout);
    free(dqkv);
    return us_test_done("test_cp_ops");
}
