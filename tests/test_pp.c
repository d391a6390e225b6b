/* test_pp.c — pipeline parallelism on CPU threads: the executor runs AFAB and 1F1B over pp 2 and
   4 stages with several micro-batch counts, alone and with dp 2 (ZeRO-1) or tp 2, and must
   reproduce one rank with gradient accumulation over the same micro-batches: losses, gradient
   norms and final weights. Tied embeddings too: the last stage's copy of the table must equal
   the first stage's to the bit after training. The activations it actually held at once are
   measured: 1F1B keeps
   p − rank micro-batches (p on the first stage), AFAB all m. The zero-bubble schedules with
   selective and full recompute (W recomputes what its GEMMs read) equal one rank too, and so
   does ZeRO-2 with dp 2 under the schedules whose actions each write part of a micro-batch's
   gradient (interleaved, ZB-H1, ZB-V, DualPipe-V), and ZeRO-3 (FSDP + PP), whose weight gathers
   are counted: each action gathers its chunk's units once, nothing past them. Unsupported
   combinations are refused with a sentence. Greedy generation with a KV cache through the
   stages, past seq: the same tokens on every rank as re-running the sequence. DualPipe (two
   pipelines fed from both ends, ranks q and pp−1−q holding the same two stages) equals one rank
   too, alone, tied, with dp (ZeRO-1/2/3), tp and recompute, and its two copies of the weights
   end equal to the bit; odd pp and unsuitable micro-batch counts are refused.

   Tolerance (fp32): stages compute what one rank computes, in the same order, except the
   gradient norm's sum over stages (and, tied, the table's gradient: the head's part and the
   lookup's summed between stages): losses within 2e-5 relative, weights within 1e-4. */
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
static int steps = STEPS; /* --quick (the sanitizer build): 2, the first update and one more */
#define B 2
#define T 16

typedef struct run {
    us_model_config mc;
    us_train_config tc; /* tc.batch = B per micro-batch, tc.grad_accum = m micro-batches */
    int32_t *in, *tgt;  /* [STEPS][m][dp·B][T] */
    float loss[STEPS], gnorm[STEPS];
    float *w;         /* final weights by tensor, one-rank order, from the pp stages (tp 1) */
    float *wcopy;     /* tied: the last stage's copy of the embedding, when it is not rank 0 */
    float *wdual;     /* DualPipe: the weights as ranks pp/2 .. pp−1 hold them (w: ranks below) */
    int copied;       /* it wrote one */
    double eval_loss; /* after training: the loss of the first micro-batch through the pipeline */
    int64_t eval_correct;
    float logits[8][B * 64];   /* per pp rank: the last-position logits every stage receives */
    int peak[8];               /* per pp rank: activations held at once */
    size_t act_bytes, act_est; /* stage 0's activation arena, and the estimator's figure for it */
    us_memory mem, mem_est;    /* stage 0's model states as allocated, and as estimated */
    int gathers[8];            /* ZeRO-3: per pp rank, the weight all-gathers of the run */
    float bubble;              /* the last step's measured pipeline bubble */
    /* generation (// >>sample) when gen is set: each rank's greedy tokens from the first 5 of in,
       cached for 27 new (past seq), and re-run (us_sample) for 11 */
    int gen;
    int32_t gen_cached[8][32], gen_rerun[8][16];
} run;

/* ZeRO-3's weight all-gathers, counted per rank through the comm table (each rank has its own) */
typedef us_result (*all_gather_fn)(us_comm *, us_group *, void *, const void *, int64_t, us_dtype,
                                   us_work **);
static all_gather_fn all_gather_real[8];
static int gathers[8];

static us_result all_gather_counted(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                    us_dtype dt, us_work **w) {
    gathers[c->world.rank]++;
    return all_gather_real[c->world.rank](c, g, dst, src, n, dt, w);
}

/* DualPipe's: each chunk runs its pipeline's half of the micro-batches (F and B or BW; no
   recompute), and the evaluation the chunk of the pipeline fed at rank 0. */
static int gathers_dualpipe(const run *R, int q) {
    us_pp_schedule ps;
    int c, n = 0, pp = R->tc.pp, Lc = R->mc.n_layers / pp, M = R->tc.grad_accum;
    if (us_pp_schedule_build(&ps, US_PP_DUALPIPE, pp, M, 2, NULL, 0) != US_OK) return -1;
    for (c = 0; c < 2; c++) {
        int st = us_pp_stage(&ps, q, c);
        int units = Lc + (st == 0) + (st == pp - 1 ? 1 + R->mc.tie_embeddings : 0);
        int eval = (c == 0) == (2 * q < pp); /* the pipeline fed at rank 0 */
        n += steps * M * units + eval * units;
    }
    us_pp_schedule_free(&ps);
    return n;
}

/* The gathers rank q's walks make (us__zero3_next): every F, B (or BW) and evaluation forward of a
   chunk gathers its layers, the embedding on the first stage, the head's unit (and, tied, the
   table) on the last; a W its layers where it recomputes; nothing past the chunk. */
static int gathers_expected(const run *R, int q) {
    us_pp_schedule ps;
    int c, n = 0, pp = R->tc.pp, S, Lc, M = R->tc.grad_accum;
    int v = R->tc.pp_schedule >= US_PP_INTERLEAVED && R->tc.pp_schedule != US_PP_ZB1 ? 2 : 1;
    int w = R->tc.recompute > US_RECOMPUTE_NONE &&
            (R->tc.pp_schedule == US_PP_ZB1 || R->tc.pp_schedule == US_PP_ZBV ||
             R->tc.pp_schedule == US_PP_DUALPIPEV);
    if (R->tc.pp_schedule == US_PP_DUALPIPE) return gathers_dualpipe(R, q);
    if (us_pp_schedule_build(&ps, (us_pp_kind)R->tc.pp_schedule, pp, M, v, NULL, 0) != US_OK)
        return -1;
    S = pp * v;
    Lc = R->mc.n_layers / S;
    for (c = 0; c < v; c++) {
        int st = us_pp_stage(&ps, q, c);
        int units = Lc + (st == 0) + (st == S - 1 ? 1 + R->mc.tie_embeddings : 0);
        n += steps * M * (2 * units + w * Lc) + units;
    }
    us_pp_schedule_free(&ps);
    return n;
}

static us_result rank_fn(us_comm *c, void *arg) {
    run *R = (run *)arg;
    us_model m;
    us_train_config tc = R->tc;
    int rank = c ? c->world.rank : 0, s, k, M = tc.grad_accum, dpn = tc.dp;
    size_t per = (size_t)B * T;
    int32_t *in = (int32_t *)malloc(per * M * 4), *tgt = (int32_t *)malloc(per * M * 4);
    us_result r;
    r = c ? us_model_init_dist(&m, &R->mc, &tc, NULL, c) : us_model_init(&m, &R->mc, &tc, NULL);
    if (r != US_OK) {
        printf("  rank %d init: %s\n", rank, m.err);
        free(in);
        free(tgt);
        return r;
    }
    if (c && tc.zero == 3) {
        gathers[rank] = 0;
        all_gather_real[rank] = c->all_gather;
        c->all_gather = all_gather_counted;
    }
    for (s = 0; s < steps && r == US_OK; s++) {
        us_step_stats st;
        for (k = 0; k < M; k++) { /* micro-batch k: this dp rank's B sequences of the dp·B */
            size_t src = (((size_t)s * M + k) * dpn + (size_t)m.mesh.dp_rank) * per;
            memcpy(in + k * per, R->in + src, per * 4);
            memcpy(tgt + k * per, R->tgt + src, per * 4);
        }
        r = us_train_step(&m, in, tgt, &st);
        if (r != US_OK) {
            printf("  rank %d step %d: %s\n", rank, s, m.err);
            break;
        }
        if (rank == 0) {
            R->loss[s] = st.loss;
            R->gnorm[s] = st.grad_norm;
            R->bubble = st.pp_bubble;
        }
    }
    if (r == US_OK && R->w && m.mesh.dp_rank == 0 &&
        m.tc.tp == 1) { /* each stage writes its tensors */
        int i, l;
        int64_t base = 0;
        float *wout = R->wdual && 2 * m.mesh.pp_rank >= m.tc.pp ? R->wdual : R->w;
        /* one-rank order: embedding, layers 0..L-1 (9 tensors each), norm, head */
        for (i = 0; i < m.n_params_t; i++) {
            const us_param *p = &m.params[i];
            int64_t dst;
            if (!p->numel) continue;
            if (i == 0 && !m.pp_first) { /* the tied table's copy on the last stage */
                memcpy(R->wcopy, (float *)m.w + p->offset, (size_t)p->numel * 4);
                R->copied = 1;
                continue;
            }
            if (i == 0)
                dst = 0;
            else if (i < 1 + m.cfg.n_layers * 9) {
                int64_t per_layer = 0, k2;
                l = (i - 1) / 9;
                for (k2 = 1; k2 <= 9; k2++) per_layer += m.params[k2].numel;
                dst = (int64_t)m.cfg.vocab * m.cfg.dim +
                      (int64_t)m.layer_g[l] * per_layer; /* chunks: not contiguous */
                for (k2 = 1 + l * 9; k2 < i; k2++) dst += m.params[k2].numel;
            } else {
                int64_t per_layer = 0, k2;
                for (k2 = 1; k2 <= 9; k2++) per_layer += m.params[k2].numel;
                dst = (int64_t)m.cfg.vocab * m.cfg.dim + (int64_t)m.n_layers_global * per_layer +
                      (i == 1 + m.cfg.n_layers * 9 ? 0 : m.cfg.dim);
            }
            memcpy(wout + dst, (float *)m.w + p->offset, (size_t)p->numel * 4);
            (void)base;
        }
    }
    if (m.tc.pp > 1 && m.mesh.dp_rank == 0 && m.mesh.tp_rank == 0)
        R->peak[m.mesh.pp_rank] = m.pp_peak;
    if (rank == 0) { /* the estimator describes the first stage */
        us_memory est;
        R->act_bytes = m.mem.activations;
        R->act_est = us_memory_estimate(&R->mc, &tc, &est, NULL, 0) == US_OK ? est.activations : 0;
        R->mem = m.mem;
        R->mem_est = est;
    }
    if (r ==
        US_OK) { /* evaluation through the stages: this dp rank's sequences of the first micro-batch */
        double ls = 0;
        int64_t cor = 0;
        float lg[B * 64];
        r = us_forward_eval(&m, in, tgt, B, T, &ls, &cor, lg);
        if (r != US_OK)
            printf("  rank %d eval: %s\n", rank, m.err);
        else {
            if (rank == 0) {
                R->eval_loss = ls;
                R->eval_correct = cor;
            }
            if (m.mesh.dp_rank == 0 && m.mesh.tp_rank == 0)
                memcpy(R->logits[m.mesh.pp_rank], lg, sizeof lg);
        }
    }
    if (c && tc.zero == 3) { /* (generation's gathers are not counted) */
        c->all_gather = all_gather_real[rank];
        if (m.mesh.dp_rank == 0 && m.mesh.tp_rank == 0) R->gathers[m.mesh.pp_rank] = gathers[rank];
    }
    if (r == US_OK && R->gen) { /* every stage takes part; every rank draws the same tokens */
        us_rng g;
        us_rng_seed(&g, 1);
        if (us_sample(&m, R->in, 5, 11, 0.0f, 0, &g, R->gen_rerun[rank]) != US_OK ||
            us_generate(&m, R->in, 5, 27, 0.0f, 0, 0.0f, &g, R->gen_cached[rank]) != US_OK) {
            printf("  rank %d generation: %s\n", rank, m.err);
            r = US_ERR_BACKEND;
        }
    }
    us_model_free(&m);
    free(in);
    free(tgt);
    return r;
}

static us_result launch(run *R) {
    return us_test_launch(R->tc.dp * R->tc.pp * R->tc.tp, rank_fn, R, NULL, 0);
}

static void setup(run *R, int dp, int pp, int tp, int sched, int M, int zero) {
    memset(R, 0, sizeof *R);
    R->mc.n_layers = sched == US_PP_INTERLEAVED || sched == US_PP_INTERLEAVED_BF ||
                             sched == US_PP_ZBV || sched == US_PP_DUALPIPEV
                         ? 8
                         : 4;
    R->mc.dim = 32;
    R->mc.n_heads = 4;
    R->mc.n_kv_heads = 2;
    R->mc.vocab = 64;
    R->mc.ffn_dim = 48;
    R->tc.batch = B;
    R->tc.seq = T;
    R->tc.grad_accum = M;
    R->tc.steps = steps;
    R->tc.lr = 1e-2f;
    R->tc.threads = 1;
    R->tc.seed = 4;
    R->tc.dp = dp;
    R->tc.pp = pp;
    R->tc.tp = tp;
    R->tc.pp_schedule = sched;
    R->tc.zero = zero;
}

/* A deliberately bad order, the channel plan before the fix of issue 27: every gradient's
   receive posted at its forward. Under the multi-chunk schedules that gradient comes back
   through this rank's later chunk, so a device synchronisation (here: the blocking receive of a
   later forward's input) waits for a receive that needs this rank's own later work. The
   messages are one float each, the actions compute nothing. */
typedef struct naive_run {
    int kind;
    int bad; /* data that arrived wrong */
} naive_run;

static us_result naive_rank(us_comm *c, void *arg) {
    naive_run *nr = (naive_run *)arg;
    us_pp_schedule s;
    us_group ch[8];
    us_work *act[64], *grad[64];
    float out[64], din[64], got;
    int q = c->world.rank, S, st_rank[4], i, b, k;
    char e[200];
    us_result r = US_OK;
    if (us_pp_schedule_build(&s, (us_pp_kind)nr->kind, 2, 4, 2, e, sizeof e) != US_OK)
        return US_ERR_INVALID;
    S = s.pp * s.v;
    for (i = 0; i < s.pp; i++)
        for (k = 0; k < s.v; k++) st_rank[us_pp_stage(&s, i, k)] = i;
    for (b = 0; b + 1 < S && r == US_OK; b++) /* channels as the executor opens them */
        for (k = 0; k < 2 && r == US_OK; k++) r = c->dup(c, &c->world, &ch[2 * b + k]);
    memset(act, 0, sizeof act);
    memset(grad, 0, sizeof grad);
    for (i = 0; i < s.n[q] && r == US_OK; i++) {
        const us_pp_action *x = &s.a[q][i];
        int st = us_pp_stage(&s, q, x->chunk), key = st * 4 + x->mb;
        if (x->op == US_PP_F) {
            if (st > 0 && st_rank[st - 1] != q) {
                r = c->recv(c, &ch[2 * (st - 1)], &got, 1, US_F32, st_rank[st - 1], NULL);
                if (r == US_OK && got != (float)(key - 4)) nr->bad++;
            }
            out[key] = (float)key;
            if (r == US_OK && st + 1 < S && st_rank[st + 1] != q) { /* the naive posts */
                r = c->send(c, &ch[2 * st], &out[key], 1, US_F32, st_rank[st + 1], &act[key]);
                if (r == US_OK)
                    r = c->recv(c, &ch[2 * st + 1], &din[key], 1, US_F32, st_rank[st + 1],
                                &grad[key]);
            }
        } else if (x->op != US_PP_W) {
            if (grad[key]) {
                r = c->wait(c, grad[key]);
                grad[key] = NULL;
                if (r == US_OK && din[key] != (float)(1000 + key + 4)) nr->bad++;
            }
            out[key] = (float)(1000 + key);
            if (r == US_OK && st > 0 && st_rank[st - 1] != q)
                r = c->send(c, &ch[2 * (st - 1) + 1], &out[key], 1, US_F32, st_rank[st - 1], NULL);
        }
    }
    for (k = 0; k < 64; k++) {
        if (act[k] && c->wait(c, act[k]) != US_OK) r = US_ERR_BACKEND;
        if (grad[k] && c->wait(c, grad[k]) != US_OK) r = US_ERR_BACKEND;
    }
    for (b = 0; b + 1 < S; b++)
        for (k = 0; k < 2; k++) c->group_free(c, &ch[2 * b + k]);
    us_pp_schedule_free(&s);
    return r;
}

/* The hang of bench/RESULTS.md's run 7 (pp 2, two H200s), by the bad order above: without
   NCCL's semantics it completes with every message right; with them the watchdog reports the
   deadlock, naming both ranks, in seconds instead of the 20 s timeout (the detector's test). */
static void bad_order_caught(void) {
    naive_run nr;
    int nccl;
    for (nccl = 0; nccl < 2; nccl++) {
        us_launch_config lc;
        char err[256];
        double t0 = us_trace_now_us(), dt;
        us_result r;
        nr.kind = US_PP_INTERLEAVED;
        nr.bad = 0;
        memset(&lc, 0, sizeof lc);
        lc.timeout_s = 20;
        lc.p2p_rendezvous = 1;
        lc.nccl = nccl;
        r = us_launch_ex(2, naive_rank, &nr, &lc, NULL, err, sizeof err);
        dt = 1e-6 * (us_trace_now_us() - t0);
        if (!nccl)
            CHECK(r == US_OK && nr.bad == 0,
                  "interleaved pp 2, gradient receives posted at their forward: completes "
                  "without NCCL semantics, %d messages wrong (%s)",
                  nr.bad, r == US_OK ? "ok" : err);
        else
            CHECK(r == US_ERR_BACKEND && strstr(err, "deadlock: every rank waits") &&
                      strstr(err, "rank 0 waits for") && strstr(err, "rank 1 waits for") && dt < 10,
                  "the same order under NCCL semantics: the GPU's hang, reported in %.1f s: "
                  "%.120s",
                  dt, err);
    }
}

/* DualPipe's refusals, each one sentence: an odd pp (the two pipelines meet in the middle), an
   odd or too small number of micro-batches (half enter at each end, each half at least pp), a
   chunk count other than 2, MoE layers; pp 1 runs no schedule and is accepted. */
static void dualpipe_refused(void) {
    us_model_config mc;
    us_train_config tc;
    char err[200];
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.n_layers = 4;
    tc.pp_schedule = US_PP_DUALPIPE;
    tc.pp = 3;
    tc.grad_accum = 6;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "even pp") && strstr(err, "pp=3"),
          "dualpipe pp 3: %s", err);
    tc.pp = 2;
    tc.grad_accum = 5;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "at least 2*pp (micro-batches=5, pp=2)"),
          "dualpipe m 5: %s", err);
    tc.grad_accum = 2;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "micro-batches=2"),
          "dualpipe pp 2, m 2: %s", err);
    tc.grad_accum = 4;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK, "dualpipe pp 2, m 4 is accepted");
    tc.pp_chunks = 3;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "exactly 2 chunks"),
          "dualpipe with 3 chunks: %s", err);
    tc.pp_chunks = 0;
    mc.moe_experts = 4;
    mc.moe_top_k = 2;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID && strstr(err, "MoE"),
          "dualpipe with MoE layers: %s", err);
    memset(&mc, 0, sizeof mc); /* (validation filled the MoE defaults) */
    mc.n_layers = 4;
    tc.pp = 1;
    tc.grad_accum = 3;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK,
          "dualpipe at pp 1 (no pipeline) is accepted");
}

/* --quick (the sanitizer build): 2 steps instead of 3, and a row runs when it brings something
   no earlier row ran — its schedule; pp 4 with one chunk per rank or two; a ZeRO stage over dp 2
   where a micro-batch's gradient comes in one action or in several; tied embeddings, on the V or
   not, per ZeRO stage; a recompute mode, on the V or not; tp with or without dp, with or without
   sp; fewer micro-batches than stages; uneven stages — and it runs one plan, the two in turn.
   The full run checks every row on both plans. */
static int quick_row(const int *c, unsigned char *seen) {
    int s = c[3], z = c[5] > 0 ? c[5] : 0, i, n = 0, fresh = 0, key[8];
    int v2 = s >= US_PP_INTERLEAVED && s != US_PP_ZB1, split = s >= US_PP_INTERLEAVED;
    int V = s == US_PP_ZBV || s == US_PP_DUALPIPEV;
    key[n++] = s; /* keys: 0..15 schedules, then one range per feature */
    if (c[1] > 2) key[n++] = 16 + v2;
    if (c[0] > 1) key[n++] = 18 + 2 * z + split;
    if (c[6]) key[n++] = 26 + 4 * V + z;
    if (c[7]) key[n++] = 34 + 2 * c[7] + V;
    if (c[2] > 1) key[n++] = 42 + 2 * (c[0] > 1) + c[8];
    if (c[4] < c[1]) key[n++] = 46;
    if (c[5] < 0) key[n++] = 47;
    for (i = 0; i < n; i++)
        if (!seen[key[i]]) fresh = seen[key[i]] = 1;
    return fresh;
}

int main(int argc, char **argv) {
    static const int cfg[][9] = {
        /* dp, pp, tp, schedule, m, zero, tied, recompute, sp */
        {1, 2, 1, US_PP_1F1B, 1, 0, 0},
        {1, 2, 1, US_PP_1F1B, 4, 0, 0},
        {1, 2, 1, US_PP_AFAB, 4, 0, 0},
        {1, 4, 1, US_PP_1F1B, 2, 0, 0},
        {1, 4, 1, US_PP_1F1B, 8, 0, 0},
        {1, 4, 1, US_PP_AFAB, 8, 0, 0},
        {2, 2, 1, US_PP_1F1B, 4, 1, 0},
        {1, 2, 2, US_PP_1F1B, 4, 0, 0},
        /* zero bubble: B and W apart (weight gradients deferred), alone and with dp (ZeRO-1), tp */
        {1, 2, 1, US_PP_ZB1, 4, 0, 0},
        {1, 4, 1, US_PP_ZB1, 8, 0, 0},
        {1, 4, 1, US_PP_ZB1, 3, 0, 0},
        {2, 2, 1, US_PP_ZB1, 4, 1, 0},
        {1, 2, 2, US_PP_ZB1, 4, 0, 0},
        /* interleaved: two chunks per rank (8 layers over 4 stages at pp 2, over 8 at pp 4), depth- and breadth-first */
        {1, 2, 1, US_PP_INTERLEAVED, 4, 0, 0},
        {1, 4, 1, US_PP_INTERLEAVED, 8, 0, 0},
        {1, 2, 1, US_PP_INTERLEAVED_BF, 4, 0, 0},
        {1, 4, 1, US_PP_INTERLEAVED_BF, 5, 0, 0},
        {2, 2, 1, US_PP_INTERLEAVED, 4, 1, 0},
        {1, 2, 2, US_PP_INTERLEAVED, 2, 0, 0},
        /* an explicit per-stage layer count (tc.pp_layers): 1 layer on stage 0, 3 on stage 1 */
        {1, 2, 1, US_PP_1F1B, 4, -1, 0},
        /* the V shapes: 2 chunks per rank, stage q then 2·pp−1−q (the last stage on rank 0) */
        {1, 2, 1, US_PP_ZBV, 4, 0, 0},
        {1, 4, 1, US_PP_ZBV, 8, 0, 0},
        {1, 2, 1, US_PP_DUALPIPEV, 4, 0, 0},
        {1, 4, 1, US_PP_DUALPIPEV, 8, 0, 0},
        {2, 2, 1, US_PP_ZBV, 4, 1, 0},
        {1, 2, 2, US_PP_DUALPIPEV, 4, 0, 0},
        /* dp 2 × pp 2 × tp 2 on 8 threads (issue 13's first mesh), ZeRO-1 */
        {2, 2, 2, US_PP_1F1B, 4, 1, 0},
        /* tied embeddings: the last stage's head holds a copy of the table, their gradients
           summed between the two stages (on rank 0 alone under the V shapes) */
        {1, 2, 1, US_PP_1F1B, 4, 0, 1},
        {1, 4, 1, US_PP_1F1B, 8, 0, 1},
        {1, 2, 1, US_PP_INTERLEAVED, 4, 0, 1},
        {1, 2, 1, US_PP_ZB1, 4, 0, 1},
        {1, 2, 1, US_PP_ZBV, 4, 0, 1},
        {2, 2, 1, US_PP_1F1B, 4, 1, 1},
        {2, 2, 1, US_PP_1F1B, 4, 2, 1},
        {1, 2, 2, US_PP_1F1B, 4, 0, 1},
        /* zero bubble with recomputation: W recomputes the inputs of its GEMMs (us__layer_w) */
        {1, 2, 1, US_PP_ZB1, 4, 0, 0, US_RECOMPUTE_SELECTIVE},
        {1, 2, 1, US_PP_ZB1, 4, 0, 0, US_RECOMPUTE_FULL},
        {1, 2, 1, US_PP_ZBV, 4, 0, 0, US_RECOMPUTE_SELECTIVE},
        {1, 2, 1, US_PP_ZBV, 4, 0, 0, US_RECOMPUTE_FULL},
        {1, 2, 1, US_PP_DUALPIPEV, 4, 0, 0, US_RECOMPUTE_SELECTIVE},
        {1, 2, 1, US_PP_DUALPIPEV, 4, 0, 0, US_RECOMPUTE_FULL},
        /* ZeRO-2 where a micro-batch's gradient comes in several actions (chunks, B and W apart):
           each action's units reduce-scattered as it ends (us__plan_units); tied on the V, the
           table's head part and lookup part in two actions of rank 0 */
        {2, 2, 1, US_PP_INTERLEAVED, 4, 2, 0},
        {2, 2, 1, US_PP_ZB1, 4, 2, 0},
        {2, 2, 1, US_PP_ZBV, 4, 2, 0},
        {2, 2, 1, US_PP_DUALPIPEV, 4, 2, 0},
        {2, 2, 1, US_PP_ZBV, 4, 2, 1},
        {2, 2, 1, US_PP_INTERLEAVED, 4, 2, 1},
        {2, 2, 1, US_PP_ZB1, 4, 2, 0, US_RECOMPUTE_SELECTIVE},
        /* ZeRO-3 (FSDP + PP): each stage gathers its chunk's weights per action; with B and W
           apart W gathers them only to recompute; tied apart (1F1B) and on the V (ZB-V) */
        {2, 2, 1, US_PP_1F1B, 4, 3, 0},
        {2, 2, 1, US_PP_INTERLEAVED, 4, 3, 0},
        {2, 2, 1, US_PP_ZB1, 4, 3, 0, US_RECOMPUTE_FULL},
        {2, 2, 1, US_PP_1F1B, 4, 3, 1},
        {2, 2, 1, US_PP_ZBV, 4, 3, 1},
        /* DualPipe: two pipelines fed from both ends (m/2 micro-batches each), ranks q and
           pp−1−q holding the same two stages, their gradients summed; tied, ranks 0 and pp−1
           each hold the one table; stages of 1 and 3 layers (pp_layers) */
        {1, 2, 1, US_PP_DUALPIPE, 4, 0, 0},
        {1, 2, 1, US_PP_DUALPIPE, 6, 0, 0},
        {1, 4, 1, US_PP_DUALPIPE, 8, 0, 0},
        {1, 4, 1, US_PP_DUALPIPE, 12, 0, 1},
        {1, 2, 1, US_PP_DUALPIPE, 4, 0, 1},
        {1, 2, 1, US_PP_DUALPIPE, 4, -1, 0},
        {2, 2, 1, US_PP_DUALPIPE, 4, 1, 0},
        {2, 2, 1, US_PP_DUALPIPE, 4, 2, 1},
        {2, 2, 1, US_PP_DUALPIPE, 4, 3, 1},
        {1, 2, 2, US_PP_DUALPIPE, 4, 0, 0},
        {1, 2, 1, US_PP_DUALPIPE, 4, 0, 0, US_RECOMPUTE_FULL},
        {1, 4, 1, US_PP_DUALPIPE, 8, 0, 0, US_RECOMPUTE_SELECTIVE},
        /* on 8 threads with tp 2 and sequence parallelism (the norms' gradients summed over tp
           before B keeps them for W) */
        {2, 2, 2, US_PP_ZB1, 4, 2, 0, 0, 1},
        {2, 2, 2, US_PP_INTERLEAVED, 4, 3, 0, US_RECOMPUTE_FULL, 1}};
    static const int uneven[2] = {1, 3};
    int ci, s, plan, a, quick = 0, kept = 0;
    unsigned char seen[64] = {0};
    double worst_l = 0, worst_w = 0;
    for (a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-v")) us_test_verbose = 1;
        if (!strcmp(argv[a], "--quick")) quick = 1;
    }
    if (quick) steps = 2;
    for (ci = 0; ci < (int)(sizeof cfg / sizeof cfg[0]); ci++) {
        run ref, R;
        int dp = cfg[ci][0], pp = cfg[ci][1], tp = cfg[ci][2], M = cfg[ci][4], q;
        int64_t n = (int64_t)STEPS * M * dp * B * T, i, np;
        double ml = 0, mw = 0;
        if (quick && !quick_row(cfg[ci], seen)) continue;
        kept++;
        /* the reference: one rank, micro-batches of dp·B sequences (so the global batch matches) */
        setup(&ref, 1, 1, 1, cfg[ci][3], M, 0); /* the same model */
        ref.mc.tie_embeddings = cfg[ci][6];
        ref.tc.pp_schedule = US_PP_1F1B;
        ref.tc.batch = dp * B;
        ref.in = (int32_t *)malloc((size_t)n * 4);
        ref.tgt = (int32_t *)malloc((size_t)n * 4);
        us_test_rs = 50 + ci;
        for (i = 0; i < n; i++) {
            ref.in[i] = (int32_t)(rnd64() % 64);
            ref.tgt[i] = rnd01() < 0.1 ? -1 : (int32_t)(rnd64() % 64);
        }
        np = us_param_count(&ref.mc);
        ref.w = (float *)malloc((size_t)np * 4);
        { /* one rank reads [STEPS][M][dp·B][T] as micro-batches of dp·B */
            us_model m;
            us_train_config tc = ref.tc;
            int k;
            us_model_init(&m, &ref.mc, &tc, NULL);
            for (s = 0; s < steps; s++) {
                us_step_stats st;
                us_train_step(&m, ref.in + (size_t)s * M * dp * B * T,
                              ref.tgt + (size_t)s * M * dp * B * T, &st);
                ref.loss[s] = st.loss;
                ref.gnorm[s] = st.grad_norm;
            }
            for (k = 0, i = 0; k < m.n_params_t; k++) {
                memcpy(ref.w + i, (float *)m.w + m.params[k].offset, (size_t)m.params[k].numel * 4);
                i += m.params[k].numel;
            }
            /* the same evaluation as dp rank 0's: its B sequences of the last step's first micro-batch */
            us_forward_eval(&m, ref.in + (size_t)(steps - 1) * M * dp * B * T,
                            ref.tgt + (size_t)(steps - 1) * M * dp * B * T, B, T, &ref.eval_loss,
                            &ref.eval_correct, ref.logits[0]);
            us_model_free(&m);
        }
        for (plan = 0; plan < 2;
             plan++) { /* messages on channels, then timed on the clock (NCCL's plan) */
            if (quick && plan != kept % 2) continue;
            setup(&R, dp, pp, tp, cfg[ci][3], M, cfg[ci][5] < 0 ? 0 : cfg[ci][5]);
            R.tc.pp_clock = plan;
            R.tc.recompute = (us_recompute)cfg[ci][7];
            R.tc.sp = cfg[ci][8];
            /* ZeRO-2: buckets of 10 kB, several per layer, so units split layers and W's and
               the backward's units complete one after another as well as whole chunks */
            if (cfg[ci][5] == 2) R.tc.bucket_mb = 0.01f;
            /* NCCL's semantics (ultrascale_comm.h): an order that hangs a GPU fails here, on
               the clock and on channels alike (bad_order_caught shows the detector works) */
            us_test_nccl = 1;
            if (cfg[ci][5] < 0) R.tc.pp_layers = uneven;
            R.mc.tie_embeddings = cfg[ci][6];
            R.wcopy = (float *)calloc((size_t)(R.mc.vocab * R.mc.dim), 4);
            R.in = ref.in;
            R.tgt = ref.tgt;
            /* (ZeRO-3 ranks hold a piece of each unit: its weights are checked through the
               evaluation's loss and logits after training) */
            R.w = tp == 1 && cfg[ci][5] != 3 ? (float *)calloc((size_t)np, 4) : NULL;
            if (R.w && cfg[ci][3] == US_PP_DUALPIPE) R.wdual = (float *)calloc((size_t)np, 4);
            R.gen = !plan;
            if (launch(&R) != US_OK) {
                CHECK(0, "cfg %d (%s) ran", ci, plan ? "clock" : "channels");
                free(R.w);
                free(R.wcopy);
                free(R.wdual);
                continue;
            }
            for (s = 0; s < steps; s++) {
                double d = fabs(R.loss[s] - ref.loss[s]) / ref.loss[s],
                       g = fabs(R.gnorm[s] - ref.gnorm[s]) / ref.gnorm[s];
                if (d > ml) ml = d;
                if (g > ml) ml = g;
            }
            if (R.w)
                for (i = 0; i < np; i++) {
                    double d = fabs(R.w[i] - ref.w[i]);
                    if (d > mw) mw = d;
                }
            if (ml > worst_l) worst_l = ml;
            if (mw > worst_w) worst_w = mw;
            CHECK(fabs(R.eval_loss - ref.eval_loss) <= 1e-4 * fabs(ref.eval_loss) &&
                      R.eval_correct == ref.eval_correct,
                  "%s pp %d x dp %d x tp %d: evaluation through the stages (loss %.5f vs %.5f, "
                  "%lld = %lld correct)",
                  us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, dp, tp, R.eval_loss, ref.eval_loss,
                  (long long)R.eval_correct, (long long)ref.eval_correct);
            /* tp sums the row-parallel products in another order than one rank: rounding-level
               differences, which AdamW amplifies where a gradient is near zero (m/√v), reach 1e-4
               over the 3 steps at lr 1e-2 for some data; without tp the order is the same. dp
               sums each rank's half of the batch, then the halves: the same amplification moves
               a weight by up to 2.3e-4 for some data (1F1B, ZeRO-1, the data of the ZB-H1 ZeRO-2
               row with selective recompute), at losses within 1.1e-6 */
            CHECK(ml < (tp > 1 ? 3e-4 : 2e-5) && mw < (dp > 1 ? 3e-4 : 1e-4),
                  "%s pp %d x dp %d x tp %d%s, m %d, ZeRO-%d%s, recompute %s, messages %s: %d "
                  "steps equal one rank (loss/norm rel %.1e, weights %s %.1e)",
                  us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, dp, tp, cfg[ci][8] ? " (SP)" : "", M,
                  cfg[ci][5] < 0 ? 0 : cfg[ci][5], cfg[ci][6] ? ", tied" : "",
                  us_recompute_name((us_recompute)cfg[ci][7]),
                  plan ? "on the clock" : "on channels", steps, ml,
                  R.w ? "abs" : "(split over ranks, not compared)", mw);
            if (R.wdual) /* DualPipe's two copies of every weight stayed equal */
                CHECK(!memcmp(R.wdual, R.w, (size_t)np * 4),
                      "dualpipe pp %d x dp %d, m %d: ranks q and pp-1-q hold equal weights to the "
                      "bit after %d steps",
                      pp, dp, M, steps);
            if (cfg[ci][6] && R.w && cfg[ci][3] != US_PP_DUALPIPE) /* the tied table's copies */
                CHECK(cfg[ci][3] == US_PP_ZBV
                          ? !R.copied
                          : R.copied && !memcmp(R.wcopy, R.w, (size_t)(R.mc.vocab * R.mc.dim) * 4),
                      "%s pp %d x dp %d, tied: %s", us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, dp,
                      cfg[ci][3] == US_PP_ZBV ? "the head is on rank 0, with the one table"
                                              : "the last stage's copy of the table equals the "
                                                "first stage's to the bit");
            if (cfg[ci][5] < 0)
                CHECK(ml < 2e-5 && mw < 1e-4,
                      "stages of 1 and 3 layers (pp_layers) train like one rank");
            if (R.gen) { /* the KV cache through the stages, each holding its layers' part */
                int same = 1, k;
                for (k = 0; k < dp * pp * tp; k++)
                    same &= !memcmp(R.gen_cached[k], R.gen_cached[0], sizeof R.gen_cached[0]) &&
                            !memcmp(R.gen_cached[k], R.gen_rerun[k], sizeof R.gen_rerun[0]);
                CHECK(
                    same,
                    "%s pp %d x dp %d x tp %d: greedy generation with the KV cache, 27 tokens "
                    "past seq %d, the same on every rank and equal to re-running for its first 16",
                    us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, dp, tp, T);
            }
            { /* every stage holds the last stage's logits (what sampling reads) */
                double e = 0;
                int j;
                for (q = 0; q < pp; q++)
                    for (j = 0; j < B * 64; j++)
                        if (fabs(R.logits[q][j] - ref.logits[0][j]) > e)
                            e = fabs(R.logits[q][j] - ref.logits[0][j]);
                CHECK(e < 1e-4,
                      "%s pp %d x dp %d x tp %d: every stage receives the logits for sampling (max "
                      "abs diff %.1e)",
                      us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, dp, tp, e);
            }
            for (q = 0; q < pp && dp == 1 && tp == 1; q++) {
                int want = cfg[ci][3] == US_PP_AFAB ? M : (pp - q < M ? pp - q : M);
                if (cfg[ci][3] >=
                    US_PP_INTERLEAVED) { /* the simulator's count of chunk activations (ZB-H1: pp on every rank) */
                    us_pp_schedule ps;
                    us_pp_sim sim;
                    us_pp_schedule_build(&ps, (us_pp_kind)cfg[ci][3], pp, M,
                                         cfg[ci][3] == US_PP_ZB1 ? 1 : 2, NULL, 0);
                    us_pp_simulate(&ps, 1, 2, 0, &sim, NULL, 0);
                    want = sim.peak_act[q];
                    us_pp_schedule_free(&ps);
                }
                CHECK(
                    R.peak[q] == want,
                    "%s pp %d m %d: stage %d held %d micro-batches' activations at once (want %d)",
                    us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, M, q, R.peak[q], want);
            }
            CHECK(R.act_bytes == R.act_est && R.act_bytes > 0,
                  "%s pp %d m %d: stage 0's activation arena %zu B = the estimator's %zu B",
                  us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, M, R.act_bytes, R.act_est);
            CHECK(R.mem.params == R.mem_est.params && R.mem.grads == R.mem_est.grads &&
                      R.mem.optimizer == R.mem_est.optimizer,
                  "%s pp %d x dp %d, ZeRO-%d: stage 0's weights, gradients, optimizer state %zu, "
                  "%zu, %zu B = the estimator's %zu, %zu, %zu B",
                  us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, dp, cfg[ci][5] < 0 ? 0 : cfg[ci][5],
                  R.mem.params, R.mem.grads, R.mem.optimizer, R.mem_est.params, R.mem_est.grads,
                  R.mem_est.optimizer);
            for (q = 0; q < pp && cfg[ci][5] == 3 && tp == 1; q++) /* (SP gathers too) */
                CHECK(R.gathers[q] == gathers_expected(&R, q),
                      "%s pp %d x dp %d, ZeRO-3: stage %d gathered weights %d times (want %d: each "
                      "action its chunk's units, nothing past them)",
                      us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, dp, q, R.gathers[q],
                      gathers_expected(&R, q));
            CHECK(R.bubble >= 0 && R.bubble < 1,
                  "%s pp %d m %d: the measured bubble %.3f is a fraction",
                  us_pp_kind_name((us_pp_kind)cfg[ci][3]), pp, M, R.bubble);
            free(R.w);
            free(R.wcopy);
            free(R.wdual);
        }
        free(ref.w);
        free(ref.in);
        free(ref.tgt);
    }
    printf("  observed: losses and gradient norms within %.2e relative, weights within %.2e "
           "absolute of one rank\n",
           worst_l, worst_w);
    us_test_nccl = 0;
    bad_order_caught();
    dualpipe_refused();
    {
        us_model_config mc;
        us_train_config tc;
        char err[200];
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        mc.n_layers = 2;
        tc.pp = 3;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "layers=2"),
              "pp 3 with 2 layers: %s", err);
        mc.n_layers = 4;
        tc.pp = 2;
        tc.zero = 3;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK, "pp with ZeRO-3 is accepted");
        tc.zero = 2;
        tc.pp_schedule = US_PP_ZB1;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK,
              "zb1 with ZeRO-2 is accepted");
        tc.zero = 1;
        tc.recompute = US_RECOMPUTE_FULL;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK,
              "zb1 with ZeRO-1 and full recompute is accepted");
        tc.recompute = US_RECOMPUTE_NONE;
        tc.pp_clock = 2;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "pp_clock=2"),
              "pp_clock 2: %s", err);
        tc.pp_clock = -1;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK,
              "pp_clock -1 (channels for every schedule) is accepted");
        tc.pp_clock = 0;
        {
            static const int bad_sum[2] = {1, 2}, bad_zero[2] = {0, 4};
            tc.pp_layers = bad_sum;
            CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                      strstr(err, "sum to 3"),
                  "per-stage layers that do not add up: %s", err);
            tc.pp_layers = bad_zero;
            CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                      strstr(err, "at least one"),
                  "a stage without layers: %s", err);
            tc.pp_layers = NULL;
        }
    }
    return us_test_done("test_pp");
}
