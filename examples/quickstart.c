/* quickstart.c — the QUICK START of ultrascale.h's opening comment, as a program that is built
   by `make` so the documented code cannot rot. Trains the built-in sorting task for 300 steps. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <stdio.h>
#include <stdlib.h>

int main(void) {
    us_model_config mc = {0};
    mc.n_layers = 2;
    mc.dim = 64;
    mc.n_heads = 4;
    us_train_config tc = {0};
    tc.batch = 8;
    tc.seq = 64;
    tc.steps = 300;
    us_model m;
    if (us_model_init(&m, &mc, &tc, NULL) != US_OK) {
        puts(us_model_error(&m));
        return 1;
    }
    us_train_config *t = &m.tc; /* tc with every default filled in */
    us_task task;
    us_task_init(&task, t->seed);                         /* the built-in sorting task */
    size_t n = (size_t)t->grad_accum * t->batch * t->seq; /* inputs/targets: [grad_accum][B][T] */
    int32_t *in = malloc(n * 4), *tgt = malloc(n * 4);
    for (int s = 0; s < t->steps; s++) {
        us_task_batch(&task, t->batch * t->grad_accum, t->seq, in, tgt);
        us_step_stats st;
        if (us_train_step(&m, in, tgt, &st) != US_OK) {
            puts(us_model_error(&m));
            break;
        }
        if (st.step % 50 == 0)
            printf("step %d loss %.4f\n", st.step, st.loss); /* accumulated, clipped, AdamW */
    }
    free(in);
    free(tgt);
    us_model_free(&m);
    return 0;
}
