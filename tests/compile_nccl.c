/* compile_nccl.c: the NCCL backend of ultrascale_comm.h compiles as C99 with -pedantic (the CUDA
   headers come in through -isystem). Compiled, not linked, by make test, under ULTRASCALE_STATIC:
   the compiler optimises (and warns about) what this file reaches, which is every entry point of
   ultrascale_comm.h (the threads backend, the bootstrap, NCCL) below; the rest of ultrascale.h is
   parsed and checked, and compiled whole by the cc_c99 and cc_2tu checks. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"

int us_compile_nccl_main(int argc, char **argv);

int us_compile_nccl_main(int argc, char **argv) {
    us_comm c;
    us_dist_env e;
    char err[128], bytes[8] = {0};
    if (us_nccl_init(&c, NULL, NULL, 0, 1, "file:///tmp/none", 1.0, err, sizeof err) != US_OK)
        return 1;
    us_nccl_free(&c);
    if (us_dist_env_read(&e, err, sizeof err) != US_OK) return 1;
    if (us_rendezvous("file:///tmp/none", 0, 1, bytes, sizeof bytes, 1.0, err, sizeof err) != US_OK)
        return 1;
    if (argc > 1) return us_launch_procs(2, argv, 1.0, err, sizeof err);
    return us_launch(1, NULL, NULL) == US_OK;
}
