#!/usr/bin/env bash
# session 15, call 3. n6 = what lands: the persistent block forward and dQ kernels (n1 of call 1,
# rebuilt from the final source), the block dK/dV kernel one CTA per key block with its K (and
# V) fragments (block-kfrag.patch); n7 = n6 without the fragments (main's block dK/dV);
# m15 = main at ccbdd69. test_cuda n6; bench_cuda --cp-flash-only n6, n7, m15, n6;
# --cp-seq 32768 n6 and m15.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 150 .dev/n6/test_cuda > $OUT/test_n6.txt 2>&1
echo "test_cuda n6 rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_n6.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_n6.txt | head -10 >> $OUT/summary.txt
for v in n6_1 n7_1 m15_1 n6_2; do
  [ $((SECONDS-T0)) -gt 480 ] && { echo "cp $v skipped" >> $OUT/summary.txt; continue; }
  timeout 90 .dev/${v%_*}/bench_cuda --cp-flash-only > $OUT/cp_$v.txt 2>&1
  echo "cp $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
for v in n6 m15; do
  [ $((SECONDS-T0)) -gt 520 ] && { echo "cp-seq $v skipped" >> $OUT/summary.txt; continue; }
  timeout 40 .dev/$v/bench_cuda --cp-seq 32768 > $OUT/seq_$v.txt 2>&1
  echo "cp-seq $v rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
done
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
tail -2 $OUT/test_n6.txt
cat $OUT/summary.txt
