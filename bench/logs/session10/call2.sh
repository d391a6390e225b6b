#!/usr/bin/env bash
# session 10, call 2: part of the backward's exponentials on the FMA pipe (a degree-3 polynomial)
# instead of the MUFU unit: p1..p4 = 1..4 of every 8 scores (dK/dV and dQ kernels), s10a = main
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
H="--attention --att-heads 32:8:64,16:4:128 --att-seq 2048,4096,8192"
for i in 1 2; do
  for v in s10a p1 p2 p3 p4; do timeout 100 stdbuf -oL .dev/$v/bench_cuda $H > $OUT/att_${v}_$i.txt 2>&1; done
  echo "round $i done $((SECONDS-T0)) s"
done
for i in 1 2; do for v in s10a p1 p2 p3 p4; do echo "== $v $i"; grep -E "^us-hop " $OUT/att_${v}_$i.txt; done; done
