/* test_data.c — the shard loader (us_loader, // >>data): every window once per epoch, another
   order the next epoch, dp ranks reading disjoint rows that make up the group's batch, a resumed
   loader reading what an uninterrupted one reads, the held-out tail, and bad shards refused.
   The shards' tokens are their own positions in the list (token = index), so a window says
   where it came from and what it must hold without asking the loader. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NSH 5
#define SEQ 8
/* shard sizes: a version 7 shard among version 1 ones, one too short for a window of SEQ + 1 */
static const int sizes[NSH] = {200, 97, 5, 161, 330};
static const int versions[NSH] = {1, 1, 7, 1, 1};
static char dir[256], paths[NSH][300];
static const char *plist[NSH];
static int total;
static int64_t windows_in[NSH], first_of[NSH], n_windows;

/* a shard of n tokens first, first + 1, ... (a header of 256 int32, then the tokens) */
static void write_shard(const char *path, int version, int first, int n, int hdr_n) {
    int32_t hdr[256];
    FILE *f = fopen(path, "wb");
    int i;
    memset(hdr, 0, sizeof hdr);
    hdr[0] = version == 1 ? 20240520 : 20240801;
    hdr[1] = version;
    hdr[2] = hdr_n;
    fwrite(hdr, 4, 256, f);
    for (i = 0; i < n; i++) {
        uint16_t a = (uint16_t)(first + i);
        uint32_t b = (uint32_t)(first + i);
        if (version == 1)
            fwrite(&a, 2, 1, f);
        else
            fwrite(&b, 4, 1, f);
    }
    fclose(f);
}

static void make_shards(void) {
    int i;
    snprintf(dir, sizeof dir, "/tmp/us_test_data_%ld", (long)getpid());
    mkdir(dir, 0755);
    for (i = 0; i < NSH; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/shard_%02d.bin", dir, i);
        plist[i] = paths[i];
        write_shard(paths[i], versions[i], total, sizes[i], sizes[i]);
        first_of[i] = total;
        windows_in[i] = sizes[i] > SEQ ? (sizes[i] - 1) / SEQ : 0; /* whole windows of SEQ + 1 */
        n_windows += windows_in[i];
        total += sizes[i];
    }
}

static us_loader_config config(uint64_t seed) {
    us_loader_config c;
    memset(&c, 0, sizeof c);
    c.T = SEQ;
    c.seed = seed;
    return c;
}

/* the window a row holds (its shard and index), or -1 when the row is not a window: SEQ + 1
   consecutive tokens inside one shard, starting at a multiple of SEQ there, targets shifted by one */
static int64_t window_id(const int32_t *in, const int32_t *tg, int *shard) {
    int s, t;
    for (s = NSH - 1; s >= 0 && in[0] < first_of[s]; s--) continue;
    if (s < 0 || (in[0] - first_of[s]) % SEQ != 0) return -1;
    for (t = 0; t < SEQ; t++)
        if (in[t] != in[0] + t || tg[t] != in[0] + t + 1) return -1;
    if (tg[SEQ - 1] >= first_of[s] + sizes[s]) return -1;
    *shard = s;
    return (in[0] - first_of[s]) / SEQ;
}

/* one epoch, read a batch of 7 at a time: every window exactly once, in an order (ids[]) */
static void test_epochs(void) {
    us_loader l;
    int32_t in[7 * SEQ], tg[7 * SEQ];
    int64_t *seen = (int64_t *)calloc((size_t)n_windows * 3, sizeof(int64_t));
    int64_t *ids = seen + n_windows, i, bad = 0, twice = 0, sorted = 1, same = 1, done = 0;
    int e, j;
    us_loader_config c = config(1);
    us_result r = us_loader_open(&l, plist, NSH, &c);
    CHECK(r == US_OK && l.n_tokens == total && l.n_windows == n_windows,
          "five shards open: %lld tokens, %lld windows (%s)", (long long)l.n_tokens,
          (long long)l.n_windows, l.err);
    for (e = 0; e < 2 && r == US_OK; e++) {
        memset(seen, 0, (size_t)n_windows * sizeof(int64_t));
        for (i = 0; i < n_windows; i++) { /* batches of 7 cross shards and epochs */
            int s;
            int64_t w;
            if (done % 7 == 0) r = us_loader_next(&l, 7, 0, 7, in, tg);
            j = (int)(done++ % 7);
            w = window_id(in + j * SEQ, tg + j * SEQ, &s);
            if (w < 0) {
                bad++;
                continue;
            }
            {
                int q;
                int64_t idx = w;
                for (q = 0; q < s; q++) idx += windows_in[q];
                twice += seen[idx]++ > 0;
                if (e == 0) {
                    ids[i] = idx;
                    sorted &= i == 0 || idx > ids[i - 1];
                } else {
                    same &= ids[i] == idx;
                }
            }
        }
        for (i = 0; i < n_windows; i++) bad += seen[i] != 1;
        CHECK(r == US_OK && bad == 0 && twice == 0,
              "epoch %d: each of the %lld windows read once (%lld not windows or missed, %lld "
              "twice)",
              e + 1, (long long)n_windows, (long long)bad, (long long)twice);
    }
    CHECK(!sorted, "the first epoch is shuffled (not in file order)");
    CHECK(!same, "the second epoch reads the windows in another order");
    CHECK(us_loader_tell(&l).epoch == 2, "after 28 batches of 7 the loader is in epoch 2 (%lld)",
          (long long)us_loader_tell(&l).epoch);
    us_loader_close(&l);
    free(seen);
}

/* no_shuffle: the file order, window after window */
static void test_in_order(void) {
    us_loader l;
    us_loader_config c = config(3);
    int32_t in[SEQ], tg[SEQ];
    int64_t i, next = 0, ok = 1;
    int s = 0;
    c.no_shuffle = 1;
    us_loader_open(&l, plist, NSH, &c);
    for (i = 0; i < n_windows; i++) {
        int sh;
        int64_t w;
        while (next >= windows_in[s]) { /* shard 2 has none */
            s++;
            next = 0;
        }
        us_loader_next(&l, 1, 0, 1, in, tg);
        w = window_id(in, tg, &sh);
        ok &= sh == s && w == next;
        next++;
    }
    CHECK(ok, "no_shuffle reads the shards and their windows in file order");
    us_loader_close(&l);
}

/* dp: four ranks' rows of each batch of 8, side by side, are one rank's batch */
static void test_dp_split(void) {
    us_loader one, rk[4];
    int32_t in[8 * SEQ], tg[8 * SEQ], rin[8 * SEQ], rtg[8 * SEQ];
    int b, r, differ = 0;
    us_loader_config c = config(11);
    us_loader_open(&one, plist, NSH, &c);
    for (r = 0; r < 4; r++) us_loader_open(&rk[r], plist, NSH, &c);
    for (b = 0; b < 40; b++) { /* 320 windows: over two epochs */
        us_loader_next(&one, 8, 0, 8, in, tg);
        for (r = 0; r < 4; r++)
            us_loader_next(&rk[r], 8, 2 * r, 2, rin + 2 * r * SEQ, rtg + 2 * r * SEQ);
        differ += memcmp(in, rin, sizeof in) != 0 || memcmp(tg, rtg, sizeof tg) != 0;
    }
    CHECK(differ == 0, "4 dp ranks' rows make up the batch of one rank (%d of 40 differ)", differ);
    CHECK(us_loader_next(&one, 8, 6, 3, in, tg) == US_ERR_INVALID,
          "rows past the batch are refused: %s", one.err);
    us_loader_close(&one);
    for (r = 0; r < 4; r++) us_loader_close(&rk[r]);
}

/* a loader that seeks to another's position reads what that one reads next */
static void test_resume(void) {
    us_loader a, b;
    int32_t ia[5 * SEQ], ta[5 * SEQ], ib[5 * SEQ], tb[5 * SEQ];
    us_loader_pos p, bad;
    int k, differ = 0;
    us_loader_config ca = config(42), cb = config(7); /* the seed comes with the position */
    us_loader_open(&a, plist, NSH, &ca);
    us_loader_open(&b, plist, NSH, &cb);
    for (k = 0; k < 13; k++) us_loader_next(&a, 5, 0, 5, ia, ta);
    p = us_loader_tell(&a);
    CHECK(us_loader_seek(&b, p) == US_OK, "seek to epoch %lld shard %lld window %lld",
          (long long)p.epoch, (long long)p.shard, (long long)p.window);
    for (k = 0; k < 30; k++) {
        us_loader_next(&a, 5, 0, 5, ia, ta);
        us_loader_next(&b, 5, 0, 5, ib, tb);
        differ += memcmp(ia, ib, sizeof ia) != 0 || memcmp(ta, tb, sizeof ta) != 0;
    }
    CHECK(differ == 0, "a resumed loader reads the same 30 batches (%d differ)", differ);
    bad = p;
    bad.window = 1000;
    CHECK(us_loader_seek(&b, bad) == US_ERR_INVALID && strstr(b.err, "windows"),
          "a position past its shard's windows is refused: %s", b.err);
    bad = p;
    bad.shard = NSH + 1;
    CHECK(us_loader_seek(&b, bad) == US_ERR_INVALID, "a shard past the list is refused: %s", b.err);
    us_loader_close(&a);
    us_loader_close(&b);
}

/* no_map: windows read with stdio (builds without mmap) are the mapped ones */
static void test_stdio(void) {
    us_loader a, b;
    int32_t ia[6 * SEQ], ta[6 * SEQ], ib[6 * SEQ], tb[6 * SEQ], ra[100], rb[100];
    us_loader_config ca = config(9), cb = config(9);
    int k, differ = 0;
    cb.no_map = 1;
    us_loader_open(&a, plist, NSH, &ca);
    CHECK(us_loader_open(&b, plist, NSH, &cb) == US_OK && b.shards[0].map == NULL &&
              a.shards[0].map != NULL,
          "no_map opens the shards without mapping them (mapped otherwise): %s", b.err);
    for (k = 0; k < 40; k++) { /* 240 windows: over two epochs and every shard */
        us_loader_next(&a, 6, 0, 6, ia, ta);
        us_loader_next(&b, 6, 0, 6, ib, tb);
        differ += memcmp(ia, ib, sizeof ia) != 0 || memcmp(ta, tb, sizeof ta) != 0;
    }
    us_loader_read(&a, 250, 100, ra);
    us_loader_read(&b, 250, 100, rb);
    CHECK(differ == 0 && !memcmp(ra, rb, sizeof ra) && rb[99] == 349,
          "stdio reads give the mapped windows and tokens (%d batches differ)", differ);
    us_loader_close(&a);
    us_loader_close(&b);
}

/* hold_out: no window reaches the tail; us_loader_read gives the tail's tokens */
static void test_hold_out(void) {
    us_loader l;
    us_loader_config c = config(5);
    int32_t in[4 * SEQ], tg[4 * SEQ], tail[300];
    int64_t i, past = 0, nt;
    int j, ok = 1;
    c.hold_out = 0.25;
    us_loader_open(&l, plist, NSH, &c);
    nt = total - (int64_t)(total * 0.25);
    CHECK(l.n_train == nt, "hold_out 0.25 trains on the first %lld of %d tokens (%lld)",
          (long long)nt, total, (long long)l.n_train);
    for (i = 0; i < 3 * l.n_windows; i += 4) {
        us_loader_next(&l, 4, 0, 4, in, tg);
        for (j = 0; j < 4 * SEQ; j++) past += tg[j] >= nt;
    }
    CHECK(past == 0, "three epochs never read a held-out token (%lld did)", (long long)past);
    CHECK(us_loader_read(&l, nt, total - nt, tail) == US_OK, "the tail reads: %s", l.err);
    for (j = 0; j < total - nt; j++) ok &= tail[j] == nt + j;
    CHECK(ok, "the tail holds tokens %lld .. %d", (long long)nt, total - 1);
    CHECK(us_loader_read(&l, 190, 20, tail) == US_OK && tail[0] == 190 && tail[19] == 209,
          "a read across two shards (one of them version 1, one of them starts at 200)");
    CHECK(us_loader_read(&l, total - 5, 10, tail) == US_ERR_INVALID,
          "a read past the end is refused: %s", l.err);
    us_loader_close(&l);
}

/* bad shards and lists: one sentence naming the file, never a crash */
static void test_bad(void) {
    us_loader l;
    us_loader_config c = config(1);
    char p[400], **list = NULL, pat[800];
    const char *one[2];
    int n = 0;
    us_result r;
    snprintf(p, sizeof p, "%s/bad.bin", dir);
    one[0] = paths[0];
    one[1] = p;
    write_shard(p, 1, 0, 50, 60); /* the header promises more than the file holds */
    r = us_loader_open(&l, one, 2, &c);
    CHECK(r == US_ERR_FORMAT && strstr(l.err, "bad.bin") && strstr(l.err, "header promises 60"),
          "a truncated shard is refused: %s", l.err);
    write_shard(p, 1, 0, 50, 40);
    r = us_loader_open(&l, one, 2, &c);
    CHECK(r == US_ERR_FORMAT && strstr(l.err, "header promises 40"),
          "a shard longer than its header: %s", l.err);
    write_shard(p, 3, 0, 50, 50);
    r = us_loader_open(&l, one, 2, &c);
    CHECK(r == US_ERR_FORMAT && strstr(l.err, "version 3"), "a wrong version: %s", l.err);
    write_shard(p, 1, 0, 50, 50);
    {
        FILE *f = fopen(p, "r+b");
        int32_t m = 1234;
        fwrite(&m, 4, 1, f);
        fclose(f);
    }
    r = us_loader_open(&l, one, 2, &c);
    CHECK(r == US_ERR_FORMAT && strstr(l.err, "not an llm.c token shard"), "a wrong magic: %s",
          l.err);
    CHECK(truncate(p, 100) == 0, "cut %s to 100 bytes", p);
    r = us_loader_open(&l, one, 2, &c);
    CHECK(r == US_ERR_FORMAT && strstr(l.err, "truncated"), "a header cut short: %s", l.err);
    r = us_loader_open(&l, (const char *[]){"/tmp/us_no_such_shard.bin"}, 1, &c);
    CHECK(r == US_ERR_IO && strstr(l.err, "cannot open"), "a missing file: %s", l.err);
    r = us_loader_open(&l, (const char *[]){paths[2]}, 1, &c);
    CHECK(r == US_ERR_INVALID && strstr(l.err, "no shard has a window"),
          "shards too short for one window: %s", l.err);
    c.vocab = 150; /* shard 0 holds tokens up to 199 */
    r = us_loader_open(&l, plist, 1, &c);
    {
        int32_t in[25 * SEQ], tg[25 * SEQ];
        r = r == US_OK ? us_loader_next(&l, 24, 0, 24, in, tg) : r;
    }
    CHECK(r == US_ERR_FORMAT && strstr(l.err, "outside the vocabulary of 150"),
          "a token past the vocabulary is refused when read: %s", l.err);
    us_loader_close(&l);
    /* lists and patterns */
    snprintf(pat, sizeof pat, "%s/shard_0[0-3].bin,%s", dir, paths[4]);
    r = us_data_expand(pat, &list, &n, l.err, sizeof l.err);
    CHECK(r == US_OK && n == 5 && !strcmp(list[0], paths[0]) && !strcmp(list[3], paths[3]) &&
              !strcmp(list[4], paths[4]),
          "a pattern and a path expand to 5 sorted paths (%d)", n);
    free(list);
    snprintf(pat, sizeof pat, "%s/nothing_*.bin", dir);
    r = us_data_expand(pat, &list, &n, l.err, sizeof l.err);
    CHECK(r == US_ERR_IO && strstr(l.err, "matches no file") && !list,
          "a pattern matching nothing: %s", l.err);
    r = us_data_expand("a.bin,,b.bin", &list, &n, l.err, sizeof l.err);
    CHECK(r == US_ERR_INVALID && strstr(l.err, "empty name"), "an empty name: %s", l.err);
    CHECK(us_data_is_shard(paths[2]) && !us_data_is_shard(p) && !us_data_is_shard("/tmp"),
          "us_data_is_shard tells shards from other files");
    remove(p);
}

/* us_choice_parse: a HellaSwag line's fields (escapes and a surrogate pair unescaped, other keys
   skipped), and one sentence for each malformed line, with nothing left to free */
static void test_choices(void) {
    static const char *good =
        "{\"ind\": 4, \"ctx\": \"A \\\"cat\\\"\", \"split\": [1, {\"a\": null}], "
        "\"endings\": [\"sat\", \"ran \\ud83d\\ude00\", \"\\u00e9\"], \"label\": 1}\n";
    static const char *bad[][2] = {
        {"[1, 2]", "not a JSON object"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 2}", "a label past the endings"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\"], \"label\": 0}", "\"endings\" (2..16)"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", 3], \"label\": 0}", "malformed"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": -1}", "out-of-range"},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 0", "not valid JSON"},
        {"{\"endings\": [\"b\", \"c\"], \"label\": 0}", "\"ctx\""},
    };
    char *ctx, *end[US_CHOICE_MAX];
    int n_end, label, k;
    const char *why = us_choice_parse(good, strlen(good), &ctx, end, &n_end, &label);
    CHECK(!why && !strcmp(ctx, "A \"cat\"") && n_end == 3 && label == 1 && !strcmp(end[0], "sat") &&
              !strcmp(end[1], "ran \xf0\x9f\x98\x80") && !strcmp(end[2], "\xc3\xa9"),
          "choices: a HellaSwag line's ctx, endings and label (%s)", why ? why : "read");
    if (!why) {
        free(ctx);
        for (k = 0; k < n_end; k++) free(end[k]);
    }
    for (k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++) {
        why = us_choice_parse(bad[k][0], strlen(bad[k][0]), &ctx, end, &n_end, &label);
        CHECK(why && strstr(why, bad[k][1]) && !ctx && n_end == 0, "choices: %s is refused: %s",
              bad[k][0], why ? why : "(accepted)");
    }
}

int main(int argc, char **argv) {
    int i;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    make_shards();
    test_epochs();
    test_in_order();
    test_dp_split();
    test_resume();
    test_stdio();
    test_hold_out();
    test_bad();
    test_choices();
    for (i = 0; i < NSH; i++) remove(paths[i]);
    rmdir(dir);
    return us_test_done("test_data");
}
