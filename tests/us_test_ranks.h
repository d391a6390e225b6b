/* us_test_ranks.h — the parallel tests' launcher: runs fn on n ranks as threads of this process
   (the threads backend of ultrascale_comm.h, with NCCL-like rendezvous sends), or directly with no communicator for one rank.
   Include after ultrascale_comm.h. Prints the launcher's sentence on a failure unless quiet. */
#ifndef US_TEST_RANKS_H
#define US_TEST_RANKS_H
#include <stdio.h>
#include <string.h>

/* 1: the launches impose NCCL's semantics on a GPU (us_launch_config.nccl: device
   synchronisations wait for every operation issued; a deadlock fails at once, naming it) */
static int us_test_nccl = 0;

static us_result us_test_launch(int n, us_rank_fn fn, void *arg, us_result *rank_results,
                                int quiet) {
    char err[256];
    us_launch_config lc;
    us_result r;
    memset(&lc, 0, sizeof lc);
    lc.timeout_s = 20;
    lc.p2p_rendezvous =
        1; /* sends complete only when received, as NCCL's: orders that deadlock on GPUs fail here */
    lc.nccl = us_test_nccl;
    if (n == 1) return fn(NULL, arg);
    r = us_launch_ex(n, fn, arg, &lc, rank_results, err, sizeof err);
    if (r != US_OK && !quiet) printf("  %s\n", err);
    return r;
}
#endif
