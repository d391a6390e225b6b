#!/usr/bin/env bash
# session 9, call 1: forward exp2 by MUFU alone + persistent forward and dQ (s9a) against main (c6)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s9a; O=.dev/c6; T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 stdbuf -oL $N/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -8; tail -1 $OUT/test_cuda.txt
H=32:8:64,16:4:128,16:16:128
for i in 1 2; do
  timeout 120 stdbuf -oL $O/bench_cuda --attention --att-heads $H > $OUT/att_old$i.txt 2>&1
  timeout 150 stdbuf -oL $N/bench_cuda --attention --att-heads $H > $OUT/att_new$i.txt 2>&1
  echo "pair $i done $((SECONDS-T0)) s"
done
timeout 150 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1
echo "total $((SECONDS-T0)) s"
for i in 1 2; do echo "== old $i"; grep -E "^us-hop " $OUT/att_old$i.txt; echo "== new $i"; grep -E "^us-hop |^us-hop1t" $OUT/att_new$i.txt; done
grep -E "^cudnn" $OUT/sdpa.txt
