#!/usr/bin/env bash
# session 13, call 8: FP8 against bf16 with the session's final library (s13d: the persistent
# dK/dV kernel takes ~3 ms off both steps' attention): bench_cuda --preset 1b, three interleaved
# pairs, and 8b8, one pair (--steps 6 --warmup 2)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=.dev/s13d; T0=$SECONDS; echo start > $OUT/summary.txt
for i in 1 2 3; do for p in bf16 fp8; do
  timeout 60 $N/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p > $OUT/b1b_${p}_$i.txt 2>&1
  echo "1b $p #$i rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b1b_${p}_$i.txt | cut -c1-100)" >> $OUT/summary.txt
done; done
for p in bf16 fp8; do
  timeout 80 $N/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision $p > $OUT/b8b8_$p.txt 2>&1
  echo "8b8 $p rc=$? $((SECONDS-T0)) s: $(grep -E '^ultrascale ' $OUT/b8b8_$p.txt | cut -c1-100)" >> $OUT/summary.txt
done
cat $OUT/summary.txt
