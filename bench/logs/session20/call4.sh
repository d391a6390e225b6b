#!/usr/bin/env bash
# session 20, call 4: s20e = the session's library (s20f's kernels: call 1's SwiGLU FP8 backward
# and walk, __fdividef in SwiGLU's backward only). test_cuda; the 1B step bf16 / fp8 interleaved
# three times; 8b8 bf16 / fp8 once
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c4.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s20e/test_cuda > $OUT/test_s20e.txt 2>&1
echo "test_cuda s20e rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s20e.txt)" > $S
grep -E "FAIL" $OUT/test_s20e.txt | head -10 >> $S
for r in 1 2 3; do for p in bf16 fp8; do
  l=$(timeout 100 .dev/s20e/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step 1b $p: $l" >> $S
done; done
for p in bf16 fp8; do
  l=$(timeout 100 .dev/s20e/bench_cuda --preset 8b8 --steps 6 --warmup 2 --precision $p 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step 8b8 $p: $l" >> $S
done
echo "total $((SECONDS-T0)) s" >> $S
cat $S
