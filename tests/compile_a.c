/* compile_a.c + compile_b.c: the two-translation-unit build. This file holds the implementation;
   compile_b.c includes only the declarations and calls into it. Also compiled alone with
   -std=c99 -pedantic -Werror, as C++, with ULTRASCALE_STATIC and without OpenMP. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include <string.h>
#include "../ultrascale.h" /* including twice is harmless */

int us_compile_b_main(void);

int main(void) {
    us_model_config mc;
    us_train_config tc;
    char err[128];
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc); /* zero means default */
    if (us_config_validate(&mc, &tc, err, sizeof err) != US_OK) return 1;
#ifndef US_COMPILE_SINGLE
    return us_compile_b_main();
#else
    return 0;
#endif
}
