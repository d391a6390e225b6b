/* test_model.c — the whole model: gradients, recomputation, accumulation, estimator, learning. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static us_model_config tiny_model(void) {
    us_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.vocab = 19;
    mc.dim = 16;
    mc.n_layers = 2;
    mc.n_heads = 4;
    mc.n_kv_heads = 2;
    mc.ffn_dim = 24;
    mc.init_std = 0.3f; /* larger weights: gradients well above fp32 noise */
    return mc;
}

static us_train_config tiny_train(int B, int T) {
    us_train_config tc;
    memset(&tc, 0, sizeof tc);
    tc.batch = B;
    tc.seq = T;
    tc.steps = 10;
    tc.lr = 1e-2f;
    tc.seed = 7;
    return tc;
}

static void random_tokens(int32_t *in, int32_t *tgt, int64_t n, int V, uint64_t seed) {
    us_rng r;
    int64_t i;
    us_rng_seed(&r, seed);
    for (i = 0; i < n; i++) {
        in[i] = (int32_t)(us_rng_u64(&r) % (uint64_t)V);
        tgt[i] = (us_rng_u64(&r) % 5 == 0)
                     ? -1
                     : (int32_t)(us_rng_u64(&r) % (uint64_t)V); /* some ignored */
    }
}

static int64_t count_valid(const int32_t *tgt, int64_t n) {
    int64_t i, v = 0;
    for (i = 0; i < n; i++) v += tgt[i] >= 0;
    return v;
}

/* ---- whole-model gradient against central finite differences (fp32 model, double loss sum) */
static void test_gradcheck(void) {
    us_model_config mc = tiny_model();
    us_train_config tc = tiny_train(2, 7);
    us_model m;
    int32_t in[14], tgt[14];
    int64_t valid;
    double ls, worst = 0;
    int i, bad = 0, checked = 0;
    CHECK(us_model_init(&m, &mc, &tc, NULL) == US_OK, "init tiny model: %s", us_model_error(&m));
    random_tokens(in, tgt, 14, 19, 3);
    valid = count_valid(tgt, 14);
    us_model_zero_grad(&m);
    CHECK(us_forward_backward(&m, in, tgt, 2, 7, (float)(1.0 / valid), &ls) == US_OK,
          "forward_backward");
    for (i = 0; i < m.n_params_t; i++) { /* three entries of every tensor */
        const us_param *p = &m.params[i];
        int k;
        for (k = 0; k < 3; k++) {
            int64_t j = p->offset + (int64_t)((k * 7919 + i * 31) % p->numel);
            float keep = m.master[j], h = 1e-2f;
            double lp = 0, lm = 0, fd, g = m.grad[j], err;
            m.master[j] = keep + h;
            us_forward_eval(&m, in, tgt, 2, 7, &lp, NULL, NULL);
            m.master[j] = keep - h;
            us_forward_eval(&m, in, tgt, 2, 7, &lm, NULL, NULL);
            m.master[j] = keep;
            fd = (lp - lm) / (2.0 * h) / (double)valid;
            err = fabs(fd - g) / (1e-3 + fabs(fd) + fabs(g));
            if (err > worst) worst = err;
            if (err > 2e-2) {
                bad++;
                printf("    %s[%lld]: grad %.6g vs finite difference %.6g\n", p->name,
                       (long long)(j - p->offset), g, fd);
            }
            checked++;
        }
    }
    CHECK(bad == 0,
          "model gradient vs finite differences: %d of %d entries off, worst relative error %.2e",
          bad, checked, worst);
    us_model_free(&m);
}

/* ---- the three recompute modes give bit-identical gradients (fp32 and bf16) */
static void test_recompute(us_precision prec) {
    us_model_config mc = tiny_model();
    float *g[3];
    int mode, B = 3, T = 70; /* T > the 64-key attention block */
    int32_t *in = (int32_t *)malloc((size_t)B * T * 4), *tgt = (int32_t *)malloc((size_t)B * T * 4);
    random_tokens(in, tgt, (int64_t)B * T, 19, 11);
    for (mode = 0; mode < 3; mode++) {
        us_train_config tc = tiny_train(B, T);
        us_model m;
        double ls;
        tc.precision = prec;
        tc.recompute = (us_recompute)(US_RECOMPUTE_NONE + mode);
        us_model_init(&m, &mc, &tc, NULL);
        us_model_zero_grad(&m);
        us_forward_backward(&m, in, tgt, B, T, 0.01f, &ls);
        g[mode] = (float *)malloc((size_t)m.n_params * 4);
        memcpy(g[mode], m.grad, (size_t)m.n_params * 4);
        if (mode == 2) {
            CHECK(!memcmp(g[0], g[1], (size_t)m.n_params * 4),
                  "%s: selective recompute gradients bit-identical to none",
                  us_precision_name(prec));
            CHECK(!memcmp(g[0], g[2], (size_t)m.n_params * 4),
                  "%s: full recompute gradients bit-identical to none", us_precision_name(prec));
        }
        us_model_free(&m);
    }
    free(g[0]);
    free(g[1]);
    free(g[2]);
    free(in);
    free(tgt);
}

/* ---- k micro-batches of accumulation equal one batch k times larger */
static void test_accumulation(void) {
    us_model_config mc = tiny_model();
    us_train_config ta = tiny_train(2, 9), tb = tiny_train(6, 9);
    us_model a, b;
    int32_t in[54], tgt[54];
    us_step_stats sa, sb;
    double maxd = 0, maxg = 0;
    int64_t i;
    int s;
    ta.grad_accum = 3;
    us_model_init(&a, &mc, &ta, NULL);
    us_model_init(&b, &mc, &tb, NULL);
    for (s = 0; s < 3; s++) {
        random_tokens(in, tgt, 54, 19, 100 + s);
        us_train_step(&a, in, tgt, &sa);
        us_train_step(&b, in, tgt, &sb);
        CHECK(fabsf(sa.loss - sb.loss) <= 1e-5f * fabsf(sb.loss),
              "step %d: loss with 3x2 accumulation %.7f equals batch 6 %.7f", s + 1, sa.loss,
              sb.loss);
        CHECK(fabsf(sa.grad_norm - sb.grad_norm) <= 1e-4f * sb.grad_norm,
              "step %d: grad norm %.7f vs %.7f", s + 1, sa.grad_norm, sb.grad_norm);
    }
    for (i = 0; i < a.n_params; i++) {
        double d = fabs(a.grad[i] - b.grad[i]);
        if (d > maxd) maxd = d;
        if (fabs(b.grad[i]) > maxg) maxg = fabs(b.grad[i]);
    }
    CHECK(maxd <= 1e-5 * maxg,
          "accumulated gradients equal the big batch's (max diff %.2e, max |g| %.2e)", maxd, maxg);
    maxd = 0;
    for (i = 0; i < a.n_params; i++)
        if (fabs(a.master[i] - b.master[i]) > maxd) maxd = fabs(a.master[i] - b.master[i]);
    CHECK(maxd < 1e-5, "weights after 3 steps agree (max diff %.2e)", maxd);
    us_model_free(&a);
    us_model_free(&b);
}

/* ---- global-norm clipping: a clipped step equals an unclipped step on gradients scaled by clip/norm */
static void test_clipping(void) {
    us_model_config mc = tiny_model();
    us_train_config ta = tiny_train(2, 9), tb;
    us_model a, b;
    int32_t in[18], tgt[18];
    double ls, norm = 0, maxd = 0;
    float gn = 0;
    int64_t i, valid;
    ta.grad_clip = 0.05f;
    tb = ta;
    tb.grad_clip = -1; /* off */
    us_model_init(&a, &mc, &ta, NULL);
    us_model_init(&b, &mc, &tb, NULL);
    random_tokens(in, tgt, 18, 19, 77);
    valid = count_valid(tgt, 18);
    us_model_zero_grad(&a);
    us_forward_backward(&a, in, tgt, 2, 9, (float)(1.0 / valid), &ls);
    us_model_zero_grad(&b);
    us_forward_backward(&b, in, tgt, 2, 9, (float)(1.0 / valid), &ls);
    for (i = 0; i < b.n_params; i++) norm += (double)b.grad[i] * b.grad[i];
    norm = sqrt(norm);
    for (i = 0; i < b.n_params; i++) b.grad[i] *= (float)(0.05 / norm);
    us_optimizer_step(&a, &gn, NULL);
    us_optimizer_step(&b, NULL, NULL);
    CHECK(fabs(gn - norm) <= 1e-5 * norm && norm > 0.05,
          "reported norm %.6f is the pre-clip global norm %.6f", gn, norm);
    for (i = 0; i < a.n_params; i++)
        if (fabs(a.master[i] - b.master[i]) > maxd) maxd = fabs(a.master[i] - b.master[i]);
    CHECK(maxd < 1e-6,
          "clipped step equals the step on gradients scaled to norm 0.05 (max diff %.2e)", maxd);
    us_model_free(&a);
    us_model_free(&b);
}

/* ---- the estimator's formula equals what the model really allocated */
static void test_estimator(void) {
    int prec, mode, tied;
    for (prec = 0; prec < 2; prec++)
        for (mode = 0; mode < 3; mode++)
            for (tied = 0; tied < 2; tied++) {
                us_model_config mc = tiny_model();
                us_train_config tc = tiny_train(3, 33);
                us_memory est;
                us_model m;
                char err[256];
                mc.tie_embeddings = tied;
                tc.precision = prec ? US_PRECISION_BF16 : US_PRECISION_FP32;
                tc.recompute = (us_recompute)(US_RECOMPUTE_NONE + mode);
                CHECK(us_memory_estimate(&mc, &tc, &est, err, sizeof err) == US_OK, "estimate: %s",
                      err);
                us_model_init(&m, &mc, &tc, NULL);
                CHECK(est.params == m.mem.params && est.grads == m.mem.grads &&
                          est.master == m.mem.master && est.optimizer == m.mem.optimizer &&
                          est.activations == m.mem.activations && est.total == m.mem.total,
                      "%s recompute=%s tied=%d: estimated %zu = allocated %zu bytes (activations "
                      "%zu vs %zu)",
                      us_precision_name(tc.precision), us_recompute_name(tc.recompute), tied,
                      est.total, m.mem.total, est.activations, m.mem.activations);
                CHECK((int64_t)m.n_params == us_param_count(&mc),
                      "parameter count formula %lld = built %lld", (long long)us_param_count(&mc),
                      (long long)m.n_params);
                us_model_free(&m);
            }
    { /* the Playbook's ratios: fp32 16 bytes per parameter, bf16 + fp32 master 18 */
        us_model_config mc = tiny_model();
        us_train_config tc = tiny_train(1, 8);
        us_memory e32, e16;
        int64_t P = us_param_count(&mc);
        us_memory_estimate(&mc, &tc, &e32, NULL, 0);
        tc.precision = US_PRECISION_BF16;
        us_memory_estimate(&mc, &tc, &e16, NULL, 0);
        CHECK(e32.params + e32.grads + e32.master + e32.optimizer == (size_t)(16 * P),
              "fp32 model state is 16 bytes/param");
        CHECK(e16.params + e16.grads + e16.master + e16.optimizer == (size_t)(18 * P),
              "bf16 model state is 18 bytes/param");
    }
    { /* recomputation saves activation memory, in the documented order */
        us_model_config mc = tiny_model();
        us_train_config tc = tiny_train(4, 64);
        us_memory e[3];
        int k;
        for (k = 0; k < 3; k++) {
            tc.recompute = (us_recompute)(US_RECOMPUTE_NONE + k);
            us_memory_estimate(&mc, &tc, &e[k], NULL, 0);
        }
        CHECK(e[0].activations > e[1].activations && e[1].activations > e[2].activations,
              "activations none %zu > selective %zu > full %zu", e[0].activations, e[1].activations,
              e[2].activations);
    }
}

/* ---- names, init, determinism across thread counts, bf16 weights are rounded masters */
static void test_params_and_determinism(void) {
    us_model_config mc = tiny_model();
    us_train_config tc = tiny_train(2, 16);
    us_model a, b;
    int32_t in[32], tgt[32];
    int s, i;
    int64_t j, bad = 0;
    us_model_init(&a, &mc, &tc, NULL);
    CHECK(us_model_find_param(&a, "model.embed_tokens.weight") &&
              us_model_find_param(&a, "model.layers.1.self_attn.k_proj.weight") &&
              us_model_find_param(&a, "model.layers.0.mlp.down_proj.weight") &&
              us_model_find_param(&a, "lm_head.weight") &&
              us_model_find_param(&a, "model.norm.weight"),
          "Hugging Face Llama parameter names");
    {
        const us_param *k = us_model_find_param(&a, "model.layers.1.self_attn.k_proj.weight");
        CHECK(k && k->shape[0] == 2 * 4 && k->shape[1] == 16, "k_proj shape [NKV*HS, C] = [8, 16]");
    }
    for (i = 1, j = 0; i < a.n_params_t; i++)
        j += a.params[i].offset != a.params[i - 1].offset + a.params[i - 1].numel;
    CHECK(j == 0, "parameter views tile the flat buffer without gaps");
    tc.threads = 1;
    us_model_init(&b, &mc, &tc, NULL);
    a.tc.threads = 2;
    a.ops.nthreads = 2;
    CHECK(!memcmp(a.master, b.master, (size_t)a.n_params * 4), "same seed, same initial weights");
    for (s = 0; s < 3; s++) {
        random_tokens(in, tgt, 32, 19, 50 + s);
        us_train_step(&a, in, tgt, NULL);
        us_train_step(&b, in, tgt, NULL);
    }
    CHECK(!memcmp(a.master, b.master, (size_t)a.n_params * 4),
          "2 threads and 1 thread train bit-identically");
    us_model_free(&a);
    us_model_free(&b);

    tc.precision = US_PRECISION_BF16;
    us_model_init(&a, &mc, &tc, NULL);
    for (s = 0; s < 2; s++) {
        random_tokens(in, tgt, 32, 19, 60 + s);
        us_train_step(&a, in, tgt, NULL);
    }
    for (j = 0; j < a.n_params; j++) bad += ((uint16_t *)a.w)[j] != us_f32_to_bf16(a.master[j]);
    CHECK(bad == 0, "bf16 weights are the RNE rounding of the fp32 master weights after AdamW");
    CHECK(a.mem.params * 2 == a.mem.master, "bf16 weights take half the bytes of the master copy");
    us_model_free(&a);
}

/* ---- the model learns: the default task, fp32 and bf16 */
static void test_learns(us_precision prec, float threshold) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_task task;
    us_step_stats st;
    int32_t *in, *tgt;
    float first = 0;
    int s;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.n_layers = 2;
    mc.dim = 48;
    mc.n_heads = 4;
    tc.batch = 8;
    tc.seq = 2 * US_TASK_LINE - 1;
    tc.steps = 150;
    tc.lr = 1e-2f;
    tc.warmup = 10;
    tc.precision = prec;
    us_model_init(&m, &mc, &tc, NULL);
    us_task_init(&task, 1);
    in = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    tgt = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    for (s = 0; s < tc.steps; s++) {
        us_task_batch(&task, tc.batch, tc.seq, in, tgt);
        if (us_train_step(&m, in, tgt, &st) != US_OK) break;
        if (s == 0) first = st.loss;
    }
    CHECK(first > 4.0f, "%s: initial loss %.3f is near ln(256) = 5.55", us_precision_name(prec),
          first);
    CHECK(st.loss < threshold, "%s: sorting-task loss after %d steps %.3f < %.2f",
          us_precision_name(prec), tc.steps, st.loss, threshold);
    free(in);
    free(tgt);
    us_model_free(&m);
}

/* ---- sampling: greedy is deterministic and top-k 1 is greedy */
static void test_sampling(void) {
    us_model_config mc = tiny_model();
    us_train_config tc = tiny_train(1, 12);
    us_model m;
    us_rng r;
    int32_t prompt[3] = {1, 2, 3}, a[12], b[12], c[12];
    int i, inrange = 1;
    us_model_init(&m, &mc, &tc, NULL);
    us_rng_seed(&r, 1);
    CHECK(us_sample(&m, prompt, 3, 9, 0.0f, 0, &r, a) == US_OK, "greedy sample");
    us_sample(&m, prompt, 3, 9, 0.0f, 0, &r, b);
    us_sample(&m, prompt, 3, 9, 1.0f, 1, &r, c);
    CHECK(!memcmp(a, b, sizeof a) && !memcmp(a, c, sizeof a),
          "greedy is deterministic and equals top-k=1 sampling");
    us_sample(&m, prompt, 3, 9, 1.5f, 5, &r, c);
    for (i = 0; i < 12; i++) inrange &= c[i] >= 0 && c[i] < 19;
    CHECK(inrange && !memcmp(c, prompt, sizeof prompt),
          "temperature sampling keeps the prompt and stays in the vocabulary");
    CHECK(us_sample(&m, prompt, 3, 10, 0.0f, 0, &r, c) == US_ERR_INVALID,
          "sampling past seq is refused: %s", us_model_error(&m));
    us_model_free(&m);
}

/* ---- generation with a KV cache (// >>sample): each step's logits are those of re-running the
   whole sequence, for two sequences side by side, past tc.seq, with the prompt cut into pieces */
static void test_kv_cache_logits(void) {
    us_model_config mc = tiny_model();
    us_train_config tc = tiny_train(2, 20), ts = tiny_train(2, 6);
    us_model m, s; /* the same weights (seed 7): an arena of 20 positions, one of 6 */
    us_gen g;

    enum { P = 9, L = 20 };

    int32_t seqs[2][L], in[2 * L], tgt[2 * L], step[2];
    float lg[2][19], ref[2][19];
    double worst = 0;
    int t, b, v, k;
    us_model_init(&m, &mc, &tc, NULL);
    us_model_init(&s, &mc, &ts, NULL);
    random_tokens(&seqs[0][0], tgt, 2 * L, 19, 11);
    for (k = 0; k < 2 * L; k++) tgt[k] = -1;
    /* s decodes: the prompt of 9 in pieces of 6 and 3, then positions up to 19 (seq is 6) */
    CHECK(us_gen_init(&g, &s, 2, L) == US_OK, "gen init: %s", us_model_error(&s));
    for (b = 0; b < 2; b++) memcpy(in + b * P, seqs[b], P * 4);
    CHECK(us_gen_forward(&g, in, P, &lg[0][0]) == US_OK, "prefill: %s", us_model_error(&s));
    for (t = P; t <= L; t++) {
        for (b = 0; b < 2; b++) memcpy(in + b * t, seqs[b], (size_t)t * 4);
        us_forward_eval(&m, in, tgt, 2, t, NULL, NULL, &ref[0][0]); /* m re-runs all t */
        for (b = 0; b < 2; b++)
            for (v = 0; v < 19; v++)
                if (fabs(lg[b][v] - ref[b][v]) > worst) worst = fabs(lg[b][v] - ref[b][v]);
        if (t == L) break;
        step[0] = seqs[0][t];
        step[1] = seqs[1][t];
        if (us_gen_forward(&g, step, 1, &lg[0][0]) != US_OK) break;
    }
    CHECK(t == L && g.len == L && worst < 2e-5,
          "cached logits at positions %d..%d of 2 sequences (seq 6) match re-running each whole "
          "sequence within %.1e",
          P, L, worst);
    CHECK(us_gen_forward(&g, step, 1, &lg[0][0]) == US_ERR_INVALID,
          "a token past the cache's %d positions is refused: %s", L, us_model_error(&s));
    us_gen_reset(&g);
    CHECK(us_gen_forward(&g, in, 3, &lg[0][0]) == US_OK && g.len == 3,
          "after a reset the cache takes a new prompt");
    us_gen_free(&g);
    CHECK(us_gen_init(&g, &s, 3, L) == US_ERR_INVALID, "3 sequences over batch 2 are refused: %s",
          us_model_error(&s));
    us_model_free(&m);
    us_model_free(&s);
}

/* Greedy generation with the cache gives the tokens us_sample gives by re-running; moe: the
   MLPs are MoE layers (4 experts, top-2, a shared one). */
static void test_kv_cache_greedy(int moe) {
    us_model_config mc = tiny_model();
    us_train_config tc = tiny_train(1, 24), ts = tiny_train(1, 5);
    us_model m, s;
    us_rng r;
    int32_t prompt[7] = {3, 1, 4, 1, 5, 9, 2}, a[24], b[24], c[24];
    if (moe) {
        mc.moe_experts = 4;
        mc.moe_shared = 1;
    }
    us_model_init(&m, &mc, &tc, NULL);
    us_model_init(&s, &mc, &ts, NULL);
    us_rng_seed(&r, 1);
    us_sample(&m, prompt, 7, 17, 0.0f, 0, &r, a);
    CHECK(us_generate(&m, prompt, 7, 17, 0.0f, 0, 0.0f, &r, b) == US_OK &&
              us_generate(&s, prompt, 7, 17, 0.0f, 0, 0.9f, &r, c) == US_OK,
          "generate: %s", us_model_error(&s));
    CHECK(!memcmp(a, b, sizeof a) && !memcmp(a, c, sizeof a),
          "greedy%s: 17 cached tokens equal re-running (seq 24), also from a model of seq 5",
          moe ? ", MoE" : "");
    us_model_free(&m);
    us_model_free(&s);
}

/* Nucleus sampling over probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps the first two
   (drawn 5:3), 0.9 the first three, 0.4 only the first; off (0), all four. */
static void test_top_p(void) {
    float lg[4];
    const double p[4] = {0.5, 0.3, 0.15, 0.05};
    const float tops[4] = {0.7f, 0.9f, 0.4f, 0.0f};
    const int kept[4] = {2, 3, 1, 4};
    us_rng r;
    int i, k, n = 4000;
    for (i = 0; i < 4; i++) lg[i] = (float)log(p[i]) + 1.0f;
    us_rng_seed(&r, 5);
    for (k = 0; k < 4; k++) {
        int cnt[4] = {0, 0, 0, 0}, seen = 0;
        for (i = 0; i < n; i++) {
            int32_t t = -1;
            us_sample_logits(lg, 4, 1.0f, 0, tops[k], &r, &t);
            if (t >= 0 && t < 4) cnt[t]++;
        }
        for (i = 0; i < 4; i++) seen += cnt[i] > 0;
        CHECK(seen == kept[k] && cnt[0] + cnt[1] + cnt[2] + cnt[3] == n,
              "top_p %.1f draws from the %d most likely tokens (saw %d)", tops[k], kept[k], seen);
        if (k == 0)
            CHECK(fabs(cnt[0] / (double)n - 0.625) < 0.03,
                  "top_p 0.7: token 0 renormalised to 0.5/0.8, drawn %.3f", cnt[0] / (double)n);
    }
    for (i = 0; i < 4; i++) lg[i] = NAN;
    {
        int32_t t = -1;
        CHECK(us_sample_logits(lg, 4, 1.0f, 0, 0.9f, &r, &t) == US_ERR_NONFINITE,
              "no finite logit to sample from is an error, not an index");
    }
}

/* ---- the fused head (loss_chunk): the same numbers as the whole logits, a smaller arena */
static void test_loss_chunk(us_precision prec, int tied) {
    us_model_config mc = tiny_model();
    int B = 3, T = 33, k, s;
    int64_t N = (int64_t)B * T, i;
    int32_t *in = (int32_t *)malloc((size_t)N * 4), *tgt = (int32_t *)malloc((size_t)N * 4);
    int32_t prompt[3] = {4, 5, 6}, sa[2][12];
    us_model m[2];
    double ls[2], el[2], gmax = 0, gdiff = 0;
    int64_t ok[2];
    float st_loss[2][3];
    us_rng r;
    mc.tie_embeddings = tied;
    random_tokens(in, tgt, N, 19, 5);
    for (k = 0; k < 2; k++) { /* k = 0: logits whole (loss_chunk −1); 1: chunks of 10 rows */
        us_train_config tc = tiny_train(B, T);
        us_memory est;
        tc.precision = prec;
        tc.loss_chunk = k ? 10 : -1;
        CHECK(us_model_init(&m[k], &mc, &tc, NULL) == US_OK, "init: %s", us_model_error(&m[k]));
        us_memory_estimate(&mc, &tc, &est, NULL, 0);
        CHECK(est.activations == m[k].mem.activations,
              "%s %s loss_chunk %d: estimated activations %zu = allocated %zu",
              us_precision_name(prec), tied ? "tied" : "untied", tc.loss_chunk, est.activations,
              m[k].mem.activations);
        us_model_zero_grad(&m[k]);
        us_forward_backward(&m[k], in, tgt, B, T, 1.0f / (float)count_valid(tgt, N), &ls[k]);
    }
    CHECK(m[1].mem.activations + (size_t)(N - 10) * 19 * (prec == US_PRECISION_FP32 ? 4 : 2) <=
              m[0].mem.activations + 256, /* (buffers start at 256-byte boundaries) */
          "%s %s: chunks of 10 rows hold %zu bytes of activations, whole logits %zu",
          us_precision_name(prec), tied ? "tied" : "untied", m[1].mem.activations,
          m[0].mem.activations);
    for (i = 0; i < (int64_t)m[0].n_params; i++) {
        double d = fabs((double)m[0].grad[i] - m[1].grad[i]);
        if (fabs(m[0].grad[i]) > gmax) gmax = fabs(m[0].grad[i]);
        if (d > gdiff) gdiff = d;
    }
    CHECK(ls[0] == ls[1] && gmax > 0 && gdiff <= 1e-6 * gmax,
          "%s %s: chunked loss %.9g = whole %.9g, gradients within %.1e of %.1e",
          us_precision_name(prec), tied ? "tied" : "untied", ls[1], ls[0], gdiff, gmax);
    for (s = 0; s < 3; s++)
        for (k = 0; k < 2; k++) {
            us_step_stats st;
            us_train_step(&m[k], in, tgt, &st);
            st_loss[k][s] = st.loss;
        }
    for (k = 0; k < 2; k++) {
        us_forward_eval(&m[k], in, tgt, B, T, &el[k], &ok[k], NULL);
        us_rng_seed(&r, 3);
        us_sample(&m[k], prompt, 3, 9, 0.0f, 0, &r, sa[k]);
    }
    CHECK(fabsf(st_loss[0][2] - st_loss[1][2]) <= 1e-5f * st_loss[0][2] &&
              fabs(el[0] - el[1]) <= 1e-5 * el[0] && ok[0] == ok[1] && !memcmp(sa[0], sa[1], 48),
          "%s %s: after 3 steps chunked and whole agree: loss %.7g / %.7g, evaluation %.7g / "
          "%.7g, %lld / %lld correct, greedy samples equal",
          us_precision_name(prec), tied ? "tied" : "untied", st_loss[1][2], st_loss[0][2], el[1],
          el[0], (long long)ok[1], (long long)ok[0]);
    us_model_free(&m[0]);
    us_model_free(&m[1]);
    free(in);
    free(tgt);
}

static void test_loss_chunk_refused(void) {
    us_model_config mc = tiny_model();
    us_train_config tc = tiny_train(2, 8);
    char err[256];
    tc.loss_chunk = 16;
    tc.dp = 2;
    tc.zero = 2;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "loss_chunk"),
          "loss_chunk with ZeRO-2 is refused: %s", err);
    tc = tiny_train(2, 8);
    tc.loss_chunk = -2;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
              strstr(err, "loss_chunk"),
          "loss_chunk -2 is refused: %s", err);
}

int main(int argc, char **argv) {
    int i, quick = 0; /* --quick skips the learning runs (for the sanitizer build) */
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) us_test_verbose = 1;
        if (!strcmp(argv[i], "--quick")) quick = 1;
    }
    test_gradcheck();
    test_recompute(US_PRECISION_FP32);
    test_recompute(US_PRECISION_BF16);
    test_accumulation();
    test_clipping();
    test_estimator();
    test_params_and_determinism();
    test_sampling();
    test_kv_cache_logits();
    test_kv_cache_greedy(0);
    test_kv_cache_greedy(1);
    test_top_p();
    test_loss_chunk(US_PRECISION_FP32, 0);
    test_loss_chunk(US_PRECISION_FP32, 1);
    test_loss_chunk(US_PRECISION_BF16, 1);
    test_loss_chunk_refused();
    if (!quick) {
        test_learns(US_PRECISION_FP32, 1.5f);
        test_learns(US_PRECISION_BF16, 1.5f);
    }
    return us_test_done("test_model");
}
