/* us_test.h — the tiny harness every test program uses.
   CHECK(cond, fmt, ...) records one result; us_test_done() prints "<prog>: N passed, N failed"
   and returns the exit code. A test program is one C file that includes the implementation. */
#ifndef US_TEST_H
#define US_TEST_H
#include <stdio.h>

static int us_test_pass, us_test_fail, us_test_verbose;

#define CHECK(cond, ...) do {                                                  \
        if (cond) { us_test_pass++; if (us_test_verbose) { printf("  ok   "); printf(__VA_ARGS__); printf("\n"); } } \
        else { us_test_fail++; printf("  FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
    } while (0)

static int us_test_done(const char *prog) {
    printf("%s: %d passed, %d failed\n", prog, us_test_pass, us_test_fail);
    return us_test_fail ? 1 : 0;
}
#endif
