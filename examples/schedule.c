/* schedule.c — pipeline schedules as pictures and numbers, from the same lists the executor runs.
       build/schedule                                      # the bubble table for pp 4, m 8
       build/schedule --schedule 1f1b --pp 4 --m 8 --svg 1f1b.svg
       build/schedule --schedule interleaved --pp 4 --m 8 --v 2 --svg il.svg
   Costs per micro-batch and stage: forward 1, backward 2 (split B 1 + W 1 for zb1), divided over
   the v chunks of the interleaved schedules. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int num(const char *s, int lo, int hi, int *out) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}
static int parse_kind(const char *s, us_pp_kind *k) {
    static const us_pp_kind all[] = {US_PP_AFAB, US_PP_1F1B, US_PP_INTERLEAVED, US_PP_INTERLEAVED_BF, US_PP_ZB1};
    int i;
    for (i = 0; i < 5; i++) if (!strcmp(s, us_pp_kind_name(all[i]))) { *k = all[i]; return 1; }
    return 0;
}
static void usage(FILE *f) {
    fprintf(f, "usage: schedule [--schedule afab|1f1b|interleaved|interleaved-bf|zb1] [--pp N] [--m N] [--v N] [--svg FILE]\n"
               "  without --schedule: the bubble and peak-activation table of every schedule\n");
}

static int row(us_pp_kind k, int pp, int m, int v, const char *svg) {
    us_pp_schedule s;
    us_pp_sim sim;
    char err[256];
    int zb = k == US_PP_ZB1, vv = k == US_PP_INTERLEAVED || k == US_PP_INTERLEAVED_BF ? v : 1;
    if (us_pp_schedule_build(&s, k, pp, m, vv, err, sizeof err) != US_OK) { fprintf(stderr, "schedule: %s\n", err); return 2; }
    if (us_pp_simulate(&s, 1.0 / vv, zb ? 1.0 / vv : 2.0 / vv, zb ? 1.0 / vv : 0, &sim, err, sizeof err) != US_OK) {
        fprintf(stderr, "schedule: %s\n", err); us_pp_schedule_free(&s); return 1;
    }
    printf("| %-14s | %2d | %3d | %d | %6.1f%% | %6.1f%% | %4d |\n", us_pp_kind_name(k), pp, m, vv, 100 * sim.bubble,
           100.0 * (pp - 1.0) / (vv * m + pp - 1.0), sim.peak_max);
    if (svg) {
        if (us_pp_svg(&s, 1.0 / vv, zb ? 1.0 / vv : 2.0 / vv, zb ? 1.0 / vv : 0, svg, err, sizeof err) != US_OK) { fprintf(stderr, "schedule: %s\n", err); us_pp_schedule_free(&s); return 1; }
        printf("wrote %s\n", svg);
    }
    us_pp_schedule_free(&s);
    return 0;
}

int main(int argc, char **argv) {
    int pp = 4, m = 8, v = 2, i, all = 1, rc = 0;
    us_pp_kind kind = US_PP_1F1B;
    const char *svg = NULL;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help")) { usage(stdout); return 0; }
        if (!val) { fprintf(stderr, "schedule: missing value for %s\n", f); usage(stderr); return 2; }
        if (!strcmp(f, "--schedule")) { if (!parse_kind(val, &kind)) { fprintf(stderr, "schedule: unknown schedule %s\n", val); usage(stderr); return 2; } all = 0; }
        else if (!strcmp(f, "--pp")) { if (!num(val, 1, 64, &pp)) { fprintf(stderr, "schedule: bad value for --pp: %s\n", val); return 2; } }
        else if (!strcmp(f, "--m")) { if (!num(val, 1, 100000, &m)) { fprintf(stderr, "schedule: bad value for --m: %s\n", val); return 2; } }
        else if (!strcmp(f, "--v")) { if (!num(val, 2, 64, &v)) { fprintf(stderr, "schedule: bad value for --v: %s\n", val); return 2; } }
        else if (!strcmp(f, "--svg")) svg = val;
        else { fprintf(stderr, "schedule: unknown flag %s\n", f); usage(stderr); return 2; }
        i++;
    }
    printf("| schedule       | pp |   m | v | bubble  | (p-1)/(vm+p-1) | peak act |\n|---|---|---|---|---|---|---|\n");
    if (all) {
        static const us_pp_kind ks[] = {US_PP_AFAB, US_PP_1F1B, US_PP_INTERLEAVED, US_PP_INTERLEAVED_BF, US_PP_ZB1};
        for (i = 0; i < 5 && !rc; i++) rc = row(ks[i], pp, m, v, NULL);
        return rc;
    }
    return row(kind, pp, m, v, svg);
}
