/* test_pp_sched.c — pipeline schedules as data (issue 7, first part): every schedule the
   builder makes passes the checker; the simulator reproduces the Playbook's bubble formulas
   (AFAB and 1F1B: (p−1)/(m+p−1); interleaved with v chunks: (p−1)/(v·m+p−1)); ZB-H1's bubble
   is below 1F1B's; 1F1B holds at most p micro-batches' activations and AFAB m; broken lists
   (a missing or repeated action, an impossible order) are refused with a sentence. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <math.h>
#include <string.h>

int main(int argc, char **argv) {
    static const us_pp_kind kinds[] = {US_PP_AFAB, US_PP_1F1B, US_PP_INTERLEAVED, US_PP_INTERLEAVED_BF, US_PP_ZB1};
    int k, p, m;
    char err[256];
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    for (k = 0; k < 5; k++)
        for (p = 1; p <= 8; p *= 2)
            for (m = 1; m <= 16; m *= 2) {
                us_pp_schedule s;
                us_pp_sim sim;
                int v = kinds[k] == US_PP_INTERLEAVED || kinds[k] == US_PP_INTERLEAVED_BF ? 2 : 1, zb = kinds[k] == US_PP_ZB1;
                double closed = (p - 1.0) / (v * m + p - 1.0);
                if (us_pp_schedule_build(&s, kinds[k], p, m, v, err, sizeof err) != US_OK) {
                    CHECK(kinds[k] == US_PP_INTERLEAVED && m % p, "%s p=%d m=%d builds: %s", us_pp_kind_name(kinds[k]), p, m, err);
                    continue;
                }
                /* costs per chunk: forward 1, backward 2 (ZB: B 1 + W 1), split over v chunks */
                if (us_pp_simulate(&s, 1.0 / v, zb ? 1.0 / v : 2.0 / v, zb ? 1.0 / v : 0.0, &sim, err, sizeof err) != US_OK) {
                    CHECK(0, "%s p=%d m=%d is valid: %s", us_pp_kind_name(kinds[k]), p, m, err);
                    us_pp_schedule_free(&s);
                    continue;
                }
                if (kinds[k] == US_PP_INTERLEAVED_BF && m < p)   /* breadth-first needs m ≥ p micro-batches to fill the chunks' turns */
                    CHECK(sim.bubble > closed, "interleaved-bf p=%d m=%d < p: bubble %.4f above the closed form %.4f (too few micro-batches)", p, m, sim.bubble, closed);
                else if (!zb) CHECK(fabs(sim.bubble - closed) < 1e-9, "%s p=%d m=%d: bubble %.4f = (p-1)/(%sm+p-1) = %.4f",
                                    us_pp_kind_name(kinds[k]), p, m, sim.bubble, v > 1 ? "v·" : "", closed);
                else CHECK(p == 1 || sim.bubble < closed - 1e-9, "zb1 p=%d m=%d: bubble %.4f < 1F1B's %.4f", p, m, sim.bubble, closed);
                if (kinds[k] == US_PP_1F1B) CHECK(sim.peak_act[0] == (m < p ? m : p), "1f1b p=%d m=%d: rank 0 holds at most %d micro-batches (%d)", p, m, m < p ? m : p, sim.peak_act[0]);
                if (kinds[k] == US_PP_AFAB) CHECK(sim.peak_act[0] == m, "afab p=%d m=%d: rank 0 holds all %d micro-batches (%d)", p, m, m, sim.peak_act[0]);
                us_pp_schedule_free(&s);
            }
    {   /* the checker refuses broken lists */
        us_pp_schedule s;
        us_pp_sim sim;
        us_pp_action t;
        us_pp_schedule_build(&s, US_PP_1F1B, 2, 4, 1, err, sizeof err);
        s.a[0][1].mb = s.a[0][0].mb;   /* rank 0's second forward repeats the first: one missing */
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sim, err, sizeof err) == US_ERR_INVALID && strstr(err, "forwards"), "a repeated action: %s", err);
        us_pp_schedule_free(&s);
        us_pp_schedule_build(&s, US_PP_1F1B, 2, 4, 1, err, sizeof err);
        t = s.a[0][0]; s.a[0][0] = s.a[0][s.n[0] - 1]; s.a[0][s.n[0] - 1] = t;   /* a backward before any forward */
        CHECK(us_pp_simulate(&s, 1, 2, 0, &sim, err, sizeof err) == US_ERR_INVALID && strstr(err, "deadlock"), "an impossible order: %s", err);
        us_pp_schedule_free(&s);
        CHECK(us_pp_schedule_build(&s, US_PP_INTERLEAVED, 4, 6, 2, err, sizeof err) == US_ERR_INVALID && strstr(err, "multiple of pp"), "interleaved with m not a multiple of p: %s", err);
        CHECK(us_pp_schedule_build(&s, US_PP_1F1B, 0, 6, 1, err, sizeof err) == US_ERR_INVALID, "pp 0: %s", err);
    }
    return us_test_done("test_pp_sched");
}
