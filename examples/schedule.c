/* schedule.c — pipeline schedules as pictures and numbers, from the same lists the executor runs.
       build/schedule                                      # the bubble tables for pp 4, m 8
       build/schedule --schedule 1f1b --pp 4 --m 8 --svg 1f1b.svg
       build/schedule --schedule interleaved --pp 4 --m 8 --v 2 --svg il.svg
       build/schedule --schedule zbv --tf 1 --tb 1.2 --tw 0.8
       build/schedule --schedule dualpipe --pp 4 --m 16 --svg dualpipe.svg
   Costs are per micro-batch on one rank: forward tF, input-gradient backward tB, weight-gradient
   backward tW (the unsplit schedules run BW = tB + tW), divided over the rank's v chunks (2 for
   zbv and dualpipev). DualPipe's rank holds 2 chunks too, but they are two stages of the model,
   each 1/pp of its layers (the weights twice over), and a micro-batch crosses only one of them:
   its costs are not divided, and a chunk's activations weigh a 1F1B micro-batch's. Without
   --schedule it prints every schedule at tF = tB = tW = 1 and at a transformer layer's FLOP
   ratio (below), or at the costs given. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const us_pp_kind all[] = {US_PP_AFAB, US_PP_1F1B, US_PP_INTERLEAVED, US_PP_INTERLEAVED_BF,
                                 US_PP_ZB1,  US_PP_ZBV,  US_PP_DUALPIPEV,   US_PP_DUALPIPE};
#define NALL ((int)(sizeof all / sizeof all[0]))

static int num(const char *s, int lo, int hi, int *out) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int cost(const char *s, double *out) {
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0 && v <= 1e6)) return 0;
    *out = v;
    return 1;
}

static int parse_kind(const char *s, us_pp_kind *k) {
    int i;
    for (i = 0; i < NALL; i++)
        if (!strcmp(s, us_pp_kind_name(all[i]))) {
            *k = all[i];
            return 1;
        }
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: schedule [--schedule "
               "afab|1f1b|interleaved|interleaved-bf|zb1|zbv|dualpipev|dualpipe]\n"
               "                [--pp N] [--m N] [--v N] [--tf X] [--tb X] [--tw X] [--svg FILE]\n"
               "  without --schedule: the bubble and peak-activation table of every schedule\n");
}

/* The bubble each schedule's paper gives, as a fraction of the makespan, where it applies
   (-1 where it does not): idle time per rank over work m·(tF+tB+tW) plus idle. */
static double formula(us_pp_kind k, int p, int m, int v, double tF, double tB, double tW) {
    double work = m * (tF + tB + tW), idle;
    switch (k) {
    case US_PP_AFAB:
    case US_PP_1F1B:
        return (p - 1.0) / (m + p - 1.0); /* Playbook */
    case US_PP_INTERLEAVED:
    case US_PP_INTERLEAVED_BF:
        return m < p ? -1 : (p - 1.0) / (v * m + p - 1.0);
    case US_PP_ZB1: /* Qi et al.: (p−1)(tF+tB−tW), when W is the shortest pass */
        if (m < p || tW > tF || tW > tB) return -1;
        idle = (p - 1) * (tF + tB - tW);
        break;
    case US_PP_ZBV: /* only the pipeline's fill, (p−1) chunk forwards, when tF = tB = tW */
        if (m < 2 * p - 1 || tF != tB || tB != tW) return -1;
        idle = (p - 1) * tF / 2;
        break;
    case US_PP_DUALPIPEV: /* DeepSeek: (PP/2−1)(F&B + B − 3W), per-chunk costs, B the full backward */
        idle = (p - 1) * ((tF + tB + tW) / 2 + (tB + tW) / 2 - 3 * tW / 2);
        break;
    case US_PP_DUALPIPE: /* the same for PP = p stages, a chunk (a stage) costing a micro-batch's */
        idle = (p / 2 - 1) * ((tF + tB + tW) + (tB + tW) - 3 * tW);
        break;
    default:
        return -1;
    }
    return idle / (work + idle);
}

/* One table row; a schedule that does not suit (pp, m, v) says why in its row, and fails the
   program when it was the one asked for (fatal). */
static int row(us_pp_kind k, int pp, int m, int v, double tF, double tB, double tW, const char *svg,
               int fatal) {
    us_pp_schedule s;
    us_pp_sim sim;
    char err[256], fs[16] = "n/a";
    int vv = k == US_PP_INTERLEAVED || k == US_PP_INTERLEAVED_BF             ? v
             : k == US_PP_ZBV || k == US_PP_DUALPIPEV || k == US_PP_DUALPIPE ? 2
                                                                             : 1;
    int zb = k == US_PP_ZB1 || k == US_PP_ZBV || k == US_PP_DUALPIPEV || k == US_PP_DUALPIPE;
    int dv = k == US_PP_DUALPIPE ? 1 : vv; /* the chunks a micro-batch crosses on a rank */
    double f = formula(k, pp, m, vv, tF, tB, tW), cF = tF / dv, cB = (zb ? tB : tB + tW) / dv,
           cW = zb ? tW / dv : 0;
    if (us_pp_schedule_build(&s, k, pp, m, vv, err, sizeof err) != US_OK) {
        if (fatal) {
            fprintf(stderr, "schedule: %s\n", err);
            return 2;
        }
        printf("| %-14s | %2d | %3d | %d | %s |\n", us_pp_kind_name(k), pp, m, vv, err);
        return 0;
    }
    if (us_pp_simulate(&s, cF, cB, cW, &sim, err, sizeof err) != US_OK) {
        fprintf(stderr, "schedule: %s\n", err);
        us_pp_schedule_free(&s);
        return 1;
    }
    if (f >= 0) snprintf(fs, sizeof fs, "%5.1f%%", 100 * f);
    printf("| %-14s | %2d | %3d | %d | %6.1f%% | %15s | %17d | %29.1f |\n", us_pp_kind_name(k), pp,
           m, vv, 100 * sim.bubble, fs, sim.peak_max, (double)sim.peak_max / dv);
    if (svg) {
        if (us_pp_svg(&s, cF, cB, cW, svg, err, sizeof err) != US_OK) {
            fprintf(stderr, "schedule: %s\n", err);
            us_pp_schedule_free(&s);
            return 1;
        }
        printf("wrote %s\n", svg);
    }
    us_pp_schedule_free(&s);
    return 0;
}

static int table(int pp, int m, int v, double tF, double tB, double tW, const us_pp_kind *ks, int n,
                 const char *svg) {
    int i, rc = 0;
    printf("\ntF=%g tB=%g tW=%g per micro-batch and rank\n\n"
           "| schedule       | pp |   m | v | bubble  | paper's formula | peak act (chunks) | peak "
           "÷ v (1F1B micro-batches) |\n"
           "|---|---|---|---|---|---|---|---|\n",
           tF, tB, tW);
    for (i = 0; i < n && !rc; i++) rc = row(ks[i], pp, m, v, tF, tB, tW, svg, n == 1);
    return rc;
}

int main(int argc, char **argv) {
    int pp = 4, m = 8, v = 2, i, one = 0, given = 0, rc;
    us_pp_kind kind = US_PP_1F1B;
    double tF = 1, tB = 1, tW = 1;
    const char *svg = NULL;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!val) {
            fprintf(stderr, "schedule: missing value for %s\n", f);
            usage(stderr);
            return 2;
        }
        if (!strcmp(f, "--schedule")) {
            if (!parse_kind(val, &kind)) {
                fprintf(stderr, "schedule: unknown schedule %s\n", val);
                usage(stderr);
                return 2;
            }
            one = 1;
        } else if (!strcmp(f, "--pp")) {
            if (!num(val, 1, 64, &pp)) {
                fprintf(stderr, "schedule: bad value for --pp: %s\n", val);
                return 2;
            }
        } else if (!strcmp(f, "--m")) {
            if (!num(val, 1, 100000, &m)) {
                fprintf(stderr, "schedule: bad value for --m: %s\n", val);
                return 2;
            }
        } else if (!strcmp(f, "--v")) {
            if (!num(val, 2, 64, &v)) {
                fprintf(stderr, "schedule: bad value for --v: %s\n", val);
                return 2;
            }
        } else if (!strcmp(f, "--tf") || !strcmp(f, "--tb") || !strcmp(f, "--tw")) {
            if (!cost(val, f[3] == 'f' ? &tF : f[3] == 'b' ? &tB : &tW)) {
                fprintf(stderr, "schedule: bad value for %s: %s\n", f, val);
                return 2;
            }
            given = 1;
        } else if (!strcmp(f, "--svg"))
            svg = val;
        else {
            fprintf(stderr, "schedule: unknown flag %s\n", f);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (tF <= 0 || tB + tW <= 0) {
        fprintf(
            stderr,
            "schedule: the forward and the backward must take some time (--tf, --tb + --tw > 0)\n");
        return 2;
    }
    if (one) return table(pp, m, v, tF, tB, tW, &kind, 1, svg);
    if ((rc = table(pp, m, v, tF, tB, tW, all, NALL, NULL)) != 0 || given) return rc;
    /* A transformer layer's FLOPs per token, hidden h, sequence s (Qi et al.'s accounting):
       F 24h² + 4sh (the linears, then scores and mixing), B 24h² + 8sh (input gradients of both),
       W 24h² (the weight gradients; attention has none). At s = h: 28 : 32 : 24. */
    return table(pp, m, v, 1, 32.0 / 28, 24.0 / 28, all, NALL, NULL);
}
