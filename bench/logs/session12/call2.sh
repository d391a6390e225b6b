#!/usr/bin/env bash
# session 12, call 2: s12b = the Hopper kernels' tiles in bands of (batch, kv head) pairs that fit
# L2 (us_cuda_attention_band): test_cuda, then bench_cuda --attention (its us-hop1b row: one band,
# the order before; paths interleaved rep by rep), SDPA in the same call, and the 1B step
# s12b against s12a (call 1's library), interleaved
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s12b; P=.dev/s12a; T0=$SECONDS
timeout 100 $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
grep -E "FAIL" $OUT/test_cuda.txt | head -6 >> $OUT/summary.txt; tail -1 $OUT/test_cuda.txt >> $OUT/summary.txt
timeout 200 $N/bench_cuda --attention > $OUT/att.txt 2>&1; echo "attention rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
timeout 120 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "sdpa rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "^us-hop |^us-hop1b|^us-hop2k" $OUT/att.txt >> $OUT/summary.txt
grep -vE "^#" $OUT/sdpa.txt | tail -20 >> $OUT/summary.txt
S="--preset 1b --steps 5 --warmup 3"
run() { timeout 40 $3/bench_cuda $2 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-80) ($((SECONDS-T0)) s)" >> $OUT/summary.txt; }
run step_new1 "$S" $N
run step_old1 "$S" $P
run step_new2 "$S" $N
run step_old2 "$S" $P
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
