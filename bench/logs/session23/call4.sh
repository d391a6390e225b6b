#!/usr/bin/env bash
# session 23, call 4: s23d (built at the commit that moves P's store into us__fp8_row_t_out) = s23c with SwiGLU's backward quantising both its patches in one tile
# pass (NP 2), 16-bit amax parts, P's rows stored 16 bytes a lane. test_cuda s23d; quantisers'
# GB/s and SwiGLU's FP8 backward, s23a and s23d; the 1B step fp8 s23a / s23d and bf16,
# once each; 8b8 once each (no profile, one round: device time)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c4.tgz
T0=$SECONDS; S=$OUT/summary.txt
timeout 150 .dev/s23d/test_cuda > $OUT/test_s23d.txt 2>&1
echo "test_cuda s23d rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s23d.txt)" > $S
grep -E "FAIL" $OUT/test_s23d.txt | head -10 >> $S
for v in s23a s23d; do
  echo "== $v fp8-gemm" >> $S
  timeout 100 .dev/$v/bench_cuda --fp8-gemm 2>&1 | grep -E "^\| [0-9]" | cut -d'|' -f2,8 >> $S
  timeout 60 .dev/$v/bench_cuda --swiglu-bwd-fp8 2>&1 | grep swiglu | cut -c1-60 >> $S
done
st() { timeout 100 .dev/$1/bench_cuda --preset $2 --steps 6 --warmup 2 --precision $3 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1; do
  for v in s23a s23d; do echo "1b fp8 $v: $(st $v 1b fp8)" >> $S; done
  echo "1b bf16 s23d: $(st s23d 1b bf16)" >> $S
done
for v in s23a s23d; do echo "8b8 fp8 $v: $(st $v 8b8 fp8)" >> $S; done
echo "8b8 bf16 s23d: $(st s23d 8b8 bf16)" >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
