/* test_dp.c — data parallelism and ZeRO, on CPU threads (the threads backend of
   ultrascale_comm.h): every configuration must reproduce the single-rank run with the same
   global batch. Also: per-rank memory equals the estimator, bucket reductions overlap the
   backward, no_sync under accumulation, and a failing rank fails them all cleanly.

   Tolerance (fp32): the ranks sum gradients in a different order than one rank's GEMMs do, so
   results agree to rounding, not bit for bit: losses within 2e-5 relative and final weights
   within 2e-5 absolute after STEPS AdamW steps (printed with -v: the observed maxima). */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include "us_test.h"
#include "us_test_ranks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 4
#define GB 8 /* global micro-batch (sequences) */
#define T 16

typedef struct run {
    us_model_config mc;
    us_train_config tc; /* tc.batch = the global micro-batch; ranks take GB/dp each */
    int32_t *in, *tgt;  /* [STEPS][accum][GB][T] */
    float loss[STEPS];
    float *weights; /* the final fp32 weights by tensor, reference order (n_params) */
    us_memory mem[8], est[8];
    size_t backend_bytes[8];
    int fail_rank; /* this rank returns an error at step 2 (-1 none) */
    us_result rank_result[8];
    us_trace trace[8];
    int tracing;
    double max_loss_rel, max_w_abs;
    int emb_sparse[8]; /* the model reduced the embedding's gradient by rows */
    int64_t sent[8];   /* bytes each rank sent */
    float *wr[8];      /* when set: each rank's whole flat weights (fp32, ZeRO < 3) */
    int vocab_used;    /* the data's tokens are < this (0: the whole vocabulary) */
    int log_order;     /* log each rank's AdamW pieces and all-gathers in oplog */
} run;

/* The call log of the ZeRO-1 overlap check: the wrappers find their rank through the comm (the
   gathers) or the model's ops table registered for it (AdamW). */
static char oplog[8][1 << 14];
static int oplen[8];
static us_ops *op_of_rank[8];
static void (*adamw_real)(us_ops *, float *, const float *, float *, float *, void *, us_dtype,
                          int64_t, float, float, float, float, float, float, int);
static us_result (*all_gather_real)(us_comm *, us_group *, void *, const void *, int64_t, us_dtype,
                                    us_work **);

static void oplog_add(int r, char ch) {
    if (r >= 0 && oplen[r] < (int)sizeof oplog[r] - 1) oplog[r][oplen[r]++] = ch;
}

static void adamw_logged(us_ops *o, float *p, const float *g, float *m, float *v, void *pl,
                         us_dtype ld, int64_t n, float lr, float b1, float b2, float eps, float wd,
                         float gs, int t) {
    int r;
    for (r = 0; r < 8; r++)
        if (op_of_rank[r] == o) oplog_add(r, 'A');
    adamw_real(o, p, g, m, v, pl, ld, n, lr, b1, b2, eps, wd, gs, t);
}

static us_result all_gather_logged(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                   us_dtype dt, us_work **w) {
    oplog_add(c->world.rank, 'G');
    return all_gather_real(c, g, dst, src, n, dt, w);
}

/* This rank's final weights, written into run->weights by tensor (fp32 policies only: the
   weights are their own master; ZeRO-3 ranks each hold one piece of every unit). */
static void collect_weights(run *R, us_model *m) {
    int i, u;
    for (u = 0; u < m->n_units; u++) {
        const us__unit *U = &m->units[u];
        int64_t lo = U->off + (m->tc.zero ? (int64_t)m->mesh.dp_rank * U->piece : 0),
                hi = lo + U->piece;
        const float *src =
            m->tc.zero == 3 ? (const float *)m->w + U->shard_off : (const float *)m->w + lo;
        int64_t ref = 0;
        for (i = 0; i < m->n_params_t; i++) {
            const us_param *p = &m->params[i];
            int64_t a = p->offset > lo ? p->offset : lo,
                    b = p->offset + p->numel < hi ? p->offset + p->numel : hi, j;
            if (i >= U->p0 && i < U->p1)
                for (j = a; j < b; j++) R->weights[ref + (j - p->offset)] = src[j - lo];
            ref += p->numel;
        }
    }
}

static us_result rank_fn(us_comm *c, void *arg) {
    run *R = (run *)arg;
    us_model m;
    us_train_config tc = R->tc;
    int rank = c ? c->world.rank : 0, dp = tc.dp, s, k;
    int B = GB / dp;
    size_t per = (size_t)B * T;
    int32_t *in = (int32_t *)malloc(per * tc.grad_accum * 4),
            *tgt = (int32_t *)malloc(per * tc.grad_accum * 4);
    us_result r;
    tc.batch = B;
    r = dp > 1 ? us_model_init_dist(&m, &R->mc, &tc, NULL, c)
               : us_model_init(&m, &R->mc, &tc, NULL);
    if (r != US_OK) {
        printf("  rank %d init: %s\n", rank, m.err);
        free(in);
        free(tgt);
        return r;
    }
    us_memory_estimate(&R->mc, &tc, &R->est[rank], NULL, 0);
    R->mem[rank] = m.mem;
    R->backend_bytes[rank] = m.ops.bytes_in_use;
    if (R->log_order && c) { /* (every rank's tables hold the same functions) */
        adamw_real = m.ops.adamw;
        m.ops.adamw = adamw_logged;
        op_of_rank[rank] = &m.ops;
        if (c->all_gather != all_gather_logged) {
            all_gather_real = c->all_gather;
            c->all_gather = all_gather_logged;
        }
    }
    if (R->tracing) {
        us_trace_init(&R->trace[rank], rank);
        m.trace = &R->trace[rank];
        if (c) c->trace = m.trace;
    }
    for (s = 0; s < STEPS && r == US_OK; s++) {
        us_step_stats st;
        for (k = 0; k < tc.grad_accum; k++) { /* this rank's rows of every micro-batch */
            size_t src = (((size_t)s * tc.grad_accum + k) * GB + (size_t)rank * B) * T;
            memcpy(in + k * per, R->in + src, per * 4);
            memcpy(tgt + k * per, R->tgt + src, per * 4);
        }
        if (R->fail_rank == rank && s == 2) {
            r = US_ERR_INVALID;
            snprintf(c->err, sizeof c->err, "rank %d gives up on purpose", rank);
            break;
        }
        if (R->log_order) oplog_add(rank, '|');
        r = us_train_step(&m, in, tgt, &st);
        if (r != US_OK) {
            if (R->fail_rank < 0) printf("  rank %d step %d: %s\n", rank, s, m.err);
            break;
        }
        if (rank == 0) R->loss[s] = st.loss;
    }
    if (r == US_OK && m.dt == US_F32 && R->weights) collect_weights(R, &m);
    if (r == US_OK && R->wr[rank]) memcpy(R->wr[rank], m.w, (size_t)m.n_flat * 4);
    R->emb_sparse[rank] = m.emb_sparse;
    R->sent[rank] = c ? c->bytes_sent : 0;
    if (c) c->trace = NULL;
    if (R->log_order && c) {
        c->all_gather = all_gather_real;
        op_of_rank[rank] = NULL;
    }
    us_model_free(&m);
    free(in);
    free(tgt);
    return r;
}

static us_result launch(run *R) { return us_test_launch(R->tc.dp, rank_fn, R, R->rank_result, 1); }

static void setup(run *R, int dp, int zero, int accum, int tied, float bucket_mb) {
    memset(R, 0, sizeof *R);
    R->mc.n_layers = 2;
    R->mc.dim = 32;
    R->mc.n_heads = 4;
    R->mc.n_kv_heads = 2;
    R->mc.vocab = 61;
    R->mc.ffn_dim = 40;
    R->mc.tie_embeddings = tied;
    R->tc.batch = GB;
    R->tc.seq = T;
    R->tc.grad_accum = accum;
    R->tc.steps = STEPS;
    R->tc.lr = 1e-2f;
    R->tc.threads = 1;
    R->tc.dp = dp;
    R->tc.zero = zero;
    R->tc.bucket_mb = bucket_mb;
    R->tc.seed = 99;
    R->fail_rank = -1;
}

/* The single-rank reference of a setup (one rank, the whole global batch), its final weights
   kept; returns the parameter count. */
static int64_t reference(run *ref) {
    us_model tmp;
    us_train_config tc = ref->tc;
    int64_t np;
    us_model_init(&tmp, &ref->mc, &tc, NULL);
    np = tmp.n_params;
    us_model_free(&tmp);
    ref->weights = (float *)malloc((size_t)np * 4);
    launch(ref);
    return np;
}

/* R against the reference: the largest relative loss difference over the steps and the largest
   absolute difference of the final weights. */
static void differences(const run *R, const run *ref, int64_t np, double *ml, double *mw) {
    int64_t j;
    int s;
    *ml = *mw = 0;
    for (s = 0; s < STEPS; s++) {
        double d = fabs(R->loss[s] - ref->loss[s]) / fabs(ref->loss[s]);
        if (d > *ml) *ml = d;
    }
    for (j = 0; j < np; j++) {
        double d = fabs(R->weights[j] - ref->weights[j]);
        if (d > *mw) *mw = d;
    }
}

static void make_data(run *R, uint64_t seed) {
    size_t n = (size_t)STEPS * R->tc.grad_accum * GB * T, i;
    R->in = (int32_t *)malloc(n * 4);
    R->tgt = (int32_t *)malloc(n * 4);
    us_test_rs = seed;
    int64_t v = R->vocab_used ? R->vocab_used : R->mc.vocab;
    for (i = 0; i < n; i++) {
        R->in[i] = (int32_t)(rnd64() % v);
        R->tgt[i] = rnd01() < 0.1 ? -1 : (int32_t)(rnd64() % v);
    }
}

/* ranks with micro-batches of different sizes, straight through us_forward_backward */
typedef struct un_run {
    us_model_config mc;
    us_train_config tc;
    int32_t in[3 * T], tgt[3 * T]; /* rank 0: sequences 0-1, rank 1: sequence 2 */
    float *w;                      /* rank 0's weights after the step */
    int sparse;
    us_result res[2];
} un_run;

static us_result unequal_rank(us_comm *c, void *arg) {
    un_run *U = (un_run *)arg;
    us_model m;
    us_train_config tc = U->tc;
    int rank = c->world.rank, B = rank == 0 ? 2 : 1;
    double ls;
    float gn, lr;
    us_result r = us_model_init_dist(&m, &U->mc, &tc, NULL, c);
    if (r != US_OK) return r;
    if (rank == 0) U->sparse = m.emb_sparse;
    us_model_zero_grad(&m);
    m.grad_sync = 1;
    r = us_forward_backward(&m, U->in + (rank == 0 ? 0 : 2 * T), U->tgt + (rank == 0 ? 0 : 2 * T),
                            B, T, 1.0f / (3 * T), &ls);
    if (r == US_OK) r = us_optimizer_step(&m, &gn, &lr);
    if (r == US_OK && rank == 0) memcpy(U->w, m.w, (size_t)m.n_flat * 4);
    us_model_free(&m);
    return r;
}

/* bf16 gradient reduction (tc.grad_reduce_dtype): each rank's gradient of one micro-batch
   (us_forward_backward, a fixed scale) reduced over dp 2, read back before any optimizer step.
   Expected, from two one-rank models on the same halves: the fp32 sum g0 + g1 (the default, bit
   for bit), and bf16(bf16(g0) + bf16(g1)) for bf16 (the threads backend's bf16 sum: the fp32
   addition of two bf16 values, rounded once). */
typedef struct bfr_run {
    us_model_config mc;
    us_train_config tc;
    int32_t in[GB * T], tgt[GB * T];
    float *got; /* [tensor offsets of the reference] the reduced gradient, the pieces held */
    int *held;  /* which elements of got some rank held */
    int64_t *ref_off;
    us_result res[2];
} bfr_run;

static us_result bfr_rank(us_comm *c, void *arg) {
    bfr_run *U = (bfr_run *)arg;
    us_model m;
    us_train_config tc = U->tc;
    int rank = c->world.rank, B = GB / 2, i;
    double ls;
    us_result r = us_model_init_dist(&m, &U->mc, &tc, NULL, c);
    if (r != US_OK) return r;
    us_model_zero_grad(&m);
    m.grad_sync = 1;
    r = us_forward_backward(&m, U->in + rank * B * T, U->tgt + rank * B * T, B, T, 1.0f / (GB * T),
                            &ls);
    if (r == US_OK) r = us__grads_finish(&m);
    for (i = 0; r == US_OK && i < m.n_params_t; i++) { /* the part of each tensor held */
        int64_t n, k, lo;
        const float *g = us__grad_held(&m, i, i + 1, &n);
        lo =
            m.tc.zero ? m.units[m.unit_of[i]].off + (int64_t)rank * m.units[m.unit_of[i]].piece : 0;
        if (lo < m.params[i].offset) lo = m.params[i].offset;
        for (k = 0; k < n; k++) {
            int64_t at = U->ref_off[i] + (lo - m.params[i].offset) + k;
            U->got[at] = g[k];
            U->held[at] = 1;
        }
    }
    us_model_free(&m);
    return r;
}

static void check_bf16_reduction(void) {
    bfr_run U;
    us_model ref[2];
    int zero, h, i;
    int64_t j, np;
    memset(&U, 0, sizeof U);
    U.mc.n_layers = 2;
    U.mc.dim = 32;
    U.mc.n_heads = 4;
    U.mc.n_kv_heads = 2;
    U.mc.vocab = 61;
    U.mc.ffn_dim = 40;
    U.tc.batch = GB / 2;
    U.tc.seq = T;
    U.tc.steps = 1;
    U.tc.lr = 1e-2f;
    U.tc.threads = 1;
    U.tc.seed = 99;
    U.tc.bucket_mb = 0.004f; /* several units */
    U.tc.dense_emb_grad = 1; /* the embedding's rows stay an fp32 reduction */
    us_test_rs = 41;
    for (j = 0; j < GB * T; j++) {
        U.in[j] = (int32_t)(rnd64() % 61);
        U.tgt[j] = (int32_t)(rnd64() % 61);
    }
    {
        us_model_config mc = U.mc;
        us_train_config tc = U.tc;
        char err[200];
        tc.grad_reduce_dtype = US_E4M3;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "grad_reduce_dtype=2"),
              "grad_reduce_dtype FP8: %s", err);
    }
    for (h = 0; h < 2; h++) { /* each rank's half on one rank */
        double ls;
        us_train_config tc = U.tc;
        CHECK(us_model_init(&ref[h], &U.mc, &tc, NULL) == US_OK, "bf16 reduction: reference");
        us_model_zero_grad(&ref[h]);
        us_forward_backward(&ref[h], U.in + h * (GB / 2) * T, U.tgt + h * (GB / 2) * T, GB / 2, T,
                            1.0f / (GB * T), &ls);
    }
    np = ref[0].n_flat;
    U.got = (float *)calloc((size_t)np, 4);
    U.held = (int *)calloc((size_t)np, sizeof(int));
    U.ref_off = (int64_t *)malloc(sizeof(int64_t) * (size_t)ref[0].n_params_t);
    for (i = 0; i < ref[0].n_params_t; i++) U.ref_off[i] = ref[0].params[i].offset;
    for (h = 0; h < 2; h++)
        for (zero = 0; zero <= 1; zero++) {
            int64_t bad = 0, nheld = 0, differs = 0;
            memset(U.got, 0, (size_t)np * 4);
            memset(U.held, 0, (size_t)np * sizeof(int));
            U.tc.dp = 2;
            U.tc.zero = zero;
            U.tc.grad_reduce_dtype = h ? US_BF16 : US_F32;
            CHECK(us_test_launch(2, bfr_rank, &U, U.res, 1) == US_OK, "bf16 reduction: dp 2 ran");
            for (i = 0; i < ref[0].n_params_t; i++)
                for (j = 0; j < ref[0].params[i].numel; j++) {
                    int64_t at = U.ref_off[i] + j;
                    float g0 = ref[0].grad[at], g1 = ref[1].grad[at], want = g0 + g1;
                    if (h)
                        want = us_bf16_to_f32(us_f32_to_bf16(us_bf16_to_f32(us_f32_to_bf16(g0)) +
                                                             us_bf16_to_f32(us_f32_to_bf16(g1))));
                    if (!U.held[at]) continue;
                    nheld++;
                    if (memcmp(&U.got[at], &want, 4)) bad++;
                    if (U.got[at] != g0 + g1) differs++;
                }
            CHECK(nheld == ref[0].n_params && bad == 0 && (h ? differs > 0 : differs == 0),
                  "dp 2 zero %d, gradients reduced in %s: %lld of %lld elements differ from "
                  "%s bit for bit (%lld differ from the fp32 sum)",
                  zero, h ? "bf16" : "fp32 (the default)", (long long)bad, (long long)nheld,
                  h ? "bf16(bf16(g0) + bf16(g1))" : "g0 + g1", (long long)differs);
        }
    us_model_free(&ref[0]);
    us_model_free(&ref[1]);
    free(U.got);
    free(U.held);
    free(U.ref_off);
}

/* bf16 reduction over training: dp 2, ZeRO 0..3, two micro-batches accumulated in fp32, STEPS
   AdamW steps against one rank's fp32 run. The bound is stated, not fitted: losses within 1e-3
   relative (the rounding of a bf16 sum is 2^-9 relative; AdamW normalises each update, so the
   weights move by at most lr per step whatever the gradient's rounding). */
static void check_bf16_training(void) {
    run ref;
    int64_t np;
    int zi;
    setup(&ref, 1, 0, 2, 0, 25);
    make_data(&ref, 17);
    np = reference(&ref);
    for (zi = 0; zi <= 3; zi++) {
        run R;
        double ml = 0, mw = 0;
        setup(&R, 2, zi, 2, 0, zi == 3 ? 25 : 0.004f);
        R.tc.grad_reduce_dtype = US_BF16;
        R.in = ref.in;
        R.tgt = ref.tgt;
        R.weights = (float *)calloc((size_t)np, 4);
        if (launch(&R) != US_OK)
            CHECK(0, "bf16 reduction, dp 2 zero %d ran", zi);
        else {
            differences(&R, &ref, np, &ml, &mw);
            CHECK(ml < 1e-3 && mw <= 2.0 * STEPS * R.tc.lr && ml > 0,
                  "bf16 reduction, dp 2 zero %d accum 2: %d steps within 1e-3 of one fp32 rank "
                  "(loss rel %.1e, not 0; weights abs %.1e)",
                  zi, STEPS, ml, mw);
        }
        free(R.weights);
    }
    free(ref.weights);
    free(ref.in);
    free(ref.tgt);
}

int main(int argc, char **argv) {
    static const int dps[] = {2, 4}, accums[] = {1, 2};
    int di, zi, ai, tied, a, quick = 0;
    double worst_loss = 0, worst_w = 0;
    /* --quick (the sanitizer build): every dp size with every ZeRO stage once, each pair under
       one of the four accumulation × tied variants (they take turns), instead of under all four */
    for (a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-v")) us_test_verbose = 1;
        if (!strcmp(argv[a], "--quick")) quick = 1;
    }

    /* ---- equivalence with one rank: dp 2 and 4 × ZeRO 0..3 × accumulation 1, 2 × tied or not */
    for (tied = 0; tied <= 1; tied++)
        for (ai = 0; ai < 2; ai++) {
            run ref;
            int64_t np;
            setup(&ref, 1, 0, accums[ai], tied, 25);
            make_data(&ref, 7 + ai);
            np = reference(&ref);
            CHECK(ref.rank_result[0] == US_OK, "reference run (accum %d, tied %d)", accums[ai],
                  tied);
            for (di = 0; di < 2; di++)
                for (zi = 0; zi <= 3; zi++) {
                    run R;
                    double ml = 0, mw = 0;
                    if (quick && zi != tied * 2 + ai) continue;
                    /* small buckets: several units, so reductions really interleave with the backward */
                    setup(&R, dps[di], zi, accums[ai], tied, zi == 3 ? 25 : 0.004f);
                    if (zi == 1) R.tc.loss_chunk = 24; /* the fused head in chunks of 24 rows */
                    R.in = ref.in;
                    R.tgt = ref.tgt;
                    R.weights = (float *)calloc((size_t)np, 4);
                    if (launch(&R) != US_OK) {
                        CHECK(0, "dp %d zero %d accum %d tied %d ran", dps[di], zi, accums[ai],
                              tied);
                        free(R.weights);
                        continue;
                    }
                    differences(&R, &ref, np, &ml, &mw);
                    if (ml > worst_loss) worst_loss = ml;
                    if (mw > worst_w) worst_w = mw;
                    CHECK(ml < 2e-5 && mw < 2e-5,
                          "dp %d zero %d accum %d %s%s: %d steps equal one rank (loss rel %.1e, "
                          "weights abs %.1e)",
                          dps[di], zi, accums[ai], tied ? "tied" : "untied",
                          zi == 1 ? ", head in chunks" : "", STEPS, ml, mw);
                    free(R.weights);
                }
            free(ref.weights);
            free(ref.in);
            free(ref.tgt);
        }
    printf(
        "  observed: losses within %.2e relative, final weights within %.2e absolute of one rank\n",
        worst_loss, worst_w);

    /* ---- the embedding's gradient by its touched rows (us__emb_sparse): a vocabulary of 256 of which
       the data uses 40, dim 16 — the condition holds, so the default reduces the last micro-batch's
       lookup gradient as packed rows and the rest of the bucket early. Against one rank and against
       the dense reduction; the replicas stay bitwise equal; the bytes sent shrink. */
    for (tied = 0; tied <= 1; tied++)
        for (ai = 0; ai < 2; ai++) {
            run ref;
            int64_t np;
            setup(&ref, 1, 0, accums[ai], tied, 0.004f);
            ref.mc.vocab = 256;
            ref.mc.dim = 16;
            ref.mc.n_heads = 2;
            ref.mc.n_kv_heads = 1;
            ref.vocab_used = 40;
            make_data(&ref, 21 + ai);
            np = reference(&ref);
            CHECK(ref.rank_result[0] == US_OK, "embedding rows: reference run (accum %d, tied %d)",
                  accums[ai], tied);
            for (di = 0; di < 2; di++)
                for (zi = 0; zi <= 1; zi++) {
                    run R[2]; /* by rows (the default), dense */
                    int v, r, same = 1;
                    double ml[2] = {0, 0}, mw[2] = {0, 0};
                    int64_t sent[2] = {0, 0};
                    if (quick && (di + zi + tied + ai) % 2) continue;
                    for (v = 0; v < 2; v++) {
                        setup(&R[v], dps[di], zi, accums[ai], tied, 0.004f);
                        R[v].mc = ref.mc;
                        R[v].tc.dense_emb_grad = v;
                        if (zi ==
                            1) /* the head in chunks: the logits buffer still holds the rows */
                            R[v].tc.loss_chunk = 8;
                        R[v].in = ref.in;
                        R[v].tgt = ref.tgt;
                        R[v].weights = (float *)calloc((size_t)np, 4);
                        for (r = 0; r < dps[di]; r++)
                            R[v].wr[r] = (float *)calloc((size_t)np + 4096, 4);
                        if (launch(&R[v]) != US_OK)
                            CHECK(0, "embedding rows: dp %d zero %d ran", dps[di], zi);
                        differences(&R[v], &ref, np, &ml[v], &mw[v]);
                        for (r = 0; r < dps[di]; r++) sent[v] += R[v].sent[r];
                    }
                    for (r = 1; r < dps[di]; r++)
                        same &= !memcmp(R[0].wr[0], R[0].wr[r], (size_t)np * 4);
                    CHECK(R[0].emb_sparse[0] && !R[1].emb_sparse[0] && ml[0] < 2e-5 &&
                              mw[0] < 2e-5 && ml[1] < 2e-5 && mw[1] < 2e-5,
                          "embedding by rows, dp %d zero %d accum %d %s: equals one rank (loss rel "
                          "%.1e, weights %.1e; dense %.1e, %.1e)",
                          dps[di], zi, accums[ai], tied ? "tied" : "untied", ml[0], mw[0], ml[1],
                          mw[1]);
                    CHECK(same,
                          "embedding by rows, dp %d zero %d accum %d %s: every rank's weights "
                          "equal rank 0's to the bit",
                          dps[di], zi, accums[ai], tied ? "tied" : "untied");
                    if (!tied && accums[ai] == 1 &&
                        zi == 0) { /* nothing to reduce early: only the packed rows travel */
                        int64_t table = (int64_t)ref.mc.vocab * ref.mc.dim * 4,
                                rows = (int64_t)40 * ref.mc.dim * 4;
                        int64_t per_rank_min =
                            STEPS * (2 * (dps[di] - 1) * (table - rows) / dps[di] - GB * T * 4);
                        CHECK(
                            sent[1] - sent[0] >= dps[di] * per_rank_min,
                            "embedding by rows, dp %d untied: %lld bytes sent instead of %lld (at "
                            "least %lld fewer: the table's all-reduce less 40 rows and the tokens)",
                            dps[di], (long long)sent[0], (long long)sent[1],
                            (long long)(dps[di] * per_rank_min));
                    }
                    for (v = 0; v < 2; v++) {
                        free(R[v].weights);
                        for (r = 0; r < dps[di]; r++) free(R[v].wr[r]);
                    }
                }
            free(ref.weights);
            free(ref.in);
            free(ref.tgt);
        }
    { /* ranks whose micro-batches differ in size (rank 0 two sequences, rank 1 one, through
           us_forward_backward): the rows' exchange sees the counts differ and every rank reduces the
           whole gradient instead; one step equals one rank running both micro-batches */
        un_run U;
        us_model ref;
        us_train_config tc;
        double ls;
        int64_t j, np;
        double mw = 0;
        memset(&U, 0, sizeof U);
        U.mc.n_layers = 2;
        U.mc.dim = 16;
        U.mc.n_heads = 2;
        U.mc.n_kv_heads = 1;
        U.mc.vocab = 256;
        U.mc.ffn_dim = 40;
        memset(&tc, 0, sizeof tc);
        tc.batch = 2;
        tc.seq = T;
        tc.steps = 1;
        tc.lr = 1e-2f;
        tc.threads = 1;
        tc.seed = 99;
        us_test_rs = 31;
        for (j = 0; j < 3 * T; j++) {
            U.in[j] = (int32_t)(rnd64() % 40);
            U.tgt[j] = (int32_t)(rnd64() % 40);
        }
        CHECK(us_model_init(&ref, &U.mc, &tc, NULL) == US_OK,
              "unequal micro-batches: the one-rank reference");
        np = ref.n_flat;
        us_model_zero_grad(&ref);
        us_forward_backward(&ref, U.in, U.tgt, 2, T, 1.0f / (3 * T), &ls);
        us_forward_backward(&ref, U.in + 2 * T, U.tgt + 2 * T, 1, T, 1.0f / (3 * T), &ls);
        {
            float gn, lr;
            CHECK(us_optimizer_step(&ref, &gn, &lr) == US_OK, "reference step");
        }
        U.tc = tc;
        U.tc.dp = 2;
        U.w = (float *)calloc((size_t)np, 4);
        CHECK(us_test_launch(2, unequal_rank, &U, U.res, 1) == US_OK && U.sparse,
              "unequal micro-batches: dp 2 ran (the model reduces by rows when it can)");
        for (j = 0; j < np; j++) {
            double d = fabs(U.w[j] - ((float *)ref.w)[j]);
            if (d > mw) mw = d;
        }
        CHECK(mw < 2e-5,
              "unequal micro-batches (2 and 1 sequences): rank 0's weights equal one rank's after "
              "a step (max |diff| %.1e)",
              mw);
        free(U.w);
        us_model_free(&ref);
    }
    { /* where it would not pay or fit, the default stays dense: ZeRO-2, and the vocabulary of 61 above */
        us_model_config mc;
        us_train_config tc;
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        mc.vocab = 256;
        mc.dim = 16;
        tc.dp = 2;
        CHECK(us__emb_sparse(&mc, &tc), "vocab 256, dim 16, dp 2: by rows");
        tc.zero = 2;
        CHECK(!us__emb_sparse(&mc, &tc), "... not under ZeRO-2 (the gradient lives in slots)");
        tc.zero = 0;
        tc.pp = 2;
        CHECK(!us__emb_sparse(&mc, &tc), "... not under pp 2");
        tc.pp = 0;
        mc.vocab = 61;
        mc.dim = 32;
        tc.precision = US_PRECISION_FP32;
        CHECK(!us__emb_sparse(&mc, &tc),
              "vocab 61, dim 32, fp32, dp 2: dense (the packed rows would not fit the logits)");
    }

    /* ---- memory: what each rank allocated is the estimator's prediction, and ZeRO saves it */
    {
        for (zi = 0; zi <= 3; zi++) {
            run R;
            int ok = 1, r;
            setup(&R, 4, zi, 1, zi == 2, 0.004f);
            R.tc.precision = US_PRECISION_BF16;
            make_data(&R, 3);
            launch(&R);
            for (r = 0; r < 4; r++) {
                ok &= !memcmp(&R.mem[r], &R.est[r], sizeof(us_memory));
                /* the backend really holds it: the categories plus at most 256 bytes of alignment per buffer */
                ok &= R.backend_bytes[r] >= R.mem[r].total &&
                      R.backend_bytes[r] <= R.mem[r].total + 16 * 256 + 2 * 64;
            }
            CHECK(ok,
                  "ZeRO-%d bf16 dp 4 %s: every rank's memory equals the estimate (params %zu, "
                  "master %zu, grads %zu, optimizer %zu bytes; backend %zu of %zu)",
                  zi, zi == 2 ? "tied" : "untied", R.mem[0].params, R.mem[0].master, R.mem[0].grads,
                  R.mem[0].optimizer, R.backend_bytes[0], R.mem[0].total);
            free(R.in);
            free(R.tgt);
        }
        { /* the book's ratio: ZeRO-1 optimizer state (Adam + master, 12 bytes/param) is 1/dp */
            us_model_config mc;
            us_train_config tc;
            us_memory m0, m1;
            memset(&mc, 0, sizeof mc);
            memset(&tc, 0, sizeof tc);
            mc.n_layers = 8;
            mc.dim = 512;
            tc.precision = US_PRECISION_BF16;
            tc.dp = 8;
            us_memory_estimate(&mc, &tc, &m0, NULL, 0);
            tc.zero = 1;
            us_memory_estimate(&mc, &tc, &m1, NULL, 0);
            CHECK(fabs((double)(m1.optimizer + m1.master) * 8 / (double)(m0.optimizer + m0.master) -
                       1) < 1e-3,
                  "ZeRO-1 over 8 ranks: optimizer + master = 1/8 of unsharded (%zu vs %zu bytes)",
                  m1.optimizer + m1.master, m0.optimizer + m0.master);
            { /* each stage keeps less model state per rank than the one before */
                size_t prev = m0.params + m0.master + m0.grads + m0.optimizer, cur;
                for (zi = 1; zi <= 3; zi++) {
                    tc.zero = zi;
                    us_memory_estimate(&mc, &tc, &m1, NULL, 0);
                    cur = m1.params + m1.master + m1.grads + m1.optimizer;
                    CHECK(
                        cur < prev,
                        "8 layers, dim 512, dp 8: ZeRO-%d model state %.2f MiB < ZeRO-%d %.2f MiB",
                        zi, cur / 1048576.0, zi - 1, prev / 1048576.0);
                    prev = cur;
                }
            }
        }
    }

    /* ---- overlap: the first bucket's reduction starts before the backward ends; no_sync */
    {
        run R;
        int r, ok = 1, launches = 0, units = 0;
        setup(&R, 2, 0, 2, 0, 0.004f);
        make_data(&R, 5);
        R.tracing = 1;
        CHECK(launch(&R) == US_OK, "traced dp 2 run");
        for (r = 0; r < 2; r++) {
            us_trace *t = &R.trace[r];
            int i, bwd_seen = 0;
            double first_comm = 1e300, bwd_end = 0;
            /* the first step: comm events start before "backward layer 0" of its last micro-batch ends */
            for (i = 0; i < t->n[US_STREAM_COMPUTE]; i++) {
                const us_trace_event *e = &t->ev[US_STREAM_COMPUTE][i];
                if (!strcmp(e->name, "backward layer 0") && ++bwd_seen == 2)
                    bwd_end = e->t1; /* micro-batch 2 of step 1 */
                if (!strncmp(e->name, "launch unit", 11)) launches++;
            }
            for (i = 0; i < t->n[US_STREAM_COMM]; i++)
                if (t->ev[US_STREAM_COMM][i].t0 < first_comm)
                    first_comm = t->ev[US_STREAM_COMM][i].t0;
            ok &= t->n[US_STREAM_COMM] > 0 && first_comm < bwd_end;
            if (r == 0)
                printf("  rank 0: first reduction starts %.0f us before the backward ends\n",
                       bwd_end - first_comm);
        }
        { /* how many units the model has: one launch per unit per step (no_sync), never per micro-batch */
            us_model m;
            us_train_config tc = R.tc;
            tc.dp = 1;
            tc.batch = GB / 2;
            us_model_init(&m, &R.mc, &tc, NULL);
            units = m.n_units;
            us_model_free(&m);
        }
        CHECK(ok, "the first bucket's reduction starts before the backward ends, on both ranks");
        CHECK(units > 2 && launches == 2 * STEPS * units,
              "no_sync: %d launches = ranks x steps x %d units (accumulation 2 reduces once per "
              "step)",
              launches, units);
        for (r = 0; r < 2; r++) us_trace_free(&R.trace[r]);
        free(R.in);
        free(R.tgt);
    }

    /* ---- ZeRO-1's weight all-gather overlaps the optimizer step: each unit's gather is issued as
       soon as its piece is updated, not after every piece. The order of the calls says it without
       a clock: wrappers log each AdamW piece ('A') and each all-gather ('G') per rank, and in every
       step a G must come before the last A. */
    {
        run R;
        int r, k, steps_ok = 0, steps = 0;
        setup(&R, 2, 1, 1, 0, 0.004f);
        make_data(&R, 13);
        R.log_order = 1;
        memset(oplen, 0, sizeof oplen);
        CHECK(launch(&R) == US_OK, "dp 2 ZeRO-1 run with its calls logged");
        for (r = 0; r < 2; r++) {
            const char *p = oplog[r];
            for (k = 0; k < STEPS; k++) { /* a step: '|', then its A's and G's */
                int lastA = -1, firstG = -1, i;
                if (*p != '|') break;
                for (i = 1; p[i] && p[i] != '|'; i++) {
                    if (p[i] == 'A')
                        lastA = i;
                    else if (p[i] == 'G' && firstG < 0)
                        firstG = i;
                }
                steps++;
                steps_ok += firstG >= 0 && firstG < lastA;
                p += i;
            }
        }
        CHECK(steps == 2 * STEPS && steps_ok == steps,
              "ZeRO-1: in %d of %d rank-steps a weight all-gather is issued before the last AdamW "
              "piece (%.40s...)",
              steps_ok, steps, oplog[0]);
        free(R.in);
        free(R.tgt);
    }

    /* ---- failure: one rank errors mid-run → every rank returns an error, the process goes on */
    for (zi = 0; zi <= 3; zi += 3) {
        run R;
        us_result res;
        int r, all = 1;
        setup(&R, 4, zi, 1, 0, 0.004f);
        make_data(&R, 9);
        R.fail_rank = 2;
        R.weights = NULL;
        res = launch(&R);
        for (r = 0; r < 4; r++) all &= R.rank_result[r] != US_OK;
        CHECK(res != US_OK && all,
              "ZeRO-%d: rank 2 fails at step 3 -> all 4 ranks return an error, no hang", zi);
        free(R.in);
        free(R.tgt);
    }
    { /* and the process is fine: a clean run afterwards */
        run R;
        setup(&R, 2, 1, 1, 0, 25);
        make_data(&R, 11);
        R.weights = (float *)calloc(100000, 4);
        CHECK(launch(&R) == US_OK && isfinite(R.loss[STEPS - 1]),
              "a run after the failures succeeds");
        free(R.weights);
        free(R.in);
        free(R.tgt);
    }
    { /* a mismatched communicator is a clear error */
        us_model m;
        us_model_config mc;
        us_train_config tc;
        us_comm self;
        us_ops o = us_cpu_ops(1);
        memset(&mc, 0, sizeof mc);
        memset(&tc, 0, sizeof tc);
        tc.dp = 2;
        us_comm_self(&self, &o);
        CHECK(us_model_init_dist(&m, &mc, &tc, NULL, &self) == US_ERR_INVALID &&
                  strstr(m.err, "dp=2"),
              "dp 2 on a one-rank communicator: %s", m.err);
        tc.dp = 1;
        tc.zero = 4;
        CHECK(us_model_init(&m, &mc, &tc, NULL) == US_ERR_INVALID && strstr(m.err, "zero=4"),
              "zero 4: %s", m.err);
    }
    check_bf16_reduction();
    check_bf16_training();
    return us_test_done("test_dp");
}
