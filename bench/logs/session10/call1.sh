#!/usr/bin/env bash
# session 10, call 1: test_cuda at 59aee46 (main, s10a); the fused backward's dQ ordering cost:
# us-hopF rows of main (ordered adds), v1 (block 0 stores, the rest add in any order: not
# deterministic) and v0 (no dQ written: the fused kernel's compute alone), beside the default
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 200 stdbuf -oL .dev/s10a/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-T0)) s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
H="--attention --att-heads 32:8:64,16:4:128 --att-seq 4096,8192"
for i in 1 2; do
  for v in s10a v1 v0; do timeout 100 stdbuf -oL .dev/$v/bench_cuda $H > $OUT/att_${v}_$i.txt 2>&1; done
  echo "pair $i done $((SECONDS-T0)) s"
done
timeout 100 python3 bench/sdpa_bench.py > $OUT/sdpa.txt 2>&1; echo "sdpa done $((SECONDS-T0)) s"
for i in 1 2; do for v in s10a v1 v0; do echo "== $v $i"; grep -E "^us-hop |^us-hopF|^us-hop2k" $OUT/att_${v}_$i.txt; done; done
grep -E "^cudnn" $OUT/sdpa.txt
