/* memory.c — the Ultra-Scale Playbook's memory widget as a command-line tool.

   How much memory does training one model on one rank take, and where does it go?
       build/memory --model llama-8b                          # the breakdown at seq 4096
       build/memory --model llama-8b --recompute full --seq 16384
       build/memory --model llama-1b --svg mem.svg            # stacked bars over sequence length
       build/memory --layers 2 --dim 64 --heads 4             # explicit dims, trainer flag names
   Nothing is allocated: the numbers come from us_memory_estimate, which states as formulas the
   same sizes us_model_init allocates. Activations assume this library's flash attention (no
   s² score matrix); the Playbook's own formula, scores materialised, is printed beside it. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GIB 1073741824.0
#define MAX_SEQS 16

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: memory [flags]\n"
        "Training memory for one rank: parameters, gradients, master weights, AdamW state and\n"
        "activations, from the Playbook's formulas applied to ultrascale's layout (ZeRO, TP, SP).\n"
        "model:\n"
        "  --model NAME      preset: tiny | llama-1b | llama-8b | llama-70b | mixtral-8x7b "
        "(default tiny,\n"
        "                    the library defaults); the flags below override its fields\n"
        "                      llama-1b   Llama-3.2-1B: L=16 C=2048 NH=32 NKV=8 F=8192 V=128256, "
        "tied\n"
        "                      llama-8b   Llama-3.1-8B: L=32 C=4096 NH=32 NKV=8 F=14336 V=128256\n"
        "                      llama-70b  Llama-3.1-70B: L=80 C=8192 NH=64 NKV=8 F=28672 V=128256\n"
        "                      mixtral-8x7b  Mixtral-8x7B: L=32 C=4096 NH=32 NKV=8 V=32000, 8 "
        "experts of F=14336, top-2\n"
        "                      tiny       L=4 C=128 NH=4 F=352 V=256 (ultrascale's defaults)\n"
        "  --layers N        decoder layers\n"
        "  --dim N           model width C\n"
        "  --heads N         attention heads\n"
        "  --kv-heads N      key/value heads, < heads for GQA\n"
        "  --ffn N           SwiGLU hidden size\n"
        "  --vocab N         vocabulary size\n"
        "  --tied            tie lm_head to the token embedding\n"
        "  --untied          give lm_head its own weights\n"
        "  --experts E       mixture of experts: E experts per layer (0 = dense)\n"
        "  --top-k K         experts per token (default 2)\n"
        "  --moe-ffn N       each expert's hidden size (default ffn/(K + shared))\n"
        "  --shared-expert   one shared expert per MoE layer\n"
        "  --capacity-factor X  the permuted rows per expert are capped (0 = none)\n"
        "training:\n"
        "  --precision P     fp32 | bf16 | fp16 | fp8 | fp8-tensor (default bf16: bf16 weights and "
        "activations, fp32 master,\n"
        "                    grads and Adam moments)\n"
        "  --recompute R     none | selective | full (default none)\n"
        "  --batch N         sequences per micro-batch B (default 1)\n"
        "  --seq N           tokens per sequence T for the table (default 4096)\n"
        "parallelism (the rank's share):\n"
        "  --dp N            data-parallel ranks (default 1); --zero K shards over them\n"
        "  --zero K          ZeRO stage 0 | 1 | 2 | 3 (default 0)\n"
        "  --tp N            tensor-parallel ranks (default 1)\n"
        "  --sp              sequence parallelism over the tp ranks\n"
        "  --ep N            expert-parallel ranks (default 1): each rank holds experts/N of each "
        "MoE\n"
        "                    layer's experts and room for every ep peer's routed rows\n"
        "output:\n"
        "  --svg FILE        also write a stacked bar chart of memory over sequence length\n"
        "  --measure         train 2 steps of the configuration on this CPU (one rank, random\n"
        "                    tokens) and print the estimate, the allocator's peak and the\n"
        "                    process's peak resident memory side by side\n"
        "  --seqs LIST       the chart's sequence lengths, comma-separated\n"
        "                    (default 1024,2048,4096,8192,16384; at most %d)\n"
        "  --help            this text\n",
        MAX_SEQS);
}

/* ------------------------------------------------------------------------------------ */
/* presets: Hugging Face config.json values */
typedef struct preset {
    const char *name;
    int64_t dim, ffn, vocab;
    int layers, heads, kv_heads, tied;
    int experts, top_k; /* mixture of experts (0: dense); an expert's size is ffn */
} preset;

static const preset presets[] = {
    {"tiny", 0, 0, 0, 0, 0, 0, 0, 0, 0}, /* zero = the library default */
    {"llama-1b", 2048, 8192, 128256, 16, 32, 8, 1, 0, 0},
    {"llama-8b", 4096, 14336, 128256, 32, 32, 8, 0, 0, 0},
    {"llama-70b", 8192, 28672, 128256, 80, 64, 8, 0, 0, 0},
    {"mixtral-8x7b", 4096, 14336, 32000, 32, 32, 8, 0, 8, 2},
};

static const preset *find_preset(const char *name) {
    size_t i;
    for (i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* command line */
typedef struct options {
    const char *model; /* preset name */
    int modified;      /* an explicit model flag overrode the preset */
    /* explicit model flags, -1 = not given: applied over the preset whatever the flag order */
    int64_t layers, dim, heads, kv_heads, ffn, vocab, tied;
    int64_t experts, top_k, moe_ffn, shared; /* mixture of experts, -1 = not given */
    float capacity;
    us_precision precision;
    us_recompute recompute;
    int64_t batch, seq, dp, zero, tp, sp, ep;
    const char *svg;
    int measure; /* --measure: train two steps here and compare */
    int64_t seqs[MAX_SEQS];
    int n_seqs;
} options;

static int bad(const char *msg, const char *arg) {
    fprintf(stderr, "memory: %s%s%s\n", msg, arg ? " " : "", arg ? arg : "");
    usage(stderr);
    return 2;
}

/* strict: the whole argument is a decimal integer in [lo, hi] (no sign, no spaces) */
static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    long long v;
    if (*s < '0' || *s > '9') return 0;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = (int64_t)v;
    return 1;
}

/* "1024,2048,4096": each entry a strict integer in [1, 2^24] */
static int parse_seqs(const char *s, options *o) {
    char buf[256], *tok, *next;
    if (strlen(s) >= sizeof buf) return 0;
    strcpy(buf, s);
    o->n_seqs = 0;
    for (tok = buf; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        if (o->n_seqs == MAX_SEQS || !parse_i64(tok, 1, 1 << 24, &o->seqs[o->n_seqs])) return 0;
        o->n_seqs++;
    }
    return 1;
}

static void options_defaults(options *o) {
    static const int64_t seqs[] = {1024, 2048, 4096, 8192, 16384};
    memset(o, 0, sizeof *o);
    o->model = "tiny";
    o->layers = o->dim = o->heads = o->kv_heads = o->ffn = o->vocab = o->tied = -1;
    o->experts = o->top_k = o->moe_ffn = o->shared = -1;
    o->precision = US_PRECISION_BF16;
    o->recompute = US_RECOMPUTE_NONE;
    o->batch = 1;
    o->seq = 4096;
    o->dp = o->tp = o->ep = 1;
    o->n_seqs = (int)(sizeof seqs / sizeof seqs[0]);
    memcpy(o->seqs, seqs, sizeof seqs);
}

static int takes_value(const char *flag) {
    static const char *const flags[] = {"--model", "--layers",    "--dim",
                                        "--heads", "--kv-heads",  "--ffn",
                                        "--vocab", "--precision", "--recompute",
                                        "--batch", "--seq",       "--seqs",
                                        "--svg",   "--dp",        "--zero",
                                        "--tp",    "--ep",        "--experts",
                                        "--top-k", "--moe-ffn",   "--capacity-factor"};
    size_t i;
    for (i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(flag, flags[i])) return 1;
    return 0;
}

/* Returns -1 to go on, else the exit code (0 after --help, 2 after a bad argument). */
static int parse_args(int argc, char **argv, options *o) {
    int i;
    options_defaults(o);
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(f, "--tied") || !strcmp(f, "--untied")) {
            o->tied = f[2] == 't';
            o->modified = 1;
            continue;
        }
        if (!strcmp(f, "--sp")) {
            o->sp = 1;
            continue;
        }
        if (!strcmp(f, "--measure")) {
            o->measure = 1;
            continue;
        }
        if (!strcmp(f, "--shared-expert")) {
            o->shared = 1;
            o->modified = 1;
            continue;
        }
        if (strncmp(f, "--", 2)) return bad("unexpected argument", f);
        if (!takes_value(f)) return bad("unknown flag", f);
        if (!v) return bad("missing value for", f);
        if (!strcmp(f, "--model")) {
            if (!find_preset(v))
                return bad(
                    "unknown model preset (tiny, llama-1b, llama-8b, llama-70b, mixtral-8x7b):", v);
            o->model = v;
        } else if (!strcmp(f, "--layers"))
            ok = parse_i64(v, 1, 1 << 16, &o->layers);
        else if (!strcmp(f, "--dim"))
            ok = parse_i64(v, 2, 1 << 20, &o->dim);
        else if (!strcmp(f, "--heads"))
            ok = parse_i64(v, 1, 1 << 16, &o->heads);
        else if (!strcmp(f, "--kv-heads"))
            ok = parse_i64(v, 1, 1 << 16, &o->kv_heads);
        else if (!strcmp(f, "--ffn"))
            ok = parse_i64(v, 1, 1 << 24, &o->ffn);
        else if (!strcmp(f, "--vocab"))
            ok = parse_i64(v, 2, 1 << 30, &o->vocab);
        else if (!strcmp(f, "--batch"))
            ok = parse_i64(v, 1, 1 << 24, &o->batch);
        else if (!strcmp(f, "--seq"))
            ok = parse_i64(v, 1, 1 << 24, &o->seq);
        else if (!strcmp(f, "--seqs"))
            ok = parse_seqs(v, o);
        else if (!strcmp(f, "--dp"))
            ok = parse_i64(v, 1, 1 << 20, &o->dp);
        else if (!strcmp(f, "--zero"))
            ok = parse_i64(v, 0, 3, &o->zero);
        else if (!strcmp(f, "--tp"))
            ok = parse_i64(v, 1, 1 << 16, &o->tp);
        else if (!strcmp(f, "--ep"))
            ok = parse_i64(v, 1, 1 << 16, &o->ep);
        else if (!strcmp(f, "--experts")) {
            ok = parse_i64(v, 0, 1024, &o->experts);
            o->modified = 1;
        } else if (!strcmp(f, "--top-k")) {
            ok = parse_i64(v, 1, 1024, &o->top_k);
            o->modified = 1;
        } else if (!strcmp(f, "--moe-ffn")) {
            ok = parse_i64(v, 1, 1 << 24, &o->moe_ffn);
            o->modified = 1;
        } else if (!strcmp(f, "--capacity-factor")) {
            double x;
            char *end;
            x = strtod(v, &end);
            ok = end != v && !*end && x >= 0 && x < 1e6;
            o->capacity = (float)x;
        } else if (!strcmp(f, "--svg"))
            o->svg = v;
        else if (!strcmp(f, "--precision")) {
            if (!strcmp(v, "fp32"))
                o->precision = US_PRECISION_FP32;
            else if (!strcmp(v, "bf16"))
                o->precision = US_PRECISION_BF16;
            else if (!strcmp(v, "fp16"))
                o->precision = US_PRECISION_FP16;
            else if (!strcmp(v, "fp8"))
                o->precision = US_PRECISION_FP8;
            else if (!strcmp(v, "fp8-tensor"))
                o->precision = US_PRECISION_FP8_TENSOR;
            else
                return bad("--precision must be fp32, bf16, fp16, fp8 or fp8-tensor, got", v);
        } else if (!strcmp(f, "--recompute")) {
            if (!strcmp(v, "none"))
                o->recompute = US_RECOMPUTE_NONE;
            else if (!strcmp(v, "selective"))
                o->recompute = US_RECOMPUTE_SELECTIVE;
            else if (!strcmp(v, "full"))
                o->recompute = US_RECOMPUTE_FULL;
            else
                return bad("--recompute must be none, selective or full, got", v);
        }
        if (!ok) {
            char msg[96];
            snprintf(msg, sizeof msg, "bad value for %s:", f);
            return bad(msg, v);
        }
        if (!strcmp(f, "--layers") || !strcmp(f, "--dim") || !strcmp(f, "--heads") ||
            !strcmp(f, "--kv-heads") || !strcmp(f, "--ffn") || !strcmp(f, "--vocab"))
            o->modified = 1;
        i++;
    }
    return -1;
}

/* The preset, then the explicit flags over it; zero fields are left for the library's defaults. */
static void build_configs(const options *o, us_model_config *mc, us_train_config *tc) {
    const preset *p = find_preset(o->model);
    memset(mc, 0, sizeof *mc);
    memset(tc, 0, sizeof *tc);
    mc->dim = o->dim >= 0 ? o->dim : p->dim;
    mc->ffn_dim = o->ffn >= 0 ? o->ffn : p->ffn;
    mc->vocab = o->vocab >= 0 ? o->vocab : p->vocab;
    mc->n_layers = (int)(o->layers >= 0 ? o->layers : p->layers);
    mc->n_heads = (int)(o->heads >= 0 ? o->heads : p->heads);
    mc->n_kv_heads = (int)(o->kv_heads >= 0 ? o->kv_heads : p->kv_heads);
    mc->tie_embeddings = (int)(o->tied >= 0 ? o->tied : p->tied);
    mc->moe_experts = (int)(o->experts >= 0 ? o->experts : p->experts);
    if (mc->moe_experts) { /* zero fields: the library's defaults */
        mc->moe_top_k = (int)(o->top_k >= 0 ? o->top_k : p->top_k);
        mc->moe_ffn_dim = o->moe_ffn >= 0 ? o->moe_ffn : p->experts ? p->ffn : 0;
        mc->moe_shared = o->shared > 0;
        mc->moe_capacity = o->capacity;
    }
    tc->precision = o->precision;
    tc->recompute = o->recompute;
    tc->batch = (int)o->batch;
    tc->seq = (int)o->seq;
    tc->dp = (int)o->dp;
    tc->zero = (int)o->zero;
    tc->tp = (int)o->tp;
    tc->sp = (int)o->sp;
    tc->ep = (int)o->ep;
}

/* ------------------------------------------------------------------------------------ */
/* estimation */

/* The library counts in int64/size_t; a few flags at their maxima multiply past 2^63. Bound
   every product in double first so that no estimate silently wraps. Configs are validated. */
static int too_large(const us_model_config *mc, const us_train_config *tc) {
    double C = (double)mc->dim, HS = C / mc->n_heads, F = (double)mc->ffn_dim,
           V = (double)mc->vocab;
    double QKV = (mc->n_heads + 2.0 * mc->n_kv_heads) * HS, N = (double)tc->batch * tc->seq;
    double per_layer = 2 * C + QKV * C + C * C + 3 * C * F +
                       (double)mc->moe_experts * (C + 3 * C * (double)mc->moe_ffn_dim);
    double params = 2 * V * C + mc->n_layers * per_layer + C;
    double acts = 4.0 * N * ((mc->n_layers + 4.0) * (6 * C + QKV + 3 * F + mc->n_heads + 8) + V);
    return 18 * params + acts > 4e18;
}

/* Validates, guards against overflow and estimates; on failure prints why and returns 0. */
static int estimate(us_model_config *mc, us_train_config *tc, us_memory *mem) {
    char err[256];
    if (us_config_validate(mc, tc, err, sizeof err) != US_OK) {
        fprintf(stderr, "memory: %s\n", err);
        return 0;
    }
    if (too_large(mc, tc)) {
        fprintf(stderr, "memory: this configuration needs more than 4 EB; refusing to estimate "
                        "past 64-bit sizes\n");
        return 0;
    }
    if (us_memory_estimate(mc, tc, mem, err, sizeof err) != US_OK) {
        fprintf(stderr, "memory: %s\n", err);
        return 0;
    }
    return 1;
}

/* Activations one more layer adds: the difference of two estimates isolates what each layer
   keeps from the shared scratch, head and backward buffers, through the public API only. */
static size_t kept_per_layer(const us_model_config *mc, const us_train_config *tc) {
    us_model_config more = *mc;
    us_memory a, b;
    more.n_layers++;
    if (us_memory_estimate(mc, tc, &a, NULL, 0) != US_OK ||
        us_memory_estimate(&more, tc, &b, NULL, 0) != US_OK)
        return 0;
    return b.activations - a.activations;
}

/* ------------------------------------------------------------------------------------ */
/* the table */

/* 8030261248 -> "8,030,261,248" */
static const char *commas(uint64_t v, char *buf, size_t len) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v), i, j = 0;
    for (i = 0; i < n && (size_t)j + 2 < len; i++) {
        if (i && (n - i) % 3 == 0) buf[j++] = ',';
        buf[j++] = tmp[i];
    }
    buf[j] = '\0';
    return buf;
}

/* "8.03 B", "1.24 M": parameter counts the way model names write them */
static void short_count(int64_t n, char *buf, size_t len) {
    double v = (double)n;
    if (v >= 1e9)
        snprintf(buf, len, "%.2f B", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, len, "%.2f M", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, len, "%.2f K", v / 1e3);
    else
        snprintf(buf, len, "%lld", (long long)n);
}

/* "14.96 GiB", "545.5 MiB", "12.0 KiB": whichever unit keeps the number readable */
static void human_bytes(double b, char *buf, size_t len) {
    if (b >= GIB)
        snprintf(buf, len, "%.2f GiB", b / GIB);
    else if (b >= 1048576.0)
        snprintf(buf, len, "%.1f MiB", b / 1048576.0);
    else
        snprintf(buf, len, "%.1f KiB", b / 1024.0);
}

static const char *model_label(const options *o) {
    static char buf[64];
    if (!o->modified) return o->model;
    if (!strcmp(o->model, "tiny")) return "custom";
    snprintf(buf, sizeof buf, "%s, modified", o->model);
    return buf;
}

static void describe_model(const us_model_config *mc, char *buf, size_t len) {
    snprintf(buf, len, "L=%d C=%lld NH=%d NKV=%d F=%lld V=%lld, %s", mc->n_layers,
             (long long)mc->dim, mc->n_heads, mc->n_kv_heads, (long long)mc->ffn_dim,
             (long long)mc->vocab, mc->tie_embeddings ? "tied" : "untied");
}

/* GiB to 2 decimals, or 4 when the whole total is under 1 GiB (a tiny model would read 0.00) */
static void print_row(const char *name, size_t bytes, size_t total) {
    char b[32];
    printf("  %-34s %22s %10.*f %6.1f%%\n", name, commas(bytes, b, sizeof b),
           (double)total < GIB ? 4 : 2, (double)bytes / GIB,
           total ? 100.0 * (double)bytes / (double)total : 0.0);
}

static void print_table(const options *o, const us_model_config *mc, const us_train_config *tc,
                        const us_memory *m) {
    int bf16 = tc->precision != US_PRECISION_FP32;
    char buf[160], cnt[32];
    int64_t P = us_param_count(mc);
    describe_model(mc, buf, sizeof buf);
    printf("memory: %s (%s)\n", model_label(o), buf);
    printf("        precision %s, recompute %s, batch %d x seq %d, per rank of dp %d (ZeRO-%d) x "
           "tp %d%s%s\n\n",
           us_precision_name(tc->precision), us_recompute_name(tc->recompute), tc->batch, tc->seq,
           tc->dp, tc->zero, tc->tp, tc->sp ? " + sp" : "",
           tc->ep > 1 ? " (experts over ep ranks)" : "");
    short_count(P, buf, sizeof buf);
    printf("  %-34s %22s  (%s)\n%s", "parameters", commas((uint64_t)P, cnt, sizeof cnt), buf,
           mc->moe_experts ? "" : "\n");
    if (mc->moe_experts) { /* a token runs K experts; memory holds all E (and their grads, master, moments) */
        us_model_config dense =
            *mc; /* the same model with dense MLPs: what is not the MoE feed-forward */
        int64_t A = us_param_count_active(mc), moe;
        dense.moe_experts = 0;
        dense.moe_top_k = 0;
        dense.moe_ffn_dim = 0;
        dense.moe_shared = 0;
        dense.moe_capacity = 0;
        dense.moe_gate = US_MOE_GATE_DEFAULT;
        dense.moe_balance = US_MOE_BALANCE_DEFAULT;
        dense.moe_bias_rate = 0;
        dense.moe_aux_coef = 0;
        dense.moe_groups = 0;
        dense.moe_top_groups = 0;
        dense.moe_every = 0;
        dense.moe_first_dense = 0;
        moe = P - (us_param_count(&dense) - (int64_t)mc->n_layers * 3 * mc->dim * mc->ffn_dim);
        short_count(A, buf, sizeof buf);
        printf("  %-34s %22s  (%s; FLOPs and MFU count these)\n", "active per token",
               commas((uint64_t)A, cnt, sizeof cnt), buf);
        short_count(moe, buf, sizeof buf);
        printf("  %-34s %22s  (%s: %d experts of F=%lld%s + router, x %d layers, top-%d)\n\n",
               "MoE feed-forward, all experts", commas((uint64_t)moe, cnt, sizeof cnt), buf,
               mc->moe_experts, (long long)mc->moe_ffn_dim, mc->moe_shared ? " + shared" : "",
               mc->n_layers, mc->moe_top_k);
    }
    printf("  %-34s %22s %10s %7s\n", "category", "bytes", "GiB", "share");
    print_row(!bf16                                ? "params (fp32)"
              : tc->precision == US_PRECISION_FP16 ? "params (fp16)"
                                                   : "params (bf16)",
              m->params, m->total);
    print_row("grads (fp32)", m->grads, m->total);
    print_row(bf16 ? "master weights (fp32)" : "master weights (params are master)", m->master,
              m->total);
    print_row("optimizer (AdamW m, v; fp32)", m->optimizer, m->total);
    print_row("activations (+ logits, scratch)", m->activations, m->total);
    print_row("total", m->total, m->total);
}

/* Ours against the Playbook's s·b·h·(34 + 5·a·s/h), whose 5·a·s/h part is the attention
   scores and softmax the Playbook's model materialises and flash attention never stores. */
static void print_comparison(const us_model_config *mc, const us_train_config *tc) {
    double s = tc->seq, b = tc->batch, h = (double)mc->dim;
    double pb = us_playbook_activation_bytes_per_layer(tc->seq, tc->batch, mc->dim, mc->n_heads);
    double linear = 34.0 * s * b * h, scores = pb - linear;
    char ours[32], all[32], lin[32], sc[32];
    human_bytes((double)kept_per_layer(mc, tc), ours, sizeof ours);
    human_bytes(pb, all, sizeof all);
    human_bytes(linear, lin, sizeof lin);
    human_bytes(scores, sc, sizeof sc);
    printf("\nactivations kept per layer, batch %d x seq %d:\n", tc->batch, tc->seq);
    printf("  ours      %10s  flash attention, no s^2 term stored (recompute %s)\n", ours,
           us_recompute_name(tc->recompute));
    printf("  Playbook  %10s  s*b*h*(34 + 5*a*s/h), attention scores materialised\n", all);
    printf("            = %s linear (34*s*b*h) + %s scores (5*a*s^2*b)\n", lin, sc);
    printf(
        "  (the Playbook counts 16-bit activations, no recompute, MHA and a 4h MLP; ours is this\n"
        "   library's exact layout: GQA q/k/v, SwiGLU gate|up and h, fp32 norm and softmax "
        "stats%s)\n",
        tc->precision == US_PRECISION_FP32 ? ", here in fp32" : "");
}

/* ------------------------------------------------------------------------------------ */
/* the chart: stacked bars of memory by category over sequence length, hand-written SVG */

enum { SVG_W = 880, SVG_H = 500, PLOT_X = 90, PLOT_Y = 80, PLOT_W = 560, PLOT_H = 350 };

typedef struct category {
    const char *label, *color;
} category;

static const category categories[5] = {
    /* bottom to top of each bar */
    {"parameters", "#4c72b0"}, {"gradients", "#dd8452"},   {"master weights", "#55a868"},
    {"optimizer", "#8172b3"},  {"activations", "#c44e52"},
};

static void mem_parts(const us_memory *m, double gib[5]) {
    gib[0] = (double)m->params / GIB;
    gib[1] = (double)m->grads / GIB;
    gib[2] = (double)m->master / GIB;
    gib[3] = (double)m->optimizer / GIB;
    gib[4] = (double)m->activations / GIB;
}

/* a 1, 2 or 5 times a power of ten, so that about five ticks span max */
static double nice_step(double max) {
    double raw = max > 0 ? max / 5 : 1, p = 1;
    while (p * 10 <= raw) p *= 10;
    while (p > raw) p /= 10;
    return raw / p > 5 ? 10 * p : raw / p > 2 ? 5 * p : raw / p > 1 ? 2 * p : p;
}

/* enough decimals to tell ticks step apart */
static int decimals_for(double step) {
    int d = 0;
    while (step < 0.999 && d < 6) {
        step *= 10;
        d++;
    }
    return d;
}

static void svg_axes(FILE *f, double top, double step) {
    int d = decimals_for(step), i, n = (int)(top / step + 0.5);
    for (i = 0; i <= n; i++) {
        double y = PLOT_Y + PLOT_H - PLOT_H * (i * step) / top;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\"/>\n", PLOT_X, y,
                PLOT_X + PLOT_W, y, i ? "#e6e6e6" : "#444");
        fprintf(f,
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\" "
                "fill=\"#444\">%.*f</text>\n",
                PLOT_X - 8, y + 4, d, i * step);
    }
    fprintf(f,
            "<text transform=\"translate(%d,%d) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\" fill=\"#222\">"
            "memory (GiB)</text>\n",
            PLOT_X - 55, PLOT_Y + PLOT_H / 2);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" "
            "fill=\"#222\">sequence length (tokens)</text>\n",
            PLOT_X + PLOT_W / 2, PLOT_Y + PLOT_H + 45);
}

static void svg_bar(FILE *f, double cx, double bw, double top, const double gib[5], int64_t seq) {
    double y = PLOT_Y + PLOT_H, total = 0;
    int k;
    for (k = 0; k < 5; k++) {
        double hgt = PLOT_H * gib[k] / top;
        total += gib[k];
        if (gib[k] <= 0) continue;
        y -= hgt;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.2f\" width=\"%.1f\" height=\"%.2f\" fill=\"%s\">"
                "<title>%s: %.3f GiB</title></rect>\n",
                cx - bw / 2, y, bw, hgt, categories[k].color, categories[k].label, gib[k]);
    }
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\" "
            "font-weight=\"bold\" fill=\"#222\">%.*f</text>\n",
            cx, y - 6,
            total >= 10    ? 1
            : total >= 0.1 ? 2
                           : 4,
            total);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" "
            "fill=\"#444\">%lld</text>\n",
            cx, PLOT_Y + PLOT_H + 20, (long long)seq);
}

static void svg_legend(FILE *f, us_precision p) {
    int bf16 = p != US_PRECISION_FP32;
    static const char *notes[5] = {NULL, "fp32", NULL, "AdamW m, v; fp32", "flash attention"};
    int k, x = PLOT_X + PLOT_W + 30, y = PLOT_Y + 10;
    for (k = 4; k >= 0; k--, y += 44) { /* top to bottom, as the bars stack */
        const char *note = k == 0   ? (!bf16                    ? "fp32"
                                       : p == US_PRECISION_FP16 ? "fp16"
                                                                : "bf16")
                           : k == 2 ? (bf16 ? "fp32 copy" : "none under fp32")
                                    : notes[k];
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", x, y,
                categories[k].color);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"13\" fill=\"#222\">%s</text>\n", x + 22,
                y + 12, categories[k].label);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#777\">%s</text>\n", x + 22,
                y + 28, note);
    }
}

/* Returns 1 on success; on failure prints why. mems[i] is the estimate at seqs[i]. */
static int write_svg(const char *path, const options *o, const us_model_config *mc,
                     const us_train_config *tc, const us_memory *mems, const int64_t *seqs, int n) {
    FILE *f = fopen(path, "w");
    double max = 0, step, top, slot = (double)PLOT_W / n;
    char desc[160], cnt[32];
    int i, ok;
    if (!f) {
        fprintf(stderr, "memory: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    for (i = 0; i < n; i++)
        if ((double)mems[i].total / GIB > max) max = (double)mems[i].total / GIB;
    step = nice_step(max * 1.08); /* headroom for the total printed above the tallest bar */
    top = step * (double)(int64_t)(max * 1.08 / step + 0.999999);
    if (top <= 0) top = step;
    describe_model(mc, desc, sizeof desc);
    short_count(us_param_count(mc), cnt, sizeof cnt);
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d "
            "%d\" "
            "font-family=\"Helvetica, Arial, sans-serif\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f,
            "<text x=\"%d\" y=\"32\" font-size=\"18\" font-weight=\"bold\" fill=\"#111\">"
            "Training memory of %s: %s, recompute %s, batch %d</text>\n",
            PLOT_X - 60, model_label(o), us_precision_name(tc->precision),
            us_recompute_name(tc->recompute), tc->batch);
    fprintf(
        f,
        "<text x=\"%d\" y=\"54\" font-size=\"12\" fill=\"#555\">%s params (%s); one rank, AdamW, "
        "no parallelism</text>\n",
        PLOT_X - 60, cnt, desc);
    svg_axes(f, top, step);
    for (i = 0; i < n; i++) {
        double gib[5];
        mem_parts(&mems[i], gib);
        svg_bar(f, PLOT_X + slot * (i + 0.5), slot * 0.62, top, gib, seqs[i]);
    }
    svg_legend(f, tc->precision);
    fprintf(f, "</svg>\n");
    ok = !ferror(f);
    if (fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "memory: error writing %s\n", path);
    return ok;
}

/* Estimates every chart sequence length (same model, precision, recompute, batch), then draws. */
static int chart(const options *o, const us_model_config *mc, const us_train_config *tc) {
    us_memory mems[MAX_SEQS];
    int i;
    for (i = 0; i < o->n_seqs; i++) {
        us_model_config m = *mc;
        us_train_config t = *tc;
        t.seq = (int)o->seqs[i];
        if (!estimate(&m, &t, &mems[i])) return 2;
    }
    if (!write_svg(o->svg, o, mc, tc, mems, o->seqs, o->n_seqs)) return 1;
    printf("\nwrote %s (memory by category over seq %lld..%lld)\n", o->svg, (long long)o->seqs[0],
           (long long)o->seqs[o->n_seqs - 1]);
    return 0;
}

/* --measure: two training steps of the configuration on this CPU, one rank, random tokens;
   then the estimate, the allocator's peak (us_ops.bytes_peak) and the process's peak resident
   set (us_peak_rss_bytes) side by side. The estimate equals the allocator's count by
   construction (tests/test_model.c checks it); the resident set is what the machine gave. */
static int measure(const us_model_config *mc, const us_train_config *tc, const us_memory *mem) {
    const double mib = 1048576.0;
#ifdef _SC_PHYS_PAGES
    const double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
#else
    const double ram = 0; /* unknown: no check */
#endif
    us_train_config t = *tc;
    us_model m;
    us_step_stats st;
    us_rng rng;
    int64_t n = (int64_t)t.batch * t.seq, i;
    int32_t *in, *tgt;
    if (t.dp > 1 || t.tp > 1 || t.ep > 1 || t.pp > 1 || t.cp > 1) {
        fprintf(stderr, "memory: --measure runs one rank on this CPU: drop --dp, --tp and --ep\n");
        return 2;
    }
    if (ram > 0 && (double)mem->total > 0.5 * ram) {
        fprintf(stderr,
                "memory: --measure would need %.1f GiB, more than half of this machine's "
                "%.1f GiB\n",
                (double)mem->total / GIB, ram / GIB);
        return 2;
    }
    t.steps = 2;
    in = (int32_t *)malloc((size_t)n * sizeof *in);
    tgt = (int32_t *)malloc((size_t)n * sizeof *tgt);
    if (!in || !tgt || us_model_init(&m, mc, &t, NULL) != US_OK) {
        fprintf(stderr, "memory: --measure: %s\n",
                in && tgt ? us_model_error(&m) : "out of memory");
        free(in);
        free(tgt);
        return 1;
    }
    us_rng_seed(&rng, 1);
    for (i = 0; i < n; i++) { /* tokens in [0, vocab) */
        in[i] = (int32_t)(us_rng_u64(&rng) % (uint64_t)mc->vocab);
        tgt[i] = (int32_t)(us_rng_u64(&rng) % (uint64_t)mc->vocab);
    }
    for (i = 0; i < t.steps; i++)
        if (us_train_step(&m, in, tgt, &st) != US_OK) {
            fprintf(stderr, "memory: --measure: %s\n", us_model_error(&m));
            break;
        }
    printf("\nmeasured on this CPU (one rank, %d steps of random tokens):\n", t.steps);
    printf("  estimate            %10.1f MiB\n", (double)mem->total / mib);
    printf("  allocator peak      %10.1f MiB  (what the library allocated through its ops)\n",
           (double)m.ops.bytes_peak / mib);
    printf("  process peak RSS    %10.1f MiB  (the program, stacks, heap overhead, these buffers "
           "too)\n",
           (double)us_peak_rss_bytes() / mib);
    us_model_free(&m);
    free(in);
    free(tgt);
    return i == t.steps ? 0 : 1;
}

int main(int argc, char **argv) {
    options o;
    us_model_config mc;
    us_train_config tc;
    us_memory mem;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    build_configs(&o, &mc, &tc);
    if (!estimate(&mc, &tc, &mem)) return 2;
    print_table(&o, &mc, &tc, &mem);
    print_comparison(&mc, &tc);
    if (o.svg && (rc = chart(&o, &mc, &tc)) != 0) return rc;
    return o.measure ? measure(&mc, &tc, &mem) : 0;
}
