/* train.c — the ultrascale trainer.

   Without --data it learns the built-in task (sorting digits, generated in code, no download):
       build/train                       # what `make train` runs
   With --data FILE it trains on raw text (byte tokens) or llm.c token shards (a list or a glob,
   mapped, each window of --seq + 1 read once per epoch in a shuffled order; names with "val"
   are the validation shards):
       build/train --data input.txt --steps 2000 --seq 256 --dim 256 --layers 6
       build/train --data 'fineweb10B/fineweb_*.bin' --vocab 50304 --seq 1024
   --tokenizer tokenizer.json (a byte-level BPE) encodes the text instead and decodes the samples:
       build/train --data input.txt --tokenizer tests/tok/gpt2.json --sample 64
   Every step prints one line; --log FILE.jsonl writes one JSON object per step with the keys
   step, loss, lr, grad_norm, tok_s, mfu, mem_bytes (+ eval_loss, eval_acc on eval steps; + moe_imbalance,
   moe_aux_loss, moe_drop_frac, moe_load with --experts; + loss_scale, skipped, skipped_total under loss
   scaling: --precision fp16, or --loss-scale S > 0).
   Compiled with nvcc and -DUS_CUDA (make train-cuda) it trains on the GPU by default.

   Data parallelism: --dp N runs N ranks — threads of this process on the CPU, one process per
   GPU with CUDA (--nproc N starts them, or torchrun / mpirun / srun do). --batch stays the
   micro-batch of the whole group: each rank takes batch/dp of its sequences, so the global
   batch (micro-batch × grad-accum × dp) and the loss curve are those of --dp 1. --zero 1|2|3
   shards optimizer state, gradients, weights; --trace FILE.json writes a Perfetto trace. */
#ifndef __cplusplus
#define _POSIX_C_SOURCE 200809L
#endif
#define ULTRASCALE_IMPLEMENTATION
#ifdef US_CUDA /* the same file, compiled by nvcc: make train-cuda */
#include "../ultrascale_cuda.cuh"
#else
#include "../ultrascale.h"
#endif
#include "../ultrascale_comm.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The usage text in parts (C99 compilers need only take 4095 characters in one string). */
static const char *const usage_text[] = {
    "usage: train [flags]\n"
    "model:\n"
    "  --layers N        decoder layers (default 4; 2 for the built-in task)\n"
    "  --dim N           model width C (default 128; 64 for the built-in task)\n"
    "  --heads N         attention heads (default 4)\n"
    "  --kv-heads N      key/value heads, < heads for GQA (default = heads)\n"
    "  --ffn N           SwiGLU hidden size (default 8/3*dim rounded up to 32)\n"
    "  --vocab N         vocabulary size (default 256, the byte tokenizer)\n"
    "  --tied            tie lm_head to the token embedding (with --pp the last stage holds "
    "a copy)\n"
    "  --rope-theta X    RoPE base (default 10000)\n",
    "mixture of experts (a MoE feed-forward layer instead of the dense MLP):\n"
    "  --experts E       routed experts per MoE layer (default 0: dense); MoE layers run under\n"
    "                    every parallelism: dp, ZeRO, tp, sp, cp, pp (every schedule) and ep\n"
    "  --top-k K         experts per token (default 2)\n"
    "  --moe-ffn N       each expert's SwiGLU hidden size (default ffn/(K + shared), rounded "
    "up to 8)\n"
    "  --shared-expert   add a shared expert every token passes through\n"
    "  --moe-gate G      softmax (default) | sigmoid (top-k renormalised, DeepSeek-V3)\n"
    "  --moe-balance B   bias (default: auxiliary-loss-free router bias) | aux (auxiliary "
    "loss) | none\n"
    "  --moe-bias-rate X the bias update rate (default 1e-3)\n"
    "  --moe-aux-coef X  the auxiliary loss coefficient (default 1e-2)\n"
    "  --capacity-factor X  an expert takes at most ceil(X*tokens*K/E) tokens; 0 = no dropping "
    "(default)\n"
    "  --moe-groups G    expert groups for group-limited routing (default 1)\n"
    "  --moe-top-groups M  groups a token may use (default all)\n"
    "  --moe-first-dense N  the first N layers stay dense (default 0)\n"
    "  --moe-every N     every N-th layer after those is MoE (default 1)\n"
    "  --moe-force-balance  benchmarks only: token n's k-th expert is (n*K+k) mod E, every expert\n"
    "                    equally loaded whatever the router says (Megatron's forced balance)\n"
    "                    The log gains moe_imbalance (max/mean tokens per expert), "
    "moe_aux_loss,\n"
    "                    moe_drop_frac and moe_load (tokens per expert, summed over MoE "
    "layers)\n"
    "training:\n"
    "  --seq N           tokens per sequence T (default 64; 71 = four problems for the task)\n"
    "  --batch N         sequences per micro-batch B (default 8; 16 for the task)\n"
    "  --grad-accum N    micro-batches per optimizer step (default 1)\n"
    "  --steps N         optimizer steps (default 1000)\n"
    "  --lr X            peak learning rate (default 3e-3; 1e-2 for the task)\n"
    "  --warmup N        linear warmup steps (default 0; 20 for the task)\n"
    "  --schedule S      cosine | constant (default cosine)\n"
    "  --min-lr-frac X   cosine floor as a fraction of lr (default 0.1)\n"
    "  --wd X            AdamW weight decay on 2-D weights (default 0.1)\n"
    "  --clip X          global-norm gradient clip, 0 = off (default 1.0)\n"
    "  --precision P     fp32 | bf16 | fp16 | fp8 | fp8-tensor (default fp32); fp16 scales the "
    "loss dynamically;\n"
    "                    fp8: bf16 plus FP8 E4M3 GEMMs in every linear layer (1x128 / 128x128 "
    "tile scales);\n"
    "                    fp8-tensor: one scale per tensor\n"
    "  --loss-scale S    static loss scale S > 0 (any precision), 0 = dynamic under fp16: "
    "starts at\n"
    "                    2^16, halves and skips the step on an inf/NaN gradient (default 0)\n"
    "  --loss-scale-window N  clean steps before a dynamic scale doubles (default 2000)\n"
    "  --loss-chunk N    the fused head: logits, loss and their gradients for N rows at a "
    "time,\n"
    "                    the logits never whole (default: chunks of at most 1 GiB of logits "
    "without\n"
    "                    --pp and below --zero 2; -1: the logits whole)\n"
    "  --fp8-pow2        FP8 scales rounded up to powers of two\n"
    "  --fp8-min-dim N   a linear runs in FP8 only when its In and Out are both >= N (default "
    "1536,\n"
    "                    where FP8 measured faster than bf16 on an H200; 16: every size)\n"
    "  --fp8-experts     the MoE experts' GEMMs in FP8 too, expert by expert (default: bf16, one\n"
    "                    grouped GEMM, which measured faster on an H200)\n"
    "  --fp8-no-weight-cache  quantise the weights at every FP8 GEMM; by default each linear's "
    "W and\n"
    "                    W^T are quantised once per optimizer step and kept (2 bytes per "
    "weight)\n"
    "  --recompute R     none | selective | full (default none)\n"
    "  --seed N          seed for init and data (default 1337)\n"
    "  --threads N       CPU threads (default: all)\n"
    "  --device D        cpu | cuda (default: cuda in the CUDA build, else cpu)\n"
    "  --gpu N           CUDA device index (default 0; the local rank under --nproc)\n",
    "  --gemm-tune       (cuda) the first 2 steps time cuBLASLt's candidate algorithms for each\n"
    "                    GEMM shape in place and keep the fastest (the heuristic's first is not\n"
    "                    always fastest at the power-capped clock); the choice can differ from "
    "run\n"
    "                    to run, and with it the last bits of the results, hence off by default\n"
    "  --gemm-tune-file F  (cuda) read those choices from F (no tuning; runs that read the same\n"
    "                    F take the same algorithms: their GEMMs give the same bits), or, where F "
    "does\n"
    "                    not exist, tune as --gemm-tune and save them to F; refused if F was\n"
    "                    written for another GPU or cuBLASLt (GPU processes: F.rankN past rank "
    "0)\n",
    "parallelism:\n"
    "  --dp N            data-parallel ranks (default 1): CPU threads, or GPU processes; each "
    "rank\n"
    "                    takes batch/dp sequences of every micro-batch (the global batch is "
    "kept)\n"
    "  --zero K          ZeRO stage 0 | 1 | 2 | 3 over dp (default 0)\n"
    "  --tp N            tensor-parallel ranks (default 1): heads, FFN and vocabulary split; "
    "the\n"
    "                    world is dp x tp ranks (tp innermost); with fewer kv heads than N, "
    "each\n"
    "                    kv head is held by N / kv-heads ranks (N a multiple of them)\n"
    "  --sp              sequence parallelism: norms and the residual stream split over tp by "
    "tokens\n"
    "  --tp-no-overlap   wait for every tp collective where it is issued (default: the "
    "backward's\n"
    "                    reductions travel under the weight-gradient GEMMs, SP's gathers "
    "under\n"
    "                    the GEMMs they feed)\n"
    "  --overlap-sms N   SMs a GEMM leaves to the tp collective travelling beside it (GPU;\n"
    "                    default 0: none)\n"
    "  --cp N            context-parallel ranks (default 1): every sequence split over N "
    "ranks\n"
    "  --ep N            expert-parallel ranks (default 1, needs --experts): each MoE layer's "
    "experts\n"
    "                    split over N of the dp x cp ranks, tokens sent to them by all-to-all; "
    "N\n"
    "                    must divide dp x cp and the experts (the world stays dp x pp x cp x "
    "tp)\n"
    "  --cp-mode M       ring (contiguous chunks) | zigzag (balanced chunks, default) | "
    "allgather\n"
    "  --pp N            pipeline stages (default 1): layers split over N ranks\n"
    "  --micro-batches M the micro-batches a pipeline schedule runs per step (= --grad-accum)\n"
    "  --pp-schedule S   afab | 1f1b (default) | interleaved (depth-first, Megatron) | "
    "interleaved-bf\n"
    "                    (breadth-first, Llama 3) | zb1 (zero bubble: B and W apart) | zbv "
    "(zero\n"
    "                    bubble, 2 chunks in a V) | dualpipev (DeepSeek's DualPipe cut in "
    "half) |\n"
    "                    dualpipe (DeepSeek's DualPipe: two pipelines fed from both ends, "
    "rank r\n"
    "                    holding stages r and pp-1-r, the weights twice; even pp, an even "
    "M >=\n"
    "                    2 x pp, half of the micro-batches entering at each end). The\n"
    "                    log gains pp_bubble (the measured idle share of the schedule) and\n"
    "                    pp_tf_ms, pp_tb_ms, pp_tw_ms (measured F, B, W per micro-batch and "
    "rank)\n",
    "  --pp-clock        time pipeline messages on the schedule's unit-cost clock (what NCCL "
    "uses)\n"
    "                    instead of sending them as they are ready on channels (CPU threads)\n"
    "  --pp-channels     pipeline messages on channels for every schedule, on NCCL too (NCCL's\n"
    "                    default: channels for afab, 1f1b, zb1, the clock for the others)\n"
    "  --pp-chunks V     model chunks per rank for the interleaved schedules (default 2)\n"
    "  --pp-layers A,B,.. layers per pipeline stage (pp x chunks counts; default: an even "
    "split)\n"
    "  --bucket-mb X     gradient bucket size in MiB (default 25)\n"
    "  --grad-reduce-dtype D  fp32 | bf16: the data-parallel gradient reductions' type (default\n"
    "                    fp32; bf16 halves their bytes, the sums rounded to bf16)\n"
    "  --dense-emb-grad  reduce the whole embedding gradient at the end of the backward\n"
    "                    (default: only the rows the batch touched, the rest earlier)\n"
    "  --nproc N         CUDA: start N processes on this node, one per GPU (sets --dp N)\n"
    "  --comm-timeout S  a collective that cannot finish in S seconds fails the run (default "
    "300)\n"
    "  --nccl-semantics  CPU threads: impose what NCCL on GPUs does (every wait synchronises the\n"
    "                    device; a deadlock fails at once, naming the ranks' calls)\n"
    "  --trace FILE.json Chrome / Perfetto trace: one row per rank and stream\n",
    "data and output:\n"
    "  --save DIR        write checkpoints into DIR/step_N (safetensors with Hugging Face "
    "names,\n"
    "                    config.json, optimizer state); at the end, and every --save-every N "
    "steps\n"
    "  --save-every N    checkpoint every N steps (default 0: only at the end)\n"
    "  --keep K          keep the K newest checkpoints in --save DIR (default 3; 0 = all)\n"
    "  --resume DIR      continue a run from DIR (a checkpoint, or the newest DIR/step_N): "
    "weights,\n"
    "                    optimizer moments, step, data position; the model shape comes from "
    "config.json\n"
    "  --init-from DIR   start from the weights of DIR (ours or a Hugging Face Llama directory "
    "with\n"
    "                    config.json and model.safetensors or shards + index): fine-tuning\n"
    "  --data FILE       raw text (byte tokens), or llm.c .bin shards: a comma-separated list "
    "or\n"
    "                    glob patterns ('dir/*.bin'), mapped, every window of --seq + 1 read "
    "once\n"
    "                    per epoch in a shuffled order; shards named *val* are held out for "
    "the\n"
    "                    evaluations. Default: the built-in sorting task\n"
    "  --val-data FILES  with --data shards: the validation shards (a list or patterns)\n"
    "  --tokenizer FILE  a Hugging Face tokenizer.json (byte-level BPE, // >>tokenizer): it "
    "encodes\n"
    "                    --data's text and decodes the samples; --vocab defaults to its ids\n"
    "  --log FILE.jsonl  one JSON object per step\n"
    "  --eval-every N    evaluate every N steps, 0 = only at the end (default 100)\n"
    "  --eval-choices FILE.jsonl  after training, a multiple-choice evaluation: HellaSwag's\n"
    "                    JSONL (\"ctx\", \"endings\", \"label\" per line), each ending scored\n"
    "                    by its tokens' mean loss after the context, the lowest the answer\n"
    "                    (llm.c's acc_norm); encoded with --tokenizer, else as bytes\n"
    "  --eval-tokens N   with --data: each evaluation scores the first N held-out tokens, in\n"
    "                    non-overlapping windows of --seq, the same ones every time (default:\n"
    "                    the whole held-out set, at most 262144 tokens)\n"
    "  --val-frac F      with --data: the last fraction F of the tokens is held out, never "
    "trained\n"
    "                    on, and the evaluations read it (default 0.1; 0 = evaluate on "
    "training data;\n"
    "                    none with validation shards)\n"
    "  --exact-match N   after training on the built-in task, decode N held-out problems "
    "and\n"
    "                    report the exact match (default 200; 0 = none)\n"
    "  --sample N        after training, sample N tokens (default 0)\n"
    "  --temperature X   sampling temperature, 0 = greedy (default 0.8)\n"
    "  --sample-top-k N  sample from the k most likely tokens, 0 = all (default 0)\n"
    "  --peak-tflops X   peak used for MFU (default: 989 on CUDA, the H100/H200 dense bf16 "
    "peak;\n"
    "                    0.096 per CPU thread, AVX2 FMA at 3 GHz)\n"
    "  --quiet           print only the summary\n"
    "  --help            this text\n"
    "Flags take their value as the next argument or after '=' (--steps=500). OpenMP threads "
    "spin\n"
    "briefly, then sleep while they wait (OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT=10000, set\n"
    "unless you set OMP_WAIT_POLICY): threads that spin long slow to a crawl when other\n"
    "programs share the cores.\n",
};

static void usage(FILE *f) {
    size_t i;
    for (i = 0; i < sizeof usage_text / sizeof usage_text[0]; i++) fputs(usage_text[i], f);
}

/* A flag the usage lists ("  --name" starting a line): an unknown flag given last is called
   unknown, not missing its value. */
static int known_flag(const char *f) {
    FILE *t = tmpfile();
    char line[512];
    size_t n = strlen(f);
    int found = 0;
    if (!t) return 1;
    usage(t);
    rewind(t);
    while (!found && fgets(line, sizeof line, t))
        found = !strncmp(line, "  ", 2) && !strncmp(line + 2, f, n) &&
                (line[2 + n] == ' ' || line[2 + n] == '\n');
    fclose(t);
    return found;
}

/* An output file that can be written, checked before training (which may take hours) rather
   than after; a file this makes is removed again. */
static int writable_file(const char *path, const char *flag) {
    struct stat sb;
    int existed = stat(path, &sb) == 0;
    FILE *f;
    if (existed && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "train: %s %s is a directory; it takes a file name\n", flag, path);
        return 0;
    }
    if (!(f = fopen(path, "a"))) {
        fprintf(stderr, "train: cannot write %s %s: %s\n", flag, path, strerror(errno));
        return 0;
    }
    fclose(f);
    if (!existed) remove(path);
    return 1;
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

#ifdef ULTRASCALE_NCCL
/* The last line of defence of a multi-process run: every collective already fails after
   --comm-timeout, but a process can also stall where no timeout reaches (a CUDA call waiting on
   a GPU an aborted communicator still occupies). If no training step completes within twice
   the timeout, this thread says so and ends the process, as PyTorch's NCCL watchdog does. */
#include <pthread.h>

typedef struct watchdog {
    pthread_mutex_t mu;
    pthread_t th;
    double last, limit;
    int rank, stop, started;
} watchdog;

static void *watchdog_main(void *arg) {
    watchdog *w = (watchdog *)arg;
    for (;;) {
        struct timespec nap = {0, 200000000};
        double idle;
        int stop;
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&w->mu);
        stop = w->stop;
        idle = now_s() - w->last;
        pthread_mutex_unlock(&w->mu);
        if (stop) return NULL;
        if (idle > w->limit) {
            fprintf(stderr,
                    "train: rank %d: no training step finished in %.0f s (twice --comm-timeout): a "
                    "peer may have died or a collective hung; exiting\n",
                    w->rank, idle);
            fflush(stdout);
            fflush(stderr);
            _Exit(1);
        }
    }
}

static void watchdog_beat(watchdog *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->last = now_s();
    pthread_mutex_unlock(&w->mu);
}

static void watchdog_start(watchdog *w, int rank, double timeout_s) {
    pthread_mutex_init(&w->mu, NULL);
    w->rank = rank;
    w->limit = 2 * (timeout_s > 0 ? timeout_s : 300);
    w->last = now_s();
    w->stop = 0;
    w->started = pthread_create(&w->th, NULL, watchdog_main, w) == 0;
}

static void watchdog_stop(watchdog *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    w->started = 0;
}
#endif

/* Multi-process tracing: each rank writes PATH.rank<r> in the clock's own time, and rank 0
   joins them into PATH (the event lines between each file's first and last line). */
static int trace_merge(const char *path, int nranks) {
    FILE *out = fopen(path, "w");
    int r, first = 1;
    char part[1100], line[1024];
    if (!out) return 0;
    fprintf(out, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    for (r = 0; r < nranks; r++) {
        FILE *in;
        snprintf(part, sizeof part, "%s.rank%d", path, r);
        if (!(in = fopen(part, "r"))) {
            fclose(out);
            return 0;
        }
        if (!fgets(line, sizeof line, in)) line[0] = 0; /* the header */
        while (fgets(line, sizeof line, in)) {
            size_t n = strlen(line);
            while (n && (line[n - 1] == '\n' || line[n - 1] == ',')) line[--n] = 0;
            if (!n || line[0] != '{') continue; /* the closing "]}" */
            fprintf(out, "%s%s", first ? "" : ",\n", line);
            first = 0;
        }
        fclose(in);
        remove(part);
    }
    fprintf(out, "\n]}\n");
    return fclose(out) == 0;
}

/* What the set-up steps return besides an exit code: go on, or (a flag group) not my flag. */
enum { GO_ON = -1, NOT_MINE = -2 };

typedef struct opts {
    us_model_config mc;
    us_train_config tc; /* tc.batch: the group's micro-batch; each rank runs batch/dp */
    const char *data_path, *log_path, *trace_path;
    const char *tok_path; /* --tokenizer: tok encodes --data's text and decodes the samples */
    us_tokenizer tok;
    const char *choices_path; /* --eval-choices: a multiple-choice file, scored after training */
    struct mc_set *choices;
    const char *save_dir, *resume_dir, *init_dir; /* checkpoints (// >>checkpoint) */
    int save_every, keep;
    char ckpt_from[4096]; /* the checkpoint --resume or --init-from resolved to */
    int eval_every, sample_n, top_k, quiet, gpu, gpu_set, use_cuda, nproc;
    int eval_tokens; /* --eval-tokens; 0: the held-out set up to EVAL_TOKENS_MAX */
    int exact_n;     /* --exact-match: the built-in task's problems decoded after training */
    int pp_layers_n; /* how many counts --pp-layers gave */
    int nccl_sem;    /* --nccl-semantics: CPU threads impose a GPU's NCCL semantics */
    int gemm_tune;   /* --gemm-tune: the first GEMM_TUNE_STEPS steps choose cuBLASLt's algorithms */
    const char *gemm_tune_file; /* --gemm-tune-file: those choices read from / saved to a file */
    float temperature, peak_tflops, comm_timeout;
    int world, rank;      /* CUDA multi-process: this process's place (from the environment) */
    us_data data;         /* the training tokens (raw text --data), less the held-out tail */
    us_data val;          /* the held-out tail (a view into data's tokens; n = 0: none); with shards
                         the evaluations' tokens, read from the validation shards or the tail */
    const char *val_path; /* --val-data */
    int shards;           /* 1: --data names llm.c shards, streamed by a us_loader per rank */
    char **train_paths, **val_paths; /* the shards (us_data_expand's lists) */
    int n_train_paths, n_val_paths;
    us_loader_config lcfg; /* every rank's loader: seq, seed, vocabulary, held-out tail */
    float val_frac;   /* --val-frac; < 0: not given (default 0.1, none if the file is too small) */
    us_trace *traces; /* [dp] when tracing */
    /* set by the ranks that find --resume's checkpoint at or past --steps: they all return
       US_OK, since a rank that returned an error the moment the load's last collective let it
       go would fail that collective for a rank still inside it; main exits 1 for them */
    volatile int nothing_left;
} opts;

/* One rank's training state, shared by the parts of run_rank below. */
typedef struct rank_state {
    opts *o;
    us_comm *comm; /* NULL on one rank; NCCL's own under CUDA multi-process */
    us_model_config mc;
    us_train_config tc; /* tc.batch: this rank's micro-batch, the group's / dp */
    int rank, dp, loud, drank, Tl, Bg, stop;
    int32_t *cpos; /* this rank's token positions in each sequence (context parallelism) */
    us_ops *opsp;
#ifdef US_CUDA
    us_ops ops;
    char tune_path[4096]; /* --gemm-tune-file's file for this rank (".rankN" past rank 0) */
    int tune_save;        /* it did not exist: tune, then save the choices there */
#ifdef ULTRASCALE_NCCL
    us_comm nccl;
    int have_nccl;
    watchdog wd;
#endif
#endif
    char devname[160];
    us_task task, eval_task;
    us_rng rng;
    us_loader loader; /* --data shards: this rank's place in the stream */
    us_model m;
    FILE *logf;
    int32_t *gin, *gtgt, *in, *tgt; /* the group's batch, then this rank's rows of it */
    double t_start, flops_tok;
    int scaled;
    float peak_tflops;
} rank_state;

/* The rank's settings from the options; the machine's threads shared among the ranks. */
static void rank_begin(rank_state *s, us_comm *comm, opts *o) {
    memset(s, 0, sizeof *s);
    s->o = o;
    s->comm = comm;
    s->mc = o->mc;
    s->tc = o->tc;
    s->rank = comm ? comm->world.rank : o->rank;
    s->dp = s->tc.dp;
    s->loud = s->rank == 0 && !o->quiet;
    s->Tl = s->tc.seq / s->tc.cp;
    s->Bg = s->tc.batch; /* the group's micro-batch */
    s->peak_tflops = o->peak_tflops;
    snprintf(s->devname, sizeof s->devname, "cpu");
    s->tc.batch = s->Bg / s->dp;
    if (s->dp * s->tc.pp * s->tc.cp * s->tc.tp > 1 && !s->tc.threads && !o->use_cuda) {
#ifdef _OPENMP
        int n = s->dp * s->tc.pp * s->tc.cp * s->tc.tp;
        s->tc.threads = omp_get_max_threads() / n > 0 ? omp_get_max_threads() / n : 1;
#endif
    }
}

#ifdef US_CUDA
/* --gemm-tune-file PATH: the choices of an earlier tuned run read from PATH (no tuning in this
   run: runs that read the same file take the same algorithms, and their GEMMs give the same
   bits; the run that tuned differs in its first steps, which took the candidates in turn), or,
   where PATH does not
   exist yet, this run tunes as --gemm-tune and saves its choices there. Past rank 0 of several
   GPU processes, each rank has its own file, PATH.rankN (their GEMM shapes can differ). */
static us_result rank_tune_file(rank_state *s) {
    char err[512];
    opts *o = s->o;
    if (o->world > 1 && o->rank > 0)
        snprintf(s->tune_path, sizeof s->tune_path, "%s.rank%d", o->gemm_tune_file, o->rank);
    else
        snprintf(s->tune_path, sizeof s->tune_path, "%s", o->gemm_tune_file);
    if (access(s->tune_path, F_OK) != 0) {
        s->tune_save = 1;
        o->gemm_tune = 1;
        return US_OK;
    }
    o->gemm_tune = 0;
    if (us_cuda_gemm_tune_load(&s->ops, s->tune_path, err, sizeof err) != US_OK) {
        fprintf(stderr, "train: rank %d: --gemm-tune-file: %s\n", o->rank, err);
        return US_ERR_FORMAT;
    }
    if (o->rank == 0 && !o->quiet)
        printf("gemm-tune: cuBLASLt's algorithms read from %s (no tuning)\n", s->tune_path);
    return US_OK;
}
#endif

/* CUDA: the GPU's ops, and NCCL over the world when there is one process per GPU. */
static us_result rank_open_device(rank_state *s) {
#ifdef US_CUDA
    char err[256];
    opts *o = s->o;
    if (!o->use_cuda) return US_OK;
    if (us_cuda_ops(&s->ops, o->gpu, err, sizeof err) != US_OK) {
        fprintf(stderr, "train: rank %d: %s\n", o->rank, err);
        return US_ERR_BACKEND;
    }
    us_cuda_describe(&s->ops, s->devname, sizeof s->devname);
    s->opsp = &s->ops;
    if (o->gemm_tune_file && rank_tune_file(s) != US_OK) {
        us_cuda_ops_free(&s->ops);
        return US_ERR_FORMAT;
    }
#ifdef ULTRASCALE_NCCL
    if (o->world > 1) { /* NCCL ordered against the ops' stream */
        if (us_nccl_init(&s->nccl, &s->ops, us_cuda_stream(&s->ops), o->rank, o->world, NULL,
                         o->comm_timeout, err, sizeof err) != US_OK) {
            fprintf(stderr, "train: rank %d: %s\n", o->rank, err);
            us_cuda_ops_free(&s->ops);
            return US_ERR_BACKEND;
        }
        s->have_nccl = 1;
        s->comm = &s->nccl;
        s->rank = o->rank;
        s->loud = s->rank == 0 && !o->quiet;
    }
#endif
#else
    (void)s;
#endif
    return US_OK;
}

/* Gives back what rank_open_device took. */
static void rank_close_device(rank_state *s) {
#ifdef US_CUDA
#ifdef ULTRASCALE_NCCL
    if (s->have_nccl) us_nccl_free(&s->nccl);
#endif
    if (s->opsp) us_cuda_ops_free(s->opsp);
#else
    (void)s;
#endif
}

/* The peak for MFU: the flag, else an H100/H200 or the CPU threads; over the whole group. */
static void rank_peak(rank_state *s) {
    if (s->peak_tflops == 0 && s->o->use_cuda) s->peak_tflops = 989.0f;
    if (s->peak_tflops == 0) {
        int th = s->tc.threads;
#ifdef _OPENMP
        if (!th) th = omp_get_max_threads();
#else
        th = 1;
#endif
        s->peak_tflops = 0.096f * (float)th;
    }
    s->peak_tflops *= (float)(s->dp * s->tc.pp * s->tc.cp * s->tc.tp);
}

/* After the model: positions, trace, log file, batch buffers, the data streams. */
static us_result rank_setup(rank_state *s) {
    opts *o = s->o;
    us_train_config *tc = &s->tc;
    size_t rows = (size_t)s->Bg * tc->seq * tc->grad_accum;
    int i;
    /* the batch rows are split over dp; tp ranks share them; cp splits each sequence */
    s->drank = s->m.mesh.dp_rank;
    s->cpos = (int32_t *)malloc((size_t)s->Tl * 4);
    if (!s->cpos) return US_ERR_OOM;
    if (tc->cp > 1)
        us_cp_positions(&s->m.tc, s->m.mesh.cp_rank, s->cpos);
    else
        for (i = 0; i < s->Tl; i++) s->cpos[i] = i;
    if (o->traces) {
        us_trace_init(&o->traces[s->rank], s->rank);
        s->m.trace = &o->traces[s->rank];
        if (s->comm) s->comm->trace = s->m.trace;
    }
    if (s->rank == 0 && o->log_path && !(s->logf = fopen(o->log_path, "w"))) {
        fprintf(stderr, "train: cannot open log file %s\n", o->log_path);
        return US_ERR_IO; /* the other ranks stop at their next collective, naming this one */
    }
    rank_peak(s);
    s->gin = (int32_t *)malloc(rows * 4);
    s->gtgt = (int32_t *)malloc(rows * 4);
    s->in = (int32_t *)malloc((size_t)tc->batch * tc->seq * tc->grad_accum * 4);
    s->tgt = (int32_t *)malloc((size_t)tc->batch * tc->seq * tc->grad_accum * 4);
    if (!s->gin || !s->gtgt || !s->in || !s->tgt) {
        fprintf(stderr, "train: out of memory\n");
        return US_ERR_OOM;
    }
    if (o->shards && us_loader_open(&s->loader, (const char *const *)o->train_paths,
                                    o->n_train_paths, &o->lcfg) != US_OK) {
        fprintf(stderr, "train: rank %d: %s\n", s->rank, s->loader.err);
        return US_ERR_IO;
    }
    us_task_init(&s->task, tc->seed);
    us_task_init(&s->eval_task, tc->seed + 7777); /* a different stream: problems not trained on */
    us_rng_seed(&s->rng, tc->seed);
    return US_OK;
}

/* --resume over shards: the loader where the checkpoint left it, on the same training tokens. */
static us_result rank_resume_loader(rank_state *s, const us_ckpt_state *cs) {
    opts *o = s->o;
    us_loader_pos p;
    if (cs->has_loader != o->shards) {
        if (s->rank == 0)
            fprintf(stderr,
                    "train: %s was saved by a run %s, and this one %s: give the same --data\n",
                    o->ckpt_from, cs->has_loader ? "over token shards" : "without token shards",
                    o->shards ? "reads shards" : "does not");
        return US_ERR_INVALID;
    }
    if (!o->shards) return US_OK;
    if (cs->loader_tokens != s->loader.n_train) {
        if (s->rank == 0)
            fprintf(stderr,
                    "train: %s trained on %lld tokens of shards, but --data now has %lld to "
                    "train on: give the same --data and --val-frac\n",
                    o->ckpt_from, (long long)cs->loader_tokens, (long long)s->loader.n_train);
        return US_ERR_INVALID;
    }
    p.epoch = cs->loader_epoch;
    p.shard = cs->loader_shard;
    p.window = cs->loader_window;
    p.seed = cs->loader_seed;
    if (us_loader_seek(&s->loader, p) != US_OK) {
        fprintf(stderr, "train: rank %d: %s: %s\n", s->rank, o->ckpt_from, s->loader.err);
        return US_ERR_FORMAT;
    }
    return US_OK;
}

/* --resume: everything, and the data streams where they were; --init-from: weights. */
static us_result rank_load_checkpoint(rank_state *s) {
    opts *o = s->o;
    us_ckpt_state cs;
    us_result r;
    if (!o->ckpt_from[0]) return US_OK;
    memset(&cs, 0, sizeof cs);
    if ((r = us_ckpt_load(&s->m, o->ckpt_from, o->resume_dir != NULL, &cs)) != US_OK) {
        fprintf(stderr, "train: rank %d: %s\n", s->rank, us_model_error(&s->m));
        return r;
    }
    if (o->resume_dir && s->m.step >= s->tc.steps) {
        if (s->rank == 0)
            fprintf(stderr,
                    "train: %s is at step %d and --steps is %d: nothing left to train (give "
                    "--steps above %d)\n",
                    o->ckpt_from, s->m.step, s->tc.steps, s->m.step);
        o->nothing_left = 1;
        s->stop = 1;
        return US_OK;
    }
    if (o->resume_dir) {
        if (cs.n_rng != 3) {
            fprintf(stderr, "train: %s has %d RNG states, not the trainer's 3\n", o->ckpt_from,
                    cs.n_rng);
            return US_ERR_FORMAT;
        }
        s->task.rng.s = cs.rng[0];
        s->eval_task.rng.s = cs.rng[1];
        s->rng.s = cs.rng[2];
        if ((r = rank_resume_loader(s, &cs)) != US_OK) return r;
    }
    if (s->loud)
        printf("checkpoint: %s %s at step %d\n",
               o->resume_dir ? "resumed from" : "initialised from", o->ckpt_from, s->m.step);
    return US_OK;
}

/* The run's first lines: the model, and on CUDA the attention kernels this shape gets. */
static void rank_print_model(rank_state *s) {
    us_model *m = &s->m;
    us_train_config *tc = &s->tc;
    char rope[160];
    if (s->loud)
        printf(
            "model: %lld params (L=%d C=%lld NH=%d NKV=%d F=%lld V=%lld%s, %s) | %s | recompute %s "
            "| B=%d T=%d accum=%d dp=%d cp=%d tp=%d zero=%d | %s | %s | memory %.2f MiB/rank\n",
            (long long)m->n_params, m->cfg.n_layers, (long long)m->cfg.dim, m->cfg.n_heads,
            m->cfg.n_kv_heads, (long long)m->cfg.ffn_dim, (long long)m->cfg.vocab,
            m->cfg.tie_embeddings ? " tied" : "", us_rope_describe(&m->cfg, rope, sizeof rope),
            us_precision_name(m->tc.precision), us_recompute_name(m->tc.recompute), s->Bg, tc->seq,
            tc->grad_accum, s->dp, tc->cp, tc->tp, tc->zero,
            s->o->data_path ? s->o->data_path : "task: sort 8 digits", s->devname,
            (double)m->mem.total / 1048576.0);
#ifdef US_CUDA
    /* no silent hundredfold cliff; what still takes the portable kernel: fp32, head sizes other
       than these six, GPUs before sm_80, and causal attention (no --cp) off Hopper in fp16 or
       at 80, 96, 192, 256 */
    if (s->loud && s->o->use_cuda) {
        const int hs = (int)(m->cfg.dim / m->cfg.n_heads);
        const char *ap = us_cuda_attention_path(&s->ops, m->dt, hs, tc->cp > 1);
        if (!strcmp(ap, "portable"))
            printf("warning: attention runs the portable kernel (%s, head size %d%s), a hundred "
                   "or more times slower than flash attention, which takes bf16 and fp16 at head "
                   "sizes 64, 80, 96, 128, 192, 256 on sm_80 and newer (without --cp, off Hopper: "
                   "bf16 at 64 and 128 only)\n",
                   us_dtype_name(m->dt), hs, tc->cp > 1 ? ", by blocks for --cp" : "");
        else
            printf("attention: %s kernels (%s, head size %d)\n",
                   !strcmp(ap, "hopper") ? "Hopper wgmma" : "flash mma.sync", us_dtype_name(m->dt),
                   hs);
    }
#endif
}

static int64_t eval_windows(const rank_state *s);

/* --data shards: how many, the tokens and windows of an epoch, where the evaluations read. */
static void print_shards(rank_state *s) {
    const opts *o = s->o;
    const us_loader *l = &s->loader;
    printf("data: %d shard%s, %lld tokens to train on (%lld windows of %d per epoch, shuffled), ",
           l->n_shards, l->n_shards > 1 ? "s" : "", (long long)l->n_train, (long long)l->n_windows,
           s->tc.seq + 1);
    if (o->n_val_paths)
        printf("%d validation shard%s for the evaluations\n", o->n_val_paths,
               o->n_val_paths > 1 ? "s" : "");
    else if (l->n_train < l->n_tokens)
        printf("the last %lld held out for the evaluations\n",
               (long long)(l->n_tokens - l->n_train));
    else
        printf("the evaluations read them too (--val-frac 0, or too few to hold any out)\n");
    printf("evaluation: %lld windows of %d tokens, the same each time (--eval-tokens)\n",
           (long long)eval_windows(s), s->tc.seq);
}

/* The run's next lines: the held-out data, the FP8 linears, the experts. */
static void rank_print_parts(rank_state *s) {
    opts *o = s->o;
    us_model *m = &s->m;
    if (s->loud && o->shards)
        print_shards(s);
    else if (s->loud && o->data_path) {
        if (o->val.n)
            printf("data: %lld tokens to train on, the last %lld held out for the evaluations\n",
                   (long long)o->data.n, (long long)o->val.n);
        else
            printf("data: %lld tokens to train on, the evaluations read them too (--val-frac 0, or "
                   "too few to hold any out)\n",
                   (long long)o->data.n);
        printf("evaluation: %lld windows of %d tokens, the same each time (--eval-tokens)\n",
               (long long)eval_windows(s), s->tc.seq);
    }
    if (s->loud && m->fp8) {
        char wq[64] = "at every GEMM";
        if (!m->fp8_linear)
            snprintf(wq, sizeof wq, "never (no FP8 GEMM)");
        else if (m->fp8_wc)
            snprintf(wq, sizeof wq, "once per step (cache %.1f MiB)",
                     (double)m->fp8_wlayer * m->cfg.n_layers / 1048576.0);
        printf("fp8: %d of %d linear layers in FP8 E4M3 (%s scales%s; the rest bf16: In or Out "
               "under --fp8-min-dim %d, or a size not a multiple of 16; MoE experts %s) | weights "
               "quantised %s\n",
               m->fp8_linear, m->fp8_linear_all,
               m->fp8 == 2 ? "per-tensor" : "1x128 activation / 128x128 weight",
               s->tc.fp8_pow2 ? ", powers of two" : "",
               s->tc.fp8_min_dim ? s->tc.fp8_min_dim : US_FP8_MIN_DIM,
               s->tc.fp8_experts ? "by the same rule, per expert" : "in bf16 (--fp8-experts)", wq);
    }
    if (s->loud && m->n_moe_all) /* (the whole model's: under pp this rank holds some) */
        printf("moe: %d of %d layers, E=%d top-%d Fe=%lld%s, %s gates, balance %s%s | ep=%d (%d "
               "experts per rank) | %lld active params per token of %lld\n",
               m->n_moe_all, m->n_layers_global, m->cfg.moe_experts, m->cfg.moe_top_k,
               (long long)m->cfg.moe_ffn_dim, m->cfg.moe_shared ? " + shared" : "",
               m->cfg.moe_gate == US_MOE_SIGMOID ? "sigmoid" : "softmax",
               m->cfg.moe_balance == US_MOE_BALANCE_BIAS  ? "bias"
               : m->cfg.moe_balance == US_MOE_BALANCE_AUX ? "aux"
                                                          : "none",
               m->cfg.moe_groups > 1 ? " | group-limited" : "", m->ep, m->cfg.moe_experts / m->ep,
               (long long)us_param_count_active(&s->mc), (long long)us_param_count(&s->mc));
}

/* Every rank draws the whole global batch (same seed) and keeps its rows of each micro-batch;
   from shards, each micro-batch's group batch comes from the loader, which reads this rank's
   rows only (the group's rows drank·batch ..). */
static us_result rank_batch(rank_state *s) {
    us_train_config *tc = &s->tc;
    int k, bb, t;
    if (s->o->shards) {
        for (k = 0; k < tc->grad_accum; k++) {
            const size_t row = (size_t)k * s->Bg + (size_t)s->drank * tc->batch;
            if (us_loader_next(&s->loader, s->Bg, s->drank * tc->batch, tc->batch,
                               s->gin + row * tc->seq, s->gtgt + row * tc->seq) != US_OK) {
                fprintf(stderr, "train: rank %d: %s (set --vocab?)\n", s->rank, s->loader.err);
                return US_ERR_FORMAT;
            }
        }
    } else if (s->o->data_path)
        us_data_batch(&s->o->data, &s->rng, s->Bg * tc->grad_accum, tc->seq, s->gin, s->gtgt);
    else
        us_task_batch(&s->task, s->Bg * tc->grad_accum, tc->seq, s->gin, s->gtgt);
    for (k = 0; k < tc->grad_accum; k++)
        for (bb = 0; bb < tc->batch; bb++)
            for (t = 0; t < s->Tl; t++) {
                size_t src =
                    ((size_t)k * s->Bg + (size_t)s->drank * tc->batch + bb) * tc->seq + s->cpos[t];
                s->in[((size_t)k * tc->batch + bb) * s->Tl + t] = s->gin[src];
                s->tgt[((size_t)k * tc->batch + bb) * s->Tl + t] = s->gtgt[src];
            }
    return US_OK;
}

/* The evaluation's windows (--data): every whole window of --seq tokens in the first
   --eval-tokens held-out tokens (default: all of them, at most EVAL_TOKENS_MAX) */
#define EVAL_TOKENS_MAX 262144

static int64_t eval_windows(const rank_state *s) {
    const opts *o = s->o;
    const us_data *d = o->val.n ? &o->val : &o->data;
    int64_t n = o->eval_tokens ? o->eval_tokens : EVAL_TOKENS_MAX;
    return us_data_windows(d, n + 1, s->tc.seq);
}

/* One micro-batch of the evaluation: this rank's rows (and cp positions) of the group's batch
   in gin/gtgt, forward only; adds the loss sum, the right predictions and the scored targets */
/* This rank's rows (and cp positions) of the group's one-micro-batch gin/gtgt [Bg][seq] into
   in/tgt [batch][Tl] */
static void rank_take_rows(rank_state *s) {
    const us_train_config *tc = &s->tc;
    int64_t j;
    for (j = 0; j < (int64_t)tc->batch * s->Tl; j++) {
        size_t src =
            ((size_t)s->drank * tc->batch + (size_t)(j / s->Tl)) * tc->seq + s->cpos[j % s->Tl];
        s->in[j] = s->gin[src];
        s->tgt[j] = s->gtgt[src];
    }
}

static us_result rank_eval_batch(rank_state *s, double v[3]) {
    us_train_config *tc = &s->tc;
    int64_t c = 0, j;
    double loss = 0;
    us_result r;
    rank_take_rows(s);
    for (j = 0; j < (int64_t)tc->batch * s->Tl; j++) v[2] += s->tgt[j] >= 0;
    r = us_forward_eval(&s->m, s->in, s->tgt, tc->batch, s->Tl, &loss, &c, NULL);
    v[0] += loss;
    v[1] += (double)c;
    return r;
}

/* Held-out loss and next-token accuracy on the scored targets, summed over the ranks. With
   --data every evaluation scores the same windows (eval_windows), the group's micro-batch of
   windows at a time, so that two evaluations differ only by the model; on the built-in task,
   one micro-batch of problems it has not trained on. */
static void rank_eval(rank_state *s, double *eval_loss, double *eval_acc) {
    opts *o = s->o;
    us_train_config *tc = &s->tc;
    const us_data *d = o->val.n ? &o->val : &o->data;
    double v[3] = {0, 0, 0};
    const int64_t W = o->data_path ? eval_windows(s) : 1;
    int64_t w;
    for (w = 0; w < W; w += s->Bg) {
        if (o->data_path)
            us_data_window_batch(d, w, W, s->Bg, tc->seq, s->gin, s->gtgt);
        else
            us_task_batch(&s->eval_task, s->Bg, tc->seq, s->gin, s->gtgt);
        if (rank_eval_batch(s, v) != US_OK) return;
    }
    if (us_dp_sum(&s->m, v, 3) == US_OK && v[2] > 0) {
        *eval_loss = v[0] / v[2];
        *eval_acc = v[1] / v[2];
    }
}

/* The step's line on stdout (rank 0, unless --quiet). */
static void rank_print_step(const rank_state *s, const us_step_stats *st, double tok_s, double mfu,
                            double eval_loss, double eval_acc) {
    printf("step %5d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU %.1f%% | "
           "mem %.2f MiB",
           st->step, st->loss, st->lr, st->grad_norm, tok_s, 100 * mfu,
           (double)s->m.ops.bytes_peak / 1048576.0);
    if (s->tc.pp > 1) printf(" | bubble %.1f%%", 100 * st->pp_bubble);
    if (s->scaled)
        printf(" | loss scale %g | skipped %d/%lld", st->loss_scale, st->skipped,
               (long long)st->skipped_total);
    if (s->m.n_moe_all) { /* the router: how uneven the experts' loads are, the aux loss, the dropped share */
        printf(" | moe imbalance %.2f", st->moe_imbalance);
        if (s->mc.moe_balance == US_MOE_BALANCE_AUX) printf(" aux %.4f", st->moe_aux_loss);
        if (s->mc.moe_capacity > 0) printf(" dropped %.1f%%", 100 * st->moe_drop_frac);
    }
    if (eval_loss >= 0) printf(" | eval loss %.4f acc %.3f", eval_loss, eval_acc);
    printf("\n");
}

/* The router's part of a --log line: the experts' loads, summed over the MoE layers. */
static void rank_log_moe(const rank_state *s, const us_step_stats *st) {
    FILE *logf = s->logf;
    int e, l2;
    fprintf(logf,
            ", \"moe_imbalance\": %.4f, \"moe_aux_loss\": %.6g, \"moe_drop_frac\": "
            "%.6f, \"moe_load\": [",
            st->moe_imbalance, st->moe_aux_loss, st->moe_drop_frac);
    for (e = 0; e < s->m.cfg.moe_experts; e++) { /* tokens per expert */
        int64_t t = 0;
        for (l2 = 0; l2 < s->m.n_moe_all; l2++) /* (every stage's, us_step_stats.moe_load) */
            t += st->moe_load[(size_t)l2 * s->m.cfg.moe_experts + e];
        fprintf(logf, "%s%lld", e ? ", " : "", (long long)t);
    }
    fprintf(logf, "]");
}

/* The memory the process really holds beside the allocator's count and the estimate: on the
   GPU the device's used memory now (context, cuBLASLt workspace and NCCL buffers included), on
   the CPU the process's peak resident set (every rank of the threads backend shares it). */
static size_t real_mem_bytes(const rank_state *s) {
#ifdef US_CUDA
    if (s->o->use_cuda) return us_cuda_device_used(&s->ops);
#endif
    (void)s;
    return us_peak_rss_bytes();
}

/* The step's JSON object in --log (rank 0). */
static void rank_log_step(const rank_state *s, const us_step_stats *st, double tok_s, double mfu,
                          double eval_loss, double eval_acc) {
    FILE *logf = s->logf;
    fprintf(logf, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, ", st->step, st->loss, st->lr);
    if (isfinite(st->grad_norm))
        fprintf(logf, "\"grad_norm\": %.6f", st->grad_norm);
    else /* a step the loss scaler skipped: JSON has no inf / NaN */
        fprintf(logf, "\"grad_norm\": null");
    fprintf(logf, ", \"tok_s\": %.1f, \"mfu\": %.6f, \"mem_bytes\": %zu, \"time_s\": %.3f", tok_s,
            mfu, s->m.ops.bytes_peak, now_s() - s->t_start);
    fprintf(logf, s->o->use_cuda ? ", \"device_used_bytes\": %zu" : ", \"rss_peak_bytes\": %zu",
            real_mem_bytes(s));
    if (s->scaled)
        fprintf(logf, ", \"loss_scale\": %.17g, \"skipped\": %d, \"skipped_total\": %lld",
                st->loss_scale, st->skipped, (long long)st->skipped_total);
    if (s->tc.pp > 1)
        fprintf(logf,
                ", \"pp_bubble\": %.4f, \"pp_tf_ms\": %.3f, \"pp_tb_ms\": %.3f, "
                "\"pp_tw_ms\": %.3f",
                st->pp_bubble, st->pp_cost_ms[0], st->pp_cost_ms[1], st->pp_cost_ms[2]);
    if (s->m.n_moe_all) rank_log_moe(s, st);
    if (eval_loss >= 0)
        fprintf(logf, ", \"eval_loss\": %.6f, \"eval_acc\": %.6f", eval_loss, eval_acc);
    fprintf(logf, "}\n");
    fflush(logf);
}

/* Every rank writes its slices into one layout-free checkpoint (a collective). */
static us_result rank_save(rank_state *s, int step) {
    us_ckpt_state cs;
    char dir[4200], err[256];
    double t1 = now_s();
    us_result r;
    memset(&cs, 0, sizeof cs);
    cs.n_rng = 3;
    cs.rng[0] = s->task.rng.s;
    cs.rng[1] = s->eval_task.rng.s;
    cs.rng[2] = s->rng.s;
    cs.data_pos = step;
    if (s->o->shards) { /* the loader's place: a resume reads the batches this run would */
        us_loader_pos p = us_loader_tell(&s->loader);
        cs.has_loader = 1;
        cs.loader_epoch = p.epoch;
        cs.loader_shard = p.shard;
        cs.loader_window = p.window;
        cs.loader_seed = p.seed;
        cs.loader_tokens = s->loader.n_train;
    }
    snprintf(dir, sizeof dir, "%s/step_%08d", s->o->save_dir, step);
    if ((r = us_ckpt_save(&s->m, dir, &cs, NULL)) != US_OK) {
        fprintf(stderr, "train: rank %d: %s\n", s->rank, us_model_error(&s->m));
        return r;
    }
    if (s->rank == 0 && us_ckpt_prune(s->o->save_dir, s->o->keep, err, sizeof err) != US_OK)
        fprintf(stderr, "train: %s\n", err);
    if (s->loud) printf("checkpoint: saved %s in %.2f s\n", dir, now_s() - t1);
    return US_OK;
}

/* --gemm-tune: cuBLASLt's candidates are timed inside this run's first GEMM_TUNE_STEPS steps
   (us_cuda_gemm_tune; every GEMM shape is called once a layer, so 2 steps give each of up to 8
   candidates several calls), then each shape keeps its fastest. k: the step of this run,
   before (1) or after (0) it. */
#define GEMM_TUNE_STEPS 2

static void rank_gemm_tune(rank_state *s, int k, int before) {
#ifdef US_CUDA
    if (!s->o->gemm_tune || !s->o->use_cuda) return;
    if (before && k == 0) us_cuda_gemm_tune(&s->ops, 1);
    if (!before && k == GEMM_TUNE_STEPS - 1) {
        char err[512];
        int n = us_cuda_gemm_tune(&s->ops, 0);
        if (s->loud)
            printf("gemm-tune: %d GEMM shapes took another algorithm after %d steps\n", n,
                   GEMM_TUNE_STEPS);
        if (s->tune_save && us_cuda_gemm_tune_save(&s->ops, s->tune_path, err, sizeof err) != US_OK)
            fprintf(stderr, "train: rank %d: --gemm-tune-file: %s\n", s->rank, err);
        else if (s->tune_save && s->loud)
            printf("gemm-tune: the choices saved to %s\n", s->tune_path);
    }
#else
    (void)s, (void)k, (void)before;
#endif
}

/* The training loop: batch, step, evaluate, print, log, checkpoint; stops at the first error. */
static us_result rank_train(rank_state *s) {
    opts *o = s->o;
    us_train_config *tc = &s->tc;
    us_result r = US_OK;
    int i, first = s->m.step; /* this run's first step (a resumed run starts past 0) */
    s->flops_tok = us_flops_per_token(&s->mc, tc->seq); /* the whole model, not one stage */
    s->t_start = now_s();
#ifdef ULTRASCALE_NCCL
    if (s->have_nccl) watchdog_start(&s->wd, s->rank, o->comm_timeout);
#endif
    s->scaled = s->m.ls_dynamic || s->m.tc.loss_scale > 0; /* the loss scaler (// >>lossscale) */
    for (i = s->m.step; i < tc->steps; i++) {
        us_step_stats st;
        double t0 = now_s(), dt, tok_s, mfu, eval_loss = -1, eval_acc = -1;
        if ((r = rank_batch(s)) != US_OK) break;
        rank_gemm_tune(s, i - first, 1);
        if ((r = us_train_step(&s->m, s->in, s->tgt, &st)) != US_OK) {
            fprintf(stderr, "train: rank %d: step %d: %s\n", s->rank, i + 1, us_model_error(&s->m));
            break;
        }
        rank_gemm_tune(s, i - first, 0);
#ifdef ULTRASCALE_NCCL
        watchdog_beat(&s->wd);
#endif
        dt = now_s() - t0;
        tok_s = (double)st.tokens / dt;
        mfu = s->flops_tok * tok_s / (s->peak_tflops * 1e12);
        /* (a step the loss scaler skipped did not advance st.step: no second eval at its number) */
        if ((o->eval_every && !st.skipped && st.step % o->eval_every == 0) || i == tc->steps - 1)
            rank_eval(s, &eval_loss, &eval_acc);
        if (s->loud) rank_print_step(s, &st, tok_s, mfu, eval_loss, eval_acc);
        if (s->logf) rank_log_step(s, &st, tok_s, mfu, eval_loss, eval_acc);
        if (o->save_dir &&
            ((o->save_every && st.step % o->save_every == 0) || st.step == tc->steps) &&
            (r = rank_save(s, st.step)) != US_OK)
            break;
    }
#ifdef ULTRASCALE_NCCL
    if (r == US_OK) watchdog_stop(&s->wd); /* after a failure it stays: the exit may stall */
#endif
    return r;
}

/* Tokens as text: through --tokenizer (ids it does not hold are left out, invalid UTF-8 becomes
   U+FFFD), else as bytes. NULL when out of memory. */
static char *decode_text(opts *o, int32_t *ids, int n) {
    const int flags = US_TOK_LOSSY | US_TOK_SKIP_UNKNOWN;
    size_t len = 0;
    char *text;
    if (!o->tok_path) {
        text = (char *)malloc((size_t)n + 1);
        if (text) us_byte_decode(ids, (size_t)n, text, (size_t)n + 1);
        return text;
    }
    us_tok_decode(&o->tok, ids, (size_t)n, flags, NULL, 0, &len);
    text = (char *)malloc(len + 1);
    if (text && us_tok_decode(&o->tok, ids, (size_t)n, flags, text, len + 1, &len) != US_OK)
        text[0] = 0;
    return text;
}

/* After training: a sample of --sample tokens from a prompt (every rank takes part). */
static void rank_sample(rank_state *s) {
    opts *o = s->o;
    int32_t prompt[US_TASK_DIGITS + 1], *out;
    int np = 0, n_new, seq = s->tc.seq;
    char *text = NULL;
    if (o->data_path) {
        np = seq < 8 ? 1 : 8;
        memcpy(prompt, o->data.n ? o->data.tokens : o->val.tokens, (size_t)np * 4);
    } else {
        np = (int)us_byte_encode("31415926=", prompt, US_TASK_DIGITS + 1);
    }
    n_new = o->sample_n < seq - np ? o->sample_n : seq - np;
    out = (int32_t *)malloc((size_t)(np + n_new) * 4);
    if (out &&
        us_sample(&s->m, prompt, np, n_new, o->temperature, o->top_k, &s->rng, out) == US_OK &&
        s->rank == 0 && (text = decode_text(o, out, np + n_new)))
        printf("sample (%d tokens, temperature %.2f%s):\n%s\n", n_new, o->temperature,
               n_new < o->sample_n ? ", capped at seq" : "", text);
    free(out);
    free(text);
}

static void rank_print_memory(const rank_state *s) {
    const double mib = 1048576.0, real = (double)real_mem_bytes(s) / mib;
    printf("memory: allocator peak %.1f MiB/rank, estimate %.1f MiB/rank, ",
           (double)s->m.ops.bytes_peak / mib, (double)s->m.mem.total / mib);
    if (s->o->use_cuda)
        printf("device used %.1f MiB (this GPU, now)\n", real);
    else
        printf("process peak RSS %.1f MiB (the whole process)\n", real);
}

/* ---- --eval-choices: a multiple-choice evaluation (HellaSwag's JSONL, as llm.c runs it) ----
   One JSON object a line with "ctx" (a string), "endings" (2 to 16 strings) and "label" (the
   right ending's index); other fields are skipped (the library's us_choice_parse). Each ending is encoded as " " + ending after
   the context, every candidate is one sequence of the batch, and its score is the mean loss of
   the ending's tokens (acc_norm); the lowest score is the model's answer. */
typedef struct mc_cand {
    int32_t *ids; /* [n]: the context's tokens, then the ending's */
    int n, ctx;   /* tokens in all, of which the first ctx are the context */
} mc_cand;

typedef struct mc_set {
    mc_cand *c; /* [n_cand], each example's endings in a row */
    int *first; /* [n_ex + 1]: example e's candidates are first[e] .. first[e + 1] − 1 */
    int *label; /* [n_ex] */
    int n_ex, n_cand, cap_ex, cap_cand;
} mc_set;

/* text → token ids through --tokenizer, else as bytes: a new array in *ids[*n] */
static int mc_encode(opts *o, const char *text, int32_t **ids, int *n) {
    size_t len = strlen(text), got = 0;
    *ids = (int32_t *)malloc((len * 2 + 1) * sizeof **ids);
    if (!*ids) return 0;
    if (o->tok_path) {
        if (us_tok_encode(&o->tok, text, len, *ids, len * 2 + 1, &got) != US_OK) return 0;
    } else {
        got = us_byte_encode(text, *ids, len + 1);
    }
    *n = (int)got;
    return 1;
}

/* An example's candidates: the context's tokens, then " " + ending's, for each ending */
static int mc_add(opts *o, mc_set *m, const char *ctx, char **end, int n_end, int label) {
    int32_t *cid, *eid;
    int nc, ne, k;
    if (m->n_ex + 1 >= m->cap_ex) {
        m->cap_ex = 2 * m->cap_ex + 16;
        m->first = (int *)realloc(m->first, (size_t)(m->cap_ex + 1) * sizeof *m->first);
        m->label = (int *)realloc(m->label, (size_t)m->cap_ex * sizeof *m->label);
    }
    if (m->n_cand + n_end > m->cap_cand) {
        m->cap_cand = 2 * m->cap_cand + n_end + 16;
        m->c = (mc_cand *)realloc(m->c, (size_t)m->cap_cand * sizeof *m->c);
    }
    if (!m->first || !m->label || !m->c || !mc_encode(o, ctx, &cid, &nc)) return 0;
    m->first[m->n_ex] = m->n_cand;
    m->label[m->n_ex++] = label;
    for (k = 0; k < n_end; k++) {
        char *sp = (char *)malloc(strlen(end[k]) + 2);
        mc_cand *c = &m->c[m->n_cand++];
        if (!sp) return 0;
        sprintf(sp, " %s", end[k]);
        eid = NULL;
        c->ids = mc_encode(o, sp, &eid, &ne) ? (int32_t *)malloc((size_t)(nc + ne) * 4) : NULL;
        free(sp);
        if (!c->ids) return 0;
        memcpy(c->ids, cid, (size_t)nc * 4);
        memcpy(c->ids + nc, eid, (size_t)ne * 4);
        free(eid);
        c->n = nc + ne;
        c->ctx = nc;
    }
    m->first[m->n_ex] = m->n_cand;
    free(cid);
    return 1;
}

static void mc_free(mc_set *m) {
    int i;
    if (!m) return;
    for (i = 0; i < m->n_cand; i++) free(m->c[i].ids);
    free(m->c);
    free(m->first);
    free(m->label);
    free(m);
}

/* --eval-choices FILE: every line an example (blank lines skipped); a line the reader does not
   understand stops the run with its number */
static int load_choices(opts *o) {
    FILE *f;
    char *line = NULL, *ctx, *end[US_CHOICE_MAX];
    size_t cap = 0;
    ssize_t len;
    int ln = 0, n_end, label = 0, k, ok = 1;
    if (!o->choices_path) return GO_ON;
    f = fopen(o->choices_path, "r");
    o->choices = (mc_set *)calloc(1, sizeof *o->choices);
    if (!f || !o->choices) {
        fprintf(stderr, "train: cannot open %s\n", o->choices_path);
        if (f) fclose(f);
        return 2;
    }
    while (ok && (len = getline(&line, &cap, f)) > 0) {
        const char *why;
        ln++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        why = us_choice_parse(line, (size_t)len, &ctx, end, &n_end, &label);
        if (why)
            fprintf(stderr, "train: %s line %d: %s\n", o->choices_path, ln, why);
        else if (!(ok = mc_add(o, o->choices, ctx, end, n_end, label)))
            fprintf(stderr, "train: %s line %d: cannot encode it\n", o->choices_path, ln);
        ok = ok && !why;
        free(ctx); /* US_MALLOC's, which is malloc here */
        for (k = 0; k < n_end; k++) free(end[k]);
    }
    free(line);
    fclose(f);
    if (ok && o->choices->n_ex == 0) {
        fprintf(stderr, "train: %s holds no example\n", o->choices_path);
        ok = 0;
    }
    return ok ? GO_ON : 2;
}

/* Candidate c as row r of the group's batch gin/gtgt [Bg][T]: inputs its tokens, targets the
   next ones scored only over the ending; the context is cut from the left if it does not fit */
static void mc_row(const mc_cand *c, int T, int32_t *in, int32_t *tg) {
    const int cut = c->n - 1 > T ? c->n - 1 - T : 0, L = c->n - 1 - cut;
    int t;
    for (t = 0; t < T; t++) {
        const int a = cut + t; /* predicts token a + 1 */
        in[t] = t < L ? c->ids[a] : 0;
        tg[t] = t < L && a + 1 >= c->ctx ? c->ids[a + 1] : -1;
    }
}

/* After training, --eval-choices: each candidate's mean ending loss, the group's micro-batch of
   candidates a forward, summed over the ranks; the share of examples whose lowest-loss ending is
   the label */
static void rank_eval_choices(rank_state *s) {
    const mc_set *m = s->o->choices;
    us_train_config *tc = &s->tc;
    const int Bg = s->Bg, T = tc->seq, nl = tc->batch * s->Tl;
    double *v = (double *)malloc((size_t)Bg * 2 * sizeof *v), *score, mean;
    float *loss = (float *)malloc((size_t)nl * sizeof *loss);
    int c0, r, j, e, right = 0;
    score = (double *)malloc((size_t)m->n_cand * sizeof *score);
    for (c0 = 0; v && loss && score && c0 < m->n_cand; c0 += Bg) {
        for (r = 0; r < Bg; r++)
            if (c0 + r < m->n_cand)
                mc_row(&m->c[c0 + r], T, s->gin + (size_t)r * T, s->gtgt + (size_t)r * T);
            else
                mc_row(&m->c[0], T, s->gin + (size_t)r * T, s->gtgt + (size_t)r * T);
        rank_take_rows(s);
        if (us_forward_eval_losses(&s->m, s->in, s->tgt, tc->batch, s->Tl, loss) != US_OK) break;
        memset(v, 0, (size_t)Bg * 2 * sizeof *v);
        for (j = 0; j < nl; j++) {
            r = s->drank * tc->batch + j / s->Tl; /* the row in the group's batch */
            v[2 * r] += s->tgt[j] >= 0 ? loss[j] : 0;
            v[2 * r + 1] += s->tgt[j] >= 0;
        }
        if (us_dp_sum(&s->m, v, 2 * Bg) != US_OK) break;
        for (r = 0; r < Bg && c0 + r < m->n_cand; r++)
            score[c0 + r] = v[2 * r + 1] > 0 ? v[2 * r] / v[2 * r + 1] : INFINITY;
    }
    for (j = 0, mean = 0; c0 >= m->n_cand && j < m->n_cand; j++) mean += score[j] / m->n_cand;
    for (e = 0; c0 >= m->n_cand && e < m->n_ex; e++) {
        int best = m->first[e], k;
        for (k = m->first[e] + 1; k < m->first[e + 1]; k++)
            if (score[k] < score[best]) best = k;
        right += best - m->first[e] == m->label[e];
    }
    if (s->rank == 0 && c0 >= m->n_cand)
        printf("multiple choice: acc_norm %.4f (%d of %d) on %s, mean ending loss %.6f\n",
               (double)right / m->n_ex, right, m->n_ex, s->o->choices_path, mean);
    else if (s->rank == 0)
        fprintf(stderr, "train: the multiple-choice evaluation failed: %s\n",
                us_model_error(&s->m));
    free(v);
    free(loss);
    free(score);
}

/* After training: the time taken, the memory, the task's exact match, the sample. */
static void rank_report(rank_state *s, us_result r) {
    opts *o = s->o;
    if (s->rank == 0) printf("trained %d steps in %.1f s\n", s->m.step, now_s() - s->t_start);
    if (s->rank == 0 && s->loud) rank_print_memory(s);
    if (r == US_OK && s->tc.cp > 1 && (!o->data_path || o->sample_n > 0) && s->rank == 0)
        printf(
            "(decoding is not implemented under context parallelism: no exact match or samples)\n");
    if (r == US_OK && !o->data_path && s->tc.cp == 1 && o->exact_n > 0) { /* every rank decodes */
        char buf[2048];
        double acc = 0;
        if (us_task_exact_match(&s->m, &s->eval_task, o->exact_n, &acc, buf, sizeof buf, 5) ==
                US_OK &&
            s->rank == 0)
            printf("sorting exact match on %d held-out problems: %.1f%%\n%s", o->exact_n, 100 * acc,
                   buf);
    }
    if (r == US_OK && o->sample_n > 0 && s->tc.cp == 1) rank_sample(s);
    if (r == US_OK && o->choices) rank_eval_choices(s);
}

/* Multi-process --trace: each process writes its part, then rank 0 joins them into one file. */
static void rank_trace_part(rank_state *s) {
    opts *o = s->o;
    us_trace *mine = &o->traces[s->rank];
    char part[1100], err[256];
    snprintf(part, sizeof part, "%s.rank%d", o->trace_path, s->rank);
    if (us_trace_write_at(part, &mine, 1, 0, err, sizeof err) != US_OK)
        fprintf(stderr, "train: %s\n", err);
    if (s->comm->barrier(s->comm, &s->comm->world) == US_OK && s->rank == 0) {
        if (trace_merge(o->trace_path, o->world))
            printf("trace: %s (%d ranks; open in ui.perfetto.dev)\n", o->trace_path, o->world);
        else
            fprintf(stderr, "train: could not join the trace parts into %s\n", o->trace_path);
    }
}

/* Frees the model and buffers; after an NCCL failure it leaves at once instead. */
static void rank_free(rank_state *s, us_result r) {
    if (s->logf) fclose(s->logf);
#ifdef ULTRASCALE_NCCL
    if (r != US_OK && s->have_nccl) {
        /* a peer died or NCCL failed: kernels of the aborted communicator may still occupy this
           GPU, and freeing device memory would wait for them forever. Leave now; the driver
           reclaims the GPU when the process ends. */
        fprintf(stderr, "train: rank %d: exiting after the communication failure\n", s->rank);
        fflush(stdout);
        fflush(stderr);
        _Exit(1);
    }
#else
    (void)r;
#endif
    free(s->gin);
    free(s->gtgt);
    free(s->in);
    free(s->tgt);
    free(s->cpos);
    us_loader_close(&s->loader);
    if (s->comm) s->comm->trace = NULL;
    us_model_free(&s->m);
}

/* One rank of the run (the only one without --dp). Rank 0 prints and logs. */
static us_result run_rank(us_comm *comm, void *arg) {
    rank_state rs, *s = &rs;
    us_train_config *tc = &rs.tc;
    us_result r;
    rank_begin(s, comm, (opts *)arg);
    if ((r = rank_open_device(s)) != US_OK) return r;
    if ((r = s->dp * tc->pp * tc->cp * tc->tp > 1
                 ? us_model_init_dist(&s->m, &s->mc, tc, s->opsp, s->comm)
                 : us_model_init(&s->m, &s->mc, tc, s->opsp)) != US_OK) {
        fprintf(stderr, "train: rank %d: %s\n", s->rank, us_model_error(&s->m));
    } else {
        if ((r = rank_setup(s)) == US_OK) r = rank_load_checkpoint(s);
        if (r == US_OK && !s->stop) {
            rank_print_model(s);
            rank_print_parts(s);
            r = rank_train(s);
            rank_report(s, r);
            if (s->o->traces && s->o->world > 1 && s->comm) rank_trace_part(s);
        }
        rank_free(s, r);
    }
    rank_close_device(s);
    return r;
}

#ifdef US_CUDA
/* CUDA: one rank in this process, or --nproc N processes (this program again, with RANK,
   WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set), or a rank started by torchrun / mpirun / srun. */
static us_result run_cuda(opts *o, int argc, char **argv) {
    char err[256];
    us_dist_env env;
    (void)argc;
    if (o->nproc > 1 && !getenv("RANK")) {
        int rc = us_launch_procs(o->nproc, argv, 10.0, err, sizeof err);
        if (rc) fprintf(stderr, "train: %s\n", err);
        return rc ? US_ERR_BACKEND : US_OK;
    }
    if (us_dist_env_read(&env, err, sizeof err) != US_OK) {
        fprintf(stderr, "train: %s\n", err);
        return US_ERR_INVALID;
    }
    o->world = env.world_size;
    o->rank = env.rank;
    if (!o->gpu_set) o->gpu = env.local_rank;
    if (env.world_size > 1) {
#ifdef ULTRASCALE_NCCL
        if (o->tc.dp * o->tc.pp * o->tc.cp * o->tc.tp != env.world_size) {
            fprintf(
                stderr,
                "train: the launcher started %d processes but --dp %d x --cp %d x --tp %d = %d\n",
                env.world_size, o->tc.dp, o->tc.cp, o->tc.tp,
                o->tc.dp * o->tc.pp * o->tc.cp * o->tc.tp);
            return US_ERR_INVALID;
        }
#else
        fprintf(stderr,
                "train: %d processes but this build has no NCCL (compile with -DULTRASCALE_NCCL)\n",
                env.world_size);
        return US_ERR_INVALID;
#endif
    } else if (o->tc.dp * o->tc.pp * o->tc.cp * o->tc.tp > 1) {
        fprintf(stderr,
                "train: --dp %d on CUDA needs one process per GPU: add --nproc %d (or start it "
                "with torchrun)\n",
                o->tc.dp, o->tc.dp);
        return US_ERR_INVALID;
    }
    return run_rank(NULL, o);
}
#else
static us_result run_cuda(opts *o, int argc, char **argv) {
    (void)o;
    (void)argc;
    (void)argv;
    return US_ERR_INVALID;
}
#endif

/* The command line as main reads it, shared by the parse_* and check_* steps below. */
typedef struct cli {
    us_model_config mc;
    us_train_config tc;
    opts o;
    int vocab, dim, ffn;    /* --vocab, --dim, --ffn, put into mc once every flag is read */
    const char *accum_flag; /* --grad-accum or --micro-batches, whichever came */
    float clip;
} cli;

/* Zero means default, except the few defaults the program itself keeps. */
static void cli_init(cli *c) {
    memset(c, 0, sizeof *c);
    c->clip = 1.0f;
    c->o.eval_every = 100;
    c->o.exact_n = 200;
    c->o.temperature = 0.8f;
    c->o.keep = 3;
    c->o.val_frac = -1;
#ifdef US_CUDA
    c->o.use_cuda = 1;
#endif
}

/* --help and the switches (takes = 0): matched before the missing-value check. */
static int parse_switch(cli *c, const char *f, const char *v, int *ok, int *takes) {
    *takes = 0;
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
        usage(stdout);
        return 0;
    } else if (!strcmp(f, "--tied"))
        c->mc.tie_embeddings = 1;
    else if (!strcmp(f, "--dense-emb-grad"))
        c->tc.dense_emb_grad = 1;
    else if (!strcmp(f, "--tp-no-overlap"))
        c->tc.tp_no_overlap = 1;
    else if (!strcmp(f, "--quiet"))
        c->o.quiet = 1;
    else if (!strcmp(f, "--sp"))
        c->tc.sp = 1;
    else if (!strcmp(f, "--pp-clock"))
        c->tc.pp_clock = 1;
    else if (!strcmp(f, "--pp-channels"))
        c->tc.pp_clock = -1;
    else if (!strcmp(f, "--nccl-semantics"))
        c->o.nccl_sem = 1;
    else if (!strcmp(f, "--gemm-tune"))
        c->o.gemm_tune = 1;
    else if (!strcmp(f, "--moe-force-balance"))
        c->tc.moe_force_balance = 1;
    else if (!strcmp(f, "--fp8-pow2"))
        c->tc.fp8_pow2 = 1;
    else if (!strcmp(f, "--fp8-experts"))
        c->tc.fp8_experts = 1;
    else if (!strcmp(f, "--fp8-no-weight-cache"))
        c->tc.fp8_no_wcache = 1;
    else if (!strcmp(f, "--shared-expert"))
        c->mc.moe_shared = 1;
    else {
        *takes = 1;
        return NOT_MINE;
    }
    (void)v;
    (void)ok;
    return GO_ON;
}

/* The model's shape: --layers, --dim, --heads and the rest up to --rope-theta. */
static int parse_model(cli *c, const char *f, const char *v, int *ok) {
    us_model_config *mc = &c->mc;
    if (!strcmp(f, "--layers"))
        *ok = parse_int(v, 1, 1 << 16, &mc->n_layers);
    else if (!strcmp(f, "--dim"))
        *ok = parse_int(v, 2, 1 << 20, &c->dim);
    else if (!strcmp(f, "--heads"))
        *ok = parse_int(v, 1, 1 << 16, &mc->n_heads);
    else if (!strcmp(f, "--kv-heads"))
        *ok = parse_int(v, 1, 1 << 16, &mc->n_kv_heads);
    else if (!strcmp(f, "--ffn"))
        *ok = parse_int(v, 1, 1 << 24, &c->ffn);
    else if (!strcmp(f, "--vocab"))
        *ok = parse_int(v, 2, 1 << 30, &c->vocab);
    else if (!strcmp(f, "--rope-theta"))
        *ok = parse_float(v, 1e-3f, 1e12f, &mc->rope_theta);
    else
        return NOT_MINE;
    return GO_ON;
}

/* The mixture of experts: --experts, --top-k and the --moe flags. */
static int parse_moe(cli *c, const char *f, const char *v, int *ok) {
    us_model_config *mc = &c->mc;
    if (!strcmp(f, "--experts"))
        *ok = parse_int(v, 0, 1 << 20, &mc->moe_experts);
    else if (!strcmp(f, "--top-k"))
        *ok = parse_int(v, 1, 1 << 20, &mc->moe_top_k);
    else if (!strcmp(f, "--moe-ffn")) {
        int x = 0; /* 0: a bad value exits (below) before x is used; quiets nvcc's host gcc */
        *ok = parse_int(v, 1, 1 << 24, &x);
        mc->moe_ffn_dim = x;
    } else if (!strcmp(f, "--moe-bias-rate")) {
        *ok = parse_float(v, 0, 1e3f, &mc->moe_bias_rate);
        if (*ok && mc->moe_bias_rate == 0)
            return bad("--moe-bias-rate must be positive (use --moe-balance none to turn "
                       "balancing off), got",
                       v);
    } else if (!strcmp(f, "--moe-aux-coef")) {
        *ok = parse_float(v, 0, 1e3f, &mc->moe_aux_coef);
        if (*ok && mc->moe_aux_coef == 0)
            return bad("--moe-aux-coef must be positive (use --moe-balance none to turn "
                       "balancing off), got",
                       v);
    } else if (!strcmp(f, "--capacity-factor"))
        *ok = parse_float(v, 0, 1e6f, &mc->moe_capacity);
    else if (!strcmp(f, "--moe-groups"))
        *ok = parse_int(v, 1, 64, &mc->moe_groups);
    else if (!strcmp(f, "--moe-top-groups"))
        *ok = parse_int(v, 1, 64, &mc->moe_top_groups);
    else if (!strcmp(f, "--moe-first-dense"))
        *ok = parse_int(v, 0, 1 << 16, &mc->moe_first_dense);
    else if (!strcmp(f, "--moe-every"))
        *ok = parse_int(v, 1, 1 << 16, &mc->moe_every);
    else if (!strcmp(f, "--moe-gate")) {
        if (!strcmp(v, "softmax"))
            mc->moe_gate = US_MOE_SOFTMAX;
        else if (!strcmp(v, "sigmoid"))
            mc->moe_gate = US_MOE_SIGMOID;
        else
            return bad("--moe-gate must be softmax or sigmoid, got", v);
    } else if (!strcmp(f, "--moe-balance")) {
        if (!strcmp(v, "bias"))
            mc->moe_balance = US_MOE_BALANCE_BIAS;
        else if (!strcmp(v, "aux"))
            mc->moe_balance = US_MOE_BALANCE_AUX;
        else if (!strcmp(v, "none"))
            mc->moe_balance = US_MOE_BALANCE_NONE;
        else
            return bad("--moe-balance must be bias, aux or none, got", v);
    } else
        return NOT_MINE;
    return GO_ON;
}

/* --grad-accum and --micro-batches: one setting, two names, refused when they disagree. */
static int parse_accum(cli *c, const char *f, const char *v, int *ok) {
    int prev = c->tc.grad_accum;
    *ok = parse_int(v, 1, 1 << 20, &c->tc.grad_accum);
    if (*ok && c->accum_flag && strcmp(c->accum_flag, f) && prev != c->tc.grad_accum) {
        fprintf(stderr,
                "train: %s %d and %s %d disagree: both set the micro-batches per step; give one\n",
                c->accum_flag, prev, f, c->tc.grad_accum);
        return 2;
    }
    c->accum_flag = !strcmp(f, "--grad-accum") ? "--grad-accum" : "--micro-batches";
    return GO_ON;
}

/* The named choices of training: --schedule, --precision, --recompute. */
static int parse_choice(cli *c, const char *f, const char *v) {
    us_train_config *tc = &c->tc;
    if (!strcmp(f, "--schedule")) {
        if (!strcmp(v, "cosine"))
            tc->schedule = US_LR_COSINE;
        else if (!strcmp(v, "constant"))
            tc->schedule = US_LR_CONSTANT;
        else
            return bad("--schedule must be cosine or constant, got", v);
    } else if (!strcmp(f, "--precision")) {
        if (!strcmp(v, "fp32"))
            tc->precision = US_PRECISION_FP32;
        else if (!strcmp(v, "bf16"))
            tc->precision = US_PRECISION_BF16;
        else if (!strcmp(v, "fp16"))
            tc->precision = US_PRECISION_FP16;
        else if (!strcmp(v, "fp8"))
            tc->precision = US_PRECISION_FP8;
        else if (!strcmp(v, "fp8-tensor"))
            tc->precision = US_PRECISION_FP8_TENSOR;
        else
            return bad("--precision must be fp32, bf16, fp16, fp8 or fp8-tensor, got", v);
    } else if (!strcmp(f, "--recompute")) {
        if (!strcmp(v, "none"))
            tc->recompute = US_RECOMPUTE_NONE;
        else if (!strcmp(v, "selective"))
            tc->recompute = US_RECOMPUTE_SELECTIVE;
        else if (!strcmp(v, "full"))
            tc->recompute = US_RECOMPUTE_FULL;
        else
            return bad("--recompute must be none, selective or full, got", v);
    } else
        return NOT_MINE;
    return GO_ON;
}

/* Training: the batch, the optimizer and its schedule, precision, recomputation. */
static int parse_training(cli *c, const char *f, const char *v, int *ok) {
    us_train_config *tc = &c->tc;
    if (!strcmp(f, "--seq"))
        *ok = parse_int(v, 1, 1 << 24, &tc->seq);
    else if (!strcmp(f, "--fp8-min-dim"))
        *ok = parse_int(v, 1, 1 << 20, &tc->fp8_min_dim);
    else if (!strcmp(f, "--loss-chunk"))
        *ok = parse_int(v, -1, 1 << 30, &tc->loss_chunk);
    else if (!strcmp(f, "--batch"))
        *ok = parse_int(v, 1, 1 << 24, &tc->batch);
    else if (!strcmp(f, "--grad-accum") || !strcmp(f, "--micro-batches"))
        return parse_accum(c, f, v, ok);
    else if (!strcmp(f, "--steps"))
        *ok = parse_int(v, 1, 1 << 30, &tc->steps);
    else if (!strcmp(f, "--lr"))
        *ok = parse_float(v, 1e-12f, 1e3f, &tc->lr);
    else if (!strcmp(f, "--warmup"))
        *ok = parse_int(v, 0, 1 << 30, &tc->warmup);
    else if (!strcmp(f, "--min-lr-frac"))
        *ok = parse_float(v, 0, 1, &tc->min_lr_frac);
    else if (!strcmp(f, "--wd")) {
        *ok = parse_float(v, 0, 1e3f, &tc->weight_decay);
        if (*ok && tc->weight_decay == 0) tc->weight_decay = -1;
    } else if (!strcmp(f, "--clip"))
        *ok = parse_float(v, 0, 1e30f, &c->clip);
    else if (!strcmp(f, "--seed")) {
        int s = 0; /* 0: a bad value exits (below) before s is used; quiets nvcc's host gcc */
        *ok = parse_int(v, 1, 0x7fffffff, &s);
        tc->seed = (uint64_t)s;
    } else if (!strcmp(f, "--threads"))
        *ok = parse_int(v, 1, 4096, &tc->threads);
    else if (!strcmp(f, "--loss-scale"))
        *ok = parse_float(v, 0, 3e38f, &tc->loss_scale);
    else if (!strcmp(f, "--loss-scale-window"))
        *ok = parse_int(v, 1, 1 << 30, &tc->loss_scale_window);
    else
        return parse_choice(c, f, v);
    return GO_ON;
}

/* --pp-layers: a comma-separated count per stage. */
static int parse_pp_layers(cli *c, const char *v) {
    static int counts[1024];
    int k = 0;
    const char *p = v;
    for (;;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 1 << 20 || k == 1024)
            return bad("--pp-layers takes positive layer counts separated by commas, got", v);
        counts[k++] = (int)x;
        if (*end == 0) break;
        if (*end != ',')
            return bad("--pp-layers takes positive layer counts separated by commas, got", v);
        p = end + 1;
    }
    c->tc.pp_layers = counts;
    c->o.pp_layers_n = k;
    return GO_ON;
}

/* Named choices: --pp-schedule, --cp-mode, --grad-reduce-dtype. */
static int parse_schedule(cli *c, const char *f, const char *v) {
    us_train_config *tc = &c->tc;
    if (!strcmp(f, "--pp-schedule")) {
        if (!strcmp(v, "afab"))
            tc->pp_schedule = US_PP_AFAB;
        else if (!strcmp(v, "1f1b"))
            tc->pp_schedule = US_PP_1F1B;
        else if (!strcmp(v, "zb1"))
            tc->pp_schedule = US_PP_ZB1;
        else if (!strcmp(v, "interleaved"))
            tc->pp_schedule = US_PP_INTERLEAVED;
        else if (!strcmp(v, "interleaved-bf"))
            tc->pp_schedule = US_PP_INTERLEAVED_BF;
        else if (!strcmp(v, "zbv"))
            tc->pp_schedule = US_PP_ZBV;
        else if (!strcmp(v, "dualpipev"))
            tc->pp_schedule = US_PP_DUALPIPEV;
        else if (!strcmp(v, "dualpipe"))
            tc->pp_schedule = US_PP_DUALPIPE;
        else
            return bad("--pp-schedule must be afab, 1f1b, interleaved, interleaved-bf, zb1, "
                       "zbv, dualpipev or dualpipe, got",
                       v);
    } else if (!strcmp(f, "--grad-reduce-dtype")) {
        if (!strcmp(v, "fp32"))
            tc->grad_reduce_dtype = US_F32;
        else if (!strcmp(v, "bf16"))
            tc->grad_reduce_dtype = US_BF16;
        else
            return bad("--grad-reduce-dtype must be fp32 or bf16, got", v);
    } else if (!strcmp(f, "--cp-mode")) {
        if (!strcmp(v, "ring"))
            tc->cp_mode = US_CP_RING;
        else if (!strcmp(v, "zigzag"))
            tc->cp_mode = US_CP_ZIGZAG;
        else if (!strcmp(v, "allgather"))
            tc->cp_mode = US_CP_ALLGATHER;
        else
            return bad("--cp-mode must be ring, zigzag or allgather, got", v);
    } else
        return NOT_MINE;
    return GO_ON;
}

/* --device: cpu, or cuda where this build has the CUDA backend. */
static int parse_device(cli *c, const char *v) {
    if (!strcmp(v, "cpu"))
        c->o.use_cuda = 0;
    else if (!strcmp(v, "cuda")) {
#ifdef US_CUDA
        c->o.use_cuda = 1;
#else
        fprintf(stderr, "train: this build has no CUDA backend; build it with make train-cuda\n");
        return 2;
#endif
    } else
        return bad("--device must be cpu or cuda, got", v);
    return GO_ON;
}

/* Parallelism: the mesh (dp, tp, cp, ep, pp), its schedules, ZeRO, the device and processes. */
static int parse_parallel(cli *c, const char *f, const char *v, int *ok) {
    us_train_config *tc = &c->tc;
    if (!strcmp(f, "--gpu")) {
        *ok = parse_int(v, 0, 1023, &c->o.gpu);
        c->o.gpu_set = 1;
    } else if (!strcmp(f, "--overlap-sms"))
        *ok = parse_int(v, 0, 4096, &tc->overlap_sms);
    else if (!strcmp(f, "--dp"))
        *ok = parse_int(v, 1, 4096, &tc->dp);
    else if (!strcmp(f, "--tp"))
        *ok = parse_int(v, 1, 4096, &tc->tp);
    else if (!strcmp(f, "--cp"))
        *ok = parse_int(v, 1, 4096, &tc->cp);
    else if (!strcmp(f, "--ep"))
        *ok = parse_int(v, 1, 4096, &tc->ep);
    else if (!strcmp(f, "--pp"))
        *ok = parse_int(v, 1, 4096, &tc->pp);
    else if (!strcmp(f, "--pp-chunks"))
        *ok = parse_int(v, 1, 16, &tc->pp_chunks);
    else if (!strcmp(f, "--pp-layers"))
        return parse_pp_layers(c, v);
    else if (!strcmp(f, "--zero"))
        *ok = parse_int(v, 0, 3, &tc->zero);
    else if (!strcmp(f, "--bucket-mb"))
        *ok = parse_float(v, 1e-6f, 1e6f, &tc->bucket_mb);
    else if (!strcmp(f, "--nproc"))
        *ok = parse_int(v, 1, 1024, &c->o.nproc);
    else if (!strcmp(f, "--comm-timeout"))
        *ok = parse_float(v, 1e-3f, 1e7f, &c->o.comm_timeout);
    else if (!strcmp(f, "--device"))
        return parse_device(c, v);
    else
        return parse_schedule(c, f, v);
    return GO_ON;
}

/* Data and output: --data, checkpoints, the log, evaluation, sampling, trace and MFU peak. */
static int parse_output(cli *c, const char *f, const char *v, int *ok) {
    opts *o = &c->o;
    if (!strcmp(f, "--trace"))
        o->trace_path = v;
    else if (!strcmp(f, "--data"))
        o->data_path = v;
    else if (!strcmp(f, "--val-data"))
        o->val_path = v;
    else if (!strcmp(f, "--tokenizer"))
        o->tok_path = v;
    else if (!strcmp(f, "--save"))
        o->save_dir = v;
    else if (!strcmp(f, "--gemm-tune-file"))
        o->gemm_tune_file = v;
    else if (!strcmp(f, "--save-every"))
        *ok = parse_int(v, 1, 1 << 30, &o->save_every);
    else if (!strcmp(f, "--keep"))
        *ok = parse_int(v, 0, 1 << 20, &o->keep);
    else if (!strcmp(f, "--resume"))
        o->resume_dir = v;
    else if (!strcmp(f, "--init-from"))
        o->init_dir = v;
    else if (!strcmp(f, "--log"))
        o->log_path = v;
    else if (!strcmp(f, "--eval-every"))
        *ok = parse_int(v, 0, 1 << 30, &o->eval_every);
    else if (!strcmp(f, "--eval-tokens"))
        *ok = parse_int(v, 1, 1 << 30, &o->eval_tokens);
    else if (!strcmp(f, "--eval-choices"))
        o->choices_path = v;
    else if (!strcmp(f, "--val-frac"))
        *ok = parse_float(v, 0.0f, 0.99f, &o->val_frac);
    else if (!strcmp(f, "--exact-match"))
        *ok = parse_int(v, 0, 1 << 20, &o->exact_n);
    else if (!strcmp(f, "--sample"))
        *ok = parse_int(v, 0, 1 << 24, &o->sample_n);
    else if (!strcmp(f, "--temperature"))
        *ok = parse_float(v, 0, 100, &o->temperature);
    else if (!strcmp(f, "--sample-top-k"))
        *ok = parse_int(v, 0, 1 << 30, &o->top_k);
    else if (!strcmp(f, "--peak-tflops"))
        *ok = parse_float(v, 1e-6f, 1e9f, &o->peak_tflops);
    else
        return NOT_MINE;
    return GO_ON;
}

/* A flag that takes a value, offered to each group in turn. */
static int parse_value_flag(cli *c, const char *f, const char *v, int *ok) {
    int rc = parse_model(c, f, v, ok);
    if (rc == NOT_MINE) rc = parse_moe(c, f, v, ok);
    if (rc == NOT_MINE) rc = parse_training(c, f, v, ok);
    if (rc == NOT_MINE) rc = parse_parallel(c, f, v, ok);
    if (rc == NOT_MINE) rc = parse_output(c, f, v, ok);
    if (rc == NOT_MINE) return bad("unknown flag", f);
    return rc;
}

/* Every argument: --flag value or --flag=value; the first mistake ends the program (exit 2). */
static int parse_args(cli *c, int argc, char **argv) {
    int i;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL, *eq = strchr(f, '=');
        int ok = 1, takes = 1, rc;
        char name[64];
        if (!strncmp(f, "--", 2) && eq) { /* --flag=value */
            if ((size_t)(eq - f) >= sizeof name) return bad("unknown flag", f);
            memcpy(name, f, (size_t)(eq - f));
            name[eq - f] = 0;
            f = name;
            v = eq + 1;
        }
        rc = parse_switch(c, f, v, &ok, &takes);
        if (rc == NOT_MINE) {
            if (strncmp(f, "--", 2)) return bad("unexpected argument", f);
            if (!v) return bad(known_flag(f) ? "missing value for" : "unknown flag", f);
            rc = parse_value_flag(c, f, v, &ok);
        }
        if (rc != GO_ON) return rc;
        if (!ok) {
            char msg[96];
            snprintf(msg, sizeof msg, "bad value for %s:", f);
            return bad(msg, v);
        }
        if (f == name && !takes) {
            fprintf(stderr, "train: %s takes no value, got %s\n", name, argv[i]);
            return 2;
        }
        if (f != name) i += takes;
    }
    return GO_ON;
}

/* Flags that need one another; the model's shape from --resume/--init-from's config.json. */
static int check_flags(cli *c) {
    us_model_config *mc = &c->mc;
    opts *o = &c->o;
    char err[256];
    if (o->choices_path && c->tc.pp > 1) {
        fprintf(stderr, "train: --eval-choices scores per-position losses, which pipeline "
                        "parallelism keeps on its last stage: drop --pp for it\n");
        return 2;
    }
    mc->vocab = c->vocab;
    mc->dim = c->dim;
    mc->ffn_dim = c->ffn;
    if (!mc->moe_experts &&
        (mc->moe_top_k || mc->moe_shared || mc->moe_ffn_dim || mc->moe_gate || mc->moe_balance ||
         mc->moe_bias_rate != 0 || mc->moe_aux_coef != 0 || mc->moe_capacity != 0 ||
         mc->moe_groups || mc->moe_top_groups || mc->moe_first_dense || mc->moe_every)) {
        fprintf(stderr, "train: --top-k and the other --moe flags configure a mixture of experts "
                        "and need --experts E (sampling's top-k is --sample-top-k)\n");
        return 2;
    }
    c->tc.grad_clip = c->clip > 0 ? c->clip : -1.0f;
    if (o->save_every && !o->save_dir) {
        fprintf(stderr, "train: --save-every needs --save DIR\n");
        return 2;
    }
    if (o->resume_dir && o->init_dir) {
        fprintf(stderr, "train: --resume continues a run and --init-from starts a new one from "
                        "weights: give one of them\n");
        return 2;
    }
    if (!o->resume_dir && !o->init_dir) return GO_ON;
    if (o->resume_dir) {
        if (us_ckpt_latest(o->resume_dir, o->ckpt_from, sizeof o->ckpt_from, err, sizeof err) !=
            US_OK) {
            fprintf(stderr, "train: --resume: %s\n", err);
            return 2;
        }
    } else
        snprintf(o->ckpt_from, sizeof o->ckpt_from, "%s", o->init_dir);
    if (us_ckpt_read_config(o->ckpt_from, mc, err, sizeof err) != US_OK) {
        fprintf(stderr, "train: %s\n", err);
        return 2;
    }
    return GO_ON;
}

/* --save's directory and --trace's file writable: found now, not after hours of training. */
static int check_outputs(const opts *o) {
    struct stat sb;
    if (o->save_dir && mkdir(o->save_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "train: cannot create --save directory %s: %s\n", o->save_dir,
                strerror(errno));
        return 2;
    }
    if (o->save_dir) {
        if (stat(o->save_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "train: --save %s exists and is not a directory\n", o->save_dir);
            return 2;
        }
        if (access(o->save_dir, W_OK | X_OK) != 0) {
            fprintf(stderr, "train: cannot write into --save directory %s: %s\n", o->save_dir,
                    strerror(errno));
            return 2;
        }
    }
    if (o->trace_path && !writable_file(o->trace_path, "--trace")) return 2;
    return GO_ON;
}

/* Without --data, the built-in task: a small model, sequences of whole problems. */
static int task_defaults(cli *c) {
    us_train_config *tc = &c->tc;
    if (c->o.data_path) return GO_ON;
    if (!tc->seq) tc->seq = 4 * US_TASK_LINE - 1;
    if (!tc->batch) tc->batch = 16;
    if (!tc->steps) tc->steps = 1000;
    if (!c->mc.n_layers) c->mc.n_layers = 2;
    if (!c->mc.dim) c->mc.dim = 64;
    if (tc->lr == 0) tc->lr = 1e-2f;
    if (!tc->warmup) tc->warmup = 20;
    if (tc->seq < US_TASK_LINE - 1) {
        fprintf(stderr, "train: the built-in task needs --seq of at least %d\n", US_TASK_LINE - 1);
        return 2;
    }
    return GO_ON;
}

/* --nproc: each process is one rank of the dp x pp x cp x tp mesh; dp follows from it. */
static int check_nproc(cli *c) {
    us_train_config *tc = &c->tc;
    int nproc = c->o.nproc, tpn, cpn;
    if (nproc && !c->o.use_cuda) {
        fprintf(stderr,
                "train: --nproc starts one process per GPU; on the CPU use --dp N (threads)\n");
        return 2;
    }
    if ((c->o.gemm_tune || c->o.gemm_tune_file) && !c->o.use_cuda) {
        fprintf(stderr, "train: %s times cuBLASLt's algorithms: it needs --device cuda\n",
                c->o.gemm_tune_file ? "--gemm-tune-file" : "--gemm-tune");
        return 2;
    }
    if (!nproc) return GO_ON;
    tpn = (tc->tp ? tc->tp : 1) * (tc->pp ? tc->pp : 1);
    cpn = tc->cp ? tc->cp : 1;
    if (nproc % (tpn * cpn)) {
        fprintf(stderr, "train: --nproc %d is not a multiple of --cp %d x --tp %d\n", nproc, cpn,
                tpn);
        return 2;
    }
    if (tc->dp && tc->dp * tpn * cpn != nproc) {
        fprintf(stderr, "train: --dp %d x --cp %d x --tp %d does not match --nproc %d\n", tc->dp,
                cpn, tpn, nproc);
        return 2;
    }
    tc->dp = nproc / (tpn * cpn);
    return GO_ON;
}

/* The mesh: --nproc, --pp-layers' count per stage, the library's own checks, batch over dp. */
static int check_mesh(cli *c) {
    us_train_config *tc = &c->tc;
    char err[256];
    int rc = check_nproc(c);
    if (rc != GO_ON) return rc;
    /* --pp-layers: one count per stage, pp x chunks (the chunks' default follows the schedule;
       DualPipe's pp stages are each held twice) */
    if (tc->pp_layers) {
        int v = tc->pp_schedule == US_PP_DUALPIPE ? 1
                : tc->pp_chunks                   ? tc->pp_chunks
                : tc->pp_schedule == US_PP_INTERLEAVED || tc->pp_schedule == US_PP_INTERLEAVED_BF
                    ? 2
                    : 1;
        if (c->o.pp_layers_n != tc->pp * v) {
            fprintf(stderr,
                    "train: --pp-layers gives %d counts but there are pp %d x %d chunks = %d "
                    "pipeline stages\n",
                    c->o.pp_layers_n, tc->pp, v, tc->pp * v);
            return 2;
        }
    }
    if (us_config_validate(&c->mc, tc, err, sizeof err) != US_OK) {
        fprintf(stderr, "train: %s\n", err);
        return 2;
    }
    if (tc->batch % tc->dp) {
        fprintf(stderr,
                "train: --batch %d is not divisible by --dp %d (each rank takes batch/dp sequences "
                "of every micro-batch)\n",
                tc->batch, tc->dp);
        return 2;
    }
    return GO_ON;
}

/* The held-out tail of --data (--val-frac, default 0.1): o->val views the file's last tokens. */
static int split_held_out(opts *o) {
    int seq = o->tc.seq;
    int64_t nv = (int64_t)((double)o->data.n * (o->val_frac < 0 ? 0.1 : o->val_frac));
    if (nv > 0 && (nv < (int64_t)seq + 1 || o->data.n - nv < (int64_t)seq + 1)) {
        if (o->val_frac >= 0) {
            fprintf(stderr,
                    "train: --val-frac %g of %lld tokens leaves %lld held out and %lld to "
                    "train on; each needs seq+1 = %d\n",
                    o->val_frac, (long long)o->data.n, (long long)nv, (long long)(o->data.n - nv),
                    seq + 1);
            us_data_free(&o->data);
            return 2;
        }
        nv = 0; /* the default on a file too small to split: evaluate on the training tokens */
    }
    memset(&o->val, 0, sizeof o->val);
    if (nv > 0) {
        o->val.tokens = o->data.tokens + (o->data.n - nv);
        o->val.n = nv;
        o->val.max_token = o->data.max_token;
        o->data.n -= nv;
    }
    return GO_ON;
}

/* --tokenizer: loaded, and the model's vocabulary (--vocab, or config.json's) holds its ids;
   without either, the vocabulary is the tokenizer's. */
static int load_tokenizer(cli *c) {
    opts *o = &c->o;
    if (!o->tok_path) return GO_ON;
    if (!o->data_path) {
        fprintf(stderr, "train: --tokenizer needs --data (the built-in task has its own tokens)\n");
        return 2;
    }
    if (us_tok_load(&o->tok, o->tok_path) != US_OK) {
        fprintf(stderr, "train: %s\n", o->tok.err);
        return 2;
    }
    if (!c->mc.vocab) c->mc.vocab = o->tok.n_vocab;
    if (c->mc.vocab < o->tok.n_vocab) {
        fprintf(stderr, "train: %s has %lld token ids but the model's vocabulary is %lld\n",
                o->tok_path, (long long)o->tok.n_vocab, (long long)c->mc.vocab);
        us_tok_free(&o->tok);
        return 2;
    }
    return GO_ON;
}

/* --data's text (read as bytes) encoded with --tokenizer; a token shard stays as it is. */
static int encode_data(opts *o) {
    us_data *d = &o->data;
    int32_t *ids;
    char *text;
    size_t n_ids, i;
    int32_t magic = 0;
    FILE *f = fopen(o->data_path, "rb");
    if (f && fread(&magic, 4, 1, f) == 1 && (magic == 20240520 || magic == 20240801)) magic = -1;
    if (f) fclose(f);
    if (!o->tok_path || magic == -1) return GO_ON;
    text = (char *)malloc((size_t)d->n + 1);
    ids = (int32_t *)malloc(((size_t)d->n * 2 + 1) * 4);
    if (!text || !ids) {
        fprintf(stderr, "train: out of memory for %s's tokens\n", o->data_path);
        return 1;
    }
    for (i = 0; i < (size_t)d->n; i++) text[i] = (char)d->tokens[i];
    if (us_tok_encode(&o->tok, text, (size_t)d->n, ids, (size_t)d->n * 2 + 1, &n_ids) != US_OK) {
        fprintf(stderr, "train: %s: %s\n", o->data_path, o->tok.err);
        return 1;
    }
    free(text);
    free(d->tokens);
    d->tokens = ids;
    d->n = (int64_t)n_ids;
    d->max_token = 0;
    for (i = 0; i < n_ids; i++)
        if (ids[i] > d->max_token) d->max_token = ids[i];
    if (!o->quiet) printf("tokenizer: %s: %lld tokens\n", o->tok_path, (long long)d->n);
    return GO_ON;
}

/* A validation shard by its name: "val" as a word of the file name, as llm.c names them
   (fineweb_val_000000.bin, tinyshakespeare_val.bin), or "validation". */
static int is_val_name(const char *path) {
    const char *b = strrchr(path, '/'), *p;
    b = b ? b + 1 : path;
    for (p = strstr(b, "val"); p; p = strstr(p + 1, "val")) {
        const int word_start = p == b || !isalnum((unsigned char)p[-1]);
        if (word_start && (!isalpha((unsigned char)p[3]) || !strncmp(p, "validation", 10)))
            return 1;
    }
    return 0;
}

/* --data's files: one that is not a shard is raw text (o->shards stays 0); else the training and
   validation shards: --val-data's, or those named *val* (when others remain to train on). */
static int list_shards(opts *o) {
    char err[512], **all, **tmp;
    int n, i, nv = 0, k = 0;
    if (us_data_expand(o->data_path, &all, &n, err, sizeof err) != US_OK) {
        fprintf(stderr, "train: --data: %s\n", err);
        return 2;
    }
    if (n == 1 && !us_data_is_shard(all[0])) {
        if (!o->val_path) {
            free(all);
            return GO_ON;
        }
        fprintf(stderr,
                "train: --val-data names validation shards, but --data %s is not an llm.c token "
                "shard (or cannot be read)\n",
                all[0]);
        free(all);
        return 2;
    }
    o->shards = 1;
    o->train_paths = all;
    o->n_train_paths = n;
    if (o->val_path) {
        if (us_data_expand(o->val_path, &o->val_paths, &o->n_val_paths, err, sizeof err) == US_OK)
            return GO_ON;
        fprintf(stderr, "train: --val-data: %s\n", err);
        return 2;
    }
    for (i = 0; i < n; i++) nv += is_val_name(all[i]);
    if (nv == 0 || nv == n) return GO_ON;
    if (!(tmp = (char **)malloc(sizeof(char *) * (size_t)n))) return 1;
    for (i = 0; i < n; i++) /* the training shards first, then the validation ones */
        if (!is_val_name(all[i])) tmp[k++] = all[i];
    for (i = 0; i < n; i++)
        if (is_val_name(all[i])) tmp[k++] = all[i];
    memcpy(all, tmp, sizeof(char *) * (size_t)n);
    free(tmp);
    o->n_train_paths = n - nv;
    o->val_paths = all + (n - nv);
    o->n_val_paths = nv;
    return GO_ON;
}

/* The evaluations' tokens from shards: the first of the validation shards, else of the held-out
   tail, else of the training tokens (as many as --eval-tokens + 1 or EVAL_TOKENS_MAX + 1). */
static int read_eval_tokens(opts *o, us_loader *train) {
    us_loader v, *l = train;
    int64_t cap = (int64_t)(o->eval_tokens ? o->eval_tokens : EVAL_TOKENS_MAX) + 1, first = 0, n;
    us_loader_config vc = o->lcfg;
    vc.hold_out = 0;
    memset(&v, 0, sizeof v);
    if (o->n_val_paths) {
        if (us_loader_open(&v, (const char *const *)o->val_paths, o->n_val_paths, &vc) != US_OK) {
            fprintf(stderr, "train: the validation shards: %s\n", v.err);
            return 2;
        }
        l = &v;
    } else if (train->n_train < train->n_tokens) {
        first = train->n_train;
    }
    n = l->n_tokens - first < cap ? l->n_tokens - first : cap;
    memset(&o->val, 0, sizeof o->val);
    if (!(o->val.tokens = (int32_t *)malloc((size_t)n * 4))) return 1;
    if (us_loader_read(l, first, n, o->val.tokens) != US_OK) {
        fprintf(stderr, "train: %s (set --vocab)\n", l->err);
        us_loader_close(&v);
        return 2;
    }
    o->val.n = n;
    us_loader_close(&v);
    return GO_ON;
}

/* --data shards: opened once here to check them and to read the evaluations' tokens (each rank
   opens its own loader); the held-out tail as for text (--val-frac) unless validation shards. */
static int load_shards(opts *o) {
    us_loader l;
    us_loader_config *c = &o->lcfg;
    const int seq = o->tc.seq;
    const double f = o->val_frac < 0 ? 0.1 : o->val_frac;
    int64_t nv;
    int rc;
    if (o->n_val_paths && o->val_frac >= 0) {
        fprintf(stderr, "train: --val-frac holds out the tail of the training shards, but there "
                        "are validation shards (--val-data, or names with val): give one\n");
        return 2;
    }
    memset(c, 0, sizeof *c);
    c->T = seq;
    c->seed = o->tc.seed;
    c->vocab = o->mc.vocab;
    if (us_loader_open(&l, (const char *const *)o->train_paths, o->n_train_paths, c) != US_OK) {
        fprintf(stderr, "train: %s\n", l.err);
        return strstr(l.err, "no shard has a window") ? 2 : 1;
    }
    nv = o->n_val_paths ? 0 : (int64_t)((double)l.n_tokens * f);
    if (nv > 0 && nv >= seq + 1) { /* the tail, if the rest still has a window */
        us_loader_close(&l);
        c->hold_out = f;
        if (us_loader_open(&l, (const char *const *)o->train_paths, o->n_train_paths, c) != US_OK) {
            if (o->val_frac >= 0) {
                fprintf(stderr, "train: --val-frac %g: %s\n", o->val_frac, l.err);
                return 2;
            }
            c->hold_out = 0; /* the default on shards too small to split */
            us_loader_open(&l, (const char *const *)o->train_paths, o->n_train_paths, c);
        }
    } else if (nv > 0 && o->val_frac >= 0) {
        fprintf(stderr,
                "train: --val-frac %g of %lld tokens holds out %lld; the evaluations need seq+1 "
                "= %d\n",
                o->val_frac, (long long)l.n_tokens, (long long)nv, seq + 1);
        us_loader_close(&l);
        return 2;
    }
    rc = read_eval_tokens(o, &l);
    us_loader_close(&l);
    return rc;
}

/* --data: the token file, checked against the vocabulary and the sequence, then split; or shards */
static int load_data(opts *o) {
    int rc;
    if (!o->data_path) return GO_ON;
    if ((rc = list_shards(o)) != GO_ON) return rc;
    if (o->shards) return load_shards(o);
    if (us_data_load(&o->data, o->data_path) != US_OK) {
        fprintf(stderr, "train: %s\n", o->data.err);
        return 1;
    }
    if ((rc = encode_data(o)) != GO_ON) {
        us_data_free(&o->data);
        return rc;
    }
    if (o->data.max_token >= o->mc.vocab) {
        fprintf(stderr, "train: %s contains token %lld but the vocabulary is %lld (set --vocab)\n",
                o->data_path, (long long)o->data.max_token, (long long)o->mc.vocab);
        us_data_free(&o->data);
        return 2;
    }
    if (o->data.n < (int64_t)o->tc.seq + 1) {
        fprintf(stderr, "train: %s has %lld tokens, fewer than seq+1 = %d\n", o->data_path,
                (long long)o->data.n, o->tc.seq + 1);
        us_data_free(&o->data);
        return 2;
    }
    return split_held_out(o);
}

/* The ranks: CUDA's (one, or one process each), threads of this process, or just this one. */
static us_result launch(opts *o, int argc, char **argv) {
    int world = o->tc.dp * o->tc.pp * o->tc.cp * o->tc.tp;
    char err[256];
    us_launch_config lc;
    us_result r;
    if (o->use_cuda) return run_cuda(o, argc, argv);
    if (world == 1) return run_rank(NULL, o);
    memset(&lc, 0, sizeof lc); /* CPU: the ranks are threads of this process */
    lc.timeout_s = o->comm_timeout;
    lc.p2p_rendezvous = 1; /* sends wait for their receiver, as NCCL's do: a pipeline runs here
                              as on GPUs */
    lc.nccl = o->nccl_sem;
    r = us_launch_ex(world, run_rank, o, &lc, NULL, err, sizeof err);
    if (r != US_OK) fprintf(stderr, "train: %s\n", err);
    return r;
}

/* --trace: the ranks' events in one file (multi-process runs wrote theirs in run_rank). */
static us_result write_trace(opts *o, us_result r) {
    int i, n = 0, world = o->tc.dp * o->tc.pp * o->tc.cp * o->tc.tp;
    char err[256];
    if (!o->use_cuda || (o->world <= 1 && o->nproc <= 1)) {
        us_trace *ptr[4096];
        for (i = 0; i < world; i++)
            if (o->traces[i].n[0] || o->traces[i].n[1]) ptr[n++] = &o->traces[i];
        if (us_trace_write(o->trace_path, ptr, n, err, sizeof err) != US_OK) {
            fprintf(stderr, "train: %s\n", err);
            if (r == US_OK) r = US_ERR_IO;
        } else if (!o->quiet && o->rank == 0)
            printf("trace: %s (%d rank%s; open in ui.perfetto.dev)\n", o->trace_path, n,
                   n > 1 ? "s" : "");
    }
    for (i = 0; i < world; i++) us_trace_free(&o->traces[i]);
    free(o->traces);
    return r;
}

/* Reads the flags, checks them, loads the data, runs the ranks; exit 0, 1 (failed), 2 (usage). */
int main(int argc, char **argv) {
    cli c;
    opts *o = &c.o;
    us_result r;
    int rc;

#ifdef _OPENMP
    /* OpenMP threads that spin briefly, then sleep while they wait, unless the user chose:
       libgomp reads the policy once, as the program starts, so the program starts itself again
       with it set. A short spin (GOMP_SPINCOUNT; libgomp's own default spins 30 times as long)
       catches the next parallel region of a small model without a sleep and a wake-up each
       time, and gives the core back soon when other programs want it */
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) {
        if (!getenv("GOMP_SPINCOUNT")) setenv("GOMP_SPINCOUNT", "10000", 1);
        execv("/proc/self/exe", argv);
    }
#endif
    cli_init(&c);
    if ((rc = parse_args(&c, argc, argv)) != GO_ON) return rc;
    if ((rc = check_flags(&c)) != GO_ON) return rc;
    if ((rc = load_tokenizer(&c)) != GO_ON) return rc;
    if ((rc = check_outputs(o)) != GO_ON) return rc;
    if ((rc = task_defaults(&c)) != GO_ON) return rc;
    if ((rc = check_mesh(&c)) != GO_ON) return rc;
    o->mc = c.mc;
    o->tc = c.tc;
    if ((rc = load_data(o)) != GO_ON) return rc;
    if ((rc = load_choices(o)) != GO_ON) return rc;
    if (o->trace_path) {
        o->traces = (us_trace *)calloc((size_t)(o->tc.dp * o->tc.pp * o->tc.cp * o->tc.tp),
                                       sizeof(us_trace));
        if (!o->traces) {
            fprintf(stderr, "train: out of memory\n");
            return 1;
        }
    }
    r = launch(o, argc, argv);
    if (o->traces) r = write_trace(o, r);
    us_data_free(&o->data);
    if (o->shards) { /* the evaluations' tokens were read, not a view */
        us_data_free(&o->val);
        if (o->val_path) free(o->val_paths);
        free(o->train_paths);
    }
    us_tok_free(&o->tok);
    mc_free(o->choices);
    return r == US_OK && !o->nothing_left ? 0 : 1;
}
