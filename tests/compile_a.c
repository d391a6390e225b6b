/* compile_a.c + compile_b.c: the two-translation-unit build. This file holds the implementation;
   compile_b.c includes only the declarations and calls into it. Also compiled alone with
   -std=c99 -pedantic -Werror, as C++, with ULTRASCALE_STATIC and without OpenMP. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale.h"   /* including twice is harmless */

int us_compile_b_main(void);

int main(void) {
    us_model_config mc = {0};
    us_train_config tc = {0};
    char err[128];
    if (us_config_validate(&mc, &tc, err, sizeof err) != US_OK) return 1;
#ifndef US_COMPILE_SINGLE
    return us_compile_b_main();
#else
    return 0;
#endif
}
