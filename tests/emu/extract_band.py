#!/usr/bin/env python3
"""extract_band.py ULTRASCALE_CUDA_CUH OUT.h -- the Hopper attention kernels' tile order of
ultrascale_cuda.cuh (// >>cuda-hopper: us__hop_snake, us__hop_qtile_of, us__hop_kblock_of, us__hop_kwalk), the
dK/dV kernel's K and V fragments (us__hop_lda), where the backward through memory keeps dS
(us__hop_ds_off), the block kernels' walk (us__hop_block_walk, with us__hop_ring) and, from the
host side, the band of pairs and the chunk of the backward through memory (us__hop_band_of,
us__hop_ds_chunk, with the causal and the block backward's dS bytes),
which band_emu.cpp checks on the CPU. Fails loudly if the markers it cuts at move."""
import sys
from extract_common import Header, write
hdr = Header(sys.argv[1], 'extract_band.py')
start = hdr.at('// >>cuda-hopper')
txt = '\n'.join(hdr.cut('/* queries per tile of the dK/dV kernel (us__hop_cfg::BQ',
                        '/* Tile sizes and shared memory of one head size', start))
txt += '\n' + '\n'.join(hdr.cut('/* Tile j of CTA i in a persistent grid', '/* This CTA\'s walk over the U causal', start))
txt += '\n' + '\n'.join(hdr.cut('/* The byte offset of 16-byte chunk c of row r', '/* Shared-memory matrix descriptor'))
txt += '\n' + '\n'.join(hdr.cut('/* A fragments (us__wg_rs) of k-step kk', '/* Sᵀ = K·Qᵀ and (DK) dPᵀ', start))
txt += '\n' + '\n'.join(hdr.cut('/* Where one query tile stands in the forward\'s rings', '/* dK/dV: K, V [KVN]', start))
txt += '\n' + '\n'.join(hdr.cut('/* The backward with dS through memory (us_cuda_attention_no_hopper 7)',
                                  '/* this thread\'s dSᵀ fragments', start))
txt += '\n' + '\n'.join(hdr.cut('/* This CTA\'s walk over the query tiles of BR rows of a block kernel',
                                  '/* The block forward, a persistent grid', start))
host = hdr.at('/* ---- host side')
txt += '\n' + '\n'.join(hdr.cut('/* The (batch, kv head) pairs a band of the Hopper kernels',
                                  '/* ... of the B·NKV pairs of a call', host))
txt += '\n' + '\n'.join(hdr.cut('/* the bytes of dS that the backward through memory stores',
                                  '/* ... for the ops\' GPU and settings', host))
txt += '\n' + '\n'.join(hdr.cut('/* the bytes of a block backward\'s dS through memory',
                                  '/* ... the pairs of a chunk of it, as the causal', host))
write(sys.argv[2], 'extract_band.py', txt, bad=('__shared__', 'asm(', 'asm volatile', '<<<'))
