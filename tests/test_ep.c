/* test_ep.c — expert parallelism on CPU threads: a MoE model with its routed experts split over
   ep ranks (folded over dp) must reproduce the single-rank run over STEPS steps: losses and
   gradient norms, the final weights (each expert gathered from the rank that holds it, looked up
   by its Hugging Face name), and the router bias of the auxiliary-loss-free balancing, which must
   be the same on every rank. Configurations: ep 2 and 4 (= dp), dp 4 × ep 2 (each expert on two
   ranks, its gradient reduced over them), data parallelism without ep, the shared expert with
   sigmoid gates, the auxiliary loss with a capacity limit (uneven and empty per-peer counts),
   recomputation with accumulation, ZeRO-1/3 without ep, tensor parallelism (tp 2, dp 2 ×
   tp 2 × ep 2, dp 4 × tp 2 × ep 2: the MoE layer runs whole on each tp rank, the ep groups are
   per tp index), and context parallelism (cp 2, cp 2 × ep 2, dp 2 × cp 2 × ep 2/4 with the aux
   loss, whose expert counts are the whole micro-batch's, tp 2 × cp 2 × ep 2: each rank routes
   its zig-zag slice of every sequence), and pipeline parallelism (pp 2 under AFAB, 1F1B,
   interleaved, ZB-H1, ZB-V and DualPipe-V; a stage without a MoE layer; a slot place dense in one
   chunk and MoE in the other; dp 2 × pp 2 × ep 2), then issue 25's 5D meshes with a DeepSeek-style
   model (first layer dense, shared expert, sigmoid gates, group-limited routing, router bias):
   dp 2 × pp 2 × ep 2 × tp 2 + sp on 16 threads and pp 2 × cp 2 × ep 2. The routing statistics
   and the last step's expert loads (us_step_stats, summed over the stages under pp) equal the
   reference's; each layer's bias is compared on the stage that holds it. Per-rank memory equals
   the estimator (under pp: the first stage's); bad settings are refused in one sentence. The
   pipelines whose MoE layers communicate inside a stage run under NCCL's semantics, the
   schedules of several chunks on the clock (// >>pp). After training, every variant decodes past
   seq with the KV cache (// >>sample): every rank gets the same logits as one rank.

   The reference is one rank running each data-parallel rank's micro-batch as a micro-batch of
   its own (grad_accum × dp of them): the auxiliary loss and the capacity limit are statistics
   of a micro-batch, so that is the run dp ranks reproduce.

   Tolerance (fp32): an expert sums its weight gradient over the rows of all ep peers in one GEMM
   and data parallelism sums over ranks, so results agree to rounding: losses and gradient norms
   within 1e-5 relative, final weights within 1e-4 absolute (printed: the observed maxima). */
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
static int steps = STEPS; /* --quick (the sanitizer build): 2, the first update and one more */
#define GB 8
#define T 8
#define MAXR 16
#define GL (T + 8) /* positions of the generation check, past seq */

typedef struct run {
    us_model_config mc;
    us_train_config tc; /* tc.batch = each rank's micro-batch */
    int32_t *in, *tgt;  /* [STEPS][accum·dp][B][T] = [STEPS][accum][GB][T] */
    float loss[STEPS], gnorm[STEPS], imb[STEPS],
        aux[STEPS];       /* + the routing statistics, summed over the ranks */
    int n_expert_t[MAXR]; /* each rank's expert tensors */
    /* the reference's tensors: names and offsets in its flat order */
    int np_t;
    char (*names)[80];
    int64_t *refoff, n_ref;
    float *weights;         /* [n_ref] the final weights, by reference offset */
    float *bias;            /* [n_moe·E] the final router bias (the reference's) */
    const float *ref_bias;  /* the reference's, compared on every rank */
    double bias_diff[MAXR]; /* each rank's largest difference from ref_bias */
    us_memory mem[MAXR], est[MAXR];
    us_result res[MAXR];
    int skew;          /* see variant */
    int pp_rank[MAXR]; /* each rank's pipeline stage: the estimator speaks for the first */
    int64_t load[64];  /* the last step's expert loads, the model's [MoE layers][E] */
    int n_load;
    /* each rank's logits after each of in[4 .. GL-1], decoded with the KV cache (// >>sample) */
    float gen_lg[MAXR][GL - 4][20];
} run;

/* Teacher-forced decoding of in[0..GL): a prompt of 5, then one token a step, past seq. */
static us_result rank_gen(us_model *m, const int32_t *in, float (*lg)[20]) {
    us_gen g;
    us_result r = us_gen_init(&g, m, 1, GL);
    int t;
    if (r == US_OK) r = us_gen_forward(&g, in, 5, lg[0]);
    for (t = 5; t < GL && r == US_OK; t++) r = us_gen_forward(&g, in + t, 1, lg[t - 4]);
    us_gen_free(&g);
    return r;
}

static int ref_index(const run *R, const char *name) {
    int i;
    for (i = 0; i < R->np_t; i++)
        if (!strcmp(R->names[i], name)) return i;
    return -1;
}

/* The place of global layer lg among the model's MoE layers (a pipeline stage holds some). */
static int moe_global_idx(const us_model_config *mc, int lg) {
    int j, n = 0;
    for (j = 0; j < lg; j++)
        n += j >= mc->moe_first_dense && (j - mc->moe_first_dense) % mc->moe_every == 0;
    return n;
}

static us_result rank_fn(us_comm *c, void *arg) {
    run *R = (run *)arg;
    us_model m;
    us_train_config tc = R->tc;
    int rank = c ? c->world.rank : 0, s, k, dr, i, b, t, cp = tc.cp > 1 ? tc.cp : 1, Tl = T / cp;
    int32_t pos[T];
    size_t per = (size_t)tc.batch * Tl;
    int32_t *in = (int32_t *)malloc(per * tc.grad_accum * 4),
            *tgt = (int32_t *)malloc(per * tc.grad_accum * 4);
    us_result r;
    r = c ? us_model_init_dist(&m, &R->mc, &tc, NULL, c) : us_model_init(&m, &R->mc, &tc, NULL);
    if (r != US_OK) {
        printf("  rank %d init: %s\n", rank, m.err);
        free(in);
        free(tgt);
        return r;
    }
    us_memory_estimate(&R->mc, &tc, &R->est[rank], NULL, 0);
    R->mem[rank] = m.mem;
    R->pp_rank[rank] = m.mesh.pp_rank;
    if (R->skew) { /* the router bias steers the choice: experts 0..K-1 win every token */
        size_t e, E = (size_t)m.cfg.moe_experts;
        for (e = 0; e < (size_t)m.n_moe * E; e++)
            m.moe_bias_h[e] = (int)(e % E) < m.cfg.moe_top_k ? 100.0f : 0.0f;
        m.ops.copy(&m.ops, m.moe_bias, m.moe_bias_h, (size_t)m.n_moe * E * 4, US_COPY_H2D);
    }
    dr = m.mesh.dp_rank;
    us_cp_positions(&m.tc, m.mesh.cp_rank, pos);
    for (i = 0; i < m.n_params_t; i++) R->n_expert_t[rank] += m.params[i].expert;
    for (s = 0; s < steps && r == US_OK; s++) {
        us_step_stats st;
        /* this rank's sequences of every global micro-batch (dp), its positions in each (cp) */
        for (k = 0; k < tc.grad_accum; k++)
            for (b = 0; b < tc.batch; b++)
                for (t = 0; t < Tl; t++) {
                    size_t src =
                        (((size_t)s * tc.grad_accum + k) * tc.batch * (tc.dp > 0 ? tc.dp : 1) +
                         (size_t)dr * tc.batch + b) *
                            T +
                        pos[t];
                    in[k * per + b * Tl + t] = R->in[src];
                    tgt[k * per + b * Tl + t] = R->tgt[src];
                }
        r = us_train_step(&m, in, tgt, &st);
        if (r != US_OK) {
            printf("  rank %d step %d: %s\n", rank, s, m.err);
            break;
        }
        if (rank == 0) {
            R->loss[s] = st.loss;
            R->gnorm[s] = st.grad_norm;
            R->imb[s] = st.moe_imbalance;
            R->aux[s] = st.moe_aux_loss;
            R->n_load = m.n_moe_all * m.cfg.moe_experts;
            if (R->n_load <= 64) memcpy(R->load, st.moe_load, sizeof(int64_t) * R->n_load);
        }
    }
    if (r == US_OK) {
        /* the weights: replicated tensors from dp rank 0, each expert from the first rank holding it,
           tensor-parallel slices from every tp rank into their place in the full tensor */
        int tp = m.tc.tp, t = m.mesh.tp_rank;
        for (i = 0; i < m.n_params_t; i++) {
            const us_param *p = &m.params[i];
            int j = ref_index(R, p->name),
                first = p->expert && m.ep > 1 ? m.edp_g.rank == 0 : m.mesh.dpcp_g.rank == 0;
            int64_t e;
            if (j < 0) {
                printf("  rank %d: tensor %s is not in the reference\n", rank, p->name);
                r = US_ERR_INVALID;
                break;
            }
            if (!first || (!p->tp_split && t != 0)) continue;
            for (e = 0; e < p->numel; e++) {
                int64_t rr = p->ndim == 2 ? e / p->shape[1] : e,
                        cc = p->ndim == 2 ? e % p->shape[1] : 0, f = e;
                if (p->tp_split == 1) f = (t * p->shape[0] + rr) * p->shape[1] + cc;
                if (p->tp_split == 2) f = rr * p->shape[1] * tp + t * p->shape[1] + cc;
                R->weights[R->refoff[j] + f] = ((const float *)m.w)[p->offset + e];
            }
        }
        if (m.n_moe) { /* each local MoE layer's bias against the reference's layer */
            size_t E = (size_t)m.cfg.moe_experts, e;
            int l;
            double d = 0;
            if (rank == 0 && R->bias) memcpy(R->bias, m.moe_bias_h, (size_t)m.n_moe * E * 4);
            for (l = 0; l < m.cfg.n_layers && R->ref_bias; l++) {
                const float *b = m.moe_bias_h + (size_t)m.moe_idx[l] * E,
                            *rb = R->ref_bias + (size_t)moe_global_idx(&m.cfg, m.layer_g[l]) * E;
                for (e = 0; e < E && m.moe_idx[l] >= 0; e++)
                    if (fabs(b[e] - rb[e]) > d) d = fabs(b[e] - rb[e]);
            }
            R->bias_diff[rank] = d;
        }
    }
    if (r == US_OK && (r = rank_gen(&m, R->in, R->gen_lg[rank])) != US_OK)
        printf("  rank %d generation: %s\n", rank, m.err);
    us_model_free(&m);
    free(in);
    free(tgt);
    return r;
}

static us_model_config moe_model(int E, int K) {
    us_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.vocab = 20; /* divisible by tp 2 */
    mc.dim = 16;
    mc.n_layers = 2;
    mc.n_heads = 4;
    mc.n_kv_heads = 2;
    mc.ffn_dim = 24;
    mc.init_std = 0.3f;
    mc.moe_experts = E;
    mc.moe_top_k = K;
    mc.moe_ffn_dim = 12;
    mc.moe_bias_rate = 1e-2f; /* large enough that the bias visibly moves in a few steps */
    return mc;
}

typedef struct variant {
    const char *what;
    int dp, ep, E, K, accum, shared, sigmoid, aux, zero;
    float cap;
    us_recompute rc;
    int tp;
    int skew; /* a large router bias sends every token to experts 0..K-1: the other ranks' experts get nothing */
    int cp; /* context parallelism (0: 1): each rank routes its slice of every sequence */
    int sp; /* sequence parallelism (tp > 1): the tp group's tokens gathered around the MoE layer */
    /* pipeline parallelism: with a schedule (a us_pp_kind, 0: none) pp 2, each stage running its
       own layers' routers and experts */
    int sched, layers; /* the schedule, the model's layers (0: 2) */
    int deepseek; /* DeepSeek-style: first layer dense, 2 groups of experts, each token's from 1 */
} variant;

static void setup(run *R, const variant *v, int ranks) {
    memset(R, 0, sizeof *R);
    R->mc = moe_model(v->E, v->K);
    if (v->layers) R->mc.n_layers = v->layers;
    if (v->deepseek) {
        R->mc.moe_first_dense = 1;
        R->mc.moe_groups = 2;
        R->mc.moe_top_groups = 1;
    }
    R->mc.moe_shared = v->shared;
    if (v->sigmoid) R->mc.moe_gate = US_MOE_SIGMOID;
    if (v->aux) R->mc.moe_balance = US_MOE_BALANCE_AUX;
    R->mc.moe_capacity = v->cap;
    R->tc.batch = GB / v->dp;
    R->tc.seq = T;
    R->tc.steps = steps;
    R->tc.lr = 1e-2f;
    R->tc.threads = 1;
    R->tc.seed = 11;
    R->skew = v->skew;
    R->tc.recompute = v->rc;
    R->tc.bucket_mb = 0.002f; /* small buckets: several units of each kind */
    if (ranks > 1) {
        R->tc.dp = v->dp;
        R->tc.ep = v->ep;
        R->tc.zero = v->zero;
        R->tc.grad_accum = v->accum;
        R->tc.tp = v->tp > 1 ? v->tp : 1;
        R->tc.cp = v->cp > 1 ? v->cp : 1;
        R->tc.sp = v->sp;
        R->tc.pp = v->sched ? 2 : 1;
        R->tc.pp_schedule = v->sched;
        /* the schedules of several chunks time their messages on the clock, NCCL's plan: the
           channels' plan still deadlocks there under NCCL's semantics (// >>pp) */
        R->tc.pp_clock = v->sched >= US_PP_INTERLEAVED && v->sched != US_PP_ZB1;
    } else
        R->tc.grad_accum = v->accum * v->dp; /* one rank: each rank's micro-batch in turn */
}

static void run_variant(const variant *v) {
    run ref, R;
    us_model tmp;
    int i, s;
    size_t n = (size_t)STEPS * v->accum * GB * T;
    double ml = 0, mg = 0, mw = 0, mb = 0, ms = 0, bmax = 0;
    int mem_ok = 1, shard_ok = 1,
        nr = v->dp * (v->tp > 1 ? v->tp : 1) * (v->cp > 1 ? v->cp : 1) *
             (v->sched ? 2 : 1); /* the layout's ranks */
    int n_moe_all, nexp = 0;
    setup(&ref, v, 1);
    ref.in = (int32_t *)malloc(n * 4);
    ref.tgt = (int32_t *)malloc(n * 4);
    us_test_rs = 1000 + (uint64_t)v->E * 7 + (uint64_t)v->dp;
    for (i = 0; i < (int)n; i++) {
        ref.in[i] = (int32_t)(rnd64() % 19);
        ref.tgt[i] = rnd01() < 0.15 ? -1 : (int32_t)(rnd64() % 19);
    }
    if (us_model_init(&tmp, &ref.mc, &ref.tc, NULL) != US_OK) {
        CHECK(0, "%s: reference init: %s", v->what, tmp.err);
        return;
    }
    ref.np_t = tmp.n_params_t;
    ref.names = (char(*)[80])malloc(sizeof(*ref.names) * (size_t)ref.np_t);
    ref.refoff = (int64_t *)malloc(sizeof(int64_t) * (size_t)ref.np_t);
    for (i = 0; i < ref.np_t; i++) {
        memcpy(ref.names[i], tmp.params[i].name, 80);
        ref.refoff[i] = ref.n_ref;
        ref.n_ref += tmp.params[i].numel;
    }
    ref.bias = (float *)calloc((size_t)tmp.n_moe * v->E, 4);
    n_moe_all = tmp.n_moe;
    us_model_free(&tmp);
    ref.weights = (float *)calloc((size_t)ref.n_ref, 4);
    CHECK(us_test_launch(1, rank_fn, &ref, NULL, 0) == US_OK, "%s: the reference ran", v->what);

    setup(&R, v, nr);
    R.in = ref.in;
    R.tgt = ref.tgt;
    R.np_t = ref.np_t;
    R.names = ref.names;
    R.refoff = ref.refoff;
    R.n_ref = ref.n_ref;
    R.weights = (float *)calloc((size_t)ref.n_ref, 4);
    R.ref_bias = ref.bias;
    if (us_test_launch(nr, rank_fn, &R, R.res, 0) != US_OK)
        CHECK(0, "%s: ran on %d ranks", v->what, nr);
    else {
        for (s = 0; s < steps; s++) {
            double dl = fabs(R.loss[s] - ref.loss[s]) / fabs(ref.loss[s]),
                   dg = fabs(R.gnorm[s] - ref.gnorm[s]) / fabs(ref.gnorm[s]);
            if (dl > ml) ml = dl;
            if (dg > mg) mg = dg;
            dl = fabs(R.imb[s] - ref.imb[s]) +
                 fabs(R.aux[s] - ref.aux[s]) / (fabs(ref.aux[s]) + 1e-30);
            if (dl > ms) ms = dl;
        }
        /* every rank of a stage holds E/ep experts of each of the stage's MoE layers */
        for (i = 0; i < nr; i++) nexp += R.n_expert_t[i];
        shard_ok = nexp == 3 * (v->E / v->ep) * n_moe_all * (nr / (v->sched ? 2 : 1));
        for (i = 0; i < v->E * n_moe_all; i++)
            if (fabs(ref.bias[i]) > bmax) bmax = fabs(ref.bias[i]);
        /* (ZeRO-3 ranks hold pieces of the flat buffers: there the losses and norms of every step speak) */
        for (i = 0; i < ref.n_ref && v->zero < 3; i++) {
            double d = fabs(R.weights[i] - ref.weights[i]);
            if (d > mw) mw = d;
        }
        for (i = 0; i < nr; i++)
            if (R.bias_diff[i] > mb) mb = R.bias_diff[i];
        for (i = 0; i < nr; i++)
            if (R.pp_rank[i] == 0) /* (under pp the estimate is the first stage's) */
                mem_ok &= R.mem[i].total == R.est[i].total &&
                          R.mem[i].activations == R.est[i].activations &&
                          R.mem[i].params == R.est[i].params;
        CHECK(ml < 1e-5 && mg < 1e-5 && mw < 1e-4,
              "%s: %d steps equal one rank (loss rel %.1e, grad norm rel %.1e, weights abs %.1e)",
              v->what, steps, ml, mg, mw);
        CHECK(
            mb < 1e-6 && (v->aux || bmax > 0),
            "%s: the router bias is the reference's on every rank (max diff %.1e; max |bias| %.2f)",
            v->what, mb, bmax);
        CHECK(ms < 1e-5,
              "%s: the routing statistics (imbalance, aux loss) are the reference's (diff %.1e)",
              v->what, ms);
        CHECK(R.n_load == ref.n_load && R.n_load <= 64 &&
                  !memcmp(R.load, ref.load, sizeof(int64_t) * R.n_load),
              "%s: the last step's expert loads (%d layers x %d experts) are the reference's",
              v->what, R.n_load / v->E, v->E);
        CHECK(shard_ok,
              "%s: each rank holds %d experts per MoE layer (all ranks: %d expert tensors)",
              v->what, v->E / v->ep, nexp);
        CHECK(mem_ok,
              "%s: per-rank memory = the estimate (rank 0: allocated %zu, estimated %zu bytes)",
              v->what, R.mem[0].total, R.est[0].total);
        { /* every rank decodes the whole sequence, experts over ep: one rank's logits */
            double e = 0;
            int same = 1, k;
            for (i = 0; i < nr; i++) {
                const float *a = &R.gen_lg[i][0][0], *b = &ref.gen_lg[0][0][0];
                same &= !memcmp(R.gen_lg[i], R.gen_lg[0], sizeof R.gen_lg[0]);
                for (k = 0; k < (GL - 4) * 20; k++)
                    if (fabs(a[k] - b[k]) > e) e = fabs(a[k] - b[k]);
            }
            CHECK(same && e < 1e-3,
                  "%s: KV-cache decoding to position %d (seq %d): every rank the same logits, "
                  "within %.1e of one rank's",
                  v->what, GL, T, e);
        }
    }
    free(R.weights);
    free(ref.weights);
    free(ref.bias);
    free(ref.names);
    free(ref.refoff);
    free(ref.in);
    free(ref.tgt);
}

static void test_refusals(void) {
    struct {
        const char *msg;
        int E, dp, ep, zero, tp, sp, cp, pp;
        float cap;
    } bad[] = {
        {"must divide dp x cp", 4, 4, 3, 0, 1, 0, 1, 1, 0},
        {"must divide experts", 6, 4, 4, 0, 1, 0, 1, 1, 0},
        {"needs a MoE model", 0, 2, 2, 0, 1, 0, 1, 1, 0},
        {"which cp and sp spread over several ranks", 4, 1, 2, 0, 1, 0, 2, 1, 1.25f},
        {"ep=-1 must be at least 1", 4, 2, -1, 0, 1, 0, 1, 1, 0},
    };

    int i;
    for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        us_model_config mc = moe_model(bad[i].E, 2);
        us_train_config tc;
        char err[256] = "";
        us_result r;
        memset(&tc, 0, sizeof tc);
        tc.dp = bad[i].dp;
        tc.ep = bad[i].ep;
        tc.zero = bad[i].zero;
        tc.tp = bad[i].tp;
        tc.sp = bad[i].sp;
        tc.cp = bad[i].cp;
        tc.pp = bad[i].pp;
        mc.moe_capacity = bad[i].cap;
        if (!bad[i].E) {
            mc.moe_ffn_dim = 0;
            mc.moe_top_k = 0;
            mc.moe_bias_rate = 0;
        }
        r = us_config_validate(&mc, &tc, err, sizeof err);
        CHECK(r == US_ERR_INVALID && strstr(err, bad[i].msg) && !strchr(err, '\n'),
              "refused in one sentence: %s", err);
    }
}

int main(int argc, char **argv) {
    static const variant vs[] = {
        /* what               dp ep E K acc sh sig aux z cap recompute tp skew cp sp sched L ds */
        {"ep 2 (dp 2)", 2, 2, 4, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE, 1, 0, 0, 0, 0, 0, 0},
        {"ep 4 (dp 4)", 4, 4, 8, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE, 1, 0, 0, 0, 0, 0, 0},
        {"dp 4 x ep 2 (experts on 2 ranks each)", 4, 2, 4, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE,
         1, 0, 0, 0, 0, 0, 0},
        {"dp 2 without ep", 2, 1, 4, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE, 1, 0, 0, 0, 0, 0, 0},
        {"ep 2, shared expert, sigmoid gates", 2, 2, 4, 2, 1, 1, 1, 0, 0, 0, US_RECOMPUTE_NONE, 1,
         0, 0, 0, 0, 0, 0},
        {"ep 4, top-1, aux loss, capacity 0.5", 4, 4, 8, 1, 1, 0, 0, 1, 0, 0.5f, US_RECOMPUTE_NONE,
         1, 0, 0, 0, 0, 0, 0},
        {"dp 4 x ep 2, accum 2, selective recompute", 4, 2, 4, 2, 2, 1, 0, 0, 0, 0,
         US_RECOMPUTE_SELECTIVE, 1, 0, 0, 0, 0, 0, 0},
        {"ep 2, accum 2, full recompute", 2, 2, 4, 2, 2, 0, 1, 0, 0, 0, US_RECOMPUTE_FULL, 1, 0, 0,
         0, 0, 0, 0},
        {"dp 2 without ep, ZeRO-1", 2, 1, 4, 2, 1, 0, 0, 0, 1, 0, US_RECOMPUTE_NONE, 1, 0, 0, 0, 0,
         0, 0},
        {"dp 2 without ep, ZeRO-3", 2, 1, 4, 2, 1, 0, 0, 0, 3, 0, US_RECOMPUTE_NONE, 1, 0, 0, 0, 0,
         0, 0},
        {"tp 2 (MoE whole on each tp rank)", 1, 1, 4, 2, 1, 1, 0, 0, 0, 0, US_RECOMPUTE_NONE, 2, 0,
         0, 0, 0, 0, 0},
        {"dp 2 x tp 2 x ep 2", 2, 2, 4, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE, 2, 0, 0, 0, 0, 0,
         0},
        {"dp 2 x tp 2 x ep 2, shared, sigmoid, full recompute", 2, 2, 4, 2, 2, 1, 1, 0, 0, 0,
         US_RECOMPUTE_FULL, 2, 0, 0, 0, 0, 0, 0},
        {"dp 4 x tp 2 x ep 2, aux loss", 4, 2, 4, 2, 1, 0, 0, 1, 0, 0, US_RECOMPUTE_NONE, 2, 0, 0,
         0, 0, 0, 0},
        {"ep 4, every token to rank 0's experts", 4, 4, 8, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE,
         1, 1, 0, 0, 0, 0, 0},
        /* context parallelism: each rank routes its (zig-zag) slice of every sequence */
        {"cp 2", 1, 1, 4, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE, 1, 0, 2, 0, 0, 0, 0},
        {"cp 2 x ep 2", 1, 2, 4, 2, 1, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE, 1, 0, 2, 0, 0, 0, 0},
        {"dp 2 x cp 2 x ep 2, aux loss, shared, accum 2, selective recompute", 2, 2, 4, 2, 2, 1, 0,
         1, 0, 0, US_RECOMPUTE_SELECTIVE, 1, 0, 2, 0, 0, 0, 0},
        {"dp 2 x cp 2 x ep 4, sigmoid gates, full recompute", 2, 4, 8, 2, 1, 0, 1, 0, 0, 0,
         US_RECOMPUTE_FULL, 1, 0, 2, 0, 0, 0, 0},
        {"tp 2 x cp 2 x ep 2, aux loss", 1, 2, 4, 2, 1, 0, 0, 1, 0, 0, US_RECOMPUTE_NONE, 2, 0, 2,
         0, 0, 0, 0},
        /* sequence parallelism: ln2's output gathered over tp, each rank keeps its rows */
        {"tp 2 + sp", 1, 1, 4, 2, 1, 1, 0, 0, 0, 0, US_RECOMPUTE_NONE, 2, 0, 1, 1, 0, 0, 0},
        {"dp 2 x tp 2 + sp x ep 2, aux loss, accum 2, selective recompute", 2, 2, 4, 2, 2, 0, 0, 1,
         0, 0, US_RECOMPUTE_SELECTIVE, 2, 0, 1, 1, 0, 0, 0},
        {"cp 2 x tp 2 + sp x ep 2, shared, sigmoid, full recompute", 1, 2, 4, 2, 1, 1, 1, 0, 0, 0,
         US_RECOMPUTE_FULL, 2, 0, 2, 1, 0, 0, 0},
        /* ZeRO: routed experts sharded over their dp·cp/ep replicas, the rest over dp×cp;
           Mixtral-style (top-2 of 8, softmax gates, aux loss) */
        {"ep 2 (dp 2), ZeRO-1, Mixtral-style", 2, 2, 8, 2, 1, 0, 0, 1, 1, 0, US_RECOMPUTE_NONE, 1,
         0, 0, 0, 0, 0, 0},
        {"ep 2 (dp 2), ZeRO-2, Mixtral-style", 2, 2, 8, 2, 1, 0, 0, 1, 2, 0, US_RECOMPUTE_NONE, 1,
         0, 0, 0, 0, 0, 0},
        {"ep 2 (dp 2), ZeRO-3, Mixtral-style", 2, 2, 8, 2, 1, 0, 0, 1, 3, 0, US_RECOMPUTE_NONE, 1,
         0, 0, 0, 0, 0, 0},
        {"dp 4 x ep 2, ZeRO-1, Mixtral-style, accum 2", 4, 2, 8, 2, 2, 0, 0, 1, 1, 0,
         US_RECOMPUTE_NONE, 1, 0, 0, 0, 0, 0, 0},
        {"dp 4 x ep 2, ZeRO-2, Mixtral-style, accum 2", 4, 2, 8, 2, 2, 0, 0, 1, 2, 0,
         US_RECOMPUTE_NONE, 1, 0, 0, 0, 0, 0, 0},
        {"dp 4 x ep 2, ZeRO-3, Mixtral-style, accum 2, selective recompute", 4, 2, 8, 2, 2, 0, 0, 1,
         3, 0, US_RECOMPUTE_SELECTIVE, 1, 0, 0, 0, 0, 0, 0},
        {"dp 4 x ep 2, ZeRO-2, half the ranks' experts get no token", 4, 2, 4, 2, 1, 0, 0, 0, 2, 0,
         US_RECOMPUTE_NONE, 1, 1, 0, 0, 0, 0, 0},
        {"dp 4 x ep 2, ZeRO-3, half the ranks' experts get no token", 4, 2, 4, 2, 1, 0, 0, 0, 3, 0,
         US_RECOMPUTE_NONE, 1, 1, 0, 0, 0, 0, 0},
        {"dp 2 x cp 2 x ep 2, ZeRO-2, shared expert", 2, 2, 4, 2, 1, 1, 0, 0, 2, 0,
         US_RECOMPUTE_NONE, 1, 0, 2, 0, 0, 0, 0},
        {"dp 2 x tp 2 + sp x ep 2, ZeRO-3, aux loss", 2, 2, 4, 2, 1, 0, 0, 1, 3, 0,
         US_RECOMPUTE_NONE, 2, 0, 1, 1, 0, 0, 0},
        /* ZeRO-2 at ep 1: each expert's gradients finished before the next's (two slots) */
        {"dp 2 without ep, ZeRO-2, Mixtral-style", 2, 1, 8, 2, 1, 0, 0, 1, 2, 0, US_RECOMPUTE_NONE,
         1, 0, 0, 0, 0, 0, 0},
        {"dp 2 without ep, ZeRO-2, shared expert, accum 2, full recompute", 2, 1, 4, 2, 2, 1, 0, 0,
         2, 0, US_RECOMPUTE_FULL, 1, 0, 0, 0, 0, 0, 0},
        /* pipeline parallelism: each stage routes through its own MoE layers; 4 micro-batches,
           4 layers (2 chunks per rank for interleaved and the V shapes). The last three columns:
           the schedule (pp 2 where set), the layers, DeepSeek-style */
        {"pp 2, 1F1B", 1, 1, 4, 2, 4, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE, 1, 0, 0, 0, US_PP_1F1B, 4,
         0},
        {"pp 2, AFAB, aux loss, capacity 1", 1, 1, 4, 2, 4, 0, 0, 1, 0, 1.0f, US_RECOMPUTE_NONE, 1,
         0, 0, 0, US_PP_AFAB, 4, 0},
        {"pp 2, interleaved, shared expert, selective recompute", 1, 1, 4, 2, 4, 1, 0, 0, 0, 0,
         US_RECOMPUTE_SELECTIVE, 1, 0, 0, 0, US_PP_INTERLEAVED, 4, 0},
        {"pp 2, ZB-H1 (the experts' Wgrad in W)", 1, 1, 4, 2, 4, 0, 0, 0, 0, 0, US_RECOMPUTE_NONE,
         1, 0, 0, 0, US_PP_ZB1, 4, 0},
        {"pp 2, ZB-V, sigmoid gates, aux loss", 1, 1, 4, 2, 4, 0, 1, 1, 0, 0, US_RECOMPUTE_NONE, 1,
         0, 0, 0, US_PP_ZBV, 4, 0},
        {"pp 2, DualPipe-V, shared expert", 1, 1, 4, 2, 4, 1, 0, 0, 0, 0, US_RECOMPUTE_NONE, 1, 0,
         0, 0, US_PP_DUALPIPEV, 4, 0},
        {"pp 2, 1F1B, a stage without a MoE layer (2 layers, the first dense)", 1, 1, 4, 2, 4, 0, 0,
         0, 0, 0, US_RECOMPUTE_NONE, 1, 0, 0, 0, US_PP_1F1B, 2, 1},
        {"pp 2, interleaved, a slot's layer dense in one chunk and MoE in the other", 1, 1, 4, 2, 4,
         0, 0, 0, 0, 0, US_RECOMPUTE_FULL, 1, 0, 0, 0, US_PP_INTERLEAVED, 4, 1},
        {"dp 2 x pp 2 x ep 2, 1F1B, aux loss, ZeRO-2", 2, 2, 4, 2, 4, 0, 0, 1, 2, 0,
         US_RECOMPUTE_NONE, 1, 0, 0, 0, US_PP_1F1B, 4, 0},
        {"dp 2 x pp 2 x ep 2, ZB-H1, ZeRO-1", 2, 2, 4, 2, 4, 1, 0, 0, 1, 0, US_RECOMPUTE_NONE, 1, 0,
         0, 0, US_PP_ZB1, 4, 0},
        {"pp 2 x tp 2 + sp, ZB-H1, DeepSeek-style (u gathered again in W)", 1, 1, 4, 2, 4, 1, 1, 0,
         0, 0, US_RECOMPUTE_NONE, 2, 0, 1, 1, US_PP_ZB1, 4, 1},
        /* ZeRO-2 and ZeRO-3 where a micro-batch's gradient comes in several actions, and W
           recomputing the MoE layer (issue 25) */
        {"dp 2 x pp 2 x ep 2, ZB-H1, ZeRO-2, selective recompute (W recomputes the MoE layer)", 2,
         2, 4, 2, 4, 0, 0, 0, 2, 0, US_RECOMPUTE_SELECTIVE, 1, 0, 0, 0, US_PP_ZB1, 4, 0},
        {"dp 2 x pp 2 x ep 2, interleaved, ZeRO-3, shared expert, full recompute", 2, 2, 4, 2, 4, 1,
         0, 0, 3, 0, US_RECOMPUTE_FULL, 1, 0, 0, 0, US_PP_INTERLEAVED, 4, 0},
        {"dp 2 x pp 2 x ep 2, ZB-V, ZeRO-3, full recompute", 2, 2, 4, 2, 4, 0, 0, 0, 3, 0,
         US_RECOMPUTE_FULL, 1, 0, 0, 0, US_PP_ZBV, 4, 0},
        /* issue 25's 5D meshes, DeepSeek-style: first layer dense, shared expert, sigmoid gates,
           group-limited routing (2 groups, each token's experts from its best one), the
           auxiliary-loss-free bias */
        {"dp 2 x pp 2 x ep 2 x tp 2 + sp (16 ranks), DeepSeek-style", 2, 2, 4, 2, 4, 1, 1, 0, 0, 0,
         US_RECOMPUTE_NONE, 2, 0, 1, 1, US_PP_1F1B, 4, 1},
        {"pp 2 x cp 2 x ep 2, DeepSeek-style", 1, 2, 4, 2, 4, 1, 1, 0, 0, 0, US_RECOMPUTE_NONE, 1,
         0, 2, 0, US_PP_1F1B, 4, 1},
    };
    int i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) us_test_verbose = 1;
        if (!strcmp(argv[i], "--quick")) steps = 2;
    }
    for (i = 0; i < (int)(sizeof vs / sizeof vs[0]); i++) {
        /* under NCCL's semantics (us_test_ranks.h) the pipelines whose MoE layers talk inside
           a stage (ep, cp, tp), and DualPipe-V on the clock: orders that would hang GPUs fail */
        us_test_nccl = vs[i].sched && (vs[i].ep > 1 || vs[i].cp > 1 || vs[i].tp > 1 ||
                                       vs[i].sched == US_PP_DUALPIPEV);
        run_variant(&vs[i]);
    }
    test_refusals();
    return us_test_done("test_ep");
}
