/* compile_optout.c: the implementation with one part left out (make test compiles it with each
   of -DULTRASCALE_NO_CHECKPOINT, -DULTRASCALE_NO_PLANNER, -DULTRASCALE_NO_DATA,
   -DULTRASCALE_NO_TOKENIZER, C99 -pedantic -Werror): what remains compiles, warns about nothing, and trains a step. */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include <string.h>

int main(void) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    us_step_stats st;
    int32_t in[2 * 16], tgt[2 * 16];
    int i;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.n_layers = 1;
    mc.dim = 16;
    mc.n_heads = 2;
    mc.vocab = 32;
    tc.batch = 2;
    tc.seq = 16;
    tc.steps = 1;
    for (i = 0; i < 2 * 16; i++) {
        in[i] = i % 32;
        tgt[i] = (i + 1) % 32;
    }
    if (us_model_init(&m, &mc, &tc, NULL) != US_OK) return 1;
    if (us_train_step(&m, in, tgt, &st) != US_OK) return 1;
    us_model_free(&m);
    return 0;
}
