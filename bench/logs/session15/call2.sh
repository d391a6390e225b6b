#!/usr/bin/env bash
# session 15, call 2. n4 = n2 (call 1) with every block kernel's walk by weight
# (us__hop_block_order: the tiles that see the most first); n5 = n4 with one K/V buffer in the
# block dK/dV kernel (KVNB 1: more L1 beside its shared memory); n1, m15 as in call 1.
# test_cuda n4; bench_cuda --cp-flash-only n4, n5, n1, m15, n4; --cp-seq 32768 n4, m15.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 150 .dev/n4/test_cuda > $OUT/test_n4.txt 2>&1
echo "test_cuda n4 rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_n4.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_n4.txt | head -10 >> $OUT/summary.txt
for v in n4_1 n5_1 n1_1 m15_1 n4_2; do
  [ $((SECONDS-T0)) -gt 480 ] && { echo "cp $v skipped" >> $OUT/summary.txt; continue; }
  timeout 90 .dev/${v%_*}/bench_cuda --cp-flash-only > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for v in n4 m15; do
  [ $((SECONDS-T0)) -gt 520 ] && { echo "cp-seq $v skipped" >> $OUT/summary.txt; continue; }
  timeout 40 .dev/$v/bench_cuda --cp-seq 32768 > $OUT/seq_$v.txt 2>&1
  echo "cp-seq $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
tail -3 $OUT/test_n4.txt
cat $OUT/summary.txt
