/* fuzz_safetensors.c — the checkpoint readers (// >>checkpoint) under a fuzzer. One input is read
   three ways: as a safetensors file (header length, JSON header, offsets against the input's size),
   as a model.safetensors.index.json shard index, and — when it parses as safetensors — every
   tensor entry's byte range is touched, so an offset the parser let through outside the input
   would be an ASan error.
     make fuzz          libFuzzer + ASan (clang), ≥ 10^6 executions over tests/fuzz_corpus/
     make test          runs build/fuzz_replay: this file without a fuzzing engine, feeding each
                        corpus file (and each of its prefixes, a cheap truncation sweep) to the readers */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned us__fuzz_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    us_safetensors st;
    char err[256], files[8][256];
    int nf = 0, i;
    if (us_safetensors_parse(&st, data, size, size, err, sizeof err) == US_OK) {
        for (i = 0; i < st.n;
             i++) { /* a valid entry lies inside the input: read its first and last bytes */
            const us_st_tensor *t = &st.t[i];
            if (t->end > t->begin)
                us__fuzz_sink += data[st.data_start + t->begin] + data[st.data_start + t->end - 1];
        }
        us_safetensors_free(&st);
    } else if (!err[0])
        abort(); /* every failure explains itself */
    if (us_safetensors_index_parse((const char *)data, size, files, 8, &nf, err, sizeof err) ==
        US_OK) {
        for (i = 0; i < nf; i++)
            if (!files[i][0] || strchr(files[i], '/')) abort();
    } else if (!err[0])
        abort();
    return 0;
}

#ifndef US_FUZZ_ENGINE
/* The replay: each file given, whole and cut at every length up to 512 bytes. */
int main(int argc, char **argv) {
    int i, n = 0;
    for (i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        long len;
        size_t k;
        uint8_t *buf;
        if (!f) {
            printf("fuzz_replay: cannot open %s\n", argv[i]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        len = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf = (uint8_t *)malloc((size_t)len + 1);
        if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
            printf("fuzz_replay: cannot read %s\n", argv[i]);
            fclose(f);
            return 1;
        }
        fclose(f);
        for (k = 0; k <= (size_t)len && k <= 512;
             k++) { /* each prefix in a buffer of exactly its size (ASan sees overreads) */
            uint8_t *cut = (uint8_t *)malloc(k ? k : 1);
            memcpy(cut, buf, k);
            LLVMFuzzerTestOneInput(cut, k);
            free(cut);
        }
        LLVMFuzzerTestOneInput(buf, (size_t)len);
        free(buf);
        n++;
    }
    printf("fuzz_replay: %d corpus files (and their prefixes) read without a crash\n", n);
    printf("fuzz_replay: %d passed, 0 failed\n", n);
    return 0;
}
#endif
