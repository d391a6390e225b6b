#!/usr/bin/env bash
# session 10, call 4: the library with the split mask copies and bf16's dS scale at the store
# (s10b): test_cuda, attention against main (s10a) and SDPA, the 1B step against torch.compile
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s10b; P=.dev/s10a; T0=$SECONDS
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
H="--attention --att-heads 32:8:64,16:4:128"
for i in 1 2; do
  timeout 100 stdbuf -oL $P/bench_cuda $H > $OUT/att_prev$i.txt 2>&1
  timeout 100 stdbuf -oL $N/bench_cuda $H > $OUT/att_new$i.txt 2>&1
done
timeout 100 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "attention done $((SECONDS-T0)) s"
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 90 stdbuf -oL $3/bench_cuda $S $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-110) ($((SECONDS-T0)) s)"; }
run bf16_1 "" $N
timeout 200 python3 bench/torch_llama.py --preset 1b --steps 6 --warmup-steps 2 --compile > $OUT/compile.txt 2>&1; echo "compile: $(grep -hE '^torch' $OUT/compile.txt | cut -c1-110) ($((SECONDS-T0)) s)"
run prev_1 "" $P
run fp8_1 "--precision fp8" $N
run bf16_2 "" $N
run fp8_2 "--precision fp8" $N
echo "total $((SECONDS-T0)) s"
for i in 1 2; do for f in prev new; do echo "== $f $i"; grep -E "^us-hop " $OUT/att_$f$i.txt; done; done
grep -E "^cudnn" $OUT/sdpa.txt
