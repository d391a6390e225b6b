#!/usr/bin/env bash
# session 15, call 4: f = the commit that lands (n6 of call 3 with the block dK/dV kernel's
# fragments at HS 80 dropped, as n7 measured): test_cuda; bench_cuda --cp-flash-only and
# --cp-seq 32768 once each
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 150 .dev/f/test_cuda > $OUT/test_f.txt 2>&1
echo "test_cuda f rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_f.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_f.txt | head -10 >> $OUT/summary.txt
timeout 90 .dev/f/bench_cuda --cp-flash-only > $OUT/cp_f_1.txt 2>&1
echo "cp f rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 40 .dev/f/bench_cuda --cp-seq 32768 > $OUT/seq_f.txt 2>&1
echo "cp-seq f rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
