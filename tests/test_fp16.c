/* test_fp16.c — fp16 mixed precision and loss scaling (// >>lossscale): fp16 training follows
   fp32 on the built-in task; an injected overflow (a huge first scale) skips steps, leaves every
   weight and moment bitwise unchanged and halves S until training proceeds; the dynamic scale
   follows its rule (halve on overflow, double after `window` clean steps); a power-of-two static
   scale is neutral: fp32 and bf16 runs with S = 2^10 end bit for bit where S = 1 runs do;
   the CPU fp16 GEMM equals an fp64 reference rounded once; data-parallel ranks (ZeRO-1, ZeRO-2)
   agree on every skip with each other and with one rank; bad loss-scale settings are refused. */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include "us_test.h"
#include "us_test_ranks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static us_model_config task_model(void) {
    us_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.dim = 32;
    mc.n_layers = 2;
    mc.n_heads = 4;
    return mc;
}

static us_train_config task_train(us_precision p, int steps) {
    us_train_config tc;
    memset(&tc, 0, sizeof tc);
    tc.batch = 8;
    tc.seq = 2 * US_TASK_LINE - 1;
    tc.steps = steps;
    tc.lr = 1e-2f;
    tc.warmup = 10;
    tc.seed = 11;
    tc.threads = 1;
    tc.precision = p;
    return tc;
}

/* runs `steps` steps of the task; returns the mean loss of the last 10 (NaN on an error) */
static double run_task(us_model *m, int steps, int *nskipped) {
    us_task task;
    size_t n = (size_t)m->tc.batch * m->tc.seq;
    int32_t *in = (int32_t *)malloc(n * 4), *tgt = (int32_t *)malloc(n * 4);
    double tail = 0;
    int s, k = 0;
    us_task_init(&task, m->tc.seed);
    if (nskipped) *nskipped = 0;
    for (s = 0; s < steps; s++) {
        us_step_stats st;
        us_task_batch(&task, m->tc.batch, m->tc.seq, in, tgt);
        if (us_train_step(m, in, tgt, &st) != US_OK) {
            printf("  step %d: %s\n", s + 1, us_model_error(m));
            tail = NAN;
            break;
        }
        if (nskipped) *nskipped += st.skipped;
        if (s >= steps - 10) {
            tail += st.loss;
            k++;
        }
    }
    free(in);
    free(tgt);
    return k ? tail / k : tail;
}

/* fp16 (dynamic scaling) learns the task like fp32 */
static void test_converges(void) {
    us_model_config mc = task_model();
    us_model m32, m16;
    us_train_config t32 = task_train(US_PRECISION_FP32, 120),
                    t16 = task_train(US_PRECISION_FP16, 120);
    double l32, l16, first;
    int sk = 0;
    CHECK(us_model_init(&m32, &mc, &t32, NULL) == US_OK, "init fp32: %s", us_model_error(&m32));
    CHECK(us_model_init(&m16, &mc, &t16, NULL) == US_OK, "init fp16: %s", us_model_error(&m16));
    CHECK(m16.dt == US_F16 && m16.ls_dynamic && m16.loss_scale == 65536.0f,
          "fp16: dt %s, dynamic %d, first S %g (want fp16, 1, 65536)", us_dtype_name(m16.dt),
          m16.ls_dynamic, m16.loss_scale);
    CHECK(m32.loss_scale == 1.0f && !m32.ls_dynamic, "fp32: no loss scaling by default (S %g)",
          m32.loss_scale);
    first = log(256.0);
    l32 = run_task(&m32, 120, NULL);
    l16 = run_task(&m16, 120, &sk);
    printf("  task, 120 steps: mean loss of the last 10: fp32 %.4f, fp16 %.4f (%d skipped, S now "
           "%g)\n",
           l32, l16, sk, m16.loss_scale);
    CHECK(l32 < 0.5 * first, "fp32 learns: %.4f < %.4f", l32, 0.5 * first);
    CHECK(fabs(l16 - l32) < 0.05 * l32 + 0.02, "fp16 ends within 5%% + 0.02 of fp32: %.4f vs %.4f",
          l16, l32);
    CHECK(m16.step + sk == 120, "steps taken %d + skipped %d = 120", m16.step, sk);
    us_model_free(&m32);
    us_model_free(&m16);
}

/* S = 2^40: the first steps overflow (fp16's max is 65504) and are skipped, bit for bit */
static void test_overflow_skips(void) {
    us_model_config mc = task_model();
    us_train_config tc = task_train(US_PRECISION_FP16, 40);
    us_model m;
    us_task task;
    size_t n = (size_t)tc.batch * tc.seq, nw, nf;
    int32_t *in = (int32_t *)malloc(n * 4), *tgt = (int32_t *)malloc(n * 4);
    void *w0;
    float *master0, *m0, *v0;
    int s, skipped = 0, bad_rule = 0, unchanged = 1, first_ok = -1;
    double loss_first = 0, loss_last = 0;
    CHECK(us_model_init(&m, &mc, &tc, NULL) == US_OK, "init: %s", us_model_error(&m));
    m.loss_scale = ldexpf(1, 40); /* the test hook: the scaler's state is the model's */
    nw = (size_t)m.n_flat * us_dtype_size(m.dt);
    nf = (size_t)m.n_flat * 4;
    w0 = malloc(nw);
    master0 = (float *)malloc(nf);
    m0 = (float *)malloc(nf);
    v0 = (float *)malloc(nf);
    us_task_init(&task, tc.seed);
    for (s = 0; s < 40; s++) {
        us_step_stats st;
        float S = m.loss_scale;
        int step0 = m.step;
        memcpy(w0, m.w, nw);
        memcpy(master0, m.master, nf);
        memcpy(m0, m.adam_m, nf);
        memcpy(v0, m.adam_v, nf);
        us_task_batch(&task, tc.batch, tc.seq, in, tgt);
        if (us_train_step(&m, in, tgt, &st) != US_OK) {
            CHECK(0, "step %d: %s", s + 1, us_model_error(&m));
            break;
        }
        if (st.loss_scale != S) bad_rule++;
        if (st.skipped) {
            skipped++;
            if (memcmp(w0, m.w, nw) || memcmp(master0, m.master, nf) || memcmp(m0, m.adam_m, nf) ||
                memcmp(v0, m.adam_v, nf) || m.step != step0)
                unchanged = 0;
            if (m.loss_scale != 0.5f * S || isfinite(st.grad_norm)) bad_rule++;
        } else {
            if (first_ok < 0) first_ok = s;
            if (!memcmp(master0, m.master, nf) || m.step != step0 + 1 || m.loss_scale != S ||
                !isfinite(st.grad_norm))
                bad_rule++;
        }
        if (st.skipped_total != skipped) bad_rule++;
        if (s == 0) loss_first = st.loss;
        loss_last = st.loss;
    }
    printf("  S = 2^40: %d steps skipped (S then 2^%d), the first update at step %d; loss %.3f -> "
           "%.3f\n",
           skipped, (int)log2(m.loss_scale), first_ok + 1, loss_first, loss_last);
    /* the first step's target logit gets dlogit ≈ -S/valid (p ≈ 1/256): finite in fp16 only once
       S/valid < 65520, so at least 40 - log2(65536·B·T) of the halvings are needed */
    CHECK(skipped >= 40 - (int)ceil(log2(65536.0 * (double)n)) && skipped <= 30,
          "%d steps skipped from S = 2^40: at least %d (S/valid must come below fp16's max) and at "
          "most 30",
          skipped, 40 - (int)ceil(log2(65536.0 * (double)n)));
    CHECK(first_ok == skipped,
          "every skip came first, then only clean steps (first update at step %d, %d skipped)",
          first_ok + 1, skipped);
    CHECK(unchanged,
          "a skipped step leaves weights, master, moments and the step count bitwise unchanged");
    CHECK(bad_rule == 0,
          "S halves on each skip and stays on clean steps (window 2000); skipped_total counts: %d "
          "violations",
          bad_rule);
    CHECK(m.loss_scale == ldexpf(1, 40 - skipped), "S = 2^(40 - skipped) = 2^%d (got %g)",
          40 - skipped, m.loss_scale);
    CHECK(m.step == 40 - skipped, "m.step = %d counts only the updates (%d)", m.step, 40 - skipped);
    CHECK(loss_last < loss_first - 0.5, "training proceeds after the skips: loss %.3f -> %.3f",
          loss_first, loss_last);
    free(in);
    free(tgt);
    free(w0);
    free(master0);
    free(m0);
    free(v0);
    us_model_free(&m);
}

/* the dynamic rule with a short window: S doubles after `window` clean steps, halves on a skip */
static void test_growth(void) {
    us_model_config mc = task_model();
    us_train_config tc = task_train(US_PRECISION_FP16, 24);
    us_model m;
    us_task task;
    size_t n = (size_t)tc.batch * tc.seq;
    int32_t *in = (int32_t *)malloc(n * 4), *tgt = (int32_t *)malloc(n * 4);
    int s, good = 0, bad = 0, doubled = 0;
    float want;
    tc.loss_scale_window = 3;
    CHECK(us_model_init(&m, &mc, &tc, NULL) == US_OK, "init: %s", us_model_error(&m));
    m.loss_scale = 8.0f; /* small: no overflow, so it grows */
    want = 8.0f;
    us_task_init(&task, tc.seed);
    for (s = 0; s < 24; s++) {
        us_step_stats st;
        us_task_batch(&task, tc.batch, tc.seq, in, tgt);
        if (us_train_step(&m, in, tgt, &st) != US_OK) {
            CHECK(0, "step %d: %s", s + 1, us_model_error(&m));
            break;
        }
        if (st.loss_scale != want) bad++;
        if (st.skipped) {
            want *= 0.5f;
            good = 0;
        } else if (++good == 3) {
            want *= 2.0f;
            good = 0;
            doubled++;
        }
    }
    CHECK(bad == 0 && m.loss_scale == want,
          "window 3: S follows halve-on-skip / double-after-3-clean (%d mismatches, S %g want %g)",
          bad, m.loss_scale, want);
    CHECK(doubled >= 6, "S doubled %d times in 24 steps (from 8)", doubled);
    free(in);
    free(tgt);
    us_model_free(&m);
}

/* a static S = 2^10 changes no bit of the fp32 master or the moments, in fp32 and in bf16 (whose
   exponent range is fp32's: nothing underflows) — with grad accumulation and clipping on */
static void test_neutral(us_precision p) {
    us_model_config mc = task_model();
    us_model a, b;
    us_train_config ta = task_train(p, 6), tb;
    size_t nf;
    ta.grad_accum = 2;
    ta.grad_clip = 0.5f;
    tb = ta;
    tb.loss_scale = 1024.0f;
    CHECK(us_model_init(&a, &mc, &ta, NULL) == US_OK && us_model_init(&b, &mc, &tb, NULL) == US_OK,
          "init %s", us_precision_name(p));
    CHECK(b.loss_scale == 1024.0f && !b.ls_dynamic, "static S = %g", b.loss_scale);
    {
        us_task task;
        size_t n = (size_t)2 * ta.batch * ta.seq;
        int32_t *in = (int32_t *)malloc(n * 4), *tgt = (int32_t *)malloc(n * 4);
        int s, clipped = 0;
        us_task_init(&task, 5);
        for (s = 0; s < 6; s++) {
            us_step_stats sa, sb;
            us_task_batch(&task, 2 * ta.batch, ta.seq, in, tgt);
            if (us_train_step(&a, in, tgt, &sa) != US_OK ||
                us_train_step(&b, in, tgt, &sb) != US_OK) {
                CHECK(0, "step");
                break;
            }
            clipped += sa.grad_norm > 0.5f;
            CHECK(sa.grad_norm == sb.grad_norm && !sb.skipped,
                  "%s step %d: unscaled grad norm %.9g equals the scaled run's %.9g",
                  us_precision_name(p), s + 1, sa.grad_norm, sb.grad_norm);
        }
        CHECK(clipped > 0, "%s: clipping was active on %d of 6 steps", us_precision_name(p),
              clipped);
        free(in);
        free(tgt);
    }
    nf = (size_t)a.n_flat * 4;
    CHECK(!memcmp(a.master, b.master, nf) && !memcmp(a.adam_m, b.adam_m, nf) &&
              !memcmp(a.adam_v, b.adam_v, nf),
          "%s: S = 2^10 leaves master weights and moments bitwise equal to S = 1 after 6 steps",
          us_precision_name(p));
    us_model_free(&a);
    us_model_free(&b);
}

/* the CPU GEMM with fp16 operands and output: fp32 accumulation, one rounding */
static void test_gemm_f16(void) {
    us_ops o = us_cpu_ops(1);
    int64_t M = 37, N = 45, K = 300, i, j,
            k; /* K > KC: the fp32 workspace path; N > 16: full vector tiles */
    uint16_t *A = (uint16_t *)malloc((size_t)M * K * 2), *B = (uint16_t *)malloc((size_t)N * K * 2),
             *C = (uint16_t *)malloc((size_t)M * N * 2);
    int bad = 0, tb;
    for (i = 0; i < M * K; i++) A[i] = us_f32_to_f16((float)(rnd01() * 2 - 1));
    for (i = 0; i < N * K; i++) B[i] = us_f32_to_f16((float)(rnd01() * 2 - 1));
    for (tb = 0; tb < 2; tb++) {
        for (i = 0; i < M * N; i++) C[i] = us_f32_to_f16((float)(rnd01() - 0.5));
        {
            uint16_t *C0 = (uint16_t *)malloc((size_t)M * N * 2);
            memcpy(C0, C, (size_t)M * N * 2);
            o.gemm(&o, 0, tb, M, N, K, 0.5f, A, US_F16, K, B, US_F16, tb ? K : N, 1.0f, C, US_F16,
                   N);
            for (i = 0; i < M; i++)
                for (j = 0; j < N; j++) {
                    double ref = 0, got = us_f16_to_f32(C[i * N + j]), ulp;
                    for (k = 0; k < K; k++)
                        ref += (double)us_f16_to_f32(A[i * K + k]) *
                               us_f16_to_f32(tb ? B[j * K + k] : B[k * N + j]);
                    ref = 0.5 * ref + us_f16_to_f32(C0[i * N + j]);
                    ulp = ldexp(1.0, (fabs(ref) < ldexp(1, -14) ? -14 : ilogb(ref)) - 10);
                    if (fabs(got - ref) > 0.5 * ulp + 1e-5 * fabs(ref) + 1e-6)
                        bad++; /* one rounding + fp32 summation */
                }
            free(C0);
        }
        CHECK(bad == 0,
              "fp16 GEMM (tb=%d) within half an fp16 ulp of the fp64 reference (+ fp32 summation): "
              "%d bad",
              tb, bad);
    }
    free(A);
    free(B);
    free(C);
}

/* data parallelism: each rank sees only its gradients' shard (ZeRO-2) but the overflow decision is
   the global norm's, so every rank skips the same steps, as one rank with the whole batch does */
#define DP_STEPS 24

typedef struct {
    us_train_config tc;
    int skipped[2][DP_STEPS];
    float S[2][DP_STEPS], loss[2][DP_STEPS];
} dp_run;

static us_result dp_rank(us_comm *c, void *arg) {
    dp_run *R = (dp_run *)arg;
    us_model_config mc = task_model();
    us_train_config tc = R->tc;
    us_model m;
    us_task task;
    int rank = c ? c->world.rank : 0, dp = tc.dp, s;
    size_t per = (size_t)(tc.batch / dp) * tc.seq, all = (size_t)tc.batch * tc.seq;
    int32_t *in = (int32_t *)malloc(all * 4), *tgt = (int32_t *)malloc(all * 4);
    us_result r;
    tc.batch /= dp;
    r = dp > 1 ? us_model_init_dist(&m, &mc, &tc, NULL, c) : us_model_init(&m, &mc, &tc, NULL);
    if (r != US_OK) {
        printf("  rank %d init: %s\n", rank, m.err);
        free(in);
        free(tgt);
        return r;
    }
    m.loss_scale = ldexpf(1, 40);
    us_task_init(&task, 3);
    for (s = 0; s < DP_STEPS && r == US_OK; s++) {
        us_step_stats st;
        us_task_batch(&task, tc.batch * dp, tc.seq, in,
                      tgt); /* the global batch; this rank's rows */
        if ((r = us_train_step(&m, in + rank * per, tgt + rank * per, &st)) != US_OK) {
            printf("  rank %d: %s\n", rank, m.err);
            break;
        }
        R->skipped[rank][s] = st.skipped;
        R->S[rank][s] = st.loss_scale;
        R->loss[rank][s] = st.loss;
    }
    us_model_free(&m);
    free(in);
    free(tgt);
    return r;
}

static void test_dp_agree(int zero) {
    dp_run one, two;
    int s, same = 1, nskip = 0;
    float worst = 0;
    memset(&one, 0, sizeof one);
    one.tc = task_train(US_PRECISION_FP16, DP_STEPS);
    one.tc.dp = 1;
    two = one;
    two.tc.dp = 2;
    two.tc.zero = zero;
    CHECK(us_test_launch(1, dp_rank, &one, NULL, 0) == US_OK, "one rank");
    CHECK(us_test_launch(2, dp_rank, &two, NULL, 0) == US_OK, "dp=2 zero=%d", zero);
    for (s = 0; s < DP_STEPS; s++) {
        if (two.skipped[0][s] != one.skipped[0][s] || two.skipped[1][s] != one.skipped[0][s] ||
            two.S[0][s] != one.S[0][s] || two.S[1][s] != one.S[0][s])
            same = 0;
        nskip += one.skipped[0][s];
        if (fabsf(two.loss[0][s] - one.loss[0][s]) / one.loss[0][s] > worst)
            worst = fabsf(two.loss[0][s] - one.loss[0][s]) / one.loss[0][s];
    }
    CHECK(same && nskip >= 10,
          "dp=2 ZeRO-%d, S = 2^40: both ranks skip one rank's %d steps and follow its S", zero,
          nskip);
    CHECK(worst < 1e-3f,
          "dp=2 ZeRO-%d fp16: losses within 1e-3 relative of one rank's (worst %.2e)", zero, worst);
}

static void test_validation(void) {
    us_model_config mc = task_model();
    us_train_config tc = task_train(US_PRECISION_FP16, 10);
    char err[256];
    tc.loss_scale = -1;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "loss scale"),
          "negative loss scale refused: %s", err);
    tc.loss_scale = INFINITY;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID,
          "infinite loss scale refused: %s", err);
    tc.loss_scale = 0;
    tc.loss_scale_window = -3;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID && strstr(err, "window"),
          "negative window refused: %s", err);
    tc.loss_scale_window = 0;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK && tc.loss_scale_window == 2000,
          "window defaults to 2000 (%d)", tc.loss_scale_window);
    CHECK(strcmp(us_precision_name(US_PRECISION_FP16), "fp16") == 0, "precision name %s",
          us_precision_name(US_PRECISION_FP16));
}

int main(int argc, char **argv) {
    us_test_rs = 0x1234567ull;
    int quick =
        argc > 1 && strcmp(argv[1], "--quick") == 0; /* the sanitizer run: no convergence run */
    us_test_verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    test_validation();
    test_gemm_f16();
    test_neutral(US_PRECISION_FP32);
    test_neutral(US_PRECISION_BF16);
    test_growth();
    test_overflow_skips();
    test_dp_agree(1);
    test_dp_agree(2);
    if (!quick) test_converges();
    return us_test_done("test_fp16");
}
