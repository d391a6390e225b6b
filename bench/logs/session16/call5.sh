#!/usr/bin/env bash
# session 16, call 5: s16f = the session's library (595b13a, its docs, and the review's
# us__hop_bypos::tile in place of the block forward and dQ kernels' keys lambdas): test_cuda;
# bench_cuda --cp-flash-only once (the block kernels after the refactor)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS; N=.dev/s16f
timeout 150 $N/test_cuda > $OUT/test_s16f.txt 2>&1
echo "test_cuda s16f rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s16f.txt)" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_s16f.txt | head -10 >> $OUT/summary.txt
timeout 90 $N/bench_cuda --cp-flash-only > $OUT/cp_s16f.txt 2>&1
echo "cp s16f rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
