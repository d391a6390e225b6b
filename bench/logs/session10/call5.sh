#!/usr/bin/env bash
# session 10, call 5: the dK/dV kernel back on one copy of its tile math by index (s10c; with two,
# ptxas spilled at HS 64) against call 4's library (s10b): test_cuda, attention against SDPA,
# the 1B step against torch.compile and eager, FP8 at 1B and 8B width, the 200M preset
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s10c; P=.dev/s10b; T0=$SECONDS
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
H="--attention --att-heads 32:8:64,16:4:128"
for i in 1 2; do
  timeout 100 stdbuf -oL $P/bench_cuda $H > $OUT/att_prev$i.txt 2>&1
  timeout 100 stdbuf -oL $N/bench_cuda $H > $OUT/att_new$i.txt 2>&1
done
timeout 100 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "attention done $((SECONDS-T0)) s"
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $N/bench_cuda $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-110) ($((SECONDS-T0)) s)"; }
tl() { timeout 200 python3 bench/torch_llama.py $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^torch' $OUT/$1.txt | cut -c1-110) ($((SECONDS-T0)) s)"; }
run bf16_1 "$S"
tl compile "--preset 1b --steps 6 --warmup-steps 2 --compile"
run fp8_1 "$S --precision fp8"
tl eager "--preset 1b --steps 6 --warmup-steps 2"
run bf16_2 "$S"
run fp8_2 "$S --precision fp8"
run b8_bf16 "--preset 8b8 --steps 6 --warmup 2"
run b8_fp8 "--preset 8b8 --steps 6 --warmup 2 --precision fp8"
run m200 "--preset 200m --steps 10 --warmup 3"
tl m200_compile "--preset 200m --steps 10 --warmup-steps 3 --compile"
echo "total $((SECONDS-T0)) s"
for i in 1 2; do for f in prev new; do echo "== $f $i"; grep -E "^us-hop " $OUT/att_$f$i.txt; done; done
grep -E "^cudnn" $OUT/sdpa.txt
