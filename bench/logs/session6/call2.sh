#!/usr/bin/env bash
# session 6, final call: the merged library with the CP block kernels' per-tile branch (cp2, 29e261a)
# against the merged library (m6, c5166a0), the FP8 ceiling, in one call
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
M=.dev/m6; C=.dev/cp2; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t=$SECONDS; timeout 150 stdbuf -oL $C/test_cuda > $OUT/test_cuda_cp2.txt 2>&1; rc=$?
echo "cp2 test_cuda rc=$rc $((SECONDS-t)) s: $(tail -n 1 $OUT/test_cuda_cp2.txt)"; grep -m5 FAIL $OUT/test_cuda_cp2.txt
if [ $rc -ne 0 ]; then
  t=$SECONDS; timeout 150 stdbuf -oL $M/test_cuda > $OUT/test_cuda_m6.txt 2>&1
  echo "m6 test_cuda rc=$? $((SECONDS-t)) s: $(tail -n 1 $OUT/test_cuda_m6.txt)"; grep -m5 FAIL $OUT/test_cuda_m6.txt
fi
for b in $M $C $M $C; do echo "== $b" >> $OUT/cp_seq.txt; timeout 90 stdbuf -oL $b/bench_cuda --cp-seq 32768 >> $OUT/cp_seq.txt 2>&1; done
B1="--preset 1b --steps 6 --warmup 2"
for a in "--precision bf16" "--precision fp8" "--precision fp8 --fp8-free-quant" "--precision bf16" "--precision fp8"; do
  echo "== 1b $a" >> $OUT/fp8.txt
  timeout 45 stdbuf -oL $C/bench_cuda $B1 $a >> $OUT/fp8.txt 2>&1
done
echo "total $((SECONDS-T0)) s"
grep -hE "^==|causal flash|one block.*hopper|cp=2 zig-zag, hopper" $OUT/cp_seq.txt 2>/dev/null | cut -c1-150
grep -hE "^==|^ultrascale" $OUT/fp8.txt | cut -c1-150
