#!/usr/bin/env bash
# session 20, call 3: s20c = call 2's (the persistent transposed quantiser, not kept); s20d = the
# session's library: s20a's SwiGLU FP8 backward and walk, __fdividef in SwiGLU's backward and
# forward, the transposed quantiser as before. test_cuda (s20d); --swiglu-bwd-fp8 (c d); the 1B
# step fp8 c d and bf16 d, interleaved three times; --profile of the 1B step, fp8 and bf16 (d)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s20d/test_cuda > $OUT/test_s20d.txt 2>&1
echo "test_cuda s20d rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s20d.txt)" > $S
grep -E "FAIL" $OUT/test_s20d.txt | head -10 >> $S
for v in s20c s20d; do
  echo "swb $v: $(timeout 60 .dev/$v/bench_cuda --swiglu-bwd-fp8 2>&1 | grep -E '^swiglu_bwd_fp8' | sed 's/ (bytes.*//' | tr '\n' ' ')" >> $S
done
for r in 1 2 3; do for vp in s20c:fp8 s20d:fp8 s20d:bf16; do
  v=${vp%:*}; p=${vp#*:}
  l=$(timeout 100 .dev/$v/bench_cuda --preset 1b --steps 6 --warmup 2 --precision $p 2>&1 | grep -E '^ultrascale' | cut -c1-100)
  echo "step $v $p: $l" >> $S
done; done
for p in fp8 bf16; do
  timeout 100 .dev/s20d/bench_cuda --preset 1b --steps 3 --warmup 2 --precision $p --profile > $OUT/profile_$p.txt 2>&1
  echo "profile $p rc=$? $((SECONDS-T0)) s" >> $S
done
echo "total $((SECONDS-T0)) s" >> $S
cat $S
