#!/usr/bin/env bash
# session 8, call 8: the transposed quantiser in registers (branch fp8-rowt): a = main (2ab0d22's
# library, staged tiles), b = 762366c (us__k_fp8_row_t in registers, SwiGLU's backward staged),
# c = a0d25d9 (both in registers); tests, micro-benchmarks, the fp8 step interleaved; calibrate
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
C=.dev/c8; T0=$SECONDS
timeout 90 stdbuf -oL $C/c/test_cuda > $OUT/test_cuda_c.txt 2>&1; echo "test_cuda c rc=$? $((SECONDS-T0)) s"; grep FAIL $OUT/test_cuda_c.txt | head -5; tail -1 $OUT/test_cuda_c.txt
timeout 60 stdbuf -oL $C/b/test_cuda --fp8 > $OUT/test_cuda_b_fp8.txt 2>&1; echo "test_cuda b --fp8 rc=$? $((SECONDS-T0)) s"; grep FAIL $OUT/test_cuda_b_fp8.txt | head -5; tail -1 $OUT/test_cuda_b_fp8.txt
for v in a b c; do timeout 60 stdbuf -oL $C/$v/bench_cuda --fp8-gemm > $OUT/fp8gemm_$v.txt 2>&1; done
echo "micro $((SECONDS-T0)) s"
S="--preset 1b --steps 6 --warmup 2"
run() { timeout 60 stdbuf -oL $C/$2/bench_cuda $S $3 > $OUT/$1.txt 2>&1; echo "$1: $(grep -hE '^ultrascale' $OUT/$1.txt | cut -c1-92) ($((SECONDS-T0)) s)"; }
run bf16_a a ""; for r in 1 2; do for v in a b c; do run fp8_${v}_$r $v "--precision fp8"; done; done
for v in a b c; do echo "== $v"; grep -E "^\| (16384 x|2048 x|8192 x)" $OUT/fp8gemm_$v.txt | awk -F'|' '{print $2, $(NF-1)}'; grep -i "^swiglu" $OUT/fp8gemm_$v.txt; done
timeout 70 stdbuf -oL $C/calibrate --out $OUT/rates_1gpu.txt > $OUT/calibrate.txt 2>&1; echo "calibrate rc=$? $((SECONDS-T0)) s"; cat $OUT/rates_1gpu.txt
echo "total $((SECONDS-T0)) s"
