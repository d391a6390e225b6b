#!/usr/bin/env bash
# session 9, call 3: the vectorised dot kernel (s9c) against call 2's library (s9b): tests,
# attention against SDPA, the 1B step (bf16, fp8) against torch.compile and eager
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s9c; P=.dev/s9b; T0=$SECONDS
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
H="--attention --att-heads 32:8:64,16:4:128"
timeout 100 stdbuf -oL $P/bench_cuda $H > $OUT/att_prev.txt 2>&1
timeout 100 stdbuf -oL $N/bench_cuda $H > $OUT/att_new.txt 2>&1
timeout 100 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "attention done $((SECONDS-T0)) s"
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $N/bench_cuda $S $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-100) ($((SECONDS-T0)) s)"; }
run bf16_1 ""
timeout 200 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 --compile > $OUT/compile.txt 2>&1; echo "compile: $(grep -hE '^torch' $OUT/compile.txt | cut -c1-100) ($((SECONDS-T0)) s)"
run fp8_1 "--precision fp8"
timeout 120 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 > $OUT/eager.txt 2>&1; echo "eager: $(grep -hE '^torch' $OUT/eager.txt | cut -c1-100) ($((SECONDS-T0)) s)"
run bf16_2 ""; run fp8_2 "--precision fp8"
echo "total $((SECONDS-T0)) s"
for f in prev new; do echo "== $f"; grep -E "^us-hop " $OUT/att_$f.txt; done
grep -E "^cudnn" $OUT/sdpa.txt
