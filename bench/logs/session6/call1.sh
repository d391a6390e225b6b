#!/usr/bin/env bash
# session 6, call 1: test_cuda at HEAD (the untested edits of 4976d5c, fc05927), MoE fp8 default
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t0=$SECONDS; timeout 240 stdbuf -oL $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$? $((SECONDS-t0)) s"
grep -E "FAIL" $OUT/test_cuda.txt | head; tail -n 1 $OUT/test_cuda.txt
for p in "bf16" "fp8" "fp8 --fp8-experts" "bf16" "fp8" "fp8 --fp8-experts"; do
  echo "== $p" >> $OUT/moe.txt
  timeout 40 stdbuf -oL $B/bench_cuda --preset moe --steps 6 --warmup 2 --precision $p >> $OUT/moe.txt 2>&1
done
grep -hE "^==|^ultrascale" $OUT/moe.txt | cut -c1-160
