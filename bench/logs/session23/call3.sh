#!/usr/bin/env bash
# session 23, call 3: s23c = s23b with P's rows through a swizzled shared buffer, stored as whole rows
# (us__fp8_row_t_regs; SwiGLU's fused forward and backward feed it from registers).
# test_cuda s23c; the quantisers' GB/s and SwiGLU's FP8 backward, s23a and s23c; the 1B step fp8
# s23a / s23c and bf16, interleaved twice; 8b8 once each; --profile fp8 s23c; Nsight
# Compute on the new kernel (both ways, 16384 x 2048)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
tar xzf .dev/c3.tgz
T0=$SECONDS; S=$OUT/summary.txt
timeout 150 .dev/s23c/test_cuda > $OUT/test_s23c.txt 2>&1
echo "test_cuda s23c rc=$? $((SECONDS-T0)) s: $(tail -1 $OUT/test_s23c.txt)" > $S
grep -E "FAIL" $OUT/test_s23c.txt | head -10 >> $S
for v in s23a s23c; do
  echo "== $v fp8-gemm" >> $S
  timeout 100 .dev/$v/bench_cuda --fp8-gemm 2>&1 | grep -E "^\| [0-9]" | cut -d'|' -f2,8 >> $S
  timeout 60 .dev/$v/bench_cuda --swiglu-bwd-fp8 2>&1 | grep swiglu | cut -c1-60 >> $S
done
st() { timeout 100 .dev/$1/bench_cuda --preset $2 --steps 6 --warmup 2 --precision $3 2>&1 | grep -E '^ultrascale' | cut -c1-100; }
for r in 1 2; do
  for v in s23a s23c; do echo "1b fp8 $v: $(st $v 1b fp8)" >> $S; done
  echo "1b bf16 s23c: $(st s23c 1b bf16)" >> $S
done
for v in s23a s23c; do echo "8b8 fp8 $v: $(st $v 8b8 fp8)" >> $S; done
echo "8b8 bf16 s23c: $(st s23c 8b8 bf16)" >> $S
timeout 100 .dev/s23c/bench_cuda --preset 1b --steps 3 --warmup 2 --precision fp8 --profile > $OUT/prof_s23c.txt 2>&1
echo "== profile s23c rc=$? $((SECONDS-T0)) s" >> $S
sed -n 2,21p $OUT/prof_s23c.txt >> $S
timeout 100 ncu --set full -k regex:us__k_fp8_row_t --launch-skip 74 --launch-count 2 .dev/s23c/bench_cuda --fp8-gemm > $OUT/ncu_rowt.txt 2>&1
echo "== ncu rowt rc=$? $((SECONDS-T0)) s" >> $S
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Theoretical Occ|L2 Cache Throughput|Eligible Warps" $OUT/ncu_rowt.txt | cut -c1-100 >> $S
echo "total $((SECONDS-T0)) s" >> $S
cat $S
