/* test_cp.c — context parallelism on CPU threads: cp 2 and 4 in each mode (ring over contiguous
   chunks, zig-zag ring, all-gather), dp 2 × cp 2 with ZeRO-1 and tp 2 × cp 2 (+ sp), and with
   pipeline parallelism (cp 2 × pp 2 under 1F1B, ZB-H1, interleaved, DualPipe-V; tp 2 × pp 2 ×
   cp 2 and dp 2 × pp 2 × cp 2 on 8 threads) must reproduce the single-rank run over STEPS
   steps: losses, gradient norms and (without tp or pp, which shard them) final weights;
   per-rank memory equals the estimator; the all-gather variant's memory is the larger; bad
   sequence lengths are refused with a sentence. Generation with a KV cache under each mesh:
   every rank decodes the whole sequence past seq, with one rank's logits.

   Tolerance (fp32): attention's softmax is merged block by block in another order, and the
   gradients are summed over dp×cp: losses and gradient norms within 2e-5 relative, weights within
   1e-4 absolute after STEPS AdamW steps at lr 1e-2 (1% of one step; see test_tp.c). */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include "us_test.h"
#include "us_test_ranks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 3
#define GB 4
#define T 24
#define GL 32 /* positions of the generation check */

typedef struct run {
    us_model_config mc;
    us_train_config tc;
    int32_t *in, *tgt; /* [STEPS][GB][T] */
    float loss[STEPS], gnorm[STEPS];
    float *w; /* rank 0's final weights (ZeRO 0/1 keep them whole), one-rank layout when tp = 1 */
    int64_t nw;
    us_memory mem[8], est[8];
    /* generation (// >>sample) when gen is set: each rank's logits after each of the first GL
       tokens of in, decoded with the KV cache (a prompt of 5, then one token a step, past T) */
    int gen;
    float gen_lg[8][GL - 4][64];
} run;

/* Teacher-forced decoding of in[0..GL): the logits after positions 4 .. GL-1 into lg. */
static us_result rank_gen(us_model *m, const int32_t *in, float (*lg)[64]) {
    us_gen g;
    us_result r = us_gen_init(&g, m, 1, GL);
    int t;
    if (r == US_OK) r = us_gen_forward(&g, in, 5, lg[0]);
    for (t = 5; t < GL && r == US_OK; t++) r = us_gen_forward(&g, in + t, 1, lg[t - 4]);
    us_gen_free(&g);
    return r;
}

static us_result rank_fn(us_comm *c, void *arg) {
    run *R = (run *)arg;
    us_model m;
    us_train_config tc = R->tc;
    int rank = c ? c->world.rank : 0, s, b, t, Tl = T / tc.cp;
    int B = GB / tc.dp, M = tc.grad_accum > 1 ? tc.grad_accum : 1;
    int32_t *in = (int32_t *)malloc((size_t)B * Tl * 4),
            *tgt = (int32_t *)malloc((size_t)B * Tl * 4), pos[T];
    us_result r;
    tc.batch = B / M; /* [M][B/M][Tl]: the rank's B sequences in order, as M micro-batches */
    r = c ? us_model_init_dist(&m, &R->mc, &tc, NULL, c) : us_model_init(&m, &R->mc, &tc, NULL);
    if (r != US_OK) {
        printf("  rank %d init: %s\n", rank, m.err);
        free(in);
        free(tgt);
        return r;
    }
    us_memory_estimate(&R->mc, &tc, &R->est[rank], NULL, 0);
    R->mem[rank] = m.mem;
    us_cp_positions(&m.tc, m.mesh.cp_rank, pos);
    for (s = 0; s < STEPS && r == US_OK; s++) {
        us_step_stats st;
        for (b = 0; b < B; b++) /* this rank's sequences (dp), its positions in each (cp) */
            for (t = 0; t < Tl; t++) {
                size_t src = ((size_t)s * GB + (size_t)m.mesh.dp_rank * B + b) * T + pos[t];
                in[b * Tl + t] = R->in[src];
                tgt[b * Tl + t] = R->tgt[src];
            }
        r = us_train_step(&m, in, tgt, &st);
        if (r != US_OK) {
            printf("  rank %d step %d: %s\n", rank, s, m.err);
            break;
        }
        if (rank == 0) {
            R->loss[s] = st.loss;
            R->gnorm[s] = st.grad_norm;
        }
    }
    if (r == US_OK && rank == 0 && R->w && m.tc.zero < 3 && m.tc.tp == 1 &&
        m.tc.pp <= 1) { /* whole weights, by tensor */
        int i;
        int64_t k = 0;
        for (i = 0; i < m.n_params_t; i++) {
            memcpy(R->w + k, (float *)m.w + m.params[i].offset, (size_t)m.params[i].numel * 4);
            k += m.params[i].numel;
        }
    }
    if (r == US_OK && R->gen && (r = rank_gen(&m, R->in, R->gen_lg[rank])) != US_OK)
        printf("  rank %d generation: %s\n", rank, m.err);
    us_model_free(&m);
    free(in);
    free(tgt);
    return r;
}

static us_result launch(run *R) {
    return us_test_launch(R->tc.dp * R->tc.cp * R->tc.tp * (R->tc.pp > 1 ? R->tc.pp : 1), rank_fn,
                          R, NULL, 0);
}

static void setup(run *R, int dp, int cp, int tp, us_cp_mode mode, int zero, int sp, int tied) {
    memset(R, 0, sizeof *R);
    R->mc.n_layers = 4;
    R->mc.dim = 32; /* 4: the interleaved and V pipelines put 2 chunks on each of 2 ranks */
    R->mc.n_heads = 4;
    R->mc.n_kv_heads = 2;
    R->mc.vocab = 64;
    R->mc.ffn_dim = 48;
    R->mc.tie_embeddings = tied;
    R->tc.batch = GB;
    R->tc.seq = T;
    R->tc.steps = STEPS;
    R->tc.lr = 1e-2f;
    R->tc.threads = 1;
    R->tc.seed = 9;
    R->tc.dp = dp;
    R->tc.cp = cp;
    R->tc.tp = tp;
    R->tc.cp_mode = mode;
    R->tc.zero = zero;
    R->tc.sp = sp;
}

int main(int argc, char **argv) {
    static const int cfg[][9] = {
        /* dp, cp, tp, mode, zero, sp, recompute, pp, schedule (pp: 2 micro-batches) */
        {1, 2, 1, US_CP_RING, 0, 0, 0, 1, 0},
        {1, 2, 1, US_CP_ZIGZAG, 0, 0, 0, 1, 0},
        {1, 2, 1, US_CP_ALLGATHER, 0, 0, 0, 1, 0},
        {1, 4, 1, US_CP_RING, 0, 0, 0, 1, 0},
        {1, 4, 1, US_CP_ZIGZAG, 0, 0, 2, 1, 0},
        {1, 4, 1, US_CP_ALLGATHER, 0, 0, 1, 1, 0},
        {2, 2, 1, US_CP_ZIGZAG, 1, 0, 0, 1, 0},
        {2, 2, 1, US_CP_RING, 3, 0, 0, 1, 0},
        {1, 2, 2, US_CP_ZIGZAG, 0, 0, 0, 1, 0},
        {1, 2, 2, US_CP_ALLGATHER, 0, 1, 0, 1, 0},
        {2, 2, 2, US_CP_ZIGZAG, 1, 0, 0, 1,
         0}, /* dp 2 × cp 2 × tp 2 on 8 threads (issue 13), ZeRO-1 */
        /* with pipeline parallelism (issue 13's tp 2 × pp 2 × cp 2 among them) */
        {1, 2, 1, US_CP_ZIGZAG, 0, 0, 0, 2, US_PP_1F1B},
        {1, 2, 2, US_CP_ZIGZAG, 0, 0, 0, 2, US_PP_1F1B},
        {1, 2, 2, US_CP_RING, 0, 1, 0, 2, US_PP_ZB1},
        {2, 2, 1, US_CP_ZIGZAG, 1, 0, 0, 2, US_PP_INTERLEAVED},
        {1, 2, 1, US_CP_ALLGATHER, 0, 0, 0, 2, US_PP_DUALPIPEV},
        {1, 2, 1, US_CP_ZIGZAG, 0, 0, 2, 2, US_PP_1F1B}};
    static const char *mode[] = {"", "ring", "zigzag", "allgather"};
    int ci, tied, s, a, quick = 0;
    double worst_l = 0, worst_w = 0;
    /* --quick (the sanitizer build): each configuration once, tied and untied taking turns */
    for (a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-v")) us_test_verbose = 1;
        if (!strcmp(argv[a], "--quick")) quick = 1;
    }
    for (tied = 0; tied <= 1; tied++) {
        run ref;
        int64_t n = (int64_t)STEPS * GB * T, i;
        setup(&ref, 1, 1, 1, US_CP_DEFAULT, 0, 0, tied);
        ref.in = (int32_t *)malloc((size_t)n * 4);
        ref.tgt = (int32_t *)malloc((size_t)n * 4);
        us_test_rs = 31 + tied;
        for (i = 0; i < n; i++) {
            ref.in[i] = (int32_t)(rnd64() % 64);
            ref.tgt[i] = rnd01() < 0.1 ? -1 : (int32_t)(rnd64() % 64);
        }
        ref.nw = us_param_count(&ref.mc);
        ref.w = (float *)malloc((size_t)ref.nw * 4);
        ref.gen = !tied;
        CHECK(launch(&ref) == US_OK, "reference: one rank (%s)", tied ? "tied" : "untied");
        for (ci = 0; ci < (int)(sizeof cfg / sizeof cfg[0]); ci++) {
            run R;
            double ml = 0, mw = 0;
            int64_t j;
            int whole = cfg[ci][4] < 3 && cfg[ci][2] == 1 &&
                        cfg[ci][7] == 1; /* rank 0 holds every weight whole */
            if (quick && ci % 2 != tied) continue;
            setup(&R, cfg[ci][0], cfg[ci][1], cfg[ci][2], (us_cp_mode)cfg[ci][3], cfg[ci][4],
                  cfg[ci][5], tied);
            R.tc.recompute = cfg[ci][6] == 2   ? US_RECOMPUTE_FULL
                             : cfg[ci][6] == 1 ? US_RECOMPUTE_SELECTIVE
                                               : US_RECOMPUTE_NONE;
            if (cfg[ci][7] > 1) {
                R.tc.pp = cfg[ci][7];
                R.tc.pp_schedule = cfg[ci][8];
                R.tc.grad_accum = cfg[ci][8] == US_PP_DUALPIPEV ? 4 : 2;
            } /* micro-batches of GB/dp/M */
            R.in = ref.in;
            R.tgt = ref.tgt;
            R.nw = ref.nw;
            R.w = (float *)calloc((size_t)ref.nw, 4);
            R.gen = !tied;
            if (launch(&R) != US_OK) {
                CHECK(0, "cfg %d ran", ci);
                free(R.w);
                continue;
            }
            for (s = 0; s < STEPS; s++) {
                double d = fabs(R.loss[s] - ref.loss[s]) / ref.loss[s],
                       g = fabs(R.gnorm[s] - ref.gnorm[s]) / ref.gnorm[s];
                if (d > ml) ml = d;
                if (g > ml) ml = g;
            }
            if (whole)
                for (j = 0; j < ref.nw; j++) {
                    double d = fabs(R.w[j] - ref.w[j]);
                    if (d > mw) mw = d;
                }
            if (ml > worst_l) worst_l = ml;
            if (mw > worst_w) worst_w = mw;
            CHECK(ml < 2e-5 && mw < 1e-4,
                  "dp %d x cp %d (%s) x tp %d%s x pp %d%s%s, ZeRO-%d, recompute %s, %s: %d steps "
                  "equal one rank (loss/norm rel %.1e, weights %s %.1e)",
                  cfg[ci][0], cfg[ci][1], mode[cfg[ci][3]], cfg[ci][2], cfg[ci][5] ? " + sp" : "",
                  cfg[ci][7], cfg[ci][7] > 1 ? " " : "",
                  cfg[ci][7] > 1 ? us_pp_kind_name((us_pp_kind)cfg[ci][8]) : "", cfg[ci][4],
                  us_recompute_name(R.tc.recompute), tied ? "tied" : "untied", STEPS, ml,
                  whole ? "abs" : "(sharded, not compared here; test_dp/test_tp/test_pp do)", mw);
            if (!tied) { /* every rank decodes the whole sequence: the same logits as one rank */
                int r, k, ranks = cfg[ci][0] * cfg[ci][1] * cfg[ci][2] * cfg[ci][7], same = 1;
                double e = 0;
                for (r = 0; r < ranks; r++) {
                    const float *a = &R.gen_lg[r][0][0], *b = &ref.gen_lg[0][0][0];
                    same &= !memcmp(R.gen_lg[r], R.gen_lg[0], sizeof R.gen_lg[0]);
                    for (k = 0; k < (GL - 4) * 64; k++)
                        if (fabs(a[k] - b[k]) > e) e = fabs(a[k] - b[k]);
                }
                CHECK(same && e < 1e-3,
                      "dp %d x cp %d x tp %d x pp %d: KV-cache decoding to position %d (seq %d) "
                      "gives every rank the same logits, within %.1e of one rank's",
                      cfg[ci][0], cfg[ci][1], cfg[ci][2], cfg[ci][7], GL, T, e);
            }
            if (!tied) {
                int r, ok = 1;
                /* the estimate is the first pipeline stage's: under pp, rank 0 (stage 0, cp rank 0) */
                for (r = 0; r < (cfg[ci][7] > 1 ? 1 : cfg[ci][0] * cfg[ci][1] * cfg[ci][2]); r++)
                    ok &= !memcmp(&R.mem[r], &R.est[r], sizeof(us_memory));
                CHECK(ok,
                      "dp %d x cp %d (%s) x tp %d x pp %d: every rank's memory equals the estimate "
                      "(rank 0 activations %zu, estimate %zu bytes)",
                      cfg[ci][0], cfg[ci][1], mode[cfg[ci][3]], cfg[ci][2], cfg[ci][7],
                      R.mem[0].activations, R.est[0].activations);
            }
            free(R.w);
        }
        free(ref.in);
        free(ref.tgt);
        free(ref.w);
    }
    printf("  observed: losses and gradient norms within %.2e relative, weights within %.2e "
           "absolute of one rank\n",
           worst_l, worst_w);
    { /* memory: cp divides the activations; the all-gather variant holds every block */
        us_model_config mc;
        us_train_config tc;
        us_memory a1, a4r, a4g;
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        mc.n_layers = 8;
        mc.dim = 512;
        mc.n_heads = 8;
        tc.seq = 8192;
        tc.batch = 1;
        us_memory_estimate(&mc, &tc, &a1, NULL, 0);
        tc.cp = 4;
        tc.cp_mode = US_CP_ZIGZAG;
        us_memory_estimate(&mc, &tc, &a4r, NULL, 0);
        tc.cp_mode = US_CP_ALLGATHER;
        us_memory_estimate(&mc, &tc, &a4g, NULL, 0);
        CHECK(a4r.activations * 3 < a1.activations && a4g.activations > a4r.activations,
              "seq 8192: activations per rank %.0f MiB at cp 1, %.0f MiB at cp 4 ring, %.0f MiB at "
              "cp 4 all-gather",
              a1.activations / 1048576.0, a4r.activations / 1048576.0, a4g.activations / 1048576.0);
    }
    { /* bad lengths */
        us_model_config mc;
        us_train_config tc;
        char err[200];
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        tc.seq = 20;
        tc.cp = 4;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "seq=20"),
              "seq 20 over cp 4 zig-zag: %s", err);
        tc.cp_mode = US_CP_RING;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK,
              "seq 20 over cp 4 ring is fine (5 tokens each)");
    }
    return us_test_done("test_cp");
}
