/* test_moe.c — the mixture-of-experts layer (// >>moe): its ops against naive references and
   finite differences, the layer's gradients, the E = 1 equivalence with the dense MLP, capacity,
   group-limited routing, the two balancing methods, recompute, accumulation, the estimator, and
   a short training run. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static us_ops O;

static float frand(void) { return (float)(2 * rnd01() - 1); }

/* ---- the router: top-k, gates and psum against a brute-force reference */
static void ref_route(const float *lg, const float *bias, int E, int K, int gate, int G, int M,
                      int32_t *topk, float *gates) {
    float p[64], sc[64], gs[64];
    int used[64] = {0}, gok[64] = {0}, e, k, g, S = E / G;
    double z = 0, mx = -1e30, sum = 0;
    for (e = 0; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
    for (e = 0; e < E; e++) z += exp(lg[e] - mx);
    for (e = 0; e < E; e++) {
        p[e] =
            gate == US_MOE_SIGMOID ? (float)(1 / (1 + exp(-lg[e]))) : (float)(exp(lg[e] - mx) / z);
        sc[e] = p[e] + (bias ? bias[e] : 0);
    }
    for (g = 0; g < G; g++) { /* the two best scores of each group */
        float a = -1e30f, b = -1e30f;
        for (e = g * S; e < g * S + S; e++) {
            if (sc[e] > a) {
                b = a;
                a = sc[e];
            } else if (sc[e] > b)
                b = sc[e];
        }
        gs[g] = S > 1 ? a + b : a;
    }
    for (k = 0; k < M; k++) {
        int best = -1;
        for (g = 0; g < G; g++)
            if (!gok[g] && (best < 0 || gs[g] > gs[best])) best = g;
        gok[best] = 1;
    }
    for (k = 0; k < K; k++) {
        int best = -1;
        for (e = 0; e < E; e++)
            if (gok[e / S] && !used[e] && (best < 0 || sc[e] > sc[best])) best = e;
        used[best] = 1;
        topk[k] = best;
        gates[k] = p[best];
        sum += p[best];
    }
    if (gate == US_MOE_SIGMOID)
        for (k = 0; k < K; k++) gates[k] = (float)(gates[k] / sum);
}

static void test_route(void) {
    int gate, trial;
    for (gate = US_MOE_SOFTMAX; gate <= US_MOE_SIGMOID; gate++)
        for (trial = 0; trial < 3; trial++) {
            int N = 37, E = trial == 2 ? 16 : 8, K = trial == 0 ? 2 : 3, G = trial == 2 ? 4 : 1,
                M = trial == 2 ? 2 : 1;
            float *lg = malloc(sizeof(float) * N * E), *probs = malloc(sizeof(float) * N * E),
                  bias[16], gates[64 * 3], psum[16];
            int32_t topk[64 * 3];
            int n, e, k, bad = 0, spans = 0;
            double ps[16] = {0}, worst = 0;
            if (G == 1) M = 1;
            for (n = 0; n < N * E; n++) lg[n] = 2 * frand();
            for (e = 0; e < E; e++) bias[e] = trial ? 0.3f * frand() : 0;
            O.moe_route(&O, topk, gates, probs, psum, lg, trial ? bias : NULL, N, E, K, gate, G,
                        G == 1 ? 1 : M);
            for (n = 0; n < N; n++) {
                int32_t rt[3];
                float rg[3];
                double t = 0;
                ref_route(lg + n * E, trial ? bias : NULL, E, K, gate, G, G == 1 ? 1 : M, rt, rg);
                for (k = 0; k < K; k++) {
                    bad += rt[k] != topk[n * K + k];
                    if (fabs(rg[k] - gates[n * K + k]) > worst)
                        worst = fabs(rg[k] - gates[n * K + k]);
                }
                for (e = 0; e < E; e++) t += probs[n * E + e];
                for (e = 0; e < E; e++) ps[e] += probs[n * E + e] / t;
                if (G > 1) { /* group-limited: how many groups the token's experts come from */
                    int used[64] = {0}, ng = 0;
                    for (k = 0; k < K; k++)
                        if (!used[topk[n * K + k] / (E / G)]++) ng++;
                    spans |= ng > M;
                }
            }
            for (e = 0; e < E; e++)
                if (fabs(ps[e] - psum[e]) > 1e-4 * (1 + fabs(ps[e]))) bad++;
            CHECK(bad == 0 && worst < 1e-6,
                  "%s router (E=%d K=%d groups %d/%d, bias %s): top-k, gates (max diff %.1e), psum "
                  "as the reference",
                  gate == US_MOE_SIGMOID ? "sigmoid" : "softmax", E, K, M, G, trial ? "on" : "off",
                  worst);
            if (G > 1)
                CHECK(!spans, "group-limited routing: no token uses more than M=%d of %d groups", M,
                      G);
            free(lg);
            free(probs);
        }
    { /* the limit does something: without it, some tokens span more than 2 groups */
        int N = 200, E = 16, K = 3, n, k, spans = 0;
        float *lg = malloc(sizeof(float) * N * E), *probs = malloc(sizeof(float) * N * E),
              *gates = malloc(sizeof(float) * N * K);
        int32_t *topk = malloc(sizeof(int32_t) * N * K);
        for (n = 0; n < N * E; n++) lg[n] = 2 * frand();
        O.moe_route(&O, topk, gates, probs, NULL, lg, NULL, N, E, K, US_MOE_SIGMOID, 4, 4);
        for (n = 0; n < N; n++) {
            int used[4] = {0}, ng = 0;
            for (k = 0; k < K; k++)
                if (!used[topk[n * K + k] / 4]++) ng++;
            spans += ng > 2;
        }
        O.moe_route(&O, topk, gates, probs, NULL, lg, NULL, N, E, K, US_MOE_SIGMOID, 4, 2);
        for (n = 0, k = 0; n < N; n++) {
            int used[4] = {0}, ng = 0, j;
            for (j = 0; j < K; j++)
                if (!used[topk[n * K + j] / 4]++) ng++;
            k += ng > 2;
        }
        CHECK(
            spans > 20 && k == 0,
            "unlimited routing spans 3 groups for %d of %d tokens; limited to 2 groups, none does",
            spans, N);
        free(lg);
        free(probs);
        free(gates);
        free(topk);
    }
}

/* ---- the router's backward against central finite differences of
        f(logits) = Σ dg·gates + Σ_n Σ_e aux_e·p'[n,e]   (p' = probs / Σ probs) */
static double route_objective(const float *lg, int N, int E, int K, int gate, const float *dg,
                              const float *aux, const float *bias, int32_t *topk_out) {
    float probs[8 * 8], gates[8 * 3];
    int32_t topk[8 * 3];
    double f = 0;
    int n, e, k;
    O.moe_route(&O, topk, gates, probs, NULL, lg, bias, N, E, K, gate, 1, 1);
    for (n = 0; n < N; n++) {
        double t = 0;
        for (k = 0; k < K; k++) f += (double)dg[n * K + k] * gates[n * K + k];
        for (e = 0; e < E; e++) t += probs[n * E + e];
        for (e = 0; e < E; e++) f += aux ? aux[e] * probs[n * E + e] / t : 0;
    }
    if (topk_out) memcpy(topk_out, topk, sizeof(int32_t) * N * K);
    return f;
}

static void test_route_bwd(void) {
    int gate, withaux;
    for (gate = US_MOE_SOFTMAX; gate <= US_MOE_SIGMOID; gate++)
        for (withaux = 0; withaux < 2; withaux++) {
            enum { N = 6, E = 8, K = 3 };

            float lg[N * E], dg[N * K], aux[E], bias[E], probs[N * E], gates[N * K], dl[N * E];
            int32_t topk[N * K], t2[N * K];
            int i, skipped = 0;
            double worst = 0;
            for (i = 0; i < N * E; i++) lg[i] = 1.5f * frand();
            for (i = 0; i < N * K; i++) dg[i] = frand();
            for (i = 0; i < E; i++) {
                aux[i] = frand();
                bias[i] = 0.2f * frand();
            }
            O.moe_route(&O, topk, gates, probs, NULL, lg, bias, N, E, K, gate, 1, 1);
            O.moe_route_bwd(&O, dl, dg, probs, topk, withaux ? aux : NULL, N, E, K, gate);
            for (i = 0; i < N * E; i++) {
                float keep = lg[i], h = 1e-3f;
                double fp, fm, fd, err;
                lg[i] = keep + h;
                fp = route_objective(lg, N, E, K, gate, dg, withaux ? aux : NULL, bias, t2);
                if (memcmp(t2, topk, sizeof t2)) {
                    skipped++;
                    lg[i] = keep;
                    continue;
                } /* the choice flipped: not differentiable there */
                lg[i] = keep - h;
                fm = route_objective(lg, N, E, K, gate, dg, withaux ? aux : NULL, bias, t2);
                lg[i] = keep;
                if (memcmp(t2, topk, sizeof t2)) {
                    skipped++;
                    continue;
                }
                fd = (fp - fm) / (2.0 * (double)h);
                err = fabs(fd - dl[i]) / (1e-2 + fabs(fd));
                if (err > worst) worst = err;
            }
            CHECK(worst < 2e-2 && skipped < 4,
                  "%s router backward%s vs finite differences: worst relative error %.1e (%d flips "
                  "skipped)",
                  gate == US_MOE_SIGMOID ? "sigmoid (top-k renormalised)" : "softmax",
                  withaux ? " with the aux term" : "", worst, skipped);
        }
}

/* ---- permute (with capacity), gather, scatter, gate gradient against naive loops */
static void test_permute_gather_scatter(void) {
    enum { N = 23, E = 5, K = 2, C = 7 };

    int32_t topk[N * K], slot_row[N * K], row_slot[N * K], routed[E], kept[E];
    float x[N * C], rows[N * K * C], out[N * C], out0[N * C], sc[N * K], dg[N * K], dout[N * C];
    int cap, i, e, k, c;
    for (i = 0; i < N * K; i++)
        topk[i] = (i % K == 0) ? (int32_t)(rnd64() % 2)
                               : (int32_t)(2 + rnd64() % 3); /* skewed toward 0, 1 */
    for (cap = 0; cap <= 6; cap += 6) {
        int cnt[E] = {0}, bad = 0, rr = 0, used = 0, dropped = 0, expect_drop = 0;
        O.moe_permute(&O, slot_row, row_slot, routed, kept, topk, N, E, K, cap, N * K);
        for (i = 0; i < N * K; i++) { /* token order: the first `cap` choices of an expert stay */
            int want = cap == 0 || cnt[topk[i]] < cap;
            cnt[topk[i]]++;
            if (!want) expect_drop++;
            bad += want != (slot_row[i] >= 0);
            dropped += slot_row[i] < 0;
            if (slot_row[i] >= 0) bad += row_slot[slot_row[i]] != i;
        }
        for (e = 0; e < E; e++) { /* rows grouped per expert, in expert order */
            bad += routed[e] != cnt[e] || kept[e] != (cap && cnt[e] > cap ? cap : cnt[e]);
            for (k = 0; k < kept[e]; k++, rr++) bad += topk[row_slot[rr]] != e;
            used += kept[e];
        }
        for (i = used; i < N * K; i++) bad += row_slot[i] != -1;
        CHECK(bad == 0 && dropped == expect_drop && (cap == 0 ? dropped == 0 : dropped > 0),
              "permute with capacity %d: counts, per-expert row groups in token order, exactly the "
              "%d expected choices dropped",
              cap, expect_drop);
    }
    /* cap 6 layout is current: gather / scatter / gate gradient against loops */
    for (i = 0; i < N * C; i++) {
        x[i] = frand();
        out0[i] = frand();
        dout[i] = frand();
    }
    for (i = 0; i < N * K; i++) sc[i] = frand();
    O.moe_gather(&O, rows, x, row_slot, sc, N * K, K, C, US_F32);
    memcpy(out, out0, sizeof out);
    O.moe_scatter(&O, out, rows, slot_row, sc, N, K, C, US_F32);
    O.moe_gate_grad(&O, dg, dout, rows, slot_row, N, K, C, US_F32);
    {
        double worst = 0;
        for (i = 0; i < N * K; i++)
            for (c = 0; c < C; c++) {
                double want = row_slot[i] < 0 ? 0 : sc[row_slot[i]] * x[row_slot[i] / K * C + c];
                if (fabs(want - rows[i * C + c]) > worst) worst = fabs(want - rows[i * C + c]);
            }
        for (i = 0; i < N; i++)
            for (c = 0; c < C; c++) {
                double want = out0[i * C + c];
                for (k = 0; k < K; k++)
                    if (slot_row[i * K + k] >= 0)
                        want += sc[i * K + k] * rows[slot_row[i * K + k] * C + c];
                if (fabs(want - out[i * C + c]) > worst) worst = fabs(want - out[i * C + c]);
            }
        for (i = 0; i < N * K; i++) {
            double want = 0;
            if (slot_row[i] >= 0)
                for (c = 0; c < C; c++) want += dout[i / K * C + c] * rows[slot_row[i] * C + c];
            if (fabs(want - dg[i]) > worst) worst = fabs(want - dg[i]);
        }
        CHECK(worst < 1e-5,
              "gather, scatter-add and gate gradient equal their loops (max diff %.1e)", worst);
    }
    { /* scatter is gather's transpose: <scatter(r), y> = <r, gather(y)>, the backward pairing the layer uses */
        float y[N * C], gy[N * K * C], z[N * C];
        double a = 0, b = 0;
        for (i = 0; i < N * C; i++) {
            y[i] = frand();
            z[i] = 0;
        }
        for (i = 0; i < N * K * C; i++) rows[i] = frand();
        O.moe_scatter(&O, z, rows, slot_row, NULL, N, K, C, US_F32);
        O.moe_gather(&O, gy, y, row_slot, NULL, N * K, K, C, US_F32);
        for (i = 0; i < N * C; i++) a += (double)z[i] * y[i];
        for (i = 0; i < N * K; i++)
            if (row_slot[i] >= 0)
                for (c = 0; c < C; c++) b += (double)rows[i * C + c] * gy[i * C + c];
        CHECK(fabs(a - b) < 1e-4 * (1 + fabs(a)),
              "un-permute (scatter) is the transpose of permute (gather): %.6f vs %.6f", a, b);
    }
    { /* bf16: the scatter rounds once */
        uint16_t xb[N * K * C], ob[N * C];
        float of[N * C];
        int bad = 0;
        for (i = 0; i < N * K * C; i++) xb[i] = us_f32_to_bf16(rows[i]);
        for (i = 0; i < N * C; i++) ob[i] = us_f32_to_bf16(out0[i]);
        O.moe_scatter(&O, ob, xb, slot_row, sc, N, K, C, US_BF16);
        for (i = 0; i < N; i++)
            for (c = 0; c < C; c++) {
                float acc = us_bf16_to_f32(us_f32_to_bf16(out0[i * C + c]));
                for (k = 0; k < K; k++)
                    if (slot_row[i * K + k] >= 0)
                        acc += sc[i * K + k] * us_bf16_to_f32(xb[slot_row[i * K + k] * C + c]);
                of[i * C + c] = acc;
            }
        for (i = 0; i < N * C; i++) bad += ob[i] != us_f32_to_bf16(of[i]);
        CHECK(bad == 0, "bf16 scatter-add is the fp32 sum rounded once");
    }
}

/* ---- whole models */
static us_model_config moe_model(int E, int K) {
    us_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.vocab = 19;
    mc.dim = 16;
    mc.n_layers = 2;
    mc.n_heads = 4;
    mc.n_kv_heads = 2;
    mc.ffn_dim = 24;
    mc.init_std = 0.3f;
    mc.moe_experts = E;
    mc.moe_top_k = K;
    mc.moe_ffn_dim = 12;
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
    tc.threads = 1; /* tiny models: one thread beats the OpenMP start-up on a busy 2-core machine */
    return tc;
}

static void random_tokens(int32_t *in, int32_t *tgt, int64_t n, int V, uint64_t seed) {
    us_rng r;
    int64_t i;
    us_rng_seed(&r, seed);
    for (i = 0; i < n; i++) {
        in[i] = (int32_t)(us_rng_u64(&r) % (uint64_t)V);
        tgt[i] = (us_rng_u64(&r) % 5 == 0) ? -1 : (int32_t)(us_rng_u64(&r) % (uint64_t)V);
    }
}

static int64_t count_valid(const int32_t *tgt, int64_t n) {
    int64_t i, v = 0;
    for (i = 0; i < n; i++) v += tgt[i] >= 0;
    return v;
}

/* the routing of every MoE layer after a forward (CPU: activations are host memory) */
static void routing_of(us_model *m, int64_t N, int32_t *out) {
    int l, K = m->cfg.moe_top_k;
    for (l = 0; l < m->cfg.n_layers; l++)
        if (m->moe_idx[l] >= 0) {
            memcpy(out, m->acts[l].topk, sizeof(int32_t) * N * K);
            out += N * K;
        }
}

/* the objective's gradient (language-model mean + the weighted aux loss) against central differences */
static void gradcheck(const char *what, us_model_config mc) {
    us_train_config tc = tiny_train(2, 7);
    us_model m;
    int32_t in[14], tgt[14], *r0, *r1;
    int64_t valid;
    double ls, worst = 0;
    int i, bad = 0, checked = 0, flips = 0, nr = 2 * 14 * 4;
    r0 = malloc(sizeof(int32_t) * nr);
    r1 = malloc(sizeof(int32_t) * nr);
    memset(r0, 0, sizeof(int32_t) * nr);
    memset(r1, 0, sizeof(int32_t) * nr);
    if (us_model_init(&m, &mc, &tc, NULL) != US_OK) {
        CHECK(0, "%s: init: %s", what, us_model_error(&m));
        return;
    }
    random_tokens(in, tgt, 14, 19, 3);
    valid = count_valid(tgt, 14);
    us_model_zero_grad(&m);
    CHECK(us_forward_backward(&m, in, tgt, 2, 7, (float)(1.0 / valid), &ls) == US_OK,
          "%s: forward_backward", what);
    us_forward_eval(&m, in, tgt, 2, 7, &ls, NULL, NULL);
    routing_of(&m, 14, r0);
    for (i = 0; i < m.n_params_t; i++) {
        const us_param *p = &m.params[i];
        int k;
        for (k = 0; k < 2; k++) {
            int64_t j = p->offset + (int64_t)((k * 7919 + i * 31) % p->numel);
            float keep = m.master[j], h = 1e-2f;
            double lp = 0, lm = 0, fd, g = m.grad[j], err, ap, am;
            int flip;
            m.master[j] = keep + h;
            us_forward_eval(&m, in, tgt, 2, 7, &lp, NULL, NULL);
            ap = m.moe_aux_last;
            routing_of(&m, 14, r1);
            flip = memcmp(r0, r1, sizeof(int32_t) * nr) != 0;
            m.master[j] = keep - h;
            us_forward_eval(&m, in, tgt, 2, 7, &lm, NULL, NULL);
            am = m.moe_aux_last;
            routing_of(&m, 14, r1);
            flip |= memcmp(r0, r1, sizeof(int32_t) * nr) != 0;
            m.master[j] = keep;
            if (flip) {
                flips++;
                continue;
            } /* a token changed experts: the loss jumps there */
            fd = ((lp - lm) / (double)valid + (ap - am)) / (2.0 * h);
            err = fabs(fd - g) / (1e-3 + fabs(fd) + fabs(g));
            if (err > worst) worst = err;
            if (err > 2e-2) {
                bad++;
                printf("    %s: %s[%lld]: grad %.6g vs finite difference %.6g\n", what, p->name,
                       (long long)(j - p->offset), g, fd);
            }
            checked++;
        }
    }
    CHECK(bad == 0 && checked > m.n_params_t,
          "%s: gradient vs finite differences: %d of %d entries off, worst relative error %.2e (%d "
          "skipped for a routing flip)",
          what, bad, checked, worst, flips);
    us_model_free(&m);
    free(r0);
    free(r1);
}

static void test_gradcheck(void) {
    us_model_config mc = moe_model(4, 2);
    mc.moe_shared = 1;
    gradcheck("softmax, top-2 of 4, shared expert", mc);
    mc = moe_model(4, 2);
    mc.moe_gate = US_MOE_SIGMOID;
    mc.moe_groups = 2;
    mc.moe_top_groups = 1;
    mc.moe_first_dense = 1;
    gradcheck("sigmoid, 2 groups (1 per token), first layer dense", mc);
    mc = moe_model(4, 2);
    mc.moe_balance = US_MOE_BALANCE_AUX;
    mc.moe_aux_coef = 0.5f;
    mc.moe_gate = US_MOE_SIGMOID;
    gradcheck("aux loss (alpha 0.5), sigmoid", mc);
    mc = moe_model(4, 1);
    mc.moe_balance = US_MOE_BALANCE_AUX;
    mc.moe_aux_coef = 0.5f;
    gradcheck("aux loss (alpha 0.5), softmax top-1", mc);
    mc = moe_model(4, 2);
    mc.moe_capacity = 0.5f;
    gradcheck("capacity factor 0.5 (drops)", mc);
}

/* ---- one expert, top-1, no shared expert is the dense MLP: same loss, same gradients */
static void test_dense_equivalence(void) {
    int gate;
    for (gate = US_MOE_SOFTMAX; gate <= US_MOE_SIGMOID; gate++) {
        us_model_config md = moe_model(0, 0), mm = moe_model(1, 1);
        us_train_config tc = tiny_train(3, 11);
        us_model d, m;
        int32_t in[33], tgt[33];
        double ld, lm, worst = 0, gmax = 0;
        int i, missing = 0;
        md.moe_ffn_dim = 0;
        mm.moe_ffn_dim = md.ffn_dim;
        mm.moe_gate = (us_moe_gate)gate;
        us_model_init(&d, &md, &tc, NULL);
        us_model_init(&m, &mm, &tc, NULL);
        for (i = 0; i < m.n_params_t;
             i++) { /* the dense weights into the MoE model under their MoE names */
            char nm[96];
            const char *s = m.params[i].name, *ex = strstr(s, "mlp.experts.0.");
            const us_param *p;
            if (ex)
                snprintf(nm, sizeof nm, "%.*smlp.%s", (int)(ex - s), s,
                         ex + strlen("mlp.experts.0."));
            else
                snprintf(nm, sizeof nm, "%s", s);
            if (strstr(s, "mlp.gate.weight"))
                continue; /* the router: random, and irrelevant with one expert */
            p = us_model_find_param(&d, nm);
            if (!p || p->numel != m.params[i].numel) {
                missing++;
                continue;
            }
            memcpy(m.master + m.params[i].offset, d.master + p->offset,
                   sizeof(float) * (size_t)p->numel);
        }
        random_tokens(in, tgt, 33, 19, 9);
        us_model_zero_grad(&d);
        us_model_zero_grad(&m);
        us_forward_backward(&d, in, tgt, 3, 11, 0.05f, &ld);
        us_forward_backward(&m, in, tgt, 3, 11, 0.05f, &lm);
        for (i = 0; i < m.n_params_t; i++) {
            char nm[96];
            const char *s = m.params[i].name, *ex = strstr(s, "mlp.experts.0.");
            const us_param *p;
            int64_t j;
            if (ex)
                snprintf(nm, sizeof nm, "%.*smlp.%s", (int)(ex - s), s,
                         ex + strlen("mlp.experts.0."));
            else
                snprintf(nm, sizeof nm, "%s", s);
            if (strstr(s,
                       "mlp.gate.weight")) { /* a single expert's gate is constant 1: no gradient */
                for (j = 0; j < m.params[i].numel; j++)
                    if (fabs(m.grad[m.params[i].offset + j]) > worst)
                        worst = fabs(m.grad[m.params[i].offset + j]);
                continue;
            }
            p = us_model_find_param(&d, nm);
            for (j = 0; p && j < p->numel; j++) {
                double a = d.grad[p->offset + j], b = m.grad[m.params[i].offset + j];
                if (fabs(a - b) > worst) worst = fabs(a - b);
                if (fabs(a) > gmax) gmax = fabs(a);
            }
        }
        CHECK(missing == 0 && m.n_params == d.n_params + (int64_t)2 * md.dim,
              "%s: every dense tensor has its MoE counterpart (+ the [1, C] router per layer)",
              gate == US_MOE_SIGMOID ? "sigmoid" : "softmax");
        CHECK(fabs(ld - lm) <= 1e-6 * fabs(ld),
              "%s, E=1 top-1: loss %.9f equals the dense model's %.9f",
              gate == US_MOE_SIGMOID ? "sigmoid" : "softmax", lm, ld);
        CHECK(worst <= 1e-6 * gmax,
              "%s, E=1 top-1: gradients equal the dense model's (max diff %.2e, max |g| %.2e)",
              gate == US_MOE_SIGMOID ? "sigmoid" : "softmax", worst, gmax);
        us_model_free(&d);
        us_model_free(&m);
    }
}

/* ---- capacity: in the model, kept = min(routed, cap) and the later tokens of a full expert drop */
static void test_capacity_model(void) {
    us_model_config mc = moe_model(4, 2);
    us_train_config tc = tiny_train(2, 16);
    us_model m;
    int32_t in[32], tgt[32];
    us_step_stats st;
    int l, e, n, bad = 0;
    int64_t cap, dropped = 0, expect = 0;
    mc.moe_capacity = 0.75f; /* cap = ceil(0.75·32·2/4) = 12 */
    us_model_init(&m, &mc, &tc, NULL);
    cap = us__moe_cap(&m.cfg, 32);
    random_tokens(in, tgt, 32, 19, 21);
    us_train_step(&m, in, tgt, &st);
    for (l = 0; l < 2; l++) {
        const int32_t *cnt = m.moe_counts_h + l * 12, *tk = m.acts[l].topk,
                      *sr = m.acts[l].slot_row;
        int seen[4] = {0};
        for (e = 0; e < 4; e++) {
            bad += cnt[4 + e] != (cnt[e] > cap ? cap : cnt[e]);
            expect += cnt[e] - cnt[4 + e];
        }
        for (n = 0; n < 64; n++) {
            int keep = seen[tk[n]]++ < cap;
            bad += keep != (sr[n] >= 0);
            dropped += sr[n] < 0;
        }
    }
    CHECK(cap == 12 && bad == 0 && dropped == expect && expect > 0,
          "capacity factor 0.75: cap %lld, kept = min(routed, cap), %lld later choices dropped",
          (long long)cap, (long long)dropped);
    CHECK(fabsf(st.moe_drop_frac - (float)dropped / 128.0f) < 1e-6f,
          "the step reports the dropped fraction %.4f", st.moe_drop_frac);
    us_model_free(&m);
}

/* ---- auxiliary-loss-free balancing: a router skewed toward experts 0 and 1 is evened out by the bias */
static void test_bias_balancing(void) {
    int mode;
    for (mode = 0; mode < 2; mode++) { /* 0: bias rule, 1: none (the control) */
        us_model_config mc = moe_model(4, 2);
        us_train_config tc = tiny_train(4, 16);
        us_model m;
        int32_t in[64], tgt[64];
        us_step_stats st;
        const us_param *emb = NULL;
        float first = 0;
        int s, l, j;
        mc.moe_balance = mode ? US_MOE_BALANCE_NONE : US_MOE_BALANCE_BIAS;
        mc.moe_bias_rate = 0.05f;
        mc.n_layers = 1;
        tc.lr = 1e-9f; /* the weights stay: only the bias moves */
        us_model_init(&m, &mc, &tc, NULL);
        emb = us_model_find_param(&m, "model.embed_tokens.weight");
        for (j = 0; j < 19; j++)
            m.master[emb->offset + j * 16] += 3.0f; /* every token leans along dimension 0 ... */
        for (l = 0; l < 1; l++) {
            const us_param *r = us_model_find_param(&m, "model.layers.0.mlp.gate.weight");
            m.master[r->offset + 0 * 16] = 2.0f;
            m.master[r->offset + 1 * 16] = 1.5f; /* ... which experts 0 and 1 like */
        }
        for (s = 0; s < 40; s++) {
            random_tokens(in, tgt, 64, 19, 300 + s);
            us_train_step(&m, in, tgt, &st);
            if (s == 0) first = st.moe_imbalance;
        }
        if (!mode)
            CHECK(
                first > 1.8f && st.moe_imbalance < 1.4f,
                "bias rule: load imbalance (max/mean) %.3f at step 1 falls to %.3f after 40 steps",
                first, st.moe_imbalance);
        else
            CHECK(first > 1.8f && st.moe_imbalance > 1.8f,
                  "without balancing the skewed router stays imbalanced: %.3f -> %.3f", first,
                  st.moe_imbalance);
        if (!mode)
            CHECK(m.moe_bias_h[0] < 0 && m.moe_bias_h[2] > 0,
                  "the overloaded expert's bias fell (%.3f), an idle one's rose (%.3f)",
                  m.moe_bias_h[0], m.moe_bias_h[2]);
        us_model_free(&m);
    }
}

/* ---- the aux loss: its value is α·Σ f_e·P_e from the routing */
static void test_aux_value(void) {
    us_model_config mc = moe_model(4, 2);
    us_train_config tc = tiny_train(2, 8);
    us_model m;
    int32_t in[16], tgt[16];
    double ls, want = 0;
    int l, e, n;
    mc.moe_balance = US_MOE_BALANCE_AUX;
    mc.moe_aux_coef = 0.1f;
    us_model_init(&m, &mc, &tc, NULL);
    random_tokens(in, tgt, 16, 19, 5);
    us_forward_eval(&m, in, tgt, 2, 8, &ls, NULL, NULL);
    for (l = 0; l < 2; l++) {
        double f[4] = {0}, P[4] = {0};
        for (n = 0; n < 32; n++) f[m.acts[l].topk[n]] += 4.0 / (2.0 * 16);
        for (n = 0; n < 16; n++)
            for (e = 0; e < 4; e++) P[e] += m.acts[l].probs[n * 4 + e] / 16.0;
        for (e = 0; e < 4; e++) want += 0.1 * f[e] * P[e];
    }
    CHECK(fabs(m.moe_aux_last - want) < 1e-6 && want > 0.15,
          "aux loss %.6f = alpha·Σ f·P over the layers %.6f (balanced: 2·alpha = 0.2)",
          m.moe_aux_last, want);
    us_model_free(&m);
}

/* ---- recompute modes give bit-identical gradients; accumulation equals the big batch */
static void test_recompute_accum(void) {
    int prec;
    for (prec = 0; prec < 2; prec++) {
        us_model_config mc = moe_model(4, 2);
        float *g[3];
        int mode, B = 3, T = 9;
        int32_t in[27], tgt[27];
        mc.moe_shared = 1;
        mc.moe_first_dense = 1;
        mc.n_layers = 3;
        random_tokens(in, tgt, 27, 19, 11);
        for (mode = 0; mode < 3; mode++) {
            us_train_config tc = tiny_train(B, T);
            us_model m;
            double ls;
            tc.precision = prec ? US_PRECISION_BF16 : US_PRECISION_FP32;
            tc.recompute = (us_recompute)(US_RECOMPUTE_NONE + mode);
            us_model_init(&m, &mc, &tc, NULL);
            us_model_zero_grad(&m);
            us_forward_backward(&m, in, tgt, B, T, 0.01f, &ls);
            g[mode] = (float *)malloc((size_t)m.n_params * 4);
            memcpy(g[mode], m.grad, (size_t)m.n_params * 4);
            if (mode == 2)
                CHECK(!memcmp(g[0], g[1], (size_t)m.n_params * 4) &&
                          !memcmp(g[0], g[2], (size_t)m.n_params * 4),
                      "%s MoE: selective and full recompute give gradients bit-identical to none",
                      prec ? "bf16" : "fp32");
            us_model_free(&m);
        }
        free(g[0]);
        free(g[1]);
        free(g[2]);
    }
    {
        us_model_config mc = moe_model(4, 2);
        us_train_config ta = tiny_train(2, 9), tb = tiny_train(6, 9);
        us_model a, b;
        int32_t in[54], tgt[54];
        us_step_stats sa, sb;
        double maxd = 0;
        int64_t i;
        int s;
        mc.moe_shared = 1;
        ta.grad_accum = 3;
        us_model_init(&a, &mc, &ta, NULL);
        us_model_init(&b, &mc, &tb, NULL);
        for (s = 0; s < 3; s++) {
            random_tokens(in, tgt, 54, 19, 100 + s);
            us_train_step(&a, in, tgt, &sa);
            us_train_step(&b, in, tgt, &sb);
        }
        for (i = 0; i < a.n_params; i++)
            if (fabs(a.master[i] - b.master[i]) > maxd) maxd = fabs(a.master[i] - b.master[i]);
        CHECK(fabsf(sa.loss - sb.loss) <= 1e-5f * sb.loss && maxd < 1e-5 &&
                  !memcmp(a.moe_bias_h, b.moe_bias_h, sizeof(float) * 8) &&
                  sa.moe_load[0] + sa.moe_load[1] + sa.moe_load[2] + sa.moe_load[3] == 2 * 54,
              "3x2 accumulation equals batch 6: loss %.6f vs %.6f, weights (max diff %.1e), router "
              "bias, loads summed over micro-batches",
              sa.loss, sb.loss, maxd);
        us_model_free(&a);
        us_model_free(&b);
    }
}

/* ---- the estimator equals the allocation; names; active parameters; validation */
static void test_estimator_and_config(void) {
    int prec, mode, v;
    for (prec = 0; prec < 2; prec++)
        for (mode = 0; mode < 3; mode++)
            for (v = 0; v < 3; v++) {
                us_model_config mc = moe_model(4, 2);
                us_train_config tc = tiny_train(3, 13);
                us_memory est;
                us_model m;
                char err[256];
                if (v == 1) {
                    mc.moe_shared = 1;
                    mc.moe_capacity = 0.5f;
                }
                if (v == 2) {
                    mc.moe_first_dense = 1;
                    mc.n_layers = 3;
                    mc.moe_every = 2;
                    mc.moe_shared = 1;
                }
                tc.precision = prec ? US_PRECISION_BF16 : US_PRECISION_FP32;
                tc.recompute = (us_recompute)(US_RECOMPUTE_NONE + mode);
                CHECK(us_memory_estimate(&mc, &tc, &est, err, sizeof err) == US_OK, "estimate: %s",
                      err);
                us_model_init(&m, &mc, &tc, NULL);
                CHECK(est.params == m.mem.params && est.grads == m.mem.grads &&
                          est.activations == m.mem.activations && est.total == m.mem.total,
                      "MoE variant %d %s recompute=%s: estimated %zu = allocated %zu bytes "
                      "(activations %zu vs %zu)",
                      v, us_precision_name(tc.precision), us_recompute_name(tc.recompute),
                      est.total, m.mem.total, est.activations, m.mem.activations);
                CHECK(m.n_params == us_param_count(&mc),
                      "MoE variant %d: parameter count formula %lld = built %lld", v,
                      (long long)us_param_count(&mc), (long long)m.n_params);
                us_model_free(&m);
            }
    {
        us_model_config mc = moe_model(8, 2), md = moe_model(0, 0);
        us_train_config tc = tiny_train(2, 8);
        us_model m;
        int64_t tot, act, dense;
        mc.moe_shared = 1;
        md.moe_ffn_dim = 0;
        us_model_init(&m, &mc, &tc, NULL);
        CHECK(us_model_find_param(&m, "model.layers.1.mlp.gate.weight") &&
                  us_model_find_param(&m, "model.layers.0.mlp.experts.7.down_proj.weight") &&
                  us_model_find_param(&m, "model.layers.1.mlp.shared_experts.up_proj.weight") &&
                  !us_model_find_param(&m, "model.layers.0.mlp.gate_proj.weight"),
              "DeepSeek-MoE parameter names: mlp.gate, mlp.experts.{e}.*_proj, "
              "mlp.shared_experts.*_proj");
        tot = us_param_count(&mc);
        act = us_param_count_active(&mc);
        dense = us_param_count(&md);
        CHECK(tot - act == 2 * (int64_t)(8 - 2) * 3 * 16 * 12 &&
                  us_param_count_active(&md) == dense,
              "active parameters %lld = total %lld minus the 6 idle experts of each layer",
              (long long)act, (long long)tot);
        CHECK(us_flops_per_token(&mc, 8) == 6.0 * act + 12.0 * 2 * 16 * 8,
              "FLOPs per token count the active parameters");
        us_model_free(&m);
    }
    {
        struct {
            const char *msg;
            int E, K, G, M, cp, cap;
        } bad[] = {
            {"must be in 1..experts", 4, 5, 0, 0, 1, 0},
            {"must divide experts", 6, 2, 4, 0, 1, 0},
            {"do not fit in top-groups", 8, 4, 4, 1, 1, 0},
            {"which cp and sp spread over several ranks", 4, 2, 0, 0, 2, 1},
            {"capacity factor", 4, 2, 0, 0, 1, -1},
            {"need experts > 0", 0, 2, 0, 0, 1, 0},
        };

        int i;
        for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
            us_model_config mc = moe_model(bad[i].E, bad[i].K);
            us_train_config tc = tiny_train(2, 8);
            char err[256] = "";
            us_result r;
            mc.moe_groups = bad[i].G;
            mc.moe_top_groups = bad[i].M;
            mc.moe_capacity = (float)bad[i].cap;
            tc.cp = bad[i].cp;
            if (!bad[i].E) mc.moe_ffn_dim = 0;
            r = us_config_validate(&mc, &tc, err, sizeof err);
            CHECK(r == US_ERR_INVALID && strstr(err, bad[i].msg) && !strchr(err, '\n'),
                  "refused in one sentence: %s", err);
        }
    }
}

/* ---- a MoE model learns the built-in task */
static void test_learns(void) {
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
    mc.dim = 32;
    mc.n_heads = 4;
    mc.moe_experts = 4;
    mc.moe_top_k = 2;
    tc.batch = 8;
    tc.seq = 2 * US_TASK_LINE - 1;
    tc.steps = 100;
    tc.threads = 1;
    tc.lr = 1e-2f;
    tc.warmup = 10;
    us_model_init(&m, &mc, &tc, NULL);
    us_task_init(&task, 1);
    in = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    tgt = (int32_t *)malloc((size_t)tc.batch * tc.seq * 4);
    for (s = 0; s < tc.steps; s++) {
        us_task_batch(&task, tc.batch, tc.seq, in, tgt);
        if (us_train_step(&m, in, tgt, &st) != US_OK) break;
        if (s == 0) first = st.loss;
    }
    CHECK(first > 4.0f && st.loss < 2.5f,
          "MoE E=4 top-2 learns the sorting task: loss %.3f -> %.3f in %d steps (imbalance %.2f)",
          first, st.loss, tc.steps, st.moe_imbalance);
    free(in);
    free(tgt);
    us_model_free(&m);
}

/* tc.moe_force_balance (benchmarks): token n's k-th expert is (n·K + k) mod E whatever the
   router says, so every expert routes the same number of tokens; the gates are the router's
   probabilities of those experts (softmax) or those over their sum (sigmoid). */
static void test_force_balance(void) {
    int gate;
    for (gate = 0; gate < 2; gate++) {
        us_model_config mc = moe_model(4, 2);
        us_train_config tc = tiny_train(2, 7);
        us_model m;
        int32_t in[14], tgt[14];
        double ls;
        int64_t n, bad = 0, off = 0, cnt[4] = {0, 0, 0, 0};
        int l, k, e;
        mc.moe_gate = gate ? US_MOE_SIGMOID : US_MOE_SOFTMAX;
        tc.moe_force_balance = 1;
        if (us_model_init(&m, &mc, &tc, NULL) != US_OK) {
            CHECK(0, "forced balance: init: %s", us_model_error(&m));
            continue;
        }
        random_tokens(in, tgt, 14, 19, 5);
        us_model_zero_grad(&m);
        CHECK(us_forward_backward(&m, in, tgt, 2, 7, 1.0f / 14, &ls) == US_OK && isfinite(ls),
              "forced balance (%s): forward_backward", gate ? "sigmoid" : "softmax");
        for (l = 0; l < m.cfg.n_layers; l++) {
            const us_layer_acts *A = &m.acts[l];
            if (m.moe_idx[l] < 0) continue;
            for (n = 0; n < 14; n++) {
                double sum = 0;
                for (k = 0; k < 2; k++) sum += A->probs[n * 4 + (n * 2 + k) % 4];
                for (k = 0; k < 2; k++) {
                    int want = (int)((n * 2 + k) % 4);
                    float p = A->probs[n * 4 + want];
                    float g = gate ? (float)(p / sum) : p;
                    if (A->topk[n * 2 + k] != want || fabsf(A->gates[n * 2 + k] - g) > 1e-7f) bad++;
                    cnt[want]++;
                }
            }
            off++;
        }
        for (e = 1; e < 4; e++)
            if (cnt[e] != cnt[0]) bad++;
        CHECK(off > 0 && bad == 0,
              "forced balance (%s): every token's experts are (n*K+k) mod E with the router's "
              "gates, %lld tokens per expert each (%lld wrong)",
              gate ? "sigmoid" : "softmax", (long long)cnt[0], (long long)bad);
        us_model_free(&m);
    }
    {
        us_model_config mc = moe_model(4, 2);
        us_train_config tc = tiny_train(2, 7);
        char err[200];
        tc.moe_force_balance = 2;
        CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "moe_force_balance=2"),
              "moe_force_balance 2: %s", err);
    }
}

int main(int argc, char **argv) {
    int i;
    for (i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-v")) us_test_verbose = 1;
    O = us_cpu_ops(1);
    test_route();
    test_route_bwd();
    test_permute_gather_scatter();
    test_gradcheck();
    test_dense_equivalence();
    test_capacity_model();
    test_bias_balancing();
    test_aux_value();
    test_recompute_accum();
    test_estimator_and_config();
    test_learns();
    test_force_balance();
    return us_test_done("test_moe");
}
