/* us_test.h — the tiny harness every test program uses.
   CHECK(cond, fmt, ...) records one result; us_test_done() prints "<prog>: N passed, N failed"
   and returns the exit code. A test program is one C file that includes the implementation. */
#ifndef US_TEST_H
#define US_TEST_H
#include <stdint.h>
#include <stdio.h>

static int us_test_pass, us_test_fail, us_test_verbose;

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (cond) {                                       \
            us_test_pass++;                               \
            if (us_test_verbose) {                        \
                printf("  ok   ");                        \
                printf(__VA_ARGS__);                      \
                printf("\n");                             \
            }                                             \
        } else {                                          \
            us_test_fail++;                               \
            printf("  FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                          \
            printf("\n");                                 \
        }                                                 \
    } while (0)

/* An RNG of the tests' own (splitmix64), independent of the library's, so a bug there cannot
   hide one here. Seed by assigning us_test_rs. */
static uint64_t us_test_rs = 12345;

static inline uint64_t rnd64(void) {
    uint64_t z = (us_test_rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double rnd01(void) { return (double)(rnd64() >> 11) * (1.0 / 9007199254740992.0); }

static int us_test_done(const char *prog) {
    printf("%s: %d passed, %d failed\n", prog, us_test_pass, us_test_fail);
    return us_test_fail ? 1 : 0;
}
#endif
