/* us_impl.c — the library's implementation in one translation unit, for the Makefile to compile
   once per flag set (build/ultrascale.o with CFLAGS, build/san/ultrascale.o with the sanitizers,
   and build/cuda/ultrascale.o by nvcc with -DUS_CUDA -DULTRASCALE_NCCL). The examples and most
   tests link against it instead of each compiling the 9,000 lines again; see the Makefile. */
#define ULTRASCALE_IMPLEMENTATION
#ifdef US_CUDA
#include "../ultrascale_cuda.cuh"
#endif
#include "../ultrascale.h"
#include "../ultrascale_comm.h"
