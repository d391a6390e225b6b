#!/usr/bin/env python3
"""extract_grouped.py ULTRASCALE_CUDA_CUH OUT.h -- the grouped GEMM kernel of ultrascale_cuda.cuh
(// >>cuda-grouped: its table, device helpers and kernel, not the PTX helpers nor the host code),
rewritten so that us_cuda_emu.h can run it on the CPU (see grouped_emu.cpp). The helpers it
borrows from // >>cuda-flash come from extract_flash.py's output. Fails loudly if the markers it
cuts at move."""
import sys
from extract_common import Header, write
hdr = Header(sys.argv[1], 'extract_grouped.py')
src, at = hdr.src, hdr.at
c = at('// >>cuda-grouped')
a = at('#define US__GG_CAP', c)                                   # sizes, the table
p = at('/* ---- PTX helpers', a)                                  # mma f16, wait_group: emulated
k = at('/* ---- the kernel', p)                                   # helpers, the kernel, the table fill
h = at('/* ---- host side', k)
txt = '\n'.join(src[a:p] + src[k:h])
txt = txt.replace('extern __shared__ __align__(16) unsigned char us__gg_smem[];',
                  'unsigned char *us__gg_smem = emu_smem;')
write(sys.argv[2], 'extract_grouped.py', txt)
