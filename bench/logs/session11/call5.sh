#!/usr/bin/env bash
# session 11, call 5 (the last of the session's device time): s11f = call 4's library with the
# RMSNorm part[] store and train.c's tuning window fixed — test_cuda, train_cuda --gemm-tune on
# the built-in task, then the 1B step against main as the session began (s11a), one profile
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s11f; P=.dev/s11a; T0=$SECONDS
timeout 100 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -6 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
timeout 60 $N/train_cuda --gemm-tune --steps 4 > $OUT/train_tune.txt 2>&1; echo "train_cuda --gemm-tune rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "gemm-tune|^step " $OUT/train_tune.txt | head -6 >> $OUT/summary.txt
S="--preset 1b --steps 5 --warmup 3"
run() { timeout 40 $3/bench_cuda $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale|gemm-tune' $OUT/$1.txt | cut -c1-96 | tr '\n' ' ') ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
run prof_new "--preset 1b --steps 2 --warmup 2 --profile" $N
grep -E '^    (gemm \(|attention|rmsnorm|swiglu|adamw|total)' $OUT/prof_new.txt | tr -s ' ' | tr '\n' ';' >> $OUT/summary.txt; echo >> $OUT/summary.txt
run bf16_new "$S" $N
run bf16_old "$S" $P
run fp8_new "$S --precision fp8" $N
run fp8_old "$S --precision fp8" $P
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
