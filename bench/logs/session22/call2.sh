#!/usr/bin/env bash
# session 22, call 2: s22c = s22b with silu(g)·u as one helper using the fast division
# (__fdividef) in every SwiGLU forward kernel, the fused FP8 one included.
# test_cuda s22c; the 1B step fp8 and bf16, s22b and s22c interleaved three times; 8b8 once;
# --profile fp8 s22c
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c2.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 150 .dev/s22c/test_cuda > $OUT/test_s22c.txt 2>&1
echo "test_cuda s22c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s22c.txt)" > $S
grep -E "FAIL" $OUT/test_s22c.txt | head -10 >> $S
st() { timeout 100 .dev/$1/bench_cuda --preset $2 --steps 6 --warmup 2 --precision $3 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2 3; do
  for p in fp8 bf16; do for v in s22b s22c; do
    echo "1b $p $v: $(st $v 1b $p)" >> $S
  done; done
done
echo "8b8 fp8 s22b: $(st s22b 8b8 fp8)" >> $S
echo "8b8 fp8 s22c: $(st s22c 8b8 fp8)" >> $S
echo "8b8 bf16 s22c: $(st s22c 8b8 bf16)" >> $S
timeout 100 .dev/s22c/bench_cuda --preset 1b --steps 3 --warmup 2 --precision fp8 --profile > $OUT/prof_s22c.txt 2>&1
echo "== profile s22c rc=$? $((SECONDS-T0)) s" >> $S
sed -n 1,22p $OUT/prof_s22c.txt >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
