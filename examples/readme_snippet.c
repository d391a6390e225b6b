/* readme_snippet.c — the README's "Using the library" example, as a program: the lines between
   the two markers are the README's code block (indented by 4 here; tests/readme_snippet.sh checks
   that they stay equal). make test builds it as C and as C++. Trains the built-in task. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <stdio.h>
#include <stdlib.h>

int main(void) {
    /* ---- README begin */
    us_model_config mc = {0}; /* zero means default */
    mc.n_layers = 2;
    mc.dim = 64;
    mc.n_heads = 4;
    us_train_config tc = {0};
    tc.batch = 16;
    tc.seq = 71;
    tc.steps = 600;
    tc.lr = 1e-2f;
    tc.precision = US_PRECISION_BF16; /* bf16 weights/activations, fp32 master + moments */
    tc.recompute = US_RECOMPUTE_SELECTIVE;

    us_model m;
    if (us_model_init(&m, &mc, &tc, NULL) != US_OK) { /* NULL = CPU ops */
        /* a sentence, e.g. "heads=8 not divisible by kv-heads=3" */
        fprintf(stderr, "%s\n", us_model_error(&m));
        return 1;
    }
    us_task task;
    us_task_init(&task, 1);
    int32_t *in = (int32_t *)malloc(16 * 71 * 4), *tgt = (int32_t *)malloc(16 * 71 * 4);
    for (int s = 0; s < tc.steps; s++) {
        us_task_batch(&task, tc.batch, tc.seq, in, tgt); /* or us_data_batch(&data, ...) */
        us_step_stats st;
        if (us_train_step(&m, in, tgt, &st) != US_OK) break;
        printf("step %d loss %.3f grad norm %.2f\n", st.step, st.loss, st.grad_norm);
    }
    free(in);
    free(tgt);
    us_model_free(&m);
    /* ---- README end */
    return 0;
}
