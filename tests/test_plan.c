/* test_plan.c — the planner (// >>plan) on the CPU, in well under a second:
     - every configuration us_plan_enumerate proposes passes us_config_validate, uses every GPU,
       reaches the requested global batch, fits by us_memory_estimate's own numbers, and comes
       out sorted;
     - the Playbook's known cases: Llama-70B on 8 × 80 GB fits with no configuration at all (its
       weights, fp32 gradients and AdamW state, 18 bytes per parameter, need 157 GB per GPU even
       fully sharded), the unsharded one needs far more; on 4 nodes it fits, and only sharded;
       a 1B model on 8 GPUs prefers pure data parallelism (tp = pp = cp = 1), and there the ZeRO
       stage changes the step by under 1 % (memory is not what binds);
     - cost model properties: more bandwidth is never slower; faster GEMMs never slower; the
       pipeline bubble equals the simulator's makespan minus the work, (p−1)(tF+tB+tW) for 1F1B;
       ZeRO-3's gathers hide under a large layer's compute but not under a tiny one's;
     - the rates file: written, read back, and its errors (bad header, unknown key, bad number). */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void llama(us_model_config *mc, int which) {
    memset(mc, 0, sizeof *mc);
    mc->vocab = 128256;
    if (which == 1) {
        mc->dim = 2048;
        mc->n_layers = 16;
        mc->n_heads = 32;
        mc->n_kv_heads = 8;
        mc->ffn_dim = 8192;
        mc->tie_embeddings = 1;
    }
    if (which == 8) {
        mc->dim = 4096;
        mc->n_layers = 32;
        mc->n_heads = 32;
        mc->n_kv_heads = 8;
        mc->ffn_dim = 14336;
    }
    if (which == 70) {
        mc->dim = 8192;
        mc->n_layers = 80;
        mc->n_heads = 64;
        mc->n_kv_heads = 8;
        mc->ffn_dim = 28672;
    }
}

static void check_plans(const char *what, const us_model_config *mc, const us_plan_cluster *cl,
                        const us_plan_request *q, us_plan *out, int n) {
    int i, bad_valid = 0, bad_world = 0, bad_batch = 0, bad_fit = 0, bad_order = 0, bad_mem = 0;
    for (i = 0; i < n; i++) {
        us_model_config m2 = *mc;
        us_train_config t2 = out[i].tc;
        us_memory mem;
        char err[256];
        if (us_config_validate(&m2, &t2, err, sizeof err) != US_OK) {
            bad_valid++;
            printf("  invalid: %s\n", err);
        }
        if ((int64_t)t2.dp * t2.tp * t2.pp * t2.cp != (int64_t)cl->gpus_per_node * cl->nodes)
            bad_world++;
        if ((int64_t)t2.batch * t2.grad_accum * t2.dp * t2.seq != q->global_tokens) bad_batch++;
        if (us_memory_estimate(mc, &out[i].tc, &mem, err, sizeof err) != US_OK ||
            mem.total != out[i].mem.total)
            bad_mem++;
        if (!out[i].fits ||
            (double)mem.total + cl->reserve_gib * 1073741824.0 > cl->gpu_mem_gib * 1073741824.0)
            bad_fit++;
        if (i && out[i].t_step < out[i - 1].t_step) bad_order++;
    }
    CHECK(n > 0, "%s: the planner proposes configurations (%d)", what, n);
    CHECK(!bad_valid, "%s: every proposed configuration passes us_config_validate (%d fail)", what,
          bad_valid);
    CHECK(!bad_world, "%s: every one uses all %d GPUs (%d do not)", what,
          cl->gpus_per_node * cl->nodes, bad_world);
    CHECK(!bad_batch, "%s: every one runs %lld tokens per step (%d do not)", what,
          (long long)q->global_tokens, bad_batch);
    CHECK(!bad_mem, "%s: every one's memory is the estimator's (%d differ)", what, bad_mem);
    CHECK(!bad_fit, "%s: every one fits in %.0f GiB less the reserve (%d do not)", what,
          cl->gpu_mem_gib, bad_fit);
    CHECK(!bad_order, "%s: sorted fastest first (%d out of order)", what, bad_order);
}

/* Mixture-of-experts models (issue 25): now that ZeRO and pp combine with ep, the planner
   proposes expert parallelism, and its all-to-all shows in the cost. Mixtral-8x7B on 8 nodes of 8 × 80 GB;
   a DeepSeek-shaped model (first layer dense, a shared expert, 64 sigmoid-gated experts, top 6
   from 4 of 8 groups, the router bias) on 2 nodes. */
static void test_moe_plans(void) {
    static us_plan out[512];
    us_model_config mc;
    us_plan_cluster cl;
    us_plan_request q;
    char err[256];
    int n, i, ep_fits = 0;
    int64_t nv, nf;
    memset(&mc, 0, sizeof mc);
    mc.vocab = 32000;
    mc.dim = 4096;
    mc.n_layers = 32;
    mc.n_heads = 32;
    mc.n_kv_heads = 8;
    mc.ffn_dim = 14336;
    mc.moe_experts = 8;
    mc.moe_top_k = 2;
    mc.moe_ffn_dim = 14336;
    memset(&cl, 0, sizeof cl);
    us_plan_cluster_defaults(&cl);
    cl.nodes = 8;
    memset(&q, 0, sizeof q);
    q.top = 512;
    /* 64 sequences a step, micro-batches up to 2: enough to show it, and quick (make test runs
       this under ASan too) */
    q.global_tokens = 64 * 4096;
    q.max_micro_batch = 2;
    us_plan_request_defaults(&q);
    CHECK(us_plan_enumerate(&mc, &cl, &q, out, &n, &nv, &nf, err, sizeof err) == US_OK && n > 0,
          "mixtral-8x7b on 8 nodes: enumerate (%s)", err);
    check_plans("mixtral x 64", &mc, &cl, &q, out, n);
    for (i = 0; i < n; i++) ep_fits += out[i].tc.ep > 1;
    for (i = 0; i < n; i++)
        if (out[i].tc.ep > 1 && !(out[i].t_ep > 0 && out[i].t_ep < out[i].t_step)) break;
    CHECK(
        ep_fits > 0 && i == n,
        "mixtral on 8 nodes: %d of the %d kept shard the experts, each with its all-to-all priced "
        "(best: ep %d pp %d)",
        ep_fits, n, out[0].tc.ep, out[0].tc.pp);
    for (i = 0; i < n; i++)
        if (out[i].tc.ep == 1 && out[i].t_ep != 0) break;
    CHECK(i == n, "mixtral: no all-to-all time where ep is 1");

    mc.vocab = 102400;
    mc.dim = 2048;
    mc.n_layers = 27;
    mc.n_heads = 16;
    mc.n_kv_heads = 16;
    mc.ffn_dim = 10944;
    mc.moe_experts = 64;
    mc.moe_top_k = 6;
    mc.moe_ffn_dim = 1408;
    mc.moe_shared = 1;
    mc.moe_first_dense = 1;
    mc.moe_gate = US_MOE_SIGMOID;
    mc.moe_groups = 8;
    mc.moe_top_groups = 4;
    cl.nodes = 2;
    CHECK(us_plan_enumerate(&mc, &cl, &q, out, &n, &nv, &nf, err, sizeof err) == US_OK && n > 0,
          "DeepSeek-shaped on 2 nodes: enumerate (%s)", err);
    check_plans("deepseek-shaped x 16", &mc, &cl, &q, out, n);
    for (i = 0, ep_fits = 0; i < n; i++) ep_fits += out[i].tc.ep >= 8;
    CHECK(ep_fits > 0, "DeepSeek-shaped: %d kept plans spread its 64 experts over >= 8 ranks",
          ep_fits);
}

int main(int argc, char **argv) {
    us_model_config mc;
    us_plan_cluster cl;
    us_plan_request q;
    static us_plan out[4096];
    us_plan p, p2;
    us_train_config tc;
    char err[256];
    int n, i;
    int64_t nv, nf;
    int quick;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    /* --quick (the sanitizer build in make test): the MoE searches, 20 s under ASan, are left out */
    quick = argc > 1 && !strcmp(argv[argc - 1], "--quick");

    /* ---- 1B on one node of 8 × 80 GB: pure data parallelism */
    llama(&mc, 1);
    memset(&cl, 0, sizeof cl);
    us_plan_cluster_defaults(&cl);
    memset(&q, 0, sizeof q);
    q.top = 4096;
    us_plan_request_defaults(&q);
    CHECK(us_plan_enumerate(&mc, &cl, &q, out, &n, &nv, &nf, err, sizeof err) == US_OK,
          "1B on 8 GPUs: enumerate (%s)", err);
    CHECK(n == nf && nf <= nv && nv > 100, "1B: %d kept = %lld fit <= %lld valid", n, (long long)nf,
          (long long)nv);
    check_plans("1B x 8", &mc, &cl, &q, out, n);
    CHECK(out[0].tc.tp == 1 && out[0].tc.pp == 1 && out[0].tc.cp == 1 && out[0].tc.dp == 8,
          "1B on 8 GPUs prefers pure data parallelism (best: dp %d tp %d pp %d cp %d)",
          out[0].tc.dp, out[0].tc.tp, out[0].tc.pp, out[0].tc.cp);
    { /* the best pure-DP plan of each ZeRO stage: within 1 % of each other, and ZeRO-0 holds the most memory */
        double best_z[4] = {0, 0, 0, 0};
        size_t mem_z[4] = {0, 0, 0, 0}, state_z[4] = {0, 0, 0, 0};
        for (i = 0; i < n; i++) {
            const us_train_config *t = &out[i].tc;
            if (t->tp == 1 && t->pp == 1 && t->cp == 1 && t->batch == 4 &&
                t->recompute == US_RECOMPUTE_NONE && best_z[t->zero] == 0) {
                best_z[t->zero] = out[i].t_step;
                mem_z[t->zero] = out[i].mem.total;
                state_z[t->zero] =
                    out[i].mem.params + out[i].mem.grads + out[i].mem.master + out[i].mem.optimizer;
            }
        }
        CHECK(best_z[0] > 0 && best_z[1] > 0 && best_z[2] > 0 && best_z[3] > 0,
              "1B: pure DP with micro-batch 4 fits under every ZeRO stage");
        /* ZeRO-1 moves the bytes of ZeRO-0; ZeRO-2 reduce-scatters every micro-batch and ZeRO-3
           also gathers the weights twice, so with the overlap tax (hidden traffic still slows
           the compute) they cost more, but under 10 % here */
        CHECK(fabs(best_z[1] / best_z[0] - 1) < 0.01,
              "1B pure DP: ZeRO-1's step %.1f ms within 1%% of ZeRO-0's %.1f", 1e3 * best_z[1],
              1e3 * best_z[0]);
        CHECK(best_z[1] < best_z[2] && best_z[2] < best_z[3] && best_z[3] < 1.1 * best_z[0],
              "1B pure DP: ZeRO-1 %.1f < ZeRO-2 %.1f < ZeRO-3 %.1f ms < 1.1 x ZeRO-0's %.1f",
              1e3 * best_z[1], 1e3 * best_z[2], 1e3 * best_z[3], 1e3 * best_z[0]);
        /* the ladder is the model states'; the totals fall with them where the activations
           are laid out alike — ZeRO-0 and 1 chunk the head (loss_chunk), ZeRO-2 and 3 cannot */
        CHECK(state_z[0] > state_z[1] && state_z[1] > state_z[2] && state_z[2] > state_z[3] &&
                  mem_z[0] > mem_z[1] && mem_z[2] > mem_z[3],
              "1B: the ZeRO ladder, model states %.1f > %.1f > %.1f > %.1f GiB (totals %.1f > "
              "%.1f, %.1f > %.1f)",
              state_z[0] / 1073741824.0, state_z[1] / 1073741824.0, state_z[2] / 1073741824.0,
              state_z[3] / 1073741824.0, mem_z[0] / 1073741824.0, mem_z[1] / 1073741824.0,
              mem_z[2] / 1073741824.0, mem_z[3] / 1073741824.0);
    }

    /* ---- 70B on 8 × 80 GB: nothing fits; on 4 nodes only sharded configurations do */
    llama(&mc, 70);
    memset(&tc, 0, sizeof tc);
    tc.dp = 8;
    tc.batch = 1;
    tc.seq = 4096;
    tc.grad_accum = 32;
    tc.precision = US_PRECISION_BF16;
    CHECK(us_plan_cost(&mc, &tc, &cl, &p, err, sizeof err) == US_OK,
          "70B dp 8 unsharded costs (%s)", err);
    CHECK(!p.fits && p.mem.total > 8.0 * 80 * 1073741824.0,
          "70B unsharded on 80 GB GPUs: %.0f GiB per GPU, no fit", p.mem.total / 1073741824.0);
    q.top = 16;
    q.max_micro_batch = 2; /* micro-batches of 1 and 2 sequences: enough to show it, and quick */
    CHECK(us_plan_enumerate(&mc, &cl, &q, out, &n, &nv, &nf, err, sizeof err) == US_OK && n == 0 &&
              nf == 0 && nv > 0,
          "70B on one node of 8 x 80 GB: %lld valid configurations, %lld fit", (long long)nv,
          (long long)nf);
    cl.nodes = 4;
    CHECK(us_plan_enumerate(&mc, &cl, &q, out, &n, &nv, &nf, err, sizeof err) == US_OK && n > 0,
          "70B on 4 nodes: %lld fit", (long long)nf);
    check_plans("70B x 32", &mc, &cl, &q, out, n);
    {
        int sharded = 1;
        for (i = 0; i < n; i++)
            if (out[i].tc.zero == 0 && out[i].tc.tp == 1 && out[i].tc.pp == 1) sharded = 0;
        CHECK(sharded, "70B on 4 nodes: every proposed configuration shards (ZeRO, tp or pp)");
        CHECK(out[0].tc.tp <= cl.gpus_per_node,
              "70B on 4 nodes: the best keeps TP inside a node (tp %d)", out[0].tc.tp);
    }

    /* ---- properties of the cost model, 8B on 2 nodes */
    llama(&mc, 8);
    memset(&cl, 0, sizeof cl);
    cl.nodes = 2;
    us_plan_cluster_defaults(&cl);
    {
        static const int cfg[][6] = {
            /* dp tp pp cp zero, schedule */
            {16, 1, 1, 1, 1, 0},         {8, 2, 1, 1, 0, 0},
            {4, 4, 1, 1, 1, 0},          {2, 8, 1, 1, 3, 0},
            {4, 2, 2, 1, 1, US_PP_1F1B}, {2, 4, 2, 1, 0, US_PP_ZB1},
            {4, 2, 1, 2, 1, 0},          {1, 8, 2, 1, 1, US_PP_INTERLEAVED},
            {8, 1, 1, 2, 3, 0}};
        int k, slower_bw = 0, slower_gemm = 0;
        for (k = 0; k < (int)(sizeof cfg / sizeof cfg[0]); k++) {
            us_plan_cluster c2 = cl;
            memset(&tc, 0, sizeof tc);
            tc.dp = cfg[k][0];
            tc.tp = cfg[k][1];
            tc.pp = cfg[k][2];
            tc.cp = cfg[k][3];
            tc.zero = cfg[k][4];
            tc.batch = 1;
            tc.seq = 4096;
            tc.grad_accum = 256 / tc.dp;
            tc.precision = US_PRECISION_BF16;
            if (tc.pp > 1) {
                tc.pp_schedule = cfg[k][5];
                tc.pp_chunks = cfg[k][5] == US_PP_INTERLEAVED ? 2 : 1;
            }
            if (us_plan_cost(&mc, &tc, &cl, &p, err, sizeof err) != US_OK) {
                CHECK(0, "8B config %d costs: %s", k, err);
                continue;
            }
            c2.rates.intra_gbps *= 2;
            c2.rates.inter_gbps *= 2;
            us_plan_cost(&mc, &tc, &c2, &p2, err, sizeof err);
            if (p2.t_step > p.t_step) slower_bw++;
            c2 = cl;
            c2.rates.gemm_tflops *= 1.5;
            us_plan_cost(&mc, &tc, &c2, &p2, err, sizeof err);
            if (p2.t_step > p.t_step) slower_gemm++;
            CHECK(fabs(p.t_step - (p.t_compute + p.t_recompute + p.t_tp + p.t_cp + p.t_ep +
                                   p.t_bubble + p.t_p2p + p.t_dp + p.t_zero3 + p.t_optimizer +
                                   p.t_overlap)) < 1e-9 * p.t_step,
                  "8B config %d: the step is the sum of its terms", k);
            CHECK(p.mfu > 0 && p.mfu < 1, "8B config %d: MFU %.3f in (0, 1)", k, p.mfu);
        }
        CHECK(!slower_bw, "doubling the bandwidths never makes a step slower (%d did)", slower_bw);
        CHECK(!slower_gemm, "faster GEMMs never make a step slower (%d did)", slower_gemm);
    }
    { /* the bubble term against the simulator: 1F1B's (p−1)(tF+tB+tW), and each schedule's makespan − work */
        static const int kinds[] = {US_PP_1F1B, US_PP_AFAB, US_PP_INTERLEAVED, US_PP_ZB1,
                                    US_PP_ZBV};
        int k;
        for (k = 0; k < 5; k++) {
            us_pp_schedule s;
            us_pp_sim sim;
            double tF, tB, tW, work;
            memset(&tc, 0, sizeof tc);
            tc.dp = 2;
            tc.tp = 2;
            tc.pp = 4;
            tc.batch = 1;
            tc.seq = 4096;
            tc.grad_accum = 128;
            tc.precision = US_PRECISION_BF16;
            tc.pp_schedule = kinds[k];
            tc.pp_chunks = kinds[k] == US_PP_INTERLEAVED || kinds[k] == US_PP_ZBV ? 2 : 1;
            if (us_plan_cost(&mc, &tc, &cl, &p, err, sizeof err) != US_OK) {
                CHECK(0, "pp cost %s: %s", us_pp_kind_name((us_pp_kind)kinds[k]), err);
                continue;
            }
            /* the per-chunk costs the model gives the simulator, recovered from its totals (no recompute, no CP/EP here) */
            work = (p.t_compute + p.t_tp) / ((double)tc.grad_accum * tc.pp_chunks);
            CHECK(us_pp_schedule_build(&s, (us_pp_kind)kinds[k], 4, 128, tc.pp_chunks, err,
                                       sizeof err) == US_OK,
                  "build");
            /* tF : tB : tW as the model splits them does not matter for 1F1B/AFAB/interleaved (BW = tB + tW) */
            tF = work / 3;
            tB = work / 3;
            tW = work / 3;
            if (kinds[k] == US_PP_1F1B || kinds[k] == US_PP_AFAB || kinds[k] == US_PP_INTERLEAVED) {
                us_pp_simulate(&s, tF, tB, tW, &sim, err, sizeof err);
                CHECK(fabs(p.t_bubble - (sim.makespan - 128.0 * tc.pp_chunks * work)) <
                          1e-6 * p.t_step,
                      "%s: the bubble %.2f ms is the simulator's makespan minus the work (%.2f)",
                      us_pp_kind_name((us_pp_kind)kinds[k]), 1e3 * p.t_bubble,
                      1e3 * (sim.makespan - 128.0 * tc.pp_chunks * work));
                if (kinds[k] == US_PP_1F1B)
                    CHECK(fabs(p.t_bubble - 3 * work) < 1e-6 * p.t_step,
                          "1F1B: bubble %.2f ms = (p-1)(tF+tB+tW) = %.2f ms", 1e3 * p.t_bubble,
                          1e3 * 3 * work);
            } else
                CHECK(p.t_bubble >= 0 && p.t_bubble < 3 * work,
                      "%s: bubble %.2f ms below 1F1B's %.2f", us_pp_kind_name((us_pp_kind)kinds[k]),
                      1e3 * p.t_bubble, 1e3 * 3 * work);
            us_pp_schedule_free(&s);
        }
    }
    { /* DualPipe through the cost model: each rank holds two stages (the estimator's first rank
         stages 0 and pp-1: the weights, gradients and moments of both), does 1F1B's work per
         micro-batch (a chunk is a stage, walked by half of the micro-batches) and idles less */
        us_plan p1, p2;
        us_result r1, r2;
        memset(&tc, 0, sizeof tc);
        tc.dp = 2;
        tc.tp = 2;
        tc.pp = 4;
        tc.batch = 1;
        tc.seq = 4096;
        tc.grad_accum = 128;
        tc.precision = US_PRECISION_BF16;
        tc.pp_schedule = US_PP_1F1B;
        r1 = us_plan_cost(&mc, &tc, &cl, &p1, err, sizeof err);
        tc.pp_schedule = US_PP_DUALPIPE;
        r2 = us_plan_cost(&mc, &tc, &cl, &p2, err, sizeof err);
        CHECK(r1 == US_OK && r2 == US_OK, "8B pp 4: 1f1b and dualpipe cost (%s)", err);
        CHECK(p2.mem.params > 1.5 * p1.mem.params && p2.mem.optimizer > 1.5 * p1.mem.optimizer,
              "8B pp 4, dualpipe: the first rank's weights %.1f GiB, AdamW %.1f GiB (1f1b's "
              "stage 0: %.1f, %.1f), two stages held",
              p2.mem.params / 1073741824.0, p2.mem.optimizer / 1073741824.0,
              p1.mem.params / 1073741824.0, p1.mem.optimizer / 1073741824.0);
        CHECK(fabs(p2.t_compute - p1.t_compute) < 1e-9 * p1.t_compute &&
                  p2.t_bubble < 0.5 * p1.t_bubble,
              "8B pp 4, dualpipe: 1f1b's compute %.1f ms, bubble %.2f ms under half of 1f1b's %.2f",
              1e3 * p2.t_compute, 1e3 * p2.t_bubble, 1e3 * p1.t_bubble);
    }
    { /* ZeRO-3: hidden under big layers (8B, 4 sequences), exposed under tiny ones (1 short sequence) */
        memset(&tc, 0, sizeof tc);
        tc.dp = 16;
        tc.zero = 3;
        tc.batch = 4;
        tc.seq = 4096;
        tc.grad_accum = 4;
        tc.precision = US_PRECISION_BF16;
        us_plan_cost(&mc, &tc, &cl, &p, err, sizeof err);
        memset(&tc, 0, sizeof tc);
        tc.dp = 16;
        tc.zero = 3;
        tc.batch = 1;
        tc.seq = 256;
        tc.grad_accum = 4;
        tc.precision = US_PRECISION_BF16;
        us_plan_cost(&mc, &tc, &cl, &p2, err, sizeof err);
        CHECK(p.t_zero3 < 0.05 * p.t_step,
              "ZeRO-3 with big layers: gathers %.1f ms of a %.0f ms step", 1e3 * p.t_zero3,
              1e3 * p.t_step);
        CHECK(p2.t_zero3 > 0.5 * p2.t_step,
              "ZeRO-3 with tiny layers: gathers %.1f ms of a %.0f ms step", 1e3 * p2.t_zero3,
              1e3 * p2.t_step);
    }
    /* ---- errors as sentences */
    memset(&tc, 0, sizeof tc);
    tc.dp = 3;
    tc.seq = 4096;
    tc.precision = US_PRECISION_BF16;
    CHECK(us_plan_cost(&mc, &tc, &cl, &p, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "cluster has 16"),
          "a configuration not using the cluster: \"%s\"", err);
    memset(&q, 0, sizeof q);
    q.global_tokens = 1000;
    q.seq = 4096;
    CHECK(us_plan_enumerate(&mc, &cl, &q, out, &n, NULL, NULL, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "multiple of seq"),
          "a global batch not of whole sequences: \"%s\"", err);

    /* ---- the rates file */
    {
        /* one file per process: make test runs the plain and sanitizer builds at once */
        char path[64];
        us_plan_rates r;
        FILE *f;
        snprintf(path, sizeof path, "/tmp/us_test_plan_rates_%ld.txt", (long)getpid());
        f = fopen(path, "w");
        fprintf(f, "ultrascale-rates 1\n# measured\ngemm_tflops = 512.5\n  intra_gbps=100  # "
                   "NVLink\n\ncp_attn_eff = 0.5\n");
        fclose(f);
        memset(&r, 0, sizeof r);
        CHECK(us_plan_rates_read(path, &r, err, sizeof err) == US_OK, "rates file read (%s)", err);
        CHECK(r.gemm_tflops == 512.5 && r.intra_gbps == 100 && r.cp_attn_eff == 0.5 &&
                  r.hbm_gbps == 0,
              "rates file values: gemm %g intra %g cp eff %g, others untouched", r.gemm_tflops,
              r.intra_gbps, r.cp_attn_eff);
        f = fopen(path, "w");
        fprintf(f, "rates\ngemm_tflops = 1\n");
        fclose(f);
        CHECK(us_plan_rates_read(path, &r, err, sizeof err) == US_ERR_FORMAT &&
                  strstr(err, "first line"),
              "bad header: \"%s\"", err);
        f = fopen(path, "w");
        fprintf(f, "ultrascale-rates 1\ngemm_tflop = 1\n");
        fclose(f);
        CHECK(us_plan_rates_read(path, &r, err, sizeof err) == US_ERR_FORMAT &&
                  strstr(err, "unknown key"),
              "unknown key: \"%s\"", err);
        f = fopen(path, "w");
        fprintf(f, "ultrascale-rates 1\ngemm_tflops = -3\n");
        fclose(f);
        CHECK(us_plan_rates_read(path, &r, err, sizeof err) == US_ERR_FORMAT &&
                  strstr(err, "positive"),
              "negative rate: \"%s\"", err);
        CHECK(r.gemm_tflops == 512.5, "a failed read leaves the rates as they were");
        CHECK(us_plan_rates_read("/nonexistent/rates", &r, err, sizeof err) == US_ERR_IO,
              "missing file: \"%s\"", err);
        remove(path);
    }
    if (!quick) test_moe_plans();
    return us_test_done("test_plan");
}
