#!/usr/bin/env python3
"""extract_flash.py ULTRASCALE_CUDA_CUH OUT.h -- the flash kernels of ultrascale_cuda.cuh (causal and
by blocks, with their device helpers), minus the PTX helpers and the host code, rewritten so that
us_cuda_emu.h can run them on the CPU (see flash_emu.cpp). Fails loudly if the markers it cuts at
move."""
import sys
from extract_common import Header, write
hdr = Header(sys.argv[1], 'extract_flash.py')
src, at = hdr.src, hdr.at
a = at('static constexpr int us__fa_threads')                       # tiles, dims
p = at('/* ---- PTX helpers')                                         # cp.async, ldmatrix, mma: emulated instead
q = at('static __device__ __forceinline__ uint32_t us__pack_bf16')   # fragments, helpers, causal kernels
h = at('/* ---- host entry points')
c = at('// >>cuda-cp-flash')                                          # the block kernels
e = at('/* ---- host side', c)
txt = '\n'.join(src[a:p] + src[q:h] + src[c:e])
txt = txt.replace('extern __shared__ __align__(16) unsigned char us__fa_smem[];', 'unsigned char *us__fa_smem = emu_smem;')
txt = txt.replace('__shared__ int sRed[4];', 'static int sRed[4];')   # blocks run one at a time
write(sys.argv[2], 'extract_flash.py', txt, bad=('__shared__', 'asm'))
