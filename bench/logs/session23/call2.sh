#!/usr/bin/env bash
# session 23, call 2: s23b = s23a with the transposed FP8 quantiser's patch held in registers
# (us__fp8_row_t_regs; SwiGLU's fused forward and backward feed it from registers).
# test_cuda s23b; the quantisers' GB/s and SwiGLU's FP8 backward, s23a and s23b; the 1B step fp8
# s23a / s23b and bf16, interleaved three times; 8b8 once each; --profile fp8 s23b; Nsight
# Compute on the new kernel (both ways, 16384 x 2048)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c2.tgz
T0=$SECONDS; S=$OUT/summary.txt
timeout 150 .dev/s23b/test_cuda > $OUT/test_s23b.txt 2>&1
echo "test_cuda s23b rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s23b.txt)" > $S
grep -E "FAIL" $OUT/test_s23b.txt | head -10 >> $S
for v in s23a s23b; do
  echo "== $v fp8-gemm" >> $S
  timeout 100 .dev/$v/bench_cuda --fp8-gemm 2>&1 | grep -E "^\| [0-9]" | cut -d'|' -f2,8 >> $S
  timeout 60 .dev/$v/bench_cuda --swiglu-bwd-fp8 2>&1 | grep swiglu | cut -c1-60 >> $S
done
st() { timeout 100 .dev/$1/bench_cuda --preset $2 --steps 6 --warmup 2 --precision $3 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2 3; do
  for v in s23a s23b; do echo "1b fp8 $v: $(st $v 1b fp8)" >> $S; done
  echo "1b bf16 s23b: $(st s23b 1b bf16)" >> $S
done
for v in s23a s23b; do echo "8b8 fp8 $v: $(st $v 8b8 fp8)" >> $S; done
echo "8b8 bf16 s23b: $(st s23b 8b8 bf16)" >> $S
timeout 100 .dev/s23b/bench_cuda --preset 1b --steps 3 --warmup 2 --precision fp8 --profile > $OUT/prof_s23b.txt 2>&1
echo "== profile s23b rc=$? $((SECONDS-T0)) s" >> $S
sed -n 2,21p $OUT/prof_s23b.txt >> $S
timeout 100 ncu --set full -k regex:us__k_fp8_row_t --launch-skip 74 --launch-count 2 .dev/s23b/bench_cuda --fp8-gemm > $OUT/ncu_rowt.txt 2>&1
echo "== ncu rowt rc=$? $((SECONDS-T0)) s" >> $S
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Theoretical Occ" $OUT/ncu_rowt.txt | cut -c1-100 >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
