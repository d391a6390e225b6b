/* test_bootstrap.c — the bootstrap of ultrascale_comm.h: launcher environments (torchrun,
   Open MPI, Slurm), the TCP and file rendezvous between forked processes, timeouts, and the
   one-node launcher us_launch_procs (which runs this program itself in a child mode). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
#include "us_test.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *const env_vars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
};

static void clear_env(void) {
    size_t i;
    for (i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++) unsetenv(env_vars[i]);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(double s) {
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* a port nobody listens on right now (bound, read back, closed) */
static int free_port(void) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static void fill(unsigned char *b, size_t n, int seed) {
    size_t i;
    for (i = 0; i < n; i++) b[i] = (unsigned char)(i * 31 + (size_t)seed * 7 + 1);
}

static void test_env(void) {
    us_dist_env e;
    char err[256];
    us_result r;
    clear_env();
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && e.rank == 0 && e.world_size == 1 && e.local_rank == 0 &&
              e.local_world_size == 1 && !strcmp(e.source, "none") &&
              !strcmp(e.master_addr, "127.0.0.1"),
          "no launcher: rank 0 of 1 (%s)", e.source);

    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "1234", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && e.rank == 3 && e.world_size == 8 && e.local_rank == 3 &&
              e.local_world_size == 4 && !strcmp(e.master_addr, "10.0.0.1") &&
              e.master_port == 1234 && !strcmp(e.source, "torchrun"),
          "torchrun");
    unsetenv("MASTER_PORT");
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && e.master_port == 29500, "MASTER_ADDR alone: port 29500 (%d)",
          e.master_port);
    setenv("MASTER_PORT", "70000", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "MASTER_PORT=70000"), "port out of range: %s", err);
    setenv("MASTER_PORT", "1234", 1);
    setenv("RANK", "abc", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "RANK='abc'") && strstr(err, "not an integer"),
          "RANK not a number: %s", err);
    setenv("RANK", "8", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "RANK=8 must be below WORLD_SIZE=8"),
          "rank >= world: %s", err);
    setenv("RANK", "1", 1);
    setenv("LOCAL_RANK", "4", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "LOCAL_RANK=4"), "local rank >= local world: %s", err);
    setenv("LOCAL_RANK", "1", 1);
    setenv("WORLD_SIZE", "", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "WORLD_SIZE"), "empty WORLD_SIZE: %s", err);
    unsetenv("WORLD_SIZE");
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "WORLD_SIZE is not"), "RANK without WORLD_SIZE: %s",
          err);
    setenv("WORLD_SIZE", "2", 1);
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    unsetenv("MASTER_ADDR");
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "MASTER_ADDR"), "world 2 without MASTER_ADDR: %s",
          err);
    setenv("MASTER_ADDR", "localhost", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && e.local_rank == 1 && e.local_world_size == 2,
          "missing local values fall back to one node");

    /* Open MPI, and its precedence over Slurm but not over torchrun */
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "5", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "16", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "16 ranks (openmpi) needs MASTER_ADDR"),
          "Open MPI without MASTER_ADDR: %s", err);
    setenv("MASTER_ADDR", "node7", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && !strcmp(e.source, "openmpi") && e.rank == 5 && e.world_size == 16 &&
              e.local_rank == 1 && e.local_world_size == 4 && !strcmp(e.master_addr, "node7") &&
              e.master_port == 29500,
          "Open MPI (before Slurm)");
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && !strcmp(e.source, "torchrun") && e.world_size == 1,
          "torchrun before Open MPI");

    /* Slurm, with the master from the node list */
    clear_env();
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[007-008,010]", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && !strcmp(e.source, "slurm") && e.rank == 5 && e.world_size == 8 &&
              e.local_rank == 1 && e.local_world_size == 4 && !strcmp(e.master_addr, "gpu007") &&
              e.master_port == 29500,
          "Slurm: first host of gpu[007-008,010] is %s, local world %d", e.master_addr,
          e.local_world_size);
    setenv("SLURM_STEP_NODELIST", "nodeA,nodeB", 1);
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    setenv("SLURM_LOCALID", "0", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && !strcmp(e.master_addr, "nodeA") && e.local_world_size == 2,
          "Slurm: step node list first (%s)", e.master_addr);
    setenv("SLURM_STEP_NODELIST", "rack1-n[3-4]-ib", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && !strcmp(e.master_addr, "rack1-n3-ib"), "Slurm: suffix after the range (%s)",
          e.master_addr);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", "4000", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_OK && !strcmp(e.master_addr, "10.1.2.3") && e.master_port == 4000,
          "Slurm: MASTER_ADDR wins over the node list");
    unsetenv("MASTER_ADDR");
    setenv("SLURM_STEP_NODELIST", "gpu[x]", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "gpu[x]"), "unreadable node list: %s", err);
    setenv("SLURM_STEP_NODELIST", "n1", 1);
    setenv("SLURM_NTASKS", "-2", 1);
    r = us_dist_env_read(&e, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "SLURM_NTASKS=-2"), "negative world: %s", err);
    clear_env();
}

/* nproc forked ranks meet over `spec`; rank 0 (this process) publishes 128 bytes after
   `delay` s. Returns how many ranks got identical bytes. */
static int run_rendezvous(const char *spec, int nproc, double delay) {
    unsigned char mine[128], want[128];
    char err[256];
    pid_t pid[16];
    int r, good = 0, st;
    fill(want, sizeof want, 42);
    fflush(stdout);
    for (r = 1; r < nproc; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            memset(mine, 0, sizeof mine);
            if (us_rendezvous(spec, r, nproc, mine, sizeof mine, 5, err, sizeof err) != US_OK) {
                printf("  rank %d: %s\n", r, err);
                fflush(stdout);
                _exit(2);
            }
            _exit(memcmp(mine, want, sizeof mine) ? 1 : 0);
        }
    }
    nap(delay);
    memcpy(mine, want, sizeof mine);
    if (us_rendezvous(spec, 0, nproc, mine, sizeof mine, 5, err, sizeof err) == US_OK)
        good++;
    else
        printf("  rank 0: %s\n", err);
    for (r = 1; r < nproc; r++)
        if (waitpid(pid[r], &st, 0) == pid[r] && WIFEXITED(st) && WEXITSTATUS(st) == 0) good++;
    return good;
}

static void test_rendezvous(void) {
    char spec[512], dir[] = "/tmp/us_boot_XXXXXX", err[256];
    unsigned char b[8];
    double t;
    us_result r;
    int port = free_port(), dead = free_port();
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%d", port);
    CHECK(run_rendezvous(spec, 4, 0.3) == 4,
          "tcp: 4 processes receive rank 0's bytes (rank 0 arrives last)");
    CHECK(run_rendezvous(spec, 4, 0.0) == 4, "tcp: the same port again right away (SO_REUSEADDR)");
    snprintf(spec, sizeof spec, "tcp://localhost:%d", port);
    CHECK(run_rendezvous(spec, 3, 0.0) == 3, "tcp: a host name");
    CHECK(mkdtemp(dir) != NULL, "a temporary directory");
    snprintf(spec, sizeof spec, "file://%s/id", dir);
    CHECK(run_rendezvous(spec, 4, 0.2) == 4, "file: 4 processes read rank 0's file");
    snprintf(spec, sizeof spec, "%s/id", dir);
    remove(spec);
    rmdir(dir);

    /* timeouts: nobody listens, nobody connects, no file */
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%d", dead);
    t = now_s();
    r = us_rendezvous(spec, 2, 4, b, sizeof b, 0.5, err, sizeof err);
    t = now_s() - t;
    CHECK(r == US_ERR_IO && strstr(err, "rank 2 could not reach 127.0.0.1:") &&
              strstr(err, "within 0.5 s") && strstr(err, "refused") && t < 2.0,
          "a peer with nobody listening gives up in %.2f s: %s", t, err);
    t = now_s();
    r = us_rendezvous(spec, 0, 3, b, sizeof b, 0.3, err, sizeof err);
    t = now_s() - t;
    CHECK(r == US_ERR_IO && strstr(err, "only 1 of 3 ranks arrived (missing: 1 2)") && t < 2.0,
          "rank 0 alone gives up in %.2f s: %s", t, err);
    r = us_rendezvous("file:///nonexistent/us_boot/id", 1, 2, b, sizeof b, 0.2, err, sizeof err);
    CHECK(r == US_ERR_IO && strstr(err, "found no file"), "no file: %s", err);
    r = us_rendezvous("file:///nonexistent/us_boot/id", 0, 2, b, sizeof b, 0.2, err, sizeof err);
    CHECK(r == US_ERR_IO && strstr(err, "could not write"), "rank 0 cannot write: %s", err);

    /* bad arguments */
    r = us_rendezvous("udp://x:1", 0, 2, b, sizeof b, 1, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "tcp:// or file://"), "unknown scheme: %s", err);
    r = us_rendezvous("tcp://host", 1, 2, b, sizeof b, 1, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "tcp://HOST:PORT"), "no port: %s", err);
    r = us_rendezvous("tcp://host:http", 1, 2, b, sizeof b, 1, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "port"), "port not a number: %s", err);
    r = us_rendezvous("tcp://host:1", 2, 2, b, sizeof b, 1, err, sizeof err);
    CHECK(r == US_ERR_INVALID && strstr(err, "rank 2"), "rank outside the world: %s", err);
    r = us_rendezvous("tcp://[::1]:1", 0, 1, b, sizeof b, 1, err, sizeof err);
    CHECK(r == US_OK, "a world of one needs nobody (and an IPv6 form parses)");
}

/* The child mode the launcher tests start: argv = {prog, "--child", mode}. */
static int child_main(const char *mode) {
    us_dist_env e;
    char err[256], spec[300];
    unsigned char b[64], want[64];
    if (us_dist_env_read(&e, err, sizeof err) != US_OK) {
        printf("  child: %s\n", err);
        return 2;
    }
    if (!strcmp(mode, "ok")) { /* the launcher's environment is enough to meet */
        const char *nvls = getenv("NCCL_NVLS_ENABLE");
        if (strcmp(e.source, "torchrun") || strcmp(e.master_addr, "127.0.0.1") ||
            e.local_rank != e.rank || e.local_world_size != e.world_size || !nvls ||
            strcmp(nvls, "0")) {
            printf("  child %d: wrong environment\n", e.rank);
            return 2;
        }
        snprintf(spec, sizeof spec, "tcp://%s:%d", e.master_addr, e.master_port);
        fill(want, sizeof want, 9);
        memcpy(b, e.rank == 0 ? want : b, sizeof b);
        if (e.rank != 0) memset(b, 0, sizeof b);
        if (us_rendezvous(spec, e.rank, e.world_size, b, sizeof b, 10, err, sizeof err) != US_OK) {
            printf("  child %d: %s\n", e.rank, err);
            return 2;
        }
        return memcmp(b, want, sizeof b) ? 2 : 0;
    }
    if (!strcmp(mode, "exit3")) {
        if (e.rank == 1) return 3;
        nap(0.2);
        return 0;
    }
    if (!strcmp(mode, "kill")) { /* rank 1 dies by a signal; the others would run for a minute */
        if (e.rank == 1) {
            nap(0.1);
            raise(SIGKILL);
        }
        nap(60);
        return 0;
    }
    return 2;
}

static void test_launch(const char *self) {
    char err[256];
    char *ok[] = {(char *)self, (char *)"--child", (char *)"ok", NULL};
    char *ok_path[] = {(char *)"us-test-bootstrap-not-in-path", (char *)"--child", (char *)"ok",
                       NULL};
    char *ex[] = {(char *)self, (char *)"--child", (char *)"exit3", NULL};
    char *kl[] = {(char *)self, (char *)"--child", (char *)"kill", NULL};
    char *none[] = {(char *)"/nonexistent/us_prog", NULL};
    double t;
    int rc;
    setenv("RANK", "7", 1); /* the launcher must override a stale environment */
    rc = us_launch_procs(4, ok, 5, err, sizeof err);
    CHECK(rc == 0, "4 ranks launched, met over tcp from their environment, exited 0 (rc %d: %s)",
          rc, err);
    unsetenv("RANK");
    rc = us_launch_procs(2, ok_path, 5, err, sizeof err);
    CHECK(rc == 0, "argv[0] without a slash and not in PATH runs /proc/self/exe (rc %d: %s)", rc,
          err);
    rc = us_launch_procs(3, ex, 5, err, sizeof err);
    CHECK(rc == 3 && strstr(err, "rank 1 exited with code 3"), "one rank exits 3: rc %d, %s", rc,
          err);
    t = now_s();
    rc = us_launch_procs(3, kl, 0.3, err, sizeof err);
    t = now_s() - t;
    CHECK(rc == 128 + 9 && strstr(err, "rank 1 was killed by signal 9") &&
              strstr(err, "2 other ranks were stopped with SIGTERM") && t < 5,
          "one rank killed: rc %d in %.2f s, %s", rc, t, err);
    rc = us_launch_procs(1, none, 1, err, sizeof err);
    CHECK(rc == 127 && strstr(err, "rank 0 exited with code 127"),
          "a program that does not exist: rc %d, %s", rc, err);
    rc = us_launch_procs(0, ok, 1, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "nproc=0"), "no processes: %s", err);
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--child")) return child_main(argv[2]);
    us_test_verbose = argc > 1 && !strcmp(argv[1], "-v");
    test_env();
    test_rendezvous();
    test_launch(argv[0]);
    return us_test_done("test_bootstrap");
}
