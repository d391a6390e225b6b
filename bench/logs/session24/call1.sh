#!/usr/bin/env bash
# session 24, call 1: s24a (ed2068b) = the o and down linears' residual read in the FP8 GEMM's
# epilogue (us_ops.fp8_gemm_res). test_cuda; the 1B and 8b8 fp8 steps with it and with
# --fp8-no-res (the copy and beta-1 GEMM, as before) and bf16, interleaved; one 1B fp8 profile.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c1.tgz -C .dev
T0=$SECONDS; S=$OUT/summary.txt
timeout 150 .dev/s24a/test_cuda > $OUT/test_s24a.txt 2>&1
echo "test_cuda s24a rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s24a.txt)" > $S
grep -E "FAIL|fp8_gemm_res|residual in the GEMM" $OUT/test_s24a.txt | head -12 >> $S
st() { timeout 100 .dev/s24a/bench_cuda --preset $1 --steps 6 --warmup 2 --precision $2 $3 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2 3; do
  echo "1b fp8 res: $(st 1b fp8)" >> $S
  echo "1b fp8 no-res: $(st 1b fp8 --fp8-no-res)" >> $S
  echo "1b bf16: $(st 1b bf16)" >> $S
done
for r in 1 2; do
  echo "8b8 fp8 res: $(st 8b8 fp8)" >> $S
  echo "8b8 fp8 no-res: $(st 8b8 fp8 --fp8-no-res)" >> $S
  echo "8b8 bf16: $(st 8b8 bf16)" >> $S
done
echo "elapsed $((SECONDS-T0)) s" >> $S
timeout 100 .dev/s24a/bench_cuda --preset 1b --steps 3 --warmup 2 --precision fp8 --profile > $OUT/prof_1b_fp8.txt 2>&1
head -22 $OUT/prof_1b_fp8.txt >> $S
grep -E "f8res|fp8  1,3 +16384 x +2048" $OUT/prof_1b_fp8.txt >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
