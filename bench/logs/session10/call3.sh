#!/usr/bin/env bash
# session 10, call 3: the backward's mask in its own copy of the tile math (s1: the wholly
# visible tiles carry no per-score mask code), and dS left unscaled under bf16 with the scale
# applied once at the dK / dQ store (s1f), against main (s10a); SDPA cuDNN in the same call
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
H="--attention --att-heads 32:8:64,16:4:128 --att-seq 2048,4096,8192"
for i in 1 2; do
  for v in s10a s1 s1f; do timeout 100 stdbuf -oL .dev/$v/bench_cuda $H > $OUT/att_${v}_$i.txt 2>&1; done
  echo "round $i done $((SECONDS-T0)) s"
done
timeout 100 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "sdpa done $((SECONDS-T0)) s"
for i in 1 2; do for v in s10a s1 s1f; do echo "== $v $i"; grep -E "^us-hop " $OUT/att_${v}_$i.txt; done; done
grep -E "^cudnn" $OUT/sdpa.txt
