#!/usr/bin/env python3
"""extract_fp8.py ULTRASCALE_CUDA_CUH OUT.h -- SwiGLU's kernels and the transposed FP8 quantiser
of ultrascale_cuda.cuh (// >>cuda-kernels' element access and SwiGLU, // >>cuda-fp8's E4M3
helpers, us__k_fp8_row_t and the fused us__k_swiglu_fwd_fp8t and us__k_swiglu_bwd_fp8), minus
the host code, rewritten so that us_cuda_emu.h can run them on the CPU (see fp8_emu.cpp). Fails
loudly if the markers it cuts at move."""
import sys
from extract_common import Header, write
hdr = Header(sys.argv[1], 'extract_fp8.py')
at = hdr.at
parts = []
def cut(a, b, start=0):
    parts.append(hdr.cut(a, b, start))
cut('__device__ __forceinline__ float us__ld(const float', '/* Calls KERNEL<float>')
cut('struct us__vec {', 'static int us__al(')
parts[-1].insert(0, 'template <typename T>')
cut('/* silu(g)·u = g / (1 + e^−g)', 'static dim3 us__rows_grid')
f = at('// >>cuda-fp8')
cut('static __device__ __forceinline__ uint8_t us__e4m3(', '/* vec bits: 1 = x may be read', f)
cut('/* ROW128 of P = xᵀ (x [L][R] as stored)', '/* raise kernel fn', f)
cut('/* ---- SwiGLU with both operands of h', 'static void us__swiglu_fwd_fp8_launch', f)
parts[-1] = parts[-1][:-1]  # the launcher's "template <typename T>" line
cut('/* ---- SwiGLU\'s backward with dgu\'s two operands', 'static void us__swiglu_bwd_fp8_launch', f)
parts[-1] = parts[-1][:-1]
txt = '\n'.join('\n'.join(p) for p in parts)
txt = txt.replace('extern __shared__ __align__(16) unsigned char us__rowt_smem[];',
                  'unsigned char *us__rowt_smem = emu_smem;')
write(sys.argv[2], 'extract_fp8.py', txt,
      bad=('__shared__', 'asm(', 'asm volatile', '<<<'))
