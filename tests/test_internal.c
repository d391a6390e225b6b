/* test_internal.c — the tests that reach into the implementation's private functions and types
   (test_dp, test_tp, test_fp8_train, test_moe) in one program: `test_internal dp [ARGS]` runs
   test_dp.c's main with ARGS. make test compiles this file inside the implementation's own
   translation unit (tests/us_impl.c defines US_TEST_INTERNAL_IN_IMPL, and main is then
   us_test_internal_main, called by tests/test_internal_main.c), so that the implementation is
   compiled once per flag set for every test, these four included. This file still builds alone
   (cc tests/test_internal.c), and so does each test file (cc tests/test_dp.c). */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#define ULTRASCALE_STATIC
#include "../ultrascale.h"
#include "../ultrascale_comm.h"

#include <stdio.h>
#include <string.h>

/* test_dp.c and test_tp.c each name their run, rank function, launcher and set-up alike */
#define run dp_run
#define rank_fn dp_rank_fn
#define launch dp_launch
#define setup dp_setup
#define main test_dp_main
#include "test_dp.c"
#undef run
#undef rank_fn
#undef launch
#undef setup
#undef main
#undef STEPS
#undef GB
#undef T

#define main test_tp_main
#include "test_tp.c"
#undef main
#undef STEPS
#undef GB
#undef T

#define main test_fp8_train_main
#include "test_fp8_train.c"
#undef main

#define main test_moe_main
#include "test_moe.c"
#undef main

#ifdef US_TEST_INTERNAL_IN_IMPL
int us_test_internal_main(int argc, char **argv);
#define US__TEST_INTERNAL_MAIN us_test_internal_main
#else
#define US__TEST_INTERNAL_MAIN main
#endif

int US__TEST_INTERNAL_MAIN(int argc, char **argv) {
    static const struct {
        const char *name;
        int (*main)(int, char **);
    } tests[] = {{"dp", test_dp_main},
                 {"tp", test_tp_main},
                 {"fp8_train", test_fp8_train_main},
                 {"moe", test_moe_main}};

    int i;
    for (i = 0; argc > 1 && i < (int)(sizeof tests / sizeof tests[0]); i++)
        if (!strcmp(argv[1], tests[i].name)) return tests[i].main(argc - 1, argv + 1);
    fprintf(stderr, "usage: test_internal dp | tp | fp8_train | moe [ARGS]\n");
    return 2;
}
