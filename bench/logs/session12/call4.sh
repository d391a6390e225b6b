#!/usr/bin/env bash
# session 12, call 4: s12c's bench with --att-band 22 (a sixth as many pairs as CTAs) beside the
# default rule (a quarter: 33 at most) and one band, interleaved rep by rep; cuDNN after
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s12c; T0=$SECONDS
H=16:16:128,32:32:64,16:4:128,32:8:64; S=1024,2048,4096,8192
timeout 240 $N/bench_cuda --attention --att-heads $H --att-seq $S --att-band 22 > $OUT/att.txt 2>&1; echo "attention rc=$? $((SECONDS-T0)) s" > $OUT/summary.txt
timeout 120 python3 bench/sdpa_bench.py --att-heads 16:16:128,32:32:64 --att-seq $S --backends cudnn > $OUT/sdpa.txt 2>&1; echo "sdpa rc=$? $((SECONDS-T0)) s" >> $OUT/summary.txt
grep -E "^us-hop |^us-hop1b|^us-hopN" $OUT/att.txt >> $OUT/summary.txt
grep -E "^cudnn" $OUT/sdpa.txt >> $OUT/summary.txt
echo "total $((SECONDS-T0)) s" >> $OUT/summary.txt
cat $OUT/summary.txt
