#!/usr/bin/env bash
# session 19, call 1: s19a = ff8b4ee (the review's refactor of the dQ-from-dS kernels, not yet run
# on a GPU) with bench_cuda's --cp-heads: test_cuda; the HS 96 context-parallel table at T 8192
# and 32768 (32/32/96, the new block backward's first timing); Nsight Compute's durations of the
# causal forward and of one block's forward kernels (ranges, walk table, block forward, finish)
# at 16/8/128, T 8192 and 32768
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz
T0=$SECONDS; N=.dev/s19a
timeout 150 $N/test_cuda > $OUT/test_s19a.txt 2>&1
echo "test_cuda s19a rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s19a.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s19a.txt | head -10 >> $OUT/summary.txt
timeout 150 $N/bench_cuda --cp-seq 8192,32768 --cp-heads 32:32:96,16:8:128 > $OUT/cp96.txt 2>&1
echo "cp96 rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "^\| (one layer|causal|one block|cp=)" $OUT/cp96.txt | cut -c1-160 >> $OUT/summary.txt
K='regex:us__hop_fwd_kernel|us__hop_block_fwd_kernel|us__hop_pos_ranges|us__hop_block_tiles|us__k_attn_block_finish'
for T in 8192 32768; do
  timeout 150 ncu --section SpeedOfLight -k "$K" --launch-count 15 $N/bench_cuda --cp-seq $T --cp-heads 16:8:128 > $OUT/ncu_$T.txt 2>&1
  echo "ncu T $T rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
  grep -E "^  us__|^  void us__|Duration|DRAM Throughput|Compute \(SM\) Throughput" $OUT/ncu_$T.txt | sed 's/(CUtensorMap.*//' | cut -c1-120 >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
