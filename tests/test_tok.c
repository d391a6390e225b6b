/* test_tok.c — the byte-level BPE tokenizer (// >>tokenizer) against Hugging Face's `tokenizers`:
   the ids it gave for each fixture text, the pre-tokenisers' pieces, its decode of random ids
   (tests/tok, written by tests/tok_fixtures.py); round trips of random bytes; bad tokenizer.json
   files refused in a sentence. Run from the repository root (or give the fixture folder). */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <stdlib.h>
#include <string.h>

static const char *dir = "tests/tok";

/* A whole fixture file, NUL-terminated; NULL when missing. */
static char *slurp(const char *name, size_t *n) {
    char path[512];
    FILE *f;
    long sz;
    char *buf;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char *)malloc((size_t)sz + 1);
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) sz = 0;
    buf[sz] = 0;
    fclose(f);
    *n = (size_t)sz;
    return buf;
}

/* Whitespace-separated integers of a fixture file into a new array. */
static long *numbers(const char *name, size_t *count) {
    size_t n, k = 0;
    char *s = slurp(name, &n), *p, *end;
    long *v;
    if (!s) return NULL;
    v = (long *)malloc((n + 1) * sizeof(long));
    for (p = s;; p = end) {
        long x = strtol(p, &end, 10);
        if (end == p) break;
        v[k++] = x;
    }
    free(s);
    *count = k;
    return v;
}

static int load(us_tokenizer *t, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    if (us_tok_load(t, path) == US_OK) return 1;
    CHECK(0, "load %s: %s", path, t->err);
    return 0;
}

/* encode(text) equals the ids of tokenizers; decode(ids) gives the text back (round). */
static void check_encode(us_tokenizer *t, const char *tok, const char *text, int round) {
    char name[128], *s, *back;
    size_t n, n_ref, n_ids, i, len = 0;
    long *ref;
    int32_t *ids;
    snprintf(name, sizeof name, "%s.txt", text);
    s = slurp(name, &n);
    snprintf(name, sizeof name, "%s.%s.ids", tok, text);
    ref = numbers(name, &n_ref);
    if (!s || !ref) {
        CHECK(0, "fixture %s or %s.txt missing (tests/tok_fixtures.py writes them)", name, text);
        return;
    }
    ids = (int32_t *)malloc((2 * n + 1) * 4);
    CHECK(us_tok_encode(t, s, n, ids, 2 * n + 1, &n_ids) == US_OK, "encode %s", name);
    for (i = 0; i < n_ids && i < n_ref && ids[i] == ref[i]; i++) {
    }
    CHECK(n_ids == n_ref && i == n_ref,
          "%s: %zu ids equal to tokenizers' %zu (first difference at %zu)", name, n_ids, n_ref, i);
    back = (char *)malloc(n + 1 + (size_t)t->max_bytes * n_ids);
    if (round) {
        us_result r = us_tok_decode(t, ids, n_ids, 0, back, n + 1, &len);
        CHECK(r == US_OK && len == n && !memcmp(back, s, n), "%s: decode gives the text back",
              name);
    }
    free(back);
    free(ids);
    free(ref);
    free(s);
}

/* the pre-tokeniser's pieces (their byte lengths) against tokenizers' Split with the same regex */
static void check_cuts(us_tokenizer *t, const char *pat, const char *text) {
    char name[128], *s;
    size_t n, n_ref, n_cut, i, prev = 0;
    long *ref;
    size_t *ends;
    snprintf(name, sizeof name, "%s.txt", text);
    s = slurp(name, &n);
    snprintf(name, sizeof name, "%s.%s.cuts", pat, text);
    ref = numbers(name, &n_ref);
    if (!s || !ref) {
        CHECK(0, "fixture %s missing", name);
        return;
    }
    ends = (size_t *)malloc((n + 1) * sizeof(size_t));
    CHECK(us_tok_pretokenize(t, s, n, ends, n + 1, &n_cut) == US_OK, "pretokenize %s", name);
    for (i = 0; i < n_cut && i < n_ref && (long)(ends[i] - prev) == ref[i]; i++) prev = ends[i];
    CHECK(n_cut == n_ref && i == n_ref,
          "%s: %zu pieces as tokenizers' %zu (first difference at piece %zu, byte %zu: \"%.12s\")",
          name, n_cut, n_ref, i, prev, s + prev);
    free(ends);
    free(ref);
    free(s);
}

/* Lines "ids\thex": tokenizers' decode of random id sequences (invalid UTF-8 as U+FFFD). */
static void check_decode(us_tokenizer *t, const char *tok, int skip) {
    char name[128], *s, *line, *next, out[4096], hex[8200];
    size_t n, len, lines = 0, good = 0;
    snprintf(name, sizeof name, "%s.dec%d", tok, skip);
    s = slurp(name, &n);
    if (!s) {
        CHECK(0, "fixture %s missing", name);
        return;
    }
    for (line = s; *line; line = next) {
        int32_t ids[64];
        int k = 0;
        char *p = line, *tab = strchr(line, '\t'), *end;
        size_t i;
        next = strchr(line, '\n');
        *next++ = 0;
        for (; p < tab && k < 64; p = end) {
            ids[k] = (int32_t)strtol(p, &end, 10);
            if (end == p) break;
            k++;
        }
        if (us_tok_decode(t, ids, (size_t)k, US_TOK_LOSSY | (skip ? US_TOK_SKIP_SPECIAL : 0), out,
                          sizeof out, &len) != US_OK)
            continue;
        for (i = 0; i < len; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)out[i]);
        hex[2 * len] = 0;
        good += !strcmp(hex, tab + 1);
        lines++;
    }
    CHECK(lines >= 300 && good == lines, "%s: %zu of %zu decodes equal tokenizers'", name, good,
          lines);
    free(s);
}

/* Random bytes (invalid UTF-8 too) come back from encode and decode. */
static void check_random_bytes(us_tokenizer *t, const char *tok) {
    enum { N = 3000 };

    char text[N], back[N + 1];
    int32_t ids[2 * N + 1];
    size_t n_ids, len, i, bad = 0, trial;
    for (trial = 0; trial < 20; trial++) {
        for (i = 0; i < N; i++) {
            uint64_t r = rnd64();
            text[i] = r % 4 ? (char)(r >> 8) : " \n\t'aZ9"[(r >> 8) % 7];
        }
        if (us_tok_encode(t, text, N, ids, 2 * N + 1, &n_ids) != US_OK ||
            us_tok_decode(t, ids, n_ids, 0, back, sizeof back, &len) != US_OK || len != N ||
            memcmp(back, text, N))
            bad++;
    }
    CHECK(bad == 0, "%s: 20 texts of random bytes come back (%zu do not)", tok, bad);
}

/* json with one substitution must be refused with a sentence containing `needle`. */
static void expect_refused(const char *json, size_t n, const char *from, const char *to,
                           const char *needle) {
    const char *at = strstr(json, from);
    size_t a, m;
    char *edited;
    us_tokenizer t;
    us_result r;
    if (!at) {
        CHECK(0, "the fixture holds \"%s\"", from);
        return;
    }
    a = (size_t)(at - json);
    m = n - strlen(from) + strlen(to);
    edited = (char *)malloc(m + 1);
    memcpy(edited, json, a);
    memcpy(edited + a, to, strlen(to));
    memcpy(edited + a + strlen(to), at + strlen(from), n - a - strlen(from));
    r = us_tok_parse(&t, edited, m);
    CHECK(r != US_OK && strstr(t.err, needle) && t.pool == NULL, "%s → %s: refused (\"%s\")", from,
          to, t.err);
    free(edited);
}

static void check_refusals(void) {
    size_t n, ln;
    char *json = slurp("gpt2.json", &n), *llama = slurp("llama3.json", &ln);
    us_tokenizer t;
    int32_t bad = 99999, ok = 65;
    size_t len;
    if (!json) {
        CHECK(0, "gpt2.json missing");
        return;
    }
    expect_refused(json, n, "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}",
                   "sets a normalizer");
    expect_refused(json, n, "\"use_regex\": true", "\"use_regex\": false", "must use its regex");
    expect_refused(json, n, "\"type\": \"ByteLevel\"", "\"type\": \"Metaspace\"", "pre_tokenizer");
    expect_refused(json, n, "\"dropout\": null", "\"dropout\": 0.1", "dropout");
    expect_refused(json, n, "\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "not BPE");
    expect_refused(json, n, "\"version\"", "\"versions\"", "field \"versions\"");
    expect_refused(json, n, "\"!\": ", "\"!!\": ", "byte 0x21");
    expect_refused(json, n, "\"single_word\": false", "\"single_word\": true", "single_word");
    expect_refused(json, n, "\"merges\": [", "\"merges\": [[\"Ġ\", \"zzz\"], ", "merge 0");
    expect_refused(json, n, "\"merges\": [", "\"merges\": [\"a b c\", ", "merge 0");
    expect_refused(json, n, "\"model\": {", "\"model\": {\"model_max\": 1, ",
                   "field \"model_max\"");
    expect_refused(json, n, "\"vocab\": {", "\"vocab\": {\"x\": -1, ", "vocabulary id");
    expect_refused(json, n, "\"decoder\": {\n    \"type\": \"ByteLevel\"",
                   "\"decoder\": {\n    \"type\": \"WordPiece\"", "decoder");
    expect_refused(json, n, "\"pre_tokenizer\": {\n    \"type\": \"ByteLevel\"",
                   "\"pre_tokenizer\": {\n    \"type\": \"Split\"", "pre_tokenizer");
    if (llama) {
        expect_refused(llama, ln, "p{N}{1,3}", "p{N}{1,2}", "neither GPT-2's nor Llama 3's");
        expect_refused(llama, ln, "\"use_regex\": false", "\"use_regex\": true",
                       "ByteLevel after Split");
    }
    CHECK(us_tok_parse(&t, json, n / 2) != US_OK && strstr(t.err, "JSON"),
          "a truncated file: \"%s\"", t.err);
    CHECK(us_tok_encode(&t, "ab", 2, &ok, 1, &len) == US_ERR_INVALID && strstr(t.err, "not loaded"),
          "encode with a tokenizer that did not load: \"%s\"", t.err);
    CHECK(us_tok_load(&t, "tests/tok/none.json") == US_ERR_IO && strstr(t.err, "none.json"),
          "a missing file: \"%s\"", t.err);
    CHECK(us_tok_parse(&t, json, n) == US_OK, "gpt2.json parses");
    CHECK(us_tok_decode(&t, &bad, 1, 0, NULL, 0, &len) == US_ERR_INVALID && strstr(t.err, "99999"),
          "an unknown id is refused: \"%s\"", t.err);
    CHECK(us_tok_decode(&t, &ok, 1, 0, NULL, 0, &len) == US_OK && len == 1, "decode counts bytes");
    { /* US_TOK_SKIP_UNKNOWN: the unknown id is left out, the others decode as without it */
        const int32_t mixed[3] = {ok, bad, ok}, known[2] = {ok, ok};
        char a[16], b[16];
        size_t la = 0, lb = 0;
        CHECK(us_tok_decode(&t, mixed, 3, US_TOK_SKIP_UNKNOWN, a, sizeof a, &la) == US_OK &&
                  us_tok_decode(&t, known, 2, 0, b, sizeof b, &lb) == US_OK && la == lb &&
                  !memcmp(a, b, la),
              "US_TOK_SKIP_UNKNOWN leaves the unknown id out (%zu bytes)", la);
    }
    us_tok_free(&t);
    free(json);
    free(llama);
}

int main(int argc, char **argv) {
    static const char *texts[] = {"shakes", "mixed", "random"};
    us_tokenizer gpt2, gpt2p, llama3;
    int k;
    if (argc > 1) dir = argv[1];
    check_refusals();
    if (!load(&gpt2, "gpt2") || !load(&gpt2p, "gpt2p") || !load(&llama3, "llama3"))
        return us_test_done("test_tok");
    CHECK(gpt2.pattern == US_TOK_GPT2 && llama3.pattern == US_TOK_LLAMA3 && llama3.ignore_merges &&
              gpt2p.add_prefix_space && !gpt2.add_prefix_space,
          "patterns and flags read");
    for (k = 0; k < 3; k++) {
        check_encode(&gpt2, "gpt2", texts[k], 1);
        check_encode(&llama3, "llama3", texts[k], 1);
        check_cuts(&gpt2, "gpt2", k ? texts[k] : "edges");
        check_cuts(&llama3, "llama3", k ? texts[k] : "edges");
    }
    check_encode(&gpt2p, "gpt2p", "shakes", 0);
    check_encode(&gpt2p, "gpt2p", "mixed", 0);
    check_encode(&gpt2, "gpt2", "strip", 0);
    check_encode(&gpt2p, "gpt2p", "strip", 0);
    check_encode(&llama3, "llama3", "strip", 1);
    check_decode(&gpt2, "gpt2", 0);
    check_decode(&gpt2, "gpt2", 1);
    check_decode(&llama3, "llama3", 0);
    check_decode(&llama3, "llama3", 1);
    check_random_bytes(&gpt2, "gpt2");
    check_random_bytes(&llama3, "llama3");
    us_tok_free(&gpt2);
    us_tok_free(&gpt2p);
    us_tok_free(&llama3);
    return us_test_done("test_tok");
}
