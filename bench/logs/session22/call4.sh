#!/usr/bin/env bash
# session 22, call 4: s22d = s22c with RMSNorm's FP8 forward also making lnᵀ's 128×1 operand
# (a vector pass for rstd, then us__k_rmsnorm_fwd_fp8t tiled 128×128), kept in ln1's and ln2's
# bytes for the qkv and gate|up Wgrads. test_cuda s22d; the 1B step fp8 s22c / s22d and bf16
# s22d interleaved three times; --profile fp8 s22d
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c4.tgz
T0=$SECONDS
S=$OUT/summary.txt
timeout 120 .dev/s22d/test_cuda > $OUT/test_s22d.txt 2>&1
echo "test_cuda s22d rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s22d.txt)" > $S
grep -E "FAIL" $OUT/test_s22d.txt | head -10 >> $S
st() { timeout 60 .dev/$1/bench_cuda --preset $2 --steps 6 --warmup 2 --precision $3 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2 3; do
  echo "1b fp8 s22c: $(st s22c 1b fp8)" >> $S
  echo "1b fp8 s22d: $(st s22d 1b fp8)" >> $S
  echo "1b bf16 s22d: $(st s22d 1b bf16)" >> $S
done
timeout 60 .dev/s22d/bench_cuda --preset 1b --steps 3 --warmup 2 --precision fp8 --profile > $OUT/prof_s22d.txt 2>&1
echo "== profile s22d rc=$? $((SECONDS-T0)) s" >> $S
sed -n 1,22p $OUT/prof_s22d.txt >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
