#!/usr/bin/env bash
# session 11, call 3: test_cuda with the tuning test's fix (dW from the same y bits); the 1B step
# default against --gemm-tune in three interleaved pairs with torch.compile twice between; the
# 200M preset the same way
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s11d; T0=$SECONDS
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
S="--preset 1b --steps 6 --warmup 4"
run() { timeout 120 stdbuf -oL $N/bench_cuda $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale|gemm-tune' $OUT/$1.txt | cut -c1-100 | tr '\n' ' ') ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
tl() { timeout 200 python3 bench/torch_llama.py $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^torch' $OUT/$1.txt | cut -c1-100) ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
run bf16_a "$S"
run tune_a "$S --gemm-tune"
tl compile_a "--preset 1b --steps 6 --warmup-steps 2 --compile"
run tune_b "$S --gemm-tune"
run bf16_b "$S"
tl compile_b "--preset 1b --steps 6 --warmup-steps 2 --compile"
run bf16_c "$S"
run tune_c "$S --gemm-tune"
run m200 "--preset 200m --steps 10 --warmup 4"
run m200_tune "--preset 200m --steps 10 --warmup 4 --gemm-tune"
tl m200_compile "--preset 200m --steps 10 --warmup-steps 3 --compile"
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
