/* test_dtypes.c — bf16 / fp16 / FP8 E4M3 / E5M2 conversions against known bit patterns, exhaustive
   round-trips, nearest-value checks on random floats, us_dtype_size and the cast op. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <float.h>
#include <math.h>
#include <string.h>

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int is_nan_f(float f) { return f != f; }

static void test_bf16(void) {
    uint32_t h;
    int bad = 0, first_bad = -1;
    uint16_t r;
    CHECK(us_f32_to_bf16(1.0f) == 0x3F80, "bf16(1.0) = 0x%04x, want 0x3F80", us_f32_to_bf16(1.0f));
    CHECK(us_f32_to_bf16(-2.0f) == 0xC000, "bf16(-2.0) = 0x%04x, want 0xC000",
          us_f32_to_bf16(-2.0f));
    CHECK(us_f32_to_bf16(bitsf(0x3F808000u)) == 0x3F80,
          "tie 0x3F808000 -> 0x%04x, want 0x3F80 (even)", us_f32_to_bf16(bitsf(0x3F808000u)));
    CHECK(us_f32_to_bf16(bitsf(0x3F818000u)) == 0x3F82,
          "tie 0x3F818000 -> 0x%04x, want 0x3F82 (even)", us_f32_to_bf16(bitsf(0x3F818000u)));
    CHECK(us_f32_to_bf16(bitsf(0x3F80C000u)) == 0x3F81,
          "0x3F80C000 (above half) -> 0x%04x, want 0x3F81", us_f32_to_bf16(bitsf(0x3F80C000u)));
    CHECK(us_f32_to_bf16(bitsf(0x3F807FFFu)) == 0x3F80,
          "0x3F807FFF (below half) -> 0x%04x, want 0x3F80", us_f32_to_bf16(bitsf(0x3F807FFFu)));
    CHECK(us_f32_to_bf16(bitsf(0x00000001u)) == 0x0000, "smallest f32 subnormal -> 0x%04x, want 0",
          us_f32_to_bf16(bitsf(0x00000001u)));
    CHECK(us_f32_to_bf16(bitsf(0x00008000u)) == 0x0000,
          "subnormal tie 0x00008000 -> 0x%04x, want 0 (even)", us_f32_to_bf16(bitsf(0x00008000u)));
    CHECK(us_f32_to_bf16(bitsf(0x00018000u)) == 0x0002,
          "subnormal tie 0x00018000 -> 0x%04x, want 0x0002", us_f32_to_bf16(bitsf(0x00018000u)));
    CHECK(us_f32_to_bf16(bitsf(0x80008000u)) == 0x8000,
          "negative subnormal tie 0x80008000 -> 0x%04x, want 0x8000",
          us_f32_to_bf16(bitsf(0x80008000u)));
    CHECK(fbits(us_bf16_to_f32(0x0001)) == 0x00010000u,
          "bf16 0x0001 -> f32 bits 0x%08x, want 0x00010000",
          (unsigned)fbits(us_bf16_to_f32(0x0001)));
    CHECK(us_f32_to_bf16(bitsf(0x00010000u)) == 0x0001,
          "f32 0x00010000 -> bf16 0x%04x, want 0x0001", us_f32_to_bf16(bitsf(0x00010000u)));
    CHECK(us_f32_to_bf16(INFINITY) == 0x7F80, "bf16(+inf) = 0x%04x", us_f32_to_bf16(INFINITY));
    CHECK(us_f32_to_bf16(-INFINITY) == 0xFF80, "bf16(-inf) = 0x%04x", us_f32_to_bf16(-INFINITY));
    CHECK(us_f32_to_bf16(FLT_MAX) == 0x7F80, "bf16(FLT_MAX) = 0x%04x, want 0x7F80 (rounds to inf)",
          us_f32_to_bf16(FLT_MAX));
    CHECK(us_f32_to_bf16(-FLT_MAX) == 0xFF80, "bf16(-FLT_MAX) = 0x%04x, want 0xFF80",
          us_f32_to_bf16(-FLT_MAX));
    CHECK(us_f32_to_bf16(bitsf(0x7F7F7FFFu)) == 0x7F7F,
          "largest value below the bf16 max tie -> 0x%04x, want 0x7F7F",
          us_f32_to_bf16(bitsf(0x7F7F7FFFu)));
    CHECK(us_f32_to_bf16(-0.0f) == 0x8000, "bf16(-0.0) = 0x%04x", us_f32_to_bf16(-0.0f));
    CHECK(us_f32_to_bf16(0.0f) == 0x0000, "bf16(+0.0) = 0x%04x", us_f32_to_bf16(0.0f));
    /* NaNs: the default quiet NaN, a signalling NaN whose payload lives only in the low 16 bits
       (truncation would make it inf), and a negative NaN */
    {
        uint32_t nans[4] = {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu};
        int i;
        for (i = 0; i < 4; i++) {
            r = us_f32_to_bf16(bitsf(nans[i]));
            CHECK((r & 0x7F80) == 0x7F80 && (r & 0x007F) != 0,
                  "bf16(NaN 0x%08x) = 0x%04x is not a NaN", (unsigned)nans[i], r);
            CHECK((r & 0x8000) == (nans[i] >> 16 & 0x8000),
                  "bf16(NaN 0x%08x) = 0x%04x lost the sign", (unsigned)nans[i], r);
        }
    }
    /* every bf16 pattern: bf16 -> f32 is exact (bits << 16), and f32 -> bf16 gives it back */
    for (h = 0; h < 65536; h++) {
        float f = us_bf16_to_f32((uint16_t)h);
        int isnan_pat = (h & 0x7F80) == 0x7F80 && (h & 0x7F);
        if (fbits(f) != h << 16 && !isnan_pat) {
            bad++;
            if (first_bad < 0) first_bad = (int)h;
            continue;
        }
        if (isnan_pat) {
            if (!is_nan_f(f) || !is_nan_f(us_bf16_to_f32(us_f32_to_bf16(f)))) {
                bad++;
                if (first_bad < 0) first_bad = (int)h;
            }
        } else if (us_f32_to_bf16(f) != h) {
            bad++;
            if (first_bad < 0) first_bad = (int)h;
        }
    }
    CHECK(bad == 0, "bf16 round-trip over all 65536 patterns: %d bad (first 0x%04x)", bad,
          first_bad);
    /* random floats: the result is one of the two bf16 neighbours (truncation or +1 ulp), and the nearer one */
    {
        int i, nb = 0;
        for (i = 0; i < 100000; i++) {
            uint32_t u = (uint32_t)rnd64();
            float f = bitsf(u);
            uint16_t lo = (uint16_t)(u >> 16), got;
            double dlo, dhi;
            if (is_nan_f(f) || (u & 0x7F800000u) == 0x7F800000u) continue;
            got = us_f32_to_bf16(f);
            if (got != lo && got != (uint16_t)(lo + 1)) {
                nb++;
                continue;
            }
            dlo = fabs((double)f - us_bf16_to_f32(lo));
            dhi = ((lo + 1) & 0x7F80) == 0x7F80
                      ? INFINITY
                      : fabs((double)f - us_bf16_to_f32((uint16_t)(lo + 1)));
            if (dlo < dhi && got != lo) nb++;
            if (dhi < dlo && got != (uint16_t)(lo + 1) && isfinite(dhi)) nb++;
            if (dlo == dhi && (got & 1)) nb++; /* tie goes to even */
        }
        CHECK(nb == 0, "bf16 nearest-even on 100000 random floats: %d bad", nb);
    }
}

/* FP8 helpers over a codec: enc/dec function pointers */
typedef uint8_t (*enc_fn)(float);
typedef float (*dec_fn)(uint8_t);

static void check_nearest(const char *name, enc_fn enc, dec_fn dec, double maxv, int maxcode,
                          int emin, int n) {
    /* random floats spread over many binades of [-maxv, maxv], from below half the smallest
       subnormal (which must round to zero) up to the largest finite value: the encoding is the
       nearest value */
    int i, bad = 0;
    float worst = 0;
    for (i = 0; i < n; i++) {
        double mag = ldexp(1.0, emin - 6) * pow(2.0, rnd01() * (log2(maxv) - (emin - 6)));
        float x = (float)(rnd64() & 1 ? -mag : mag);
        uint8_t c = enc(x), mc = (uint8_t)(c & 0x7F), sg = (uint8_t)(c & 0x80);
        double d0 = fabs((double)x - dec(c));
        int ok = (c & 0x80) == (x < 0 ? 0x80 : 0) && mc <= maxcode && !is_nan_f(dec(c));
        if (ok && mc > 0 && d0 > fabs((double)x - dec((uint8_t)(sg | (mc - 1))))) ok = 0;
        if (ok && mc < maxcode && d0 > fabs((double)x - dec((uint8_t)(sg | (mc + 1))))) ok = 0;
        if (!ok) {
            bad++;
            worst = x;
        }
    }
    CHECK(bad == 0, "%s: encode is the nearest value for %d random floats: %d bad (e.g. %.9g)",
          name, n, bad, worst);
}

static void test_e4m3(void) {
    int c, bad = 0, firstbad = -1, mono = 1;
    CHECK(us_f32_to_e4m3(1.0f) == 0x38, "e4m3(1) = 0x%02x, want 0x38", us_f32_to_e4m3(1.0f));
    CHECK(us_f32_to_e4m3(448.0f) == 0x7E, "e4m3(448) = 0x%02x, want 0x7E", us_f32_to_e4m3(448.0f));
    CHECK(us_f32_to_e4m3(-448.0f) == 0xFE, "e4m3(-448) = 0x%02x, want 0xFE",
          us_f32_to_e4m3(-448.0f));
    CHECK(us_f32_to_e4m3(500.0f) == 0x7E, "e4m3(500) = 0x%02x, want 0x7E (saturate)",
          us_f32_to_e4m3(500.0f));
    CHECK(us_f32_to_e4m3(1e9f) == 0x7E, "e4m3(1e9) = 0x%02x, want 0x7E", us_f32_to_e4m3(1e9f));
    CHECK(us_f32_to_e4m3(INFINITY) == 0x7E, "e4m3(+inf) = 0x%02x, want 0x7E",
          us_f32_to_e4m3(INFINITY));
    CHECK(us_f32_to_e4m3(-INFINITY) == 0xFE, "e4m3(-inf) = 0x%02x, want 0xFE",
          us_f32_to_e4m3(-INFINITY));
    CHECK((us_f32_to_e4m3(NAN) & 0x7F) == 0x7F, "e4m3(NaN) = 0x%02x, want 0x7F/0xFF",
          us_f32_to_e4m3(NAN));
    CHECK((us_f32_to_e4m3(-NAN) & 0x7F) == 0x7F, "e4m3(-NaN) = 0x%02x, want 0x7F/0xFF",
          us_f32_to_e4m3(-NAN));
    CHECK(us_f32_to_e4m3(ldexpf(1, -9)) == 0x01, "e4m3(2^-9) = 0x%02x, want 0x01",
          us_f32_to_e4m3(ldexpf(1, -9)));
    CHECK(us_f32_to_e4m3(ldexpf(1, -10)) == 0x00, "e4m3(2^-10, tie) = 0x%02x, want 0x00",
          us_f32_to_e4m3(ldexpf(1, -10)));
    CHECK(us_f32_to_e4m3(-ldexpf(1, -10)) == 0x80, "e4m3(-2^-10, tie) = 0x%02x, want 0x80",
          us_f32_to_e4m3(-ldexpf(1, -10)));
    CHECK(us_f32_to_e4m3(ldexpf(1, -12)) == 0x00, "e4m3(2^-12) = 0x%02x, want 0x00 (underflow)",
          us_f32_to_e4m3(ldexpf(1, -12)));
    CHECK(us_f32_to_e4m3(1e-30f) == 0x00, "e4m3(1e-30) = 0x%02x, want 0x00 (underflow)",
          us_f32_to_e4m3(1e-30f));
    CHECK(us_f32_to_e4m3(3 * ldexpf(1, -10)) == 0x02, "e4m3(3*2^-10, tie) = 0x%02x, want 0x02",
          us_f32_to_e4m3(3 * ldexpf(1, -10)));
    CHECK(us_f32_to_e4m3(ldexpf(1, -6)) == 0x08, "e4m3(2^-6) = 0x%02x, want 0x08",
          us_f32_to_e4m3(ldexpf(1, -6)));
    CHECK(us_f32_to_e4m3(0.0f) == 0x00, "e4m3(0) = 0x%02x", us_f32_to_e4m3(0.0f));
    CHECK(us_f32_to_e4m3(-0.0f) == 0x80, "e4m3(-0) = 0x%02x", us_f32_to_e4m3(-0.0f));
    CHECK(us_f32_to_e4m3(464.0f) == 0x7E, "e4m3(464, tie toward the NaN code) = 0x%02x, want 0x7E",
          us_f32_to_e4m3(464.0f));
    CHECK(us_f32_to_e4m3(1.0625f) == 0x38, "e4m3(1.0625, tie) = 0x%02x, want 0x38 (even)",
          us_f32_to_e4m3(1.0625f));
    CHECK(us_f32_to_e4m3(1.1875f) == 0x3A, "e4m3(1.1875, tie) = 0x%02x, want 0x3A (even)",
          us_f32_to_e4m3(1.1875f));
    for (c = 0; c < 256; c++) {
        float f = us_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7F) == 0x7F) {
            if (!is_nan_f(f)) {
                bad++;
                if (firstbad < 0) firstbad = c;
            }
            continue;
        }
        if (!isfinite(f) || us_f32_to_e4m3(f) != c) {
            bad++;
            if (firstbad < 0) firstbad = c;
        }
        if (c >= 1 && c <= 0x7E && !(f > us_e4m3_to_f32((uint8_t)(c - 1)))) mono = 0;
    }
    CHECK(bad == 0, "e4m3: decode/encode round-trip over 256 codes: %d bad (first 0x%02x)", bad,
          firstbad);
    CHECK(mono, "e4m3: decoded values increase strictly over codes 0x00..0x7E");
    CHECK(us_e4m3_to_f32(0x7E) == 448.0f && us_e4m3_to_f32(0x01) == ldexpf(1, -9) &&
              us_e4m3_to_f32(0x08) == ldexpf(1, -6),
          "e4m3 decode of 0x7E/0x01/0x08 = %g/%g/%g", us_e4m3_to_f32(0x7E), us_e4m3_to_f32(0x01),
          us_e4m3_to_f32(0x08));
    check_nearest("e4m3", us_f32_to_e4m3, us_e4m3_to_f32, 448.0, 0x7E, -6, 10000);
}

static void test_e5m2(void) {
    int c, bad = 0, firstbad = -1, mono = 1;
    uint8_t n;
    CHECK(us_f32_to_e5m2(1.0f) == 0x3C, "e5m2(1) = 0x%02x, want 0x3C", us_f32_to_e5m2(1.0f));
    CHECK(us_f32_to_e5m2(57344.0f) == 0x7B, "e5m2(57344) = 0x%02x, want 0x7B",
          us_f32_to_e5m2(57344.0f));
    CHECK(us_f32_to_e5m2(60000.0f) == 0x7B, "e5m2(60000) = 0x%02x, want 0x7B (saturate)",
          us_f32_to_e5m2(60000.0f));
    CHECK(us_f32_to_e5m2(-1e9f) == 0xFB, "e5m2(-1e9) = 0x%02x, want 0xFB (saturate)",
          us_f32_to_e5m2(-1e9f));
    CHECK(us_f32_to_e5m2(INFINITY) == 0x7C, "e5m2(+inf) = 0x%02x, want 0x7C",
          us_f32_to_e5m2(INFINITY));
    CHECK(us_f32_to_e5m2(-INFINITY) == 0xFC, "e5m2(-inf) = 0x%02x, want 0xFC",
          us_f32_to_e5m2(-INFINITY));
    n = us_f32_to_e5m2(NAN);
    CHECK((n & 0x7C) == 0x7C && (n & 0x03) != 0, "e5m2(NaN) = 0x%02x, want a NaN code", n);
    CHECK(us_f32_to_e5m2(ldexpf(1, -16)) == 0x01, "e5m2(2^-16) = 0x%02x, want 0x01",
          us_f32_to_e5m2(ldexpf(1, -16)));
    CHECK(us_f32_to_e5m2(ldexpf(1, -14)) == 0x04, "e5m2(2^-14) = 0x%02x, want 0x04",
          us_f32_to_e5m2(ldexpf(1, -14)));
    CHECK(us_f32_to_e5m2(ldexpf(1, -17)) == 0x00, "e5m2(2^-17, tie) = 0x%02x, want 0x00",
          us_f32_to_e5m2(ldexpf(1, -17)));
    CHECK(us_f32_to_e5m2(3 * ldexpf(1, -17)) == 0x02, "e5m2(3*2^-17, tie) = 0x%02x, want 0x02",
          us_f32_to_e5m2(3 * ldexpf(1, -17)));
    CHECK(us_f32_to_e5m2(1e-30f) == 0x00, "e5m2(1e-30) = 0x%02x, want 0x00 (underflow)",
          us_f32_to_e5m2(1e-30f));
    CHECK(us_f32_to_e5m2(-0.0f) == 0x80, "e5m2(-0) = 0x%02x", us_f32_to_e5m2(-0.0f));
    CHECK(us_e5m2_to_f32(0x7C) == INFINITY && us_e5m2_to_f32(0xFC) == -INFINITY,
          "e5m2 decode 0x7C/0xFC = %g/%g", us_e5m2_to_f32(0x7C), us_e5m2_to_f32(0xFC));
    for (c = 0; c < 256; c++) {
        float f = us_e5m2_to_f32((uint8_t)c);
        int m = c & 0x7F;
        if (m >= 0x7D) {
            if (!is_nan_f(f)) {
                bad++;
                if (firstbad < 0) firstbad = c;
            }
            continue;
        }
        if (m == 0x7C) {
            if (!isinf(f)) {
                bad++;
                if (firstbad < 0) firstbad = c;
            }
        }
        if (us_f32_to_e5m2(f) != c) {
            bad++;
            if (firstbad < 0) firstbad = c;
        }
        if (c >= 1 && c <= 0x7C && !(f > us_e5m2_to_f32((uint8_t)(c - 1)))) mono = 0;
    }
    CHECK(bad == 0, "e5m2: decode/encode round-trip over 256 codes: %d bad (first 0x%02x)", bad,
          firstbad);
    CHECK(mono, "e5m2: decoded values increase strictly over codes 0x00..0x7C");
    check_nearest("e5m2", us_f32_to_e5m2, us_e5m2_to_f32, 57344.0, 0x7B, -14, 10000);
}

/* fp16 (IEEE binary16) value of a pattern, from the format's definition, in double */
static double f16_value(uint32_t h) {
    int e = (int)(h >> 10) & 31, m = (int)(h & 0x3FF);
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void test_f16(void) {
    uint32_t h, u;
    int bad = 0, first_bad = -1, badtie = 0, first_tie = -1;
    CHECK(us_f32_to_f16(1.0f) == 0x3C00, "fp16(1.0) = 0x%04x, want 0x3C00", us_f32_to_f16(1.0f));
    CHECK(us_f32_to_f16(-2.0f) == 0xC000, "fp16(-2.0) = 0x%04x, want 0xC000", us_f32_to_f16(-2.0f));
    CHECK(us_f32_to_f16(65504.0f) == 0x7BFF, "fp16(65504) = 0x%04x, want 0x7BFF (max)",
          us_f32_to_f16(65504.0f));
    CHECK(us_f32_to_f16(65519.996f) == 0x7BFF, "fp16(65519.996) = 0x%04x, want 0x7BFF",
          us_f32_to_f16(65519.996f));
    CHECK(us_f32_to_f16(65520.0f) == 0x7C00,
          "fp16(65520, tie above max) = 0x%04x, want 0x7C00 (inf)", us_f32_to_f16(65520.0f));
    CHECK(us_f32_to_f16(-1e6f) == 0xFC00, "fp16(-1e6) = 0x%04x, want 0xFC00 (-inf)",
          us_f32_to_f16(-1e6f));
    CHECK(us_f32_to_f16(FLT_MAX) == 0x7C00, "fp16(FLT_MAX) = 0x%04x, want 0x7C00",
          us_f32_to_f16(FLT_MAX));
    CHECK(us_f32_to_f16(INFINITY) == 0x7C00 && us_f32_to_f16(-INFINITY) == 0xFC00,
          "fp16(±inf) = 0x%04x 0x%04x", us_f32_to_f16(INFINITY), us_f32_to_f16(-INFINITY));
    CHECK(us_f32_to_f16(ldexpf(1, -14)) == 0x0400,
          "fp16(2^-14) = 0x%04x, want 0x0400 (smallest normal)", us_f32_to_f16(ldexpf(1, -14)));
    CHECK(us_f32_to_f16(ldexpf(1, -24)) == 0x0001, "fp16(2^-24) = 0x%04x, want 0x0001",
          us_f32_to_f16(ldexpf(1, -24)));
    CHECK(us_f32_to_f16(ldexpf(1, -25)) == 0x0000, "fp16(2^-25, tie) = 0x%04x, want 0 (even)",
          us_f32_to_f16(ldexpf(1, -25)));
    CHECK(us_f32_to_f16(nextafterf(ldexpf(1, -25), 1)) == 0x0001,
          "fp16(just above 2^-25) = 0x%04x, want 0x0001",
          us_f32_to_f16(nextafterf(ldexpf(1, -25), 1)));
    CHECK(us_f32_to_f16(3 * ldexpf(1, -25)) == 0x0002, "fp16(3·2^-25, tie) = 0x%04x, want 0x0002",
          us_f32_to_f16(3 * ldexpf(1, -25)));
    CHECK(us_f32_to_f16(ldexpf(1, -14) - ldexpf(1, -25)) == 0x0400,
          "fp16(2^-14 - 2^-25, tie) = 0x%04x, want 0x0400 (carry to normal)",
          us_f32_to_f16(ldexpf(1, -14) - ldexpf(1, -25)));
    CHECK(us_f32_to_f16(1e-30f) == 0x0000 && us_f32_to_f16(-1e-30f) == 0x8000,
          "fp16(±1e-30) = 0x%04x 0x%04x, want ±0", us_f32_to_f16(1e-30f), us_f32_to_f16(-1e-30f));
    CHECK(us_f32_to_f16(bitsf(0x00000001u)) == 0x0000, "fp16(smallest f32 subnormal) = 0x%04x",
          us_f32_to_f16(bitsf(0x00000001u)));
    CHECK(us_f32_to_f16(-0.0f) == 0x8000, "fp16(-0) = 0x%04x", us_f32_to_f16(-0.0f));
    {
        uint32_t nans[4] = {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu};
        int i;
        for (i = 0; i < 4; i++) {
            uint16_t r = us_f32_to_f16(bitsf(nans[i]));
            CHECK((r & 0x7C00) == 0x7C00 && (r & 0x03FF) != 0,
                  "fp16(NaN 0x%08x) = 0x%04x is not a NaN", (unsigned)nans[i], r);
            CHECK((r & 0x8000) == (nans[i] >> 16 & 0x8000),
                  "fp16(NaN 0x%08x) = 0x%04x lost the sign", (unsigned)nans[i], r);
        }
    }
    /* every fp16 pattern: decodes to the value the format defines, and encodes back to itself */
    for (h = 0; h < 65536; h++) {
        float f = us_f16_to_f32((uint16_t)h);
        double want = f16_value(h);
        int isnan_pat = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        int ok = isnan_pat
                     ? is_nan_f(f) && is_nan_f(us_f16_to_f32(us_f32_to_f16(f))) &&
                           (us_f32_to_f16(f) & 0x8000) == (h & 0x8000)
                     : (double)f == want && !signbit(f) == !signbit(want) && us_f32_to_f16(f) == h;
        if (!ok) {
            bad++;
            if (first_bad < 0) first_bad = (int)h;
        }
    }
    CHECK(bad == 0, "fp16 decode + round trip over all 65536 patterns: %d bad (first 0x%04x)", bad,
          first_bad);
    /* the tie table, from first principles: between consecutive fp16 magnitudes a < b (b = 65536
       past the max, which rounds to inf = 0x7C00), the midpoint goes to the even pattern, one fp32
       ulp below it to a, one above to b; same for negatives */
    for (h = 0; h < 0x7C00; h++) {
        double a = f16_value(h), b = h + 1 == 0x7C00 ? 65536.0 : f16_value(h + 1);
        float mid = (float)((a + b) / 2); /* exact: 12 significant bits */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h, s;
        int ok = (double)mid == (a + b) / 2;
        for (s = 0; s <= 0x8000 && ok; s = (uint16_t)(s + 0x8000)) {
            float sg = s ? -1.0f : 1.0f;
            ok = us_f32_to_f16(sg * mid) == (even | s) &&
                 us_f32_to_f16(sg * nextafterf(mid, 0)) == (h | s) &&
                 us_f32_to_f16(sg * nextafterf(mid, INFINITY)) == ((h + 1) | s);
            if (s) break;
        }
        if (!ok) {
            badtie++;
            if (first_tie < 0) first_tie = (int)h;
        }
    }
    CHECK(badtie == 0,
          "fp16 midpoints (ties to even, ±1 fp32 ulp) over all 31744 gaps: %d bad (first 0x%04x)",
          badtie, first_tie);
#ifdef __FLT16_MAX__
    /* an independent reference: the compiler's own _Float16 conversion (F16C's vcvtps2ph or
       libgcc's __truncsfhf2), on every 61st fp32 pattern plus the 2^16 patterns u<<16 | 0x1000 */
    {
        int badc = 0;
        uint32_t first = 0;
        for (u = 0;; u += 61) {
            float f = bitsf(u);
            __extension__ _Float16 r = (_Float16)f;
            uint16_t rb, mine = us_f32_to_f16(f);
            memcpy(&rb, &r, 2);
            if (rb != mine && !(is_nan_f(f) && (mine & 0x7C00) == 0x7C00 && (mine & 0x3FF) &&
                                (rb & 0x7FFF) > 0x7C00)) {
                if (!badc) first = u;
                badc++;
            }
            if (u > 0xFFFFFFFFu - 61) break;
        }
        for (u = 0; u < 65536; u++) {
            float f = bitsf(u << 16 | 0x1000u);
            __extension__ _Float16 r = (_Float16)f;
            uint16_t rb;
            memcpy(&rb, &r, 2);
            if (!is_nan_f(f) && rb != us_f32_to_f16(f)) {
                if (!badc) first = u << 16 | 0x1000u;
                badc++;
            }
        }
        CHECK(badc == 0,
              "fp32 -> fp16 equals the compiler's _Float16 cast on 70M fp32 patterns: %d differ "
              "(first 0x%08x)",
              badc, (unsigned)first);
    }
#else
    (void)u;
    printf("  note: this compiler has no _Float16; the _Float16 cross-check is skipped\n");
#endif
}

static void test_sizes_and_cast(void) {
    us_ops o = us_cpu_ops(1);

    enum { n = 4096 };

    static float src[n], back[n];
    static uint16_t b16[n];
    static uint8_t f8[n];
    int i, bad = 0, bad8 = 0, bad5 = 0, badb = 0;
    CHECK(us_dtype_size(US_F32) == 4 && us_dtype_size(US_BF16) == 2 &&
              us_dtype_size(US_E4M3) == 1 && us_dtype_size(US_E5M2) == 1 &&
              us_dtype_size(US_I32) == 4,
          "us_dtype_size: %d %d %d %d %d", (int)us_dtype_size(US_F32), (int)us_dtype_size(US_BF16),
          (int)us_dtype_size(US_E4M3), (int)us_dtype_size(US_E5M2), (int)us_dtype_size(US_I32));
    for (i = 0; i < n; i++) src[i] = (float)((rnd01() * 2 - 1) * pow(2.0, rnd01() * 20 - 10));
    src[0] = 0;
    src[1] = -0.0f;
    src[2] = bitsf(0x3F808000u);
    src[3] = 1e-30f;
    src[4] = 600.0f;
    o.cast(&o, b16, US_BF16, src, US_F32, n);
    o.cast(&o, back, US_F32, b16, US_BF16, n);
    for (i = 0; i < n; i++) {
        if (b16[i] != us_f32_to_bf16(src[i])) badb++;
        if (fbits(back[i]) != fbits(us_bf16_to_f32(us_f32_to_bf16(src[i])))) bad++;
    }
    CHECK(badb == 0, "cast f32->bf16 equals us_f32_to_bf16: %d bad", badb);
    CHECK(bad == 0, "cast f32->bf16->f32 equals the scalar round-trip: %d bad", bad);
    o.cast(&o, f8, US_E4M3, src, US_F32, n);
    for (i = 0; i < n; i++)
        if (f8[i] != us_f32_to_e4m3(src[i])) bad8++;
    o.cast(&o, back, US_F32, f8, US_E4M3, n);
    for (i = 0; i < n; i++)
        if (fbits(back[i]) != fbits(us_e4m3_to_f32(us_f32_to_e4m3(src[i])))) bad8++;
    CHECK(bad8 == 0, "cast f32<->e4m3 equals the scalar conversions: %d bad", bad8);
    o.cast(&o, f8, US_E5M2, src, US_F32, n);
    for (i = 0; i < n; i++)
        if (f8[i] != us_f32_to_e5m2(src[i])) bad5++;
    o.cast(&o, back, US_F32, f8, US_E5M2, n);
    for (i = 0; i < n; i++)
        if (fbits(back[i]) != fbits(us_e5m2_to_f32(us_f32_to_e5m2(src[i])))) bad5++;
    CHECK(bad5 == 0, "cast f32<->e5m2 equals the scalar conversions: %d bad", bad5);
    {
        int badh = 0;
        CHECK(us_dtype_size(US_F16) == 2 && strcmp(us_dtype_name(US_F16), "fp16") == 0,
              "us_dtype_size/name(US_F16) = %d %s", (int)us_dtype_size(US_F16),
              us_dtype_name(US_F16));
        o.cast(&o, b16, US_F16, src, US_F32, n);
        for (i = 0; i < n; i++)
            if (b16[i] != us_f32_to_f16(src[i])) badh++;
        o.cast(&o, back, US_F32, b16, US_F16, n);
        for (i = 0; i < n; i++)
            if (fbits(back[i]) != fbits(us_f16_to_f32(us_f32_to_f16(src[i])))) badh++;
        CHECK(badh == 0, "cast f32<->fp16 equals the scalar conversions: %d bad", badh);
    }
}

int main(int argc, char **argv) {
    us_test_rs = 0x9E3779B97F4A7C15ull;
    us_test_verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    test_bf16();
    test_e4m3();
    test_e5m2();
    test_f16();
    test_sizes_and_cast();
    return us_test_done("test_dtypes");
}
