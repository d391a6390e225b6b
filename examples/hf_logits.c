/* hf_logits.c — the last-position logits of a checkpoint, for comparison with Hugging Face's
   LlamaForCausalLM (bench/hf_logits.sh). Loads DIR (config.json + model.safetensors or shards:
   ours or a Hugging Face Llama directory) in fp32 and runs B sequences of T tokens:
       build/hf_logits DIR TOKENS.i32 B T OUT.f32
   TOKENS.i32 holds B·T int32 tokens; OUT.f32 receives [B][V] fp32 logits of each sequence's last
   position (the whole sequence feeds them through causal attention). Built by nvcc with -DUS_CUDA
   (make build/hf_logits_cuda) the model runs on GPU 0 through the CUDA backend. */
#define ULTRASCALE_IMPLEMENTATION
#ifdef US_CUDA
#include "../ultrascale_cuda.cuh"
#else
#include "../ultrascale.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    char err[256], rope[160];
    int B, T;
    int32_t *tok, *tgt;
    float *logits;
    double loss = 0;
    FILE *f;
    size_t n;
    us_ops *opsp = NULL;
#ifdef US_CUDA
    us_ops ops;
    if (us_cuda_ops(&ops, 0, err, sizeof err) != US_OK) {
        fprintf(stderr, "hf_logits: %s\n", err);
        return 1;
    }
    opsp = &ops;
#endif
    if (argc != 6 || (B = atoi(argv[3])) < 1 || (T = atoi(argv[4])) < 1) {
        fprintf(stderr, "usage: hf_logits DIR TOKENS.i32 B T OUT.f32\n");
        return 2;
    }
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    if (us_ckpt_read_config(argv[1], &mc, err, sizeof err) != US_OK) {
        fprintf(stderr, "hf_logits: %s\n", err);
        return 1;
    }
    tc.batch = B;
    tc.seq = T;
    tc.precision = US_PRECISION_FP32;
    if (us_model_init(&m, &mc, &tc, opsp) != US_OK) {
        fprintf(stderr, "hf_logits: %s\n", us_model_error(&m));
        return 1;
    }
    if (us_ckpt_load(&m, argv[1], 0, NULL) != US_OK) {
        fprintf(stderr, "hf_logits: %s\n", us_model_error(&m));
        us_model_free(&m);
        return 1;
    }
    n = (size_t)B * T;
    tok = (int32_t *)malloc(n * 4);
    tgt = (int32_t *)malloc(n * 4);
    logits = (float *)malloc((size_t)B * m.cfg.vocab * 4);
    if (!tok || !tgt || !logits || !(f = fopen(argv[2], "rb")) || fread(tok, 4, n, f) != n) {
        fprintf(stderr, "hf_logits: cannot read %d x %d tokens from %s\n", B, T, argv[2]);
        return 1;
    }
    fclose(f);
    memset(tgt, 0xff, n * 4); /* -1: no loss, logits only */
    if (us_forward_eval(&m, tok, tgt, B, T, &loss, NULL, logits) != US_OK) {
        fprintf(stderr, "hf_logits: %s\n", us_model_error(&m));
        return 1;
    }
    if (!(f = fopen(argv[5], "wb")) ||
        fwrite(logits, 4, (size_t)B * m.cfg.vocab, f) != (size_t)B * m.cfg.vocab) {
        fprintf(stderr, "hf_logits: cannot write %s\n", argv[5]);
        return 1;
    }
    fclose(f);
    printf("hf_logits: %d x %lld logits written to %s (%s, %s)\n", B, (long long)m.cfg.vocab,
           argv[5], us_rope_describe(&m.cfg, rope, sizeof rope), m.ops.name);
    us_model_free(&m);
    free(tok);
    free(tgt);
    free(logits);
#ifdef US_CUDA
    us_cuda_ops_free(&ops);
#endif
    return 0;
}
