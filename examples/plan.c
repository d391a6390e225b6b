/* plan.c — which parallel configuration trains a model fastest on a cluster (the // >>plan section).
       build/plan --model llama-8b --nodes 1                       # top configurations on 8 × 80 GB
       build/plan --model llama-1b --gpus-per-node 2 --gpu-mem 139 --seq 2048 --global-batch 65536 --rates rates.txt
       build/plan --sweep --svg docs/plan_heatmap.svg              # 1B..405B × 1..64 nodes, H100-class rates
   Every configuration printed is also a build/train_cuda command line. --random N adds N random
   valid configurations that fit (for checking the ranking against measured runs); --tsv FILE
   writes the printed ones as tab-separated lines for bench/plan_validate.sh. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* presets: Hugging Face config.json values */
typedef struct preset {
    const char *name;
    int64_t dim, ffn, vocab;
    int layers, heads, kv, tied, experts, top_k;
} preset;

static const preset presets[] = {
    {"llama-1b", 2048, 8192, 128256, 16, 32, 8, 1, 0, 0},       /* Llama-3.2-1B */
    {"llama-3b", 3072, 8192, 128256, 28, 24, 8, 1, 0, 0},       /* Llama-3.2-3B */
    {"llama-8b", 4096, 14336, 128256, 32, 32, 8, 0, 0, 0},      /* Llama-3.1-8B */
    {"llama-70b", 8192, 28672, 128256, 80, 64, 8, 0, 0, 0},     /* Llama-3.1-70B */
    {"llama-405b", 16384, 53248, 128256, 126, 128, 8, 0, 0, 0}, /* Llama-3.1-405B */
    {"mixtral-8x7b", 4096, 14336, 32000, 32, 32, 8, 0, 8, 2},
};
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

static const preset *find_preset(const char *s) {
    int i;
    for (i = 0; i < NPRESETS; i++)
        if (!strcmp(presets[i].name, s)) return &presets[i];
    return NULL;
}

static void apply_preset(const preset *p, us_model_config *mc) {
    memset(mc, 0, sizeof *mc);
    mc->dim = p->dim;
    mc->ffn_dim = p->ffn;
    mc->vocab = p->vocab;
    mc->n_layers = p->layers;
    mc->n_heads = p->heads;
    mc->n_kv_heads = p->kv;
    mc->tie_embeddings = p->tied;
    if (p->experts) {
        mc->moe_experts = p->experts;
        mc->moe_top_k = p->top_k;
        mc->moe_ffn_dim = p->ffn;
    }
}

static void usage(FILE *f) {
    fprintf(
        f, "usage: plan [model] [cluster] [batch] [output]\n"
           "model:\n"
           "  --model NAME      llama-1b | llama-3b | llama-8b | llama-70b | llama-405b | "
           "mixtral-8x7b (default llama-1b)\n"
           "  --layers N --dim N --heads N --kv-heads N --ffn N --vocab N --tied --experts N "
           "--top-k N\n"
           "                    override the preset's dimensions (without --model: the library's "
           "defaults\n"
           "                    and untied embeddings under them); --experts makes a MoE model, "
           "experts of --ffn\n"
           "cluster:\n"
           "  --gpus-per-node N default 8          --nodes N          default 1\n"
           "  --gpu-mem GIB     default 80         --reserve GIB      memory left free, default 3\n"
           "  --rates FILE      measured rates (bench/calibrate writes it: \"ultrascale-rates 1\", "
           "key = value)\n"
           "  --gemm-tflops X --attn-fwd-tflops X --attn-bwd-tflops X --hbm-gbps X --intra-gbps X\n"
           "  --inter-gbps X --latency-us X --peak-tflops X --cp-attn-eff X --gemm-m-half X "
           "--overlap-tax X\n"
           "                    one rate each (after --rates); defaults: H200 measurements "
           "(us_plan_rates)\n"
           "batch:\n"
           "  --global-batch N  tokens per optimizer step (default 1048576)\n"
           "  --seq N           sequence length T (default 4096)\n"
           "  --max-micro-batch N  largest per-GPU micro-batch tried (default 64)\n"
           "output:\n"
           "  --top N           configurations printed (default 5)\n"
           "  --random N        also N random valid configurations that fit (not among the top)\n"
           "  --seed N          for --random (default 1)\n"
           "  --tsv FILE        the printed configurations as tab-separated lines: kind, rank,\n"
           "                    predicted tokens/s, predicted bytes per GPU, train_cuda command\n"
           "  --sweep           the Playbook's benchmark grid instead: 1B/3B/8B/70B/405B × 1..64 "
           "nodes of\n"
           "                    --gpus-per-node GPUs; rates not given take H100-class values (gemm "
           "600,\n"
           "                    attention 400/300, HBM 2800, NVLink 360, InfiniBand 45)\n"
           "  --svg FILE        with --sweep: the heatmap of predicted MFU and best configuration\n"
           "  --help            this text\n");
}

static int bad(const char *what, const char *v) {
    fprintf(stderr, "plan: %s %s\n", what, v ? v : "");
    return 2;
}

static int num_i(const char *s, long lo, long hi, long *out) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int num_d(const char *s, double lo, double hi, double *out) {
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

static int is_value_flag(const char *f) {
    static const char *const v[] = {"--model",
                                    "--layers",
                                    "--dim",
                                    "--heads",
                                    "--kv-heads",
                                    "--ffn",
                                    "--vocab",
                                    "--experts",
                                    "--top-k",
                                    "--gpus-per-node",
                                    "--nodes",
                                    "--global-batch",
                                    "--seq",
                                    "--max-micro-batch",
                                    "--top",
                                    "--random",
                                    "--seed",
                                    "--gpu-mem",
                                    "--reserve",
                                    "--gemm-tflops",
                                    "--attn-fwd-tflops",
                                    "--attn-bwd-tflops",
                                    "--hbm-gbps",
                                    "--intra-gbps",
                                    "--inter-gbps",
                                    "--latency-us",
                                    "--peak-tflops",
                                    "--cp-attn-eff",
                                    "--gemm-m-half",
                                    "--overlap-tax",
                                    "--rates",
                                    "--tsv",
                                    "--svg"};
    size_t i;
    for (i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!strcmp(f, v[i])) return 1;
    return 0;
}

static void cfg_name(const us_plan *p, char *b, size_t n) {
    const us_train_config *t = &p->tc;
    int k = snprintf(b, n, "dp%d tp%d pp%d cp%d", t->dp, t->tp, t->pp, t->cp);
    if (t->ep > 1) k += snprintf(b + k, n - (size_t)k, " ep%d", t->ep);
    k += snprintf(b + k, n - (size_t)k, " zero%d%s mb%d ga%d %s", t->zero, t->sp ? " sp" : "",
                  t->batch, t->grad_accum, us_recompute_name(t->recompute));
    if (t->pp > 1)
        snprintf(b + k, n - (size_t)k, " %s", us_pp_kind_name((us_pp_kind)t->pp_schedule));
}

static void print_plan(const us_model_config *mc, const char *kind, int i, const us_plan *p,
                       FILE *tsv) {
    char name[160], cmd[1024];
    cfg_name(p, name, sizeof name);
    us_plan_command(mc, p, cmd, sizeof cmd);
    printf("%-6s %2d  %-52s %9.1f ms %10.0f tok/s  MFU %5.1f%%  %6.2f GiB/GPU\n", kind, i, name,
           1e3 * p->t_step, p->tokens_per_s, 100 * p->mfu, p->mem.total / 1073741824.0);
    printf("           compute %.1f  recompute %.1f  tp %.1f  cp %.1f  ep %.1f  bubble %.1f  p2p "
           "%.1f  dp %.1f  zero3 %.1f  optimizer %.1f  overlap %.1f ms\n",
           1e3 * p->t_compute, 1e3 * p->t_recompute, 1e3 * p->t_tp, 1e3 * p->t_cp, 1e3 * p->t_ep,
           1e3 * p->t_bubble, 1e3 * p->t_p2p, 1e3 * p->t_dp, 1e3 * p->t_zero3, 1e3 * p->t_optimizer,
           1e3 * p->t_overlap);
    printf("           %s\n", cmd);
    if (tsv) fprintf(tsv, "%s\t%d\t%.1f\t%zu\t%s\n", kind, i, p->tokens_per_s, p->mem.total, cmd);
}

/* why the best wins: the terms where the best of another family spends more */
static void explain(const us_plan *best, const us_plan *o, const char *family) {
    const char *nm[] = {"compute",
                        "recompute",
                        "TP communication",
                        "CP ring",
                        "EP all-to-all",
                        "pipeline bubble",
                        "pipeline messages",
                        "exposed DP reduction",
                        "ZeRO-3 gathers",
                        "optimizer",
                        "compute slowed by overlapped communication"};
    double a[11] = {best->t_compute, best->t_recompute, best->t_tp,     best->t_cp,
                    best->t_ep,      best->t_bubble,    best->t_p2p,    best->t_dp,
                    best->t_zero3,   best->t_optimizer, best->t_overlap};
    double b[11] = {o->t_compute, o->t_recompute, o->t_tp,     o->t_cp,
                    o->t_ep,      o->t_bubble,    o->t_p2p,    o->t_dp,
                    o->t_zero3,   o->t_optimizer, o->t_overlap};
    char name[160];
    int i, k = 0;
    cfg_name(o, name, sizeof name);
    printf("  vs the best %s (%s, %.1f ms, +%.1f%%):", family, name, 1e3 * o->t_step,
           100 * (o->t_step / best->t_step - 1));
    for (i = 0; i < 11; i++)
        if (b[i] - a[i] > 0.002 * best->t_step) {
            printf("%s +%.1f ms %s", k++ ? "," : "", 1e3 * (b[i] - a[i]), nm[i]);
        }
    for (i = 0; i < 11; i++)
        if (a[i] - b[i] > 0.002 * best->t_step) {
            printf("%s -%.1f ms %s", k++ ? "," : "", 1e3 * (a[i] - b[i]), nm[i]);
        }
    if (!k) printf(" within 0.2%% in every term");
    printf("\n");
}

/* ------------------------------------------------------------------------------------ */
/* the sweep: the Playbook's benchmark heatmap (T 4096, 1M tokens), predicted */
static int sweep(us_plan_cluster cl0, const char *svg) {
    static const char *const models[] = {"llama-1b", "llama-3b", "llama-8b", "llama-70b",
                                         "llama-405b"};
    static const char *const labels[] = {"1B", "3B", "8B", "70B", "405B"};
    static const int nodes[] = {1, 2, 4, 8, 16, 32, 64};

    enum { NM = 5, NN = 7 };

    double mfu[NM][NN];
    char cfg[NM][NN][96];
    int i, j;
    FILE *f;
    printf("predicted best configuration and MFU, T 4096, global batch 1M tokens, %d GPUs per "
           "node, %.0f GiB each\n",
           cl0.gpus_per_node, cl0.gpu_mem_gib);
    printf("rates: gemm %.0f, attention %.0f/%.0f TFLOP/s, HBM %.0f, intra-node %.0f, inter-node "
           "%.0f GB/s, peak %.0f TFLOP/s\n",
           cl0.rates.gemm_tflops, cl0.rates.attn_fwd_tflops, cl0.rates.attn_bwd_tflops,
           cl0.rates.hbm_gbps, cl0.rates.intra_gbps, cl0.rates.inter_gbps, cl0.rates.peak_tflops);
    printf("%-11s", "model");
    for (j = 0; j < NN; j++) printf(" | %-22d", nodes[j]);
    printf("\n");
    for (i = 0; i < NM; i++) {
        us_model_config mc;
        apply_preset(find_preset(models[i]), &mc);
        printf("%-11s", models[i]);
        for (j = 0; j < NN; j++) {
            us_plan_cluster cl = cl0;
            us_plan_request q;
            us_plan best;
            int n;
            char err[256];
            memset(&q, 0, sizeof q);
            q.top = 1;
            cl.nodes = nodes[j];
            if (us_plan_enumerate(&mc, &cl, &q, &best, &n, NULL, NULL, err, sizeof err) != US_OK) {
                fprintf(stderr, "plan: %s\n", err);
                return 1;
            }
            if (n) {
                const us_train_config *t = &best.tc;
                mfu[i][j] = best.mfu;
                snprintf(cfg[i][j], sizeof cfg[i][j], "dp%d tp%d pp%d%s z%d", t->dp, t->tp, t->pp,
                         t->cp > 1 ? " cp" : "", t->zero);
                if (t->cp > 1)
                    snprintf(cfg[i][j], sizeof cfg[i][j], "dp%d tp%d pp%d cp%d z%d", t->dp, t->tp,
                             t->pp, t->cp, t->zero);
                printf(" | %4.1f%% %-16s", 100 * best.mfu, cfg[i][j]);
            } else {
                mfu[i][j] = -1;
                snprintf(cfg[i][j], sizeof cfg[i][j], "does not fit");
                printf(" | %-22s", "OOM");
            }
            fflush(stdout);
        }
        printf("\n");
    }
    if (!svg) return 0;
    if (!(f = fopen(svg, "w"))) {
        fprintf(stderr, "plan: cannot write %s\n", svg);
        return 1;
    }
    {
        int W = 130 + NN * 120, Hh = 90 + NM * 60 + 40;
        fprintf(f,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "font-family=\"sans-serif\">\n",
                W, Hh);
        fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
        fprintf(f,
                "<text x=\"%d\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">Predicted MFU of "
                "the best configuration (T 4096, 1M tokens per step, %d GPUs per node)</text>\n",
                W / 2, cl0.gpus_per_node);
        fprintf(f,
                "<text x=\"%d\" y=\"42\" font-size=\"11\" text-anchor=\"middle\" "
                "fill=\"#555\">ultrascale planner, H100-class rates: GEMM %.0f, attention "
                "%.0f/%.0f TFLOP/s, NVLink %.0f, InfiniBand %.0f GB/s, %.0f GiB</text>\n",
                W / 2, cl0.rates.gemm_tflops, cl0.rates.attn_fwd_tflops, cl0.rates.attn_bwd_tflops,
                cl0.rates.intra_gbps, cl0.rates.inter_gbps, cl0.gpu_mem_gib);
        for (j = 0; j < NN; j++)
            fprintf(f,
                    "<text x=\"%d\" y=\"72\" font-size=\"12\" text-anchor=\"middle\">%d "
                    "node%s</text>\n",
                    130 + j * 120 + 60, nodes[j], nodes[j] > 1 ? "s" : "");
        for (i = 0; i < NM; i++) {
            int y = 82 + i * 60;
            fprintf(f, "<text x=\"120\" y=\"%d\" font-size=\"13\" text-anchor=\"end\">%s</text>\n",
                    y + 34, labels[i]);
            for (j = 0; j < NN; j++) {
                int x = 130 + j * 120;
                if (mfu[i][j] < 0) {
                    fprintf(f,
                            "<rect x=\"%d\" y=\"%d\" width=\"118\" height=\"58\" "
                            "fill=\"#ddd\"/><text x=\"%d\" y=\"%d\" font-size=\"12\" "
                            "text-anchor=\"middle\" fill=\"#666\">does not fit</text>\n",
                            x, y, x + 59, y + 34);
                } else { /* white (0 %) to deep blue (60 %) */
                    double t = mfu[i][j] / 0.6;
                    int rr, gg, bb;
                    if (t > 1) t = 1;
                    rr = (int)(255 - t * (255 - 8));
                    gg = (int)(255 - t * (255 - 69));
                    bb = (int)(255 - t * (255 - 148));
                    fprintf(f,
                            "<rect x=\"%d\" y=\"%d\" width=\"118\" height=\"58\" "
                            "fill=\"rgb(%d,%d,%d)\"/>\n",
                            x, y, rr, gg, bb);
                    fprintf(f,
                            "<text x=\"%d\" y=\"%d\" font-size=\"15\" text-anchor=\"middle\" "
                            "fill=\"%s\">%.1f%%</text>\n",
                            x + 59, y + 26, t > 0.55 ? "white" : "black", 100 * mfu[i][j]);
                    fprintf(f,
                            "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\" "
                            "fill=\"%s\">%s</text>\n",
                            x + 59, y + 45, t > 0.55 ? "white" : "black", cfg[i][j]);
                }
            }
        }
        fprintf(f,
                "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\" "
                "fill=\"#555\">each cell: predicted MFU and the fastest configuration that fits (z "
                "= ZeRO stage); grey: no configuration fits in memory</text>\n",
                W / 2, Hh - 12);
        fprintf(f, "</svg>\n");
    }
    fclose(f);
    printf("wrote %s\n", svg);
    return 0;
}

int main(int argc, char **argv) {
    us_model_config mc;
    us_plan_cluster cl;
    us_plan_request q;
    us_plan_rates given; /* rates from flags, applied after --rates */
    const char *rates_path = NULL, *tsv_path = NULL, *svg = NULL;
    long top = 5, nrand = 0, seed = 1, v;
    int do_sweep = 0, i;
    char err[256];
    memset(&cl, 0, sizeof cl);
    memset(&q, 0, sizeof q);
    memset(&given, 0, sizeof given);
    /* the preset first, whatever the flag order; without --model, llama-1b unless dimensions are
       given (then the library's defaults fill what is not, untied) */
    {
        int dims = 0;
        for (i = 1; i < argc; i++)
            if (!strcmp(argv[i], "--layers") || !strcmp(argv[i], "--dim") ||
                !strcmp(argv[i], "--heads") || !strcmp(argv[i], "--kv-heads") ||
                !strcmp(argv[i], "--ffn") || !strcmp(argv[i], "--vocab"))
                dims = 1;
        if (dims)
            memset(&mc, 0, sizeof mc);
        else
            apply_preset(&presets[0], &mc);
    }
    for (i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            const preset *p = find_preset(argv[i + 1]);
            if (!p)
                return bad("unknown --model (llama-1b, llama-3b, llama-8b, llama-70b, llama-405b, "
                           "mixtral-8x7b):",
                           argv[i + 1]);
            apply_preset(p, &mc);
        }
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *a = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(f, "--tied")) {
            mc.tie_embeddings = 1;
            continue;
        }
        if (!strcmp(f, "--sweep")) {
            do_sweep = 1;
            continue;
        }
        if (strncmp(f, "--", 2)) return bad("unexpected argument", f);
        if (!is_value_flag(f)) return bad("unknown flag", f);
        if (!a) return bad("missing value after", f);
        i++;
#define INT_FLAG(name, lo, hi, dst)                                           \
    else if (!strcmp(f, name)) {                                              \
        if (!num_i(a, lo, hi, &v))                                            \
            return bad(name " needs an integer in " #lo ".." #hi ", got", a); \
        dst = v;                                                              \
    }
#define DBL_FLAG(name, dst)                                                                 \
    else if (!strcmp(f, name)) {                                                            \
        if (!num_d(a, 1e-9, 1e12, &d)) return bad(name " needs a positive number, got", a); \
        dst = d;                                                                            \
    }
        if (!strcmp(f, "--model")) continue;
        INT_FLAG("--layers", 1, 65536, mc.n_layers)
        INT_FLAG("--dim", 2, 1048576, mc.dim)
        INT_FLAG("--heads", 1, 65536, mc.n_heads)
        INT_FLAG("--kv-heads", 1, 65536, mc.n_kv_heads)
        INT_FLAG("--ffn", 1, 16777216, mc.ffn_dim)
        INT_FLAG("--vocab", 2, 1073741824, mc.vocab)
        INT_FLAG("--experts", 0, 1024, mc.moe_experts)
        INT_FLAG("--top-k", 1, 1024, mc.moe_top_k)
        INT_FLAG("--gpus-per-node", 1, 1024, cl.gpus_per_node)
        INT_FLAG("--nodes", 1, 65536, cl.nodes)
        INT_FLAG("--global-batch", 1, 1099511627776L, q.global_tokens)
        INT_FLAG("--seq", 1, 16777216, q.seq)
        INT_FLAG("--max-micro-batch", 1, 65536, q.max_micro_batch)
        INT_FLAG("--top", 1, 10000, top)
        INT_FLAG("--random", 0, 10000, nrand)
        INT_FLAG("--seed", 0, 2147483647, seed)
        DBL_FLAG("--gpu-mem", cl.gpu_mem_gib)
        DBL_FLAG("--reserve", cl.reserve_gib)
        DBL_FLAG("--gemm-tflops", given.gemm_tflops)
        DBL_FLAG("--attn-fwd-tflops", given.attn_fwd_tflops)
        DBL_FLAG("--attn-bwd-tflops", given.attn_bwd_tflops)
        DBL_FLAG("--hbm-gbps", given.hbm_gbps)
        DBL_FLAG("--intra-gbps", given.intra_gbps)
        DBL_FLAG("--inter-gbps", given.inter_gbps)
        DBL_FLAG("--latency-us", given.latency_us)
        DBL_FLAG("--peak-tflops", given.peak_tflops)
        DBL_FLAG("--cp-attn-eff", given.cp_attn_eff)
        DBL_FLAG("--gemm-m-half", given.gemm_m_half)
        DBL_FLAG("--overlap-tax", given.overlap_tax)
        else if (!strcmp(f, "--rates")) rates_path = a;
        else if (!strcmp(f, "--tsv")) tsv_path = a;
        else if (!strcmp(f, "--svg")) svg = a;
    }
    if (mc.moe_experts && !mc.moe_ffn_dim) mc.moe_ffn_dim = mc.ffn_dim;
    if (!mc.moe_experts) mc.moe_top_k = 0;
    if (svg && !do_sweep) return bad("--svg draws the --sweep heatmap: add --sweep", NULL);
    if (rates_path && us_plan_rates_read(rates_path, &cl.rates, err, sizeof err) != US_OK) {
        fprintf(stderr, "plan: %s\n", err);
        return 2;
    }
    { /* flags over the file */
        double *src = &given.gemm_tflops, *dst = &cl.rates.gemm_tflops;
        int k;
        for (k = 0; k < (int)(sizeof given / sizeof(double)); k++)
            if (src[k] > 0) dst[k] = src[k];
    }
    if (do_sweep) { /* rates not given: H100-class values */
        us_plan_rates *r = &cl.rates;
        if (r->gemm_tflops == 0) r->gemm_tflops = 600;
        if (r->attn_fwd_tflops == 0) r->attn_fwd_tflops = 400;
        if (r->attn_bwd_tflops == 0) r->attn_bwd_tflops = 300;
        if (r->hbm_gbps == 0) r->hbm_gbps = 2800;
        if (r->intra_gbps == 0) r->intra_gbps = 360;
        if (r->inter_gbps == 0) r->inter_gbps = 45;
        us_plan_cluster_defaults(&cl);
        return sweep(cl, svg);
    }
    us_plan_cluster_defaults(&cl);
    us_plan_request_defaults(&q);
    {
        us_plan *all;
        int n, k, shown = 0;
        int64_t nv, nf;
        us_plan one;
        FILE *tsv = NULL;
        q.top = 1;
        if (us_plan_enumerate(&mc, &cl, &q, &one, &n, &nv, &nf, err, sizeof err) != US_OK) {
            fprintf(stderr, "plan: %s\n", err);
            return 2;
        }
        printf("model: %d layers, dim %lld, %d/%d heads, ffn %lld, vocab %lld%s, %.3f B parameters "
               "(%.3f B active)\n",
               mc.n_layers, (long long)mc.dim, mc.n_heads, mc.n_kv_heads, (long long)mc.ffn_dim,
               (long long)mc.vocab, mc.moe_experts ? " (MoE)" : "", us_param_count(&mc) / 1e9,
               us_param_count_active(&mc) / 1e9);
        printf("cluster: %d node(s) x %d GPUs, %.0f GiB each (%.0f reserved); rates: gemm %.4g, "
               "attention %.4g/%.4g TFLOP/s, HBM %.4g, intra %.4g, inter %.4g GB/s\n",
               cl.nodes, cl.gpus_per_node, cl.gpu_mem_gib, cl.reserve_gib, cl.rates.gemm_tflops,
               cl.rates.attn_fwd_tflops, cl.rates.attn_bwd_tflops, cl.rates.hbm_gbps,
               cl.rates.intra_gbps, cl.rates.inter_gbps);
        printf(
            "batch: %lld tokens per step, seq %d: %lld valid configurations, %lld fit in memory\n",
            (long long)q.global_tokens, q.seq, (long long)nv, (long long)nf);
        if (!nf) {
            printf("no configuration fits: add GPUs or memory (the model's weights, gradients and "
                   "AdamW state alone need %.1f GiB in total)\n",
                   18.0 * us_param_count(&mc) / 1073741824.0);
            return 1;
        }
        all = (us_plan *)malloc(sizeof *all * (size_t)nf);
        if (!all) {
            fprintf(stderr, "plan: out of memory\n");
            return 1;
        }
        q.top = (int)nf;
        if (us_plan_enumerate(&mc, &cl, &q, all, &n, NULL, NULL, err, sizeof err) != US_OK) {
            fprintf(stderr, "plan: %s\n", err);
            free(all);
            return 2;
        }
        if (tsv_path && !(tsv = fopen(tsv_path, "w"))) {
            fprintf(stderr, "plan: cannot write %s\n", tsv_path);
            free(all);
            return 2;
        }
        for (k = 0; k < n && k < top; k++, shown++) print_plan(&mc, "top", k + 1, &all[k], tsv);
        if (nrand > 0 && n > shown) { /* distinct random picks among the rest */
            uint64_t s = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
            int left = n - shown, want = nrand < left ? (int)nrand : left, got = 0;
            char *used = (char *)calloc((size_t)n, 1);
            while (used && got < want) {
                int r;
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                r = shown + (int)(s % (uint64_t)left);
                if (used[r]) continue;
                used[r] = 1;
                print_plan(&mc, "random", ++got, &all[r], tsv);
            }
            free(used);
        }
        { /* why the best wins: against the best of each other family, and the best of each ZeRO stage */
            const char *fam[] = {"with tp > 1", "with pp > 1", "with cp > 1", "pure data parallel"};
            int z;
            printf("why the best wins:\n");
            for (k = 0; k < 4; k++) {
                int j;
                for (j = 1; j < n; j++) {
                    const us_train_config *t = &all[j].tc;
                    int in = k == 0   ? t->tp > 1
                             : k == 1 ? t->pp > 1
                             : k == 2 ? t->cp > 1
                                      : t->tp == 1 && t->pp == 1 && t->cp == 1;
                    int bin = k == 0   ? all[0].tc.tp > 1
                              : k == 1 ? all[0].tc.pp > 1
                              : k == 2
                                  ? all[0].tc.cp > 1
                                  : all[0].tc.tp == 1 && all[0].tc.pp == 1 && all[0].tc.cp == 1;
                    if (in && !bin) {
                        explain(&all[0], &all[j], fam[k]);
                        break;
                    }
                }
            }
            for (z = 0; z <= 3; z++) {
                int j;
                char fz[32];
                if (z == all[0].tc.zero) continue;
                snprintf(fz, sizeof fz, "with ZeRO-%d", z);
                for (j = 1; j < n; j++)
                    if (all[j].tc.zero == z) {
                        explain(&all[0], &all[j], fz);
                        break;
                    }
            }
        }
        if (tsv) fclose(tsv);
        free(all);
    }
    return 0;
}
