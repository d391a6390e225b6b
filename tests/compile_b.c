/* compile_b.c: the second translation unit — declarations only, linked against compile_a.c. */
#include "../ultrascale.h"
#include <string.h>
#include <stdio.h>

int us_compile_b_main(void);

int us_compile_b_main(void) {
    us_model_config mc;
    us_train_config tc;
    us_memory mem;
    char err[128];
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    if (us_memory_estimate(&mc, &tc, &mem, err, sizeof err) != US_OK) return 1;
    if (us_f32_to_bf16(1.0f) != 0x3F80) return 1;
    printf("two translation units: %lld params, %zu bytes\n", (long long)us_param_count(&mc),
           mem.total);
    return 0;
}
