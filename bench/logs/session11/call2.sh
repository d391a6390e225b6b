#!/usr/bin/env bash
# session 11, call 2: GEMM algorithms chosen by timing them inside the warm-up steps
# (--gemm-tune, us_cuda_gemm_tune) against the heuristic's first, the 1B step bf16 and fp8
# interleaved, torch.compile in the same call; test_cuda of the same library first
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s11c; T0=$SECONDS
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL|tuning|timed candidates" $OUT/test_cuda.txt | head -8 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
S="--preset 1b --steps 6 --warmup 4"
run() { timeout 120 stdbuf -oL $N/bench_cuda $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale|gemm-tune' $OUT/$1.txt | cut -c1-100 | tr '\n' ' ') ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
tl() { timeout 200 python3 bench/torch_llama.py $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^torch' $OUT/$1.txt | cut -c1-100) ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
run bf16_a "$S"
run bf16_tune_a "$S --gemm-tune"
tl compile "--preset 1b --steps 6 --warmup-steps 2 --compile"
run bf16_b "$S"
run bf16_tune_b "$S --gemm-tune"
run fp8_a "$S --precision fp8"
run fp8_tune_a "$S --precision fp8 --gemm-tune"
run fp8_b "$S --precision fp8"
run fp8_tune_b "$S --precision fp8 --gemm-tune"
run prof_tune "--preset 1b --steps 3 --warmup 4 --gemm-tune --profile"
sed -n '/profile of one/,$p' $OUT/prof_tune.txt | head -36 >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
