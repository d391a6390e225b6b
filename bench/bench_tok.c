/* bench_tok.c — encoding speed of the tokenizer (// >>tokenizer), one thread:
       build/bench_tok tokenizer.json text.txt [repeats]
   prints the tokens, MB/s and an FNV hash of the ids (bench/bench_tok.py compares it with
   Hugging Face tokenizers' ids and speed). */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    us_tokenizer t;
    FILE *f;
    char *text;
    long n;
    int32_t *ids;
    size_t n_ids = 0, i;
    int r, repeats = argc > 3 ? atoi(argv[3]) : 5;
    double best = 1e30, t0;
    uint64_t h = 1469598103934665603ull;
    if (argc < 3 || repeats < 1) {
        fprintf(stderr, "usage: bench_tok tokenizer.json text.txt [repeats]\n");
        return 2;
    }
    if (us_tok_load(&t, argv[1]) != US_OK) {
        fprintf(stderr, "bench_tok: %s\n", t.err);
        return 1;
    }
    f = fopen(argv[2], "rb");
    if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        fprintf(stderr, "bench_tok: cannot read %s\n", argv[2]);
        return 1;
    }
    text = (char *)malloc((size_t)n + 1);
    ids = (int32_t *)malloc((2 * (size_t)n + 1) * 4);
    if (!text || !ids || fread(text, 1, (size_t)n, f) != (size_t)n) return 1;
    fclose(f);
    for (r = 0; r < repeats; r++) {
        t0 = now();
        if (us_tok_encode(&t, text, (size_t)n, ids, 2 * (size_t)n + 1, &n_ids) != US_OK) return 1;
        if (now() - t0 < best) best = now() - t0;
    }
    for (i = 0; i < n_ids; i++) h = (h ^ (uint64_t)(uint32_t)ids[i]) * 1099511628211ull;
    printf("tokens %zu bytes %ld best_s %.4f MB_s %.2f fnv %016llx\n", n_ids, n, best,
           (double)n / best / 1e6, (unsigned long long)h);
    us_tok_free(&t);
    free(text);
    free(ids);
    return 0;
}
