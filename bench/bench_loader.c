/* bench_loader.c — the shard loader's speed (// >>data), one thread:
       build/bench_loader DIR [shards] [Mtokens per shard] [T]
   writes `shards` llm.c version 1 shards of random tokens into DIR (default 8 of 10M tokens),
   then times: opening them (headers checked, files mapped), a batch of 64 windows of T + 1
   (default 1024) from the mapped files and read with stdio (no_map), against us_data_load
   reading one shard whole. Prints tokens per second; the files stay in DIR for another run. */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* a shard of n random uint16 tokens below 50257 (GPT-2's vocabulary), unless it exists */
static int write_shard(const char *path, int64_t n, uint64_t seed) {
    int32_t hdr[256];
    uint16_t buf[4096];
    us_rng r;
    int64_t done = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        return 0;
    }
    if (!(f = fopen(path, "wb"))) return 1;
    memset(hdr, 0, sizeof hdr);
    hdr[0] = 20240520;
    hdr[1] = 1;
    hdr[2] = (int32_t)n;
    fwrite(hdr, 4, 256, f);
    us_rng_seed(&r, seed);
    while (done < n) {
        int64_t k = n - done < 4096 ? n - done : 4096, i;
        for (i = 0; i < k; i++) buf[i] = (uint16_t)(us_rng_u64(&r) % 50257);
        fwrite(buf, 2, (size_t)k, f);
        done += k;
    }
    return fclose(f) != 0;
}

/* windows per second over `batches` batches of 64 */
static double time_windows(us_loader *l, int batches, int32_t *in, int32_t *tg) {
    double t0 = now();
    int b;
    for (b = 0; b < batches; b++)
        if (us_loader_next(l, 64, 0, 64, in, tg) != US_OK) {
            fprintf(stderr, "bench_loader: %s\n", l->err);
            exit(1);
        }
    return 64.0 * batches / (now() - t0);
}

int main(int argc, char **argv) {
    int ns = argc > 2 ? atoi(argv[2]) : 8, T = argc > 4 ? atoi(argv[4]) : 1024, i, mode;
    int64_t per = (int64_t)(argc > 3 ? atof(argv[3]) : 10.0) * 1000000;
    char **paths;
    us_loader_config c;
    us_loader l;
    us_data d;
    int32_t *in, *tg;
    double t0;
    if (argc < 2 || ns < 1 || per < 2 || T < 1) {
        fprintf(stderr, "usage: bench_loader DIR [shards] [Mtokens per shard] [T]\n");
        return 2;
    }
    paths = (char **)malloc(sizeof(char *) * (size_t)ns);
    for (i = 0; i < ns; i++) {
        paths[i] = (char *)malloc(strlen(argv[1]) + 32);
        sprintf(paths[i], "%s/bench_%03d.bin", argv[1], i);
        if (write_shard(paths[i], per, (uint64_t)i + 1)) {
            fprintf(stderr, "bench_loader: cannot write %s\n", paths[i]);
            return 1;
        }
    }
    in = (int32_t *)malloc((size_t)64 * T * 4);
    tg = (int32_t *)malloc((size_t)64 * T * 4);
    memset(&c, 0, sizeof c);
    c.T = T;
    c.seed = 1;
    for (mode = 0; mode < 2; mode++) {
        double w;
        c.no_map = mode;
        t0 = now();
        if (us_loader_open(&l, (const char *const *)paths, ns, &c) != US_OK) {
            fprintf(stderr, "bench_loader: %s\n", l.err);
            return 1;
        }
        printf("%s: opened %d shards (%lld tokens) in %.2f ms\n", mode ? "stdio" : "mmap", ns,
               (long long)l.n_tokens, 1e3 * (now() - t0));
        time_windows(&l, 20, in, tg); /* the pages in the cache */
        w = time_windows(&l, 200, in, tg);
        printf("%s: %.0f windows/s of %d tokens = %.1f M tokens/s\n", mode ? "stdio" : "mmap", w,
               T + 1, w * (T + 1) / 1e6);
        us_loader_close(&l);
    }
    t0 = now();
    if (us_data_load(&d, paths[0]) != US_OK) {
        fprintf(stderr, "bench_loader: %s\n", d.err);
        return 1;
    }
    printf("us_data_load: one shard whole (%lld tokens) in %.1f ms = %.1f M tokens/s\n",
           (long long)d.n, 1e3 * (now() - t0), (double)d.n / (now() - t0) / 1e6);
    us_data_free(&d);
    for (i = 0; i < ns; i++) free(paths[i]);
    free(paths);
    free(in);
    free(tg);
    return 0;
}
