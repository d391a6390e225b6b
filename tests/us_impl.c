/* us_impl.c — the library's implementation in one translation unit, for the Makefile to compile
   once per flag set (build/ultrascale.o with CFLAGS, build/san/ultrascale.o with the sanitizers,
   and build/cuda/ultrascale.o by nvcc with -DUS_CUDA -DULTRASCALE_NCCL). The examples and most
   tests link against it instead of each compiling the 17,000 lines again; see the Makefile.
   The C objects also hold the four tests that use the implementation's private parts
   (tests/test_internal.c: test_dp, test_tp, test_fp8_train, test_moe), which can only be
   compiled inside its translation unit; build/test_internal calls them
   (tests/test_internal_main.c); the other programs carry them unused. */
#define ULTRASCALE_IMPLEMENTATION
#ifdef US_CUDA
#include "../ultrascale_cuda.cuh"
#endif
#include "../ultrascale.h"
#include "../ultrascale_comm.h"

#ifndef US_CUDA
#define US_TEST_INTERNAL_IN_IMPL
#include "test_internal.c"
#endif
