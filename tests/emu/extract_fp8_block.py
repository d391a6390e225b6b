#!/usr/bin/env python3
"""extract_fp8_block.py ULTRASCALE_CUDA_CUH OUT.h -- the BLOCK128 quantiser of ultrascale_cuda.cuh
(// >>cuda-fp8's E4M3 helpers, the 16-bit |x| and unpack helpers, and the ---- BLOCK128 part:
us__oct_*, us__t8x8, us__k_fp8_block), minus the host code, rewritten so that us_cuda_emu.h can
run it on the CPU (see fp8_block_emu.cpp). Fails loudly if the markers it cuts at move."""
import sys
from extract_common import Header, write
hdr = Header(sys.argv[1], 'extract_fp8_block.py')
at = hdr.at
parts = []
def cut(a, b, start=0):
    parts.append(hdr.cut(a, b, start))
f = at('// >>cuda-fp8')
cut('static __device__ __forceinline__ uint8_t us__e4m3(', '/* vec bits: 1 = x may be read', f)
cut('/* a 16-bit |x| pattern (sign cleared)', 'struct us__raw4', f)
parts[-1] = parts[-1][:-1]  # us__raw4's "template <typename T>" line
cut('/* ---- BLOCK128: the weight cache', '/* TENSOR: the amax', f)
txt = '\n'.join('\n'.join(p) for p in parts)
# one block runs at a time in the emulator, its threads in one OS thread: a static is its smem
txt = txt.replace('__shared__ unsigned red[8];', 'static unsigned red[8];')
write(sys.argv[2], 'extract_fp8_block.py', txt,
      bad=('__shared__', 'asm(', 'asm volatile', '<<<'))
