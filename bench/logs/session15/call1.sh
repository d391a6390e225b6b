#!/usr/bin/env bash
# session 15, call 1. m15 = main at ccbdd69; n1 = the persistent block forward and dQ kernels
# (us__hop_block_tiles, us__hop_block_walk) with the block dK/dV kernel's K fragments (session
# 14's block-kfrag.patch); n2 = n1 with the block dK/dV kernel persistent too
# (us__hop_block_kwalk). test_cuda n2 (n1 too if n2 fails); bench_cuda --cp-flash-only n2, m15,
# n1, then n2, m15 again; --cp-seq 32768 n2 and m15. Each run skipped past 500 s.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 150 .dev/n2/test_cuda > $OUT/test_n2.txt 2>&1
echo "test_cuda n2 rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_n2.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_n2.txt | head -10 >> $OUT/summary.txt
if ! tail -1 $OUT/test_n2.txt | grep -q " 0 failed"; then
  timeout 150 .dev/n1/test_cuda > $OUT/test_n1.txt 2>&1
  echo "test_cuda n1 rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_n1.txt)" >> $OUT/summary.txt
  grep -E "FAIL" $OUT/test_n1.txt | head -10 >> $OUT/summary.txt
fi
for v in n2_1 m15_1 n1_1 n2_2 m15_2; do
  [ $((SECONDS-T0)) -gt 500 ] && { echo "cp $v skipped" >> $OUT/summary.txt; continue; }
  timeout 90 .dev/${v%_*}/bench_cuda --cp-flash-only > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for v in n2 m15; do
  [ $((SECONDS-T0)) -gt 500 ] && { echo "cp-seq $v skipped" >> $OUT/summary.txt; continue; }
  timeout 60 .dev/$v/bench_cuda --cp-seq 32768 > $OUT/seq_$v.txt 2>&1
  echo "cp-seq $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for f in $OUT/cp_*.txt $OUT/seq_*.txt; do
  echo "== $(basename $f)"; grep -E "^\| (one layer|causal|one block, .*hopper|cp=2 zig-zag, hopper)" $f | cut -c1-150
done >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
