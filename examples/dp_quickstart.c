/* dp_quickstart.c — data parallelism from the library, without the trainer: 4 ranks as threads
   of this process (ultrascale_comm.h's threads backend), ZeRO-2, the built-in task. Every rank
   draws the same global batch and trains on its quarter of it; the losses are the global ones.
   On GPUs the same rank function runs with us_nccl_init(...) as its comm (see README.md). */
#define _POSIX_C_SOURCE 200809L /* the comm header needs POSIX threads and clocks */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANKS 4
#define GLOBAL_BATCH 16

static us_result rank_main(us_comm *c, void *arg) {
    us_model m;
    us_model_config mc;
    us_train_config tc;
    us_task task;
    int32_t *gin, *gtgt;
    int s, r = c->world.rank, T;
    size_t rows;
    us_result res = US_OK;
    (void)arg;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc); /* zero means default */
    mc.n_layers = 2;
    mc.dim = 64;
    tc.dp = c->world.size;
    tc.zero = 2;
    tc.batch = GLOBAL_BATCH / tc.dp; /* sequences per rank */
    tc.seq = T = 4 * US_TASK_LINE - 1;
    tc.steps = 100;
    tc.lr = 1e-2f;
    tc.warmup = 10;
    tc.threads = 1;
    if ((res = us_model_init_dist(&m, &mc, &tc, NULL, c)) != US_OK) {
        fprintf(stderr, "rank %d: %s\n", r, us_model_error(&m));
        return res;
    }
    us_task_init(&task, 1); /* the same stream on every rank */
    rows = (size_t)tc.batch * T;
    gin = (int32_t *)malloc((size_t)GLOBAL_BATCH * T * 4);
    gtgt = (int32_t *)malloc((size_t)GLOBAL_BATCH * T * 4);
    for (s = 0; s < tc.steps && res == US_OK; s++) {
        us_step_stats st;
        us_task_batch(&task, GLOBAL_BATCH, T, gin, gtgt);
        res = us_train_step(&m, gin + r * rows, gtgt + r * rows, &st); /* this rank's rows */
        if (res != US_OK)
            fprintf(stderr, "rank %d: %s\n", r, us_model_error(&m));
        else if (r == 0 && st.step % 20 == 0)
            printf("step %d loss %.4f (global batch %lld tokens)\n", st.step, st.loss,
                   (long long)st.tokens);
    }
    free(gin);
    free(gtgt);
    us_model_free(&m);
    return res;
}

int main(void) {
    char err[256];
    if (us_launch_ex(RANKS, rank_main, NULL, NULL, NULL, err, sizeof err) != US_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}
