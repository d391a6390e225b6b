/* tokenize.c — text into llm.c token shards with a Hugging Face tokenizer.json (// >>tokenizer),
   and back:
       build/tokenize --tokenizer tokenizer.json --out data/shakes input.txt [more.txt ...]
   writes data/shakes_000000.bin, _000001.bin, ... (--shard-tokens tokens each, default 100M), the
   files' tokens one after the other, in the format us_data_load_shard reads (build/train --data):
   a header of 256 int32 (magic 20240520, version 1, token count) then uint16 tokens when every
   id fits (the vocabulary has at most 65536 ids), else magic 20240801, version 7, uint32 tokens.
       build/tokenize --tokenizer tokenizer.json --decode data/shakes_000000.bin
   writes the shard's text to stdout. */
#define _POSIX_C_SOURCE 200809L
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"

#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>

static int usage(void) {
    fprintf(stderr, "usage: tokenize --tokenizer tokenizer.json --out PREFIX [--shard-tokens N] "
                    "FILE...\n"
                    "       tokenize --tokenizer tokenizer.json --decode SHARD.bin\n");
    return 2;
}

/* One shard: the header and n tokens of width 2 or 4 bytes. */
static int write_shard(const char *prefix, int k, const int32_t *ids, int64_t n, int wide) {
    char path[1024];
    int32_t hdr[256];
    int64_t i;
    FILE *f;
    snprintf(path, sizeof path, "%s_%06d.bin", prefix, k);
    memset(hdr, 0, sizeof hdr);
    hdr[0] = wide ? 20240801 : 20240520;
    hdr[1] = wide ? 7 : 1;
    hdr[2] = (int32_t)n;
    f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "tokenize: cannot write %s: %s\n", path, strerror(errno));
        return 0;
    }
    fwrite(hdr, sizeof hdr, 1, f);
    for (i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                              (unsigned char)(v >> 24)};
        fwrite(b, wide ? 4 : 2, 1, f);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "tokenize: cannot write %s\n", path);
        return 0;
    }
    printf("wrote %s: %lld tokens of %d bytes\n", path, (long long)n, wide ? 4 : 2);
    return 1;
}

/* A file's text appended to the tokens (*ids grows). */
static int encode_file(us_tokenizer *t, const char *path, int32_t **ids, int64_t *n) {
    FILE *f = fopen(path, "rb");
    char *text;
    long sz;
    size_t got, cap, n_ids;
    int32_t *grown;
    if (!f || fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "tokenize: cannot read %s\n", path);
        if (f) fclose(f);
        return 0;
    }
    text = (char *)malloc((size_t)sz + 1);
    got = text ? fread(text, 1, (size_t)sz, f) : 0;
    fclose(f);
    cap = 2 * (size_t)sz + 1;
    grown = (int32_t *)realloc(*ids, ((size_t)*n + cap) * 4);
    if (!text || got != (size_t)sz || !grown) {
        fprintf(stderr, "tokenize: cannot read %s (%ld bytes)\n", path, sz);
        free(text);
        return 0;
    }
    *ids = grown;
    if (us_tok_encode(t, text, (size_t)sz, *ids + *n, cap, &n_ids) != US_OK) {
        fprintf(stderr, "tokenize: %s: %s\n", path, t->err);
        free(text);
        return 0;
    }
    printf("%s: %ld bytes, %zu tokens\n", path, sz, n_ids);
    *n += (int64_t)n_ids;
    free(text);
    return 1;
}

static int decode_shard(us_tokenizer *t, const char *path) {
    us_data d;
    size_t len;
    char *text;
    if (us_data_load_shard(&d, path) != US_OK) {
        fprintf(stderr, "tokenize: %s\n", d.err);
        return 1;
    }
    if (us_tok_decode(t, d.tokens, (size_t)d.n, 0, NULL, 0, &len) != US_OK ||
        !(text = (char *)malloc(len + 1)) ||
        us_tok_decode(t, d.tokens, (size_t)d.n, 0, text, len + 1, &len) != US_OK) {
        fprintf(stderr, "tokenize: %s: %s\n", path, t->err);
        us_data_free(&d);
        return 1;
    }
    fwrite(text, 1, len, stdout);
    free(text);
    us_data_free(&d);
    return 0;
}

int main(int argc, char **argv) {
    const char *tok_path = NULL, *out = NULL, *decode = NULL;
    long long shard = 100000000;
    int i, nfiles = 0, ok = 1, k, wide;
    int32_t *ids = NULL;
    int64_t n = 0, at;
    us_tokenizer t;
    char *end;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tok_path = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            decode = argv[++i];
        else if (!strcmp(argv[i], "--shard-tokens") && i + 1 < argc) {
            shard = strtoll(argv[++i], &end, 10);
            if (*end || shard < 1 || shard > 2147483647LL) {
                fprintf(stderr, "tokenize: --shard-tokens must be between 1 and 2147483647 (a "
                                "shard's header counts its tokens in an int32)\n");
                return 2;
            }
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            fprintf(stderr, "tokenize: unknown flag %s\n", argv[i]);
            return usage();
        } else
            argv[nfiles++ + 1] = argv[i];
    }
    if (!tok_path || (!decode && (!out || !nfiles))) return usage();
    if (us_tok_load(&t, tok_path) != US_OK) {
        fprintf(stderr, "tokenize: %s\n", t.err);
        return 1;
    }
    if (decode) {
        ok = !decode_shard(&t, decode);
        us_tok_free(&t);
        return ok ? 0 : 1;
    }
    wide = t.n_vocab > 65536; /* the uint16 format holds ids up to 65535 */
    for (i = 0; i < nfiles && ok; i++) ok = encode_file(&t, argv[i + 1], &ids, &n);
    if (ok && n == 0) {
        fprintf(stderr, "tokenize: the files hold no text: a shard needs at least one token\n");
        ok = 0;
    }
    for (at = 0, k = 0; ok && at < n; at += shard, k++)
        ok = write_shard(out, k, ids + at, n - at < shard ? n - at : shard, wide);
    free(ids);
    us_tok_free(&t);
    return ok ? 0 : 1;
}
