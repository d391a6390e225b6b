#!/usr/bin/env python3
"""extract_rmsnorm.py ULTRASCALE_CUDA_CUH OUT.h -- RMSNorm's one-pass backward of
ultrascale_cuda.cuh (// >>cuda-kernels' element and 16-byte access, us__block_sum, and
us__k_rmsnorm_bwd_vec: dx and dw's partial sums of 32 rows a block), minus the host code,
rewritten so that us_cuda_emu.h can run it on the CPU (see rmsnorm_emu.cpp). Fails loudly if the
markers it cuts at move."""
import sys
from extract_common import Header, write
hdr = Header(sys.argv[1], 'extract_rmsnorm.py')
parts = []
def cut(a, b, start=0):
    parts.append(hdr.cut(a, b, start))
cut('__device__ __forceinline__ float us__ld(const float', '/* Calls KERNEL<float>')
cut('/* block-wide sum (any blockDim', '__device__ float us__block_max')
cut('struct us__vec {', 'static int us__al(')
parts[-1].insert(0, 'template <typename T>')
cut('#define US__ROW_RV', '/* What a vector kernel of RMSNorm or SwiGLU does')
cut("/* dx and dw's partial sums in one pass", '/* dw = Σ_n dy·xhat in two passes')
txt = '\n'.join('\n'.join(p) for p in parts)
# one block runs at a time in the emulator, its threads in one OS thread: a static is its smem
txt = txt.replace('__shared__ float sh[32];', 'static float sh[32];')
write(sys.argv[2], 'extract_rmsnorm.py', txt,
      bad=('__shared__', 'asm(', 'asm volatile', '<<<'))
