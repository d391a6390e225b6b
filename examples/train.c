/* train.c — the ultrascale trainer.

   Without --data it learns the built-in task (sorting digits, generated in code, no download):
       build/train                       # what `make train` runs
   With --data FILE it trains on raw text (byte tokens) or an llm.c token shard:
       build/train --data input.txt --steps 2000 --seq 256 --dim 256 --layers 6
   Every step prints one line; --log FILE.jsonl writes one JSON object per step with the keys
   step, loss, lr, grad_norm, tok_s, mfu, mem_bytes (+ eval_loss, eval_acc on eval steps).
   Compiled with nvcc and -DUS_CUDA (make train-cuda) it trains on the GPU by default. */
#ifndef __cplusplus
#define _POSIX_C_SOURCE 199309L
#endif
#define ULTRASCALE_IMPLEMENTATION
#ifdef US_CUDA   /* the same file, compiled by nvcc: make train-cuda */
#include "../ultrascale_cuda.cuh"
#else
#include "../ultrascale.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: train [flags]\n"
        "model:\n"
        "  --layers N        decoder layers (default 4; 2 for the built-in task)\n"
        "  --dim N           model width C (default 128; 64 for the built-in task)\n"
        "  --heads N         attention heads (default 4)\n"
        "  --kv-heads N      key/value heads, < heads for GQA (default = heads)\n"
        "  --ffn N           SwiGLU hidden size (default 8/3*dim rounded up to 32)\n"
        "  --vocab N         vocabulary size (default 256, the byte tokenizer)\n"
        "  --tied            tie lm_head to the token embedding\n"
        "  --rope-theta X    RoPE base (default 10000)\n"
        "training:\n"
        "  --seq N           tokens per sequence T (default 64; 71 = four problems for the task)\n"
        "  --batch N         sequences per micro-batch B (default 8; 16 for the task)\n"
        "  --grad-accum N    micro-batches per optimizer step (default 1)\n"
        "  --steps N         optimizer steps (default 1000; 1500 for the built-in task)\n"
        "  --lr X            peak learning rate (default 3e-3; 1e-2 for the task)\n"
        "  --warmup N        linear warmup steps (default 0; 20 for the task)\n"
        "  --schedule S      cosine | constant (default cosine)\n"
        "  --min-lr-frac X   cosine floor as a fraction of lr (default 0.1)\n"
        "  --wd X            AdamW weight decay on 2-D weights (default 0.1)\n"
        "  --clip X          global-norm gradient clip, 0 = off (default 1.0)\n"
        "  --precision P     fp32 | bf16 (default fp32)\n"
        "  --recompute R     none | selective | full (default none)\n"
        "  --seed N          seed for init and data (default 1337)\n"
        "  --threads N       CPU threads (default: all)\n"
        "  --device D        cpu | cuda (default: cuda in the CUDA build, else cpu)\n"
        "  --gpu N           CUDA device index (default 0)\n"
        "data and output:\n"
        "  --data FILE       raw text (byte tokens) or llm.c .bin shard; default: the built-in sorting task\n"
        "  --log FILE.jsonl  one JSON object per step\n"
        "  --eval-every N    evaluate every N steps, 0 = only at the end (default 100)\n"
        "  --sample N        after training, sample N tokens (default 0)\n"
        "  --temperature X   sampling temperature, 0 = greedy (default 0.8)\n"
        "  --top-k N         sample from the k most likely tokens, 0 = all (default 0)\n"
        "  --peak-tflops X   peak used for MFU (default: 989 on CUDA, the H100/H200 dense bf16 peak;\n"
        "                    0.096 per CPU thread, AVX2 FMA at 3 GHz)\n"
        "  --quiet           print only the summary\n"
        "  --help            this text\n");
}

static int bad(const char *msg, const char *arg) {
    fprintf(stderr, "train: %s%s%s\n", msg, arg ? " " : "", arg ? arg : "");
    usage(stderr);
    return 2;
}

/* strict number parsing: the whole argument must be a number in range */
static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}
static int parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return 0;
    *out = (float)v;
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    us_model_config mc;
    us_train_config tc;
    const char *data_path = NULL, *log_path = NULL;
    int eval_every = 100, sample_n = 0, top_k = 0, quiet = 0, i, vocab = 0, dim = 0, ffn = 0, gpu = 0;
#ifdef US_CUDA
    int use_cuda = 1;
    us_ops ops;
#else
    int use_cuda = 0;
#endif
    us_ops *opsp = NULL;
    char devname[160] = "cpu";
    float temperature = 0.8f, peak_tflops = 0, clip = 1.0f;
    us_data data;
    us_task task, eval_task;
    us_rng rng;
    us_model m;
    FILE *logf = NULL;
    int32_t *in = NULL, *tgt = NULL;
    char err[256];
    double t_start, flops_tok;
    int64_t per_step;
    us_result r;

    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    memset(&data, 0, sizeof data);
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1, takes = 1;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(f, "--tied")) { mc.tie_embeddings = 1; takes = 0; }
        else if (!strcmp(f, "--quiet")) { quiet = 1; takes = 0; }
        else if (strncmp(f, "--", 2)) return bad("unexpected argument", f);
        else if (!v) return bad("missing value for", f);
        else if (!strcmp(f, "--layers")) ok = parse_int(v, 1, 1 << 16, &mc.n_layers);
        else if (!strcmp(f, "--dim")) ok = parse_int(v, 2, 1 << 20, &dim);
        else if (!strcmp(f, "--heads")) ok = parse_int(v, 1, 1 << 16, &mc.n_heads);
        else if (!strcmp(f, "--kv-heads")) ok = parse_int(v, 1, 1 << 16, &mc.n_kv_heads);
        else if (!strcmp(f, "--ffn")) ok = parse_int(v, 1, 1 << 24, &ffn);
        else if (!strcmp(f, "--vocab")) ok = parse_int(v, 2, 1 << 30, &vocab);
        else if (!strcmp(f, "--rope-theta")) ok = parse_float(v, 1e-3f, 1e12f, &mc.rope_theta);
        else if (!strcmp(f, "--seq")) ok = parse_int(v, 1, 1 << 24, &tc.seq);
        else if (!strcmp(f, "--batch")) ok = parse_int(v, 1, 1 << 24, &tc.batch);
        else if (!strcmp(f, "--grad-accum")) ok = parse_int(v, 1, 1 << 20, &tc.grad_accum);
        else if (!strcmp(f, "--steps")) ok = parse_int(v, 1, 1 << 30, &tc.steps);
        else if (!strcmp(f, "--lr")) ok = parse_float(v, 1e-12f, 1e3f, &tc.lr);
        else if (!strcmp(f, "--warmup")) ok = parse_int(v, 0, 1 << 30, &tc.warmup);
        else if (!strcmp(f, "--min-lr-frac")) ok = parse_float(v, 0, 1, &tc.min_lr_frac);
        else if (!strcmp(f, "--wd")) { ok = parse_float(v, 0, 1e3f, &tc.weight_decay); if (ok && tc.weight_decay == 0) tc.weight_decay = -1; }
        else if (!strcmp(f, "--clip")) ok = parse_float(v, 0, 1e30f, &clip);
        else if (!strcmp(f, "--seed")) { int s; ok = parse_int(v, 1, 0x7fffffff, &s); tc.seed = (uint64_t)s; }
        else if (!strcmp(f, "--threads")) ok = parse_int(v, 1, 4096, &tc.threads);
        else if (!strcmp(f, "--gpu")) ok = parse_int(v, 0, 1023, &gpu);
        else if (!strcmp(f, "--device")) {
            if (!strcmp(v, "cpu")) use_cuda = 0;
            else if (!strcmp(v, "cuda")) {
#ifdef US_CUDA
                use_cuda = 1;
#else
                fprintf(stderr, "train: this build has no CUDA backend; build it with make train-cuda\n");
                return 2;
#endif
            } else return bad("--device must be cpu or cuda, got", v);
        }
        else if (!strcmp(f, "--data")) data_path = v;
        else if (!strcmp(f, "--log")) log_path = v;
        else if (!strcmp(f, "--eval-every")) ok = parse_int(v, 0, 1 << 30, &eval_every);
        else if (!strcmp(f, "--sample")) ok = parse_int(v, 0, 1 << 24, &sample_n);
        else if (!strcmp(f, "--temperature")) ok = parse_float(v, 0, 100, &temperature);
        else if (!strcmp(f, "--top-k")) ok = parse_int(v, 0, 1 << 30, &top_k);
        else if (!strcmp(f, "--peak-tflops")) ok = parse_float(v, 1e-6f, 1e9f, &peak_tflops);
        else if (!strcmp(f, "--schedule")) {
            if (!strcmp(v, "cosine")) tc.schedule = US_LR_COSINE;
            else if (!strcmp(v, "constant")) tc.schedule = US_LR_CONSTANT;
            else return bad("--schedule must be cosine or constant, got", v);
        } else if (!strcmp(f, "--precision")) {
            if (!strcmp(v, "fp32")) tc.precision = US_PRECISION_FP32;
            else if (!strcmp(v, "bf16")) tc.precision = US_PRECISION_BF16;
            else return bad("--precision must be fp32 or bf16, got", v);
        } else if (!strcmp(f, "--recompute")) {
            if (!strcmp(v, "none")) tc.recompute = US_RECOMPUTE_NONE;
            else if (!strcmp(v, "selective")) tc.recompute = US_RECOMPUTE_SELECTIVE;
            else if (!strcmp(v, "full")) tc.recompute = US_RECOMPUTE_FULL;
            else return bad("--recompute must be none, selective or full, got", v);
        } else return bad("unknown flag", f);
        if (!ok) {
            char msg[96];
            snprintf(msg, sizeof msg, "bad value for %s:", f);
            return bad(msg, v);
        }
        i += takes;
    }
    mc.vocab = vocab; mc.dim = dim; mc.ffn_dim = ffn;
    tc.grad_clip = clip > 0 ? clip : -1.0f;
    if (!data_path) {   /* the built-in task: a small model, sequences of whole problems */
        if (!tc.seq) tc.seq = 4 * US_TASK_LINE - 1;
        if (!tc.batch) tc.batch = 16;
        if (!tc.steps) tc.steps = 1500;
        if (!mc.n_layers) mc.n_layers = 2;
        if (!mc.dim) mc.dim = 64;
        if (tc.lr == 0) tc.lr = 1e-2f;
        if (!tc.warmup) tc.warmup = 20;
        if (tc.seq < US_TASK_LINE - 1) {
            fprintf(stderr, "train: the built-in task needs --seq of at least %d\n", US_TASK_LINE - 1);
            return 2;
        }
    }
    if (us_config_validate(&mc, &tc, err, sizeof err) != US_OK) {
        fprintf(stderr, "train: %s\n", err);
        return 2;
    }
    if (data_path) {
        if (us_data_load(&data, data_path) != US_OK) { fprintf(stderr, "train: %s\n", data.err); return 1; }
        if (data.max_token >= mc.vocab) {
            fprintf(stderr, "train: %s contains token %lld but the vocabulary is %lld (set --vocab)\n", data_path,
                    (long long)data.max_token, (long long)mc.vocab);
            us_data_free(&data);
            return 2;
        }
        if (data.n < (int64_t)tc.seq + 1) {
            fprintf(stderr, "train: %s has %lld tokens, fewer than seq+1 = %d\n", data_path, (long long)data.n, tc.seq + 1);
            us_data_free(&data);
            return 2;
        }
    }
#ifdef US_CUDA
    if (use_cuda) {
        if (us_cuda_ops(&ops, gpu, err, sizeof err) != US_OK) { fprintf(stderr, "train: %s\n", err); us_data_free(&data); return 1; }
        us_cuda_describe(&ops, devname, sizeof devname);
        opsp = &ops;
    }
#endif
    (void)gpu;
    if ((r = us_model_init(&m, &mc, &tc, opsp)) != US_OK) {
        fprintf(stderr, "train: %s\n", us_model_error(&m));
        us_data_free(&data);
        return 1;
    }
    if (log_path && !(logf = fopen(log_path, "w"))) {
        fprintf(stderr, "train: cannot open log file %s\n", log_path);
        us_model_free(&m); us_data_free(&data);
        return 1;
    }
    if (peak_tflops == 0 && use_cuda) peak_tflops = 989.0f;
    if (peak_tflops == 0) {
        int th = tc.threads;
#ifdef _OPENMP
        if (!th) th = omp_get_max_threads();
#else
        th = 1;
#endif
        peak_tflops = 0.096f * (float)th;
    }
    per_step = (int64_t)tc.batch * tc.seq * tc.grad_accum;
    in = (int32_t *)malloc((size_t)per_step * 4);
    tgt = (int32_t *)malloc((size_t)per_step * 4);
    if (!in || !tgt) { fprintf(stderr, "train: out of memory\n"); return 1; }
    us_task_init(&task, tc.seed);
    us_task_init(&eval_task, tc.seed + 7777);   /* a different stream: problems not trained on */
    us_rng_seed(&rng, tc.seed);
    flops_tok = us_flops_per_token(&m.cfg, tc.seq);
    if (!quiet)
        printf("model: %lld params (L=%d C=%lld NH=%d NKV=%d F=%lld V=%lld%s) | %s | recompute %s | B=%d T=%d accum=%d | %s | %s | memory %.2f MiB\n",
               (long long)m.n_params, m.cfg.n_layers, (long long)m.cfg.dim, m.cfg.n_heads, m.cfg.n_kv_heads,
               (long long)m.cfg.ffn_dim, (long long)m.cfg.vocab, m.cfg.tie_embeddings ? " tied" : "",
               us_precision_name(m.tc.precision), us_recompute_name(m.tc.recompute), tc.batch, tc.seq, tc.grad_accum,
               data_path ? data_path : "task: sort 8 digits", devname, (double)m.mem.total / 1048576.0);
    t_start = now_s();
    for (i = 0; i < tc.steps; i++) {
        us_step_stats st;
        double t0 = now_s(), dt, tok_s, mfu, eval_loss = -1, eval_acc = -1;
        if (data_path) us_data_batch(&data, &rng, tc.batch * tc.grad_accum, tc.seq, in, tgt);
        else us_task_batch(&task, tc.batch * tc.grad_accum, tc.seq, in, tgt);
        if ((r = us_train_step(&m, in, tgt, &st)) != US_OK) {
            fprintf(stderr, "train: step %d: %s\n", i + 1, us_model_error(&m));
            break;
        }
        dt = now_s() - t0;
        tok_s = (double)st.tokens / dt;
        mfu = flops_tok * tok_s / (peak_tflops * 1e12);
        if ((eval_every && st.step % eval_every == 0) || st.step == tc.steps) {
            /* held-out loss and next-token accuracy on the scored targets */
            double ls = 0, valid = 0;
            int64_t correct = 0, c, k;
            if (data_path) us_data_batch(&data, &rng, tc.batch, tc.seq, in, tgt);
            else us_task_batch(&eval_task, tc.batch, tc.seq, in, tgt);
            for (k = 0; k < (int64_t)tc.batch * tc.seq; k++) valid += tgt[k] >= 0;
            if (us_forward_eval(&m, in, tgt, tc.batch, tc.seq, &ls, &c, NULL) == US_OK && valid > 0) {
                eval_loss = ls / valid;
                correct = c;
                eval_acc = (double)correct / valid;
            }
        }
        if (!quiet) {
            printf("step %5d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU %.1f%% | mem %.2f MiB",
                   st.step, st.loss, st.lr, st.grad_norm, tok_s, 100 * mfu, (double)m.ops.bytes_peak / 1048576.0);
            if (eval_loss >= 0) printf(" | eval loss %.4f acc %.3f", eval_loss, eval_acc);
            printf("\n");
        }
        if (logf) {
            fprintf(logf, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"tok_s\": %.1f, \"mfu\": %.6f, \"mem_bytes\": %zu, \"time_s\": %.3f",
                    st.step, st.loss, st.lr, st.grad_norm, tok_s, mfu, m.ops.bytes_peak, now_s() - t_start);
            if (eval_loss >= 0) fprintf(logf, ", \"eval_loss\": %.6f, \"eval_acc\": %.6f", eval_loss, eval_acc);
            fprintf(logf, "}\n");
            fflush(logf);
        }
    }
    printf("trained %d steps in %.1f s\n", m.step, now_s() - t_start);
    if (r == US_OK && !data_path) {
        char buf[2048];
        double acc = 0;
        if (us_task_exact_match(&m, &eval_task, 200, &acc, buf, sizeof buf, 5) == US_OK)
            printf("sorting exact match on 200 held-out problems: %.1f%%\n%s", 100 * acc, buf);
    }
    if (r == US_OK && sample_n > 0) {
        int32_t prompt[US_TASK_DIGITS + 1], *out;
        int np = 0, n_new;
        char *text;
        if (data_path) { np = tc.seq < 8 ? 1 : 8; memcpy(prompt, data.tokens, (size_t)np * 4); }
        else { np = (int)us_byte_encode("31415926=", prompt, US_TASK_DIGITS + 1); }
        n_new = sample_n < tc.seq - np ? sample_n : tc.seq - np;
        out = (int32_t *)malloc((size_t)(np + n_new) * 4);
        text = (char *)malloc((size_t)(np + n_new) + 1);
        if (out && text && us_sample(&m, prompt, np, n_new, temperature, top_k, &rng, out) == US_OK) {
            us_byte_decode(out, (size_t)(np + n_new), text, (size_t)(np + n_new) + 1);
            printf("sample (%d tokens, temperature %.2f%s):\n%s\n", n_new, temperature, n_new < sample_n ? ", capped at seq" : "", text);
        }
        free(out); free(text);
    }
    if (logf) fclose(logf);
    free(in); free(tgt);
    us_model_free(&m);
#ifdef US_CUDA
    if (opsp) us_cuda_ops_free(opsp);
#endif
    us_data_free(&data);
    return r == US_OK ? 0 : 1;
}
