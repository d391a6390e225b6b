/* cp_memory.c — the Playbook's point about context parallelism, from the estimator: activation
   memory per GPU grows with the sequence length, and splitting every sequence over cp ranks
   divides it (the all-gather variant keeps a little more: every rank's K/V block at once).
       build/cp_memory                      # Llama-3.1-8B shape, bf16, selective recompute
       build/cp_memory --full               # full recompute */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    static const int seqs[] = {4096, 8192, 16384, 32768, 65536, 131072};
    static const int cps[] = {1, 2, 4, 8};
    us_model_config mc;
    us_train_config tc;
    int i, j, full = argc > 1 && !strcmp(argv[1], "--full");
    if (argc > 1 && !full) {
        fprintf(stderr, "usage: cp_memory [--full]\n");
        return 2;
    }
    memset(&mc, 0, sizeof mc);
    mc.n_layers = 32;
    mc.dim = 4096;
    mc.n_heads = 32;
    mc.n_kv_heads = 8;
    mc.ffn_dim = 14336;
    mc.vocab = 128256;
    printf("activation memory per GPU, GiB — Llama-3.1-8B shape, bf16, batch 1, recompute %s\n",
           full ? "full" : "selective");
    printf("%8s", "seq");
    for (j = 0; j < 4; j++) printf(" | cp %d ring  cp %d gather", cps[j], cps[j]);
    printf("\n");
    for (i = 0; i < 6; i++) {
        printf("%8d", seqs[i]);
        for (j = 0; j < 4; j++) {
            us_memory a, g;
            char err[160];
            memset(&tc, 0, sizeof tc);
            tc.batch = 1;
            tc.seq = seqs[i];
            tc.precision = US_PRECISION_BF16;
            tc.cp = cps[j];
            tc.recompute = full ? US_RECOMPUTE_FULL : US_RECOMPUTE_SELECTIVE;
            tc.cp_mode = US_CP_ZIGZAG;
            if (us_memory_estimate(&mc, &tc, &a, err, sizeof err) != US_OK) {
                fprintf(stderr, "cp_memory: %s\n", err);
                return 1;
            }
            tc.cp_mode = US_CP_ALLGATHER;
            if (us_memory_estimate(&mc, &tc, &g, err, sizeof err) != US_OK) {
                fprintf(stderr, "cp_memory: %s\n", err);
                return 1;
            }
            printf(" | %10.2f %12.2f", a.activations / 1073741824.0, g.activations / 1073741824.0);
        }
        printf("\n");
    }
    return 0;
}
