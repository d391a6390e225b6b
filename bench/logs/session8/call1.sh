#!/usr/bin/env bash
# session 8, call 1: where the 1B step's GEMM time goes, shape by shape, in the step and alone
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/c1; T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for p in bf16 fp8; do
  timeout 90 stdbuf -oL $B/bench_cuda --preset 1b --steps 3 --warmup 2 --precision $p --profile > $OUT/prof_$p.txt 2>&1
  echo "$p rc=$? $((SECONDS-T0)) s"
done
echo "total $((SECONDS-T0)) s"
for p in bf16 fp8; do grep -E "^ultrascale" $OUT/prof_$p.txt | cut -c1-120; sed -n '/GEMMs by call/,$p' $OUT/prof_$p.txt; done
