/* ultrascale.h — train Llama-style language models, from one CPU core to many GPUs.
   An STB-style single-header library under the MIT licence (see the end of the file).

   Do this in exactly one C or C++ file, before the include:
       #define ULTRASCALE_IMPLEMENTATION
       #include "ultrascale.h"
   Other files include the header without the define. Add `#define ULTRASCALE_STATIC` before the
   implementation to make every function static (private to that translation unit). A build that
   compiles the implementation once into an object can keep the define in every program and pass
   -DULTRASCALE_IMPLEMENTATION_DONE -DULTRASCALE_COMM_IMPLEMENTATION_DONE: the define then brings
   the declarations only (the Makefile does this; see tests/us_impl.c).
   Parts a program does not use can be left out, declarations and code, by defining before the
   include (as stb's STBI_NO_*; make test compiles the library with each):
       ULTRASCALE_NO_CHECKPOINT   // >>checkpoint: safetensors save / load, its JSON reader (us_ckpt_*)
       ULTRASCALE_NO_PLANNER      // >>plan: the configuration planner (us_plan_*)
       ULTRASCALE_NO_DATA         // >>data: text and token-shard loading, the built-in task
                                  // (us_byte_*, us_data_*, us_loader_*, us_task_*)
       ULTRASCALE_NO_TOKENIZER    // >>tokenizer: tokenizer.json byte-level BPE (us_tok_*)

   QUICK START
   -----------
       us_model_config mc = {0};  mc.n_layers = 2; mc.dim = 64; mc.n_heads = 4;
       us_train_config tc = {0};  tc.batch = 8; tc.seq = 64; tc.steps = 300;
       us_model m;
       if (us_model_init(&m, &mc, &tc, NULL) != US_OK) { puts(us_model_error(&m)); return 1; }
       us_train_config *t = &m.tc;                            // tc with every default filled in
       us_task task; us_task_init(&task, t->seed);            // the built-in sorting task
       size_t n = (size_t)t->grad_accum * t->batch * t->seq;  // inputs/targets: [grad_accum][B][T]
       int32_t *in = malloc(n * 4), *tgt = malloc(n * 4);
       for (int s = 0; s < t->steps; s++) {
           us_task_batch(&task, t->batch * t->grad_accum, t->seq, in, tgt);
           us_step_stats st;
           if (us_train_step(&m, in, tgt, &st) != US_OK) { puts(us_model_error(&m)); break; }
           printf("step %d loss %.4f\n", st.step, st.loss);      // accumulated, clipped, AdamW
       }
       us_model_free(&m);

   Every configuration struct is "zero means default": fill only what you care about, then
   us_model_config_defaults() / us_train_config_defaults() fill the rest and
   us_config_validate() explains in one sentence what is wrong.
   Functions return a us_result; the readable message is in us_model_error() (or the struct's
   own `err` field). Nothing in the library calls exit() or asserts on user input.

   THE TWO SEAMS (DESIGN.md)
   -------------------------
   ops   (us_ops)  every numeric primitive the model uses, forward and backward, over memory the
                   backend owns. The CPU implementation here is the reference; the CUDA one lives
                   in ultrascale_cuda.cuh. The model never dereferences parameter or activation
                   memory itself: it moves data only through ops->copy.
   comm  (us_comm) collectives over groups of ranks, each also asynchronous (a handle to wait
                   on). Defined here with the world of one rank; the threads and NCCL backends
                   arrive with ultrascale_comm.h.

   SHAPE LEGEND used in every comment
   ----------------------------------
   B batch (micro-batch), T sequence, N = B·T tokens, C model dim, NH heads, NKV kv heads,
   HS head size (C/NH), QKV = (NH+2·NKV)·HS, F FFN dim, V vocab, L layers; mixture of experts:
   E experts, K experts per token, Fe an expert's FFN dim, R rows of the permuted tokens (N·K).

   TABLE OF CONTENTS (grep for the tag)
   -----------------
   public API
     results, dtypes and conversions ........ us_result, us_dtype, us_f32_to_bf16, ...
     FP8 tile quantisation .................. us_fp8_quantize, us_fp8_dequantize, us_fp8_gemm
     configuration .......................... us_model_config, us_train_config
     ops table .............................. us_ops, us_cpu_ops
     comm table ............................. us_comm, us_group, us_comm_self
     model and trainer ...................... us_model, us_train_step, us_forward_eval
     data ................................... us_data (raw text, llm.c shards), us_loader, us_task
     tokenizer .............................. us_tok_load, us_tok_encode, us_tok_decode
     sampling and generation ................ us_sample_logits, us_generate, us_gen_forward
     checkpoints ............................ us_ckpt_save, us_ckpt_load, us_safetensors_parse
     estimator, FLOPs ....................... us_memory_estimate, us_flops_per_token, us_param_count_active
     planner ................................ us_plan_enumerate, us_plan_cost, us_plan_rates_read
   implementation
     // >>dtypes      bf16 / fp16 / FP8 E4M3 / E5M2 conversions, bit-exact round-to-nearest-even
     // >>config      defaults and validation (each chapter's checks, called in turn)
     // >>gemm        cache-blocked, packed, OpenMP fp32 GEMM with bf16 operands
     // >>kernels     embedding, RMSNorm, RoPE, SwiGLU, cross-entropy, casts (CPU ops)
     // >>fp8         FP8 E4M3 tiles (1×128, 128×1, 128×128, per tensor), the emulated FP8 GEMM
     // >>attention   causal GQA attention, blockwise online softmax (+ the naive reference)
     // >>optimizer   AdamW, global-norm clipping, LR schedules
     // >>comm        the comm seam's world of one rank (threads and NCCL: ultrascale_comm.h)
     // >>trace       named regions per rank and stream, written as a Chrome / Perfetto trace
     // >>model       parameters in flat buffers with Hugging Face names, the activation arena, init
     // >>dp          data parallelism: units (buckets) reduced while the backward runs
     // >>zero        ZeRO-1/2/3: optimizer state, gradients and weights sharded over dp
     // >>tp          tensor and sequence parallelism: heads, FFN columns, vocabulary over tp ranks
     // >>cp          context parallelism: the sequence split over cp ranks, ring attention, zig-zag
     // >>pp          pipeline parallelism: schedules as data (checked, simulated, drawn), the stage
                      split, the messages between stages, the executor
     // >>moe         mixture of experts: router, permute, experts, combine; bias / aux balancing
     // >>ep          expert parallelism: experts over the ep group, all-to-all dispatch and combine
     // >>fp8-linear  FP8 training: the linears' Fprop, Dgrad, Wgrad GEMMs in E4M3 (tile / tensor scales)
     // >>layer       the decoder layer's forward and backward with recomputation (none / selective /
                      full), the model's forward and backward
     // >>lossscale   fp16 mixed precision: dynamic loss scaling, overflow detection, step skipping
     // >>train       the model's set-up (each chapter's in turn), gradient accumulation, the step
     // >>data        byte tokenizer, text loader, llm.c token shards, the shard loader,
                      the built-in task
     // >>sample      temperature / top-k / top-p sampling, generation with a KV cache
     // >>checkpoint  safetensors, Hugging Face names, config.json, training state, resharding, crash-safe
     // >>tokenizer   tokenizer.json byte-level BPE: GPT-2 / Llama 3 pre-tokenisers, merges, added tokens
     // >>estimate    memory estimator and FLOP/MFU counting (the Playbook formulas)
     // >>plan        the planner: every valid configuration, ranked by a cost model (Playbook A3)
*/
#ifndef ULTRASCALE_H
#define ULTRASCALE_H

#include <stddef.h>
#include <stdint.h>

#ifdef ULTRASCALE_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define US_API static __attribute__((unused))
#else
#define US_API static
#endif
#else
#define US_API extern
#endif

#define US_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- results */
typedef enum us_result {
    US_OK = 0,
    US_ERR_INVALID,   /* a configuration or argument is wrong; the message says which */
    US_ERR_OOM,       /* an allocation failed */
    US_ERR_IO,        /* a file could not be opened or read */
    US_ERR_FORMAT,    /* a file is truncated, corrupt or of the wrong kind */
    US_ERR_NONFINITE, /* the loss or the gradient norm became NaN or infinite */
    US_ERR_BACKEND    /* the compute backend reported an error */
} us_result;

US_API const char *us_result_description(us_result r);

/* ---------------------------------------------------------------- dtypes */
typedef enum us_dtype {
    US_F32 = 0,
    US_BF16, /* 1 sign, 8 exponent, 7 mantissa bits: the upper half of an fp32 */
    US_E4M3, /* FP8 (OCP "fn"): no infinities, NaN = S.1111.111, max ±448 */
    US_E5M2, /* FP8: IEEE-like, ±inf and NaNs, max ±57344 */
    US_I32,
    US_F64, /* host-side scalars in collectives (loss sums, norms) */
    US_F16 /* IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits, max ±65504, subnormals to 2^-24 */
} us_dtype;

US_API size_t us_dtype_size(us_dtype dt);
US_API const char *us_dtype_name(us_dtype dt);

/* Round-to-nearest-even. NaN stays NaN. Finite values beyond the format's range saturate to its
   largest finite value; ±inf stays ±inf where the format has it (bf16, E5M2) and saturates to ±448
   in E4M3, which has none (the "satfinite" convention of NVIDIA's cvt instructions). bf16 is the
   exception for finite overflow: like IEEE rounding it rounds to ±inf; so is fp16 (IEEE binary16:
   |x| ≥ 65520, halfway past 65504, rounds to ±inf; subnormals rounded on their own 2^-24 grid). */
US_API uint16_t us_f32_to_bf16(float f);
US_API float us_bf16_to_f32(uint16_t h);
US_API uint16_t us_f32_to_f16(float f);
US_API float us_f16_to_f32(uint16_t h);
US_API uint8_t us_f32_to_e4m3(float f);
US_API float us_e4m3_to_f32(uint8_t b);
US_API uint8_t us_f32_to_e5m2(float f);
US_API float us_e5m2_to_f32(uint8_t b);

/* ---------------------------------------------------------------- FP8 tile quantisation (// >>fp8)
   DeepSeek-V3's fine-grained scaling: a tensor X[M][K] whose GEMM reduces along K is stored as
   E4M3 bytes q and fp32 scales s with X ≈ q·s, one s per tile. s = amax(tile)/448, optionally
   rounded up to a power of two (then q·s loses nothing to the scale's own rounding); a tile whose
   s would be 0 (all zeros, or amax/448 underflows) gets s = 1; a tile holding a NaN or an inf
   gets s = NaN, so the non-finite value reaches the GEMM and the loss check; an s below fp32's
   smallest normal (2^-126) is raised to it, so that 1/s is finite. q = e4m3(x · r) with
   r = 1/s, one IEEE fp32 division per tile and one fp32 multiply per element (as the GPU
   kernels do it: a division per element would make them compute-bound), then round-to-nearest-
   even to E4M3 with saturation (us_f32_to_e4m3).
   Partial tiles (M or K not a multiple of 128) take their amax over the elements present.
   Scale layouts, fp32, chosen so that cuBLASLt can read them as they are (DESIGN.md, measured
   on the H200; kb = k/128, mb = m/128, KB = ceil(K/128), MB = ceil(M/128)):
     ROW128   1×128 tiles along K (activations, output gradients; cuBLASLt VEC128_32F):
              q [M][K], s [KB][M] — token fastest: s[kb·M + m]
     COL128   128×1 tiles along M, for the backward GEMM that reduces over M (Wgrad over tokens).
              Quantised straight from X, never from a quantised X, and written transposed:
              q [K][M], s [MB][K]: s[mb·K + k]. This is exactly ROW128 of Xᵀ, byte for byte, so
              it is the TN operand as it stands.
     BLOCK128 128×128 blocks (weights; cuBLASLt BLK128x128_32F): q [M][K], s [MB][KBp] with the
              block row padded to KBp = KB rounded up to a multiple of 4: s[mb·KBp + kb]; the
              padding entries are written as 1. A block's amax does not change under
              transposition, so BLOCK128 of Wᵀ is BLOCK128 of W transposed, q and s alike: the
              Dgrad GEMM may transpose a quantised weight (unlike a ROW128 tensor)
     TENSOR   one scale for the whole tensor (per-tensor "current scaling", for comparison):
              q [M][K], s [1]
   The ops us_ops.fp8_quantize and fp8_gemm (CPU: these functions; CUDA: fused kernels and
   cuBLASLt) produce and consume these buffers, each row padded with zeros to whole 128-element
   tiles; these host functions are their reference. */
typedef enum us_fp8_tiling {
    US_FP8_TILING_DEFAULT = 0, /* row128 */
    US_FP8_ROW128,
    US_FP8_COL128,
    US_FP8_BLOCK128,
    US_FP8_TENSOR
} us_fp8_tiling;

#define US_FP8_TILE 128
/* The smallest In and Out of a linear that runs in FP8 by default (us_train_config.fp8_min_dim):
   below it quantising costs more than the FP8 GEMM saves (measured, see us__fp8_on) */
#define US_FP8_MIN_DIM 1536
/* The most logits the fused head holds at once by default (us_train_config.loss_chunk) */
#define US_LOSS_CHUNK_BYTES ((size_t)1 << 30)
#define US_E4M3_MAX 448.0f
/* The scale rule above for one tile's amax (|x| maximum); pow2 != 0 rounds it up to 2^e. */
US_API float us_fp8_scale(float amax, int pow2);
/* Number of fp32 scales tiling t writes for X[M][K] (BLOCK128 counts its padding); -1 if invalid. */
US_API int64_t us_fp8_scales_size(us_fp8_tiling t, int64_t M, int64_t K);
/* x[M][K] fp32 or bf16 (dt) → q (bytes of E4M3; [M][K], or [K][M] for COL128) and s (layout above).
   Returns US_ERR_INVALID with a sentence in err (may be NULL) for a bad dtype, tiling or size. */
US_API us_result us_fp8_quantize(uint8_t *q, float *s, const void *x, us_dtype dt, int64_t M,
                                 int64_t K, us_fp8_tiling t, int pow2, char *err, size_t errlen);
/* The inverse: x[M][K] fp32 = e4m3_to_f32(q)·s (one fp32 multiply), in X's orientation for every
   tiling (COL128 reads q [K][M] and writes x [M][K]). */
US_API us_result us_fp8_dequantize(float *x, const uint8_t *q, const float *s, int64_t M, int64_t K,
                                   us_fp8_tiling t, char *err, size_t errlen);
/* The FP8 GEMM, TN as cuBLASLt runs it, emulated on the CPU: c[M][N] fp32 = deq(a)·deq(b)ᵀ with
   a [M][K] and b [N][K] (K contiguous in both) scaled by tilings ta and tb (each ROW128,
   BLOCK128 or TENSOR over its own [rows][K]; COL128 output is a ROW128 operand of the transpose
   and is accepted as such). Accumulation (DeepSeek-V3's promotion every 128 elements), for each
   c[m][n], deterministic and independent of the thread count:
       acc = 0
       for kb = 0, 1, ... KB-1:
           p = 0;  for k in block kb, in order:  p = p + e4m3(a[m][k])·e4m3(b[n][k])   (fp32; each
                                                  product is exact, so fma or not gives the same p)
           acc = fmaf(p, sa·sb, acc)              (sa·sb rounded to fp32 first; sa = a's scale of
                                                  (m, kb), sb = b's of (n, kb))
       c[m][n] = acc */
US_API us_result us_fp8_gemm(float *c, const uint8_t *a, const float *sa, us_fp8_tiling ta,
                             const uint8_t *b, const float *sb, us_fp8_tiling tb, int64_t M,
                             int64_t N, int64_t K, char *err, size_t errlen);

/* ---------------------------------------------------------------- configuration */
typedef enum us_moe_gate {
    US_MOE_GATE_DEFAULT = 0, /* softmax */
    US_MOE_SOFTMAX, /* gates = the chosen experts' softmax probabilities (Switch, GShard, DeepSeek-V2) */
    US_MOE_SIGMOID /* gates = the chosen sigmoid scores renormalised to sum to 1 (DeepSeek-V3) */
} us_moe_gate;

typedef enum us_moe_balance {
    US_MOE_BALANCE_DEFAULT = 0, /* bias */
    US_MOE_BALANCE_BIAS, /* auxiliary-loss-free (DeepSeek-V3): a router bias, not trained, steers the choice */
    US_MOE_BALANCE_AUX, /* the classic auxiliary loss α·Σ_e f_e·P_e added to the objective */
    US_MOE_BALANCE_NONE
} us_moe_balance;

typedef enum us_rope_scaling {
    US_ROPE_DEFAULT = 0, /* none */
    US_ROPE_NONE, /* plain RoPE: pair j turns at θ^(−2j/HS) (Hugging Face's rope_type "default") */
    US_ROPE_LLAMA3 /* Llama 3.1's: frequencies whose wavelength is over rope_orig_ctx/rope_low_freq
                      are divided by rope_factor, those under rope_orig_ctx/rope_high_freq kept,
                      those between blended (Hugging Face's rope_type "llama3") */
} us_rope_scaling;

typedef struct us_model_config {
    int64_t vocab;      /* V; default 256 (the byte tokenizer) */
    int64_t dim;        /* C; default 128 */
    int n_layers;       /* L; default 4 */
    int n_heads;        /* NH; default 4 */
    int n_kv_heads;     /* NKV; default n_heads (multi-head); fewer = grouped-query attention */
    int64_t ffn_dim;    /* F; default 8/3·C rounded up to a multiple of 32 (Llama's SwiGLU size) */
    int tie_embeddings; /* 1: lm_head shares model.embed_tokens.weight; default 0 (untied) */
    float rope_theta;   /* RoPE's base θ; default 10000 */
    /* RoPE scaling (us_rope_freqs): with rope_scaling = US_ROPE_LLAMA3 the four fields below are
       zero-means-default (Llama 3.1's numbers); with none (the default) they must stay 0. */
    us_rope_scaling rope_scaling;
    float rope_factor;    /* llama3 "factor": default 8 */
    float rope_low_freq;  /* llama3 "low_freq_factor": default 1 */
    float rope_high_freq; /* llama3 "high_freq_factor": default 4 */
    int rope_orig_ctx;    /* llama3 "original_max_position_embeddings": default 8192 */
    float norm_eps;       /* RMSNorm epsilon; default 1e-5 */
    float init_std;       /* default 0.02; o_proj and down_proj get init_std/sqrt(2L) */
    /* mixture of experts (// >>moe): moe_experts > 0 replaces the dense MLP of the chosen layers
       by E SwiGLU experts behind a top-k router. Every other moe_ field is then zero-means-default;
       with moe_experts = 0 (the default, a dense model) they must stay 0. */
    int moe_experts; /* E; default 0 (dense); at most 1024 */
    int moe_top_k;   /* K experts per token; default 2 (1 when E = 1) */
    int moe_first_dense; /* the first layers keep the dense MLP (DeepSeek's first_k_dense_replace); default 0 */
    int moe_every; /* after those, every moe_every-th layer is MoE; default 1 (all of them) */
    int64_t
        moe_ffn_dim; /* Fe, each expert's hidden size; default ffn_dim/(K + shared) rounded up to a
                                 multiple of 8, so a token's active FFN is about the dense one's */
    int moe_shared;  /* 1: a shared expert of size Fe that every token passes through; default 0 */
    us_moe_gate moe_gate;
    us_moe_balance moe_balance;
    float
        moe_bias_rate; /* γ of the bias rule b_e += γ·sign(mean load − load_e) after each step; default 1e-3 */
    float moe_aux_coef; /* α of the auxiliary loss (balance aux); default 1e-2 */
    float
        moe_capacity; /* capacity factor cf: an expert takes at most ceil(cf·N·K/E) of a micro-batch's N
                                 tokens, later tokens are dropped (pass by the residual); default 0 = drop nothing */
    int moe_groups; /* G expert groups for group-limited routing; default 1 (no limit); at most 64 */
    int moe_top_groups; /* M: each token's experts come from its M best groups (DeepSeek-V3's node limit); default G */
} us_model_config;

typedef enum us_precision {
    US_PRECISION_DEFAULT = 0, /* fp32 */
    US_PRECISION_FP32,        /* everything fp32: the reference */
    US_PRECISION_BF16,        /* bf16 params and activations, fp32 master weights, moments, grads */
    US_PRECISION_FP8, /* bf16 policy, and every linear layer's Fprop, Dgrad and Wgrad GEMMs in FP8 E4M3 with
                                 online fine-grained scales: 1×128 activation tiles, 128×128 weight blocks (// >>fp8-linear) */
    US_PRECISION_FP8_TENSOR, /* the same GEMMs with one scale per tensor ("current scaling"), for comparison */
    US_PRECISION_FP16 /* fp16 params and activations, fp32 master weights, moments, grads, and
                                 dynamic loss scaling (// >>lossscale) */
} us_precision;

typedef enum us_recompute {
    US_RECOMPUTE_DEFAULT = 0, /* none */
    US_RECOMPUTE_NONE,        /* keep every activation the backward needs */
    US_RECOMPUTE_SELECTIVE,   /* keep GEMM outputs; recompute norms, attention core and SwiGLU */
    US_RECOMPUTE_FULL         /* keep only each layer's input; recompute the layer in backward */
} us_recompute;

typedef enum us_lr_schedule {
    US_LR_DEFAULT = 0, /* cosine */
    US_LR_COSINE,      /* linear warmup, cosine decay to lr·min_lr_frac at `steps` */
    US_LR_CONSTANT     /* linear warmup, then constant */
} us_lr_schedule;

typedef enum us_cp_mode {
    US_CP_DEFAULT = 0, /* zigzag */
    US_CP_RING,        /* contiguous chunks, K/V passed around the ring (the naive split) */
    US_CP_ZIGZAG,      /* chunks r and 2·cp−1−r (causal work balanced), ring */
    US_CP_ALLGATHER    /* zig-zag chunks, all K/V gathered, then attention */
} us_cp_mode;

typedef struct us_train_config {
    int batch;         /* B, sequences per micro-batch; default 8 */
    int seq;           /* T, tokens per sequence; default 64 */
    int grad_accum;    /* micro-batches per optimizer step; default 1 */
    int steps;         /* optimizer steps (sets the cosine horizon); default 1000 */
    float lr;          /* peak learning rate; default 3e-3 */
    int warmup;        /* warmup steps; default 0 */
    float min_lr_frac; /* cosine floor as a fraction of lr; default 0.1 */
    us_lr_schedule schedule;
    float weight_decay; /* decoupled, on 2-D weights only; default 0.1; negative = none */
    float beta1, beta2; /* defaults 0.9, 0.95 */
    float adam_eps;     /* default 1e-8 */
    float grad_clip;    /* global-norm clip; default 1.0; negative = off */
    us_precision precision;
    /* loss scaling (// >>lossscale): the loss's gradient seed is multiplied by S and the gradients
       divided by S before clipping and AdamW; a step whose gradients hold an inf or a NaN is skipped */
    float
        loss_scale; /* 0: dynamic under fp16 (S starts at 2^16, halves on an overflow, doubles after
                              loss_scale_window clean steps), none under fp32/bf16; > 0: a static S (any precision) */
    int loss_scale_window; /* clean steps before S doubles; default 2000 (PyTorch GradScaler's growth_interval) */
    us_recompute recompute;
    uint64_t seed; /* default 1337 */
    int threads;   /* CPU threads; default: all OpenMP threads */
    /* data parallelism and ZeRO (// >>dp, // >>zero) */
    int dp;   /* data-parallel ranks; default 1. B above is each rank's micro-batch, so the
                              global batch is batch × grad_accum × dp sequences */
    int zero; /* ZeRO stage over dp: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters */
    float bucket_mb; /* gradient bucket size in MiB of fp32 gradients (DP, ZeRO-1/2); default 25 */
    us_dtype grad_reduce_dtype; /* DP's gradient reductions: US_F32 (0, default) or US_BF16, the
                                   Playbook's bf16 reduction: half the bytes on the wire; each
                                   rank's fp32 gradient is rounded to bf16, every addition of the
                                   reduction rounds again, and the sum lands back in fp32 (the
                                   local accumulation over micro-batches stays fp32) (// >>dp) */
    /* benchmarks only (Megatron's --moe-router-force-load-balancing): 1 routes token n's k-th
       choice to expert (n·K + k) mod E whatever the router says, so every expert gets the same
       number of tokens (±1); the gates stay the router's probabilities of those experts (// >>moe) */
    int moe_force_balance;
    int dense_emb_grad; /* 1: reduce the whole embedding gradient at the end of the backward like any
                                  bucket. Default 0: where it pays, only the rows the batch touched, the rest
                                  reduced early (us__emb_sparse, // >>dp) */
    /* tensor parallelism (// >>tp): heads, FFN columns and the vocabulary split over tp ranks */
    int tp; /* default 1; must divide heads, kv-heads, ffn and vocab */
    int sp; /* 1: sequence parallelism: norms and the residual stream split over tp by tokens */
    int tp_no_overlap; /* 1: every tp collective waited for where it is issued (for comparison). Default
                                 0: the backward's reductions and gathers travel under the weight-gradient GEMMs,
                                 and SP's gathers under the GEMMs they feed (us__sp_gather_gemm, // >>tp) */
    int overlap_sms; /* SMs the GEMMs running beside an overlapped tp collective leave to it
                                 (us_ops.sm_margin); default 0: none (on two H200s 8, 16 and 32 gained nothing) */
    /* context parallelism (// >>cp): every sequence split over cp ranks for the whole model;
       inputs to us_train_step are then this rank's seq/cp tokens of each sequence */
    int cp; /* default 1; seq must split into cp (ring) or 2·cp (zigzag, allgather) chunks */
    us_cp_mode cp_mode;
    /* pipeline parallelism (// >>pp): layers split over pp ranks, grad_accum micro-batches per
       step run by a schedule; every stage receives the step's inputs and targets */
    int pp;          /* default 1 */
    int pp_schedule; /* a us_pp_kind the executor runs (any of them; default 1f1b) */
    int pp_chunks;   /* model chunks per pp rank: interleaved default 2, the V shapes and
                        DualPipe exactly 2, others 1 */
    /* 1: time the pipeline's messages on the schedule's clock even where the backend could send
       them as they are ready (us_comm.p2p_early); -1: channels for every schedule, on NCCL too
       (to try them there); 0: as us__pp_early chooses (// >>pp) */
    int pp_clock;
    const int
        *pp_layers; /* NULL: layers split over the pp·chunks stages to balance their FLOPs (the
                              last stage, which also runs the head, takes fewer; the first ones take
                              the remainder); else [pp·chunks] layers per stage (DualPipe: [pp]),
                              each ≥ 1, summing to n_layers */
    /* expert parallelism (// >>ep): each MoE layer's routed experts split over ep consecutive ranks
       of the dp×cp group (folded over data parallelism, as in Megatron); tokens travel to their
       experts' rank and back by all-to-all */
    int ep; /* default 1; must divide dp·cp and the experts */
    /* FP8 (// >>fp8-linear) */
    int fp8_pow2; /* 1: FP8 scales rounded up to powers of two (fp8 and fp8-tensor precision only) */
    int fp8_no_wcache; /* 1: quantise the weights at every GEMM instead of once per step (fp8 and fp8-tensor
                              only; by default every linear's W and Wᵀ are quantised at their first use after the
                              weights change and kept, 2 bytes per weight; ZeRO-3, whose weights are not resident,
                              never keeps them) */
    int fp8_min_dim; /* a linear runs in FP8 only when its In and Out are both at least this (0: the
                              default US_FP8_MIN_DIM, where FP8 measured faster than bf16; 16: every size) */
    /* 1: the MoE experts' GEMMs in FP8 too, expert by expert under the same size rule
       (DeepSeek-V3's recipe); 0 (the default): the experts stay bf16, one grouped GEMM, which
       measured faster on an H200 (the MoE preset: 108k against 95k tokens/s; bench/RESULTS.md) */
    int fp8_experts;
    /* the fused head (// >>layer, us__head_loss): logits, loss and their gradients computed for
       loss_chunk rows at a time, so the [B·T, V] logits never stand whole in memory. 0: chunks of
       at most US_LOSS_CHUNK_BYTES of logits where the configuration allows it (no pipeline,
       ZeRO below 2), whole elsewhere; −1: whole; > 0: this many rows (refused with pp or ZeRO-2/3) */
    int loss_chunk;
} us_train_config;

US_API void us_model_config_defaults(us_model_config *c);
US_API void us_train_config_defaults(us_train_config *c);
/* Fills defaults first, then checks; on failure writes one sentence into err (size errlen). */
US_API us_result us_config_validate(us_model_config *mc, us_train_config *tc, char *err,
                                    size_t errlen);
US_API const char *us_precision_name(us_precision p);
US_API const char *us_recompute_name(us_recompute r);
US_API const char *us_cp_mode_name(us_cp_mode m);
/* RoPE's inverse frequencies freq[HS/2], HS = dim/n_heads, for mc with its defaults filled: pair j
   of a head at position t turns by t·freq[j] radians. freq[j] = θ^(−2j/HS), rescaled under
   US_ROPE_LLAMA3 as transformers does it (_compute_llama3_parameters), in double. */
US_API void us_rope_freqs(const us_model_config *mc, double *freq);
/* mc's RoPE in words into buf ("rope 500000" or "rope 500000 llama3 (factor 32, low 1, high 4,
   original 8192)"), for the model line; returns buf. */
US_API const char *us_rope_describe(const us_model_config *mc, char *buf, size_t cap);

/* ---------------------------------------------------------------- ops table (seam 1)
   Every pointer argument below is backend memory (host for the CPU ops, device for CUDA) except
   where a comment says "host". `dt` is the dtype of activations and low-precision weights
   (US_F32, US_BF16 or US_F16); tensors marked f32 are always fp32. "+=" means the op accumulates. */
typedef enum us_copy_kind { US_COPY_H2D = 0, US_COPY_D2H, US_COPY_D2D } us_copy_kind;

/* the grouped GEMM's three products (us_ops.gemm_grouped): a linear layer's forward, its input
   gradient and its weight gradient */
typedef enum us_gg_mode { US_GG_FPROP = 0, US_GG_DGRAD, US_GG_WGRAD } us_gg_mode;

typedef struct us_ops us_ops;

struct us_ops {
    const char *name;
    int nthreads;  /* CPU threads for the CPU ops; 0 = all */
    int sm_margin; /* GPU backends: SMs a GEMM leaves free for communication running beside it (the
                         model sets it around an overlapped collective, // >>tp); 0 = the GEMM takes all */
    void *backend; /* backend-private state */
    void *(*alloc)(us_ops *o, size_t bytes); /* zero-filled, 64-byte aligned */
    void (*free)(us_ops *o, void *p);
    void (*zero)(us_ops *o, void *p, size_t bytes);
    void (*copy)(us_ops *o, void *dst, const void *src, size_t bytes, us_copy_kind kind);
    void (*sync)(us_ops *o);
    /* dst[n] = src[n] converted between dtypes (RNE) */
    void (*cast)(us_ops *o, void *dst, us_dtype ddt, const void *src, us_dtype sdt, int64_t n);
    /* C[M,N] = alpha·op(A)[M,K]·op(B)[K,N] + beta·C, row-major; ta/tb transpose; beta 0 never reads C */
    void (*gemm)(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const void *A, us_dtype adt, int64_t lda, const void *B, us_dtype bdt, int64_t ldb,
                 float beta, void *C, us_dtype cdt, int64_t ldc);
    /* Grouped GEMM: G independent products in one call (// >>moe: a layer's experts, each on its
       own rows). Group g owns rows [off[g], off[g] + n[g]) of X and Y (off, n host i64[G]; a group
       may be empty, groups may leave rows between them untouched) and its own matrix W[g] (W a
       host array of G backend pointers: the experts' tensors need not be evenly spaced). X [·,K]
       has row stride ldx and Y [·,N] row stride ldy, both dt; sums in fp32. With X_g and Y_g the
       group's rows:
         US_GG_FPROP  Y_g = X_g · W[g]ᵀ     W[g] [N,K] dt    overwrites Y_g
         US_GG_DGRAD  Y_g = X_g · W[g]      W[g] [K,N] dt    overwrites Y_g
         US_GG_WGRAD  W[g] += Y_gᵀ · X_g    W[g] [N,K] f32   (rows the reduction; an empty group
                                                             adds nothing)
       Each group's result is what gemm gives for it alone. */
    void (*gemm_grouped)(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n,
                         int64_t N, int64_t K, const void *X, int64_t ldx, void *const *W, void *Y,
                         int64_t ldy, us_dtype dt);
    /* FP8 (// >>fp8). An FP8 GEMM operand is a matrix P[R][L] whose GEMM reduces along L, stored as
       E4M3 bytes q [R][Lp] (Lp = L rounded up to a multiple of 128, the padding columns 0) and fp32
       scales s laid out by tiling t over P[R][L] exactly as us_fp8_quantize writes them (ROW128
       [LB][R], BLOCK128 [RB][LBp], TENSOR [1]; LB = ceil(L/128)). Quantise x[M][K] (dt f32 or
       bf16) into such an operand: P = x (R = M, L = K) or, with trans, P = xᵀ (R = K, L = M),
       read from x as it is stored: one pass per tile, amax, scale, cast (ROW128 of xᵀ is COL128
       of x: the backward's second quantisation from the high-precision x). t is ROW128, BLOCK128
       or TENSOR; pow2 rounds the scales up to powers of two. */
    void (*fp8_quantize)(us_ops *o, uint8_t *q, float *s, const void *x, us_dtype dt, int64_t M,
                         int64_t K, int t, int trans, int pow2);
    /* Both operands of x at once: (q, s) as fp8_quantize with trans 0 and (qt, st) as with trans 1,
       byte for byte, from one read of x (t ROW128, BLOCK128 or TENSOR). The backward quantises an
       output gradient dy so (1×128 tiles for Dgrad, 128×1 for the Wgrad that follows), and the
       weight cache a weight (W for Fprop, Wᵀ for Dgrad). Optional: NULL means two fp8_quantize calls. */
    void (*fp8_quantize_both)(us_ops *o, uint8_t *q, float *s, uint8_t *qt, float *st,
                              const void *x, us_dtype dt, int64_t M, int64_t K, int t, int pow2);
    /* RMSNorm with its output's FP8 operand (FP8 training's Fprop of the qkv and gate|up linears):
       out [N,C] and rstd f32[N] as rmsnorm_fwd, and (q, s) as fp8_quantize(out, N, C, ROW128,
       trans 0, pow2) gives for that out, byte for byte, from the registers that write out (out is
       read back by no one in between). Optional: NULL means the two calls. */
    void (*rmsnorm_fwd_fp8)(us_ops *o, void *out, float *rstd, uint8_t *q, float *s, const void *x,
                            const void *w, int64_t N, int64_t C, float eps, us_dtype dt, int pow2);
    /* SwiGLU with its output's FP8 operands (the down linear's Fprop, and its Wgrad): h [N,F] as
       swiglu_fwd, and (q, s) as fp8_quantize(h, N, F, ROW128, trans 0, pow2) gives for that h;
       qt non-NULL: also (qt, st) as fp8_quantize(h, N, F, ROW128, trans 1, pow2), the 128×1
       operand of hᵀ (qt [F][Np], st [Np/128][F], Np = N rounded up to 128), byte for byte. h NULL
       (with qt only): h is not stored (the operands are all that is read of it). Optional, as
       above. */
    void (*swiglu_fwd_fp8)(us_ops *o, void *h, uint8_t *q, float *s, uint8_t *qt, float *st,
                           const void *gu, int64_t N, int64_t F, us_dtype dt, int pow2);
    /* SwiGLU's backward with its output's two FP8 operands (the gate|up linear's Dgrad and Wgrad):
       dgu [N,2F] as swiglu_bwd(dgu, dh, gu) forms it, and (q, s), (qt, st) as
       fp8_quantize_both(dgu, N, 2F, ROW128, pow2) gives for that dgu, byte for byte. dgu NULL:
       dgu need not be stored (its operands are all that is read of it), and gu may be overwritten
       with it (the op may run in place, as the layer's backward does). Optional, as above. */
    void (*swiglu_bwd_fp8)(us_ops *o, void *dgu, uint8_t *q, float *s, uint8_t *qt, float *st,
                           const void *dh, const void *gu, int64_t N, int64_t F, us_dtype dt,
                           int pow2);
    /* C[M,N] = alpha·deq(a)[M,K]·deq(b)[N,K]ᵀ + beta·C (cdt f32 or bf16, row stride ldc; beta 0
       never reads C): the TN FP8 GEMM of us_fp8_gemm on two operands as fp8_quantize writes them
       (a ROW128 or TENSOR: the activation operand; b ROW128, BLOCK128 or TENSOR: the weight
       operand; both TENSOR or neither), fp32 accumulation (on Hopper's tensor cores about 14 bits
       inside each 128-element block, promoted to fp32 between blocks: ~1e-3 of Σ|a·b| from the
       CPU's exact emulation, as cuBLASLt does for PyTorch too; tests/test_cuda.cu) */
    void (*fp8_gemm)(us_ops *o, int64_t M, int64_t N, int64_t K, float alpha, const uint8_t *a,
                     const float *sa, int ta, const uint8_t *b, const float *sb, int tb, float beta,
                     void *C, us_dtype cdt, int64_t ldc);
    /* out[N,C] = wte[tok[n], :]                      tok i32[N]; a negative token gives a zero row
       (tensor parallelism: the token lives in another rank's slice of the vocabulary) */
    void (*embedding_fwd)(us_ops *o, void *out, const int32_t *tok, const void *wte, int64_t N,
                          int64_t C, us_dtype dt);
    /* dwte f32[V,C] += scatter of dout[N,C] (negative tokens skipped) */
    void (*embedding_bwd)(us_ops *o, float *dwte, const void *dout, const int32_t *tok, int64_t N,
                          int64_t C, us_dtype dt);
    /* out[N,C] = x / rms(x) · w;  rstd f32[N] */
    void (*rmsnorm_fwd)(us_ops *o, void *out, float *rstd, const void *x, const void *w, int64_t N,
                        int64_t C, float eps, us_dtype dt);
    /* dx[N,C] += ∂/∂x;  dw f32[C] += ∂/∂w */
    void (*rmsnorm_bwd)(us_ops *o, void *dx, float *dw, const void *dout, const void *x,
                        const void *w, const float *rstd, int64_t N, int64_t C, us_dtype dt);
    /* dst[rows, cols] (row stride dld) = src[rows, cols] (row stride sld), elements of dt */
    void (*copy2d)(us_ops *o, void *dst, int64_t dld, const void *src, int64_t sld, int64_t rows,
                   int64_t cols, us_dtype dt);
    /* RoPE in place on the q and k heads of qkv[B,T,QKV] (rotate-half): pair (j, j+HS/2) of a
       head at position t turns by t·freq[j] radians, freq f64[HS/2] a host array (the model's,
       us_rope_freqs); bwd applies the inverse rotation. The frequencies cross the seam rather
       than θ and a scaling rule: a backend only multiplies, and a new scaling rule is one host
       function, not a change to every backend's kernels. */
    void (*rope_fwd)(us_ops *o, void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS,
                     const double *freq, us_dtype dt);
    void (*rope_bwd)(us_ops *o, void *dqkv, int64_t B, int64_t T, int NH, int NKV, int HS,
                     const double *freq, us_dtype dt);
    /* RoPE at given positions: row t of each sequence rotates by pos[t] (i32[T], all < T_total);
       dir +1 forward, -1 backward. Context parallelism's tokens are not at positions 0..T-1. */
    void (*rope_at)(us_ops *o, void *qkv, const int32_t *pos, int64_t B, int64_t T, int64_t T_total,
                    int NH, int NKV, int HS, const double *freq, float dir, us_dtype dt);
    /* causal GQA: out[B,T,NH·HS], lse f32[B,NH,T] from qkv[B,T,QKV] */
    void (*attention_fwd)(us_ops *o, void *out, float *lse, const void *qkv, int64_t B, int64_t T,
                          int NH, int NKV, int HS, us_dtype dt);
    /* dqkv[B,T,QKV] = (overwrites) gradient from dout[B,T,NH·HS] */
    void (*attention_bwd)(us_ops *o, void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, int64_t B, int64_t T, int NH, int NKV, int HS,
                          us_dtype dt);
    /* Attention by key blocks with global positions — the building block of context parallelism
       (ring attention visits the blocks one by one, the all-gather variant once). Queries are
       the q heads of qkv[B,Tq,QKV]; a block's keys and values are kv[B,Tk,2·NKV·HS] (k heads,
       then v heads); qpos i32[Tq], kpos i32[Tk] are global positions (a key is seen by a query
       when kpos ≤ qpos). The online-softmax state f32 acc[B,NH,Tq,HS], m and l [B,NH,Tq] carries
       over blocks (init = 1 on the first); finish writes out[B,Tq,NH·HS] = acc/l and
       lse[B,NH,Tq] = m + log l (a row that saw no key gets 0 and -inf). */
    void (*attn_block_fwd)(us_ops *o, float *acc, float *m, float *l, const void *qkv,
                           const void *kv, const int32_t *qpos, const int32_t *kpos, int64_t B,
                           int64_t Tq, int64_t Tk, int NH, int NKV, int HS, int init, us_dtype dt);
    void (*attn_block_finish)(us_ops *o, void *out, float *lse, const float *acc, const float *m,
                              const float *l, int64_t B, int64_t Tq, int NH, int HS, us_dtype dt);
    /* Its backward for one block, from the final out and lse: dq f32[B,Tq,NH·HS] += and
       dkv f32[B,Tk,2·NKV·HS] += (the block's keys' and values' gradients). */
    void (*attn_block_bwd)(us_ops *o, float *dq, float *dkv, const void *dout, const void *qkv,
                           const void *out, const float *lse, const void *kv, const int32_t *qpos,
                           const int32_t *kpos, int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV,
                           int HS, us_dtype dt);
    /* h[N,F] = silu(gu[:, :F]) · gu[:, F:];  bwd overwrites dgu[N,2F], which may be gu itself
       (each element is read before it is written: the layer's backward runs it in place) */
    void (*swiglu_fwd)(us_ops *o, void *h, const void *gu, int64_t N, int64_t F, us_dtype dt);
    void (*swiglu_bwd)(us_ops *o, void *dgu, const void *dh, const void *gu, int64_t N, int64_t F,
                       us_dtype dt);
    /* optional (NULL: the model copies res into y, then gemm with beta 1): y[N,Out] =
       res[N,Out] + x[N,In]·W[Out,In]ᵀ with y ≠ res, the residual added in the GEMM's epilogue */
    void (*gemm_res)(us_ops *o, int64_t N, int64_t Out, int64_t In, const void *x, const void *W,
                     const void *res, void *y, us_dtype dt);
    /* Mixture of experts (// >>moe): route, permute into per-expert groups, run the experts (GEMMs,
       SwiGLU), combine. R = rows of the permuted buffers. Router: from logits f32[N,E], probs
       f32[N,E] = softmax or sigmoid (gate: a us_moe_gate, never DEFAULT); each token's K experts
       topk i32[N,K] are those with the largest probs + bias (bias f32[E], may be NULL: it steers the
       choice only, not the gates), taken from the token's top_groups best of n_groups equal groups
       (a group's score: the sum of its two best biased scores); ties go to the lower index. gates
       f32[N,K] = the chosen probs (softmax) or the chosen probs over their sum (sigmoid). psum
       f32[E] (may be NULL) = Σ_n probs[n,e] / Σ_e' probs[n,e'], for the auxiliary loss. */
    void (*moe_route)(us_ops *o, int32_t *topk, float *gates, float *probs, float *psum,
                      const float *logits, const float *bias, int64_t N, int E, int K, int gate,
                      int n_groups, int top_groups);
    /* dlogits f32[N,E] (overwrites) = the gradient through the gates from dgates f32[N,K], plus
       through the normalised probs p' = probs / Σ probs from aux f32[E] = ∂loss/∂p'[n,e] (the same
       for every token; may be NULL) */
    void (*moe_route_bwd)(us_ops *o, float *dlogits, const float *dgates, const float *probs,
                          const int32_t *topk, const float *aux, int64_t N, int E, int K, int gate);
    /* Counting sort of the N·K choices by expert, stable in token order. routed i32[E] = choices of
       each expert; kept i32[E] = min(routed, cap) (cap ≤ 0: no limit), the first ones in token order;
       rows are grouped per expert, experts in order; slot_row i32[N·K] = the row of choice n·K+k, -1
       if dropped; row_slot i32[R] = the choice n·K+k each row holds, -1 for rows past the kept total */
    void (*moe_permute)(us_ops *o, int32_t *slot_row, int32_t *row_slot, int32_t *routed,
                        int32_t *kept, const int32_t *topk, int64_t N, int E, int K, int64_t cap,
                        int64_t R);
    /* dst[R,C] = scale[s]·src[s / K] with s = row_slot[r] (zero rows where s < 0); scale f32[N·K] may be NULL (1) */
    void (*moe_gather)(us_ops *o, void *dst, const void *src, const int32_t *row_slot,
                       const float *scale, int64_t R, int K, int64_t C, us_dtype dt);
    /* dst[N,C] += Σ_k scale[n·K+k]·src[slot_row[n·K+k]] over the kept choices, rounded once; scale may be NULL (1) */
    void (*moe_scatter)(us_ops *o, void *dst, const void *src, const int32_t *slot_row,
                        const float *scale, int64_t N, int K, int64_t C, us_dtype dt);
    /* dgates f32[N·K] = dout[n,:] · src[slot_row[n·K+k], :] (0 for a dropped choice) */
    void (*moe_gate_grad)(us_ops *o, float *dgates, const void *dout, const void *src,
                          const int32_t *slot_row, int64_t N, int K, int64_t C, us_dtype dt);
    /* fused softmax-cross-entropy over logits[N,V]: losses f32[N] (0 where tgt<0), argmax i32[N] (may be
       NULL); if dscale != 0 the logits are overwritten with dscale·(softmax − onehot) (0 rows where tgt<0) */
    void (*xent)(us_ops *o, float *losses, int32_t *argmax, void *logits, const int32_t *tgt,
                 int64_t N, int64_t V, float dscale, us_dtype dt);
    /* Vocabulary-parallel cross-entropy (TP): logits[N,V] hold this rank's V columns of the
       vocabulary; tgt is local: the column, -1 for a target in another rank's slice, -2 ignored.
       Pass 1 (sumexp NULL): mx f32[N] = each row's max, amax i32[N] (may be NULL) its column.
       Pass 2, given mx = the max over all ranks: sumexp f64[N] = Σ exp(logit − mx) and tlogit
       f32[N] = the target's logit where 0 ≤ tgt < V, else 0 (both summed over ranks after). */
    void (*xent_stats)(us_ops *o, float *mx, int32_t *amax, double *sumexp, float *tlogit,
                       const void *logits, const int32_t *tgt, int64_t N, int64_t V, us_dtype dt);
    /* losses f32[N] = log(sumexp) + mx − tlogit (0 where tgt = −2); if dscale != 0 the logits are
       overwritten with dscale·(softmax − onehot) over this rank's columns (0 rows where tgt = −2) */
    void (*xent_finish)(us_ops *o, float *losses, void *logits, const int32_t *tgt, const float *mx,
                        const double *sumexp, const float *tlogit, int64_t N, int64_t V,
                        float dscale, us_dtype dt);
    /* AdamW on n fp32 master values p with grads g·gscale; also writes p_lowp (dtype lowdt) if not NULL */
    void (*adamw)(us_ops *o, float *p, const float *g, float *m, float *v, void *p_lowp,
                  us_dtype lowdt, int64_t n, float lr, float beta1, float beta2, float eps,
                  float wd, float gscale, int step);
    /* y[n] += a·x[n], f32 (ZeRO-2/3 add each micro-batch's reduced gradient shard to the last) */
    void (*axpy)(us_ops *o, float *y, const float *x, float a, int64_t n);
    /* host: Σ x² over f32[n], accumulated in double */
    double (*sumsq)(us_ops *o, const float *x, int64_t n);
    /* NULL while all is well, else the first error the backend recorded (may itself be NULL
       for backends that cannot fail, like the CPU one) */
    const char *(*error)(us_ops *o);
    /* Trace marks, for backends whose ops return before the work is done (NULL on the CPU, whose
       ops finish first, so the host clock times them). mark() records the point the work issued
       so far has reached on the compute stream and returns its id (-1 when no more fit);
       mark_us(id), once that work has finished (after sync), is the moment it was reached on
       us_trace_now_us's clock; mark_reset() frees every id. The model's traces use them. */
    int (*mark)(us_ops *o);
    double (*mark_us)(us_ops *o, int id);
    void (*mark_reset)(us_ops *o);
    /* bytes of backend memory held now and at most, over alloc/free (kept by the backend) */
    size_t bytes_in_use, bytes_peak;
};

/* The CPU reference ops. nthreads 0 = all OpenMP threads. */
US_API us_ops us_cpu_ops(int nthreads);

/* ---------------------------------------------------------------- comm table (seam 2)
   Collectives over a group of ranks, on backend memory (the ops table's). Each call is
   synchronous when `w` is NULL; otherwise it starts the collective, stores a handle in *w and
   returns at once: the caller computes and later calls wait(c, *w) — how data parallelism
   overlaps gradient reduction with the backward pass. Counts are elements of dtype dt
   (US_F32, US_BF16, US_F16, US_I32, US_F64; reductions accumulate in the dtype itself).
   Every rank of a group must issue the group's collectives in the same order (as with MPI and
   NCCL); collectives on different groups may be in flight at the same time.
   This header defines the seam and the world of one rank (us_comm_self); ultrascale_comm.h
   brings the threads backend (ranks as threads, for CI) and NCCL (GPUs). */
typedef enum us_reduce_op { US_REDUCE_SUM = 0, US_REDUCE_AVG, US_REDUCE_MAX } us_reduce_op;

typedef struct us_group {
    int size;   /* ranks in the group */
    int rank;   /* this rank's index in it, 0..size-1 */
    void *impl; /* backend handle (a communicator, shared state of the threads, ...) */
} us_group;

typedef struct us_trace us_trace;
typedef struct us_work us_work; /* an in-flight collective */
typedef struct us_comm us_comm;

struct us_comm {
    const char *name;
    void *backend;
    us_ops *ops; /* the memory the collectives read and write (may be NULL for host backends) */
    us_group world;
    /* buf[n] ← op over the group's buf[n] */
    us_result (*all_reduce)(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt,
                            us_reduce_op op, us_work **w);
    /* root's dst[n] ← op over the group's src[n] (dst only read on the root; may equal src) */
    us_result (*reduce)(us_comm *c, us_group *g, void *dst, const void *src, int64_t n, us_dtype dt,
                        us_reduce_op op, int root, us_work **w);
    /* dst[n] ← op over the group of src[rank·n .. rank·n+n)   (src holds size·n; dst may be
       src + rank·n, the in-place form) */
    us_result (*reduce_scatter)(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                us_dtype dt, us_reduce_op op, us_work **w);
    /* dst[size·n] ← every rank's src[n], in rank order (src may be dst + rank·n, in place) */
    us_result (*all_gather)(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                            us_dtype dt, us_work **w);
    /* root's dst[size·n] ← every rank's src[n], in rank order */
    us_result (*gather)(us_comm *c, us_group *g, void *dst, const void *src, int64_t n, us_dtype dt,
                        int root, us_work **w);
    /* dst[n] ← root's src[rank·n .. rank·n+n) */
    us_result (*scatter)(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                         us_dtype dt, int root, us_work **w);
    /* buf[n] ← root's buf[n] */
    us_result (*broadcast)(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt, int root,
                           us_work **w);
    /* point to point, for pipeline stages; peer is a rank of the group */
    us_result (*send)(us_comm *c, us_group *g, const void *buf, int64_t n, us_dtype dt, int peer,
                      us_work **w);
    us_result (*recv)(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt, int peer,
                      us_work **w);
    /* send to one peer and receive from another (or the same) as one operation, so two
       neighbours that both send first cannot deadlock (pipeline parallelism's exchanges) */
    us_result (*sendrecv)(us_comm *c, us_group *g, const void *sbuf, int64_t sn, int speer,
                          void *rbuf, int64_t rn, int rpeer, us_dtype dt, us_work **w);
    /* dst ← the block each peer sends this rank; counts and displacements in elements, [size]
       (read during the call: they need not outlive it, even when it is asynchronous) */
    us_result (*all_to_all)(us_comm *c, us_group *g, void *dst, const int64_t *recv_counts,
                            const int64_t *recv_displs, const void *src, const int64_t *send_counts,
                            const int64_t *send_displs, us_dtype dt, us_work **w);
    us_result (*barrier)(us_comm *c, us_group *g);
    us_result (*wait)(us_comm *c, us_work *w); /* w NULL is a no-op; frees the handle */
    /* Collective over `parent`: ranks giving the same color form a new group, ordered by key
       (ties by parent rank); MPI_Comm_split / ncclCommSplit. A negative color joins no group
       (out gets size 0). */
    us_result (*split)(us_comm *c, us_group *parent, int color, int key, us_group *out);
    void (*group_free)(us_comm *c, us_group *g);
    /* Collective over g: a new group of the same ranks, in the same order, whose operations run
       apart from every other group's — in issue order among themselves, but never queued behind
       another group's nor it behind them (threads: a progress thread of its own; NCCL: its own
       communicator and stream). A channel: pipeline stages send activations on one and
       gradients on another, so an early send on one never holds up a receive on the other. */
    us_result (*dup)(us_comm *c, us_group *g, us_group *out);
    double timeout_s; /* a collective that cannot finish within this many seconds fails; 0 = 300 */
    /* point-to-point calls may be posted long before their peer's at no cost (host backends: a
       queued call waits on a thread). 0 for NCCL, whose waiting calls are kernels on the GPU:
       the pipeline then times its messages on its clock for the schedules where that idles
       less (us__pp_early, // >>pp) */
    int p2p_early;
    int64_t bytes_sent; /* bytes this rank has sent to peers so far (the backend counts) */
    us_trace *trace;    /* when set, the backend records each collective on the comm stream row */
    char err[256];
};

/* The world of one rank: reductions are the identity, gathers and scatters are copies, a
   point-to-point message has nobody to go to (an error). The parallel strategies are written
   against this table, so with us_comm_self they run unchanged on a single device. */
US_API void us_comm_self(us_comm *c, us_ops *ops);

/* The device mesh (Playbook "5D parallelism"): world = dp × pp × cp × tp, tp innermost, so
   world rank = ((dp_rank·pp + pp_rank)·cp + cp_rank)·tp + tp_rank. Every rank has one group per
   dimension and one for dp×cp (ZeRO and gradient reduction run over it). Built from any comm
   backend with its split(); the one-rank world gives 1×1×1×1. */
typedef struct us_mesh {
    int dp, pp, cp, tp;                      /* sizes; product = world size */
    int dp_rank, pp_rank, cp_rank, tp_rank;  /* this rank's coordinates */
    us_group dp_g, pp_g, cp_g, tp_g, dpcp_g; /* dpcp_g.rank = dp_rank·cp + cp_rank */
} us_mesh;

/* Collective over c->world. Sizes of 0 mean 1; their product must equal the world size. */
US_API us_result us_mesh_init(us_mesh *mesh, us_comm *c, int dp, int pp, int cp, int tp);
US_API void us_mesh_free(us_mesh *mesh, us_comm *c);

/* ---------------------------------------------------------------- tracer
   Named regions per rank and per stream (0 = compute, 1 = communication, 2 = host), written as
   a Chrome / Perfetto trace: one process row per rank, one thread row per stream. Each (rank,
   stream) row has one writer thread, so recording takes no lock. Times are microseconds from
   us_trace_now_us(), a monotonic clock shared by the threads of a process. On a GPU the compute
   and communication rows hold the times the GPU ran the work (us_ops.mark, events on the comm
   stream); what the host did meanwhile — launching a reduction, waiting for one — is on the host
   row. On the CPU the host does the compute, and those regions sit on the compute row. */
enum { US_STREAM_COMPUTE = 0, US_STREAM_COMM = 1, US_STREAM_HOST = 2, US_TRACE_STREAMS = 3 };

typedef struct us_trace_event {
    char name[48];
    const char *cat;
    double t0, t1;
} us_trace_event;

struct us_trace {
    int rank;
    us_trace_event *ev[US_TRACE_STREAMS];
    int n[US_TRACE_STREAMS], cap[US_TRACE_STREAMS];
};

US_API double us_trace_now_us(void);
US_API void us_trace_init(us_trace *t, int rank);
US_API void us_trace_free(us_trace *t);
/* cat: "compute", "comm" or "wait" (a static string) */
US_API void us_trace_add(us_trace *t, int stream, const char *cat, const char *name, double t0_us,
                         double t1_us);
/* Writes the ranks' traces into one JSON file (traceEvents, "X" events, pid = rank, tid = stream). */
US_API us_result us_trace_write(const char *path, us_trace *const *ranks, int nranks, char *err,
                                size_t errlen);
/* The same with times measured from base_us instead of the earliest event; base_us = 0 keeps the
   clock's own times, so the files of several processes on one node line up (CLOCK_MONOTONIC). */
US_API us_result us_trace_write_at(const char *path, us_trace *const *ranks, int nranks,
                                   double base_us, char *err, size_t errlen);

/* ---------------------------------------------------------------- model and trainer */
typedef struct us_param {
    char name[80];  /* Hugging Face Llama name, e.g. model.layers.3.self_attn.q_proj.weight */
    int64_t offset; /* element offset into the flat buffers */
    int64_t numel;
    int ndim;
    int64_t shape[2];
    int decay;    /* weight decay applies (2-D weights) */
    int tp_split; /* tensor parallelism: 0 replicated, 1 rows split over tp, 2 columns split,
                     3 rows split over the kv heads (k and v when tp > NKV: tp/NKV ranks each) */
    int expert; /* expert parallelism: a routed expert's weight, held by one rank of the ep group (// >>ep) */
} us_param;

/* Bytes by category: filled from a formula by us_memory_estimate, from real allocations by the model. */
typedef struct us_memory {
    size_t
        params; /* weights the forward reads (bf16 under bf16, fp32 under fp32; under fp8 with their
                            quantised copies, tc.fp8_no_wcache) */
    size_t grads;       /* fp32 gradients */
    size_t master;      /* fp32 master weights (0 under fp32, where params are the master) */
    size_t optimizer;   /* AdamW m and v, fp32 */
    size_t activations; /* the per-step activation arena (saved activations + scratch + logits) */
    size_t total;
} us_memory;

typedef struct us_layer_acts us_layer_acts; /* per-layer activation pointers (implementation) */

typedef struct us_model {
    us_model_config cfg;
    us_train_config tc;
    us_ops ops;
    us_dtype dt;       /* activation / low-precision weight dtype */
    double *rope_freq; /* host f64[HS/2]: RoPE's inverse frequencies (us_rope_freqs) */
    int n_params_t;    /* number of parameter tensors */
    us_param *params;  /* [n_params_t] views into the flat buffers */
    int64_t n_params;  /* total elements */
    void *state;       /* the one allocation holding the five flat buffers below */
    void *w;           /* flat weights the forward reads, dtype dt     [n_params] */
    float *master;     /* fp32 master weights (== w under fp32)        [n_params] */
    float *grad;       /* fp32 gradients                               [n_params] */
    void *grad_bf;     /* grad_reduce_dtype bf16: the units' reductions in bf16 [every unit's n] */
    size_t grad_bf_bytes;
    int params_unnamed; /* the estimator's model (// >>estimate): tensor sizes, the names empty */
    float *adam_m, *adam_v; /* fp32 moments                                 [n_params] */
    char *arena;            /* activation arena                             [mem.activations] */
    us_layer_acts *acts;    /* [L] */
    struct us_gen *gen;     /* a cached generation's forward under way (// >>sample), or NULL */
    void *a[32];            /* named scratch activations (implementation) */
    us_memory mem;          /* what was really allocated */
    int step; /* optimizer steps taken (a step skipped by the loss scaler does not count) */
    /* loss scaling (// >>lossscale) */
    float loss_scale; /* S the next step's gradients carry (1: none); callers of us_forward_backward
                                 multiply their dscale by it, us_optimizer_step divides it out */
    int ls_dynamic; /* S adapts: halves on an overflow, doubles after loss_scale_window clean steps */
    int ls_good;    /* clean steps since S last changed */
    int ls_skipped; /* the last us_optimizer_step found an overflow and skipped the update */
    int64_t ls_skipped_total; /* steps skipped so far */
    /* parallelism. The flat buffers are cut into units (// >>dp): gradient buckets, or under
       ZeRO-3 one unit per layer; with ZeRO each unit is padded to split into dp equal pieces and
       this rank keeps only its piece of the sharded buffers (// >>zero). */
    us_comm *comm; /* the caller's, or `self` for one rank */
    us_comm self;
    us_mesh mesh;
    int n_units;
    struct us__unit *units; /* [n_units] in flat-buffer order */
    int *unit_of;           /* [n_params_t] unit of each tensor */
    int64_t n_flat;         /* elements of an unsharded flat buffer, padding included */
    int64_t shard_n;        /* elements of this rank's shard (n_flat without ZeRO) */
    int64_t slot_n;         /* elements of one ZeRO-2/3 staging or gather slot (the largest unit) */
    int n_gslots, n_wslots;
    /* ZeRO-2/3's slots, at most 5: two units per step of the walk (four where expert parallelism
       makes a MoE layer two units), one more for tied embeddings (us__dist_sizes_of) */
    float *gslot[5]; /* ZeRO-2/3: full gradients of the units being produced / reduced */
    void *wslot[5];  /* ZeRO-3: gathered weights of the units in use / prefetched */
    int gslot_unit[5], wslot_unit[5]; /* which unit holds each slot, -1 free */
    int grad_sync;   /* reduce gradients in this backward (us_train_step sets it) */
    int synced;      /* reductions were launched and must be finished before the step */
    int tp_inflight; /* tp collectives started and not yet waited for (// >>tp) */
    int head_fused;  /* the last forward ran the head's backward in chunks (us__head_loss) */
    /* the embedding's gradient by its touched rows (us__emb_sparse, // >>dp) */
    int emb_sparse;   /* this model reduces the last micro-batch's lookup gradient by rows */
    int emb_on;       /* this backward does: emb_nu rows gathered at its start */
    int emb_dirty;    /* the embedding's gradient may hold something not yet reduced */
    int64_t emb_nu;   /* rows touched by the dp×cp ranks' tokens this micro-batch */
    int64_t emb_nf;   /* token rows a micro-batch may have (the arena's) */
    int32_t *emb_map; /* [vocab_l] host: a row's place among them, -1 for none */
    int32_t *
        emb_ids; /* [dp·cp·(Nf + 1) + Nf] host: every rank's count and token rows, then this rank's as places */
    us_trace *trace; /* when set, compute and wait regions are recorded (comm->trace too) */
    struct us__tpend
        *tpend; /* GPU-timed regions whose marks are resolved at the step's end (// >>trace) */
    int n_tpend, cap_tpend;
    /* this rank's share under tensor parallelism (the whole model at tp 1) */
    int nh_l, nkv_l;        /* heads, kv heads */
    int kv_rep;             /* tp ranks that hold each kv head (tp > NKV: tp/NKV; else 1) */
    us_group kv_g;          /* those ranks, which sum their k and v gradients (kv_rep > 1) */
    int64_t ffn_l, vocab_l; /* FFN columns, vocabulary rows */
    int64_t vocab_off;      /* first vocabulary row of this rank */
    /* pipeline parallelism: this rank's stage (cfg.n_layers is then the stage's layer count) */
    int pp_first, pp_last,
        n_layers_global; /* this rank holds the embedding; the head; the model's layers */
    int pp_v;     /* model chunks on this rank (interleaved schedules: tc.pp_chunks; else 1) */
    int *layer_g; /* [cfg.n_layers] each local layer's index in the whole model (chunk-major) */
    int chunk_lo[16], chunk_hi[16];  /* each chunk's local layers [lo, hi) */
    int l_lo, l_hi, c_first, c_last; /* what a forward/backward runs now: layers [l_lo, l_hi);
                                              it embeds the tokens; it ends with the head and loss */
    int pp_head_rank;                /* the pp rank that holds the last stage (the head) */
    us_group tie_g;  /* tied embeddings, head apart: pp ranks 0 and pp_head_rank (// >>pp) */
    us_group dual_g; /* DualPipe: pp ranks q and pp−1−q, which hold the same stages (// >>pp) */
    us_group *
        pp_ch; /* [2·stages] the channels of each boundary between ranks (us__pp_connect), or NULL: */
    struct us__pp_msg *pp_msgs;
    int pp_nmsg;      /* the timed messages of this rank, in the order it exchanges them */
    double *pp_start; /* [actions of this rank] each action's start on the schedule's clock */
    int slots; /* micro-batches whose activations the schedule holds at once (1 without pp) */
    us_layer_acts *slot_acts; /* [slots][pp_lc]: a slot holds one chunk's layers */
    us_layer_acts *
        acts_work; /* [cfg.n_layers] what acts points to: the selected slot's layers at their chunk's place */
    int pp_lc;           /* layers of the largest chunk on this rank (all of them without chunks) */
    void *(*slot_a)[32]; /* [slots] each slot's named scratch */
    struct us_pp_schedule *pp_sched; /* the step's schedule (pp > 1) */
    int pp_peak;      /* most micro-batches whose activations the executor held at once */
    int pp_wsplit;    /* the schedule runs B and W apart: layers keep their output gradients */
    int pp_bonly;     /* inside a B action: the layers skip their weight gradients */
    int pp_slot;      /* the activation slot selected (us__pp_slot_select; 0 without pp) */
    double pp_wall_s; /* the last step's time in the executor */
    double pp_t_s[3]; /* the last step's compute in it: forwards, backwards (B or BW), W passes */
    /* the layers' tensors: layer l's are [layer_p[l], layer_p[l+1]); layer_p[n_layers] is the final
       norm. A dense layer has 9 tensors, a MoE layer 7 + 3·(E + shared) (// >>moe) */
    int *layer_p; /* [cfg.n_layers + 1] */
    /* mixture of experts (// >>moe) */
    int *moe_idx;  /* [cfg.n_layers] the layer's index among the MoE layers, -1 for a dense one */
    int n_moe;     /* MoE layers of this rank (its pipeline stages') */
    int n_moe_all; /* MoE layers of the whole model (every stage's; n_moe without pp) */
    int64_t moe_rows; /* R: rows of the permuted buffers for a full micro-batch */
    float *
        moe_bias; /* [n_moe][E] router bias (backend memory): no gradient, no AdamW, the sign rule */
    float *moe_bias_h; /* [n_moe][E] its host copy */
    /* [slots][cfg.n_layers][3E] host: the last forward's routed and kept tokens per expert, then
       the routed tokens of the whole micro-batch (summed over cp: the auxiliary loss's f_e); one
       table per pipeline slot, since a micro-batch's backward needs its own forward's counts
       (us__moe_cnt) */
    int32_t *moe_counts_h;
    int64_t *moe_load; /* [n_moe][E] host: tokens routed this step so far */
    int64_t *
        moe_load_last; /* [n_moe_all][E] host: the last step's, every stage's (us_step_stats.moe_load) */
    double *moe_pp_sum; /* [n_moe_all·E + 4] backend, pp > 1: the statistics summed over stages */
    int64_t moe_choices,
        moe_dropped;     /* this step so far: token→expert choices, and those dropped */
    double moe_aux;      /* this step so far: the auxiliary loss, as weighted in the objective */
    double moe_aux_last; /* the last forward's auxiliary loss (weighted), for tests */
    int moe_train;       /* the forward running is a training one: count its routing */
    float *moe_fb;       /* tc.moe_force_balance: host [N,E] probs, then [N,K] gates, topk */
    float moe_stat[3];   /* the last step's imbalance, aux loss, dropped fraction */
    /* host, the experts' grouped GEMMs (us__moe_mm): this rank's experts' matrices [E/ep]; their
       first rows and row counts, then the rows the bf16 grouped GEMM takes of them [4][E/ep] */
    void **moe_wp;
    int64_t *moe_go;
    /* expert parallelism (// >>ep): this rank holds routed experts [ep_rank·E/ep, (ep_rank+1)·E/ep) */
    int ep, ep_rank; /* the ep group's size (1: off) and this rank's place in it */
    us_group ep_g; /* the ranks of dp×cp that share the tokens' experts: consecutive dp×cp ranks */
    us_group
        edp_g; /* expert data parallelism: the dp×cp ranks holding the same experts (their gradients' group) */
    int64_t
        moe_rx; /* rows this rank's experts may receive: ep·R (every peer's every row), less under a capacity limit */
    int32_t *
        ep_counts_h; /* [slots][cfg.n_layers][ep][E] host: the last forward's kept tokens per expert of every ep peer */
    /* FP8 training (// >>fp8-linear) */
    int fp8; /* 0 off; 1 tile scaling (precision fp8); 2 one scale per tensor (fp8-tensor) */
    int fp8_linear,
        fp8_linear_all; /* dense linear layers of this rank whose GEMMs run in FP8, of all */
    size_t fp8_off[5];  /* offsets of sa, qb, sb, qk, sk in the FP8 scratch (qa at 0) */
    const void
        *fp8_kept; /* the output gradient whose 128×1 copy (qk, sk) Dgrad left for Wgrad, or NULL */
    int64_t fp8_kept_n, fp8_kept_c; /* its rows and columns */
    const void *fp8_pre; /* the activation whose 1×128 operand (qa, sa) a fused RMSNorm or SwiGLU
                            just wrote for the Fprop that reads it next (us__fp8_pre), or the
                            output gradient whose two operands (qa, sa; qk, sk) SwiGLU's backward
                            wrote for the Dgrad and Wgrad that read it next (us__fp8_dy), or NULL */
    int64_t fp8_pre_n, fp8_pre_c; /* its rows and columns */
    char *
        fp8_wc; /* the weight cache: W's and Wᵀ's operands of each FP8 linear of this rank, per layer
                                 (NULL: none; us__fp8_wcache) */
    const void **fp8_wkey;             /* [4·cfg.n_layers] the weight each entry is made from */
    unsigned char *fp8_wok;            /* [4·cfg.n_layers] made since the weights last changed */
    size_t fp8_wlayer, fp8_woff[4][4]; /* bytes per layer; linear i's q, s, qᵀ, sᵀ offsets in it */
    int64_t fp8_wdim[4][2];            /* linear i's (Out, In); (0, 0) when it never runs in FP8 */
    char err[256];
} us_model;

typedef struct us_step_stats {
    int step;   /* 1-based index of the step just taken */
    float loss; /* mean loss over the valid targets of the global batch */
    float lr;
    float grad_norm;  /* before clipping (unscaled; inf or NaN on a step the loss scaler skipped) */
    float loss_scale; /* S this step's gradients carried (1 without loss scaling) */
    int skipped; /* 1: the gradients overflowed, the update was skipped (step did not advance) */
    int64_t skipped_total; /* skipped steps so far */
    int64_t tokens;        /* tokens processed (B·T·grad_accum) */
    int64_t valid;         /* targets that counted toward the loss */
    float
        pp_bubble; /* pipeline: the ranks' mean idle fraction of the schedule's wall time (0 without pp) */
    float pp_cost_ms
        [3]; /* pipeline: measured F, B (a full backward BW when unsplit) and W per micro-batch
                               and rank, ranks' mean: the simulator's tF, tB, tW for this model */
    /* mixture of experts (zeros for a dense model): the step's routing over its micro-batches */
    float
        moe_imbalance; /* the most loaded expert's tokens over the mean, averaged over MoE layers (1 = balanced) */
    float
        moe_aux_loss; /* balance aux: the auxiliary loss added to the objective (not part of `loss`) */
    float moe_drop_frac; /* fraction of the token→expert choices the capacity limit dropped */
    const int64_t *
        moe_load; /* [MoE layers][E] tokens routed to each expert (the model's; valid until the next step) */
} us_step_stats;

/* Builds the model on `ops` (NULL = us_cpu_ops(tc->threads)): validates, allocates parameters,
   gradients, optimizer state and the activation arena, and initialises weights from tc->seed. */
US_API us_result us_model_init(us_model *m, const us_model_config *mc, const us_train_config *tc,
                               const us_ops *ops);
/* The same for one rank of a data-parallel group: every rank of comm's world calls it (it is a
   collective), with tc->dp = the world size. Each rank gets the same initial weights; ZeRO
   stages keep only this rank's shards. comm must outlive the model. */
US_API us_result us_model_init_dist(us_model *m, const us_model_config *mc,
                                    const us_train_config *tc, const us_ops *ops, us_comm *comm);
US_API void us_model_free(us_model *m);
US_API const char *us_model_error(const us_model *m);
US_API const us_param *us_model_find_param(const us_model *m, const char *name);

/* One optimizer step over grad_accum micro-batches. inputs/targets are host arrays
   [grad_accum][B][T] (this rank's share of the global batch; T = seq/cp, the tokens at
   us_cp_positions, under context parallelism); a target < 0 is ignored. The loss
   is the mean over the global batch's valid targets (all ranks), so k micro-batches, or k
   data-parallel ranks, equal one batch k times larger. */
US_API us_result us_train_step(us_model *m, const int32_t *inputs, const int32_t *targets,
                               us_step_stats *st);

/* The pieces of a step, for callers that drive their own loop (and for the parallel strategies). */
US_API void us_model_zero_grad(us_model *m);
/* Forward and backward of one micro-batch (B ≤ tc.batch, T ≤ tc.seq, host tokens); gradients are
   accumulated with weight dscale per valid target (1/valid for a plain mean; times m->loss_scale
   under loss scaling, // >>lossscale). Returns the summed
   loss over valid targets in *loss_sum. With dp > 1, set m->grad_sync = 1 before the last
   micro-batch so its backward launches the gradient reductions (ZeRO-2/3 reduce every one). */
US_API us_result us_forward_backward(us_model *m, const int32_t *inputs, const int32_t *targets,
                                     int B, int T, float dscale, double *loss_sum);
/* Finishes the gradient reductions, divides them by m->loss_scale, clips by global norm and applies
   AdamW with the scheduled lr (ZeRO: to this rank's shard, then all-gathers the weights); returns
   the pre-clip norm. Under loss scaling a non-finite norm skips the update (m->ls_skipped = 1, the
   step count stays) and returns US_OK; without it, US_ERR_NONFINITE. */
US_API us_result us_optimizer_step(us_model *m, float *grad_norm, float *lr);
/* Says that the weights were written from outside the library's own paths (the optimizer, the
   checkpoint loader). Under fp8 the linears' quantised weights are made at their first use after
   us_optimizer_step, us_model_zero_grad, us_ckpt_load, us_forward_eval, us_sample or
   us_task_exact_match and kept until the next (tc.fp8_no_wcache): a loop that writes weights
   between micro-batches calls this. */
US_API void us_model_weights_changed(us_model *m);
US_API float us_lr_at(const us_train_config *tc, int step); /* step is 0-based */
/* Sums n host doubles over the model's data-parallel group, dp×cp (every rank calls it): eval
   losses, counts. A no-op on one rank. */
US_API us_result us_dp_sum(us_model *m, double *v, int n);
/* Context parallelism: the global positions pos[seq/cp] of cp rank r's tokens within each
   sequence (contiguous chunk, or zig-zag halves r and 2·cp−1−r); a rank's inputs and targets
   are the sequences' tokens at these positions. tc must have passed us_config_validate. */
US_API void us_cp_positions(const us_train_config *tc, int r, int32_t *pos);

/* Forward only. Returns the summed loss over valid targets and how many predictions were right
   (argmax == target) in *correct (may be NULL). logits_out (host, may be NULL) receives the
   last position's logits of each sequence, [B][V] floats. */
US_API us_result us_forward_eval(us_model *m, const int32_t *inputs, const int32_t *targets, int B,
                                 int T, double *loss_sum, int64_t *correct, float *logits_out);
/* Forward only, the loss of every position: losses [B][T] on the host (0 where the target is
   < 0), for scores finer than a sum, as a multiple-choice evaluation's per-candidate loss.
   Under context parallelism these are this rank's positions (us_cp_positions); pipeline
   parallelism is refused (the losses live on the last stage only). */
US_API us_result us_forward_eval_losses(us_model *m, const int32_t *inputs, const int32_t *targets,
                                        int B, int T, float *losses);

/* The textbook attention, kept as the reference for tests: S = QK^T/sqrt(HS) materialised
   [T,T], causal mask, softmax, P*V. fp32, single-threaded. qkv[B,T,QKV] -> out[B,T,NH*HS]. */
US_API void us_attention_naive_fwd(float *out, const float *qkv, int64_t B, int64_t T, int NH,
                                   int NKV, int HS);

/* ---------------------------------------------------------------- random numbers */
typedef struct us_rng {
    uint64_t s;
} us_rng;

US_API void us_rng_seed(us_rng *r, uint64_t seed);
US_API uint64_t us_rng_u64(us_rng *r);
US_API float us_rng_uniform(us_rng *r); /* [0, 1) */
US_API float us_rng_normal(us_rng *r);

#ifndef ULTRASCALE_NO_DATA
/* ---------------------------------------------------------------- data */
typedef struct us_data {
    int32_t *tokens; /* host [n] */
    int64_t n;
    int64_t max_token; /* largest token id present */
    char err[256];
} us_data;

/* Bytes of a text file as tokens 0..255 (the byte-level tokenizer). */
US_API us_result us_data_load_text(us_data *d, const char *path);
/* An llm.c token shard: 256 int32 header (magic 20240520 version 1 → uint16 tokens; magic
   20240801 version 7 → uint32 tokens; [2] = token count), size checked against the header. */
US_API us_result us_data_load_shard(us_data *d, const char *path);
/* Either of the two, told apart by the magic number. */
US_API us_result us_data_load(us_data *d, const char *path);
US_API us_result us_data_from_bytes(us_data *d, const void *bytes, int64_t n);
/* Fills inputs/targets [nseq][T] with random windows of T+1 tokens (targets shifted by one). */
US_API us_result us_data_batch(us_data *d, us_rng *r, int nseq, int T, int32_t *inputs,
                               int32_t *targets);
/* The evaluation's windows: laid end to end without overlap, window i holds tokens i·T ..
   i·T + T (T inputs, and T targets shifted by one), so every token but the first is scored once.
   us_data_windows counts the whole windows of the first n tokens (n ≤ 0: all of them);
   us_data_window_batch fills inputs/targets [nseq][T] with windows first, first + 1, ... in
   order, and windows past the count with targets −1 (never scored). */
US_API int64_t us_data_windows(const us_data *d, int64_t n, int T);
US_API void us_data_window_batch(const us_data *d, int64_t first, int64_t count, int nseq, int T,
                                 int32_t *inputs, int32_t *targets);
US_API void us_data_free(us_data *d);
US_API size_t us_byte_encode(const char *text, int32_t *tokens, size_t cap);
US_API size_t us_byte_decode(const int32_t *tokens, size_t n, char *text, size_t cap);

/* Many llm.c token shards, mapped and streamed with llm.c's loader semantics: each epoch visits
   the shards in a shuffled order and, inside each, its windows of T + 1 tokens (window w holds
   tokens w·T .. w·T + T, laid end to end) in a shuffled order, so every window is read exactly
   once per epoch and the next epoch reads them in another order (a shard's last (n − 1) mod T
   tokens, too few for a window, are not trained on, as in llm.c). The shuffles are functions of
   (seed, epoch, shard): the position below is all a resume needs. A data-parallel group shares
   one stream: each us_loader_next call takes the group's batch of nseq windows and fills the
   caller's rows first .. first + count − 1 of it, so dp ranks read disjoint windows that together
   cover the batch, and the batch is that of one rank. Shards are mapped (POSIX mmap; elsewhere
   windows are read with stdio), never read whole. */
typedef struct us_loader_config { /* zero means default */
    int T;                        /* tokens per sequence: windows of T + 1 (required, > 0) */
    uint64_t seed;                /* the shuffles' seed */
    int no_shuffle;               /* 1: shards in the given order, windows in file order */
    int no_map;      /* 1: read each window with stdio instead of mapping the files (what builds
                   without POSIX mmap do) */
    int64_t vocab;   /* > 0: reading a token ≥ vocab is an error saying so */
    double hold_out; /* [0, 1): the last fraction of the tokens, in list order, is not trained on
                        (read it with us_loader_read from n_train) */
} us_loader_config;

typedef struct us_loader_pos { /* the next window: the window-th of this epoch's shard-th shard */
    int64_t epoch, shard, window;
    uint64_t seed; /* the seed that orders the stream */
} us_loader_pos;

typedef struct us_loader_shard {
    char *path;
    int tsz;                  /* bytes per token: 2 (version 1) or 4 (version 7) */
    int64_t n;                /* tokens */
    int64_t first;            /* the index of its first token in the list's concatenation */
    int64_t windows;          /* windows trained on (none reach the held-out tail) */
    const unsigned char *map; /* the mapped file; NULL: read with stdio */
    size_t map_len;
} us_loader_shard;

typedef struct us_loader {
    us_loader_config cfg;
    int n_shards;
    us_loader_shard *shards; /* [n_shards] in the given order */
    int64_t n_tokens;        /* every token of every shard */
    int64_t n_train;         /* the first n_train of them are trained on, the rest held out */
    int64_t n_windows;       /* windows per epoch */
    us_loader_pos pos;
    int64_t *order;      /* [n_shards] this epoch's shard order */
    int64_t *perm;       /* [the largest shard's windows] the current shard's window order */
    int64_t order_epoch; /* the epoch order was drawn for (−1: none) */
    int64_t perm_epoch;  /* the epoch and shard perm was drawn for (−1: none) */
    int perm_shard;
    void *file; /* the stdio fallback's open FILE, of shard file_shard */
    int file_shard;
    char err[512];
} us_loader;

/* Splits spec at commas; an item with * ? or [ is a glob pattern (POSIX glob, sorted; one that
   matches nothing is an error), any other is a path. *paths[*n] is one allocation (US_MALLOC):
   free it with free(), or US_FREE where that is overridden. */
US_API us_result us_data_expand(const char *spec, char ***paths, int *n, char *err, size_t errlen);
/* 1 when the file starts with an llm.c shard's magic (20240520 or 20240801), else 0. */
US_API int us_data_is_shard(const char *path);
/* Opens and maps n shards; every header is checked (magic, version, token count, file size) and a
   bad one refused naming the file. Fails when the shards hold no window of T + 1 to train on. */
US_API us_result us_loader_open(us_loader *l, const char *const *paths, int n,
                                const us_loader_config *cfg);
/* The group's next batch of nseq windows; fills rows first .. first + count − 1 of it into
   inputs/targets [count][T] (targets are the inputs shifted by one). Advances by nseq. */
US_API us_result us_loader_next(us_loader *l, int nseq, int first, int count, int32_t *inputs,
                                int32_t *targets);
/* Where the stream is, and going back there (a position of another run over the same shards
   continues that run's stream window for window). */
US_API us_loader_pos us_loader_tell(const us_loader *l);
US_API us_result us_loader_seek(us_loader *l, us_loader_pos pos);
/* Tokens first .. first + n − 1 of the shards laid end to end in list order, into out [n]. */
US_API us_result us_loader_read(us_loader *l, int64_t first, int64_t n, int32_t *out);
US_API void us_loader_close(us_loader *l);

/* The built-in default task (no download): sorting digits. Each line is a string of
   US_TASK_DIGITS random digits, '=', the same digits sorted, '\n' — e.g. "70421835=01234578\n".
   Only the answer (sorted digits and the newline) is scored: the other targets are -1. */
#define US_TASK_DIGITS 8
#define US_TASK_LINE (2 * US_TASK_DIGITS + 2)

typedef struct us_task {
    us_rng rng;
} us_task;

US_API void us_task_init(us_task *t, uint64_t seed);
/* Fills [nseq][T] with whole lines (T ≥ US_TASK_LINE); a window ends with newlines as padding. */
US_API void us_task_batch(us_task *t, int nseq, int T, int32_t *inputs, int32_t *targets);
/* Greedy-decodes answers to `n` fresh problems and returns the fraction solved exactly;
   writes up to `show` examples as text into buf (may be NULL). */
US_API us_result us_task_exact_match(us_model *m, us_task *t, int n, double *acc, char *buf,
                                     size_t buflen, int show);
#endif /* ULTRASCALE_NO_DATA */

#if !defined(ULTRASCALE_NO_CHECKPOINT) || !defined(ULTRASCALE_NO_TOKENIZER)
/* One example of a multiple-choice evaluation, a line of HellaSwag's JSONL as llm.c reads it:
   an object with "ctx" (a string), "endings" (2 to US_CHOICE_MAX strings) and "label" (the index of
   the right ending); other keys are skipped. On success *ctx and endings[0 .. *n_end) are new
   NUL-terminated strings the caller frees (US_FREE), and NULL comes back; otherwise a phrase
   that says what is wrong, and nothing to free. (The library's JSON reader, so it needs
   // >>checkpoint or // >>tokenizer.) */
#define US_CHOICE_MAX 16
US_API const char *us_choice_parse(const char *line, size_t n, char **ctx,
                                   char *endings[US_CHOICE_MAX], int *n_end, int *label);
#endif

#ifndef ULTRASCALE_NO_TOKENIZER
/* ---------------------------------------------------------------- tokenizer (// >>tokenizer)
   A Hugging Face tokenizer.json holding a byte-level BPE (GPT-2, Llama 3, or one trained with the
   `tokenizers` package): encode and decode give what that package gives, token for token
   (encode(text, add_special_tokens=False), decode(ids, skip_special_tokens)). Accepted: model BPE
   (merges as "a b" strings or [a, b] pairs, ignore_merges, every one of the 256 byte tokens in the
   vocabulary), no normalizer, the pre-tokeniser ByteLevel with GPT-2's regex or Split with
   Llama 3's regex followed by ByteLevel without one, the ByteLevel decoder, added and special
   tokens (lstrip, rstrip, normalized). A post-processor (ByteLevel, TemplateProcessing) adds
   tokens only under add_special_tokens: a caller who wants a BOS token adds it. Anything else is
   refused with a sentence that names it. Invalid UTF-8 in a text: each bad byte is a character
   of its own that is neither letter, number nor space. Loading allocates; encode and decode
   read the tokenizer and write only its err, on failure: threads may share one. */
typedef struct us_tokenizer {
    int64_t n_vocab;  /* ids are 0..n_vocab-1 (the model's and the added tokens'; holes allowed) */
    int64_t n_merges; /* merge ranks 0..n_merges-1 */
    int pattern;      /* US_TOK_GPT2 or US_TOK_LLAMA3: the pre-tokeniser's regex */
    int add_prefix_space; /* ByteLevel's: a space before every segment that lacks one */
    int ignore_merges;    /* a piece that is itself a token is that token (Llama 3) */
    int max_bytes;        /* the longest token's bytes */
    /* internal */
    char *pool;                   /* every token's bytes, as decode writes them */
    int64_t *off;                 /* [n_vocab] a token's bytes in pool */
    int32_t *len;                 /* [n_vocab] their count */
    uint8_t *kind;                /* [n_vocab] US__TK_* bits: in the model, added, special */
    int32_t *hash;                /* the model's tokens by their bytes, open addressing */
    int64_t hash_cap;             /* a power of two */
    struct us__tok_merge *merges; /* (left id, right id) → rank, merged id, open addressing */
    int64_t merge_cap;
    int32_t byte_id[256]; /* the token of each single byte */
    struct us__tok_added *added;
    int n_added;
    char err[256];
} us_tokenizer;

enum { US_TOK_GPT2 = 1, US_TOK_LLAMA3 = 2 };

/* us_tok_decode's flags */
#define US_TOK_SKIP_SPECIAL 1 /* leave special tokens out (skip_special_tokens=True) */
#define US_TOK_LOSSY 2 /* each invalid UTF-8 sequence becomes U+FFFD, as tokenizers' decode */
/* leave out ids the tokenizer does not hold (a model vocabulary padded past it) instead of
   failing, as tokenizers' decode drops them */
#define US_TOK_SKIP_UNKNOWN 4

US_API us_result us_tok_load(us_tokenizer *t, const char *path);
/* The same from the file's text json[n]. */
US_API us_result us_tok_parse(us_tokenizer *t, const char *json, size_t n);
US_API void us_tok_free(us_tokenizer *t);
/* text[n] (any bytes) → ids[*n_ids]; cap ≥ n (2n + 1 under add_prefix_space) holds every id. */
US_API us_result us_tok_encode(us_tokenizer *t, const char *text, size_t n, int32_t *ids,
                               size_t cap, size_t *n_ids);
/* ids[n] → the text's bytes in out[*len] and a NUL (cap ≥ *len + 1; out NULL: only *len). An
   id that is no token is an error unless flags has US_TOK_SKIP_UNKNOWN (tokenizers drops it). */
US_API us_result us_tok_decode(us_tokenizer *t, const int32_t *ids, size_t n, int flags, char *out,
                               size_t cap, size_t *len);
/* The pre-tokeniser alone: text[n] (no added tokens, no prefix space) cut into pieces, the end
   of each piece in ends[*n_pieces] (cap ≥ n). */
US_API us_result us_tok_pretokenize(us_tokenizer *t, const char *text, size_t n, size_t *ends,
                                    size_t cap, size_t *n_pieces);
#endif /* ULTRASCALE_NO_TOKENIZER */

/* ---------------------------------------------------------------- sampling and generation */
/* Extends prompt (host tokens) by n_new tokens sampled with temperature (0 = greedy) and
   top-k (0 = all); out receives prompt + new tokens, [n_prompt + n_new] <= tc.seq. Each new
   token re-runs the whole sequence: the reference that us_generate's KV cache is tested against. */
US_API us_result us_sample(us_model *m, const int32_t *prompt, int n_prompt, int n_new,
                           float temperature, int top_k, us_rng *r, int32_t *out);

/* One token from host logits lg[V]: temperature 0 = greedy (argmax, the lowest index on ties);
   else the top_k largest logits (0 = all; ties at the k-th all kept), softmax at temperature,
   then with 0 < top_p < 1 only the most likely of them whose probabilities reach top_p
   (nucleus sampling; 0 or ≥ 1 = all), one uniform draw. Every rank that draws from the same
   logits with the same rng state picks the same token. US_ERR_NONFINITE when no logit is
   finite, US_ERR_OOM when scratch memory fails. */
US_API us_result us_sample_logits(const float *lg, int64_t V, float temperature, int top_k,
                                  float top_p, us_rng *r, int32_t *tok);

/* Generation with a KV cache (// >>sample). The prompt runs once (the prefill); after that each
   step runs the model on one new token per sequence, whose query attends over the keys and
   values the cache holds for every earlier position. The cache is, for each layer of this rank,
   kv [B][max_len][2·NKV·HS] in the model's dtype (each position's k heads after RoPE, then its v
   heads), allocated through the model's ops: it lives where the model does (CPU or GPU). A
   forward call takes at most tc.seq / cp tokens per sequence (the arena's size; us_gen_forward
   cuts longer prompts into pieces), while the cache may be longer than tc.seq: positions run up to
   max_len, the model's context. Under tensor, pipeline and data parallelism every rank of the
   model's world calls these functions, with the same tokens; every rank gets the same logits.
   Context parallelism splits a training sequence, not a generation's: each cp rank holds the
   whole cache and decodes every position itself (the weights are whole on it). The cache holds
   the keys and values of the weights as they were: writing weights makes it stale
   (us_gen_reset). */
typedef struct us_gen {
    us_model *m;
    int B;             /* sequences decoded side by side, all of the same length */
    int max_len;       /* positions the cache holds */
    int len;           /* positions filled so far */
    int chunk;         /* the most tokens per sequence one forward runs (tc.seq / cp) */
    void *kv;          /* [L][B][max_len][2·NKV·HS] dt, backend memory */
    int32_t *pos;      /* backend i32[max_len]: 0, 1, 2, ... (query and key positions) */
    float *acc;        /* backend f32[B][NH][chunk][HS]: the attention's online softmax */
    float *mx, *sum;   /* backend f32[B][NH][chunk] each */
    int32_t *tgt, *in; /* host i32[B·chunk]: no targets (-1); one piece of the tokens */
    size_t bytes;      /* backend bytes held */
} us_gen;

/* B sequences (1 ≤ B ≤ tc.batch) of up to max_len positions (0 = tc.seq); errors: the model's. */
US_API us_result us_gen_init(us_gen *g, us_model *m, int B, int max_len);
/* Appends tokens [B][T] (host) at positions len .. len+T−1 of every sequence and writes each
   sequence's logits after its last token into host logits [B][V] (may be NULL). */
US_API us_result us_gen_forward(us_gen *g, const int32_t *tokens, int T, float *logits);
/* Empties the cache (len = 0): a new prompt, or weights that changed. */
US_API void us_gen_reset(us_gen *g);
US_API void us_gen_free(us_gen *g);
/* Extends prompt by n_new tokens with a KV cache (us_sample_logits for each one); out receives
   prompt + new tokens, [n_prompt + n_new], which may exceed tc.seq. */
US_API us_result us_generate(us_model *m, const int32_t *prompt, int n_prompt, int n_new,
                             float temperature, int top_k, float top_p, us_rng *r, int32_t *out);

/* ---------------------------------------------------------------- pipeline schedules (// >>pp)
   Schedules are data (DESIGN.md): a pure function lists, for every pipeline rank, the ordered
   actions it runs — forward F, full backward BW, or the zero-bubble split into B (input
   gradient) and W (weight gradient) — each for one micro-batch and one model chunk (a rank holds
   v chunks; chunk c of rank r is stage c·pp + r, or for the V-shaped schedules r then
   2·pp−1−r). DualPipe splits the model into pp stages and runs two pipelines over the same
   ranks: micro-batches 0 .. m/2−1 enter at rank 0 (stage st on rank st), m/2 .. m−1 at rank
   pp−1 (stage st on rank pp−1−st), so rank r holds stages r and pp−1−r, the lower one as chunk 0,
   and ranks r and pp−1−r hold the same two. Sends and receives follow from the stages. One
   checker validates any list (every action exactly once, dependencies, no deadlock), one
   simulator times it from per-action costs, one renderer draws it; the executor runs any list. */
typedef enum us_pp_kind {
    US_PP_DEFAULT = 0,    /* 1f1b */
    US_PP_AFAB,           /* all forwards, then all backwards (GPipe) */
    US_PP_1F1B,           /* one forward, one backward in the steady state (PipeDream-flush) */
    US_PP_INTERLEAVED,    /* 1F1B over v chunks per rank, depth-first (Megatron) */
    US_PP_INTERLEAVED_BF, /* the same, breadth-first (all micro-batches of a chunk in turn; Llama 3) */
    US_PP_ZB1, /* ZB-H1: 1F1B with B/W split, rank r defers its W's by r micro-batches (1F1B's peak) */
    US_PP_ZBV, /* ZB-V: 2 chunks per rank in a V, B/W split; 1F1B's memory, near-zero bubble */
    US_PP_DUALPIPEV, /* DualPipe-V (DeepSeek): the V with forward & backward pairs overlapped */
    US_PP_DUALPIPE /* DualPipe (DeepSeek-V3): two pipelines fed from both ends, the weights twice */
} us_pp_kind;

typedef enum us_pp_op { US_PP_F = 0, US_PP_B, US_PP_W, US_PP_BW } us_pp_op;

/* overlap = 1 marks a forward that runs together with the backward (B or BW, another
   micro-batch) right after it in the list: DualPipe's "F&B" pair, where each one's communication
   hides under the other's compute. An executor may run the pair as F then the backward. */
typedef struct us_pp_action {
    us_pp_op op;
    int mb, chunk, overlap;
} us_pp_action;

typedef struct us_pp_schedule {
    us_pp_kind kind;
    int pp, m, v;     /* ranks, micro-batches, chunks per rank */
    int vshape;       /* stages run down and back up (ZB-V, DualPipe-V) */
    int dual;         /* two pipelines, one fed at each end (DualPipe): pp stages, each twice */
    int *n;           /* [pp] actions per rank */
    us_pp_action **a; /* [pp][n[r]] */
} us_pp_schedule;

typedef struct us_pp_sim {
    double makespan;  /* time from the first action's start to the last one's end */
    double bubble;    /* idle fraction: 1 − Σ busy / (pp · makespan) */
    int peak_act[64]; /* per rank: most micro-batch chunks whose activations are held at once
                                 (from F until W; one chunk holds 1/v of the rank's layers) */
    int peak_max;
} us_pp_sim;

US_API const char *us_pp_kind_name(us_pp_kind k);
/* Builds the lists; writes a sentence into err if pp, m, v do not suit the schedule. v counts
   chunks per rank for the interleaved schedules (at least 2); the V-shaped ones and DualPipe
   always hold 2 (pass 0 or 2); the others hold 1 and ignore it. */
US_API us_result us_pp_schedule_build(us_pp_schedule *s, us_pp_kind kind, int pp, int m, int v,
                                      char *err, size_t errlen);
US_API void us_pp_schedule_free(us_pp_schedule *s);
/* The stage chunk c of rank r runs (0 .. pp·v−1, embedding first; DualPipe: 0 .. pp−1). */
US_API int us_pp_stage(const us_pp_schedule *s, int r, int c);
/* Times the lists with action costs tF, tB, tW (BW costs tB + tW) and zero-cost transfers, as
   soon as each action's inputs exist; fails with a sentence on a missing, repeated or
   impossible action, or a deadlock. The checker is this simulation with unit costs. An
   overlapped F&B pair starts when both inputs exist and costs the sum of its two actions (see
   // >>pp: overlap hides communication, which is free here, not compute). */
US_API us_result us_pp_simulate(const us_pp_schedule *s, double tF, double tB, double tW,
                                us_pp_sim *out, char *err, size_t errlen);
/* An SVG timeline (one row per rank, F/B/W boxes numbered by micro-batch, like the Playbook's). */
US_API us_result us_pp_svg(const us_pp_schedule *s, double tF, double tB, double tW,
                           const char *path, char *err, size_t errlen);

#ifndef ULTRASCALE_NO_CHECKPOINT
/* ---------------------------------------------------------------- checkpoints (// >>checkpoint)
   Weights are written as safetensors with Hugging Face Llama names and full (unsharded) tensor
   shapes, so a directory loads in `transformers` (LlamaForCausalLM.from_pretrained) and a Hugging
   Face Llama directory loads here. A checkpoint directory holds:
     config.json                 LlamaConfig fields (+ DeepSeek-style MoE fields for a MoE model)
     model.safetensors           weights in the model's dtype (F32, or BF16 under bf16), or
     model-0000i-of-0000n.safetensors + model.safetensors.index.json (shard_bytes > 0)
     optimizer.safetensors       training state, fp32: optimizer.exp_avg.<name>,
                                 optimizer.exp_avg_sq.<name>, master.<name> (bf16 policy only)
     trainer_state.json          step, the caller's RNG states and data position, the layout
   Files are layout-free: on save every rank pwrites the elements it owns (its tp/pp/ep slice,
   its ZeRO piece; one replica of dp/cp) into pre-sized files; on load every rank preads only the
   byte ranges of the slices it holds. So a checkpoint written under any dp/zero/tp/pp/cp/ep loads
   under any other. Loading under the same layout continues bit for bit; under another layout the
   weights and moments are the same numbers, and the next steps differ by the fp32 rounding of
   the new reduction order.
   Crash safety: a save writes DIR.tmp, fsyncs every file, renames it to DIR and fsyncs the parent;
   a half-written DIR.tmp is never read (us_ckpt_latest skips it) and never replaces a good DIR.
   Reading validates everything: header length (≤ US_ST_MAX_HEADER and inside the file), the JSON
   (a bounded parser), dtypes, shapes against the model config, data offsets inside the file and
   not overlapping; every failure is US_ERR_FORMAT or US_ERR_IO with one sentence. POSIX file calls
   (pread, pwrite, fsync, mkdir) are used where _POSIX_C_SOURCE ≥ 200809L; elsewhere save and load
   return US_ERR_IO saying so (the parser works everywhere). */
#define US_ST_MAX_HEADER \
    ((uint64_t)100 << 20) /* header bytes accepted, the safetensors package's limit */
#define US_ST_MAX_DIMS 8

typedef struct us_st_tensor {
    char name[256];
    char dtype[12]; /* as the file writes it: F32, BF16, F16, F64, I32, ... */
    int ndim;
    int64_t shape[US_ST_MAX_DIMS];
    uint64_t begin, end; /* byte offsets into the data section */
} us_st_tensor;

typedef struct us_safetensors {
    int n;               /* tensors */
    us_st_tensor *t;     /* [n] in header order */
    uint64_t data_start; /* 8 + header length: where the data section begins */
    uint64_t data_size;  /* file size − data_start */
} us_safetensors;

/* Parses a safetensors header from the file's first n bytes (n ≥ 8 + header length; file_size
   bounds the data offsets). Returns US_ERR_FORMAT with one sentence in err for anything wrong. */
US_API us_result us_safetensors_parse(us_safetensors *st, const void *bytes, size_t n,
                                      uint64_t file_size, char *err, size_t errlen);
US_API void us_safetensors_free(us_safetensors *st);
US_API const us_st_tensor *us_safetensors_find(const us_safetensors *st, const char *name);
/* Parses a model.safetensors.index.json text: the shard file names, deduplicated in *files
   (each [256]), and how many. Fails with US_ERR_FORMAT on a bad document or file name (a shard
   must be a plain name inside the directory: no '/', no "..") */
US_API us_result us_safetensors_index_parse(const char *json, size_t n, char (*files)[256],
                                            int max_files, int *n_files, char *err, size_t errlen);

typedef struct us_ckpt_state { /* what the caller's loop needs besides the model */
    int64_t step;              /* optimizer steps taken: saved from m->step, restored into it */
    int64_t data_pos;          /* the caller's data position (e.g. batches drawn) */
    int n_rng;                 /* RNG states kept (at most 8) */
    uint64_t rng[8];
    /* a shard loader's position (us_loader_pos, // >>data), saved when has_loader = 1 and
       restored with has_loader = 1 when the file holds one */
    int has_loader;
    int64_t loader_epoch, loader_shard, loader_window;
    uint64_t loader_seed;
    int64_t loader_tokens; /* the tokens it trains on (n_train): a resume checks the data */
} us_ckpt_state;

typedef struct us_ckpt_opts { /* zero means default */
    int weights_only;         /* 1: model weights and config.json only (an export) */
    int64_t shard_bytes;      /* > 0: model weights in files of about this size plus an index */
    int64_t
        crash_after; /* tests only: the process kills itself (SIGKILL) after writing this many data bytes */
} us_ckpt_opts;

/* Collective over the model's world: every rank calls it. Writes dir (via dir.tmp and rename;
   an existing dir is replaced only after the new one is complete). st may be NULL. */
US_API us_result us_ckpt_save(us_model *m, const char *dir, const us_ckpt_state *st,
                              const us_ckpt_opts *opts);
/* Collective. resume = 0: weights only (fine-tuning from a Hugging Face or ultrascale directory;
   moments stay zero, step 0). resume = 1: weights, fp32 master weights, moments, step, and
   *st (may be NULL) from trainer_state.json. Accepts model.safetensors or an index with shards. */
US_API us_result us_ckpt_load(us_model *m, const char *dir, int resume, us_ckpt_state *st);
/* Reads dir/config.json (LlamaConfig) into mc: fields mc leaves 0 are taken from the file; a field
   mc sets to another value is an error naming both. */
US_API us_result us_ckpt_read_config(const char *dir, us_model_config *mc, char *err,
                                     size_t errlen);
/* A checkpoint directory (has trainer_state.json) is itself; else the complete dir/step_N with the
   largest N. US_ERR_IO when there is none. */
US_API us_result us_ckpt_latest(const char *dir, char *out, size_t outlen, char *err,
                                size_t errlen);
/* Removes all but the `keep` newest dir/step_N checkpoints (and stale dir/step_N.tmp). */
US_API us_result us_ckpt_prune(const char *dir, int keep, char *err, size_t errlen);
#endif /* ULTRASCALE_NO_CHECKPOINT */

/* ---------------------------------------------------------------- estimator and FLOPs */
/* Memory by category for one rank, from the Playbook's formulas applied to this library's layout
   (no allocation). Equals us_model.mem after us_model_init with the same configs. */
US_API us_result us_memory_estimate(const us_model_config *mc, const us_train_config *tc,
                                    us_memory *out, char *err, size_t errlen);
/* The Playbook's activation formula for one layer with attention scores materialised, in bytes
   for mixed precision: s*b*h*(34 + 5*a*s/h). For comparison with what flash attention saves. */
US_API double us_playbook_activation_bytes_per_layer(int64_t seq, int64_t batch, int64_t dim,
                                                     int64_t heads);
US_API int64_t us_param_count(const us_model_config *mc);
/* Parameters one token's forward uses: a MoE layer counts its router, K routed experts and the
   shared one, not all E (us_param_count counts every expert). Equal to us_param_count when dense. */
US_API int64_t us_param_count_active(const us_model_config *mc);
/* Training FLOPs per token (Playbook): 6*N + 12*L*C*T (the attention term 12*L*h*s^2 per sequence),
   with N the active parameters (us_param_count_active): a token runs only its K experts. */
US_API double us_flops_per_token(const us_model_config *mc, int64_t seq);
/* The process's peak resident memory in bytes (Linux: VmHWM in /proc/self/status), 0 where the
   system does not say. The real peak beside the allocator's count (us_ops.bytes_peak) and the
   estimate: it also holds the program, the threads' stacks, the C heap's own overhead and
   whatever is allocated outside the ops (data, the trainer's buffers); every rank of the threads
   backend shares one process. On the GPU see us_cuda_device_used. */
US_API size_t us_peak_rss_bytes(void);

#ifndef ULTRASCALE_NO_PLANNER
/* ---------------------------------------------------------------- planner (// >>plan)
   Which parallel configuration trains a model fastest on a cluster? The Playbook's answer, as a
   search: enumerate every (dp, tp, pp, cp, ep, zero, sp, micro-batch, grad-accum, recompute, pp
   schedule) that passes us_config_validate and uses every GPU, drop what us_memory_estimate
   says does not fit, and rank the rest by a cost model built from the book's formulas and the
   measured rates below (appendix A3 for what overlaps; the pipeline simulator for the bubble).
   Every rate is zero-means-default; the defaults are this project's measurements on one H200
   (bench/RESULTS.md) and, for what one machine cannot measure, stated assumptions. */
typedef struct us_plan_rates {
    double
        gemm_tflops; /* bf16 GEMM at the model's shapes with 16384 rows (tokens); default 736 (the
                                1B step's GEMMs, H200) */
    double
        attn_fwd_tflops; /* causal flash attention forward, counted as 2·T²·C FLOPs per sequence and
                                layer; default 228 (H200, HS 64) */
    double attn_bwd_tflops; /* its backward, 2.5× the forward's FLOPs; default 180 */
    double hbm_gbps;        /* effective bandwidth of the elementwise ops and AdamW; default 3500
                                (the 1B profile: AdamW 3.2 TB/s, norms/SwiGLU/RoPE ≈ 3.9) */
    double intra_gbps;  /* bus bandwidth (NCCL's busbw) of a collective inside a node; default 333
                                (all-reduce of 1 GiB on 2 H200s) */
    double inter_gbps;  /* bus bandwidth per GPU of a collective spanning nodes; default 45 (one
                                400 Gb/s InfiniBand NIC per GPU: an assumption, not measured here) */
    double latency_us;  /* fixed cost of one collective or message; default 15 */
    double peak_tflops; /* the MFU denominator; default 989 (H100/H200 dense bf16) */
    double gemm_m_half; /* rows (tokens) at which a GEMM runs at half its large-M rate: a GEMM of M
                                rows runs at gemm_tflops · f(M)/f(16384), f(M) = M/(M + gemm_m_half);
                                default 256 (an assumption until bench/calibrate measures it) */
    double cp_attn_eff; /* attention under context parallelism runs at this fraction of the rates
                                above (smaller zig-zag blocks); default 0.86 (cp 2 on the H200: one
                                GPU's 4.30 ms of T=4096 attention took 4.985 ms over both ranks) */
    double overlap_tax; /* what the compute loses to communication hidden under it (NCCL's kernels
                                share the SMs and HBM), as a fraction of that communication's time
                                at the node's bus bandwidth: the work is per byte, so a slow
                                inter-node collective costs its bytes, not its duration. Default 1:
                                on 2 H200s a layer's backward ran 0.80 ms slower under its 0.74 ms
                                gradient all-reduce (bench/RESULTS.md, issue 9); 1e-9 gives the
                                textbook's free overlap */
} us_plan_rates;

typedef struct us_plan_cluster {
    int gpus_per_node;  /* default 8 */
    int nodes;          /* default 1 */
    double gpu_mem_gib; /* default 80 */
    double reserve_gib; /* left free: CUDA context, NCCL buffers, cuBLASLt workspace,
                                fragmentation; default 3 */
    us_plan_rates rates;
} us_plan_cluster;

typedef struct us_plan_request {
    int64_t global_tokens; /* tokens per optimizer step; default 1048576 (the Playbook's 1M) */
    int seq;               /* T; default 4096 */
    int max_micro_batch;   /* largest per-rank micro-batch tried, in sequences; default 64 */
    int top;               /* plans us_plan_enumerate keeps, best first; default 10 */
} us_plan_request;

/* One configuration and what the cost model predicts for it, all times in seconds per step. */
typedef struct us_plan {
    us_train_config tc; /* dp tp pp cp ep zero sp, batch (each rank's micro-batch), grad_accum,
                                recompute, pp_schedule, pp_chunks, seq; bf16 */
    us_memory mem;      /* per GPU (the first pipeline rank's), from us_memory_estimate */
    int fits;           /* mem.total + reserve ≤ GPU memory */
    double t_step;      /* the sum of the terms below */
    double t_compute;   /* GEMM, attention, elementwise; forward and backward, every micro-batch */
    double t_recompute; /* the forward work recomputation repeats */
    double t_tp, t_cp, t_ep; /* exposed communication of TP (critical path), CP (ring beyond its
                                compute), EP (all-to-alls) */
    double t_bubble;         /* pipeline idle: the simulator's makespan minus one rank's work */
    double t_p2p;            /* pipeline messages on the fill and drain path */
    double t_dp;             /* exposed gradient reduction, and ZeRO-1/2's weight all-gather */
    double t_zero3;          /* exposed ZeRO-3 weight gathers and gradient scatters */
    double t_optimizer;      /* AdamW over the rank's (sharded) parameters */
    double t_overlap;        /* the compute slowed by the communication hidden under it (DP, ZeRO,
                                the CP ring): overlap_tax × the hidden time */
    double tokens_per_s, mfu;
} us_plan;

US_API void us_plan_rates_defaults(us_plan_rates *r);
US_API void us_plan_cluster_defaults(us_plan_cluster *c); /* and its rates */
US_API void us_plan_request_defaults(us_plan_request *q);
/* Reads a rates file (bench/calibrate writes one): first line "ultrascale-rates 1", then
   "key = value" lines with the us_plan_rates field names; '#' starts a comment; keys not given
   keep r's values. Unknown keys, bad numbers and a wrong header fail with a sentence. */
US_API us_result us_plan_rates_read(const char *path, us_plan_rates *r, char *err, size_t errlen);
/* The cost model for one configuration (tc.dp·tp·pp·cp must equal the cluster's GPUs; tc.batch is
   each rank's micro-batch). Fails with a sentence when the configuration does not validate. */
US_API us_result us_plan_cost(const us_model_config *mc, const us_train_config *tc,
                              const us_plan_cluster *cl, us_plan *out, char *err, size_t errlen);
/* Every valid configuration of the request on the cluster; the q.top (default 10) fastest that fit
   go to out[0..*n_out) (out holds at least q.top), best first. *n_valid counts the configurations
   that validate, *n_fit those that fit (either may be NULL). No configuration fitting is not an
   error: *n_out is then 0. */
US_API us_result us_plan_enumerate(const us_model_config *mc, const us_plan_cluster *cl,
                                   const us_plan_request *q, us_plan *out, int *n_out,
                                   int64_t *n_valid, int64_t *n_fit, char *err, size_t errlen);
/* A train_cuda command line for a plan (model flags from mc): --nproc, --batch (the group's
   micro-batch, batch·dp), --grad-accum, --seq, --tp ... Returns the characters written. */
US_API int us_plan_command(const us_model_config *mc, const us_plan *p, char *buf, size_t cap);
#endif /* ULTRASCALE_NO_PLANNER */

#ifdef __cplusplus
}
#endif
#endif /* ULTRASCALE_H */

/* ==================================================================================== */
/*                                   IMPLEMENTATION                                      */
/* ==================================================================================== */
#ifdef ULTRASCALE_IMPLEMENTATION
#ifndef ULTRASCALE_IMPLEMENTATION_DONE
#define ULTRASCALE_IMPLEMENTATION_DONE

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef US_MALLOC
#define US_MALLOC(sz) malloc(sz)
#define US_FREE(p) free(p)
#endif
/* Programmer bugs only; user input gets a us_result. */
#ifndef US_ASSERT
#define US_ASSERT(x)                                                                             \
    do {                                                                                         \
        if (!(x)) {                                                                              \
            fprintf(stderr, "ultrascale: internal error: %s (%s:%d)\n", #x, __FILE__, __LINE__); \
            abort();                                                                             \
        }                                                                                        \
    } while (0)
#endif
/* Kernel scratch: a kernel has no result code, so running out of host memory there is fatal
   with a message (model-level allocations return US_ERR_OOM instead). */
static void *us__scratch(size_t bytes) {
    void *p = US_MALLOC(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "ultrascale: out of memory for %zu bytes of kernel scratch\n", bytes);
        abort();
    }
    return p;
}

#define US__ALIGN 256 /* every arena tensor starts on a 256-byte boundary (CUDA-friendly) */

static size_t us__align(size_t n) { return (n + US__ALIGN - 1) & ~(size_t)(US__ALIGN - 1); }

/* The one formatter of an error message into a buffer (err may be NULL), and the one clock, of
   both headers (ultrascale_comm.h uses them too). */
static void us__errf(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    if (!err || !errlen) return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Seconds on a monotonic clock: the trace's times, the comm backends' deadlines. In strict C99,
   where POSIX clocks are hidden, processor time (ultrascale_comm.h requires the POSIX clock). */
static double us__now_s(void) {
#ifdef CLOCK_MONOTONIC /* POSIX clocks are visible (-D_POSIX_C_SOURCE=200809L or gnu99) */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
    return (double)clock() / (double)CLOCKS_PER_SEC;
#endif
}

US_API const char *us_result_description(us_result r) {
    switch (r) {
    case US_OK:
        return "ok";
    case US_ERR_INVALID:
        return "invalid configuration or argument";
    case US_ERR_OOM:
        return "out of memory";
    case US_ERR_IO:
        return "i/o error";
    case US_ERR_FORMAT:
        return "bad file format";
    case US_ERR_NONFINITE:
        return "loss or gradient is not finite";
    case US_ERR_BACKEND:
        return "compute backend error";
    }
    return "unknown result";
}

/* ------------------------------------------------------------------------------------ */
// >>dtypes  bf16, fp16 and FP8 conversions, bit-exact round-to-nearest-even
/* ------------------------------------------------------------------------------------ */
US_API size_t us_dtype_size(us_dtype dt) {
    switch (dt) {
    case US_F32:
    case US_I32:
        return 4;
    case US_F64:
        return 8;
    case US_BF16:
    case US_F16:
        return 2;
    case US_E4M3:
    case US_E5M2:
        return 1;
    }
    return 0;
}

US_API const char *us_dtype_name(us_dtype dt) {
    switch (dt) {
    case US_F32:
        return "fp32";
    case US_BF16:
        return "bf16";
    case US_F16:
        return "fp16";
    case US_E4M3:
        return "e4m3";
    case US_E5M2:
        return "e5m2";
    case US_I32:
        return "i32";
    case US_F64:
        return "fp64";
    }
    return "?";
}

static uint32_t us__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float us__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define US__BF16_HELPERS_DEFINED

static inline float us__bf16_to_f32(uint16_t h) { return us__bits_f32((uint32_t)h << 16); }

static inline uint16_t us__f32_to_bf16(float f) {
    uint32_t u = us__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u); /* RNE: add half-ulp minus one, plus the lsb for ties */
    return (uint16_t)(u >> 16);
}

US_API uint16_t us_f32_to_bf16(float f) { return us__f32_to_bf16(f); }

US_API float us_bf16_to_f32(uint16_t h) { return us__bf16_to_f32(h); }

/* IEEE binary16 (fp16): exponent bias 15, normals 2^-14 .. 65504, subnormals m·2^-24. fp16 → fp32
   is exact (the exponent is re-biased by 127-15 = 112, the mantissa shifted up 13 bits). */
static inline float us__f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return us__bits_f32(s | 0x7f800000u | (m << 13)); /* ±inf, NaN (payload kept) */
    if (e == 0) {                                                    /* ±0 and subnormals */
        float f = (float)m * 5.9604644775390625e-8f;                 /* m · 2^-24, exact */
        return s ? -f : f;
    }
    return us__bits_f32(s | ((e + 112u) << 23) | (m << 13));
}

/* fp32 → fp16, round to nearest, ties to even, in integers (independent of the FPU's mode). */
static inline uint16_t us__f32_to_f16(float f) {
    uint32_t u = us__f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN, sign kept */
    if (a >= 0x477ff000u)
        return (uint16_t)(s | 0x7c00u); /* ≥ 65520 (the tie above 65504) and inf → inf */
    if (a < 0x38800000u) {              /* below 2^-14: an fp16 subnormal or zero */
        uint32_t e = a >> 23, man = (a & 0x7fffffu) | 0x800000u, sh, r, rem, half;
        if (e < 102) return (uint16_t)s; /* below 2^-25 (half the smallest subnormal) */
        sh = 126 - e;                    /* |x| / 2^-24 = man · 2^(e-126), sh in 14..24 */
        r = man >> sh;
        rem = man & ((1u << sh) - 1);
        half = 1u << (sh - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++; /* may carry into the smallest normal 0x0400 */
        return (uint16_t)(s | r);
    }
    a += 0x0fffu + ((a >> 13) & 1u);                  /* RNE on the 13 dropped bits */
    return (uint16_t)(s | ((a - 0x38000000u) >> 13)); /* re-bias 127 → 15; a carry may reach inf */
}

US_API uint16_t us_f32_to_f16(float f) { return us__f32_to_f16(f); }

US_API float us_f16_to_f32(uint16_t h) { return us__f16_to_f32(h); }

/* one element of a 16-bit tensor (bf16 or fp16) */
static inline float us__h16_to_f32(uint16_t h, us_dtype dt) {
    return dt == US_F16 ? us__f16_to_f32(h) : us__bf16_to_f32(h);
}

static inline uint16_t us__f32_to_h16(float f, us_dtype dt) {
    return dt == US_F16 ? us__f32_to_f16(f) : us__f32_to_bf16(f);
}

/* FP8 with `mb` mantissa bits, exponent bias `bias`, largest finite value `maxv`. The value is
   rounded to the format's grid in double (exact: scaling by powers of two), ties to even. */
static uint8_t us__f32_to_fp8(float f, int mb, int bias, double maxv, int has_inf,
                              uint8_t nan_code) {
    uint8_t sign = (us__f32_bits(f) >> 31) ? 0x80 : 0;
    double a = fabs((double)f), q, x, fl, r;
    int e, emin = 1 - bias;
    if (f != f) return (uint8_t)(sign | nan_code);
    if (isinf(f)) {
        if (has_inf) return (uint8_t)(sign | (has_inf & 0x7f));
        a = maxv;
    }
    if (a == 0) return sign;
    (void)frexp(a, &e);
    e -= 1;                 /* a = 1.m · 2^e */
    if (e < emin) e = emin; /* subnormals share the smallest exponent's grid */
    q = ldexp(1.0, e - mb); /* spacing of representable values near a */
    x = a / q;
    fl = floor(x);
    if (x - fl > 0.5 || (x - fl == 0.5 && fmod(fl, 2.0) != 0.0)) fl += 1.0;
    r = fl * q;
    if (r > maxv) r = maxv;  /* saturate (and ±inf in E4M3) */
    if (r == 0) return sign; /* underflow to (signed) zero */
    (void)frexp(r, &e);
    e -= 1;
    if (e < emin) return (uint8_t)(sign | (uint8_t)(r / ldexp(1.0, emin - mb))); /* subnormal */
    return (uint8_t)(sign | (uint8_t)((e + bias) << mb) |
                     (uint8_t)(r / ldexp(1.0, e - mb) - ldexp(1.0, mb)));
}

static float us__fp8_to_f32(uint8_t b, int mb, int bias, int has_inf) {
    int sgn = b >> 7, ex = (b >> mb) & ((1 << (7 - mb)) - 1), man = b & ((1 << mb) - 1);
    int emax = (1 << (7 - mb)) - 1;
    double v;
    if (has_inf && ex == emax)
        v = man ? NAN : INFINITY; /* E5M2: IEEE-style specials */
    else if (!has_inf && ex == emax && man == (1 << mb) - 1)
        v = NAN; /* E4M3: only S.1111.111 */
    else if (ex == 0)
        v = ldexp((double)man, 1 - bias - mb);
    else
        v = ldexp(1.0 + ldexp((double)man, -mb), ex - bias);
    return (float)(sgn ? -v : v);
}

US_API uint8_t us_f32_to_e4m3(float f) { return us__f32_to_fp8(f, 3, 7, 448.0, 0, 0x7f); }

/* The same rounding as us_f32_to_e4m3 by bit arithmetic, for the quantiser's hot loop (the
   reference above reads as the definition; tests/test_fp8.c checks that the two agree). Normal
   range: round the fp32 mantissa to 3 bits, nearest-even, letting the carry enter the exponent;
   below 2^-6 the E4M3 grid is the multiples of 2^-9, rounded with the 2^23 trick. */
static uint8_t us__e4m3_fast(float f) {
    uint32_t b = us__f32_bits(f), sign = (b >> 24) & 0x80u, a = b & 0x7fffffffu, code;
    float x;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);  /* NaN */
    if (a >= 0x43e80000u) return (uint8_t)(sign | 0x7eu); /* ≥ 464 and inf: saturate to 448 */
    if (a >= 0x3c800000u) {                               /* ≥ 2^-6: normal */
        a += 0x7ffffu + ((a >> 20) & 1u);
        code = (a >> 20) - (120u << 3); /* fp32 exponent bias 127 → E4M3's 7 */
        return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
    }
    x = us__bits_f32(a) * 512.0f;      /* exact; < 8 */
    x = (x + 8388608.0f) - 8388608.0f; /* round to an integer, nearest-even */
    return (uint8_t)(sign | (uint32_t)x);
}

US_API float us_e4m3_to_f32(uint8_t b) { return us__fp8_to_f32(b, 3, 7, 0); }

/* E5M2: has_inf carries the inf code 0x7c */
US_API uint8_t us_f32_to_e5m2(float f) { return us__f32_to_fp8(f, 2, 15, 57344.0, 0x7c, 0x7e); }

US_API float us_e5m2_to_f32(uint8_t b) { return us__fp8_to_f32(b, 2, 15, 1); }

/* Rows in and out of fp32: CPU kernels compute in fp32 and round once on store. */
static void us__load_f32(float *dst, const void *src, us_dtype dt, int64_t n) {
    int64_t i;
    if (dt == US_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    if (dt == US_F16) {
        for (i = 0; i < n; i++) dst[i] = us__f16_to_f32(((const uint16_t *)src)[i]);
        return;
    }
    for (i = 0; i < n; i++) dst[i] = us__bf16_to_f32(((const uint16_t *)src)[i]);
}

static void us__store_f32(void *dst, us_dtype dt, const float *src, int64_t n) {
    int64_t i;
    if (dt == US_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    if (dt == US_F16) {
        for (i = 0; i < n; i++) ((uint16_t *)dst)[i] = us__f32_to_f16(src[i]);
        return;
    }
    for (i = 0; i < n; i++) ((uint16_t *)dst)[i] = us__f32_to_bf16(src[i]);
}

static float us__get(const void *p, us_dtype dt, int64_t i) {
    return dt == US_F32 ? ((const float *)p)[i] : us__h16_to_f32(((const uint16_t *)p)[i], dt);
}

static void us__set(void *p, us_dtype dt, int64_t i, float v) {
    if (dt == US_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = us__f32_to_h16(v, dt);
}

/* element i of a tensor of dtype dt, as a byte pointer */
static void *us__at(const void *p, us_dtype dt, int64_t i) {
    return (char *)p + (size_t)i * us_dtype_size(dt);
}

/* ------------------------------------------------------------------------------------ */
// >>config  zero means default; validation explains in one sentence
/* ------------------------------------------------------------------------------------ */
US_API void us_model_config_defaults(us_model_config *c) {
    if (!c->vocab) c->vocab = 256;
    if (!c->dim) c->dim = 128;
    if (!c->n_layers) c->n_layers = 4;
    if (!c->n_heads) c->n_heads = 4;
    if (!c->n_kv_heads) c->n_kv_heads = c->n_heads;
    if (!c->ffn_dim) c->ffn_dim = ((8 * c->dim / 3) + 31) / 32 * 32;
    if (c->rope_theta == 0) c->rope_theta = 10000.0f;
    if (c->rope_scaling == US_ROPE_DEFAULT) c->rope_scaling = US_ROPE_NONE;
    if (c->rope_scaling == US_ROPE_LLAMA3) { /* plain RoPE leaves them 0 (us__rope_checks) */
        if (c->rope_factor == 0) c->rope_factor = 8.0f;
        if (c->rope_low_freq == 0) c->rope_low_freq = 1.0f;
        if (c->rope_high_freq == 0) c->rope_high_freq = 4.0f;
        if (!c->rope_orig_ctx) c->rope_orig_ctx = 8192;
    }
    if (c->norm_eps == 0) c->norm_eps = 1e-5f;
    if (c->init_std == 0) c->init_std = 0.02f;
    if (c->moe_experts > 0) { /* a dense model leaves the moe_ fields at 0 (validation checks) */
        if (!c->moe_top_k) c->moe_top_k = c->moe_experts < 2 ? 1 : 2;
        if (!c->moe_every) c->moe_every = 1;
        if (!c->moe_ffn_dim && c->moe_top_k > 0 && c->moe_shared >= 0)
            c->moe_ffn_dim =
                ((c->ffn_dim + c->moe_top_k + c->moe_shared - 1) / (c->moe_top_k + c->moe_shared) +
                 7) /
                8 * 8;
        if (c->moe_gate == US_MOE_GATE_DEFAULT) c->moe_gate = US_MOE_SOFTMAX;
        if (c->moe_balance == US_MOE_BALANCE_DEFAULT) c->moe_balance = US_MOE_BALANCE_BIAS;
        if (c->moe_bias_rate == 0) c->moe_bias_rate = 1e-3f;
        if (c->moe_aux_coef == 0) c->moe_aux_coef = 1e-2f;
        if (!c->moe_groups) c->moe_groups = 1;
        if (!c->moe_top_groups) c->moe_top_groups = c->moe_groups;
    }
}

US_API void us_train_config_defaults(us_train_config *c) {
    if (!c->batch) c->batch = 8;
    if (!c->seq) c->seq = 64;
    if (!c->grad_accum) c->grad_accum = 1;
    if (!c->steps) c->steps = 1000;
    if (c->lr == 0) c->lr = 3e-3f;
    if (c->min_lr_frac == 0) c->min_lr_frac = 0.1f;
    if (c->schedule == US_LR_DEFAULT) c->schedule = US_LR_COSINE;
    if (c->weight_decay == 0) c->weight_decay = 0.1f;
    if (c->beta1 == 0) c->beta1 = 0.9f;
    if (c->beta2 == 0) c->beta2 = 0.95f;
    if (c->adam_eps == 0) c->adam_eps = 1e-8f;
    if (c->grad_clip == 0) c->grad_clip = 1.0f;
    if (c->precision == US_PRECISION_DEFAULT) c->precision = US_PRECISION_FP32;
    if (c->recompute == US_RECOMPUTE_DEFAULT) c->recompute = US_RECOMPUTE_NONE;
    if (!c->seed) c->seed = 1337;
    if (!c->dp) c->dp = 1;
    if (!c->tp) c->tp = 1;
    if (!c->cp) c->cp = 1;
    if (!c->pp) c->pp = 1;
    if (!c->ep) c->ep = 1;
    if (!c->pp_schedule) c->pp_schedule = 2; /* US_PP_1F1B (declared below) */
    if (!c->pp_chunks)
        c->pp_chunks = c->pp_schedule >= 3 && c->pp_schedule != 5
                           ? 2
                           : 1; /* interleaved(-bf), ZB-V, DualPipe-V, DualPipe: 2 */
    if (c->cp_mode == US_CP_DEFAULT) c->cp_mode = US_CP_ZIGZAG;
    if (c->bucket_mb == 0) c->bucket_mb = 25.0f;
    if (c->loss_scale_window == 0) c->loss_scale_window = 2000;
}

US_API const char *us_precision_name(us_precision p) {
    return p == US_PRECISION_BF16         ? "bf16"
           : p == US_PRECISION_FP16       ? "fp16"
           : p == US_PRECISION_FP8        ? "fp8"
           : p == US_PRECISION_FP8_TENSOR ? "fp8-tensor"
                                          : "fp32";
}

US_API const char *us_cp_mode_name(us_cp_mode m) {
    return m == US_CP_RING ? "ring" : m == US_CP_ALLGATHER ? "allgather" : "zigzag";
}

US_API const char *us_recompute_name(us_recompute r) {
    return r == US_RECOMPUTE_SELECTIVE ? "selective" : r == US_RECOMPUTE_FULL ? "full" : "none";
}

/* A check that fails: the sentence into err, US_ERR_INVALID. */
#define US__BAD(...)                        \
    do {                                    \
        us__errf(err, errlen, __VA_ARGS__); \
        return US_ERR_INVALID;              \
    } while (0)

/* Each chapter checks its own settings, and us_config_validate calls the checks in turn: */
static us_result us__moe_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                                size_t errlen);
static us_result us__ep_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                               size_t errlen);
static us_result us__optimizer_checks(const us_train_config *tc, char *err, size_t errlen);
static us_result us__loss_scale_checks(const us_train_config *tc, char *err, size_t errlen);
static us_result us__fp8_checks(const us_train_config *tc, char *err, size_t errlen);
static us_result us__dp_checks(const us_train_config *tc, char *err, size_t errlen);
static us_result us__zero_checks(const us_train_config *tc, char *err, size_t errlen);
static us_result us__tp_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                               size_t errlen);
static us_result us__cp_checks(const us_train_config *tc, char *err, size_t errlen);
static us_result us__pp_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                               size_t errlen);

/* Checks the model's shape (us_config_validate). */
static us_result us__model_checks(const us_model_config *mc, char *err, size_t errlen) {
    if (mc->vocab < 2) US__BAD("vocab=%lld must be at least 2", (long long)mc->vocab);
    if (mc->vocab > (1 << 30)) US__BAD("vocab=%lld is larger than 2^30", (long long)mc->vocab);
    if (mc->dim < 2) US__BAD("dim=%lld must be at least 2", (long long)mc->dim);
    if (mc->n_layers < 1) US__BAD("layers=%d must be at least 1", mc->n_layers);
    if (mc->n_heads < 1) US__BAD("heads=%d must be at least 1", mc->n_heads);
    if (mc->n_kv_heads < 1) US__BAD("kv-heads=%d must be at least 1", mc->n_kv_heads);
    if (mc->dim % mc->n_heads)
        US__BAD("dim=%lld not divisible by heads=%d", (long long)mc->dim, mc->n_heads);
    if ((mc->dim / mc->n_heads) % 2)
        US__BAD("head size dim/heads=%lld must be even for RoPE",
                (long long)(mc->dim / mc->n_heads));
    if (mc->n_heads % mc->n_kv_heads)
        US__BAD("heads=%d not divisible by kv-heads=%d", mc->n_heads, mc->n_kv_heads);
    if (mc->ffn_dim < 1) US__BAD("ffn=%lld must be at least 1", (long long)mc->ffn_dim);
    if (mc->tie_embeddings != 0 && mc->tie_embeddings != 1)
        US__BAD("tie_embeddings=%d must be 0 or 1", mc->tie_embeddings);
    if (!(mc->norm_eps > 0)) US__BAD("norm eps=%g must be positive", mc->norm_eps);
    if (!(mc->init_std > 0)) US__BAD("init std=%g must be positive", mc->init_std);
    return US_OK;
}

/* RoPE's base and scaling (us_rope_freqs): the bounds transformers warns about are refused here. */
static us_result us__rope_checks(const us_model_config *mc, char *err, size_t errlen) {
    if (!(mc->rope_theta > 0) || mc->rope_theta > 1e30f)
        US__BAD("rope theta=%g must be a positive number", mc->rope_theta);
    if (mc->rope_scaling != US_ROPE_NONE && mc->rope_scaling != US_ROPE_LLAMA3)
        US__BAD("unknown rope scaling %d", (int)mc->rope_scaling);
    if (mc->rope_scaling == US_ROPE_NONE) {
        if (mc->rope_factor != 0 || mc->rope_low_freq != 0 || mc->rope_high_freq != 0 ||
            mc->rope_orig_ctx != 0)
            US__BAD("rope factor, low/high freq factors and original context belong to llama3 "
                    "scaling and must stay 0 without it");
        return US_OK;
    }
    if (!(mc->rope_factor >= 1) || mc->rope_factor > 1e30f)
        US__BAD("rope factor=%g must be a number of at least 1 (llama3 scaling)", mc->rope_factor);
    if (!(mc->rope_low_freq > 0) || !(mc->rope_high_freq > mc->rope_low_freq) ||
        mc->rope_high_freq > 1e30f)
        US__BAD("rope low_freq_factor=%g and high_freq_factor=%g must satisfy 0 < low < high "
                "(llama3 scaling)",
                mc->rope_low_freq, mc->rope_high_freq);
    if (mc->rope_orig_ctx < 1)
        US__BAD("rope original context=%d must be at least 1 (llama3 scaling)", mc->rope_orig_ctx);
    return US_OK;
}

/* Checks the batch, the step count, the precision, recomputation, threads (us_config_validate). */
static us_result us__train_checks(const us_train_config *tc, char *err, size_t errlen) {
    if (tc->batch < 1) US__BAD("batch=%d must be at least 1", tc->batch);
    if (tc->seq < 1) US__BAD("seq=%d must be at least 1", tc->seq);
    if (tc->grad_accum < 1) US__BAD("grad-accum=%d must be at least 1", tc->grad_accum);
    if (tc->steps < 1) US__BAD("steps=%d must be at least 1", tc->steps);
    if (tc->precision != US_PRECISION_FP32 && tc->precision != US_PRECISION_BF16 &&
        tc->precision != US_PRECISION_FP16 && tc->precision != US_PRECISION_FP8 &&
        tc->precision != US_PRECISION_FP8_TENSOR)
        US__BAD("unknown precision %d", (int)tc->precision);
    if (tc->loss_chunk < -1)
        US__BAD("loss_chunk=%d must be -1 (whole logits), 0 (the default) or a number of rows",
                tc->loss_chunk);
    if (tc->loss_chunk > 0 && (tc->pp > 1 || tc->zero >= 2))
        US__BAD("loss_chunk=%d needs pp 1 and ZeRO below 2 (the chunked head forms its weight "
                "gradient in the forward, where a pipeline or sharded gradients cannot take it)",
                tc->loss_chunk);
    if (tc->recompute < US_RECOMPUTE_NONE || tc->recompute > US_RECOMPUTE_FULL)
        US__BAD("unknown recompute mode %d", (int)tc->recompute);
    if (tc->threads < 0) US__BAD("threads=%d must not be negative", tc->threads);
    return US_OK;
}

/* Checks no byte count may wrap (us_config_validate). */
static us_result us__size_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                                 size_t errlen) {
    { /* sizes are int64 everywhere: refuse configurations whose byte counts could wrap */
        double C = (double)mc->dim, F = (double)mc->ffn_dim, V = (double)mc->vocab,
               N = (double)tc->batch * tc->seq;
        double P = V * C * 2 + mc->n_layers * (2 * C + 2 * C * C * 2 + 3 * C * F) +
                   C; /* at most, with MHA */
        double act =
            N * (mc->n_layers + 2.0) * (12 * C + 6 * F + 4.0 * mc->n_heads) * 4 + N * V * 4;
        if (P * 18 + act > 4e18)
            US__BAD("the configuration needs more than 4 EB of memory (%.3g bytes)", P * 18 + act);
    }
    return US_OK;
}

US_API us_result us_config_validate(us_model_config *mc, us_train_config *tc, char *err,
                                    size_t errlen) {
    us_result r;
    us_model_config_defaults(mc);
    us_train_config_defaults(tc);
    if ((r = us__model_checks(mc, err, errlen)) != US_OK) return r;
    if ((r = us__rope_checks(mc, err, errlen)) != US_OK) return r;
    if ((r = us__moe_checks(mc, tc, err, errlen)) != US_OK) return r;
    if ((r = us__ep_checks(mc, tc, err, errlen)) != US_OK) return r;
    if ((r = us__train_checks(tc, err, errlen)) != US_OK) return r;
    if ((r = us__optimizer_checks(tc, err, errlen)) != US_OK) return r;
    if ((r = us__loss_scale_checks(tc, err, errlen)) != US_OK) return r;
    if ((r = us__fp8_checks(tc, err, errlen)) != US_OK) return r;
    if ((r = us__dp_checks(tc, err, errlen)) != US_OK) return r;
    if ((r = us__zero_checks(tc, err, errlen)) != US_OK) return r;
    if ((r = us__tp_checks(mc, tc, err, errlen)) != US_OK) return r;
    if ((r = us__cp_checks(tc, err, errlen)) != US_OK) return r;
    if ((r = us__pp_checks(mc, tc, err, errlen)) != US_OK) return r;
    if ((r = us__size_checks(mc, tc, err, errlen)) != US_OK) return r;
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>gemm  cache-blocked, packed, OpenMP fp32 GEMM with bf16 operands (the CPU hot loop)
/* ------------------------------------------------------------------------------------ */
/* ---------------------------------------------------------------------------
   us__gemm: blocked, packed, deterministic CPU GEMM (fp32 / bf16 in & out).

   Structure (GotoBLAS / BLIS):
     for jc in N by NC            -- B panel (KC x NC) shared by all threads, L3
       for pc in K by KC          -- fixed K blocking => fixed summation order
         pack B(pc:pc+KC, jc:jc+NC) into NR-column slivers (threads split it)
         barrier
         for ic in my rows by MC  -- A block (MC x KC) private per thread, L2
           pack A(ic, pc) into MR-row slivers
           for jr in my NR slivers   -- B sliver (KC x NR) stays in L1
             for ir in MR slivers    -- A sliver streams from L2
               micro-kernel MR x NR (6 x 16, 12 ymm accumulators)
         barrier
   Determinism: every C element is produced by exactly one thread, with a
   K order (KC blocks ascending, k ascending inside) that depends only on the
   shape, never on nthreads. Threads only split M (and N when M is small).

   Assumes <stdint.h> <stddef.h> <string.h> <stdlib.h> <math.h> (and <omp.h>
   under _OPENMP) were included before this fragment.
   --------------------------------------------------------------------------- */

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define US__GEMM_AVX2 1
#else
#define US__GEMM_AVX2 0
#endif

/* Register block (micro-tile) and cache blocks, tuned for Zen3 (32K L1d,
   512K L2 per core): B sliver KC*NR*4 = 16 KB in L1, A block MC*KC*4 = 144 KB
   in L2, B panel KC*NC*4 ~ 4 MB in L3. KC must not depend on nthreads. */
#define US__GEMM_MR 6
#define US__GEMM_NR 16
#ifndef US__GEMM_KC
#define US__GEMM_KC 256
#endif
#ifndef US__GEMM_MC
#define US__GEMM_MC 144 /* multiple of MR */
#endif
#ifndef US__GEMM_NC
#define US__GEMM_NC 4080 /* multiple of NR */
#endif

/* C = a*x + y with a fused multiply-add where the hardware has one, so the
   scalar edge epilogue rounds like the vector one. */
static inline float us__gemm_fma(float a, float x, float y) {
#if defined(__FMA__)
    return fmaf(a, x, y);
#else
    return a * x + y;
#endif
}

/* Where a micro-tile's result goes. Always v = alpha*acc + beta*c (beta==0
   never reads c). If cb is NULL, v is stored to the fp32 tile c. Otherwise this
   is the last K pass of a 16-bit C (bf16, or fp16 when cf16): v += betab*cb (betab==0 never
   reads cb) and v is rounded once into cb; c is then only read, never written. */
typedef struct {
    float *c;
    int64_t ldc;
    float alpha, beta;
    uint16_t *cb;
    int64_t ldcb;
    float betab;
    int cf16;
} us__gemm_out;

/* Scalar epilogue for edge tiles (and the portable build). */
static void us__gemm_store_tile(const float *acc /* [MR][NR] */, const us__gemm_out *o, int mr,
                                int nr) {
    int i, j;
    for (i = 0; i < mr; i++) {
        const float *ai = acc + i * US__GEMM_NR;
        for (j = 0; j < nr; j++) {
            float v = o->alpha * ai[j];
            if (o->beta != 0.0f) v = us__gemm_fma(o->beta, o->c[i * o->ldc + j], v);
            if (!o->cb) {
                o->c[i * o->ldc + j] = v;
            } else {
                uint16_t *d = o->cb + i * o->ldcb + j;
                if (o->betab != 0.0f)
                    v = us__gemm_fma(o->betab, o->cf16 ? us__f16_to_f32(*d) : us__bf16_to_f32(*d),
                                     v);
                *d = o->cf16 ? us__f32_to_f16(v) : us__f32_to_bf16(v);
            }
        }
    }
}

#if US__GEMM_AVX2
/* Vector epilogue for one 8-wide row segment; same arithmetic as the scalar one. */
static inline void us__gemm_store8(__m256 acc, const us__gemm_out *o, int64_t off_c,
                                   int64_t off_cb) {
    __m256 v = _mm256_mul_ps(_mm256_set1_ps(o->alpha), acc);
    if (o->beta != 0.0f)
        v = _mm256_fmadd_ps(_mm256_set1_ps(o->beta), _mm256_loadu_ps(o->c + off_c), v);
    if (!o->cb) {
        _mm256_storeu_ps(o->c + off_c, v);
    } else if (o->cf16) {
        /* fp16 C: the scalar RNE conversion (the CPU fp16 path is for checking, not speed) */
        float t[8];
        uint16_t *d = o->cb + off_cb;
        int j;
        if (o->betab != 0.0f) {
            for (j = 0; j < 8; j++) t[j] = us__f16_to_f32(d[j]);
            v = _mm256_fmadd_ps(_mm256_set1_ps(o->betab), _mm256_loadu_ps(t), v);
        }
        _mm256_storeu_ps(t, v);
        for (j = 0; j < 8; j++) d[j] = us__f32_to_f16(t[j]);
    } else {
        uint16_t *d = o->cb + off_cb;
        __m256i u, r, nan, h;
        __m128i lo;
        if (o->betab != 0.0f) {
            __m256i old = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)d));
            v = _mm256_fmadd_ps(_mm256_set1_ps(o->betab),
                                _mm256_castsi256_ps(_mm256_slli_epi32(old, 16)), v);
        }
        /* RNE to bf16, as us__f32_to_bf16: u + 0x7fff + lsb, NaN -> quiet NaN. */
        u = _mm256_castps_si256(v);
        r = _mm256_add_epi32(
            u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
        nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                 _mm256_set1_epi32(0x7f800000));
        h = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16),
                               _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040)),
                               nan);
        /* 8 x u32 (each <= 0xffff) -> 8 x u16: pack within lanes, then gather qwords 0 and 2. */
        h = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
        lo = _mm256_castsi256_si128(h);
        _mm_storeu_si128((__m128i *)d, lo);
    }
}
#endif

/* Micro-kernel: c[mr x nr] (= or +=) alpha * a_sliver[kc x MR]^T . b_sliver[kc x NR].
   a: packed MR-row sliver, a[k*MR + i]; b: packed NR-col sliver, b[k*NR + j].
   Both are zero-padded, so the full 6x16 product is always computed and only
   the store is trimmed for edge tiles. */
static void us__gemm_ukr(int64_t kc, const float *a, const float *b, const us__gemm_out *o, int mr,
                         int nr) {
#if US__GEMM_AVX2
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    int64_t k;
    /* Warm the C tile while the K loop runs (it is touched only at the end). */
    {
        int i;
        if (o->beta != 0.0f)
            for (i = 0; i < mr; i++) {
                _mm_prefetch((const char *)(o->c + i * o->ldc), _MM_HINT_T0);
                _mm_prefetch((const char *)(o->c + i * o->ldc + 15), _MM_HINT_T0);
            }
        if (o->cb && o->betab != 0.0f)
            for (i = 0; i < mr; i++) _mm_prefetch((const char *)(o->cb + i * o->ldcb), _MM_HINT_T0);
    }
    for (k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), av;
        av = _mm256_broadcast_ss(a + 0);
        c00 = _mm256_fmadd_ps(av, b0, c00);
        c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(a + 1);
        c10 = _mm256_fmadd_ps(av, b0, c10);
        c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(a + 2);
        c20 = _mm256_fmadd_ps(av, b0, c20);
        c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(a + 3);
        c30 = _mm256_fmadd_ps(av, b0, c30);
        c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(a + 4);
        c40 = _mm256_fmadd_ps(av, b0, c40);
        c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(a + 5);
        c50 = _mm256_fmadd_ps(av, b0, c50);
        c51 = _mm256_fmadd_ps(av, b1, c51);
        a += US__GEMM_MR;
        b += US__GEMM_NR;
    }
    if (mr == US__GEMM_MR && nr == US__GEMM_NR) {
        /* Full tile: vector epilogue straight into C (or the fp32 workspace). */
#define US__GEMM_ST(row, lo, hi)                                     \
    do {                                                             \
        us__gemm_store8(lo, o, (row)*o->ldc, (row)*o->ldcb);         \
        us__gemm_store8(hi, o, (row)*o->ldc + 8, (row)*o->ldcb + 8); \
    } while (0)
        US__GEMM_ST(0, c00, c01);
        US__GEMM_ST(1, c10, c11);
        US__GEMM_ST(2, c20, c21);
        US__GEMM_ST(3, c30, c31);
        US__GEMM_ST(4, c40, c41);
        US__GEMM_ST(5, c50, c51);
#undef US__GEMM_ST
    } else {
        float acc[US__GEMM_MR * US__GEMM_NR];
        _mm256_storeu_ps(acc + 0 * 16, c00);
        _mm256_storeu_ps(acc + 0 * 16 + 8, c01);
        _mm256_storeu_ps(acc + 1 * 16, c10);
        _mm256_storeu_ps(acc + 1 * 16 + 8, c11);
        _mm256_storeu_ps(acc + 2 * 16, c20);
        _mm256_storeu_ps(acc + 2 * 16 + 8, c21);
        _mm256_storeu_ps(acc + 3 * 16, c30);
        _mm256_storeu_ps(acc + 3 * 16 + 8, c31);
        _mm256_storeu_ps(acc + 4 * 16, c40);
        _mm256_storeu_ps(acc + 4 * 16 + 8, c41);
        _mm256_storeu_ps(acc + 5 * 16, c50);
        _mm256_storeu_ps(acc + 5 * 16 + 8, c51);
        us__gemm_store_tile(acc, o, mr, nr);
    }
#else
    /* Portable path (correctness first, ~10-20 GFLOP/s): same tile shape and
       the same ascending-k order, two rows at a time; the j loops auto-vectorise. */
    float acc[US__GEMM_MR * US__GEMM_NR];
    int64_t k;
    int i, j;
    for (i = 0; i < US__GEMM_MR; i += 2) {
        float r0[US__GEMM_NR], r1[US__GEMM_NR];
        const float *ak = a + i, *bk = b;
        for (j = 0; j < US__GEMM_NR; j++) r0[j] = r1[j] = 0.0f;
        for (k = 0; k < kc; k++) {
            const float a0 = ak[0], a1 = ak[1];
            for (j = 0; j < US__GEMM_NR; j++) {
                r0[j] += a0 * bk[j];
                r1[j] += a1 * bk[j];
            }
            ak += US__GEMM_MR;
            bk += US__GEMM_NR;
        }
        for (j = 0; j < US__GEMM_NR; j++) {
            acc[i * US__GEMM_NR + j] = r0[j];
            acc[(i + 1) * US__GEMM_NR + j] = r1[j];
        }
    }
    us__gemm_store_tile(acc, o, mr, nr);
#endif
}

/* Pack op(A)[i0:i0+mc, p0:p0+kc] into MR-row slivers: dst[s][k][MR], rows past
   mc zero-padded so the micro-kernel never branches on edges. */
static void us__gemm_pack_a(int ta, const void *A, int dtA, int64_t lda, int64_t i0, int64_t mc,
                            int64_t p0, int64_t kc, float *dst) {
    const int64_t sl = kc * US__GEMM_MR; /* floats per sliver */
    int64_t is, k;
    if (!ta) {
        /* A is M x K row-major: per sliver, MR rows each contiguous along k. */
        for (is = 0; is < mc; is += US__GEMM_MR) {
            const int mr = (int)(mc - is < US__GEMM_MR ? mc - is : US__GEMM_MR);
            float *d = dst + (is / US__GEMM_MR) * sl;
            int i;
            if (dtA == 0) {
                const float *src = (const float *)A + (i0 + is) * lda + p0;
                for (i = 0; i < mr; i++)
                    for (k = 0; k < kc; k++) d[k * US__GEMM_MR + i] = src[i * lda + k];
            } else {
                const uint16_t *src = (const uint16_t *)A + (i0 + is) * lda + p0;
                for (i = 0; i < mr; i++)
                    for (k = 0; k < kc; k++)
                        d[k * US__GEMM_MR + i] = us__h16_to_f32(src[i * lda + k], (us_dtype)dtA);
            }
            for (i = mr; i < US__GEMM_MR; i++)
                for (k = 0; k < kc; k++) d[k * US__GEMM_MR + i] = 0.0f;
        }
    } else {
        /* A stored K x M: walk storage rows k in order (sequential reads of mc
           values) and scatter MR-wide pieces into the slivers. */
        const int64_t full = mc / US__GEMM_MR * US__GEMM_MR, rem = mc - full;
        for (k = 0; k < kc; k++) {
            float *d = dst + k * US__GEMM_MR;
            int64_t i;
#if US__GEMM_AVX2
            /* Rows are lda apart: the hardware prefetcher does not follow that
               well, so request the row 8 steps ahead explicitly. */
            if (k + 8 < kc) {
                const char *pf = (const char *)A + ((p0 + k + 8) * lda + i0) * (dtA ? 2 : 4);
                const int64_t bytes = mc * (dtA ? 2 : 4);
                int64_t o;
                for (o = 0; o < bytes + 63; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
            }
#endif
            if (dtA == 0) {
                const float *src = (const float *)A + (p0 + k) * lda + i0;
                for (is = 0; is < full; is += US__GEMM_MR, d += sl)
                    for (i = 0; i < US__GEMM_MR; i++) d[i] = src[is + i];
                for (i = 0; i < rem; i++) d[i] = src[full + i];
            } else {
                const uint16_t *src = (const uint16_t *)A + (p0 + k) * lda + i0;
                for (is = 0; is < full; is += US__GEMM_MR, d += sl)
                    for (i = 0; i < US__GEMM_MR; i++)
                        d[i] = us__h16_to_f32(src[is + i], (us_dtype)dtA);
                for (i = 0; i < rem; i++) d[i] = us__h16_to_f32(src[full + i], (us_dtype)dtA);
            }
            if (rem)
                for (i = rem; i < US__GEMM_MR; i++) d[i] = 0.0f;
        }
    }
}

/* Pack one NR-column sliver of op(B)[p0:p0+kc, j0:j0+nr] into dst[k][NR]
   (zero-padded to NR) so the micro-kernel streams contiguous aligned memory. */
static void us__gemm_pack_b_sliver(int tb, const void *B, int dtB, int64_t ldb, int64_t p0,
                                   int64_t kc, int64_t j0, int nr, float *dst) {
    int64_t k;
    int j;
    if (!tb) {
        /* B is K x N row-major: each k contributes NR contiguous values. */
        for (k = 0; k < kc; k++) {
            const int64_t base = (p0 + k) * ldb + j0;
            float *d = dst + k * US__GEMM_NR;
            if (dtB == 0) {
                const float *src = (const float *)B + base;
#if US__GEMM_AVX2
                if (nr == US__GEMM_NR) {
                    _mm256_store_ps(d, _mm256_loadu_ps(src));
                    _mm256_store_ps(d + 8, _mm256_loadu_ps(src + 8));
                    continue;
                }
#endif
                for (j = 0; j < nr; j++) d[j] = src[j];
            } else {
                const uint16_t *src = (const uint16_t *)B + base;
#if US__GEMM_AVX2
                if (nr == US__GEMM_NR && dtB == US_BF16) {
                    /* bf16 -> f32: zero-extend to 32 bits, shift into the high half. */
                    __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
                    __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 8)));
                    _mm256_store_ps(d, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
                    _mm256_store_ps(d + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
                    continue;
                }
#endif
                for (j = 0; j < nr; j++) d[j] = us__h16_to_f32(src[j], (us_dtype)dtB);
            }
            for (j = nr; j < US__GEMM_NR; j++) d[j] = 0.0f;
        }
    } else {
        /* B stored N x K (we want B^T): NR rows, each contiguous along k.
           Reading row by row keeps the source streams sequential; the 16 KB
           destination stays in L1 for the strided writes. */
        for (j = 0; j < nr; j++) {
            const int64_t base = (j0 + j) * ldb + p0;
            if (dtB == 0) {
                const float *src = (const float *)B + base;
                for (k = 0; k < kc; k++) dst[k * US__GEMM_NR + j] = src[k];
            } else {
                const uint16_t *src = (const uint16_t *)B + base;
                for (k = 0; k < kc; k++)
                    dst[k * US__GEMM_NR + j] = us__h16_to_f32(src[k], (us_dtype)dtB);
            }
        }
        for (j = nr; j < US__GEMM_NR; j++)
            for (k = 0; k < kc; k++) dst[k * US__GEMM_NR + j] = 0.0f;
    }
}

/* Everything a worker thread needs; read-only except the buffers it owns. */
typedef struct {
    int ta, tb, dtA, dtB, dtC;
    int64_t M, N, K, lda, ldb, ldc;
    const void *A, *B;
    void *C;
    float alpha, beta;
    int64_t nc_max;
    float *bpack; /* KC x nc_max, shared */
    float *apack; /* per thread: MC x KC */
    float *cws;   /* bf16 C only: fp32 accumulator, M x nc_max (ld = nc_max) */
    int tm, tn;   /* thread grid: tm row groups x tn column groups */
} us__gemm_ctx;

static void us__gemm_worker(const us__gemm_ctx *g, int tid, int nt) {
    const int64_t MR = US__GEMM_MR, NR = US__GEMM_NR;
    const int64_t KC = US__GEMM_KC, MC = US__GEMM_MC;
    /* If the runtime gave us fewer threads than planned, fall back to a 1-D split. */
    const int tm = (nt == g->tm * g->tn) ? g->tm : nt, tn = (nt == g->tm * g->tn) ? g->tn : 1;
    const int tmi = tid % tm, tni = tid / tm;
    const int64_t ms = (g->M + MR - 1) / MR;
    /* This thread's rows: a contiguous run of whole MR slivers (balanced). */
    const int64_t row_lo = (ms * tmi / tm) * MR;
    const int64_t row_hi = (ms * (tmi + 1) / tm) * MR < g->M ? (ms * (tmi + 1) / tm) * MR : g->M;
    float *apack = g->apack + (int64_t)tid * MC * KC;
    int64_t jc, pc;

    for (jc = 0; jc < g->N; jc += g->nc_max) {
        const int64_t nc = g->N - jc < g->nc_max ? g->N - jc : g->nc_max;
        const int64_t ns = (nc + NR - 1) / NR;
        const int64_t s_lo = ns * tni / tn, s_hi = ns * (tni + 1) / tn;
        /* fp32 C: accumulate in place across K passes. bf16 C: accumulate in
           the fp32 workspace (only exists when K > KC) and round once, in the
           last pass's epilogue, so K blocking never double-rounds. */
        float *cf = g->dtC ? g->cws : (float *)g->C + jc;
        const int64_t ldcf = g->dtC ? g->nc_max : g->ldc;

        for (pc = 0; pc < g->K; pc += KC) {
            const int64_t kc = g->K - pc < KC ? g->K - pc : KC;
            const int first = (pc == 0), last = (pc + kc >= g->K);
            us__gemm_out o;
            int64_t s, ic;
            o.alpha = g->alpha;
            o.beta =
                first ? (g->dtC ? 0.0f : g->beta) : 1.0f; /* later passes add to the partial sums */
            o.betab = g->beta;
            o.ldc = ldcf;
            o.ldcb = g->ldc;

            /* Pack the shared B panel: slivers split statically over all threads. */
            for (s = ns * tid / nt; s < ns * (tid + 1) / nt; s++) {
                const int64_t j0 = s * NR;
                const int nr = (int)(nc - j0 < NR ? nc - j0 : NR);
                us__gemm_pack_b_sliver(g->tb, g->B, g->dtB, g->ldb, pc, kc, jc + j0, nr,
                                       g->bpack + s * kc * NR);
            }
#ifdef _OPENMP
#pragma omp barrier
#endif
            for (ic = row_lo; ic < row_hi; ic += MC) {
                const int64_t mc = row_hi - ic < MC ? row_hi - ic : MC;
                us__gemm_pack_a(g->ta, g->A, g->dtA, g->lda, ic, mc, pc, kc, apack);
                for (s = s_lo; s < s_hi; s++) {
                    const int64_t j0 = s * NR;
                    const int nr = (int)(nc - j0 < NR ? nc - j0 : NR);
                    const float *bs = g->bpack + s * kc * NR;
                    int64_t ir;
                    for (ir = 0; ir < mc; ir += MR) {
                        const int mr = (int)(mc - ir < MR ? mc - ir : MR);
                        o.c = cf ? cf + (ic + ir) * ldcf + j0 : NULL;
                        o.cb = (g->dtC && last) ? (uint16_t *)g->C + (ic + ir) * g->ldc + jc + j0
                                                : NULL;
                        o.cf16 = g->dtC == US_F16;
                        us__gemm_ukr(kc, apack + ir * kc, bs, &o, mr, nr);
                    }
                }
            }
            /* Nobody may repack B (next pc / jc) while others still read it. */
#ifdef _OPENMP
#pragma omp barrier
#endif
        }
    }
}

/* Pointer rounded up to a 64-byte boundary (C99 has no portable aligned_alloc). */
static float *us__gemm_align64(void *p) {
    return (float *)(((uintptr_t)p + 63u) & ~(uintptr_t)63u);
}

/* K == 0 or alpha == 0 (as in BLAS): C[M,N] = beta * C without touching A or B; beta == 0 never
   reads C, so an uninitialised C becomes zeros. */
static void us__gemm_scale_c(int64_t M, int64_t N, float beta, void *C, int dtC, int64_t ldc) {
    int64_t i, j;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            const float v = beta == 0.0f ? 0.0f : beta * us__get(C, (us_dtype)dtC, i * ldc + j);
            if (dtC)
                ((uint16_t *)C)[i * ldc + j] = us__f32_to_h16(v, (us_dtype)dtC);
            else
                ((float *)C)[i * ldc + j] = v;
        }
}

/* Tiny problems (M·N·K < 32³): packing would cost more than it saves. Straight dot products
   C[M,N] with the same ascending-k fp32 accumulation as the micro-kernel. */
static void us__gemm_small(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                           const void *A, int dtA, int64_t lda, const void *B, int dtB, int64_t ldb,
                           float beta, void *C, int dtC, int64_t ldc) {
    const int64_t sai = ta ? 1 : lda, sak = ta ? lda : 1; /* op(A)[i,k] = A[i*sai + k*sak] */
    const int64_t sbk = tb ? 1 : ldb, sbj = tb ? ldb : 1; /* op(B)[k,j] = B[k*sbk + j*sbj] */
    int64_t i, j;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            float acc = 0.0f, v;
            int64_t k;
            for (k = 0; k < K; k++)
                acc = us__gemm_fma(us__get(A, (us_dtype)dtA, i * sai + k * sak),
                                   us__get(B, (us_dtype)dtB, k * sbk + j * sbj), acc);
            v = alpha * acc;
            if (beta != 0.0f) v = us__gemm_fma(beta, us__get(C, (us_dtype)dtC, i * ldc + j), v);
            if (dtC)
                ((uint16_t *)C)[i * ldc + j] = us__f32_to_h16(v, (us_dtype)dtC);
            else
                ((float *)C)[i * ldc + j] = v;
        }
}

/* The width of a column block, g->nc_max (≤ NC, no wider than N rounded up to NR): a 16-bit C
   over several K passes accumulates in an fp32 [M, nc_max] workspace, capped at ~16M floats. */
static void us__gemm_col_block(us__gemm_ctx *g) {
    const int64_t NR = US__GEMM_NR;
    g->nc_max = US__GEMM_NC;
    if (g->dtC && g->K > US__GEMM_KC) {
        int64_t cap = ((int64_t)1 << 24) / g->M / NR * NR;
        if (cap < NR) cap = NR;
        if (cap < g->nc_max) g->nc_max = cap;
    }
    if (g->nc_max > (g->N + NR - 1) / NR * NR) g->nc_max = (g->N + NR - 1) / NR * NR;
}

/* The thread grid g->tm x g->tn (tm·tn == nt): prefer splitting M (no duplicated A packing);
   split N when M has too few MR slivers to balance. */
static void us__gemm_thread_grid(us__gemm_ctx *g, int nt) {
    const int64_t MR = US__GEMM_MR, NR = US__GEMM_NR;
    const int64_t ms = (g->M + MR - 1) / MR, ns = (g->nc_max + NR - 1) / NR;
    double best_eff = -1.0;
    int t, best_tm = nt;
    for (t = nt; t >= 1; t--) {
        if (nt % t) continue;
        {
            const int64_t tn = nt / t;
            const double em = ((double)ms / t) / (double)((ms + t - 1) / t);
            const double en = ((double)ns / tn) / (double)((ns + tn - 1) / tn);
            /* small penalty per extra column group: each one repacks A */
            const double eff = em * en - 0.02 * (double)(tn - 1);
            if (eff > best_eff + 1e-9) {
                best_eff = eff;
                best_tm = t;
            }
        }
    }
    g->tm = best_tm;
    g->tn = nt / best_tm;
}

/* The packed path: column blocks, K passes and MC x NR tiles (us__gemm_worker) over nt threads,
   with one scratch allocation cut into the B panel [KC, nc_max], the A blocks [nt][MC, KC] and,
   for a 16-bit C over several K passes, the fp32 workspace [M, nc_max]. */
static void us__gemm_packed(us__gemm_ctx *g, int nt) {
    const int64_t KC = US__GEMM_KC, MC = US__GEMM_MC;
    const int64_t kc_max = g->K < KC ? g->K : KC;
    size_t nb = (size_t)(kc_max * g->nc_max);
    const size_t na = (size_t)(MC * KC) * (size_t)nt;
    const size_t nw = (g->dtC && g->K > KC) ? (size_t)(g->M * g->nc_max) : 0;
    void *raw;
    /* One allocation, three 64-byte aligned regions (each a multiple of 16 floats). */
    nb = (nb + 15) & ~(size_t)15;
    raw = us__scratch((nb + na + nw) * sizeof(float) + 64);
    g->bpack = us__gemm_align64(raw);
    g->apack = g->bpack + nb;
    g->cws = nw ? g->apack + na : NULL;

#ifdef _OPENMP
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        us__gemm_worker(g, omp_get_thread_num(), omp_get_num_threads());
    } else {
        us__gemm_worker(g, 0, 1);
    }
#else
    us__gemm_worker(g, 0, 1);
#endif
    US_FREE(raw);
}

/* C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C, all row-major.
   op(A) = A (M x K, stride lda) if ta==0, else A^T (A stored K x M, stride lda).
   op(B) = B (K x N, stride ldb) if tb==0, else B^T (B stored N x K, stride ldb).
   dtA/dtB/dtC: a us_dtype, US_F32 (0), US_BF16 (1) or US_F16 (uint16_t). fp32 accumulation; a
   16-bit C is rounded once (RNE). beta==0 never reads C. K==0 (or alpha==0, as in BLAS)
   gives C = beta*C without touching A/B. nthreads: 0 = all OpenMP threads.
   Bitwise deterministic for any nthreads. */
static void us__gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                     int dtA, int64_t lda, const void *B, int dtB, int64_t ldb, float beta, void *C,
                     int dtC, int64_t ldc, int nthreads) {
    us__gemm_ctx g;
    int nt = 1;
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        us__gemm_scale_c(M, N, beta, C, dtC, ldc);
        return;
    }
    if ((double)M * (double)N * (double)K < 32.0 * 32.0 * 32.0) {
        us__gemm_small(ta, tb, M, N, K, alpha, A, dtA, lda, B, dtB, ldb, beta, C, dtC, ldc);
        return;
    }

#ifdef _OPENMP
    nt = nthreads > 0 ? nthreads : omp_get_max_threads();
#else
    (void)nthreads;
#endif
    /* Small products do not amortise a thread team. */
    if ((double)M * (double)N * (double)K < 96.0 * 96.0 * 96.0) nt = 1;
    if (nt < 1) nt = 1;

    g.ta = ta;
    g.tb = tb;
    g.dtA = dtA;
    g.dtB = dtB;
    g.dtC = dtC;
    g.M = M;
    g.N = N;
    g.K = K;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    g.A = A;
    g.B = B;
    g.C = C;
    g.alpha = alpha;
    g.beta = beta;
    us__gemm_col_block(&g);
    us__gemm_thread_grid(&g, nt);
    us__gemm_packed(&g, nt);
}

/* ------------------------------------------------------------------------------------ */
// >>kernels  the CPU reference ops: compute in fp32, round once on store
/* ------------------------------------------------------------------------------------ */
/* US__SIMD marks an element-wise loop (nothing summed across its iterations) for vectorising,
   which gcc's -O2 cost model declines where a loop needs a remainder or an aliasing check: each
   lane does what one iteration did, so the results are the same bits. */
#ifdef _OPENMP
#define US__PARALLEL_FOR _Pragma("omp parallel for schedule(static) num_threads(us__nt)")
#define US__PARALLEL_FOR_DYNAMIC \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(us__nt)")
#define US__SIMD _Pragma("omp simd")

static int us__threads(const us_ops *o) {
    return o->nthreads > 0 ? o->nthreads : omp_get_max_threads();
}

static int us__omp_max(void) { return omp_get_max_threads(); }

static int us__tid(void) { return omp_get_thread_num(); }
#else
#define US__PARALLEL_FOR
#define US__PARALLEL_FOR_DYNAMIC
#define US__SIMD

static int us__threads(const us_ops *o) {
    (void)o;
    return 1;
}

static int us__omp_max(void) { return 1; }

static int us__tid(void) { return 0; }
#endif
/* Row kernels take one scratch block per thread up front, not one per row in the hot loop. */
#define US__ROW_SCRATCH(type, name, per_thread) \
    type *name##_all = (type *)us__scratch((size_t)us__nt * (size_t)(per_thread) * sizeof(type))
#define US__MY_ROW(name, per_thread) (name##_all + (size_t)us__tid() * (size_t)(per_thread))

static void *us__cpu_alloc(us_ops *o, size_t bytes) {
    /* over-allocate; stash the raw pointer and the size just below the aligned block */
    char *raw = (char *)US_MALLOC(bytes + 64 + 2 * sizeof(void *)), *p;
    if (!raw) return NULL;
    p = (char *)(((uintptr_t)raw + 2 * sizeof(void *) + 63) & ~(uintptr_t)63);
    ((void **)p)[-1] = raw;
    ((size_t *)p)[-2] = bytes;
    memset(p, 0, bytes);
    o->bytes_in_use += bytes;
    if (o->bytes_in_use > o->bytes_peak) o->bytes_peak = o->bytes_in_use;
    return p;
}

static void us__cpu_free(us_ops *o, void *p) {
    if (!p) return;
    o->bytes_in_use -= ((size_t *)p)[-2];
    US_FREE(((void **)p)[-1]);
}

static void us__cpu_zero(us_ops *o, void *p, size_t bytes) {
    (void)o;
    memset(p, 0, bytes);
}

static void us__cpu_copy(us_ops *o, void *dst, const void *src, size_t bytes, us_copy_kind kind) {
    (void)o;
    (void)kind;
    if (bytes) memmove(dst, src, bytes);
}

static void us__cpu_sync(us_ops *o) { (void)o; }

static void us__cpu_cast(us_ops *o, void *dst, us_dtype ddt, const void *src, us_dtype sdt,
                         int64_t n) {
    int64_t i;
    int us__nt = us__threads(o);
    (void)us__nt;
    US__PARALLEL_FOR
    for (i = 0; i < n; i++) {
        float v = sdt == US_F32    ? ((const float *)src)[i]
                  : sdt == US_BF16 ? us__bf16_to_f32(((const uint16_t *)src)[i])
                  : sdt == US_F16  ? us__f16_to_f32(((const uint16_t *)src)[i])
                  : sdt == US_E4M3 ? us_e4m3_to_f32(((const uint8_t *)src)[i])
                  : sdt == US_E5M2 ? us_e5m2_to_f32(((const uint8_t *)src)[i])
                  : sdt == US_F64  ? (float)((const double *)src)[i]
                                   : (float)((const int32_t *)src)[i];
        switch (ddt) {
        case US_F32:
            ((float *)dst)[i] = v;
            break;
        case US_BF16:
            ((uint16_t *)dst)[i] = us__f32_to_bf16(v);
            break;
        case US_F16:
            ((uint16_t *)dst)[i] = us__f32_to_f16(v);
            break;
        case US_E4M3:
            ((uint8_t *)dst)[i] = us_f32_to_e4m3(v);
            break;
        case US_E5M2:
            ((uint8_t *)dst)[i] = us_f32_to_e5m2(v);
            break;
        case US_I32:
            ((int32_t *)dst)[i] = (int32_t)v;
            break;
        case US_F64:
            ((double *)dst)[i] = v;
            break;
        }
    }
}

static void us__cpu_gemm(us_ops *o, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, us_dtype adt, int64_t lda, const void *B, us_dtype bdt,
                         int64_t ldb, float beta, void *C, us_dtype cdt, int64_t ldc) {
    us__gemm(ta, tb, M, N, K, alpha, A, (int)adt, lda, B, (int)bdt, ldb, beta, C, (int)cdt, ldc,
             us__threads(o));
}

/* Embedding: a row gather. Backward scatters by column blocks, so every dwte element is summed
   by one thread in token order: deterministic for any thread count. */
static void us__cpu_embedding_fwd(us_ops *o, void *out, const int32_t *tok, const void *wte,
                                  int64_t N, int64_t C, us_dtype dt) {
    int64_t n;
    size_t row = (size_t)C * us_dtype_size(dt);
    int us__nt = us__threads(o);
    (void)us__nt;
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        if (tok[n] >= 0)
            memcpy((char *)out + n * row, (const char *)wte + (size_t)tok[n] * row, row);
        else
            memset((char *)out + n * row, 0, row);
    }
}

static void us__cpu_embedding_bwd(us_ops *o, float *dwte, const void *dout, const int32_t *tok,
                                  int64_t N, int64_t C, us_dtype dt) {
    int64_t blk, nblk = (C + 63) / 64;
    int us__nt = us__threads(o);
    (void)us__nt;
    US__PARALLEL_FOR
    for (blk = 0; blk < nblk; blk++) {
        int64_t n, c, c0 = blk * 64, c1 = c0 + 64 < C ? c0 + 64 : C;
        for (n = 0; n < N; n++) {
            float *d = dwte + (int64_t)tok[n] * C;
            if (tok[n] < 0) continue;
            for (c = c0; c < c1; c++) d[c] += us__get(dout, dt, n * C + c);
        }
    }
}

/* RMSNorm: y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps). */
static void us__cpu_rmsnorm_fwd(us_ops *o, void *out, float *rstd, const void *x, const void *w,
                                int64_t N, int64_t C, float eps, us_dtype dt) {
    int us__nt = us__threads(o);
    float *wf = (float *)us__scratch((size_t)C * 4);
    int64_t n;
    US__ROW_SCRATCH(float, row, C);
    us__load_f32(wf, w, dt, C);
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        float *row = US__MY_ROW(row, C);
        double ss = 0;
        float r;
        int64_t c;
        us__load_f32(row, us__at(x, dt, n * C), dt, C);
        for (c = 0; c < C; c++) ss += (double)row[c] * row[c];
        r = (float)(1.0 / sqrt(ss / (double)C + eps));
        rstd[n] = r;
        for (c = 0; c < C; c++) row[c] = row[c] * r * wf[c];
        us__store_f32(us__at(out, dt, n * C), dt, row, C);
    }
    US_FREE(row_all);
    US_FREE(wf);
}

/* dx = rstd · (dxhat − xhat · mean(dxhat·xhat)) with dxhat = dy·w, xhat = x·rstd; dw = Σ_n dy·xhat.
   dx is row-parallel; dw is column-parallel so its sums run in row order on one thread. */
static void us__cpu_rmsnorm_bwd(us_ops *o, void *dx, float *dw, const void *dout, const void *x,
                                const void *w, const float *rstd, int64_t N, int64_t C,
                                us_dtype dt) {
    int us__nt = us__threads(o);
    float *wf = (float *)us__scratch((size_t)C * 4);
    int64_t n, blk, nblk = (C + 63) / 64;
    US__ROW_SCRATCH(float, xr, 3 * C);
    us__load_f32(wf, w, dt, C);
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        float *xr = US__MY_ROW(xr, 3 * C), *dy = xr + C, *acc = dy + C;
        double dot = 0;
        float r = rstd[n], mean;
        int64_t c;
        us__load_f32(xr, us__at(x, dt, n * C), dt, C);
        us__load_f32(dy, us__at(dout, dt, n * C), dt, C);
        us__load_f32(acc, us__at(dx, dt, n * C), dt, C);
        for (c = 0; c < C; c++) dot += (double)dy[c] * wf[c] * xr[c] * r;
        mean = (float)(dot / (double)C);
        for (c = 0; c < C; c++) acc[c] += r * (dy[c] * wf[c] - xr[c] * r * mean);
        us__store_f32(us__at(dx, dt, n * C), dt, acc, C);
    }
    US_FREE(xr_all);
    US__PARALLEL_FOR
    for (blk = 0; blk < nblk; blk++) {
        int64_t c, c0 = blk * 64, c1 = c0 + 64 < C ? c0 + 64 : C, r;
        for (r = 0; r < N; r++)
            for (c = c0; c < c1; c++)
                dw[c] += us__get(dout, dt, r * C + c) * us__get(x, dt, r * C + c) * rstd[r];
    }
    US_FREE(wf);
}

/* Llama 3.1's rule as transformers writes it (_compute_llama3_parameters): with wavelength
   λ = 2π/f and L the original context, keep f where λ < L/high, take f/factor where λ > L/low,
   and blend between them, (1 − s)·f/factor + s·f with s = (L/λ − low)/(high − low), so the
   long wavelengths stretch to the new context while the short ones, which encode nearby
   positions, stay as trained. */
US_API void us_rope_freqs(const us_model_config *mc, double *freq) {
    us_model_config c = *mc;
    int64_t HS, j;
    us_model_config_defaults(&c);
    HS = c.dim / c.n_heads;
    for (j = 0; j < HS / 2; j++) {
        double f = pow((double)c.rope_theta, -2.0 * (double)j / (double)HS);
        if (c.rope_scaling == US_ROPE_LLAMA3) {
            double L = c.rope_orig_ctx, lo = c.rope_low_freq, hi = c.rope_high_freq;
            double wl = 2.0 * 3.14159265358979323846 / f, s = (L / wl - lo) / (hi - lo);
            if (wl > L / lo)
                f = f / c.rope_factor;
            else if (!(wl < L / hi))
                f = (1.0 - s) * f / c.rope_factor + s * f;
        }
        freq[j] = f;
    }
}

US_API const char *us_rope_describe(const us_model_config *mc, char *buf, size_t cap) {
    us_model_config c = *mc;
    us_model_config_defaults(&c);
    if (c.rope_scaling == US_ROPE_LLAMA3)
        snprintf(buf, cap, "rope %g llama3 (factor %g, low %g, high %g, original %d)",
                 (double)c.rope_theta, (double)c.rope_factor, (double)c.rope_low_freq,
                 (double)c.rope_high_freq, c.rope_orig_ctx);
    else
        snprintf(buf, cap, "rope %g", (double)c.rope_theta);
    return buf;
}

/* RoPE, Hugging Face "rotate-half": pairs (j, j+HS/2) rotate by pos·freq[j] (us_rope_freqs).
   dir = +1 forward, −1 backward (the transpose of a rotation is the inverse rotation). */
static void us__cpu_rope_pos(us_ops *o, void *qkv, const int32_t *pos, int64_t B, int64_t T, int NH,
                             int NKV, int HS, const double *freq, us_dtype dt, int dir) {
    int us__nt = us__threads(o);
    int half = HS / 2, nrot = NH + NKV; /* q heads then k heads are rotated; v is not */
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, bt;
    float *cs = (float *)us__scratch((size_t)T * half * 2 * sizeof(float)), *sn = cs + T * half;
    int64_t t;
    int j;
    for (t = 0; t < T; t++)
        for (j = 0; j < half; j++) {
            double ang = (double)(pos ? pos[t] : t) * freq[j];
            cs[t * half + j] = (float)cos(ang);
            sn[t * half + j] = (float)sin(ang) * (float)dir;
        }
    US__ROW_SCRATCH(float, row, (int64_t)nrot *HS);
    US__PARALLEL_FOR
    for (bt = 0; bt < B * T; bt++) {
        int64_t tt = bt % T;
        float *row = US__MY_ROW(row, (int64_t)nrot * HS);
        int h, jj;
        us__load_f32(row, us__at(qkv, dt, bt * QKV), dt, (int64_t)nrot * HS);
        for (h = 0; h < nrot; h++) {
            float *v = row + h * HS;
            for (jj = 0; jj < half; jj++) {
                float c = cs[tt * half + jj], s = sn[tt * half + jj], a = v[jj], b = v[jj + half];
                v[jj] = a * c - b * s;
                v[jj + half] = b * c + a * s;
            }
        }
        us__store_f32(us__at(qkv, dt, bt * QKV), dt, row, (int64_t)nrot * HS);
    }
    US_FREE(row_all);
    US_FREE(cs);
}

static void us__cpu_rope_fwd(us_ops *o, void *qkv, int64_t B, int64_t T, int NH, int NKV, int HS,
                             const double *freq, us_dtype dt) {
    us__cpu_rope_pos(o, qkv, NULL, B, T, NH, NKV, HS, freq, dt, 1);
}

static void us__cpu_rope_bwd(us_ops *o, void *dqkv, int64_t B, int64_t T, int NH, int NKV, int HS,
                             const double *freq, us_dtype dt) {
    us__cpu_rope_pos(o, dqkv, NULL, B, T, NH, NKV, HS, freq, dt, -1);
}

static void us__cpu_rope_at(us_ops *o, void *qkv, const int32_t *pos, int64_t B, int64_t T,
                            int64_t T_total, int NH, int NKV, int HS, const double *freq, float dir,
                            us_dtype dt) {
    (void)T_total;
    us__cpu_rope_pos(o, qkv, pos, B, T, NH, NKV, HS, freq, dt, dir > 0 ? 1 : -1);
}

static void us__cpu_copy2d(us_ops *o, void *dst, int64_t dld, const void *src, int64_t sld,
                           int64_t rows, int64_t cols, us_dtype dt) {
    size_t a = us_dtype_size(dt);
    int64_t r;
    (void)o;
    for (r = 0; r < rows; r++)
        memcpy((char *)dst + (size_t)(r * dld) * a, (const char *)src + (size_t)(r * sld) * a,
               (size_t)cols * a);
}

/* SwiGLU: h = silu(g)·u with g = gu[:, :F], u = gu[:, F:] (gate_proj and up_proj fused in one GEMM). */
static void us__cpu_swiglu_fwd(us_ops *o, void *h, const void *gu, int64_t N, int64_t F,
                               us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t n;
    (void)us__nt;
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        int64_t f;
        for (f = 0; f < F; f++) {
            float g = us__get(gu, dt, n * 2 * F + f), u = us__get(gu, dt, n * 2 * F + F + f);
            us__set(h, dt, n * F + f, g / (1.0f + expf(-g)) * u);
        }
    }
}

static void us__cpu_swiglu_bwd(us_ops *o, void *dgu, const void *dh, const void *gu, int64_t N,
                               int64_t F, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t n;
    (void)us__nt;
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        int64_t f;
        for (f = 0; f < F; f++) {
            float g = us__get(gu, dt, n * 2 * F + f), u = us__get(gu, dt, n * 2 * F + F + f);
            float d = us__get(dh, dt, n * F + f), sg = 1.0f / (1.0f + expf(-g));
            us__set(dgu, dt, n * 2 * F + f, d * u * sg * (1.0f + g * (1.0f - sg)));
            us__set(dgu, dt, n * 2 * F + F + f, d * g * sg);
        }
    }
}

/* Fused softmax-cross-entropy: the probabilities are never stored; the logits buffer is reused
   for dlogits = dscale·(softmax − onehot). */
static void us__cpu_xent(us_ops *o, float *losses, int32_t *argmax, void *logits,
                         const int32_t *tgt, int64_t N, int64_t V, float dscale, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t n;
    US__ROW_SCRATCH(float, row, V);
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        float *row = US__MY_ROW(row, V), mx = -INFINITY;
        double sum = 0;
        int64_t v, am = 0;
        us__load_f32(row, us__at(logits, dt, n * V), dt, V);
        for (v = 0; v < V; v++)
            if (row[v] > mx) {
                mx = row[v];
                am = v;
            }
        for (v = 0; v < V; v++) sum += exp((double)(row[v] - mx));
        if (argmax) argmax[n] = (int32_t)am;
        losses[n] = tgt[n] < 0 ? 0.0f : (float)(log(sum) + mx - row[tgt[n]]);
        if (dscale != 0) {
            float inv = (float)(1.0 / sum);
            for (v = 0; v < V; v++)
                row[v] = tgt[n] < 0 ? 0.0f : dscale * (expf(row[v] - mx) * inv - (v == tgt[n]));
            us__store_f32(us__at(logits, dt, n * V), dt, row, V);
        }
    }
    US_FREE(row_all);
}

static void us__cpu_xent_stats(us_ops *o, float *mx, int32_t *amax, double *sumexp, float *tlogit,
                               const void *logits, const int32_t *tgt, int64_t N, int64_t V,
                               us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t n;
    US__ROW_SCRATCH(float, row, V);
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        float *row = US__MY_ROW(row, V);
        int64_t v, am = 0;
        us__load_f32(row, us__at(logits, dt, n * V), dt, V);
        if (!sumexp) {
            float m = -INFINITY;
            for (v = 0; v < V; v++)
                if (row[v] > m) {
                    m = row[v];
                    am = v;
                }
            mx[n] = m;
            if (amax) amax[n] = (int32_t)am;
        } else {
            double sum = 0;
            for (v = 0; v < V; v++) sum += exp((double)(row[v] - mx[n]));
            sumexp[n] = sum;
            tlogit[n] = tgt[n] >= 0 ? row[tgt[n]] : 0.0f;
        }
    }
    US_FREE(row_all);
}

static void us__cpu_xent_finish(us_ops *o, float *losses, void *logits, const int32_t *tgt,
                                const float *mx, const double *sumexp, const float *tlogit,
                                int64_t N, int64_t V, float dscale, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t n;
    US__ROW_SCRATCH(float, row, V);
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        float *row = US__MY_ROW(row, V);
        int64_t v;
        losses[n] = tgt[n] == -2 ? 0.0f : (float)(log(sumexp[n]) + mx[n] - tlogit[n]);
        if (dscale != 0) {
            float inv = (float)(1.0 / sumexp[n]);
            us__load_f32(row, us__at(logits, dt, n * V), dt, V);
            for (v = 0; v < V; v++)
                row[v] =
                    tgt[n] == -2 ? 0.0f : dscale * (expf(row[v] - mx[n]) * inv - (v == tgt[n]));
            us__store_f32(us__at(logits, dt, n * V), dt, row, V);
        }
    }
    US_FREE(row_all);
}

static void us__cpu_axpy(us_ops *o, float *y, const float *x, float a, int64_t n) {
    int64_t i;
    (void)o;
    for (i = 0; i < n; i++) y[i] += a * x[i];
}

static double us__cpu_sumsq(us_ops *o, const float *x, int64_t n) {
    /* fixed 4096-element chunks summed in order: the same result for any thread count */
    int us__nt = us__threads(o);
    int64_t nch = (n + 4095) / 4096, ch;
    double *part = (double *)us__scratch((size_t)(nch ? nch : 1) * sizeof(double)), s = 0;
    (void)us__nt;
    US__PARALLEL_FOR
    for (ch = 0; ch < nch; ch++) {
        int64_t i, e = (ch + 1) * 4096 < n ? (ch + 1) * 4096 : n;
        double a = 0;
        for (i = ch * 4096; i < e; i++) a += (double)x[i] * x[i];
        part[ch] = a;
    }
    for (ch = 0; ch < nch; ch++) s += part[ch];
    US_FREE(part);
    return s;
}

/* Mixture-of-experts ops (// >>moe has the layer built from them). The router works per token:
   scores, the allowed groups, then top-k by repeated argmax (K is small), lower index on ties.
   One function for both backends: the CUDA router's thread per token calls it too. */
#ifdef __CUDACC__
#define US__HD __host__ __device__
#else
#define US__HD
#endif
static US__HD void us__moe_route_row(int32_t *topk, float *gates, float *probs, const float *lg,
                                     const float *bias, int E, int K, int gate, int G, int M) {
    int e, k, g, S = E / G;
    uint64_t allowed = ~(uint64_t)0;
    float sum = 0;
    if (gate == US_MOE_SIGMOID)
        for (e = 0; e < E; e++) probs[e] = 1.0f / (1.0f + expf(-lg[e]));
    else {
        float mx = -INFINITY;
        double z = 0;
        for (e = 0; e < E; e++)
            if (lg[e] > mx) mx = lg[e];
        for (e = 0; e < E; e++) z += exp((double)(lg[e] - mx));
        for (e = 0; e < E; e++) probs[e] = (float)(exp((double)(lg[e] - mx)) / z);
    }
    if (M <
        G) { /* group-limited routing: keep the M groups whose two best biased scores sum highest */
        allowed = 0;
        for (k = 0; k < M; k++) {
            int best = -1;
            float bs = 0;
            for (g = 0; g < G; g++) {
                float a = -INFINITY, b = -INFINITY, sc;
                if (allowed >> g & 1) continue;
                for (e = g * S; e < (g + 1) * S; e++) {
                    float v = probs[e] + (bias ? bias[e] : 0.0f);
                    if (v > a) {
                        b = a;
                        a = v;
                    } else if (v > b)
                        b = v;
                }
                sc = S > 1 ? a + b : a;
                if (best < 0 || sc > bs) {
                    best = g;
                    bs = sc;
                }
            }
            allowed |= (uint64_t)1 << best;
        }
    }
    for (k = 0; k < K; k++) {
        int best = -1, j;
        float bs = 0;
        for (e = 0; e < E; e++) {
            float v = probs[e] + (bias ? bias[e] : 0.0f);
            int taken = !(allowed >> (e / S) & 1);
            for (j = 0; j < k && !taken; j++) taken = topk[j] == e;
            if (!taken && (best < 0 || v > bs)) {
                best = e;
                bs = v;
            }
        }
        topk[k] = best;
    }
    for (k = 0; k < K; k++) {
        gates[k] = probs[topk[k]];
        sum += gates[k];
    }
    if (gate == US_MOE_SIGMOID)
        for (k = 0; k < K; k++) gates[k] /= sum + 1e-20f; /* DeepSeek-V3's top-k renormalisation */
}

static void us__cpu_moe_route(us_ops *o, int32_t *topk, float *gates, float *probs, float *psum,
                              const float *logits, const float *bias, int64_t N, int E, int K,
                              int gate, int n_groups, int top_groups) {
    int us__nt = us__threads(o);
    int64_t n;
    (void)us__nt;
    US__PARALLEL_FOR
    for (n = 0; n < N; n++)
        us__moe_route_row(topk + n * K, gates + n * K, probs + n * E, logits + n * E, bias, E, K,
                          gate, n_groups, top_groups);
    if (psum) { /* in token order: deterministic */
        int e;
        for (e = 0; e < E; e++) psum[e] = 0;
        for (n = 0; n < N; n++) {
            double t = 0;
            for (e = 0; e < E; e++) t += probs[n * E + e];
            for (e = 0; e < E; e++) psum[e] += (float)(probs[n * E + e] / t);
        }
    }
}

/* Softmax gates g_k = p[s_k]: ∂p = Σ_k dg_k·onehot(s_k). Sigmoid gates g_k = p[s_k]/S with
   S = Σ_j p[s_j]: ∂p[s_j] = (dg_j − Σ_k dg_k·g_k)/S. The aux term's p' = p/Σp likewise. Then
   through the score function: softmax p⊙(∂p − ⟨∂p, p⟩), sigmoid ∂p·p·(1 − p). */
static void us__cpu_moe_route_bwd(us_ops *o, float *dlogits, const float *dgates,
                                  const float *probs, const int32_t *topk, const float *aux,
                                  int64_t N, int E, int K, int gate) {
    int us__nt = us__threads(o);
    int64_t n;
    US__ROW_SCRATCH(double, dp, E);
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) {
        double *dp = US__MY_ROW(dp, E), S = 1e-20, dot = 0;
        const float *p = probs + n * E, *dg = dgates + n * K;
        const int32_t *s = topk + n * K;
        int e, k;
        for (e = 0; e < E; e++) dp[e] = 0;
        if (gate == US_MOE_SIGMOID) {
            float Sf = 0;
            for (k = 0; k < K; k++) Sf += p[s[k]];
            S = (double)(Sf + 1e-20f); /* the forward's fp32 sum */
            for (k = 0; k < K; k++) dot += (double)dg[k] * p[s[k]] / S;
            for (k = 0; k < K; k++) dp[s[k]] += ((double)dg[k] - dot) / S;
        } else
            for (k = 0; k < K; k++) dp[s[k]] += dg[k];
        if (aux) {
            double T = 0, adot = 0;
            for (e = 0; e < E; e++) T += p[e];
            for (e = 0; e < E; e++) adot += (double)aux[e] * p[e] / T;
            for (e = 0; e < E; e++) dp[e] += ((double)aux[e] - adot) / T;
        }
        if (gate == US_MOE_SIGMOID)
            for (e = 0; e < E; e++) dlogits[n * E + e] = (float)(dp[e] * p[e] * (1.0 - p[e]));
        else {
            double pd = 0;
            for (e = 0; e < E; e++) pd += dp[e] * p[e];
            for (e = 0; e < E; e++) dlogits[n * E + e] = (float)(p[e] * (dp[e] - pd));
        }
    }
    US_FREE(dp_all);
}

static void us__cpu_moe_permute(us_ops *o, int32_t *slot_row, int32_t *row_slot, int32_t *routed,
                                int32_t *kept, const int32_t *topk, int64_t N, int E, int K,
                                int64_t cap, int64_t R) {
    int64_t *off = (int64_t *)us__scratch((size_t)E * 2 * sizeof(int64_t)), *fill = off + E, i,
            r = 0;
    int e;
    (void)o;
    for (e = 0; e < E; e++) routed[e] = 0;
    for (i = 0; i < N * K; i++) routed[topk[i]]++;
    for (e = 0; e < E; e++) {
        kept[e] = cap > 0 && routed[e] > cap ? (int32_t)cap : routed[e];
        off[e] = r;
        fill[e] = 0;
        r += kept[e];
    }
    for (i = 0; i < N * K; i++) { /* token order: an expert over capacity drops its later tokens */
        e = topk[i];
        if (fill[e] < kept[e]) {
            slot_row[i] = (int32_t)(off[e] + fill[e]);
            row_slot[off[e] + fill[e]] = (int32_t)i;
            fill[e]++;
        } else
            slot_row[i] = -1;
    }
    for (; r < R; r++) row_slot[r] = -1;
    US_FREE(off);
}

static void us__cpu_moe_gather(us_ops *o, void *dst, const void *src, const int32_t *row_slot,
                               const float *scale, int64_t R, int K, int64_t C, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t r;
    US__ROW_SCRATCH(float, row, C);
    US__PARALLEL_FOR
    for (r = 0; r < R; r++) {
        float *row = US__MY_ROW(row, C), sc;
        int64_t c, s = row_slot[r];
        if (s < 0) {
            memset(us__at(dst, dt, r * C), 0, (size_t)C * us_dtype_size(dt));
            continue;
        }
        sc = scale ? scale[s] : 1.0f;
        us__load_f32(row, us__at(src, dt, s / K * C), dt, C);
        for (c = 0; c < C; c++) row[c] *= sc;
        us__store_f32(us__at(dst, dt, r * C), dt, row, C);
    }
    US_FREE(row_all);
}

static void us__cpu_moe_scatter(us_ops *o, void *dst, const void *src, const int32_t *slot_row,
                                const float *scale, int64_t N, int K, int64_t C, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t n;
    US__ROW_SCRATCH(float, row, 2 * C);
    US__PARALLEL_FOR
    for (n = 0; n < N; n++) { /* each token sums its own K rows: deterministic */
        float *acc = US__MY_ROW(row, 2 * C), *y = acc + C;
        int64_t c;
        int k;
        us__load_f32(acc, us__at(dst, dt, n * C), dt, C);
        for (k = 0; k < K; k++) {
            int64_t r = slot_row[n * K + k];
            float sc = scale ? scale[n * K + k] : 1.0f;
            if (r < 0) continue;
            us__load_f32(y, us__at(src, dt, r * C), dt, C);
            for (c = 0; c < C; c++) acc[c] += sc * y[c];
        }
        us__store_f32(us__at(dst, dt, n * C), dt, acc, C);
    }
    US_FREE(row_all);
}

static void us__cpu_moe_gate_grad(us_ops *o, float *dgates, const void *dout, const void *src,
                                  const int32_t *slot_row, int64_t N, int K, int64_t C,
                                  us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t i;
    (void)us__nt;
    US__PARALLEL_FOR
    for (i = 0; i < N * K; i++) {
        int64_t c, r = slot_row[i];
        double d = 0;
        if (r >= 0)
            for (c = 0; c < C; c++)
                d += (double)us__get(dout, dt, i / K * C + c) * us__get(src, dt, r * C + c);
        dgates[i] = (float)d;
    }
}

/* The grouped GEMM (us_ops.gemm_grouped) as one gemm per non-empty group, through the table (a
   wrapper of o->gemm sees each); the CPU's, and the CUDA backend's fallback for shapes its
   kernel does not take. */
static void us__gemm_grouped_each(us_ops *o, int mode, int G, const int64_t *off, const int64_t *n,
                                  int64_t N, int64_t K, const void *X, int64_t ldx, void *const *W,
                                  void *Y, int64_t ldy, us_dtype dt) {
    int g;
    for (g = 0; g < G; g++) {
        const void *x = us__at(X, dt, off[g] * ldx);
        void *y = us__at(Y, dt, off[g] * ldy);
        if (n[g] <= 0) continue;
        if (mode == US_GG_FPROP) /* Y_g [n,N] = X_g [n,K] · W [N,K]ᵀ */
            o->gemm(o, 0, 1, n[g], N, K, 1.0f, x, dt, ldx, W[g], dt, K, 0.0f, y, dt, ldy);
        else if (mode == US_GG_DGRAD) /* Y_g [n,N] = X_g [n,K] · W [K,N] */
            o->gemm(o, 0, 0, n[g], N, K, 1.0f, x, dt, ldx, W[g], dt, N, 0.0f, y, dt, ldy);
        else /* W f32 [N,K] += Y_gᵀ [N,n] · X_g [n,K] */
            o->gemm(o, 1, 0, N, K, n[g], 1.0f, y, dt, ldy, x, dt, ldx, 1.0f, W[g], US_F32, K);
    }
}

/* ------------------------------------------------------------------------------------ */
// >>fp8  FP8 E4M3 tile quantisation and the emulated FP8 GEMM (DeepSeek-V3 fine-grained scaling)
/* ------------------------------------------------------------------------------------ */
/* Why tiles: E4M3 keeps 3 mantissa bits over ~18 binades. One scale per tensor lets a few outlier
   channels set it, pushing everything else toward the subnormals; one per 1×128 tile (128×128
   block for weights) confines an outlier to its own tile. The backward GEMM that reduces over
   tokens needs tiles along the other axis, so X is quantised a second time (COL128) from the
   high-precision values, never by re-tiling a quantised X (that would round twice).
   Host reference of the future ops; layouts and the scale rule in the declarations above. */
static US__HD float us__fp8_scale(float amax, int pow2) {
    float s, m;
    int e;
    if (!(amax <= FLT_MAX)) return NAN; /* a NaN or an inf in the tile */
    s = amax / US_E4M3_MAX;
    if (s == 0.0f) return 1.0f;   /* a zero tile, or amax/448 underflowed */
    if (s < FLT_MIN) s = FLT_MIN; /* subnormal: 1/s must stay finite */
    if (pow2) {
        m = frexpf(s, &e); /* s = m·2^e, m in [0.5, 1) */
        if (m != 0.5f) s = ldexpf(1.0f, e);
    }
    return s;
}

US_API float us_fp8_scale(float amax, int pow2) { return us__fp8_scale(amax, pow2); }

static int64_t us__fp8_kbp(int64_t K) { return ((K + US_FP8_TILE - 1) / US_FP8_TILE + 3) / 4 * 4; }

US_API int64_t us_fp8_scales_size(us_fp8_tiling t, int64_t M, int64_t K) {
    int64_t MB = (M + US_FP8_TILE - 1) / US_FP8_TILE, KB = (K + US_FP8_TILE - 1) / US_FP8_TILE;
    if (M < 0 || K < 0) return -1;
    switch (t) {
    case US_FP8_TILING_DEFAULT:
    case US_FP8_ROW128:
        return KB * M;
    case US_FP8_COL128:
        return MB * K;
    case US_FP8_BLOCK128:
        return MB * us__fp8_kbp(K);
    case US_FP8_TENSOR:
        return 1;
    }
    return -1;
}

static us_result us__fp8_check(const char *fn, us_fp8_tiling t, int64_t M, int64_t K, char *err,
                               size_t errlen) {
    if ((int)t < (int)US_FP8_TILING_DEFAULT || (int)t > (int)US_FP8_TENSOR) {
        us__errf(err, errlen, "%s: tiling %d is not a us_fp8_tiling", fn, (int)t);
        return US_ERR_INVALID;
    }
    if (M < 0 || K < 0) {
        us__errf(err, errlen, "%s: the matrix is %lld x %lld; sizes must be >= 0", fn, (long long)M,
                 (long long)K);
        return US_ERR_INVALID;
    }
    return US_OK;
}

/* Quantise the rectangle [m0,m1)×[k0,k1) of x[·][K] with one scale; q element (m,k) at
   q[m·qrs + k·qcs] (qrs = K, qcs = 1 in place; qrs = 1, qcs = M transposed). Returns the scale. */
static float us__fp8_quant_rect(uint8_t *q, int64_t qrs, int64_t qcs, const void *x, us_dtype dt,
                                int64_t K, int64_t m0, int64_t m1, int64_t k0, int64_t k1,
                                int pow2) {
    float amax = 0.0f, sc, a, r;
    int64_t m, k;
    for (m = m0; m < m1; m++)
        for (k = k0; k < k1; k++) {
            a = fabsf(us__get(x, dt, m * K + k));
            if (a > amax || a != a) amax = a; /* a NaN sticks */
        }
    sc = us__fp8_scale(amax, pow2);
    r = 1.0f / sc;
    for (m = m0; m < m1; m++)
        for (k = k0; k < k1; k++)
            q[m * qrs + k * qcs] = us__e4m3_fast(us__get(x, dt, m * K + k) * r);
    return sc;
}

/* nt: OpenMP threads (the CPU ops pass theirs; the public functions all of them) */
static us_result us__fp8_quantize_nt(uint8_t *q, float *s, const void *x, us_dtype dt, int64_t M,
                                     int64_t K, us_fp8_tiling t, int pow2, char *err, size_t errlen,
                                     int nt) {
    const int64_t T = US_FP8_TILE;
    int64_t MB = (M + T - 1) / T, KB = (K + T - 1) / T, KBp = us__fp8_kbp(K), i, j;
    us_result r = us__fp8_check("us_fp8_quantize", t, M, K, err, errlen);
    if (r != US_OK) return r;
    (void)nt;
    if (dt != US_F32 && dt != US_BF16) {
        us__errf(err, errlen, "us_fp8_quantize: x must be fp32 or bf16, not %s", us_dtype_name(dt));
        return US_ERR_INVALID;
    }
    if (!s || ((!q || !x) && M * K > 0)) {
        us__errf(err, errlen, "us_fp8_quantize: q, s and x must not be NULL");
        return US_ERR_INVALID;
    }
    switch (t) {
    case US_FP8_TILING_DEFAULT:
    case US_FP8_ROW128: /* s [KB][M] */
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
#endif
        for (i = 0; i < M; i++)
            for (j = 0; j < KB; j++)
                s[j * M + i] = us__fp8_quant_rect(q, K, 1, x, dt, K, i, i + 1, j * T,
                                                  j * T + T < K ? j * T + T : K, pow2);
        break;
    case US_FP8_COL128: /* q [K][M], s [MB][K] */
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
#endif
        for (i = 0; i < MB; i++)
            for (j = 0; j < K; j++)
                s[i * K + j] = us__fp8_quant_rect(q, 1, M, x, dt, K, i * T,
                                                  i * T + T < M ? i * T + T : M, j, j + 1, pow2);
        break;
    case US_FP8_BLOCK128: /* s [MB][KBp] */
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
#endif
        for (i = 0; i < MB; i++)
            for (j = 0; j < KBp; j++)
                s[i * KBp + j] = j >= KB ? 1.0f
                                         : us__fp8_quant_rect(q, K, 1, x, dt, K, i * T,
                                                              i * T + T < M ? i * T + T : M, j * T,
                                                              j * T + T < K ? j * T + T : K, pow2);
        break;
    case US_FP8_TENSOR:
        s[0] = us__fp8_quant_rect(q, K, 1, x, dt, K, 0, M, 0, K, pow2);
        break;
    }
    return US_OK;
}

US_API us_result us_fp8_quantize(uint8_t *q, float *s, const void *x, us_dtype dt, int64_t M,
                                 int64_t K, us_fp8_tiling t, int pow2, char *err, size_t errlen) {
    return us__fp8_quantize_nt(q, s, x, dt, M, K, t, pow2, err, errlen, us__omp_max());
}

/* The scale of X's element (m, k) under tiling t (X[M][K] in its own orientation). */
static float us__fp8_scale_of(const float *s, us_fp8_tiling t, int64_t M, int64_t K, int64_t m,
                              int64_t k) {
    switch (t) {
    case US_FP8_TILING_DEFAULT:
    case US_FP8_ROW128:
        return s[k / US_FP8_TILE * M + m];
    case US_FP8_COL128:
        return s[m / US_FP8_TILE * K + k];
    case US_FP8_BLOCK128:
        return s[m / US_FP8_TILE * us__fp8_kbp(K) + k / US_FP8_TILE];
    case US_FP8_TENSOR:
        return s[0];
    }
    return NAN;
}

US_API us_result us_fp8_dequantize(float *x, const uint8_t *q, const float *s, int64_t M, int64_t K,
                                   us_fp8_tiling t, char *err, size_t errlen) {
    float lut[256];
    int64_t m, k;
    int i;
    us_result r = us__fp8_check("us_fp8_dequantize", t, M, K, err, errlen);
    if (r != US_OK) return r;
    if (M * K == 0) return US_OK;
    if (!x || !q || !s) {
        us__errf(err, errlen, "us_fp8_dequantize: x, q and s must not be NULL");
        return US_ERR_INVALID;
    }
    for (i = 0; i < 256; i++) lut[i] = us_e4m3_to_f32((uint8_t)i);
    for (m = 0; m < M; m++)
        for (k = 0; k < K; k++)
            x[m * K + k] = lut[q[t == US_FP8_COL128 ? k * M + m : m * K + k]] *
                           us__fp8_scale_of(s, t, M, K, m, k);
    return US_OK;
}

static us_result us__fp8_gemm_nt(float *c, const uint8_t *a, const float *sa, us_fp8_tiling ta,
                                 const uint8_t *b, const float *sb, us_fp8_tiling tb, int64_t M,
                                 int64_t N, int64_t K, char *err, size_t errlen, int nt) {
    const int64_t T = US_FP8_TILE;
    int64_t KB = (K + T - 1) / T, m, i;
    float lut[256], *af, *bf;
    us_result r;
    /* a GEMM operand is stored [rows][K]: COL128's output is ROW128 of the transpose */
    if (ta == US_FP8_COL128) ta = US_FP8_ROW128;
    if (tb == US_FP8_COL128) tb = US_FP8_ROW128;
    (void)nt;
    if ((r = us__fp8_check("us_fp8_gemm (a)", ta, M, K, err, errlen)) != US_OK) return r;
    if ((r = us__fp8_check("us_fp8_gemm (b)", tb, N, K, err, errlen)) != US_OK) return r;
    if (M * N == 0) return US_OK;
    if (!c || ((!a || !sa || !b || !sb) && K > 0)) {
        us__errf(err, errlen, "us_fp8_gemm: c, a, sa, b and sb must not be NULL");
        return US_ERR_INVALID;
    }
    af = (float *)US_MALLOC((size_t)((M + N) * K + 1) * sizeof(float));
    if (!af) {
        us__errf(err, errlen, "us_fp8_gemm: out of memory for %lld decoded elements",
                 (long long)((M + N) * K));
        return US_ERR_OOM;
    }
    bf = af + M * K; /* b decoded and transposed, [K][N]: the n loop below is unit-stride */
    for (i = 0; i < 256; i++) lut[i] = us_e4m3_to_f32((uint8_t)i);
    for (i = 0; i < M * K; i++) af[i] = lut[a[i]]; /* exact: every E4M3 value is an fp32 */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(nt)
#endif
    for (i = 0; i < N * K; i++) bf[(i % K) * N + i / K] = lut[b[i]];
        /* one thread owns each row of c and sums every element in the documented order (k ascending
       within a block, blocks ascending), n by n in lock step: deterministic, thread-independent */
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        float *p = (float *)US_MALLOC((size_t)(2 * N) * sizeof(float)), *acc = p ? p + N : NULL;
        int64_t n, kb, k, k1;
        if (p) {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (m = 0; m < M; m++) {
                const float *ar = af + m * K;
                for (n = 0; n < N; n++) acc[n] = 0.0f;
                for (kb = 0; kb < KB; kb++) {
                    float s_a = us__fp8_scale_of(sa, ta, M, K, m, kb * T);
                    k1 = (kb + 1) * T < K ? (kb + 1) * T : K;
                    for (n = 0; n < N; n++) p[n] = 0.0f;
                    for (k = kb * T; k < k1; k++) {
                        const float ak = ar[k], *bk = bf + k * N;
                        US__SIMD
                        for (n = 0; n < N; n++)
                            p[n] += ak * bk[n]; /* exact products: fma or not, the same p */
                    }
                    for (n = 0; n < N; n++)
                        acc[n] =
                            fmaf(p[n], s_a * us__fp8_scale_of(sb, tb, N, K, n, kb * T), acc[n]);
                }
                for (n = 0; n < N; n++) c[m * N + n] = acc[n];
            }
            US_FREE(p);
        } else {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (m = 0; m < M; m++)
                for (n = 0; n < N; n++)
                    c[m * N + n] = NAN; /* out of memory: poison, never wrong numbers */
        }
    }
    US_FREE(af);
    return US_OK;
}

US_API us_result us_fp8_gemm(float *c, const uint8_t *a, const float *sa, us_fp8_tiling ta,
                             const uint8_t *b, const float *sb, us_fp8_tiling tb, int64_t M,
                             int64_t N, int64_t K, char *err, size_t errlen) {
    return us__fp8_gemm_nt(c, a, sa, ta, b, sb, tb, M, N, K, err, errlen, us__omp_max());
}

/* The FP8 ops of the CPU backend (us_ops.fp8_quantize, fp8_gemm): the host functions above on
   operands padded to whole 128-element tiles along the reduction. The padding is zeros, which
   change neither an amax nor a sum, so the results are those of the unpadded tensors; the GPU
   needs it (cuBLASLt's block-scaled FP8 reduces over whole tiles). */
static int64_t us__fp8_padded(int64_t L) {
    return (L + US_FP8_TILE - 1) / US_FP8_TILE * US_FP8_TILE;
}

static void us__cpu_fp8_quantize(us_ops *o, uint8_t *q, float *s, const void *x, us_dtype dt,
                                 int64_t M, int64_t K, int t, int trans, int pow2) {
    int64_t R = trans ? K : M, L = trans ? M : K, Lp = us__fp8_padded(L), r;
    size_t es = us_dtype_size(dt);
    int us__nt = us__threads(o);
    char *xt = NULL;
    uint8_t *qd = q;
    const void *src = x;
    (void)us__nt;
    if (trans && R * L > 0) { /* P = xᵀ, materialised: the reference quantises it as it stands */
        xt = (char *)US_MALLOC((size_t)(R * L) * es);
        if (!xt) return;
        US__PARALLEL_FOR
        for (r = 0; r < R; r++) {
            int64_t l;
            for (l = 0; l < L; l++)
                memcpy(xt + (size_t)(r * L + l) * es, (const char *)x + (size_t)(l * K + r) * es,
                       es);
        }
        src = xt;
    }
    if (Lp != L && R * L > 0) qd = (uint8_t *)US_MALLOC((size_t)(R * L));
    if (qd) {
        us__fp8_quantize_nt(qd, s, src, dt, R, L, (us_fp8_tiling)t, pow2, NULL, 0, us__nt);
        if (qd != q) {
            US__PARALLEL_FOR
            for (r = 0; r < R; r++) {
                memcpy(q + r * Lp, qd + r * L, (size_t)L);
                memset(q + r * Lp + L, 0, (size_t)(Lp - L));
            }
        }
    }
    if (qd != q) US_FREE(qd);
    US_FREE(xt);
}

/* the definition of fp8_quantize_both: the two quantisations, one after the other */
static void us__cpu_fp8_quantize_both(us_ops *o, uint8_t *q, float *s, uint8_t *qt, float *st,
                                      const void *x, us_dtype dt, int64_t M, int64_t K, int t,
                                      int pow2) {
    us__cpu_fp8_quantize(o, q, s, x, dt, M, K, t, 0, pow2);
    us__cpu_fp8_quantize(o, qt, st, x, dt, M, K, t, 1, pow2);
}

/* the definitions of rmsnorm_fwd_fp8 and swiglu_fwd_fp8: the op, then the 1×128 quantisation of
   the bf16 (or fp32) output it wrote (and for SwiGLU with qt, the 128×1 one of hᵀ) */
static void us__cpu_rmsnorm_fwd_fp8(us_ops *o, void *out, float *rstd, uint8_t *q, float *s,
                                    const void *x, const void *w, int64_t N, int64_t C, float eps,
                                    us_dtype dt, int pow2) {
    us__cpu_rmsnorm_fwd(o, out, rstd, x, w, N, C, eps, dt);
    us__cpu_fp8_quantize(o, q, s, out, dt, N, C, US_FP8_ROW128, 0, pow2);
}

static void us__cpu_swiglu_fwd_fp8(us_ops *o, void *h, uint8_t *q, float *s, uint8_t *qt, float *st,
                                   const void *gu, int64_t N, int64_t F, us_dtype dt, int pow2) {
    void *hw = h ? h : US_MALLOC((size_t)(N * F) * us_dtype_size(dt)); /* h not kept: a temporary */
    if (!hw) return;
    us__cpu_swiglu_fwd(o, hw, gu, N, F, dt);
    us__cpu_fp8_quantize(o, q, s, hw, dt, N, F, US_FP8_ROW128, 0, pow2);
    if (qt) us__cpu_fp8_quantize(o, qt, st, hw, dt, N, F, US_FP8_ROW128, 1, pow2);
    if (hw != h) US_FREE(hw);
}

/* the definition of swiglu_bwd_fp8: swiglu_bwd (in place over gu when dgu is NULL), then both
   quantisations of the dgu it wrote */
static void us__cpu_swiglu_bwd_fp8(us_ops *o, void *dgu, uint8_t *q, float *s, uint8_t *qt,
                                   float *st, const void *dh, const void *gu, int64_t N, int64_t F,
                                   us_dtype dt, int pow2) {
    void *d = dgu ? dgu : (void *)gu;
    us__cpu_swiglu_bwd(o, d, dh, gu, N, F, dt);
    us__cpu_fp8_quantize_both(o, q, s, qt, st, d, dt, N, 2 * F, US_FP8_ROW128, pow2);
}

static void us__cpu_fp8_gemm(us_ops *o, int64_t M, int64_t N, int64_t K, float alpha,
                             const uint8_t *a, const float *sa, int ta, const uint8_t *b,
                             const float *sb, int tb, float beta, void *C, us_dtype cdt,
                             int64_t ldc) {
    float *c;
    int64_t i;
    int us__nt = us__threads(o);
    (void)us__nt;
    if (M <= 0 || N <= 0) return;
    c = (float *)US_MALLOC((size_t)(M * N) * sizeof(float));
    if (!c) return;
    if (K > 0)
        us__fp8_gemm_nt(c, a, sa, (us_fp8_tiling)ta, b, sb, (us_fp8_tiling)tb, M, N,
                        us__fp8_padded(K), NULL, 0, us__nt);
    else
        memset(c, 0, (size_t)(M * N) * sizeof(float));
    US__PARALLEL_FOR
    for (i = 0; i < M; i++) {
        int64_t j;
        for (j = 0; j < N; j++)
            us__set(C, cdt, i * ldc + j,
                    beta == 0 ? alpha * c[i * N + j]
                              : alpha * c[i * N + j] + beta * us__get(C, cdt, i * ldc + j));
    }
    US_FREE(c);
}

/* ------------------------------------------------------------------------------------ */
// >>attention  causal grouped-query attention, FlashAttention-style on the CPU
/* ------------------------------------------------------------------------------------ */
/* Keys are visited in blocks of US__ATT_BLOCK with an online softmax (running max m, running
   sum l, rescaled accumulator), so no T×T matrix exists; the backward recomputes the scores from
   q, k and the saved log-sum-exp (FlashAttention-2). Query head h reads kv head h/(NH/NKV). */
#define US__ATT_BLOCK 64

/* Σ a·b with eight independent partial sums, combined in a fixed order: the compiler can
   vectorise it (a single running sum cannot be reordered without -ffast-math) and the result
   does not depend on threads. */
static inline float us__dot(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0, u;
    for (; d + 8 <= n; d += 8)
        for (u = 0; u < 8; u++) acc[u] += a[d + u] * b[d + u];
    for (; d < n; d++) acc[d & 7] += a[d] * b[d];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* K and V of one (batch, kv head) as fp32 [T, HS] each */
static void us__load_kv(float *k, float *v, const void *qkv, int64_t b, int g, int64_t T, int NH,
                        int NKV, int HS, us_dtype dt) {
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, t;
    for (t = 0; t < T; t++) {
        int64_t row = (b * T + t) * QKV;
        us__load_f32(k + t * HS, us__at(qkv, dt, row + (int64_t)(NH + g) * HS), dt, HS);
        us__load_f32(v + t * HS, us__at(qkv, dt, row + (int64_t)(NH + NKV + g) * HS), dt, HS);
    }
}

/* Queries are taken US__ATT_QBLOCK rows at a time so each key/value row, once loaded, serves
   the whole block from L1. Per row the arithmetic is the unblocked algorithm's, in its order. */
#define US__ATT_QBLOCK 16

static void us__cpu_attention_fwd(us_ops *o, void *out, float *lse, const void *qkv, int64_t B,
                                  int64_t T, int NH, int NKV, int HS, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, bh;
    float scale = 1.0f / sqrtf((float)HS);
    (void)us__nt;
    US__PARALLEL_FOR_DYNAMIC
    for (bh = 0; bh < B * NH; bh++) {
        const int64_t QB = US__ATT_QBLOCK;
        int64_t b = bh / NH, q0, j0, j;
        int h = (int)(bh % NH), g = h / (NH / NKV), d, qi;
        /* K, V [T,HS]; per query of the block: q [HS], acc [HS], scores [KB], running max m and sum l */
        float *k = (float *)us__scratch(
            ((size_t)2 * T * HS + (size_t)QB * (2 * HS + US__ATT_BLOCK + 2)) * 4);
        float *v = k + T * HS, *q = v + T * HS, *acc = q + QB * HS, *s = acc + QB * HS,
              *m = s + QB * US__ATT_BLOCK, *l = m + QB;
        us__load_kv(k, v, qkv, b, g, T, NH, NKV, HS, dt);
        for (q0 = 0; q0 < T; q0 += QB) {
            int nq = (int)(T - q0 < QB ? T - q0 : QB);
            for (qi = 0; qi < nq; qi++) {
                us__load_f32(q + qi * HS,
                             us__at(qkv, dt, (b * T + q0 + qi) * QKV + (int64_t)h * HS), dt, HS);
                for (d = 0; d < HS; d++) acc[qi * HS + d] = 0;
                m[qi] = -INFINITY;
                l[qi] = 0;
            }
            for (j0 = 0; j0 < q0 + nq;
                 j0 += US__ATT_BLOCK) /* key blocks up to the block's last query */
                for (qi = 0; qi < nq; qi++) {
                    int64_t t = q0 + qi,
                            j1 = j0 + US__ATT_BLOCK <= t + 1 ? j0 + US__ATT_BLOCK : t + 1;
                    float *qr = q + qi * HS, *ar = acc + qi * HS, *sr = s + qi * US__ATT_BLOCK,
                          bm = -INFINITY, mnew, corr;
                    if (j0 > t) continue; /* causal: this block lies after the query */
                    for (j = j0; j < j1; j++) {
                        sr[j - j0] = us__dot(qr, k + j * HS, HS) * scale;
                        if (sr[j - j0] > bm) bm = sr[j - j0];
                    }
                    mnew = m[qi] > bm ? m[qi] : bm;
                    corr = expf(m[qi] - mnew); /* rescale what was summed under the old max */
                    l[qi] *= corr;
                    US__SIMD
                    for (d = 0; d < HS; d++) ar[d] *= corr;
                    for (j = j0; j < j1; j++) {
                        float p = expf(sr[j - j0] - mnew);
                        l[qi] += p;
                        US__SIMD
                        for (d = 0; d < HS; d++) ar[d] += p * v[j * HS + d];
                    }
                    m[qi] = mnew;
                }
            for (qi = 0; qi < nq; qi++) {
                int64_t t = q0 + qi;
                for (d = 0; d < HS; d++) acc[qi * HS + d] /= l[qi];
                us__store_f32(us__at(out, dt, (b * T + t) * NH * HS + (int64_t)h * HS), dt,
                              acc + qi * HS, HS);
                lse[(b * NH + h) * T + t] = m[qi] + logf(l[qi]);
            }
        }
        US_FREE(k);
    }
}

/* One thread per (batch, kv head) owns dK and dV of that head. For each query block, every key
   row j is visited once and updated by the block's queries in order, so dK[j] and dV[j] still
   sum over query heads, then queries, ascending — a fixed order for any thread count. */
static void us__cpu_attention_bwd(us_ops *o, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const float *lse, int64_t B, int64_t T, int NH,
                                  int NKV, int HS, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, bg;
    int grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
    (void)us__nt;
    US__PARALLEL_FOR_DYNAMIC
    for (bg = 0; bg < B * NKV; bg++) {
        const int64_t QB = US__ATT_QBLOCK;
        int64_t b = bg / NKV, q0, t, j;
        int g = (int)(bg % NKV), h, d, qi;
        /* K, V, dK, dV [T,HS]; per query of the block: q, dO, dQ [HS], D and lse */
        float *k = (float *)us__scratch(((size_t)4 * T * HS + (size_t)QB * (3 * HS + 2)) * 4);
        float *v = k + T * HS, *dk = v + T * HS, *dv = dk + T * HS, *q = dv + T * HS,
              *dob = q + QB * HS, *dq = dob + QB * HS;
        float *D = dq + QB * HS, *L = D + QB,
              *ob = dq; /* O is only needed for D: it borrows dQ's rows */
        us__load_kv(k, v, qkv, b, g, T, NH, NKV, HS, dt);
        memset(dk, 0, (size_t)2 * T * HS * 4);
        for (h = g * grp; h < (g + 1) * grp; h++)
            for (q0 = 0; q0 < T; q0 += QB) {
                int nq = (int)(T - q0 < QB ? T - q0 : QB);
                for (qi = 0; qi < nq; qi++) {
                    int64_t orow = (b * T + q0 + qi) * NH * HS + (int64_t)h * HS;
                    us__load_f32(q + qi * HS,
                                 us__at(qkv, dt, (b * T + q0 + qi) * QKV + (int64_t)h * HS), dt,
                                 HS);
                    us__load_f32(ob + qi * HS, us__at(out, dt, orow), dt, HS);
                    us__load_f32(dob + qi * HS, us__at(dout, dt, orow), dt, HS);
                    D[qi] = us__dot(dob + qi * HS, ob + qi * HS, HS);
                    L[qi] = lse[(b * NH + h) * T + q0 + qi];
                }
                for (qi = 0; qi < nq * HS; qi++) dq[qi] = 0;
                for (j = 0; j < q0 + nq; j++) {
                    const float *kj = k + j * HS, *vj = v + j * HS;
                    float *dkj = dk + j * HS, *dvj = dv + j * HS;
                    for (qi = (int)(j > q0 ? j - q0 : 0); qi < nq; qi++) { /* queries t ≥ j */
                        float *qr = q + qi * HS, *dor = dob + qi * HS, *dqr = dq + qi * HS;
                        float sdot = us__dot(qr, kj, HS), dp = us__dot(dor, vj, HS), p, ds;
                        p = expf(sdot * scale - L[qi]);
                        ds = p * (dp - D[qi]) * scale;
                        US__SIMD
                        for (d = 0; d < HS; d++) {
                            dqr[d] += ds * kj[d];
                            dkj[d] += ds * qr[d];
                            dvj[d] += p * dor[d];
                        }
                    }
                }
                for (qi = 0; qi < nq; qi++)
                    us__store_f32(us__at(dqkv, dt, (b * T + q0 + qi) * QKV + (int64_t)h * HS), dt,
                                  dq + qi * HS, HS);
            }
        for (t = 0; t < T; t++) {
            int64_t row = (b * T + t) * QKV;
            us__store_f32(us__at(dqkv, dt, row + (int64_t)(NH + g) * HS), dt, dk + t * HS, HS);
            us__store_f32(us__at(dqkv, dt, row + (int64_t)(NH + NKV + g) * HS), dt, dv + t * HS,
                          HS);
        }
        US_FREE(k);
    }
}

/* Attention by key blocks with positions (context parallelism's building block): one thread per
   (batch, query head) runs the online softmax of the existing kernel over the block's visible
   keys, continuing the state (acc, m, l) of earlier blocks. */
static void us__cpu_attn_block_fwd(us_ops *o, float *acc, float *m, float *l, const void *qkv,
                                   const void *kv, const int32_t *qpos, const int32_t *kpos,
                                   int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV, int HS,
                                   int init, us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KV = (int64_t)2 * NKV * HS, bh;
    float scale = 1.0f / sqrtf((float)HS);
    (void)us__nt;
    US__PARALLEL_FOR_DYNAMIC
    for (bh = 0; bh < B * NH; bh++) {
        int64_t b = bh / NH, i, j0, j;
        int h = (int)(bh % NH), g = h / (NH / NKV), d;
        float *k = (float *)us__scratch(((size_t)2 * Tk * HS + HS + US__ATT_BLOCK) * 4),
              *v = k + Tk * HS, *q = v + Tk * HS, *s = q + HS;
        for (j = 0; j < Tk; j++) {
            us__load_f32(k + j * HS, us__at(kv, dt, (b * Tk + j) * KV + (int64_t)g * HS), dt, HS);
            us__load_f32(v + j * HS, us__at(kv, dt, (b * Tk + j) * KV + (int64_t)(NKV + g) * HS),
                         dt, HS);
        }
        for (i = 0; i < Tq; i++) {
            int64_t r = (b * NH + h) * Tq + i;
            float *ar = acc + r * HS;
            if (init) {
                m[r] = -INFINITY;
                l[r] = 0;
                for (d = 0; d < HS; d++) ar[d] = 0;
            }
            us__load_f32(q, us__at(qkv, dt, (b * Tq + i) * QKV + (int64_t)h * HS), dt, HS);
            for (j0 = 0; j0 < Tk; j0 += US__ATT_BLOCK) {
                int64_t j1 = j0 + US__ATT_BLOCK < Tk ? j0 + US__ATT_BLOCK : Tk;
                float bm = -INFINITY, mnew, corr;
                for (j = j0; j < j1; j++) {
                    s[j - j0] = kpos[j] <= qpos[i] ? us__dot(q, k + j * HS, HS) * scale : -INFINITY;
                    if (s[j - j0] > bm) bm = s[j - j0];
                }
                if (bm == -INFINITY) continue; /* nothing visible in this block */
                mnew = m[r] > bm ? m[r] : bm;
                corr = expf(m[r] - mnew);
                l[r] *= corr;
                for (d = 0; d < HS; d++) ar[d] *= corr;
                for (j = j0; j < j1; j++) {
                    float p;
                    if (s[j - j0] == -INFINITY) continue;
                    p = expf(s[j - j0] - mnew);
                    l[r] += p;
                    for (d = 0; d < HS; d++) ar[d] += p * v[j * HS + d];
                }
                m[r] = mnew;
            }
        }
        US_FREE(k);
    }
}

static void us__cpu_attn_block_finish(us_ops *o, void *out, float *lse, const float *acc,
                                      const float *m, const float *l, int64_t B, int64_t Tq, int NH,
                                      int HS, us_dtype dt) {
    int64_t r;
    float *row = (float *)us__scratch((size_t)HS * 4);
    int d;
    (void)o;
    for (r = 0; r < B * NH * Tq; r++) {
        int64_t b = r / (NH * Tq), h = r / Tq % NH, i = r % Tq;
        for (d = 0; d < HS; d++) row[d] = l[r] > 0 ? acc[r * HS + d] / l[r] : 0.0f;
        us__store_f32(us__at(out, dt, (b * Tq + i) * NH * HS + h * HS), dt, row, HS);
        lse[r] = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
    }
    US_FREE(row);
}

/* One thread per (batch, kv head): it owns that head's dK, dV of the block and dQ of its query
   heads, so every sum has one order whatever the thread count. */
static void us__cpu_attn_block_bwd(us_ops *o, float *dq, float *dkv, const void *dout,
                                   const void *qkv, const void *out, const float *lse,
                                   const void *kv, const int32_t *qpos, const int32_t *kpos,
                                   int64_t B, int64_t Tq, int64_t Tk, int NH, int NKV, int HS,
                                   us_dtype dt) {
    int us__nt = us__threads(o);
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KV = (int64_t)2 * NKV * HS, bg;
    int grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
    (void)us__nt;
    US__PARALLEL_FOR_DYNAMIC
    for (bg = 0; bg < B * NKV; bg++) {
        int64_t b = bg / NKV, i, j;
        int g = (int)(bg % NKV), h, d;
        float *k = (float *)us__scratch(((size_t)2 * Tk * HS + 3 * (size_t)HS) * 4),
              *v = k + Tk * HS, *q = v + Tk * HS, *dob = q + HS, *ob = dob + HS;
        for (j = 0; j < Tk; j++) {
            us__load_f32(k + j * HS, us__at(kv, dt, (b * Tk + j) * KV + (int64_t)g * HS), dt, HS);
            us__load_f32(v + j * HS, us__at(kv, dt, (b * Tk + j) * KV + (int64_t)(NKV + g) * HS),
                         dt, HS);
        }
        for (h = g * grp; h < (g + 1) * grp; h++)
            for (i = 0; i < Tq; i++) {
                int64_t orow = (b * Tq + i) * NH * HS + (int64_t)h * HS;
                float L = lse[(b * NH + h) * Tq + i], D, *dqr = dq + orow;
                if (L == -INFINITY) continue;
                us__load_f32(q, us__at(qkv, dt, (b * Tq + i) * QKV + (int64_t)h * HS), dt, HS);
                us__load_f32(ob, us__at(out, dt, orow), dt, HS);
                us__load_f32(dob, us__at(dout, dt, orow), dt, HS);
                D = us__dot(dob, ob, HS);
                for (j = 0; j < Tk; j++) {
                    float p, ds, *dk = dkv + (b * Tk + j) * KV + (int64_t)g * HS,
                                 *dv = dkv + (b * Tk + j) * KV + (int64_t)(NKV + g) * HS;
                    if (kpos[j] > qpos[i]) continue;
                    p = expf(us__dot(q, k + j * HS, HS) * scale - L);
                    ds = p * (us__dot(dob, v + j * HS, HS) - D) * scale;
                    for (d = 0; d < HS; d++) {
                        dqr[d] += ds * k[j * HS + d];
                        dk[d] += ds * q[d];
                        dv[d] += p * dob[d];
                    }
                }
            }
        US_FREE(k);
    }
}

US_API void us_attention_naive_fwd(float *out, const float *qkv, int64_t B, int64_t T, int NH,
                                   int NKV, int HS) {
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, b, i, j;
    float *S = (float *)us__scratch((size_t)T * T * 4);
    int h, d;
    for (b = 0; b < B; b++)
        for (h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            for (i = 0; i < T; i++) {
                float mx = -INFINITY, sum = 0;
                for (j = 0; j < T; j++) {
                    float dot = 0;
                    if (j > i) {
                        S[i * T + j] = -INFINITY;
                        continue;
                    }
                    for (d = 0; d < HS; d++)
                        dot += qkv[(b * T + i) * QKV + h * HS + d] *
                               qkv[(b * T + j) * QKV + (NH + g) * HS + d];
                    S[i * T + j] = dot / sqrtf((float)HS);
                    if (S[i * T + j] > mx) mx = S[i * T + j];
                }
                for (j = 0; j < T; j++) {
                    S[i * T + j] = j > i ? 0 : expf(S[i * T + j] - mx);
                    sum += S[i * T + j];
                }
                for (d = 0; d < HS; d++) {
                    float a = 0;
                    for (j = 0; j <= i; j++)
                        a += S[i * T + j] * qkv[(b * T + j) * QKV + (NH + NKV + g) * HS + d];
                    out[(b * T + i) * NH * HS + h * HS + d] = a / sum;
                }
            }
        }
    US_FREE(S);
}

/* ------------------------------------------------------------------------------------ */
// >>optimizer  AdamW, global-norm clipping, learning-rate schedules
/* ------------------------------------------------------------------------------------ */
/* PyTorch's AdamW order: decoupled decay p ← p·(1 − lr·wd), then the bias-corrected Adam update. */

/* Checks the learning rate, its schedule, AdamW (us_config_validate). */
static us_result us__optimizer_checks(const us_train_config *tc, char *err, size_t errlen) {
    if (!(tc->lr > 0) || !isfinite(tc->lr)) US__BAD("lr=%g must be a positive number", tc->lr);
    if (tc->warmup < 0) US__BAD("warmup=%d must not be negative", tc->warmup);
    if (!(tc->min_lr_frac >= 0 && tc->min_lr_frac <= 1))
        US__BAD("min lr fraction=%g must be in [0, 1]", tc->min_lr_frac);
    if (tc->schedule != US_LR_COSINE && tc->schedule != US_LR_CONSTANT)
        US__BAD("unknown lr schedule %d", (int)tc->schedule);
    if (!(tc->beta1 >= 0 && tc->beta1 < 1)) US__BAD("beta1=%g must be in [0, 1)", tc->beta1);
    if (!(tc->beta2 >= 0 && tc->beta2 < 1)) US__BAD("beta2=%g must be in [0, 1)", tc->beta2);
    if (!(tc->adam_eps > 0)) US__BAD("adam eps=%g must be positive", tc->adam_eps);
    if (isnan(tc->weight_decay)) US__BAD("weight decay must be a number");
    if (isnan(tc->grad_clip)) US__BAD("grad clip must be a number");
    return US_OK;
}

static void us__cpu_adamw(us_ops *o, float *p, const float *g, float *m, float *v, void *p_lowp,
                          us_dtype lowdt, int64_t n, float lr, float beta1, float beta2, float eps,
                          float wd, float gscale, int step) {
    int us__nt = us__threads(o);
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    int64_t i;
    (void)us__nt;
    US__PARALLEL_FOR
    for (i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
        v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        p[i] = p[i] * (1.0f - lr * wd) - lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps);
        if (p_lowp) us__set(p_lowp, lowdt, i, p[i]);
    }
}

US_API float us_lr_at(const us_train_config *tc, int step) {
    float lr = tc->lr, floor_lr = tc->lr * tc->min_lr_frac;
    if (step < tc->warmup) return lr * (float)(step + 1) / (float)tc->warmup;
    if (tc->schedule == US_LR_CONSTANT || tc->steps <= tc->warmup) return lr;
    {
        double prog = (double)(step - tc->warmup) / (double)(tc->steps - tc->warmup);
        if (prog > 1) prog = 1;
        return floor_lr +
               (lr - floor_lr) * 0.5f * (float)(1.0 + cos(3.14159265358979323846 * prog));
    }
}

US_API us_ops us_cpu_ops(int nthreads) {
    us_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cpu";
    o.nthreads = nthreads;
    o.alloc = us__cpu_alloc;
    o.free = us__cpu_free;
    o.zero = us__cpu_zero;
    o.copy = us__cpu_copy;
    o.sync = us__cpu_sync;
    o.cast = us__cpu_cast;
    o.gemm = us__cpu_gemm;
    o.gemm_grouped = us__gemm_grouped_each;
    o.embedding_fwd = us__cpu_embedding_fwd;
    o.embedding_bwd = us__cpu_embedding_bwd;
    o.rmsnorm_fwd = us__cpu_rmsnorm_fwd;
    o.rmsnorm_bwd = us__cpu_rmsnorm_bwd;
    o.rope_fwd = us__cpu_rope_fwd;
    o.rope_bwd = us__cpu_rope_bwd;
    o.attention_fwd = us__cpu_attention_fwd;
    o.attention_bwd = us__cpu_attention_bwd;
    o.copy2d = us__cpu_copy2d;
    o.rope_at = us__cpu_rope_at;
    o.attn_block_fwd = us__cpu_attn_block_fwd;
    o.attn_block_finish = us__cpu_attn_block_finish;
    o.attn_block_bwd = us__cpu_attn_block_bwd;
    o.swiglu_fwd = us__cpu_swiglu_fwd;
    o.swiglu_bwd = us__cpu_swiglu_bwd;
    o.xent = us__cpu_xent;
    o.adamw = us__cpu_adamw;
    o.sumsq = us__cpu_sumsq;
    o.axpy = us__cpu_axpy;
    o.xent_stats = us__cpu_xent_stats;
    o.xent_finish = us__cpu_xent_finish;
    o.moe_route = us__cpu_moe_route;
    o.moe_route_bwd = us__cpu_moe_route_bwd;
    o.moe_permute = us__cpu_moe_permute;
    o.moe_gather = us__cpu_moe_gather;
    o.moe_scatter = us__cpu_moe_scatter;
    o.moe_gate_grad = us__cpu_moe_gate_grad;
    o.fp8_quantize = us__cpu_fp8_quantize;
    o.fp8_gemm = us__cpu_fp8_gemm;
    o.fp8_quantize_both = us__cpu_fp8_quantize_both;
    o.rmsnorm_fwd_fp8 = us__cpu_rmsnorm_fwd_fp8;
    o.swiglu_fwd_fp8 = us__cpu_swiglu_fwd_fp8;
    o.swiglu_bwd_fp8 = us__cpu_swiglu_bwd_fp8;
    return o;
}

/* ------------------------------------------------------------------------------------ */
// >>comm  the comm seam's world of one rank
/* ------------------------------------------------------------------------------------ */
static us_result us__self_group(us_comm *c, us_group *g) {
    if (!g || g->size != 1 || g->rank != 0) {
        us__errf(c->err, sizeof c->err, "a world of one rank has only group {0}");
        return US_ERR_INVALID;
    }
    return US_OK;
}

static us_result us__self_copy(us_comm *c, void *dst, const void *src, int64_t n, us_dtype dt) {
    if (n < 0) {
        us__errf(c->err, sizeof c->err, "negative element count %lld", (long long)n);
        return US_ERR_INVALID;
    }
    if (dst != src && n > 0)
        c->ops->copy(c->ops, dst, src, (size_t)n * us_dtype_size(dt), US_COPY_D2D);
    return US_OK;
}

static us_result us__self_all_reduce(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt,
                                     us_reduce_op op, us_work **w) {
    (void)buf;
    (void)n;
    (void)dt;
    (void)op;
    if (w) *w = NULL;
    return us__self_group(c, g); /* sum, mean or max over one rank is the value itself */
}

static us_result us__self_reduce_scatter(us_comm *c, us_group *g, void *dst, const void *src,
                                         int64_t n, us_dtype dt, us_reduce_op op, us_work **w) {
    us_result r = us__self_group(c, g);
    (void)op;
    if (w) *w = NULL;
    return r != US_OK ? r : us__self_copy(c, dst, src, n, dt);
}

static us_result us__self_all_gather(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                     us_dtype dt, us_work **w) {
    us_result r = us__self_group(c, g);
    if (w) *w = NULL;
    return r != US_OK ? r : us__self_copy(c, dst, src, n, dt);
}

static us_result us__self_broadcast(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt,
                                    int root, us_work **w) {
    (void)buf;
    (void)n;
    (void)dt;
    if (w) *w = NULL;
    if (root != 0) {
        us__errf(c->err, sizeof c->err, "broadcast root %d is not a rank of a one-rank group",
                 root);
        return US_ERR_INVALID;
    }
    return us__self_group(c, g);
}

static us_result us__self_p2p(us_comm *c, us_group *g, int peer, us_work **w, const char *what) {
    (void)g;
    if (w) *w = NULL;
    us__errf(c->err, sizeof c->err, "%s peer %d: a world of one rank has no peers", what, peer);
    return US_ERR_INVALID;
}

static us_result us__self_send(us_comm *c, us_group *g, const void *buf, int64_t n, us_dtype dt,
                               int peer, us_work **w) {
    (void)buf;
    (void)n;
    (void)dt;
    return us__self_p2p(c, g, peer, w, "send to");
}

static us_result us__self_recv(us_comm *c, us_group *g, void *buf, int64_t n, us_dtype dt, int peer,
                               us_work **w) {
    (void)buf;
    (void)n;
    (void)dt;
    return us__self_p2p(c, g, peer, w, "recv from");
}

static us_result us__self_all_to_all(us_comm *c, us_group *g, void *dst, const int64_t *rc,
                                     const int64_t *rd, const void *src, const int64_t *sc,
                                     const int64_t *sd, us_dtype dt, us_work **w) {
    us_result r = us__self_group(c, g);
    if (w) *w = NULL;
    if (r != US_OK) return r;
    if (rc[0] != sc[0]) {
        us__errf(c->err, sizeof c->err, "all-to-all sends %lld elements to itself but expects %lld",
                 (long long)sc[0], (long long)rc[0]);
        return US_ERR_INVALID;
    }
    return us__self_copy(c, us__at(dst, dt, rd[0]), us__at(src, dt, sd[0]), sc[0], dt);
}

static us_result us__self_reduce(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                 us_dtype dt, us_reduce_op op, int root, us_work **w) {
    us_result r = us__self_group(c, g);
    (void)op;
    if (w) *w = NULL;
    if (r == US_OK && root != 0) {
        us__errf(c->err, sizeof c->err, "reduce root %d is not a rank of a one-rank group", root);
        return US_ERR_INVALID;
    }
    return r != US_OK ? r : us__self_copy(c, dst, src, n, dt);
}

static us_result us__self_gather(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                 us_dtype dt, int root, us_work **w) {
    return us__self_reduce(c, g, dst, src, n, dt, US_REDUCE_SUM, root, w); /* one block: a copy */
}

static us_result us__self_scatter(us_comm *c, us_group *g, void *dst, const void *src, int64_t n,
                                  us_dtype dt, int root, us_work **w) {
    return us__self_reduce(c, g, dst, src, n, dt, US_REDUCE_SUM, root, w);
}

static us_result us__self_split(us_comm *c, us_group *parent, int color, int key, us_group *out) {
    us_result r = us__self_group(c, parent);
    (void)key;
    if (r != US_OK) return r;
    out->size = color < 0 ? 0 : 1;
    out->rank = 0;
    out->impl = NULL;
    return US_OK;
}

static void us__self_group_free(us_comm *c, us_group *g) {
    (void)c;
    g->size = 0;
}

static us_result us__self_dup(us_comm *c, us_group *g, us_group *out) {
    return us__self_split(c, g, 0, 0, out);
}

static us_result us__self_sendrecv(us_comm *c, us_group *g, const void *sbuf, int64_t sn, int speer,
                                   void *rbuf, int64_t rn, int rpeer, us_dtype dt, us_work **w) {
    (void)sbuf;
    (void)sn;
    (void)rbuf;
    (void)rn;
    (void)rpeer;
    (void)dt;
    return us__self_p2p(c, g, speer, w, "sendrecv to");
}

static us_result us__self_barrier(us_comm *c, us_group *g) { return us__self_group(c, g); }

static us_result us__self_wait(us_comm *c, us_work *w) {
    (void)c;
    (void)w;
    return US_OK;
}

US_API void us_comm_self(us_comm *c, us_ops *ops) {
    memset(c, 0, sizeof *c);
    c->name = "self";
    c->ops = ops;
    c->world.size = 1;
    c->world.rank = 0;
    c->all_reduce = us__self_all_reduce;
    c->reduce_scatter = us__self_reduce_scatter;
    c->all_gather = us__self_all_gather;
    c->broadcast = us__self_broadcast;
    c->send = us__self_send;
    c->recv = us__self_recv;
    c->all_to_all = us__self_all_to_all;
    c->barrier = us__self_barrier;
    c->wait = us__self_wait;
    c->reduce = us__self_reduce;
    c->gather = us__self_gather;
    c->scatter = us__self_scatter;
    c->split = us__self_split;
    c->group_free = us__self_group_free;
    c->dup = us__self_dup;
    c->p2p_early = 1;
    c->sendrecv = us__self_sendrecv;
}

/* The mesh: tp innermost, then cp, pp, dp (Playbook "5D parallelism": TP groups stay inside a
   node, where bandwidth is highest). Each group is a split of the world by the coordinates it
   does not span. */
US_API us_result us_mesh_init(us_mesh *mesh, us_comm *c, int dp, int pp, int cp, int tp) {
    int r = c->world.rank;
    us_result res;
    memset(mesh, 0, sizeof *mesh);
    mesh->dp = dp > 0 ? dp : 1;
    mesh->pp = pp > 0 ? pp : 1;
    mesh->cp = cp > 0 ? cp : 1;
    mesh->tp = tp > 0 ? tp : 1;
    if ((int64_t)mesh->dp * mesh->pp * mesh->cp * mesh->tp != c->world.size) {
        us__errf(c->err, sizeof c->err,
                 "the mesh dp %d x pp %d x cp %d x tp %d = %lld ranks does not match the world of "
                 "%d ranks",
                 mesh->dp, mesh->pp, mesh->cp, mesh->tp,
                 (long long)mesh->dp * mesh->pp * mesh->cp * mesh->tp, c->world.size);
        return US_ERR_INVALID;
    }
    mesh->tp_rank = r % mesh->tp;
    mesh->cp_rank = r / mesh->tp % mesh->cp;
    mesh->pp_rank = r / (mesh->tp * mesh->cp) % mesh->pp;
    mesh->dp_rank = r / (mesh->tp * mesh->cp * mesh->pp);
    { /* color = the coordinates a group does not span, flattened; key = the coordinate it does */
        int d = mesh->dp_rank, p = mesh->pp_rank, x = mesh->cp_rank, t = mesh->tp_rank;
        int P = mesh->pp, X = mesh->cp, T = mesh->tp;
        if ((res = c->split(c, &c->world, (d * P + p) * X + x, t, &mesh->tp_g)) != US_OK)
            return res;
        if ((res = c->split(c, &c->world, (d * P + p) * T + t, x, &mesh->cp_g)) != US_OK)
            return res;
        if ((res = c->split(c, &c->world, (d * X + x) * T + t, p, &mesh->pp_g)) != US_OK)
            return res;
        if ((res = c->split(c, &c->world, (p * X + x) * T + t, d, &mesh->dp_g)) != US_OK)
            return res;
        if ((res = c->split(c, &c->world, p * T + t, d * X + x, &mesh->dpcp_g)) != US_OK)
            return res;
    }
    return US_OK;
}

US_API void us_mesh_free(us_mesh *mesh, us_comm *c) {
    us_group *g[5];
    int i;
    g[0] = &mesh->tp_g;
    g[1] = &mesh->cp_g;
    g[2] = &mesh->pp_g;
    g[3] = &mesh->dp_g;
    g[4] = &mesh->dpcp_g;
    for (i = 0; i < 5; i++)
        if (g[i]->size && c->group_free) c->group_free(c, g[i]);
    memset(mesh, 0, sizeof *mesh);
}

/* ------------------------------------------------------------------------------------ */
// >>trace  named regions per rank and stream, written as a Chrome / Perfetto trace
/* ------------------------------------------------------------------------------------ */
US_API double us_trace_now_us(void) { return 1e6 * us__now_s(); }

US_API void us_trace_init(us_trace *t, int rank) {
    memset(t, 0, sizeof *t);
    t->rank = rank;
}

US_API void us_trace_free(us_trace *t) {
    int s;
    for (s = 0; s < US_TRACE_STREAMS; s++) US_FREE(t->ev[s]);
    memset(t, 0, sizeof *t);
}

US_API void us_trace_add(us_trace *t, int stream, const char *cat, const char *name, double t0,
                         double t1) {
    us_trace_event *e;
    if (!t || stream < 0 || stream >= US_TRACE_STREAMS) return;
    if (t->n[stream] == t->cap[stream]) { /* a trace that cannot grow drops events, never the run */
        int cap = t->cap[stream] ? 2 * t->cap[stream] : 1024;
        us_trace_event *ne = (us_trace_event *)realloc(t->ev[stream], (size_t)cap * sizeof *ne);
        if (!ne) return;
        t->ev[stream] = ne;
        t->cap[stream] = cap;
    }
    e = &t->ev[stream][t->n[stream]++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cat = cat;
    e->t0 = t0;
    e->t1 = t1;
}

US_API us_result us_trace_write(const char *path, us_trace *const *ranks, int nranks, char *err,
                                size_t errlen) {
    double base = 1e300;
    int r, s, i;
    for (r = 0; r < nranks; r++) /* times start at the earliest event of any rank */
        for (s = 0; s < US_TRACE_STREAMS; s++)
            for (i = 0; i < ranks[r]->n[s]; i++)
                if (ranks[r]->ev[s][i].t0 < base) base = ranks[r]->ev[s][i].t0;
    return us_trace_write_at(path, ranks, nranks, base < 1e300 ? base : 0, err, errlen);
}

US_API us_result us_trace_write_at(const char *path, us_trace *const *ranks, int nranks,
                                   double base, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    int r, s, i, first = 1;
    static const char *stream_names[US_TRACE_STREAMS] = {"compute", "communication", "host"};
    if (!f) {
        us__errf(err, errlen, "cannot write the trace %s", path);
        return US_ERR_IO;
    }
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    for (r = 0; r < nranks; r++) {
        int pid = ranks[r]->rank;
        fprintf(
            f,
            "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
            first ? "" : ",\n", pid, pid);
        first = 0;
        for (s = 0; s < US_TRACE_STREAMS; s++) {
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{"
                    "\"name\":\"%s\"}}",
                    pid, s, stream_names[s]);
            for (i = 0; i < ranks[r]->n[s]; i++) {
                const us_trace_event *e = &ranks[r]->ev[s][i];
                fprintf(f,
                        ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":\"%s\","
                        "\"ts\":%.3f,\"dur\":%.3f}",
                        pid, s, e->cat ? e->cat : "", e->name, e->t0 - base, e->t1 - e->t0);
            }
        }
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0) {
        us__errf(err, errlen, "cannot finish writing the trace %s", path);
        return US_ERR_IO;
    }
    return US_OK;
}

/* Tracing the step. A compute region starts with us__tstart and ends with us__trace: on the CPU
   both read the host clock; on a GPU (us_ops.mark) both drop a mark into the compute stream, and
   the region's GPU times are read at the end of the step (us__trace_flush), so the trace shows when
   the GPU computed, not when the host issued. Host activities (launching and waiting for
   collectives) are timed by the host clock: us__trace_host, on the host row on a GPU. */
typedef struct us__trace_mark {
    double t;
    int id;
} us__trace_mark;

struct us__tpend {
    const char *cat;
    char name[48];
    int id0, id1;
};

static us__trace_mark us__tstart(us_model *m) {
    us__trace_mark t;
    t.t = us_trace_now_us();
    t.id = m->trace && m->ops.mark ? m->ops.mark(&m->ops) : -1;
    return t;
}

static void us__trace(us_model *m, const char *cat, const char *name, us__trace_mark t0) {
    struct us__tpend *p;
    int id1;
    if (!m->trace) return;
    if (!m->ops.mark) {
        us_trace_add(m->trace, US_STREAM_COMPUTE, cat, name, t0.t, us_trace_now_us());
        return;
    }
    if (t0.id < 0 || (id1 = m->ops.mark(&m->ops)) < 0)
        return; /* out of marks: the region is left out */
    if (m->n_tpend == m->cap_tpend) {
        int cap = m->cap_tpend ? 2 * m->cap_tpend : 256;
        struct us__tpend *np = (struct us__tpend *)realloc(m->tpend, (size_t)cap * sizeof *np);
        if (!np) return;
        m->tpend = np;
        m->cap_tpend = cap;
    }
    p = &m->tpend[m->n_tpend++];
    p->cat = cat;
    p->id0 = t0.id;
    p->id1 = id1;
    snprintf(p->name, sizeof p->name, "%s", name);
}

static void us__trace_host(us_model *m, const char *cat, const char *name, double t0) {
    if (m->trace)
        us_trace_add(m->trace, m->ops.mark ? US_STREAM_HOST : US_STREAM_COMPUTE, cat, name, t0,
                     us_trace_now_us());
}

/* The step's GPU-timed regions into the trace (one sync; only when tracing a GPU). */
static void us__trace_flush(us_model *m) {
    int i;
    if (!m->n_tpend) return;
    m->ops.sync(&m->ops);
    for (i = 0; i < m->n_tpend; i++)
        us_trace_add(m->trace, US_STREAM_COMPUTE, m->tpend[i].cat, m->tpend[i].name,
                     m->ops.mark_us(&m->ops, m->tpend[i].id0),
                     m->ops.mark_us(&m->ops, m->tpend[i].id1));
    m->n_tpend = 0;
    m->ops.mark_reset(&m->ops);
}

/* ------------------------------------------------------------------------------------ */
// >>model  Llama decoder: flat parameter buffers with Hugging Face names, the arena, init
/* ------------------------------------------------------------------------------------ */
/* The model's data, in order: the random streams and the errors; the parameters (their order in
   the flat buffers, names, counts: us__build_params); the activations (us_layer_acts, the named
   scratch, the arena laid out per pipeline slot: us__layout_arena); the weights' initialisation;
   the accessors us__weight and us__grad, which find a tensor wherever ZeRO keeps it. The decoder
   layer's forward and backward are // >>layer; the set-up that runs every chapter's part is
   // >>train's us__model_setup. */
US_API void us_rng_seed(us_rng *r, uint64_t seed) { r->s = seed; }

US_API uint64_t us_rng_u64(us_rng *r) { /* splitmix64: tiny, good enough, splittable by seed */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

US_API float us_rng_uniform(us_rng *r) {
    return (float)(us_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

US_API float us_rng_normal(us_rng *r) {
    double u1 = ((double)(us_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(us_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void us__model_set_error(us_model *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
}

US_API const char *us_model_error(const us_model *m) { return m->err; }

/* A backend that failed (a CUDA error, say) turns the next result into US_ERR_BACKEND. */
static us_result us__backend_check(us_model *m) {
    const char *e = m->ops.error ? m->ops.error(&m->ops) : NULL;
    if (!e) return US_OK;
    us__model_set_error(m, "%s backend: %s", m->ops.name, e);
    return US_ERR_BACKEND;
}

static us_result us__comm_fail(us_model *m, us_result r, const char *what) {
    if (r != US_OK && !m->err[0]) us__model_set_error(m, "%s: %s", what, m->comm->err);
    return r;
}

/* Parameter order (and so flat-buffer order). q/k/v are adjacent, so one GEMM against the
   [QKV, C] block computes all three; gate/up likewise form one [2F, C] block. A MoE layer
   (// >>moe) has the router at US__P_GATE, then gate|up|down triples: the shared expert's, then
   each routed expert's. Layers differ in length, so layer l's tensors start at m->layer_p[l]
   (the macros read the `m` in scope: every caller is a function of the model). */
enum {
    US__P_LN1,
    US__P_Q,
    US__P_K,
    US__P_V,
    US__P_O,
    US__P_LN2,
    US__P_GATE,
    US__P_UP,
    US__P_DOWN,
    US__P_PER_LAYER
};

enum {
    US__P_ROUTER = US__P_GATE,
    US__P_EXPERTS = US__P_GATE + 1
}; /* a MoE layer's router and first triple */

#define US__TENSOR(l, k) (m->layer_p[l] + (k)) /* index of layer l's tensor k */
#define US__P_NORM(L) (m->layer_p[L])
#define US__P_HEAD(L) (m->layer_p[L] + 1)

/* Whether global layer lg is a MoE layer: E > 0, past the first dense ones, every moe_every-th. */
static int us__is_moe(const us_model_config *c, int lg) {
    return c->moe_experts > 0 && lg >= c->moe_first_dense &&
           (lg - c->moe_first_dense) % c->moe_every == 0;
}

/* expert parallelism's size (// >>ep): 1 when off */
static int us__ep_size(const us_train_config *tc) { return tc->ep > 1 ? tc->ep : 1; }

/* Tensors of global layer lg on a rank of an ep group of size ep: the E/ep local experts. */
static int us__layer_tensors(const us_model_config *c, int ep, int lg) {
    return us__is_moe(c, lg) ? US__P_EXPERTS + 3 * (c->moe_experts / ep + c->moe_shared)
                             : US__P_PER_LAYER;
}

/* Parameters of the model (active = 0) or those one token uses (active = 1: K routed experts). */
static int64_t us__param_count(const us_model_config *mc_in, int active) {
    us_model_config c = *mc_in, *mc = &c;
    int64_t C, HS, QKV, attn, n;
    int l;
    us_model_config_defaults(mc); /* zero means default here too */
    C = mc->dim;
    HS = mc->dim / mc->n_heads;
    QKV = (int64_t)(mc->n_heads + 2 * mc->n_kv_heads) * HS;
    attn = 2 * C + QKV * C + (int64_t)mc->n_heads * HS * C;
    n = mc->vocab * C * (mc->tie_embeddings ? 1 : 2) + C;
    for (l = 0; l < mc->n_layers; l++) {
        if (!us__is_moe(mc, l)) {
            n += attn + 3 * C * mc->ffn_dim;
            continue;
        }
        n += attn + (int64_t)mc->moe_experts * C +
             (int64_t)((active ? mc->moe_top_k : mc->moe_experts) + mc->moe_shared) * 3 * C *
                 mc->moe_ffn_dim;
    }
    return n;
}

US_API int64_t us_param_count(const us_model_config *mc) { return us__param_count(mc, 0); }

/* Tensor i's place: its layer (-1: the embedding, final norm or head) and index k in the layer;
   the role of k: 1 the second or third part of a fused GEMM block (k, v, up), 2 a residual
   output projection (o, down: the smaller init), 0 else. */
static int us__tensor_role(const us_model *m, int i, int *layer, int *kk) {
    int l, k, moe;
    *layer = -1;
    *kk = 0;
    if (i < 1 || i >= m->layer_p[m->cfg.n_layers]) return 0;
    for (l = 0; m->layer_p[l + 1] <= i; l++) {
    }
    k = i - m->layer_p[l];
    *layer = l;
    *kk = k;
    moe = us__is_moe(&m->cfg, m->layer_g[l]);
    if (k == US__P_K || k == US__P_V) return 1;
    if (k == US__P_O) return 2;
    if (!moe) return k == US__P_UP ? 1 : k == US__P_DOWN ? 2 : 0;
    return k < US__P_EXPERTS              ? 0
           : (k - US__P_EXPERTS) % 3 == 1 ? 1
           : (k - US__P_EXPERTS) % 3 == 2 ? 2
                                          : 0;
}

US_API int64_t us_param_count_active(const us_model_config *mc) { return us__param_count(mc, 1); }

static void us__add_param(us_model *m, const char *name, int64_t rows, int64_t cols, int64_t *off) {
    us_param *p = &m->params[m->n_params_t++];
    p->tp_split = 0;
    p->expert = 0;
    p->name[0] = 0;
    if (!m->params_unnamed) snprintf(p->name, sizeof p->name, "%s", name);
    p->offset = *off;
    p->ndim = cols ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols;
    p->numel = rows * (cols ? cols : 1);
    p->decay = cols != 0;
    *off += p->numel;
}

static void us__build_params(us_model *m) {
    const us_model_config *c = &m->cfg;
    int64_t C = c->dim, HS = C / c->n_heads, off = 0;
    int l, e, tp = m->tc.tp > 0 ? m->tc.tp : 1, El = c->moe_experts / us__ep_size(&m->tc);
    int kv_split = m->kv_rep > 1 ? 3 : 1; /* k, v by kv head: kv_rep ranks share one (// >>tp) */
    char nm[80] = "";
    /* tensor parallelism (us__tp_init set this rank's share): q/k/v and gate/up are
       column-parallel (this rank's output rows of the weight), o and down row-parallel (its input
       columns); the embedding and the head hold this rank's slice of the vocabulary; norms are
       replicated */
    m->n_params_t = 0;
    /* pipeline stages hold their own layers; the embedding (first stage; tied, the last stage's
       head too: its copy, // >>pp) and the final norm and head (last stage) exist on every stage
       with zero rows elsewhere, so tensor indices stay fixed */
    us__add_param(m, "model.embed_tokens.weight",
                  m->pp_first || (c->tie_embeddings && m->pp_last) ? m->vocab_l : 0, C, &off);
    m->params[0].tp_split = tp > 1;
    for (l = 0; l < c->n_layers; l++) {
#define US__ADD_LAYER_PARAM(suffix, r, cc, split)                                                  \
    (m->params_unnamed ? 0 : snprintf(nm, sizeof nm, "model.layers.%d.%s", m->layer_g[l], suffix), \
     us__add_param(m, nm, r, cc, &off),                                                            \
     m->params[m->n_params_t - 1].tp_split = tp > 1 ? split : 0)
        m->layer_p[l] = m->n_params_t;
        US__ADD_LAYER_PARAM("input_layernorm.weight", C, 0, 0);
        US__ADD_LAYER_PARAM("self_attn.q_proj.weight", (int64_t)m->nh_l * HS, C, 1);
        US__ADD_LAYER_PARAM("self_attn.k_proj.weight", (int64_t)m->nkv_l * HS, C, kv_split);
        US__ADD_LAYER_PARAM("self_attn.v_proj.weight", (int64_t)m->nkv_l * HS, C, kv_split);
        US__ADD_LAYER_PARAM("self_attn.o_proj.weight", C, (int64_t)m->nh_l * HS, 2);
        US__ADD_LAYER_PARAM("post_attention_layernorm.weight", C, 0, 0);
        /* DeepSeek-MoE names (// >>moe); the router bias is not a parameter */
        if (us__is_moe(c, m->layer_g[l])) {
            int64_t Fe = c->moe_ffn_dim;
            char sfx[64] = "";
            US__ADD_LAYER_PARAM("mlp.gate.weight", c->moe_experts, C, 0);
            if (c->moe_shared) {
                US__ADD_LAYER_PARAM("mlp.shared_experts.gate_proj.weight", Fe, C, 0);
                US__ADD_LAYER_PARAM("mlp.shared_experts.up_proj.weight", Fe, C, 0);
                US__ADD_LAYER_PARAM("mlp.shared_experts.down_proj.weight", C, Fe, 0);
            }
            /* expert parallelism (// >>ep): this rank's E/ep experts, under their global numbers */
            for (e = m->ep_rank * El; e < (m->ep_rank + 1) * El; e++) {
                if (!m->params_unnamed)
                    snprintf(sfx, sizeof sfx, "mlp.experts.%d.gate_proj.weight", e);
                US__ADD_LAYER_PARAM(sfx, Fe, C, 0);
                m->params[m->n_params_t - 1].expert = 1;
                if (!m->params_unnamed)
                    snprintf(sfx, sizeof sfx, "mlp.experts.%d.up_proj.weight", e);
                US__ADD_LAYER_PARAM(sfx, Fe, C, 0);
                m->params[m->n_params_t - 1].expert = 1;
                if (!m->params_unnamed)
                    snprintf(sfx, sizeof sfx, "mlp.experts.%d.down_proj.weight", e);
                US__ADD_LAYER_PARAM(sfx, C, Fe, 0);
                m->params[m->n_params_t - 1].expert = 1;
            }
        } else {
            US__ADD_LAYER_PARAM("mlp.gate_proj.weight", m->ffn_l, C, 1);
            US__ADD_LAYER_PARAM("mlp.up_proj.weight", m->ffn_l, C, 1);
            US__ADD_LAYER_PARAM("mlp.down_proj.weight", C, m->ffn_l, 2);
        }
#undef US__ADD_LAYER_PARAM
    }
    m->layer_p[c->n_layers] = m->n_params_t;
    us__add_param(m, "model.norm.weight", m->pp_last ? C : 0, 0, &off);
    if (!c->tie_embeddings) {
        us__add_param(m, "lm_head.weight", m->pp_last ? m->vocab_l : 0, C, &off);
        m->params[m->n_params_t - 1].tp_split = tp > 1;
    }
    m->n_params = off;
}

/* The parameter tables of this rank's layers, filled by us__build_params. */
static us_result us__params_init(us_model *m) {
    int nt = 3, i;
    for (i = 0; i < m->cfg.n_layers; i++)
        nt += us__layer_tensors(&m->cfg, us__ep_size(&m->tc), m->layer_g[i]);
    m->params = (us_param *)US_MALLOC(sizeof(us_param) * (size_t)nt);
    m->unit_of = (int *)US_MALLOC(sizeof(int) * (size_t)nt);
    m->layer_p = (int *)US_MALLOC(sizeof(int) * (size_t)(m->cfg.n_layers + 1));
    if (!m->params || !m->unit_of || !m->layer_p) {
        us__model_set_error(m, "out of host memory for the model tables");
        return US_ERR_OOM;
    }
    us__build_params(m);
    return US_OK;
}

/* A unit: a contiguous range of whole tensors in the flat buffers, the thing data parallelism
   reduces in one collective and ZeRO shards (// >>dp, // >>zero). */
typedef struct us__unit {
    int p0, p1;        /* parameter tensors [p0, p1) */
    int64_t off, n;    /* flat offset and length, padding included */
    int64_t piece;     /* n / dp under ZeRO (each rank owns one piece), else n */
    int64_t shard_off; /* where a rank's piece sits in the shard buffers (off without ZeRO) */
    int pending;       /* tensors whose gradient this backward has not finished */
    us_work *work;     /* in-flight gradient reduction */
    us_work *gather;   /* ZeRO-3: in-flight all-gather of the weights */
    int gslot, wslot;  /* ZeRO-2/3 gradient slot / ZeRO-3 weight slot holding the unit, -1 none */
    /* routed experts' weights under ep > 1: reduced over the expert-data-parallel group
       (// >>ep) */
    int expert;
} us__unit;

#define US__SHARD_PAD 16 /* a ZeRO piece is a multiple of 16 elements: 64-byte aligned in fp32 */

/* The group a unit's gradient is reduced over, and that ZeRO shards it over: routed experts under
   ep, their expert-data-parallel group (the ranks holding the same experts, // >>ep); everything
   else, dp×cp. And this rank's place in it: the piece it owns. */
static us_group *us__unit_group(us_model *m, const us__unit *U) {
    return U->expert ? &m->edp_g : &m->mesh.dpcp_g;
}

static int us__unit_rank(const us_model *m, const us__unit *U) {
    return U->expert ? m->edp_g.rank : m->mesh.dpcp_g.rank;
}

US_API const us_param *us_model_find_param(const us_model *m, const char *name) {
    int i;
    for (i = 0; i < m->n_params_t; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

/* Activations: pointers per layer. Depending on the recompute mode some point into one shared
   layer-sized scratch that every layer overwrites in the forward and the backward refills. */
struct us_layer_acts {
    void *x;      /* [N,C]   layer input: kept in every mode */
    void *ln1;    /* [N,C]   input_layernorm output */
    float *rstd1; /* [N]     */
    void *qkv;    /* [N,QKV] after RoPE */
    void *att;    /* [N,NH·HS] attention output */
    float *lse;   /* [B,NH,T] log-sum-exp of each attention row */
    void *xmid;   /* [N,C]   residual after attention */
    void *ln2;    /* [N,C]   */
    float *rstd2; /* [N]     */
    void *gu;     /* [N,2F]  gate | up */
    void *h;      /* [N,F]   SwiGLU output, or (h_t) hᵀ's FP8 operand in its bytes */
    int h_t;      /* h holds hᵀ's 128×1 FP8 operand for the down linear's Wgrad instead of h
                (us__swiglu_fwd; its layout: us__h_t) */
    /* zero-bubble schedules (B and W apart): the output gradients the weight GEMMs read, kept
       from B until W; NULL otherwise */
    void *g_down; /* [N,C]   the residual gradient entering the MLP (down-projection output) */
    void *g_gu;   /* [N,2F]  gate | up output gradient */
    void *g_o;    /* [N,C]   the residual gradient entering attention (o-projection output) */
    void *g_qkv;  /* [N,QKV] q | k | v output gradient (after RoPE's backward) */
    /* and under ZeRO-2/3 the two norms' weight gradients, computed by B, handed over by W, so
       that W completes every unit of the layer (us__layer_w); NULL otherwise */
    float *g_ln1; /* [C]     f32 */
    float *g_ln2; /* [C]     f32 */
    /* a MoE layer (// >>moe; NULL in a dense one, which has gu and h instead). R rows of the
       permuted buffers: N·K, fewer under a capacity limit; Fe the expert size. The routing and
       the permutation are explicit tensors, so expert parallelism can send each expert's rows
       (counts, then the rows) to the rank that holds it between permute and experts, and back. */
    float *logits;     /* [N,E]   f32 router logits */
    float *probs;      /* [N,E]   f32 softmax or sigmoid scores */
    int32_t *topk;     /* [N,K]   each token's experts */
    float *gates;      /* [N,K]   f32 their combine weights */
    int32_t *slot_row; /* [N,K]   the row each choice went to, -1 dropped */
    int32_t *row_slot; /* [R]     the choice n·K+k each row holds, -1 unused */
    /* [2E]    tokens routed to each expert, then those kept (host copy: m->moe_counts_h) */
    int32_t *counts;
    void *xe;   /* [R,C]   the normed tokens, grouped by expert */
    void *gu_e; /* [R,2Fe] each row's expert's gate | up */
    void *h_e;  /* [R,Fe]  SwiGLU */
    void *ye;   /* [R,C]   expert outputs (before the gates) */
    void *sgu;  /* [N,2Fe] shared expert gate | up (moe_shared) */
    void *sh;   /* [N,Fe]  shared expert SwiGLU */
    /* a MoE layer under B and W apart (us__moe_w): the weight GEMMs' output gradients, kept from
       B until W; the residual gradient the shared expert's down-projection reads goes in g_down */
    void *g_dye;  /* [Rx,C]   the local experts' output gradients, expert-major */
    void *g_dgu;  /* [Rx,2Fe] their gate | up output gradients */
    void *g_sdgu; /* [N,2Fe]  the shared expert's gate | up output gradient (moe_shared) */
    void *g_dlg;  /* [N,E]    the router's logits gradient, in dt */
};

/* named scratch in us_model.a[] */
enum {
    US__A_XOUT,
    US__A_XF,
    US__A_RSTDF,
    US__A_LOGITS,
    US__A_LOSSES,
    US__A_ARGMAX,
    US__A_TOK,
    US__A_TGT,
    US__A_DRES,
    US__A_DLN,
    US__A_DATT,
    US__A_DQKV,
    US__A_DH,
    US__A_SCAL,
    US__A_VP,
    US__A_SPG,
    US__A_NW,
    US__A_CPPOS,
    US__A_CPKV,
    US__A_CPDKV,
    US__A_CPACC,
    US__A_CPM,
    US__A_CPL,
    US__A_CPDQ,
    US__A_CPTMP,
    US__A_MOE,
    US__A_FP8,
    US__A_COUNT
};

typedef struct us__arena {
    char *base;
    size_t used;
} us__arena;

static void *us__take(us__arena *a, size_t bytes) {
    void *p = a->base ? a->base + a->used : NULL;
    a->used += us__align(bytes);
    return p;
}

static int us__emb_sparse(const us_model_config *mc, const us_train_config *tc); /* // >>dp */

/* Bytes of an activation or weight element the forward reads: 4 under fp32, else 2 (bf16,
   fp16, and FP8, whose activations stay in bf16 between its GEMMs) */
static int64_t us__act_bytes(const us_train_config *tc) {
    return tc->precision == US_PRECISION_FP32 ? 4 : 2;
}

/* Rows of the fused head's chunk for a micro-batch of Nf rows (Nf itself: one chunk, the logits
   whole). Chunks need the head's backward in the forward: no pipeline (a stage's forward and
   backward are apart), ZeRO below 2 (gradients resident). The default keeps the logits under
   US_LOSS_CHUNK_BYTES in chunks of a multiple of 64 rows; a chunk holds at least tp·B rows,
   where us__last_logits gathers the ranks' vocabulary slices. */
static int64_t us__loss_rows(const us_model_config *mc, const us_train_config *tc, int64_t Nf) {
    int64_t a = us__act_bytes(tc), tp = tc->tp > 1 ? tc->tp : 1;
    int64_t V = mc->vocab / tp, rows, n, least = tp * tc->batch;
    if (tc->loss_chunk < 0 || tc->pp > 1 || tc->zero >= 2) return Nf;
    if (tc->loss_chunk > 0)
        rows = tc->loss_chunk;
    else {
        if ((size_t)(Nf * V * a) <= US_LOSS_CHUNK_BYTES) return Nf;
        n = (int64_t)(((size_t)(Nf * V * a) + US_LOSS_CHUNK_BYTES - 1) / US_LOSS_CHUNK_BYTES);
        rows = ((Nf + n - 1) / n + 63) / 64 * 64;
    }
    if (rows < least) rows = least;
    return rows < Nf ? rows : Nf;
}

/* The logits buffer: the fused head's chunk of logits [rows, V/tp], and at least what
   us__emb_rows_finish packs into it when the embedding's gradient goes by rows. */
static size_t us__logits_bytes(const us_model_config *mc, const us_train_config *tc, int64_t Nf) {
    int64_t a = us__act_bytes(tc), tp = tc->tp > 1 ? tc->tp : 1;
    int64_t n = (int64_t)(tc->dp > 1 ? tc->dp : 1) * (tc->cp > 1 ? tc->cp : 1);
    size_t logits = (size_t)(us__loss_rows(mc, tc, Nf) * (mc->vocab / tp) * a);
    size_t rows = us__emb_sparse(mc, tc) ? (size_t)(Nf * (n * (mc->dim * 4 + 4) + 4)) : 0;
    return logits > rows ? logits : rows;
}

/* What the chapters below add to the arena: each sizes its own scratch. */
static void us__sp_rows(const us_model *m, int64_t N, int64_t *Np, int64_t *Ns); /* // >>tp */
static void us__tp_scratch(const us_model *m, int64_t Nf, int head, size_t *sz); /* // >>tp */
static void us__cp_scratch(const us_model *m, int64_t N, size_t *sz);            /* // >>cp */
static void us__moe_take(const us_model *m, us__arena *ar, us_layer_acts *L, int cheap,
                         int gemm); /* a MoE layer's activations (// >>moe) */
static void us__moe_take_w(const us_model *m, us__arena *ar,
                           us_layer_acts *L); /* its output gradients kept for W */
typedef struct us__moe_grads us__moe_grads;
static size_t us__moe_scratch(const us_model *m, us__moe_grads *g);       /* its backward's */
static size_t us__fp8_arena(us_model *m, int64_t Nf, int set, int count); /* // >>fp8-linear */

/* Which named scratch a pipeline slot owns: what lives from a micro-batch chunk's forward to its
   backward (or travels), and on the rank of the head the head's inputs and the logits, which
   hold the loss gradient from forward to backward. The rest is scratch of one action, shared by
   the slots. */
static int us__scratch_per_slot(int i) {
    return i == US__A_XOUT || i == US__A_DRES || i == US__A_RSTDF || i == US__A_LOSSES ||
           i == US__A_ARGMAX || i == US__A_TOK || i == US__A_TGT || i == US__A_SCAL ||
           i == US__A_XF || i == US__A_LOGITS || i == US__A_VP;
}

/* Whether place j of a slot holds a MoE layer (want 1) or a dense one (want 0) in some chunk of
   this rank: a slot serves every chunk, whose j-th layers may differ (// >>pp). */
static int us__slot_has(const us_model *m, int j, int want) {
    int c, v = m->pp_v > 0 ? m->pp_v : 1;
    for (c = 0; c < v; c++) {
        int l = m->chunk_lo[c] + j;
        if (l < m->chunk_hi[c] && (m->moe_idx && m->moe_idx[l] >= 0) == want) return 1;
    }
    return 0;
}

/* One pipeline chunk's layers (all layers without pipeline parallelism), into m->acts when
   writing. Nf rows for tensors every rank holds whole (padded to a multiple of tp under sequence
   parallelism); Ns rows for the residual stream and the norms, which SP splits over tp. What the
   recompute mode does not keep lives in one layer-sized scratch every layer shares: the forward
   overwrites it and the backward refills it (// >>layer). */
static void us__layout_layers(us_model *m, us__arena *ar, int write) {
    const us_model_config *c = &m->cfg;
    int cp = m->tc.cp > 1 ? m->tc.cp : 1;
    int64_t N = (int64_t)m->tc.batch * (m->tc.seq / cp), Nf, Ns;
    int64_t C = c->dim, HS = C / c->n_heads, F = m->ffn_l;
    int64_t QKV = (int64_t)(m->nh_l + 2 * m->nkv_l) * HS, AO = (int64_t)m->nh_l * HS;
    size_t a = us_dtype_size(m->dt);
    int mode = m->tc.recompute, l, nl = m->pp_lc ? m->pp_lc : c->n_layers, any_dense = 0;
    int keep_gemm = mode != US_RECOMPUTE_FULL, keep_cheap = mode == US_RECOMPUTE_NONE;
    us_layer_acts shared;
    us__sp_rows(m, N, &Nf, &Ns);
    for (l = 0; l < c->n_layers; l++) any_dense |= !m->moe_idx || m->moe_idx[l] < 0;
    /* the shared layer scratch (used by the recompute modes); a MoE layer's in us__moe_take */
    memset(&shared, 0, sizeof shared);
    if (!keep_cheap) {
        shared.ln1 = us__take(ar, Ns * C * a); /* [Ns,C] */
        shared.rstd1 = (float *)us__take(ar, Ns * 4);
        shared.att = us__take(ar, Nf * AO * a); /* [Nf,NH·HS] */
        shared.lse = (float *)us__take(ar, N * m->nh_l * 4);
        shared.ln2 = us__take(ar, Ns * C * a);
        shared.rstd2 = (float *)us__take(ar, Ns * 4);
        if (any_dense) shared.h = us__take(ar, Nf * F * a);
    }
    if (!keep_gemm) {
        shared.qkv = us__take(ar, Nf * QKV * a);
        shared.xmid = us__take(ar, Ns * C * a);
        if (any_dense) shared.gu = us__take(ar, Nf * 2 * F * a);
    }
    if (m->n_moe) us__moe_take(m, ar, &shared, !keep_cheap, !keep_gemm);
    for (l = 0; l < nl; l++) { /* one chunk's layers per slot (// >>pp) */
        us_layer_acts L = shared;
        int moe = us__slot_has(m, l, 1), dense = us__slot_has(m, l, 0);
        L.x = us__take(ar, Ns * C * a);
        if (keep_gemm) {
            L.qkv = us__take(ar, Nf * QKV * a);
            L.xmid = us__take(ar, Ns * C * a);
            if (dense) L.gu = us__take(ar, Nf * 2 * F * a);
        }
        if (keep_cheap) {
            L.ln1 = us__take(ar, Ns * C * a);
            L.rstd1 = (float *)us__take(ar, Ns * 4);
            L.att = us__take(ar, Nf * AO * a);
            L.lse = (float *)us__take(ar, N * m->nh_l * 4);
            L.ln2 = us__take(ar, Ns * C * a);
            L.rstd2 = (float *)us__take(ar, Ns * 4);
            if (dense) L.h = us__take(ar, Nf * F * a);
        }
        if (moe) us__moe_take(m, ar, &L, keep_cheap, keep_gemm);
        if (m->pp_wsplit) { /* B/W apart: the weight GEMMs' other operand, from B until W */
            L.g_down = us__take(ar, Nf * C * a);
            L.g_gu = us__take(ar, Nf * 2 * F * a);
            L.g_o = us__take(ar, Nf * C * a);
            L.g_qkv = us__take(ar, Nf * QKV * a);
            if (moe) us__moe_take_w(m, ar, &L);
            if (m->tc.zero >= 2) {
                L.g_ln1 = (float *)us__take(ar, C * 4);
                L.g_ln2 = (float *)us__take(ar, C * 4);
            }
        }
        if (write) m->acts[l] = L;
    }
}

/* The named scratch's sizes: the head, the loss and the backward's, then each chapter's. */
static void us__scratch_sizes(us_model *m, size_t *sz, int write, int part) {
    int cp = m->tc.cp > 1 ? m->tc.cp : 1, head = m->pp_last; /* XF, LOGITS: the head's rank only */
    int64_t N = (int64_t)m->tc.batch * (m->tc.seq / cp), Nf, Ns;
    int64_t C = m->cfg.dim, HS = C / m->cfg.n_heads, F = m->ffn_l;
    int64_t QKV = (int64_t)(m->nh_l + 2 * m->nkv_l) * HS, AO = (int64_t)m->nh_l * HS;
    size_t a = us_dtype_size(m->dt);
    us__sp_rows(m, N, &Nf, &Ns);
    sz[US__A_XOUT] = Ns * C * a;
    sz[US__A_XF] = head ? Nf * C * a : 0;
    sz[US__A_RSTDF] = Ns * 4;
    sz[US__A_LOGITS] = head ? us__logits_bytes(&m->cfg, &m->tc, Nf) : 0;
    sz[US__A_LOSSES] = Nf * 4;
    sz[US__A_ARGMAX] = Nf * 4;
    sz[US__A_TOK] = Nf * 4;
    sz[US__A_TGT] = Nf * 4;
    sz[US__A_DRES] = Nf * C * a;
    sz[US__A_DLN] = Nf * C * a;
    sz[US__A_DATT] = Nf * AO * a;
    sz[US__A_DQKV] = Nf * QKV * a;
    sz[US__A_DH] = Nf * F * a;
    sz[US__A_SCAL] = 64; /* scalars all-reduced over the ranks: valid targets, loss, norm² */
    sz[US__A_MOE] = us__moe_scratch(m, NULL); /* the MoE backward's gradients (// >>moe) */
    /* the linear GEMMs' quantised operands (// >>fp8-linear) */
    sz[US__A_FP8] = us__fp8_arena(m, Nf, write, write && part == 1);
    us__tp_scratch(m, Nf, head, sz);
    us__cp_scratch(m, N, sz);
}

/* Lays out one pipeline slot (part 0: a chunk's layers and the slot's scratch) or the scratch
   the slots share (part 1); without pipeline parallelism the arena is one of each. With base
   NULL it only measures. The estimator states the same sizes as formulas; tests/test_model.c
   checks that the two agree. */
static size_t us__layout_arena(us_model *m, char *base, int part) {
    size_t sz[US__A_COUNT];
    us__arena ar;
    int i;
    ar.base = base;
    ar.used = 0;
    if (part == 0) us__layout_layers(m, &ar, base != NULL);
    us__scratch_sizes(m, sz, base != NULL, part);
    for (i = 0; i < US__A_COUNT; i++) {
        void *p;
        if (us__scratch_per_slot(i) != (part == 0)) continue;
        p = us__take(&ar, sz[i]);
        if (base) m->a[i] = p;
    }
    return ar.used;
}

/* Value f of a tensor's normal stream seeded s: std·N(0,1) from the stream's draws 2f+1 and 2f+2.
   splitmix64 moves its state by a constant per draw, so any position is reached directly, and
   the threads can each fill a chunk with exactly the values one thread drawing in order would.
   Tensor-parallel ranks draw the whole tensor
   and keep their rows (split 1) or columns (split 2) of the [rows·tp or rows, cols·tp or cols]
   tensor, ldo being their slice's row length. */
static void us__init_fill(float *dst, int64_t fn, int ones, float std, uint64_t s, int split,
                          int64_t tp, int64_t t, int64_t rows, int64_t cols, int nt) {
    const int64_t chunk = 1 << 16;
    int64_t nc = (fn + chunk - 1) / chunk, c;
    int64_t fcols = split == 2 ? cols * tp : cols;
    (void)nt;
#ifdef _OPENMP
    /* nt: the ops' thread count (us__threads), as every CPU op uses; one thread opens no team, so a
       process forked after OpenMP ran (whose child has no pool threads) can still build a model */
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && nc > 1)
#endif
    for (c = 0; c < nc; c++) {
        us_rng r;
        int64_t f, f1 = (c + 1) * chunk < fn ? (c + 1) * chunk : fn;
        r.s = s + (uint64_t)(2 * c * chunk) * 0x9E3779B97F4A7C15ull;
        for (f = c * chunk; f < f1; f++) {
            float v = ones ? 1.0f : std * us_rng_normal(&r);
            int64_t fr, fc;
            if (!split) {
                dst[f] = v;
                continue;
            }
            fr = f / fcols;
            fc = f % fcols;
            if (split == 1 && fr / rows == t) dst[(fr - t * rows) * cols + fc] = v;
            if (split == 2 && fc / cols == t) dst[fr * cols + (fc - t * cols)] = v;
        }
    }
}

static void us__tp_slice(const us_model *m, const us_param *p, int64_t *parts,
                         int64_t *part); /* // >>tp */

static void us__init_weights(us_model *m) {
    /* each tensor draws from its own stream seeded by (seed, index): the values do not depend
       on the order tensors are visited or on how the buffers are sharded. A unit is built on
       the host, then this rank stores what it keeps of it. */
    int i, u, Z = m->tc.zero, L = m->cfg.n_layers, LG = m->n_layers_global;
    float proj_std = m->cfg.init_std / sqrtf(2.0f * (float)LG);
    int nt = us__threads(&m->ops); /* a GPU backend's ops say 0: every host thread */
    size_t a = us_dtype_size(m->dt);
    float *h = (float *)US_MALLOC((size_t)(m->n_flat > 0 ? m->n_flat : 1) * 4);
    uint16_t *hb = m->dt != US_F32 ? (uint16_t *)US_MALLOC((size_t)m->n_flat * 2) : NULL;
    us_ops *o = &m->ops;
    (void)a;
    for (u = 0; u < m->n_units; u++) {
        const us__unit *U = &m->units[u];
        float *hu = h + U->off;
        int64_t j, own = U->off + (Z ? (int64_t)us__unit_rank(m, U) * U->piece
                                     : 0); /* flat index of this rank's piece */
        memset(hu, 0, (size_t)U->n * 4);
        for (i = U->p0; i < U->p1; i++) {
            const us_param *p = &m->params[i];
            int l, k, role = us__tensor_role(m, i, &l, &k);
            /* the tensor's stream (a pipeline stage holds a slice of the layers): 1 + 9·layer + k
               in the whole model's dense numbering; a MoE layer's tensors past the norms from
               their own range */
            /* (a routed expert's k counts the experts by their global number, // >>ep) */
            int kg =
                p->expert ? k + 3 * m->ep_rank * (m->cfg.moe_experts / us__ep_size(&m->tc)) : k;
            uint64_t gi =
                l < 0
                    ? (i == 0 ? 0
                              : (uint64_t)(i - US__P_NORM(L)) + 1 + (uint64_t)LG * US__P_PER_LAYER)
                : k >= US__P_GATE && us__is_moe(&m->cfg, m->layer_g[l])
                    ? ((uint64_t)1 << 40) + ((uint64_t)m->layer_g[l] << 20) + (uint64_t)kg
                    : 1 + (uint64_t)m->layer_g[l] * US__P_PER_LAYER + (uint64_t)k;
            float std = role == 2 ? proj_std : m->cfg.init_std;
            us_rng r;
            us_rng_seed(&r, m->tc.seed * 0x100000001B3ull + gi * 0x9E3779B97F4A7C15ull);
            int64_t parts, part;
            us__tp_slice(m, p, &parts, &part);
            if (!p->tp_split)
                us__init_fill(h + p->offset, p->numel, p->ndim == 1, std, r.s, 0, 1, 0, 0, 0, nt);
            else /* draw the whole tensor, keep this rank's rows (split 1, 3) or columns (2) */
                us__init_fill(h + p->offset, p->numel * parts, 0, std, r.s,
                              p->tp_split == 2 ? 2 : 1, parts, part, p->shape[0], p->shape[1], nt);
        }
        if (hb)
            for (j = 0; j < U->n; j++) hb[U->off + j] = us__f32_to_h16(hu[j], m->dt);
        /* weights the forward reads: all of them, or (ZeRO-3) this rank's piece */
        if (Z < 3)
            o->copy(o, us__at(m->w, m->dt, U->off), hb ? (void *)(hb + U->off) : (void *)hu,
                    (size_t)U->n * (hb ? 2 : 4), US_COPY_H2D);
        else
            o->copy(o, us__at(m->w, m->dt, U->shard_off),
                    hb ? (void *)(hb + own) : (void *)(h + own), (size_t)U->piece * (hb ? 2 : 4),
                    US_COPY_H2D);
        /* the separate fp32 master (bf16 / fp16 policy): the whole unit, or this rank's piece */
        if (hb) o->copy(o, m->master + U->shard_off, h + own, (size_t)U->piece * 4, US_COPY_H2D);
    }
    US_FREE(h);
    US_FREE(hb);
}

/* weight k of layer l (dtype dt) and its fp32 gradient. Under ZeRO-3 the weight lives in the
   slot its unit was gathered into (// >>zero); under ZeRO-2/3 the gradient in its unit's slot. */
static void *us__weight(us_model *m, int idx) {
    if (m->tc.zero == 3) {
        const us__unit *U = &m->units[m->unit_of[idx]];
        US_ASSERT(U->wslot >= 0);
        return us__at(m->wslot[U->wslot], m->dt, m->params[idx].offset - U->off);
    }
    return us__at(m->w, m->dt, m->params[idx].offset);
}

static float *us__grad_slot(us_model *m, int u);

static float *us__grad(us_model *m, int idx) {
    if (m->tc.zero >= 2) {
        int u = m->unit_of[idx];
        return us__grad_slot(m, u) + (m->params[idx].offset - m->units[u].off);
    }
    return m->grad + m->params[idx].offset;
}

/* ------------------------------------------------------------------------------------ */
// >>dp  data parallelism: gradient buckets reduced while the backward runs
/* ------------------------------------------------------------------------------------ */
/* Playbook "Data parallelism": every rank holds the whole model, runs its share of the batch,
   and the gradients are summed over the dp group before the optimizer step. The three
   refinements, in the book's order:
   1. overlap — a unit's (bucket's) reduction starts the moment the backward produces its last
      gradient (us__grads_ready) and is waited for only before the optimizer step, so it runs
      while the earlier layers' backward computes;
   2. bucketing — one collective per ~25 MB of gradients (us__plan_units), not one per tensor
      (latency-bound) nor one for the whole model (nothing to overlap with);
   3. no_sync — under gradient accumulation only the last micro-batch's backward reduces.
   Optionally the reductions run in bf16 (grad_reduce_dtype, us__unit_launch_bf16): half the
   bytes, the sums rounded; the local accumulation stays fp32.
   Each rank scales its loss gradient by 1 / (valid targets of the global batch), so the SUM
   over ranks is the global-batch mean: the number one rank would compute for the whole batch
   (the book's average, without assuming every rank has the same number of valid targets). */

/* Checks dp and the gradient buckets (us_config_validate). */
static us_result us__dp_checks(const us_train_config *tc, char *err, size_t errlen) {
    if (tc->dp < 1) US__BAD("dp=%d must be at least 1", tc->dp);
    if (!(tc->bucket_mb > 0) || !isfinite(tc->bucket_mb))
        US__BAD("bucket size %g MB must be a positive number", tc->bucket_mb);
    if (tc->dense_emb_grad != 0 && tc->dense_emb_grad != 1)
        US__BAD("dense_emb_grad=%d must be 0 or 1", tc->dense_emb_grad);
    if (tc->grad_reduce_dtype != US_F32 && tc->grad_reduce_dtype != US_BF16)
        US__BAD("grad_reduce_dtype=%d must be US_F32 (0) or US_BF16 (1)",
                (int)tc->grad_reduce_dtype);
    return US_OK;
}

/* Whether the embedding's gradient is reduced by its touched rows (// >>dp, us__emb_rows_*): data
   parallelism without sharded gradients, one pipeline stage, and the scratch fits — the logits
   buffer [Nf, V/tp] must hold the packed rows [≤ dp·cp·Nf, C] fp32 with their indices, and the
   residual gradient [Nf, C] every rank's count and token rows. Decided from the configs alone, so
   the memory estimate cuts the same units. */
static int us__emb_sparse(const us_model_config *mc, const us_train_config *tc) {
    int64_t n = (int64_t)(tc->dp > 1 ? tc->dp : 1) * (tc->cp > 1 ? tc->cp : 1), C = mc->dim;
    int64_t a = us__act_bytes(tc), V = mc->vocab / (tc->tp > 1 ? tc->tp : 1);
    if (tc->dense_emb_grad || n <= 1 || tc->zero >= 2 || tc->pp > 1) return 0;
    return n * (C * 4 + 4) + 4 <= V * a && (n + 1) * 8 <= C * a;
}

/* ZeRO-2 under pipeline parallelism reduces a unit's gradient as the action writing it ends, so a
   unit must not straddle two actions' parts of a micro-batch's gradient: a chunk's layers (one
   backward each, interleaved and V-shaped schedules), the final norm and head (the last stage's
   backward, before the layers' W under zero bubble) and the embedding (the first stage's) are
   cut apart. Within a layer, W completes every tensor (the norms' gradients wait for it,
   us__w_norm). The other choice, a slot that lives until a unit's last contribution of the
   step, would hold, across a step whose actions interleave micro-batches, a slot per unit:
   the whole gradient ZeRO-2 is there to shard. Whether tensor i starts such a part: */
static int us__pp_unit_border(const us_model *m, int i) {
    int c;
    if (i == 1 || i == US__P_NORM(m->cfg.n_layers)) return 1;
    for (c = 1; c < m->pp_v; c++)
        if (i == US__TENSOR(m->chunk_lo[c], 0)) return 1;
    return 0;
}

/* Cuts the tensors into units and assigns every tensor its flat offset (the offsets of
   us__build_params are replaced). Without ZeRO-3 the units are gradient buckets of about
   bucket_mb, filled in backward order as PyTorch DDP does, so a bucket's last gradient is
   produced early in the backward; ZeRO-3 uses one unit per layer (+ the embedding, + the final
   norm with the head), what it gathers before the layer runs. Under ZeRO every unit is padded
   to a multiple of dp·16 elements so it splits into dp equal pieces: the user never needs
   divisibility. Under expert parallelism routed experts and the rest never share a unit: the
   experts' units are reduced and sharded over their dp·cp/ep replicas (// >>ep), so ZeRO-3
   gives a MoE layer two units. units may be NULL (count only). Returns the number of units. */
static int us__plan_units(us_model *m, us__unit *units) {
    const us_train_config *tc = &m->tc;
    int np = m->n_params_t, L = m->cfg.n_layers, ns = 0, i, u, ep = us__ep_size(tc),
        dpcp = tc->dp * (tc->cp > 0 ? tc->cp : 1);
    int64_t bucket = (int64_t)((double)tc->bucket_mb * 1048576.0 / 4.0), acc = 0, off = 0,
            shard = 0;
    /* ZeRO-2 under pp: a unit is reduced per action that writes it (its slot lives no longer) */
    int zact = tc->zero >= 2 && tc->pp > 1;
    int *start = (int *)US_MALLOC(sizeof(int) * (size_t)(np + 1)); /* first tensor of each unit */
    if (tc->zero == 3) { /* [embedding] [layer 0] ... [layer L-1] [final norm (+ lm_head)] */
        start[ns++] = 0;
        for (i = 0; i < L; i++) {
            start[ns++] = US__TENSOR(i, 0);
            /* under ep a MoE layer's routed experts are a unit of their own (// >>ep) */
            if (ep > 1 && us__is_moe(&m->cfg, m->layer_g[i]))
                start[ns++] = US__TENSOR(i, US__P_EXPERTS) + 3 * m->cfg.moe_shared;
        }
        start[ns++] = US__P_NORM(L);
    } else { /* buckets filled from the last tensor backwards, closed at bucket_mb */
        if (bucket < 1) bucket = 1;
        for (i = np - 1; i > 0; i--) {
            int l, k, fused = us__tensor_role(m, i, &l, &k) == 1;
            /* under expert parallelism routed experts and the rest never share a unit: their
               gradients are reduced over different groups (// >>ep) */
            int border = ep > 1 && m->params[i].expert != m->params[i - 1].expert;
            border |= zact && us__pp_unit_border(m, i);
            acc += m->params[i].numel;
            /* q|k|v and gate|up are one GEMM each, writing one gradient block: never split them */
            if ((acc >= bucket || border) && !fused) {
                start[ns++] = i;
                acc = 0;
            }
        }
        /* the embedding alone when its gradient is reduced early and by rows (us__emb_sparse),
           or when tied under pp, where its copies' pieces must cover the same elements on two
           stages of different layers (us__pp_tied_sum) */
        if (np > 1 && (ns == 0 || start[ns - 1] != 1) &&
            (us__emb_sparse(&m->cfg, tc) || (tc->pp > 1 && m->cfg.tie_embeddings)))
            start[ns++] = 1;
        start[ns++] = 0;
        for (i = 0; i < ns / 2; i++) {
            int t = start[i];
            start[i] = start[ns - 1 - i];
            start[ns - 1 - i] = t;
        }
    }
    start[ns] = np;
    for (u = 0; u < ns; u++) {
        /* ZeRO's owners: dp×cp ranks, or for routed experts under ep their dp·cp/ep replicas */
        int expert = ep > 1 && m->params[start[u]].expert,
            own = tc->zero ? (expert ? dpcp / ep : dpcp) : 1;
        int64_t first = off, n, quantum = (int64_t)own * US__SHARD_PAD;
        for (i = start[u]; i < start[u + 1]; i++) {
            m->params[i].offset = off;
            off += m->params[i].numel;
        }
        n = off - first;
        if (tc->zero) n = (n + quantum - 1) / quantum * quantum;
        off = first + n;
        if (units) {
            us__unit *U = &units[u];
            memset(U, 0, sizeof *U);
            U->p0 = start[u];
            U->p1 = start[u + 1];
            U->off = first;
            U->n = n;
            U->piece = tc->zero ? n / own : n;
            U->shard_off = tc->zero ? shard : first;
            U->gslot = U->wslot = -1;
            U->expert = expert;
        }
        shard += tc->zero ? n / own : n;
    }
    US_FREE(start);
    return ns;
}

static int us__dp_needed(const us_model *m) { return m->mesh.dpcp_g.size > 1 || m->tc.zero; }

/* Data parallelism's set-up: the flat buffers cut into units (us__plan_units) and each tensor's
   unit; the host tables of the embedding's rows when its gradient is reduced by rows
   (us__emb_sparse); under grad_reduce_dtype bf16, the buffer the reductions run in. */
static us_result us__dp_init(us_model *m) {
    int u, i;
    m->n_units = us__plan_units(m, NULL);
    m->units = (us__unit *)US_MALLOC(sizeof(us__unit) * (size_t)m->n_units);
    if (!m->units) {
        us__model_set_error(m, "out of host memory for the model tables");
        return US_ERR_OOM;
    }
    us__plan_units(m, m->units);
    for (u = 0; u < m->n_units; u++)
        for (i = m->units[u].p0; i < m->units[u].p1; i++) m->unit_of[i] = u;
    if (m->tc.grad_reduce_dtype == US_BF16 && m->n_units > 0 && us__dp_needed(m)) {
        const us__unit *Z = &m->units[m->n_units - 1]; /* units lie in flat order */
        m->grad_bf_bytes = (size_t)(Z->off + Z->n) * 2;
        m->grad_bf = m->ops.alloc(&m->ops, m->grad_bf_bytes);
        if (!m->grad_bf) {
            us__model_set_error(m, "out of memory for the bf16 gradient reductions (%zu bytes)",
                                m->grad_bf_bytes);
            return US_ERR_OOM;
        }
    }
    if ((m->emb_sparse = us__emb_sparse(&m->cfg, &m->tc) && m->c_first)) {
        int64_t Nr, Ns, k;
        us__sp_rows(m, (int64_t)m->tc.batch * (m->tc.seq / m->mesh.cp), &Nr, &Ns); /* arena rows */
        m->emb_map = (int32_t *)US_MALLOC((size_t)m->vocab_l * 4);
        m->emb_nf = Nr;
        m->emb_ids = (int32_t *)US_MALLOC((size_t)(m->mesh.dpcp_g.size + 1) * (size_t)(Nr + 1) * 4);
        if (!m->emb_map || !m->emb_ids) {
            us__model_set_error(m, "out of host memory for the model tables");
            return US_ERR_OOM;
        }
        for (k = 0; k < m->vocab_l; k++) m->emb_map[k] = -1;
    }
    return US_OK;
}

/* Sums host doubles over the dp group (through backend memory: NCCL reads device memory). */
static us_result us__group_sum(us_model *m, us_group *g, double *v, int n) {
    us_ops *o = &m->ops;
    us_result r;
    if (g->size <= 1) return US_OK;
    o->copy(o, m->a[US__A_SCAL], v, (size_t)n * 8, US_COPY_H2D);
    r = m->comm->all_reduce(m->comm, g, m->a[US__A_SCAL], n, US_F64, US_REDUCE_SUM, NULL);
    if (r != US_OK) return us__comm_fail(m, r, "all-reduce of the step's scalars");
    o->copy(o, v, m->a[US__A_SCAL], (size_t)n * 8, US_COPY_D2H);
    return US_OK;
}

static us_result us__dp_sum(us_model *m, double *v, int n) {
    return us__group_sum(m, &m->mesh.dpcp_g, v, n);
}

US_API us_result us_dp_sum(us_model *m, double *v, int n) { return us__dp_sum(m, v, n); }

/* Starts the reduction of a unit whose gradients are complete: an all-reduce without ZeRO, a
   reduce-scatter with it (each rank keeps the sum of its own piece). Asynchronous. */
/* ZeRO-2/3: a unit's gradient slot, reduced (or alone on one rank), adds this rank's piece into
   the gradient shard and is given back. No-op otherwise. */
static void us__slot_to_shard(us_model *m, int u) {
    us__unit *U = &m->units[u];
    if (m->tc.zero < 2 || U->gslot < 0) return;
    m->ops.axpy(&m->ops, m->grad + U->shard_off,
                m->gslot[U->gslot] + (int64_t)us__unit_rank(m, U) * U->piece, 1.0f, U->piece);
    m->gslot_unit[U->gslot] = -1;
    U->gslot = -1;
}

/* The unit's fp32 gradient this rank reduces: in the flat gradient, or ZeRO-2/3's slot. */
static float *us__unit_grad(us_model *m, const us__unit *U) {
    return m->tc.zero >= 2 ? m->gslot[U->gslot] : m->grad + U->off;
}

/* Playbook "bf16 gradient reduction": the unit's gradient rounded to bf16 in grad_bf (same
   offsets), reduced there, every addition rounded to bf16 (NCCL's and the threads backend's
   bf16 sum); us__unit_finish widens the result back. Half the bytes of the fp32 reduction. */
static us_result us__unit_launch_bf16(us_model *m, us__unit *U, us_group *g, int R) {
    us_comm *c = m->comm;
    uint16_t *b = (uint16_t *)m->grad_bf + U->off;
    m->ops.cast(&m->ops, b, US_BF16, us__unit_grad(m, U), US_F32, U->n);
    if (m->tc.zero == 0) return c->all_reduce(c, g, b, U->n, US_BF16, US_REDUCE_SUM, &U->work);
    return c->reduce_scatter(c, g, b + (int64_t)R * U->piece, b, U->piece, US_BF16, US_REDUCE_SUM,
                             &U->work);
}

/* After a bf16 reduction: the reduced part, widened into the fp32 gradient (or slot). */
static void us__unit_widen(us_model *m, const us__unit *U) {
    int64_t at = m->tc.zero ? (int64_t)us__unit_rank(m, U) * U->piece : 0;
    m->ops.cast(&m->ops, us__unit_grad(m, U) + at, US_F32, (uint16_t *)m->grad_bf + U->off + at,
                US_BF16, m->tc.zero ? U->piece : U->n);
}

static us_result us__unit_launch(us_model *m, int u) {
    us__unit *U = &m->units[u];
    us_comm *c = m->comm;
    us_group *g = us__unit_group(m, U); /* experts: over their replicas only (// >>ep) */
    int R = us__unit_rank(m, U);
    us_result r;
    double t0 = us_trace_now_us();
    char nm[48];
    if (g->size <=
        1) { /* one dp×cp rank, or ep = dp·cp (each expert on one rank): nothing to reduce, */
        us__slot_to_shard(m, u); /* but ZeRO-2/3's slot still goes into the shard */
        return US_OK;
    }
    /* ZeRO-2/3: a unit nothing wrote in this backward (experts that got no tokens) still takes
       part in the collective, with a fresh slot of zeros; its previous micro-batch's reduction,
       if still in flight, is finished first (us__grad_slot) */
    if (m->tc.zero >= 2 && (U->gslot < 0 || U->work)) us__grad_slot(m, u);
    if (m->grad_bf)
        r = us__unit_launch_bf16(m, U, g, R);
    else if (m->tc.zero == 0)
        r = c->all_reduce(c, g, m->grad + U->off, U->n, US_F32, US_REDUCE_SUM, &U->work);
    else if (m->tc.zero == 1)
        r = c->reduce_scatter(c, g, m->grad + U->off + R * U->piece, m->grad + U->off, U->piece,
                              US_F32, US_REDUCE_SUM, &U->work);
    else { /* ZeRO-2/3: in place in the unit's slot; us__unit_finish adds the piece to the shard */
        float *slot = m->gslot[U->gslot];
        r = c->reduce_scatter(c, g, slot + R * U->piece, slot, U->piece, US_F32, US_REDUCE_SUM,
                              &U->work);
    }
    snprintf(nm, sizeof nm, "launch unit %d", u);
    us__trace_host(m, "comm", nm, t0);
    return us__comm_fail(m, r, m->tc.zero ? "gradient reduce-scatter" : "gradient all-reduce");
}

/* Waits for a unit's reduction; ZeRO-2/3 then accumulate the reduced piece into the gradient
   shard and give the slot back. */
static us_result us__unit_finish(us_model *m, int u) {
    us__unit *U = &m->units[u];
    us_result r = US_OK;
    double t0 = us_trace_now_us();
    char nm[48];
    if (!U->work) return US_OK;
    r = m->comm->wait(m->comm, U->work);
    U->work = NULL;
    snprintf(nm, sizeof nm, "wait unit %d", u);
    us__trace_host(m, "wait", nm, t0);
    if (r != US_OK) return us__comm_fail(m, r, "gradient reduction");
    if (m->grad_bf) us__unit_widen(m, U);
    us__slot_to_shard(m, u);
    return US_OK;
}

/* The backward hook: tensors [i0, i1) have their final gradient for this micro-batch. */
static us_result us__grads_ready(us_model *m, int i0, int i1) {
    int i;
    if (!us__dp_needed(m)) return US_OK;
    for (i = i0; i < i1; i++) {
        int u = m->unit_of[i];
        us__unit *U = &m->units[u];
        if (--U->pending == 0 && (m->grad_sync || m->tc.zero >= 2)) {
            us_result r = us__unit_launch(m, u);
            if (r != US_OK) return r;
            m->synced = 1;
        }
    }
    return US_OK;
}

static void us__grads_begin(us_model *m) { /* a backward starts: every tensor is pending */
    int u;
    for (u = 0; u < m->n_units; u++) m->units[u].pending = m->units[u].p1 - m->units[u].p0;
}

/* Before the optimizer step: every unit reduced and finished (a caller that never set
   grad_sync gets its reductions here, without overlap). */
static us_result us__grads_finish(us_model *m) {
    int u;
    us_result r;
    if (!us__dp_needed(m)) return US_OK;
    if (m->tc.zero < 2 && !m->synced)
        for (u = 0; u < m->n_units; u++)
            if ((r = us__unit_launch(m, u)) != US_OK) return r;
    for (u = 0; u < m->n_units; u++)
        if ((r = us__unit_finish(m, u)) != US_OK) return r;
    m->synced = 0;
    return US_OK;
}

/* The part of tensors [i0, i1)'s reduced gradient (one unit's neighbours) this rank holds for
   the optimizer step, after us__grads_finish: all of it without ZeRO, else its overlap with
   this rank's piece (*n elements; 0: none). Where a weight has copies on several ranks (// >>tp's
   replicated kv heads, // >>pp's tied embedding), the copies' gradients are summed on these. */
static float *us__grad_held(us_model *m, int i0, int i1, int64_t *n) {
    const us__unit *U = &m->units[m->unit_of[i0]];
    int Z = m->tc.zero;
    int64_t lo = U->off + (Z ? (int64_t)m->mesh.dpcp_g.rank * U->piece : 0), hi = lo + U->piece;
    int64_t a = m->params[i0].offset, b = m->params[i1 - 1].offset + m->params[i1 - 1].numel;
    float *gp = Z < 2 ? m->grad + lo : m->grad + U->shard_off; /* flat index lo */
    US_ASSERT(m->unit_of[i1 - 1] == m->unit_of[i0]);
    if (a < lo) a = lo;
    if (b > hi) b = hi;
    *n = b > a ? b - a : 0;
    return gp + (a - lo);
}

/* 4. The embedding's gradient by its touched rows. The embedding's gradient is finished by the
   lookup's backward, the step's last op, so its bucket has nothing left to hide under (at a 128k
   vocabulary, 1 GB of fp32). But the lookup's backward touches only the rows of the tokens seen.
   So, in the micro-batch that reduces:
     - the embedding's bucket (a unit of its own) is reduced early, hidden under the layers: at
       the start of the backward, or after the head when tied (the head's part is in it too), or
       not at all while it holds nothing (untied, one micro-batch);
     - the ranks' tokens are gathered at the start of the backward, and every rank numbers the
       union U of the rows they touch in the same order (first seen, in rank order);
     - the lookup's gradient goes into those rows packed, [|U|, C] fp32, which are all-reduced
       alone (a byte vocabulary's few rows instead of [V, C]), then added into the
       reduced gradient, each row once: every rank adds the same numbers in the same order, and
       the replicas stay equal to the bit.
   The sums are the dense reduction's, in another order. dense_emb_grad = 1 turns it off. */
static us_result us__emb_rows_begin(us_model *m, int64_t R) { /* R token rows of this rank */
    us_ops *o = &m->ops;
    us_group *g = &m->mesh.dpcp_g;
    int64_t n = g->size, i, k, nu = 0,
            W = m->emb_nf + 1; /* a rank's record: its count, then its rows */
    int32_t *all = m->emb_ids, *mine = m->emb_ids + n * W, *map = m->emb_map,
            *dev = (int32_t *)m->a[US__A_DRES], R32 = (int32_t)R;
    us_result r;
    m->emb_on = 0;
    if (!m->emb_sparse || !m->grad_sync || !m->c_first) return US_OK;
    /* every rank's rows (-1: another tp rank's), through the residual gradient's buffer (free
       until the head's backward): [count, rows..., padding] per rank, so ranks whose micro-batches
       differ in size still make one collective of one size */
    o->copy(o, dev + n * W, &R32, 4, US_COPY_H2D);
    o->copy(o, dev + n * W + 1, m->a[US__A_TOK], (size_t)R * 4, US_COPY_D2D);
    r = m->comm->all_gather(m->comm, g, dev, dev + n * W, W, US_I32, NULL);
    if (r != US_OK) return us__comm_fail(m, r, "all-gather of the embedding's rows");
    o->copy(o, all, dev, (size_t)(n * W) * 4, US_COPY_D2H);
    if ((r = us__backend_check(m)) != US_OK) return r;
    for (k = 0; k < n; k++)
        if (all[k * W] != R32) return US_OK; /* unequal micro-batches: reduce the whole gradient */
    memcpy(mine, all + g->rank * W + 1, (size_t)R * 4);
    for (k = 0; k < n;
         k++) /* U, in first-seen order, over the front of `all` (nu stays behind the reading) */
        for (i = 0; i < R; i++) {
            int32_t v = all[k * W + 1 + i];
            if (v >= 0 && map[v] < 0) {
                map[v] = (int32_t)nu;
                all[nu++] = v;
            }
        }
    for (i = 0; i < R; i++)
        mine[i] = mine[i] >= 0 ? map[mine[i]] : -1; /* this rank's rows as places in U */
    for (i = 0; i < nu; i++) map[all[i]] = -1;
    m->emb_nu = nu;
    m->emb_on = 1;
    return US_OK;
}

static us_result
us__emb_rows_early(us_model *m) { /* the embedding's bucket: reduced now, or known empty */
    if (!m->emb_on) return US_OK;
    if (m->emb_dirty) return us__grads_ready(m, 0, 1);
    m->units[m->unit_of[0]].pending = 0; /* zeros on every rank: their sum is here already */
    return US_OK;
}

/* The lookup's backward from dx [R, C] (dtype dt), by rows, into the embedding's reduced
   gradient. */
static us_result us__emb_rows_finish(us_model *m, const void *dx, int64_t R) {
    us_ops *o = &m->ops;
    int64_t C = m->cfg.dim, nu = m->emb_nu, n = m->mesh.dpcp_g.size, W = m->emb_nf + 1;
    float *P =
        (float *)
            m->a[US__A_LOGITS]; /* [nu, C], then U and this rank's places: the logits are spent */
    int32_t *ix = (int32_t *)(P + nu * C), *tk = ix + nu;
    us_result r = US_OK;
    us__trace_mark t0 = us__tstart(m);
    m->emb_on = 0;
    if (nu > 0) {
        o->copy(o, ix, m->emb_ids, (size_t)nu * 4, US_COPY_H2D);
        o->copy(o, tk, m->emb_ids + n * W, (size_t)R * 4, US_COPY_H2D);
        o->zero(o, P, (size_t)(nu * C) * 4);
        o->embedding_bwd(o, P, dx, tk, R, C, m->dt);
        r = m->comm->all_reduce(m->comm, &m->mesh.dpcp_g, P, nu * C, US_F32, US_REDUCE_SUM, NULL);
        if (r != US_OK) return us__comm_fail(m, r, "all-reduce of the embedding's rows");
    }
    if ((r = us__unit_finish(m, m->unit_of[0])) != US_OK) return r; /* the early part, reduced */
    if (nu > 0)
        o->embedding_bwd(o, us__grad(m, 0), P, ix, nu, C,
                         US_F32); /* distinct rows: no two adds meet */
    us__trace(m, "compute", "embedding rows", t0);
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>zero  ZeRO-1/2/3: optimizer state, gradients and weights sharded over dp
/* ------------------------------------------------------------------------------------ */
/* Playbook "ZeRO": each of the dp ranks owns 1/dp of every unit (a "piece") and keeps only
   what the stage shards:
     ZeRO-1  AdamW moments (and the fp32 master under bf16): reduce-scatter the gradients, update
             the own piece, all-gather the weights;
     ZeRO-2  + gradients: each unit's gradient lives in a slot only while it is produced and
             reduce-scattered, then the rank keeps its piece (summed over micro-batches);
     ZeRO-3  + weights: a layer's weights are all-gathered into a slot just before the layer
             runs, forward and again backward, and freed after; the next layer's gather is
             issued first so it overlaps the current layer's compute (prefetch).
   Under expert parallelism a routed expert's units belong to the ranks holding that expert, its
   dp·cp/ep replicas (the expert-data-parallel group, // >>ep): they reduce-scatter, update and
   gather among themselves (us__unit_group), as the rest does over dp×cp.
   Memory per rank (Ψ parameters, dp = N_d; the book's mixed-precision formulas 2Ψ+2Ψ+12Ψ/N_d,
   2Ψ+(2Ψ+12Ψ)/N_d, (2Ψ+2Ψ+12Ψ)/N_d, here with fp32 gradients): see us_memory_estimate. */

/* Checks the ZeRO stage (us_config_validate). */
static us_result us__zero_checks(const us_train_config *tc, char *err, size_t errlen) {
    if (tc->zero < 0 || tc->zero > 3) US__BAD("zero=%d must be 0, 1, 2 or 3", tc->zero);
    return US_OK;
}

/* ZeRO-2/3: the slot holding unit u's full gradient for this backward, taken (and zeroed) at
   the unit's first gradient write. With every slot busy, the oldest reduction is finished. */
static float *us__grad_slot(us_model *m, int u) {
    /* returns the slot, [U->n] f32: the unit's whole gradient, its piece [U->piece] per rank */
    us__unit *U = &m->units[u];
    int s, oldest = -1;
    if (U->gslot >= 0 && !U->work) return m->gslot[U->gslot]; /* being written in this backward */
    if (U->work) us__unit_finish(m, u); /* the previous micro-batch's reduction: done first */
    for (;;) {
        for (s = 0; s < m->n_gslots; s++)
            if (m->gslot_unit[s] < 0) break;
        if (s < m->n_gslots) break;
        for (s = 0; s < m->n_gslots; s++) /* units are reduced in backward order: highest first */
            if (m->units[m->gslot_unit[s]].work &&
                (oldest < 0 || m->gslot_unit[s] > m->gslot_unit[oldest]))
                oldest = s;
        US_ASSERT(oldest >= 0);
        if (us__unit_finish(m, m->gslot_unit[oldest]) != US_OK)
            m->gslot_unit[oldest] = -1; /* error kept in m->err */
        oldest = -1;
    }
    m->gslot_unit[s] = u;
    U->gslot = s;
    m->ops.zero(&m->ops, m->gslot[s], (size_t)U->n * 4);
    return m->gslot[s];
}

/* ZeRO-3's walk over the model: step 0 is the embedding, step 1+l layer l, step L+1 the final
   norm and head. Returns the units step s reads. */
static int us__zero3_units(const us_model *m, int s, int out[2]) {
    int L = m->cfg.n_layers, n = 0;
    if (s == 0)
        out[n++] = m->unit_of[0];
    else if (s <= L) {
        out[n++] = m->unit_of[US__TENSOR(s - 1, 0)];
        if (m->unit_of[m->layer_p[s] - 1] != out[0]) /* a MoE layer's experts under ep */
            out[n++] = m->unit_of[m->layer_p[s] - 1];
    } else {
        out[n++] = m->unit_of[US__P_NORM(L)];
        if (m->cfg.tie_embeddings) out[n++] = m->unit_of[0];
    }
    return n;
}

static us_result us__zero3_gather(us_model *m, int u) { /* asynchronous; no-op if resident */
    /* the slot [U->n] (dtype dt) gathers every rank's piece [U->piece] of unit u */
    us__unit *U = &m->units[u];
    us_result r;
    int s;
    if (U->wslot >= 0) return US_OK;
    for (s = 0; s < m->n_wslots; s++)
        if (m->wslot_unit[s] < 0) break;
    US_ASSERT(s < m->n_wslots);
    m->wslot_unit[s] = u;
    U->wslot = s;
    r = m->comm->all_gather(m->comm, us__unit_group(m, U), m->wslot[s],
                            us__at(m->w, m->dt, U->shard_off), U->piece, m->dt, &U->gather);
    return us__comm_fail(m, r, "ZeRO-3 weight all-gather");
}

static void us__zero3_release(us_model *m, int u) {
    us__unit *U = &m->units[u];
    if (U->wslot < 0) return;
    if (U->gather) {
        m->comm->wait(m->comm, U->gather);
        U->gather = NULL;
    }
    m->wslot_unit[U->wslot] = -1;
    U->wslot = -1;
}

static void us__zero3_release_all(us_model *m) {
    int u;
    if (m->tc.zero == 3)
        for (u = 0; u < m->n_units; u++) us__zero3_release(m, u);
}

/* The step after s in a walk in direction dir over the layers [l_lo, l_hi) that run now (a
   pipeline chunk's, // >>pp; all of them without pp), with the embedding before them on the
   first stage and the head after them on the last unless lay (the layers only); -1 at the end.
   Under pipeline parallelism each stage walks its own chunk's units, once per action (F, B, W):
   a micro-batch's forward, then its backward gather the chunk's weights again, as ZeRO-3 does
   without pp, and the executor gives every gathered unit back as an action ends. Keeping them
   across a stage's micro-batches instead would hold the stage's weights whole, ZeRO-1's memory,
   for the m − 1 gathers per layer and pass it saves. */
static int us__zero3_next(const us_model *m, int s, int dir, int lay) {
    int L = m->cfg.n_layers, l = s - 1;
    if (dir > 0) {
        if (s == 0) return 1 + m->l_lo;
        if (s == L + 1) return -1;
        return l + 1 < m->l_hi ? s + 1 : m->c_last && !lay ? L + 1 : -1;
    }
    if (s == L + 1) return m->l_hi;
    if (s == 0) return -1;
    return l - 1 >= m->l_lo ? s - 1 : m->c_first && !lay ? 0 : -1;
}

/* Enter step s walking in direction dir (+1 forward, -1 backward; us__zero3_next's walk, lay
   the layers only): the step's weights must be here; the previous step's that this one does not
   read are freed; the next step's gather is issued now, so it runs while step s computes. */
static us_result us__zero3_walk(us_model *m, int s, int dir, int lay) {
    int cur[2], prev[2], next[2], nc, np = 0, nn = 0, i, j;
    int sp = us__zero3_next(m, s, -dir, lay), sn = us__zero3_next(m, s, dir, lay);
    us_result r;
    double t0;
    if (m->tc.zero != 3) return US_OK;
    nc = us__zero3_units(m, s, cur);
    if (sp >= 0) np = us__zero3_units(m, sp, prev);
    if (sn >= 0) nn = us__zero3_units(m, sn, next);
    t0 = us_trace_now_us();
    for (i = 0; i < nc; i++) {
        us__unit *U = &m->units[cur[i]];
        if ((r = us__zero3_gather(m, cur[i])) != US_OK) return r;
        if (U->gather) {
            r = m->comm->wait(m->comm, U->gather);
            U->gather = NULL;
            if (r != US_OK) return us__comm_fail(m, r, "ZeRO-3 weight all-gather");
        }
    }
    us__trace_host(m, "wait", "wait weights", t0);
    for (i = 0; i < np; i++) {
        int keep = 0;
        for (j = 0; j < nc; j++) keep |= prev[i] == cur[j];
        if (!keep) us__zero3_release(m, prev[i]);
    }
    for (i = 0; i < nn; i++)
        if ((r = us__zero3_gather(m, next[i])) != US_OK) return r;
    return US_OK;
}

static us_result us__zero3_enter(us_model *m, int s, int dir) {
    return us__zero3_walk(m, s, dir, 0);
}

/* AdamW over the flat range [lo, hi) of this rank's piece of unit U, one call per run of
   neighbouring tensors with the same weight decay (padding is skipped: no tensor covers it). */
static void us__adamw_piece(us_model *m, const us__unit *U, float lr, float gscale) {
    us_ops *o = &m->ops;
    const us_train_config *tc = &m->tc;
    int Z = tc->zero, i, decay = -1;
    int64_t lo = U->off + (Z ? (int64_t)us__unit_rank(m, U) * U->piece : 0), hi = lo + U->piece,
            r0 = 0, r1 = 0;
    float wd = tc->weight_decay > 0 ? tc->weight_decay : 0.0f;
    /* where flat index lo lives in each buffer */
    float *master = m->dt == US_F32 && Z < 3 ? (float *)m->w + lo : m->master + U->shard_off;
    float *grad = Z < 2 ? m->grad + lo : m->grad + U->shard_off;
    float *mm = m->adam_m + U->shard_off, *vv = m->adam_v + U->shard_off;
    void *low = m->dt == US_F32 ? NULL
                : Z < 3         ? us__at(m->w, m->dt, lo)
                                : us__at(m->w, m->dt, U->shard_off);
    for (i = U->p0; i <= U->p1; i++) {
        int64_t a = 0, b = 0;
        if (i < U->p1) {
            a = m->params[i].offset > lo ? m->params[i].offset : lo;
            b = m->params[i].offset + m->params[i].numel < hi
                    ? m->params[i].offset + m->params[i].numel
                    : hi;
        }
        if (i == U->p1 || (a < b && (m->params[i].decay != decay || a != r1))) {
            if (r1 > r0) { /* flush the run [r0, r1) */
                int64_t k = r0 - lo;
                o->adamw(o, master + k, grad + k, mm + k, vv + k,
                         low ? us__at(low, m->dt, k) : NULL, m->dt, r1 - r0, lr, tc->beta1,
                         tc->beta2, tc->adam_eps, decay ? wd : 0.0f, gscale, m->step);
            }
            if (i < U->p1) {
                r0 = a;
                r1 = b;
                decay = m->params[i].decay;
            }
        } else if (a < b)
            r1 = b;
    }
}

/* Sizes of the parallel layout, shared by the model and the estimator. */
typedef struct us__dist_sizes {
    int64_t n_flat, shard_n, slot_n;
    int n_gslots, n_wslots;
} us__dist_sizes;

static void us__dist_sizes_of(const us_model *m, us__dist_sizes *z) {
    int u, Z = m->tc.zero, per = us__ep_size(&m->tc) > 1 && m->cfg.moe_experts ? 2 : 1,
           spare = 2 * per + (m->cfg.tie_embeddings ? 1 : 0);
    memset(z, 0, sizeof *z);
    for (u = 0; u < m->n_units; u++) {
        z->n_flat += m->units[u].n;
        z->shard_n += m->units[u].piece;
        if (m->units[u].n > z->slot_n) z->slot_n = m->units[u].n;
    }
    /* ZeRO-2/3 produce a unit's full gradient in a slot: one being written, one being reduced,
       and (tied) the embedding's, written by the head first and by the embedding last. ZeRO-3's
       weights likewise: the layer in use, the next one prefetched, and (tied) the embedding. A
       MoE layer under ep is two units (its routed experts apart, us__plan_units): twice the
       slots for the layers. */
    z->n_gslots = Z >= 2 ? (m->n_units < spare ? m->n_units : spare) : 0;
    z->n_wslots = Z == 3 ? (m->n_units < spare ? m->n_units : spare) : 0;
    if (Z < 2) z->slot_n = 0;
}

/* ------------------------------------------------------------------------------------ */
// >>tp  tensor parallelism: heads, FFN columns and the vocabulary split over the tp ranks
/* ------------------------------------------------------------------------------------ */
/* Playbook "Tensor parallelism" (Megatron-LM): in each block a column-parallel GEMM (q|k|v,
   gate|up: each rank computes its heads / FFN columns from the replicated input) is followed
   by a row-parallel one (o, down: each rank's partial product of the full output), so one
   all-reduce per block finishes the forward (the book's f̄; its conjugate f is the identity),
   and in the backward one all-reduce of the input gradient (f) is needed where the
   column-parallel GEMM meets the replicated norm. The embedding and the head split the
   vocabulary: a token outside this rank's rows embeds to zero and the all-reduce adds the one
   rank that has it; the loss is computed from this rank's logit columns with the row max and
   the softmax denominator all-reduced (us__tp_xent), so no rank holds the full logits. */

/* Checks tp divides the heads, the FFN and the vocabulary, and divides the kv heads or is a
   multiple of them (us__tp_kv_heads); SP needs tp > 1 (us_config_validate). */
static us_result us__tp_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                               size_t errlen) {
    if (tc->tp_no_overlap != 0 && tc->tp_no_overlap != 1)
        US__BAD("tp_no_overlap=%d must be 0 or 1", tc->tp_no_overlap);
    if (tc->overlap_sms < 0 || tc->overlap_sms > 4096)
        US__BAD("overlap_sms=%d must be a count of SMs (0: none)", tc->overlap_sms);
    if (tc->tp < 1) US__BAD("tp=%d must be at least 1", tc->tp);
    if (tc->sp != 0 && tc->sp != 1) US__BAD("sp=%d must be 0 or 1", tc->sp);
    if (tc->sp && tc->tp < 2)
        US__BAD("sequence parallelism splits the tensor-parallel group's tokens: it needs tp > 1");
    if (mc->n_heads % tc->tp)
        US__BAD("tp=%d must divide heads=%d (each rank computes whole heads)", tc->tp, mc->n_heads);
    if (mc->n_kv_heads >= tc->tp ? mc->n_kv_heads % tc->tp : tc->tp % mc->n_kv_heads)
        US__BAD("tp=%d and kv-heads=%d: tp must divide the kv heads, or be a multiple of them "
                "(each kv head is then held by tp/kv-heads ranks)",
                tc->tp, mc->n_kv_heads);
    if (mc->ffn_dim % tc->tp)
        US__BAD("tp=%d must divide ffn=%lld (the SwiGLU columns are split)", tc->tp,
                (long long)mc->ffn_dim);
    if (mc->vocab % tc->tp)
        US__BAD("tp=%d must divide vocab=%lld (the embedding and the head are split by vocabulary "
                "rows)",
                tc->tp, (long long)mc->vocab);
    return US_OK;
}

/* KV heads on one tp rank: NKV/tp, or 1 when tp exceeds them. Grouped-query attention with fewer
   kv heads than ranks replicates each kv head on tp/NKV ranks (as Megatron-LM and vLLM do): rank
   t holds query heads [t·NH/tp, (t+1)·NH/tp), which all read kv head t·NKV/tp, so each rank
   still computes whole heads and the attention needs no communication. */
static int us__tp_kv_heads(int nkv, int tp) { return nkv >= tp ? nkv / tp : 1; }

/* Tensor parallelism's set-up: this rank's share of the heads, the FFN columns and the
   vocabulary (its rows start at vocab_off). The checks (us_config_validate) made each divide. */
static void us__tp_init(us_model *m) {
    const us_model_config *c = &m->cfg;
    int tp = m->tc.tp > 0 ? m->tc.tp : 1;
    m->nh_l = c->n_heads / tp;
    m->nkv_l = us__tp_kv_heads(c->n_kv_heads, tp);
    m->kv_rep = tp > c->n_kv_heads ? tp / c->n_kv_heads : 1;
    m->ffn_l = c->ffn_dim / tp;
    m->vocab_l = c->vocab / tp;
    m->vocab_off = (int64_t)m->mesh.tp_rank * m->vocab_l;
}

/* Which slice of the whole tensor p this rank holds: the whole is cut into *parts along the split
   dimension, and this rank's is number *part. K and V under kv_rep > 1 are cut by kv head, and
   the kv_rep ranks that share a head hold the same slice. */
static void us__tp_slice(const us_model *m, const us_param *p, int64_t *parts, int64_t *part) {
    int tp = m->tc.tp > 1 ? m->tc.tp : 1, t = m->mesh.tp_rank;
    *parts = p->tp_split == 0 ? 1 : p->tp_split == 3 ? tp / m->kv_rep : tp;
    *part = p->tp_split == 0 ? 0 : p->tp_split == 3 ? t / m->kv_rep : t;
}

/* Whether this tp rank counts tensor p in a sum over the tp group (the gradient norm): every
   rank its slice of a split tensor; rank 0 a replicated one; the first of its kv_rep ranks a kv
   head's K or V. */
static int us__tp_counts(const us_model *m, const us_param *p) {
    if (p->tp_split == 3) return m->mesh.tp_rank % m->kv_rep == 0;
    return p->tp_split || m->mesh.tp_rank == 0;
}

/* The group of the kv_rep ranks that hold one kv head: consecutive tp ranks. */
static us_result us__tp_connect(us_model *m) {
    us_result r;
    if (m->kv_rep <= 1) return US_OK;
    r = m->comm->split(m->comm, &m->mesh.tp_g, m->mesh.tp_rank / m->kv_rep, m->mesh.tp_rank,
                       &m->kv_g);
    return us__comm_fail(m, r, "the group of a kv head's tensor-parallel ranks");
}

static void us__tp_free(us_model *m) {
    if (m->comm && m->comm->group_free && m->kv_g.size) m->comm->group_free(m->comm, &m->kv_g);
    memset(&m->kv_g, 0, sizeof m->kv_g);
}

/* A replicated kv head's weight gradient, summed over its kv_rep ranks. Each of them computed
   dK and dV from its own query heads only (the attention's backward adds a query head's part
   into its kv head), so each holds a partial sum of the whole dWk, dWv. The input gradient
   needs nothing: its all-reduce over tp already adds every rank's dK·Wk. The sum runs once per
   step, after data parallelism's reduction (the two sums commute), on the part of K|V each rank
   holds for the optimizer (its ZeRO piece), so the replicas take the same step and stay equal. */
static us_result us__tp_kv_sum(us_model *m) {
    int l;
    us_result r;
    if (m->kv_rep <= 1) return US_OK;
    for (l = 0; l < m->cfg.n_layers; l++) {
        int64_t n;
        float *g = us__grad_held(m, US__TENSOR(l, US__P_K), US__TENSOR(l, US__P_V) + 1, &n);
        if (!n) continue;
        r = m->comm->all_reduce(m->comm, &m->kv_g, g, n, US_F32, US_REDUCE_SUM, NULL);
        if (r != US_OK) return us__comm_fail(m, r, "the all-reduce of a kv head's gradients");
    }
    return US_OK;
}

static us_result us__tp_sum_w(us_model *m, void *buf, int64_t n, us_dtype dt,
                              us_work **w) { /* over tp, in place */
    us_result r;
    if (m->tc.tp <= 1) return US_OK;
    r = m->comm->all_reduce(m->comm, &m->mesh.tp_g, buf, n, dt, US_REDUCE_SUM, w);
    return us__comm_fail(m, r, "tensor-parallel all-reduce");
}

static us_result us__tp_sum(us_model *m, void *buf, int64_t n, us_dtype dt) {
    return us__tp_sum_w(m, buf, n, dt, NULL);
}

static us_result us__tp_max(us_model *m, void *buf, int64_t n, us_dtype dt) {
    us_result r = m->comm->all_reduce(m->comm, &m->mesh.tp_g, buf, n, dt, US_REDUCE_MAX, NULL);
    return us__comm_fail(m, r, "tensor-parallel all-reduce (max)");
}

/* The start of a row-parallel output: the residual on tp rank 0, zeros elsewhere, so that the
   sum over ranks of (start + partial GEMM) is residual + the full product. */
static void us__tp_residual(us_model *m, void *dst, const void *res, int64_t n) {
    us_ops *o = &m->ops;
    size_t bytes = (size_t)n * us_dtype_size(m->dt);
    if (m->tc.tp <= 1 || m->mesh.tp_rank == 0)
        o->copy(o, dst, res, bytes, US_COPY_D2D);
    else
        o->zero(o, dst, bytes);
}

/* Vocabulary-parallel softmax cross-entropy over logits [N, V/tp] with local targets (the
   column, -1 on another rank, -2 ignored), the rows r0.. of the micro-batch: their losses and
   (want_argmax) global argmax, lowest index on ties like the one-rank kernel, go to rows r0.. */
static us_result us__tp_xent(us_model *m, const int32_t *tgt_l, int64_t N, int64_t r0, float dscale,
                             int want_argmax) {
    us_ops *o = &m->ops;
    char *vp = (char *)m->a[US__A_VP];
    double *se = (double *)vp;
    float *mx = (float *)(vp + N * 8), *tl = mx + N;
    int32_t *am = (int32_t *)(tl + N);
    void *logits = m->a[US__A_LOGITS];
    int64_t V = m->vocab_l, i;
    us_result r;
    o->xent_stats(o, mx, am, NULL, NULL, logits, tgt_l, N, V, m->dt);
    /* each rank offers its best column where it holds the global max; MAX of -index picks the
       first */
    if (want_argmax) {
        float *lm = (float *)US_MALLOC((size_t)N * 8);
        int32_t *la = (int32_t *)US_MALLOC((size_t)N * 4);
        if (!lm || !la) {
            US_FREE(lm);
            US_FREE(la);
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        o->copy(o, lm, mx, (size_t)N * 4, US_COPY_D2H);
        o->copy(o, la, am, (size_t)N * 4, US_COPY_D2H);
        if ((r = us__tp_max(m, mx, N, US_F32)) != US_OK) {
            US_FREE(lm);
            US_FREE(la);
            return r;
        }
        o->copy(o, lm + N, mx, (size_t)N * 4, US_COPY_D2H);
        for (i = 0; i < N; i++)
            la[i] = lm[i] == lm[N + i] ? -(int32_t)(m->vocab_off + la[i]) : INT32_MIN;
        o->copy(o, am, la, (size_t)N * 4, US_COPY_H2D);
        if ((r = us__tp_max(m, am, N, US_I32)) != US_OK) {
            US_FREE(lm);
            US_FREE(la);
            return r;
        }
        o->copy(o, la, am, (size_t)N * 4, US_COPY_D2H);
        for (i = 0; i < N; i++) la[i] = -la[i];
        o->copy(o, (int32_t *)m->a[US__A_ARGMAX] + r0, la, (size_t)N * 4, US_COPY_H2D);
        US_FREE(lm);
        US_FREE(la);
    } else if ((r = us__tp_max(m, mx, N, US_F32)) != US_OK)
        return r;
    o->xent_stats(o, mx, NULL, se, tl, logits, tgt_l, N, V, m->dt);
    if ((r = us__tp_sum(m, se, N, US_F64)) != US_OK) return r;
    if ((r = us__tp_sum(m, tl, N, US_F32)) != US_OK) return r;
    o->xent_finish(o, (float *)m->a[US__A_LOSSES] + r0, logits, tgt_l, mx, se, tl, N, V, dscale,
                   m->dt);
    return US_OK;
}

/* Sequence parallelism (Playbook "Sequence parallelism", Korthikanti et al.): the norms and the
   residual stream, which TP leaves replicated, are split by tokens — each tp rank keeps Ns = Np/tp
   rows (Np = B·T padded to a multiple of tp; padding rows are zero tokens with ignored targets).
   Entering a column-parallel GEMM, g all-gathers the norm output; leaving a row-parallel one, ḡ
   reduce-scatters the partial products instead of all-reducing them. In the backward the two
   swap. The same bytes move as TP's all-reduce (reduce-scatter + all-gather), but no rank stores
   or normalises the whole sequence. */
static int us__sp_on(const us_model *m) { return m->tc.sp && m->tc.tp > 1; }

static void us__sp_rows(const us_model *m, int64_t N, int64_t *Np, int64_t *Ns) {
    *Np = us__sp_on(m) ? (N + m->tc.tp - 1) / m->tc.tp * m->tc.tp : N;
    *Ns = us__sp_on(m) ? *Np / m->tc.tp : N;
}

/* Tensor and sequence parallelism's scratch (// >>model's arena), for Nf rows; head: this rank
   runs the head. */
static void us__tp_scratch(const us_model *m, int64_t Nf, int head, size_t *sz) {
    int64_t C = m->cfg.dim;
    size_t a = us_dtype_size(m->dt);
    int sp = us__sp_on(m);
    /* the vocabulary-parallel loss: mx, tlogit f32, sumexp f64, argmax i32 */
    sz[US__A_VP] = m->tc.tp > 1 && head ? Nf * (4 + 4 + 8 + 4) + 8 : 0;
    /* sequence parallelism: a whole-sequence [Nf, C] buffer for the all-gathered norm outputs,
       the partial products before their reduce-scatter and the gathered residual gradient;
       and a norm weight's partial gradient, summed over tp before it is accumulated */
    sz[US__A_SPG] = sp ? Nf * C * a : 0;
    sz[US__A_NW] = sp ? C * 4 : 0;
}

static us_result us__sp_gather_w(us_model *m, void *full, const void *shard, int64_t Ns,
                                 us_work **w) { /* g */
    us_result r =
        m->comm->all_gather(m->comm, &m->mesh.tp_g, full, shard, Ns * m->cfg.dim, m->dt, w);
    return us__comm_fail(m, r, "sequence-parallel all-gather");
}

static us_result us__sp_scatter_w(us_model *m, void *shard, const void *full, int64_t Ns,
                                  us_work **w) { /* ḡ */
    us_result r = m->comm->reduce_scatter(m->comm, &m->mesh.tp_g, shard, full, Ns * m->cfg.dim,
                                          m->dt, US_REDUCE_SUM, w);
    return us__comm_fail(m, r, "sequence-parallel reduce-scatter");
}

static us_result us__sp_gather(us_model *m, void *full, const void *shard, int64_t Ns) {
    return us__sp_gather_w(m, full, shard, Ns, NULL);
}

static us_result us__sp_scatter(us_model *m, void *shard, const void *full, int64_t Ns) {
    return us__sp_scatter_w(m, shard, full, Ns, NULL);
}

/* While a tp collective travels, the GEMMs beside it may leave it overlap_sms SMs
   (us_ops.sm_margin). A margin speeds the collective up and slows the GEMMs about as much
   (bench/RESULTS.md), so the default is none. Started collectives are counted; the margin holds
   until the last is waited for. */
static void us__tp_started(us_model *m, us_work *w) {
    if (!w) return;
    m->tp_inflight++;
    m->ops.sm_margin = m->tc.overlap_sms;
}

static us_result us__tp_wait(us_model *m,
                             us_work **w) { /* a started collective, finished (NULL: none) */
    us_result r;
    if (!*w) return US_OK;
    r = m->comm->wait(m->comm, *w);
    *w = NULL;
    if (--m->tp_inflight <= 0) {
        m->tp_inflight = 0;
        m->ops.sm_margin = 0;
    }
    return us__comm_fail(m, r, "tensor-parallel communication");
}

/* The backward's overlap (Megatron-LM's asynchronous TP communication): a column-parallel GEMM's
   backward needs its input gradient reduced over tp (f's conjugate: all-reduce, or SP's
   reduce-scatter) and, under SP, its input gathered again for the weight gradient. Neither
   depends on the weight-gradient GEMM, so the gather is started before the input-gradient GEMMs
   and the reduction before the weight-gradient GEMM, and both travel while those compute.
   Starts the reduction of dln [Np, C] into this rank's rows (dlnp) or in place: */
static us_result us__tp_dgrad_start(us_model *m, void *dlnp, void *dln, int64_t N, int64_t Ns,
                                    us_work **w) {
    us_result r;
    us_work **wa = m->tc.tp_no_overlap ? NULL : w; /* (no overlap: finished here) */
    *w = NULL;
    if (m->tc.tp <= 1) return US_OK;
    r = us__sp_on(m) ? us__sp_scatter_w(m, dlnp, dln, Ns, wa)
                     : us__tp_sum_w(m, dln, N * m->cfg.dim, m->dt, wa);
    if (r == US_OK) us__tp_started(m, *w);
    return r;
}

static us_result us__sp_gather_early(us_model *m, void *full, const void *shard, int64_t Ns,
                                     us_work **w) { /* started, or done */
    us_result r = us__sp_gather_w(m, full, shard, Ns, m->tc.tp_no_overlap ? NULL : w);
    if (r == US_OK) us__tp_started(m, *w);
    return r;
}

static void us__linear_fwd(us_model *m, int64_t N, int64_t In, int64_t Out, const void *x,
                           const void *W, float beta, void *y);
static void us__linear_dgrad(us_model *m, int64_t N, int64_t In, int64_t Out, const void *dy,
                             const void *W, float beta, void *dx, int keep);

/* g with its GEMM: the collective matmul (Wang et al. 2023; Megatron-LM's and PyTorch's async
   TP). Gathering the whole input before the GEMM leaves the GPU idle while it travels. Instead
   the row blocks go round the tp ranks as a ring: at step s each rank multiplies the block it
   holds, (rank − s) mod tp, while passing it to the next rank and taking the one before: each
   transfer travels under a block's GEMM, and the first block's GEMM waits for nothing.
   G [Np, C] ends holding the whole gathered input, as us__sp_gather leaves it (the weight
   gradient reads it again). The GEMM is one of the two a gathered input feeds: */
typedef struct us__ring_gemm {
    int dgrad;       /* 0: y = x·Wᵀ (us__linear_fwd), 1: y = x·W (us__linear_dgrad) */
    int64_t In, Out; /* x [rows, In] (dgrad: x is dy [rows, Out], y dx [rows, In]) */
    const void *W;
    void *y;
    int keep; /* dgrad: the Wgrad of the whole gathered dy comes next (us__linear_dgrad's keep;
                         it applies when the rows are multiplied at once, not block by block) */
} us__ring_gemm;

static void us__ring_gemm_rows(us_model *m, const us__ring_gemm *g, const void *G, int64_t row0,
                               int64_t rows, int keep) {
    size_t a = us_dtype_size(m->dt);
    if (!g->dgrad)
        us__linear_fwd(m, rows, g->In, g->Out, (const char *)G + (size_t)(row0 * g->In) * a, g->W,
                       0.0f, (char *)g->y + (size_t)(row0 * g->Out) * a);
    else
        us__linear_dgrad(m, rows, g->In, g->Out, (const char *)G + (size_t)(row0 * g->Out) * a,
                         g->W, 0.0f, (char *)g->y + (size_t)(row0 * g->In) * a, keep);
}

/* ḡ with its GEMM, the other half of the collective matmul: the row-parallel GEMM's partial
   products are made in k row chunks of every rank's block, laid out [k][tp][Ns/k] in G, and each
   chunk's reduce-scatter travels while the next chunk multiplies; only the last chunk's waits.
   The numbers are those of one GEMM and one reduce-scatter: each element is the same partial
   product (the residual added on its own rank first) summed the same way. dst [Ns, C] gets this
   rank's rows; x [Np, In] is the GEMM's input, W [C, In]. */
static int us__tp_ring(const us_model *m);
static int64_t us__sp_chunk_rows = 4096; /* (tests lower it, so small models chunk too) */
static void us__sp_residual(us_model *m, void *full, const void *res, int64_t Np, int64_t Ns);

static us_result us__sp_gemm_scatter(us_model *m, void *dst, const void *res, const void *x,
                                     int64_t In, const void *W, int64_t Ns) {
    us_ops *o = &m->ops;
    int tp = m->tc.tp, t = m->mesh.tp_rank, k, j, q;
    int64_t C = m->cfg.dim, off = 0;
    size_t a = us_dtype_size(m->dt);
    char *G = (char *)m->a[US__A_SPG];
    us_work *w[4] = {NULL, NULL, NULL, NULL};
    us_result r = US_OK;
    if (!us__tp_ring(m)) {
        us__sp_residual(m, G, res, Ns * tp, Ns);
        us__linear_fwd(m, Ns * tp, In, C, x, W, 1.0f, G);
        return us__sp_scatter(m, dst, G, Ns);
    }
    /* chunks of at least 4096 rows per rank block: GEMMs still large */
    k = (int)(Ns / us__sp_chunk_rows);
    if (k < 1) k = 1;
    if (k > 4) k = 4;
    for (j = 0; j < k && r == US_OK; j++) {
        int64_t lo = Ns * j / k, n = Ns * (j + 1) / k - lo;
        char *base = G + (size_t)(off * C) * a; /* [tp][n][C] */
        for (q = 0; q < tp; q++) {
            char *out = base + (size_t)(q * n * C) * a;
            if (q == t)
                o->copy(o, out, (const char *)res + (size_t)(lo * C) * a, (size_t)(n * C) * a,
                        US_COPY_D2D);
            us__linear_fwd(m, n, In, C, (const char *)x + (size_t)((q * Ns + lo) * In) * a, W,
                           q == t ? 1.0f : 0.0f, out);
        }
        r = us__sp_scatter_w(m, (char *)dst + (size_t)(lo * C) * a, base, n, &w[j]);
        if (r == US_OK) us__tp_started(m, w[j]);
        off += tp * n;
    }
    for (j = 0; j < k;
         j++) { /* all of them waited for, after a failure too: none outlives its buffer */
        us_result r2 = us__tp_wait(m, &w[j]);
        if (r == US_OK) r = r2;
    }
    return r;
}

/* Row blocks are independent GEMMs only where nothing is shared between rows: per-tensor FP8
   would scale each block by its own amax, and the tile mode would quantise the weight once per
   block, so FP8 gathers first. */
static int us__tp_ring(const us_model *m) {
    return us__sp_on(m) && !m->tc.tp_no_overlap && m->tc.precision != US_PRECISION_FP8 &&
           m->tc.precision != US_PRECISION_FP8_TENSOR;
}

static us_result us__sp_gather_gemm(us_model *m, void *G, const void *shard, int64_t Ns,
                                    const us__ring_gemm *g) {
    us_ops *o = &m->ops;
    int tp = m->tc.tp, t = m->mesh.tp_rank, s;
    size_t blk = (size_t)(Ns * m->cfg.dim) * us_dtype_size(m->dt);
    us_result r;
    if (!us__tp_ring(m)) {
        if ((r = us__sp_gather(m, G, shard, Ns)) != US_OK) return r;
        us__ring_gemm_rows(m, g, G, 0, Ns * tp, g->keep);
        return US_OK;
    }
    if ((const char *)G + t * blk != (const char *)shard)
        o->copy(o, (char *)G + t * blk, shard, blk, US_COPY_D2D);
    for (s = 0; s < tp; s++) {
        int have = (t - s + tp) % tp, take = (t - s - 1 + 2 * tp) % tp;
        us_work *w = NULL;
        if (s < tp - 1) { /* pass on the block held, take the one before it */
            r = m->comm->sendrecv(m->comm, &m->mesh.tp_g, (char *)G + have * blk, Ns * m->cfg.dim,
                                  (t + 1) % tp, (char *)G + take * blk, Ns * m->cfg.dim,
                                  (t - 1 + tp) % tp, m->dt, &w);
            if (r != US_OK) return us__comm_fail(m, r, "sequence-parallel ring exchange");
            us__tp_started(m, w);
        }
        us__ring_gemm_rows(m, g, G, have * Ns, Ns, 0);
        if ((r = us__tp_wait(m, &w)) != US_OK) return r;
    }
    return US_OK;
}

/* A row-parallel output under SP starts as zeros with this rank's residual rows in their place:
   the reduce-scatter then gives each rank residual + the full product for its rows. */
static void us__sp_residual(us_model *m, void *full, const void *res, int64_t Np, int64_t Ns) {
    us_ops *o = &m->ops;
    size_t rowb = (size_t)m->cfg.dim * us_dtype_size(m->dt);
    o->zero(o, full, (size_t)Np * rowb);
    o->copy(o, (char *)full + (size_t)(m->mesh.tp_rank * Ns) * rowb, res, (size_t)Ns * rowb,
            US_COPY_D2D);
}

/* RMSNorm backward; under SP each rank has only its tokens' part of the weight's gradient, so it
   is summed over tp (in a scratch, so earlier micro-batches' sums are not summed again). */
static us_result us__norm_bwd(us_model *m, void *dres, int widx, const void *dln, const void *x,
                              const float *rstd, int64_t rows, float *dw) {
    us_ops *o = &m->ops;
    int64_t C = m->cfg.dim;
    us_result r;
    if (!us__sp_on(m)) {
        o->rmsnorm_bwd(o, dres, dw ? dw : us__grad(m, widx), dln, x, us__weight(m, widx), rstd,
                       rows, C, m->dt);
        return US_OK;
    }
    o->zero(o, m->a[US__A_NW], (size_t)C * 4);
    o->rmsnorm_bwd(o, dres, (float *)m->a[US__A_NW], dln, x, us__weight(m, widx), rstd, rows, C,
                   m->dt);
    if ((r = us__tp_sum(m, m->a[US__A_NW], C, US_F32)) != US_OK) return r;
    o->axpy(o, dw ? dw : us__grad(m, widx), (const float *)m->a[US__A_NW], 1.0f, C);
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>cp  context parallelism: the sequence split over cp ranks, ring attention, zig-zag
/* ------------------------------------------------------------------------------------ */
/* Playbook "Context parallelism": every sequence is split over the cp ranks for the whole
   model; all token-wise work (norms, MLP, GEMMs) is local, and only attention needs other
   ranks' keys and values. Ring attention passes the K/V blocks around the ring (an all-to-all
   whose only non-empty parts go to the next rank) while the block in hand is attended to, and
   merges the partial results with the online-softmax rule (the state acc, m, l carried over
   blocks); the backward passes each block's dK/dV along with it until they are home. Zig-zag
   sharding gives rank r chunks r and 2·cp−1−r, so every rank has the same causal work; the
   all-gather variant gathers every block first (simpler, more memory). Gradients are then
   reduced over dp×cp (// >>dp), each rank holding the same weights. */

/* Checks the sequence splits into the cp ranks' chunks (us_config_validate). */
static us_result us__cp_checks(const us_train_config *tc, char *err, size_t errlen) {
    if (tc->cp < 1) US__BAD("cp=%d must be at least 1", tc->cp);
    if (tc->cp_mode < US_CP_RING || tc->cp_mode > US_CP_ALLGATHER)
        US__BAD("unknown cp mode %d", (int)tc->cp_mode);
    if (tc->cp > 1 && tc->seq % (tc->cp_mode == US_CP_RING ? tc->cp : 2 * tc->cp))
        US__BAD("seq=%d must split into %d equal chunks for cp=%d (%s)", tc->seq,
                tc->cp_mode == US_CP_RING ? tc->cp : 2 * tc->cp, tc->cp,
                tc->cp_mode == US_CP_RING ? "one per rank" : "two per rank, zig-zag");
    return US_OK;
}

static int us__cp_pos(const us_train_config *tc, int r,
                      int t) { /* global position of rank r's token t */
    int cp = tc->cp, Tl = tc->seq / cp, half = Tl / 2;
    if (tc->cp_mode == US_CP_RING) return r * Tl + t;
    return t < half ? r * half + t : (2 * cp - 1 - r) * half + (t - half);
}

US_API void us_cp_positions(const us_train_config *tc, int r, int32_t *pos) {
    int t;
    for (t = 0; t < tc->seq / tc->cp; t++) pos[t] = us__cp_pos(tc, r, t);
}

/* Context parallelism's scratch (// >>model's arena), N = B·T/cp rows: positions, the K/V blocks
   in flight (two for the ring, all cp for the all-gather variant) with their gradients, the
   online-softmax state, dQ and a cast buffer. */
static void us__cp_scratch(const us_model *m, int64_t N, size_t *sz) {
    int cp = m->tc.cp > 1 ? m->tc.cp : 1;
    int64_t HS = m->cfg.dim / m->cfg.n_heads, AO = (int64_t)m->nh_l * HS;
    int64_t KVW = (int64_t)2 * m->nkv_l * HS, nb = m->tc.cp_mode == US_CP_ALLGATHER ? cp : 2,
            on = cp > 1;
    size_t a = us_dtype_size(m->dt);
    sz[US__A_CPPOS] = on ? (size_t)(cp * (m->tc.seq / cp)) * 4 : 0; /* [cp, T/cp] i32 */
    sz[US__A_CPKV] = on ? nb * N * KVW * a : 0;                     /* [nb, N, 2·NKV·HS] */
    sz[US__A_CPDKV] = on ? nb * N * KVW * 4 : 0;                    /* [nb, N, 2·NKV·HS] f32 */
    sz[US__A_CPACC] = on ? N * AO * 4 : 0;                          /* [N, NH·HS] f32 */
    sz[US__A_CPM] = sz[US__A_CPL] = on ? N * m->nh_l * 4 : 0;       /* [N, NH] f32 */
    sz[US__A_CPDQ] = on ? N * AO * 4 : 0;                           /* [N, NH·HS] f32 */
    sz[US__A_CPTMP] = on ? N * (AO > KVW ? AO : KVW) * a : 0;
}

/* Context parallelism's set-up: every rank's token positions, [cp][T/cp] i32, in the arena. */
static us_result us__cp_init(us_model *m) {
    int Tl = m->tc.seq / m->tc.cp, rr, t;
    int32_t *pos;
    if (m->tc.cp <= 1) return US_OK;
    pos = (int32_t *)US_MALLOC((size_t)(m->tc.cp * Tl) * 4);
    if (!pos) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    for (rr = 0; rr < m->tc.cp; rr++)
        for (t = 0; t < Tl; t++) pos[rr * Tl + t] = us__cp_pos(&m->tc, rr, t);
    m->ops.copy(&m->ops, m->a[US__A_CPPOS], pos, (size_t)(m->tc.cp * Tl) * 4, US_COPY_H2D);
    US_FREE(pos);
    return US_OK;
}

/* Moves this rank's block to the next rank and receives the previous rank's, as one all-to-all. */
static us_result us__cp_shift(us_model *m, void *dst, const void *src, int64_t n, us_dtype dt,
                              us_work **w) {
    int cp = m->mesh.cp, r = m->mesh.cp_rank; /* src, dst: n elements, [N, 2·NKV·HS] K|V or dK|dV */
    int64_t *sc = (int64_t *)calloc((size_t)(4 * cp), sizeof(int64_t)), *sd = sc + cp,
            *rc = sd + cp, *rd = rc + cp; /* any cp */
    us_result res;
    if (!sc) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    sc[(r + 1) % cp] = n;
    rc[(r - 1 + cp) % cp] = n;
    res = m->comm->all_to_all(m->comm, &m->mesh.cp_g, dst, rc, rd, src, sc, sd, dt, w);
    free(sc);
    return us__comm_fail(m, res, "context-parallel ring exchange");
}

static us_result us__cp_attention_fwd(us_model *m, us_layer_acts *A, int64_t B, int64_t T) {
    us_ops *o = &m->ops;
    us_dtype dt = m->dt;
    int NH = m->nh_l, NKV = m->nkv_l, HS = (int)(m->cfg.dim / m->cfg.n_heads), cp = m->mesh.cp,
        r = m->mesh.cp_rank, s;
    int64_t N = B * T, QKV = (int64_t)(NH + 2 * NKV) * HS, KVW = (int64_t)2 * NKV * HS;
    const int32_t *pos = (const int32_t *)m->a[US__A_CPPOS];
    char *kv = (char *)m->a[US__A_CPKV]; /* [2 or cp][N, KVW]: K|V blocks, KVW = 2·NKV·HS */
    size_t blk = (size_t)(N * KVW) * us_dtype_size(dt);
    /* the online softmax over blocks: acc [N, NH·HS], mm (row max) and ll (row sum) [N, NH], f32 */
    float *acc = (float *)m->a[US__A_CPACC], *mm = (float *)m->a[US__A_CPM],
          *ll = (float *)m->a[US__A_CPL];
    us_result res;
    if (m->tc.cp_mode == US_CP_ALLGATHER) { /* every block gathered, then attended to in turn */
        o->copy2d(o, kv + (size_t)r * blk, KVW, us__at(A->qkv, dt, (int64_t)NH * HS), QKV, N, KVW,
                  dt);
        res = m->comm->all_gather(m->comm, &m->mesh.cp_g, kv, kv + (size_t)r * blk, N * KVW, dt,
                                  NULL);
        if (res != US_OK) return us__comm_fail(m, res, "context-parallel all-gather");
        for (s = 0; s < cp; s++)
            o->attn_block_fwd(o, acc, mm, ll, A->qkv, kv + (size_t)s * blk, pos + r * T,
                              pos + s * T, B, T, T, NH, NKV, HS, s == 0, dt);
    } else { /* the ring: attend to the block in hand while the next one travels */
        char *cur = kv, *nxt = kv + blk, *t;
        o->copy2d(o, cur, KVW, us__at(A->qkv, dt, (int64_t)NH * HS), QKV, N, KVW, dt);
        for (s = 0; s < cp; s++) {
            us_work *w = NULL;
            int src = (r - s + cp) % cp;
            if (s < cp - 1 && (res = us__cp_shift(m, nxt, cur, N * KVW, dt, &w)) != US_OK)
                return res;
            o->attn_block_fwd(o, acc, mm, ll, A->qkv, cur, pos + r * T, pos + src * T, B, T, T, NH,
                              NKV, HS, s == 0, dt);
            if (w && (res = m->comm->wait(m->comm, w)) != US_OK)
                return us__comm_fail(m, res, "context-parallel ring exchange");
            t = cur;
            cur = nxt;
            nxt = t;
        }
    }
    o->attn_block_finish(o, A->att, A->lse, acc, mm, ll, B, T, NH, HS, dt);
    return US_OK;
}

/* dqkv (overwritten): dQ from every block this rank's queries saw; dK, dV of this rank's block
   from every rank's queries (summed around the ring, or reduce-scattered after the all-gather). */
static us_result us__cp_attention_bwd(us_model *m, us_layer_acts *A, void *dqkv, const void *dout,
                                      int64_t B, int64_t T) {
    us_ops *o = &m->ops;
    us_dtype dt = m->dt;
    int NH = m->nh_l, NKV = m->nkv_l, HS = (int)(m->cfg.dim / m->cfg.n_heads), cp = m->mesh.cp,
        r = m->mesh.cp_rank, s;
    int64_t N = B * T, QKV = (int64_t)(NH + 2 * NKV) * HS, KVW = (int64_t)2 * NKV * HS,
            AO = (int64_t)NH * HS;
    const int32_t *pos = (const int32_t *)m->a[US__A_CPPOS];
    char *kv = (char *)m->a[US__A_CPKV]; /* [2 or cp][N, KVW] K|V blocks */
    /* dkv [2 or cp][N, KVW] f32: dK|dV travelling with their block; dq [N, NH·HS] f32 */
    float *dkv = (float *)m->a[US__A_CPDKV], *dq = (float *)m->a[US__A_CPDQ], *home;
    void *tmp = m->a[US__A_CPTMP];
    size_t blk = (size_t)(N * KVW) * us_dtype_size(dt);
    us_result res;
    o->zero(o, dq, (size_t)(N * AO) * 4);
    if (m->tc.cp_mode == US_CP_ALLGATHER) {
        o->copy2d(o, kv + (size_t)r * blk, KVW, us__at(A->qkv, dt, (int64_t)NH * HS), QKV, N, KVW,
                  dt);
        res = m->comm->all_gather(m->comm, &m->mesh.cp_g, kv, kv + (size_t)r * blk, N * KVW, dt,
                                  NULL);
        if (res != US_OK) return us__comm_fail(m, res, "context-parallel all-gather");
        o->zero(o, dkv, (size_t)(cp * N * KVW) * 4);
        for (s = 0; s < cp; s++)
            o->attn_block_bwd(o, dq, dkv + (int64_t)s * N * KVW, dout, A->qkv, A->att, A->lse,
                              kv + (size_t)s * blk, pos + r * T, pos + s * T, B, T, T, NH, NKV, HS,
                              dt);
        home = dkv + (int64_t)r * N * KVW; /* in place: this rank's block gets every rank's part */
        res = m->comm->reduce_scatter(m->comm, &m->mesh.cp_g, home, dkv, N * KVW, US_F32,
                                      US_REDUCE_SUM, NULL);
        if (res != US_OK) return us__comm_fail(m, res, "context-parallel reduce-scatter");
        /* K/V and their gradient accumulators travel together; after cp shifts dK/dV are home */
    } else {
        char *cur = kv, *nxt = kv + blk, *t;
        float *dcur = dkv, *dnxt = dkv + N * KVW, *dt2;
        o->copy2d(o, cur, KVW, us__at(A->qkv, dt, (int64_t)NH * HS), QKV, N, KVW, dt);
        o->zero(o, dcur, (size_t)(N * KVW) * 4);
        for (s = 0; s < cp;
             s++) { /* the next K/V block travels while this one's gradients are computed */
            int src = (r - s + cp) % cp;
            us_work *w = NULL;
            if (s < cp - 1 && (res = us__cp_shift(m, nxt, cur, N * KVW, dt, &w)) != US_OK)
                return res;
            o->attn_block_bwd(o, dq, dcur, dout, A->qkv, A->att, A->lse, cur, pos + r * T,
                              pos + src * T, B, T, T, NH, NKV, HS, dt);
            if (w && (res = m->comm->wait(m->comm, w)) != US_OK)
                return us__comm_fail(m, res, "context-parallel ring exchange");
            if ((res = us__cp_shift(m, dnxt, dcur, N * KVW, US_F32, NULL)) != US_OK)
                return res; /* dK, dV follow their block */
            t = cur;
            cur = nxt;
            nxt = t;
            dt2 = dcur;
            dcur = dnxt;
            dnxt = dt2;
        }
        home = dcur;
    }
    o->cast(o, tmp, dt, dq, US_F32, N * AO); /* dQ into the q columns of dqkv */
    o->copy2d(o, dqkv, QKV, tmp, AO, N, AO, dt);
    o->cast(o, tmp, dt, home, US_F32, N * KVW); /* dK | dV into the k and v columns */
    o->copy2d(o, us__at(dqkv, dt, AO), QKV, tmp, KVW, N, KVW, dt);
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>pp  pipeline parallelism: schedules as data, the stage split, the executor
/* ------------------------------------------------------------------------------------ */
/* Playbook "Pipeline parallelism": the layers are split into stages over the pp ranks; a
   micro-batch's activations flow forward stage to stage and its gradients flow back. What a rank
   does, and in which order, is the schedule: a list of actions per rank (forward F, backward B or
   BW, weight gradient W; micro-batch, model chunk), written by a pure function for each of AFAB,
   1F1B, interleaved 1F1B, ZB-H1, ZB-V, DualPipe-V and DualPipe. One checker, one simulator
   (bubble, peak activations) and one SVG renderer read the same lists, and one executor
   (us__pp_run) runs any of them. In order: the schedules, their checks and pictures; the stage
   split (which layers a stage holds, us__pp_stage_layers); the set-up (us__pp_init); the
   messages between stages; the executor and the evaluation forward. */

/* DualPipe's own checks (pp > 1): two pipelines that enter at the two ends and meet in the
   middle (an even pp), half of the micro-batches fed at each end, each half at least pp (what
   DeepSeek's DualPipe asserts: it reaches its overlapped steady state from there), and 2
   chunks per rank, the two stages it holds. MoE layers are refused: the two copies of a layer
   would route different halves of the batch, and their router biases would drift apart. */
static us_result us__pp_dual_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                                    size_t errlen) {
    if (tc->pp <= 1) return US_OK; /* no pipeline: the schedule is not run */
    if (tc->pp % 2)
        US__BAD("dualpipe needs an even pp: its two pipelines enter at the two ends and meet in "
                "the middle (pp=%d)",
                tc->pp);
    if (tc->grad_accum % 2 || tc->grad_accum < 2 * tc->pp)
        US__BAD("dualpipe feeds half of the micro-batches at each end and needs an even number "
                "of them, at least 2*pp (micro-batches=%d, pp=%d)",
                tc->grad_accum, tc->pp);
    if (tc->pp_chunks != 2)
        US__BAD("dualpipe runs exactly 2 chunks per rank, stages r and pp-1-r (pp_chunks=%d)",
                tc->pp_chunks);
    if (mc->moe_experts)
        US__BAD("dualpipe does not run MoE layers yet: the two copies of a layer would route "
                "different halves of the batch and their router biases drift apart");
    return US_OK;
}

/* Checks a stage for every layer, the schedule and its chunks, and what pipeline parallelism
   does not combine with (us_config_validate). */
static us_result us__pp_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                               size_t errlen) {
    if (tc->pp < 1) US__BAD("pp=%d must be at least 1", tc->pp);
    if (tc->pp > mc->n_layers)
        US__BAD("pp=%d exceeds layers=%d: every pipeline stage needs a layer", tc->pp,
                mc->n_layers);
    /* pipeline × ZeRO-3: each stage gathers its chunk's units per action (us__zero3_next) */
    /* pipeline × context parallelism: each stage's cp ranks run the ring within the stage
       (tests/test_cp.c) */
    if (tc->pp_schedule < US_PP_AFAB || tc->pp_schedule > US_PP_DUALPIPE)
        US__BAD("unknown pipeline schedule %d", tc->pp_schedule);
    if (tc->pp_chunks < 1 || tc->pp_chunks > 16)
        US__BAD("pp_chunks=%d must be in 1..16", tc->pp_chunks);
    if (tc->pp_clock < -1 || tc->pp_clock > 1)
        US__BAD("pp_clock=%d must be -1 (channels), 0 (the default) or 1 (the clock)",
                tc->pp_clock);
    if ((tc->pp_schedule == US_PP_INTERLEAVED || tc->pp_schedule == US_PP_INTERLEAVED_BF) &&
        tc->pp_chunks < 2)
        US__BAD("the interleaved schedules need at least 2 model chunks per rank (pp_chunks=%d)",
                tc->pp_chunks);
    if ((tc->pp_schedule == US_PP_ZBV || tc->pp_schedule == US_PP_DUALPIPEV) && tc->pp_chunks != 2)
        US__BAD("%s runs exactly 2 chunks per rank, in a V (pp_chunks=%d)",
                us_pp_kind_name((us_pp_kind)tc->pp_schedule), tc->pp_chunks);
    if (tc->pp_schedule == US_PP_DUALPIPE) {
        us_result r = us__pp_dual_checks(mc, tc, err, errlen);
        if (r != US_OK) return r;
    }
    if (tc->pp_schedule <= US_PP_1F1B && tc->pp_chunks != 1)
        US__BAD("pp_chunks=%d applies to the interleaved and V-shaped schedules only (%s runs one "
                "chunk per rank)",
                tc->pp_chunks, us_pp_kind_name((us_pp_kind)tc->pp_schedule));
    if (tc->pp_schedule == US_PP_ZB1 && tc->pp_chunks != 1)
        US__BAD("zb1 runs one chunk per rank (pp_chunks=%d)", tc->pp_chunks);
    if (tc->pp > 1 && tc->pp_schedule != US_PP_DUALPIPE && tc->pp * tc->pp_chunks > mc->n_layers)
        US__BAD(
            "pp=%d x %d chunks = %d pipeline stages exceed layers=%d: every stage needs a layer",
            tc->pp, tc->pp_chunks, tc->pp * tc->pp_chunks, mc->n_layers);
    if (tc->pp_layers && tc->pp > 1) {
        int st, sum = 0, S = tc->pp * (tc->pp_schedule == US_PP_DUALPIPE ? 1 : tc->pp_chunks);
        for (st = 0; st < S; st++) {
            if (tc->pp_layers[st] < 1)
                US__BAD("pipeline stage %d is given %d layers: every stage needs at least one", st,
                        tc->pp_layers[st]);
            sum += tc->pp_layers[st];
        }
        if (sum != mc->n_layers)
            US__BAD("the per-stage layer counts sum to %d but the model has %d layers", sum,
                    mc->n_layers);
    }
    /* zero bubble × recompute: W recomputes what its GEMMs read (us__layer_w) */
    /* ZeRO-2 × chunks or B and W apart: units that complete within one action (us__plan_units) */
    return US_OK;
}

US_API const char *us_pp_kind_name(us_pp_kind k) {
    switch (k) {
    case US_PP_AFAB:
        return "afab";
    case US_PP_INTERLEAVED:
        return "interleaved";
    case US_PP_INTERLEAVED_BF:
        return "interleaved-bf";
    case US_PP_ZB1:
        return "zb1";
    case US_PP_ZBV:
        return "zbv";
    case US_PP_DUALPIPEV:
        return "dualpipev";
    case US_PP_DUALPIPE:
        return "dualpipe";
    default:
        return "1f1b";
    }
}

US_API int us_pp_stage(const us_pp_schedule *s, int r, int c) {
    if (s->dual) return (c == 0) == (2 * r < s->pp) ? r : s->pp - 1 - r; /* the lower first */
    if (s->vshape) return c == 0 ? r : 2 * s->pp - 1 - r;
    return c * s->pp + r;
}

/* The layer stages the model is split into: pp·v, or DualPipe's pp (each held by two ranks). */
static int us__pp_nstages(const us_pp_schedule *s) { return s->dual ? s->pp : s->pp * s->v; }

/* DualPipe: the pipeline chunk c of rank r belongs to, 0 fed at rank 0, 1 at rank pp−1; chunk 0,
   the lower stage, is the first half's on ranks below pp/2 and the second's above. */
static int us__pp_dir(const us_pp_schedule *s, int r, int c) { return c ^ (2 * r >= s->pp); }

/* Messages flow between positions, 0 .. pp·v−1: a position's forward sends to the next one's,
   its backward to the one before. A position is the stage, except under DualPipe, whose stage
   st is position st in the pipeline fed at rank 0 (rank st) and pp + st in the one fed at rank
   pp−1 (rank pp−1−st): the V's numbering, cut at the fold, as no micro-batch crosses from one
   pipeline to the other. */
static int us__pp_pos(const us_pp_schedule *s, int r, int c) {
    if (!s->dual) return us_pp_stage(s, r, c);
    return us__pp_dir(s, r, c) ? 2 * s->pp - 1 - r : r;
}

static int us__pp_pos_first(const us_pp_schedule *s, int u) {
    return u == 0 || (s->dual && u == s->pp); /* embeds the tokens */
}

static int us__pp_pos_last(const us_pp_schedule *s, int u) {
    return u == s->pp * s->v - 1 || (s->dual && u == s->pp - 1); /* computes the loss */
}

static void us__pp_push(us_pp_schedule *s, int r, us_pp_op op, int mb, int chunk) {
    us_pp_action *x = &s->a[r][s->n[r]++];
    x->op = op;
    x->mb = mb;
    x->chunk = chunk;
    x->overlap = 0;
}

/* The virtual-stage order of the interleaved schedules: the k-th forward (or backward) of a rank
   works on micro-batch mb of chunk c. Depth-first takes micro-batches in groups of pp through
   every chunk (Megatron); breadth-first runs all m micro-batches through a chunk before the
   next. */
static void us__pp_virtual(const us_pp_schedule *s, int k, int backward, int *mb, int *chunk) {
    int grp = s->kind == US_PP_INTERLEAVED_BF ? s->m : s->pp, v = s->v;
    int c = (k / grp) % v;
    *chunk = backward ? v - 1 - c : c;
    *mb = (k / (grp * v)) * grp + k % grp;
}

/* The zero-bubble schedules are written phase by phase, the way the papers draw them, through a
   cursor on one rank's list: it numbers each chunk's micro-batches in order and remembers the
   weight gradients owed by split backwards (B now, W later), oldest first. A step whose
   micro-batch does not exist (few micro-batches) is skipped. The phases are written for a V of
   vp ranks, vm micro-batches per chunk, this rank at place vr: the schedule's own pp, m and r,
   except under DualPipe (us__pp_zero_bubble). */
typedef struct us__pp_cur {
    us_pp_schedule *s;
    int r, f[2], b[2];     /* forwards and backwards (B or BW) listed, per chunk */
    int *owed, head, tail; /* [2·m] micro-batch·2 + chunk of each W still to list, oldest first */
    int vp, vm, vr;        /* the V the phases see */
    int mb0[2];            /* each chunk's first micro-batch (DualPipe: its pipeline's half) */
} us__pp_cur;

static void us__pp_add_forward(us__pp_cur *q, int c) {
    if (q->f[c] < q->vm) us__pp_push(q->s, q->r, US_PP_F, q->mb0[c] + q->f[c]++, c);
}

static void us__pp_add_backward(us__pp_cur *q, int c,
                                int split) { /* B with its W owed, or the full BW */
    int mb = q->mb0[c] + q->b[c];
    if (q->b[c] >= q->f[c]) return;
    if (split) q->owed[q->tail++] = 2 * mb + c;
    us__pp_push(q->s, q->r, split ? US_PP_B : US_PP_BW, mb, c);
    q->b[c]++;
}

static void us__pp_add_wgrad(us__pp_cur *q) { /* the oldest owed weight gradient */
    if (q->head < q->tail) {
        int k = q->owed[q->head++];
        us__pp_push(q->s, q->r, US_PP_W, k / 2, k % 2);
    }
}

/* DualPipe's F&B: a forward of chunk cf overlapped with a full backward of chunk cb (another,
   older micro-batch); either alone when the other has run out. */
static void us__pp_add_fb(us__pp_cur *q, int cf, int cb) {
    int n = q->s->n[q->r];
    us__pp_add_forward(q, cf);
    if (q->s->n[q->r] > n && q->b[cb] < q->f[cb]) q->s->a[q->r][n].overlap = 1;
    us__pp_add_backward(q, cb, 0);
}

/* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", §2.1): 1F1B's order of forwards and
   input-gradient backwards B, so every B leaves as early as in 1F1B; the weight gradient W of a
   micro-batch waits on rank r until r more B's have run. Every rank then holds pp micro-batches
   (from F to W), the most 1F1B holds on its first rank; the deferred W's fill the cooldown, where
   1F1B idles, and the bubble is (pp−1)(tF+tB−tW) per rank instead of (pp−1)(tF+tB+tW). */
static void us__pp_zb1(us__pp_cur *q) {
    int pp = q->s->pp, m = q->s->m, r = q->r, i;
    for (i = 0; i < pp - r - 1; i++) us__pp_add_forward(q, 0); /* 1F1B's warm-up */
    for (i = 0; i < m; i++) {
        us__pp_add_forward(q, 0);
        us__pp_add_backward(q, 0, 1);
        if (q->tail - q->head > r) us__pp_add_wgrad(q);
    }
    while (q->head < q->tail) us__pp_add_wgrad(q);
}

/* ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory"; ZB paper §6): rank r holds
   stage r (chunk 0) and stage 2·pp−1−r (chunk 1), so a micro-batch runs down the ranks and back
   up, and its gradient down and back up again; the first and last stage share rank 0. With unit
   costs rank r's first chunk-1 activation comes back 2(pp−r)−1 steps after its first forward,
   so it warms up with that many chunk-0 forwards; r pairs of a chunk-1 and a chunk-0 forward
   then bring its first chunk-1 gradient, and it runs F B W on chunk 1 pp−r times. In the steady
   state it runs F B W on each chunk in turn: 2·pp micro-batch chunks held at most, each half of
   the rank's layers — 1F1B's pp micro-batches of memory — and no idle time when tF = tB = tW,
   so a rank idles only while the pipeline fills. The cooldown runs the backwards as they come,
   the owed W's in the gaps. With fewer than 2·pp−1 micro-batches the phases run short: still a
   valid schedule, with more idle time than the fill. */
static void us__pp_zbv(us__pp_cur *q) {
    int pp = q->s->pp, m = q->s->m, r = q->r, i;
    for (i = 0; i < 2 * (pp - r) - 1; i++) us__pp_add_forward(q, 0);
    for (i = 0; i < r; i++) {
        us__pp_add_forward(q, 1);
        us__pp_add_forward(q, 0);
    }
    for (i = 0; i < pp - r; i++) {
        us__pp_add_forward(q, 1);
        us__pp_add_backward(q, 1, 1);
        us__pp_add_wgrad(q);
    }
    while (q->f[1] < m) {
        us__pp_add_forward(q, 0);
        us__pp_add_backward(q, 0, 1);
        us__pp_add_wgrad(q);
        us__pp_add_forward(q, 1);
        us__pp_add_backward(q, 1, 1);
        us__pp_add_wgrad(q);
    }
    for (i = 0; i < r; i++) {
        us__pp_add_backward(q, 0, 1);
        us__pp_add_backward(q, 1, 1);
    }
    for (i = 0; i < pp - r; i++) {
        us__pp_add_backward(q, 0, 1);
        us__pp_add_wgrad(q);
    }
    while (q->b[1] < m) us__pp_add_backward(q, 1, 1);
    while (q->b[0] < m) us__pp_add_backward(q, 0, 1);
    while (q->head < q->tail) us__pp_add_wgrad(q);
}

/* DualPipe-V (DeepSeek's DualPipe cut in half, the DualPipe repository's DualPipeV; the
   Playbook's zero-bubble and DualPipe section): the same V as ZB-V, in eight phases on rank r.
   Warm-up: 2(pp−r−1) chunk-0 forwards, then r+1 pairs of a chunk-0 and a chunk-1 forward, then
   pp−r−1 rounds of B W F on chunk 1. Steady state: a chunk-0 forward overlapped with a chunk-1
   backward, then a chunk-1 forward overlapped with a chunk-0 backward — DualPipe's F&B pairs,
   where one micro-batch's all-to-all and pipeline transfers hide under the other's compute (the
   last rank runs its first pair apart: its chunk-0 forward feeds its own chunk 1). Cooldown:
   pp−r−1 rounds of a chunk-1 backward and an F&B pair use up the forwards; 2(r+1) backwards
   alternate between the chunks, the second half split; pp−r−1 rounds of an owed W and a split
   chunk-0 backward follow, and the last W's fill the tail. Needs m ≥ 2·pp. (Written for the V
   the cursor sees: DualPipe runs the same phases, us__pp_zero_bubble.) */
static void us__pp_dualpipev(us__pp_cur *q) {
    int pp = q->vp, m = q->vm, r = q->vr, i;
    for (i = 0; i < 2 * (pp - r - 1); i++) us__pp_add_forward(q, 0);
    for (i = 0; i < r + 1; i++) {
        us__pp_add_forward(q, 0);
        us__pp_add_forward(q, 1);
    }
    for (i = 0; i < pp - r - 1; i++) {
        us__pp_add_backward(q, 1, 1);
        us__pp_add_wgrad(q);
        us__pp_add_forward(q, 1);
    }
    for (i = 0; i < m - 2 * pp + r + 1; i++) {
        if (i == 0 && r == pp - 1) {
            us__pp_add_forward(q, 0);
            us__pp_add_backward(q, 1, 0);
        } else
            us__pp_add_fb(q, 0, 1);
        us__pp_add_fb(q, 1, 0);
    }
    for (i = 0; i < pp - r - 1; i++) {
        us__pp_add_backward(q, 1, 0);
        us__pp_add_fb(q, 1, 0);
    }
    for (i = 0; i < 2 * (r + 1); i++) us__pp_add_backward(q, 1 - i % 2, i >= r + 1);
    for (i = 0; i < pp - r - 1; i++) {
        us__pp_add_wgrad(q);
        us__pp_add_backward(q, 0, 1);
    }
    while (q->head < q->tail) us__pp_add_wgrad(q);
}

/* The split-backward schedules: each rank's list from its phases, through one cursor.
   DualPipe (DeepSeek-V3 §3.2.1; the DualPipe repository's DualPipe) is two DualPipe-V's glued
   at their folds: rank r runs DualPipe-V's phases as the V of pp/2 ranks and m/2 micro-batches
   sees them, at place min(r, pp−1−r), its chunk 0 (the lower stage) being the V's first half
   and chunk 1 its second; rank pp/2−1's chunk 0 feeds rank pp/2's chunk 1 where the V's last
   rank fed its own, and the two run the same phases, so every message comes as in the V. Ranks
   r and pp−1−r run mirror lists, each on its own pipeline's half of the micro-batches. */
static us_result us__pp_zero_bubble(us_pp_schedule *s, char *err, size_t errlen) {
    us__pp_cur q;
    int r;
    memset(&q, 0, sizeof q);
    q.s = s;
    q.owed = (int *)malloc(sizeof(int) * (size_t)(2 * s->m));
    if (!q.owed) {
        us_pp_schedule_free(s);
        us__errf(err, errlen, "out of host memory");
        return US_ERR_OOM;
    }
    for (r = 0; r < s->pp; r++) {
        int c;
        q.r = r;
        q.f[0] = q.f[1] = q.b[0] = q.b[1] = q.head = q.tail = 0;
        q.vp = s->dual ? s->pp / 2 : s->pp;
        q.vm = s->dual ? s->m / 2 : s->m;
        q.vr = s->dual && 2 * r >= s->pp ? s->pp - 1 - r : r;
        for (c = 0; c < 2; c++) q.mb0[c] = s->dual ? us__pp_dir(s, r, c) * q.vm : 0;
        if (s->kind == US_PP_ZB1)
            us__pp_zb1(&q);
        else if (s->kind == US_PP_ZBV)
            us__pp_zbv(&q);
        else
            us__pp_dualpipev(&q);
    }
    free(q.owed);
    return US_OK;
}

/* What the schedules of 2 chunks per rank (the V shapes, DualPipe) need of pp, m and v. */
static us_result us__pp_two_chunks_check(us_pp_kind kind, int pp, int m, int v, char *err,
                                         size_t errlen) {
    int vs = kind != US_PP_DUALPIPE;
    if (v != 0 && v != 2) {
        us__errf(err, errlen, "%s runs exactly 2 chunks per rank%s (got v=%d; pass 0 or 2)",
                 us_pp_kind_name(kind), vs ? " in a V" : "", v);
        return US_ERR_INVALID;
    }
    if (kind == US_PP_DUALPIPE && pp % 2) {
        us__errf(err, errlen,
                 "DualPipe needs an even pp: its two pipelines enter at the two ends and meet in "
                 "the middle (got pp=%d)",
                 pp);
        return US_ERR_INVALID;
    }
    if (kind == US_PP_DUALPIPE && (m % 2 || m < 2 * pp)) {
        us__errf(err, errlen,
                 "DualPipe feeds half of the micro-batches at each end and needs an even number "
                 "of them, at least 2*pp (got micro-batches=%d, pp=%d)",
                 m, pp);
        return US_ERR_INVALID;
    }
    if (kind == US_PP_DUALPIPEV && m < 2 * pp) {
        us__errf(err, errlen,
                 "DualPipe-V needs micro-batches >= 2*pp to reach its overlapped steady state "
                 "(got micro-batches=%d, pp=%d)",
                 m, pp);
        return US_ERR_INVALID;
    }
    return US_OK;
}

US_API us_result us_pp_schedule_build(us_pp_schedule *s, us_pp_kind kind, int pp, int m, int v,
                                      char *err, size_t errlen) {
    int r, k, il, vs;
    memset(s, 0, sizeof *s);
    if (kind == US_PP_DEFAULT) kind = US_PP_1F1B;
    il = kind == US_PP_INTERLEAVED || kind == US_PP_INTERLEAVED_BF;
    vs = kind == US_PP_ZBV || kind == US_PP_DUALPIPEV;
    if (kind < US_PP_AFAB || kind > US_PP_DUALPIPE) {
        us__errf(err, errlen, "unknown pipeline schedule %d", (int)kind);
        return US_ERR_INVALID;
    }
    if (pp < 1 || pp > 64) {
        us__errf(err, errlen, "pp=%d must be in 1..64", pp);
        return US_ERR_INVALID;
    }
    if (m < 1) {
        us__errf(err, errlen, "micro-batches=%d must be at least 1", m);
        return US_ERR_INVALID;
    }
    if (il) {
        if (v < 2) {
            us__errf(err, errlen,
                     "the interleaved schedule needs at least 2 chunks per rank (got %d)", v);
            return US_ERR_INVALID;
        }
        if (kind == US_PP_INTERLEAVED && m % pp) {
            us__errf(err, errlen,
                     "interleaved 1F1B takes micro-batches in groups of pp: micro-batches=%d is "
                     "not a multiple of pp=%d",
                     m, pp);
            return US_ERR_INVALID;
        }
    } else if (vs || kind == US_PP_DUALPIPE) {
        if (us__pp_two_chunks_check(kind, pp, m, v, err, errlen) != US_OK) return US_ERR_INVALID;
        v = 2;
    } else
        v = 1;
    s->kind = kind;
    s->pp = pp;
    s->m = m;
    s->v = v;
    s->vshape = vs;
    s->dual = kind == US_PP_DUALPIPE;
    s->n = (int *)calloc((size_t)pp, sizeof(int));
    s->a = (us_pp_action **)calloc((size_t)pp, sizeof(us_pp_action *));
    if (!s->n || !s->a) {
        us_pp_schedule_free(s);
        us__errf(err, errlen, "out of host memory");
        return US_ERR_OOM;
    }
    for (r = 0; r < pp; r++) {
        s->a[r] = (us_pp_action *)malloc(sizeof(us_pp_action) * (size_t)(3 * m * v));
        if (!s->a[r]) {
            us_pp_schedule_free(s);
            us__errf(err, errlen, "out of host memory");
            return US_ERR_OOM;
        }
    }
    if (kind == US_PP_ZB1 || vs || s->dual) return us__pp_zero_bubble(s, err, errlen);
    for (r = 0; r < pp; r++) {
        if (kind == US_PP_AFAB) { /* GPipe: every forward, then every backward */
            for (k = 0; k < m; k++) us__pp_push(s, r, US_PP_F, k, 0);
            for (k = 0; k < m; k++) us__pp_push(s, r, US_PP_BW, k, 0);
        } else if (kind == US_PP_1F1B) {
            /* warm up with pp−r−1 forwards (the rank's distance from the end), then alternate
               F and B, then drain the backwards */
            int warm = pp - r - 1 < m ? pp - r - 1 : m, f = 0, b = 0;
            for (; f < warm; f++) us__pp_push(s, r, US_PP_F, f, 0);
            for (; b < m; b++) {
                if (f < m) {
                    us__pp_push(s, r, US_PP_F, f, 0);
                    f++;
                }
                us__pp_push(s, r, US_PP_BW, b, 0);
            }
        } else { /* interleaved: 1F1B over the m·v virtual micro-batches of the rank's chunks */
            int total = m * v, grp = kind == US_PP_INTERLEAVED_BF ? m : pp;
            int warm = (pp - r - 1) * 2 + (v - 1) * grp, f = 0, b = 0, mb, c;
            if (warm > total) warm = total;
            for (; f < warm; f++) {
                us__pp_virtual(s, f, 0, &mb, &c);
                us__pp_push(s, r, US_PP_F, mb, c);
            }
            while (b < total) {
                if (f < total) {
                    us__pp_virtual(s, f, 0, &mb, &c);
                    us__pp_push(s, r, US_PP_F, mb, c);
                    f++;
                }
                us__pp_virtual(s, b, 1, &mb, &c);
                us__pp_push(s, r, US_PP_BW, mb, c);
                b++;
            }
        }
    }
    return US_OK;
}

US_API void us_pp_schedule_free(us_pp_schedule *s) {
    int r;
    if (s->a)
        for (r = 0; r < s->pp; r++) free(s->a[r]);
    free(s->a);
    free(s->n);
    memset(s, 0, sizeof *s);
}

/* Simulation: each action starts when its rank is free and its inputs exist —
     F(mb, stage)  after F(mb, stage−1)                       (the activation arrives)
     B(mb, stage)  after F(mb, stage) and B(mb, stage+1)      (the output gradient arrives; the
                   last stage's after its own F)
     W(mb, stage)  after B(mb, stage)
   with BW = B then W at once, and stages counted as positions (us__pp_pos: each of DualPipe's
   two pipelines begins and ends). Every rank's list is walked in order; any rank whose next
   action is ready advances. If none can and lists remain, the schedule deadlocks.
   An F&B pair (overlap) starts when both its inputs exist, and both its outputs leave when it
   ends, as DualPipe's overlapped_forward_backward sends them. It costs the SUM of its two
   actions: the two computations share one device, so overlap does not shorten the compute; what
   it buys is hiding each one's communication (pipeline sends, expert-parallel all-to-all) under
   the other's compute, and transfers are free here. So this simulator shows DualPipe-V's
   schedule, not its communication advantage. */
typedef struct us__pp_ev {
    double f, b, w;
} us__pp_ev; /* end times, -1 = not yet */

static double us__pp_cost(const us_pp_action *x, double tF, double tB, double tW) {
    return x->op == US_PP_F ? tF : x->op == US_PP_B ? tB : x->op == US_PP_W ? tW : tB + tW;
}

/* When action x of rank r may start as far as its inputs go; -1 while one is not produced. */
static double us__pp_ready(const us_pp_schedule *s, const us__pp_ev *e, int r,
                           const us_pp_action *x) {
    int m = s->m, st = us__pp_pos(s, r, x->chunk);
    const us__pp_ev *me = &e[st * m + x->mb];
    double g;
    if (x->op == US_PP_F) return !us__pp_pos_first(s, st) ? e[(st - 1) * m + x->mb].f : 0;
    if (x->op == US_PP_W) return me->b;
    if (us__pp_pos_last(s, st) || me->f < 0)
        return me->f; /* the last stage starts from its own loss */
    g = e[(st + 1) * m + x->mb].b;
    return g < 0 ? -1 : g > me->f ? g : me->f;
}

/* The checker's static half: every (micro-batch, chunk) of a rank has exactly one forward, one
   input-gradient and one weight-gradient backward (BW counts as both); overlapped pairs are a
   forward and a backward. A rank's actions are first counted into its (chunk, micro-batch)
   cells, so a check reads each list twice rather than once per action: the planner simulates
   thousands of schedules of hundreds of actions. */
static us_result us__pp_check_lists(const us_pp_schedule *s, char *err, size_t errlen) {
    int r, i, cells = s->m > 0 && s->v > 0 ? s->m * s->v : 1;
    int *cnt = (int *)malloc(sizeof(int) * 3 * (size_t)cells); /* [v][m][3]: a cell's F, B, W */
    us_result res = US_ERR_INVALID;
    if (!cnt) {
        us__errf(err, errlen, "out of host memory");
        return US_ERR_OOM;
    }
    for (r = 0; r < s->pp; r++) {
        memset(cnt, 0, sizeof(int) * 3 * (size_t)cells);
        for (i = 0; i < s->n[r]; i++) { /* (an action outside the cells is reported below) */
            const us_pp_action *y = &s->a[r][i];
            int *c;
            if (y->mb < 0 || y->mb >= s->m || y->chunk < 0 || y->chunk >= s->v) continue;
            c = &cnt[3 * (y->chunk * s->m + y->mb)];
            c[0] += y->op == US_PP_F;
            c[1] += y->op == US_PP_B || y->op == US_PP_BW;
            c[2] += y->op == US_PP_W || y->op == US_PP_BW;
        }
        for (i = 0; i < s->n[r]; i++) {
            const us_pp_action *x = &s->a[r][i];
            const int *c;
            if (x->mb < 0 || x->mb >= s->m || x->chunk < 0 || x->chunk >= s->v) {
                us__errf(err, errlen,
                         "rank %d action %d names micro-batch %d chunk %d, outside %d x %d", r, i,
                         x->mb, x->chunk, s->m, s->v);
                goto done;
            }
            if (s->dual && (s->m % 2 || (2 * x->mb >= s->m) != us__pp_dir(s, r, x->chunk))) {
                us__errf(err, errlen,
                         "rank %d action %d: micro-batch %d runs on the other pipeline than chunk "
                         "%d of this rank (DualPipe: the first m/2 enter at rank 0, the rest at "
                         "rank pp-1)",
                         r, i, x->mb, x->chunk);
                goto done;
            }
            if (x->overlap && (x->op != US_PP_F || i + 1 == s->n[r] ||
                               (s->a[r][i + 1].op != US_PP_B && s->a[r][i + 1].op != US_PP_BW))) {
                us__errf(
                    err, errlen,
                    "rank %d action %d: an overlapped pair is a forward followed by a backward", r,
                    i);
                goto done;
            }
            c = &cnt[3 * (x->chunk * s->m + x->mb)];
            if (c[0] != 1 || c[1] != 1 || c[2] != 1) {
                us__errf(err, errlen,
                         "rank %d: micro-batch %d chunk %d has %d forwards, %d input and %d weight "
                         "backwards (want 1 each)",
                         r, x->mb, x->chunk, c[0], c[1], c[2]);
                goto done;
            }
        }
    }
    res = US_OK;
done:
    free(cnt);
    return res;
}

/* The walk itself; start (may be NULL) receives every action's start time, [pp][nmax] where
   nmax is the longest rank list: what the renderer draws (a pair's backward starts where its
   forward's share ends). */
static us_result us__pp_play(const us_pp_schedule *s, double tF, double tB, double tW,
                             us_pp_sim *out, double *start, int nmax, char *err, size_t errlen) {
    int S = s->pp * s->v, m = s->m, r, i, progress, left;
    us__pp_ev *e = (us__pp_ev *)malloc(sizeof(us__pp_ev) * (size_t)(S * m));
    int *pc = (int *)calloc((size_t)s->pp, sizeof(int)),
        *held = (int *)calloc((size_t)s->pp, sizeof(int));
    double *busy = (double *)calloc((size_t)s->pp, sizeof(double)),
           *clock = (double *)calloc((size_t)s->pp, sizeof(double)), end = 0;
    us_result res = US_OK;
    if (!e || !pc || !held || !busy || !clock) {
        res = US_ERR_OOM;
        us__errf(err, errlen, "out of host memory");
        goto done;
    }
    memset(out, 0, sizeof *out);
    for (i = 0; i < S * m; i++) e[i].f = e[i].b = e[i].w = -1;
    if ((res = us__pp_check_lists(s, err, errlen)) != US_OK) goto done;
    do {
        progress = 0;
        left = 0;
        for (r = 0; r < s->pp; r++) {
            while (pc[r] < s->n[r]) {
                const us_pp_action *x = &s->a[r][pc[r]];
                int k, n = x->overlap ? 2 : 1; /* the action, or the F&B pair it starts */
                double t0 = clock[r], ready;
                for (k = 0; k < n; k++) {
                    if ((ready = us__pp_ready(s, e, r, x + k)) < 0) break;
                    if (ready > t0) t0 = ready;
                }
                if (k < n) break;
                for (k = 0; k < n; k++) {
                    double cost = us__pp_cost(x + k, tF, tB, tW);
                    if (start) start[(size_t)r * nmax + pc[r] + k] = t0;
                    t0 += cost;
                    busy[r] += cost;
                }
                clock[r] = t0;
                for (k = 0; k < n; k++) { /* a pair's outputs leave together, when it ends */
                    us__pp_ev *me = &e[us__pp_pos(s, r, x[k].chunk) * m + x[k].mb];
                    if (x[k].op == US_PP_F) {
                        me->f = t0;
                        if (++held[r] > out->peak_act[r]) out->peak_act[r] = held[r];
                    }
                    if (x[k].op == US_PP_B || x[k].op == US_PP_BW)
                        me->b = t0; /* the input gradient leaves when the action ends */
                    if (x[k].op == US_PP_W || x[k].op == US_PP_BW) {
                        me->w = t0;
                        held[r]--;
                    } /* activations freed with the weight gradient */
                }
                if (t0 > end) end = t0;
                pc[r] += n;
                progress = 1;
            }
            left += s->n[r] - pc[r];
        }
    } while (progress && left);
    if (left) {
        static const char *name[] = {"F", "B", "W", "BW"};
        for (r = 0; r < s->pp && pc[r] == s->n[r]; r++) {
        }
        us__errf(err, errlen,
                 "the schedule deadlocks: rank %d waits at action %d (%s of micro-batch %d, chunk "
                 "%d) for an input no rank will produce",
                 r, pc[r], name[s->a[r][pc[r]].op], s->a[r][pc[r]].mb, s->a[r][pc[r]].chunk);
        res = US_ERR_INVALID;
        goto done;
    }
    out->makespan = end;
    {
        double b = 0;
        for (r = 0; r < s->pp; r++) {
            b += busy[r];
            if (out->peak_act[r] > out->peak_max) out->peak_max = out->peak_act[r];
        }
        out->bubble = end > 0 ? 1.0 - b / ((double)s->pp * end) : 0;
    }
done:
    free(e);
    free(pc);
    free(held);
    free(busy);
    free(clock);
    return res;
}

US_API us_result us_pp_simulate(const us_pp_schedule *s, double tF, double tB, double tW,
                                us_pp_sim *out, char *err, size_t errlen) {
    return us__pp_play(s, tF, tB, tW, out, NULL, 0, err, errlen);
}

US_API us_result us_pp_svg(const us_pp_schedule *s, double tF, double tB, double tW,
                           const char *path, char *err, size_t errlen) {
    us_pp_sim sim;
    FILE *f;
    double scale, rowh = 28, x0 = 70, width = 1100, *start;
    int rk, i, nmax = 0;
    us_result r;
    for (rk = 0; rk < s->pp; rk++)
        if (s->n[rk] > nmax) nmax = s->n[rk];
    start = (double *)malloc(sizeof(double) * (size_t)(s->pp * (nmax ? nmax : 1)));
    if (!start) {
        us__errf(err, errlen, "out of host memory");
        return US_ERR_OOM;
    }
    if ((r = us__pp_play(s, tF, tB, tW, &sim, start, nmax, err, errlen)) != US_OK) {
        free(start);
        return r;
    }
    if (!(f = fopen(path, "w"))) {
        free(start);
        us__errf(err, errlen, "cannot write %s", path);
        return US_ERR_IO;
    }
    scale = (width - x0 - 10) / sim.makespan;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n",
            width, rowh * s->pp + 60);
    fprintf(f,
            "<text x=\"8\" y=\"16\" font-size=\"13\">%s, pp=%d, m=%d, v=%d: bubble %.1f%%, peak "
            "activations %d micro-batch chunks</text>\n",
            us_pp_kind_name(s->kind), s->pp, s->m, s->v, 100 * sim.bubble, sim.peak_max);
    for (rk = 0; rk < s->pp; rk++)
        for (i = 0; i < s->n[rk]; i++) { /* one box per action, where the simulation placed it */
            const us_pp_action *x = &s->a[rk][i];
            double t0 = start[(size_t)rk * nmax + i], cost = us__pp_cost(x, tF, tB, tW),
                   y = 30 + rk * rowh;
            int lite = s->dual ? us__pp_dir(s, rk, x->chunk) : x->chunk; /* DualPipe: by pipeline */
            const char *col = x->op == US_PP_F   ? (lite ? "#6fa8dc" : "#3d85c6")
                              : x->op == US_PP_W ? (lite ? "#b4a7d6" : "#8e7cc3")
                                                 : (lite ? "#93c47d" : "#6aa84f");
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                    "stroke=\"white\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"white\">%d</text>\n",
                    x0 + t0 * scale, y, cost * scale, rowh - 4, col, x0 + (t0 + cost / 2) * scale,
                    y + 17, x->mb + 1);
            if (x->overlap) /* an F&B pair: one black frame around both, as DualPipe draws it */
                fprintf(f,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                        "stroke=\"black\" stroke-width=\"1.5\"/>\n",
                        x0 + t0 * scale, y, (cost + us__pp_cost(x + 1, tF, tB, tW)) * scale,
                        rowh - 4);
        }
    for (rk = 0; rk < s->pp; rk++)
        fprintf(f, "<text x=\"8\" y=\"%.1f\">rank %d</text>\n", 30 + rk * rowh + 17, rk);
    fprintf(f,
            "<text x=\"%.0f\" y=\"%.0f\">F forward  B/BW backward  W weight gradient (lighter: "
            "%s%s)</text>\n</svg>\n",
            x0, rowh * s->pp + 50, s->dual ? "the pipeline fed at the last rank" : "second chunk",
            s->kind == US_PP_DUALPIPEV || s->dual ? "; framed: an overlapped F&amp;B pair" : "");
    free(start);
    if (fclose(f) != 0) {
        us__errf(err, errlen, "cannot finish writing %s", path);
        return US_ERR_IO;
    }
    return US_OK;
}

/* Stage st's first layer and layer count among S stages: tc.pp_layers, or a split that balances
   the stages' work. The last stage also runs the head, whose GEMMs cost 6·V·C FLOPs per token
   against a layer's 6·(its parameters) + 12·C·T: at Llama-3.2-1B's shape the head weighs as much
   as 2.6 layers, and an even split leaves the first stage idle a third of the time. So the last
   stage takes as many layers as bring it nearest the mean stage cost (at least one), and the
   others share the rest evenly, the first ones taking the remainder. */
static void us__pp_stage_layers(const us_model_config *mc, const us_train_config *tc, int S, int st,
                                int *first, int *count) {
    int k, L = mc->n_layers, last, base, extra;
    if (tc->pp_layers && tc->pp > 1) {
        for (*first = 0, k = 0; k < st; k++) *first += tc->pp_layers[k];
        *count = tc->pp_layers[st];
        return;
    }
    last = L / S;
    if (S > 1 && L > 0) {
        double C = (double)mc->dim, V = (double)mc->vocab, head = 6.0 * V * C;
        double layer =
            (6.0 *
                 (double)(us_param_count_active(mc) -
                          (int64_t)(mc->vocab * mc->dim * (mc->tie_embeddings ? 1 : 2) + mc->dim)) /
                 L +
             12.0 * C * (double)(tc->seq > 0 ? tc->seq : 1));
        double want = layer > 0 ? ((L * layer + head) / S - head) / layer : (double)last;
        int lo = (int)want, c, best = -1;
        double best_cost = 0;
        for (c = lo; c <= lo + 1;
             c++) { /* the whole count below or above: the one whose slowest stage is faster */
            int n = c < 1       ? 1
                    : c > L / S ? L / S
                                : c; /* at least one, never more than an even share */
            /* the slowest stage: the last one, or the fullest other (the rest, rounded up) */
            double cost, other;
            if (n < 1) n = 1;
            cost = n * layer + head;
            other = ((L - n + S - 2) / (S - 1)) * layer;
            if (other > cost) cost = other;
            if (best < 0 || cost < best_cost) {
                best = n;
                best_cost = cost;
            }
        }
        last = best;
    }
    base = (L - last) / (S > 1 ? S - 1 : 1);
    extra = (L - last) % (S > 1 ? S - 1 : 1);
    if (S == 1) {
        *first = 0;
        *count = L;
    } else if (st == S - 1) {
        *first = L - last;
        *count = last;
    } else {
        *first = st * base + (st < extra ? st : extra);
        *count = base + (st < extra);
    }
}

/* The layers pipeline rank q runs: its chunks' stages (c·pp + q; the V shapes: q, then
   2·pp−1−q; DualPipe: the lower of q and pp−1−q, then the other) of the pp·v stages (DualPipe:
   pp) us__pp_stage_layers splits the model into, in chunk order.
   layer_g (NULL: count only) gets their global numbers, lo and hi (NULL: not wanted) each
   chunk's range, *largest the largest chunk. Returns the rank's layer count. The model's set-up
   and the memory estimator both use it. */
static int us__pp_rank_layers(const us_model_config *mc, const us_train_config *tc,
                              const us_pp_schedule *s, int q, int *layer_g, int *lo, int *hi,
                              int *largest) {
    int v = s ? s->v : 1, S = s ? us__pp_nstages(s) : tc->pp, c, l, n = 0;
    *largest = 0;
    for (c = 0; c < v; c++) {
        int st = s ? us_pp_stage(s, q, c) : 0, g0, nl;
        us__pp_stage_layers(mc, tc, S, st, &g0, &nl);
        if (lo) lo[c] = n;
        for (l = 0; l < nl; l++, n++)
            if (layer_g) layer_g[n] = g0 + l;
        if (hi) hi[c] = n;
        if (nl > *largest) *largest = nl;
    }
    return n;
}

static int us__pp_rank_of(const us_pp_schedule *s, int st);
static us_result us__pp_plan(us_model *m);

/* The position of the last stage of the pipeline fed at rank 0, where the evaluation scores. */
static int us__pp_head_pos(const us_pp_schedule *s) {
    return s->dual ? s->pp - 1 : s->pp * s->v - 1;
}

/* Pipeline parallelism's set-up: the step's schedule (which stages this rank runs, in which
   order); this rank's layers (us__pp_rank_layers), which from here on are the model's n_layers;
   whether it holds the embedding (stage 0) and the head (the last stage), both under DualPipe
   on ranks 0 and pp−1; the head's rank, where the evaluation scores (DualPipe: the pipeline fed
   at rank 0 ends on rank pp−1);
   one activation slot per micro-batch chunk in flight, the schedule's simulated peak for this
   rank (1F1B: pp − rank; AFAB: all micro-batches); the messages' plan (us__pp_plan). Without
   pipeline parallelism: every layer, one slot. */
static us_result us__pp_init(us_model *m) {
    char e2[200] = "out of host memory";
    int q = m->mesh.pp_rank, i, S;
    if (m->tc.pp > 1) {
        m->pp_sched = (us_pp_schedule *)calloc(1, sizeof(us_pp_schedule));
        if (!m->pp_sched ||
            us_pp_schedule_build(m->pp_sched, (us_pp_kind)m->tc.pp_schedule, m->tc.pp,
                                 m->tc.grad_accum, m->tc.pp_chunks, e2, sizeof e2) != US_OK) {
            us__model_set_error(m, "pipeline schedule: %s", e2);
            return US_ERR_INVALID;
        }
    }
    m->n_layers_global = m->cfg.n_layers;
    m->pp_v = m->pp_sched ? m->pp_sched->v : 1;
    S = m->pp_sched ? us__pp_nstages(m->pp_sched) : 1;
    m->layer_g = (int *)US_MALLOC(sizeof(int) * (size_t)m->n_layers_global);
    if (!m->layer_g) {
        us__model_set_error(m, "out of host memory for the model tables");
        return US_ERR_OOM;
    }
    m->cfg.n_layers = us__pp_rank_layers(&m->cfg, &m->tc, m->pp_sched, q, m->layer_g, m->chunk_lo,
                                         m->chunk_hi, &m->pp_lc);
    m->pp_head_rank = m->pp_sched ? us__pp_rank_of(m->pp_sched, us__pp_head_pos(m->pp_sched)) : 0;
    m->pp_first = q == 0;
    m->pp_last = q == m->pp_head_rank;
    for (i = 0; m->pp_sched && i < m->pp_v; i++) { /* DualPipe: rank pp−1 embeds, rank 0 scores */
        m->pp_first |= us_pp_stage(m->pp_sched, q, i) == 0;
        m->pp_last |= us_pp_stage(m->pp_sched, q, i) == S - 1;
    }
    m->l_lo = 0;
    m->l_hi = m->cfg.n_layers;
    m->c_first = m->pp_first;
    m->c_last = m->pp_last;
    m->slots = 1;
    if (m->tc.pp > 1) {
        us_pp_sim sim;
        if (us_pp_simulate(m->pp_sched, 1, 2, 0, &sim, e2, sizeof e2) != US_OK) {
            us__model_set_error(m, "pipeline schedule: %s", e2);
            return US_ERR_INVALID;
        }
        m->slots = sim.peak_act[q];
        for (i = 0; i < m->pp_sched->n[q]; i++)
            if (m->pp_sched->a[q][i].op == US_PP_W) m->pp_wsplit = 1;
        return us__pp_plan(m);
    }
    return US_OK;
}

/* Tied embeddings (Megatron-LM's embedding group): the first stage looks the tokens up in the
   table and the last stage's head multiplies by it, so when they are different ranks each holds
   a copy (us__build_params). The copies start equal (one init stream) and stay equal: their
   gradients, the lookup's on the first stage and the head's on the last, are summed over the
   pair before every optimizer step (us__pp_tied_sum), and both then take the same AdamW step.
   A checkpoint has one tensor, which both write alike and both read. The V-shaped schedules
   end on rank 0, which then holds the one table; under DualPipe ranks 0 and pp−1 each hold the
   first and the last stage, so each its one table (the pair's sum keeps the two equal,
   us__pp_dual_sum). */
static int us__pp_tied_apart(const us_model *m) {
    return m->cfg.tie_embeddings && m->tc.pp > 1 && m->pp_head_rank != 0 &&
           !(m->pp_sched && m->pp_sched->dual);
}

/* Whether this pp rank counts tensor i in a sum over stages (the gradient norm): the head's copy
   of a tied embedding is the first stage's, counted there; DualPipe's copies on ranks pp/2 ..
   pp−1 are their partners' (us__pp_dual_sum), counted on ranks 0 .. pp/2−1. */
static int us__pp_counts(const us_model *m, int i) {
    if (m->dual_g.size && 2 * m->mesh.pp_rank >= m->tc.pp) return 0;
    return i != 0 || !us__pp_tied_apart(m) || m->pp_first;
}

/* The pairs that sum the copies' gradients: pp ranks 0 and pp_head_rank (the tied embedding);
   DualPipe's q and pp−1−q (us__pp_dual_sum). */
static us_result us__pp_tie_connect(us_model *m) {
    int q = m->mesh.pp_rank, P = m->tc.pp;
    us_result r;
    if (m->pp_sched && m->pp_sched->dual) {
        r = m->comm->split(m->comm, &m->mesh.pp_g, q < P - 1 - q ? q : P - 1 - q, q, &m->dual_g);
        return us__comm_fail(m, r, "the groups of DualPipe's pairs of ranks");
    }
    if (!us__pp_tied_apart(m)) return US_OK;
    r = m->comm->split(m->comm, &m->mesh.pp_g, q == 0 || q == m->pp_head_rank ? 0 : -1, q,
                       &m->tie_g);
    return us__comm_fail(m, r, "the group of the tied embedding's stages");
}

static void us__pp_tie_free(us_model *m) {
    if (m->comm && m->comm->group_free && m->tie_g.size) m->comm->group_free(m->comm, &m->tie_g);
    if (m->comm && m->comm->group_free && m->dual_g.size) m->comm->group_free(m->comm, &m->dual_g);
    memset(&m->tie_g, 0, sizeof m->tie_g);
    memset(&m->dual_g, 0, sizeof m->dual_g);
}

/* The tied copies' gradients summed over the pair, after data parallelism's reduction (the sums
   commute), on the part each rank holds for the optimizer. The embedding is a unit of its own
   on both stages (us__plan_units), so their ZeRO pieces cover the same elements. */
static us_result us__pp_tied_sum(us_model *m) {
    int64_t n;
    float *g;
    us_result r;
    if (!m->tie_g.size) return US_OK;
    g = us__grad_held(m, 0, 1, &n);
    if (!n) return US_OK;
    r = m->comm->all_reduce(m->comm, &m->tie_g, g, n, US_F32, US_REDUCE_SUM, NULL);
    return us__comm_fail(m, r, "the all-reduce of the tied embedding's gradient");
}

/* DualPipe's two copies of the weights (DeepSeek-V3 §3.2.1: "2× parameters"): ranks q and
   pp−1−q hold the same two stages, laid out alike (the lower stage as chunk 0 on both, hence
   the same tensors, units and ZeRO pieces), and each ran its pipeline's half of the
   micro-batches through them. Their gradients are summed over the pair after data parallelism's
   reduction (the sums commute), on what each holds for the optimizer, so both take the same
   AdamW step and the copies stay equal to the bit, as one copy trained on the whole batch. */
static us_result us__pp_dual_sum(us_model *m) {
    int u;
    int64_t n;
    float *g;
    us_result r = US_OK;
    if (!m->dual_g.size) return US_OK;
    if (m->tc.zero != 1) /* the whole gradient, or ZeRO-2/3's shard */
        r = m->comm->all_reduce(m->comm, &m->dual_g, m->grad, m->tc.zero ? m->shard_n : m->n_flat,
                                US_F32, US_REDUCE_SUM, NULL);
    for (u = 0; m->tc.zero == 1 && u < m->n_units && r == US_OK; u++) { /* each unit's piece */
        g = us__grad_held(m, m->units[u].p0, m->units[u].p1, &n);
        if (n) r = m->comm->all_reduce(m->comm, &m->dual_g, g, n, US_F32, US_REDUCE_SUM, NULL);
    }
    return us__comm_fail(m, r, "the all-reduce of DualPipe's copies' gradients");
}

/* ---- the executor: one rank's list of actions run on its chunks of layers. It runs the layer
   chapter's passes (// >>layer) on one chunk at a time: */
static us_result us__forward(us_model *m, const int32_t *inputs, const int32_t *targets, int B,
                             int T, float dscale, double *loss_sum);
static us_result us__backward(us_model *m, int B, int T);
static us_result us__layer_w(us_model *m, int l, int64_t B, int64_t T);
static us_result us__last_logits(us_model *m, int B, int T, float *logits_out);

/* Selects slot k for chunk c: the slot's layers stand at the chunk's place in acts (a slot holds
   one chunk's activations, so interleaved and V-shaped schedules store 1/v of the rank's layers
   per micro-batch chunk in flight), its scratch in a. */
static void us__pp_slot_select(us_model *m, int k, int c) {
    int lo = m->chunk_lo[c], n = m->chunk_hi[c] - lo;
    memcpy(m->acts_work + lo, m->slot_acts + (size_t)k * m->pp_lc,
           sizeof(us_layer_acts) * (size_t)n);
    m->acts = m->acts_work;
    memcpy(m->a, m->slot_a[k], sizeof m->a);
    m->pp_slot = k;
}

/* The pp rank at position st (us__pp_pos), and the chunk of rank q there (-1: none). */
static int us__pp_rank_of(const us_pp_schedule *s, int st) {
    if (s->vshape || s->dual) return st < s->pp ? st : 2 * s->pp - 1 - st;
    return st % s->pp;
}

static int us__pp_chunk_of(const us_pp_schedule *s, int q, int st) {
    int c;
    for (c = 0; c < s->v; c++)
        if (us__pp_pos(s, q, c) == st) return c;
    return -1;
}

/* Points the forward and backward at one chunk, its activations in slot k; us__pp_select_all
   gives back the whole rank (slot 0), what every call outside the executor sees. */
static void us__pp_select(us_model *m, int k, int chunk) {
    const us_pp_schedule *s = m->pp_sched;
    int st = us_pp_stage(s, m->mesh.pp_rank, chunk);
    us__pp_slot_select(m, k, chunk);
    m->l_lo = m->chunk_lo[chunk];
    m->l_hi = m->chunk_hi[chunk];
    m->c_first = st == 0;
    m->c_last = st == us__pp_nstages(s) - 1;
}

static void us__pp_select_all(us_model *m) {
    us__pp_slot_select(m, 0, 0);
    m->l_lo = 0;
    m->l_hi = m->cfg.n_layers;
    m->c_first = m->pp_first;
    m->c_last = m->pp_last;
}

static us_result us__pp_wpass(us_model *m, int B, int T) { /* the chunk's W, last layer first */
    int l;
    us_result r = US_OK;
    us__grads_begin(m); /* its units complete in this action (ZeRO-2/3 reduce them as they do) */
    for (l = m->l_hi - 1; l >= m->l_lo; l--) {
        /* ZeRO-3: the weights only where W recomputes (us__layer_w); its GEMMs do not read them */
        if (m->tc.recompute != US_RECOMPUTE_NONE && (r = us__zero3_walk(m, 1 + l, -1, 1)) != US_OK)
            break;
        if ((r = us__layer_w(m, l, B, T)) != US_OK) break;
    }
    us__zero3_release_all(m);
    return r != US_OK ? r : us__backend_check(m);
}

/* How messages travel (// >>pp). Sends complete only when received (NCCL's, and the threads
   backend's under rendezvous), so the order in which ranks post them decides whether they wait
   for each other forever. Two plans, by what a waiting call costs the backend (us_comm.p2p_early):

   Channels (host backends). Every boundary between two stages on different ranks has two
   channels (us_comm.dup): one carries the activations forward, the other the gradients back. A
   channel matches its messages in order and runs apart from the others, so a forward's output
   leaves as soon as it is computed and a rank waits only for data it needs now: a forward for
   its input, a backward for its gradient, whose receive was posted ahead into the slot that
   will need it. When a call may be posted is us__pp_plan_posts' rule: nothing pending may need
   this rank's later work, since a device synchronisation (on a GPU, the first launch of any
   kernel) waits for everything pending. A slot is reused only after its sends completed. A
   channel carries micro-batches in one order on both ends, which us__pp_plan checks.
   The rule holds every schedule, 1F1B to DualPipe, at any pp under the threads backend's NCCL
   semantics (tests/test_pp.c runs them all there; before it, interleaved and the V schedules
   hung there as on two H200s in run 7: a gradient's receive posted at its forward waited, in a
   later synchronisation, for this rank's own later chunk).

   The clock (NCCL, for the schedules us__pp_early gives it). Its waiting calls are kernels
   spinning on the GPU, under which the channel plan (before its rule above) hung for
   interleaved, ZB-V and DualPipe-V (run 7): so every message is exchanged at one agreed time
   on the schedule's own clock — the checker's unit-cost play
   (tF = tB = tW = 1), which every rank computes alike:
     an activation  at its consumer's start (the receiver takes a slot only then: no more
                    activations held than the schedule says; the sender still holds it, since
                    its backward comes after the consumer's);
     a gradient     at its producer's end (the receiver's slot exists: its forward ran earlier).
   Before starting an action, a rank makes every exchange timed at or before that action's
   start, in time order; at equal times gradients go first (a full backward frees its slot as
   its gradient leaves, and an activation arriving at that moment may take the same slot), then
   the successor on even ranks and the predecessor on odd ones; the two directions between a
   pair travel as one sendrecv on the pp group. Sends are not waited for except before their
   slot is written again. By induction on the clock no rank ever waits for a message its peer
   cannot yet send: whatever an exchange at time t carries was produced by an action that
   started before t. The price: a message waits for its time even when its data is ready, and
   a receive can wait while a later action could run (bench/pp_bubble.sh measures both plans). */
static int us__pp_channel(int b, int grad) { return 2 * b + grad; } /* boundary b: stages b → b+1 */

/* Channels or the clock: channels where a waiting call costs the backend nothing
   (us_comm.p2p_early: the threads backend); on NCCL, channels for the schedules whose channel
   plan idled less than the clock under the threads backend's NCCL semantics (bench/RESULTS.md,
   2026-12-01: AFAB, 1F1B, ZB-H1 at pp 2, m 8), the clock for the others (interleaved, ZB-V and
   DualPipe-V idled 6 to 31 points more on channels there). tc.pp_clock: 1 the clock always,
   -1 channels always. */
static int us__pp_early(const us_model *m) {
    int k = m->pp_sched ? (int)m->pp_sched->kind : US_PP_1F1B;
    if (!m->comm || m->tc.pp_clock > 0) return 0;
    return m->comm->p2p_early || m->tc.pp_clock < 0 || k == US_PP_DEFAULT || k == US_PP_AFAB ||
           k == US_PP_1F1B || k == US_PP_ZB1;
}

static us_result us__pp_play(const us_pp_schedule *s, double tF, double tB, double tW,
                             us_pp_sim *out, double *start, int nmax, char *err, size_t errlen);
static double us__pp_cost(const us_pp_action *x, double tF, double tB, double tW);

typedef struct us__pp_msg {
    double t; /* the agreed time */
    int grad; /* 0: an activation (forward output), 1: a gradient (backward output) */
    int peer; /* pp rank of the other end */
    /* 1: this rank sends (act = the producing action), 0: receives (act = the consumer) */
    int send;
    int act;   /* index into this rank's list */
    int order; /* tie-break at equal times: successor before predecessor on even ranks */
} us__pp_msg;

static int us__pp_msg_cmp(const void *a, const void *b) {
    const us__pp_msg *x = (const us__pp_msg *)a, *y = (const us__pp_msg *)b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->grad != y->grad)
        return y->grad -
               x->grad; /* a gradient leaves its slot before the slot can be taken again */
    if (x->order != y->order) return x->order - y->order;
    return x->send - y->send;
}

/* The clock plan: this rank's messages with their agreed times, in exchange order. */
static us_result us__pp_plan_clock(us_model *m) {
    const us_pp_schedule *s = m->pp_sched;
    int P = s->pp, S = P * s->v, M = s->m, q = m->mesh.pp_rank, nmax = 0, r, i, k, nm = 0;
    double *start = NULL;
    int *where = NULL;
    us_pp_sim sim;
    char e2[200];
    us_result res = US_ERR_OOM;
    for (r = 0; r < P; r++)
        if (s->n[r] > nmax) nmax = s->n[r];
    start = (double *)US_MALLOC(sizeof(double) * (size_t)(P * nmax));
    where = (int *)US_MALLOC(sizeof(int) * (size_t)(2 * S * M)); /* [F|B][pos][mb] → r·nmax + i */
    m->pp_msgs = (us__pp_msg *)US_MALLOC(sizeof(us__pp_msg) * (size_t)(2 * s->n[q] + 1));
    m->pp_start = (double *)US_MALLOC(sizeof(double) * (size_t)(s->n[q] + 1));
    if (!start || !where || !m->pp_msgs || !m->pp_start) {
        us__model_set_error(m, "out of host memory");
        goto done;
    }
    if (us__pp_play(s, 1, 1, 1, &sim, start, nmax, e2, sizeof e2) != US_OK) {
        us__model_set_error(m, "pipeline schedule: %s", e2);
        res = US_ERR_INVALID;
        goto done;
    }
    for (i = 0; i < 2 * S * M; i++) where[i] = -1;
    for (r = 0; r < P; r++)
        for (i = 0; i < s->n[r]; i++) {
            const us_pp_action *x = &s->a[r][i];
            if (x->op != US_PP_W)
                where[(x->op != US_PP_F) * S * M + us__pp_pos(s, r, x->chunk) * M + x->mb] =
                    r * nmax + i;
        }
    for (k = 0; k < 2 * S * M; k++) { /* every message that leaves or reaches this rank */
        int grad = k >= S * M, st = k / M % S, mb = k % M, prod = where[k], cons, ra, rb;
        us__pp_msg *x = &m->pp_msgs[nm];
        if (prod < 0 || (!grad && us__pp_pos_last(s, st)) || (grad && us__pp_pos_first(s, st)))
            continue;
        cons = where[grad * S * M + (grad ? st - 1 : st + 1) * M + mb];
        ra = prod / nmax;
        rb = cons / nmax;
        if (ra == rb || (ra != q && rb != q)) continue; /* handed over on one rank, or not ours */
        x->grad = grad;
        x->send = ra == q;
        x->peer = x->send ? rb : ra;
        x->act = (x->send ? prod : cons) % nmax;
        x->t = grad ? start[prod] + us__pp_cost(&s->a[ra][prod % nmax], 1, 1, 1) : start[cons];
        x->order = (x->peer == (q + 1) % P) == (q % 2 == 0) ? 0 : 1;
        nm++;
    }
    qsort(m->pp_msgs, (size_t)nm, sizeof(us__pp_msg), us__pp_msg_cmp);
    m->pp_nmsg = nm;
    for (i = 0; i < s->n[q]; i++) m->pp_start[i] = start[q * nmax + i];
    res = US_OK;
done:
    US_FREE(start);
    US_FREE(where);
    return res;
}

/* One call the channel plan may post ahead of need: an activation's send or a gradient's
   receive, both made by the rank of a boundary's earlier stage (us__pp_plan_posts). */
typedef struct us__pp_call {
    int r;  /* its rank */
    int ch; /* its channel (us__pp_channel) */
    int k;  /* its place in the channel's order */
    int f;  /* the forward it belongs to (index into rank r's list) */
    int u;  /* that micro-batch chunk's backward (B or BW) on rank r: posted before it */
    int t;  /* posted after rank r's action t */
} us__pp_call;

static int us__pp_call_cmp(const void *a, const void *b) { /* by rank, then in posting order */
    const us__pp_call *x = (const us__pp_call *)a, *y = (const us__pp_call *)b;
    if (x->r != y->r) return x->r - y->r;
    if (x->t != y->t) return x->t - y->t;
    if (x->ch != y->ch) return x->ch - y->ch;
    return x->k - y->k;
}

static int us__pp_call_chan_cmp(const void *a, const void *b) { /* by channel, in its order */
    const us__pp_call *x = (const us__pp_call *)a, *y = (const us__pp_call *)b;
    return x->ch != y->ch ? x->ch - y->ch : x->k - y->k;
}

/* The state of a play of the channel plan (us__pp_play_posts). */
typedef struct us__pp_posts {
    const us_pp_schedule *s;
    us__pp_call *calls; /* sorted by us__pp_call_cmp */
    int ncall;
    int *side;  /* [2·channel + 0|1] the rank that sends | receives on it, -1: not a channel */
    int *cnt;   /* [2·channel + 0|1] calls its sender | receiver has posted */
    int *next;  /* [rank] its next action (n: the step's end; n + 1: done) */
    int *pre;   /* [rank] 1: the next action's input receive is posted */
    int *first; /* [rank] its first call in calls not yet posted */
} us__pp_posts;

/* Whether rank r's calls have all completed: sends are received (rendezvous), receives sent. */
static int us__pp_posts_idle(const us__pp_posts *p, int r) {
    int c, nc = 2 * (p->s->pp * p->s->v);
    for (c = 0; c < 2 * nc; c++)
        if (p->side[c] == r && p->cnt[c] > p->cnt[c ^ 1]) return 0;
    return 1;
}

/* Rank r takes its next step if it can: posts its forward's input receive, passes the device
   synchronisation before an action (or the step's end), or runs the action and posts what
   follows it (a backward's gradient send, then the plan's calls after it). 1: it moved. */
static int us__pp_posts_step(us__pp_posts *p, int r) {
    const us_pp_schedule *s = p->s;
    int i = p->next[r], st;
    const us_pp_action *x;
    if (i > s->n[r]) return 0;
    if (i == s->n[r] || p->pre[r]) {
        if (!us__pp_posts_idle(p, r)) return 0;
        p->pre[r] = 0;
        if (i == s->n[r]) {
            p->next[r]++;
            return 1;
        }
        x = &s->a[r][i];
        st = us__pp_pos(s, r, x->chunk);
        if (x->op != US_PP_F && x->op != US_PP_W && !us__pp_pos_first(s, st) &&
            us__pp_rank_of(s, st - 1) != r)
            p->cnt[2 * us__pp_channel(st - 1, 1)]++; /* its input's gradient, sent */
        for (;
             p->first[r] < p->ncall && p->calls[p->first[r]].r == r && p->calls[p->first[r]].t == i;
             p->first[r]++) {
            const us__pp_call *y = &p->calls[p->first[r]];
            p->cnt[2 * y->ch + (y->ch & 1)]++; /* an activation sent or a gradient's receive */
        }
        p->next[r]++;
        return 1;
    }
    x = &s->a[r][i];
    st = us__pp_pos(s, r, x->chunk);
    if (x->op == US_PP_F && !us__pp_pos_first(s, st) && us__pp_rank_of(s, st - 1) != r)
        p->cnt[2 * us__pp_channel(st - 1, 0) + 1]++; /* its input's receive */
    p->pre[r] = 1;
    return 1;
}

/* Plays the plan under NCCL's semantics at their strictest: every action starts with a device
   synchronisation, which waits until every call its rank has posted completed (a forward's
   input receive is posted just before it: no kernel, no wait lies between the previous action's
   posts and that receive in us__pp_forward_action). 1: every rank reaches the step's end; 0: a
   deadlock, where p->next says where each rank waits. */
static int us__pp_play_posts(us__pp_posts *p) {
    const us_pp_schedule *s = p->s;
    int r, moved = 1, done = 1, nc = 2 * (s->pp * s->v);
    for (r = 0; r < 2 * nc; r++) p->cnt[r] = 0;
    for (r = 0; r < s->pp; r++) {
        p->next[r] = 0;
        p->pre[r] = 0;
        p->first[r] = r ? p->first[r - 1] : 0;
        while (p->first[r] < p->ncall && p->calls[p->first[r]].r < r) p->first[r]++;
    }
    while (moved) {
        moved = 0;
        for (r = 0; r < s->pp; r++)
            while (us__pp_posts_step(p, r)) moved = 1;
    }
    for (r = 0; r < s->pp; r++)
        if (p->next[r] <= s->n[r]) done = 0;
    return done;
}

/* Keeps each channel's calls in its order (none posted before an earlier one), then sorts them
   by rank in posting order. 0: a call would then come after its backward (no plan so). */
static int us__pp_posts_order(us__pp_posts *p) {
    int j;
    qsort(p->calls, (size_t)p->ncall, sizeof *p->calls, us__pp_call_chan_cmp);
    for (j = 1; j < p->ncall; j++)
        if (p->calls[j].ch == p->calls[j - 1].ch && p->calls[j].t < p->calls[j - 1].t)
            p->calls[j].t = p->calls[j - 1].t;
    for (j = 0; j < p->ncall; j++)
        if (p->calls[j].t >= p->calls[j].u) return 0;
    qsort(p->calls, (size_t)p->ncall, sizeof *p->calls, us__pp_call_cmp);
    return 1;
}

/* The calls rank r posts on side sd of channel ch as soon as it passes the synchronisation it
   waits in: its forward's input receive, or its backward's gradient send and its planned calls. */
static int us__pp_posts_upcoming(const us__pp_posts *p, int r, int ch, int sd) {
    const us_pp_schedule *s = p->s;
    int i = p->next[r], j, n = 0, st;
    const us_pp_action *x;
    if (i >= s->n[r]) return 0;
    x = &s->a[r][i];
    st = us__pp_pos(s, r, x->chunk);
    if (!p->pre[r])
        return x->op == US_PP_F && !us__pp_pos_first(s, st) && us__pp_rank_of(s, st - 1) != r &&
               ch == us__pp_channel(st - 1, 0) && sd == 1;
    if (x->op != US_PP_F && x->op != US_PP_W && !us__pp_pos_first(s, st) &&
        us__pp_rank_of(s, st - 1) != r && ch == us__pp_channel(st - 1, 1) && sd == 0)
        n++;
    for (j = p->first[r]; j < p->ncall && p->calls[j].r == r && p->calls[j].t == i; j++)
        if (p->calls[j].ch == ch && (ch & 1) == sd) n++;
    return n;
}

/* After a deadlocked play, a waiting rank's posted calls that have not completed move past the
   action it waits before (unless that action needs them: their backward), in turn until one
   class has some: 0, those whose peer posts its end only after more work; else 1, gradients'
   receives whose peer posts the send as soon as its own synchronisation passes (two ranks each
   wait for the other's next call); else 2, such activations' sends. With `all`, every such call
   at once. Then every channel's calls are kept in its order. 1: something moved; 0: nothing can
   (no plan found this way). */
static int us__pp_posts_delay(us__pp_posts *p, int all) {
    const us_pp_schedule *s = p->s;
    int j, cls, moved = 0;
    for (cls = 0; cls < 3 && !moved; cls++)
        for (j = 0; j < p->ncall; j++) {
            us__pp_call *y = &p->calls[j];
            int a = p->next[y->r], o = 2 * y->ch + ((y->ch & 1) ^ 1), soon;
            if (a > s->n[y->r] || y->t >= a || a >= y->u) continue; /* not posted, or needed now */
            if (y->k < p->cnt[o]) continue;                         /* it completed */
            soon = y->k < p->cnt[o] + us__pp_posts_upcoming(p, p->side[o], y->ch, o & 1);
            if (!all && cls != (soon ? 2 - (y->ch & 1) : 0)) continue;
            y->t = a;
            moved = 1;
        }
    return moved && us__pp_posts_order(p);
}

/* When the channel plan posts its calls. A forward's input is received as the forward starts
   and a backward's input gradient is sent as it ends; the other calls may go ahead of need: an
   activation's send once its forward ran, a gradient's receive once the forward it belongs to
   ran (into that micro-batch chunk's slot). Posting them early lets a message travel while both
   ranks compute; but on a GPU a device synchronisation (the first launch of a kernel, a
   cudaFree) waits for every pending call, so a pending call whose peer needs this rank's later
   work hangs the GPU (NCCL semantics in ultrascale_comm.h), and a pending receive of a gradient
   still far away makes every such wait that long. So an activation's send starts right after
   its forward and a gradient's receive right before its backward, and the plan is played at
   NCCL's strictest, a synchronisation before every action; where the play deadlocks, some
   waiting rank's unfinished calls move past the action it waits before (us__pp_posts_delay),
   and the play runs again, to a fixpoint. A plan that plays through at the strictest plays
   through under any fewer synchronisations (each wait can only end sooner). If no plan is
   found so, the receives start right after their forward too; moving calls by classes delays
   fewer calls but can paint itself into a corner, and then every unfinished call moves (the
   three tries found a plan for every schedule at pp 2..8, m 1..24: a scratch check, not kept).
   Each channel's calls keep its order (a gradient's receives, the sender's order of
   backwards). m->pp_msgs: t = the action after which to post, act = the forward the message
   belongs to, order = its place on the channel. */
static us_result us__pp_plan_posts(us_model *m) {
    const us_pp_schedule *s = m->pp_sched;
    int P = s->pp, S = P * s->v, M = s->m, q = m->mesh.pp_rank, r, i, b, nm = 0;
    int *where, *gpos, *kact, *gcnt, all, found;
    us__pp_posts p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.calls = (us__pp_call *)US_MALLOC(sizeof(us__pp_call) * (size_t)(2 * S * M + 1));
    where = (int *)US_MALLOC(sizeof(int) * (size_t)(3 * S * M + 10 * S + 3 * P));
    m->pp_msgs = (us__pp_msg *)US_MALLOC(sizeof(us__pp_msg) * (size_t)(2 * s->n[q] + 1));
    if (!p.calls || !where || !m->pp_msgs) {
        US_FREE(p.calls);
        US_FREE(where);
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    gpos = where + 2 * S * M; /* [stage][mb] the gradient's place among its stage's backwards */
    p.side = gpos + S * M;
    p.cnt = p.side + 4 * S;
    p.next = p.cnt + 4 * S;
    p.pre = p.next + P;
    p.first = p.pre + P;
    kact = p.first + P; /* [stage] activations of the stage planned so far */
    gcnt = kact + S;    /* [stage] backwards of the stage seen so far */
    for (i = 0; i < 4 * S; i++) p.side[i] = -1;
    for (b = 0; b + 1 < S; b++) {
        int lo = us__pp_rank_of(s, b), hi = us__pp_rank_of(s, b + 1);
        if (lo == hi || us__pp_pos_last(s, b)) continue;
        p.side[2 * us__pp_channel(b, 0)] = p.side[2 * us__pp_channel(b, 1) + 1] = lo;
        p.side[2 * us__pp_channel(b, 0) + 1] = p.side[2 * us__pp_channel(b, 1)] = hi;
    }
    for (i = 0; i < S; i++) kact[i] = gcnt[i] = 0;
    for (r = 0; r < P; r++)
        for (i = 0; i < s->n[r]; i++) {
            const us_pp_action *x = &s->a[r][i];
            int st = us__pp_pos(s, r, x->chunk);
            if (x->op == US_PP_W) continue;
            where[(x->op != US_PP_F) * S * M + st * M + x->mb] = i;
            if (x->op != US_PP_F) gpos[st * M + x->mb] = gcnt[st]++;
        }
    for (r = 0; r < P; r++)
        for (i = 0; i < s->n[r]; i++) {
            const us_pp_action *x = &s->a[r][i];
            int st = us__pp_pos(s, r, x->chunk), k;
            if (x->op != US_PP_F || us__pp_pos_last(s, st) || us__pp_rank_of(s, st + 1) == r)
                continue;
            for (k = 0; k < 2; k++) { /* 0: the activation's send; 1: its gradient's receive */
                us__pp_call *y = &p.calls[p.ncall++];
                y->r = r;
                y->ch = us__pp_channel(st, k);
                y->k = k ? gpos[(st + 1) * M + x->mb] : kact[st]++;
                y->f = y->t = i;
                y->u = where[S * M + st * M + x->mb];
            }
        }
    for (all = -1, found = 0; all < 2 && !found; all++) { /* by classes; if that fails, all */
        for (i = 0; i < p.ncall; i++) /* first try: each gradient's receive just before need */
            p.calls[i].t = all < 0 && (p.calls[i].ch & 1) ? p.calls[i].u - 1 : p.calls[i].f;
        if (!us__pp_posts_order(&p)) continue;
        while (!(found = us__pp_play_posts(&p)))
            if (!us__pp_posts_delay(&p, all > 0)) break;
    }
    if (!found) {
        US_FREE(p.calls);
        US_FREE(where);
        us__model_set_error(m,
                            "pipeline schedule %s: no plan of its channel messages is free of "
                            "deadlock under NCCL's semantics (use the clock: pp_clock)",
                            us_pp_kind_name(s->kind));
        return US_ERR_INVALID;
    }
    for (i = 0; i < p.ncall; i++) {
        const us__pp_call *y = &p.calls[i];
        us__pp_msg *z = &m->pp_msgs[nm];
        if (y->r != q) continue;
        z->t = y->t;
        z->grad = y->ch & 1;
        z->send = !z->grad;
        z->peer = us__pp_rank_of(s, y->ch / 2 + 1);
        z->act = y->f;
        z->order = y->k;
        nm++;
    }
    m->pp_nmsg = nm;
    US_FREE(p.calls);
    US_FREE(where);
    return US_OK;
}

/* The channel plan needs no times; it checks that each channel's activations leave in the order
   they are received (at the receiver's forwards), and plans when gradient receives are posted. */
static us_result us__pp_plan(us_model *m) {
    const us_pp_schedule *s = m->pp_sched;
    int P = s->pp, S = P * s->v, M = s->m, b, k, r, i;
    int *seq, *got;
    if (!us__pp_early(m)) return us__pp_plan_clock(m);
    seq = (int *)US_MALLOC(sizeof(int) * (size_t)(2 * M + 2));
    if (!seq) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    got = seq + M + 1;
    for (b = 0; b + 1 < S; b++) {
        int lo = us__pp_rank_of(s, b), hi = us__pp_rank_of(s, b + 1);
        if (lo == hi || us__pp_pos_last(s, b)) continue; /* on one rank, or no boundary */
        for (k = 0; k < 1; k++) { /* activations lo → hi (gradients: us__pp_plan_posts) */
            int ns = 0, nr = 0, snd = k ? hi : lo, rcv = k ? lo : hi;
            /* the sender produces: F of stage b, or B/BW of stage b+1 */
            for (i = 0; i < s->n[snd]; i++) {
                const us_pp_action *x = &s->a[snd][i];
                if (us__pp_pos(s, snd, x->chunk) == b + k &&
                    (k ? (x->op == US_PP_B || x->op == US_PP_BW) : x->op == US_PP_F) && ns < M)
                    seq[ns++] = x->mb;
            }
            /* the receiver receives at its F of stage b+1, or posts at its F of stage b */
            for (i = 0; i < s->n[rcv]; i++) {
                const us_pp_action *x = &s->a[rcv][i];
                if (us__pp_pos(s, rcv, x->chunk) == b + 1 - k && x->op == US_PP_F && nr < M)
                    got[nr++] = x->mb;
            }
            for (r = ns == nr ? 0 : -1; r == 0 && ns > 0 && nr > 0; ns--, nr--)
                if (seq[ns - 1] != got[nr - 1]) r = -1;
            if (r) {
                us__model_set_error(m,
                                    "pipeline schedule %s: the %s between stages %d and %d leave "
                                    "in another order than they are received",
                                    us_pp_kind_name(s->kind), k ? "gradients" : "activations", b,
                                    b + 1);
                US_FREE(seq);
                return US_ERR_INVALID;
            }
        }
    }
    US_FREE(seq);
    return us__pp_plan_posts(m);
}

/* Connects the pipeline's ranks before the first step. Channels: opened (collective over the pp
   group: every rank dups for every boundary that crosses ranks, in boundary order), and one
   element sent over each, in channel order, each a blocking pair, so they cannot wait in a
   cycle. The clock: NCCL connects two ranks lazily, on the host, inside their first send or
   receive, with the peer connecting at the same time; a pipeline's first message in a direction
   can meet a lone receive on one side while the other side is inside a grouped send+receive
   (AFAB's last forward sends on and receives the first gradient): each then waits for the other
   forever. So every pair of neighbours exchanges one element both ways on the pp group; even
   stages pair with their successor first, odd ones with their predecessor, so the pairs never
   wait in a ring. */
static us_result us__pp_connect(us_model *m) {
    const us_pp_schedule *s = m->pp_sched;
    us_group *g = &m->mesh.pp_g;
    int q = m->mesh.pp_rank, S = s->pp * s->v, P = g->size, b, k;
    us_result r;
    if (!us__pp_early(m)) {
        /* interleaved: the last stage of a chunk feeds rank 0 */
        int ring = m->pp_v > 1 && !s->vshape && !s->dual;
        for (k = 0; k < 2; k++) {
            int peer = (q % 2 == 0) == (k == 0) ? q + 1 : q - 1;
            if (ring) peer = (peer + P) % P;
            if (peer < 0 || peer >= P || peer == q || (k == 1 && P == 2 && ring))
                continue; /* pp 2: one pair */
            r = m->comm->sendrecv(m->comm, g, m->a[US__A_XOUT], 1, peer, m->acts[0].x, 1, peer,
                                  m->dt, NULL);
            if ((r = us__comm_fail(m, r, "pipeline connection")) != US_OK) return r;
        }
        return US_OK;
    }
    m->pp_ch = (us_group *)calloc((size_t)(2 * S), sizeof(us_group));
    if (!m->pp_ch) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    for (b = 0; b + 1 < S; b++)
        for (k = 0; k < 2; k++) {
            int lo = us__pp_rank_of(s, b), hi = us__pp_rank_of(s, b + 1), snd = k ? hi : lo,
                rcv = k ? lo : hi;
            us_group *ch = &m->pp_ch[us__pp_channel(b, k)];
            if (lo == hi || us__pp_pos_last(s, b)) continue;
            if ((r = us__comm_fail(m, m->comm->dup(m->comm, g, ch), "pipeline channel")) != US_OK)
                return r;
            if (q == snd)
                r = m->comm->send(m->comm, ch, m->a[US__A_XOUT], 1, m->dt, rcv, NULL);
            else if (q == rcv)
                r = m->comm->recv(m->comm, ch, m->acts[0].x, 1, m->dt, snd, NULL);
            if ((r = us__comm_fail(m, r, "pipeline connection")) != US_OK) return r;
        }
    return US_OK;
}

static void us__pp_disconnect(us_model *m) {
    int i, S = m->pp_sched ? m->pp_sched->pp * m->pp_sched->v : 0;
    if (m->pp_ch && m->comm)
        for (i = 0; i < 2 * S; i++)
            if (m->pp_ch[i].size) m->comm->group_free(m->comm, &m->pp_ch[i]);
    free(m->pp_ch);
    m->pp_ch = NULL;
}

/* Waits for *w (NULL: nothing in flight) and clears it. */
static us_result us__pp_wait(us_model *m, us_work **w, const char *what) {
    us_result r = US_OK;
    if (*w) {
        r = us__comm_fail(m, m->comm->wait(m->comm, *w), what);
        *w = NULL;
    }
    return r;
}

/* A slot is written again only after its sends completed: pend[2·slot] its activation's,
   pend[2·slot + 1] its gradient's. */
static us_result us__pp_settle(us_model *m, us_work **pend, int slot) {
    us_result r = us__pp_wait(m, &pend[2 * slot], "pipeline send");
    return r != US_OK ? r : us__pp_wait(m, &pend[2 * slot + 1], "pipeline send");
}

static us_result us__pp_pop_slot(us_model *m, int *free_slot, int *nfree, int *slot) {
    if (!*nfree) {
        us__model_set_error(m, "internal: pipeline slots exhausted");
        return US_ERR_BACKEND;
    }
    *slot = free_slot[--*nfree];
    if (m->slots - *nfree > m->pp_peak) m->pp_peak = m->slots - *nfree;
    return US_OK;
}

static us_result us__pp_take_slot(us_model *m, us_work **pend, int *free_slot, int *nfree,
                                  int *slot) {
    us_result r = us__pp_pop_slot(m, free_slot, nfree, slot);
    return r != US_OK ? r : us__pp_settle(m, pend, *slot);
}

/* The clock plan's exchanges timed at or before `until`, from *e on. Sends read the producer's
   slot and are not waited for (pend); a received activation takes a free slot (the consumer's),
   a received gradient lands in the consumer's slot; receives are waited for. */
static us_result us__pp_exchange(us_model *m, int *e, double until, int *slot_of, int *free_slot,
                                 int *nfree, us_work **pend, int64_t n) {
    const us_pp_schedule *s = m->pp_sched;
    int q = m->mesh.pp_rank, M = s->m, sslot = -1;
    us_comm *c = m->comm;
    while (*e < m->pp_nmsg && m->pp_msgs[*e].t <= until) {
        const us__pp_msg *x = &m->pp_msgs[*e], *snd = NULL, *rcv = NULL;
        const void *sbuf = NULL;
        void *rbuf = NULL;
        us_result r;
        int j;
        for (j = *e; j < m->pp_nmsg && m->pp_msgs[j].t == x->t && m->pp_msgs[j].grad == x->grad &&
                     m->pp_msgs[j].peer == x->peer;
             j++) {
            if (m->pp_msgs[j].send)
                snd = &m->pp_msgs[j];
            else
                rcv = &m->pp_msgs[j];
        }
        *e = j;
        if (snd) {
            const us_pp_action *y = &s->a[q][snd->act];
            sslot = slot_of[y->chunk * M + y->mb];
            sbuf = m->slot_a[sslot][x->grad ? US__A_DRES : US__A_XOUT];
        }
        if (rcv) {
            const us_pp_action *y = &s->a[q][rcv->act];
            int key = y->chunk * M + y->mb;
            if (!x->grad) { /* the consumer forward's slot, taken now */
                if ((r = us__pp_take_slot(m, pend, free_slot, nfree, &slot_of[key])) != US_OK)
                    return r;
                rbuf = m->slot_acts[(size_t)slot_of[key] * m->pp_lc]
                           .x; /* the chunk's first layer input */
            } else
                rbuf = m->slot_a[slot_of[key]][US__A_DRES];
        }
        if (sbuf && rbuf)
            r = us__comm_fail(
                m, c->sendrecv(c, &m->mesh.pp_g, sbuf, n, x->peer, rbuf, n, x->peer, m->dt, NULL),
                "pipeline exchange");
        else if (sbuf) {
            if ((r = us__pp_settle(m, pend, sslot)) != US_OK)
                return r; /* at most one of each kind per slot */
            r = us__comm_fail(
                m, c->send(c, &m->mesh.pp_g, sbuf, n, m->dt, x->peer, &pend[2 * sslot + x->grad]),
                "pipeline send");
        } else
            r = us__comm_fail(m, c->recv(c, &m->mesh.pp_g, rbuf, n, m->dt, x->peer, NULL),
                              "pipeline receive");
        if (r != US_OK) return r;
    }
    return US_OK;
}

/* The executor's state over one step: the micro-batches, the slots, the transfers in flight. */
typedef struct us__pp_exec {
    const int32_t *inputs, *targets; /* [M][per] tokens of the step's micro-batches */
    int64_t per, n;                  /* tokens per micro-batch; elements of a message */
    size_t nb;                       /* bytes of a message: [Ns, C] of the residual stream */
    int B, T;
    float dscale;
    double *loss;
    int *slot_of;   /* [chunk·M + mb] the slot holding a micro-batch chunk, -1 none */
    int *free_slot; /* [slots] the free slots, a stack of nfree */
    int nfree;
    us_work **pend;  /* [2·slots] each slot's activation and gradient sends in flight */
    us_work **precv; /* channels: [chunk·M + mb] the gradient receive (us__pp_post) */
    int chan;        /* 1: channels, 0: the clock plan */
} us__pp_exec;

/* A forward action: its slot (unless its input arrived into one, the clock plan), its input from
   this rank's earlier stage or over a channel, the forward; on channels its output leaves, and
   its gradient's receive is posted, when us__pp_post says. */
static us_result us__pp_forward_action(us_model *m, us__pp_exec *x, const us_pp_action *a, int st,
                                       int prev) {
    const us_pp_schedule *s = m->pp_sched;
    int q = m->mesh.pp_rank, M = s->m, key = a->chunk * M + a->mb;
    us_comm *c = m->comm;
    double ls = 0, t0;
    us_result r;
    if (x->slot_of[key] < 0 &&
        (r = us__pp_pop_slot(m, x->free_slot, &x->nfree, &x->slot_of[key])) != US_OK)
        return r;
    us__pp_select(m, x->slot_of[key], a->chunk);
    /* channels: the input's receive comes before the slot's sends are settled (which reads
       other buffers), so no wait of this rank lies between its last action and the receive, as
       us__pp_plan_posts assumes */
    if (x->chan && prev >= 0 && prev != q &&
        (r = us__comm_fail(m,
                           c->recv(c, &m->pp_ch[us__pp_channel(st - 1, 0)], m->acts[m->l_lo].x,
                                   x->n, m->dt, prev, NULL),
                           "pipeline receive")) != US_OK)
        return r;
    if ((r = us__pp_settle(m, x->pend, x->slot_of[key])) != US_OK) return r;
    if (prev == q) /* the stage before is this rank's: its output */
        m->ops.copy(&m->ops, m->acts[m->l_lo].x,
                    m->slot_a[x->slot_of[us__pp_chunk_of(s, q, st - 1) * M + a->mb]][US__A_XOUT],
                    x->nb, US_COPY_D2D);
    t0 = us_trace_now_us();
    r = us__forward(m, x->inputs + a->mb * x->per, x->targets + a->mb * x->per, x->B, x->T,
                    x->dscale, &ls);
    us__zero3_release_all(m); /* ZeRO-3: the weights it gathered, given back (us__zero3_next) */
    if (r != US_OK) return r;
    m->pp_t_s[0] += 1e-6 * (us_trace_now_us() - t0);
    *x->loss += ls;
    return r;
}

/* Channels: the calls planned after action i (us__pp_plan_posts), from *e on: an activation's
   send from its forward's slot, a gradient's receive into it. */
static us_result us__pp_post(us_model *m, us__pp_exec *x, int *e, int i) {
    const us_pp_schedule *s = m->pp_sched;
    int q = m->mesh.pp_rank, M = s->m;
    us_comm *c = m->comm;
    for (; *e < m->pp_nmsg && m->pp_msgs[*e].t <= i; ++*e) {
        const us__pp_msg *y = &m->pp_msgs[*e];
        const us_pp_action *f = &s->a[q][y->act];
        int key = f->chunk * M + f->mb, st = us__pp_pos(s, q, f->chunk), k = x->slot_of[key];
        us_group *ch = &m->pp_ch[us__pp_channel(st, y->grad)];
        us_result r;
        if (y->send)
            r = c->send(c, ch, m->slot_a[k][US__A_XOUT], x->n, m->dt, y->peer, &x->pend[2 * k]);
        else
            r = c->recv(c, ch, m->slot_a[k][US__A_DRES], x->n, m->dt, y->peer, &x->precv[key]);
        if ((r = us__comm_fail(m, r, y->send ? "pipeline send" : "pipeline receive")) != US_OK)
            return r;
    }
    return US_OK;
}

/* A backward action, B or BW: waits for its output's gradient (channels), runs the backward
   (reducing over dp when sync), and hands its input's gradient to this rank's earlier stage or
   sends it back; a BW frees the slot. */
static us_result us__pp_backward_action(us_model *m, us__pp_exec *x, const us_pp_action *a, int st,
                                        int prev, int sync) {
    const us_pp_schedule *s = m->pp_sched;
    int q = m->mesh.pp_rank, M = s->m, key = a->chunk * M + a->mb, k = x->slot_of[key];
    us_comm *c = m->comm;
    double t0;
    us_result r;
    us__pp_select(m, k, a->chunk);
    if ((r = us__pp_wait(m, &x->precv[key], "pipeline receive")) != US_OK) return r;
    m->grad_sync = sync;
    m->pp_bonly = a->op == US_PP_B;
    t0 = us_trace_now_us();
    r = us__backward(m, x->B, x->T);
    m->pp_bonly = 0;
    if (r != US_OK) return r;
    m->pp_t_s[1] += 1e-6 * (us_trace_now_us() - t0);
    if (prev == q) /* hand the input's gradient to this rank's earlier stage */
        m->ops.copy(&m->ops,
                    m->slot_a[x->slot_of[us__pp_chunk_of(s, q, st - 1) * M + a->mb]][US__A_DRES],
                    m->a[US__A_DRES], x->nb, US_COPY_D2D);
    else if (x->chan && prev >= 0 &&
             (r = us__comm_fail(m,
                                c->send(c, &m->pp_ch[us__pp_channel(st - 1, 1)], m->a[US__A_DRES],
                                        x->n, m->dt, prev, &x->pend[2 * k + 1]),
                                "pipeline send")) != US_OK)
        return r;
    if (a->op == US_PP_BW)
        x->free_slot[x->nfree++] = k; /* its gradient, if sent, leaves before the slot is reused */
    return US_OK;
}

/* The pipeline executor: runs this rank's list of the schedule, one chunk of layers per
   action. A forward takes an activation slot and receives its input from the stage before, or
   copies it from this rank's slot of that stage, or embeds the tokens; it sends its output on
   (or computes the loss) and, on channels, posts the receive of the gradient that will come
   back for it. A backward waits for that gradient (or starts from the loss) and sends its
   input's gradient back, or hands it to this rank's earlier stage. Under the clock plan the
   sends and receives happen between actions instead, as us__pp_plan_clock timed them. A full
   backward (BW) frees the slot; under the zero-bubble schedules B does the input gradients only
   and W, later, the weight gradients (us__layer_w), then frees it. The last backward of the
   step launches the data-parallel reductions (no_sync before it); with several chunks or B and
   W apart a tensor's gradient is complete only at the end, so the reductions start before the
   optimizer step instead.
   DualPipe(-V)'s F&B pairs run here one after the other: correct, and on CPU threads as fast
   as it gets, but nothing is hidden. Running a pair overlapped, as DeepSeek does, would need:
   the two halves on two streams (CUDA) joined by events at the pair's end, or DeepSeek's finer
   cut, each chunk split into attention, MoE dispatch, MLP and combine, interleaved so one
   micro-batch's all-to-all and pipeline transfer travel under the other's GEMMs, with a few
   SMs set aside for the communication kernels (tc.overlap_sms); the scratch the slots share
   (us__scratch_per_slot's complement: the backward's gradients, recompute, FP8 operands, CP's
   blocks, ZeRO-3's weight slots) doubled, since both halves use it at once; the pair's
   messages posted as one synchronisation, the forward's input and the backward's output
   gradient received before it and both outputs sent after (as us__pp_play assumes), which the
   channel plan (us__pp_plan_posts) would play with the pair as one action; under expert
   parallelism the all-to-alls made asynchronous (us_comm's work handles) and waited inside the
   other half's layer loop. The simulator already costs a pair as the sum of its halves: the
   overlap buys hidden communication, not compute. */
static us_result us__pp_run(us_model *m, const int32_t *inputs, const int32_t *targets, int64_t per,
                            int T, float dscale, double *loss) {
    const us_pp_schedule *s = m->pp_sched;
    int q = m->mesh.pp_rank, i, e = 0, last_bw = -1, M = s->m;
    int64_t Np, Ns;
    double t_begin = us_trace_now_us();
    us_result r = US_OK;
    us__pp_exec x;
    memset(&x, 0, sizeof x);
    x.inputs = inputs;
    x.targets = targets;
    x.per = per;
    x.B = m->tc.batch;
    x.T = T;
    x.dscale = dscale;
    x.loss = loss;
    x.chan = m->pp_ch != NULL;
    us__sp_rows(m, (int64_t)x.B * T, &Np, &Ns);
    x.n = Ns * m->cfg.dim; /* the residual stream between stages: this rank's rows under SP */
    x.nb = (size_t)x.n * us_dtype_size(m->dt);
    x.slot_of = (int *)US_MALLOC(sizeof(int) * (size_t)(M * s->v + m->slots));
    x.pend = (us_work **)calloc((size_t)(2 * m->slots + M * s->v), sizeof(us_work *));
    if (!x.slot_of || !x.pend) {
        US_FREE(x.slot_of);
        free(x.pend);
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    x.precv = x.pend + 2 * m->slots;
    x.free_slot = x.slot_of + M * s->v;
    for (i = 0; i < m->slots; i++) x.free_slot[x.nfree++] = m->slots - 1 - i;
    for (i = 0; i < M * s->v; i++) x.slot_of[i] = -1;
    if (!m->pp_wsplit && s->v == 1)
        for (i = 0; i < s->n[q]; i++)
            if (s->a[q][i].op != US_PP_F) last_bw = i;
    m->pp_t_s[0] = m->pp_t_s[1] = m->pp_t_s[2] = 0;
    for (i = 0; i < s->n[q] && r == US_OK; i++) {
        const us_pp_action *a = &s->a[q][i];
        int st = us__pp_pos(s, q, a->chunk), key = a->chunk * M + a->mb;
        int prev = !us__pp_pos_first(s, st) ? us__pp_rank_of(s, st - 1) : -1;
        double t0;
        if (!x.chan && (r = us__pp_exchange(m, &e, m->pp_start[i], x.slot_of, x.free_slot, &x.nfree,
                                            x.pend, x.n)) != US_OK)
            break;
        if (a->op == US_PP_F)
            r = us__pp_forward_action(m, &x, a, st, prev);
        else if (a->op == US_PP_W) {
            us__pp_select(m, x.slot_of[key], a->chunk);
            t0 = us_trace_now_us();
            if ((r = us__pp_wpass(m, x.B, T)) != US_OK) break;
            m->pp_t_s[2] += 1e-6 * (us_trace_now_us() - t0);
            x.free_slot[x.nfree++] = x.slot_of[key];
        } else
            r = us__pp_backward_action(m, &x, a, st, prev, i == last_bw);
        if (r == US_OK && x.chan) r = us__pp_post(m, &x, &e, i);
    }
    if (r == US_OK && !x.chan) /* the last gradients out */
        r = us__pp_exchange(m, &e, INFINITY, x.slot_of, x.free_slot, &x.nfree, x.pend, x.n);
    /* every transfer complete (after a failure too: none outlives its buffer) */
    for (i = 0; i < 2 * m->slots + M * s->v; i++) {
        us_result r2 = us__pp_wait(m, &x.pend[i], "pipeline exchange");
        if (r == US_OK) r = r2;
    }
    free(x.pend);
    m->grad_sync = 0;
    m->pp_wall_s = 1e-6 * (us_trace_now_us() - t_begin);
    us__pp_select_all(m);
    US_FREE(x.slot_of);
    return r;
}

/* The evaluation forward through the stages (us_forward_eval under pipeline parallelism): each
   rank runs its chunks in stage order, passing the residual stream on; the last stage scores,
   and the sums (and the last-position logits, for sampling) reach every stage. DualPipe's
   batch takes the pipeline fed at rank 0 alone (its other one holds the same weights). */
static us_result us__pp_eval(us_model *m, const int32_t *inputs, const int32_t *targets, int B,
                             int T, double *loss_sum, int64_t *correct, float *logits_out) {
    us_ops *o = &m->ops;
    int64_t N = (int64_t)B * T, i;
    double ls = 0;
    us_result r;
    us_comm *c = m->comm;
    int q = m->mesh.pp_rank;
    int64_t Np, Ns, n;
    double v[2] = {0, 0};
    const us_pp_schedule *s = m->pp_sched;
    int k, head = q == m->pp_head_rank;
    us__sp_rows(m, N, &Np, &Ns);
    n = Ns * m->cfg.dim;
    r = US_OK;
    for (k = 0; k < s->v && r == US_OK; k++) { /* this rank's chunks in stage order */
        int st = us__pp_pos(s, q, k);          /* chunk order is stage order, V shape too */
        double l1 = 0;
        if (s->dual && st >= s->pp) continue; /* the pipeline fed at rank pp−1 */
        us__pp_select(m, 0,
                      k); /* one slot for every chunk in turn: XOUT carries over to the next */
        if (!us__pp_pos_first(s, st) && us__pp_rank_of(s, st - 1) != q)
            r = us__comm_fail(m,
                              c->recv(c, &m->mesh.pp_g, m->acts[m->l_lo].x, n, m->dt,
                                      us__pp_rank_of(s, st - 1), NULL),
                              "pipeline receive");
        else if (!us__pp_pos_first(s, st)) /* the stage before is this rank's: still in XOUT */
            o->copy(o, m->acts[m->l_lo].x, m->a[US__A_XOUT], (size_t)n * us_dtype_size(m->dt),
                    US_COPY_D2D);
        if (r == US_OK) r = us__forward(m, inputs, targets, B, T, 0.0f, &l1);
        us__zero3_release_all(m); /* ZeRO-3: each chunk gathers its own */
        ls += l1;
        if (r == US_OK && !us__pp_pos_last(s, st) && us__pp_rank_of(s, st + 1) != q)
            r = us__comm_fail(m,
                              c->send(c, &m->mesh.pp_g, m->a[US__A_XOUT], n, m->dt,
                                      us__pp_rank_of(s, st + 1), NULL),
                              "pipeline send");
    }
    us__pp_select_all(m);
    if (r != US_OK) return r;
    if (head) {
        int32_t *am = (int32_t *)US_MALLOC((size_t)N * 4);
        if (!am) {
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        o->copy(o, am, m->a[US__A_ARGMAX], (size_t)N * 4, US_COPY_D2H);
        for (i = 0; i < N; i++) v[1] += targets[i] >= 0 && am[i] == targets[i];
        US_FREE(am);
        v[0] = ls;
    }
    if (r != US_OK || (r = us__group_sum(m, &m->mesh.pp_g, v, 2)) != US_OK) return r;
    if (loss_sum) *loss_sum = v[0];
    if (correct) *correct = (int64_t)v[1];
    /* the last stage's last-position logits, broadcast to every stage (for sampling) */
    if (logits_out) {
        size_t bytes = (size_t)B * m->cfg.vocab * 4;
        void *d = o->alloc(o, bytes);
        if (!d) {
            us__model_set_error(m, "out of memory for %zu bytes of logits", bytes);
            return US_ERR_OOM;
        }
        if (head && (r = us__last_logits(m, B, T, logits_out)) != US_OK) {
            o->free(o, d);
            return r;
        }
        if (head) o->copy(o, d, logits_out, bytes, US_COPY_H2D);
        r = us__comm_fail(
            m, c->broadcast(c, &m->mesh.pp_g, d, B * m->cfg.vocab, US_F32, m->pp_head_rank, NULL),
            "pipeline logits broadcast");
        if (r == US_OK && !head) o->copy(o, logits_out, d, bytes, US_COPY_D2H);
        o->free(o, d);
        return r;
    }
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>moe  mixture of experts: route, permute, experts, combine (one rank)
/* ------------------------------------------------------------------------------------ */
/* A MoE layer (Shazeer et al.; Mixtral; DeepSeek-V3) replaces the dense MLP: a router picks K of
   E SwiGLU experts per token, and the token's output is the gate-weighted sum of theirs (plus,
   optionally, a shared expert every token uses). Per layer, with u = ln2(xmid):
       route    logits[N,E] = u·Wr^T;  probs = softmax | sigmoid;  topk = K best of probs + bias
       permute  counting sort of the N·K choices by expert: rows [R] grouped per expert
       experts  for each expert e, its rows: y_e = swiglu(x_e·Wgu_e^T)·Wd_e^T   (two GEMMs)
       combine  x_{l+1} = xmid + shared(u) + Σ_k gate[n,k]·y[row of (n,k)]
   Only K experts run per token, so compute follows the active parameters while memory holds all
   E. Expert parallelism (// >>ep) puts an all-to-all between permute and experts (each expert's
   rows to the rank holding it, the counts first) and another before combine; a rank then runs
   its E/ep experts on the rows it received.
   Load balancing. Left alone, a router collapses onto a few experts. The classic remedy is an
   auxiliary loss α·Σ_e f_e·P_e (f_e = E/(K·N)·tokens routed to e, P_e = mean normalised
   probability of e), which pulls the router toward uniform at some cost in quality. DeepSeek-V3
   instead adds a bias b_e to the scores used for *selection only* and, after each step, moves it
   by b_e += γ·sign(mean load − load_e): no gradient interferes with the language-model loss.
   Capacity. With a capacity factor cf each expert takes at most ceil(cf·N·K/E) tokens of a
   micro-batch, in token order; a dropped choice contributes nothing (its token keeps the
   residual and its other experts). cf = 0, the default, drops nothing.
   Group-limited routing (DeepSeek-V3's node limit): the E experts form G groups, a token first
   keeps its M best groups, then picks its K experts inside them.
   Parallel layouts. Routing is per token, so data and context parallelism only need sums: each
   rank routes its own tokens (under cp its slice of every sequence), the gradients are summed
   over dp×cp (// >>dp), and the bias rule and the statistics use loads summed over dp×cp
   (us__moe_step_end). Two things are statistics of a whole micro-batch: the auxiliary loss's
   f_e, whose counts are summed over cp (us__moe_batch_counts), each cp rank adding its own
   tokens' part of P_e; and the capacity limit, which keeps an expert's first tokens in token
   order and is refused where cp or sp spread a micro-batch over ranks.
   Pipeline parallelism (// >>pp) splits the layers, MoE or dense, over the stages: a stage runs
   its own layers' routers and experts and keeps their biases, moved by their own loads; its ep
   group stays inside it (ep folds over dp×cp, which a stage's ranks form). With several
   micro-batches in flight the host routing counts a backward reads are per activation slot
   (us__moe_cnt); the statistics of the step are summed over the stages (us__moe_pp_stats); the
   zero-bubble schedules' W forms the layer's weight gradients (us__moe_w). */

/* Checks the MoE layer's settings and what it does not combine with (us_config_validate): the
   capacity limit under cp or sp. Every other parallelism, pp included, takes MoE layers. */
static us_result us__moe_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                                size_t errlen) {
    if (tc->moe_force_balance != 0 && tc->moe_force_balance != 1)
        US__BAD("moe_force_balance=%d must be 0 or 1", tc->moe_force_balance);
    if (tc->moe_force_balance && !mc->moe_experts)
        US__BAD("moe_force_balance needs experts (a MoE model)");
    if (mc->moe_experts < 0 || mc->moe_experts > 1024)
        US__BAD("experts=%d must be in 0..1024", mc->moe_experts);
    if (!mc->moe_experts &&
        (mc->moe_top_k || mc->moe_first_dense || mc->moe_every || mc->moe_ffn_dim ||
         mc->moe_shared || mc->moe_gate || mc->moe_balance || mc->moe_bias_rate != 0 ||
         mc->moe_aux_coef != 0 || mc->moe_capacity != 0 || mc->moe_groups || mc->moe_top_groups))
        US__BAD("the MoE settings (top-k, shared expert, gating, balancing, capacity, groups, ...) "
                "need experts > 0");
    if (mc->moe_experts) {
        int E = mc->moe_experts, G = mc->moe_groups;
        if (mc->moe_top_k < 1 || mc->moe_top_k > E)
            US__BAD("moe top-k=%d must be in 1..experts=%d", mc->moe_top_k, E);
        if (mc->moe_first_dense < 0 || mc->moe_first_dense >= mc->n_layers)
            US__BAD("moe first-dense=%d must leave a MoE layer among layers=%d",
                    mc->moe_first_dense, mc->n_layers);
        if (mc->moe_every < 1) US__BAD("moe every=%d must be at least 1", mc->moe_every);
        if (mc->moe_ffn_dim < 1)
            US__BAD("moe ffn=%lld must be at least 1", (long long)mc->moe_ffn_dim);
        if (mc->moe_shared != 0 && mc->moe_shared != 1)
            US__BAD("moe shared=%d must be 0 or 1", mc->moe_shared);
        if (mc->moe_gate != US_MOE_SOFTMAX && mc->moe_gate != US_MOE_SIGMOID)
            US__BAD("unknown moe gate %d", (int)mc->moe_gate);
        if (mc->moe_balance < US_MOE_BALANCE_BIAS || mc->moe_balance > US_MOE_BALANCE_NONE)
            US__BAD("unknown moe balance mode %d", (int)mc->moe_balance);
        if (!(mc->moe_bias_rate >= 0) || !isfinite(mc->moe_bias_rate))
            US__BAD("moe bias rate=%g must be a number >= 0", mc->moe_bias_rate);
        if (!(mc->moe_aux_coef >= 0) || !isfinite(mc->moe_aux_coef))
            US__BAD("moe aux coefficient=%g must be a number >= 0", mc->moe_aux_coef);
        if (!(mc->moe_capacity >= 0) || !isfinite(mc->moe_capacity))
            US__BAD("capacity factor=%g must be a number >= 0 (0 = no dropping)", mc->moe_capacity);
        if (G < 1 || G > 64 || E % G)
            US__BAD("moe groups=%d must divide experts=%d and be in 1..64", G, E);
        if (mc->moe_top_groups < 1 || mc->moe_top_groups > G)
            US__BAD("moe top-groups=%d must be in 1..groups=%d", mc->moe_top_groups, G);
        if (mc->moe_top_k > mc->moe_top_groups * (E / G))
            US__BAD("top-k=%d experts do not fit in top-groups=%d groups of %d experts",
                    mc->moe_top_k, mc->moe_top_groups, E / G);
        if (mc->moe_capacity > 0 && (tc->cp > 1 || (tc->sp && tc->tp > 1)))
            US__BAD("a capacity limit keeps each expert's first tokens of a micro-batch, which cp "
                    "and sp spread over several ranks: drop the capacity factor under cp=%d / sp",
                    tc->cp);
    }
    return US_OK;
}

struct us__moe_grads { /* the backward's scratch, one action's (m->a[US__A_MOE]) */
    void *dye;         /* [R,C]   ∂ expert outputs */
    void *dxe;         /* [R,C]   ∂ expert inputs */
    void *dh;          /* [max(R,N·shared),Fe]   ∂ SwiGLU outputs (routed, then shared) */
    void *dgu;         /* [max(R,N·shared),2Fe]  ∂ gate | up */
    void *dlg;         /* [N,E]   ∂ logits in dt, for the router's GEMMs */
    float *dgates;     /* [N,K]   */
    float *dlogits;    /* [N,E]   */
    float *vec;   /* [E]     the auxiliary loss's Σ_n p' (forward), its coefficients (backward) */
    void *ept;    /* [Rx,C]  ep > 1: the all-to-all's rows in transit, by source rank (// >>ep) */
    int32_t *epc; /* [ep,E]  ep > 1: every ep peer's kept tokens per expert */
    double *sum; /* [MoE layers·E + 3] dp·cp > 1: the step's routing counts, summed over dp×cp */
    void *dresf; /* [Np,C]  sp: the tp group's residual gradient, gathered (us__moe_bwd) */
};

/* Tokens a MoE layer routes per micro-batch on this rank: cp splits every sequence, so
   batch·seq/cp; sequence parallelism gathers the tp group's tokens back before the layer
   (us__moe_fwd), so it does not divide them. */
static int64_t us__moe_tokens(const us_model *m) {
    return (int64_t)m->tc.batch * (m->tc.seq / (m->tc.cp > 1 ? m->tc.cp : 1));
}

/* an expert takes at most cap tokens of a micro-batch of N (0: no limit); R rows hold them all */
static int64_t us__moe_cap(const us_model_config *c, int64_t N) {
    return c->moe_capacity > 0
               ? (int64_t)ceil((double)c->moe_capacity * (double)N * c->moe_top_k / c->moe_experts)
               : 0;
}

static int64_t us__moe_rows(const us_model_config *c, int64_t N) {
    int64_t cap = us__moe_cap(c, N), nk = N * c->moe_top_k;
    return cap > 0 && cap * c->moe_experts < nk ? cap * c->moe_experts : nk;
}

/* Rows a rank's experts may run on (// >>ep): its own R on one rank; under expert parallelism
   every peer may send it all its rows, ep·R, unless a capacity limit bounds each of its E/ep
   experts to cap rows per peer: then ep·min(R, E/ep·cap) ≈ cf·N·K, whatever ep is. */
static int64_t us__moe_rx(const us_model_config *c, const us_train_config *tc, int64_t N) {
    int64_t ep = us__ep_size(tc), R = us__moe_rows(c, N), cap = us__moe_cap(c, N),
            lim = cap * (c->moe_experts / ep);
    return ep * (cap > 0 && lim < R ? lim : R);
}

/* Bytes of one MoE layer's activations (us__moe_take's order) and of the backward's scratch
   (us__moe_scratch's): the estimator uses the same pieces. Under expert parallelism the rows a
   rank's experts run on (xe, gate|up, SwiGLU and their gradients) are sized for the worst case,
   Rx (us__moe_rx), plus a transit buffer of Rx rows and the count table (// >>ep); n_moe MoE
   layers' routing counts are summed over dp×cp in a small scratch; under sequence parallelism the
   backward gathers the residual gradient, [Np, C]. */
static void us__moe_bytes(const us_model_config *c, const us_train_config *tc, int n_moe, int64_t N,
                          size_t a, size_t *gemm, size_t *cheap, size_t *scratch) {
    int64_t E = c->moe_experts, K = c->moe_top_k, Fe = c->moe_ffn_dim, R = us__moe_rows(c, N),
            C = c->dim, S = c->moe_shared;
    int64_t ep = us__ep_size(tc), Rx = us__moe_rx(c, tc, N), hN = Rx > N * S ? Rx : N * S,
            nsum = tc->dp * tc->cp > 1 ? (int64_t)n_moe * E + 3 : 0;
    int64_t Np = tc->sp && tc->tp > 1 ? (N + tc->tp - 1) / tc->tp * tc->tp : 0; /* SP: gathered */
    *gemm = us__align(N * E * 4) + us__align(Rx * 2 * Fe * a) + us__align(R * C * a) +
            (S ? us__align(N * 2 * Fe * a) : 0);
    *cheap = us__align(N * E * 4) + 3 * us__align(N * K * 4) + us__align(R * 4) +
             us__align(2 * E * 4) + us__align(Rx * C * a) + us__align(Rx * Fe * a) +
             (S ? us__align(N * Fe * a) : 0);
    *scratch = 2 * us__align(Rx * C * a) + us__align(hN * Fe * a) + us__align(hN * 2 * Fe * a) +
               us__align(N * E * a) + us__align(N * K * 4) + us__align(N * E * 4) +
               us__align(E * 4) + (ep > 1 ? us__align(Rx * C * a) + us__align(ep * E * 4) : 0) +
               (nsum ? us__align(nsum * 8) : 0) + (Np ? us__align(Np * C * a) : 0);
}

/* Bytes a MoE layer keeps from B to W under the zero-bubble schedules (us__moe_take_w's order). */
static size_t us__moe_w_bytes(const us_model_config *c, const us_train_config *tc, int64_t N,
                              size_t a) {
    int64_t Rx = us__moe_rx(c, tc, N), C = c->dim, Fe = c->moe_ffn_dim;
    return us__align(Rx * C * a) + us__align(Rx * 2 * Fe * a) +
           (c->moe_shared ? us__align(N * 2 * Fe * a) : 0) + us__align(N * c->moe_experts * a);
}

static void us__moe_take(const us_model *m, us__arena *ar, us_layer_acts *L, int cheap, int gemm) {
    const us_model_config *c = &m->cfg;
    int64_t N = us__moe_tokens(m), E = c->moe_experts, K = c->moe_top_k, Fe = c->moe_ffn_dim,
            R = m->moe_rows, C = c->dim;
    int64_t Rx = m->moe_rx; /* rows this rank's experts run on (ep·R under expert parallelism) */
    size_t a = us_dtype_size(m->dt);
    if (gemm) { /* GEMM outputs: kept unless recompute is full */
        L->logits = (float *)us__take(ar, N * E * 4);
        L->gu_e = us__take(ar, Rx * 2 * Fe * a);
        L->ye = us__take(ar, R * C * a);
        if (c->moe_shared) L->sgu = us__take(ar, N * 2 * Fe * a);
    }
    if (cheap) { /* cheap to recompute from them: routing, permutation, SwiGLU */
        L->probs = (float *)us__take(ar, N * E * 4);
        L->topk = (int32_t *)us__take(ar, N * K * 4);
        L->gates = (float *)us__take(ar, N * K * 4);
        L->slot_row = (int32_t *)us__take(ar, N * K * 4);
        L->row_slot = (int32_t *)us__take(ar, R * 4);
        L->counts = (int32_t *)us__take(ar, 2 * E * 4);
        L->xe = us__take(ar, Rx * C * a);
        L->h_e = us__take(ar, Rx * Fe * a);
        if (c->moe_shared) L->sh = us__take(ar, N * Fe * a);
    }
}

static size_t us__moe_scratch(const us_model *m, us__moe_grads *g) {
    const us_model_config *c = &m->cfg;
    int64_t N = us__moe_tokens(m), E = c->moe_experts, K = c->moe_top_k, Fe = c->moe_ffn_dim,
            C = c->dim;
    int64_t Rx = m->moe_rx, hN = Rx > N * c->moe_shared ? Rx : N * c->moe_shared,
            ep = us__ep_size(&m->tc);
    int64_t nsum = m->tc.dp * m->tc.cp > 1 ? (int64_t)m->n_moe * E + 3 : 0, Np, Ns;
    size_t a = us_dtype_size(m->dt);
    us__arena ar;
    if (!m->n_moe) return 0;
    us__sp_rows(m, N, &Np, &Ns);
    ar.base = g ? (char *)m->a[US__A_MOE] : NULL;
    ar.used = 0;
    {
        void *dye = us__take(&ar, Rx * C * a), *dxe = us__take(&ar, Rx * C * a),
             *dh = us__take(&ar, hN * Fe * a);
        void *dgu = us__take(&ar, hN * 2 * Fe * a), *dlg = us__take(&ar, N * E * a);
        float *dgates = (float *)us__take(&ar, N * K * 4),
              *dlogits = (float *)us__take(&ar, N * E * 4), *vec = (float *)us__take(&ar, E * 4);
        void *ept = ep > 1 ? us__take(&ar, Rx * C * a) : NULL;
        int32_t *epc = ep > 1 ? (int32_t *)us__take(&ar, ep * E * 4) : NULL;
        double *sum = nsum ? (double *)us__take(&ar, nsum * 8) : NULL;
        void *dresf = us__sp_on(m) ? us__take(&ar, Np * C * a) : NULL;
        if (g) {
            g->dresf = dresf;
            g->dye = dye;
            g->dxe = dxe;
            g->dh = dh;
            g->dgu = dgu;
            g->dlg = dlg;
            g->dgates = dgates;
            g->dlogits = dlogits;
            g->vec = vec;
            g->ept = ept;
            g->epc = epc;
            g->sum = sum;
        }
    }
    return ar.used;
}

/* The MoE layers' tables. Under pipeline parallelism each stage holds its own layers' router
   state (bias, loads, counts), and a stage without a MoE layer still takes part in the
   statistics' sum over the stages (us__moe_step_end): it keeps the whole model's load table and
   the sum's buffer. The host count tables have one copy per activation slot: with several
   micro-batches in flight a MoE layer's backward reads the counts of its own micro-batch's
   forward (us__moe_cnt). */
static us_result us__moe_init(us_model *m) {
    const us_model_config *c = &m->cfg;
    int l, E = c->moe_experts;
    size_t nb, na, nc, S = (size_t)(m->slots > 0 ? m->slots : 1);
    m->moe_idx = (int *)US_MALLOC(sizeof(int) * (size_t)(c->n_layers > 0 ? c->n_layers : 1));
    if (!m->moe_idx) {
        us__model_set_error(m, "out of host memory for the model tables");
        return US_ERR_OOM;
    }
    m->n_moe = m->n_moe_all = 0;
    for (l = 0; l < c->n_layers; l++)
        m->moe_idx[l] = us__is_moe(c, m->layer_g[l]) ? m->n_moe++ : -1;
    for (l = 0; l < m->n_layers_global; l++) m->n_moe_all += us__is_moe(c, l);
    if (!m->n_moe_all) return US_OK;
    m->moe_rows = us__moe_rows(c, us__moe_tokens(m));
    m->moe_rx = us__moe_rx(c, &m->tc, us__moe_tokens(m));
    nb = (size_t)m->n_moe * (size_t)E;
    na = (size_t)m->n_moe_all * (size_t)E;
    nc = S * (size_t)c->n_layers * (size_t)E;
    if (m->ep > 1) {
        m->ep_counts_h = (int32_t *)US_MALLOC(nc * (size_t)m->ep * sizeof(int32_t) + 4);
        if (!m->ep_counts_h) {
            us__model_set_error(m, "out of host memory for the expert-parallel count table");
            return US_ERR_OOM;
        }
        memset(m->ep_counts_h, 0, nc * (size_t)m->ep * sizeof(int32_t));
    }
    m->moe_bias_h = (float *)US_MALLOC(nb * sizeof(float) + 4);
    m->moe_load = (int64_t *)US_MALLOC(nb * sizeof(int64_t) + 8);
    m->moe_load_last = (int64_t *)US_MALLOC(na * sizeof(int64_t));
    m->moe_counts_h = (int32_t *)US_MALLOC(3 * nc * sizeof(int32_t) + 4);
    m->moe_wp = (void **)US_MALLOC(sizeof(void *) * (size_t)(E / m->ep));
    m->moe_go = (int64_t *)US_MALLOC(sizeof(int64_t) * 4 * (size_t)(E / m->ep));
    if (nb) /* zero-filled: no bias at the start */
        m->moe_bias = (float *)m->ops.alloc(&m->ops, nb * sizeof(float));
    if (m->tc.pp > 1) m->moe_pp_sum = (double *)m->ops.alloc(&m->ops, (na + 4) * sizeof(double));
    if (!m->moe_bias_h || !m->moe_load || !m->moe_load_last || !m->moe_counts_h || !m->moe_wp ||
        !m->moe_go || (nb && !m->moe_bias) || (m->tc.pp > 1 && !m->moe_pp_sum)) {
        us__model_set_error(m, "out of memory for the MoE router state");
        return US_ERR_OOM;
    }
    memset(m->moe_bias_h, 0, nb * sizeof(float));
    memset(m->moe_load, 0, nb * sizeof(int64_t));
    memset(m->moe_load_last, 0, na * sizeof(int64_t));
    memset(m->moe_counts_h, 0, 3 * nc * sizeof(int32_t));
    if (m->tc.moe_force_balance) { /* [N,E] + [N,K] + [N,K] host */
        int64_t N = us__moe_tokens(m);
        m->moe_fb = (float *)US_MALLOC((size_t)N * (size_t)(E + 2 * c->moe_top_k) * 4);
        if (!m->moe_fb) {
            us__model_set_error(m, "out of host memory for the forced routing");
            return US_ERR_OOM;
        }
    }
    return US_OK;
}

/* MoE layer l's host counts (m->moe_counts_h) for the slot selected: [3E]. */
static int32_t *us__moe_cnt(const us_model *m, int l) {
    size_t E = (size_t)m->cfg.moe_experts;
    return m->moe_counts_h + ((size_t)m->pp_slot * (size_t)m->cfg.n_layers + (size_t)l) * 3 * E;
}

/* Layer l's every ep peer's kept tokens per expert (m->ep_counts_h) for the slot selected:
   [ep][E]. */
static int32_t *us__ep_cnt(const us_model *m, int l) {
    size_t E = (size_t)m->cfg.moe_experts, ep = (size_t)m->ep;
    return m->ep_counts_h + ((size_t)m->pp_slot * (size_t)m->cfg.n_layers + (size_t)l) * ep * E;
}

static void us__moe_free(us_model *m) {
    if (m->moe_bias && m->ops.free) m->ops.free(&m->ops, m->moe_bias);
    if (m->moe_pp_sum && m->ops.free) m->ops.free(&m->ops, m->moe_pp_sum);
    m->moe_pp_sum = NULL;
    US_FREE(m->moe_bias_h);
    US_FREE(m->moe_load);
    US_FREE(m->moe_load_last);
    US_FREE(m->moe_counts_h);
    US_FREE(m->moe_idx);
    US_FREE(m->ep_counts_h);
    US_FREE(m->moe_fb);
    US_FREE(m->moe_wp);
    US_FREE(m->moe_go);
    m->moe_fb = NULL;
    m->moe_wp = NULL;
    m->moe_go = NULL;
    m->ep_counts_h = NULL;
    m->moe_bias = m->moe_bias_h = NULL;
    m->moe_load = m->moe_load_last = NULL;
    m->moe_counts_h = NULL;
    m->moe_idx = NULL;
}

static size_t us__moe_bias_bytes(const us_model *m) {
    return (size_t)m->n_moe * (size_t)m->cfg.moe_experts * sizeof(float);
}

/* The router state's backend memory: the bias, and under pp the statistics' sum buffer
   (us__moe_pp_stats). The estimator states the same (us__estimate_states). */
static size_t us__moe_state_bytes(const us_model *m) {
    size_t pps = m->tc.pp > 1 && m->n_moe_all
                     ? ((size_t)m->n_moe_all * (size_t)m->cfg.moe_experts + 4) * sizeof(double)
                     : 0;
    return us__moe_bias_bytes(m) + pps;
}

/* expert parallelism (// >>ep) */
static us_result us__ep_counts(us_model *m, int l, const int32_t *kept, int32_t *scratch);
static us_result us__ep_move(us_model *m, int l, int dir, void *dst, const void *src,
                             void *transit);

/* Rows local expert j of MoE layer l ran on in the last forward: its kept tokens, or under
   expert parallelism those every ep peer sent it. */
static int64_t us__moe_local_rows(const us_model *m, int l, int j) {
    int E = m->cfg.moe_experts, s;
    int64_t n = 0;
    const int32_t *epc;
    if (m->ep <= 1) return us__moe_cnt(m, l)[E + j];
    epc = us__ep_cnt(m, l);
    for (s = 0; s < m->ep; s++) n += epc[(size_t)s * E + (size_t)m->ep_rank * (E / m->ep) + j];
    return n;
}

/* Local expert 0's gate_proj in MoE layer l: expert e's gate|up is this + 3e, its down + 2. */
static int us__moe_ex(const us_model *m, int l) {
    return US__TENSOR(l, US__P_EXPERTS) + 3 * m->cfg.moe_shared;
}

/* Each local expert's rows of MoE layer l in the last forward, into m->moe_go: first rows
   [E/ep], then counts [E/ep] (rows are expert-major). Returns their total. */
static int64_t us__moe_groups(us_model *m, int l) {
    int e, El = m->cfg.moe_experts / m->ep;
    int64_t off = 0;
    for (e = 0; e < El; e++) {
        m->moe_go[e] = off;
        m->moe_go[El + e] = us__moe_local_rows(m, l, e);
        off += m->moe_go[El + e];
    }
    return off;
}

/* FP8 for an expert's GEMM (// >>fp8-linear) */
static int64_t us__fp8_expert(us_model *m, int mode, int64_t n, int64_t In, int64_t Out,
                              const void *X, void *W, void *Y);

/* Experts [e0, e1) of a MoE layer, each with its matrix of linear In → Out in m->moe_wp (k 0:
   gate|up, In C, Out 2Fe; k 2: down, In Fe, Out C) and its rows in m->moe_go: the product mode
   (us_ops.gemm_grouped's) on every expert's rows at once. Under FP8 the rows an expert's GEMM
   takes in FP8 (us__fp8_expert) run per expert first; the rest, all of them otherwise, in one
   grouped GEMM. X holds the linear's input side (x, or dy for Dgrad), Y the other. */
static void us__moe_run(us_model *m, int mode, int k, int e0, int e1, const void *X, void *Y) {
    int El = m->cfg.moe_experts / m->ep, e;
    int64_t In = k ? m->cfg.moe_ffn_dim : m->cfg.dim, Out = k ? m->cfg.dim : 2 * m->cfg.moe_ffn_dim;
    int64_t xc = mode == US_GG_DGRAD ? Out : In, yc = mode == US_GG_DGRAD ? In : Out;
    int64_t *off = m->moe_go, *n = off + El, *off2 = n + El, *n2 = off2 + El;
    for (e = e0; e < e1; e++) { /* [off2, off2 + n2): what the grouped GEMM has left to do */
        int64_t d = us__fp8_expert(m, mode, n[e], In, Out, us__at(X, m->dt, off[e] * xc),
                                   m->moe_wp[e], us__at(Y, m->dt, off[e] * yc));
        off2[e] = off[e] + d;
        n2[e] = n[e] - d;
    }
    m->ops.gemm_grouped(&m->ops, mode, e1 - e0, off2 + e0, n2 + e0, yc, xc, X, xc, m->moe_wp + e0,
                        Y, yc, m->dt);
}

/* Fprop (Y = X·Wᵀ) or Dgrad (Y = X·W) of all local experts of MoE layer l, tensor k of each, on
   their rows (us__moe_groups first) */
static void us__moe_mm(us_model *m, int l, int mode, int k, const void *X, void *Y) {
    int e, El = m->cfg.moe_experts / m->ep, ex = us__moe_ex(m, l);
    for (e = 0; e < El; e++) m->moe_wp[e] = us__weight(m, ex + 3 * e + k);
    us__moe_run(m, mode, k, 0, El, X, Y);
}

/* The backward's walk over the experts' weights: step t is expert El−1−t/2's down (t even), then
   its gate|up (t odd), the flat buffers' order backwards. The tensor of step t: */
static int us__moe_walk(const us_model *m, int l, int t) {
    int El = m->cfg.moe_experts / m->ep;
    return us__moe_ex(m, l) + 3 * (El - 1 - t / 2) + (t % 2 ? 0 : 2);
}

/* Wgrad of the tensors k (0 gate|up, 2 down) among walk steps [t0, t1): W += Yᵀ·X on each
   expert's rows, into the gradients (which under ZeRO-2/3 takes their unit's slot) */
static void us__moe_wgrad_part(us_model *m, int l, int k, int t0, int t1, const void *Y,
                               const void *X) {
    int El = m->cfg.moe_experts / m->ep, t, e0 = El, e1 = 0;
    for (t = t0; t < t1; t++) {
        int e = El - 1 - t / 2, i = us__moe_walk(m, l, t);
        if ((t % 2 ? 0 : 2) != k) continue;
        m->moe_wp[e] = m->moe_go[El + e] ? us__grad(m, i) : NULL;
        e0 = e < e0 ? e : e0;
        e1 = e + 1 > e1 ? e + 1 : e1;
    }
    if (e0 < e1) us__moe_run(m, US_GG_WGRAD, k, e0, e1, X, (void *)Y); /* (Wgrad reads Y) */
}

/* The experts' weight gradients of MoE layer l from their output gradients dye [rows,C], dgu
   [rows,2Fe] and the forward's h_e, xe (us__moe_groups first): dWdown += dyeᵀ·h_e, dWgu +=
   dguᵀ·xe on each expert's rows, in grouped GEMMs, then handed to data parallelism in the walk's
   order (last expert first, as a dense layer's tensors: // >>dp reduces each bucket when full).
   ZeRO-2/3 hold a unit's gradient in a slot while it is written and keep two slots (// >>zero),
   so there the grouped GEMMs take the walk one unit at a time; without them, all of it at once. */
static us_result us__moe_wgrad(us_model *m, int l, const void *dye, const void *dgu) {
    us_layer_acts *A = &m->acts[l];
    int nt = 2 * (m->cfg.moe_experts / m->ep), t0, t1, t;
    us_result r;
    for (t0 = 0; t0 < nt; t0 = t1) {
        int u = m->tc.zero >= 2 ? m->unit_of[us__moe_walk(m, l, t0)] : -1;
        for (t1 = t0 + 1; t1 < nt && (u < 0 || m->unit_of[us__moe_walk(m, l, t1)] == u); t1++) {
        }
        us__moe_wgrad_part(m, l, 2, t0, t1, dye, A->h_e);
        us__moe_wgrad_part(m, l, 0, t0, t1, dgu, A->xe);
        for (t = t0; t < t1; t++) {
            int i = us__moe_walk(m, l, t);
            if ((r = us__grads_ready(m, i, t % 2 ? i + 2 : i + 1)) != US_OK) return r;
        }
    }
    return US_OK;
}

/* The auxiliary loss's weight per micro-batch: the step's objective averages it over the
   micro-batches (and dp ranks), as the language-model loss is a mean over the global batch. The
   cp ranks share one micro-batch: each adds its tokens' part of the one loss (us__moe_fwd). */
static double us__moe_aux_weight(const us_model *m) {
    return 1.0 / ((double)m->tc.grad_accum * m->tc.dp);
}

/* The auxiliary loss's f_e counts the whole micro-batch: under context parallelism each cp rank
   routes a slice of it, so layer l's routed counts cnt[0, E) are summed over cp into
   cnt[2E, 3E) (copied when cp = 1), through the routing-count scratch (g->sum, [≥ E] f64). */
static us_result us__moe_batch_counts(us_model *m, int32_t *cnt, us__moe_grads *g) {
    int E = m->cfg.moe_experts, e;
    double *h;
    us_result r;
    if (m->mesh.cp <= 1) {
        memcpy(cnt + 2 * E, cnt, (size_t)E * sizeof(int32_t));
        return US_OK;
    }
    h = (double *)US_MALLOC((size_t)E * sizeof(double));
    if (!h) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    for (e = 0; e < E; e++) h[e] = (double)cnt[e];
    m->ops.copy(&m->ops, g->sum, h, (size_t)E * sizeof(double), US_COPY_H2D);
    r = m->comm->all_reduce(m->comm, &m->mesh.cp_g, g->sum, E, US_F64, US_REDUCE_SUM, NULL);
    if (r == US_OK) {
        m->ops.copy(&m->ops, h, g->sum, (size_t)E * sizeof(double), US_COPY_D2H);
        for (e = 0; e < E; e++) cnt[2 * E + e] = (int32_t)h[e]; /* exact: counts below 2^31 */
    }
    US_FREE(h);
    return us__comm_fail(m, r, "all-reduce of the micro-batch's routing counts");
}

/* combine: x_{l+1} = xmid + sh·Wdown_sᵀ + Σ_k gate[n,k]·ye[row of (n,k)], on this rank's rows:
   all N, or under SP its Ns rows [t·Ns, t·Ns + Ns) of the tp group's (padding past N keeps xmid).
   xnext [Ns,C]. */
static void us__moe_combine(us_model *m, int l, int64_t N, void *xnext) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    us_layer_acts *A = &m->acts[l];
    us_dtype dt = m->dt;
    int K = c->moe_top_k;
    int64_t C = c->dim, Fe = c->moe_ffn_dim, Np, Ns, r0, n;
    us__sp_rows(m, N, &Np, &Ns);
    r0 = us__sp_on(m) ? (int64_t)m->mesh.tp_rank * Ns : 0;
    n = N - r0 < Ns ? N - r0 : Ns; /* this rank's real tokens */
    o->copy(o, xnext, A->xmid, (size_t)(Ns * C) * us_dtype_size(dt), US_COPY_D2D);
    if (n <= 0) return;
    if (c->moe_shared)
        o->gemm(o, 0, 1, n, C, Fe, 1.0f, us__at(A->sh, dt, r0 * Fe), dt, Fe,
                us__weight(m, US__TENSOR(l, US__P_EXPERTS) + 2), dt, Fe, 1.0f, xnext, dt, C);
    o->moe_scatter(o, xnext, A->ye, A->slot_row + r0 * K, A->gates + r0 * K, n, K, C, dt);
}

/* A real forward's routing statistics, and the auxiliary loss α·Σ_e f_e·P_e over the
   micro-batch's Nb tokens: f_e from its routed counts, P_e from this rank's N tokens (the cp
   ranks' shares sum to it). */
static us_result us__moe_stats(us_model *m, int l, int64_t N, us__moe_grads *g) {
    const us_model_config *c = &m->cfg;
    int E = c->moe_experts, K = c->moe_top_k, e, mi = m->moe_idx[l];
    int32_t *cnt = us__moe_cnt(m, l), *kept = cnt + E;
    double lossv = 0, Nb = (double)N * m->mesh.cp;
    us_result r;
    if (c->moe_balance == US_MOE_BALANCE_AUX) {
        float *ps = (float *)US_MALLOC((size_t)E * 4);
        if (!ps) {
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        if ((r = us__moe_batch_counts(m, cnt, g)) != US_OK) {
            US_FREE(ps);
            return r;
        }
        m->ops.copy(&m->ops, ps, g->vec, (size_t)E * 4, US_COPY_D2H); /* Σ_n p'[n,e] */
        for (e = 0; e < E; e++)
            lossv += (double)E * cnt[2 * E + e] / ((double)K * Nb) * (ps[e] / Nb);
        lossv *= c->moe_aux_coef * us__moe_aux_weight(m);
        US_FREE(ps);
    }
    m->moe_aux_last += lossv;
    if (m->moe_train) {
        for (e = 0; e < E; e++) {
            m->moe_load[(size_t)mi * E + e] += cnt[e];
            m->moe_dropped += cnt[e] - kept[e];
        }
        m->moe_choices += N * K;
        m->moe_aux += lossv;
    }
    return US_OK;
}

/* Sequence parallelism (// >>tp) leaves each tp rank Ns of the tp group's N tokens. Megatron-LM
   has two answers for a MoE layer: gather the tokens around the experts (its "allgather" token
   dispatcher), or route each rank's local tokens (its "alltoall" dispatcher, the tp ranks
   becoming more expert-data-parallel ranks). This takes the gather: ln2's output is all-gathered
   (g) before the router, every tp rank runs the layer whole on the N tokens as it does without
   SP, and keeps its own rows of the output; the backward gathers the residual gradient and keeps
   its rows of ∂u. Why: the layer stays replicated over tp, so its weight gradients are whole on
   every tp rank and are reduced over the same groups (dp×cp, or the expert-data-parallel group)
   with and without SP, and ZeRO and ep shard them alike; routing the local tokens would divide
   the expert compute by tp but needs every MoE gradient summed over tp as well, over a group
   that crosses ep's. The cost is the one tp without SP already pays: the experts' compute is
   repeated on every tp rank.
   MoE layer l's forward from A->ln2, with recompute as in us__layer_fwd: GEMM outputs (logits,
   gate | up, expert outputs) are kept unless recompute is full; routing, permutation and SwiGLU
   are refilled by selective. A real forward (recompute = 0) writes x_{l+1} and counts the
   routing. */
/* tc.moe_force_balance (benchmarks: every expert equally loaded, as Megatron's forced balance):
   token n's k-th expert is (n·K + k) mod E, K distinct experts per token; the gates are the
   router's probabilities of those experts as moe_route makes them (softmax: the probability;
   sigmoid: over the chosen ones' sum), so the backward through the router is unchanged. */
static void us__moe_force_balance(us_model *m, us_layer_acts *A, int64_t N) {
    us_ops *o = &m->ops;
    int E = m->cfg.moe_experts, K = m->cfg.moe_top_k, k;
    float *p = m->moe_fb, *gt = p + N * E;
    int32_t *tk = (int32_t *)(gt + N * K);
    int64_t n;
    o->copy(o, p, A->probs, (size_t)(N * E) * 4, US_COPY_D2H);
    for (n = 0; n < N; n++) {
        double sum = 0;
        for (k = 0; k < K; k++) {
            tk[n * K + k] = (int32_t)((n * K + k) % E);
            gt[n * K + k] = p[n * E + tk[n * K + k]];
            sum += gt[n * K + k];
        }
        for (k = 0; m->cfg.moe_gate == US_MOE_SIGMOID && k < K; k++)
            gt[n * K + k] = (float)(gt[n * K + k] / sum);
    }
    o->copy(o, A->topk, tk, (size_t)(N * K) * 4, US_COPY_H2D);
    o->copy(o, A->gates, gt, (size_t)(N * K) * 4, US_COPY_H2D);
}

static us_result us__moe_fwd(us_model *m, int l, int64_t N, int recompute, void *xnext) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    us_layer_acts *A = &m->acts[l];
    us_dtype dt = m->dt;
    int E = c->moe_experts, K = c->moe_top_k, mi = m->moe_idx[l], mode = m->tc.recompute,
        aux = c->moe_balance == US_MOE_BALANCE_AUX;
    int do_gemm = !recompute || mode == US_RECOMPUTE_FULL,
        do_cheap = !recompute || mode != US_RECOMPUTE_NONE;
    int64_t C = c->dim, Fe = c->moe_ffn_dim, R = us__moe_rows(c, N), rows;
    /* host: routed [E], kept [E], routed in the whole micro-batch [E] (us__moe_batch_counts) */
    int32_t *cnt = us__moe_cnt(m, l);
    /* the experts' outputs, expert-major: A->ye itself on one rank, else a scratch sent home
       after */
    void *ye;
    const void *u = A->ln2; /* [N,C] the layer's input: ln2's output, or under SP gathered */
    us_result r;
    us__moe_grads g;
    us__moe_scratch(m, &g);
    ye = m->ep > 1 ? g.dxe : A->ye;
    if (us__sp_on(m) && (do_gemm || do_cheap)) { /* g: the tp group's tokens (see above) */
        int64_t Np, Ns;
        us__sp_rows(m, N, &Np, &Ns);
        if ((r = us__sp_gather(m, m->a[US__A_SPG], A->ln2, Ns)) != US_OK) return r;
        u = m->a[US__A_SPG];
    }
    /* route: logits [N,E] f32 = u [N,C] · Wrouter [E,C]ᵀ; topk, gates [N,K] */
    if (do_gemm)
        o->gemm(o, 0, 1, N, E, C, 1.0f, u, dt, C, us__weight(m, US__TENSOR(l, US__P_ROUTER)), dt, C,
                0.0f, A->logits, US_F32, E);
    if (do_cheap) {
        const float *bias =
            c->moe_balance == US_MOE_BALANCE_BIAS ? m->moe_bias + (size_t)mi * E : NULL;
        o->moe_route(o, A->topk, A->gates, A->probs, aux && !recompute ? g.vec : NULL, A->logits,
                     bias, N, E, K, (int)c->moe_gate, c->moe_groups, c->moe_top_groups);
        if (m->tc.moe_force_balance) us__moe_force_balance(m, A, N);
        /* permute: the counts come to the host, where they size each expert's GEMMs */
        o->moe_permute(o, A->slot_row, A->row_slot, A->counts, A->counts + E, A->topk, N, E, K,
                       us__moe_cap(c, N), R);
        o->copy(o, cnt, A->counts, (size_t)(2 * E) * 4, US_COPY_D2H);
        if (m->ep >
            1) { /* expert parallelism: the counts, then each row to its expert's rank (// >>ep) */
            if ((r = us__ep_counts(m, l, A->counts + E, g.epc)) != US_OK) return r;
            o->moe_gather(o, g.dye, u, A->row_slot, NULL, R, K, C, dt);
            if ((r = us__ep_move(m, l, 0, A->xe, g.dye, g.ept)) != US_OK) return r;
        } else
            o->moe_gather(o, A->xe, u, A->row_slot, NULL, R, K, C, dt);
    }
    /* this rank's experts, each on its contiguous rows (expert-major), one grouped GEMM per
       product (us__moe_mm): gu_e [rows,2Fe] = xe [rows,C] · Wgu [2Fe,C]ᵀ, h_e [rows,Fe] =
       swiglu(gu_e), ye [rows,C] = h_e · Wdown [C,Fe]ᵀ, each row with its own expert's W */
    rows = us__moe_groups(m, l);
    if (do_gemm) us__moe_mm(m, l, US_GG_FPROP, 0, A->xe, A->gu_e);
    if (do_cheap) o->swiglu_fwd(o, A->h_e, A->gu_e, rows, Fe, dt);
    if (do_gemm) us__moe_mm(m, l, US_GG_FPROP, 2, A->h_e, ye);
    if (do_gemm && m->ep > 1 && (r = us__ep_move(m, l, 1, A->ye, ye, g.ept)) != US_OK)
        return r; /* the outputs come home (// >>ep) */
    /* the shared expert, a dense SwiGLU MLP of size Fe on every token: sgu [N,2Fe], sh [N,Fe] */
    if (c->moe_shared) {
        if (do_gemm)
            o->gemm(o, 0, 1, N, 2 * Fe, C, 1.0f, u, dt, C,
                    us__weight(m, US__TENSOR(l, US__P_EXPERTS)), dt, C, 0.0f, A->sgu, dt, 2 * Fe);
        if (do_cheap) o->swiglu_fwd(o, A->sh, A->sgu, N, Fe, dt);
    }
    if (recompute) return US_OK;
    us__moe_combine(m, l, N, xnext);
    return us__moe_stats(m, l, N, &g);
}

/* The backward of MoE layer l's local experts over their rows [rows] (dye [rows,C], expert-major):
   each expert's is the dense MLP's on its rows, all experts in one grouped GEMM per product:
   dh [rows,Fe] = dye · Wdown [C,Fe]; dgu [rows,2Fe] = swiglu'(dh); dxe [rows,C] = dgu · Wgu
   [2Fe,C]; then the weight gradients (us__moe_wgrad). With B and W apart (split) dye and dgu
   stay in the layer's g_dye, g_dgu, and the weight gradients wait for W (us__moe_w). */
static us_result us__moe_experts_bwd(us_model *m, int l, int64_t rows, us__moe_grads *g,
                                     const void *dye, int split) {
    us_layer_acts *A = &m->acts[l];
    void *dgu = split ? A->g_dgu : g->dgu;
    us__moe_groups(m, l);
    us__moe_mm(m, l, US_GG_DGRAD, 2, dye, g->dh);
    m->ops.swiglu_bwd(&m->ops, dgu, g->dh, A->gu_e, rows, m->cfg.moe_ffn_dim, m->dt);
    us__moe_mm(m, l, US_GG_DGRAD, 0, dgu, g->dxe);
    return split ? US_OK : us__moe_wgrad(m, l, dye, dgu);
}

/* Its backward. On entry dres = ∂loss/∂x_{l+1}; leaves ∂loss/∂u in DLN (u = ln2's output),
   accumulated from the experts (un-permuted), the shared expert and the router.
   Zero-bubble schedules (// >>pp) split a backward into B (input gradients) and W (weight
   gradients): under that split (m->pp_bonly) this B keeps the output gradients the weight GEMMs
   need — the experts' (g_dye, g_dgu), the shared expert's (the residual gradient in g_down,
   g_sdgu) and the router's (g_dlg) — and us__moe_w forms the weight gradients in W. */
/* The shared expert's backward, a dense SwiGLU MLP on all N tokens: dh [N,Fe] = dres · Wdown_s,
   dWdown_s += dresᵀ · sh; dgu [N,2Fe] = swiglu'(dh); dln [N,C] += dgu · Wgu_s, dWgu_s += dguᵀ · u.
   Split: dres goes to g_down and dgu stays in g_sdgu for W (us__moe_w). */
static us_result us__moe_shared_bwd(us_model *m, int l, int64_t N, const void *dres, const void *u,
                                    us__moe_grads *g, int split) {
    us_ops *o = &m->ops;
    us_layer_acts *A = &m->acts[l];
    us_dtype dt = m->dt;
    int sx = US__TENSOR(l, US__P_EXPERTS);
    int64_t C = m->cfg.dim, Fe = m->cfg.moe_ffn_dim;
    void *dgu = split ? A->g_sdgu : g->dgu, *dln = m->a[US__A_DLN];
    o->gemm(o, 0, 0, N, Fe, C, 1.0f, dres, dt, C, us__weight(m, sx + 2), dt, Fe, 0.0f, g->dh, dt,
            Fe);
    o->swiglu_bwd(o, dgu, g->dh, A->sgu, N, Fe, dt);
    o->gemm(o, 0, 0, N, C, 2 * Fe, 1.0f, dgu, dt, 2 * Fe, us__weight(m, sx), dt, C, 1.0f, dln, dt,
            C);
    if (split) {
        o->copy(o, A->g_down, dres, (size_t)(N * C) * us_dtype_size(dt), US_COPY_D2D);
        return US_OK;
    }
    o->gemm(o, 1, 0, C, Fe, N, 1.0f, dres, dt, C, A->sh, dt, Fe, 1.0f, us__grad(m, sx + 2), US_F32,
            Fe);
    o->gemm(o, 1, 0, 2 * Fe, C, N, 1.0f, dgu, dt, 2 * Fe, u, dt, C, 1.0f, us__grad(m, sx), US_F32,
            C);
    return us__grads_ready(m, sx, sx + 3);
}

static us_result us__moe_bwd(us_model *m, int l, int64_t N) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    us_layer_acts *A = &m->acts[l];
    us_dtype dt = m->dt;
    int E = c->moe_experts, K = c->moe_top_k, e, aux = c->moe_balance == US_MOE_BALANCE_AUX,
        El = E / m->ep;
    int64_t C = c->dim, rows, nperm, Np, Ns;
    int32_t *cnt = us__moe_cnt(m, l), *kept = cnt + E;
    int rt = US__TENSOR(l, US__P_ROUTER), split = m->pp_bonly; /* zero-bubble B: W waits */
    void *dres = m->a[US__A_DRES], *dln = m->a[US__A_DLN], *dxp, *dye, *dlg;
    const void *u = A->ln2; /* [N,C] the layer's input */
    us_result r;
    us__moe_grads g;
    us__moe_scratch(m, &g);
    dye = split ? A->g_dye : g.dye; /* [rows,C] the local experts' output gradients */
    dlg = split ? A->g_dlg : g.dlg; /* [N,E] the router logits' gradient in dt */
    us__sp_rows(m, N, &Np, &Ns);
    if (us__sp_on(m)) { /* the tp group's residual gradient and input, whole (see us__moe_fwd) */
        if ((r = us__sp_gather(m, g.dresf, dres, Ns)) != US_OK) return r;
        if ((r = us__sp_gather(m, m->a[US__A_SPG], A->ln2, Ns)) != US_OK) return r;
        dres = g.dresf;
        u = m->a[US__A_SPG];
    }
    for (e = 0, nperm = 0; e < E; e++) nperm += kept[e]; /* this rank's tokens' rows */
    for (e = 0, rows = 0; e < El; e++)
        rows += us__moe_local_rows(m, l, e); /* the rows its experts ran */
    /* combine: ∂gate[n,k] = dres[n]·y[row], ∂y[row] = gate[n,k]·dres[n] */
    o->moe_gate_grad(o, g.dgates, dres, A->ye, A->slot_row, N, K, C, dt);
    if (m->ep > 1) { /* the output gradients travel like the dispatch (// >>ep) */
        o->moe_gather(o, g.dxe, dres, A->row_slot, A->gates, nperm, K, C, dt);
        if ((r = us__ep_move(m, l, 0, dye, g.dxe, g.ept)) != US_OK) return r;
    } else
        o->moe_gather(o, dye, dres, A->row_slot, A->gates, rows, K, C, dt);
    if ((r = us__moe_experts_bwd(m, l, rows, &g, dye, split)) != US_OK) return r;
    dxp = g.dxe;
    if (m->ep > 1) { /* the input gradients come back like the combine (// >>ep) */
        if ((r = us__ep_move(m, l, 1, g.dye, g.dxe, g.ept)) != US_OK) return r;
        dxp = g.dye;
    }
    /* un-permute: each token sums the gradients of its rows */
    o->zero(o, dln, (size_t)(Np * C) * us_dtype_size(dt)); /* (SP's padding rows: zero) */
    o->moe_scatter(o, dln, dxp, A->slot_row, NULL, N, K, C, dt);
    if (c->moe_shared && (r = us__moe_shared_bwd(m, l, N, dres, u, &g, split)) != US_OK) return r;
    /* router: through the gates, and (aux) through P_e: ∂loss/∂p'[n,e] = w·α·f_e/Nb, Nb the
       micro-batch's tokens (N·cp), f_e from its routed counts (us__moe_batch_counts) */
    if (aux) {
        float *v = (float *)US_MALLOC((size_t)E * 4);
        double Nb = (double)N * m->mesh.cp;
        if (!v) {
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        for (e = 0; e < E; e++)
            v[e] = (float)(c->moe_aux_coef * us__moe_aux_weight(m) * (double)E * cnt[2 * E + e] /
                           ((double)K * Nb) / Nb) *
                   m->loss_scale; /* scaled like the main loss's seed (// >>lossscale) */
        o->copy(o, g.vec, v, (size_t)E * 4, US_COPY_H2D);
        US_FREE(v);
    }
    o->moe_route_bwd(o, g.dlogits, g.dgates, A->probs, A->topk, aux ? g.vec : NULL, N, E, K,
                     (int)c->moe_gate);
    /* dlogits [N,E] f32 → dlg (dtype dt); dln [N,C] += dlg · Wrouter [E,C];
       dWrouter += dlgᵀ · ln2 */
    o->cast(o, dlg, dt, g.dlogits, US_F32, N * E);
    o->gemm(o, 0, 0, N, C, E, 1.0f, dlg, dt, E, us__weight(m, rt), dt, C, 1.0f, dln, dt, C);
    if (split) return US_OK;
    o->gemm(o, 1, 0, E, C, N, 1.0f, dlg, dt, E, u, dt, C, 1.0f, us__grad(m, rt), US_F32, C);
    return us__grads_ready(m, rt, rt + 1);
}

/* The W half of a MoE layer's zero-bubble backward: the weight gradients from what B kept (the
   g_* output gradients) and the forward's inputs — the experts last to first as in B, the
   shared expert, the router; under SP the tp group's u is gathered again. */
static us_result us__moe_w(us_model *m, int l, int64_t N) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    us_layer_acts *A = &m->acts[l];
    us_dtype dt = m->dt;
    int E = c->moe_experts, rt = US__TENSOR(l, US__P_ROUTER), sx = US__TENSOR(l, US__P_EXPERTS);
    int64_t C = c->dim, Fe = c->moe_ffn_dim, Np, Ns;
    const void *u = A->ln2; /* [N,C] */
    us_result r;
    us__moe_groups(m, l);
    if ((r = us__moe_wgrad(m, l, A->g_dye, A->g_dgu)) != US_OK) return r;
    if (us__sp_on(m)) {
        us__sp_rows(m, N, &Np, &Ns);
        if ((r = us__sp_gather(m, m->a[US__A_SPG], A->ln2, Ns)) != US_OK) return r;
        u = m->a[US__A_SPG];
    }
    if (c->moe_shared) {
        o->gemm(o, 1, 0, C, Fe, N, 1.0f, A->g_down, dt, C, A->sh, dt, Fe, 1.0f, us__grad(m, sx + 2),
                US_F32, Fe);
        o->gemm(o, 1, 0, 2 * Fe, C, N, 1.0f, A->g_sdgu, dt, 2 * Fe, u, dt, C, 1.0f, us__grad(m, sx),
                US_F32, C);
        if ((r = us__grads_ready(m, sx, sx + 3)) != US_OK) return r;
    }
    o->gemm(o, 1, 0, E, C, N, 1.0f, A->g_dlg, dt, E, u, dt, C, 1.0f, us__grad(m, rt), US_F32, C);
    return us__grads_ready(m, rt, rt + 1);
}

/* Under B and W apart, a MoE layer's kept output gradients (us__moe_w; g_down, which every
   layer place has then, holds the shared expert's residual gradient). */
static void us__moe_take_w(const us_model *m, us__arena *ar, us_layer_acts *L) {
    const us_model_config *c = &m->cfg;
    int64_t N = us__moe_tokens(m), Rx = m->moe_rx, C = c->dim, Fe = c->moe_ffn_dim;
    size_t a = us_dtype_size(m->dt);
    L->g_dye = us__take(ar, Rx * C * a);
    L->g_dgu = us__take(ar, Rx * 2 * Fe * a);
    if (c->moe_shared) L->g_sdgu = us__take(ar, N * 2 * Fe * a);
    L->g_dlg = us__take(ar, N * c->moe_experts * a);
}

/* Local MoE layer l's place among the whole model's MoE layers (// >>pp: a stage holds some). */
static int us__moe_global_idx(const us_model *m, int l) {
    int j, n = 0;
    for (j = 0; j < m->layer_g[l]; j++) n += us__is_moe(&m->cfg, j);
    return n;
}

/* The step's statistics over the whole model: each pipeline stage counted its own MoE layers
   (their loads, choices, drops, aux loss and imbalance sum imb), so under pp they are summed
   over the stages, each stage's loads at its layers' places in the model's table; every rank
   then reports the whole model's. Without pp, this rank's are the model's. */
static us_result us__moe_pp_stats(us_model *m, double *imb) {
    size_t E = (size_t)m->cfg.moe_experts, na = (size_t)m->n_moe_all * E, j;
    double *h;
    int l;
    us_result r;
    if (m->tc.pp <= 1) {
        memcpy(m->moe_load_last, m->moe_load, sizeof(int64_t) * na);
        return US_OK;
    }
    h = (double *)US_MALLOC((na + 4) * sizeof(double));
    if (!h) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    memset(h, 0, (na + 4) * sizeof(double));
    for (l = 0; l < m->cfg.n_layers; l++)
        if (m->moe_idx[l] >= 0)
            for (j = 0; j < E; j++)
                h[(size_t)us__moe_global_idx(m, l) * E + j] =
                    (double)m->moe_load[(size_t)m->moe_idx[l] * E + j];
    h[na] = (double)m->moe_choices;
    h[na + 1] = (double)m->moe_dropped;
    h[na + 2] = m->moe_aux;
    h[na + 3] = *imb;
    m->ops.copy(&m->ops, m->moe_pp_sum, h, (na + 4) * sizeof(double), US_COPY_H2D);
    r = m->comm->all_reduce(m->comm, &m->mesh.pp_g, m->moe_pp_sum, (int64_t)(na + 4), US_F64,
                            US_REDUCE_SUM, NULL);
    if (r == US_OK) {
        m->ops.copy(&m->ops, h, m->moe_pp_sum, (na + 4) * sizeof(double), US_COPY_D2H);
        for (j = 0; j < na; j++) m->moe_load_last[j] = (int64_t)h[j]; /* exact below 2^53 */
        m->moe_choices = (int64_t)h[na];
        m->moe_dropped = (int64_t)h[na + 1];
        m->moe_aux = h[na + 2];
        *imb = h[na + 3];
    }
    US_FREE(h);
    return us__comm_fail(m, r, "all-reduce of the routing statistics over the pipeline stages");
}

/* After the optimizer step: the step's routing statistics, then DeepSeek-V3's bias rule
   b_e += γ·sign(mean load − load_e) per MoE layer (overloaded experts become less attractive).
   With several data-parallel ranks the loads (and the statistics) are first summed over dp×cp:
   every rank then moves the replicated bias alike, as one rank with the global batch would.
   Under pipeline parallelism each layer's bias lives on its stage, which moves it by the loads
   of its own layer; only the reported statistics are summed over the stages (us__moe_pp_stats,
   where a stage without a MoE layer takes part too). */
static us_result us__moe_step_end(us_model *m) {
    const us_model_config *c = &m->cfg;
    int i, e, E = c->moe_experts;
    double imb = 0;
    us_result r;
    if (!m->n_moe_all) return US_OK;
    if (m->mesh.dpcp_g.size > 1 && m->n_moe) { /* (the dp×cp group shares one stage's layers) */
        size_t n = (size_t)m->n_moe * (size_t)E, j;
        double *h = (double *)US_MALLOC((n + 3) * sizeof(double));
        us__moe_grads g;
        if (!h) {
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        us__moe_scratch(m, &g);
        for (j = 0; j < n; j++) h[j] = (double)m->moe_load[j];
        h[n] = (double)m->moe_choices;
        h[n + 1] = (double)m->moe_dropped;
        h[n + 2] = m->moe_aux;
        m->ops.copy(&m->ops, g.sum, h, (n + 3) * sizeof(double), US_COPY_H2D);
        r = m->comm->all_reduce(m->comm, &m->mesh.dpcp_g, g.sum, (int64_t)(n + 3), US_F64,
                                US_REDUCE_SUM, NULL);
        if (r != US_OK) {
            US_FREE(h);
            return us__comm_fail(m, r, "all-reduce of the routing counts");
        }
        m->ops.copy(&m->ops, h, g.sum, (n + 3) * sizeof(double), US_COPY_D2H);
        for (j = 0; j < n; j++) m->moe_load[j] = (int64_t)h[j]; /* exact: counts below 2^53 */
        m->moe_choices = (int64_t)h[n];
        m->moe_dropped = (int64_t)h[n + 1];
        m->moe_aux = h[n + 2];
        US_FREE(h);
    }
    for (i = 0; i < m->n_moe; i++) {
        int64_t *ld = m->moe_load + (size_t)i * E, mx = 0, sum = 0;
        for (e = 0; e < E; e++) {
            sum += ld[e];
            if (ld[e] > mx) mx = ld[e];
        }
        imb += sum ? (double)mx * E / (double)sum : 1.0;
        if (c->moe_balance == US_MOE_BALANCE_BIAS && sum)
            for (e = 0; e < E; e++) {
                double d = (double)sum / E - (double)ld[e];
                m->moe_bias_h[(size_t)i * E + e] += d > 0   ? c->moe_bias_rate
                                                    : d < 0 ? -c->moe_bias_rate
                                                            : 0.0f;
            }
    }
    if (c->moe_balance == US_MOE_BALANCE_BIAS && m->n_moe)
        m->ops.copy(&m->ops, m->moe_bias, m->moe_bias_h, us__moe_bias_bytes(m), US_COPY_H2D);
    if ((r = us__moe_pp_stats(m, &imb)) != US_OK) return r;
    m->moe_stat[0] = (float)(imb / m->n_moe_all);
    m->moe_stat[1] = (float)m->moe_aux;
    m->moe_stat[2] =
        m->moe_choices ? (float)((double)m->moe_dropped / (double)m->moe_choices) : 0.0f;
    memset(m->moe_load, 0, sizeof(int64_t) * (size_t)m->n_moe * (size_t)E);
    m->moe_choices = m->moe_dropped = 0;
    m->moe_aux = 0;
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>ep  expert parallelism: experts over the ep group, all-to-all dispatch and combine
/* ------------------------------------------------------------------------------------ */
/* Playbook "Expert parallelism" (GShard, Switch Transformer, DeepSeek-V3): a MoE layer's E routed
   experts are split over the ep ranks of a group, each holding E/ep of them, while everything
   else (attention, norms, the router, the shared expert) stays replicated as under data
   parallelism. Each rank routes and permutes its own tokens as one rank would (rows grouped by
   global expert, // >>moe), then
     counts    an all-gather of every peer's kept tokens per expert, so each rank knows how many
               rows it gets from every peer for each of its experts (and how many it sends);
     dispatch  an all-to-all with those uneven counts: peer p receives the rows of its experts
               [p·E/ep, (p+1)·E/ep), one contiguous run since rows are grouped by expert. The rows
               arrive by source rank and are rearranged expert-major, so each local expert's rows
               are one GEMM;
     experts   as on one rank, on the E/ep local experts;
     combine   the reverse rearrangement and the reverse all-to-all bring every output row home,
               where the gates combine them as before.
   The backward mirrors it: the expert outputs' gradients travel like the dispatch, the expert
   inputs' gradients come back like the combine.
   Groups (Megatron's folding of ep over data parallelism): the ep group is ep consecutive ranks
   of dp×cp; the ranks holding the same experts — dp·cp/ep of them, the expert-data-parallel
   group — sum their expert gradients (units of their own, // >>dp), every other gradient is
   summed over dp×cp. Each rank's loss gradient is already scaled by the global batch, and every
   token's contribution to an expert reaches the expert's rank, so both sums are the global
   gradient. ZeRO shards each kind over its own group the same way (// >>zero). The router
   bias and the routing statistics are summed over dp×cp (us__moe_step_end), the statistics then
   over the pipeline stages. Under pipeline parallelism the ep groups are per stage.
   Tensor parallelism does not split a MoE layer: every tp rank runs it whole on the same tokens
   (the experts are replicated over tp, the compute repeated; under sequence parallelism the tp
   group's tokens are gathered first, us__moe_fwd), so its input gradient needs no all-reduce;
   each tp index has its own dp×cp group, hence its own ep and expert-dp groups.
   Buffers: without a capacity limit nothing bounds how many rows a rank receives below every
   row of every peer, so the expert-side tensors hold ep·R rows; with one, each peer sends at most
   cap rows per expert, E/ep·cap per rank (us__moe_rx, us__moe_bytes). Memory per rank then stays
   near one rank's (cf·N·K rows) instead of growing with ep: a capacity factor is what keeps
   expert parallelism's activation memory bounded. */

/* Checks expert parallelism: a MoE model, ep dividing dp x cp and the experts
   (us_config_validate). */
static us_result us__ep_checks(const us_model_config *mc, const us_train_config *tc, char *err,
                               size_t errlen) {
    if (tc->ep < 1) US__BAD("ep=%d must be at least 1", tc->ep);
    if (tc->ep > 1 && !mc->moe_experts)
        US__BAD("expert parallelism (ep=%d) needs a MoE model: set experts > 0", tc->ep);
    if (tc->ep > 1 && (tc->dp * tc->cp) % tc->ep)
        US__BAD("ep=%d must divide dp x cp = %d (the expert-parallel group folds over the "
                "data-parallel ranks)",
                tc->ep, tc->dp * tc->cp);
    if (tc->ep > 1 && mc->moe_experts % tc->ep)
        US__BAD("ep=%d must divide experts=%d (each rank holds experts/ep of them)", tc->ep,
                mc->moe_experts);
    return US_OK;
}

static us_result us__ep_init(us_model *m) {
    us_result r;
    int R = m->mesh.dpcp_g.rank, ep = us__ep_size(&m->tc);
    m->ep = ep;
    m->ep_rank = 0;
    if (ep <= 1) return US_OK;
    if ((r = m->comm->split(m->comm, &m->mesh.dpcp_g, R / ep, R, &m->ep_g)) != US_OK)
        return us__comm_fail(m, r, "the expert-parallel group");
    if ((r = m->comm->split(m->comm, &m->mesh.dpcp_g, R % ep, R, &m->edp_g)) != US_OK)
        return us__comm_fail(m, r, "the expert-data-parallel group");
    m->ep_rank = m->ep_g.rank;
    return US_OK;
}

static void us__ep_free(us_model *m) {
    if (m->comm && m->comm->group_free) {
        if (m->ep_g.size) m->comm->group_free(m->comm, &m->ep_g);
        if (m->edp_g.size) m->comm->group_free(m->comm, &m->edp_g);
    }
    memset(&m->ep_g, 0, sizeof m->ep_g);
    memset(&m->edp_g, 0, sizeof m->edp_g);
}

/* Every ep peer's kept tokens per expert, kept i32[E] (backend) → host us__ep_cnt(m, l) [ep][E]. */
static us_result us__ep_counts(us_model *m, int l, const int32_t *kept, int32_t *scratch) {
    int E = m->cfg.moe_experts;
    us_result r = m->comm->all_gather(m->comm, &m->ep_g, scratch, kept, E, US_I32, NULL);
    if (r != US_OK) return us__comm_fail(m, r, "expert-parallel count exchange");
    m->ops.copy(&m->ops, us__ep_cnt(m, l), scratch, (size_t)m->ep * E * 4, US_COPY_D2H);
    return US_OK;
}

/* Moves rows of C elements between this rank's tokens and its experts, by layer l's counts.
   dir 0 (dispatch): src [rows, C], this rank's kept rows grouped by global expert → dst, the
   rows of this rank's experts, expert-major (within an expert by source rank).
   dir 1 (combine): the reverse. transit [ep·R, C] holds the rows by source rank. */
static us_result us__ep_move(us_model *m, int l, int dir, void *dst, const void *src,
                             void *transit) {
    us_ops *o = &m->ops;
    us_dtype dt = m->dt;
    int E = m->cfg.moe_experts, ep = m->ep, El = E / ep, me = m->ep_rank, s, j, e;
    int64_t C = m->cfg.dim, *a = (int64_t *)US_MALLOC(sizeof(int64_t) * 4 * (size_t)ep), *sc = a,
            *sd = a + ep, *rc = a + 2 * ep, *rd = a + 3 * ep;
    int64_t so, eo, n, *lo;
    const int32_t *cnt = us__ep_cnt(m, l); /* [ep][E] kept rows per (source, expert) */
    size_t rowb = (size_t)C * us_dtype_size(dt);
    us_result r;
    if (!a) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    /* sc/sd: what this rank's tokens send to each peer; rc/rd: what its experts get from each */
    for (s = 0, so = 0, eo = 0; s < ep; s++) {
        for (e = s * El, n = 0; e < (s + 1) * El; e++) n += cnt[(size_t)me * E + e];
        sc[s] = n * C;
        sd[s] = so;
        so += n * C;
        for (j = 0, n = 0; j < El; j++) n += cnt[(size_t)s * E + me * El + j];
        rc[s] = n * C;
        rd[s] = eo;
        eo += n * C;
    }
    US_ASSERT(eo <= m->moe_rx * C);
    lo = (int64_t *)US_MALLOC(sizeof(int64_t) *
                              (size_t)El); /* where each local expert's rows start, expert-major */
    if (!lo) {
        US_FREE(a);
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    for (j = 0, n = 0; j < El; j++) {
        lo[j] = n;
        for (s = 0; s < ep; s++) n += cnt[(size_t)s * E + me * El + j];
    }
    if (dir == 0) {
        r = m->comm->all_to_all(m->comm, &m->ep_g, transit, rc, rd, src, sc, sd, dt, NULL);
        if (r != US_OK) {
            US_FREE(a);
            US_FREE(lo);
            return us__comm_fail(m, r, "expert-parallel dispatch all-to-all");
        }
    }
    /* block (source s, expert j): at rd[s] + its earlier experts by source, at lo[j] + earlier
       sources expert-major */
    for (s = 0; s < ep; s++)
        for (j = 0, so = rd[s] / C; j < El; j++) {
            int64_t k = cnt[(size_t)s * E + me * El + j], t;
            for (t = 0, eo = lo[j]; t < s; t++) eo += cnt[(size_t)t * E + me * El + j];
            if (k && dir == 0)
                o->copy(o, (char *)dst + (size_t)eo * rowb,
                        (const char *)transit + (size_t)so * rowb, (size_t)k * rowb, US_COPY_D2D);
            if (k && dir == 1)
                o->copy(o, (char *)transit + (size_t)so * rowb,
                        (const char *)src + (size_t)eo * rowb, (size_t)k * rowb, US_COPY_D2D);
            so += k;
        }
    if (dir == 1) {
        r = m->comm->all_to_all(m->comm, &m->ep_g, dst, sc, sd, transit, rc, rd, dt, NULL);
        if (r != US_OK) {
            US_FREE(a);
            US_FREE(lo);
            return us__comm_fail(m, r, "expert-parallel combine all-to-all");
        }
    }
    US_FREE(a);
    US_FREE(lo);
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>fp8-linear  FP8 training: a linear layer's Fprop, Dgrad and Wgrad GEMMs in E4M3
/* ------------------------------------------------------------------------------------ */
/* The Playbook's FP8 recipe as DeepSeek-V3 trains with it, for y = x·Wᵀ, x [N][In], W [Out][In]:
       GEMM    computes        a (activation side)                 b (weight side)
       Fprop   y   = x·Wᵀ      x   1×128 tiles along In            W   128×128 blocks
       Dgrad   dx  = dy·W      dy  1×128 tiles along Out           Wᵀ  128×128 blocks
       Wgrad   dW += dyᵀ·x     dyᵀ 128×1 tiles of dy (over tokens) xᵀ  128×1 tiles of x
   Every operand is quantised online (amax of this very tensor, no history) from the bf16 tensor
   the bf16 policy would use, into the FP8 scratch, just before its GEMM; the backward GEMMs that
   reduce over the other dimension quantise a second time from bf16 (dy, x along tokens; W
   transposed), never by transposing an already quantised tensor. dy's two copies come from one
   read (us_ops.fp8_quantize_both): Dgrad writes the 128×1 copy beside its own operand and leaves
   it in the scratch (qk, sk) for the Wgrad of the same dy, which follows. The Fprop inputs that
   an RMSNorm or SwiGLU writes just before (ln1 → qkv, ln2 → gate|up, h → down) get their 1×128
   tiles from that kernel (us_ops.rmsnorm_fwd_fp8, swiglu_fwd_fp8; us__fp8_pre): the same bytes
   without a second read of the bf16 output. That output is still written and kept, since the
   Wgrad's 128×1 copy is quantised from it in the backward (and SP gathers it). Backward, the
   gate|up linear's output gradient dgu gets both its operands (1×128 for Dgrad, 128×1 for Wgrad)
   from SwiGLU's backward (us_ops.swiglu_bwd_fp8; us__fp8_dy), and dgu itself, which nothing else
   reads, is not stored in bf16. The GEMMs
   accumulate in fp32 (promotion every 128) and write bf16 activations or add into the fp32
   weight gradients.
   Embedding, LM head, norms, attention and the MoE router stay bf16; master weights and moments
   fp32. A MoE layer's experts take the same three GEMMs, expert by expert (us__fp8_expert).
   fp8-tensor (US_PRECISION_FP8_TENSOR) uses one scale per tensor instead: the simpler recipe,
   which one outlier channel can ruin. tc.fp8_pow2 rounds scales up to 2^e.
   Sizes: tiles cut at the tensor's edge are padded with zeros (partial tiles), so any size
   works; a GEMM whose N, In or Out is not a multiple of 16 falls back to bf16 (the model line
   reports how many linears run in FP8). */

/* Checks the FP8 settings apply to the FP8 precisions only (us_config_validate). */
static us_result us__fp8_checks(const us_train_config *tc, char *err, size_t errlen) {
    if (tc->fp8_pow2 && tc->precision != US_PRECISION_FP8 &&
        tc->precision != US_PRECISION_FP8_TENSOR)
        US__BAD("fp8_pow2 applies to the fp8 and fp8-tensor precisions only, not %s",
                us_precision_name(tc->precision));
    if (tc->fp8_no_wcache && tc->precision != US_PRECISION_FP8 &&
        tc->precision != US_PRECISION_FP8_TENSOR)
        US__BAD("fp8_no_wcache applies to the fp8 and fp8-tensor precisions only, not %s",
                us_precision_name(tc->precision));
    if (tc->fp8_min_dim < 0)
        US__BAD("fp8_min_dim=%d must be >= 0 (0 = the default, %d)", tc->fp8_min_dim,
                US_FP8_MIN_DIM);
    if (tc->fp8_min_dim && tc->precision != US_PRECISION_FP8 &&
        tc->precision != US_PRECISION_FP8_TENSOR)
        US__BAD("fp8_min_dim applies to the fp8 and fp8-tensor precisions only, not %s",
                us_precision_name(tc->precision));
    if (tc->fp8_experts != 0 && tc->fp8_experts != 1)
        US__BAD("fp8_experts=%d must be 0 or 1", tc->fp8_experts);
    if (tc->fp8_experts && tc->precision != US_PRECISION_FP8 &&
        tc->precision != US_PRECISION_FP8_TENSOR)
        US__BAD("fp8_experts applies to the fp8 and fp8-tensor precisions only, not %s",
                us_precision_name(tc->precision));
    return US_OK;
}

/* FP8 (// >>fp8-linear): an operand P[R][L] as fp8_quantize writes it: R·Lp bytes, and the
   larger of the ROW128 and BLOCK128 scale tensors */
static size_t us__fp8_operand(int64_t R, int64_t L, size_t *sbytes) {
    int64_t LB = (L + US_FP8_TILE - 1) / US_FP8_TILE, RB = (R + US_FP8_TILE - 1) / US_FP8_TILE,
            LBp = (LB + 3) / 4 * 4;
    int64_t ns = LB * R > RB * LBp ? LB * R : RB * LBp;
    *sbytes = (size_t)(ns > 1 ? ns : 1) * 4;
    return (size_t)(R * LB * US_FP8_TILE);
}

/* A dense layer's four linears, qkv, o, gate|up, down, as (In, Out) per rank */
static void us__fp8_linears(int64_t io[4][2], int64_t C, int64_t QKV, int64_t AO, int64_t F) {
    io[0][0] = C;
    io[0][1] = QKV;
    io[1][0] = AO;
    io[1][1] = C;
    io[2][0] = C;
    io[2][1] = 2 * F;
    io[3][0] = F;
    io[3][1] = C;
}

/* The scratch of the quantised copies: the largest a (activation side) and b (weight side)
   operand over the three GEMMs of the dense layers' four linears (N tokens; per-rank dims) and,
   in a MoE model (Rx > 0), of the experts' two (C → 2Fe, Fe → C; up to Rx rows, all a rank's
   experts may get, us__moe_rx), and the largest dyᵀ that Dgrad keeps for Wgrad (k), laid out
   qa | sa | qb | sb | qk | sk; off gets the offsets of sa, qb, sb, qk, sk. Linears under the size
   rule (In or Out < lo, us__fp8_on) never run in FP8 and take no room. The estimator counts the
   same. */
static size_t us__fp8_scratch(int64_t N, int64_t C, int64_t QKV, int64_t AO, int64_t F, int64_t Rx,
                              int64_t Fe, int64_t lo, size_t off[5]) {
    int64_t io[6][2];
    size_t qa = 0, sa = 0, qb = 0, sb = 0, qk = 0, sk = 0, q, sz;
    int i, j;
    us__fp8_linears(io, C, QKV, AO, F);
    io[4][0] = io[5][1] = C; /* the experts' gate|up and down */
    io[4][1] = 2 * Fe;
    io[5][0] = Fe;
    for (i = 0; i < (Rx > 0 ? 6 : 4); i++) {
        int64_t In = io[i][0], Out = io[i][1], a[3][2], b[3][2];
        if (i == 4) N = Rx;
        if (In < lo || Out < lo) continue;
        a[0][0] = N;
        a[0][1] = In;
        a[1][0] = N;
        a[1][1] = Out;
        a[2][0] = Out;
        a[2][1] = N; /* Fprop x, Dgrad dy, Wgrad dyᵀ */
        b[0][0] = Out;
        b[0][1] = In;
        b[1][0] = In;
        b[1][1] = Out;
        b[2][0] = In;
        b[2][1] = N; /* W, Wᵀ, xᵀ */
        for (j = 0; j < 3; j++) {
            q = us__fp8_operand(a[j][0], a[j][1], &sz);
            if (q > qa) qa = q;
            if (sz > sa) sa = sz;
            q = us__fp8_operand(b[j][0], b[j][1], &sz);
            if (q > qb) qb = q;
            if (sz > sb) sb = sz;
        }
        q = us__fp8_operand(a[2][0], a[2][1], &sz);
        if (q > qk) qk = q;
        if (sz > sk) sk = sz;
    }
    off[0] = us__align(qa);
    off[1] = off[0] + us__align(sa);
    off[2] = off[1] + us__align(qb);
    off[3] = off[2] + us__align(sb);
    off[4] = off[3] + us__align(qk);
    return off[4] + us__align(sk);
}

/* The weight cache (// >>fp8-linear): one layer's part, for its four linears (qkv, o, gate|up,
   down; In → Out per rank): the operands of W [Out][In] and of Wᵀ [In][Out] as fp8_quantize
   writes them, laid out q | s | qᵀ | sᵀ per linear; off[i] gets linear i's four offsets and
   dim[i] its (Out, In). A linear whose sizes are not multiples of 16, or under the size rule
   (In or Out < lo), never runs in FP8 and takes no room: its dim stays (0, 0). The estimator
   counts the same. */
static size_t us__fp8_wcache_layer(int64_t C, int64_t QKV, int64_t AO, int64_t F, int64_t lo,
                                   size_t off[4][4], int64_t dim[4][2]) {
    int64_t io[4][2];
    size_t at = 0, sb, q;
    int i;
    us__fp8_linears(io, C, QKV, AO, F);
    for (i = 0; i < 4; i++) {
        int64_t In = io[i][0], Out = io[i][1];
        off[i][0] = off[i][1] = off[i][2] = off[i][3] = at;
        dim[i][0] = dim[i][1] = 0;
        if (In % 16 || Out % 16 || In < lo || Out < lo) continue;
        dim[i][0] = Out;
        dim[i][1] = In;
        q = us__fp8_operand(Out, In, &sb);
        off[i][1] = at += us__align(q);
        off[i][2] = at += us__align(sb);
        q = us__fp8_operand(In, Out, &sb);
        off[i][3] = at += us__align(q);
        at += us__align(sb);
    }
    return at;
}

/* the size rule's bound: the smallest In and Out of a linear that runs in FP8 (us__fp8_on) */
static int64_t us__fp8_min_dim(const us_train_config *tc) {
    return tc->fp8_min_dim > 0 ? tc->fp8_min_dim : US_FP8_MIN_DIM;
}

/* whether the model keeps the weight cache: fp8 (either), not asked off, the weights resident */
static int us__fp8_wcache_on(const us_train_config *tc) {
    return (tc->precision == US_PRECISION_FP8 || tc->precision == US_PRECISION_FP8_TENSOR) &&
           !tc->fp8_no_wcache && tc->zero < 3;
}

/* A linear GEMM of N tokens, In → Out runs in FP8 when the policy says so, all three sizes are
   multiples of 16 (FP8 tensor cores' alignment) and In and Out are at least tc.fp8_min_dim
   (US_FP8_MIN_DIM by default); otherwise in bf16. The size rule: quantising the operands costs
   in proportion to In + Out, the faster GEMM saves in proportion to In·Out, so small linears
   lose; US_FP8_MIN_DIM is where FP8 measured faster on an H200 (bench/RESULTS.md). */
static int us__fp8_on(const us_model *m, int64_t N, int64_t In, int64_t Out) {
    int64_t lo = us__fp8_min_dim(&m->tc);
    return m->fp8 && N > 0 && N % 16 == 0 && In % 16 == 0 && Out % 16 == 0 && In >= lo && Out >= lo;
}

/* The FP8 scratch in the arena (// >>model): the linear GEMMs' quantised operands for Nf rows,
   one action's; set: their offsets into m->fp8_off; count: which dense linears run in FP8, for
   the model line. */
static size_t us__fp8_arena(us_model *m, int64_t Nf, int set, int count) {
    const us_model_config *c = &m->cfg;
    int64_t C = c->dim, HS = C / c->n_heads, F = m->ffn_l;
    int64_t QKV = (int64_t)(m->nh_l + 2 * m->nkv_l) * HS, AO = (int64_t)m->nh_l * HS, io[4][2];
    size_t off[5] = {0, 0, 0, 0, 0}, sz;
    int l, i;
    int64_t Rx = c->moe_experts ? us__moe_rx(c, &m->tc, us__moe_tokens(m)) : 0;
    sz = m->fp8
             ? us__fp8_scratch(Nf, C, QKV, AO, F, Rx, c->moe_ffn_dim, us__fp8_min_dim(&m->tc), off)
             : 0;
    if (set) memcpy(m->fp8_off, off, sizeof off);
    if (!count) return sz;
    us__fp8_linears(io, C, QKV, AO, F);
    m->fp8_linear = m->fp8_linear_all = 0;
    for (l = 0; l < c->n_layers; l++)
        for (i = 0; i < 4; i++) {
            if (i >= 2 && m->moe_idx && m->moe_idx[l] >= 0) continue; /* experts: us__fp8_expert */
            m->fp8_linear_all++;
            m->fp8_linear += us__fp8_on(m, Nf, io[i][0], io[i][1]);
        }
    return sz;
}

/* FP8 training's set-up: the weight cache, one part per layer (us__fp8_wcache_layer), and each
   entry's key, the weight it caches. No linear in FP8 (all under the size rule): no cache. */
static us_result us__fp8_init(us_model *m) {
    int HS = (int)(m->cfg.dim / m->cfg.n_heads), nl = m->cfg.n_layers, li, k;
    int64_t QKV = (int64_t)(m->nh_l + 2 * m->nkv_l) * HS, AO = (int64_t)m->nh_l * HS;
    int pk[4] = {US__P_Q, US__P_O, US__P_GATE, US__P_DOWN};
    if (!us__fp8_wcache_on(&m->tc)) return US_OK;
    m->fp8_wlayer = us__fp8_wcache_layer(m->cfg.dim, QKV, AO, m->ffn_l, us__fp8_min_dim(&m->tc),
                                         m->fp8_woff, m->fp8_wdim);
    if (m->fp8_wlayer) m->fp8_wc = (char *)m->ops.alloc(&m->ops, m->fp8_wlayer * (size_t)nl);
    m->fp8_wkey = (const void **)calloc((size_t)(4 * nl), sizeof(void *));
    m->fp8_wok = (unsigned char *)calloc((size_t)(4 * nl), 1);
    if ((m->fp8_wlayer && !m->fp8_wc) || !m->fp8_wkey || !m->fp8_wok) {
        us__model_set_error(
            m, "out of memory for the FP8 weight cache (%.1f MiB; tc.fp8_no_wcache does without)",
            (double)m->fp8_wlayer * nl / 1048576.0);
        return US_ERR_OOM;
    }
    for (li = 0; li < nl; li++)
        for (k = 0; k < 4; k++) m->fp8_wkey[4 * li + k] = us__weight(m, US__TENSOR(li, pk[k]));
    return US_OK;
}

/* C[M][N] = a·bᵀ + beta·C in FP8: a is the stored tensor xa [ar][ac] (or its transpose, atr),
   quantised with tiling at; b likewise; K is the shared dimension. Both go through the model's
   FP8 scratch (two operands at a time), then one fp8_gemm with row stride N. keep (a Dgrad's dy):
   also write aᵀ's operand into qk, sk for the Wgrad; kept (that Wgrad): a is already there;
   pre (an Fprop after a fused norm or SwiGLU, us__fp8_pre, or a Dgrad after a fused SwiGLU
   backward, us__fp8_dy): a is already in qa, sa.
   wc (a weight's Fprop or Dgrad) non-NULL: b is already quantised there, in the weight cache. */
enum { US__FP8_FRESH, US__FP8_KEEP, US__FP8_KEPT, US__FP8_PRE };

typedef struct us__fp8_opnd {
    const uint8_t *q;
    const float *s;
} us__fp8_opnd;

static void us__fp8_mm(us_model *m, const void *xa, int64_t ar, int64_t ac, int at, int atr,
                       const void *xb, int64_t br, int64_t bc, int bt, int btr, float beta, void *C,
                       us_dtype cdt, int keep, const us__fp8_opnd *wc) {
    us_ops *o = &m->ops;
    char *base = (char *)m->a[US__A_FP8];
    uint8_t *qa = (uint8_t *)base, *qb = (uint8_t *)(base + m->fp8_off[1]),
            *qk = (uint8_t *)(base + m->fp8_off[3]);
    float *sa = (float *)(base + m->fp8_off[0]), *sb = (float *)(base + m->fp8_off[2]),
          *sk = (float *)(base + m->fp8_off[4]);
    int64_t M = atr ? ac : ar, K = atr ? ar : ac, N = btr ? bc : br;
    if (keep != US__FP8_PRE) m->fp8_pre = NULL; /* qa may change */
    if (keep == US__FP8_KEPT) {
        qa = qk;
        sa = sk;
    } else if (keep == US__FP8_KEEP)
        o->fp8_quantize_both(o, qa, sa, qk, sk, xa, m->dt, ar, ac, at, m->tc.fp8_pow2);
    else if (keep == US__FP8_FRESH)
        o->fp8_quantize(o, qa, sa, xa, m->dt, ar, ac, at, atr, m->tc.fp8_pow2);
    if (wc) {
        qb = (uint8_t *)wc->q;
        sb = (float *)wc->s;
    } else
        o->fp8_quantize(o, qb, sb, xb, m->dt, br, bc, bt, btr, m->tc.fp8_pow2);
    o->fp8_gemm(o, M, N, K, 1.0f, qa, sa, at, qb, sb, bt, beta, C, cdt, N);
}

/* the activation side's tiling and the weight side's (fp8-tensor: one scale per tensor for both) */
static int us__fp8_act(const us_model *m) { return m->fp8 == 2 ? US_FP8_TENSOR : US_FP8_ROW128; }

static int us__fp8_wt(const us_model *m) { return m->fp8 == 2 ? US_FP8_TENSOR : US_FP8_BLOCK128; }

/* The weight cache: W's operand (trans 0, Fprop) or Wᵀ's (trans 1, Dgrad) of the weight W
   [Out][In], from the cache, made (both at once) at its first use since the weights last
   changed; 0 if W has no entry (no cache, or not a dense linear's weight of these sizes: then
   the caller quantises into the scratch, as without a cache). Both operands come from the bf16
   W as it is at that first use, so they equal what quantising at every GEMM gives while W stays
   the same, which it does between optimizer steps (us_model_weights_changed has the rules). */
static int us__fp8_wcache(us_model *m, const void *W, int64_t Out, int64_t In, int trans,
                          us__fp8_opnd *op) {
    int e, n = 4 * m->cfg.n_layers;
    const size_t *off;
    char *base;
    if (!m->fp8_wc) return 0;
    for (e = 0; e < n && m->fp8_wkey[e] != W; e++) {
    }
    if (e == n || m->fp8_wdim[e % 4][0] != Out || m->fp8_wdim[e % 4][1] != In) return 0;
    off = m->fp8_woff[e % 4];
    base = m->fp8_wc + (size_t)(e / 4) * m->fp8_wlayer;
    if (!m->fp8_wok[e]) {
        us_ops *o = &m->ops;
        uint8_t *q = (uint8_t *)(base + off[0]), *qt = (uint8_t *)(base + off[2]);
        float *s = (float *)(base + off[1]), *st = (float *)(base + off[3]);
        if (o->fp8_quantize_both)
            o->fp8_quantize_both(o, q, s, qt, st, W, m->dt, Out, In, us__fp8_wt(m), m->tc.fp8_pow2);
        else {
            o->fp8_quantize(o, q, s, W, m->dt, Out, In, us__fp8_wt(m), 0, m->tc.fp8_pow2);
            o->fp8_quantize(o, qt, st, W, m->dt, Out, In, us__fp8_wt(m), 1, m->tc.fp8_pow2);
        }
        m->fp8_wok[e] = 1;
    }
    op->q = (const uint8_t *)(base + off[trans ? 2 : 0]);
    op->s = (const float *)(base + off[trans ? 3 : 1]);
    return 1;
}

/* the weights changed: the cache is made again at each weight's next use. (A MoE layer's two FFN
   entries stay unused: its experts quantise their weights at each GEMM, us__fp8_expert.) */
static void us__fp8_wcache_drop(us_model *m) {
    if (m->fp8_wok) memset(m->fp8_wok, 0, (size_t)(4 * m->cfg.n_layers));
}

US_API void us_model_weights_changed(us_model *m) { us__fp8_wcache_drop(m); }

/* Fprop: y[N][Out] = x[N][In]·Wᵀ + beta·y */
static void us__linear_fwd(us_model *m, int64_t N, int64_t In, int64_t Out, const void *x,
                           const void *W, float beta, void *y) {
    us_ops *o = &m->ops;
    int pre = m->fp8_pre == x && m->fp8_pre_n == N && m->fp8_pre_c == In;
    m->fp8_pre = NULL; /* an operand made ahead serves the one Fprop that follows its kernel */
    if (!us__fp8_on(m, N, In, Out)) {
        o->gemm(o, 0, 1, N, Out, In, 1.0f, x, m->dt, In, W, m->dt, In, beta, y, m->dt, Out);
        return;
    }
    us__fp8_opnd wc;
    int cached = us__fp8_wcache(m, W, Out, In, 0, &wc);
    us__fp8_mm(m, x, N, In, us__fp8_act(m), 0, W, Out, In, us__fp8_wt(m), 0, beta, y, m->dt,
               pre ? US__FP8_PRE : US__FP8_FRESH, cached ? &wc : NULL);
}

/* Both fusions below: where the fused kernel is to write t's 1×128 operand (qa, sa of the FP8
   scratch) when `on`, with t [N, c] marked as its owner for the GEMM that reads it next; NULL (and
   no mark) otherwise */
static uint8_t *us__fp8_mark(us_model *m, const void *t, int64_t N, int64_t c, int on, float **s) {
    char *base = (char *)m->a[US__A_FP8];
    m->fp8_pre = NULL;
    if (!on) return NULL;
    m->fp8_pre = t;
    m->fp8_pre_n = N;
    m->fp8_pre_c = c;
    *s = (float *)(base + m->fp8_off[0]);
    return (uint8_t *)base;
}

/* Fusion (FP8 training with 1×128 tiles): the Fprop of a linear In → Out on N rows of x takes x's
   operand from the kernel that writes x (us_ops.rmsnorm_fwd_fp8, swiglu_fwd_fp8) when it runs in
   FP8 and the backend has the op. Returns where that operand goes (qa, sa of the FP8 scratch,
   which the Fprop reads next) and marks x as its owner; NULL: write x alone. The bytes are those
   the Fprop's own quantisation of x would write, so fusing changes no result; it saves that
   quantisation's read of x (2 bytes an element) and a launch. fp8-tensor is not fused: its one
   scale needs the whole tensor's amax before the first byte. */
static uint8_t *us__fp8_pre(us_model *m, const void *x, int64_t N, int64_t In, int64_t Out,
                            int have_op, float **s) {
    return us__fp8_mark(m, x, N, In, have_op && m->fp8 == 1 && us__fp8_on(m, N, In, Out), s);
}

/* The backward's fusion (FP8 training with 1×128 tiles): the Dgrad of a linear In → Out on N rows
   of its output gradient dy, and the Wgrad of the same dy right after it, take dy's two operands
   from the kernel that forms dy (us_ops.swiglu_bwd_fp8) when the linear runs in FP8 and the backend
   has the op. Returns where the 1×128 operand goes (qa, sa, which the Dgrad reads) and, in *qt,
   *st, the 128×1 one (qk, sk, which it leaves for the Wgrad), and marks dy as their owner; NULL:
   form dy alone. The bytes are those of fp8_quantize_both on dy, so fusing changes no result; it
   saves dy's bf16 store and the quantiser's read of it (4 bytes an element) and a launch. Off
   where the Wgrad does not follow (a zero-bubble B keeps dy for W) and under fp8-tensor. */
static uint8_t *us__fp8_dy(us_model *m, const void *dy, int64_t N, int64_t In, int64_t Out,
                           int have_op, float **s, uint8_t **qt, float **st) {
    uint8_t *q =
        us__fp8_mark(m, dy, N, Out, have_op && m->fp8 == 1 && us__fp8_on(m, N, In, Out), s);
    if (q) {
        *qt = q + m->fp8_off[3];
        *st = (float *)(q + m->fp8_off[4]);
    }
    return q;
}

/* ln [N,C] = rmsnorm(x [N,C])·w, rstd [N]; fuse: the linear C → Out that reads ln next runs on
   these N rows right after, so ln's 1×128 operand comes from the norm's kernel (us__fp8_pre) */
static void us__norm_fwd(us_model *m, void *ln, float *rstd, const void *x, int widx, int64_t N,
                         int64_t Out, int fuse) {
    us_ops *o = &m->ops;
    int64_t C = m->cfg.dim;
    float *s = NULL;
    uint8_t *q = us__fp8_pre(m, ln, N, C, Out, fuse && o->rmsnorm_fwd_fp8, &s);
    if (q)
        o->rmsnorm_fwd_fp8(o, ln, rstd, q, s, x, us__weight(m, widx), N, C, m->cfg.norm_eps, m->dt,
                           m->tc.fp8_pow2);
    else
        o->rmsnorm_fwd(o, ln, rstd, x, us__weight(m, widx), N, C, m->cfg.norm_eps, m->dt);
}

/* hᵀ's 128×1 operand as the layer keeps it in h's bytes (A->h_t): qt u8[F][Lp], then st
   f32[Lp/128][F], Lp = Np rounded up to 128; bytes non-NULL: the two's size */
static us__fp8_opnd us__h_t(const us_layer_acts *A, int64_t Np, int64_t F, size_t *bytes) {
    const uint8_t *qt = (const uint8_t *)A->h;
    int64_t Lp = us__fp8_padded(Np);
    us__fp8_opnd t = {qt, (const float *)(qt + F * Lp)};
    if (bytes) *bytes = (size_t)(F * Lp) + (size_t)(Lp / 128 * F) * 4;
    return t;
}

/* h [Np,F] = swiglu(gu [Np,2F]); fuse: the down linear F → C runs next on these rows (no
   recomputation, no SP gather), so h's 1×128 operand comes from SwiGLU's kernel (us__fp8_pre).
   Its Wgrad, in the backward, then reads h only through hᵀ's 128×1 operand: that one is made here
   too, from the same kernel, and kept in h's own bytes instead of h (A->h_t: 1 + 4/128 bytes an
   element where h takes 2), which saves h's store now and the quantiser's read of h in the
   backward. The bytes are those the Wgrad's own quantisation of h gives, so nothing else changes.
   A recomputing forward writes h itself (its Wgrad reads that). */
static void us__swiglu_fwd(us_model *m, us_layer_acts *A, int64_t N, int64_t Np, int64_t F,
                           int fuse) {
    us_ops *o = &m->ops;
    size_t kept = 0;
    float *s = NULL;
    uint8_t *q = us__fp8_pre(m, A->h, N, F, m->cfg.dim, fuse && o->swiglu_fwd_fp8, &s);
    us__fp8_opnd t = us__h_t(A, Np, F, &kept);
    A->h_t = q && kept <= (size_t)(Np * F) * us_dtype_size(m->dt);
    if (!q)
        o->swiglu_fwd(o, A->h, A->gu, Np, F, m->dt);
    else if (A->h_t)
        o->swiglu_fwd_fp8(o, NULL, q, s, (uint8_t *)t.q, (float *)t.s, A->gu, Np, F, m->dt,
                          m->tc.fp8_pow2);
    else
        o->swiglu_fwd_fp8(o, A->h, q, s, NULL, NULL, A->gu, Np, F, m->dt, m->tc.fp8_pow2);
}

/* The residual branch's end, y[N][Out] = res + x·Wᵀ (res: the residual stream, which under tp
   only rank 0 adds, us__tp_residual): in the GEMM's epilogue where the backend can (gemm_res),
   else a copy and a GEMM that accumulates (beta 1). */
static void us__linear_fwd_res(us_model *m, int64_t N, int64_t In, int64_t Out, const void *x,
                               const void *W, const void *res, void *y) {
    us_ops *o = &m->ops;
    if (o->gemm_res && (m->tc.tp <= 1 || m->mesh.tp_rank == 0) && !us__fp8_on(m, N, In, Out)) {
        o->gemm_res(o, N, Out, In, x, W, res, y, m->dt);
        return;
    }
    us__tp_residual(m, y, res, N * Out);
    us__linear_fwd(m, N, In, Out, x, W, 1.0f, y);
}

/* Dgrad: dx[N][In] = dy[N][Out]·W + beta·dx. keep: the Wgrad of this same dy comes next (nothing
   writes dy in between), so dy's 128×1 copy is made now, from the same read. dy marked by
   us__fp8_dy: both copies are already in the scratch, written by the kernel that formed dy. */
static void us__linear_dgrad(us_model *m, int64_t N, int64_t In, int64_t Out, const void *dy,
                             const void *W, float beta, void *dx, int keep) {
    us_ops *o = &m->ops;
    int pre = m->fp8_pre == dy && m->fp8_pre_n == N && m->fp8_pre_c == Out;
    m->fp8_pre = NULL;
    if (!us__fp8_on(m, N, In, Out)) {
        o->gemm(o, 0, 0, N, In, Out, 1.0f, dy, m->dt, Out, W, m->dt, In, beta, dx, m->dt, In);
        return;
    }
    us__fp8_opnd wc;
    int cached = us__fp8_wcache(m, W, Out, In, 1, &wc);
    keep = keep && (pre || o->fp8_quantize_both);
    us__fp8_mm(m, dy, N, Out, us__fp8_act(m), 0, W, Out, In, us__fp8_wt(m), 1, beta, dx,
               m->dt, /* Wᵀ [In][Out], from bf16 W */
               pre    ? US__FP8_PRE
               : keep ? US__FP8_KEEP
                      : US__FP8_FRESH,
               cached ? &wc : NULL);
    m->fp8_kept = keep ? dy : NULL;
    m->fp8_kept_n = N;
    m->fp8_kept_c = Out;
}

/* Wgrad: dW f32[Out][In] += dy[N][Out]ᵀ·x[N][In], reducing over the N tokens. xt non-NULL: xᵀ's
   FP8 operand, made ahead (the down linear's h, us__swiglu_fwd) */
static void us__linear_wgrad(us_model *m, int64_t N, int64_t In, int64_t Out, const void *dy,
                             const void *x, const us__fp8_opnd *xt, float *dW) {
    us_ops *o = &m->ops;
    if (!us__fp8_on(m, N, In, Out)) {
        o->gemm(o, 1, 0, Out, In, N, 1.0f, dy, m->dt, Out, x, m->dt, In, 1.0f, dW, US_F32, In);
        return;
    }
    /* dyᵀ [Out][N] and xᵀ [In][N]: 128×1 tiles of dy and x, activation tiling on both sides;
       dyᵀ's as Dgrad left it, when it did */
    int kept = m->fp8_kept == dy && m->fp8_kept_n == N && m->fp8_kept_c == Out;
    m->fp8_kept = NULL;
    us__fp8_mm(m, dy, N, Out, us__fp8_act(m), 1, x, N, In, us__fp8_act(m), 1, 1.0f, dW, US_F32,
               kept ? US__FP8_KEPT : US__FP8_FRESH, xt);
}

/* The down linear's Wgrad, dWdown f32[C][F] += dy[Np][C]ᵀ·h[Np][F], from hᵀ's operand where the
   forward kept it in h's bytes (A->h_t, us__swiglu_fwd) */
static void us__down_wgrad(us_model *m, int l, const us_layer_acts *A, int64_t Np, int64_t F,
                           const void *dy) {
    us__fp8_opnd xt = us__h_t(A, Np, F, NULL);
    us__linear_wgrad(m, Np, F, m->cfg.dim, dy, A->h, A->h_t ? &xt : NULL,
                     us__grad(m, US__TENSOR(l, US__P_DOWN)));
}

/* The MoE experts' GEMMs (// >>moe, us__moe_run) under tc.fp8_experts (by default they stay in
   the bf16 grouped GEMM): expert by expert through the same FP8 path,
   where the size rule lets the expert's linear In → Out run in FP8 (us__fp8_on), with W quantised
   at each GEMM (the weight cache holds the dense linears). Fprop and Dgrad take the first
   n − n mod 16 of the expert's n rows (FP8 tensor cores want the token count a multiple of 16;
   every output row depends on its own input row alone, so the grouped bf16 GEMM takes the last
   n mod 16), Wgrad all n (its reduction runs over the tokens, which the quantiser pads with zeros
   to whole 128-tiles). mode as us_ops.gemm_grouped's: X the linear's input side (x, or dy for
   Dgrad), Y the other, W the weight (Wgrad: its fp32 gradient). Returns the rows done in FP8. */
static int64_t us__fp8_expert(us_model *m, int mode, int64_t n, int64_t In, int64_t Out,
                              const void *X, void *W, void *Y) {
    int64_t n16 = n - n % 16;
    if (n <= 0 || !m->tc.fp8_experts || !us__fp8_on(m, 16, In, Out)) return 0;
    if (mode == US_GG_WGRAD) { /* dW [Out][In] += dyᵀ·x: 128×1 tiles of dy and x */
        us__fp8_mm(m, Y, n, Out, us__fp8_act(m), 1, X, n, In, us__fp8_act(m), 1, 1.0f, W, US_F32,
                   US__FP8_FRESH, NULL);
        return n;
    }
    if (mode == US_GG_FPROP && n16)
        us__linear_fwd(m, n16, In, Out, X, W, 0.0f, Y);
    else if (n16)
        us__linear_dgrad(m, n16, In, Out, X, W, 0.0f, Y, 0);
    return n16;
}

/* ------------------------------------------------------------------------------------ */
// >>layer  the decoder layer's forward and backward (with recomputation), the model's
/* ------------------------------------------------------------------------------------ */
static us_result us__gen_attention(us_model *m, int l, us_layer_acts *A, int64_t B, int64_t T);

/* One decoder layer forward. recompute=0 is the real forward; recompute=1 refills, before the
   layer's backward, only what the mode did not keep: none keeps all; selective keeps the GEMM
   outputs (qkv, xmid, gu) and recomputes norms, attention core and SwiGLU (the Playbook's
   "selective": cheap to recompute, expensive to store); full keeps only the layer input. */
static us_result us__layer_fwd(us_model *m, int l, int64_t B, int64_t T, int recompute) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    us_layer_acts *A = &m->acts[l];
    us_dtype dt = m->dt;
    int NH = m->nh_l, NKV = m->nkv_l,
        HS = (int)(c->dim / c->n_heads); /* this rank's heads (// >>tp) */
    int64_t N = B * T, C = c->dim, F = m->ffn_l, QKV = (int64_t)(NH + 2 * NKV) * HS,
            AO = (int64_t)NH * HS, Np, Ns;
    us_result r = US_OK;
    int mode = m->tc.recompute, sp = us__sp_on(m);
    int do_gemm = !recompute || mode == US_RECOMPUTE_FULL,
        do_cheap = !recompute || mode != US_RECOMPUTE_NONE;
    void *xnext = l + 1 < m->l_hi ? m->acts[l + 1].x : m->a[US__A_XOUT],
         *G = m->a[US__A_SPG]; /* a chunk's last layer: XOUT */
    us__sp_rows(m, N, &Np,
                &Ns); /* GEMMs run on Np rows; norms and the residual on Ns (both N without SP) */
    /* ln1 [Ns,C] = rmsnorm(x [Ns,C]), rstd1 [Ns] */
    if (do_cheap)
        us__norm_fwd(m, A->ln1, A->rstd1, A->x, US__TENSOR(l, US__P_LN1), Ns, QKV, do_gemm && !sp);
    /* qkv [Np,QKV] = ln1 · Wqkv [QKV,C]ᵀ (under SP ln1 gathered to [Np,C] first), then RoPE */
    if (do_gemm) {
        if (sp) { /* g, travelling under the GEMM */
            us__ring_gemm g = {0, C, QKV, us__weight(m, US__TENSOR(l, US__P_Q)), A->qkv, 0};
            if ((r = us__sp_gather_gemm(m, G, A->ln1, Ns, &g)) != US_OK) return r;
        } else
            us__linear_fwd(m, Np, C, QKV, A->ln1, us__weight(m, US__TENSOR(l, US__P_Q)), 0.0f,
                           A->qkv);
        if (m->gen) {
        } /* generation: RoPE at the cached positions, in us__gen_attention */
        else if (m->mesh.cp > 1)
            o->rope_at(o, A->qkv, (const int32_t *)m->a[US__A_CPPOS] + m->mesh.cp_rank * T, B, T,
                       m->tc.seq, NH, NKV, HS, m->rope_freq, 1.0f, dt);
        else
            o->rope_fwd(o, A->qkv, B, T, NH, NKV, HS, m->rope_freq, dt);
    }
    /* att [Np,NH·HS] = attention(q, k, v), lse [B,NH,T]; under CP over the ring (// >>cp);
       generating, over the KV cache (// >>sample) */
    if (do_cheap) {
        if (m->gen) {
            if ((r = us__gen_attention(m, l, A, B, T)) != US_OK) return r;
        } else if (m->mesh.cp > 1) {
            if ((r = us__cp_attention_fwd(m, A, B, T)) != US_OK) return r;
        } /* // >>cp */
        else
            o->attention_fwd(o, A->att, A->lse, A->qkv, B, T, NH, NKV, HS, dt);
        if (Np > N)
            o->zero(o, us__at(A->att, dt, N * AO),
                    (size_t)((Np - N) * AO) * us_dtype_size(dt)); /* padding rows stay zero */
    }
    /* xmid = x + att·Wo^T, rounded once (under tp: summed over the ranks' partial products) */
    if (do_gemm) {
        if (sp) {
            if ((r = us__sp_gemm_scatter(m, A->xmid, A->x, A->att, AO,
                                         us__weight(m, US__TENSOR(l, US__P_O)), Ns)) != US_OK)
                return r;
        } /* ḡ */
        else {
            us__linear_fwd_res(m, N, AO, C, A->att, us__weight(m, US__TENSOR(l, US__P_O)), A->x,
                               A->xmid);
            if ((r = us__tp_sum(m, A->xmid, N * C, dt)) != US_OK) return r;
        }
    }
    if (do_cheap) /* ln2 [Ns,C] = rmsnorm(xmid), rstd2 [Ns] (a MoE layer's router reads it) */
        us__norm_fwd(m, A->ln2, A->rstd2, A->xmid, US__TENSOR(l, US__P_LN2), Ns, 2 * F,
                     do_gemm && !sp && m->moe_idx[l] < 0);
    if (m->moe_idx[l] >= 0)
        return us__moe_fwd(m, l, N, recompute, xnext); /* a MoE layer (// >>moe) */
    /* gu [Np,2F] = ln2 · Wgu [2F,C]ᵀ, h [Np,F] = swiglu(gu) (F: this rank's FFN columns) */
    if (do_gemm) {
        if (sp) {
            us__ring_gemm g = {0, C, 2 * F, us__weight(m, US__TENSOR(l, US__P_GATE)), A->gu, 0};
            if ((r = us__sp_gather_gemm(m, G, A->ln2, Ns, &g)) != US_OK) return r;
        } else
            us__linear_fwd(m, Np, C, 2 * F, A->ln2, us__weight(m, US__TENSOR(l, US__P_GATE)), 0.0f,
                           A->gu);
    }
    if (do_cheap) /* the down linear's operands of h with it, when that linear runs next */
        us__swiglu_fwd(m, A, N, Np, F, !recompute && !sp);
    /* x_{l+1} [Ns,C] = xmid + h·Wdown [C,F]ᵀ: the next layer's input, never recomputed */
    if (!recompute) {
        if (sp)
            r = us__sp_gemm_scatter(m, xnext, A->xmid, A->h, F,
                                    us__weight(m, US__TENSOR(l, US__P_DOWN)), Ns);
        else {
            us__linear_fwd_res(m, N, F, C, A->h, us__weight(m, US__TENSOR(l, US__P_DOWN)), A->xmid,
                               xnext);
            r = us__tp_sum(m, xnext, N * C, dt);
        }
    }
    return r;
}

/* dgu [N,2F] = swiglu'(dh [N,F]) at gu [N,2F]; fuse (the gate|up Dgrad and Wgrad of dgu follow):
   dgu's two FP8 operands come from the same kernel (us__fp8_dy), and dgu, in place over gu, is
   left unwritten where the backend can (nothing but those operands reads it) */
static void us__swiglu_bwd(us_model *m, void *dgu, const void *dh, const void *gu, int64_t N,
                           int64_t F, int fuse) {
    us_ops *o = &m->ops;
    float *s = NULL, *st = NULL;
    uint8_t *qt = NULL;
    uint8_t *q = us__fp8_dy(m, dgu, N, m->cfg.dim, 2 * F, fuse && o->swiglu_bwd_fp8 && dgu == gu,
                            &s, &qt, &st);
    if (q)
        o->swiglu_bwd_fp8(o, NULL, q, s, qt, st, dh, gu, N, F, m->dt, m->tc.fp8_pow2);
    else
        o->swiglu_bwd(o, dgu, dh, gu, N, F, m->dt);
}

/* Backward of layer l. On entry dres holds ∂loss/∂x_{l+1}; on exit ∂loss/∂x_l (under SP: this
   rank's Ns rows). Weight gradients accumulate (beta = 1) in fp32. */
static us_result us__layer_bwd(us_model *m, int l, int64_t B, int64_t T) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    us_layer_acts *A = &m->acts[l];
    us_dtype dt = m->dt;
    int NH = m->nh_l, NKV = m->nkv_l, HS = (int)(c->dim / c->n_heads), sp = us__sp_on(m);
    int64_t N = B * T, C = c->dim, F = m->ffn_l, QKV = (int64_t)(NH + 2 * NKV) * HS,
            AO = (int64_t)NH * HS, Np, Ns;
    int split = m->pp_bonly; /* a zero-bubble B: weight gradients wait for W (us__layer_w) */
    void *dres = m->a[US__A_DRES], *dln = m->a[US__A_DLN], *dh = m->a[US__A_DH],
         *dgu = split ? A->g_gu : A->gu; /* in place: gu is spent once dgu is formed */
    void *datt = m->a[US__A_DATT], *dqkv = split ? A->g_qkv : m->a[US__A_DQKV],
         *G = m->a[US__A_SPG];
    void *dresF = sp ? G : dres; /* the whole residual gradient the GEMMs read */
    float *sw1 = split ? A->g_ln1 : NULL, *sw2 = split ? A->g_ln2 : NULL; /* kept for W */
    us_work *wg = NULL,
            *wd = NULL; /* SP's gather of a GEMM input, the input gradient's reduction, in flight */
    size_t rowb;
    void *dlnp;
    us_result r;
    us__sp_rows(m, N, &Np, &Ns);
    rowb = (size_t)Np * (size_t)C * us_dtype_size(dt);
    dlnp = sp ? us__at(dln, dt, (int64_t)m->mesh.tp_rank * Ns * C)
              : dln; /* where this rank's rows of dln land */
    /* MLP: x_{l+1} = xmid + swiglu(ln2·Wgu^T)·Wdown^T. Each weight gradient, once complete, is
       handed to data parallelism (us__grads_ready), which may start reducing its bucket while
       the rest of the backward runs. */
    if (m->moe_idx[l] >= 0) { /* a MoE layer (// >>moe): experts, shared expert, router */
        if ((r = us__moe_bwd(m, l, N)) != US_OK) return r;
    } else {
        if (sp) { /* ḡ's conjugate, travelling under the GEMM */
            us__ring_gemm g = {1, F, C, us__weight(m, US__TENSOR(l, US__P_DOWN)), dh, !split};
            if ((r = us__sp_gather_gemm(m, G, dres, Ns, &g)) != US_OK) return r;
        } else
            us__linear_dgrad(m, Np, F, C, dres, us__weight(m, US__TENSOR(l, US__P_DOWN)), 0.0f, dh,
                             !split);
        if (split)
            o->copy(o, A->g_down, dresF, rowb, US_COPY_D2D);
        else {
            us__down_wgrad(m, l, A, Np, F, dresF);
            if ((r = us__grads_ready(m, US__TENSOR(l, US__P_DOWN),
                                     US__TENSOR(l, US__P_DOWN) + 1)) != US_OK)
                return r;
            /* G is free: the gate|up GEMM's input again, travelling under the next two kernels */
            if (sp && (r = us__sp_gather_early(m, G, A->ln2, Ns, &wg)) != US_OK) return r;
        }
        /* dh [Np,F] = dres · Wdown [C,F]; dWdown += dresᵀ · h; dgu [Np,2F] = swiglu'(dh);
           dln [Np,C] = dgu · Wgu [2F,C]; dWgu += dguᵀ · ln2 */
        us__swiglu_bwd(m, dgu, dh, A->gu, Np, F, !split);
        us__linear_dgrad(m, Np, C, 2 * F, dgu, us__weight(m, US__TENSOR(l, US__P_GATE)), 0.0f, dln,
                         !split);
        /* f (TP: all-reduce) or g's conjugate (SP: reduce-scatter): the column-parallel input's
           gradient, travelling under the weight-gradient GEMM */
        if ((r = us__tp_dgrad_start(m, dlnp, dln, N, Ns, &wd)) != US_OK) return r;
        if (!split) {
            if ((r = us__tp_wait(m, &wg)) != US_OK) return r;
            us__linear_wgrad(m, Np, C, 2 * F, dgu, sp ? G : A->ln2, NULL,
                             us__grad(m, US__TENSOR(l, US__P_GATE)));
            if ((r = us__grads_ready(m, US__TENSOR(l, US__P_GATE), US__TENSOR(l, US__P_UP) + 1)) !=
                US_OK)
                return r;
        }
        if ((r = us__tp_wait(m, &wd)) != US_OK) return r;
    }
    /* (a MoE layer is not split over tp: each tp rank runs it whole, // >>moe, and its input's
       gradient is complete) */
    if (sw2) o->zero(o, sw2, (size_t)C * 4);
    if ((r = us__norm_bwd(m, dres, US__TENSOR(l, US__P_LN2), dlnp, A->xmid, A->rstd2, Ns, sw2)) !=
        US_OK)
        return r;
    if (!sw2 &&
        (r = us__grads_ready(m, US__TENSOR(l, US__P_LN2), US__TENSOR(l, US__P_LN2) + 1)) != US_OK)
        return r;
    /* attention: xmid = x + attention(rope(ln1·Wqkv^T))·Wo^T */
    if (sp) {
        us__ring_gemm g = {1, AO, C, us__weight(m, US__TENSOR(l, US__P_O)), datt, !split};
        if ((r = us__sp_gather_gemm(m, G, dres, Ns, &g)) != US_OK) return r;
    } else
        us__linear_dgrad(m, Np, AO, C, dres, us__weight(m, US__TENSOR(l, US__P_O)), 0.0f, datt,
                         !split);
    if (split)
        o->copy(o, A->g_o, dresF, rowb, US_COPY_D2D);
    else {
        us__linear_wgrad(m, Np, AO, C, dresF, A->att, NULL, us__grad(m, US__TENSOR(l, US__P_O)));
        if ((r = us__grads_ready(m, US__TENSOR(l, US__P_O), US__TENSOR(l, US__P_O) + 1)) != US_OK)
            return r;
        if (sp && (r = us__sp_gather_early(m, G, A->ln1, Ns, &wg)) != US_OK)
            return r; /* under the attention's backward */
    }
    /* datt [Np,NH·HS] = dres · Wo [C,NH·HS]; dWo += dresᵀ · att; dqkv [Np,QKV] from attention's
       and RoPE's backward; dln [Np,C] = dqkv · Wqkv [QKV,C]; dWqkv += dqkvᵀ · ln1 */
    if (m->mesh.cp > 1) {
        if ((r = us__cp_attention_bwd(m, A, dqkv, datt, B, T)) != US_OK) return r;
        o->rope_at(o, dqkv, (const int32_t *)m->a[US__A_CPPOS] + m->mesh.cp_rank * T, B, T,
                   m->tc.seq, NH, NKV, HS, m->rope_freq, -1.0f, dt);
    } else {
        o->attention_bwd(o, dqkv, datt, A->qkv, A->att, A->lse, B, T, NH, NKV, HS, dt);
        o->rope_bwd(o, dqkv, B, T, NH, NKV, HS, m->rope_freq, dt);
    }
    if (Np > N) o->zero(o, us__at(dqkv, dt, N * QKV), (size_t)((Np - N) * QKV) * us_dtype_size(dt));
    us__linear_dgrad(m, Np, C, QKV, dqkv, us__weight(m, US__TENSOR(l, US__P_Q)), 0.0f, dln, !split);
    if ((r = us__tp_dgrad_start(m, dlnp, dln, N, Ns, &wd)) != US_OK) return r;
    if (!split) {
        if ((r = us__tp_wait(m, &wg)) != US_OK) return r;
        us__linear_wgrad(m, Np, C, QKV, dqkv, sp ? G : A->ln1, NULL,
                         us__grad(m, US__TENSOR(l, US__P_Q)));
        if ((r = us__grads_ready(m, US__TENSOR(l, US__P_Q), US__TENSOR(l, US__P_V) + 1)) != US_OK)
            return r;
    }
    if ((r = us__tp_wait(m, &wd)) != US_OK) return r;
    if (sw1) o->zero(o, sw1, (size_t)C * 4);
    if ((r = us__norm_bwd(m, dres, US__TENSOR(l, US__P_LN1), dlnp, A->x, A->rstd1, Ns, sw1)) !=
        US_OK)
        return r;
    return sw1 ? US_OK : us__grads_ready(m, US__TENSOR(l, US__P_LN1), US__TENSOR(l, US__P_LN1) + 1);
}

/* ZeRO-2/3 with B and W apart: a norm's weight gradient dw [C] f32, which B computed and kept,
   goes into the gradient now, with the layer's other weights, so that the unit holding it is
   complete, and reduced, within this one action (us__plan_units). */
static us_result us__w_norm(us_model *m, const float *dw, int widx) {
    m->ops.axpy(&m->ops, us__grad(m, widx), dw, 1.0f, m->cfg.dim);
    return us__grads_ready(m, widx, widx + 1);
}

/* The W half of a zero-bubble backward (Qi et al.): the layer's four weight-gradient GEMMs, from
   the output gradients B kept (g_*) and the inputs the forward kept (or, under recomputation,
   recomputes: below). Nothing downstream waits
   for these, so the schedule runs them where the pipeline would otherwise idle. Under sequence
   parallelism the normed inputs are gathered again, as the full backward does. */
static us_result us__layer_w(us_model *m, int l, int64_t B, int64_t T) {
    const us_model_config *c = &m->cfg;
    us_layer_acts *A = &m->acts[l];
    int NH = m->nh_l, NKV = m->nkv_l, HS = (int)(c->dim / c->n_heads), sp = us__sp_on(m);
    int64_t C = c->dim, F = m->ffn_l, QKV = (int64_t)(NH + 2 * NKV) * HS, AO = (int64_t)NH * HS, Np,
            Ns;
    void *G = m->a[US__A_SPG];
    us_result r;
    us__sp_rows(m, B * T, &Np, &Ns);
    /* Under recomputation the W GEMMs' inputs the mode does not keep (selective: ln1, att, ln2,
       h; full: all but x) live in the slot's one layer-sized scratch, which B's recompute of the
       other layers has overwritten since: W recomputes them here, as B did (us__layer_fwd's
       recompute pass, from what the mode keeps), instead of keeping them from B until W. Keeping
       them would cost, per layer and micro-batch in flight, the very memory the mode saves;
       recomputing costs no memory and one more recompute per layer and micro-batch (selective:
       the norms, attention and SwiGLU; full: the layer's forward but the down projection). */
    if (m->tc.recompute != US_RECOMPUTE_NONE && (r = us__layer_fwd(m, l, B, T, 1)) != US_OK)
        return r;
    if (m->moe_idx[l] >= 0) { /* a MoE layer's experts, shared expert and router (// >>moe) */
        if ((r = us__moe_w(m, l, B * T)) != US_OK) return r;
    } else {
        us__down_wgrad(m, l, A, Np, F, A->g_down);
        if ((r = us__grads_ready(m, US__TENSOR(l, US__P_DOWN), US__TENSOR(l, US__P_DOWN) + 1)) !=
            US_OK)
            return r;
        if (sp && (r = us__sp_gather(m, G, A->ln2, Ns)) != US_OK) return r;
        us__linear_wgrad(m, Np, C, 2 * F, A->g_gu, sp ? G : A->ln2, NULL,
                         us__grad(m, US__TENSOR(l, US__P_GATE)));
        if ((r = us__grads_ready(m, US__TENSOR(l, US__P_GATE), US__TENSOR(l, US__P_UP) + 1)) !=
            US_OK)
            return r;
    }
    if (A->g_ln2 && (r = us__w_norm(m, A->g_ln2, US__TENSOR(l, US__P_LN2))) != US_OK) return r;
    us__linear_wgrad(m, Np, AO, C, A->g_o, A->att, NULL, us__grad(m, US__TENSOR(l, US__P_O)));
    if ((r = us__grads_ready(m, US__TENSOR(l, US__P_O), US__TENSOR(l, US__P_O) + 1)) != US_OK)
        return r;
    if (sp && (r = us__sp_gather(m, G, A->ln1, Ns)) != US_OK) return r;
    us__linear_wgrad(m, Np, C, QKV, A->g_qkv, sp ? G : A->ln1, NULL,
                     us__grad(m, US__TENSOR(l, US__P_Q)));
    if ((r = us__grads_ready(m, US__TENSOR(l, US__P_Q), US__TENSOR(l, US__P_V) + 1)) != US_OK)
        return r;
    return A->g_ln1 ? us__w_norm(m, A->g_ln1, US__TENSOR(l, US__P_LN1)) : US_OK;
}

static int us__head_idx(const us_model *m) {
    return m->cfg.tie_embeddings ? 0 : US__P_HEAD(m->cfg.n_layers);
}

/* Checks host tokens against the vocabulary before they reach a kernel. */
static us_result us__check_tokens(us_model *m, const int32_t *in, const int32_t *tgt, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) {
        if (in[i] < 0 || in[i] >= m->cfg.vocab) {
            us__model_set_error(
                m, "input token %d at position %lld is outside the vocabulary [0, %lld)", in[i],
                (long long)i, (long long)m->cfg.vocab);
            return US_ERR_INVALID;
        }
        if (tgt && tgt[i] >= m->cfg.vocab) {
            us__model_set_error(
                m, "target token %d at position %lld is outside the vocabulary [0, %lld)", tgt[i],
                (long long)i, (long long)m->cfg.vocab);
            return US_ERR_INVALID;
        }
    }
    return US_OK;
}

/* The head and the loss over xf [R, C] (R = N, or Np under SP): logits [R, V] = xf·Whead^T, then
   the fused softmax cross-entropy, which writes each row's loss and, when dscale != 0, turns the
   logits into their gradient in place. With loss_chunk (us__loss_rows) this runs on chunks of
   rows and, in a training forward, each chunk's gradient goes on at once through the head's
   backward — dxf [R, C] into DLN, dWhead += dlogitsᵀ·xf — so the logits never stand whole in
   memory (the Liger-style fused linear cross-entropy): at a 128k vocabulary, B·T = 16k tokens,
   4.2 GB of bf16 logits become 0.5 GB. The backward then starts from DLN (m->head_fused). */
static us_result us__head_loss(us_model *m, int64_t R, float dscale) {
    us_ops *o = &m->ops;
    int64_t C = m->cfg.dim, V = m->vocab_l, rows = us__loss_rows(&m->cfg, &m->tc, R), r0;
    int head = us__head_idx(m);
    size_t a = us_dtype_size(m->dt);
    us_result r;
    m->head_fused = rows < R && dscale != 0;
    for (r0 = 0; r0 < R; r0 += rows) {
        int64_t n = R - r0 < rows ? R - r0 : rows;
        const void *xf = us__at(m->a[US__A_XF], m->dt, r0 * C);
        const int32_t *tgt = (const int32_t *)m->a[US__A_TGT] + r0;
        o->gemm(o, 0, 1, n, V, C, 1.0f, xf, m->dt, C, us__weight(m, head), m->dt, C, 0.0f,
                m->a[US__A_LOGITS], m->dt, V);
        if (m->tc.tp > 1) {
            if ((r = us__tp_xent(m, tgt, n, r0, dscale, dscale == 0)) != US_OK) return r;
        } else
            o->xent(o, (float *)m->a[US__A_LOSSES] + r0, (int32_t *)m->a[US__A_ARGMAX] + r0,
                    m->a[US__A_LOGITS], tgt, n, V, dscale, m->dt);
        if (m->head_fused) { /* dxf = dlogits·Whead; dWhead += dlogitsᵀ·xf (the backward's two) */
            o->gemm(o, 0, 0, n, C, V, 1.0f, m->a[US__A_LOGITS], m->dt, V, us__weight(m, head),
                    m->dt, C, 0.0f, (char *)m->a[US__A_DLN] + (size_t)(r0 * C) * a, m->dt, C);
            o->gemm(o, 1, 0, V, C, n, 1.0f, m->a[US__A_LOGITS], m->dt, V, xf, m->dt, C, 1.0f,
                    us__grad(m, head), US_F32, C);
        }
    }
    return US_OK;
}

/* Embedding → L layers → final norm → logits → fused cross-entropy (with its gradient when
   dscale != 0). Sums the loss of the valid targets into *loss_sum. */
static us_result us__forward(us_model *m, const int32_t *inputs, const int32_t *targets, int B,
                             int T, float dscale, double *loss_sum) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    int64_t N = (int64_t)B * T, C = c->dim, i, Np, Ns;
    int l, sp = us__sp_on(m);
    us_result r;
    float *losses;
    us__sp_rows(m, N, &Np, &Ns);
    if (B < 1 || T < 1 || B > m->tc.batch || T > m->tc.seq / m->mesh.cp) {
        us__model_set_error(m,
                            "batch %d x seq %d does not fit the arena sized for batch %d x seq %d",
                            B, T, m->tc.batch, m->tc.seq / m->mesh.cp);
        return US_ERR_INVALID;
    }
    /* positions are fixed by the sharding (a generation's are its cache's, // >>sample) */
    if (m->mesh.cp > 1 && T != m->tc.seq / m->mesh.cp && !m->gen) {
        us__model_set_error(m,
                            "under context parallelism every call runs this rank's whole share: "
                            "seq %d / cp %d = %d tokens, not %d",
                            m->tc.seq, m->mesh.cp, m->tc.seq / m->mesh.cp, T);
        return US_ERR_INVALID;
    }
    if ((r = us__check_tokens(m, inputs, targets, N)) != US_OK) return r;
    m->moe_train =
        dscale != 0; /* a training forward: its routing counts toward the step (// >>moe) */
    m->moe_aux_last = 0;
    if (m->tc.tp >
        1) { /* tokens and targets in this rank's vocabulary rows (// >>tp); SP's padding rows last */
        int32_t *tl = (int32_t *)US_MALLOC((size_t)Np * 8);
        if (!tl) {
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        for (i = 0; i < Np; i++) {
            int64_t a = i < N ? inputs[i] - m->vocab_off : -1,
                    b = i < N ? targets[i] - m->vocab_off : -1;
            tl[i] = a >= 0 && a < m->vocab_l ? (int32_t)a : -1;
            tl[Np + i] = i >= N || targets[i] < 0 ? -2 : b >= 0 && b < m->vocab_l ? (int32_t)b : -1;
        }
        o->copy(o, m->a[US__A_TOK], tl, (size_t)Np * 4, US_COPY_H2D);
        o->copy(o, m->a[US__A_TGT], tl + Np, (size_t)Np * 4, US_COPY_H2D);
        US_FREE(tl);
    } else {
        o->copy(o, m->a[US__A_TOK], inputs, (size_t)N * 4, US_COPY_H2D);
        o->copy(o, m->a[US__A_TGT], targets, (size_t)N * 4, US_COPY_H2D);
    }
    /* ZeRO-3 walks the model in steps: enter each one (its weights gathered, the next step's
       gather issued) before computing it */
    if (m->c_first && (r = us__zero3_enter(m, 0, 1)) != US_OK) return r;
    /* a pipeline chunk runs layers [l_lo, l_hi): a later stage's acts[l_lo].x holds the activation received (// >>pp) */
    if (!m->c_first) {
    } else if (
        sp) { /* each token's row comes from the rank holding it, and goes to the rank holding the token */
        o->embedding_fwd(o, m->a[US__A_SPG], (const int32_t *)m->a[US__A_TOK], us__weight(m, 0), Np,
                         C, m->dt);
        if ((r = us__sp_scatter(m, m->acts[0].x, m->a[US__A_SPG], Ns)) != US_OK) return r;
    } else {
        o->embedding_fwd(o, m->acts[0].x, (const int32_t *)m->a[US__A_TOK], us__weight(m, 0), N, C,
                         m->dt);
        if ((r = us__tp_sum(m, m->acts[0].x, N * C, m->dt)) != US_OK)
            return r; /* one rank holds each token's row */
    }
    for (l = m->l_lo; l < m->l_hi; l++) {
        us__trace_mark t0;
        char nm[40];
        if ((r = us__zero3_enter(m, 1 + l, 1)) != US_OK)
            return r; /* the weights' wait is a host region of its own */
        t0 = us__tstart(m);
        if ((r = us__layer_fwd(m, l, B, T, 0)) != US_OK) return r;
        if (m->trace) {
            snprintf(nm, sizeof nm, "forward layer %d", l);
            us__trace(m, "compute", nm, t0);
        }
    }
    if (!m->c_last) {
        *loss_sum = 0;
        return us__backend_check(m);
    } /* XOUT goes to the next stage */
    if ((r = us__zero3_enter(m, c->n_layers + 1, 1)) != US_OK) return r;
    { /* the final norm on this rank's rows, then (SP) the whole sequence for the head */
        void *xf_mine = us__at(m->a[US__A_XF], m->dt, sp ? (int64_t)m->mesh.tp_rank * Ns * C : 0);
        o->rmsnorm_fwd(o, xf_mine, (float *)m->a[US__A_RSTDF], m->a[US__A_XOUT],
                       us__weight(m, US__P_NORM(c->n_layers)), Ns, C, c->norm_eps, m->dt);
        if (sp && (r = us__sp_gather(m, m->a[US__A_XF], xf_mine, Ns)) != US_OK) return r;
    }
    if ((r = us__head_loss(m, sp ? Np : N, dscale)) != US_OK) return r;
    losses = (float *)US_MALLOC((size_t)N * 4);
    if (!losses) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    o->copy(o, losses, m->a[US__A_LOSSES], (size_t)N * 4, US_COPY_D2H);
    if ((r = us__backend_check(m)) != US_OK) {
        US_FREE(losses);
        return r;
    }
    *loss_sum = 0;
    for (i = 0; i < N; i++) *loss_sum += losses[i];
    US_FREE(losses);
    if (!isfinite(*loss_sum)) {
        us__model_set_error(m, "the loss is not finite (%g)", *loss_sum);
        return US_ERR_NONFINITE;
    }
    return US_OK;
}

static us_result us__backward(us_model *m, int B, int T) {
    us_ops *o = &m->ops;
    const us_model_config *c = &m->cfg;
    int64_t N = (int64_t)B * T, C = c->dim, V = m->vocab_l, Np, Ns;
    int l, head = us__head_idx(m), L = c->n_layers, sp = us__sp_on(m);
    int parts = m->pp_v > 1 || m->pp_wsplit;
    us_result r;
    us__trace_mark t0 = us__tstart(m);
    void *dlnp;
    us__sp_rows(m, N, &Np, &Ns);
    dlnp = us__at(m->a[US__A_DLN], m->dt, sp ? (int64_t)m->mesh.tp_rank * Ns * C : 0);
    us__grads_begin(m);
    /* absent on this stage: done (tied, the last stage's copy: once the head's part is in).
       Not where a micro-batch's gradient comes in several actions (chunks, B and W apart, // >>pp):
       there nothing launches a unit by absence, and ZeRO-2/3 reduce what each action wrote */
    if (!parts && !m->c_first && (head || !m->c_last) && (r = us__grads_ready(m, 0, 1)) != US_OK)
        return r;
    if ((r = us__emb_rows_begin(m, sp ? Np : N)) != US_OK)
        return r; /* the embedding's gradient by rows (// >>dp) */
    if (head && (r = us__emb_rows_early(m)) != US_OK) return r; /* untied: the bucket now */
    if (!m->c_last) { /* a pipeline stage before the last: DRES holds the gradient received */
        if (!parts && (r = us__grads_ready(m, US__P_NORM(L), m->n_params_t)) != US_OK) return r;
        goto layers;
    }
    if ((r = us__zero3_enter(m, L + 1, -1)) != US_OK) return r;
    /* logits = xf·Whead^T, the logits buffer now holds dlogits (unless the forward's chunks
       already went through the head: us__head_loss) */
    if (!m->head_fused) {
        o->gemm(o, 0, 0, Np, C, V, 1.0f, m->a[US__A_LOGITS], m->dt, V, us__weight(m, head), m->dt,
                C, 0.0f, m->a[US__A_DLN], m->dt, C);
        o->gemm(o, 1, 0, V, C, Np, 1.0f, m->a[US__A_LOGITS], m->dt, V, m->a[US__A_XF], m->dt, C,
                1.0f, us__grad(m, head), US_F32, C);
    }
    m->head_fused = 0;
    if (head && (r = us__grads_ready(m, head, head + 1)) != US_OK)
        return r; /* tied: the embedding's gradient is not done yet, */
    if (!head) {  /* unless only its rows remain (us__emb_sparse) */
        m->emb_dirty = 1;
        if ((r = us__emb_rows_early(m)) != US_OK) return r;
        /* or this is the last stage's copy (// >>pp): it has its whole gradient now */
        if (!m->c_first && (r = us__grads_ready(m, 0, 1)) != US_OK) return r;
    }
    /* the vocabulary slices' parts: summed (TP), or summed and split by tokens (SP) */
    if ((r = sp ? us__sp_scatter(m, dlnp, m->a[US__A_DLN], Ns)
                : us__tp_sum(m, m->a[US__A_DLN], N * C, m->dt)) != US_OK)
        return r;
    o->zero(o, m->a[US__A_DRES], (size_t)Ns * C * us_dtype_size(m->dt));
    if ((r = us__norm_bwd(m, m->a[US__A_DRES], US__P_NORM(L), dlnp, m->a[US__A_XOUT],
                          (float *)m->a[US__A_RSTDF], Ns, NULL)) != US_OK)
        return r;
    if ((r = us__grads_ready(m, US__P_NORM(L), US__P_NORM(L) + 1)) != US_OK) return r;
    us__trace(m, "compute", "backward head", t0);
layers:
    for (l = m->l_hi - 1; l >= m->l_lo; l--) {
        char nm[40];
        if ((r = us__zero3_enter(m, 1 + l, -1)) != US_OK) return r;
        t0 = us__tstart(m);
        if (m->tc.recompute != US_RECOMPUTE_NONE && (r = us__layer_fwd(m, l, B, T, 1)) != US_OK)
            return r;
        if ((r = us__layer_bwd(m, l, B, T)) != US_OK) return r;
        if (m->trace) {
            snprintf(nm, sizeof nm, "backward layer %d", l);
            us__trace(m, "compute", nm, t0);
        }
    }
    if (m->c_first && (r = us__zero3_enter(m, 0, -1)) != US_OK) return r;
    /* (else DRES is the gradient of this stage's input: the executor sends it back) */
    if (m->c_first) {
        /* every rank needs every token's gradient under SP: its vocabulary rows may be anywhere */
        const void *dx = sp ? m->a[US__A_SPG] : m->a[US__A_DRES];
        int64_t R = sp ? Np : N;
        if (sp && (r = us__sp_gather(m, m->a[US__A_SPG], m->a[US__A_DRES], Ns)) != US_OK) return r;
        if (m->emb_on) {
            if ((r = us__emb_rows_finish(m, dx, R)) != US_OK) return r;
        } else {
            o->embedding_bwd(o, us__grad(m, 0), dx, (const int32_t *)m->a[US__A_TOK], R, C, m->dt);
            m->emb_dirty = 1;
            if ((r = us__grads_ready(m, 0, 1)) != US_OK) return r;
        }
    }
    us__zero3_release_all(m);
    return m->err[0] ? US_ERR_BACKEND
                     : US_OK; /* a slot's reduction may have failed inside us__grad */
}

/* Each sequence's last-position logits into host logits_out [B][V]; under tp the ranks'
   vocabulary slices are gathered. */
static us_result us__last_logits(us_model *m, int B, int T, float *logits_out) {
    us_ops *o = &m->ops;
    us_result r;
    {
        int64_t Vl = m->vocab_l, tp = m->tc.tp, t, rk = m->mesh.tp_rank;
        size_t rowb = (size_t)Vl * us_dtype_size(m->dt);
        char *rows = (char *)US_MALLOC(rowb * (size_t)(B * tp)); /* [tp][B][Vl] */
        int b;
        if (!rows) {
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        int64_t N = (int64_t)B * T, Np, Ns, R, C = m->cfg.dim, step = T;
        us__sp_rows(m, N, &Np, &Ns);
        R = us__sp_on(m) ? Np : N; /* the rows us__head_loss ran */
        if (us__loss_rows(&m->cfg, &m->tc, R) < R) {
            /* the fused head kept only its last chunk: the B last positions' logits again, rows
               T−1, 2T−1, … of xf (a stride of T rows) into logits rows 0..B−1 */
            o->gemm(o, 0, 1, B, Vl, C, 1.0f, us__at(m->a[US__A_XF], m->dt, (int64_t)(T - 1) * C),
                    m->dt, T * C, us__weight(m, us__head_idx(m)), m->dt, C, 0.0f,
                    m->a[US__A_LOGITS], m->dt, Vl);
            step = 1;
        }
        for (b = 0; b < B; b++)
            o->copy(o, rows + (rk * B + b) * rowb,
                    us__at(m->a[US__A_LOGITS], m->dt, ((int64_t)b * step + step - 1) * Vl), rowb,
                    US_COPY_D2H);
        if (tp > 1) { /* through the logits buffer, which holds at least tp·tc.batch rows */
            void *lg = m->a[US__A_LOGITS];
            int64_t Nf, Nsf;
            us__sp_rows(m, (int64_t)m->tc.batch * (m->tc.seq / m->mesh.cp), &Nf, &Nsf);
            if ((size_t)(B * tp) * rowb > us__logits_bytes(&m->cfg, &m->tc, Nf)) {
                US_FREE(rows);
                us__model_set_error(m, "gathering logits under tp=%d needs seq >= tp (got %d)",
                                    (int)tp, m->tc.seq);
                return US_ERR_INVALID;
            }
            o->copy(o, us__at(lg, m->dt, rk * B * Vl), rows + rk * B * rowb, (size_t)B * rowb,
                    US_COPY_H2D);
            r = m->comm->all_gather(m->comm, &m->mesh.tp_g, lg, us__at(lg, m->dt, rk * B * Vl),
                                    B * Vl, m->dt, NULL);
            if (r != US_OK) {
                US_FREE(rows);
                return us__comm_fail(m, r, "tensor-parallel logits all-gather");
            }
            o->copy(o, rows, lg, (size_t)(B * tp) * rowb, US_COPY_D2H);
        }
        for (b = 0; b < B; b++)
            for (t = 0; t < tp; t++)
                us__load_f32(logits_out + (int64_t)b * m->cfg.vocab + t * Vl,
                             rows + (t * B + b) * rowb, m->dt, Vl);
        US_FREE(rows);
    }
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>lossscale  fp16 mixed precision: dynamic loss scaling, overflow detection, step skipping
/* ------------------------------------------------------------------------------------ */
/* Playbook "Mixed precision training", FP16. fp16's 5 exponent bits span only 2^-24 .. 65504:
   activations fit, but small gradients underflow to zero in an fp16 backward. The recipe:
   (1) forward and backward on fp16 weights and activations, computed in fp32 and rounded once on
       store: GEMMs accumulate in fp32, RMSNorm's statistics, the softmax and the loss are fp32;
   (2) an fp32 master copy of the weights takes the updates; gradients accumulate in fp32 and
       AdamW's moments are fp32 (as under bf16);
   (3) loss scaling: the loss is multiplied by S before the backward — here its gradient seed,
       dscale·S — lifting the gradients into fp16's range; the fp32 gradients are divided by S
       before clipping and AdamW (folded into AdamW's gradient factor, g·clip/S: no extra pass);
   (4) overflow: an inf or a NaN anywhere in the gradients makes the global gradient norm not
       finite — the norm every rank already agrees on (summed over dp, tp, pp, ep) — so S was too
       large: the step is skipped (no weight, moment or step-count change) and S halves;
   (5) after loss_scale_window clean steps S doubles, probing again for the largest S that fits.
   A power-of-two S is exact: scaling and unscaling change no bits unless a value underflows or
   overflows, so a static S = 2^k trains bit for bit like no scaling wherever nothing does. */
#define US__LS_INIT \
    65536.0f /* 2^16, the dynamic scaler's first S (PyTorch GradScaler's init_scale) */
#define US__LS_MAX 16777216.0f /* 2^24: S grows no further (apex's max_loss_scale) */

/* Checks the loss scale (us_config_validate). */
static us_result us__loss_scale_checks(const us_train_config *tc, char *err, size_t errlen) {
    if (!(tc->loss_scale >= 0) || !isfinite(tc->loss_scale))
        US__BAD("loss scale=%g must be a finite number >= 0 (0 = dynamic under fp16)",
                tc->loss_scale);
    if (tc->loss_scale_window < 1)
        US__BAD("loss scale window=%d must be at least 1", tc->loss_scale_window);
    return US_OK;
}

static void us__loss_scale_init(us_model *m) {
    m->ls_dynamic = m->tc.loss_scale == 0 && m->tc.precision == US_PRECISION_FP16;
    m->loss_scale = m->tc.loss_scale > 0 ? m->tc.loss_scale : m->ls_dynamic ? US__LS_INIT : 1.0f;
    m->ls_good = m->ls_skipped = 0;
    m->ls_skipped_total = 0;
}

static int us__loss_scale_on(const us_model *m) { return m->ls_dynamic || m->tc.loss_scale > 0; }

/* After the step's gradient norm; overflow: it is not finite. Moves S for the next step. */
static us_result us__loss_scale_update(us_model *m, int overflow) {
    m->ls_skipped = overflow;
    if (!overflow) {
        if (m->ls_dynamic && ++m->ls_good >= m->tc.loss_scale_window) {
            m->ls_good = 0;
            if (m->loss_scale * 2.0f <= US__LS_MAX) m->loss_scale *= 2.0f;
        }
        return US_OK;
    }
    m->ls_skipped_total++;
    m->ls_good = 0;
    if (!m->ls_dynamic) return US_OK; /* a static S: skip, keep S */
    if (m->loss_scale <= 1.0f) { /* Megatron's min_loss_scale: below 1 scaling no longer helps */
        us__model_set_error(
            m, "the gradients overflow even at loss scale 1 (step %d); weights left unchanged",
            m->step + 1);
        return US_ERR_NONFINITE;
    }
    m->loss_scale *= 0.5f;
    return US_OK;
}

/* ------------------------------------------------------------------------------------ */
// >>train  the model's set-up (each chapter's in turn), gradient accumulation, the step
/* ------------------------------------------------------------------------------------ */

/* ---- set-up: the model's tables and memory, each chapter's part in turn */

/* The model state is one allocation cut into flat buffers:
     w       weights the forward reads (dtype dt): all n_flat, or the shard under ZeRO-3
     master  fp32 master weights under bf16: n_flat, or the shard under ZeRO ≥ 1
             (under fp32 the weights are their own master)
     grad    fp32 gradients: n_flat, or the shard under ZeRO ≥ 2
     m, v    AdamW moments: n_flat, or the shard under ZeRO ≥ 1
     slots   ZeRO-2/3 gradient slots, ZeRO-3 weight slots (// >>zero)
   Their sizes in bytes (moment: each of m and v; gslot, wslot: one slot): */
typedef struct us__state_sizes {
    size_t w, master, grad, moment, gslot, wslot;
} us__state_sizes;

/* Allocates the state; a failure (m->state NULL) is reported with the arena's (us__arena_init). */
static void us__state_init(us_model *m, us__state_sizes *b) {
    us__dist_sizes z;
    size_t a = us_dtype_size(m->dt), off = 0;
    char *state;
    int i;
    us__dist_sizes_of(m, &z);
    m->n_flat = z.n_flat;
    m->shard_n = z.shard_n;
    m->slot_n = z.slot_n;
    m->n_gslots = z.n_gslots;
    m->n_wslots = z.n_wslots;
    b->w = (size_t)(m->tc.zero == 3 ? z.shard_n : z.n_flat) * a;
    b->master = m->dt == US_F32 ? 0 : (size_t)(m->tc.zero ? z.shard_n : z.n_flat) * 4;
    b->grad = (size_t)(m->tc.zero >= 2 ? z.shard_n : z.n_flat) * 4;
    b->moment = (size_t)(m->tc.zero ? z.shard_n : z.n_flat) * 4;
    b->gslot = (size_t)z.slot_n * 4;
    b->wslot = (size_t)z.slot_n * a;
    state = (char *)m->ops.alloc(&m->ops, us__align(b->w) + us__align(b->master) +
                                              us__align(b->grad) + 2 * us__align(b->moment) +
                                              (size_t)z.n_gslots * us__align(b->gslot) +
                                              (size_t)z.n_wslots * us__align(b->wslot));
    m->state = state;
    if (!state) return;
    m->w = state;
    off += us__align(b->w);
    m->master = b->master                              ? (float *)(state + off)
                : (m->tc.zero == 1 || m->tc.zero == 2) ? NULL
                                                       : (float *)m->w;
    off += us__align(b->master);
    m->grad = (float *)(state + off);
    off += us__align(b->grad);
    m->adam_m = (float *)(state + off);
    off += us__align(b->moment);
    m->adam_v = (float *)(state + off);
    off += us__align(b->moment);
    for (i = 0; i < z.n_gslots; i++) {
        m->gslot[i] = (float *)(state + off);
        off += us__align(b->gslot);
        m->gslot_unit[i] = -1;
    }
    for (i = 0; i < z.n_wslots; i++) {
        m->wslot[i] = state + off;
        off += us__align(b->wslot);
        m->wslot_unit[i] = -1;
    }
}

/* The activation arena: one slot per micro-batch chunk in flight (m->slots, // >>pp), then the
   scratch the slots share, which every slot's table points to (us__layout_arena). */
static us_result us__arena_init(us_model *m, const us_model_config *mc, const us__state_sizes *b) {
    size_t one;
    int k, j;
    m->slot_acts =
        (us_layer_acts *)US_MALLOC(sizeof(us_layer_acts) * (size_t)(m->slots * m->pp_lc));
    m->acts_work = (us_layer_acts *)calloc((size_t)m->cfg.n_layers, sizeof(us_layer_acts));
    m->slot_a = (void *(*)[32])US_MALLOC(sizeof(void *[32]) * (size_t)m->slots);
    if (!m->slot_acts || !m->slot_a || !m->acts_work) {
        us__model_set_error(m, "out of host memory for the model tables");
        return US_ERR_OOM;
    }
    m->mem.activations =
        us__layout_arena(m, NULL, 0) * (size_t)m->slots + us__layout_arena(m, NULL, 1);
    m->arena = m->state ? (char *)m->ops.alloc(&m->ops, m->mem.activations) : NULL;
    if (!m->state || !m->arena) {
        size_t total = b->w + b->master + b->grad + 2 * b->moment + m->mem.activations;
        us__model_set_error(
            m, "out of memory allocating %.1f MiB for %lld parameters and the activation arena",
            (double)total / 1048576.0, (long long)us_param_count(mc));
        return US_ERR_OOM;
    }
    one = us__layout_arena(m, NULL, 0);
    us__layout_arena(m, m->arena + (size_t)m->slots * one, 1);
    for (k = m->slots - 1; k >= 0; k--) {
        m->acts = m->slot_acts + (size_t)k * m->pp_lc;
        us__layout_arena(m, m->arena + (size_t)k * one, 0);
        memcpy(m->slot_a[k], m->a, sizeof m->a);
    }
    for (k = 0; k < m->slots; k++)
        for (j = 0; j < US__A_COUNT; j++)
            if (!us__scratch_per_slot(j)) m->slot_a[k][j] = m->a[j];
    us__pp_slot_select(m, 0, 0); /* without chunks: every layer */
    return US_OK;
}

/* RoPE's frequencies, once: every layer's rope ops get them (us_ops.rope_fwd). */
static us_result us__rope_init(us_model *m) {
    m->rope_freq = (double *)US_MALLOC(sizeof(double) * (size_t)(m->cfg.dim / m->cfg.n_heads / 2));
    if (!m->rope_freq) {
        us__model_set_error(m, "out of host memory for RoPE's frequencies");
        return US_ERR_OOM;
    }
    us_rope_freqs(&m->cfg, m->rope_freq);
    return US_OK;
}

/* The backend, the precision and the device mesh, then each chapter's set-up in the order they
   depend on each other, the memory line, the weights. */
static us_result us__model_setup(us_model *m, const us_model_config *mc, const us_train_config *tc,
                                 const us_ops *ops, us_comm *comm) {
    us__state_sizes b;
    us_result r;
    memset(m, 0, sizeof *m);
    m->cfg = *mc;
    m->tc = *tc;
    if ((r = us_config_validate(&m->cfg, &m->tc, m->err, sizeof m->err)) != US_OK) return r;
    m->ops = ops ? *ops : us_cpu_ops(m->tc.threads);
    m->dt = m->tc.precision == US_PRECISION_FP32   ? US_F32
            : m->tc.precision == US_PRECISION_FP16 ? US_F16
                                                   : US_BF16; /* fp8: bf16 but the linear GEMMs */
    us__loss_scale_init(m);                                   /* // >>lossscale */
    m->fp8 = m->tc.precision == US_PRECISION_FP8          ? 1
             : m->tc.precision == US_PRECISION_FP8_TENSOR ? 2
                                                          : 0;
    if (m->fp8 && (!m->ops.fp8_quantize || !m->ops.fp8_gemm)) {
        us__model_set_error(m, "precision %s needs FP8 ops, which the %s backend does not have",
                            us_precision_name(m->tc.precision), m->ops.name);
        return US_ERR_INVALID;
    }
    if (!comm) {
        us_comm_self(&m->self, &m->ops);
        comm = &m->self;
    }
    m->comm = comm;
    if (comm->world.size != m->tc.dp * m->tc.pp * m->tc.cp * m->tc.tp) {
        us__model_set_error(m,
                            "dp=%d x pp=%d x cp=%d x tp=%d = %d ranks but the communicator has %d",
                            m->tc.dp, m->tc.pp, m->tc.cp, m->tc.tp,
                            m->tc.dp * m->tc.pp * m->tc.cp * m->tc.tp, comm->world.size);
        return US_ERR_INVALID;
    }
    if ((r = us_mesh_init(&m->mesh, comm, m->tc.dp, m->tc.pp, m->tc.cp, m->tc.tp)) != US_OK) {
        us__model_set_error(m, "device mesh: %s", comm->err);
        return r;
    }
    if ((r = us__rope_init(m)) != US_OK) return r; /* // >>kernels: RoPE's frequencies */
    if ((r = us__ep_init(m)) != US_OK) return r;   /* // >>ep: its groups */
    if ((r = us__pp_init(m)) != US_OK) return r; /* // >>pp: schedule, this rank's layers, slots */
    us__tp_init(m);                              /* // >>tp: this rank's heads, FFN, vocabulary */
    if ((r = us__tp_connect(m)) != US_OK) return r;     /* // >>tp: a kv head's ranks */
    if ((r = us__pp_tie_connect(m)) != US_OK) return r; /* // >>pp: the tied embedding's pair */
    if ((r = us__params_init(m)) != US_OK) return r;    /* // >>model: the tensors */
    if ((r = us__moe_init(m)) != US_OK) return r;       /* // >>moe: the router state */
    if ((r = us__dp_init(m)) != US_OK) return r;        /* // >>dp: units, the embedding's rows */
    us__state_init(m, &b);                              /* flat buffers (// >>zero shards them) */
    if ((r = us__arena_init(m, mc, &b)) != US_OK) return r;
    if ((r = us__cp_init(m)) != US_OK) return r; /* // >>cp: the token positions */
    if (m->tc.pp > 1 && (r = us__pp_connect(m)) != US_OK) return r; /* // >>pp: neighbours */
    if ((r = us__fp8_init(m)) != US_OK) return r; /* // >>fp8-linear: the weight cache */
    /* + the fp32 router biases (// >>moe), the FP8 weight cache */
    m->mem.params = b.w + (size_t)m->n_wslots * b.wslot + us__moe_state_bytes(m) +
                    m->fp8_wlayer * (size_t)m->cfg.n_layers;
    m->mem.master = b.master;
    m->mem.grads = b.grad + (size_t)m->n_gslots * b.gslot + m->grad_bf_bytes; /* // >>dp */
    m->mem.optimizer = 2 * b.moment;
    m->mem.total =
        m->mem.params + m->mem.master + m->mem.grads + m->mem.optimizer + m->mem.activations;
    us__init_weights(m);
    return us__backend_check(m);
}

/* One cleanup path: a set-up that failed after the device mesh exists frees what it made
   (us_model_free frees whatever is there), keeping the message. */
static us_result us__model_init(us_model *m, const us_model_config *mc, const us_train_config *tc,
                                const us_ops *ops, us_comm *comm) {
    us_result r = us__model_setup(m, mc, tc, ops, comm);
    char e[sizeof m->err];
    if (r == US_OK || !m->mesh.dpcp_g.size) return r;
    memcpy(e, m->err, sizeof e);
    us_model_free(m);
    memcpy(m->err, e, sizeof e);
    return r;
}

US_API us_result us_model_init(us_model *m, const us_model_config *mc, const us_train_config *tc,
                               const us_ops *ops) {
    return us__model_init(m, mc, tc, ops, NULL);
}

US_API us_result us_model_init_dist(us_model *m, const us_model_config *mc,
                                    const us_train_config *tc, const us_ops *ops, us_comm *comm) {
    if (!comm) {
        memset(m, 0, sizeof *m);
        us__model_set_error(m, "us_model_init_dist needs a communicator");
        return US_ERR_INVALID;
    }
    return us__model_init(m, mc, tc, ops, comm);
}

US_API void us_model_free(us_model *m) {
    us_ops *o = &m->ops;
    int u;
    if (m->units && m->comm) /* never leave a collective in flight on memory about to be freed */
        for (u = 0; u < m->n_units; u++) {
            if (m->units[u].work) m->comm->wait(m->comm, m->units[u].work);
            if (m->units[u].gather) m->comm->wait(m->comm, m->units[u].gather);
        }
    if (o->free) {
        o->free(o, m->state);
        o->free(o, m->arena);
        if (m->grad_bf) o->free(o, m->grad_bf);
    }
    m->grad_bf = NULL;
    us__pp_disconnect(m);
    us__ep_free(m);
    us__tp_free(m);
    us__pp_tie_free(m);
    if (m->comm && m->mesh.dpcp_g.size) us_mesh_free(&m->mesh, m->comm);
    US_FREE(m->slot_acts);
    free(m->acts_work); /* acts points into them */
    m->acts_work = NULL;
    US_FREE(m->slot_a);
    if (m->pp_sched) {
        us_pp_schedule_free(m->pp_sched);
        free(m->pp_sched);
    }
    US_FREE(m->pp_msgs);
    US_FREE(m->pp_start);
    m->slot_acts = NULL;
    m->slot_a = NULL;
    m->pp_sched = NULL;
    m->pp_msgs = NULL;
    m->pp_start = NULL;
    US_FREE(m->params);
    US_FREE(m->units);
    US_FREE(m->unit_of);
    US_FREE(m->layer_g);
    US_FREE(m->layer_p);
    US_FREE(m->emb_map);
    US_FREE(m->emb_ids);
    US_FREE(m->rope_freq);
    m->emb_map = m->emb_ids = NULL;
    m->rope_freq = NULL;
    m->params = NULL;
    m->acts = NULL;
    m->units = NULL;
    m->unit_of = NULL;
    m->w = NULL;
    m->layer_g = NULL;
    m->layer_p = NULL;
    us__moe_free(m);
    if (m->fp8_wc) m->ops.free(&m->ops, m->fp8_wc);
    free(m->fp8_wkey);
    free(m->fp8_wok);
    m->fp8_wc = NULL;
    m->fp8_wkey = NULL;
    m->fp8_wok = NULL;
    m->fp8_wlayer = 0;
    free(m->tpend); /* grown by realloc, like the trace's own rows */
    m->tpend = NULL;
    m->n_tpend = m->cap_tpend = 0;
    m->master = m->grad = m->adam_m = m->adam_v = NULL;
    m->state = NULL;
    m->arena = NULL;
    m->comm = NULL;
}

US_API void us_model_zero_grad(us_model *m) {
    m->ops.zero(&m->ops, m->grad, (size_t)(m->tc.zero >= 2 ? m->shard_n : m->n_flat) * 4);
    m->emb_dirty = 0;
    us__fp8_wcache_drop(m); /* a new step: the weights may have been written since the last */
}

US_API us_result us_forward_backward(us_model *m, const int32_t *inputs, const int32_t *targets,
                                     int B, int T, float dscale, double *loss_sum) {
    us_result r;
    m->err[0] = 0;
    m->tp_inflight = 0;
    m->ops.sm_margin = 0; /* (a failed step may have left a tp collective counted) */
    r = us__forward(m, inputs, targets, B, T, dscale, loss_sum);
    if (r != US_OK) return r;
    r = us__backward(m, B, T);
    m->grad_sync = 0;
    return r;
}

US_API us_result us_optimizer_step(us_model *m, float *grad_norm, float *lr_out) {
    us_ops *o = &m->ops;
    const us_train_config *tc = &m->tc;
    int Z = tc->zero, u;
    double norm2 = 0, gnorm;
    float gscale = 1.0f, lr = us_lr_at(tc, m->step),
          inv_s = 1.0f / m->loss_scale; /* exact for S = 2^k */
    us_result r;
    us__trace_mark t0;
    m->ls_skipped = 0;
    us__fp8_wcache_drop(m); /* the weights are about to change */
    if ((r = us__grads_finish(m)) != US_OK)
        return r; /* the last reductions' waits: host regions of their own */
    /* a weight with copies on several ranks: the copies' gradients summed, so they stay equal */
    if ((r = us__tp_kv_sum(m)) != US_OK) return r;   /* replicated kv heads (// >>tp) */
    if ((r = us__pp_tied_sum(m)) != US_OK) return r; /* the tied embedding and head (// >>pp) */
    if ((r = us__pp_dual_sum(m)) != US_OK) return r; /* DualPipe's two copies (// >>pp) */
    t0 = us__tstart(m);
    /* the global gradient norm: every rank holds all of it without ZeRO; with ZeRO each holds the
       sums of its pieces, and the squares are summed over dp */
    if (Z == 0 && m->tc.tp <= 1 && m->tc.pp <= 1 && m->ep <= 1)
        norm2 = o->sumsq(o, m->grad, m->n_flat);
    else { /* tp: split tensors summed over tp, replicated ones counted once (us__tp_counts); pp:
              every stage's own (a tied embedding's on the first, us__pp_counts); ep: every rank's
              experts, counted on the first of their replicas (// >>ep) */
        int i;
        for (u = 0; u < m->n_units; u++) {
            const us__unit *U = &m->units[u];
            int64_t lo = U->off + (Z ? (int64_t)us__unit_rank(m, U) * U->piece : 0),
                    hi = lo + U->piece;
            const float *gp = Z < 2 ? m->grad + lo : m->grad + U->shard_off; /* flat index lo */
            for (i = U->p0; i < U->p1; i++) {
                const us_param *p = &m->params[i];
                int64_t a = p->offset > lo ? p->offset : lo,
                        b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
                int first = p->expert && m->ep > 1 ? m->edp_g.rank == 0 : m->mesh.dpcp_g.rank == 0;
                if (a < b && us__tp_counts(m, p) && us__pp_counts(m, i) && (Z || first))
                    norm2 += o->sumsq(o, gp + (a - lo), b - a);
            }
        }
        if ((r = us__group_sum(m, &m->comm->world, &norm2, 1)) != US_OK)
            return r; /* each part counted on one rank */
    }
    gnorm = sqrt(norm2) / m->loss_scale; /* unscaled (// >>lossscale) */
    if (grad_norm) *grad_norm = (float)gnorm;
    if (lr_out) *lr_out = lr;
    if (!isfinite(gnorm) &&
        us__loss_scale_on(m)) { /* an overflow under loss scaling: skip the update */
        if ((r = us__loss_scale_update(m, 1)) != US_OK) return r;
        if ((r = us__moe_step_end(m)) != US_OK)
            return r; /* the step's routing statistics still close */
        us__trace(m, "compute", "optimizer step (skipped)", t0);
        return us__backend_check(m);
    }
    if (!isfinite(gnorm)) {
        us__model_set_error(m, "the gradient norm is not finite at step %d; weights left unchanged",
                            m->step + 1);
        return US_ERR_NONFINITE;
    }
    if (tc->grad_clip > 0 && gnorm > tc->grad_clip)
        gscale = (float)(tc->grad_clip / gnorm); /* clip by global norm */
    gscale *= inv_s;                             /* and unscale, in the same factor */
    if ((r = us__loss_scale_update(m, 0)) != US_OK) return r;
    m->step++;
    /* The tensors tile the flat buffers, so each run of neighbours that share a weight-decay
       setting is one contiguous range: one AdamW call per run, not per tensor (a layer's
       q|k|v|o and gate|up|down become two calls on a GPU instead of seven launches). Without
       ZeRO the whole buffer is one range; with it, each unit's own piece. */
    if (Z == 0) {
        us__unit all;
        memset(&all, 0, sizeof all);
        all.p0 = 0;
        all.p1 = m->n_params_t;
        all.n = all.piece = m->n_flat;
        us__adamw_piece(m, &all, lr, gscale);
    } else
        for (u = 0; u < m->n_units; u++) {
            us__unit *U = &m->units[u];
            us__adamw_piece(m, U, lr, gscale);
            /* ZeRO-1/2: this rank updated its piece of the unit; the weights the forward reads are
           all-gathered at once, while the next units' pieces update (Playbook "ZeRO-1": the
           all-gather overlaps the optimizer step) */
            if (Z != 1 && Z != 2) continue;
            r = m->comm->all_gather(
                m->comm, us__unit_group(m, U), us__at(m->w, m->dt, U->off),
                us__at(m->w, m->dt, U->off + (int64_t)us__unit_rank(m, U) * U->piece), U->piece,
                m->dt, &U->gather);
            if (r != US_OK) return us__comm_fail(m, r, "weight all-gather");
        }
    us__trace(m, "compute", "optimizer step", t0);
    if (Z == 1 || Z == 2) {
        double tw = us_trace_now_us();
        for (u = 0; u < m->n_units; u++) {
            r = m->comm->wait(m->comm, m->units[u].gather);
            m->units[u].gather = NULL;
            if (r != US_OK) return us__comm_fail(m, r, "weight all-gather");
        }
        us__trace_host(m, "wait", "wait weights", tw);
    }
    if ((r = us__moe_step_end(m)) != US_OK)
        return r; /* routing statistics, the router bias rule (// >>moe) */
    return us__backend_check(m);
}

US_API us_result us_train_step(us_model *m, const int32_t *inputs, const int32_t *targets,
                               us_step_stats *st) {
    const us_train_config *tc = &m->tc;
    int Tl = tc->seq / tc->cp; /* under context parallelism, this rank's share of each sequence */
    int64_t per = (int64_t)tc->batch * Tl, total = per * tc->grad_accum, valid = 0, i;
    double loss = 0,
           pp_stat[4] = {0, 0, 0, 0}; /* pipeline: the bubble, then F, B, W ms per micro-batch */
    float gn = 0, lr = 0, S, dscale;
    int k;
    us_result r;
    double dvalid;
    m->err[0] = 0;
    for (i = 0; i < total; i++) valid += targets[i] >= 0;
    dvalid = (double)valid;
    if ((r = us__dp_sum(m, &dvalid, 1)) != US_OK) return r; /* valid targets of the global batch */
    valid = (int64_t)dvalid;
    if (!valid) {
        us__model_set_error(m, "every target of the batch is ignored (< 0); nothing to learn from");
        return US_ERR_INVALID;
    }
    us_model_zero_grad(m);
    S = m->loss_scale;
    dscale =
        (float)(1.0 / (double)valid) * S; /* the loss's gradient seed, times S (// >>lossscale) */
    if (tc->pp > 1) { /* the micro-batches run by the pipeline schedule (// >>pp) */
        if ((r = us__pp_run(m, inputs, targets, per, Tl, dscale, &loss)) != US_OK) return r;
    } else
        for (k = 0; k < tc->grad_accum;
             k++) { /* each micro-batch adds its share of the global mean */
            double ls = 0;
            m->grad_sync = k == tc->grad_accum - 1; /* no_sync until the last micro-batch */
            r = us_forward_backward(m, inputs + k * per, targets + k * per, tc->batch, Tl, dscale,
                                    &ls);
            if (r != US_OK) return r;
            loss += ls;
        }
    if ((r = us_optimizer_step(m, &gn, &lr)) != US_OK)
        return r; /* unscales; may skip (// >>lossscale) */
    if ((r = us__group_sum(m, &m->mesh.pp_g, &loss, 1)) != US_OK)
        return r; /* the last stage computed it */
    if ((r = us__dp_sum(m, &loss, 1)) != US_OK) return r;
    /* the measured pp_stat: each rank's idle share of the schedule's time, and its costs,
       averaged */
    if (tc->pp > 1) {
        pp_stat[0] = m->pp_wall_s > 0
                         ? 1.0 - (m->pp_t_s[0] + m->pp_t_s[1] + m->pp_t_s[2]) / m->pp_wall_s
                         : 0;
        for (k = 0; k < 3; k++) pp_stat[1 + k] = 1e3 * m->pp_t_s[k] / tc->grad_accum;
        if ((r = us__group_sum(m, &m->comm->world, pp_stat, 4)) != US_OK) return r;
        for (k = 0; k < 4; k++) pp_stat[k] /= m->comm->world.size;
    }
    us__trace_flush(m); /* a GPU's regions, timed by its marks (// >>trace) */
    if (st) {
        st->step = m->step;
        st->loss = (float)(loss / (double)valid);
        st->lr = lr;
        st->grad_norm = gn;
        st->loss_scale = S;
        st->skipped = m->ls_skipped;
        st->skipped_total = m->ls_skipped_total;
        st->tokens = total * m->mesh.dp * m->mesh.cp;
        st->valid = valid;
        st->pp_bubble = (float)pp_stat[0];
        for (k = 0; k < 3; k++) st->pp_cost_ms[k] = (float)pp_stat[1 + k];
        st->moe_imbalance = m->moe_stat[0];
        st->moe_aux_loss = m->moe_stat[1];
        st->moe_drop_frac = m->moe_stat[2];
        st->moe_load = m->n_moe_all ? m->moe_load_last : NULL;
    }
    return US_OK;
}

static us_result us__forward_eval(us_model *m, const int32_t *inputs, const int32_t *targets, int B,
                                  int T, double *loss_sum, int64_t *correct, float *logits_out);

US_API us_result us_forward_eval(us_model *m, const int32_t *inputs, const int32_t *targets, int B,
                                 int T, double *loss_sum, int64_t *correct, float *logits_out) {
    us__fp8_wcache_drop(
        m); /* evaluation comes between steps, where a caller may have written weights */
    return us__forward_eval(m, inputs, targets, B, T, loss_sum, correct, logits_out);
}

US_API us_result us_forward_eval_losses(us_model *m, const int32_t *inputs, const int32_t *targets,
                                        int B, int T, float *losses) {
    us_result r;
    if (m->tc.pp > 1) {
        us__model_set_error(m,
                            "per-position losses are not available under pipeline parallelism "
                            "(pp=%d): only the last stage holds them",
                            m->tc.pp);
        return US_ERR_INVALID;
    }
    /* the forward leaves every position's loss in the activations: read them out */
    if ((r = us_forward_eval(m, inputs, targets, B, T, NULL, NULL, NULL)) != US_OK) return r;
    m->ops.copy(&m->ops, losses, m->a[US__A_LOSSES], (size_t)B * T * 4, US_COPY_D2H);
    return us__backend_check(m);
}

static us_result us__forward_eval(us_model *m, const int32_t *inputs, const int32_t *targets, int B,
                                  int T, double *loss_sum, int64_t *correct, float *logits_out) {
    us_ops *o = &m->ops;
    int64_t N = (int64_t)B * T, i;
    double ls = 0;
    us_result r;
    if (m->tc.pp > 1) /* the forward through the stages (// >>pp) */
        return us__pp_eval(m, inputs, targets, B, T, loss_sum, correct, logits_out);
    r = us__forward(m, inputs, targets, B, T, 0.0f, &ls);
    us__zero3_release_all(m);
    if (r != US_OK) return r;
    if (loss_sum) *loss_sum = ls;
    if (correct) {
        int32_t *am = (int32_t *)US_MALLOC((size_t)N * 4);
        if (!am) {
            us__model_set_error(m, "out of host memory");
            return US_ERR_OOM;
        }
        o->copy(o, am, m->a[US__A_ARGMAX], (size_t)N * 4, US_COPY_D2H);
        *correct = 0;
        for (i = 0; i < N; i++) *correct += targets[i] >= 0 && am[i] == targets[i];
        US_FREE(am);
    }
    if (logits_out) return us__last_logits(m, B, T, logits_out);
    return US_OK;
}

#if !defined(ULTRASCALE_NO_DATA) || !defined(ULTRASCALE_NO_TOKENIZER)
/* ------------------------------------------------------------------------------------ */
// >>data  byte tokenizer, raw text, llm.c token shards, the shard loader, the built-in task
/* ------------------------------------------------------------------------------------ */
/* A whole file into *buf[*len] (+ 1 byte of room); // >>tokenizer reads tokenizer.json with it. */
static us_result us__read_file(const char *path, unsigned char **buf, int64_t *len, char *err,
                               size_t errlen) {
    FILE *f = fopen(path, "rb");
    long sz;
    int c;
    *buf = NULL;
    *len = 0;
    if (!f) {
        us__errf(err, errlen, "cannot open %s", path);
        return US_ERR_IO;
    }
    errno = 0;
    c = fgetc(f); /* a directory opens but does not read */
    if (c == EOF && ferror(f)) {
        fclose(f);
        us__errf(err, errlen, "cannot read %s: %s", path, errno ? strerror(errno) : "read error");
        return US_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        us__errf(err, errlen, "cannot determine the size of %s", path);
        return US_ERR_IO;
    }
    if (sz == 0 && c != EOF) { /* /dev/zero, a pipe, a /proc file: data but no size */
        fclose(f);
        us__errf(err, errlen,
                 "%s is not a regular file (it has no size but reads data): copy it into one",
                 path);
        return US_ERR_IO;
    }
    *buf = (unsigned char *)US_MALLOC((size_t)sz + 1);
    if (!*buf) {
        fclose(f);
        us__errf(err, errlen, "out of memory reading %s (%ld bytes)", path, sz);
        return US_ERR_OOM;
    }
    if (fread(*buf, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        US_FREE(*buf);
        *buf = NULL;
        us__errf(err, errlen, "cannot read %s", path);
        return US_ERR_IO;
    }
    fclose(f);
    *len = sz;
    return US_OK;
}
#endif

#ifndef ULTRASCALE_NO_DATA
US_API size_t us_byte_encode(const char *text, int32_t *tokens, size_t cap) {
    size_t i;
    for (i = 0; text[i] && i < cap; i++) tokens[i] = (unsigned char)text[i];
    return i;
}

US_API size_t us_byte_decode(const int32_t *tokens, size_t n, char *text, size_t cap) {
    size_t i;
    if (!cap) return 0;
    for (i = 0; i < n && i + 1 < cap; i++)
        text[i] = tokens[i] >= 32 && tokens[i] < 127 ? (char)tokens[i]
                  : tokens[i] == '\n'                ? '\n'
                                                     : '?';
    text[i] = 0;
    return i;
}

US_API void us_data_free(us_data *d) {
    US_FREE(d->tokens);
    d->tokens = NULL;
    d->n = 0;
}

US_API us_result us_data_from_bytes(us_data *d, const void *bytes, int64_t n) {
    int64_t i;
    memset(d, 0, sizeof *d);
    if (n <= 0) {
        us__errf(d->err, sizeof d->err, "the text is empty");
        return US_ERR_FORMAT;
    }
    d->tokens = (int32_t *)US_MALLOC((size_t)n * 4);
    if (!d->tokens) {
        us__errf(d->err, sizeof d->err, "out of memory for %lld tokens", (long long)n);
        return US_ERR_OOM;
    }
    for (i = 0; i < n; i++) {
        d->tokens[i] = ((const unsigned char *)bytes)[i];
        if (d->tokens[i] > d->max_token) d->max_token = d->tokens[i];
    }
    d->n = n;
    return US_OK;
}

US_API us_result us_data_load_text(us_data *d, const char *path) {
    unsigned char *buf;
    int64_t len;
    char err[256];
    us_result r = us__read_file(path, &buf, &len, err, sizeof err);
    if (r != US_OK) {
        memset(d, 0, sizeof *d);
        snprintf(d->err, sizeof d->err, "%s", err);
        return r;
    }
    r = us_data_from_bytes(d, buf, len);
    if (r != US_OK) snprintf(d->err, sizeof d->err, "%s is empty", path);
    US_FREE(buf);
    return r;
}

#define US__SHARD_HEADER 256

/* An llm.c shard's header (256 int32) against the file's length in bytes: its bytes per token
   and token count, or US_ERR_FORMAT with one sentence. hdr is read only when len holds it. */
static us_result us__shard_header(const int32_t *hdr, int64_t len, const char *path, int *tsz,
                                  int64_t *ntok, char *err, size_t errlen) {
    const int64_t hb = US__SHARD_HEADER * 4;
    if (len < hb) {
        us__errf(err, errlen,
                 "%s is truncated: %lld bytes, but a token shard's header alone is %d bytes", path,
                 (long long)len, (int)hb);
        return US_ERR_FORMAT;
    }
    if (hdr[0] == 20240520 && hdr[1] == 1) {
        *tsz = 2;
    } else if (hdr[0] == 20240801 && hdr[1] == 7) {
        *tsz = 4;
    } else if (hdr[0] == 20240520 || hdr[0] == 20240801) {
        us__errf(err, errlen, "%s: unsupported shard version %d for magic %d", path, hdr[1],
                 hdr[0]);
        return US_ERR_FORMAT;
    } else {
        us__errf(err, errlen,
                 "%s is not an llm.c token shard (magic %d, expected 20240520 or 20240801)", path,
                 hdr[0]);
        return US_ERR_FORMAT;
    }
    *ntok = hdr[2];
    if (*ntok <= 0) {
        us__errf(err, errlen, "%s: the header says %lld tokens", path, (long long)*ntok);
        return US_ERR_FORMAT;
    }
    if (len != hb + *ntok * *tsz) {
        us__errf(err, errlen,
                 "%s: file is %lld bytes but the header promises %lld tokens of %d bytes (%lld "
                 "bytes)",
                 path, (long long)len, (long long)*ntok, *tsz, (long long)(hb + *ntok * *tsz));
        return US_ERR_FORMAT;
    }
    return US_OK;
}

/* n tokens of tsz bytes (little-endian) at p into out; a token ≥ vocab (vocab > 0) or past
   INT32_MAX is an error naming the shard and the token's index in it (index of p[0]: at). */
static us_result us__shard_decode(const unsigned char *p, int tsz, int64_t n, int32_t *out,
                                  int64_t vocab, const char *path, int64_t at, char *err,
                                  size_t errlen) {
    int64_t i;
    for (i = 0; i < n; i++, p += tsz) {
        uint32_t t = tsz == 2 ? (uint32_t)(p[0] | p[1] << 8)
                              : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                    (uint32_t)p[3] << 24;
        if (t > 0x7fffffffu || (vocab > 0 && (int64_t)t >= vocab)) {
            if (t > 0x7fffffffu)
                us__errf(err, errlen, "%s: token %lld has the impossible value %u", path,
                         (long long)(at + i), t);
            else
                us__errf(err, errlen, "%s: token %lld is %u, outside the vocabulary of %lld", path,
                         (long long)(at + i), t, (long long)vocab);
            return US_ERR_FORMAT;
        }
        out[i] = (int32_t)t;
    }
    return US_OK;
}

US_API us_result us_data_load_shard(us_data *d, const char *path) {
    unsigned char *buf;
    int64_t len, ntok, i;
    int32_t hdr[US__SHARD_HEADER];
    int tsz;
    char err[256];
    us_result r = us__read_file(path, &buf, &len, err, sizeof err);
    memset(d, 0, sizeof *d);
    if (r != US_OK) {
        snprintf(d->err, sizeof d->err, "%s", err);
        return r;
    }
    if (len >= (int64_t)sizeof hdr) memcpy(hdr, buf, sizeof hdr);
    r = us__shard_header(hdr, len, path, &tsz, &ntok, d->err, sizeof d->err);
    if (r == US_OK && !(d->tokens = (int32_t *)US_MALLOC((size_t)ntok * 4))) {
        us__errf(d->err, sizeof d->err, "out of memory for %lld tokens", (long long)ntok);
        r = US_ERR_OOM;
    }
    if (r == US_OK)
        r = us__shard_decode(buf + sizeof hdr, tsz, ntok, d->tokens, 0, path, 0, d->err,
                             sizeof d->err);
    US_FREE(buf);
    if (r != US_OK) {
        us_data_free(d);
        return r;
    }
    for (i = 0; i < ntok; i++)
        if (d->tokens[i] > d->max_token) d->max_token = d->tokens[i];
    d->n = ntok;
    return US_OK;
}

US_API us_result us_data_load(us_data *d, const char *path) {
    FILE *f = fopen(path, "rb");
    int32_t magic = 0;
    size_t got;
    if (!f) {
        memset(d, 0, sizeof *d);
        us__errf(d->err, sizeof d->err, "cannot open %s", path);
        return US_ERR_IO;
    }
    got = fread(&magic, 1, 4, f);
    fclose(f);
    if (got == 4 && (magic == 20240520 || magic == 20240801)) return us_data_load_shard(d, path);
    return us_data_load_text(d, path);
}

US_API int64_t us_data_windows(const us_data *d, int64_t n, int T) {
    if (n <= 0 || n > d->n) n = d->n;
    return T > 0 && n > 1 ? (n - 1) / T : 0;
}

US_API void us_data_window_batch(const us_data *d, int64_t first, int64_t count, int nseq, int T,
                                 int32_t *inputs, int32_t *targets) {
    int s, t;
    for (s = 0; s < nseq; s++) {
        const int64_t w = first + s; /* window w: tokens w·T .. w·T + T */
        int32_t *in = inputs + (int64_t)s * T, *tg = targets + (int64_t)s * T;
        if (w < count) {
            memcpy(in, d->tokens + w * T, (size_t)T * 4);
            memcpy(tg, d->tokens + w * T + 1, (size_t)T * 4);
            continue;
        }
        for (t = 0; t < T; t++) { /* padding: a valid input, nothing scored */
            in[t] = 0;
            tg[t] = -1;
        }
    }
}

US_API us_result us_data_batch(us_data *d, us_rng *r, int nseq, int T, int32_t *inputs,
                               int32_t *targets) {
    int s;
    if (d->n < (int64_t)T + 1) {
        us__errf(d->err, sizeof d->err,
                 "the data has %lld tokens; a sequence of %d needs at least %d", (long long)d->n, T,
                 T + 1);
        return US_ERR_INVALID;
    }
    for (s = 0; s < nseq; s++) {
        int64_t start = (int64_t)(us_rng_u64(r) % (uint64_t)(d->n - T));
        memcpy(inputs + (int64_t)s * T, d->tokens + start, (size_t)T * 4);
        memcpy(targets + (int64_t)s * T, d->tokens + start + 1, (size_t)T * 4);
    }
    return US_OK;
}

/* ---- the shard loader: many llm.c shards, mapped, streamed in llm.c's shuffled order */
#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200809L
#define US__DATA_POSIX 1
#include <glob.h>
#include <sys/mman.h>
#endif

/* the list us_data_expand builds, one string at a time */
typedef struct us__strs {
    char **v;
    int n, cap;
    size_t bytes;
} us__strs;

static int us__strs_add(us__strs *s, const char *p, size_t len) {
    char *c;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        char **v = (char **)realloc(s->v, sizeof(char *) * (size_t)cap);
        if (!v) return 1;
        s->v = v;
        s->cap = cap;
    }
    if (!(c = (char *)US_MALLOC(len + 1))) return 1;
    memcpy(c, p, len);
    c[len] = 0;
    s->v[s->n++] = c;
    s->bytes += len + 1;
    return 0;
}

/* one comma-separated item: a path, or a glob pattern's matches in sorted order */
static us_result us__expand_item(us__strs *s, const char *item, size_t len, char *err,
                                 size_t errlen) {
    char pat[4096];
    if (len == 0 || len >= sizeof pat) {
        us__errf(err, errlen, "%s in the list of files", len ? "a name too long" : "an empty name");
        return US_ERR_INVALID;
    }
    memcpy(pat, item, len);
    pat[len] = 0;
    if (!strpbrk(pat, "*?[")) {
        if (!us__strs_add(s, pat, len)) return US_OK;
        us__errf(err, errlen, "out of memory for the list of files");
        return US_ERR_OOM;
    }
#ifdef US__DATA_POSIX
    {
        glob_t g;
        size_t i;
        int rc = glob(pat, 0, NULL, &g);
        if (rc == GLOB_NOMATCH) {
            us__errf(err, errlen, "%s matches no file", pat);
            return US_ERR_IO;
        }
        if (rc != 0) {
            us__errf(err, errlen, "cannot expand the pattern %s", pat);
            return US_ERR_IO;
        }
        for (i = 0; i < g.gl_pathc; i++)
            if (us__strs_add(s, g.gl_pathv[i], strlen(g.gl_pathv[i]))) break;
        rc = i == g.gl_pathc;
        globfree(&g);
        if (rc) return US_OK;
        us__errf(err, errlen, "out of memory for the list of files");
        return US_ERR_OOM;
    }
#else
    us__errf(err, errlen, "%s is a pattern, and this build has no POSIX glob: list the files", pat);
    return US_ERR_INVALID;
#endif
}

US_API us_result us_data_expand(const char *spec, char ***paths, int *n, char *err, size_t errlen) {
    us__strs s = {NULL, 0, 0, 0};
    us_result r = US_OK;
    const char *p = spec;
    char *at;
    int i;
    *paths = NULL;
    *n = 0;
    if (!spec) {
        us__errf(err, errlen, "no list of files");
        return US_ERR_INVALID;
    }
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if ((r = us__expand_item(&s, p, len, err, errlen)) != US_OK || !comma) break;
        p = comma + 1;
    }
    if (r == US_OK && !(*paths = (char **)US_MALLOC(sizeof(char *) * (size_t)s.n + s.bytes))) {
        us__errf(err, errlen, "out of memory for the list of files");
        r = US_ERR_OOM;
    }
    if (r == US_OK && s.n > 0) { /* one allocation: the pointers, then the strings */
        at = (char *)(*paths + s.n);
        for (i = 0; i < s.n; i++) {
            (*paths)[i] = at;
            strcpy(at, s.v[i]);
            at += strlen(s.v[i]) + 1;
        }
        *n = s.n;
    }
    for (i = 0; i < s.n; i++) US_FREE(s.v[i]);
    free(s.v);
    return r;
}

US_API int us_data_is_shard(const char *path) {
    FILE *f = fopen(path, "rb");
    int32_t magic = 0;
    size_t got;
    if (!f) return 0;
    got = fread(&magic, 1, 4, f);
    fclose(f);
    return got == 4 && (magic == 20240520 || magic == 20240801);
}

/* One shard: its header checked against its size, then the file mapped (POSIX). */
static us_result us__loader_open_shard(us_loader *l, us_loader_shard *sh, const char *path) {
    int32_t hdr[US__SHARD_HEADER];
    FILE *f = fopen(path, "rb");
    int64_t len = -1;
    size_t got;
    us_result r;
    if (!(sh->path = (char *)US_MALLOC(strlen(path) + 1))) return US_ERR_OOM;
    strcpy(sh->path, path);
    if (!f) {
        us__errf(l->err, sizeof l->err, "cannot open %s", path);
        return US_ERR_IO;
    }
    got = fread(hdr, 1, sizeof hdr, f);
    if (ferror(f) || fseek(f, 0, SEEK_END) != 0 || (len = (int64_t)ftell(f)) < 0 ||
        (got < sizeof hdr && len >= (int64_t)sizeof hdr)) {
        fclose(f);
        us__errf(l->err, sizeof l->err, "cannot read %s", path);
        return US_ERR_IO;
    }
    r = us__shard_header(hdr, len, path, &sh->tsz, &sh->n, l->err, sizeof l->err);
#ifdef US__DATA_POSIX
    if (r == US_OK && !l->cfg.no_map) {
        void *m = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fileno(f), 0);
        if (m == MAP_FAILED) {
            us__errf(l->err, sizeof l->err, "cannot map %s: %s", path, strerror(errno));
            r = US_ERR_IO;
        } else {
            sh->map = (const unsigned char *)m;
            sh->map_len = (size_t)len;
        }
    }
#endif
    fclose(f);
    return r;
}

/* Which windows are trained on: those wholly before the held-out tail. */
static void us__loader_count(us_loader *l) {
    int64_t T = l->cfg.T;
    int i;
    l->n_train = l->n_tokens - (int64_t)((double)l->n_tokens * l->cfg.hold_out);
    l->n_windows = 0;
    for (i = 0; i < l->n_shards; i++) {
        us_loader_shard *sh = &l->shards[i];
        int64_t u = l->n_train - sh->first;
        if (u > sh->n) u = sh->n;
        sh->windows = u > T ? (u - 1) / T : 0;
        l->n_windows += sh->windows;
    }
}

US_API us_result us_loader_open(us_loader *l, const char *const *paths, int n,
                                const us_loader_config *cfg) {
    int64_t most = 1;
    us_result r = US_OK;
    int i;
    memset(l, 0, sizeof *l);
    l->cfg = *cfg;
    l->order_epoch = l->perm_epoch = -1;
    l->file_shard = -1;
    l->pos.seed = cfg->seed;
    if (cfg->T <= 0 || n <= 0 || !(cfg->hold_out >= 0 && cfg->hold_out < 1)) {
        us__errf(l->err, sizeof l->err,
                 "the loader needs T > 0 (got %d), shards (got %d) and 0 <= hold_out < 1 (got %g)",
                 cfg->T, n, cfg->hold_out);
        return US_ERR_INVALID;
    }
    l->shards = (us_loader_shard *)calloc((size_t)n, sizeof *l->shards);
    l->order = (int64_t *)US_MALLOC(sizeof(int64_t) * (size_t)n);
    if (!l->shards || !l->order) r = US_ERR_OOM;
    for (i = 0; i < n && r == US_OK; i++) {
        l->n_shards = i + 1;
        r = us__loader_open_shard(l, &l->shards[i], paths[i]);
        l->shards[i].first = l->n_tokens;
        l->n_tokens += l->shards[i].n;
    }
    if (r == US_OK) {
        us__loader_count(l);
        for (i = 0; i < n; i++)
            if (l->shards[i].windows > most) most = l->shards[i].windows;
        if (!(l->perm = (int64_t *)US_MALLOC(sizeof(int64_t) * (size_t)most))) r = US_ERR_OOM;
    }
    if (r == US_OK && l->n_windows == 0)
        us__errf(l->err, sizeof l->err,
                 "the %d shard%s %lld tokens (%lld to train on): no shard has a window of "
                 "T + 1 = %d",
                 n, n > 1 ? "s hold" : " holds", (long long)l->n_tokens, (long long)l->n_train,
                 cfg->T + 1);
    if (r == US_OK && l->n_windows == 0) r = US_ERR_INVALID;
    if (r == US_ERR_OOM) us__errf(l->err, sizeof l->err, "out of memory opening %d shards", n);
    if (r != US_OK) {
        char keep[512];
        memcpy(keep, l->err, sizeof keep);
        us_loader_close(l);
        memcpy(l->err, keep, sizeof keep);
    }
    return r;
}

US_API void us_loader_close(us_loader *l) {
    int i;
    for (i = 0; l->shards && i < l->n_shards; i++) {
#ifdef US__DATA_POSIX
        if (l->shards[i].map) munmap((void *)l->shards[i].map, l->shards[i].map_len);
#endif
        US_FREE(l->shards[i].path);
    }
    if (l->file) fclose((FILE *)l->file);
    free(l->shards);
    US_FREE(l->order);
    US_FREE(l->perm);
    memset(l, 0, sizeof *l);
}

/* The shuffles: Fisher–Yates with a generator seeded by (seed, epoch, shard), so any position's
   order is recomputed from three numbers (shard −1: the epoch's order of shards). */
static void us__loader_shuffle(int64_t *a, int64_t n, uint64_t seed, int64_t epoch, int64_t shard) {
    us_rng r;
    int64_t i;
    us_rng_seed(&r, seed ^ 0x6a09e667f3bcc909ull * (uint64_t)(epoch + 1));
    r.s ^= 0xbb67ae8584caa73bull * (uint64_t)(shard + 2);
    for (i = 0; i < n; i++) a[i] = i;
    for (i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(us_rng_u64(&r) % (uint64_t)(i + 1));
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* The shard file at position k of the current epoch's order (drawn on first use). */
static int us__loader_shard_at(us_loader *l, int64_t k) {
    if (l->order_epoch != l->pos.epoch) {
        if (l->cfg.no_shuffle) {
            int64_t i;
            for (i = 0; i < l->n_shards; i++) l->order[i] = i;
        } else {
            us__loader_shuffle(l->order, l->n_shards, l->pos.seed, l->pos.epoch, -1);
        }
        l->order_epoch = l->pos.epoch;
    }
    return (int)l->order[k];
}

/* The next window of the stream: its shard and its index there; moves the position on. */
static void us__loader_step(us_loader *l, int *shard, int64_t *window) {
    for (;;) {
        int s;
        if (l->pos.shard >= l->n_shards) { /* the epoch is done: the next, in a new order */
            l->pos.epoch++;
            l->pos.shard = 0;
            l->pos.window = 0;
        }
        s = us__loader_shard_at(l, l->pos.shard);
        if (l->pos.window < l->shards[s].windows) {
            if (l->perm_epoch != l->pos.epoch || l->perm_shard != s) {
                if (l->cfg.no_shuffle) {
                    int64_t i;
                    for (i = 0; i < l->shards[s].windows; i++) l->perm[i] = i;
                } else {
                    us__loader_shuffle(l->perm, l->shards[s].windows, l->pos.seed, l->pos.epoch, s);
                }
                l->perm_epoch = l->pos.epoch;
                l->perm_shard = s;
            }
            *shard = s;
            *window = l->perm[l->pos.window++];
            return;
        }
        l->pos.shard++;
        l->pos.window = 0;
    }
}

/* n tokens of shard s from its token at: from the map, or (no mmap) read with stdio */
static us_result us__loader_tokens(us_loader *l, int s, int64_t at, int64_t n, int32_t *out) {
    const us_loader_shard *sh = &l->shards[s];
    const int64_t hb = US__SHARD_HEADER * 4;
    unsigned char buf[4096];
    int64_t done = 0;
    if (sh->map)
        return us__shard_decode(sh->map + hb + at * sh->tsz, sh->tsz, n, out, l->cfg.vocab,
                                sh->path, at, l->err, sizeof l->err);
    if (l->file_shard != s) {
        if (l->file) fclose((FILE *)l->file);
        l->file_shard = s;
        if (!(l->file = fopen(sh->path, "rb"))) {
            l->file_shard = -1;
            us__errf(l->err, sizeof l->err, "cannot open %s", sh->path);
            return US_ERR_IO;
        }
    }
    while (done < n) { /* in pieces of the buffer */
        int64_t k =
            n - done < (int64_t)sizeof buf / sh->tsz ? n - done : (int64_t)sizeof buf / sh->tsz;
        us_result r;
        if (fseek((FILE *)l->file, (long)(hb + (at + done) * sh->tsz), SEEK_SET) != 0 ||
            fread(buf, (size_t)sh->tsz, (size_t)k, (FILE *)l->file) != (size_t)k) {
            us__errf(l->err, sizeof l->err, "cannot read %s (did it change?)", sh->path);
            return US_ERR_IO;
        }
        r = us__shard_decode(buf, sh->tsz, k, out + done, l->cfg.vocab, sh->path, at + done, l->err,
                             sizeof l->err);
        if (r != US_OK) return r;
        done += k;
    }
    return US_OK;
}

US_API us_result us_loader_next(us_loader *l, int nseq, int first, int count, int32_t *inputs,
                                int32_t *targets) {
    const int T = l->cfg.T;
    int j;
    if (first < 0 || count < 0 || first + count > nseq) {
        us__errf(l->err, sizeof l->err, "rows %d .. %d are not in a batch of %d", first,
                 first + count - 1, nseq);
        return US_ERR_INVALID;
    }
    for (j = 0; j < nseq; j++) {
        int s;
        int64_t w;
        us_result r;
        int32_t *in;
        us__loader_step(l, &s, &w);
        if (j < first || j >= first + count) continue; /* another dp rank's row */
        in = inputs + (int64_t)(j - first) * T;
        if ((r = us__loader_tokens(l, s, w * T, T, in)) != US_OK) return r;
        memcpy(targets + (int64_t)(j - first) * T, in + 1, (size_t)(T - 1) * 4);
        r = us__loader_tokens(l, s, w * T + T, 1, targets + (int64_t)(j - first) * T + T - 1);
        if (r != US_OK) return r;
    }
    return US_OK;
}

US_API us_loader_pos us_loader_tell(const us_loader *l) { return l->pos; }

US_API us_result us_loader_seek(us_loader *l, us_loader_pos pos) {
    us_loader_pos was = l->pos;
    int64_t windows = 0;
    if (pos.epoch < 0 || pos.shard < 0 || pos.shard > l->n_shards || pos.window < 0) {
        us__errf(l->err, sizeof l->err, "position epoch %lld shard %lld window %lld is not one",
                 (long long)pos.epoch, (long long)pos.shard, (long long)pos.window);
        return US_ERR_INVALID;
    }
    l->pos = pos;
    if (pos.seed != was.seed) l->order_epoch = l->perm_epoch = -1; /* other shuffles */
    if (pos.shard < l->n_shards) windows = l->shards[us__loader_shard_at(l, pos.shard)].windows;
    if (pos.window > windows) {
        us__errf(l->err, sizeof l->err,
                 "position epoch %lld shard %lld window %lld: that shard has %lld windows",
                 (long long)pos.epoch, (long long)pos.shard, (long long)pos.window,
                 (long long)windows);
        l->pos = was;
        l->order_epoch = l->perm_epoch = -1;
        return US_ERR_INVALID;
    }
    return US_OK;
}

US_API us_result us_loader_read(us_loader *l, int64_t first, int64_t n, int32_t *out) {
    int s = 0;
    if (first < 0 || n < 0 || first + n > l->n_tokens) {
        us__errf(l->err, sizeof l->err, "tokens %lld .. %lld are not in the %lld of the shards",
                 (long long)first, (long long)(first + n - 1), (long long)l->n_tokens);
        return US_ERR_INVALID;
    }
    while (n > 0) {
        us_loader_shard *sh;
        int64_t at, k;
        us_result r;
        while (l->shards[s].first + l->shards[s].n <= first) s++;
        sh = &l->shards[s];
        at = first - sh->first;
        k = sh->n - at < n ? sh->n - at : n;
        if ((r = us__loader_tokens(l, s, at, k, out)) != US_OK) return r;
        out += k;
        first += k;
        n -= k;
    }
    return US_OK;
}

US_API void us_task_init(us_task *t, uint64_t seed) { us_rng_seed(&t->rng, seed ^ 0x5eedull); }

/* one problem: digits, '=', sorted digits, '\n' into line[US_TASK_LINE] */
static void us__task_line(us_task *t, int32_t *line) {
    int cnt[10] = {0}, i, d, k = 0;
    for (i = 0; i < US_TASK_DIGITS; i++) {
        d = (int)(us_rng_u64(&t->rng) % 10);
        line[i] = '0' + d;
        cnt[d]++;
    }
    line[US_TASK_DIGITS] = '=';
    for (d = 0; d < 10; d++)
        for (i = 0; i < cnt[d]; i++) line[US_TASK_DIGITS + 1 + k++] = '0' + d;
    line[US_TASK_LINE - 1] = '\n';
}

US_API void us_task_batch(us_task *t, int nseq, int T, int32_t *inputs, int32_t *targets) {
    int32_t *buf = (int32_t *)US_MALLOC(((size_t)T + 1) * 4);
    char *scored = (char *)US_MALLOC((size_t)T + 1);
    int s, i;
    for (s = 0; s < nseq; s++) {
        int pos = 0;
        while (pos + US_TASK_LINE <= T + 1) {
            us__task_line(t, buf + pos);
            for (i = 0; i < US_TASK_LINE; i++)
                scored[pos + i] = i > US_TASK_DIGITS; /* the answer and its newline */
            pos += US_TASK_LINE;
        }
        for (; pos < T + 1; pos++) {
            buf[pos] = '\n';
            scored[pos] = 0;
        }
        for (i = 0; i < T; i++) {
            inputs[(int64_t)s * T + i] = buf[i];
            targets[(int64_t)s * T + i] = scored[i + 1] ? buf[i + 1] : -1;
        }
    }
    US_FREE(buf);
    US_FREE(scored);
}

US_API us_result us_task_exact_match(us_model *m, us_task *t, int n, double *acc, char *buf,
                                     size_t buflen, int show) {
    enum {
        P = US_TASK_DIGITS + 1,
        A = US_TASK_DIGITS + 1
    }; /* prompt "digits=", answer "sorted\n" */

    int B = m->tc.batch, done = 0, solved = 0, shown = 0, i;
    int32_t *lines = (int32_t *)US_MALLOC((size_t)B * US_TASK_LINE * 4),
            *ctx = (int32_t *)US_MALLOC((size_t)B * US_TASK_LINE * 4);
    int32_t *tg = (int32_t *)US_MALLOC((size_t)B * US_TASK_LINE * 4),
            *gen = (int32_t *)US_MALLOC((size_t)B * A * 4);
    float *logits = (float *)US_MALLOC((size_t)B * m->cfg.vocab * 4);
    size_t used = 0;
    us_result r = US_OK;
    if (m->tc.seq < US_TASK_LINE - 1) {
        us__model_set_error(m, "the task needs seq >= %d", US_TASK_LINE - 1);
        r = US_ERR_INVALID;
        goto out;
    }
    if (!lines || !ctx || !tg || !gen || !logits) {
        us__model_set_error(m, "out of host memory");
        r = US_ERR_OOM;
        goto out;
    }
    if (buf && buflen) buf[0] = 0;
    us__fp8_wcache_drop(m); /* as us_sample */
    for (i = 0; i < B * US_TASK_LINE; i++) tg[i] = -1;
    while (done < n) {
        int nb = n - done < B ? n - done : B, b, k;
        for (b = 0; b < nb; b++) us__task_line(t, lines + b * US_TASK_LINE);
        /* greedy decoding of nb problems side by side: every prompt has the same length */
        for (k = 0; k < A; k++) {
            int len = P + k;
            for (b = 0; b < nb; b++) {
                memcpy(ctx + b * len, lines + b * US_TASK_LINE, (size_t)P * 4);
                memcpy(ctx + b * len + P, gen + b * A, (size_t)k * 4);
            }
            if ((r = us__forward_eval(m, ctx, tg, nb, len, NULL, NULL, logits)) != US_OK) goto out;
            for (b = 0; b < nb; b++) {
                const float *lg = logits + (int64_t)b * m->cfg.vocab;
                int64_t v, best = 0;
                for (v = 1; v < m->cfg.vocab; v++)
                    if (lg[v] > lg[best]) best = v;
                gen[b * A + k] = (int32_t)best;
            }
        }
        for (b = 0; b < nb; b++) {
            int ok = 1;
            for (i = 0; i < A; i++) ok &= gen[b * A + i] == lines[b * US_TASK_LINE + P + i];
            solved += ok;
            if (buf && shown < show && used + 64 < buflen) {
                char q[US_TASK_LINE + 1], a[US_TASK_LINE + 1];
                us_byte_decode(lines + b * US_TASK_LINE, (size_t)P, q, sizeof q);
                us_byte_decode(gen + b * A, (size_t)A - 1, a, sizeof a);
                used += (size_t)snprintf(buf + used, buflen - used, "  %s%s  %s\n", q, a,
                                         ok ? "ok" : "wrong");
                shown++;
            }
        }
        done += nb;
    }
    *acc = n > 0 ? (double)solved / (double)n : 0.0;
out:
    US_FREE(lines);
    US_FREE(ctx);
    US_FREE(tg);
    US_FREE(gen);
    US_FREE(logits);
    return r;
}
#endif /* ULTRASCALE_NO_DATA */

/* ------------------------------------------------------------------------------------ */
// >>sample  temperature / top-k / top-p sampling, generation with a KV cache
/* ------------------------------------------------------------------------------------ */
typedef struct us__cand {
    double p;
    int64_t v;
} us__cand;

/* most likely first; equal probabilities by index, so the order is the same on every rank */
static int us__cand_cmp(const void *a, const void *b) {
    const us__cand *x = (const us__cand *)a, *y = (const us__cand *)b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->v < y->v ? -1 : x->v > y->v;
}

/* The k-th largest logit (ties by index): the top-k filter keeps every logit ≥ it. */
static us_result us__topk_threshold(const float *lg, int64_t V, int top_k, float *kth) {
    float *tmp;
    int64_t v;
    int kk;
    *kth = -INFINITY;
    if (top_k <= 0 || top_k >= V) return US_OK;
    tmp = (float *)US_MALLOC((size_t)V * 4);
    if (!tmp) return US_ERR_OOM;
    memcpy(tmp, lg, (size_t)V * 4);
    for (kk = 0; kk < top_k; kk++) { /* partial selection: top_k is small */
        int64_t best = -1;
        for (v = 0; v < V; v++)
            if (tmp[v] > -INFINITY && (best < 0 || tmp[v] > tmp[best])) best = v;
        if (best < 0) break;
        *kth = tmp[best];
        tmp[best] = -INFINITY;
    }
    US_FREE(tmp);
    return US_OK;
}

/* Nucleus sampling (Holtzman et al.): the kept tokens by falling probability, cut after the
   first whose running sum reaches top_p, the draw u over what remains (u in [0, 1)). */
static us_result us__top_p_pick(const float *lg, int64_t V, float kth, float mx, float temperature,
                                double sum, float top_p, float u, int64_t *pick) {
    us__cand *c = (us__cand *)US_MALLOC((size_t)V * sizeof(us__cand));
    int64_t n = 0, keep, v;
    double run = 0, acc = 0;
    if (!c) return US_ERR_OOM;
    for (v = 0; v < V; v++) {
        if (lg[v] < kth) continue;
        c[n].p = exp((double)(lg[v] - mx) / temperature) / sum;
        c[n].v = v;
        n++;
    }
    qsort(c, (size_t)n, sizeof(us__cand), us__cand_cmp);
    for (keep = 0; keep < n;) {
        run += c[keep++].p;
        if (run >= top_p) break;
    }
    *pick = c[keep - 1].v;
    for (v = 0; v < keep; v++) {
        acc += c[v].p / run;
        if (acc > u) {
            *pick = c[v].v;
            break;
        }
    }
    US_FREE(c);
    return US_OK;
}

US_API us_result us_sample_logits(const float *lg, int64_t V, float temperature, int top_k,
                                  float top_p, us_rng *r, int32_t *tok) {
    int64_t pick = 0, v;
    float kth, mx = -INFINITY, u;
    double sum = 0, c = 0;
    us_result res;
    if (V < 1) return US_ERR_INVALID;
    if (temperature <= 0) {
        for (v = 1; v < V; v++)
            if (lg[v] > lg[pick]) pick = v;
        *tok = (int32_t)pick;
        return US_OK;
    }
    /* keep the top_k largest logits (ties by index), softmax at temperature, draw */
    if ((res = us__topk_threshold(lg, V, top_k, &kth)) != US_OK) return res;
    for (v = 0; v < V; v++)
        if (lg[v] >= kth && lg[v] > mx) mx = lg[v];
    if (!isfinite(mx)) return US_ERR_NONFINITE; /* no finite logit to draw from */
    for (v = 0; v < V; v++) sum += lg[v] >= kth ? exp((double)(lg[v] - mx) / temperature) : 0.0;
    u = us_rng_uniform(r);
    if (top_p > 0 && top_p < 1) {
        res = us__top_p_pick(lg, V, kth, mx, temperature, sum, top_p, u, &pick);
        *tok = (int32_t)pick;
        return res;
    }
    pick = V - 1;
    for (v = 0; v < V; v++) {
        c += lg[v] >= kth ? exp((double)(lg[v] - mx) / temperature) / sum : 0.0;
        if (lg[v] >= kth && c > u) {
            pick = v;
            break;
        }
    }
    *tok = (int32_t)pick;
    return US_OK;
}

static void us__sample_error(us_model *m, us_result r) {
    us__model_set_error(m, r == US_ERR_NONFINITE ? "sampling found no finite logit"
                                                 : "out of host memory for sampling");
}

US_API us_result us_sample(us_model *m, const int32_t *prompt, int n_prompt, int n_new,
                           float temperature, int top_k, us_rng *r, int32_t *out) {
    int64_t V = m->cfg.vocab;
    int len, total = n_prompt + n_new;
    float *lg = (float *)US_MALLOC((size_t)V * 4);
    int32_t *tg = (int32_t *)US_MALLOC((size_t)(total > 0 ? total : 1) * 4);
    us_result res = US_OK;
    us__fp8_wcache_drop(
        m); /* as us_forward_eval, once: the tokens' forwards share the quantised weights */
    if (!lg || !tg) {
        US_FREE(lg);
        US_FREE(tg);
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    if (n_prompt < 1 || n_new < 0 || total > m->tc.seq) {
        us__model_set_error(m, "prompt %d + new %d tokens must be between 1 and seq=%d", n_prompt,
                            n_new, m->tc.seq);
        US_FREE(lg);
        US_FREE(tg);
        return US_ERR_INVALID;
    }
    memcpy(out, prompt, (size_t)n_prompt * 4);
    for (len = 0; len < total; len++) tg[len] = -1;
    for (len = n_prompt; len < total; len++) {
        if ((res = us__forward_eval(m, out, tg, 1, len, NULL, NULL, lg)) != US_OK) break;
        if ((res = us_sample_logits(lg, V, temperature, top_k, 0.0f, r, out + len)) != US_OK) {
            us__sample_error(m, res);
            break;
        }
    }
    US_FREE(lg);
    US_FREE(tg);
    return res;
}

/* Generation's attention for layer l, called by us__layer_fwd in place of RoPE and attention
   while m->gen is set: the new tokens' q and k [B,T,QKV] turn by their positions len .. len+T−1,
   their k and v heads are appended to the cache, and their queries attend over the cache's
   positions 0 .. len+T−1 (causal by position) with the blockwise op of context parallelism:
   one key block per sequence, the whole cache so far. */
static us_result us__gen_attention(us_model *m, int l, us_layer_acts *A, int64_t B, int64_t T) {
    us_gen *g = m->gen;
    us_ops *o = &m->ops;
    us_dtype dt = m->dt;
    int NH = m->nh_l, NKV = m->nkv_l, HS = (int)(m->cfg.dim / m->cfg.n_heads);
    int64_t QKV = (int64_t)(NH + 2 * NKV) * HS, KV = (int64_t)2 * NKV * HS, AO = (int64_t)NH * HS;
    int64_t p0 = g->len, b;
    /* this layer's cache [B][max_len][KV] */
    void *cache = us__at(g->kv, dt, (int64_t)l * g->B * g->max_len * KV);
    o->rope_at(o, A->qkv, g->pos + p0, B, T, g->max_len, NH, NKV, HS, m->rope_freq, 1.0f, dt);
    for (b = 0; b < B; b++) {
        void *kvb = us__at(cache, dt, b * g->max_len * KV); /* [max_len][KV] */
        const void *qb = us__at(A->qkv, dt, b * T * QKV);   /* [T][QKV] */
        o->copy2d(o, us__at(kvb, dt, p0 * KV), KV, us__at(qb, dt, AO), QKV, T, KV, dt);
        o->attn_block_fwd(o, g->acc + b * NH * T * HS, g->mx + b * NH * T, g->sum + b * NH * T, qb,
                          kvb, g->pos + p0, g->pos, 1, T, p0 + T, NH, NKV, HS, 1, dt);
    }
    /* att [B,T,NH·HS] = acc / sum, lse [B,NH,T] */
    o->attn_block_finish(o, A->att, A->lse, g->acc, g->mx, g->sum, B, T, NH, HS, dt);
    return US_OK;
}

US_API void us_gen_free(us_gen *g) {
    us_ops *o;
    if (!g->m) return;
    o = &g->m->ops;
    if (g->kv) o->free(o, g->kv);
    if (g->pos) o->free(o, g->pos);
    if (g->acc) o->free(o, g->acc);
    if (g->mx) o->free(o, g->mx);
    if (g->sum) o->free(o, g->sum);
    US_FREE(g->tgt);
    US_FREE(g->in);
    memset(g, 0, sizeof *g);
}

US_API void us_gen_reset(us_gen *g) { g->len = 0; }

US_API us_result us_gen_init(us_gen *g, us_model *m, int B, int max_len) {
    us_ops *o = &m->ops;
    int NH = m->nh_l, HS = (int)(m->cfg.dim / m->cfg.n_heads), i;
    int64_t KV = (int64_t)2 * m->nkv_l * HS, L = m->cfg.n_layers, n;
    size_t kvb, accb, stb;
    int32_t *pos;
    memset(g, 0, sizeof *g);
    if (max_len == 0) max_len = m->tc.seq;
    if (B < 1 || B > m->tc.batch || max_len < 1) {
        us__model_set_error(m,
                            "generation needs 1 <= B <= batch=%d sequences and max_len >= 1 "
                            "(got B=%d, max_len=%d)",
                            m->tc.batch, B, max_len);
        return US_ERR_INVALID;
    }
    g->m = m;
    g->B = B;
    g->max_len = max_len;
    g->chunk = m->tc.seq / m->mesh.cp < max_len ? m->tc.seq / m->mesh.cp : max_len;
    n = (int64_t)B * g->chunk;
    kvb = (size_t)(L * B * max_len * KV) * us_dtype_size(m->dt);
    accb = (size_t)(n * NH * HS) * 4;
    stb = (size_t)(n * NH) * 4;
    g->kv = L > 0 ? o->alloc(o, kvb) : NULL;
    g->pos = (int32_t *)o->alloc(o, (size_t)max_len * 4);
    g->acc = (float *)o->alloc(o, accb);
    g->mx = (float *)o->alloc(o, stb);
    g->sum = (float *)o->alloc(o, stb);
    g->tgt = (int32_t *)US_MALLOC((size_t)n * 4);
    g->in = (int32_t *)US_MALLOC((size_t)n * 4);
    pos = (int32_t *)US_MALLOC((size_t)max_len * 4);
    g->bytes = kvb + (size_t)max_len * 4 + accb + 2 * stb;
    if ((L > 0 && !g->kv) || !g->pos || !g->acc || !g->mx || !g->sum || !g->tgt || !g->in || !pos) {
        US_FREE(pos);
        us_gen_free(g);
        us__model_set_error(m, "out of memory for a KV cache of %zu bytes", kvb);
        return US_ERR_OOM;
    }
    for (i = 0; i < max_len; i++) pos[i] = i;
    for (i = 0; i < n; i++) g->tgt[i] = -1;
    o->copy(o, g->pos, pos, (size_t)max_len * 4, US_COPY_H2D);
    US_FREE(pos);
    /* the forwards that follow share the quantised weights (as us_sample) */
    us__fp8_wcache_drop(m);
    return US_OK;
}

US_API us_result us_gen_forward(us_gen *g, const int32_t *tokens, int T, float *logits) {
    us_model *m = g->m;
    int done = 0, B = g->B, b;
    us_result r = US_OK;
    if (T < 1 || g->len + T > g->max_len) {
        us__model_set_error(m, "%d new tokens after %d do not fit the cache of %d positions", T,
                            g->len, g->max_len);
        return US_ERR_INVALID;
    }
    while (done < T && r == US_OK) { /* pieces of at most chunk tokens: the arena's length */
        int n = T - done < g->chunk ? T - done : g->chunk;
        for (b = 0; b < B; b++)
            memcpy(g->in + (int64_t)b * n, tokens + (int64_t)b * T + done, (size_t)n * 4);
        m->gen = g;
        r = us__forward_eval(m, g->in, g->tgt, B, n, NULL, NULL, done + n == T ? logits : NULL);
        m->gen = NULL;
        if (r == US_OK) g->len += n;
        done += n;
    }
    return r;
}

US_API us_result us_generate(us_model *m, const int32_t *prompt, int n_prompt, int n_new,
                             float temperature, int top_k, float top_p, us_rng *r, int32_t *out) {
    us_gen g;
    float *lg;
    us_result res;
    int k;
    if (n_prompt < 1 || n_new < 0) {
        us__model_set_error(m,
                            "generation needs a prompt of at least 1 token and n_new >= 0 "
                            "(got %d and %d)",
                            n_prompt, n_new);
        return US_ERR_INVALID;
    }
    memcpy(out, prompt, (size_t)n_prompt * 4);
    if (n_new == 0) return US_OK;
    lg = (float *)US_MALLOC((size_t)m->cfg.vocab * 4);
    if (!lg) {
        us__model_set_error(m, "out of host memory");
        return US_ERR_OOM;
    }
    if ((res = us_gen_init(&g, m, 1, n_prompt + n_new - 1)) != US_OK) {
        US_FREE(lg);
        return res;
    }
    /* the prefill: the whole prompt once; then one token a step, the last one never run */
    res = us_gen_forward(&g, prompt, n_prompt, lg);
    for (k = 0; k < n_new && res == US_OK; k++) {
        if ((res = us_sample_logits(lg, m->cfg.vocab, temperature, top_k, top_p, r,
                                    out + n_prompt + k)) != US_OK) {
            us__sample_error(m, res);
            break;
        }
        if (k + 1 < n_new) res = us_gen_forward(&g, out + n_prompt + k, 1, lg);
    }
    us_gen_free(&g);
    US_FREE(lg);
    return res;
}

#if !defined(ULTRASCALE_NO_CHECKPOINT) || !defined(ULTRASCALE_NO_TOKENIZER)
/* ------------------------------------------------------------------------------------ */
// >>checkpoint  safetensors with Hugging Face names, resharding by byte ranges, crash-safe saves
/* ------------------------------------------------------------------------------------ */
/* A small bounded JSON reader: one pass builds a flat token list (pre-order; each token knows
   where its subtree ends), depth and token count limited, every byte checked. Enough for the
   safetensors header, the shard index, config.json and trainer_state.json. */
enum { US__J_OBJ = 1, US__J_ARR, US__J_STR, US__J_NUM, US__J_LIT };

typedef struct us__jtok {
    int type, size, next;
    size_t start, end;
} us__jtok; /* [start, end) raw text; strings without quotes */

typedef struct us__json {
    const char *s;
    size_t n, i;
    us__jtok *t;
    int nt, cap;
    char err[160];
} us__json;

#define US__J_MAX_DEPTH 32

static void us__jws(us__json *j) {
    while (j->i < j->n &&
           (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
}

static int us__jfail(us__json *j, const char *what) {
    if (!j->err[0]) snprintf(j->err, sizeof j->err, "%s at byte %lu", what, (unsigned long)j->i);
    return -1;
}

static int us__jnew(us__json *j, int type, size_t start) {
    if (j->nt >= j->cap) return us__jfail(j, "too many JSON values");
    j->t[j->nt].type = type;
    j->t[j->nt].size = 0;
    j->t[j->nt].start = start;
    j->t[j->nt].end = start;
    j->t[j->nt].next = j->nt + 1;
    return j->nt++;
}

static int us__jhex(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static int us__jstring(us__json *j) { /* at the opening quote */
    int k = us__jnew(j, US__J_STR, ++j->i);
    if (k < 0) return -1;
    while (j->i < j->n && j->s[j->i] != '"') {
        unsigned char c = (unsigned char)j->s[j->i];
        if (c < 0x20) return us__jfail(j, "control character in a JSON string");
        if (c == '\\') {
            char e;
            if (++j->i >= j->n) break;
            e = j->s[j->i];
            if (e == 'u') {
                int q;
                for (q = 1; q <= 4; q++)
                    if (j->i + q >= j->n || us__jhex(j->s[j->i + q]) < 0)
                        return us__jfail(j, "bad \\u escape in a JSON string");
                j->i += 4;
            } else if (!strchr("\"\\/bfnrt", e) || !e)
                return us__jfail(j, "bad escape in a JSON string");
        }
        j->i++;
    }
    if (j->i >= j->n) return us__jfail(j, "unterminated JSON string");
    j->t[k].end = j->i++;
    return k;
}

static int us__jvalue(us__json *j, int depth);

static int us__jcontainer(us__json *j, int depth, int obj) {
    int k = us__jnew(j, obj ? US__J_OBJ : US__J_ARR, j->i);
    if (k < 0) return -1;
    if (depth > US__J_MAX_DEPTH) return us__jfail(j, "JSON nested too deeply");
    j->i++;
    us__jws(j);
    if (j->i < j->n && j->s[j->i] == (obj ? '}' : ']')) {
        j->i++;
        j->t[k].end = j->i;
        j->t[k].next = j->nt;
        return k;
    }
    for (;;) {
        us__jws(j);
        if (obj) {
            if (j->i >= j->n || j->s[j->i] != '"')
                return us__jfail(j, "expected a string key in a JSON object");
            if (us__jstring(j) < 0) return -1;
            us__jws(j);
            if (j->i >= j->n || j->s[j->i] != ':')
                return us__jfail(j, "expected ':' in a JSON object");
            j->i++;
        }
        if (us__jvalue(j, depth + 1) < 0) return -1;
        j->t[k].size++;
        us__jws(j);
        if (j->i < j->n && j->s[j->i] == ',') {
            j->i++;
            continue;
        }
        if (j->i < j->n && j->s[j->i] == (obj ? '}' : ']')) {
            j->i++;
            break;
        }
        return us__jfail(j, obj ? "expected ',' or '}' in a JSON object"
                                : "expected ',' or ']' in a JSON array");
    }
    j->t[k].end = j->i;
    j->t[k].next = j->nt;
    return k;
}

static int us__jvalue(us__json *j, int depth) {
    char c;
    us__jws(j);
    if (j->i >= j->n) return us__jfail(j, "unexpected end of JSON");
    c = j->s[j->i];
    if (c == '{' || c == '[') return us__jcontainer(j, depth, c == '{');
    if (c == '"') return us__jstring(j);
    if (c == '-' || (c >= '0' && c <= '9')) { /* -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)? */
        int k = us__jnew(j, US__J_NUM, j->i), digits = 0;
        if (k < 0) return -1;
        if (j->s[j->i] == '-') j->i++;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
            j->i++;
            digits++;
        }
        if (!digits) return us__jfail(j, "bad JSON number");
        if (j->i < j->n && j->s[j->i] == '.') {
            j->i++;
            digits = 0;
            while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
                j->i++;
                digits++;
            }
            if (!digits) return us__jfail(j, "bad JSON number");
        }
        if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
            j->i++;
            digits = 0;
            if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-')) j->i++;
            while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
                j->i++;
                digits++;
            }
            if (!digits) return us__jfail(j, "bad JSON number");
        }
        j->t[k].end = j->i;
        return k;
    }
    {
        static const char *lit[3] = {"true", "false", "null"};
        int q;
        for (q = 0; q < 3; q++) {
            size_t L = strlen(lit[q]);
            if (j->n - j->i >= L && !memcmp(j->s + j->i, lit[q], L)) {
                int k = us__jnew(j, US__J_LIT, j->i);
                if (k < 0) return -1;
                j->i += L;
                j->t[k].end = j->i;
                return k;
            }
        }
    }
    return us__jfail(j, "unexpected character in JSON");
}

/* Parses s[n] as one JSON value; max_tokens bounds the work. 0 on success. */
static int us__json_parse(us__json *j, const char *s, size_t n, int max_tokens) {
    memset(j, 0, sizeof *j);
    j->s = s;
    j->n = n;
    j->cap = max_tokens;
    j->t = (us__jtok *)US_MALLOC(sizeof(us__jtok) * (size_t)(max_tokens > 0 ? max_tokens : 1));
    if (!j->t) {
        snprintf(j->err, sizeof j->err, "out of memory for the JSON tokens");
        return -1;
    }
    if (us__jvalue(j, 0) < 0) return -1;
    us__jws(j);
    if (j->i != j->n) return us__jfail(j, "trailing bytes after the JSON value");
    return 0;
}

static void us__json_free(us__json *j) {
    US_FREE(j->t);
    j->t = NULL;
}

/* A string token unescaped into out (UTF-8); 0 if it does not fit or is not a string. */
static int us__jstr(const us__json *j, int k, char *out, size_t cap) {
    size_t i, o = 0;
    if (k < 0 || j->t[k].type != US__J_STR || !cap) return 0;
    for (i = j->t[k].start; i < j->t[k].end; i++) {
        unsigned cp = (unsigned char)j->s[i];
        if (cp == '\\') {
            char e = j->s[++i];
            if (e == 'u') {
                cp = (unsigned)(us__jhex(j->s[i + 1]) << 12 | us__jhex(j->s[i + 2]) << 8 |
                                us__jhex(j->s[i + 3]) << 4 | us__jhex(j->s[i + 4]));
                i += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && i + 6 < j->t[k].end && j->s[i + 1] == '\\' &&
                    j->s[i + 2] == 'u') {
                    unsigned lo =
                        (unsigned)(us__jhex(j->s[i + 3]) << 12 | us__jhex(j->s[i + 4]) << 8 |
                                   us__jhex(j->s[i + 5]) << 4 | us__jhex(j->s[i + 6]));
                    if (lo >= 0xDC00 && lo < 0xE000) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        i += 6;
                    }
                }
                if (cp == 0) return 0; /* an embedded NUL would cut a C string short */
                if (cp < 0x80) {
                    if (o + 1 >= cap) return 0;
                    out[o++] = (char)cp;
                } else if (cp < 0x800) {
                    if (o + 2 >= cap) return 0;
                    out[o++] = (char)(0xC0 | cp >> 6);
                    out[o++] = (char)(0x80 | (cp & 63));
                } else if (cp < 0x10000) {
                    if (o + 3 >= cap) return 0;
                    out[o++] = (char)(0xE0 | cp >> 12);
                    out[o++] = (char)(0x80 | (cp >> 6 & 63));
                    out[o++] = (char)(0x80 | (cp & 63));
                } else {
                    if (o + 4 >= cap) return 0;
                    out[o++] = (char)(0xF0 | cp >> 18);
                    out[o++] = (char)(0x80 | (cp >> 12 & 63));
                    out[o++] = (char)(0x80 | (cp >> 6 & 63));
                    out[o++] = (char)(0x80 | (cp & 63));
                }
                continue;
            }
            cp = e == 'b'   ? '\b'
                 : e == 'f' ? '\f'
                 : e == 'n' ? '\n'
                 : e == 'r' ? '\r'
                 : e == 't' ? '\t'
                            : (unsigned char)e;
        }
        if (o + 1 >= cap) return 0;
        out[o++] = (char)cp;
    }
    out[o] = 0;
    return 1;
}

/* The value of key in object token k, or -1. */
static int us__jget(const us__json *j, int k, const char *key) {
    int c, q;
    char buf[256];
    if (k < 0 || j->t[k].type != US__J_OBJ) return -1;
    for (c = k + 1, q = 0; q < j->t[k].size; q++) {
        int v = c + 1;
        if (us__jstr(j, c, buf, sizeof buf) && !strcmp(buf, key)) return v;
        c = j->t[v].next;
    }
    return -1;
}

/* An integer token (no fraction or exponent) into *v; 0 if not one or out of int64 range. */
static int us__jint(const us__json *j, int k, int64_t *v) {
    size_t i;
    int neg = 0;
    uint64_t x = 0;
    if (k < 0 || j->t[k].type != US__J_NUM) return 0;
    i = j->t[k].start;
    if (j->s[i] == '-') {
        neg = 1;
        i++;
    }
    for (; i < j->t[k].end; i++) {
        char c = j->s[i];
        if (c < '0' || c > '9') return 0;
        if (x > (UINT64_MAX - (uint64_t)(c - '0')) / 10) return 0;
        x = x * 10 + (uint64_t)(c - '0');
    }
    if (x > (uint64_t)INT64_MAX) return 0;
    *v = neg ? -(int64_t)x : (int64_t)x;
    return 1;
}

static int us__jnum(const us__json *j, int k, double *v) {
    char buf[64];
    size_t L;
    if (k < 0 || j->t[k].type != US__J_NUM) return 0;
    L = j->t[k].end - j->t[k].start;
    if (L >= sizeof buf) return 0;
    memcpy(buf, j->s + j->t[k].start, L);
    buf[L] = 0;
    *v = strtod(buf, NULL);
    return 1;
}

static int us__jbool(const us__json *j, int k, int *v) {
    if (k < 0 || j->t[k].type != US__J_LIT) return 0;
    if (j->s[j->t[k].start] == 'n') return 0;
    *v = j->s[j->t[k].start] == 't';
    return 1;
}

/* String token k as a new NUL-terminated buffer (unescaped: never longer than its raw text), or
   NULL */
static char *us__jdup(const us__json *j, int k) {
    char *out;
    if (k < 0 || j->t[k].type != US__J_STR) return NULL;
    out = (char *)US_MALLOC(j->t[k].end - j->t[k].start + 1);
    if (out && !us__jstr(j, k, out, j->t[k].end - j->t[k].start + 1)) {
        US_FREE(out);
        out = NULL;
    }
    return out;
}

static void us__choice_free(char **ctx, char **endings, int *n_end) {
    int e;
    US_FREE(*ctx);
    *ctx = NULL;
    for (e = 0; e < *n_end; e++) US_FREE(endings[e]);
    *n_end = 0;
}

/* A HellaSwag line's fields (us_choice_parse); its checks in the order a reader meets them */
static const char *us__choice_fields(const us__json *j, char **ctx, char **endings, int *n_end,
                                     int *label) {
    const int c = us__jget(j, 0, "ctx"), e = us__jget(j, 0, "endings");
    const int k = us__jget(j, 0, "label");
    int64_t lab = -1;
    int q, v;
    if (j->t[0].type != US__J_OBJ) return "not a JSON object";
    if (c < 0 || e < 0 || k < 0 || j->t[e].type != US__J_ARR || j->t[e].size < 2 ||
        j->t[e].size > US_CHOICE_MAX)
        return "no \"ctx\", \"endings\" (2..16) and \"label\"";
    if (!us__jint(j, k, &lab) || lab < 0) return "a malformed or out-of-range value";
    if (lab >= j->t[e].size) return "a label past the endings";
    if (!(*ctx = us__jdup(j, c))) return "a malformed or out-of-range value";
    for (q = 0, v = e + 1; q < j->t[e].size; q++, v = j->t[v].next) {
        if (!(endings[q] = us__jdup(j, v))) return "a malformed or out-of-range value";
        *n_end = q + 1;
    }
    *label = (int)lab;
    return NULL;
}

US_API const char *us_choice_parse(const char *line, size_t n, char **ctx,
                                   char *endings[US_CHOICE_MAX], int *n_end, int *label) {
    us__json j;
    const char *why;
    *ctx = NULL;
    *n_end = 0;
    *label = 0;
    if (us__json_parse(&j, line, n, 1024) < 0) {
        us__json_free(&j);
        return "not valid JSON";
    }
    why = us__choice_fields(&j, ctx, endings, n_end, label);
    if (why) us__choice_free(ctx, endings, n_end);
    us__json_free(&j);
    return why;
}
#endif /* the JSON reader, which // >>tokenizer and the multiple-choice reader use too */

#ifndef ULTRASCALE_NO_CHECKPOINT
/* ---- safetensors: 8-byte little-endian header length, a JSON header, the data section */
static const struct {
    const char *name;
    int size;
} us__st_dtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
                     {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
                     {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};

static int us__st_dtype_size(const char *d) {
    size_t i;
    for (i = 0; i < sizeof us__st_dtypes / sizeof us__st_dtypes[0]; i++)
        if (!strcmp(us__st_dtypes[i].name, d)) return us__st_dtypes[i].size;
    return 0;
}

static int us__st_cmp_begin(const void *a, const void *b) {
    const us_st_tensor *x = *(const us_st_tensor *const *)a, *y = *(const us_st_tensor *const *)b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
           : x->end < y->end     ? -1
                                 : x->end > y->end;
}

static int us__st_cmp_name(const void *a, const void *b) {
    return strcmp(((const us_st_tensor *)a)->name, ((const us_st_tensor *)b)->name);
}

US_API void us_safetensors_free(us_safetensors *st) {
    if (st) {
        US_FREE(st->t);
        memset(st, 0, sizeof *st);
    }
}

/* The 8-byte header length, checked against the bytes given and the file's size before any of
   the header is read, so a short or lying file fails with its own message. */
static us_result us__st_header_len(const unsigned char *b, size_t n, uint64_t file_size,
                                   uint64_t *hlen_out, char *err, size_t errlen) {
    uint64_t hlen = 0;
    int i;
    if (n < 8 || file_size < 8) {
        us__errf(err, errlen, "safetensors: %llu bytes is too short for the 8-byte header length",
                 (unsigned long long)(n < file_size ? n : file_size));
        return US_ERR_FORMAT;
    }
    for (i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen < 2 || hlen > US_ST_MAX_HEADER) {
        us__errf(err, errlen, "safetensors: header length %llu is outside 2..%llu bytes",
                 (unsigned long long)hlen, (unsigned long long)US_ST_MAX_HEADER);
        return US_ERR_FORMAT;
    }
    if (hlen > file_size - 8) {
        us__errf(err, errlen,
                 "safetensors: header length %llu runs past the end of the %llu-byte file",
                 (unsigned long long)hlen, (unsigned long long)file_size);
        return US_ERR_FORMAT;
    }
    if (hlen > n - 8) {
        us__errf(err, errlen, "safetensors: only %llu of the header's %llu bytes were given",
                 (unsigned long long)(n - 8), (unsigned long long)hlen);
        return US_ERR_FORMAT;
    }
    if (b[8] != '{') {
        us__errf(err, errlen, "safetensors: the header does not start with '{'");
        return US_ERR_FORMAT;
    }
    *hlen_out = hlen;
    return US_OK;
}

/* An entry's shape (token sh) into t, and the bytes dtype × shape needs, refusing sizes that
   would overflow the check against data_offsets. */
static us_result us__st_shape(const us__json *j, int sh, us_st_tensor *t, uint64_t *need, char *err,
                              size_t errlen) {
    uint64_t bytes_need = (uint64_t)us__st_dtype_size(t->dtype);
    int64_t x;
    int q;
    if (j->t[sh].type != US__J_ARR || j->t[sh].size > US_ST_MAX_DIMS) {
        us__errf(err, errlen, "safetensors: tensor %s: shape must be an array of at most %d sizes",
                 t->name, US_ST_MAX_DIMS);
        return US_ERR_FORMAT;
    }
    for (q = 0, x = 0; q < j->t[sh].size; q++) {
        int e = sh + 1 + q; /* the elements are numbers: one token each */
        if (!us__jint(j, e, &x) || x < 0 || x > ((int64_t)1 << 48)) {
            us__errf(err, errlen, "safetensors: tensor %s: shape entry %d is not a size in 0..2^48",
                     t->name, q);
            return US_ERR_FORMAT;
        }
        t->shape[q] = x;
        if (x && bytes_need > UINT64_MAX / (uint64_t)x) {
            us__errf(err, errlen, "safetensors: tensor %s: its size overflows", t->name);
            return US_ERR_FORMAT;
        }
        bytes_need *= (uint64_t)x;
    }
    t->ndim = j->t[sh].size;
    *need = bytes_need;
    return US_OK;
}

/* Header entry k (key token c): a tensor appended to st->t, or __metadata__ checked and skipped;
   every field validated, so later reads can trust begin/end. */
static us_result us__st_entry(const us__json *j, int c, int k, us_safetensors *st, char *err,
                              size_t errlen) {
    us_st_tensor *t = &st->t[st->n];
    int v = c + 1, d, sh, off;
    uint64_t bytes_need;
    int64_t x, y;
    if (!us__jstr(j, c, t->name, sizeof t->name) || !t->name[0]) {
        us__errf(err, errlen, "safetensors: tensor %d has an empty or too long (> 255 bytes) name",
                 k);
        return US_ERR_FORMAT;
    }
    if (!strcmp(t->name, "__metadata__")) { /* string → string */
        int mm, mc;
        if (j->t[v].type != US__J_OBJ) {
            us__errf(err, errlen, "safetensors: __metadata__ is not an object");
            return US_ERR_FORMAT;
        }
        for (mc = v + 1, mm = 0; mm < j->t[v].size; mm++, mc = j->t[mc + 1].next)
            if (j->t[mc + 1].type != US__J_STR) {
                us__errf(err, errlen, "safetensors: __metadata__ values must be strings");
                return US_ERR_FORMAT;
            }
        return US_OK;
    }
    if (j->t[v].type != US__J_OBJ) {
        us__errf(err, errlen, "safetensors: tensor %s is not described by an object", t->name);
        return US_ERR_FORMAT;
    }
    d = us__jget(j, v, "dtype");
    sh = us__jget(j, v, "shape");
    off = us__jget(j, v, "data_offsets");
    if (d < 0 || sh < 0 || off < 0) {
        us__errf(err, errlen, "safetensors: tensor %s lacks dtype, shape or data_offsets", t->name);
        return US_ERR_FORMAT;
    }
    if (!us__jstr(j, d, t->dtype, sizeof t->dtype) || !us__st_dtype_size(t->dtype)) {
        us__errf(err, errlen, "safetensors: tensor %s has an unknown dtype", t->name);
        return US_ERR_FORMAT;
    }
    if (us__st_shape(j, sh, t, &bytes_need, err, errlen) != US_OK) return US_ERR_FORMAT;
    if (j->t[off].type != US__J_ARR || j->t[off].size != 2 || !us__jint(j, off + 1, &x) ||
        !us__jint(j, off + 2, &y) || x < 0 || y < x) {
        us__errf(err, errlen,
                 "safetensors: tensor %s: data_offsets must be [begin, end] with 0 <= begin <= end",
                 t->name);
        return US_ERR_FORMAT;
    }
    t->begin = (uint64_t)x;
    t->end = (uint64_t)y;
    if (t->end > st->data_size) {
        us__errf(err, errlen,
                 "safetensors: tensor %s: data_offsets end %llu is past the data section's "
                 "%llu bytes",
                 t->name, (unsigned long long)t->end, (unsigned long long)st->data_size);
        return US_ERR_FORMAT;
    }
    if (t->end - t->begin != bytes_need) {
        us__errf(err, errlen,
                 "safetensors: tensor %s: %llu data bytes but dtype %s and its shape need %llu",
                 t->name, (unsigned long long)(t->end - t->begin), t->dtype,
                 (unsigned long long)bytes_need);
        return US_ERR_FORMAT;
    }
    st->n++;
    return US_OK;
}

/* No two tensors share bytes, no two share a name: a reader may then write each tensor's bytes
   to one place. */
static us_result us__st_disjoint(const us_safetensors *st, char *err, size_t errlen) {
    us_st_tensor **order;
    us_st_tensor *sorted;
    int i;
    order = (us_st_tensor **)US_MALLOC(sizeof(us_st_tensor *) * (size_t)(st->n ? st->n : 1));
    if (!order) {
        us__errf(err, errlen, "safetensors: out of memory");
        return US_ERR_OOM;
    }
    for (i = 0; i < st->n; i++) order[i] = &st->t[i];
    qsort(order, (size_t)st->n, sizeof *order, us__st_cmp_begin);
    for (i = 1; i < st->n; i++)
        if (order[i]->begin < order[i - 1]->end) {
            us__errf(err, errlen, "safetensors: tensors %s and %s overlap in the data section",
                     order[i - 1]->name, order[i]->name);
            US_FREE(order);
            return US_ERR_FORMAT;
        }
    US_FREE(order);
    sorted = (us_st_tensor *)US_MALLOC(sizeof(us_st_tensor) * (size_t)(st->n ? st->n : 1));
    if (!sorted) {
        us__errf(err, errlen, "safetensors: out of memory");
        return US_ERR_OOM;
    }
    memcpy(sorted, st->t, sizeof(us_st_tensor) * (size_t)st->n);
    qsort(sorted, (size_t)st->n, sizeof *sorted, us__st_cmp_name);
    for (i = 1; i < st->n; i++)
        if (!strcmp(sorted[i].name, sorted[i - 1].name)) {
            us__errf(err, errlen, "safetensors: tensor %s appears twice", sorted[i].name);
            US_FREE(sorted);
            return US_ERR_FORMAT;
        }
    US_FREE(sorted);
    return US_OK;
}

US_API us_result us_safetensors_parse(us_safetensors *st, const void *bytes, size_t n,
                                      uint64_t file_size, char *err, size_t errlen) {
    const unsigned char *b = (const unsigned char *)bytes;
    uint64_t hlen = 0;
    us__json j;
    int k, c, ntok;
    us_result r = US_ERR_FORMAT;
    memset(st, 0, sizeof *st);
    if (us__st_header_len(b, n, file_size, &hlen, err, errlen) != US_OK) return US_ERR_FORMAT;
    st->data_start = 8 + hlen;
    st->data_size = file_size - st->data_start;
    /* a tensor entry needs at least ~40 header bytes and 8 JSON values: this bounds the tokens */
    ntok = (int)(hlen / 2 + 16 < 4000000 ? hlen / 2 + 16 : 4000000);
    if (us__json_parse(&j, (const char *)b + 8, (size_t)hlen, ntok) != 0) {
        us__errf(err, errlen, "safetensors: bad JSON header: %s", j.err);
        us__json_free(&j);
        return US_ERR_FORMAT;
    }
    if (j.t[0].type != US__J_OBJ) {
        us__errf(err, errlen, "safetensors: the header is not a JSON object");
        goto out;
    }
    st->t =
        (us_st_tensor *)calloc((size_t)(j.t[0].size > 0 ? j.t[0].size : 1), sizeof(us_st_tensor));
    if (!st->t) {
        us__errf(err, errlen, "safetensors: out of memory for %d tensor entries", j.t[0].size);
        r = US_ERR_OOM;
        goto out;
    }
    for (c = 1, k = 0; k < j.t[0].size; k++, c = j.t[c + 1].next)
        if (us__st_entry(&j, c, k, st, err, errlen) != US_OK) goto out;
    r = us__st_disjoint(st, err, errlen);
out:
    us__json_free(&j);
    if (r != US_OK) us_safetensors_free(st);
    return r;
}

US_API const us_st_tensor *us_safetensors_find(const us_safetensors *st, const char *name) {
    int i;
    for (i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name)) return &st->t[i];
    return NULL;
}

US_API us_result us_safetensors_index_parse(const char *json, size_t n, char (*files)[256],
                                            int max_files, int *n_files, char *err, size_t errlen) {
    us__json j;
    int wm, c, q, k;
    char name[256];
    *n_files = 0;
    if (n > US_ST_MAX_HEADER) {
        us__errf(err, errlen, "safetensors index: %llu bytes is larger than the %llu allowed",
                 (unsigned long long)n, (unsigned long long)US_ST_MAX_HEADER);
        return US_ERR_FORMAT;
    }
    if (us__json_parse(&j, json, n, (int)(n / 2 + 16)) != 0) {
        us__errf(err, errlen, "safetensors index: bad JSON: %s", j.err);
        us__json_free(&j);
        return US_ERR_FORMAT;
    }
    wm = us__jget(&j, 0, "weight_map");
    if (wm < 0 || j.t[wm].type != US__J_OBJ) {
        us__errf(err, errlen, "safetensors index: no \"weight_map\" object");
        us__json_free(&j);
        return US_ERR_FORMAT;
    }
    for (c = wm + 1, q = 0; q < j.t[wm].size; q++, c = j.t[c + 1].next) {
        if (!us__jstr(&j, c + 1, name, sizeof name) || !name[0] || strchr(name, '/') ||
            strchr(name, '\\') || !strcmp(name, ".") || !strcmp(name, "..")) {
            us__errf(err, errlen,
                     "safetensors index: weight_map entry %d is not a plain file name inside the "
                     "directory",
                     q);
            us__json_free(&j);
            return US_ERR_FORMAT;
        }
        for (k = 0; k < *n_files; k++)
            if (!strcmp(files[k], name)) break;
        if (k < *n_files) continue;
        if (*n_files >= max_files) {
            us__errf(err, errlen, "safetensors index: more than %d shard files", max_files);
            us__json_free(&j);
            return US_ERR_FORMAT;
        }
        memcpy(files[(*n_files)++], name, sizeof name);
    }
    us__json_free(&j);
    return US_OK;
}

#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#define US__CKPT_POSIX 1
#else
#define US__CKPT_POSIX 0
#endif
#if US__CKPT_POSIX
/* ---- the model's tensors in the file: full shapes, Hugging Face names, layout-free */
typedef struct us__ck_t {
    char name[96];
    int64_t rows, cols;
} us__ck_t; /* cols 0: 1-D */

/* Every tensor of the whole model in file order (dense or MoE; each MoE layer's router bias as
   DeepSeek-V3's e_score_correction_bias when balancing by bias). out may be NULL (count only). */
static int us__ckpt_tensors(const us_model *m, us__ck_t *out) {
    const us_model_config *c = &m->cfg;
    int64_t C = c->dim, HS = C / c->n_heads, Fe = c->moe_ffn_dim;
    int l, e, n = 0;
#define US__CT(r, cc, ...)                                          \
    do {                                                            \
        if (out) {                                                  \
            snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__); \
            out[n].rows = (r);                                      \
            out[n].cols = (cc);                                     \
        }                                                           \
        n++;                                                        \
    } while (0)
    US__CT(c->vocab, C, "model.embed_tokens.weight");
    for (l = 0; l < m->n_layers_global; l++) {
        US__CT(C, 0, "model.layers.%d.input_layernorm.weight", l);
        US__CT((int64_t)c->n_heads * HS, C, "model.layers.%d.self_attn.q_proj.weight", l);
        US__CT((int64_t)c->n_kv_heads * HS, C, "model.layers.%d.self_attn.k_proj.weight", l);
        US__CT((int64_t)c->n_kv_heads * HS, C, "model.layers.%d.self_attn.v_proj.weight", l);
        US__CT(C, (int64_t)c->n_heads * HS, "model.layers.%d.self_attn.o_proj.weight", l);
        US__CT(C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (us__is_moe(c, l)) {
            US__CT(c->moe_experts, C, "model.layers.%d.mlp.gate.weight", l);
            if (c->moe_balance == US_MOE_BALANCE_BIAS)
                US__CT(c->moe_experts, 0, "model.layers.%d.mlp.gate.e_score_correction_bias", l);
            if (c->moe_shared) {
                US__CT(Fe, C, "model.layers.%d.mlp.shared_experts.gate_proj.weight", l);
                US__CT(Fe, C, "model.layers.%d.mlp.shared_experts.up_proj.weight", l);
                US__CT(C, Fe, "model.layers.%d.mlp.shared_experts.down_proj.weight", l);
            }
            for (e = 0; e < c->moe_experts; e++) {
                US__CT(Fe, C, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                US__CT(Fe, C, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                US__CT(C, Fe, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
        } else {
            US__CT(c->ffn_dim, C, "model.layers.%d.mlp.gate_proj.weight", l);
            US__CT(c->ffn_dim, C, "model.layers.%d.mlp.up_proj.weight", l);
            US__CT(C, c->ffn_dim, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
    US__CT(C, 0, "model.norm.weight");
    if (!c->tie_embeddings) US__CT(c->vocab, C, "lm_head.weight");
#undef US__CT
    return n;
}

/* Tensor parallelism's slice of a local tensor in the full one: element j of the local tensor is
   element g of the full one, and the run of local elements from j that stay contiguous there.
   Rows split (tp_split 1): local [rows/tp][cols] is rows t·rows/tp.. of the full [rows][cols];
   columns split (2): local [rows][cols/tp] is columns t·cols/tp.. of every full row. */
static int64_t us__ckpt_global(const us_model *m, const us_param *p, int64_t j, int64_t *run) {
    int64_t t, tp;
    us__tp_slice(m, p, &tp, &t); /* (a replicated kv head: its ranks read and write one block) */
    if (p->tp_split == 2) {      /* columns split: row r of the slice is a piece of full row r */
        int64_t cols = p->shape[1], r = j / cols, cc = j % cols;
        *run = cols - cc;
        return r * cols * tp + t * cols + cc;
    }
    *run = p->numel - j;
    return j + t * p->numel; /* rows split: a contiguous block (replicated: t = 0) */
}

/* The flat range [lo, hi) of unit U whose elements this rank writes (owned = 1) or needs to
   read. ZeRO: this rank's piece; else the whole unit, written by one replica (dp×cp rank 0,
   or for routed experts under ep the expert-data-parallel rank 0). weights = 1: the range of the
   weights the forward reads (whole units unless ZeRO-3). */
static void us__ckpt_range(const us_model *m, const us__unit *U, int owned, int weights,
                           int64_t *lo, int64_t *hi) {
    int Z = m->tc.zero, R = us__unit_rank(m, U);
    if (Z && (owned || !weights || Z == 3)) {
        *lo = U->off + (int64_t)R * U->piece;
        *hi = *lo + U->piece;
        return;
    }
    if (owned && R != 0) {
        *lo = *hi = U->off;
        return;
    }
    *lo = U->off;
    *hi = U->off + U->n;
}

#endif
/* Every rank learns whether any rank failed (a sum over the world: also a barrier). */
static us_result us__ckpt_agree(us_model *m, us_result mine) {
    double v = mine != US_OK;
    us_result r = us__group_sum(m, &m->comm->world, &v, 1);
    if (r != US_OK) return r;
    if (v > 0 && mine == US_OK) {
        us__model_set_error(m, "checkpoint: another rank failed (its own message says why)");
        return US_ERR_IO;
    }
    return mine;
}
#if US__CKPT_POSIX
/* src [n] fp32 → dst [n] in the file's dtype (F32, or BF16 rounded to nearest even) */
static void us__ckpt_cvt_out(void *dst, const char *fdt, const float *src, int64_t n) {
    int64_t i;
    if (!strcmp(fdt, "F32"))
        memcpy(dst, src, (size_t)n * 4);
    else
        for (i = 0; i < n; i++) ((uint16_t *)dst)[i] = us_f32_to_bf16(src[i]);
}

/* src [n] in the file's dtype (F32, BF16, F16) → dst [n] fp32, exactly */
static void us__ckpt_cvt_in(float *dst, const char *fdt, const void *src, int64_t n) {
    int64_t i;
    if (!strcmp(fdt, "F32"))
        memcpy(dst, src, (size_t)n * 4);
    else if (!strcmp(fdt, "BF16"))
        for (i = 0; i < n; i++) dst[i] = us_bf16_to_f32(((const uint16_t *)src)[i]);
    else
        for (i = 0; i < n; i++)
            dst[i] = us__f16_to_f32(((const uint16_t *)src)[i]); /* // >>dtypes */
}

static int us__pwrite_all(int fd, const void *buf, size_t n, uint64_t off) {
    const char *p = (const char *)buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static int us__pread_all(int fd, void *buf, size_t n, uint64_t off) {
    char *p = (char *)buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int us__fsync_path(const char *path) {
    int fd = open(path, O_RDONLY), rc;
    if (fd < 0) return -1;
    rc = fsync(fd);
    close(fd);
    return rc;
}

static void us__rm_tree(const char *dir) { /* a checkpoint directory: files only, one level */
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4096];
    if (d) {
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static void us__parent_dir(const char *path, char *out, size_t cap) {
    const char *s = strrchr(path, '/');
    if (!s)
        snprintf(out, cap, ".");
    else if (s == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(s - path), path);
}

/* One safetensors file being written: its tensors (index into the global list), dtype and offsets. */
typedef struct us__ckf {
    char path[4096];
    int fd;
    int t0, t1;
    uint64_t data_start, size;
} us__ckf;

/* The JSON header for tensors [t0, t1) of list (names prefixed), padded with spaces to 8 bytes. */
static char *us__st_header(const us__ck_t *list, int t0, int t1, const char *prefix, const char *dt,
                           uint64_t *hlen, uint64_t *data) {
    size_t cap = 256 + (size_t)(t1 - t0) * 256, len;
    char *h = (char *)US_MALLOC(cap);
    int i, esz = us__st_dtype_size(dt);
    uint64_t off = 0;
    if (!h) return NULL;
    len = (size_t)snprintf(h, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (i = t0; i < t1; i++) {
        uint64_t nb =
            (uint64_t)list[i].rows * (uint64_t)(list[i].cols ? list[i].cols : 1) * (uint64_t)esz;
        if (list[i].cols)
            len += (size_t)snprintf(
                h + len, cap - len,
                ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                prefix, list[i].name, dt, (long long)list[i].rows, (long long)list[i].cols,
                (unsigned long long)off, (unsigned long long)(off + nb));
        else
            len += (size_t)snprintf(
                h + len, cap - len,
                ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%llu,%llu]}",
                prefix, list[i].name, dt, (long long)list[i].rows, (unsigned long long)off,
                (unsigned long long)(off + nb));
        off += nb;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    h[len] = 0;
    *hlen = len;
    *data = off;
    return h;
}

/* Rank 0: creates the file with its header and its full size (holes until the ranks write). */
static us_result us__ckf_create(us_model *m, us__ckf *f, const us__ck_t *list, const char *prefix,
                                const char *dt) {
    uint64_t hlen, data;
    unsigned char len8[8];
    int i, fd;
    char *h = us__st_header(list, f->t0, f->t1, prefix, dt, &hlen, &data);
    if (!h) {
        us__model_set_error(m, "checkpoint: out of host memory for a header");
        return US_ERR_OOM;
    }
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)(hlen >> (8 * i));
    fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || us__pwrite_all(fd, len8, 8, 0) || us__pwrite_all(fd, h, (size_t)hlen, 8) ||
        ftruncate(fd, (off_t)(8 + hlen + data)) || fsync(fd)) {
        us__model_set_error(m, "checkpoint: cannot write %s: %s", f->path, strerror(errno));
        if (fd >= 0) close(fd);
        US_FREE(h);
        return US_ERR_IO;
    }
    close(fd);
    US_FREE(h);
    return US_OK;
}

/* Host copies of this rank's state buffers (what the device holds), fp32 except w in dt. */
typedef struct us__ckhost {
    void *w;
    float *master, *m, *v;
    int64_t wn, on;
} us__ckhost;

static void us__ckhost_free(us__ckhost *h) {
    US_FREE(h->w);
    US_FREE(h->master);
    US_FREE(h->m);
    US_FREE(h->v);
    memset(h, 0, sizeof *h);
}

/* Where flat element f of unit U lives in the weights (which = 0) or the sharded fp32 buffers. */
static int64_t us__ckpt_index(const us_model *m, const us__unit *U, int which, int64_t f) {
    int Z = m->tc.zero;
    if ((which == 0 && Z == 3) || (which && Z))
        return U->shard_off + f - (U->off + (int64_t)us__unit_rank(m, U) * U->piece);
    return f;
}

/* Writes this rank's owned elements of buffer `which` (0 weights, 1 master, 2 exp_avg, 3
   exp_avg_sq) into the files f[0..nf) holding the global list; crash_after counts bytes.
   h holds the buffer on the host as the rank keeps it: [unit elements] of the flat layout, or
   of its ZeRO shard [piece] (us__ckpt_index maps a flat index into it); each run of a local
   tensor lands at its full tensor's offset [rows][cols] in the file (us__ckpt_global). */
static us_result us__ckpt_write_buf(us_model *m, us__ckf *f, int nf, const us__ck_t *list,
                                    int nlist, int which, const us__ckhost *h, const char *prefix,
                                    const char *fdt, int64_t *written, int64_t crash_after) {
    int u, i, k, esz = us__st_dtype_size(fdt);
    char full[160];
    float *tmp32 = NULL;
    void *tmpo = NULL;
    int64_t cap = 0;
    us_result r = US_OK;
    (void)nlist;
    (void)prefix;
    for (u = 0; u < m->n_units && r == US_OK; u++) {
        const us__unit *U = &m->units[u];
        int64_t lo, hi;
        us__ckpt_range(m, U, 1, which == 0, &lo, &hi);
        for (i = U->p0; i < U->p1 && r == US_OK; i++) {
            const us_param *p = &m->params[i];
            int64_t a = p->offset > lo ? p->offset : lo,
                    b = p->offset + p->numel < hi ? p->offset + p->numel : hi, fpos, run;
            int fi = -1, ti = -1;
            uint64_t toff = 0;
            if (a >= b) continue;
            snprintf(full, sizeof full, "%s", p->name);
            for (k = 0; k < nf && ti < 0; k++) { /* which file and where in it */
                int t;
                uint64_t off = 0;
                for (t = f[k].t0; t < f[k].t1; t++) {
                    if (!strcmp(list[t].name, full)) {
                        fi = k;
                        ti = t;
                        toff = off;
                        break;
                    }
                    off += (uint64_t)list[t].rows * (uint64_t)(list[t].cols ? list[t].cols : 1) *
                           (uint64_t)esz;
                }
            }
            if (ti < 0) {
                us__model_set_error(m, "checkpoint: internal: %s is not in the file list", full);
                return US_ERR_INVALID;
            }
            for (fpos = a; fpos < b; fpos += run) {
                int64_t g = us__ckpt_global(m, p, fpos - p->offset, &run),
                        idx = us__ckpt_index(m, U, which, fpos), e;
                if (run > b - fpos) run = b - fpos;
                if (run > cap) {
                    US_FREE(tmp32);
                    US_FREE(tmpo);
                    cap = run;
                    tmp32 = (float *)US_MALLOC((size_t)cap * 4);
                    tmpo = US_MALLOC((size_t)cap * 4);
                    if (!tmp32 || !tmpo) {
                        us__model_set_error(m, "checkpoint: out of host memory");
                        r = US_ERR_OOM;
                        break;
                    }
                }
                if (which == 0 && m->dt == US_BF16)
                    memcpy(tmpo, (const uint16_t *)h->w + idx, (size_t)run * 2); /* bf16 as it is */
                else {
                    const float *src = which == 0   ? (const float *)h->w
                                       : which == 1 ? h->master
                                       : which == 2 ? h->m
                                                    : h->v;
                    for (e = 0; e < run; e++) tmp32[e] = src[idx + e];
                    us__ckpt_cvt_out(tmpo, fdt, tmp32, run);
                }
                if (crash_after > 0 &&
                    *written + run * esz >= crash_after) { /* the crash test: die mid-write */
                    int64_t part = (crash_after - *written) / esz;
                    if (part > 0)
                        us__pwrite_all(f[fi].fd, tmpo, (size_t)(part * esz),
                                       f[fi].data_start + toff + (uint64_t)g * (uint64_t)esz);
                    raise(SIGKILL);
                }
                if (us__pwrite_all(f[fi].fd, tmpo, (size_t)(run * esz),
                                   f[fi].data_start + toff + (uint64_t)g * (uint64_t)esz)) {
                    us__model_set_error(m, "checkpoint: cannot write %s: %s", f[fi].path,
                                        strerror(errno));
                    r = US_ERR_IO;
                    break;
                }
                *written += run * esz;
            }
        }
    }
    US_FREE(tmp32);
    US_FREE(tmpo);
    return r;
}

static int us__write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644), rc;
    if (fd < 0) return -1;
    rc = us__pwrite_all(fd, text, strlen(text), 0) || fsync(fd);
    close(fd);
    return rc;
}

/* us_ckpt_save's state from one step to the next: the plan (the tensor list and the files it
   goes in), the host copies and the bytes written so far (crash_after counts them). */
typedef struct us__cksave {
    us_ckpt_opts opts;
    int rank, nlist, nf, bf, has_master;
    us__ck_t *list;
    us__ckf *files, opt;
    char tmp[4096];
    us__ckhost h;
    int64_t written;
} us__cksave;

/* Plan: the tensor list and the model files it splits into (one, or shards of about
   shard_bytes), named under dir.tmp, so every later step writes only where the plan says. */
static us_result us__cksave_plan(us_model *m, us__cksave *s, const char *dir) {
    int t = 0, k;
    uint64_t esz = s->bf ? 2 : 4;
    const us__ck_t *list;
    snprintf(s->tmp, sizeof s->tmp, "%s.tmp", dir);
    s->nlist = us__ckpt_tensors(m, NULL);
    s->list = (us__ck_t *)US_MALLOC(sizeof(us__ck_t) * (size_t)s->nlist);
    s->files = (us__ckf *)calloc((size_t)s->nlist, sizeof(us__ckf));
    if (!s->list || !s->files) {
        US_FREE(s->list);
        US_FREE(s->files);
        s->list = NULL;
        s->files = NULL;
        us__model_set_error(m, "checkpoint: out of host memory");
        return US_ERR_OOM;
    }
    us__ckpt_tensors(m, s->list);
    list = s->list;
    while (t < s->nlist) {
        uint64_t acc = 0;
        s->files[s->nf].t0 = t;
        do {
            acc += (uint64_t)list[t].rows * (uint64_t)(list[t].cols ? list[t].cols : 1) *
                   (list[t].cols == 0 && strstr(list[t].name, "e_score") ? 4 : esz);
            t++;
        } while (t < s->nlist && (s->opts.shard_bytes <= 0 ||
                                  acc + (uint64_t)list[t].rows *
                                              (uint64_t)(list[t].cols ? list[t].cols : 1) * esz <=
                                      (uint64_t)s->opts.shard_bytes));
        s->files[s->nf].t1 = t;
        s->files[s->nf].fd = -1;
        s->nf++;
    }
    for (k = 0; k < s->nf; k++) {
        us__ckf *f = &s->files[k];
        if (s->nf == 1)
            snprintf(f->path, sizeof f->path, "%.4000s/model.safetensors", s->tmp);
        else
            snprintf(f->path, sizeof f->path, "%.4000s/model-%05d-of-%05d.safetensors", s->tmp,
                     k + 1, s->nf % 100000);
    }
    snprintf(s->opt.path, sizeof s->opt.path, "%.4000s/optimizer.safetensors", s->tmp);
    s->opt.t0 = 0;
    s->opt.t1 = s->nlist;
    /* the router biases are fp32 whatever the policy: they go in the model file as F32 beside
       weights of dt, so a file mixes dtypes only for MoE models balanced by bias. Keep it simple:
       such a model writes its weights in F32 too. */
    if (m->n_moe_all && m->cfg.moe_balance == US_MOE_BALANCE_BIAS)
        s->bf = 0; /* (every stage alike, with MoE layers or without: // >>pp) */
    return US_OK;
}

/* Step 1 (rank 0): dir.tmp and every file pre-sized with its header, so that each rank can
   then write its own elements in place. */
static us_result us__cksave_create(us_model *m, us__cksave *s) {
    us_result r = US_OK;
    int k;
    us__rm_tree(s->tmp); /* a crashed earlier save */
    if (mkdir(s->tmp, 0755) != 0) {
        us__model_set_error(m, "checkpoint: cannot create %s: %s", s->tmp, strerror(errno));
        r = US_ERR_IO;
    }
    for (k = 0; k < s->nf && r == US_OK; k++)
        r = us__ckf_create(m, &s->files[k], s->list, "", s->bf ? "BF16" : "F32");
    if (r == US_OK &&
        !s->opts
             .weights_only) { /* exp_avg, exp_avg_sq (and master) per tensor: three lists in one file */
        us__ck_t *l3 = (us__ck_t *)US_MALLOC(sizeof(us__ck_t) * (size_t)s->nlist * 3);
        int q, n3 = 0;
        static const char *pre[3] = {"optimizer.exp_avg.", "optimizer.exp_avg_sq.", "master."};
        if (!l3) {
            us__model_set_error(m, "checkpoint: out of host memory");
            r = US_ERR_OOM;
        }
        for (q = 0; l3 && q < (s->has_master ? 3 : 2); q++)
            for (k = 0; k < s->nlist; k++) {
                if (s->list[k].cols == 0 && strstr(s->list[k].name, "e_score"))
                    continue; /* not trained */
                l3[n3] = s->list[k];
                snprintf(l3[n3].name, sizeof l3[n3].name, "%s%s", pre[q], s->list[k].name);
                n3++;
            }
        if (l3) {
            s->opt.t0 = 0;
            s->opt.t1 = n3;
            r = us__ckf_create(m, &s->opt, l3, "", "F32");
        }
        US_FREE(l3);
    }
    return r;
}

/* Step 2a: host copies of this rank's weights and Adam moments (weights widened to fp32 when the
   file is F32 and the weights are not), so the writes below read host memory only. */
static us_result us__cksave_host(us_model *m, us__cksave *s) {
    us_ops *o = &m->ops;
    us__ckhost *h = &s->h;
    int Z = m->tc.zero;
    int64_t wn = Z == 3 ? m->shard_n : m->n_flat, on = Z ? m->shard_n : m->n_flat;
    h->w = US_MALLOC((size_t)(wn > 0 ? wn : 1) * us_dtype_size(m->dt));
    h->m = (float *)US_MALLOC((size_t)(on > 0 ? on : 1) * 4);
    h->v = (float *)US_MALLOC((size_t)(on > 0 ? on : 1) * 4);
    if (s->has_master) h->master = (float *)US_MALLOC((size_t)(on > 0 ? on : 1) * 4);
    if (!h->w || !h->m || !h->v || (s->has_master && !h->master)) {
        us__model_set_error(m, "checkpoint: out of host memory");
        return US_ERR_OOM;
    }
    o->sync(o);
    o->copy(o, h->w, m->w, (size_t)wn * us_dtype_size(m->dt), US_COPY_D2H);
    o->copy(o, h->m, m->adam_m, (size_t)on * 4, US_COPY_D2H);
    o->copy(o, h->v, m->adam_v, (size_t)on * 4, US_COPY_D2H);
    if (h->master) o->copy(o, h->master, m->master, (size_t)on * 4, US_COPY_D2H);
    if (m->dt != US_F32 && !s->bf) { /* an F32 file from bf16 or fp16 weights: widen exactly */
        float *w32 = (float *)US_MALLOC((size_t)(wn > 0 ? wn : 1) * 4);
        if (!w32) {
            us__model_set_error(m, "checkpoint: out of host memory");
            return US_ERR_OOM;
        }
        us__load_f32(w32, h->w, m->dt, wn);
        US_FREE(h->w);
        h->w = w32;
    }
    return US_OK;
}

/* Step 2b: every model file opened for writing, and where its data section starts (after the
   header rank 0 wrote). */
static us_result us__cksave_open(us_model *m, us__cksave *s) {
    us_result r = US_OK;
    uint64_t hl;
    unsigned char len8[8];
    int k, q;
    for (k = 0; k < s->nf && r == US_OK; k++) {
        s->files[k].fd = open(s->files[k].path, O_WRONLY);
        if (s->files[k].fd < 0) {
            us__model_set_error(m, "checkpoint: cannot open %s: %s", s->files[k].path,
                                strerror(errno));
            r = US_ERR_IO;
        }
    }
    for (k = 0; k < s->nf && r == US_OK; k++) { /* each file's data section: after its header */
        int fd = open(s->files[k].path, O_RDONLY);
        if (fd < 0 || us__pread_all(fd, len8, 8, 0)) {
            us__model_set_error(m, "checkpoint: cannot read back %s", s->files[k].path);
            r = US_ERR_IO;
        }
        if (fd >= 0) close(fd);
        for (hl = 0, q = 7; q >= 0; q--) hl = hl << 8 | len8[q];
        s->files[k].data_start = 8 + hl;
    }
    return r;
}

/* Step 2c: the MoE router biases (not parameters): one writer per layer, dp×cp and tp rank 0. */
static us_result us__cksave_router_bias(us_model *m, us__cksave *s) {
    us_result r = US_OK;
    int l, E = m->cfg.moe_experts;
    const us__ck_t *list = s->list;
    for (l = 0; l < m->cfg.n_layers && r == US_OK; l++) {
        char nm[96];
        int t, fi;
        uint64_t off = 0;
        if (m->moe_idx[l] < 0) continue;
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate.e_score_correction_bias", m->layer_g[l]);
        for (fi = 0; fi < s->nf; fi++) {
            for (off = 0, t = s->files[fi].t0; t < s->files[fi].t1 && strcmp(list[t].name, nm); t++)
                off += (uint64_t)list[t].rows * (uint64_t)(list[t].cols ? list[t].cols : 1) * 4;
            if (t < s->files[fi].t1) break;
        }
        if (fi == s->nf ||
            us__pwrite_all(s->files[fi].fd, m->moe_bias_h + (size_t)m->moe_idx[l] * E,
                           (size_t)E * 4, s->files[fi].data_start + off)) {
            us__model_set_error(m, "checkpoint: cannot write the router bias of layer %d",
                                m->layer_g[l]);
            r = US_ERR_IO;
        }
    }
    return r;
}

/* Step 2d: exp_avg, exp_avg_sq (and master) into optimizer.safetensors, each third of the file
   written as its own "file" view. */
static us_result us__cksave_optimizer(us_model *m, us__cksave *s) {
    us_result r = US_OK;
    us__ck_t *l3 = (us__ck_t *)US_MALLOC(sizeof(us__ck_t) * (size_t)s->nlist * 3);
    int q, k, n3 = 0;
    static const char *pre[3] = {"optimizer.exp_avg.", "optimizer.exp_avg_sq.", "master."};
    unsigned char len8[8];
    uint64_t hl = 0;
    s->opt.fd = open(s->opt.path, O_RDWR);
    if (!l3 || s->opt.fd < 0 || us__pread_all(s->opt.fd, len8, 8, 0)) {
        us__model_set_error(m, "checkpoint: cannot open %s", s->opt.path);
        r = US_ERR_IO;
    }
    for (k = 7; k >= 0; k--) hl = hl << 8 | len8[k];
    s->opt.data_start = 8 + hl;
    for (q = 0; r == US_OK && q < (s->has_master ? 3 : 2); q++) {
        int n0 = n3;
        for (k = 0; k < s->nlist; k++) {
            if (s->list[k].cols == 0 && strstr(s->list[k].name, "e_score")) continue;
            l3[n3] = s->list[k];
            n3++;
        }
        /* each third of the file is one buffer: write it as its own "file" view */
        {
            us__ckf view = s->opt;
            uint64_t before = 0;
            int t;
            for (t = 0; t < n0; t++)
                before += (uint64_t)l3[t].rows * (uint64_t)(l3[t].cols ? l3[t].cols : 1) * 4;
            view.t0 = n0;
            view.t1 = n3;
            view.data_start = s->opt.data_start + before;
            r = us__ckpt_write_buf(m, &view, 1, l3, n3,
                                   q == 0   ? 2
                                   : q == 1 ? 3
                                            : 1,
                                   &s->h, pre[q], "F32", &s->written, s->opts.crash_after);
        }
    }
    US_FREE(l3);
    return r;
}

/* Step 2: every rank writes the elements it owns into the pre-sized files, then fsyncs them. */
static us_result us__cksave_write(us_model *m, us__cksave *s) {
    us_result r = us__cksave_host(m, s);
    int k;
    if (r == US_OK) r = us__cksave_open(m, s);
    if (r == US_OK) {
        us_dtype save_dt = m->dt;
        if (m->dt != US_F32 && !s->bf) m->dt = US_F32; /* h.w was widened above */
        r = us__ckpt_write_buf(m, s->files, s->nf, s->list, s->nlist, 0, &s->h, "",
                               s->bf ? "BF16" : "F32", &s->written, s->opts.crash_after);
        m->dt = save_dt;
    }
    if (r == US_OK && m->n_moe && m->cfg.moe_balance == US_MOE_BALANCE_BIAS &&
        m->mesh.dpcp_g.rank == 0 && m->mesh.tp_rank == 0)
        r = us__cksave_router_bias(m, s);
    if (r == US_OK && !s->opts.weights_only) r = us__cksave_optimizer(m, s);
    for (k = 0; k < s->nf; k++)
        if (s->files[k].fd >= 0) {
            if (r == US_OK && fsync(s->files[k].fd)) {
                us__model_set_error(m, "checkpoint: fsync %s failed", s->files[k].path);
                r = US_ERR_IO;
            }
            close(s->files[k].fd);
        }
    if (s->opt.fd >= 0) {
        if (r == US_OK && fsync(s->opt.fd)) {
            us__model_set_error(m, "checkpoint: fsync %s failed", s->opt.path);
            r = US_ERR_IO;
        }
        close(s->opt.fd);
    }
    return r;
}

/* A JSON number for a Python float: %.9g, with ".0" when that reads as an integer. */
static const char *us__json_float(char *buf, size_t cap, double v) {
    snprintf(buf, cap, "%.9g", v);
    if (!strpbrk(buf, ".eEn")) snprintf(buf + strlen(buf), cap - strlen(buf), ".0");
    return buf;
}

/* config.json's RoPE in both layouts, so that transformers 4.x (rope_theta, rope_scaling) and
   5.x (rope_parameters; it takes rope_scaling first when both are there) rebuild the same
   frequencies. Appended at t + len; returns the new length. */
static size_t us__cksave_rope_json(const us_model_config *c, char *t, size_t len, size_t cap) {
    char th[40], f[3][40], l3[400] = "";
    if (c->rope_scaling == US_ROPE_LLAMA3)
        snprintf(l3, sizeof l3,
                 "\"factor\": %s, \"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                 "\"original_max_position_embeddings\": %d",
                 us__json_float(f[0], 40, c->rope_factor),
                 us__json_float(f[1], 40, c->rope_low_freq),
                 us__json_float(f[2], 40, c->rope_high_freq), c->rope_orig_ctx);
    us__json_float(th, sizeof th, c->rope_theta);
    if (l3[0])
        len += (size_t)snprintf(t + len, cap - len,
                                ",\n  \"rope_theta\": %s,\n  \"rope_scaling\": {\"rope_type\": "
                                "\"llama3\", %s},\n  \"rope_parameters\": {\"rope_type\": "
                                "\"llama3\", \"rope_theta\": %s, %s}",
                                th, l3, th, l3);
    else
        len += (size_t)snprintf(t + len, cap - len,
                                ",\n  \"rope_theta\": %s,\n  \"rope_scaling\": null,\n  "
                                "\"rope_parameters\": {\"rope_type\": \"default\", "
                                "\"rope_theta\": %s}",
                                th, th);
    return len;
}

/* Step 3a: config.json in Hugging Face Llama's names (DeepSeek-V3's for MoE), so
   transformers reads the directory as it is. max_position_embeddings does not enter
   transformers' Llama RoPE; it is at least the run's context, and the context Llama 3's
   scaling was made for (transformers warns when it is not above original_max_position_embeddings). */
static us_result us__cksave_config_json(us_model *m, const us__cksave *s, char *t, size_t cap) {
    const us_model_config *c = &m->cfg;
    size_t len;
    char path[4200];
    double ctx = m->tc.seq > 2048 ? m->tc.seq : 2048;
    if (c->rope_scaling == US_ROPE_LLAMA3 && (double)c->rope_factor * c->rope_orig_ctx > ctx)
        ctx = (double)c->rope_factor * c->rope_orig_ctx;
    len = (size_t)snprintf(
        t, cap,
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  "
        "\"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
        "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  "
        "\"num_key_value_heads\": %d,\n  \"head_dim\": %lld,\n  \"vocab_size\": %lld,\n"
        "  \"max_position_embeddings\": %.0f,\n  \"rms_norm_eps\": %.9g,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n  \"mlp_bias\": "
        "false,\n  \"torch_dtype\": \"%s\",\n  \"ultrascale_version\": \"%s\"",
        (long long)c->dim, (long long)c->ffn_dim, m->n_layers_global, c->n_heads, c->n_kv_heads,
        (long long)(c->dim / c->n_heads), (long long)c->vocab, ctx, (double)c->norm_eps,
        c->tie_embeddings ? "true" : "false", s->bf ? "bfloat16" : "float32", US_VERSION);
    len = us__cksave_rope_json(c, t, len, cap);
    if (c->moe_experts) /* DeepSeek-V3's names for the MoE fields */
        len += (size_t)snprintf(
            t + len, cap - len,
            ",\n  \"n_routed_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  "
            "\"moe_intermediate_size\": %lld,\n"
            "  \"n_shared_experts\": %d,\n  \"first_k_dense_replace\": %d,\n  "
            "\"moe_layer_freq\": %d,\n  \"n_group\": %d,\n  \"topk_group\": %d,\n"
            "  \"scoring_func\": \"%s\",\n  \"ultrascale_moe_balance\": %d",
            c->moe_experts, c->moe_top_k, (long long)c->moe_ffn_dim, c->moe_shared,
            c->moe_first_dense, c->moe_every, c->moe_groups, c->moe_top_groups,
            c->moe_gate == US_MOE_SIGMOID ? "sigmoid" : "softmax", (int)c->moe_balance);
    snprintf(t + len, cap - len, "\n}\n");
    snprintf(path, sizeof path, "%s/config.json", s->tmp);
    if (us__write_text(path, t)) {
        us__model_set_error(m, "checkpoint: cannot write %s", path);
        return US_ERR_IO;
    }
    return US_OK;
}

/* Step 3b: model.safetensors.index.json for a sharded save: which file holds each tensor, and
   the total size (patched in once summed). */
static us_result us__cksave_index_json(us_model *m, const us__cksave *s, char *t, size_t cap) {
    uint64_t total = 0;
    size_t len;
    int k, q;
    char path[4200];
    len = (size_t)snprintf(t, cap,
                           "{\n  \"metadata\": {\"total_size\": "
                           "TOTAL__________________},\n  \"weight_map\": {");
    for (k = 0; k < s->nf; k++)
        for (q = s->files[k].t0; q < s->files[k].t1; q++) {
            const us__ck_t *e = &s->list[q];
            total += (uint64_t)e->rows * (uint64_t)(e->cols ? e->cols : 1) * (s->bf ? 2 : 4);
            len += (size_t)snprintf(t + len, cap - len,
                                    "%s\n    \"%s\": \"model-%05d-of-%05d.safetensors\"",
                                    k + q ? "," : "", e->name, k + 1, s->nf);
        }
    snprintf(t + len, cap - len, "\n  }\n}\n");
    {
        char tot[32], *at = strstr(t, "TOTAL__________________");
        int tl = snprintf(tot, sizeof tot, "%llu", (unsigned long long)total);
        memset(at, ' ', 23);
        memcpy(at, tot, (size_t)tl);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", s->tmp);
    if (us__write_text(path, t)) {
        us__model_set_error(m, "checkpoint: cannot write %s", path);
        return US_ERR_IO;
    }
    return US_OK;
}

/* Step 3c: trainer_state.json: step, data position, RNG, loss scaler and layout, so a run
   resumes where it was. */
static us_result us__cksave_trainer_json(us_model *m, const us__cksave *s, const us_ckpt_state *st,
                                         char *t, size_t cap) {
    size_t len;
    int q;
    char path[4200];
    len = (size_t)snprintf(t, cap,
                           "{\n  \"format\": \"ultrascale-trainer-state\",\n  \"version\": "
                           "1,\n  \"step\": %d,\n  \"data_position\": %lld,\n  \"rng\": [",
                           m->step, (long long)(st ? st->data_pos : 0));
    for (q = 0; st && q < st->n_rng && q < 8; q++)
        len += (size_t)snprintf(t + len, cap - len, "%s\"%llu\"", q ? ", " : "",
                                (unsigned long long)st->rng[q]);
    len += (size_t)snprintf(t + len, cap - len, "],\n");
    if (st && st->has_loader) /* the shard loader's place in its stream (// >>data) */
        len += (size_t)snprintf(t + len, cap - len,
                                "  \"loader\": {\"epoch\": %lld, \"shard\": %lld, \"window\": "
                                "%lld, \"seed\": \"%llu\", \"tokens\": %lld},\n",
                                (long long)st->loader_epoch, (long long)st->loader_shard,
                                (long long)st->loader_window, (unsigned long long)st->loader_seed,
                                (long long)st->loader_tokens);
    /* the loss scaler (// >>lossscale): S and its clean steps, so an fp16 run resumes where it was */
    snprintf(t + len, cap - len,
             "  \"precision\": \"%s\",\n  \"seed\": %llu,\n  \"loss_scale\": %.9g,\n  "
             "\"loss_scale_good_steps\": %d,\n"
             "  \"layout\": {\"dp\": %d, \"zero\": %d, \"tp\": %d, \"sp\": %d, \"pp\": %d, "
             "\"cp\": %d, \"ep\": %d}\n}\n",
             us_precision_name(m->tc.precision), (unsigned long long)m->tc.seed,
             (double)m->loss_scale, m->ls_good, m->tc.dp, m->tc.zero, m->tc.tp, m->tc.sp, m->tc.pp,
             m->tc.cp, m->tc.ep);
    snprintf(path, sizeof path, "%s/trainer_state.json", s->tmp);
    if (us__write_text(path, t)) {
        us__model_set_error(m, "checkpoint: cannot write %s", path);
        return US_ERR_IO;
    }
    return US_OK;
}

/* Step 3d, the commit: fsync dir.tmp, move any old dir aside, rename, fsync the parent, so a
   crash leaves either the old checkpoint or the new one whole. */
static us_result us__cksave_rename(us_model *m, const us__cksave *s, const char *dir) {
    struct stat sb;
    char parent[4096], old[4096];
    us_result r = US_OK;
    us__parent_dir(dir, parent, sizeof parent);
    snprintf(old, sizeof old, "%s.old", dir);
    if (us__fsync_path(s->tmp)) {
        us__model_set_error(m, "checkpoint: fsync %s failed", s->tmp);
        r = US_ERR_IO;
    } else if (stat(dir, &sb) == 0) {
        us__rm_tree(old);
        if (rename(dir, old)) {
            us__model_set_error(m, "checkpoint: cannot move the old %s aside: %s", dir,
                                strerror(errno));
            r = US_ERR_IO;
        }
    }
    if (r == US_OK && rename(s->tmp, dir)) {
        us__model_set_error(m, "checkpoint: cannot rename %s to %s: %s", s->tmp, dir,
                            strerror(errno));
        r = US_ERR_IO;
    }
    if (r == US_OK) {
        us__fsync_path(parent);
        us__rm_tree(old);
    }
    return r;
}

/* Step 3 (rank 0): the JSON files beside the tensors, then the commit. */
static us_result us__cksave_commit(us_model *m, const us__cksave *s, const char *dir,
                                   const us_ckpt_state *st) {
    size_t cap = 4096 + (size_t)s->nlist * 160;
    char *t = (char *)US_MALLOC(cap);
    us_result r = US_OK;
    if (!t) {
        us__model_set_error(m, "checkpoint: out of host memory");
        r = US_ERR_OOM;
    }
    if (r == US_OK) r = us__cksave_config_json(m, s, t, cap);
    if (r == US_OK && s->nf > 1) r = us__cksave_index_json(m, s, t, cap);
    if (r == US_OK && !s->opts.weights_only) r = us__cksave_trainer_json(m, s, st, t, cap);
    US_FREE(t);
    if (r == US_OK) r = us__cksave_rename(m, s, dir);
    return r;
}
#endif

US_API us_result us_ckpt_save(us_model *m, const char *dir, const us_ckpt_state *st,
                              const us_ckpt_opts *opts_in) {
#if !US__CKPT_POSIX
    (void)dir;
    (void)st;
    (void)opts_in;
    us__model_set_error(
        m,
        "checkpoint: this build has no POSIX file calls (compile with -D_POSIX_C_SOURCE=200809L)");
    return US_ERR_IO;
#else
    us__cksave s;
    us_result r;
    memset(&s, 0, sizeof s);
    if (opts_in) s.opts = *opts_in;
    s.rank = m->comm->world.rank;
    s.bf = m->dt == US_BF16;
    s.has_master = m->dt != US_F32 && m->master; /* fp16: an F32 file, exact */
    s.opt.fd = -1;
    if (strlen(dir) + 64 > sizeof s.tmp) {
        us__model_set_error(m, "checkpoint: the path %.64s... is too long", dir);
        return US_ERR_INVALID;
    }
    r = us__cksave_plan(m, &s, dir);
    if (r != US_OK) return r;
    if (s.rank == 0) r = us__cksave_create(m, &s);
    r = us__ckpt_agree(m, r);
    if (r == US_OK) r = us__cksave_write(m, &s);
    r = us__ckpt_agree(m, r);
    if (r == US_OK && s.rank == 0) r = us__cksave_commit(m, &s, dir, st);
    r = us__ckpt_agree(m, r);
    us__ckhost_free(&s.h);
    US_FREE(s.list);
    US_FREE(s.files);
    return r;
#endif
}

#if US__CKPT_POSIX
/* The directory's model files, opened and their headers parsed. */
typedef struct us__ckin {
    int n;
    int fd[64];
    us_safetensors st[64];
    char path[64][4200];
} us__ckin;

static void us__ckin_close(us__ckin *in) {
    int k;
    for (k = 0; k < in->n; k++) {
        if (in->fd[k] >= 0) close(in->fd[k]);
        us_safetensors_free(&in->st[k]);
    }
    in->n = 0;
}

static us_result us__ckin_open1(us_model *m, us__ckin *in, const char *path) {
    int k = in->n, fd;
    struct stat sb;
    unsigned char len8[8];
    uint64_t hl = 0;
    char *head, e[240];
    us_result r;
    if (k >= 64) {
        us__model_set_error(m, "checkpoint: more than 64 shard files");
        return US_ERR_FORMAT;
    }
    snprintf(in->path[k], sizeof in->path[k], "%s", path);
    fd = open(path, O_RDONLY);
    if (fd < 0 || fstat(fd, &sb)) {
        us__model_set_error(m, "checkpoint: cannot open %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return US_ERR_IO;
    }
    if (sb.st_size < 8 || us__pread_all(fd, len8, 8, 0)) {
        us__model_set_error(m, "checkpoint: %s: %lld bytes is too short for a safetensors file",
                            path, (long long)sb.st_size);
        close(fd);
        return US_ERR_FORMAT;
    }
    for (k = 7; k >= 0; k--) hl = hl << 8 | len8[k];
    k = in->n;
    if (hl > US_ST_MAX_HEADER || hl > (uint64_t)sb.st_size - 8) { /* let the parser say which */
        r = us_safetensors_parse(&in->st[k], len8, 8, (uint64_t)sb.st_size, e, sizeof e);
        us__model_set_error(m, "checkpoint: %s: %s", path, e);
        close(fd);
        return US_ERR_FORMAT;
    }
    head = (char *)US_MALLOC((size_t)hl + 8);
    if (!head) {
        us__model_set_error(m, "checkpoint: out of host memory for the header of %s", path);
        close(fd);
        return US_ERR_OOM;
    }
    if (us__pread_all(fd, head, (size_t)hl + 8, 0)) {
        us__model_set_error(m, "checkpoint: cannot read the header of %s", path);
        US_FREE(head);
        close(fd);
        return US_ERR_IO;
    }
    r = us_safetensors_parse(&in->st[k], head, (size_t)hl + 8, (uint64_t)sb.st_size, e, sizeof e);
    US_FREE(head);
    if (r != US_OK) {
        us__model_set_error(m, "checkpoint: %s: %s", path, e);
        close(fd);
        return r;
    }
    in->fd[k] = fd;
    in->n++;
    return US_OK;
}

static us_result us__ckin_open_model(us_model *m, us__ckin *in, const char *dir) {
    char p[4200];
    struct stat sb;
    memset(in, 0, sizeof *in);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (stat(p, &sb) == 0) {
        char(*files)[256] = (char(*)[256])US_MALLOC(sizeof(char[256]) * 64), e[240], *txt;
        int nfiles = 0, fd, k;
        us_result r = US_OK;
        if (sb.st_size > (off_t)US_ST_MAX_HEADER) {
            us__model_set_error(m, "checkpoint: %s is larger than %llu bytes", p,
                                (unsigned long long)US_ST_MAX_HEADER);
            US_FREE(files);
            return US_ERR_FORMAT;
        }
        txt = (char *)US_MALLOC((size_t)sb.st_size + 1);
        fd = open(p, O_RDONLY);
        if (!files || !txt || fd < 0 || us__pread_all(fd, txt, (size_t)sb.st_size, 0)) {
            us__model_set_error(m, "checkpoint: cannot read %s", p);
            r = US_ERR_IO;
        }
        if (fd >= 0) close(fd);
        if (r == US_OK && us_safetensors_index_parse(txt, (size_t)sb.st_size, files, 64, &nfiles, e,
                                                     sizeof e) != US_OK) {
            us__model_set_error(m, "checkpoint: %s: %s", p, e);
            r = US_ERR_FORMAT;
        }
        for (k = 0; k < nfiles && r == US_OK; k++) {
            snprintf(p, sizeof p, "%s/%s", dir, files[k]);
            r = us__ckin_open1(m, in, p);
        }
        US_FREE(files);
        US_FREE(txt);
        return r;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return us__ckin_open1(m, in, p);
}

static const us_st_tensor *us__ckin_find(const us__ckin *in, const char *name, int *which) {
    int k;
    for (k = 0; k < in->n; k++) {
        const us_st_tensor *t = us_safetensors_find(&in->st[k], name);
        if (t) {
            *which = k;
            return t;
        }
    }
    return NULL;
}

/* Checks tensor `name` of the file against the expected full shape and a readable dtype. */
static const us_st_tensor *us__ckin_check(us_model *m, const us__ckin *in, const char *name,
                                          const us__ck_t *want, int *which, int optional) {
    const us_st_tensor *t = us__ckin_find(in, name, which);
    int64_t r0 = want->rows, c0 = want->cols;
    if (!t) {
        if (!optional)
            us__model_set_error(m, "checkpoint: %s has no tensor %s", in->n ? in->path[0] : "?",
                                name);
        return NULL;
    }
    if (strcmp(t->dtype, "F32") && strcmp(t->dtype, "BF16") && strcmp(t->dtype, "F16")) {
        us__model_set_error(m, "checkpoint: tensor %s has dtype %s; only F32, BF16 and F16 load",
                            name, t->dtype);
        return NULL;
    }
    if (t->ndim != (c0 ? 2 : 1) || t->shape[0] != r0 || (c0 && t->shape[1] != c0)) {
        us__model_set_error(m,
                            "checkpoint: tensor %s has shape [%lld%s%lld] but the model config "
                            "expects [%lld%s%lld]",
                            name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                            (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)r0,
                            c0 ? ", " : "", (long long)c0);
        return NULL;
    }
    return t;
}

/* Reads into hf (fp32, flat indices) the elements of every local tensor that this rank needs
   (weights: which = 0; else the sharded fp32 buffers' ranges), only those byte ranges.
   hf [flat elements of the rank's layout] (what us__ckpt_range gives per unit); the file holds
   each tensor whole, [rows][cols] in its dtype. */
static us_result us__ckpt_read_buf(us_model *m, const us__ckin *in, const us__ck_t *list, int nlist,
                                   const char *prefix, int which, float *hf) {
    int u, i, k;
    char full[200];
    void *tmp = NULL;
    int64_t cap = 0;
    for (u = 0; u < m->n_units; u++) {
        const us__unit *U = &m->units[u];
        int64_t lo, hi;
        us__ckpt_range(m, U, 0, which == 0, &lo, &hi);
        for (i = U->p0; i < U->p1; i++) {
            const us_param *p = &m->params[i];
            int64_t a = p->offset > lo ? p->offset : lo,
                    b = p->offset + p->numel < hi ? p->offset + p->numel : hi, fpos, run;
            const us_st_tensor *t;
            int fi = 0, esz;
            if (a >= b) continue;
            for (k = 0; k < nlist && strcmp(list[k].name, p->name); k++) {
            }
            if (k == nlist) {
                us__model_set_error(m, "checkpoint: internal: %s has no full shape", p->name);
                US_FREE(tmp);
                return US_ERR_INVALID;
            }
            snprintf(full, sizeof full, "%s%s", prefix, p->name);
            if (!(t = us__ckin_check(m, in, full, &list[k], &fi, 0))) {
                US_FREE(tmp);
                return US_ERR_FORMAT;
            }
            esz = us__st_dtype_size(t->dtype);
            for (fpos = a; fpos < b; fpos += run) {
                int64_t g = us__ckpt_global(m, p, fpos - p->offset, &run);
                if (run > b - fpos) run = b - fpos;
                if (run > cap) {
                    US_FREE(tmp);
                    cap = run;
                    tmp = US_MALLOC((size_t)cap * 4);
                    if (!tmp) {
                        us__model_set_error(m, "checkpoint: out of host memory");
                        return US_ERR_OOM;
                    }
                }
                if (us__pread_all(in->fd[fi], tmp, (size_t)(run * esz),
                                  in->st[fi].data_start + t->begin + (uint64_t)g * (uint64_t)esz)) {
                    us__model_set_error(m, "checkpoint: cannot read tensor %s from %s", full,
                                        in->path[fi]);
                    US_FREE(tmp);
                    return US_ERR_IO;
                }
                us__ckpt_cvt_in(hf + fpos, t->dtype, tmp, run);
            }
        }
    }
    US_FREE(tmp);
    return US_OK;
}

/* Copies the fp32 flat values hf [flat elements] into buffer `which` on the device (this rank's
   ranges): weights rounded once to the run's dtype, the fp32 buffers as they are. */
static us_result us__ckpt_upload(us_model *m, int which, const float *hf) {
    us_ops *o = &m->ops;
    int u;
    int64_t e;
    for (u = 0; u < m->n_units; u++) {
        const us__unit *U = &m->units[u];
        int64_t lo, hi, dst;
        us__ckpt_range(m, U, 0, which == 0, &lo, &hi);
        if (hi <= lo) continue;
        dst = us__ckpt_index(m, U, which, lo);
        if (which == 0 && m->dt != US_F32) { /* bf16 or fp16 weights, rounded once */
            uint16_t *b = (uint16_t *)US_MALLOC((size_t)(hi - lo) * 2);
            if (!b) {
                us__model_set_error(m, "checkpoint: out of host memory");
                return US_ERR_OOM;
            }
            for (e = lo; e < hi; e++) b[e - lo] = us__f32_to_h16(hf[e], m->dt);
            o->copy(o, (uint16_t *)m->w + dst, b, (size_t)(hi - lo) * 2, US_COPY_H2D);
            o->sync(o);
            US_FREE(b);
        } else {
            float *d = which == 0   ? (float *)m->w
                       : which == 1 ? m->master
                       : which == 2 ? m->adam_m
                                    : m->adam_v;
            o->copy(o, d + dst, hf + lo, (size_t)(hi - lo) * 4, US_COPY_H2D);
        }
    }
    o->sync(o);
    return US_OK;
}

/* The master weights (bf16 and fp16 runs): from the training state's optimizer file when resuming
   and it has them, else the model file's values still in hf (a superset of this rank's master
   range). Opens the optimizer file into opt for the moments. */
static us_result us__ckpt_load_master(us_model *m, const char *dir, int resume, us__ckin *opt,
                                      const us__ck_t *list, int nlist, float *hf) {
    us_result r = US_OK;
    int have_master = 0;
    char p[4200];
    if (resume) {
        snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
        if ((r = us__ckin_open1(m, opt, p)) == US_OK)
            have_master =
                us_safetensors_find(&opt->st[0], "master.model.norm.weight") != NULL ||
                us_safetensors_find(&opt->st[0], "master.model.embed_tokens.weight") != NULL;
    }
    /* else hf still holds the file's weights, a superset of this rank's master range */
    if (r == US_OK && have_master) {
        memset(hf, 0, (size_t)m->n_flat * 4);
        r = us__ckpt_read_buf(m, opt, list, nlist, "master.", 1, hf);
    }
    if (r == US_OK) r = us__ckpt_upload(m, 1, hf);
    return r;
}

/* The MoE router biases (auxiliary-loss-free balancing), where the model file has them. */
static us_result us__ckpt_load_router_bias(us_model *m, us__ckin *in) {
    us_result r = US_OK;
    int l, E = m->cfg.moe_experts;
    for (l = 0; l < m->cfg.n_layers && r == US_OK; l++) {
        us__ck_t want;
        const us_st_tensor *t;
        int fi = 0;
        if (m->moe_idx[l] < 0) continue;
        snprintf(want.name, sizeof want.name, "model.layers.%d.mlp.gate.e_score_correction_bias",
                 m->layer_g[l]);
        want.rows = E;
        want.cols = 0;
        t = us__ckin_check(m, in, want.name, &want, &fi, 1);
        if (!t) {
            if (us__ckin_find(in, want.name, &fi)) r = US_ERR_FORMAT;
            continue;
        }
        if (strcmp(t->dtype, "F32") ||
            us__pread_all(in->fd[fi], m->moe_bias_h + (size_t)m->moe_idx[l] * E, (size_t)E * 4,
                          in->st[fi].data_start + t->begin)) {
            us__model_set_error(m, "checkpoint: cannot read %s (it must be F32)", want.name);
            r = US_ERR_FORMAT;
        }
    }
    if (r == US_OK)
        m->ops.copy(&m->ops, m->moe_bias, m->moe_bias_h, us__moe_bias_bytes(m), US_COPY_H2D);
    return r;
}

/* The AdamW moments: from the optimizer file when resuming, else zero. */
static us_result us__ckpt_load_moments(us_model *m, const char *dir, int resume, us__ckin *opt,
                                       const us__ck_t *list, int nlist, float *hf) {
    us_result r = US_OK;
    int k;
    char p[4200];
    if (!resume) {
        m->ops.zero(&m->ops, m->adam_m, (size_t)(m->tc.zero ? m->shard_n : m->n_flat) * 4);
        m->ops.zero(&m->ops, m->adam_v, (size_t)(m->tc.zero ? m->shard_n : m->n_flat) * 4);
        return US_OK;
    }
    if (!opt->n) {
        snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
        r = us__ckin_open1(m, opt, p);
    }
    for (k = 2; k <= 3 && r == US_OK; k++) {
        memset(hf, 0, (size_t)m->n_flat * 4);
        r = us__ckpt_read_buf(m, opt, list, nlist,
                              k == 2 ? "optimizer.exp_avg." : "optimizer.exp_avg_sq.", k, hf);
        if (r == US_OK) r = us__ckpt_upload(m, k, hf);
    }
    return r;
}

/* trainer_state.json's "loader" object, a shard loader's position (// >>data), when it has one. */
static us_result us__ckpt_load_loader(us_model *m, const us__json *j, const char *p,
                                      us_ckpt_state *st) {
    int k = us__jget(j, 0, "loader");
    char num[32], *end;
    if (k < 0) return US_OK;
    if (!us__jint(j, us__jget(j, k, "epoch"), &st->loader_epoch) ||
        !us__jint(j, us__jget(j, k, "shard"), &st->loader_shard) ||
        !us__jint(j, us__jget(j, k, "window"), &st->loader_window) ||
        !us__jint(j, us__jget(j, k, "tokens"), &st->loader_tokens) ||
        !us__jstr(j, us__jget(j, k, "seed"), num, sizeof num) || !num[0] || st->loader_epoch < 0 ||
        st->loader_shard < 0 || st->loader_window < 0) {
        us__model_set_error(m,
                            "checkpoint: %s: \"loader\" needs epoch, shard, window (numbers, not "
                            "negative), seed (a decimal string) and tokens",
                            p);
        return US_ERR_FORMAT;
    }
    errno = 0;
    st->loader_seed = strtoull(num, &end, 10);
    if (*end || errno) {
        us__model_set_error(m, "checkpoint: %s: the loader's seed is not a 64-bit number", p);
        return US_ERR_FORMAT;
    }
    st->has_loader = 1;
    return US_OK;
}

/* trainer_state.json: the step, the data position, the RNG states and the loss scaler's state. */
static us_result us__ckpt_load_trainer_state(us_model *m, const char *dir, us_ckpt_state *st) {
    us_result r = US_OK;
    char p[4200];
    struct stat sb;
    us__json j;
    char *txt = NULL;
    int fd;
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    fd = open(p, O_RDONLY);
    if (fd < 0 || fstat(fd, &sb) || sb.st_size > 65536) {
        us__model_set_error(m, "checkpoint: cannot read %s (missing, or over 64 KiB)", p);
        r = US_ERR_IO;
    } else if (!(txt = (char *)US_MALLOC((size_t)sb.st_size + 1)) ||
               us__pread_all(fd, txt, (size_t)sb.st_size, 0)) {
        us__model_set_error(m, "checkpoint: cannot read %s", p);
        r = US_ERR_IO;
    }
    if (fd >= 0) close(fd);
    if (r == US_OK) {
        char fmt[64], num[32];
        int64_t step = 0, pos = 0;
        int rn, q;
        if (us__json_parse(&j, txt, (size_t)sb.st_size, 4096) != 0) {
            us__model_set_error(m, "checkpoint: %s: %s", p, j.err);
            r = US_ERR_FORMAT;
        } else if (!us__jstr(&j, us__jget(&j, 0, "format"), fmt, sizeof fmt) ||
                   strcmp(fmt, "ultrascale-trainer-state") ||
                   !us__jint(&j, us__jget(&j, 0, "version"), &step) || step != 1) {
            us__model_set_error(m, "checkpoint: %s is not an ultrascale trainer state of version 1",
                                p);
            r = US_ERR_FORMAT;
        } else if (!us__jint(&j, us__jget(&j, 0, "step"), &step) || step < 0 || step > 0x7fffffff ||
                   !us__jint(&j, us__jget(&j, 0, "data_position"), &pos) ||
                   (rn = us__jget(&j, 0, "rng")) < 0 || j.t[rn].type != US__J_ARR ||
                   j.t[rn].size > 8) {
            us__model_set_error(m, "checkpoint: %s needs step, data_position and rng (at most 8)",
                                p);
            r = US_ERR_FORMAT;
        } else {
            double ls;
            int64_t good;
            m->step = (int)step;
            /* the loss scaler's state, when the file has it and this run scales dynamically
               (a static --loss-scale stays as given; older files have none) */
            if (m->ls_dynamic && us__jnum(&j, us__jget(&j, 0, "loss_scale"), &ls) && ls >= 1 &&
                ls <= 16777216.0 && us__jint(&j, us__jget(&j, 0, "loss_scale_good_steps"), &good) &&
                good >= 0 && good < 0x7fffffff) {
                m->loss_scale = (float)ls;
                m->ls_good = (int)good;
            }
            if (st) {
                memset(st, 0, sizeof *st);
                st->step = step;
                st->data_pos = pos;
                st->n_rng = j.t[rn].size;
                for (q = 0; q < st->n_rng && r == US_OK; q++) {
                    char *end;
                    if (!us__jstr(&j, rn + 1 + q, num, sizeof num) || !num[0]) {
                        us__model_set_error(
                            m, "checkpoint: %s: rng entries must be decimal strings", p);
                        r = US_ERR_FORMAT;
                        break;
                    }
                    errno = 0;
                    st->rng[q] = strtoull(num, &end, 10);
                    if (*end || errno) {
                        us__model_set_error(
                            m, "checkpoint: %s: rng entry %d is not a 64-bit number", p, q);
                        r = US_ERR_FORMAT;
                    }
                }
                if (r == US_OK) r = us__ckpt_load_loader(m, &j, p, st);
            }
        }
        us__json_free(&j);
    }
    US_FREE(txt);
    return r;
}

static us_result us__ckpt_load_local(us_model *m, const char *dir, int resume, us_ckpt_state *st) {
    us__ckin in, opt;
    int nlist = us__ckpt_tensors(m, NULL), k;
    us__ck_t *list = (us__ck_t *)US_MALLOC(sizeof(us__ck_t) * (size_t)nlist);
    float *hf = (float *)calloc((size_t)(m->n_flat > 0 ? m->n_flat : 1), 4);
    us_result r;
    memset(&opt, 0, sizeof opt);
    if (!list || !hf) {
        US_FREE(list);
        US_FREE(hf);
        us__model_set_error(m, "checkpoint: out of host memory");
        return US_ERR_OOM;
    }
    us__ckpt_tensors(m, list);
    if ((r = us__ckin_open_model(m, &in, dir)) != US_OK) {
        us__ckin_close(&in);
        US_FREE(list);
        US_FREE(hf);
        return r;
    }
    r = us__ckpt_read_buf(m, &in, list, nlist, "", 0, hf);
    if (r == US_OK) r = us__ckpt_upload(m, 0, hf);
    if (r == US_OK && m->dt != US_F32 && m->master)
        r = us__ckpt_load_master(m, dir, resume, &opt, list, nlist, hf);
    if (r == US_OK && m->n_moe && m->cfg.moe_balance == US_MOE_BALANCE_BIAS)
        r = us__ckpt_load_router_bias(m, &in);
    if (r == US_OK) r = us__ckpt_load_moments(m, dir, resume, &opt, list, nlist, hf);
    if (r == US_OK && resume)
        r = us__ckpt_load_trainer_state(m, dir, st);
    else if (r == US_OK)
        m->step = 0;
    /* ZeRO-3's gathered weights are stale now */
    for (k = 0; k < m->n_wslots; k++) m->wslot_unit[k] = -1;
    for (k = 0; k < m->n_units; k++) m->units[k].wslot = -1;
    us__ckin_close(&in);
    us__ckin_close(&opt);
    US_FREE(list);
    US_FREE(hf);
    return r;
}
#endif

US_API us_result us_ckpt_load(us_model *m, const char *dir, int resume, us_ckpt_state *st) {
#if !US__CKPT_POSIX
    (void)dir;
    (void)resume;
    (void)st;
    us__model_set_error(
        m,
        "checkpoint: this build has no POSIX file calls (compile with -D_POSIX_C_SOURCE=200809L)");
    return us__ckpt_agree(m, US_ERR_IO);
#else
    us__fp8_wcache_drop(m); /* new weights */
    return us__ckpt_agree(m, us__ckpt_load_local(m, dir, resume, st));
#endif
}

#if US__CKPT_POSIX
/* config.json's fields this library reads (RoPE's apart: us__cfg_rope): the key, where it goes in us_model_config, its kind
   (0 int, 1 int64, 2 float, 3 bool) and its allowed range. */
static const struct {
    const char *key;
    int kind;
    size_t off;
    int64_t lo, hi;
} us__cfg_fields[] = {
    {"vocab_size", 1, offsetof(us_model_config, vocab), 1, (int64_t)1 << 31},
    {"hidden_size", 1, offsetof(us_model_config, dim), 1, (int64_t)1 << 20},
    {"num_hidden_layers", 0, offsetof(us_model_config, n_layers), 1, 1 << 16},
    {"num_attention_heads", 0, offsetof(us_model_config, n_heads), 1, 1 << 16},
    {"num_key_value_heads", 0, offsetof(us_model_config, n_kv_heads), 1, 1 << 16},
    {"intermediate_size", 1, offsetof(us_model_config, ffn_dim), 1, (int64_t)1 << 24},
    {"tie_word_embeddings", 3, offsetof(us_model_config, tie_embeddings), 0, 1},
    {"rms_norm_eps", 2, offsetof(us_model_config, norm_eps), 0, 0},
    {"n_routed_experts", 0, offsetof(us_model_config, moe_experts), 0, 1024},
    {"num_experts_per_tok", 0, offsetof(us_model_config, moe_top_k), 0, 1024},
    {"moe_intermediate_size", 1, offsetof(us_model_config, moe_ffn_dim), 0, (int64_t)1 << 24},
    {"n_shared_experts", 0, offsetof(us_model_config, moe_shared), 0, 1},
    {"first_k_dense_replace", 0, offsetof(us_model_config, moe_first_dense), 0, 1 << 16},
    {"moe_layer_freq", 0, offsetof(us_model_config, moe_every), 0, 1 << 16},
    {"n_group", 0, offsetof(us_model_config, moe_groups), 0, 64},
    {"topk_group", 0, offsetof(us_model_config, moe_top_groups), 0, 64},
    {"ultrascale_moe_balance", 0, offsetof(us_model_config, moe_balance), 0, 3}};

/* dir/config.json read (at most 1 MiB) and parsed into j; on success *txt holds the text j
   points into, and the caller frees both. */
static us_result us__cfg_load(const char *p, char **txt_out, us__json *j, char *err,
                              size_t errlen) {
    char *txt;
    struct stat sb;
    int fd = open(p, O_RDONLY);
    if (fd < 0 || fstat(fd, &sb) || sb.st_size > (1 << 20)) {
        us__errf(err, errlen, "cannot read %s (missing, or over 1 MiB)", p);
        if (fd >= 0) close(fd);
        return US_ERR_IO;
    }
    txt = (char *)US_MALLOC((size_t)sb.st_size + 1);
    if (!txt || us__pread_all(fd, txt, (size_t)sb.st_size, 0)) {
        us__errf(err, errlen, "cannot read %s", p);
        close(fd);
        US_FREE(txt);
        return US_ERR_IO;
    }
    close(fd);
    if (us__json_parse(j, txt, (size_t)sb.st_size, 100000) != 0 || j->t[0].type != US__J_OBJ) {
        us__errf(err, errlen, "%s: %s", p, j->err[0] ? j->err : "not a JSON object");
        us__json_free(j);
        US_FREE(txt);
        return US_ERR_FORMAT;
    }
    *txt_out = txt;
    return US_OK;
}

/* Field q of us__cfg_fields into mc: absent or null keeps the default; a value the caller's
   config already sets differently is refused, so a checkpoint never loads into the wrong model. */
static us_result us__cfg_field(const us__json *j, int q, us_model_config *mc, const char *p,
                               char *err, size_t errlen) {
    int k = us__jget(j, 0, us__cfg_fields[q].key), b;
    int64_t v = 0;
    double d = 0;
    const char *key = us__cfg_fields[q].key;
    char *fld = (char *)mc + us__cfg_fields[q].off;
    if (k < 0 || (j->t[k].type == US__J_LIT && j->s[j->t[k].start] == 'n'))
        return US_OK; /* absent or null: the default */
    if (us__cfg_fields[q].kind == 2) {
        float cur, x;
        if (!us__jnum(j, k, &d) || !(d > 0) || d > 1e30) {
            us__errf(err, errlen, "%s: %s must be a positive number", p, key);
            return US_ERR_FORMAT;
        }
        memcpy(&cur, fld, 4);
        x = (float)d;
        if (cur != 0 && cur != x) {
            us__errf(err, errlen, "%s says %s = %g but the model config sets %g", p, key, (double)x,
                     (double)cur);
            return US_ERR_INVALID;
        }
        memcpy(fld, &x, 4);
        return US_OK;
    }
    if (us__cfg_fields[q].kind == 3) {
        if (!us__jbool(j, k, &b)) {
            us__errf(err, errlen, "%s: %s must be true or false", p, key);
            return US_ERR_FORMAT;
        }
        v = b;
    } else if (!us__jint(j, k, &v) || v < us__cfg_fields[q].lo || v > us__cfg_fields[q].hi) {
        us__errf(err, errlen, "%s: %s must be an integer in %lld..%lld", p, key,
                 (long long)us__cfg_fields[q].lo, (long long)us__cfg_fields[q].hi);
        return US_ERR_FORMAT;
    }
    if (us__cfg_fields[q].kind == 1) {
        int64_t cur;
        memcpy(&cur, fld, 8);
        if (cur != 0 && cur != v) {
            us__errf(err, errlen, "%s says %s = %lld but the model config sets %lld", p, key,
                     (long long)v, (long long)cur);
            return US_ERR_INVALID;
        }
        memcpy(fld, &v, 8);
    } else {
        int cur, x = (int)v;
        memcpy(&cur, fld, sizeof(int));
        if (us__cfg_fields[q].kind == 3 && x == 0) return US_OK; /* untied: the default */
        if (cur != 0 && cur != x) {
            us__errf(err, errlen, "%s says %s = %d but the model config sets %d", p, key, x, cur);
            return US_ERR_INVALID;
        }
        memcpy(fld, &x, sizeof(int));
    }
    return US_OK;
}

/* Key `key` of object k, or -1 when it is absent or null. */
static int us__jset(const us__json *j, int k, const char *key) {
    int v = us__jget(j, k, key);
    return v < 0 || (j->t[v].type == US__J_LIT && j->s[j->t[v].start] == 'n') ? -1 : v;
}

/* RoPE as one config.json dictionary says it: the scaling kind, θ (0: not given) and llama3's
   four numbers. */
typedef struct us__rope_cfg {
    us_rope_scaling kind;
    double theta, factor, low, high, orig;
} us__rope_cfg;

/* A positive number under key `key` of object k into *v (left alone when absent or null); a
   value that is not one is refused, naming dictionary `where`. */
static us_result us__cfg_posnum(const us__json *j, int k, const char *key, double *v, const char *p,
                                const char *where, char *err, size_t errlen) {
    int kv = us__jset(j, k, key);
    if (kv < 0) return US_OK;
    if (!us__jnum(j, kv, v) || !(*v > 0) || *v > 1e30) {
        us__errf(err, errlen, "%s: %s%s must be a positive number", p, where, key);
        return US_ERR_FORMAT;
    }
    return US_OK;
}

/* The RoPE dictionary at token k, named `where` (rope_scaling, transformers 4.x; rope_parameters,
   5.x), into *rc: rope_type (or the older "type"; absent: "default"), rope_theta, and for llama3
   its four numbers, which transformers requires. A type other than default and llama3, a
   partial rotation and per-layer-type dictionaries are refused: this model has none of them. */
static us_result us__cfg_rope_dict(const us__json *j, int k, const char *where, us__rope_cfg *rc,
                                   const char *p, char *err, size_t errlen) {
    static const char *const l3[4] = {"factor", "low_freq_factor", "high_freq_factor",
                                      "original_max_position_embeddings"};
    char ty[32] = "default", w[40];
    double prf = 1, *dst[4];
    int kt = us__jset(j, k, "rope_type"), c, q;
    us_result r = US_OK;
    snprintf(w, sizeof w, "%s's ", where);
    if (j->t[k].type != US__J_OBJ) {
        us__errf(err, errlen, "%s: %s must be an object or null", p, where);
        return US_ERR_FORMAT;
    }
    for (c = k + 1, q = 0; q < j->t[k].size; q++, c = j->t[c + 1].next)
        if (j->t[c + 1].type == US__J_OBJ) {
            us__errf(err, errlen,
                     "%s: %s holds a dictionary per layer type, and this library's layers share "
                     "one RoPE",
                     p, where);
            return US_ERR_FORMAT;
        }
    if (kt < 0) kt = us__jset(j, k, "type");
    if (kt >= 0 && !us__jstr(j, kt, ty, sizeof ty)) {
        us__errf(err, errlen, "%s: %srope_type must be a short string", p, w);
        return US_ERR_FORMAT;
    }
    if (strcmp(ty, "default") && strcmp(ty, "llama3")) {
        us__errf(err, errlen,
                 "%s: %srope_type is \"%s\", and this library has RoPE scaling \"default\" and "
                 "\"llama3\" only",
                 p, w, ty);
        return US_ERR_FORMAT;
    }
    rc->kind = strcmp(ty, "llama3") ? US_ROPE_NONE : US_ROPE_LLAMA3;
    if ((r = us__cfg_posnum(j, k, "rope_theta", &rc->theta, p, w, err, errlen)) != US_OK ||
        (r = us__cfg_posnum(j, k, "partial_rotary_factor", &prf, p, w, err, errlen)) != US_OK)
        return r;
    if (prf != 1) {
        us__errf(err, errlen, "%s: %spartial_rotary_factor is %g; this library rotates whole heads",
                 p, w, prf);
        return US_ERR_FORMAT;
    }
    dst[0] = &rc->factor;
    dst[1] = &rc->low;
    dst[2] = &rc->high;
    dst[3] = &rc->orig;
    for (q = 0; q < 4 && rc->kind == US_ROPE_LLAMA3; q++) {
        if ((r = us__cfg_posnum(j, k, l3[q], dst[q], p, w, err, errlen)) != US_OK) return r;
        if (*dst[q] == 0) {
            us__errf(err, errlen, "%s: %sllama3 scaling needs %s", p, w, l3[q]);
            return US_ERR_FORMAT;
        }
    }
    if (rc->kind == US_ROPE_LLAMA3 && (rc->orig != floor(rc->orig) || rc->orig > (1 << 30))) {
        us__errf(err, errlen,
                 "%s: %soriginal_max_position_embeddings must be an integer up to 2^30", p, w);
        return US_ERR_FORMAT;
    }
    return US_OK;
}

/* v (a number of config.json, key `key`) into *fld, unless the caller's config already sets
   another value. */
static us_result us__cfg_putf(float *fld, double v, const char *key, const char *p, char *err,
                              size_t errlen) {
    float x = (float)v;
    if (*fld != 0 && *fld != x) {
        us__errf(err, errlen, "%s says %s = %g but the model config sets %g", p, key, (double)x,
                 (double)*fld);
        return US_ERR_INVALID;
    }
    *fld = x;
    return US_OK;
}

/* RoPE from config.json in either layout:
     transformers 4.x: "rope_theta": θ at the top; "rope_scaling": null or {"rope_type", ...}
     transformers 5.x: "rope_parameters": {"rope_theta": θ, "rope_type", ...}, no top-level θ
   A file with both says the same thing twice (this library writes both, so that either version
   reloads it): when the two disagree, the versions would build different models, and the file
   is refused. No θ anywhere is transformers' default, 10000. */
static us_result us__cfg_rope(const us__json *j, us_model_config *mc, const char *p, char *err,
                              size_t errlen) {
    us__rope_cfg a, b, *rc;
    int ks = us__jset(j, 0, "rope_scaling"), kp = us__jset(j, 0, "rope_parameters");
    double top = 0, prf = 1, theta;
    us_result r = US_OK;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    if ((ks >= 0 && (r = us__cfg_rope_dict(j, ks, "rope_scaling", &a, p, err, errlen)) != US_OK) ||
        (kp >= 0 &&
         (r = us__cfg_rope_dict(j, kp, "rope_parameters", &b, p, err, errlen)) != US_OK) ||
        (r = us__cfg_posnum(j, 0, "rope_theta", &top, p, "", err, errlen)) != US_OK ||
        (r = us__cfg_posnum(j, 0, "partial_rotary_factor", &prf, p, "", err, errlen)) != US_OK)
        return r;
    if (ks >= 0 && kp >= 0 &&
        (a.kind != b.kind || a.factor != b.factor || a.low != b.low || a.high != b.high ||
         a.orig != b.orig || (a.theta && b.theta && a.theta != b.theta))) {
        us__errf(err, errlen, "%s: rope_scaling and rope_parameters disagree", p);
        return US_ERR_FORMAT;
    }
    rc = kp >= 0 ? &b : &a; /* all zeros when neither is there: plain RoPE */
    theta = b.theta ? b.theta : a.theta;
    if (top && theta && top != theta) {
        us__errf(err, errlen,
                 "%s: rope_theta is %g at the top and %g in %s; transformers 4 reads the first, "
                 "5 the second",
                 p, top, theta, kp >= 0 ? "rope_parameters" : "rope_scaling");
        return US_ERR_FORMAT;
    }
    if (prf != 1) {
        us__errf(err, errlen, "%s: partial_rotary_factor is %g; this library rotates whole heads",
                 p, prf);
        return US_ERR_FORMAT;
    }
    if (!rc->kind) rc->kind = US_ROPE_NONE;
    if (mc->rope_scaling != US_ROPE_DEFAULT && mc->rope_scaling != rc->kind) {
        us__errf(err, errlen, "%s says rope_type = %s but the model config sets %s", p,
                 rc->kind == US_ROPE_LLAMA3 ? "llama3" : "default",
                 mc->rope_scaling == US_ROPE_LLAMA3 ? "llama3" : "default");
        return US_ERR_INVALID;
    }
    if (rc->kind == US_ROPE_LLAMA3) mc->rope_scaling = US_ROPE_LLAMA3;
    if ((theta || top) &&
        (r = us__cfg_putf(&mc->rope_theta, theta ? theta : top, "rope_theta", p, err, errlen)))
        return r;
    if (rc->kind != US_ROPE_LLAMA3) return US_OK;
    if ((r = us__cfg_putf(&mc->rope_factor, rc->factor, "factor", p, err, errlen)) ||
        (r = us__cfg_putf(&mc->rope_low_freq, rc->low, "low_freq_factor", p, err, errlen)) ||
        (r = us__cfg_putf(&mc->rope_high_freq, rc->high, "high_freq_factor", p, err, errlen)))
        return r;
    if (mc->rope_orig_ctx && mc->rope_orig_ctx != (int)rc->orig) {
        us__errf(err, errlen,
                 "%s says original_max_position_embeddings = %d but the model config sets %d", p,
                 (int)rc->orig, mc->rope_orig_ctx);
        return US_ERR_INVALID;
    }
    mc->rope_orig_ctx = (int)rc->orig;
    return US_OK;
}

/* What this model cannot represent (biases, an MLP other than SwiGLU) is refused rather than
   silently dropped; DeepSeek's scoring function is read; head_dim must be hidden/heads here. */
static us_result us__cfg_refuse(const us__json *j, us_model_config *mc, const char *p, char *err,
                                size_t errlen) {
    int b2;
    char act[32], sf[32];
    int64_t hd;
    if ((us__jbool(j, us__jget(j, 0, "attention_bias"), &b2) && b2) ||
        (us__jbool(j, us__jget(j, 0, "mlp_bias"), &b2) && b2)) {
        us__errf(err, errlen,
                 "%s: attention_bias / mlp_bias is true, and this library's linear layers "
                 "have no bias",
                 p);
        return US_ERR_FORMAT;
    }
    if (us__jstr(j, us__jget(j, 0, "hidden_act"), act, sizeof act) && strcmp(act, "silu")) {
        us__errf(err, errlen, "%s: hidden_act is %s; this library's MLP is SwiGLU (silu)", p, act);
        return US_ERR_FORMAT;
    }
    if (us__jstr(j, us__jget(j, 0, "scoring_func"), sf, sizeof sf) && !mc->moe_gate)
        mc->moe_gate = !strcmp(sf, "sigmoid") ? US_MOE_SIGMOID : US_MOE_SOFTMAX;
    if (us__jint(j, us__jget(j, 0, "head_dim"), &hd) && mc->n_heads > 0 &&
        hd * mc->n_heads != mc->dim) {
        us__errf(err, errlen,
                 "%s: head_dim %lld is not hidden_size/num_attention_heads = %lld, which "
                 "this library assumes",
                 p, (long long)hd, (long long)(mc->dim / mc->n_heads));
        return US_ERR_FORMAT;
    }
    return US_OK;
}
#endif

US_API us_result us_ckpt_read_config(const char *dir, us_model_config *mc, char *err,
                                     size_t errlen) {
#if !US__CKPT_POSIX
    (void)dir;
    (void)mc;
    (void)us__jnum;
    (void)us__jbool;
    us__errf(err, errlen, "checkpoint: this build has no POSIX file calls");
    return US_ERR_IO;
#else
    char p[4200], *txt = NULL;
    us__json j;
    int q;
    us_result r;
    snprintf(p, sizeof p, "%s/config.json", dir);
    r = us__cfg_load(p, &txt, &j, err, errlen);
    if (r != US_OK) return r;
    for (q = 0; q < (int)(sizeof us__cfg_fields / sizeof us__cfg_fields[0]) && r == US_OK; q++)
        r = us__cfg_field(&j, q, mc, p, err, errlen);
    if (r == US_OK) r = us__cfg_rope(&j, mc, p, err, errlen);
    if (r == US_OK) r = us__cfg_refuse(&j, mc, p, err, errlen);
    us__json_free(&j);
    US_FREE(txt);
    return r;
#endif
}

#if US__CKPT_POSIX
/* The step number of a name "step_N" (complete: no suffix), or -1. */
static long long us__ckpt_stepname(const char *s) {
    long long v = 0;
    if (strncmp(s, "step_", 5)) return -1;
    s += 5;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 100000000000LL) return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}
#endif
US_API us_result us_ckpt_latest(const char *dir, char *out, size_t outlen, char *err,
                                size_t errlen) {
#if !US__CKPT_POSIX
    (void)dir;
    (void)out;
    (void)outlen;
    us__errf(err, errlen, "checkpoint: this build has no POSIX file calls");
    return US_ERR_IO;
#else
    char p[4200];
    struct stat sb;
    DIR *d;
    struct dirent *e;
    long long best = -1;
    char bestname[256] = "";
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (stat(p, &sb) == 0) {
        snprintf(out, outlen, "%s", dir);
        return US_OK;
    }
    if (!(d = opendir(dir))) {
        us__errf(err, errlen, "cannot open checkpoint directory %s: %s", dir, strerror(errno));
        return US_ERR_IO;
    }
    while ((e = readdir(d)) != NULL) {
        long long s = us__ckpt_stepname(e->d_name);
        if (s <= best) continue;
        snprintf(p, sizeof p, "%s/%s/trainer_state.json", dir, e->d_name);
        if (stat(p, &sb) == 0) {
            best = s;
            snprintf(bestname, sizeof bestname, "%s", e->d_name);
        }
    }
    closedir(d);
    if (best < 0) {
        us__errf(
            err, errlen,
            "%s holds no complete checkpoint (no trainer_state.json, no step_N directory with one)",
            dir);
        return US_ERR_IO;
    }
    snprintf(out, outlen, "%s/%s", dir, bestname);
    return US_OK;
#endif
}

US_API us_result us_ckpt_prune(const char *dir, int keep, char *err, size_t errlen) {
#if !US__CKPT_POSIX
    (void)dir;
    (void)keep;
    us__errf(err, errlen, "checkpoint: this build has no POSIX file calls");
    return US_ERR_IO;
#else
    DIR *d;
    struct dirent *e;
    long long steps[1024];
    char names[1024][64], p[4200];
    int n = 0, i, j;
    if (keep < 1) return US_OK;
    if (!(d = opendir(dir))) {
        us__errf(err, errlen, "cannot open checkpoint directory %s: %s", dir, strerror(errno));
        return US_ERR_IO;
    }
    while ((e = readdir(d)) != NULL && n < 1024) {
        long long s = us__ckpt_stepname(e->d_name);
        size_t L = strlen(e->d_name);
        if (s < 0 && L > 4 && L < 60 &&
            !strcmp(e->d_name + L - 4, ".tmp")) { /* a stale half-written one */
            char base[64];
            snprintf(base, sizeof base, "%.*s", (int)(L - 4 < 63 ? L - 4 : 63), e->d_name);
            if (us__ckpt_stepname(base) >= 0) {
                snprintf(names[n], sizeof names[n], "%.63s", e->d_name);
                steps[n++] = -2;
            }
            continue;
        }
        if (s < 0 || L >= 60) continue;
        snprintf(names[n], sizeof names[n], "%.63s", e->d_name);
        steps[n++] = s;
    }
    closedir(d);
    for (i = 0; i < n; i++) {
        int newer = 0;
        for (j = 0; j < n; j++) newer += steps[j] > steps[i];
        if (steps[i] == -2 || newer >= keep) {
            snprintf(p, sizeof p, "%.4000s/%.63s", dir, names[i]);
            us__rm_tree(p);
        }
    }
    return US_OK;
#endif
}
#endif /* ULTRASCALE_NO_CHECKPOINT */

#ifndef ULTRASCALE_NO_TOKENIZER
/* ------------------------------------------------------------------------------------ */
// >>tokenizer  byte-level BPE from a Hugging Face tokenizer.json: GPT-2 and Llama 3 pre-tokenisers
/* ------------------------------------------------------------------------------------ */
/* Encoding runs as the `tokenizers` package does:
     1. added tokens are cut out of the text: first those matched on the raw text (normalized
        false), then in the pieces between them the others; the leftmost match wins, the longest
        at one place; lstrip / rstrip take the white space beside a match into it;
     2. each remaining segment (with ByteLevel's add_prefix_space, a space before it if it lacks
        one) is cut by the pre-tokeniser's regex into pieces, here a hand-written matcher per
        pattern;
     3. each piece's bytes start as byte tokens; BPE merges the pair of lowest rank (the leftmost
        of equal ranks) until no pair has a merge, with a heap as tokenizers' word.rs.
   Tokens are kept as the raw bytes they stand for: the byte-level alphabet (a printable character
   per byte: 'Ġ' for ' ') is undone at load time. Unicode letters \p{L} and numbers \p{N} are the
   ranges below, as the regex engine of tokenizers (Oniguruma) has them, written by
   tests/tok_fixtures.py; \s is Unicode's White_Space. */
enum { US__TK_L = 1, US__TK_N = 2, US__TK_S = 4, US__TK_O = 8, US__TK_NL = 16 }; /* char classes */

enum { US__TK_MODEL = 1, US__TK_ADDED = 2, US__TK_SPECIAL = 4 }; /* token kinds */

typedef struct us__tok_merge {
    uint64_t key; /* left id << 32 | right id; ~0 = empty */
    uint32_t rank;
    int32_t id;
} us__tok_merge;

typedef struct us__tok_added {
    int32_t id;
    int special, lstrip, rstrip, normalized;
    char *content; /* raw UTF-8 */
    size_t n;
} us__tok_added;

/* {first, last, 0 letter / 1 number}, sorted, disjoint */
static const uint32_t us__tok_table[][3] = {
    /* tok-table begin */
    {0x30, 0x39, 1},       {0x41, 0x5a, 0},       {0x61, 0x7a, 0},       {0xaa, 0xaa, 0},
    {0xb2, 0xb3, 1},       {0xb5, 0xb5, 0},       {0xb9, 0xb9, 1},       {0xba, 0xba, 0},
    {0xbc, 0xbe, 1},       {0xc0, 0xd6, 0},       {0xd8, 0xf6, 0},       {0xf8, 0x2c1, 0},
    {0x2c6, 0x2d1, 0},     {0x2e0, 0x2e4, 0},     {0x2ec, 0x2ec, 0},     {0x2ee, 0x2ee, 0},
    {0x370, 0x374, 0},     {0x376, 0x377, 0},     {0x37a, 0x37d, 0},     {0x37f, 0x37f, 0},
    {0x386, 0x386, 0},     {0x388, 0x38a, 0},     {0x38c, 0x38c, 0},     {0x38e, 0x3a1, 0},
    {0x3a3, 0x3f5, 0},     {0x3f7, 0x481, 0},     {0x48a, 0x52f, 0},     {0x531, 0x556, 0},
    {0x559, 0x559, 0},     {0x560, 0x588, 0},     {0x5d0, 0x5ea, 0},     {0x5ef, 0x5f2, 0},
    {0x620, 0x64a, 0},     {0x660, 0x669, 1},     {0x66e, 0x66f, 0},     {0x671, 0x6d3, 0},
    {0x6d5, 0x6d5, 0},     {0x6e5, 0x6e6, 0},     {0x6ee, 0x6ef, 0},     {0x6f0, 0x6f9, 1},
    {0x6fa, 0x6fc, 0},     {0x6ff, 0x6ff, 0},     {0x710, 0x710, 0},     {0x712, 0x72f, 0},
    {0x74d, 0x7a5, 0},     {0x7b1, 0x7b1, 0},     {0x7c0, 0x7c9, 1},     {0x7ca, 0x7ea, 0},
    {0x7f4, 0x7f5, 0},     {0x7fa, 0x7fa, 0},     {0x800, 0x815, 0},     {0x81a, 0x81a, 0},
    {0x824, 0x824, 0},     {0x828, 0x828, 0},     {0x840, 0x858, 0},     {0x860, 0x86a, 0},
    {0x870, 0x887, 0},     {0x889, 0x88e, 0},     {0x8a0, 0x8c9, 0},     {0x904, 0x939, 0},
    {0x93d, 0x93d, 0},     {0x950, 0x950, 0},     {0x958, 0x961, 0},     {0x966, 0x96f, 1},
    {0x971, 0x980, 0},     {0x985, 0x98c, 0},     {0x98f, 0x990, 0},     {0x993, 0x9a8, 0},
    {0x9aa, 0x9b0, 0},     {0x9b2, 0x9b2, 0},     {0x9b6, 0x9b9, 0},     {0x9bd, 0x9bd, 0},
    {0x9ce, 0x9ce, 0},     {0x9dc, 0x9dd, 0},     {0x9df, 0x9e1, 0},     {0x9e6, 0x9ef, 1},
    {0x9f0, 0x9f1, 0},     {0x9f4, 0x9f9, 1},     {0x9fc, 0x9fc, 0},     {0xa05, 0xa0a, 0},
    {0xa0f, 0xa10, 0},     {0xa13, 0xa28, 0},     {0xa2a, 0xa30, 0},     {0xa32, 0xa33, 0},
    {0xa35, 0xa36, 0},     {0xa38, 0xa39, 0},     {0xa59, 0xa5c, 0},     {0xa5e, 0xa5e, 0},
    {0xa66, 0xa6f, 1},     {0xa72, 0xa74, 0},     {0xa85, 0xa8d, 0},     {0xa8f, 0xa91, 0},
    {0xa93, 0xaa8, 0},     {0xaaa, 0xab0, 0},     {0xab2, 0xab3, 0},     {0xab5, 0xab9, 0},
    {0xabd, 0xabd, 0},     {0xad0, 0xad0, 0},     {0xae0, 0xae1, 0},     {0xae6, 0xaef, 1},
    {0xaf9, 0xaf9, 0},     {0xb05, 0xb0c, 0},     {0xb0f, 0xb10, 0},     {0xb13, 0xb28, 0},
    {0xb2a, 0xb30, 0},     {0xb32, 0xb33, 0},     {0xb35, 0xb39, 0},     {0xb3d, 0xb3d, 0},
    {0xb5c, 0xb5d, 0},     {0xb5f, 0xb61, 0},     {0xb66, 0xb6f, 1},     {0xb71, 0xb71, 0},
    {0xb72, 0xb77, 1},     {0xb83, 0xb83, 0},     {0xb85, 0xb8a, 0},     {0xb8e, 0xb90, 0},
    {0xb92, 0xb95, 0},     {0xb99, 0xb9a, 0},     {0xb9c, 0xb9c, 0},     {0xb9e, 0xb9f, 0},
    {0xba3, 0xba4, 0},     {0xba8, 0xbaa, 0},     {0xbae, 0xbb9, 0},     {0xbd0, 0xbd0, 0},
    {0xbe6, 0xbf2, 1},     {0xc05, 0xc0c, 0},     {0xc0e, 0xc10, 0},     {0xc12, 0xc28, 0},
    {0xc2a, 0xc39, 0},     {0xc3d, 0xc3d, 0},     {0xc58, 0xc5a, 0},     {0xc5d, 0xc5d, 0},
    {0xc60, 0xc61, 0},     {0xc66, 0xc6f, 1},     {0xc78, 0xc7e, 1},     {0xc80, 0xc80, 0},
    {0xc85, 0xc8c, 0},     {0xc8e, 0xc90, 0},     {0xc92, 0xca8, 0},     {0xcaa, 0xcb3, 0},
    {0xcb5, 0xcb9, 0},     {0xcbd, 0xcbd, 0},     {0xcdd, 0xcde, 0},     {0xce0, 0xce1, 0},
    {0xce6, 0xcef, 1},     {0xcf1, 0xcf2, 0},     {0xd04, 0xd0c, 0},     {0xd0e, 0xd10, 0},
    {0xd12, 0xd3a, 0},     {0xd3d, 0xd3d, 0},     {0xd4e, 0xd4e, 0},     {0xd54, 0xd56, 0},
    {0xd58, 0xd5e, 1},     {0xd5f, 0xd61, 0},     {0xd66, 0xd78, 1},     {0xd7a, 0xd7f, 0},
    {0xd85, 0xd96, 0},     {0xd9a, 0xdb1, 0},     {0xdb3, 0xdbb, 0},     {0xdbd, 0xdbd, 0},
    {0xdc0, 0xdc6, 0},     {0xde6, 0xdef, 1},     {0xe01, 0xe30, 0},     {0xe32, 0xe33, 0},
    {0xe40, 0xe46, 0},     {0xe50, 0xe59, 1},     {0xe81, 0xe82, 0},     {0xe84, 0xe84, 0},
    {0xe86, 0xe8a, 0},     {0xe8c, 0xea3, 0},     {0xea5, 0xea5, 0},     {0xea7, 0xeb0, 0},
    {0xeb2, 0xeb3, 0},     {0xebd, 0xebd, 0},     {0xec0, 0xec4, 0},     {0xec6, 0xec6, 0},
    {0xed0, 0xed9, 1},     {0xedc, 0xedf, 0},     {0xf00, 0xf00, 0},     {0xf20, 0xf33, 1},
    {0xf40, 0xf47, 0},     {0xf49, 0xf6c, 0},     {0xf88, 0xf8c, 0},     {0x1000, 0x102a, 0},
    {0x103f, 0x103f, 0},   {0x1040, 0x1049, 1},   {0x1050, 0x1055, 0},   {0x105a, 0x105d, 0},
    {0x1061, 0x1061, 0},   {0x1065, 0x1066, 0},   {0x106e, 0x1070, 0},   {0x1075, 0x1081, 0},
    {0x108e, 0x108e, 0},   {0x1090, 0x1099, 1},   {0x10a0, 0x10c5, 0},   {0x10c7, 0x10c7, 0},
    {0x10cd, 0x10cd, 0},   {0x10d0, 0x10fa, 0},   {0x10fc, 0x1248, 0},   {0x124a, 0x124d, 0},
    {0x1250, 0x1256, 0},   {0x1258, 0x1258, 0},   {0x125a, 0x125d, 0},   {0x1260, 0x1288, 0},
    {0x128a, 0x128d, 0},   {0x1290, 0x12b0, 0},   {0x12b2, 0x12b5, 0},   {0x12b8, 0x12be, 0},
    {0x12c0, 0x12c0, 0},   {0x12c2, 0x12c5, 0},   {0x12c8, 0x12d6, 0},   {0x12d8, 0x1310, 0},
    {0x1312, 0x1315, 0},   {0x1318, 0x135a, 0},   {0x1369, 0x137c, 1},   {0x1380, 0x138f, 0},
    {0x13a0, 0x13f5, 0},   {0x13f8, 0x13fd, 0},   {0x1401, 0x166c, 0},   {0x166f, 0x167f, 0},
    {0x1681, 0x169a, 0},   {0x16a0, 0x16ea, 0},   {0x16ee, 0x16f0, 1},   {0x16f1, 0x16f8, 0},
    {0x1700, 0x1711, 0},   {0x171f, 0x1731, 0},   {0x1740, 0x1751, 0},   {0x1760, 0x176c, 0},
    {0x176e, 0x1770, 0},   {0x1780, 0x17b3, 0},   {0x17d7, 0x17d7, 0},   {0x17dc, 0x17dc, 0},
    {0x17e0, 0x17e9, 1},   {0x17f0, 0x17f9, 1},   {0x1810, 0x1819, 1},   {0x1820, 0x1878, 0},
    {0x1880, 0x1884, 0},   {0x1887, 0x18a8, 0},   {0x18aa, 0x18aa, 0},   {0x18b0, 0x18f5, 0},
    {0x1900, 0x191e, 0},   {0x1946, 0x194f, 1},   {0x1950, 0x196d, 0},   {0x1970, 0x1974, 0},
    {0x1980, 0x19ab, 0},   {0x19b0, 0x19c9, 0},   {0x19d0, 0x19da, 1},   {0x1a00, 0x1a16, 0},
    {0x1a20, 0x1a54, 0},   {0x1a80, 0x1a89, 1},   {0x1a90, 0x1a99, 1},   {0x1aa7, 0x1aa7, 0},
    {0x1b05, 0x1b33, 0},   {0x1b45, 0x1b4c, 0},   {0x1b50, 0x1b59, 1},   {0x1b83, 0x1ba0, 0},
    {0x1bae, 0x1baf, 0},   {0x1bb0, 0x1bb9, 1},   {0x1bba, 0x1be5, 0},   {0x1c00, 0x1c23, 0},
    {0x1c40, 0x1c49, 1},   {0x1c4d, 0x1c4f, 0},   {0x1c50, 0x1c59, 1},   {0x1c5a, 0x1c7d, 0},
    {0x1c80, 0x1c8a, 0},   {0x1c90, 0x1cba, 0},   {0x1cbd, 0x1cbf, 0},   {0x1ce9, 0x1cec, 0},
    {0x1cee, 0x1cf3, 0},   {0x1cf5, 0x1cf6, 0},   {0x1cfa, 0x1cfa, 0},   {0x1d00, 0x1dbf, 0},
    {0x1e00, 0x1f15, 0},   {0x1f18, 0x1f1d, 0},   {0x1f20, 0x1f45, 0},   {0x1f48, 0x1f4d, 0},
    {0x1f50, 0x1f57, 0},   {0x1f59, 0x1f59, 0},   {0x1f5b, 0x1f5b, 0},   {0x1f5d, 0x1f5d, 0},
    {0x1f5f, 0x1f7d, 0},   {0x1f80, 0x1fb4, 0},   {0x1fb6, 0x1fbc, 0},   {0x1fbe, 0x1fbe, 0},
    {0x1fc2, 0x1fc4, 0},   {0x1fc6, 0x1fcc, 0},   {0x1fd0, 0x1fd3, 0},   {0x1fd6, 0x1fdb, 0},
    {0x1fe0, 0x1fec, 0},   {0x1ff2, 0x1ff4, 0},   {0x1ff6, 0x1ffc, 0},   {0x2070, 0x2070, 1},
    {0x2071, 0x2071, 0},   {0x2074, 0x2079, 1},   {0x207f, 0x207f, 0},   {0x2080, 0x2089, 1},
    {0x2090, 0x209c, 0},   {0x2102, 0x2102, 0},   {0x2107, 0x2107, 0},   {0x210a, 0x2113, 0},
    {0x2115, 0x2115, 0},   {0x2119, 0x211d, 0},   {0x2124, 0x2124, 0},   {0x2126, 0x2126, 0},
    {0x2128, 0x2128, 0},   {0x212a, 0x212d, 0},   {0x212f, 0x2139, 0},   {0x213c, 0x213f, 0},
    {0x2145, 0x2149, 0},   {0x214e, 0x214e, 0},   {0x2150, 0x2182, 1},   {0x2183, 0x2184, 0},
    {0x2185, 0x2189, 1},   {0x2460, 0x249b, 1},   {0x24ea, 0x24ff, 1},   {0x2776, 0x2793, 1},
    {0x2c00, 0x2ce4, 0},   {0x2ceb, 0x2cee, 0},   {0x2cf2, 0x2cf3, 0},   {0x2cfd, 0x2cfd, 1},
    {0x2d00, 0x2d25, 0},   {0x2d27, 0x2d27, 0},   {0x2d2d, 0x2d2d, 0},   {0x2d30, 0x2d67, 0},
    {0x2d6f, 0x2d6f, 0},   {0x2d80, 0x2d96, 0},   {0x2da0, 0x2da6, 0},   {0x2da8, 0x2dae, 0},
    {0x2db0, 0x2db6, 0},   {0x2db8, 0x2dbe, 0},   {0x2dc0, 0x2dc6, 0},   {0x2dc8, 0x2dce, 0},
    {0x2dd0, 0x2dd6, 0},   {0x2dd8, 0x2dde, 0},   {0x2e2f, 0x2e2f, 0},   {0x3005, 0x3006, 0},
    {0x3007, 0x3007, 1},   {0x3021, 0x3029, 1},   {0x3031, 0x3035, 0},   {0x3038, 0x303a, 1},
    {0x303b, 0x303c, 0},   {0x3041, 0x3096, 0},   {0x309d, 0x309f, 0},   {0x30a1, 0x30fa, 0},
    {0x30fc, 0x30ff, 0},   {0x3105, 0x312f, 0},   {0x3131, 0x318e, 0},   {0x3192, 0x3195, 1},
    {0x31a0, 0x31bf, 0},   {0x31f0, 0x31ff, 0},   {0x3220, 0x3229, 1},   {0x3248, 0x324f, 1},
    {0x3251, 0x325f, 1},   {0x3280, 0x3289, 1},   {0x32b1, 0x32bf, 1},   {0x3400, 0x4dbf, 0},
    {0x4e00, 0xa48c, 0},   {0xa4d0, 0xa4fd, 0},   {0xa500, 0xa60c, 0},   {0xa610, 0xa61f, 0},
    {0xa620, 0xa629, 1},   {0xa62a, 0xa62b, 0},   {0xa640, 0xa66e, 0},   {0xa67f, 0xa69d, 0},
    {0xa6a0, 0xa6e5, 0},   {0xa6e6, 0xa6ef, 1},   {0xa717, 0xa71f, 0},   {0xa722, 0xa788, 0},
    {0xa78b, 0xa7cd, 0},   {0xa7d0, 0xa7d1, 0},   {0xa7d3, 0xa7d3, 0},   {0xa7d5, 0xa7dc, 0},
    {0xa7f2, 0xa801, 0},   {0xa803, 0xa805, 0},   {0xa807, 0xa80a, 0},   {0xa80c, 0xa822, 0},
    {0xa830, 0xa835, 1},   {0xa840, 0xa873, 0},   {0xa882, 0xa8b3, 0},   {0xa8d0, 0xa8d9, 1},
    {0xa8f2, 0xa8f7, 0},   {0xa8fb, 0xa8fb, 0},   {0xa8fd, 0xa8fe, 0},   {0xa900, 0xa909, 1},
    {0xa90a, 0xa925, 0},   {0xa930, 0xa946, 0},   {0xa960, 0xa97c, 0},   {0xa984, 0xa9b2, 0},
    {0xa9cf, 0xa9cf, 0},   {0xa9d0, 0xa9d9, 1},   {0xa9e0, 0xa9e4, 0},   {0xa9e6, 0xa9ef, 0},
    {0xa9f0, 0xa9f9, 1},   {0xa9fa, 0xa9fe, 0},   {0xaa00, 0xaa28, 0},   {0xaa40, 0xaa42, 0},
    {0xaa44, 0xaa4b, 0},   {0xaa50, 0xaa59, 1},   {0xaa60, 0xaa76, 0},   {0xaa7a, 0xaa7a, 0},
    {0xaa7e, 0xaaaf, 0},   {0xaab1, 0xaab1, 0},   {0xaab5, 0xaab6, 0},   {0xaab9, 0xaabd, 0},
    {0xaac0, 0xaac0, 0},   {0xaac2, 0xaac2, 0},   {0xaadb, 0xaadd, 0},   {0xaae0, 0xaaea, 0},
    {0xaaf2, 0xaaf4, 0},   {0xab01, 0xab06, 0},   {0xab09, 0xab0e, 0},   {0xab11, 0xab16, 0},
    {0xab20, 0xab26, 0},   {0xab28, 0xab2e, 0},   {0xab30, 0xab5a, 0},   {0xab5c, 0xab69, 0},
    {0xab70, 0xabe2, 0},   {0xabf0, 0xabf9, 1},   {0xac00, 0xd7a3, 0},   {0xd7b0, 0xd7c6, 0},
    {0xd7cb, 0xd7fb, 0},   {0xf900, 0xfa6d, 0},   {0xfa70, 0xfad9, 0},   {0xfb00, 0xfb06, 0},
    {0xfb13, 0xfb17, 0},   {0xfb1d, 0xfb1d, 0},   {0xfb1f, 0xfb28, 0},   {0xfb2a, 0xfb36, 0},
    {0xfb38, 0xfb3c, 0},   {0xfb3e, 0xfb3e, 0},   {0xfb40, 0xfb41, 0},   {0xfb43, 0xfb44, 0},
    {0xfb46, 0xfbb1, 0},   {0xfbd3, 0xfd3d, 0},   {0xfd50, 0xfd8f, 0},   {0xfd92, 0xfdc7, 0},
    {0xfdf0, 0xfdfb, 0},   {0xfe70, 0xfe74, 0},   {0xfe76, 0xfefc, 0},   {0xff10, 0xff19, 1},
    {0xff21, 0xff3a, 0},   {0xff41, 0xff5a, 0},   {0xff66, 0xffbe, 0},   {0xffc2, 0xffc7, 0},
    {0xffca, 0xffcf, 0},   {0xffd2, 0xffd7, 0},   {0xffda, 0xffdc, 0},   {0x10000, 0x1000b, 0},
    {0x1000d, 0x10026, 0}, {0x10028, 0x1003a, 0}, {0x1003c, 0x1003d, 0}, {0x1003f, 0x1004d, 0},
    {0x10050, 0x1005d, 0}, {0x10080, 0x100fa, 0}, {0x10107, 0x10133, 1}, {0x10140, 0x10178, 1},
    {0x1018a, 0x1018b, 1}, {0x10280, 0x1029c, 0}, {0x102a0, 0x102d0, 0}, {0x102e1, 0x102fb, 1},
    {0x10300, 0x1031f, 0}, {0x10320, 0x10323, 1}, {0x1032d, 0x10340, 0}, {0x10341, 0x10341, 1},
    {0x10342, 0x10349, 0}, {0x1034a, 0x1034a, 1}, {0x10350, 0x10375, 0}, {0x10380, 0x1039d, 0},
    {0x103a0, 0x103c3, 0}, {0x103c8, 0x103cf, 0}, {0x103d1, 0x103d5, 1}, {0x10400, 0x1049d, 0},
    {0x104a0, 0x104a9, 1}, {0x104b0, 0x104d3, 0}, {0x104d8, 0x104fb, 0}, {0x10500, 0x10527, 0},
    {0x10530, 0x10563, 0}, {0x10570, 0x1057a, 0}, {0x1057c, 0x1058a, 0}, {0x1058c, 0x10592, 0},
    {0x10594, 0x10595, 0}, {0x10597, 0x105a1, 0}, {0x105a3, 0x105b1, 0}, {0x105b3, 0x105b9, 0},
    {0x105bb, 0x105bc, 0}, {0x105c0, 0x105f3, 0}, {0x10600, 0x10736, 0}, {0x10740, 0x10755, 0},
    {0x10760, 0x10767, 0}, {0x10780, 0x10785, 0}, {0x10787, 0x107b0, 0}, {0x107b2, 0x107ba, 0},
    {0x10800, 0x10805, 0}, {0x10808, 0x10808, 0}, {0x1080a, 0x10835, 0}, {0x10837, 0x10838, 0},
    {0x1083c, 0x1083c, 0}, {0x1083f, 0x10855, 0}, {0x10858, 0x1085f, 1}, {0x10860, 0x10876, 0},
    {0x10879, 0x1087f, 1}, {0x10880, 0x1089e, 0}, {0x108a7, 0x108af, 1}, {0x108e0, 0x108f2, 0},
    {0x108f4, 0x108f5, 0}, {0x108fb, 0x108ff, 1}, {0x10900, 0x10915, 0}, {0x10916, 0x1091b, 1},
    {0x10920, 0x10939, 0}, {0x10980, 0x109b7, 0}, {0x109bc, 0x109bd, 1}, {0x109be, 0x109bf, 0},
    {0x109c0, 0x109cf, 1}, {0x109d2, 0x109ff, 1}, {0x10a00, 0x10a00, 0}, {0x10a10, 0x10a13, 0},
    {0x10a15, 0x10a17, 0}, {0x10a19, 0x10a35, 0}, {0x10a40, 0x10a48, 1}, {0x10a60, 0x10a7c, 0},
    {0x10a7d, 0x10a7e, 1}, {0x10a80, 0x10a9c, 0}, {0x10a9d, 0x10a9f, 1}, {0x10ac0, 0x10ac7, 0},
    {0x10ac9, 0x10ae4, 0}, {0x10aeb, 0x10aef, 1}, {0x10b00, 0x10b35, 0}, {0x10b40, 0x10b55, 0},
    {0x10b58, 0x10b5f, 1}, {0x10b60, 0x10b72, 0}, {0x10b78, 0x10b7f, 1}, {0x10b80, 0x10b91, 0},
    {0x10ba9, 0x10baf, 1}, {0x10c00, 0x10c48, 0}, {0x10c80, 0x10cb2, 0}, {0x10cc0, 0x10cf2, 0},
    {0x10cfa, 0x10cff, 1}, {0x10d00, 0x10d23, 0}, {0x10d30, 0x10d39, 1}, {0x10d40, 0x10d49, 1},
    {0x10d4a, 0x10d65, 0}, {0x10d6f, 0x10d85, 0}, {0x10e60, 0x10e7e, 1}, {0x10e80, 0x10ea9, 0},
    {0x10eb0, 0x10eb1, 0}, {0x10ec2, 0x10ec4, 0}, {0x10f00, 0x10f1c, 0}, {0x10f1d, 0x10f26, 1},
    {0x10f27, 0x10f27, 0}, {0x10f30, 0x10f45, 0}, {0x10f51, 0x10f54, 1}, {0x10f70, 0x10f81, 0},
    {0x10fb0, 0x10fc4, 0}, {0x10fc5, 0x10fcb, 1}, {0x10fe0, 0x10ff6, 0}, {0x11003, 0x11037, 0},
    {0x11052, 0x1106f, 1}, {0x11071, 0x11072, 0}, {0x11075, 0x11075, 0}, {0x11083, 0x110af, 0},
    {0x110d0, 0x110e8, 0}, {0x110f0, 0x110f9, 1}, {0x11103, 0x11126, 0}, {0x11136, 0x1113f, 1},
    {0x11144, 0x11144, 0}, {0x11147, 0x11147, 0}, {0x11150, 0x11172, 0}, {0x11176, 0x11176, 0},
    {0x11183, 0x111b2, 0}, {0x111c1, 0x111c4, 0}, {0x111d0, 0x111d9, 1}, {0x111da, 0x111da, 0},
    {0x111dc, 0x111dc, 0}, {0x111e1, 0x111f4, 1}, {0x11200, 0x11211, 0}, {0x11213, 0x1122b, 0},
    {0x1123f, 0x11240, 0}, {0x11280, 0x11286, 0}, {0x11288, 0x11288, 0}, {0x1128a, 0x1128d, 0},
    {0x1128f, 0x1129d, 0}, {0x1129f, 0x112a8, 0}, {0x112b0, 0x112de, 0}, {0x112f0, 0x112f9, 1},
    {0x11305, 0x1130c, 0}, {0x1130f, 0x11310, 0}, {0x11313, 0x11328, 0}, {0x1132a, 0x11330, 0},
    {0x11332, 0x11333, 0}, {0x11335, 0x11339, 0}, {0x1133d, 0x1133d, 0}, {0x11350, 0x11350, 0},
    {0x1135d, 0x11361, 0}, {0x11380, 0x11389, 0}, {0x1138b, 0x1138b, 0}, {0x1138e, 0x1138e, 0},
    {0x11390, 0x113b5, 0}, {0x113b7, 0x113b7, 0}, {0x113d1, 0x113d1, 0}, {0x113d3, 0x113d3, 0},
    {0x11400, 0x11434, 0}, {0x11447, 0x1144a, 0}, {0x11450, 0x11459, 1}, {0x1145f, 0x11461, 0},
    {0x11480, 0x114af, 0}, {0x114c4, 0x114c5, 0}, {0x114c7, 0x114c7, 0}, {0x114d0, 0x114d9, 1},
    {0x11580, 0x115ae, 0}, {0x115d8, 0x115db, 0}, {0x11600, 0x1162f, 0}, {0x11644, 0x11644, 0},
    {0x11650, 0x11659, 1}, {0x11680, 0x116aa, 0}, {0x116b8, 0x116b8, 0}, {0x116c0, 0x116c9, 1},
    {0x116d0, 0x116e3, 1}, {0x11700, 0x1171a, 0}, {0x11730, 0x1173b, 1}, {0x11740, 0x11746, 0},
    {0x11800, 0x1182b, 0}, {0x118a0, 0x118df, 0}, {0x118e0, 0x118f2, 1}, {0x118ff, 0x11906, 0},
    {0x11909, 0x11909, 0}, {0x1190c, 0x11913, 0}, {0x11915, 0x11916, 0}, {0x11918, 0x1192f, 0},
    {0x1193f, 0x1193f, 0}, {0x11941, 0x11941, 0}, {0x11950, 0x11959, 1}, {0x119a0, 0x119a7, 0},
    {0x119aa, 0x119d0, 0}, {0x119e1, 0x119e1, 0}, {0x119e3, 0x119e3, 0}, {0x11a00, 0x11a00, 0},
    {0x11a0b, 0x11a32, 0}, {0x11a3a, 0x11a3a, 0}, {0x11a50, 0x11a50, 0}, {0x11a5c, 0x11a89, 0},
    {0x11a9d, 0x11a9d, 0}, {0x11ab0, 0x11af8, 0}, {0x11bc0, 0x11be0, 0}, {0x11bf0, 0x11bf9, 1},
    {0x11c00, 0x11c08, 0}, {0x11c0a, 0x11c2e, 0}, {0x11c40, 0x11c40, 0}, {0x11c50, 0x11c6c, 1},
    {0x11c72, 0x11c8f, 0}, {0x11d00, 0x11d06, 0}, {0x11d08, 0x11d09, 0}, {0x11d0b, 0x11d30, 0},
    {0x11d46, 0x11d46, 0}, {0x11d50, 0x11d59, 1}, {0x11d60, 0x11d65, 0}, {0x11d67, 0x11d68, 0},
    {0x11d6a, 0x11d89, 0}, {0x11d98, 0x11d98, 0}, {0x11da0, 0x11da9, 1}, {0x11ee0, 0x11ef2, 0},
    {0x11f02, 0x11f02, 0}, {0x11f04, 0x11f10, 0}, {0x11f12, 0x11f33, 0}, {0x11f50, 0x11f59, 1},
    {0x11fb0, 0x11fb0, 0}, {0x11fc0, 0x11fd4, 1}, {0x12000, 0x12399, 0}, {0x12400, 0x1246e, 1},
    {0x12480, 0x12543, 0}, {0x12f90, 0x12ff0, 0}, {0x13000, 0x1342f, 0}, {0x13441, 0x13446, 0},
    {0x13460, 0x143fa, 0}, {0x14400, 0x14646, 0}, {0x16100, 0x1611d, 0}, {0x16130, 0x16139, 1},
    {0x16800, 0x16a38, 0}, {0x16a40, 0x16a5e, 0}, {0x16a60, 0x16a69, 1}, {0x16a70, 0x16abe, 0},
    {0x16ac0, 0x16ac9, 1}, {0x16ad0, 0x16aed, 0}, {0x16b00, 0x16b2f, 0}, {0x16b40, 0x16b43, 0},
    {0x16b50, 0x16b59, 1}, {0x16b5b, 0x16b61, 1}, {0x16b63, 0x16b77, 0}, {0x16b7d, 0x16b8f, 0},
    {0x16d40, 0x16d6c, 0}, {0x16d70, 0x16d79, 1}, {0x16e40, 0x16e7f, 0}, {0x16e80, 0x16e96, 1},
    {0x16f00, 0x16f4a, 0}, {0x16f50, 0x16f50, 0}, {0x16f93, 0x16f9f, 0}, {0x16fe0, 0x16fe1, 0},
    {0x16fe3, 0x16fe3, 0}, {0x17000, 0x187f7, 0}, {0x18800, 0x18cd5, 0}, {0x18cff, 0x18d08, 0},
    {0x1aff0, 0x1aff3, 0}, {0x1aff5, 0x1affb, 0}, {0x1affd, 0x1affe, 0}, {0x1b000, 0x1b122, 0},
    {0x1b132, 0x1b132, 0}, {0x1b150, 0x1b152, 0}, {0x1b155, 0x1b155, 0}, {0x1b164, 0x1b167, 0},
    {0x1b170, 0x1b2fb, 0}, {0x1bc00, 0x1bc6a, 0}, {0x1bc70, 0x1bc7c, 0}, {0x1bc80, 0x1bc88, 0},
    {0x1bc90, 0x1bc99, 0}, {0x1ccf0, 0x1ccf9, 1}, {0x1d2c0, 0x1d2d3, 1}, {0x1d2e0, 0x1d2f3, 1},
    {0x1d360, 0x1d378, 1}, {0x1d400, 0x1d454, 0}, {0x1d456, 0x1d49c, 0}, {0x1d49e, 0x1d49f, 0},
    {0x1d4a2, 0x1d4a2, 0}, {0x1d4a5, 0x1d4a6, 0}, {0x1d4a9, 0x1d4ac, 0}, {0x1d4ae, 0x1d4b9, 0},
    {0x1d4bb, 0x1d4bb, 0}, {0x1d4bd, 0x1d4c3, 0}, {0x1d4c5, 0x1d505, 0}, {0x1d507, 0x1d50a, 0},
    {0x1d50d, 0x1d514, 0}, {0x1d516, 0x1d51c, 0}, {0x1d51e, 0x1d539, 0}, {0x1d53b, 0x1d53e, 0},
    {0x1d540, 0x1d544, 0}, {0x1d546, 0x1d546, 0}, {0x1d54a, 0x1d550, 0}, {0x1d552, 0x1d6a5, 0},
    {0x1d6a8, 0x1d6c0, 0}, {0x1d6c2, 0x1d6da, 0}, {0x1d6dc, 0x1d6fa, 0}, {0x1d6fc, 0x1d714, 0},
    {0x1d716, 0x1d734, 0}, {0x1d736, 0x1d74e, 0}, {0x1d750, 0x1d76e, 0}, {0x1d770, 0x1d788, 0},
    {0x1d78a, 0x1d7a8, 0}, {0x1d7aa, 0x1d7c2, 0}, {0x1d7c4, 0x1d7cb, 0}, {0x1d7ce, 0x1d7ff, 1},
    {0x1df00, 0x1df1e, 0}, {0x1df25, 0x1df2a, 0}, {0x1e030, 0x1e06d, 0}, {0x1e100, 0x1e12c, 0},
    {0x1e137, 0x1e13d, 0}, {0x1e140, 0x1e149, 1}, {0x1e14e, 0x1e14e, 0}, {0x1e290, 0x1e2ad, 0},
    {0x1e2c0, 0x1e2eb, 0}, {0x1e2f0, 0x1e2f9, 1}, {0x1e4d0, 0x1e4eb, 0}, {0x1e4f0, 0x1e4f9, 1},
    {0x1e5d0, 0x1e5ed, 0}, {0x1e5f0, 0x1e5f0, 0}, {0x1e5f1, 0x1e5fa, 1}, {0x1e7e0, 0x1e7e6, 0},
    {0x1e7e8, 0x1e7eb, 0}, {0x1e7ed, 0x1e7ee, 0}, {0x1e7f0, 0x1e7fe, 0}, {0x1e800, 0x1e8c4, 0},
    {0x1e8c7, 0x1e8cf, 1}, {0x1e900, 0x1e943, 0}, {0x1e94b, 0x1e94b, 0}, {0x1e950, 0x1e959, 1},
    {0x1ec71, 0x1ecab, 1}, {0x1ecad, 0x1ecaf, 1}, {0x1ecb1, 0x1ecb4, 1}, {0x1ed01, 0x1ed2d, 1},
    {0x1ed2f, 0x1ed3d, 1}, {0x1ee00, 0x1ee03, 0}, {0x1ee05, 0x1ee1f, 0}, {0x1ee21, 0x1ee22, 0},
    {0x1ee24, 0x1ee24, 0}, {0x1ee27, 0x1ee27, 0}, {0x1ee29, 0x1ee32, 0}, {0x1ee34, 0x1ee37, 0},
    {0x1ee39, 0x1ee39, 0}, {0x1ee3b, 0x1ee3b, 0}, {0x1ee42, 0x1ee42, 0}, {0x1ee47, 0x1ee47, 0},
    {0x1ee49, 0x1ee49, 0}, {0x1ee4b, 0x1ee4b, 0}, {0x1ee4d, 0x1ee4f, 0}, {0x1ee51, 0x1ee52, 0},
    {0x1ee54, 0x1ee54, 0}, {0x1ee57, 0x1ee57, 0}, {0x1ee59, 0x1ee59, 0}, {0x1ee5b, 0x1ee5b, 0},
    {0x1ee5d, 0x1ee5d, 0}, {0x1ee5f, 0x1ee5f, 0}, {0x1ee61, 0x1ee62, 0}, {0x1ee64, 0x1ee64, 0},
    {0x1ee67, 0x1ee6a, 0}, {0x1ee6c, 0x1ee72, 0}, {0x1ee74, 0x1ee77, 0}, {0x1ee79, 0x1ee7c, 0},
    {0x1ee7e, 0x1ee7e, 0}, {0x1ee80, 0x1ee89, 0}, {0x1ee8b, 0x1ee9b, 0}, {0x1eea1, 0x1eea3, 0},
    {0x1eea5, 0x1eea9, 0}, {0x1eeab, 0x1eebb, 0}, {0x1f100, 0x1f10c, 1}, {0x1fbf0, 0x1fbf9, 1},
    {0x20000, 0x2a6df, 0}, {0x2a700, 0x2b739, 0}, {0x2b740, 0x2b81d, 0}, {0x2b820, 0x2cea1, 0},
    {0x2ceb0, 0x2ebe0, 0}, {0x2ebf0, 0x2ee5d, 0}, {0x2f800, 0x2fa1d, 0}, {0x30000, 0x3134a, 0},
    {0x31350, 0x323af, 0},
    /* tok-table end */
};

static int us__tok_class(uint32_t cp) {
    int64_t lo = 0, hi = (int64_t)(sizeof us__tok_table / sizeof us__tok_table[0]) - 1;
    if (cp < 128) {
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return US__TK_L;
        if (cp >= '0' && cp <= '9') return US__TK_N;
        if (cp == '\n' || cp == '\r') return US__TK_S | US__TK_NL;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return US__TK_S;
        return US__TK_O;
    }
    if (cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
        cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return US__TK_S;
    while (lo <= hi) {
        int64_t mid = (lo + hi) / 2;
        if (cp < us__tok_table[mid][0])
            hi = mid - 1;
        else if (cp > us__tok_table[mid][1])
            lo = mid + 1;
        else
            return us__tok_table[mid][2] ? US__TK_N : US__TK_L;
    }
    return US__TK_O;
}

/* The code point at s[i] (i < n) and where the next begins; an invalid byte is 0x110000, alone. */
static uint32_t us__tok_utf8(const uint8_t *s, size_t n, size_t i, size_t *next) {
    uint32_t c = s[i], cp;
    size_t k, len = c < 0x80 ? 1 : c >= 0xc2 && c < 0xe0 ? 2 : c >= 0xe0 && c < 0xf0 ? 3 : 4;
    *next = i + 1;
    if (len == 1) return c;
    if (c >= 0xf5 || c < 0xc2 || i + len > n) return 0x110000;
    cp = c & (0x3fu >> (len - 1));
    for (k = 1; k < len; k++) {
        if ((s[i + k] & 0xc0) != 0x80) return 0x110000;
        cp = cp << 6 | (s[i + k] & 0x3fu);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0x110000;
    *next = i + len;
    return cp;
}

/* The class of the character at s[i] (0 at the end) and where the next one begins. */
static int us__tok_at(const uint8_t *s, size_t n, size_t i, size_t *next) {
    *next = i;
    return i < n ? us__tok_class(us__tok_utf8(s, n, i, next)) : 0;
}

/* The end of the run of characters in class mask from i; *last: where its last character starts. */
static size_t us__tok_run(const uint8_t *s, size_t n, size_t i, int mask, size_t *last) {
    size_t j;
    *last = i;
    while (us__tok_at(s, n, i, &j) & mask) {
        *last = i;
        i = j;
    }
    return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d at s[i], its end or 0; fold: case-insensitively, as Llama 3's (?i:...),
   where Oniguruma's case folding also takes 'ſ' (U+017F) for 's'. */
static size_t us__tok_contraction(const uint8_t *s, size_t n, size_t i, int fold) {
    int a, b;
    if (s[i] != '\'' || i + 1 >= n) return 0;
    a = fold && s[i + 1] < 128 ? s[i + 1] | 32 : s[i + 1];
    b = i + 2 < n ? (fold && s[i + 2] < 128 ? s[i + 2] | 32 : s[i + 2]) : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    if (fold && s[i + 1] == 0xc5 && b == 0xbf) return i + 3;
    return 0;
}

/* \s+(?!\S)|\s+ at a white space s[i]: the run, less its last character when a non-space
   follows and the run has more than one. */
static size_t us__tok_spaces(const uint8_t *s, size_t n, size_t i) {
    size_t last, e = us__tok_run(s, n, i, US__TK_S, &last);
    return e < n && last > i ? last : e;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ — the end of
   the piece that starts at s[i], alternatives tried in order as the regex engine does. */
static size_t us__tok_gpt2(const uint8_t *s, size_t n, size_t i) {
    static const int alt[3] = {US__TK_L, US__TK_N, US__TK_O};
    size_t j, k, last, e = us__tok_contraction(s, n, i, 0);
    int c0 = us__tok_at(s, n, i, &j), c1 = us__tok_at(s, n, j, &k), q;
    if (e) return e;
    for (q = 0; q < 3; q++) {
        if (s[i] == ' ' && (c1 & alt[q])) return us__tok_run(s, n, j, alt[q], &last);
        if (c0 & alt[q]) return us__tok_run(s, n, i, alt[q], &last);
    }
    return us__tok_spaces(s, n, i);
}

/* Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ — the end of the piece that starts at s[i]. */
static size_t us__tok_llama3(const uint8_t *s, size_t n, size_t i) {
    size_t j, k, last, e = us__tok_contraction(s, n, i, 1), p;
    int c0 = us__tok_at(s, n, i, &j), c1 = us__tok_at(s, n, j, &k), q;
    if (e) return e;
    if (!(c0 & (US__TK_L | US__TK_N | US__TK_NL)) && (c1 & US__TK_L))
        return us__tok_run(s, n, j, US__TK_L, &last);
    if (c0 & US__TK_L) return us__tok_run(s, n, i, US__TK_L, &last);
    if (c0 & US__TK_N) {
        for (e = j, q = 1; q < 3 && (us__tok_at(s, n, e, &k) & US__TK_N); q++) e = k;
        return e;
    }
    p = s[i] == ' ' && (c1 & US__TK_O) ? j : i;
    if (us__tok_at(s, n, p, &k) & US__TK_O) {
        e = us__tok_run(s, n, p, US__TK_O, &last);
        while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }
    e = us__tok_run(s, n, i, US__TK_S, &last); /* \s*[\r\n]+: up to the run's last CR or LF */
    for (p = e; p > i; p--)
        if (s[p - 1] == '\r' || s[p - 1] == '\n') return p;
    return us__tok_spaces(s, n, i);
}

static size_t us__tok_piece(const us_tokenizer *t, const uint8_t *s, size_t n, size_t i) {
    return t->pattern == US_TOK_LLAMA3 ? us__tok_llama3(s, n, i) : us__tok_gpt2(s, n, i);
}

US_API us_result us_tok_pretokenize(us_tokenizer *t, const char *text, size_t n, size_t *ends,
                                    size_t cap, size_t *n_pieces) {
    size_t i = 0, k = 0;
    while (i < n) {
        if (k >= cap) {
            us__errf(t->err, sizeof t->err, "us_tok_pretokenize: more than %lld pieces",
                     (long long)cap);
            return US_ERR_INVALID;
        }
        i = us__tok_piece(t, (const uint8_t *)text, n, i);
        ends[k++] = i;
    }
    *n_pieces = k;
    return US_OK;
}

/* ---- the tables: a token's bytes → its id, (left, right) → the merge */
static uint64_t us__tok_fnv(const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The model token whose bytes are p[n], or -1. */
static int32_t us__tok_find(const us_tokenizer *t, const void *p, size_t n) {
    uint64_t h = us__tok_fnv(p, n) & (uint64_t)(t->hash_cap - 1);
    for (;; h = (h + 1) & (uint64_t)(t->hash_cap - 1)) {
        int32_t id = t->hash[h];
        if (id < 0) return -1;
        if ((size_t)t->len[id] == n && !memcmp(t->pool + t->off[id], p, n)) return id;
    }
}

static const us__tok_merge *us__tok_merge_find(const us_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = (key * 0x9e3779b97f4a7c15ull) >> 20 & (uint64_t)(t->merge_cap - 1);
    for (;; h = (h + 1) & (uint64_t)(t->merge_cap - 1)) {
        const us__tok_merge *m = t->merges + h;
        if (m->key == key) return m;
        if (m->key == ~0ull) return NULL;
    }
}

/* ---- encoding */
typedef struct us__tok_sym {
    int32_t id, prev, next, len;
} us__tok_sym;

typedef struct us__tok_mg {
    uint32_t rank, pos;
    int32_t id;
} us__tok_mg;

typedef struct us__tok_enc {
    const us_tokenizer *t;
    int32_t *ids;
    size_t cap, n;
    uint8_t *buf;     /* [text + 1] a segment with its prefix space */
    us__tok_sym *sym; /* [text] a piece's symbols */
    us__tok_mg *heap; /* [3 · text] the merges waiting: the first pairs, then two per merge */
    size_t nheap;
} us__tok_enc;

static int us__tok_mg_less(const us__tok_mg *a, const us__tok_mg *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void us__tok_push(us__tok_enc *e, uint32_t pos, const us__tok_merge *m) {
    size_t i = e->nheap++;
    us__tok_mg x;
    x.rank = m->rank;
    x.pos = pos;
    x.id = m->id;
    while (i > 0 && us__tok_mg_less(&x, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = x;
}

static us__tok_mg us__tok_pop(us__tok_enc *e) {
    us__tok_mg top = e->heap[0], x = e->heap[--e->nheap];
    size_t i = 0, c;
    while ((c = 2 * i + 1) < e->nheap) {
        if (c + 1 < e->nheap && us__tok_mg_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!us__tok_mg_less(&e->heap[c], &x)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    e->heap[i] = x;
    return top;
}

/* One piece p[n] through BPE into e->ids. */
static void us__tok_bpe(us__tok_enc *e, const uint8_t *p, size_t n) {
    const us_tokenizer *t = e->t;
    us__tok_sym *y = e->sym;
    const us__tok_merge *m;
    int32_t i, id;
    if (t->ignore_merges && (id = us__tok_find(t, p, n)) >= 0) {
        e->ids[e->n++] = id;
        return;
    }
    e->nheap = 0;
    for (i = 0; i < (int32_t)n; i++) {
        y[i].id = t->byte_id[p[i]];
        y[i].prev = i - 1;
        y[i].next = i + 1 < (int32_t)n ? i + 1 : -1;
        y[i].len = 1;
        if (i > 0 && (m = us__tok_merge_find(t, y[i - 1].id, y[i].id)))
            us__tok_push(e, (uint32_t)(i - 1), m);
    }
    while (e->nheap) {
        us__tok_mg top = us__tok_pop(e);
        int32_t a = (int32_t)top.pos, b = y[a].next;
        if (y[a].len == 0 || b < 0) continue;
        m = us__tok_merge_find(t, y[a].id, y[b].id);
        if (!m || m->id != top.id) continue; /* a stale entry: a neighbour merged since */
        y[a].id = top.id;
        y[a].len += y[b].len;
        y[a].next = y[b].next;
        y[b].len = 0;
        if (y[b].next >= 0) y[y[b].next].prev = a;
        if (y[a].prev >= 0 && (m = us__tok_merge_find(t, y[y[a].prev].id, y[a].id)))
            us__tok_push(e, (uint32_t)y[a].prev, m);
        if (y[a].next >= 0 && (m = us__tok_merge_find(t, y[a].id, y[y[a].next].id)))
            us__tok_push(e, (uint32_t)a, m);
    }
    for (i = 0; i >= 0; i = y[i].next) e->ids[e->n++] = y[i].id;
}

/* A segment between added tokens: the prefix space, the pre-tokeniser, BPE. */
static void us__tok_segment(us__tok_enc *e, const uint8_t *s, size_t n) {
    size_t i = 0, j;
    if (!n) return;
    if (e->t->add_prefix_space && s[0] != ' ') {
        e->buf[0] = ' ';
        memcpy(e->buf + 1, s, n);
        s = e->buf;
        n++;
    }
    for (; i < n; i = j) {
        j = us__tok_piece(e->t, s, n, i);
        us__tok_bpe(e, s + i, j - i);
    }
}

/* The longest added token of the pass (normalized 0 / 1) at s[i], or -1. */
static int us__tok_added_at(const us_tokenizer *t, const uint8_t *s, size_t n, size_t i, int pass) {
    int k, best = -1;
    for (k = 0; k < t->n_added; k++) {
        const us__tok_added *a = t->added + k;
        if (a->normalized != pass || (uint8_t)a->content[0] != s[i] || a->n > n - i) continue;
        if ((best < 0 || a->n > t->added[best].n) && !memcmp(a->content, s + i, a->n)) best = k;
    }
    return best;
}

/* Step 1: the added tokens of one pass cut out of s[a, b) (tokenizers' find_matches); what lies
   between goes to the next pass, after the last to step 2. */
static void us__tok_split(us__tok_enc *e, const uint8_t *s, size_t a, size_t b, int pass) {
    const us_tokenizer *t = e->t;
    size_t from = a, i, start, stop, last;
    for (i = a; i < b; i++) {
        int k = us__tok_added_at(t, s, b, i, pass);
        const us__tok_added *ad;
        if (k < 0) continue;
        ad = t->added + k;
        start = i;
        stop = i + ad->n;
        if (ad->lstrip) {
            while (start > a) {
                size_t p = start - 1, q;
                while (p > a && (s[p] & 0xc0) == 0x80) p--; /* back to the character's start */
                if (!(us__tok_at(s, b, p, &q) & US__TK_S) || q != start) break;
                start = p;
            }
            if (start < from) start = from;
        }
        if (ad->rstrip) stop = us__tok_run(s, b, stop, US__TK_S, &last);
        if (from < start) {
            if (pass == 0)
                us__tok_split(e, s, from, start, 1);
            else
                us__tok_segment(e, s + from, start - from);
        }
        e->ids[e->n++] = ad->id;
        from = stop;
        i += ad->n - 1;
    }
    if (from < b) {
        if (pass == 0)
            us__tok_split(e, s, from, b, 1);
        else
            us__tok_segment(e, s + from, b - from);
    }
}

US_API us_result us_tok_encode(us_tokenizer *t, const char *text, size_t n, int32_t *ids,
                               size_t cap, size_t *n_ids) {
    us__tok_enc e;
    us_result r = US_OK;
    *n_ids = 0;
    if (!t->pool) {
        us__errf(t->err, sizeof t->err, "us_tok_encode: the tokenizer is not loaded");
        return US_ERR_INVALID;
    }
    if (cap < (t->add_prefix_space ? 2 * n + 1 : n)) {
        us__errf(t->err, sizeof t->err,
                 "us_tok_encode: %lld bytes need room for %lld ids, not %lld", (long long)n,
                 (long long)(t->add_prefix_space ? 2 * n + 1 : n), (long long)cap);
        return US_ERR_INVALID;
    }
    memset(&e, 0, sizeof e);
    e.t = t;
    e.ids = ids;
    e.cap = cap;
    e.buf = (uint8_t *)US_MALLOC(n + 2);
    e.sym = (us__tok_sym *)US_MALLOC((n + 1) * sizeof(us__tok_sym));
    e.heap = (us__tok_mg *)US_MALLOC((3 * n + 3) * sizeof(us__tok_mg));
    if (!e.buf || !e.sym || !e.heap) {
        us__errf(t->err, sizeof t->err, "out of memory encoding %lld bytes", (long long)n);
        r = US_ERR_OOM;
    } else
        us__tok_split(&e, (const uint8_t *)text, 0, n, 0);
    *n_ids = e.n;
    US_FREE(e.buf);
    US_FREE(e.sym);
    US_FREE(e.heap);
    return r;
}

/* ---- decoding */
/* Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD (EF BF BD).
   Writes what fits of out[cap] (out may be NULL) and returns the length. */
static size_t us__tok_lossy(const uint8_t *s, size_t n, char *out, size_t cap) {
    size_t i = 0, o = 0, k, need, good;
    while (i < n) {
        uint8_t c = s[i], lo = 0x80, hi = 0xbf;
        need = c < 0x80 ? 0 : c >= 0xc2 && c < 0xe0 ? 1 : c >= 0xe0 && c < 0xf0 ? 2 : 3;
        lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
        good = (c >= 0x80 && c < 0xc2) || c > 0xf4 ? 0 : 1; /* bytes of a valid prefix */
        for (k = 1; good && k <= need; k++, good++) {
            uint8_t b = i + k < n ? s[i + k] : 0;
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf)) break;
        }
        if (good == need + 1) {
            for (k = 0; k < good; k++, o++)
                if (out && o < cap) out[o] = (char)s[i + k];
        } else {
            for (k = 0; k < 3; k++, o++)
                if (out && o < cap) out[o] = (char)"\xef\xbf\xbd"[k];
        }
        i += good ? good : 1;
    }
    return o;
}

/* whether id is one of the tokenizer's tokens */
static int us__tok_known(const us_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->kind[id];
}

US_API us_result us_tok_decode(us_tokenizer *t, const int32_t *ids, size_t n, int flags, char *out,
                               size_t cap, size_t *len) {
    size_t i, raw = 0, o;
    char *buf;
    *len = 0;
    for (i = 0; i < n; i++) {
        if (!us__tok_known(t, ids[i])) {
            if (flags & US_TOK_SKIP_UNKNOWN) continue;
            us__errf(t->err, sizeof t->err, "token id %d is not in the tokenizer's %lld ids",
                     (int)ids[i], (long long)t->n_vocab);
            return US_ERR_INVALID;
        }
        if (!(flags & US_TOK_SKIP_SPECIAL) || !(t->kind[ids[i]] & US__TK_SPECIAL))
            raw += (size_t)t->len[ids[i]];
    }
    buf = (char *)US_MALLOC(raw + 1);
    if (!buf) {
        us__errf(t->err, sizeof t->err, "out of memory decoding %lld tokens", (long long)n);
        return US_ERR_OOM;
    }
    for (i = 0, o = 0; i < n; i++) {
        if (!us__tok_known(t, ids[i])) continue; /* only under US_TOK_SKIP_UNKNOWN */
        if ((flags & US_TOK_SKIP_SPECIAL) && (t->kind[ids[i]] & US__TK_SPECIAL)) continue;
        memcpy(buf + o, t->pool + t->off[ids[i]], (size_t)t->len[ids[i]]);
        o += (size_t)t->len[ids[i]];
    }
    *len = flags & US_TOK_LOSSY ? us__tok_lossy((const uint8_t *)buf, raw, out, cap) : raw;
    if (out && *len + 1 > cap) {
        US_FREE(buf);
        us__errf(t->err, sizeof t->err, "the text needs %lld bytes and a NUL; the buffer has %lld",
                 (long long)*len, (long long)cap);
        return US_ERR_INVALID;
    }
    if (out && !(flags & US_TOK_LOSSY)) memcpy(out, buf, raw);
    if (out) out[*len] = 0;
    US_FREE(buf);
    return US_OK;
}

/* ---- loading tokenizer.json (the JSON reader is the one of // >>checkpoint) */
/* A byte-level string (GPT-2's bytes_to_unicode: '!'..'~', '¡'..'¬', '®'..'ÿ' stand for
   themselves, the other 68 bytes in order for U+0100..U+0143) back into bytes, as the ByteLevel
   decoder does: a string with a character outside that alphabet stays as it is. */
static size_t us__tok_unbyte(const char *s, size_t n, char *out, int *whole) {
    size_t i = 0, j, o = 0;
    *whole = 1;
    while (i < n) {
        uint32_t cp = us__tok_utf8((const uint8_t *)s, n, i, &j);
        int b = -1;
        if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
            b = (int)cp;
        else if (cp >= 0x100 && cp < 0x100 + 68) {
            int k = (int)cp - 0x100, c;
            for (c = 0; c < 256; c++) /* the k-th byte that does not stand for itself */
                if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae) &&
                    k-- == 0)
                    break;
            b = c;
        }
        if (b < 0) {
            *whole = 0;
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (char)b;
        i = j;
    }
    return o;
}

static int us__tok_jnull(const us__json *j, int k) {
    return k < 0 || (j->t[k].type == US__J_LIT && j->s[j->t[k].start] == 'n');
}

/* 1 when token k is the string s */
static int us__tok_jis(const us__json *j, int k, const char *s) {
    char buf[256];
    return us__jstr(j, k, buf, sizeof buf) && !strcmp(buf, s);
}

/* the "type" of object k, or "" */
static const char *us__tok_jtype(const us__json *j, int k, char *buf, size_t cap) {
    if (!us__jstr(j, us__jget(j, k, "type"), buf, cap)) buf[0] = 0;
    return buf;
}

#define US__TOK_MAX_ID (1 << 24)

typedef struct us__tok_load {
    us_tokenizer *t;
    us__json j;
    char *tmp;   /* [json bytes + 1] a string unescaped */
    size_t used; /* of t->pool */
} us__tok_load;

#define US__TOK_FAIL(t, ...)                          \
    do {                                              \
        us__errf(t->err, sizeof t->err, __VA_ARGS__); \
        return US_ERR_FORMAT;                         \
    } while (0)

/* String token k unescaped into L->tmp (length *n); 0 if it is not a string or holds a NUL. */
static int us__tok_jtmp(us__tok_load *L, int k, size_t *n) {
    if (k < 0 || !us__jstr(&L->j, k, L->tmp, L->j.t[k].end - L->j.t[k].start + 1)) return 0;
    *n = strlen(L->tmp);
    return 1;
}

/* Token id's bytes: the string in L->tmp[n] through the ByteLevel decoder, into the pool; 1 when
   every character was in the byte-level alphabet. */
static int us__tok_set(us__tok_load *L, int32_t id, size_t n, int kind) {
    us_tokenizer *t = L->t;
    int whole;
    size_t m = us__tok_unbyte(L->tmp, n, t->pool + L->used, &whole);
    t->off[id] = (int64_t)L->used;
    t->len[id] = (int32_t)m;
    t->kind[id] |= (uint8_t)kind;
    L->used += m;
    if ((int)m > t->max_bytes) t->max_bytes = (int)m;
    return whole;
}

/* The largest id in model.vocab and added_tokens. */
static us_result us__tok_max_id(us__tok_load *L, int vocab, int added, int64_t *max_id) {
    const us__json *j = &L->j;
    int c, q;
    int64_t id;
    *max_id = -1;
    for (c = vocab + 1, q = 0; q < j->t[vocab].size; q++, c = j->t[c + 1].next) {
        if (!us__jint(j, c + 1, &id) || id < 0 || id >= US__TOK_MAX_ID)
            US__TOK_FAIL(L->t, "tokenizer.json: a vocabulary id is not an integer in [0, %d)",
                         US__TOK_MAX_ID);
        if (id > *max_id) *max_id = id;
    }
    for (c = added + 1, q = 0; added >= 0 && q < j->t[added].size; q++, c = j->t[c].next) {
        if (!us__jint(j, us__jget(j, c, "id"), &id) || id < 0 || id >= US__TOK_MAX_ID)
            US__TOK_FAIL(L->t, "tokenizer.json: added token %d has no id in [0, %d)", q,
                         US__TOK_MAX_ID);
        if (id > *max_id) *max_id = id;
    }
    return US_OK;
}

/* model.vocab: each token's bytes, and the hash of the model's tokens. */
static us_result us__tok_vocab(us__tok_load *L, int vocab) {
    us_tokenizer *t = L->t;
    const us__json *j = &L->j;
    int c, q;
    int64_t id;
    size_t n;
    for (t->hash_cap = 16; t->hash_cap < 2 * (int64_t)j->t[vocab].size; t->hash_cap *= 2) {
    }
    t->hash = (int32_t *)US_MALLOC((size_t)t->hash_cap * 4);
    if (!t->hash) US__TOK_FAIL(t, "out of memory for the vocabulary's hash");
    memset(t->hash, 0xff, (size_t)t->hash_cap * 4);
    for (c = vocab + 1, q = 0; q < j->t[vocab].size; q++, c = j->t[c + 1].next) {
        uint64_t h;
        us__jint(j, c + 1, &id);
        if (!us__tok_jtmp(L, c, &n) || !n)
            US__TOK_FAIL(t, "tokenizer.json: vocabulary entry %d is empty or holds a NUL", q);
        if (t->kind[id])
            US__TOK_FAIL(t, "tokenizer.json: two vocabulary entries have id %d", (int)id);
        if (!us__tok_set(L, (int32_t)id, n, US__TK_MODEL)) continue; /* BPE never makes it */
        if (us__tok_find(t, t->pool + t->off[id], (size_t)t->len[id]) >= 0)
            US__TOK_FAIL(t, "tokenizer.json: vocabulary entry \"%.60s\" (id %d) appears twice",
                         L->tmp, (int)id);
        h = us__tok_fnv(t->pool + t->off[id], (size_t)t->len[id]) & (uint64_t)(t->hash_cap - 1);
        while (t->hash[h] >= 0) h = (h + 1) & (uint64_t)(t->hash_cap - 1);
        t->hash[h] = (int32_t)id;
    }
    for (q = 0; q < 256; q++) {
        char b = (char)q;
        if ((t->byte_id[q] = us__tok_find(t, &b, 1)) < 0)
            US__TOK_FAIL(t,
                         "tokenizer.json: the vocabulary lacks the token of byte 0x%02x: a "
                         "byte-level BPE needs all 256",
                         q);
    }
    return US_OK;
}

/* One side of a merge: a model token by its byte-level string in L->tmp[n]. */
static int32_t us__tok_merge_side(us__tok_load *L, const char *s, size_t n) {
    char buf[1024];
    int whole;
    size_t m;
    if (n > sizeof buf) return -1;
    m = us__tok_unbyte(s, n, buf, &whole);
    return whole ? us__tok_find(L->t, buf, m) : -1;
}

/* model.merges: "a b" strings or [a, b] pairs; rank = position (a repeated pair keeps the last,
   as tokenizers' map does). */
static us_result us__tok_merges(us__tok_load *L, int merges) {
    us_tokenizer *t = L->t;
    const us__json *j = &L->j;
    int c, q;
    for (t->merge_cap = 16; t->merge_cap < 2 * (int64_t)j->t[merges].size; t->merge_cap *= 2) {
    }
    t->merges = (us__tok_merge *)US_MALLOC((size_t)t->merge_cap * sizeof(us__tok_merge));
    if (!t->merges) US__TOK_FAIL(t, "out of memory for the merges");
    memset(t->merges, 0xff, (size_t)t->merge_cap * sizeof(us__tok_merge));
    for (c = merges + 1, q = 0; q < j->t[merges].size; q++, c = j->t[c].next) {
        size_t n, na = 0, nb = 0;
        char *sp, both[2048];
        int ok;
        int32_t a, b, id;
        uint64_t key, h;
        ok = 0;
        if (j->t[c].type == US__J_ARR && j->t[c].size == 2 && us__tok_jtmp(L, c + 1, &na) &&
            na < 1024) {
            memcpy(both, L->tmp, na);
            ok = us__tok_jtmp(L, j->t[c + 1].next, &nb) && nb < 1024;
            if (ok) memcpy(both + na, L->tmp, nb);
        } else if (us__tok_jtmp(L, c, &n) && n < 2048 && (sp = strchr(L->tmp, ' ')) &&
                   !strchr(sp + 1, ' ')) {
            na = (size_t)(sp - L->tmp);
            nb = n - na - 1;
            memcpy(both, L->tmp, na);
            memcpy(both + na, sp + 1, nb);
            ok = 1;
        }
        if (!ok)
            US__TOK_FAIL(t, "tokenizer.json: merge %d is neither \"a b\" nor [\"a\", \"b\"]", q);
        a = us__tok_merge_side(L, both, na);
        b = a >= 0 ? us__tok_merge_side(L, both + na, nb) : -1;
        id = b >= 0 ? us__tok_merge_side(L, both, na + nb) : -1;
        if (id < 0)
            US__TOK_FAIL(t,
                         "tokenizer.json: merge %d joins or makes a token that is not in the "
                         "vocabulary",
                         q);
        key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        h = (key * 0x9e3779b97f4a7c15ull) >> 20 & (uint64_t)(t->merge_cap - 1);
        while (t->merges[h].key != ~0ull && t->merges[h].key != key)
            h = (h + 1) & (uint64_t)(t->merge_cap - 1);
        t->merges[h].key = key;
        t->merges[h].rank = (uint32_t)q;
        t->merges[h].id = id;
    }
    t->n_merges = j->t[merges].size;
    return US_OK;
}

/* added_tokens: their bytes for decoding and their content for step 1 of encoding. */
static us_result us__tok_added_load(us__tok_load *L, int added) {
    us_tokenizer *t = L->t;
    const us__json *j = &L->j;
    int c, q;
    if (added < 0) return US_OK;
    t->added = (us__tok_added *)US_MALLOC(sizeof(us__tok_added) * (size_t)(j->t[added].size + 1));
    if (!t->added) US__TOK_FAIL(t, "out of memory for the added tokens");
    for (c = added + 1, q = 0; q < j->t[added].size; q++, c = j->t[c].next) {
        us__tok_added *a = t->added + q;
        int sw = 0;
        int64_t id;
        size_t n;
        us__jint(j, us__jget(j, c, "id"), &id);
        if (!us__tok_jtmp(L, us__jget(j, c, "content"), &n) || !n)
            US__TOK_FAIL(t, "tokenizer.json: added token %d has no content", (int)id);
        if (!us__jbool(j, us__jget(j, c, "special"), &a->special) ||
            !us__jbool(j, us__jget(j, c, "lstrip"), &a->lstrip) ||
            !us__jbool(j, us__jget(j, c, "rstrip"), &a->rstrip) ||
            !us__jbool(j, us__jget(j, c, "normalized"), &a->normalized))
            US__TOK_FAIL(t,
                         "tokenizer.json: added token %d lacks one of special, lstrip, rstrip, "
                         "normalized",
                         (int)id);
        if (us__jbool(j, us__jget(j, c, "single_word"), &sw) && sw)
            US__TOK_FAIL(t,
                         "tokenizer.json: added token \"%.60s\" is single_word, which this reader "
                         "does not implement",
                         L->tmp);
        a->id = (int32_t)id;
        a->n = n;
        a->content = t->pool + L->used; /* raw, then the decoder's bytes after it */
        memcpy(a->content, L->tmp, n);
        L->used += n;
        if (t->kind[id] & US__TK_ADDED)
            US__TOK_FAIL(t, "tokenizer.json: two added tokens have id %d", (int)id);
        if (t->kind[id] & US__TK_MODEL) { /* then both must decode alike */
            int64_t off = t->off[id];
            int32_t len = t->len[id];
            us__tok_set(L, (int32_t)id, n, 0);
            if (len != t->len[id] || memcmp(t->pool + off, t->pool + t->off[id], (size_t)len))
                US__TOK_FAIL(t,
                             "tokenizer.json: added token \"%.60s\" has the id of another "
                             "token of the model",
                             a->content);
            t->off[id] = off;
        } else
            us__tok_set(L, (int32_t)id, n, 0);
        t->kind[id] |= (uint8_t)(US__TK_ADDED | (a->special ? US__TK_SPECIAL : 0));
        t->n_added++;
    }
    return US_OK;
}

/* One pre-tokeniser of the pipeline: ByteLevel (with GPT-2's regex, or none after Split) or Split
   with Llama 3's regex, isolated. */
static us_result us__tok_pre_one(us__tok_load *L, int k, int after_split) {
    static const char *gpt2 =
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    static const char *llama3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                "\\s+(?!\\S)|\\s+";
    us_tokenizer *t = L->t;
    const us__json *j = &L->j;
    char ty[64];
    int regex = 1, inv = 0, pat = us__jget(j, us__jget(j, k, "pattern"), "Regex");
    us__tok_jtype(j, k, ty, sizeof ty);
    if (!strcmp(ty, "ByteLevel")) {
        us__jbool(j, us__jget(j, k, "add_prefix_space"), &t->add_prefix_space);
        us__jbool(j, us__jget(j, k, "use_regex"), &regex);
        if (regex == after_split || (after_split && t->add_prefix_space))
            US__TOK_FAIL(t, "tokenizer.json: pre_tokenizer: ByteLevel%s",
                         after_split ? " after Split must have use_regex and add_prefix_space false"
                                     : " alone must use its regex");
        if (!after_split) t->pattern = US_TOK_GPT2;
        return US_OK;
    }
    if (strcmp(ty, "Split") || after_split)
        US__TOK_FAIL(t, "tokenizer.json: pre_tokenizer \"%s\" is not one this reader knows", ty);
    us__jbool(j, us__jget(j, k, "invert"), &inv);
    if (!us__tok_jis(j, us__jget(j, k, "behavior"), "Isolated") || inv)
        US__TOK_FAIL(t, "tokenizer.json: a Split pre_tokenizer must be Isolated, not inverted");
    if (us__tok_jis(j, pat, llama3))
        t->pattern = US_TOK_LLAMA3;
    else if (us__tok_jis(j, pat, gpt2))
        t->pattern = US_TOK_GPT2;
    else
        US__TOK_FAIL(t, "tokenizer.json: the Split pattern is neither GPT-2's nor Llama 3's regex: "
                        "this reader has a matcher for those two only");
    return US_OK;
}

/* pre_tokenizer: ByteLevel, or Sequence [ByteLevel] or [Split, ByteLevel] */
static us_result us__tok_pre(us__tok_load *L, int k) {
    const us__json *j = &L->j;
    char ty[64];
    int seq = us__jget(j, k, "pretokenizers"), n = 1, first = k;
    us_result r;
    if (us__tok_jnull(j, k))
        US__TOK_FAIL(L->t, "tokenizer.json has no pre_tokenizer: a byte-level BPE needs ByteLevel");
    if (!strcmp(us__tok_jtype(j, k, ty, sizeof ty), "Sequence")) {
        if (seq < 0 || j->t[seq].type != US__J_ARR || j->t[seq].size < 1 || j->t[seq].size > 2)
            n = 0;
        else {
            n = j->t[seq].size;
            first = seq + 1;
        }
    }
    us__tok_jtype(j, first, ty, sizeof ty);
    if (n == 2 && !strcmp(ty, "Split")) {
        if ((r = us__tok_pre_one(L, first, 0)) != US_OK) return r;
        return us__tok_pre_one(L, j->t[first].next, 1);
    }
    if (n != 1 || strcmp(ty, "ByteLevel"))
        US__TOK_FAIL(L->t,
                     "tokenizer.json: the pre_tokenizer must be ByteLevel or the Sequence [Split, "
                     "ByteLevel]; this reader knows no other");
    return us__tok_pre_one(L, first, 0);
}

/* normalizer, decoder, post_processor, truncation, padding: what encode and decode must honour */
static us_result us__tok_rest(us__tok_load *L, int root) {
    const us__json *j = &L->j;
    char ty[64];
    int post = us__jget(j, root, "post_processor"), dec = us__jget(j, root, "decoder"), c, q, n = 1;
    const char *key[3] = {"normalizer", "truncation", "padding"};
    for (q = 0; q < 3; q++)
        if (!us__tok_jnull(j, us__jget(j, root, key[q])))
            US__TOK_FAIL(L->t, "tokenizer.json sets a %s, which this reader does not apply",
                         key[q]);
    if (!us__tok_jnull(j, dec) && strcmp(us__tok_jtype(j, dec, ty, sizeof ty), "ByteLevel"))
        US__TOK_FAIL(L->t, "tokenizer.json: the decoder \"%s\" is not ByteLevel", ty);
    if (us__tok_jnull(j, dec))
        US__TOK_FAIL(L->t, "tokenizer.json has no decoder: a byte-level BPE needs ByteLevel");
    if (us__tok_jnull(j, post)) return US_OK;
    c = post;
    if (!strcmp(us__tok_jtype(j, post, ty, sizeof ty), "Sequence")) {
        int arr = us__jget(j, post, "processors");
        n = arr >= 0 && j->t[arr].type == US__J_ARR ? j->t[arr].size : 0;
        c = arr + 1;
    }
    for (q = 0; q < n; q++, c = j->t[c].next) {
        us__tok_jtype(j, c, ty, sizeof ty);
        if (strcmp(ty, "ByteLevel") && strcmp(ty, "TemplateProcessing"))
            US__TOK_FAIL(L->t,
                         "tokenizer.json: the post_processor \"%s\" is not ByteLevel or "
                         "TemplateProcessing",
                         ty);
    }
    return US_OK;
}

/* model: BPE without dropout, subword prefix or word suffix */
static us_result us__tok_model(us__tok_load *L, int model) {
    static const char *known[] = {"type",
                                  "dropout",
                                  "unk_token",
                                  "continuing_subword_prefix",
                                  "end_of_word_suffix",
                                  "fuse_unk",
                                  "byte_fallback",
                                  "ignore_merges",
                                  "vocab",
                                  "merges"};
    const us__json *j = &L->j;
    char buf[64];
    double dropout = 0;
    int c, q, k, vocab = us__jget(j, model, "vocab"), merges = us__jget(j, model, "merges");
    if (strcmp(us__tok_jtype(j, model, buf, sizeof buf), "BPE"))
        US__TOK_FAIL(L->t, "tokenizer.json: the model is \"%s\", not BPE", buf);
    for (c = model + 1, q = 0; q < j->t[model].size; q++, c = j->t[c + 1].next) {
        for (k = 0; k < 10 && !us__tok_jis(j, c, known[k]); k++) {
        }
        if (k == 10) {
            us__jstr(j, c, buf, sizeof buf);
            US__TOK_FAIL(L->t,
                         "tokenizer.json: the BPE model's field \"%s\" is not one this "
                         "reader knows",
                         buf);
        }
    }
    us__jnum(j, us__jget(j, model, "dropout"), &dropout);
    if (dropout != 0) US__TOK_FAIL(L->t, "tokenizer.json: BPE dropout is random: set it to null");
    for (q = 0; q < 2; q++) {
        int v = us__jget(j, model, q ? "end_of_word_suffix" : "continuing_subword_prefix");
        if (!us__tok_jnull(j, v) && !us__tok_jis(j, v, ""))
            US__TOK_FAIL(L->t, "tokenizer.json: a byte-level BPE has no %s",
                         q ? "end_of_word_suffix" : "continuing_subword_prefix");
    }
    us__jbool(j, us__jget(j, model, "ignore_merges"), &L->t->ignore_merges);
    if (vocab < 0 || j->t[vocab].type != US__J_OBJ || merges < 0 || j->t[merges].type != US__J_ARR)
        US__TOK_FAIL(L->t, "tokenizer.json: the BPE model needs a vocab object and a merges array");
    return US_OK;
}

/* The allocations: the pool (every string fits in the file's size), the per-id arrays. */
static us_result us__tok_alloc(us__tok_load *L, size_t n, int64_t n_vocab) {
    us_tokenizer *t = L->t;
    t->n_vocab = n_vocab;
    L->tmp = (char *)US_MALLOC(n + 1);
    t->pool = (char *)US_MALLOC(2 * n + 1);
    t->off = (int64_t *)US_MALLOC((size_t)n_vocab * 8);
    t->len = (int32_t *)US_MALLOC((size_t)n_vocab * 4);
    t->kind = (uint8_t *)US_MALLOC((size_t)n_vocab);
    if (!L->tmp || !t->pool || !t->off || !t->len || !t->kind)
        US__TOK_FAIL(t, "out of memory for a tokenizer of %lld ids", (long long)n_vocab);
    memset(t->kind, 0, (size_t)n_vocab);
    memset(t->len, 0, (size_t)n_vocab * 4);
    memset(t->off, 0, (size_t)n_vocab * 8);
    return US_OK;
}

static us_result us__tok_parse(us__tok_load *L, const char *json, size_t n) {
    static const char *known[] = {"version",        "truncation", "padding",
                                  "added_tokens",   "normalizer", "pre_tokenizer",
                                  "post_processor", "decoder",    "model"};
    us_tokenizer *t = L->t;
    const us__json *j = &L->j;
    int root = 0, c, q, k, model, added;
    int64_t max_id;
    us_result r;
    char key[64];
    if (us__json_parse(&L->j, json, n, (int)(n / 2 + 16)) != 0)
        US__TOK_FAIL(t, "tokenizer.json is not valid JSON: %s", L->j.err);
    if (j->t[root].type != US__J_OBJ) US__TOK_FAIL(t, "tokenizer.json is not a JSON object");
    for (c = root + 1, q = 0; q < j->t[root].size; q++, c = j->t[c + 1].next) {
        for (k = 0; k < 9 && !us__tok_jis(j, c, known[k]); k++) {
        }
        if (k == 9) {
            us__jstr(j, c, key, sizeof key);
            US__TOK_FAIL(t, "tokenizer.json has the field \"%s\", which this reader does not know",
                         key);
        }
    }
    model = us__jget(j, root, "model");
    added = us__jget(j, root, "added_tokens");
    if (!us__tok_jnull(j, added) && j->t[added].type != US__J_ARR)
        US__TOK_FAIL(t, "tokenizer.json: added_tokens is not an array");
    if (us__tok_jnull(j, added)) added = -1;
    if (model < 0) US__TOK_FAIL(t, "tokenizer.json has no model");
    if ((r = us__tok_model(L, model)) != US_OK) return r;
    if ((r = us__tok_pre(L, us__jget(j, root, "pre_tokenizer"))) != US_OK) return r;
    if ((r = us__tok_rest(L, root)) != US_OK) return r;
    if ((r = us__tok_max_id(L, us__jget(j, model, "vocab"), added, &max_id)) != US_OK) return r;
    if ((r = us__tok_alloc(L, n, max_id + 1)) != US_OK) return r;
    if ((r = us__tok_vocab(L, us__jget(j, model, "vocab"))) != US_OK) return r;
    if ((r = us__tok_merges(L, us__jget(j, model, "merges"))) != US_OK) return r;
    return us__tok_added_load(L, added);
}

US_API us_result us_tok_parse(us_tokenizer *t, const char *json, size_t n) {
    us__tok_load L;
    us_result r;
    memset(t, 0, sizeof *t);
    memset(&L, 0, sizeof L);
    L.t = t;
    r = us__tok_parse(&L, json, n);
    us__json_free(&L.j);
    US_FREE(L.tmp);
    if (r != US_OK) {
        char err[sizeof t->err];
        memcpy(err, t->err, sizeof err);
        us_tok_free(t);
        memcpy(t->err, err, sizeof err);
    }
    return r;
}

US_API us_result us_tok_load(us_tokenizer *t, const char *path) {
    unsigned char *buf;
    int64_t len;
    us_result r;
    memset(t, 0, sizeof *t);
    r = us__read_file(path, &buf, &len, t->err, sizeof t->err);
    if (r != US_OK) return r;
    r = us_tok_parse(t, (const char *)buf, (size_t)len);
    if (r != US_OK) {
        char err[sizeof t->err];
        memcpy(err, t->err, sizeof err);
        us__errf(t->err, sizeof t->err, "%s: %s", path, err);
    }
    US_FREE(buf);
    return r;
}

US_API void us_tok_free(us_tokenizer *t) {
    US_FREE(t->pool);
    US_FREE(t->off);
    US_FREE(t->len);
    US_FREE(t->kind);
    US_FREE(t->hash);
    US_FREE(t->merges);
    US_FREE(t->added);
    memset(t, 0, sizeof *t);
}
#endif /* ULTRASCALE_NO_TOKENIZER */

/* ------------------------------------------------------------------------------------ */
// >>estimate  memory estimator and FLOPs (the Playbook's formulas)
/* ------------------------------------------------------------------------------------ */
/* Parameters, gradients and optimizer state (Playbook "memory usage in transformers"):
     fp32:  4Ψ weights + 4Ψ grads + 8Ψ Adam (m, v)                   = 16Ψ
     bf16:  2Ψ weights + 4Ψ fp32 grads + 4Ψ fp32 master + 8Ψ Adam    = 18Ψ
   and with ZeRO over N_d = dp ranks (Playbook "ZeRO"), per rank, k = 4 (fp32 master) + 8 (Adam):
     ZeRO-1:  2Ψ + 4Ψ + kΨ/N_d          optimizer state (and master) sharded
     ZeRO-2:  2Ψ + (4Ψ + kΨ)/N_d        + gradients
     ZeRO-3:  (2Ψ + 4Ψ + kΨ)/N_d        + weights
   where Ψ counts the flat buffers as laid out (each unit padded to a multiple of 16·N_d so it
   splits evenly), plus the transient slots ZeRO-2/3 need: 2 (3 with tied embeddings) units'
   full gradients and, under ZeRO-3, as many units' gathered weights (a unit is a layer).
   Activations: with flash attention no s² term is stored, so per layer the kept tensors are
   linear in s·b: x, ln1, q/k/v, attention output, xmid, ln2, gate|up, h (+ fp32 rstd and lse);
   selective drops the non-GEMM ones, full keeps only x; one layer's worth is then scratch. */

static us_result us__memory_estimate(const us_model_config *mc_in, const us_train_config *tc_in,
                                     us_memory *out, int *peak_io, char *err, size_t errlen);

/* the "VmHWM:  123456 kB" line of /proc/self/status (the high-water mark of the resident set) */
US_API size_t us_peak_rss_bytes(void) {
    char line[256];
    size_t kb = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long v;
        if (sscanf(line, "VmHWM: %llu kB", &v) == 1) {
            kb = (size_t)v;
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

US_API us_result us_memory_estimate(const us_model_config *mc_in, const us_train_config *tc_in,
                                    us_memory *out, char *err, size_t errlen) {
    return us__memory_estimate(mc_in, tc_in, out, NULL, err, errlen);
}

/* One rank's share of the model, as the estimator's formulas use it. */
typedef struct us__est_dims {
    int64_t N;     /* tokens of one micro-batch on this rank: B·T/cp */
    int64_t C;     /* model dim */
    int64_t HS;    /* head size */
    int64_t QKV;   /* q, k, v columns on this tp rank: (NH/tp + 2·NKV/tp)·HS, NKV/tp at least 1 */
    int64_t AO;    /* attention output columns on this tp rank: NH/tp·HS */
    int64_t F;     /* FFN columns on this tp rank: F/tp */
    size_t a;      /* bytes of a weight or activation element: 4 under fp32, else 2 */
    int n_moe;     /* MoE layers this rank holds (the first pipeline rank's) */
    int n_moe_all; /* MoE layers of the whole model */
} us__est_dims;

/* The flat buffers as the model lays them out, for the ZeRO ladder. */
typedef struct us__est_flat {
    int64_t psi;     /* Ψ: elements of an unsharded flat buffer, padding included */
    int64_t shard;   /* elements of this rank's ZeRO shard (psi without ZeRO) */
    int64_t unit;    /* elements of one ZeRO-2/3 staging or gather slot (the largest unit) */
    int slots;       /* ZeRO-2/3 gradient slots */
    int rank_layers; /* layers this rank holds (the first pipeline rank's) */
} us__est_flat;

/* One layer's activation tensors on one rank, bytes, each rounded up to the arena alignment.
   Sequence parallelism keeps the residual stream and the norms at Ns = Nf/tp rows, the Playbook's
   "activations / tp" for the parts TP alone leaves whole; Nf is N padded to a multiple of tp. */
typedef struct us__est_acts {
    int64_t Nf, Ns;
    int sp;     /* sequence parallelism is on (sp with tp > 1) */
    size_t x;   /* [Ns, C] the residual stream; also ln1, ln2, xmid */
    size_t rs;  /* [Ns] fp32 RMSNorm statistics */
    size_t qkv; /* [Nf, QKV] */
    size_t att; /* [Nf, AO] the attention output */
    size_t lse; /* [N, NH/tp] fp32 log-sum-exp of the attention rows */
    size_t gu;  /* [Nf, 2·F/tp] gate | up */
    size_t h;   /* [Nf, F/tp] SwiGLU's output */
    size_t xf;  /* [Nf, C] a whole-sequence row block */
    size_t rf;  /* [Nf] fp32 per row */
} us__est_acts;

/* Pipeline parallelism: the schedule the first rank runs, and the most micro-batch chunks it
   holds at once (the simulator's peak; peak_io caches it across calls with the same shape). */
static us_result us__estimate_pp_peak(const us_train_config *tc, us_pp_schedule *ps, int *peak_io,
                                      int *peak, char *err, size_t errlen) {
    us_pp_sim sim;
    us_result r;
    if (us_pp_schedule_build(ps, (us_pp_kind)tc->pp_schedule, tc->pp, tc->grad_accum, tc->pp_chunks,
                             err, errlen) != US_OK)
        return US_ERR_INVALID;
    if (peak_io && *peak_io > 0) {
        *peak = *peak_io;
        return US_OK;
    }
    r = us_pp_simulate(ps, 1, 2, 0, &sim, err, errlen);
    if (r != US_OK) {
        us_pp_schedule_free(ps);
        return r;
    }
    *peak = sim.peak_act[0];
    if (peak_io) *peak_io = *peak;
    return US_OK;
}

/* Ψ as laid out: the same cut into units the model makes (us__plan_units), on a model that holds
   only its parameter table (no allocation of weights); under pipeline parallelism the first
   rank's (its chunks' layers and the embedding). */
static us_result us__estimate_flat(const us_model_config *mc, const us_train_config *tc,
                                   const us_pp_schedule *psp, us__est_flat *f, char *err,
                                   size_t errlen) {
    us_model tmp;
    us__dist_sizes z;
    int largest, l, nt = 3;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = *mc;
    tmp.tc = *tc;
    tmp.n_layers_global = mc->n_layers;
    tmp.params_unnamed = 1; /* sizes are all the estimate needs: the names' formatting was most of
                               the planner's time */
    tmp.cfg.n_layers = f->rank_layers = us__pp_rank_layers(mc, tc, psp, 0, NULL, tmp.chunk_lo,
                                                           tmp.chunk_hi, &largest); /* // >>pp */
    tmp.pp_v = psp ? psp->v : 1;
    tmp.pp_first = 1;
    /* the V shapes end on rank 0, and so does DualPipe's pipeline fed at rank pp−1 */
    tmp.pp_last = !psp || us__pp_rank_of(psp, tc->pp * psp->v - 1) == 0;
    for (l = 0; l < mc->n_layers; l++) nt += us__layer_tensors(mc, us__ep_size(tc), l);
    tmp.params = (us_param *)US_MALLOC(sizeof(us_param) * (size_t)nt);
    tmp.layer_g = (int *)US_MALLOC(sizeof(int) * (size_t)mc->n_layers);
    tmp.layer_p = (int *)US_MALLOC(sizeof(int) * (size_t)(mc->n_layers + 1));
    if (tmp.params && tmp.layer_g && tmp.layer_p) {
        for (l = 0; l < mc->n_layers; l++)
            tmp.layer_g[l] = l; /* the MoE layers, and names: sizes do not depend on them */
        us__tp_init(&tmp);
        us__build_params(&tmp);
        tmp.n_units = us__plan_units(&tmp, NULL);
        tmp.units = (us__unit *)US_MALLOC(sizeof(us__unit) * (size_t)tmp.n_units);
    }
    if (!tmp.params || !tmp.layer_g || !tmp.layer_p || !tmp.units) {
        US_FREE(tmp.params);
        US_FREE(tmp.layer_g);
        US_FREE(tmp.layer_p);
        us__errf(err, errlen, "out of host memory");
        return US_ERR_OOM;
    }
    us__plan_units(&tmp, tmp.units);
    us__dist_sizes_of(&tmp, &z);
    f->psi = z.n_flat;
    f->shard = z.shard_n;
    f->unit = z.slot_n;
    f->slots = z.n_gslots;
    US_FREE(tmp.params);
    US_FREE(tmp.units);
    US_FREE(tmp.layer_g);
    US_FREE(tmp.layer_p);
    return US_OK;
}

/* The model states by the ZeRO ladder: weights (2Ψ, sharded by ZeRO-3, which adds the gathered
   units' slots), fp32 master (4Ψ, sharded from ZeRO-1), fp32 gradients (4Ψ, sharded from ZeRO-2,
   plus the slots) and AdamW's m and v (8Ψ, sharded from ZeRO-1). */
static void us__estimate_states(const us_model_config *mc, const us_train_config *tc,
                                const us__est_dims *d, const us__est_flat *f, us_memory *out) {
    const int Z = tc->zero;
    const size_t a = d->a;
    /* + the fp32 router biases of the MoE layers, under pp the statistics' buffer (// >>moe) */
    out->params =
        (size_t)(Z == 3 ? f->shard + f->slots * f->unit : f->psi) * a +
        (size_t)d->n_moe * (size_t)mc->moe_experts * 4 +
        (tc->pp > 1 && d->n_moe_all ? ((size_t)d->n_moe_all * (size_t)mc->moe_experts + 4) * 8 : 0);
    if (us__fp8_wcache_on(tc)) { /* the FP8 weight cache (// >>fp8-linear) */
        size_t woff[4][4];
        int64_t wdim[4][2];
        out->params +=
            us__fp8_wcache_layer(d->C, d->QKV, d->AO, d->F, us__fp8_min_dim(tc), woff, wdim) *
            (size_t)f->rank_layers;
    }
    out->master = a == 4 ? 0 : (size_t)(Z ? f->shard : f->psi) * 4;
    out->grads = (size_t)(Z >= 2 ? f->shard + f->slots * f->unit : f->psi) * 4;
    out->optimizer = (size_t)(Z ? f->shard : f->psi) * 8;
}

/* The sizes of one layer's activation tensors on this rank (us__est_acts). */
static void us__estimate_act_sizes(const us_model_config *mc, const us_train_config *tc,
                                   const us__est_dims *d, us__est_acts *s) {
    const int64_t N = d->N, C = d->C, F = d->F;
    const size_t a = d->a;
    int64_t Nf, Ns;
    s->sp = tc->sp && tc->tp > 1;
    s->Nf = Nf = s->sp ? (N + tc->tp - 1) / tc->tp * tc->tp : N;
    s->Ns = Ns = s->sp ? Nf / tc->tp : N;
    s->x = us__align(Ns * C * a);
    s->rs = us__align(Ns * 4);
    s->qkv = us__align(Nf * d->QKV * a);
    s->att = us__align(Nf * d->AO * a);
    s->lse = us__align(N * (mc->n_heads / tc->tp) * 4);
    s->gu = us__align(Nf * 2 * F * a);
    s->h = us__align(Nf * F * a);
    s->xf = us__align(Nf * C * a);
    s->rf = us__align(Nf * 4);
}

/* What a (pipeline) slot holds besides its layers: the chunk's output and input gradient, the
   norm statistics, losses, argmax, inputs, targets, the scalars for the all-reduces; on the rank
   of the head (the first rank without pp, or under a V) the final norm's output, the logits and
   the vocabulary-parallel loss's row statistics. */
static size_t us__estimate_head(const us_model_config *mc, const us_train_config *tc,
                                const us_pp_schedule *psp, const us__est_acts *s) {
    const int head0 = !psp || us__pp_rank_of(psp, tc->pp * psp->v - 1) == 0;
    const int64_t Nf = s->Nf;
    return s->x + s->xf /* residual gradient */ + s->rs + 4 * s->rf + us__align(64) +
           (head0 ? s->xf + us__align(us__logits_bytes(mc, tc, Nf)) +
                        (tc->tp > 1 ? us__align(Nf * 20 + 8) : 0)
                  : 0);
}

/* The scratch of one action, shared by the slots: the backward's gradients, SP's whole-sequence
   buffer and a norm weight's partial gradient, FP8's quantised operands, context parallelism's
   positions, K/V blocks in flight (2 for the ring, cp for the all-gather) and their fp32
   gradients, the online-softmax state, dQ, a cast buffer. */
static size_t us__estimate_scratch(const us_model_config *mc, const us_train_config *tc,
                                   const us__est_dims *d, const us__est_acts *s) {
    const int64_t N = d->N, C = d->C, HS = d->HS, AO = d->AO;
    const size_t a = d->a;
    size_t bwd =
        s->xf /* norm grad */ + s->att + s->qkv + s->h + (s->sp ? s->xf + us__align(C * 4) : 0);
    /* the quantised GEMM operands (// >>fp8-linear) */
    if (tc->precision == US_PRECISION_FP8 || tc->precision == US_PRECISION_FP8_TENSOR) {
        size_t off[5];
        int64_t Rx = mc->moe_experts ? us__moe_rx(mc, tc, N) : 0; /* the experts' (// >>moe) */
        bwd += us__fp8_scratch(s->Nf, C, d->QKV, AO, d->F, Rx, mc->moe_ffn_dim, us__fp8_min_dim(tc),
                               off);
    }
    if (tc->cp > 1) {
        int64_t KVW = (int64_t)2 * us__tp_kv_heads(mc->n_kv_heads, tc->tp) * HS,
                nb = tc->cp_mode == US_CP_ALLGATHER ? tc->cp : 2;
        bwd += us__align((size_t)tc->cp * (tc->seq / tc->cp) * 4) + us__align(nb * N * KVW * a) +
               us__align(nb * N * KVW * 4) + 2 * us__align(N * AO * 4) +
               2 * us__align(N * (mc->n_heads / tc->tp) * 4) +
               us__align(N * (AO > KVW ? AO : KVW) * a);
    }
    return bwd;
}

/* The first pipeline rank's activations: per micro-batch chunk it holds at once (peak), a slot
   of its largest chunk's layers, the recompute modes' shared layer, and the head's part; then the
   scratch the slots share (bwd, and a MoE layer's backward scratch). A slot's place j holds what
   the j-th layer of any of the rank's chunks needs, dense or MoE (us__layout_layers); with B and
   W apart each layer keeps its output gradients for W. */
static size_t us__estimate_pp_acts(const us_model_config *mc, const us_train_config *tc,
                                   const us__est_dims *d, const us_pp_schedule *psp, int peak,
                                   const us__est_acts *s, size_t head, size_t bwd) {
    int keep_gemm = tc->recompute != US_RECOMPUTE_FULL,
        keep_cheap = tc->recompute == US_RECOMPUTE_NONE;
    int lo[16], hi[16], largest, n, i, j, c, wsplit = 0, nm = 0, any_dense = 0;
    int *lg = (int *)US_MALLOC(sizeof(int) * (size_t)mc->n_layers);
    size_t moe_gemm = 0, moe_cheap = 0, moe_scr = 0, slot = 0;
    size_t attn_cheap = 2 * s->x + 2 * s->rs + s->att + s->lse;
    if (!lg) return 0;
    n = us__pp_rank_layers(mc, tc, psp, 0, lg, lo, hi, &largest);
    for (i = 0; i < n; i++) {
        nm += us__is_moe(mc, lg[i]);
        any_dense |= !us__is_moe(mc, lg[i]);
    }
    for (i = 0; i < psp->n[0]; i++) wsplit |= psp->a[0][i].op == US_PP_W;
    if (nm) us__moe_bytes(mc, tc, nm, d->N, d->a, &moe_gemm, &moe_cheap, &moe_scr);
    if (!keep_cheap) slot += attn_cheap + (any_dense ? s->h : 0) + moe_cheap;
    if (!keep_gemm) slot += s->qkv + s->x + (any_dense ? s->gu : 0) + moe_gemm;
    for (j = 0; j < largest; j++) {
        int moe = 0, dense = 0;
        for (c = 0; c < psp->v; c++)
            if (lo[c] + j < hi[c]) {
                moe |= us__is_moe(mc, lg[lo[c] + j]);
                dense |= !us__is_moe(mc, lg[lo[c] + j]);
            }
        slot += s->x;
        if (keep_gemm) slot += s->qkv + s->x + (dense ? s->gu : 0) + (moe ? moe_gemm : 0);
        if (keep_cheap) slot += attn_cheap + (dense ? s->h : 0) + (moe ? moe_cheap : 0);
        if (wsplit)
            slot += 2 * s->xf + s->qkv + s->gu + (moe ? us__moe_w_bytes(mc, tc, d->N, d->a) : 0);
        /* and under ZeRO-2/3 the norms' weight gradients, from B to W (us__w_norm) */
        if (wsplit && tc->zero >= 2) slot += 2 * us__align((size_t)d->C * 4);
    }
    US_FREE(lg);
    return (slot + head) * (size_t)peak + bwd + moe_scr;
}

/* Activations (flash attention: no s² term): per layer the tensors the backward needs — all of
   them without recomputation, the GEMM outputs under selective, only the input x under full,
   whose one layer's worth of the rest is then shared scratch — times the layers this rank holds,
   plus the head's slot and the backward's scratch. Under pipeline parallelism every micro-batch
   chunk the first rank holds at once (peak) has its own layers and slot. */
static size_t us__estimate_activations(const us_model_config *mc, const us_train_config *tc,
                                       const us__est_dims *d, const us_pp_schedule *psp, int peak) {
    const int mode = tc->recompute, n_moe = d->n_moe;
    int64_t L = mc->n_layers;
    us__est_acts s;
    size_t gemm_outs, cheap, attn_cheap, per_layer, shared, head, bwd;
    size_t moe_gemm = 0, moe_cheap = 0, moe_scr = 0;
    us__estimate_act_sizes(mc, tc, d, &s);
    gemm_outs = s.qkv + s.x /* xmid */ + s.gu;
    attn_cheap = 2 * s.x /* ln1, ln2 */ + 2 * s.rs + s.att + s.lse;
    cheap = attn_cheap + s.h;
    per_layer =
        s.x + (mode != US_RECOMPUTE_FULL ? gemm_outs : 0) + (mode == US_RECOMPUTE_NONE ? cheap : 0);
    shared = (mode != US_RECOMPUTE_NONE ? cheap : 0) + (mode == US_RECOMPUTE_FULL ? gemm_outs : 0);
    if (n_moe) {
        /* MoE layers (// >>moe; one rank, no pp) keep router, permutation and expert tensors
           instead of gu, h */
        us__moe_bytes(mc, tc, n_moe, d->N, d->a, &moe_gemm, &moe_cheap, &moe_scr);
        shared = (mode != US_RECOMPUTE_NONE ? attn_cheap + (n_moe < L ? s.h : 0) + moe_cheap : 0) +
                 (mode == US_RECOMPUTE_FULL ? s.qkv + s.x + (n_moe < L ? s.gu : 0) + moe_gemm : 0);
    }
    head = us__estimate_head(mc, tc, psp, &s);
    bwd = us__estimate_scratch(mc, tc, d, &s);
    if (psp) return us__estimate_pp_acts(mc, tc, d, psp, peak, &s, head, bwd);
    if (n_moe) {
        size_t moe_layer = s.x + (mode != US_RECOMPUTE_FULL ? s.qkv + s.x + moe_gemm : 0) +
                           (mode == US_RECOMPUTE_NONE ? attn_cheap + moe_cheap : 0);
        return (size_t)(L - n_moe) * per_layer + (size_t)n_moe * moe_layer + shared + head + bwd +
               moe_scr;
    }
    return (size_t)L * per_layer + shared + head + bwd;
}

/* peak_io (the planner's cache): if > 0, the first pipeline rank's peak of held micro-batch chunks,
   known from an earlier call with the same schedule, pp, micro-batches and chunks; if 0, set here */
static us_result us__memory_estimate(const us_model_config *mc_in, const us_train_config *tc_in,
                                     us_memory *out, int *peak_io, char *err, size_t errlen) {
    us_model_config mc = *mc_in;
    us_train_config tc = *tc_in;
    us_result r = us_config_validate(&mc, &tc, err, errlen);
    us_pp_schedule ps, *psp = NULL;
    us__est_dims d;
    us__est_flat f;
    int peak = 1, l;
    if (r != US_OK) return r;
    if (tc.pp > 1) {
        /* the first pipeline rank: its stages, and the activations its schedule holds */
        if ((r = us__estimate_pp_peak(&tc, &ps, peak_io, &peak, err, errlen)) != US_OK) return r;
        psp = &ps;
    }
    if ((r = us__estimate_flat(&mc, &tc, psp, &f, err, errlen)) != US_OK) {
        if (psp) us_pp_schedule_free(psp);
        return r;
    }
    /* tensor parallelism: each rank holds its heads, FFN columns and vocabulary rows */
    d.N = (int64_t)tc.batch * (tc.seq / tc.cp);
    d.C = mc.dim;
    d.HS = d.C / mc.n_heads;
    d.F = mc.ffn_dim / tc.tp;
    d.QKV = (int64_t)(mc.n_heads / tc.tp + 2 * us__tp_kv_heads(mc.n_kv_heads, tc.tp)) * d.HS;
    d.AO = (int64_t)mc.n_heads / tc.tp * d.HS;
    d.a = (size_t)us__act_bytes(&tc);
    for (l = 0, d.n_moe_all = 0; l < mc.n_layers; l++) d.n_moe_all += us__is_moe(&mc, l);
    d.n_moe = d.n_moe_all;
    if (psp) { /* the first pipeline rank's MoE layers */
        int *lg = (int *)US_MALLOC(sizeof(int) * (size_t)mc.n_layers), n, largest;
        if (!lg) {
            us_pp_schedule_free(psp);
            us__errf(err, errlen, "out of host memory");
            return US_ERR_OOM;
        }
        n = us__pp_rank_layers(&mc, &tc, psp, 0, lg, NULL, NULL, &largest);
        for (l = 0, d.n_moe = 0; l < n; l++) d.n_moe += us__is_moe(&mc, lg[l]);
        US_FREE(lg);
    }
    memset(out, 0, sizeof *out);
    us__estimate_states(&mc, &tc, &d, &f, out);
    out->activations = us__estimate_activations(&mc, &tc, &d, psp, peak);
    if (psp) us_pp_schedule_free(psp);
    out->total = out->params + out->master + out->grads + out->optimizer + out->activations;
    return US_OK;
}

US_API double us_playbook_activation_bytes_per_layer(int64_t seq, int64_t batch, int64_t dim,
                                                     int64_t heads) {
    return (double)seq * batch * dim * (34.0 + 5.0 * (double)heads * seq / (double)dim);
}

US_API double us_flops_per_token(const us_model_config *mc_in, int64_t seq) {
    us_model_config c = *mc_in, *mc = &c;
    us_model_config_defaults(mc);
    return 6.0 * (double)us_param_count_active(mc) +
           12.0 * mc->n_layers * (double)mc->dim * (double)seq;
}

#ifndef ULTRASCALE_NO_PLANNER
/* ------------------------------------------------------------------------------------ */
// >>plan  the planner: every valid configuration, ranked by a cost model (Playbook A3)
/* ------------------------------------------------------------------------------------ */
/* The Playbook's recipe (chapter "Finding the best training configuration"): first fit the model
   in memory, then reach the target global batch, then maximise throughput. Here all three are
   one search. Step 1 is us_memory_estimate; step 2 fixes dp·micro-batch·grad-accum = global
   sequences; step 3 is the cost model below, one term per idea of the book:
     compute     FLOPs over measured rates: GEMMs 6·N_active per token (2 forward, 2 input
                 gradient B, 2 weight gradient W), causal attention 2·T·C per token and layer
                 forward and 2.5× that backward, elementwise ops (norms, RoPE, SwiGLU, residual,
                 cross-entropy) as bytes over the HBM rate; TP divides all of it by tp, SP also
                 the norms and the residual stream
     recompute   selective repeats the attention core and the elementwise forward in the
                 backward; full repeats the whole layer forward (with its TP collectives)
     TP          2 all-reduces of the activations (N·C) per layer forward and 2 backward (under SP
                 an all-gather and a reduce-scatter each, the same bytes): on the critical path
                 (A3: TP communication is not overlapped unless the implementation does so)
     CP          the ring passes K/V cp−1 times per layer (K/V and their gradients backward),
                 each step overlapping one block's attention: exposed only beyond it (A3)
     EP          dispatch and combine all-to-alls of N·K·C per MoE layer, twice forward and
                 twice backward, exposed
     PP          the per-micro-batch costs go to the schedule simulator (us_pp_simulate) with
                 the slowest stage's costs: the bubble is the makespan minus one rank's work
                 ((p−1)/m of the work for 1F1B, the simulator's number for every schedule); the
                 activation messages of the fill and the drain are exposed
     DP          the gradient reduction (fp32, over dp·cp) overlaps the last micro-batch's
                 backward bucket by bucket (A3: hidden when t_compute ≥ t_comm; the last
                 bucket never is); ZeRO-1 reduce-scatters instead and all-gathers the bf16
                 weights after the update (exposed); ZeRO-2 reduce-scatters every micro-batch;
                 ZeRO-3 gathers each layer's weights forward and backward, prefetched under the
                 previous layer's compute (A3: exposed only where the gather outlasts it)
     overlap     hidden is not free: NCCL's kernels take SMs and HBM from the compute they hide
                 under. overlap_tax × the hidden collectives' time at the node's rate (measured
                 on 2 H200s: a layer's backward lost about the whole time of the all-reduce
                 under it); without this term the planner ranked ZeRO-3 first on 2 GPUs and
                 measured it third (bench/RESULTS.md)
     optimizer   AdamW reads and writes 30 bytes per parameter of the rank's shard
   Collectives cost latency + f·bytes/busbw, f = 2(n−1)/n for all-reduce, (n−1)/n for all-gather,
   reduce-scatter and all-to-all, 1 for a message: NCCL's bus bandwidth convention, so a
   measured busbw plugs in as it is. Ranks are laid out tp fastest, then cp, pp, dp
   (us_mesh_init): a group runs at the node's rate when its span fits in a node. */
US_API void us_plan_rates_defaults(us_plan_rates *r) {
    if (r->gemm_tflops == 0) r->gemm_tflops = 736;
    if (r->attn_fwd_tflops == 0) r->attn_fwd_tflops = 228;
    if (r->attn_bwd_tflops == 0) r->attn_bwd_tflops = 180;
    if (r->hbm_gbps == 0) r->hbm_gbps = 3500;
    if (r->intra_gbps == 0) r->intra_gbps = 333;
    if (r->inter_gbps == 0) r->inter_gbps = 45;
    if (r->latency_us == 0) r->latency_us = 15;
    if (r->peak_tflops == 0) r->peak_tflops = 989;
    if (r->cp_attn_eff == 0) r->cp_attn_eff = 0.86;
    if (r->overlap_tax == 0) r->overlap_tax = 1;
    if (r->gemm_m_half == 0) r->gemm_m_half = 256;
}

US_API void us_plan_cluster_defaults(us_plan_cluster *c) {
    if (c->gpus_per_node == 0) c->gpus_per_node = 8;
    if (c->nodes == 0) c->nodes = 1;
    if (c->gpu_mem_gib == 0) c->gpu_mem_gib = 80;
    if (c->reserve_gib == 0) c->reserve_gib = 3;
    us_plan_rates_defaults(&c->rates);
}

US_API void us_plan_request_defaults(us_plan_request *q) {
    if (q->global_tokens == 0) q->global_tokens = (int64_t)1 << 20;
    if (q->seq == 0) q->seq = 4096;
    if (q->max_micro_batch == 0) q->max_micro_batch = 64;
    if (q->top == 0) q->top = 10;
}

/* the rates file's keys, in the struct's order */
static const char *const us__rate_keys[] = {
    "gemm_tflops", "attn_fwd_tflops", "attn_bwd_tflops", "hbm_gbps",    "intra_gbps", "inter_gbps",
    "latency_us",  "peak_tflops",     "cp_attn_eff",     "gemm_m_half", "overlap_tax"};
#define US__NRATES 11

static double *us__rate_field(us_plan_rates *r, int i) {
    double *f[US__NRATES];
    f[0] = &r->gemm_tflops;
    f[1] = &r->attn_fwd_tflops;
    f[2] = &r->attn_bwd_tflops;
    f[3] = &r->hbm_gbps;
    f[4] = &r->intra_gbps;
    f[5] = &r->inter_gbps;
    f[6] = &r->latency_us;
    f[7] = &r->peak_tflops;
    f[8] = &r->cp_attn_eff;
    f[9] = &r->gemm_m_half;
    f[10] = &r->overlap_tax;
    return f[i];
}

static us_result us__plan_check_rates(const us_plan_rates *r, char *err, size_t errlen) {
    int i;
    for (i = 0; i < US__NRATES; i++) {
        double v = *us__rate_field((us_plan_rates *)r, i);
        if (!(v > 0) || !isfinite(v)) {
            us__errf(err, errlen, "rate %s=%g must be a positive number", us__rate_keys[i], v);
            return US_ERR_INVALID;
        }
    }
    return US_OK;
}

US_API us_result us_plan_rates_read(const char *path, us_plan_rates *r, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    char line[512];
    int ln = 0;
    us_plan_rates tmp = *r;
    if (!f) {
        us__errf(err, errlen, "cannot open rates file %s", path);
        return US_ERR_IO;
    }
    while (fgets(line, sizeof line, f)) {
        char *p = line, *eq, *end, *k, *ke;
        int i;
        double v;
        ln++;
        if (strchr(line, '#')) *strchr(line, '#') = 0;
        while (*p == ' ' || *p == '\t') p++;
        for (end = p + strlen(p);
             end > p && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t');)
            *--end = 0;
        if (ln == 1) {
            if (strcmp(p, "ultrascale-rates 1")) {
                fclose(f);
                us__errf(err, errlen,
                         "%s is not a rates file: its first line must be \"ultrascale-rates 1\"",
                         path);
                return US_ERR_FORMAT;
            }
            continue;
        }
        if (!*p) continue;
        if (!(eq = strchr(p, '='))) {
            fclose(f);
            us__errf(err, errlen, "%s line %d: expected key = value", path, ln);
            return US_ERR_FORMAT;
        }
        for (k = p, ke = eq; ke > k && (ke[-1] == ' ' || ke[-1] == '\t'); ke--)
            ;
        *ke = 0;
        for (i = 0; i < US__NRATES; i++)
            if (!strcmp(k, us__rate_keys[i])) break;
        if (i == US__NRATES) {
            fclose(f);
            us__errf(err, errlen, "%s line %d: unknown key \"%s\"", path, ln, k);
            return US_ERR_FORMAT;
        }
        errno = 0;
        v = strtod(eq + 1, &end);
        while (*end == ' ' || *end == '\t') end++;
        if (errno || end == eq + 1 || *end || !(v > 0) || !isfinite(v)) {
            fclose(f);
            us__errf(err, errlen, "%s line %d: %s must be a positive number", path, ln, k);
            return US_ERR_FORMAT;
        }
        *us__rate_field(&tmp, i) = v;
    }
    fclose(f);
    if (ln == 0) {
        us__errf(err, errlen, "%s is empty: a rates file starts with \"ultrascale-rates 1\"", path);
        return US_ERR_FORMAT;
    }
    *r = tmp;
    return US_OK;
}

typedef enum us__coll { US__AR = 0, US__AG, US__RS, US__A2A, US__P2P } us__coll;

/* seconds for one collective of `bytes` (the whole tensor) over n ranks at bus bandwidth gbps */
static double us__coll_s(us__coll k, double bytes, int n, double gbps, double lat_us) {
    double f;
    if (n <= 1 || bytes <= 0) return 0;
    f = k == US__AR ? 2.0 * (n - 1) / n : k == US__P2P ? 1.0 : (double)(n - 1) / n;
    return lat_us * 1e-6 + f * bytes / (gbps * 1e9);
}

/* a group whose ranks span `span` consecutive ranks stays inside a node when span ≤ GPUs per node */
static double us__span_gbps(const us_plan_cluster *cl, int64_t span) {
    return span <= cl->gpus_per_node ? cl->rates.intra_gbps : cl->rates.inter_gbps;
}

/* A3's overlap of a reduction with the backward, bucket by bucket: whatever outlasts the backward
   window is exposed, and so is the last bucket, issued when the backward ends. */
static double us__dp_exposed(double t_comm, double window, double bytes, double bucket_bytes) {
    double last = bytes > 0 ? t_comm * (bucket_bytes < bytes ? bucket_bytes / bytes : 1.0) : 0;
    return (t_comm > window ? t_comm - window : 0) + last;
}

/* The search's memo of what depends on the schedule's shape alone (kind, pp, micro-batches,
   chunks): the first rank's activation peak, and the makespan at unit forward cost for the
   backward/forward and weight/forward ratios last seen (makespan scales with the costs). */
typedef struct us__plan_memo {
    int kind, pp, m, v, peak;
    double rb, rw, span1;
} us__plan_memo;

static us_result us__plan_cost(const us_model_config *mc_in, const us_train_config *tc_in,
                               const us_plan_cluster *cl_in, us_plan *out, us__plan_memo *memo,
                               char *err, size_t errlen);

US_API us_result us_plan_cost(const us_model_config *mc_in, const us_train_config *tc_in,
                              const us_plan_cluster *cl_in, us_plan *out, char *err,
                              size_t errlen) {
    return us__plan_cost(mc_in, tc_in, cl_in, out, NULL, err, errlen);
}

static us__plan_memo *us__plan_memo_of(us__plan_memo *memo, int n, const us_train_config *tc) {
    int h = (int)(((unsigned)tc->pp_schedule * 131u + (unsigned)tc->pp * 31u +
                   (unsigned)tc->grad_accum * 7u + (unsigned)tc->pp_chunks) %
                  (unsigned)n);
    us__plan_memo *e = &memo[h];
    if (e->kind != tc->pp_schedule || e->pp != tc->pp || e->m != tc->grad_accum ||
        e->v != tc->pp_chunks) {
        memset(e, 0, sizeof *e);
        e->kind = tc->pp_schedule;
        e->pp = tc->pp;
        e->m = tc->grad_accum;
        e->v = tc->pp_chunks;
    }
    return e;
}

#define US__PLAN_MEMO 4096

/* The cluster's shape and memory, checked before anything is planned on it. */
static us_result us__plan_check_nodes(const us_plan_cluster *cl, char *err, size_t errlen) {
    if (cl->gpus_per_node < 1 || cl->nodes < 1) {
        us__errf(
            err, errlen,
            "the cluster needs at least one node of at least one GPU (gpus per node %d, nodes %d)",
            cl->gpus_per_node, cl->nodes);
        return US_ERR_INVALID;
    }
    return US_OK;
}

static us_result us__plan_check_cluster(const us_plan_cluster *cl, char *err, size_t errlen) {
    us_result r = us__plan_check_nodes(cl, err, errlen);
    if (r != US_OK) return r;
    if (!(cl->gpu_mem_gib > 0) || !(cl->reserve_gib > 0) || !isfinite(cl->gpu_mem_gib) ||
        !isfinite(cl->reserve_gib)) {
        us__errf(err, errlen, "GPU memory %g GiB and reserve %g GiB must be positive numbers",
                 cl->gpu_mem_gib, cl->reserve_gib);
        return US_ERR_INVALID;
    }
    return us__plan_check_rates(&cl->rates, err, errlen);
}

/* One rank's view of a configuration: its shape, the rates it runs at, and the seconds of one
   layer's work per token and of its communication per micro-batch. */
typedef struct us__plan_rank {
    int tp, cp, pp, dp, Z;
    int v;      /* model chunks a micro-batch crosses on a pipeline rank (DualPipe: 1 of its 2) */
    int copies; /* the weights a rank holds, in micro-batch walks: 2 under DualPipe, else 1 */
    int m;      /* micro-batches per step */
    int K;      /* experts per token (0: dense) */
    int64_t C, T, V, L, NH, NKV, HS, world;
    double n;                      /* tokens of one micro-batch on this rank: the GEMMs' M */
    double G, Af, Ab, H, lat;      /* FLOP/s: GEMMs at M = n, attention fwd/bwd; HBM B/s; µs */
    double attn_f;                 /* attention forward FLOPs per token and layer (2·T·C/tp) */
    double head_f, head_e;         /* the head: GEMM FLOPs and elementwise bytes per token */
    double tf_l, tb_l, tw_l, re_l; /* per token and layer: forward, B, W, recomputed forward */
    double w_tp, w_cp, w_pp, w_dp, w_ep; /* each group's bus bandwidth, GB/s */
    double tp_l;                         /* TP's all-reduces of one layer's pass */
    double cp_f, cp_b, cp_h;             /* CP's ring exposed forward, backward; hidden */
    double ep_l;                         /* EP's all-to-alls of one layer's pass */
} us__plan_rank;

/* One micro-batch on the slowest pipeline chunk (the whole model without pp): seconds. */
typedef struct us__plan_chunk {
    int Lc, Mc, headc;     /* its layers, its MoE layers, and whether it runs the head */
    double cF, cB, cW, cR; /* compute: forward, input gradients B, weight gradients W, recompute */
    double cRW;            /* B and W apart: the recompute W repeats (us__layer_w), else 0 */
    double kTP, kCP, kEP;  /* exposed communication of TP, CP and EP */
} us__plan_chunk;

/* The configuration's shape on one rank, and the rates it runs at: attention under CP at
   cp_attn_eff of its rate, GEMMs of n rows at f(n)/f(16384) of theirs. */
static void us__plan_rank_of(const us_model_config *mc, const us_train_config *tc,
                             const us_plan_rates *R, us__plan_rank *k) {
    k->tp = tc->tp;
    k->cp = tc->cp;
    k->pp = tc->pp;
    k->dp = tc->dp;
    k->Z = tc->zero;
    k->m = tc->grad_accum;
    k->copies = k->pp > 1 && tc->pp_schedule == US_PP_DUALPIPE ? 2 : 1;
    k->v = k->copies == 1 && k->pp > 1 ? tc->pp_chunks : 1;
    k->world = (int64_t)tc->dp * tc->tp * tc->pp * tc->cp;
    k->C = mc->dim;
    k->T = tc->seq;
    k->V = mc->vocab;
    k->L = mc->n_layers;
    k->NH = mc->n_heads;
    k->NKV = mc->n_kv_heads;
    k->HS = k->C / k->NH;
    k->K = mc->moe_experts ? mc->moe_top_k : 0;
    k->G = R->gemm_tflops * 1e12;
    k->Af = R->attn_fwd_tflops * 1e12;
    k->Ab = R->attn_bwd_tflops * 1e12;
    k->H = R->hbm_gbps * 1e9;
    k->lat = R->latency_us;
    if (k->cp > 1) {
        k->Af *= R->cp_attn_eff;
        k->Ab *= R->cp_attn_eff;
    }
    k->n = (double)tc->batch * k->T / k->cp;
    /* smaller GEMMs run slower */
    k->G *= (k->n / (k->n + R->gemm_m_half)) / (16384.0 / (16384.0 + R->gemm_m_half));
}

/* Compute and recompute per token and layer on one tp rank. A layer's active parameters (the
   embedding is a lookup, the head a GEMM of its own) and the FFN width a token passes through:
   what is left after attention and the norms, over 3·C. GEMMs: 2 FLOPs per parameter forward,
   B and W each the same; attention forward 2·T·C (QKᵀ and PV over the causal half), backward
   2.5× that; elementwise bytes: two norms, two residual adds (10·C, split by tp only under SP),
   RoPE on q and k, SwiGLU (3·F), all bf16; the backward moves about twice the forward's bytes. */
static void us__plan_compute(const us_model_config *mc, const us_train_config *tc,
                             us__plan_rank *k) {
    const int64_t C = k->C, V = k->V, NH = k->NH, NKV = k->NKV, HS = k->HS;
    const int tp = k->tp;
    double Pact, Pl, Fact, gemm_f, ef, ef_C, kv_all;
    Pact = (double)us_param_count_active(mc);
    Pl = (Pact - (double)V * C * (mc->tie_embeddings ? 1 : 2) - (double)C) / (double)k->L;
    Fact = (Pl - (double)C * (NH + 2 * NKV) * HS - (double)C * NH * HS - 2.0 * C) / (3.0 * C);
    /* kv heads over the tp ranks, a replicated head (tp > NKV, // >>tp) counted on each rank */
    kv_all = (double)us__tp_kv_heads((int)NKV, tp) * tp;
    gemm_f = 2.0 * (Pl + 2.0 * C * HS * (kv_all - NKV)) / tp;
    k->attn_f = 2.0 * k->T * C / tp;
    ef_C = 2.0 * 10 * C / (tc->sp ? tp : 1);
    ef = ef_C + 2.0 * (2.0 * (NH + kv_all) * HS + 3.0 * Fact) / tp;
    k->head_f = 2.0 * V * C / tp;               /* the head GEMM forward */
    k->head_e = 2.0 * 3 * V / tp + 2.0 * 4 * C; /* cross-entropy over the logits, the final norm */
    k->tf_l = gemm_f / k->G + k->attn_f / k->Af + ef / k->H;
    /* B: input gradients (attention's whole backward); W: weight gradients */
    k->tb_l = gemm_f / k->G + 2.5 * k->attn_f / k->Ab + 2 * ef / k->H;
    k->tw_l = gemm_f / k->G;
    k->re_l = tc->recompute == US_RECOMPUTE_FULL        ? k->tf_l
              : tc->recompute == US_RECOMPUTE_SELECTIVE ? k->attn_f / k->Af + ef / k->H
                                                        : 0;
}

/* Communication per layer and micro-batch. Ranks are laid out tp fastest, then cp, pp, dp: a
   group runs at the node's rate when its span fits in a node. TP: 2 all-reduces of N·C per pass
   (on the critical path). CP: the ring's cp−1 steps, each one K/V block (backward with its
   gradients) against one block's attention, exposed only beyond it. EP: dispatch and combine. */
static void us__plan_comm(const us_plan_cluster *cl, const us_train_config *tc, us__plan_rank *k) {
    const int tp = k->tp, cp = k->cp, pp = k->pp, dp = k->dp;
    const double n = k->n, lat = k->lat;
    k->w_tp = us__span_gbps(cl, tp);
    k->w_cp = us__span_gbps(cl, (int64_t)tp * cp);
    k->w_pp = us__span_gbps(cl, (int64_t)tp * cp * pp);
    k->w_dp = us__span_gbps(cl, dp > 1 ? k->world : (int64_t)tp * cp);
    k->w_ep = us__span_gbps(cl, tc->ep <= cp ? (int64_t)tp * tc->ep
                                             : (int64_t)tp * cp * pp * (tc->ep / cp));
    k->tp_l = 2 * us__coll_s(US__AR, n * k->C * 2, tp, k->w_tp, lat); /* per pass */
    {
        double kv = n * 2.0 * us__tp_kv_heads((int)k->NKV, tp) * k->HS * 2,
               blk_f = n * k->attn_f / k->Af / cp, blk_b = n * 2.5 * k->attn_f / k->Ab / cp;
        double sf = us__coll_s(US__P2P, kv, cp, k->w_cp, lat),
               sb = us__coll_s(US__P2P, 2 * kv, cp, k->w_cp, lat);
        k->cp_f = (cp - 1) * (sf > blk_f ? sf - blk_f : 0);
        k->cp_b = (cp - 1) * (sb > blk_b ? sb - blk_b : 0);
        /* hidden under the blocks */
        k->cp_h = (cp - 1) * ((sf < blk_f ? sf : blk_f) + (sb < blk_b ? sb : blk_b));
    }
    /* dispatch + combine, per pass */
    k->ep_l = 2 * us__coll_s(US__A2A, n * k->K * k->C * 2, tc->ep, k->w_ep, lat);
}

/* The slowest pipeline chunk (layers by the model's even split; the head on the last stage) and
   what one micro-batch costs on it; without pp the chunk is the whole model. */
static void us__plan_slowest_chunk(const us_model_config *mc, const us_train_config *tc,
                                   const us__plan_rank *k, us__plan_chunk *ch) {
    const int64_t S = (int64_t)k->pp * k->v;
    const double n = k->n, G = k->G, H = k->H;
    const int full = tc->recompute == US_RECOMPUTE_FULL;
    double worst = -1;
    int64_t st;
    int Lc = 0, Mc = 0, headc = 0;
    for (st = 0; st < S; st++) {
        int first, count, mo = 0, k2;
        double c;
        us__pp_stage_layers(mc, tc, (int)S, (int)st, &first, &count);
        for (k2 = first; k2 < first + count; k2++) mo += us__is_moe(mc, k2);
        c = count * (k->tf_l + k->tb_l + k->tw_l) +
            (st == S - 1 ? (3 * k->head_f) / G + 2 * k->head_e / H : 0);
        if (c > worst) {
            worst = c;
            Lc = count;
            Mc = mo;
            headc = st == S - 1;
        }
    }
    ch->Lc = Lc;
    ch->Mc = Mc;
    ch->headc = headc;
    ch->cF = n * (Lc * k->tf_l + (headc ? k->head_f / G + k->head_e / H : 0));
    ch->cB = n * (Lc * k->tb_l + (headc ? k->head_f / G + k->head_e / H : 0));
    ch->cW = n * (Lc * k->tw_l + (headc ? k->head_f / G : 0));
    ch->cR = n * Lc * k->re_l;
    ch->cRW = tc->pp > 1 && (tc->pp_schedule == US_PP_ZB1 || tc->pp_schedule == US_PP_ZBV ||
                             tc->pp_schedule == US_PP_DUALPIPEV)
                  ? ch->cR
                  : 0;
    /* forward, backward (+ the recomputed forward) */
    ch->kTP = Lc * k->tp_l * (full ? 3 : 2);
    ch->kCP = Lc * (k->cp_f + k->cp_b + (full ? k->cp_f : 0));
    ch->kEP = Mc * k->ep_l * (full ? 3 : 2);
}

/* ZeRO-3, sharded over the dp·cp ranks that hold the same weights: each layer's weights
   gathered before its forward and its backward, the gradient scattered after; the next layer's
   gather overlaps this layer's compute. Under pp a rank walks its own layers, chunk by chunk, per
   micro-batch (us__zero3_next): each chunk's first gather is exposed (W's gathers under recompute
   are not counted). psi: the rank's parameters (tp, pp, ep shares; DualPipe's two stages, of
   which a micro-batch walks one). Sets out->t_zero3; adds to *hidden the collectives' time
   hidden under the compute. */
static void us__plan_zero3(const us__plan_rank *k, const us_plan_rates *R, double psi, us_plan *out,
                           double *hidden) {
    const int dp = k->dp, cp = k->cp;
    const int64_t L = (k->L + k->pp - 1) / k->pp; /* this rank's layers */
    const double n = k->n, psi_l = psi / (k->copies * L + 2.0);
    double zF = 0, zB = 0;
    if (k->Z == 3 && dp * cp > 1) {
        double ag = us__coll_s(US__AG, 2 * psi_l, dp * cp, k->w_dp, k->lat),
               rs = us__coll_s(US__RS, 4 * psi_l, dp * cp, k->w_dp, k->lat);
        double lf = n * k->tf_l, lb = n * (k->tb_l + k->tw_l + k->re_l);
        /* + each chunk's first gather and last scatter, nothing to hide under */
        zF = L * (ag > lf ? ag - lf : 0) + k->v * ag;
        zB = L * (ag + rs > lb ? ag + rs - lb : 0) + k->v * rs;
        *hidden += (double)k->m * L * ((ag < lf ? ag : lf) + (ag + rs < lb ? ag + rs : lb)) *
                   k->w_dp / R->intra_gbps;
    }
    out->t_zero3 = (double)k->m * (zF + zB);
}

/* Pipeline parallelism: the schedule's makespan with these per-chunk costs (the simulator's,
   or the memo's makespan at unit forward cost scaled); the bubble is what it adds to the work,
   and the activation messages of the fill and the drain are exposed. */
static us_result us__plan_pipeline(const us_train_config *tc, const us__plan_rank *k,
                                   const us__plan_chunk *ch, us__plan_memo *memo, us_plan *out,
                                   char *err, size_t errlen) {
    const int m = k->m, v = k->v;
    const int64_t S = (int64_t)k->pp * v;
    us_pp_schedule s;
    us_pp_sim sim;
    us_result r;
    double tF = ch->cF + (ch->kTP + ch->kCP + ch->kEP) * (1.0 / 3),
           tB = ch->cB + ch->cR + (ch->kTP + ch->kCP + ch->kEP) * (2.0 / 3), tW = ch->cW + ch->cRW;
    us__plan_memo *e = memo ? us__plan_memo_of(memo, US__PLAN_MEMO, tc) : NULL;
    double span, t_msg;
    if (e && e->span1 > 0 && e->rb == tB / tF && e->rw == tW / tF)
        span = e->span1 * tF;
    else {
        if ((r = us_pp_schedule_build(&s, (us_pp_kind)tc->pp_schedule, k->pp, m, tc->pp_chunks, err,
                                      errlen)) != US_OK)
            return r;
        r = us_pp_simulate(&s, tF, tB, tW, &sim, err, errlen);
        us_pp_schedule_free(&s);
        if (r != US_OK) return r;
        span = sim.makespan;
        if (e) {
            e->rb = tB / tF;
            e->rw = tW / tF;
            e->span1 = span / tF;
        }
    }
    out->t_bubble = span - (double)m * v * (tF + tB + tW);
    if (out->t_bubble < 0) out->t_bubble = 0;
    t_msg = us__coll_s(US__P2P, k->n * k->C * 2, 2, k->w_pp, k->lat);
    out->t_p2p = 2.0 * (S - 1) * t_msg;
    return US_OK;
}

/* Data parallelism: fp32 gradients over dp·cp, overlapped with the last micro-batch's backward
   bucket by bucket; ZeRO-1 reduce-scatters and all-gathers the updated bf16 weights, ZeRO-2
   reduce-scatters every micro-batch. Then AdamW: 30 bytes per parameter of the rank's shard.
   Sets out->t_dp and out->t_optimizer; adds to *hidden the reduction's hidden time. */
static void us__plan_dp(const us_train_config *tc, const us__plan_rank *k, const us__plan_chunk *ch,
                        const us_plan_rates *R, double psi, us_plan *out, double *hidden) {
    const int g = k->dp * k->cp, Z = k->Z, m = k->m;
    const double w_dp = k->w_dp, lat = k->lat;
    double gb = 4 * psi, window = k->v * (ch->cB + ch->cW + ch->cR + ch->cRW),
           bucket = (double)tc->bucket_mb * 1048576.0;
    double ag = us__coll_s(US__AG, 2 * psi, g, w_dp, lat); /* ZeRO-1/2: the updated bf16 weights */
    double red = g > 1 && Z < 3 ? us__coll_s(Z == 0 ? US__AR : US__RS, gb, g, w_dp, lat) : 0,
           ex = g > 1 && Z < 3 ? us__dp_exposed(red, window, gb, bucket) : 0;
    if (Z == 0)
        out->t_dp = ex;
    else if (Z == 1)
        out->t_dp = ex + ag;
    else if (Z == 2)
        out->t_dp = m * ex + ag;
    *hidden += (Z == 2 ? m : 1) * (red > ex ? red - ex : 0) * w_dp / R->intra_gbps;
    out->t_optimizer = 30.0 * (Z ? psi / g : psi) / k->H;
}

static us_result us__plan_cost(const us_model_config *mc_in, const us_train_config *tc_in,
                               const us_plan_cluster *cl_in, us_plan *out, us__plan_memo *memo,
                               char *err, size_t errlen) {
    us_model_config mc = *mc_in;
    us_train_config tc = *tc_in;
    us_plan_cluster cl = *cl_in;
    const us_plan_rates *R;
    us_result r;
    us__plan_rank k;
    us__plan_chunk ch;
    int64_t world;
    double psi, hidden = 0;
    us_plan_cluster_defaults(&cl);
    R = &cl.rates;
    if ((r = us__plan_check_cluster(&cl, err, errlen)) != US_OK) return r;
    if ((r = us_config_validate(&mc, &tc, err, errlen)) != US_OK) return r;
    world = (int64_t)tc.dp * tc.tp * tc.pp * tc.cp;
    if (world != (int64_t)cl.gpus_per_node * cl.nodes) {
        us__errf(err, errlen, "dp %d x tp %d x pp %d x cp %d = %lld GPUs, but the cluster has %lld",
                 tc.dp, tc.tp, tc.pp, tc.cp, (long long)world,
                 (long long)cl.gpus_per_node * cl.nodes);
        return US_ERR_INVALID;
    }
    /* step 1 of the recipe: memory (the first pipeline rank's) */
    memset(out, 0, sizeof *out);
    out->tc = tc;
    {
        us__plan_memo *e = memo && tc.pp > 1 ? us__plan_memo_of(memo, US__PLAN_MEMO, &tc) : NULL;
        if ((r = us__memory_estimate(&mc, &tc, &out->mem, e ? &e->peak : NULL, err, errlen)) !=
            US_OK)
            return r;
    }
    out->fits =
        (double)out->mem.total + cl.reserve_gib * 1073741824.0 <= cl.gpu_mem_gib * 1073741824.0;

    /* step 3: the cost model, one term per idea of the book */
    us__plan_rank_of(&mc, &tc, R, &k);
    us__plan_compute(&mc, &tc, &k);
    us__plan_comm(&cl, &tc, &k);
    us__plan_slowest_chunk(&mc, &tc, &k, &ch);
    /* the rank's parameters (tp, pp, ep shares) */
    psi = (double)out->mem.optimizer / 8 * (k.Z ? k.dp * k.cp : 1);
    us__plan_zero3(&k, R, psi, out, &hidden);
    /* the CP ring's hidden transfers (the recomputed forward repeats the forward's) */
    hidden += (double)k.m * k.v * ch.Lc * k.cp_h * (tc.recompute == US_RECOMPUTE_FULL ? 1.5 : 1) *
              k.w_cp / R->intra_gbps;
    out->t_compute = (double)k.m * k.v * (ch.cF + ch.cB + ch.cW);
    out->t_recompute = (double)k.m * k.v * (ch.cR + ch.cRW);
    out->t_tp = (double)k.m * k.v * ch.kTP;
    out->t_cp = (double)k.m * k.v * ch.kCP;
    out->t_ep = (double)k.m * k.v * ch.kEP;
    if (k.pp > 1 && (r = us__plan_pipeline(&tc, &k, &ch, memo, out, err, errlen)) != US_OK)
        return r;
    us__plan_dp(&tc, &k, &ch, R, psi, out, &hidden);
    /* hidden: each collective's hidden time at the node's rate (its bytes' SM and HBM work) */
    out->t_overlap = R->overlap_tax * hidden;
    out->t_step = out->t_compute + out->t_recompute + out->t_tp + out->t_cp + out->t_ep +
                  out->t_bubble + out->t_p2p + out->t_dp + out->t_zero3 + out->t_optimizer +
                  out->t_overlap;
    {
        double tokens = (double)tc.batch * tc.grad_accum * k.dp * k.T;
        out->tokens_per_s = tokens / out->t_step;
        out->mfu = us_flops_per_token(&mc, k.T) * out->tokens_per_s /
                   ((double)world * R->peak_tflops * 1e12);
    }
    return US_OK;
}

/* A lower bound of us_memory_estimate's weights, gradients, master and AdamW bytes, without
   building anything: the first pipeline rank holds at least floor(L/(pp·v))·v layers, each at
   least its attention (dense: and MLP) weights over tp, sharded by ZeRO over dp·cp. The search
   skips the estimate (and the schedule simulation inside it) where even this cannot fit. */
static double us__plan_state_bound(const us_model_config *mc, const us_train_config *tc) {
    double C = (double)mc->dim, HS = C / mc->n_heads, g = (double)tc->dp * tc->cp;
    double Pl = C * (mc->n_heads + 2.0 * mc->n_kv_heads) * HS + C * mc->n_heads * HS +
                (mc->moe_experts ? 0 : 3.0 * C * mc->ffn_dim);
    int v = tc->pp > 1 ? (tc->pp_chunks ? tc->pp_chunks : 1) : 1, S = tc->pp * v;
    double psi = (double)(mc->n_layers / S) * v * Pl / tc->tp, Z = tc->zero;
    return psi * (2.0 / (Z == 3 ? g : 1) + 4.0 / (Z >= 2 ? g : 1) + 12.0 / (Z >= 1 ? g : 1));
}

static int us__plan_cmp(const void *a, const void *b) {
    const us_plan *p = (const us_plan *)a,
                  *q = (const us_plan *)b; /* faster first; at equal time, less memory */
    if (p->t_step != q->t_step) return p->t_step < q->t_step ? -1 : 1;
    return p->mem.total < q->mem.total ? -1 : p->mem.total > q->mem.total;
}

/* The schedules tried under pipeline parallelism (interleaved and ZB-V with 2 chunks per rank). */
static const int us__plan_kinds[] = {US_PP_AFAB, US_PP_1F1B, US_PP_INTERLEAVED, US_PP_ZB1,
                                     US_PP_ZBV};

/* The search: its inputs, the schedule memo, the counts, and the q.top best plans so far. */
typedef struct us__plan_search {
    const us_model_config *mc; /* validated: its defaults filled */
    const us_plan_cluster *cl;
    const us_plan_request *q;
    int64_t Gs; /* sequences per step = dp · micro-batch · grad-accum */
    us__plan_memo *memo;
    int64_t nv, nf; /* configurations that validate, that fit */
    us_plan *out;   /* [q.top] the kept plans, unordered until the end */
    int kept;       /* plans in out */
    int worst;      /* out's slowest plan, -1 when not known since the last change */
} us__plan_search;

/* The model, the rates, the cluster's shape and the request, checked before the search. mc's
   defaults are filled here. */
static us_result us__plan_check_request(us_model_config *mc, const us_plan_cluster *cl,
                                        const us_plan_request *q, char *err, size_t errlen) {
    us_train_config probe;
    us_result r;
    memset(&probe, 0, sizeof probe);
    if ((r = us_config_validate(mc, &probe, err, errlen)) != US_OK) return r;
    if ((r = us__plan_check_rates(&cl->rates, err, errlen)) != US_OK) return r;
    if ((r = us__plan_check_nodes(cl, err, errlen)) != US_OK) return r;
    if (q->seq < 1 || q->global_tokens < 1 || q->global_tokens % q->seq) {
        us__errf(err, errlen,
                 "the global batch of %lld tokens must be a positive multiple of seq=%d",
                 (long long)q->global_tokens, q->seq);
        return US_ERR_INVALID;
    }
    if (q->top < 1 || q->max_micro_batch < 1) {
        us__errf(err, errlen, "top=%d and max micro-batch=%d must be at least 1", q->top,
                 q->max_micro_batch);
        return US_ERR_INVALID;
    }
    return US_OK;
}

/* The cheap check first: whether tp, cp, pp (and dp) suit the model at all. */
static int us__plan_layout_ok(const us__plan_search *s, int tp, int cp, int pp, int dp) {
    us_model_config m2 = *s->mc;
    us_train_config probe;
    char e2[256];
    memset(&probe, 0, sizeof probe);
    probe.tp = tp;
    probe.cp = cp;
    probe.pp = pp;
    probe.dp = dp;
    probe.seq = s->q->seq;
    return us_config_validate(&m2, &probe, e2, sizeof e2) == US_OK;
}

/* Keep p if it is among the q.top fastest so far: fill out, then replace the slowest kept. */
static void us__plan_keep(us__plan_search *s, const us_plan *p) {
    int i;
    if (s->kept < s->q->top) {
        s->out[s->kept++] = *p;
        s->worst = -1;
        return;
    }
    if (s->worst < 0)
        for (s->worst = 0, i = 1; i < s->kept; i++)
            if (us__plan_cmp(&s->out[i], &s->out[s->worst]) > 0) s->worst = i;
    if (us__plan_cmp(p, &s->out[s->worst]) < 0) {
        s->out[s->worst] = *p;
        s->worst = -1;
    }
}

/* One configuration: counted if it validates, skipped where even its model states cannot fit
   (us__plan_state_bound), else costed and kept if it fits and ranks. */
static void us__plan_try(us__plan_search *s, const us_train_config *tc) {
    const us_plan_cluster *cl = s->cl;
    us_plan p;
    char e2[256];
    {
        us_model_config m2 = *s->mc;
        us_train_config t2 = *tc;
        if (us_config_validate(&m2, &t2, e2, sizeof e2) != US_OK) return;
    }
    s->nv++;
    if (us__plan_state_bound(s->mc, tc) + cl->reserve_gib * 1073741824.0 >
        cl->gpu_mem_gib * 1073741824.0)
        return; /* cannot fit */
    if (us__plan_cost(s->mc, tc, cl, &p, s->memo, e2, sizeof e2) != US_OK || !p.fits) return;
    s->nf++;
    us__plan_keep(s, &p);
}

/* One layout and micro-batch size: each recomputation mode and, under pp, each schedule. */
static void us__plan_micro_batch(us__plan_search *s, const us_train_config *layout, int mb) {
    const int nk = layout->pp > 1 ? (int)(sizeof us__plan_kinds / sizeof us__plan_kinds[0]) : 1;
    int rc, k;
    for (rc = US_RECOMPUTE_NONE; rc <= US_RECOMPUTE_FULL; rc++) {
        for (k = 0; k < nk; k++) {
            us_train_config tc = *layout;
            tc.batch = mb;
            tc.grad_accum = (int)(s->Gs / tc.dp / mb);
            tc.recompute = (us_recompute)rc;
            if (tc.pp > 1) {
                const int kind = us__plan_kinds[k];
                tc.pp_schedule = kind;
                tc.pp_chunks = kind == US_PP_INTERLEAVED || kind == US_PP_ZBV ? 2 : 1;
            }
            us__plan_try(s, &tc);
        }
    }
}

/* Every configuration of one layout (tp, cp, pp, dp): expert parallelism over the dp·cp ranks
   where the experts split evenly, each ZeRO stage over them, SP where tp > 1, and each per-rank
   micro-batch that divides the rank's sequences of the step. */
static void us__plan_layout(us__plan_search *s, int tp, int cp, int pp, int dp) {
    const int E = s->mc->moe_experts;
    const int64_t per_rank = s->Gs / dp;
    int ep, z, sp, mb;
    for (ep = 1; ep <= dp * cp; ep++) {
        if ((dp * cp) % ep || (ep > 1 && (!E || E % ep))) continue;
        /* ZeRO shards over dp·cp: one rank has nothing to shard */
        for (z = 0; z <= (dp * cp > 1 ? 3 : 0); z++) {
            for (sp = 0; sp <= (tp > 1); sp++) {
                for (mb = 1; mb <= s->q->max_micro_batch && mb <= per_rank; mb++) {
                    us_train_config layout;
                    if (per_rank % mb) continue;
                    memset(&layout, 0, sizeof layout);
                    layout.dp = dp;
                    layout.tp = tp;
                    layout.cp = cp;
                    layout.pp = pp;
                    layout.ep = ep;
                    layout.zero = z;
                    layout.sp = sp;
                    layout.seq = s->q->seq;
                    layout.precision = US_PRECISION_BF16;
                    us__plan_micro_batch(s, &layout, mb);
                }
            }
        }
    }
}

US_API us_result us_plan_enumerate(const us_model_config *mc_in, const us_plan_cluster *cl_in,
                                   const us_plan_request *q_in, us_plan *out, int *n_out,
                                   int64_t *n_valid, int64_t *n_fit, char *err, size_t errlen) {
    us_model_config mc = *mc_in;
    us_plan_cluster cl = *cl_in;
    us_plan_request q = *q_in;
    us__plan_search s;
    int64_t world;
    int tp, cp, pp, dp;
    us_result r;
    us_plan_cluster_defaults(&cl);
    us_plan_request_defaults(&q);
    *n_out = 0;
    if (n_valid) *n_valid = 0;
    if (n_fit) *n_fit = 0;
    if ((r = us__plan_check_request(&mc, &cl, &q, err, errlen)) != US_OK) return r;
    memset(&s, 0, sizeof s);
    s.mc = &mc;
    s.cl = &cl;
    s.q = &q;
    s.Gs = q.global_tokens / q.seq;
    s.out = out;
    s.worst = -1;
    if (!(s.memo = (us__plan_memo *)US_MALLOC(US__PLAN_MEMO * sizeof *s.memo))) {
        us__errf(err, errlen, "out of host memory");
        return US_ERR_OOM;
    }
    memset(s.memo, 0, US__PLAN_MEMO * sizeof *s.memo);
    /* every layout that uses every GPU: world = tp · cp · pp · dp */
    world = (int64_t)cl.gpus_per_node * cl.nodes;
    for (tp = 1; tp <= world; tp++) {
        if (world % tp) continue;
        for (cp = 1; cp <= world / tp; cp++) {
            if ((world / tp) % cp) continue;
            for (pp = 1; pp <= world / tp / cp; pp++) {
                if ((world / tp / cp) % pp) continue;
                dp = (int)(world / tp / cp / pp);
                if (s.Gs % dp || !us__plan_layout_ok(&s, tp, cp, pp, dp)) continue;
                us__plan_layout(&s, tp, cp, pp, dp);
            }
        }
    }
    US_FREE(s.memo);
    qsort(out, (size_t)s.kept, sizeof *out, us__plan_cmp);
    *n_out = s.kept;
    if (n_valid) *n_valid = s.nv;
    if (n_fit) *n_fit = s.nf;
    return US_OK;
}

static void us__cat(char *buf, size_t cap, size_t *k, const char *fmt, ...) {
    va_list ap;
    int n;
    if (*k >= cap) return;
    va_start(ap, fmt);
    n = vsnprintf(buf + *k, cap - *k, fmt, ap);
    va_end(ap);
    if (n > 0) *k += (size_t)n;
}

US_API int us_plan_command(const us_model_config *mc_in, const us_plan *p, char *buf, size_t cap) {
    us_model_config mc = *mc_in;
    const us_train_config *t = &p->tc;
    int w = t->dp * t->tp * t->pp * t->cp;
    size_t k = 0;
    us_model_config_defaults(&mc);
    if (cap) buf[0] = 0;
    us__cat(buf, cap, &k,
            "build/train_cuda --layers %d --dim %lld --heads %d --kv-heads %d --ffn %lld --vocab "
            "%lld%s",
            mc.n_layers, (long long)mc.dim, mc.n_heads, mc.n_kv_heads, (long long)mc.ffn_dim,
            (long long)mc.vocab, mc.tie_embeddings ? " --tied" : "");
    if (mc.moe_experts)
        us__cat(buf, cap, &k, " --experts %d --top-k %d --moe-ffn %lld%s", mc.moe_experts,
                mc.moe_top_k, (long long)mc.moe_ffn_dim, mc.moe_shared ? " --shared-expert" : "");
    /* train's --batch is the whole dp group's micro-batch: each rank takes batch/dp of it */
    us__cat(buf, cap, &k, " --precision bf16 --seq %d --batch %d --grad-accum %d", t->seq,
            t->batch * t->dp, t->grad_accum);
    if (w > 1) us__cat(buf, cap, &k, " --nproc %d", w);
    if (t->tp > 1) us__cat(buf, cap, &k, " --tp %d%s", t->tp, t->sp ? " --sp" : "");
    if (t->cp > 1) us__cat(buf, cap, &k, " --cp %d", t->cp);
    if (t->ep > 1) us__cat(buf, cap, &k, " --ep %d", t->ep);
    if (t->pp > 1)
        us__cat(buf, cap, &k, " --pp %d --pp-schedule %s --pp-chunks %d", t->pp,
                us_pp_kind_name((us_pp_kind)t->pp_schedule), t->pp_chunks);
    us__cat(buf, cap, &k, " --zero %d --recompute %s", t->zero, us_recompute_name(t->recompute));
    return (int)k;
}
#endif /* ULTRASCALE_NO_PLANNER */

#endif /* ULTRASCALE_IMPLEMENTATION_DONE */
#endif /* ULTRASCALE_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the ultrascale authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
