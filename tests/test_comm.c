/* test_comm.c — the comm seam (us_comm) and its world of one rank. The threads and NCCL
   backends of ultrascale_comm.h will be checked against the same expectations. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "us_test.h"

#include <string.h>

int main(int argc, char **argv) {
    us_ops o = us_cpu_ops(1);
    us_comm c;
    us_work *w = (us_work *)&c; /* poisoned: a synchronous backend must set it to NULL */
    float a[8], b[8], keep[8];
    int64_t cnt[1] = {3}, rd[1] = {2}, sd[1] = {4};
    us_group bad = {2, 1, NULL};
    int i;
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    us_comm_self(&c, &o);
    for (i = 0; i < 8; i++) {
        a[i] = (float)(rnd01() * 2 - 1);
        b[i] = -7.0f;
    }
    memcpy(keep, a, sizeof a);
    CHECK(c.world.size == 1 && c.world.rank == 0 && !strcmp(c.name, "self"),
          "the world is one rank");
    CHECK(c.all_reduce(&c, &c.world, a, 8, US_F32, US_REDUCE_SUM, NULL) == US_OK &&
              !memcmp(a, keep, sizeof a),
          "sum over one rank is the identity");
    CHECK(c.all_reduce(&c, &c.world, a, 8, US_F32, US_REDUCE_AVG, &w) == US_OK && w == NULL &&
              c.wait(&c, w) == US_OK && !memcmp(a, keep, sizeof a),
          "async mean over one rank: handle, wait, identity");
    CHECK(c.reduce_scatter(&c, &c.world, b, a, 8, US_F32, US_REDUCE_SUM, NULL) == US_OK &&
              !memcmp(b, a, sizeof a),
          "reduce-scatter of one rank copies its block");
    for (i = 0; i < 8; i++) b[i] = -7.0f;
    CHECK(c.all_gather(&c, &c.world, b, a, 5, US_F32, NULL) == US_OK && !memcmp(b, a, 5 * 4) &&
              b[5] == -7.0f,
          "all-gather copies n elements and no more");
    CHECK(c.broadcast(&c, &c.world, a, 8, US_F32, 0, NULL) == US_OK && !memcmp(a, keep, sizeof a),
          "broadcast from rank 0");
    CHECK(c.broadcast(&c, &c.world, a, 8, US_F32, 1, NULL) == US_ERR_INVALID &&
              strstr(c.err, "root 1"),
          "broadcast from a missing root: %s", c.err);
    CHECK(c.send(&c, &c.world, a, 8, US_F32, 1, NULL) == US_ERR_INVALID &&
              strstr(c.err, "no peers"),
          "send has nobody to go to: %s", c.err);
    CHECK(c.recv(&c, &c.world, a, 8, US_F32, 0, NULL) == US_ERR_INVALID, "recv too: %s", c.err);
    for (i = 0; i < 8; i++) b[i] = -7.0f;
    CHECK(c.all_to_all(&c, &c.world, b, cnt, rd, a, cnt, sd, US_F32, NULL) == US_OK &&
              !memcmp(b + 2, a + 4, 3 * 4) && b[1] == -7.0f && b[5] == -7.0f,
          "all-to-all moves the block to itself at the displacements");
    CHECK(c.all_reduce(&c, &bad, a, 8, US_F32, US_REDUCE_SUM, NULL) == US_ERR_INVALID &&
              strstr(c.err, "only group"),
          "a group that does not exist: %s", c.err);
    CHECK(c.all_gather(&c, &c.world, b, a, -1, US_F32, NULL) == US_ERR_INVALID,
          "negative count: %s", c.err);
    CHECK(c.barrier(&c, &c.world) == US_OK, "barrier");
    return us_test_done("test_comm");
}
