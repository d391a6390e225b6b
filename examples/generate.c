/* generate.c — text from a checkpoint, with a KV cache (// >>sample in ultrascale.h).
       build/generate DIR [--tokenizer tokenizer.json] [--prompt TEXT] [options]
   DIR is a checkpoint directory, ours (build/train --save; a run directory means its newest
   step_N) or a Hugging Face Llama one (config.json + model.safetensors or shards). The prompt
   is encoded with the tokenizer (default DIR/tokenizer.json, else bytes: the byte-level model
   of build/train), run once (the prefill), then each new token is one forward of one position
   over the cache. The text is printed as it comes; the speeds of both phases go to stderr.
   Built by nvcc with -DUS_CUDA (make build/generate_cuda) the model runs on GPU 0. */
#define ULTRASCALE_IMPLEMENTATION
#ifdef US_CUDA
#include "../ultrascale_cuda.cuh"
#else
#include "../ultrascale.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *usage =
    "usage: generate DIR [options]\n"
    "  DIR               checkpoint: ours (a run directory means its newest step_N) or a Hugging\n"
    "                    Face Llama directory (config.json, model.safetensors or shards)\n"
    "  --tokenizer FILE  tokenizer.json (default DIR/tokenizer.json if there, else bytes)\n"
    "  --prompt TEXT     the text to continue (default \"Once upon a time\")\n"
    "  --n N             new tokens (default 64)\n"
    "  --temperature X   0 = greedy (default 0.8)\n"
    "  --top-k K         sample from the K most likely tokens, 0 = all (default 0)\n"
    "  --top-p P         sample from the most likely tokens whose probabilities reach P\n"
    "                    (nucleus), 0 or 1 = all (default 0.95)\n"
    "  --seed S          random seed (default 1)\n"
    "  --max-len N       positions the cache may hold (default: config.json's\n"
    "                    max_position_embeddings, else prompt + n)\n"
    "  --seq N           the most prompt tokens one forward runs (default 512)\n"
    "  --precision P     fp32 | bf16 (default fp32 on the CPU, bf16 on the GPU)\n"
    "  --threads N       CPU threads (default all)\n"
    "  --stop ID         stop after this token (e.g. the end-of-text id; default none)\n"
    "  --no-cache        re-run the whole sequence for every token (us_sample's way; for\n"
    "                    comparison: the same text, slower)\n"
    "  --ids             print token ids (prompt, then the new ones) instead of text\n";

typedef struct opts {
    const char *dir, *tok_path, *prompt, *precision;
    int n, top_k, max_len, seq, threads, stop, no_cache, ids;
    float temperature, top_p;
    unsigned long long seed;
} opts;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* an integer flag's value, or -1 with a message (every integer option is ≥ 0) */
static long int_arg(const char *flag, const char *v) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < 0) {
        fprintf(stderr, "generate: %s needs a whole number >= 0, not \"%s\"\n", flag, v);
        return -1;
    }
    return x;
}

static int parse(int argc, char **argv, opts *o) {
    int i;
    memset(o, 0, sizeof *o);
    o->prompt = "Once upon a time";
    o->n = 64;
    o->temperature = 0.8f;
    o->top_p = 0.95f;
    o->seed = 1;
    o->seq = 512;
    o->stop = -1;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        if (!strcmp(f, "--no-cache") || !strcmp(f, "--ids")) {
            *(!strcmp(f, "--ids") ? &o->ids : &o->no_cache) = 1;
            continue;
        }
        if (f[0] != '-') {
            if (o->dir) {
                fprintf(stderr, "generate: one checkpoint directory, not \"%s\" too\n", f);
                return 2;
            }
            o->dir = f;
            continue;
        }
        if (!v) {
            fprintf(stderr, "generate: %s needs a value (--help lists the options)\n", f);
            return 2;
        }
        i++;
        if (!strcmp(f, "--tokenizer"))
            o->tok_path = v;
        else if (!strcmp(f, "--prompt"))
            o->prompt = v;
        else if (!strcmp(f, "--precision"))
            o->precision = v;
        else if (!strcmp(f, "--temperature"))
            o->temperature = (float)atof(v);
        else if (!strcmp(f, "--top-p"))
            o->top_p = (float)atof(v);
        else if (!strcmp(f, "--n") || !strcmp(f, "--top-k") || !strcmp(f, "--seed") ||
                 !strcmp(f, "--max-len") || !strcmp(f, "--seq") || !strcmp(f, "--threads") ||
                 !strcmp(f, "--stop")) {
            if ((x = int_arg(f, v)) < 0) return 2;
            if (!strcmp(f, "--n")) o->n = (int)x;
            if (!strcmp(f, "--top-k")) o->top_k = (int)x;
            if (!strcmp(f, "--seed")) o->seed = (unsigned long long)x;
            if (!strcmp(f, "--max-len")) o->max_len = (int)x;
            if (!strcmp(f, "--seq")) o->seq = (int)x;
            if (!strcmp(f, "--threads")) o->threads = (int)x;
            if (!strcmp(f, "--stop")) o->stop = (int)x;
        } else {
            fprintf(stderr, "generate: unknown option %s (--help lists the options)\n", f);
            return 2;
        }
    }
    if (!o->dir) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    return 0;
}

/* config.json's max_position_embeddings (the model's context), or 0 */
static int context_of(const char *dir) {
    char path[4200], buf[65536];
    const char *k;
    size_t n;
    FILE *f;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!(f = fopen(path, "rb"))) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (!(k = strstr(buf, "\"max_position_embeddings\""))) return 0;
    k = strchr(k, ':');
    return k ? atoi(k + 1) : 0;
}

/* The prompt's tokens into *ids[*n]: with the tokenizer, or as bytes. */
static int encode(us_tokenizer *tok, int have_tok, const char *text, int32_t **ids, int *n) {
    size_t len = strlen(text), cap = 2 * len + 1, got = 0;
    *ids = (int32_t *)malloc(cap * 4);
    if (!*ids) return 1;
    if (!have_tok)
        got = us_byte_encode(text, *ids, cap);
    else if (us_tok_encode(tok, text, len, *ids, cap, &got) != US_OK) {
        fprintf(stderr, "generate: %s\n", tok->err);
        return 1;
    }
    *n = (int)got;
    return 0;
}

/* Prints the text of ids[0..n) past the *shown bytes already printed (a token may end inside a
   UTF-8 character, which the next one completes: the bytes print as they are). have_tok: 0
   bytes, 1 the tokenizer, 2 the ids themselves (--ids). */
static void print_new(us_tokenizer *tok, int have_tok, const int32_t *ids, int n, size_t *shown) {
    const int flags = US_TOK_SKIP_SPECIAL | US_TOK_SKIP_UNKNOWN;
    static int warned;
    size_t len = 0;
    char *text;
    if (have_tok == 2) { /* --ids: *shown counts the ids printed */
        for (; *shown < (size_t)n; (*shown)++) printf("%d ", ids[*shown]);
        fflush(stdout);
        return;
    }
    if (have_tok) { /* ids the tokenizer does not hold (a model vocabulary padded past it) */
        if (!warned &&
            us_tok_decode(tok, ids, (size_t)n, US_TOK_SKIP_SPECIAL, NULL, 0, &len) != US_OK)
            warned = fprintf(stderr,
                             "generate: %s (the model's vocabulary is larger): such ids "
                             "are left out of the text\n",
                             tok->err);
        us_tok_decode(tok, ids, (size_t)n, flags, NULL, 0, &len);
    } else {
        len = (size_t)n;
    }
    if (!(text = (char *)malloc(len + 1))) return;
    if (have_tok)
        us_tok_decode(tok, ids, (size_t)n, flags, text, len + 1, &len);
    else
        len = us_byte_decode(ids, (size_t)n, text, len + 1);
    if (len > *shown) fwrite(text + *shown, 1, len - *shown, stdout);
    fflush(stdout);
    *shown = len;
    free(text);
}

/* The model from dir's config.json and weights, on ops (NULL: the CPU). */
static int load_model(const opts *o, const char *dir, us_model *m, us_ops *ops, int max_len) {
    us_model_config mc;
    us_train_config tc;
    char err[256];
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    if (us_ckpt_read_config(dir, &mc, err, sizeof err) != US_OK) {
        fprintf(stderr, "generate: %s\n", err);
        return 1;
    }
    tc.batch = 1;
    tc.seq = o->seq < max_len && !o->no_cache ? o->seq : max_len; /* no cache: all at once */
    tc.threads = o->threads;
    tc.precision = ops ? US_PRECISION_BF16 : US_PRECISION_FP32;
    if (o->precision && !strcmp(o->precision, "fp32"))
        tc.precision = US_PRECISION_FP32;
    else if (o->precision && !strcmp(o->precision, "bf16"))
        tc.precision = US_PRECISION_BF16;
    else if (o->precision) {
        fprintf(stderr, "generate: --precision is fp32 or bf16, not \"%s\"\n", o->precision);
        return 2;
    }
    if (us_model_init(m, &mc, &tc, ops) != US_OK || us_ckpt_load(m, dir, 0, NULL) != US_OK) {
        fprintf(stderr, "generate: %s\n", us_model_error(m));
        us_model_free(m);
        return 1;
    }
    return 0;
}

static void print_speeds(int np, int k, double t0, double t1, double t2, const char *cache) {
    fprintf(stderr,
            "prefill: %d tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s "
            "(%.1f tokens/s); %s\n",
            np, t1 - t0, np / (t1 - t0 > 0 ? t1 - t0 : 1e-9), k, t2 - t1,
            k / (t2 - t1 > 0 ? t2 - t1 : 1e-9), cache);
}

/* --no-cache: each new token re-runs the whole sequence (the first run counts as the prefill) */
static int run_nocache(const opts *o, us_model *m, us_tokenizer *tok, int have_tok, int32_t *ids,
                       int np) {
    us_rng r;
    float *lg = (float *)malloc((size_t)m->cfg.vocab * 4);
    int32_t *tgt = (int32_t *)malloc((size_t)(np + o->n + 1) * 4);
    int k, rc = 1, i;
    size_t shown = 0;
    double t0, t1 = 0, t2;
    if (!lg || !tgt) {
        fprintf(stderr, "generate: out of memory\n");
        free(lg);
        free(tgt);
        return 1;
    }
    for (i = 0; i < np + o->n + 1; i++) tgt[i] = -1;
    us_rng_seed(&r, o->seed);
    print_new(tok, have_tok, ids, np, &shown);
    t0 = now_s();
    for (k = 0; k < o->n; k++) {
        if (us_forward_eval(m, ids, tgt, 1, np + k, NULL, NULL, lg) != US_OK ||
            us_sample_logits(lg, m->cfg.vocab, o->temperature, o->top_k, o->top_p, &r,
                             ids + np + k) != US_OK)
            goto out;
        if (k == 0) t1 = now_s();
        print_new(tok, have_tok, ids, np + k + 1, &shown);
        if (ids[np + k] == o->stop) {
            k++;
            break;
        }
    }
    t2 = now_s();
    printf("\n");
    if (k == 0) t1 = t2;
    print_speeds(np, k > 0 ? k - 1 : 0, t0, t1, t2, "no cache");
    rc = 0;
out:
    if (rc) fprintf(stderr, "generate: %s\n", us_model_error(m));
    free(lg);
    free(tgt);
    return rc;
}

/* Prefill, then one token a step; the text as it comes, the speeds at the end. */
static int run(const opts *o, us_model *m, us_tokenizer *tok, int have_tok, int32_t *ids, int np,
               int max_len) {
    us_gen g;
    us_rng r;
    float *lg = (float *)malloc((size_t)m->cfg.vocab * 4);
    int k = 0, rc = 1;
    size_t shown = 0;
    double t0, t1, t2;
    char what[96];
    if (!lg || us_gen_init(&g, m, 1, max_len) != US_OK) {
        fprintf(stderr, "generate: %s\n", lg ? us_model_error(m) : "out of memory");
        free(lg);
        return 1;
    }
    us_rng_seed(&r, o->seed);
    print_new(tok, have_tok, ids, np, &shown);
    t0 = now_s();
    if (us_gen_forward(&g, ids, np, lg) != US_OK) goto out;
    t1 = now_s();
    for (k = 0; k < o->n; k++) {
        if (us_sample_logits(lg, m->cfg.vocab, o->temperature, o->top_k, o->top_p, &r,
                             ids + np + k) != US_OK)
            goto out;
        print_new(tok, have_tok, ids, np + k + 1, &shown);
        if (ids[np + k] == o->stop) {
            k++;
            break;
        }
        if (k + 1 < o->n && us_gen_forward(&g, ids + np + k, 1, lg) != US_OK) goto out;
    }
    t2 = now_s();
    printf("\n");
    snprintf(what, sizeof what, "cache %.1f MiB for %d positions", (double)g.bytes / 1048576.0,
             max_len);
    print_speeds(np, k, t0, t1, t2, what);
    rc = 0;
out:
    if (rc) fprintf(stderr, "generate: %s\n", us_model_error(m));
    us_gen_free(&g);
    free(lg);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    us_model m;
    us_tokenizer tok;
    char dir[4096], err[256], path[4200];
    int32_t *prompt = NULL, *ids;
    int rc, np = 0, have_tok = 0, ctx, max_len;
    FILE *f;
    us_ops *opsp = NULL;
#ifdef US_CUDA
    us_ops ops;
#endif
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("%s", usage);
        return 0;
    }
    if ((rc = parse(argc, argv, &o)) != 0) return rc;
    /* a run directory (ours) holds step_N checkpoints: the newest; any other is itself */
    if (us_ckpt_latest(o.dir, dir, sizeof dir, err, sizeof err) != US_OK)
        snprintf(dir, sizeof dir, "%s", o.dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!o.tok_path && (f = fopen(path, "rb"))) {
        fclose(f);
        o.tok_path = path;
    }
    memset(&tok, 0, sizeof tok);
    if (o.tok_path && us_tok_load(&tok, o.tok_path) != US_OK) {
        fprintf(stderr, "generate: %s\n", tok.err);
        return 1;
    }
    have_tok = o.tok_path != NULL;
    if (encode(&tok, have_tok, o.prompt, &prompt, &np) != 0 || np < 1) {
        if (np < 1) fprintf(stderr, "generate: the prompt is empty: give --prompt some text\n");
        return 1;
    }
    ctx = context_of(dir);
    max_len = o.max_len ? o.max_len : ctx ? ctx : np + o.n;
    if (np + o.n > max_len) {
        fprintf(stderr,
                "generate: the prompt's %d tokens + --n %d exceed the model's context of %d "
                "positions\n",
                np, o.n, max_len);
        return 2;
    }
    if (!o.max_len) max_len = np + o.n; /* the cache need not hold more */
#ifdef US_CUDA
    if (us_cuda_ops(&ops, 0, err, sizeof err) != US_OK) {
        fprintf(stderr, "generate: %s\n", err);
        return 1;
    }
    opsp = &ops;
#endif
    if ((rc = load_model(&o, dir, &m, opsp, max_len)) != 0) return rc;
    ids = (int32_t *)malloc((size_t)(np + o.n + 1) * 4);
    if (!ids) return 1;
    memcpy(ids, prompt, (size_t)np * 4);
    if (o.ids) have_tok = 2; /* print ids, not text */
    rc = o.no_cache ? run_nocache(&o, &m, &tok, have_tok, ids, np)
                    : run(&o, &m, &tok, have_tok, ids, np, max_len);
    us_model_free(&m);
    if (o.tok_path) us_tok_free(&tok);
    free(prompt);
    free(ids);
    return rc;
}
