/* test_errors.c — bad input gets a clear error and a result code, never a crash. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* validation names the problem in one sentence containing `needle` */
static void expect_invalid(us_model_config mc, us_train_config tc, const char *needle) {
    char err[256] = "";
    us_result r = us_config_validate(&mc, &tc, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, needle), "rejected with \"%s\" (wanted \"%s\")", err,
          needle);
}

static void test_configs(void) {
    us_model_config mc, ok;
    us_train_config tc, tok;
    us_model m;
    char err[256];
    memset(&ok, 0, sizeof ok);
    memset(&tok, 0, sizeof tok);
    mc = ok;
    tc = tok;
    CHECK(us_config_validate(&mc, &tc, err, sizeof err) == US_OK,
          "all-zero configs are valid defaults");
    CHECK(mc.dim == 128 && mc.n_layers == 4 && mc.n_kv_heads == mc.n_heads && mc.ffn_dim == 352 &&
              mc.vocab == 256,
          "model defaults filled (ffn %lld)", (long long)mc.ffn_dim);
    CHECK(tc.batch == 8 && tc.seq == 64 && tc.grad_accum == 1 &&
              tc.precision == US_PRECISION_FP32 && tc.recompute == US_RECOMPUTE_NONE,
          "train defaults filled");
    mc = ok;
    mc.n_heads = 8;
    mc.n_kv_heads = 3;
    expect_invalid(mc, tok, "heads=8 not divisible by kv-heads=3");
    mc = ok;
    mc.dim = 100;
    mc.n_heads = 3;
    expect_invalid(mc, tok, "dim=100 not divisible by heads=3");
    mc = ok;
    mc.dim = 12;
    mc.n_heads = 4;
    expect_invalid(mc, tok, "must be even for RoPE");
    mc = ok;
    mc.n_layers = -1;
    expect_invalid(mc, tok, "layers=-1");
    mc = ok;
    mc.vocab = 1;
    expect_invalid(mc, tok, "vocab=1");
    mc = ok;
    mc.tie_embeddings = 2;
    expect_invalid(mc, tok, "tie_embeddings=2");
    mc = ok;
    mc.rope_theta = -1;
    expect_invalid(mc, tok, "rope theta");
    mc = ok;
    mc.rope_factor = 8; /* llama3's numbers without llama3 scaling */
    expect_invalid(mc, tok, "belong to llama3 scaling");
    mc = ok;
    mc.rope_scaling = (us_rope_scaling)7;
    expect_invalid(mc, tok, "unknown rope scaling 7");
    mc = ok;
    mc.rope_scaling = US_ROPE_LLAMA3;
    mc.rope_factor = 0.5f;
    expect_invalid(mc, tok, "rope factor=0.5 must be a number of at least 1");
    mc.rope_factor = 0;
    mc.rope_low_freq = 4;
    mc.rope_high_freq = 1;
    expect_invalid(mc, tok, "0 < low < high");
    mc.rope_low_freq = NAN;
    expect_invalid(mc, tok, "0 < low < high");
    mc.rope_low_freq = 0;
    mc.rope_high_freq = 0;
    mc.rope_orig_ctx = -5;
    expect_invalid(mc, tok, "rope original context=-5");
    tc = tok;
    tc.batch = -3;
    expect_invalid(ok, tc, "batch=-3");
    tc = tok;
    tc.grad_accum = -1;
    expect_invalid(ok, tc, "grad-accum=-1");
    tc = tok;
    tc.lr = NAN;
    expect_invalid(ok, tc, "lr=");
    tc = tok;
    tc.beta2 = 1.0f;
    expect_invalid(ok, tc, "beta2=1");
    tc = tok;
    tc.precision = (us_precision)9;
    expect_invalid(ok, tc, "precision");
    tc = tok;
    tc.recompute = (us_recompute)9;
    expect_invalid(ok, tc, "recompute");
    tc = tok;
    tc.warmup = -5;
    expect_invalid(ok, tc, "warmup=-5");
    mc = ok;
    mc.n_heads = 8;
    mc.n_kv_heads = 3;
    CHECK(us_model_init(&m, &mc, &tok, NULL) == US_ERR_INVALID &&
              strstr(us_model_error(&m), "kv-heads"),
          "us_model_init refuses and explains: %s", us_model_error(&m));
    us_model_free(&m); /* freeing a failed model is safe */
    {
        us_memory est;
        mc = ok;
        mc.n_heads = 8;
        mc.n_kv_heads = 3;
        CHECK(us_memory_estimate(&mc, &tok, &est, err, sizeof err) == US_ERR_INVALID,
              "estimator validates too: %s", err);
    }
}

static void write_file(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(buf, 1, n, f);
        fclose(f);
    }
}

static void test_shards(void) {
    char p[64]; /* one file per process: make test runs the plain and sanitizer builds at once */
    int32_t hdr[256];
    unsigned char buf[1024 + 64];
    us_data d;
    us_result r;
    int i;
    snprintf(p, sizeof p, "/tmp/us_test_shard_%ld.bin", (long)getpid());
    memset(hdr, 0, sizeof hdr);
    /* a good v1 shard: 10 uint16 tokens */
    hdr[0] = 20240520;
    hdr[1] = 1;
    hdr[2] = 10;
    memcpy(buf, hdr, 1024);
    for (i = 0; i < 10; i++) {
        buf[1024 + 2 * i] = (unsigned char)(i * 7);
        buf[1024 + 2 * i + 1] = (unsigned char)(i == 9);
    }
    write_file(p, buf, 1024 + 20);
    r = us_data_load(&d, p);
    CHECK(r == US_OK && d.n == 10 && d.tokens[3] == 21 && d.tokens[9] == 63 + 256 &&
              d.max_token == 319,
          "v1 shard (uint16) loads: %s", d.err);
    us_data_free(&d);
    /* a good v7 shard: 3 uint32 tokens */
    hdr[0] = 20240801;
    hdr[1] = 7;
    hdr[2] = 3;
    memcpy(buf, hdr, 1024);
    memset(buf + 1024, 0, 12);
    buf[1024 + 4] = 0x01;
    buf[1024 + 6] = 0x02; /* token 1 = 0x00020001 */
    write_file(p, buf, 1024 + 12);
    r = us_data_load(&d, p);
    CHECK(r == US_OK && d.n == 3 && d.tokens[1] == 0x20001, "v7 shard (uint32) loads: %s", d.err);
    us_data_free(&d);
    /* truncated: header promises 10 tokens, file has 7 */
    hdr[0] = 20240520;
    hdr[1] = 1;
    hdr[2] = 10;
    memcpy(buf, hdr, 1024);
    write_file(p, buf, 1024 + 14);
    r = us_data_load_shard(&d, p);
    CHECK(r == US_ERR_FORMAT && strstr(d.err, "header promises 10 tokens"), "truncated shard: %s",
          d.err);
    /* too long is as wrong as too short */
    write_file(p, buf, 1024 + 30);
    r = us_data_load_shard(&d, p);
    CHECK(r == US_ERR_FORMAT, "shard longer than its header: %s", d.err);
    /* header cut short */
    write_file(p, buf, 100);
    r = us_data_load_shard(&d, p);
    CHECK(r == US_ERR_FORMAT && strstr(d.err, "truncated"), "shard shorter than its header: %s",
          d.err);
    /* wrong magic, wrong version, nonsense count */
    hdr[0] = 12345;
    memcpy(buf, hdr, 1024);
    write_file(p, buf, 1024 + 20);
    r = us_data_load_shard(&d, p);
    CHECK(r == US_ERR_FORMAT && strstr(d.err, "magic"), "wrong magic: %s", d.err);
    hdr[0] = 20240520;
    hdr[1] = 3;
    memcpy(buf, hdr, 1024);
    write_file(p, buf, 1024 + 20);
    r = us_data_load(&d, p);
    CHECK(r == US_ERR_FORMAT && strstr(d.err, "version 3"), "wrong version: %s", d.err);
    hdr[1] = 1;
    hdr[2] = -5;
    memcpy(buf, hdr, 1024);
    write_file(p, buf, 1024 + 20);
    r = us_data_load(&d, p);
    CHECK(r == US_ERR_FORMAT, "negative token count: %s", d.err);
    /* missing file, empty text */
    r = us_data_load(&d, "/tmp/us_no_such_file.bin");
    CHECK(r == US_ERR_IO && strstr(d.err, "cannot open"), "missing file: %s", d.err);
    write_file(p, "", 0);
    r = us_data_load(&d, p);
    CHECK(r == US_ERR_FORMAT && strstr(d.err, "empty"), "empty text file: %s", d.err);
    /* a directory, and files that read data but have no size: one sentence each, not "empty" */
    r = us_data_load(&d, "/tmp");
    CHECK(r == US_ERR_IO && strstr(d.err, "cannot read /tmp: Is a directory"), "a directory: %s",
          d.err);
    r = us_data_load(&d, "/dev/zero");
    CHECK(r == US_ERR_IO && strstr(d.err, "/dev/zero is not a regular file"), "/dev/zero: %s",
          d.err);
    /* text that is too short for one sequence */
    write_file(p, "hello", 5);
    r = us_data_load(&d, p);
    CHECK(r == US_OK && d.n == 5 && d.tokens[1] == 'e', "raw text loads as bytes");
    {
        us_rng rng;
        int32_t in[16], tgt[16];
        us_rng_seed(&rng, 1);
        r = us_data_batch(&d, &rng, 1, 16, in, tgt);
        CHECK(r == US_ERR_INVALID && strstr(d.err, "needs at least 17"),
              "sequence longer than the data: %s", d.err);
        r = us_data_batch(&d, &rng, 2, 4, in, tgt);
        CHECK(r == US_OK && tgt[0] == in[1] && tgt[4] == in[5],
              "windows: targets are inputs shifted by one");
    }
    us_data_free(&d);
    remove(p);
}

static void test_bad_tokens_and_nonfinite(void) {
    us_model_config mc;
    us_train_config tc;
    us_model m;
    int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9}, ign[8];
    us_step_stats st;
    int i;
    memset(&mc, 0, sizeof mc);
    memset(&tc, 0, sizeof tc);
    mc.vocab = 10;
    mc.dim = 8;
    mc.n_layers = 1;
    mc.n_heads = 2;
    tc.batch = 1;
    tc.seq = 8;
    CHECK(us_model_init(&m, &mc, &tc, NULL) == US_OK, "tiny model");
    in[3] = 10;
    CHECK(us_train_step(&m, in, tgt, &st) == US_ERR_INVALID &&
              strstr(us_model_error(&m), "outside the vocabulary"),
          "input token = vocab: %s", us_model_error(&m));
    in[3] = -1;
    CHECK(us_train_step(&m, in, tgt, &st) == US_ERR_INVALID, "negative input token: %s",
          us_model_error(&m));
    in[3] = 4;
    tgt[2] = 99;
    CHECK(us_train_step(&m, in, tgt, &st) == US_ERR_INVALID &&
              strstr(us_model_error(&m), "target token 99"),
          "target outside the vocabulary: %s", us_model_error(&m));
    tgt[2] = 4;
    for (i = 0; i < 8; i++) ign[i] = -1;
    CHECK(us_train_step(&m, in, ign, &st) == US_ERR_INVALID &&
              strstr(us_model_error(&m), "ignored"),
          "all targets ignored: %s", us_model_error(&m));
    CHECK(us_forward_eval(&m, in, tgt, 2, 8, NULL, NULL, NULL) == US_ERR_INVALID,
          "batch larger than the arena: %s", us_model_error(&m));
    CHECK(us_train_step(&m, in, tgt, &st) == US_OK && m.step == 1,
          "a good step after the bad ones");
    /* a NaN weight: the loss is not finite, reported, weights untouched */
    m.master[0 + 3 * 8] = NAN; /* embedding row of token 3 */
    {
        float keep = m.master[100];
        CHECK(us_train_step(&m, in, tgt, &st) == US_ERR_NONFINITE &&
                  strstr(us_model_error(&m), "not finite"),
              "NaN loss detected: %s", us_model_error(&m));
        CHECK(m.master[100] == keep && m.step == 1, "no update after a non-finite loss");
    }
    us_model_free(&m);
}

int main(int argc, char **argv) {
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    test_configs();
    test_shards();
    test_bad_tokens_and_nonfinite();
    CHECK(strcmp(us_result_description(US_ERR_FORMAT), "bad file format") == 0,
          "result descriptions");
    return us_test_done("test_errors");
}
