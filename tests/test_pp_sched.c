/* test_pp_sched.c — pipeline schedules as data: every schedule the builder makes passes the
   checker (pp 1, 2, 4, 8 and many micro-batch counts), and the simulator reproduces each
   schedule's published numbers:
     AFAB, 1F1B               bubble (p−1)/(m+p−1)                    (Playbook)
     interleaved, v chunks    bubble (p−1)/(v·m+p−1)                  (Playbook)
     ZB-H1                    idle per rank (p−1)(tF+tB−tW), for m ≥ p and tW ≤ min(tF, tB)
                              (Qi et al.; at tF = tB = tW the "(p−1)/3m" bubble rate)
     ZB-V                     idle per rank (p−1)·tF of one chunk, the pipeline's fill, for
                              m ≥ 2p−1 at tF = tB = tW (the paper's "zero bubble")
     DualPipe-V               idle per rank (p−1)(F&B + B − 3W) with per-chunk costs, B the full
                              backward and F&B = F + B (DeepSeek's table), at tF = tB = tW
   and the memory claims: 1F1B holds min(m, p) micro-batches on rank 0, AFAB m; ZB-H1 at most
   1F1B's peak on every rank; ZB-V at most 2p chunks (a chunk is half a rank's layers: 1F1B's p
   micro-batches); DualPipe-V 2p+1 chunks on every rank (DeepSeek's PP+1 for PP = 2p stages).
   At tF = tB = tW the bubbles order ZB-V ≤ ZB-H1 < 1F1B. DualPipe-V against ZB-V, honestly: with
   free transfers and an F&B pair costing the sum of its parts, DualPipe-V idles twice as long as
   ZB-V and holds one chunk more; what it buys, communication hidden under compute, is outside
   this simulator. Broken lists (a missing or repeated action, an impossible order, a bad
   overlap mark) and bad (pp, m, v) are refused with a sentence.
   DualPipe (two pipelines fed from both ends, pp stages, each rank holding stages r and
   pp−1−r, half of the micro-batches entering at each end): valid at every even p up to 16 and
   even m ≥ 2p, refused elsewhere; rank r runs DualPipe-V's phases as the V of p/2 ranks and m/2
   micro-batches sees them, so its makespan equals that V's at any costs; DeepSeek's idle
   (PP/2−1)(F&B + B − 3W) per rank at tF = tB = tW, with a chunk (a stage) as costly as 1F1B's;
   PP+1 chunks held on every rank (DeepSeek's table); less idle than DualPipe-V and 1F1B on the
   same model and ranks. A micro-batch listed on the other pipeline is refused. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <string.h>

static const us_pp_kind kinds[] = {US_PP_AFAB, US_PP_1F1B, US_PP_INTERLEAVED, US_PP_INTERLEAVED_BF,
                                   US_PP_ZB1,  US_PP_ZBV,  US_PP_DUALPIPEV};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

static int chunks(us_pp_kind k) {
    return k == US_PP_INTERLEAVED || k == US_PP_INTERLEAVED_BF || k == US_PP_ZBV ||
                   k == US_PP_DUALPIPEV
               ? 2
               : 1;
}

static int split(us_pp_kind k) { return k == US_PP_ZB1 || k == US_PP_ZBV || k == US_PP_DUALPIPEV; }

/* Builds and simulates kind at (p, m) with per-micro-batch, per-rank costs tF, tB, tW (the
   unsplit schedules run BW = tB + tW), split evenly over the rank's chunks. */
static us_result sim(us_pp_kind k, int p, int m, double tF, double tB, double tW, us_pp_sim *out,
                     char *err, size_t errlen) {
    us_pp_schedule s;
    int v = chunks(k);
    us_result r;
    err[0] = 0;
    r = us_pp_schedule_build(&s, k, p, m, v, err, errlen);
    if (r != US_OK) return r;
    if (!split(k)) {
        tB += tW;
        tW = 0;
    }
    r = us_pp_simulate(&s, tF / v, tB / v, tW / v, out, err, errlen);
    us_pp_schedule_free(&s);
    return r;
}

/* bubble fraction from the idle time of every rank, with per-rank work m·(tF+tB+tW) */
static double bubble(int m, double idle, double tF, double tB, double tW) {
    return idle / (m * (tF + tB + tW) + idle);
}

/* DualPipe at (p, m), per-action costs tF, tB, tW: each micro-batch runs one chunk per rank, a
   stage of 1/p of the layers, so 1F1B's per-micro-batch costs apply undivided. */
static us_result sim_dual(int p, int m, double tF, double tB, double tW, us_pp_sim *out, char *err,
                          size_t errlen) {
    us_pp_schedule s;
    us_result r;
    err[0] = 0;
    r = us_pp_schedule_build(&s, US_PP_DUALPIPE, p, m, 2, err, errlen);
    if (r != US_OK) return r;
    r = us_pp_simulate(&s, tF, tB, tW, out, err, errlen);
    us_pp_schedule_free(&s);
    return r;
}

static void dualpipe_checks(void) {
    static const double costs[][3] = {{1, 1, 1}, {1, 8.0 / 7, 6.0 / 7}, {1, 1, 0.5}, {2, 1, 1}};
    char err[256];
    int p, m, c, r;
    for (p = 1; p <= 16; p++) /* valid where it applies, refused with a sentence elsewhere */
        for (m = 1; m <= 40; m++) {
            us_pp_sim d;
            us_result res = sim_dual(p, m, 1, 1, 1, &d, err, sizeof err);
            if (p % 2)
                CHECK(res == US_ERR_INVALID && strstr(err, "even pp"),
                      "dualpipe p=%d m=%d refused: %s", p, m, err);
            else if (m % 2 || m < 2 * p)
                CHECK(res == US_ERR_INVALID && strstr(err, "at least 2*pp"),
                      "dualpipe p=%d m=%d refused: %s", p, m, err);
            else
                CHECK(res == US_OK, "dualpipe p=%d m=%d builds and passes the checker: %s", p, m,
                      err);
        }
    for (p = 2; p <= 8; p *= 2)
        for (m = 2 * p; m <= 24; m += 2) {
            us_pp_sim d, dv, f1;
            double want = bubble(m, (p / 2 - 1) * ((1 + 2) + 2 - 3 * 1), 1, 1, 1);
            for (c = 0; c < (int)(sizeof costs / sizeof costs[0]) && p > 2; c++) {
                us_pp_schedule s;
                double tF = costs[c][0], tB = costs[c][1], tW = costs[c][2];
                us_pp_schedule_build(&s, US_PP_DUALPIPEV, p / 2, m / 2, 2, err, sizeof err);
                us_pp_simulate(&s, tF, tB, tW, &dv, err, sizeof err);
                us_pp_schedule_free(&s);
                sim_dual(p, m, tF, tB, tW, &d, err, sizeof err);
                CHECK(fabs(d.makespan - dv.makespan) < 1e-9,
                      "dualpipe p=%d m=%d tF=%g tB=%g tW=%g: makespan %.4f = dualpipev p=%d m=%d's "
                      "%.4f",
                      p, m, tF, tB, tW, d.makespan, p / 2, m / 2, dv.makespan);
            }
            sim_dual(p, m, 1, 1, 1, &d, err, sizeof err);
            CHECK(fabs(d.bubble - want) < 1e-9,
                  "dualpipe p=%d m=%d: bubble %.4f = (PP/2-1)(F&B+B-3W) = %.4f", p, m, d.bubble,
                  want);
            for (r = 0; r < p; r++)
                CHECK(d.peak_act[r] == p + 1, "dualpipe p=%d m=%d: rank %d holds %d chunks = PP+1",
                      p, m, r, d.peak_act[r]);
            sim(US_PP_DUALPIPEV, p, m, 1, 1, 1, &dv, err, sizeof err);
            sim(US_PP_1F1B, p, m, 1, 1, 1, &f1, err, sizeof err);
            CHECK(d.bubble < dv.bubble && dv.bubble < f1.bubble,
                  "p=%d m=%d, tF=tB=tW: dualpipe %.4f < dualpipev %.4f < 1f1b %.4f", p, m, d.bubble,
                  dv.bubble, f1.bubble);
        }
    { /* the checker: a micro-batch of the first half listed on the pipeline fed at rank pp−1 */
        us_pp_schedule s;
        us_pp_sim sm;
        us_pp_schedule_build(&s, US_PP_DUALPIPE, 4, 8, 2, err, sizeof err);
        CHECK(s.a[0][0].op == US_PP_F && s.a[0][0].chunk == 0 && s.a[0][0].mb == 0 &&
                  s.a[3][0].op == US_PP_F && s.a[3][0].chunk == 0 && s.a[3][0].mb == 4,
              "dualpipe pp=4 m=8: rank 0 starts micro-batch 0, rank 3 micro-batch 4 (%d, %d)",
              s.a[0][0].mb, s.a[3][0].mb);
        s.a[3][0].mb = 0;
        CHECK(us_pp_simulate(&s, 1, 1, 1, &sm, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "rank 3 action 0: micro-batch 0 runs on the other pipeline"),
              "a micro-batch on the other pipeline: %s", err);
        us_pp_schedule_free(&s);
        CHECK(!strcmp(us_pp_kind_name(US_PP_DUALPIPE), "dualpipe"), "kind name dualpipe");
    }
}

int main(int argc, char **argv) {
    static const int ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24};
    static const double costs[][3] = {{1, 1, 1}, {1, 8.0 / 7, 6.0 / 7}, {1, 1, 0.5}, {2, 1, 1}};
    int k, p, mi, c;
    char err[256];
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (k = 0; k < NKINDS; k++) /* every list is valid; the 1F1B family's closed forms */
        for (p = 1; p <= 8; p *= 2)
            for (mi = 0; mi < (int)(sizeof ms / sizeof ms[0]); mi++) {
                us_pp_sim s;
                int m = ms[mi], v = chunks(kinds[k]);
                double closed = (p - 1.0) / (v * m + p - 1.0);
                us_result r = sim(kinds[k], p, m, 1, 1, 1, &s, err, sizeof err);
                if (kinds[k] == US_PP_INTERLEAVED && m % p) {
                    CHECK(r == US_ERR_INVALID && strstr(err, "multiple of pp"),
                          "interleaved p=%d m=%d refused: %s", p, m, err);
                    continue;
                }
                if (kinds[k] == US_PP_DUALPIPEV && m < 2 * p) {
                    CHECK(r == US_ERR_INVALID && strstr(err, ">= 2*pp"),
                          "dualpipev p=%d m=%d < 2p refused: %s", p, m, err);
                    continue;
                }
                CHECK(r == US_OK, "%s p=%d m=%d builds and passes the checker: %s",
                      us_pp_kind_name(kinds[k]), p, m, err);
                if (r != US_OK || split(kinds[k])) continue;
                if (kinds[k] == US_PP_INTERLEAVED_BF &&
                    m < p) /* breadth-first needs m ≥ p micro-batches to fill the chunks' turns */
                    CHECK(s.bubble > closed,
                          "interleaved-bf p=%d m=%d < p: bubble %.4f above the closed form %.4f "
                          "(too few micro-batches)",
                          p, m, s.bubble, closed);
                else
                    CHECK(fabs(s.bubble - closed) < 1e-9,
                          "%s p=%d m=%d: bubble %.4f = (p-1)/(%sm+p-1) = %.4f",
                          us_pp_kind_name(kinds[k]), p, m, s.bubble, v > 1 ? "v·" : "", closed);
                if (kinds[k] == US_PP_1F1B)
                    CHECK(s.peak_act[0] == (m < p ? m : p),
                          "1f1b p=%d m=%d: rank 0 holds at most %d micro-batches (%d)", p, m,
                          m < p ? m : p, s.peak_act[0]);
                if (kinds[k] == US_PP_AFAB)
                    CHECK(s.peak_act[0] == m,
                          "afab p=%d m=%d: rank 0 holds all %d micro-batches (%d)", p, m, m,
                          s.peak_act[0]);
            }
    for (p = 2; p <= 8; p *= 2) /* the zero-bubble schedules against their papers */
        for (mi = 0; mi < (int)(sizeof ms / sizeof ms[0]); mi++) {
            us_pp_sim f1, z1, zv, dv;
            int m = ms[mi], r, lo = m < p ? m : p;
            if (sim(US_PP_1F1B, p, m, 1, 1, 1, &f1, err, sizeof err) != US_OK ||
                sim(US_PP_ZB1, p, m, 1, 1, 1, &z1, err, sizeof err) != US_OK ||
                sim(US_PP_ZBV, p, m, 1, 1, 1, &zv, err, sizeof err) != US_OK) {
                CHECK(0, "p=%d m=%d simulates: %s", p, m, err);
                continue;
            }
            CHECK(zv.bubble <= z1.bubble + 1e-12 && z1.bubble < f1.bubble,
                  "p=%d m=%d, tF=tB=tW: zbv %.4f <= zb1 %.4f < 1f1b %.4f", p, m, zv.bubble,
                  z1.bubble, f1.bubble);
            for (c = 0; c < (int)(sizeof costs / sizeof costs[0]) && m >= p; c++) {
                double tF = costs[c][0], tB = costs[c][1], tW = costs[c][2],
                       want = bubble(m, (p - 1) * (tF + tB - tW), tF, tB, tW);
                sim(US_PP_ZB1, p, m, tF, tB, tW, &z1, err, sizeof err);
                CHECK(fabs(z1.bubble - want) < 1e-9,
                      "zb1 p=%d m=%d tF=%g tB=%g tW=%g: bubble %.4f = (p-1)(tF+tB-tW) idle = %.4f",
                      p, m, tF, tB, tW, z1.bubble, want);
            }
            sim(US_PP_ZB1, p, m, 1, 1, 1, &z1, err, sizeof err);
            for (r = 0; r < p; r++)
                CHECK(z1.peak_act[r] <= f1.peak_max && z1.peak_act[r] == lo,
                      "zb1 p=%d m=%d: rank %d holds %d micro-batches, min(m, p) = 1F1B's peak %d",
                      p, m, r, z1.peak_act[r], f1.peak_max);
            if (m >= 2 * p - 1) { /* idle: the fill, p−1 chunk forwards of 1/2 */
                double want = bubble(m, (p - 1) * 0.5, 1, 1, 1);
                CHECK(fabs(zv.bubble - want) < 1e-9,
                      "zbv p=%d m=%d: bubble %.4f = (p-1)/(6m+p-1) = %.4f (idle = the fill, one "
                      "chunk forward per stage)",
                      p, m, zv.bubble, want);
            }
            CHECK(zv.peak_max <= 2 * p && (m < 2 * p || zv.peak_max == 2 * p),
                  "zbv p=%d m=%d: peak %d chunks <= 2p = 1F1B's p micro-batches", p, m,
                  zv.peak_max);
            if (m < 2 * p) continue;
            if (sim(US_PP_DUALPIPEV, p, m, 1, 1, 1, &dv, err, sizeof err) != US_OK) {
                CHECK(0, "dualpipev p=%d m=%d: %s", p, m, err);
                continue;
            }
            { /* DeepSeek: (PP/2−1)(F&B + B − 3W) for PP = 2p stages, per-chunk F = B_in = W = 1/2 */
                double F = 0.5, B = 1.0, W = 0.5,
                       want = bubble(m, (p - 1) * ((F + B) + B - 3 * W), 1, 1, 1);
                CHECK(fabs(dv.bubble - want) < 1e-9,
                      "dualpipev p=%d m=%d: bubble %.4f = (PP/2-1)(F&B+B-3W) = %.4f", p, m,
                      dv.bubble, want);
            }
            for (r = 0; r < p; r++)
                CHECK(dv.peak_act[r] == 2 * p + 1,
                      "dualpipev p=%d m=%d: rank %d holds %d chunks = PP+1 = %d", p, m, r,
                      dv.peak_act[r], 2 * p + 1);
            CHECK(dv.bubble > zv.bubble && dv.peak_max == zv.peak_max + 1,
                  "p=%d m=%d: dualpipev %.4f idles more than zbv %.4f and holds one chunk more (%d "
                  "vs %d)",
                  p, m, dv.bubble, zv.bubble, dv.peak_max, zv.peak_max);
        }
    { /* DualPipe-V's F&B pairs: a forward overlapped with a backward of an older micro-batch */
        us_pp_schedule s;
        int r, i, pairs = 0, bad = 0;
        us_pp_schedule_build(&s, US_PP_DUALPIPEV, 4, 10, 2, err, sizeof err);
        for (r = 0; r < s.pp; r++)
            for (i = 0; i < s.n[r]; i++)
                if (s.a[r][i].overlap) {
                    pairs++;
                    bad += s.a[r][i + 1].op != US_PP_BW || s.a[r][i + 1].mb >= s.a[r][i].mb;
                }
        CHECK(pairs > 0 && !bad,
              "dualpipev pp=4 m=10: %d F&B pairs, each a forward with the full backward of an "
              "older micro-batch (%d not)",
              pairs, bad);
        us_pp_schedule_free(&s);
    }
    { /* the checker refuses broken lists */
        us_pp_schedule s;
        us_pp_sim sm;
        us_pp_action t;
        us_pp_schedule_build(&s, US_PP_1F1B, 2, 4, 1, err, sizeof err);
        s.a[0][1].mb = s.a[0][0].mb; /* rank 0's second forward repeats the first: one missing */
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sm, err, sizeof err) == US_ERR_INVALID &&
                  !strcmp(err, "rank 0: micro-batch 0 chunk 0 has 2 forwards, 1 input and 1 "
                               "weight backwards (want 1 each)"),
              "a repeated action: %s", err);
        s.a[1][2].chunk = 1; /* rank 1's third action names a chunk the schedule lacks */
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sm, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "rank 0: micro-batch 0 chunk 0 has 2 forwards"),
              "rank 0's error comes before rank 1's: %s", err);
        s.a[0][1].mb = 1;
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sm, err, sizeof err) == US_ERR_INVALID &&
                  !strcmp(err, "rank 1 action 2 names micro-batch 1 chunk 1, outside 4 x 1"),
              "an action outside the micro-batches x chunks: %s", err);
        us_pp_schedule_free(&s);
        us_pp_schedule_build(&s, US_PP_1F1B, 2, 4, 1, err, sizeof err);
        t = s.a[0][0];
        s.a[0][0] = s.a[0][s.n[0] - 1];
        s.a[0][s.n[0] - 1] = t; /* a backward before any forward */
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sm, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "deadlock"),
              "an impossible order: %s", err);
        us_pp_schedule_free(&s);
        us_pp_schedule_build(&s, US_PP_1F1B, 2, 4, 1, err, sizeof err);
        s.a[1][0].overlap =
            1; /* rank 1 starts F0, BW0: a pair whose backward needs its own forward */
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sm, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "deadlock"),
              "a forward overlapped with its own backward: %s", err);
        s.a[1][0].overlap = 0;
        s.a[1][s.n[1] - 1].overlap = 1; /* a mark on the last action, a backward */
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sm, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "overlapped pair"),
              "an overlap mark on a backward: %s", err);
        us_pp_schedule_free(&s);
        CHECK(us_pp_schedule_build(&s, US_PP_INTERLEAVED, 4, 6, 2, err, sizeof err) ==
                      US_ERR_INVALID &&
                  strstr(err, "multiple of pp"),
              "interleaved with m not a multiple of p: %s", err);
        CHECK(us_pp_schedule_build(&s, US_PP_1F1B, 0, 6, 1, err, sizeof err) == US_ERR_INVALID,
              "pp 0: %s", err);
        CHECK(us_pp_schedule_build(&s, US_PP_ZBV, 4, 8, 3, err, sizeof err) == US_ERR_INVALID &&
                  strstr(err, "2 chunks"),
              "zbv with v=3: %s", err);
        CHECK(us_pp_schedule_build(&s, US_PP_DUALPIPEV, 4, 6, 0, err, sizeof err) ==
                      US_ERR_INVALID &&
                  strstr(err, ">= 2*pp"),
              "dualpipev with m < 2p: %s", err);
        CHECK(us_pp_schedule_build(&s, (us_pp_kind)99, 4, 8, 0, err, sizeof err) ==
                      US_ERR_INVALID &&
                  strstr(err, "unknown"),
              "an unknown kind: %s", err);
        CHECK(!strcmp(us_pp_kind_name(US_PP_ZBV), "zbv") &&
                  !strcmp(us_pp_kind_name(US_PP_DUALPIPEV), "dualpipev"),
              "kind names zbv, dualpipev");
    }
    dualpipe_checks();
    return us_test_done("test_pp_sched");
}
