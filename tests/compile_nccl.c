/* compile_nccl.c: the NCCL backend of ultrascale_comm.h compiles as C99 with -pedantic (the CUDA
   headers come in through -isystem). Compiled, not linked, by make test. */
#define ULTRASCALE_IMPLEMENTATION
#include "../ultrascale.h"
#include "../ultrascale_comm.h"

int us_compile_nccl_main(void);

int us_compile_nccl_main(void) {
    us_comm c;
    char err[128];
    return us_nccl_init(&c, NULL, NULL, 0, 1, "file:///tmp/none", 1.0, err, sizeof err) == US_OK;
}
