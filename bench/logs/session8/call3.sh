#!/usr/bin/env bash
# session 8, call 3: cuBLASLt's candidates for the step's GEMMs, timed at the power-capped clock
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=.dev/c3; T0=$SECONDS
timeout 200 stdbuf -oL $B/bench_cuda --gemm-sustained > $OUT/sustained.txt 2>&1; echo "rc=$? $((SECONDS-T0)) s"
cat $OUT/sustained.txt
