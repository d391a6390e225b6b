/* figures.c — the Playbook's key figures, recomputed by this library and written as SVG:
       build/figures [DIR]          # default docs/
     DIR/fig_memory_recompute.svg   memory per GPU vs sequence length, recompute none/selective/full
                                    (Llama-3.1-8B, one sequence, bf16; us_memory_estimate)
     DIR/fig_zero_ladder.svg        ZeRO-0..3 memory per GPU by category (Llama-3.1-8B, dp 8)
     DIR/fig_pp_bubble.svg          pipeline bubble vs micro-batches, pp 8: 1F1B, interleaved (v 2),
                                    ZB-H1, ZB-V (us_pp_simulate at tF = tB = tW)
     DIR/fig_tp_tradeoff.svg        TP 1..8 on one node: predicted throughput vs memory per GPU
                                    (Llama-3.1-8B, T 4096, planner cost model; predicted, not measured) */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#define GIB 1073741824.0
static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};

static void llama8b(us_model_config *mc) {
    memset(mc, 0, sizeof *mc);
    mc->dim = 4096;
    mc->ffn_dim = 14336;
    mc->vocab = 128256;
    mc->n_layers = 32;
    mc->n_heads = 32;
    mc->n_kv_heads = 8;
}

/* a line chart: ns series of np points each, x on a log2 axis when logx */
typedef struct chart {
    const char *title, *xlabel, *ylabel;
    double xmin, xmax, ymin, ymax;
    int logx;
} chart;

static double cx(const chart *c, double x) {
    double f = c->logx ? (log2(x) - log2(c->xmin)) / (log2(c->xmax) - log2(c->xmin))
                       : (x - c->xmin) / (c->xmax - c->xmin);
    return 70 + f * 480;
}

static double cy(const chart *c, double y) {
    return 330 - (y - c->ymin) / (c->ymax - c->ymin) * 270;
}

static FILE *chart_open(const char *path, const chart *c, const double *xt, int nxt, double ystep) {
    FILE *f = fopen(path, "w");
    double y;
    int i;
    if (!f) return NULL;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"380\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
               "height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"310\" y=\"30\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n",
            c->title);
    for (y = c->ymin; y <= c->ymax + 1e-9; y += ystep)
        fprintf(f,
                "<line x1=\"70\" x2=\"550\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text "
                "x=\"64\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                cy(c, y), cy(c, y), cy(c, y) + 4, y);
    for (i = 0; i < nxt; i++)
        fprintf(f, "<text x=\"%.1f\" y=\"348\" text-anchor=\"middle\">%g</text>\n", cx(c, xt[i]),
                xt[i]);
    fprintf(f, "<line x1=\"70\" x2=\"550\" y1=\"330\" y2=\"330\" stroke=\"black\"/><line x1=\"70\" "
               "x2=\"70\" y1=\"60\" y2=\"330\" stroke=\"black\"/>\n");
    fprintf(f, "<text x=\"310\" y=\"372\" text-anchor=\"middle\">%s</text>\n", c->xlabel);
    fprintf(f,
            "<text x=\"18\" y=\"195\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
            "195)\">%s</text>\n",
            c->ylabel);
    return f;
}

static void series(FILE *f, const chart *c, const double *x, const double *y, int n, int k,
                   const char *name, int dashed) {
    int i;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
            colors[k % 5], dashed ? " stroke-dasharray=\"5,4\"" : "");
    for (i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", cx(c, x[i]), cy(c, y[i]));
    fprintf(f, "\"/>\n");
    for (i = 0; i < n; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", cx(c, x[i]),
                cy(c, y[i]), colors[k % 5]);
    fprintf(f,
            "<line x1=\"565\" x2=\"590\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" "
            "stroke-width=\"2\"%s/><text x=\"596\" y=\"%d\">%s</text>\n",
            80 + 20 * k, 80 + 20 * k, colors[k % 5], dashed ? " stroke-dasharray=\"5,4\"" : "",
            84 + 20 * k, name);
}

static int fig_memory(const char *dir) {
    static const us_recompute modes[] = {US_RECOMPUTE_NONE, US_RECOMPUTE_SELECTIVE,
                                         US_RECOMPUTE_FULL};
    double xs[5] = {1024, 2048, 4096, 8192, 16384}, ys[4][5];
    char path[512], err[256];
    us_model_config mc;
    chart c = {"Llama-3.1-8B, one sequence, bf16 + fp32 AdamW: memory per GPU",
               "sequence length",
               "GiB",
               1024,
               16384,
               0,
               250,
               1};
    FILE *f;
    int i, k;
    llama8b(&mc);
    for (k = 0; k < 3; k++)
        for (i = 0; i < 5; i++) {
            us_train_config tc;
            us_memory m;
            memset(&tc, 0, sizeof tc);
            tc.batch = 1;
            tc.seq = (int)xs[i];
            tc.precision = US_PRECISION_BF16;
            tc.recompute = modes[k];
            if (us_memory_estimate(&mc, &tc, &m, err, sizeof err) != US_OK) {
                fprintf(stderr, "figures: %s\n", err);
                return 1;
            }
            ys[k][i] = m.total / GIB;
            ys[3][i] = (m.params + m.grads + m.master + m.optimizer) / GIB;
        }
    snprintf(path, sizeof path, "%s/fig_memory_recompute.svg", dir);
    if (!(f = chart_open(path, &c, xs, 5, 50))) {
        fprintf(stderr, "figures: cannot write %s\n", path);
        return 1;
    }
    for (k = 0; k < 3; k++) series(f, &c, xs, ys[k], 5, k, us_recompute_name(modes[k]), 0);
    series(f, &c, xs, ys[3], 5, 3, "model states", 1);
    fprintf(f, "</svg>\n");
    fclose(f);
    printf("%s: recompute none %.1f -> %.1f GiB, selective %.1f -> %.1f, full %.1f -> %.1f (T 1024 "
           "-> 16384)\n",
           path, ys[0][0], ys[0][4], ys[1][0], ys[1][4], ys[2][0], ys[2][4]);
    return 0;
}

static int fig_zero(const char *dir) {
    static const char *const cat[] = {"bf16 weights", "fp32 gradients", "fp32 master", "AdamW m, v",
                                      "activations"};
    char path[512], err[256];
    us_model_config mc;
    double v[4][5];
    FILE *f;
    int z, k;
    llama8b(&mc);
    for (z = 0; z < 4; z++) {
        us_train_config tc;
        us_memory m;
        memset(&tc, 0, sizeof tc);
        tc.batch = 1;
        tc.seq = 4096;
        tc.dp = 8;
        tc.zero = z;
        tc.precision = US_PRECISION_BF16;
        if (us_memory_estimate(&mc, &tc, &m, err, sizeof err) != US_OK) {
            fprintf(stderr, "figures: %s\n", err);
            return 1;
        }
        v[z][0] = m.params / GIB;
        v[z][1] = m.grads / GIB;
        v[z][2] = m.master / GIB;
        v[z][3] = m.optimizer / GIB;
        v[z][4] = m.activations / GIB;
    }
    snprintf(path, sizeof path, "%s/fig_zero_ladder.svg", dir);
    if (!(f = fopen(path, "w"))) {
        fprintf(stderr, "figures: cannot write %s\n", path);
        return 1;
    }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"380\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
               "height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"300\" y=\"30\" font-size=\"14\" text-anchor=\"middle\">Llama-3.1-8B on "
               "dp 8, T 4096, one sequence: memory per GPU by ZeRO stage</text>\n");
    fprintf(f, "<line x1=\"70\" x2=\"470\" y1=\"330\" y2=\"330\" stroke=\"black\"/>\n");
    {
        double scale = 270.0 / 150; /* px per GiB, axis to 150 GiB */
        int g;
        for (g = 0; g <= 150; g += 25)
            fprintf(f,
                    "<line x1=\"70\" x2=\"470\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/><text "
                    "x=\"64\" y=\"%.1f\" text-anchor=\"end\">%d</text>\n",
                    330 - g * scale, 330 - g * scale, 334 - g * scale, g);
        fprintf(f, "<text x=\"18\" y=\"195\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
                   "195)\">GiB</text>\n");
        for (z = 0; z < 4; z++) {
            double y = 330, tot = 0;
            int x = 95 + z * 95;
            for (k = 0; k < 5; k++) {
                double h = v[z][k] * scale;
                fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"60\" height=\"%.1f\" fill=\"%s\"/>\n",
                        x, y - h, h, colors[k]);
                y -= h;
                tot += v[z][k];
            }
            fprintf(f,
                    "<text x=\"%d\" y=\"%.1f\" text-anchor=\"middle\">%.1f</text><text x=\"%d\" "
                    "y=\"348\" text-anchor=\"middle\">ZeRO-%d</text>\n",
                    x + 30, y - 5, tot, x + 30, z);
        }
        for (k = 0; k < 5; k++)
            fprintf(f,
                    "<rect x=\"490\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/><text "
                    "x=\"510\" y=\"%d\">%s</text>\n",
                    70 + 22 * k, colors[k], 82 + 22 * k, cat[k]);
    }
    fprintf(f, "</svg>\n");
    fclose(f);
    printf("%s: ZeRO-0 %.1f, ZeRO-1 %.1f, ZeRO-2 %.1f, ZeRO-3 %.1f GiB\n", path,
           v[0][0] + v[0][1] + v[0][2] + v[0][3] + v[0][4],
           v[1][0] + v[1][1] + v[1][2] + v[1][3] + v[1][4],
           v[2][0] + v[2][1] + v[2][2] + v[2][3] + v[2][4],
           v[3][0] + v[3][1] + v[3][2] + v[3][3] + v[3][4]);
    return 0;
}

static int fig_bubble(const char *dir) {
    static const us_pp_kind kinds[] = {US_PP_1F1B, US_PP_INTERLEAVED, US_PP_ZB1, US_PP_ZBV};
    double xs[6] = {8, 16, 24, 32, 48, 64}, ys[4][6];
    char path[512], err[256];
    chart c = {"Pipeline bubble, pp 8, tF = tB = tW (us_pp_simulate)",
               "micro-batches m",
               "bubble (idle fraction)",
               8,
               64,
               0,
               0.5,
               0};
    FILE *f;
    int i, k;
    for (k = 0; k < 4; k++)
        for (i = 0; i < 6; i++) {
            us_pp_schedule s;
            us_pp_sim sim;
            if (us_pp_schedule_build(&s, kinds[k], 8, (int)xs[i], 2, err, sizeof err) != US_OK) {
                fprintf(stderr, "figures: %s\n", err);
                return 1;
            }
            if (us_pp_simulate(&s, 1, 1, 1, &sim, err, sizeof err) != US_OK) {
                us_pp_schedule_free(&s);
                fprintf(stderr, "figures: %s\n", err);
                return 1;
            }
            ys[k][i] = sim.bubble;
            us_pp_schedule_free(&s);
        }
    snprintf(path, sizeof path, "%s/fig_pp_bubble.svg", dir);
    if (!(f = chart_open(path, &c, xs, 6, 0.1))) {
        fprintf(stderr, "figures: cannot write %s\n", path);
        return 1;
    }
    for (k = 0; k < 4; k++)
        series(f, &c, xs, ys[k], 6, k, k == 1 ? "interleaved v2" : us_pp_kind_name(kinds[k]), 0);
    fprintf(f, "</svg>\n");
    fclose(f);
    printf("%s: m 8 -> 64: 1f1b %.3f -> %.3f, interleaved %.3f -> %.3f, zb1 %.3f -> %.3f, zbv %.3f "
           "-> %.3f\n",
           path, ys[0][0], ys[0][5], ys[1][0], ys[1][5], ys[2][0], ys[2][5], ys[3][0], ys[3][5]);
    return 0;
}

static int fig_tp(const char *dir) {
    char path[512], err[256];
    us_model_config mc;
    us_plan_cluster cl;
    double mem[2][4], tok[2][4];
    FILE *f;
    int i, sp;
    llama8b(&mc);
    memset(&cl, 0, sizeof cl);
    us_plan_cluster_defaults(&cl);
    for (sp = 0; sp < 2; sp++)
        for (i = 0; i < 4; i++) {
            us_train_config tc;
            us_plan p;
            memset(&tc, 0, sizeof tc);
            tc.tp = 1 << i;
            tc.dp = 8 >> i;
            tc.sp = sp && tc.tp > 1;
            tc.zero = 1;
            tc.batch = 1;
            tc.seq = 4096;
            tc.grad_accum = 256 / tc.dp;
            tc.precision = US_PRECISION_BF16;
            if (us_plan_cost(&mc, &tc, &cl, &p, err, sizeof err) != US_OK) {
                fprintf(stderr, "figures: %s\n", err);
                return 1;
            }
            mem[sp][i] = p.mem.total / GIB;
            tok[sp][i] = p.tokens_per_s / 8 / 1000;
        }
    snprintf(path, sizeof path, "%s/fig_tp_tradeoff.svg", dir);
    if (!(f = fopen(path, "w"))) {
        fprintf(stderr, "figures: cannot write %s\n", path);
        return 1;
    }
    {
        chart c = {"Llama-3.1-8B, 8 GPUs, ZeRO-1, T 4096: TP throughput vs memory (predicted)",
                   "memory per GPU (GiB)",
                   "thousand tokens/s per GPU",
                   0,
                   140,
                   0,
                   12,
                   0};
        double xt[8] = {0, 20, 40, 60, 80, 100, 120, 140};
        fclose(f);
        if (!(f = chart_open(path, &c, xt, 8, 2))) {
            fprintf(stderr, "figures: cannot write %s\n", path);
            return 1;
        }
        for (sp = 0; sp < 2; sp++) {
            series(f, &c, mem[sp], tok[sp], 4, sp, sp ? "TP + SP" : "TP", sp);
            for (i = 0; i < 4; i++)
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">tp%d</text>\n",
                        cx(&c, mem[sp][i]) + 5, cy(&c, tok[sp][i]) + (sp ? -6 : 14), 1 << i);
        }
        fprintf(f, "<text x=\"310\" y=\"48\" text-anchor=\"middle\" font-size=\"10\" "
                   "fill=\"#555\">planner cost model with the H200 defaults; the measured version "
                   "needs bench/plan_validate.sh's TP runs</text>\n");
        fprintf(f, "</svg>\n");
    }
    fclose(f);
    printf("%s: tp 1/2/4/8: %.1f/%.1f/%.1f/%.1f GiB, %.2f/%.2f/%.2f/%.2f k tok/s per GPU (SP: "
           "%.1f/%.1f/%.1f GiB at tp 2/4/8)\n",
           path, mem[0][0], mem[0][1], mem[0][2], mem[0][3], tok[0][0], tok[0][1], tok[0][2],
           tok[0][3], mem[1][1], mem[1][2], mem[1][3]);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "docs";
    if (argc > 2 || (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))) {
        fprintf(argc > 2 ? stderr : stdout,
                "usage: figures [DIR]   (writes the four SVG figures into DIR, default docs)\n");
        return argc > 2 ? 2 : 0;
    }
    if (fig_memory(dir) || fig_zero(dir) || fig_bubble(dir) || fig_tp(dir)) return 1;
    return 0;
}
