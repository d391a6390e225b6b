#!/usr/bin/env python3
"""extract_embed.py ULTRASCALE_CUDA_CUH OUT.h -- the embedding backward's kernel of
ultrascale_cuda.cuh (// >>cuda-kernels' element access and us__k_embedding_bwd: each id's run of
sorted tokens added in token order), which embed_emu.cpp runs on the CPU. Fails loudly if the
markers it cuts at move."""
import sys
from extract_common import Header, write
hdr = Header(sys.argv[1], 'extract_embed.py')
parts = [hdr.cut('__device__ __forceinline__ float us__ld(const float', '/* Calls KERNEL<float>'),
         hdr.cut('/* one block per (sorted position i', 'static void us__cuda_embedding_fwd(')]
write(sys.argv[2], 'extract_embed.py', '\n'.join('\n'.join(p) for p in parts),
      bad=('__shared__', 'asm(', 'asm volatile', '<<<'))
